//! The ordered callback list: registration (chief-only filtering, unique state keys), dispatch
//! of every lifecycle point in order, merging of `before_run` additions into one step, and the
//! checkpoints asked for during a trigger round, written when the round ends.
//!
//! Rounds: the first error ends a round (later callbacks are not called), except `after_train`,
//! where every callback runs and errors are collected. Saves asked for in a round are written at
//! its end — also after a clean stop, never after an error.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::backend::{Feed, Step};
use crate::ir::{NodeId, Value};
use crate::tensor::HostTensor;
use crate::tower::VarCollection;

use super::callback::{Callback, SavedCheckpointInfo};
use super::checkpoint::{latest_checkpoint, step_of_file_name};
use super::context::{TrainContext, wall_seconds};
use super::counters::ResumePoint;
use super::error::TrainError;
use super::resume::ResumeState;

struct Registered {
    callback: Box<dyn Callback>,
    key: String,
}

/// One hooked run's step after every callback added to it.
pub(crate) struct MergedRun {
    pub(crate) step: Step,
    pub(crate) feeds: Vec<Feed>,
    /// Positions in the fetch list of the trainer's own fetches.
    pub(crate) base: Vec<usize>,
    /// Positions of each callback's fetches.
    pub(crate) per_callback: Vec<Vec<usize>>,
}

/// Where a checkpoint written at the end of a round lets the loop continue.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Round {
    /// `before_train`: the run's start point.
    BeforeTrain(ResumePoint),
    /// A step's `trigger_step`s: the next step.
    Step,
    /// An epoch's `trigger_epoch`s: the next epoch.
    Epoch,
}

/// The callbacks of a run, in call order.
#[derive(Default)]
pub(crate) struct CallbackList {
    entries: Vec<Registered>,
}

impl CallbackList {
    /// Adds `callback` unless it is chief-only and this worker is not the chief. Returns
    /// whether it was added.
    pub(crate) fn register(&mut self, callback: Box<dyn Callback>, is_chief: bool) -> bool {
        let name = callback.name();
        if callback.chief_only() && !is_chief {
            log::warn!(target: "towerpack", "Callback {name} is chief-only, skipped.");
            return false;
        }
        let same = self
            .entries
            .iter()
            .filter(|e| e.key == name || e.key.starts_with(&format!("{name}#")))
            .count();
        let key = if same == 0 {
            name
        } else {
            format!("{name}#{same}")
        };
        self.entries.push(Registered { callback, key });
        true
    }

