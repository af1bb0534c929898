//! The loop counters (tensorpack's `TrainLoop`): `epoch_num`, `local_step`, `global_step` and the
//! loop bounds, plus [`ResumePoint`], the position a resumed run continues from.
//!
//! Semantics (tensorpack's): epochs are 1-based and inclusive of `max_epoch`; `epoch_num` is
//! `starting_epoch - 1` during `before_train`; `local_step` is the 0-based index of the current
//! step, -1 before the first, and `steps_per_epoch - 1` during `after_epoch`/`trigger_epoch`;
//! `global_step` mirrors the `global_step` variable and grows by one per hooked run.

use serde::{Deserialize, Serialize};

/// The counters of the training loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopCounters {
    /// The current epoch (the number of finished epochs outside of one).
    pub epoch_num: u64,
    /// Index of the current step in its epoch; -1 before the first step.
    pub local_step: i64,
    /// Hooked runs finished so far, over the whole training (restored on resume).
    pub global_step: u64,
    pub steps_per_epoch: u64,
    pub starting_epoch: u64,
    pub max_epoch: u64,
}

impl LoopCounters {
    /// Counters before training: `epoch_num = starting_epoch - 1`, `local_step = -1`.
    pub fn new(steps_per_epoch: u64, starting_epoch: u64, max_epoch: u64) -> LoopCounters {
        LoopCounters {
            epoch_num: starting_epoch.saturating_sub(1),
            local_step: -1,
            global_step: 0,
            steps_per_epoch,
            starting_epoch,
            max_epoch,
        }
    }

    /// True during the last step of an epoch (`local_step == steps_per_epoch - 1`): where
    /// tensorpack fetches summaries along with the step.
    pub fn is_last_step_of_epoch(&self) -> bool {
        self.steps_per_epoch > 0 && self.local_step == self.steps_per_epoch as i64 - 1
    }

    /// True during the very last step of training.
    pub fn is_last_step_of_training(&self) -> bool {
        self.is_last_step_of_epoch() && self.epoch_num == self.max_epoch
    }
}

/// Where a run continues: step `next_local_step` of epoch `epoch`. `next_local_step` may equal
/// `steps_per_epoch`, meaning the steps of `epoch` all ran and only its `after_epoch` and
/// `trigger_epoch` remain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumePoint {
    pub epoch: u64,
    pub next_local_step: u64,
}

impl ResumePoint {
    /// The start of epoch `epoch`.
    pub fn epoch_start(epoch: u64) -> ResumePoint {
        ResumePoint {
            epoch,
            next_local_step: 0,
        }
    }
}
