//! [`LossScaleMonitor`]: makes FP16's dynamic loss scale visible — the `loss_scale` monitor
//! scalar, a warning naming the steps in which steps were skipped, and the run's count of
//! skipped steps (`loss_scale/skipped_steps`). The engine registers it whenever the run has a
//! loss scale ([`TrainConfig::loss_scale`](crate::train::TrainConfig::loss_scale)); it reads
//! what the trainer put in [`crate::optim::LOSS_SCALE_COLLECTION`].
//!
//! It fetches the new scale and the device's count of skipped steps
//! ([`crate::optim::LOSS_SCALE_SKIPPED_STEPS`], a checkpointed variable the gated update
//! increments) with every [`every`](LossScaleMonitor::every)-th step of an epoch and its last,
//! not after every step: a fetch makes the host wait for the step before it submits the next,
//! which on an H100 cost fp16 ResNet-20 training a third of its speed (30,770 img/s against
//! bf16's 45,162 at batch 128, 2026-11-27). No skip goes uncounted: the count lives on the
//! device, and the monitor reports how much it grew between two fetches.

use crate::ir::Value;
use crate::optim::{LOSS_SCALE_COLLECTION, LOSS_SCALE_SKIPPED_STEPS};
use crate::tensor::HostTensor;
use crate::train::callback::{Callback, RunArgs};
use crate::train::context::TrainContext;
use crate::train::error::TrainError;

/// Reports the loss scale and the steps skipped under it, fetched every few steps.
#[derive(Debug)]
pub struct LossScaleMonitor {
    /// `(new scale, new count of skipped steps)`, when the graph has a loss scale.
    values: Option<(Value, Value)>,
    every: u64,
    fetching: bool,
    /// The device's count at the last fetch (or when training started) and the global step
    /// then.
    last: Option<(u64, u64)>,
    skipped: u64,
}

impl Default for LossScaleMonitor {
    fn default() -> LossScaleMonitor {
        LossScaleMonitor::new()
    }
}

impl LossScaleMonitor {
    /// A monitor of the graph's loss scale (inert when it has none), fetching with every 10th
    /// step of an epoch and its last.
    pub fn new() -> LossScaleMonitor {
        LossScaleMonitor {
            values: None,
            every: 10,
            fetching: false,
            last: None,
            skipped: 0,
        }
    }

    /// Fetches with every `steps`-th step of an epoch (its first, then every `steps`; 1: every
    /// step) and with its last; 0 is taken as 1.
    pub fn every(mut self, steps: u64) -> LossScaleMonitor {
        self.every = steps.max(1);
        self
    }

    /// Steps skipped for non-finite gradients in this run, as of the last fetch (every skip
    /// of the run once its last step has run).
    pub fn skipped_steps(&self) -> u64 {
        self.skipped
    }
}

/// A fetched integer scalar as a count (negative or unreadable: 0).
fn count(value: &HostTensor) -> u64 {
    value.scalar_value().map_or(0, |v| v.max(0.0) as u64)
}

impl Callback for LossScaleMonitor {
    fn chief_only(&self) -> bool {
        false
    }

    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if let [scale, _applied, skipped] = ctx.graph().collection(LOSS_SCALE_COLLECTION) {
            self.values = Some((*scale, *skipped));
        }
        Ok(())
    }

    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if self.values.is_some() {
            // A resumed run starts from the checkpoint's count.
            let start = count(&ctx.read_variable(LOSS_SCALE_SKIPPED_STEPS)?);
            self.last = Some((start, ctx.global_step()));
        }
        Ok(())
    }

    fn before_run(&mut self, ctx: &TrainContext) -> Result<RunArgs, TrainError> {
        let due = u64::try_from(ctx.local_step()).map_or(true, |s| s % self.every == 0)
            || ctx.counters().is_last_step_of_epoch();
        self.fetching = due && self.values.is_some();
        Ok(match self.values {
            Some((scale, skipped)) if self.fetching => RunArgs::fetch(vec![scale, skipped]),
            _ => RunArgs::none(),
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
        let [scale, skipped] = fetched else {
            return Ok(());
        };
        let scale = scale.scalar_value().unwrap_or(f64::NAN);
        let now = count(skipped);
        // This step's number (the engine's step counter counted it before this monitor runs).
        let step = ctx.global_step();
        let (before, since) = self.last.unwrap_or((0, 0));
        if now > before {
            self.skipped += now - before;
            let steps = if since + 1 == step {
                format!("step {step}")
            } else {
                format!("steps {}..={step}", since + 1)
            };
            log::warn!(
                target: "towerpack",
                "{} step(s) skipped in {steps}: a gradient was not finite under the loss scale; \
                 the scale is now {scale}",
                now - before
            );
            ctx.put_scalar("loss_scale/skipped_steps", self.skipped as f64)?;
        }
        self.last = Some((now, step));
        ctx.put_scalar("loss_scale", scale)
    }
}