    /// The registration keys, in order.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.key.clone()).collect()
    }

    pub(crate) fn into_callbacks(self) -> Vec<Box<dyn Callback>> {
        self.entries.into_iter().map(|e| e.callback).collect()
    }

    /// Calls `hook` on each callback in order, stopping at the first error.
    fn each(
        &mut self,
        ctx: &mut TrainContext,
        mut hook: impl FnMut(&mut dyn Callback, &mut TrainContext) -> Result<(), TrainError>,
    ) -> Result<(), TrainError> {
        for e in &mut self.entries {
            hook(e.callback.as_mut(), ctx)?;
        }
        Ok(())
    }

    pub(crate) fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.each(ctx, |c, ctx| c.setup_graph(ctx))
    }

    pub(crate) fn before_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.each(ctx, |c, ctx| c.before_epoch(ctx))
    }

    pub(crate) fn after_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.each(ctx, |c, ctx| c.after_epoch(ctx))
    }

    pub(crate) fn before_train(
        &mut self,
        ctx: &mut TrainContext,
        start: ResumePoint,
    ) -> Result<(), TrainError> {
        let result = self.each(ctx, |c, ctx| c.before_train(ctx));
        self.end_round(ctx, Round::BeforeTrain(start), result)
    }

    pub(crate) fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let result = self.each(ctx, |c, ctx| c.trigger_step(ctx));
        self.end_round(ctx, Round::Step, result)
    }

    /// `trigger_epoch` of each callback, timed: when the round takes 2 s or more, callbacks
    /// that took over 30% of it and over 1 s are named in the log (tensorpack's rule).
    pub(crate) fn trigger_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let mut times: Vec<(String, Duration)> = Vec::new();
        let result = self.each(ctx, |c, ctx| {
            let t = Instant::now();
            let r = c.trigger_epoch(ctx);
            times.push((c.name(), t.elapsed()));
            r
        });
        let total: Duration = times.iter().map(|(_, t)| *t).sum();
        if total >= Duration::from_secs(2) {
            for (name, t) in &times {
                if t.as_secs_f64() > 0.3 * total.as_secs_f64() && *t > Duration::from_secs(1) {
                    log::info!(
                        target: "towerpack",
                        "CallbackTimeLogger: {name} took {:.3} sec of the epoch's {:.3} sec of \
                         callbacks",
                        t.as_secs_f64(),
                        total.as_secs_f64()
                    );
                }
            }
        }
        self.end_round(ctx, Round::Epoch, result)
    }

    /// Every callback's `after_train`, even when some fail; returns the errors in order.
    pub(crate) fn after_train(&mut self, ctx: &mut TrainContext) -> Vec<TrainError> {
        ctx.checkpoints.pending.clear();
        let mut errors = Vec::new();
        for e in &mut self.entries {
            if let Err(err) = e.callback.after_train(ctx) {
                log::error!(target: "towerpack", "{}.after_train failed: {err}", e.key);
                errors.push(err);
            }
        }
        errors
    }

    /// Merges the trainer's fetches and targets with what each callback's `before_run` adds.
    pub(crate) fn before_run(
        &mut self,
        ctx: &TrainContext,
        fetches: &[Value],
        targets: &[NodeId],
    ) -> Result<MergedRun, TrainError> {
        let mut all_fetches: Vec<Value> = Vec::new();
        let mut index: HashMap<Value, usize> = HashMap::new();
        let mut position = |v: Value, all: &mut Vec<Value>| {
            *index.entry(v).or_insert_with(|| {
                all.push(v);
                all.len() - 1
            })
        };
        let base = fetches
            .iter()
            .map(|&v| position(v, &mut all_fetches))
            .collect();
        let mut all_targets: Vec<NodeId> = targets.to_vec();
        let mut feeds = Vec::new();
        let mut per_callback = Vec::with_capacity(self.entries.len());
        for e in &mut self.entries {
            let args = e.callback.before_run(ctx)?;
            per_callback.push(
                args.fetches
                    .iter()
                    .map(|&v| position(v, &mut all_fetches))
                    .collect(),
            );
            for t in args.targets {
                if !all_targets.contains(&t) {
                    all_targets.push(t);
                }
            }
            feeds.extend(args.feeds);
        }
        Ok(MergedRun {
            step: Step::new(all_fetches, all_targets),
            feeds,
            base,
            per_callback,
        })
    }

    /// Hands each callback the values of its fetches.
    pub(crate) fn after_run(
        &mut self,
        ctx: &mut TrainContext,
        values: &[HostTensor],
        merged: &MergedRun,
    ) -> Result<(), TrainError> {
        for (e, positions) in self.entries.iter_mut().zip(&merged.per_callback) {
            let mine: Vec<HostTensor> = positions.iter().map(|&i| values[i].clone()).collect();
            e.callback.after_run(ctx, &mine)?;
        }
        Ok(())
    }

    /// Every callback's resume state, by key.
    pub(crate) fn save_states(&self) -> BTreeMap<String, serde_json::Value> {
        self.entries
            .iter()
            .filter_map(|e| e.callback.save_state().map(|s| (e.key.clone(), s)))
            .collect()
    }

    /// Gives each callback its saved state; states of callbacks no longer registered are
    /// reported, as are callbacks without a saved state.
    pub(crate) fn restore_states(
        &mut self,
        states: &BTreeMap<String, serde_json::Value>,
    ) -> Result<(), TrainError> {
        for e in &mut self.entries {
            if let Some(state) = states.get(&e.key) {
                e.callback.restore_state(state)?;
            } else if e.callback.save_state().is_some() {
                log::warn!(
                    target: "towerpack",
                    "Resume: the checkpoint has no state for callback {}; it starts fresh",
                    e.key
                );
            }
        }
        let known = self.keys();
        for key in states.keys().filter(|k| !known.contains(k)) {
            log::warn!(
                target: "towerpack",
                "Resume: the checkpoint has state for callback {key}, which this run does not have"
            );
        }
        Ok(())
    }

    /// Ends a round: writes the checkpoints asked for (unless the round failed other than by
    /// a clean stop), then returns the round's result.
    fn end_round(
        &mut self,
        ctx: &mut TrainContext,
        round: Round,
        result: Result<(), TrainError>,
    ) -> Result<(), TrainError> {
        if let Err(e) = &result
            && !e.is_stop()
        {
            ctx.checkpoints.pending.clear();
            return result;
        }
        if !ctx.checkpoints.pending.is_empty() {
            self.save_pending(ctx, round)?;
        }
        result
    }

    /// The last checkpoint of an interrupted run: the state after the current step (what a
    /// step's trigger round saves, so a resume continues with the next step) in every open
    /// checkpoint directory. A directory whose latest checkpoint is already of this global step
    /// (a saver triggered in this step's round) is not written twice. Returns the checkpoints.
    pub(crate) fn save_after_interrupt(
        &mut self,
        ctx: &mut TrainContext,
    ) -> Result<Vec<PathBuf>, TrainError> {
        let step = ctx.counters.global_step;
        let mut checkpoints = Vec::new();
        ctx.checkpoints.pending.clear();
        let dirs: Vec<PathBuf> = ctx.checkpoints.managers.keys().cloned().collect();
        for dir in dirs {
            if let Some(latest) = latest_checkpoint(&dir)?
                && latest
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(step_of_file_name)
                    == Some(step)
            {
                checkpoints.push(latest);
            } else {
                ctx.checkpoints.pending.push(dir);
            }
        }
        if !ctx.checkpoints.pending.is_empty() {
            let saved = self.save_pending(ctx, Round::Step)?;
            checkpoints.extend(saved.into_iter().map(|info| info.path));
        }
        Ok(checkpoints)
    }

    /// Writes the checkpoints asked for in this round; returns those written.
    fn save_pending(
        &mut self,
        ctx: &mut TrainContext,
        round: Round,
    ) -> Result<Vec<SavedCheckpointInfo>, TrainError> {
        let c = ctx.counters;
        let next = match round {
            Round::BeforeTrain(start) => start,
            Round::Step => ResumePoint {
                epoch: c.epoch_num,
                next_local_step: u64::try_from(c.local_step + 1).unwrap_or(0),
            },
            Round::Epoch => ResumePoint::epoch_start(c.epoch_num + 1),
        };
        let mut state = ResumeState::new(next, ctx.seed);
        state.epoch_num = c.epoch_num;
        state.local_step = c.local_step;
        state.global_step = c.global_step;
        state.steps_per_epoch = c.steps_per_epoch;
        state.input = ctx.input_state();
        state.callbacks = self.save_states();
        let metadata = state.to_metadata();
        let tensors = {
            let session = ctx.session("writing a checkpoint")?;
            let graph = session.graph();
            let ids = VarCollection::Global.variables(graph);
            let names: Vec<String> = ids
                .iter()
                .map(|&id| graph.variable(id).name.clone())
                .collect();
            let mut tensors = Vec::with_capacity(ids.len());
            for (id, name) in ids.into_iter().zip(names) {
                tensors.push((name, session.read_variable(id)?));
            }
            tensors
        };
        let dirs = std::mem::take(&mut ctx.checkpoints.pending);
        let mut saved = Vec::new();
        for dir in dirs {
            let Some(manager) = ctx.checkpoints.managers.get_mut(&dir) else {
                continue;
            };
            match manager.save(c.global_step, &tensors, &metadata, wall_seconds()) {
                Ok(result) => {
                    log::info!(target: "towerpack", "Model saved to {}.", result.path.display());
                    for (path, e) in &result.failed_deletes {
                        log::warn!(target: "towerpack", "Cannot delete old checkpoint {}: {e}", path.display());
                    }
                    saved.push(SavedCheckpointInfo {
                        dir: dir.clone(),
                        path: result.path,
                        global_step: c.global_step,
                    });
                }
                // tensorpack's ModelSaver logs IO errors (full disk, permissions) and goes on.
                Err(e) => {
                    log::error!(target: "towerpack", "Failed to save a checkpoint in {}: {e}", dir.display())
                }
            }
        }
        for info in &saved {
            self.each(ctx, |cb, ctx| cb.on_checkpoint_saved(ctx, info))?;
        }
        Ok(saved)
    }
}
