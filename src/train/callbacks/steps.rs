//! Callbacks that add graph work to every step: the global step counter, BatchNorm's EMA
//! updates (`UPDATE_OPS`), moving averages of `MOVING_SUMMARY` scalars, and the summaries of
//! `SUMMARIES`, fetched with the last step of each epoch.

use crate::dsl::Tensor;
use crate::ir::{NodeId, Value};
use crate::optim::add_step_counter;
use crate::tensor::{DType, HostTensor};
use crate::tower::{MOVING_SUMMARY, SUMMARIES, UPDATE_OPS, VarSpec};
use crate::train::callback::{Callback, RunArgs};
use crate::train::context::TrainContext;
use crate::train::error::TrainError;
use crate::train::monitors::normalize_tag;

/// Increments `global_step` in every hooked run (tensorpack's `MaintainStepCounter`; the
/// trainer registers it).
#[derive(Debug, Default)]
pub struct MaintainStepCounter {
    increment: Option<NodeId>,
}

impl MaintainStepCounter {
    /// The counter.
    pub fn new() -> MaintainStepCounter {
        MaintainStepCounter::default()
    }
}

impl Callback for MaintainStepCounter {
    fn chief_only(&self) -> bool {
        false
    }

    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let graph = ctx.graph_mut("MaintainStepCounter")?;
        self.increment = Some(add_step_counter(graph)?);
        Ok(())
    }

    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if ctx.global_step() != 0 {
            log::info!(target: "towerpack", "Start training with global_step={}", ctx.global_step());
        }
        Ok(())
    }

    fn before_run(&mut self, _: &TrainContext) -> Result<RunArgs, TrainError> {
        Ok(RunArgs::run(self.increment.into_iter().collect()))
    }

    fn after_run(&mut self, ctx: &mut TrainContext, _: &[HostTensor]) -> Result<(), TrainError> {
        ctx.counters.global_step += 1;
        Ok(())
    }
}

/// Runs the `UPDATE_OPS` collection (BatchNorm's EMA assigns) with every hooked run.
#[derive(Debug, Default)]
pub struct RunUpdateOps {
    ops: Vec<NodeId>,
}

impl RunUpdateOps {
    /// Runs `UPDATE_OPS`.
    pub fn new() -> RunUpdateOps {
        RunUpdateOps::default()
    }
}

impl Callback for RunUpdateOps {
    fn chief_only(&self) -> bool {
        false
    }

    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.ops = ctx
            .graph()
            .collection(UPDATE_OPS)
            .iter()
            .map(|v| v.node)
            .collect();
        Ok(())
    }

    fn before_run(&mut self, _: &TrainContext) -> Result<RunArgs, TrainError> {
        Ok(RunArgs::run(self.ops.clone()))
    }
}

/// True once per step: on the first hooked run of the last step of an epoch.
struct LastStepOnce {
    last: Option<(u64, i64)>,
}

impl LastStepOnce {
    fn fire(&mut self, ctx: &TrainContext, every: u64) -> bool {
        let c = ctx.counters();
        let periodic =
            every > 0 && c.local_step >= 0 && (c.local_step as u64 + 1).is_multiple_of(every);
        if !(c.is_last_step_of_epoch() || periodic) {
            return false;
        }
        let here = (c.epoch_num, c.local_step);
        if self.last == Some(here) {
            return false;
        }
        self.last = Some(here);
        true
    }
}

/// Keeps an exponential moving average (`EMA/<name>` variables, saved in checkpoints) of every
/// `MOVING_SUMMARY` scalar, updated in every hooked run, and puts the averages as monitor
/// scalars with the last step of each epoch. Like tensorpack's `add_moving_summary`, averages
/// start at 0 without debiasing.
pub struct MovingAverageSummary {
    decay: f64,
    averages: Vec<(String, NodeId, Value)>,
    once: LastStepOnce,
    fetching: bool,
}

impl Default for MovingAverageSummary {
    fn default() -> MovingAverageSummary {
        MovingAverageSummary::new()
    }
}

impl MovingAverageSummary {
    /// Decay 0.95 (tensorpack's default).
    pub fn new() -> MovingAverageSummary {
        MovingAverageSummary::with_decay(0.95)
    }

