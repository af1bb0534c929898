//! Exact resume: the state a checkpoint carries beyond the variables (loop position, data
//! position, seed, callback state) in its safetensors metadata, and AutoResume's search of the
//! logdir.
//!
//! Metadata keys: `towerpack.resume` holds the whole [`ResumeState`] as JSON; `epoch_num`,
//! `local_step` and `global_step` repeat the counters in plain text for tools and humans.
//! Randomness needs no state of its own: graph ops draw from `(seed, global_step)` and data
//! flows from `(seed, pass, index)`, both restored exactly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data::FlowState;

use super::checkpoint::{latest_checkpoint, load_checkpoint};
use super::counters::ResumePoint;
use super::error::TrainError;
use super::summary::load_existing_epoch_number;

/// The metadata key of [`ResumeState`].
pub const RESUME_KEY: &str = "towerpack.resume";
const VERSION: u32 = 1;

/// Everything besides variables that an exact resume restores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResumeState {
    pub version: u32,
    /// Counters when the checkpoint was written.
    pub epoch_num: u64,
    pub local_step: i64,
    pub global_step: u64,
    pub steps_per_epoch: u64,
    /// Where the loop continues.
    pub next: ResumePoint,
    /// The run's seed (a resume with another seed is not exact).
    pub seed: u64,
    /// The consumed position of the training input, if it has one.
    pub input: Option<FlowState>,
    /// `save_state` of each callback, by its registration key.
    pub callbacks: BTreeMap<String, serde_json::Value>,
}

impl ResumeState {
    /// A state at `next`, counters and the rest to be filled in.
    pub fn new(next: ResumePoint, seed: u64) -> ResumeState {
        ResumeState {
            version: VERSION,
            epoch_num: 0,
            local_step: -1,
            global_step: 0,
            steps_per_epoch: 0,
            next,
            seed,
            input: None,
            callbacks: BTreeMap::new(),
        }
    }

    /// The checkpoint metadata holding this state.
    pub fn to_metadata(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        // Serializing plain data (numbers, strings, JSON values) cannot fail.
        m.insert(
            RESUME_KEY.to_string(),
            serde_json::to_string(self).unwrap_or_default(),
        );
        m.insert("epoch_num".into(), self.epoch_num.to_string());
        m.insert("local_step".into(), self.local_step.to_string());
        m.insert("global_step".into(), self.global_step.to_string());
        m
    }

    /// The state in checkpoint metadata, `None` if it has none.
    pub fn from_metadata(
        metadata: &BTreeMap<String, String>,
        source: &Path,
    ) -> Result<Option<ResumeState>, TrainError> {
        let Some(text) = metadata.get(RESUME_KEY) else {
            return Ok(None);
        };
        let state: ResumeState = serde_json::from_str(text).map_err(|e| {
            TrainError::Resume(format!(
                "{}: metadata `{RESUME_KEY}` is not valid: {e}",
                source.display()
            ))
        })?;
        if state.version != VERSION {
            return Err(TrainError::Resume(format!(
                "{}: resume state version {} (this build reads {VERSION})",
                source.display(),
                state.version
            )));
        }
        Ok(Some(state))
    }
}

/// What AutoResume found in a logdir.
#[derive(Clone, Debug, PartialEq)]
pub struct FoundResume {
    /// The latest checkpoint.
    pub checkpoint: PathBuf,
    /// Where to continue.
    pub start: ResumePoint,
    /// The exact state, when the checkpoint has one (else tensorpack's rule: the epoch after the
    /// last one in `stats.json`).
    pub state: Option<ResumeState>,
}

/// AutoResume's search of `logdir`: the latest checkpoint and where to continue. `None` when the
/// logdir has neither a checkpoint nor `stats.json` (a fresh run).
///
/// tensorpack asserts that both or neither exist; here a checkpoint with resume metadata needs
/// no `stats.json`, and the remaining cases are errors that say what is missing.
pub fn find_auto_resume(logdir: &Path) -> Result<Option<FoundResume>, TrainError> {
    let checkpoint = latest_checkpoint(logdir)?;
    let last_epoch = load_existing_epoch_number(logdir)?;
    match (checkpoint, last_epoch) {
        (None, None) => Ok(None),
        (None, Some(epoch)) => Err(TrainError::Resume(format!(
            "{} records epoch {epoch}, but {} holds no checkpoint; delete or back up the logdir \
             to start over",
            logdir.join(super::summary::STATS_FILE_NAME).display(),
            logdir.display()
        ))),
        (Some(path), last_epoch) => {
            let loaded = load_checkpoint(&path)?;
            if let Some(state) = ResumeState::from_metadata(&loaded.metadata, &path)? {
                return Ok(Some(FoundResume {
                    checkpoint: path,
                    start: state.next,
                    state: Some(state),
                }));
            }
            match last_epoch {
                Some(epoch) => Ok(Some(FoundResume {
                    checkpoint: path,
                    start: ResumePoint::epoch_start(epoch + 1),
                    state: None,
                })),
                None => Err(TrainError::Resume(format!(
                    "{} has no resume metadata and {} has no stats.json, so the epoch to \
                     continue from is unknown; restore it with session_init and set \
                     starting_epoch instead",
                    path.display(),
                    logdir.display()
                ))),
            }
        }
    }
}