    /// `ema = decay * ema + (1 - decay) * value`.
    pub fn with_decay(decay: f64) -> MovingAverageSummary {
        MovingAverageSummary {
            decay,
            averages: Vec::new(),
            once: LastStepOnce { last: None },
            fetching: false,
        }
    }
}

impl Callback for MovingAverageSummary {
    fn chief_only(&self) -> bool {
        false
    }

    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let values: Vec<(String, Value)> = ctx
            .graph()
            .collection(MOVING_SUMMARY)
            .iter()
            .map(|&v| (normalize_tag(&ctx.graph().value_name(v)), v))
            .collect();
        if values.is_empty() {
            return Ok(());
        }
        let decay = self.decay;
        let averages = ctx.with_builder("MovingAverageSummary", |b| {
            let _scope = b.name_scope("MovingAverageSummary");
            let mut out = Vec::new();
            for (tag, v) in values {
                let x = b.tensor_of(v).cast(DType::F32);
                let spec = VarSpec::new(&[]).trainable(false);
                let ema: Tensor = b.get_variable_by_full_name(&format!("EMA/{tag}"), &spec);
                let new = &ema * ema.scalar_like_f64(decay) + &x * x.scalar_like_f64(1.0 - decay);
                if let (Some(assign), Some(value)) = (b.assign(&ema, &new), new.value()) {
                    out.push((tag, assign, value));
                }
            }
            out
        })?;
        self.averages = averages;
        Ok(())
    }

    fn before_run(&mut self, ctx: &TrainContext) -> Result<RunArgs, TrainError> {
        self.fetching = !self.averages.is_empty() && self.once.fire(ctx, 0);
        Ok(RunArgs {
            targets: self.averages.iter().map(|a| a.1).collect(),
            fetches: if self.fetching {
                self.averages.iter().map(|a| a.2).collect()
            } else {
                Vec::new()
            },
            feeds: Vec::new(),
        })
    }

    fn after_run(
        &mut self,
        ctx: &mut TrainContext,
        fetched: &[HostTensor],
    ) -> Result<(), TrainError> {
        if !self.fetching {
            return Ok(());
        }
        for ((tag, _, _), value) in self.averages.iter().zip(fetched) {
            ctx.put_scalar(tag, value.scalar_value().unwrap_or(f64::NAN))?;
        }
        Ok(())
    }
}

/// Fetches the `SUMMARIES` collection with the last step of each epoch (and every `period`
/// local steps when `period > 0`) and puts scalars as scalars, other tensors as histograms
/// (tensorpack's `MergeAllSummaries`).
pub struct MergeAllSummaries {
    period: u64,
    summaries: Vec<(String, Value)>,
    once: LastStepOnce,
    fetching: bool,
}

impl Default for MergeAllSummaries {
    fn default() -> MergeAllSummaries {
        MergeAllSummaries::new()
    }
}

impl MergeAllSummaries {
    /// With the last step of each epoch only.
    pub fn new() -> MergeAllSummaries {
        MergeAllSummaries::with_period(0)
    }

    /// Also every `period` local steps.
    pub fn with_period(period: u64) -> MergeAllSummaries {
        MergeAllSummaries {
            period,
            summaries: Vec::new(),
            once: LastStepOnce { last: None },
            fetching: false,
        }
    }
}

impl Callback for MergeAllSummaries {
    fn chief_only(&self) -> bool {
        false
    }

    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let graph = ctx.graph();
        self.summaries = graph
            .collection(SUMMARIES)
            .iter()
            .map(|&v| (normalize_tag(&graph.value_name(v)), v))
            .collect();
        Ok(())
    }

    fn before_run(&mut self, ctx: &TrainContext) -> Result<RunArgs, TrainError> {
        self.fetching = !self.summaries.is_empty() && self.once.fire(ctx, self.period);
        Ok(if self.fetching {
            RunArgs::fetch(self.summaries.iter().map(|s| s.1).collect())
        } else {
            RunArgs::none()
        })
    }

    fn after_run(
        &mut self,
        ctx: &mut TrainContext,
        fetched: &[HostTensor],
    ) -> Result<(), TrainError> {
        if !self.fetching {
            return Ok(());
        }
        for ((tag, _), value) in self.summaries.iter().zip(fetched) {
            if value.shape().is_empty() {
                ctx.put_scalar(tag, value.scalar_value().unwrap_or(f64::NAN))?;
            } else {
                ctx.put_histogram(tag, value)?;
            }
        }
        Ok(())
    }
}
