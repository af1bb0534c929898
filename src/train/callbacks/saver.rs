//! Checkpoint callbacks: [`ModelSaver`] asks for `model-<global_step>.safetensors` on every
//! trigger, with tensorpack's retention (`max_to_keep`, `keep_checkpoint_every_n_hours`);
//! [`MinSaver`] / [`MaxSaver`] copy the checkpoint of the best value of a statistic.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::train::callback::{Callback, SavedCheckpointInfo};
use crate::train::checkpoint::{
    RetentionPolicy, latest_checkpoint, step_of_file_name, write_atomically,
};
use crate::train::context::TrainContext;
use crate::train::error::{ConfigError, TrainError};

/// Saves a checkpoint of every global variable (weights, BatchNorm EMAs, optimizer slots,
/// `global_step`, `learning_rate`) plus the exact-resume state, on each trigger (every epoch by
/// default; wrap it in a `PeriodicTrigger` for other schedules). The file is written at the end
/// of the trigger round, so it holds one consistent state of the loop. IO errors are logged,
/// not fatal (tensorpack's behaviour).
#[derive(Clone, Debug)]
pub struct ModelSaver {
    max_to_keep: usize,
    keep_every_n_hours: f64,
    checkpoint_dir: Option<PathBuf>,
    dir: Option<PathBuf>,
}

impl Default for ModelSaver {
    fn default() -> ModelSaver {
        ModelSaver::new()
    }
}

impl ModelSaver {
    /// tensorpack's defaults: keep 10, plus one every 0.5 hours; in the logdir.
    pub fn new() -> ModelSaver {
        ModelSaver {
            max_to_keep: 10,
            keep_every_n_hours: 0.5,
            checkpoint_dir: None,
            dir: None,
        }
    }

    /// How many recent checkpoints to keep (0: all).
    pub fn max_to_keep(mut self, n: usize) -> ModelSaver {
        self.max_to_keep = n;
        self
    }

    /// Also keep one checkpoint per this many hours for good (0 disables).
    pub fn keep_checkpoint_every_n_hours(mut self, hours: f64) -> ModelSaver {
        self.keep_every_n_hours = hours;
        self
    }

    /// Saves to `dir` instead of the logdir.
    pub fn checkpoint_dir(mut self, dir: impl AsRef<Path>) -> ModelSaver {
        self.checkpoint_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// The directory in use (after setup).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }
}

/// `explicit`, else the logdir; an error naming `who` without either.
fn checkpoint_dir_of(
    who: &str,
    explicit: &Option<PathBuf>,
    ctx: &TrainContext,
) -> Result<PathBuf, TrainError> {
    explicit
        .clone()
        .or_else(|| ctx.logdir().map(Path::to_path_buf))
        .ok_or_else(|| {
            TrainError::from(ConfigError::NoCheckpointDir {
                callback: who.to_string(),
            })
        })
}

impl Callback for ModelSaver {
    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.dir = Some(checkpoint_dir_of("ModelSaver", &self.checkpoint_dir, ctx)?);
        Ok(())
    }

    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        let keep_every = (self.keep_every_n_hours > 0.0)
            .then(|| Duration::from_secs_f64(self.keep_every_n_hours * 3600.0));
        let policy = RetentionPolicy {
            max_to_keep: self.max_to_keep,
            keep_every,
        };
        ctx.open_checkpoint_dir(&dir, policy)
    }

    fn trigger(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        match self.dir.clone() {
            Some(dir) => ctx.request_checkpoint(&dir),
            None => Ok(()),
        }
    }
}

/// Keeps a copy of the checkpoint with the lowest value of a statistic, as
/// `min-<stat>.safetensors` in the checkpoint directory (tensorpack's `MinSaver`).
///
/// On each trigger it reads the statistic's latest `(global_step, value)`; when it is the best
/// so far, the checkpoint of that global step in the directory (by a `ModelSaver` with the same
/// directory: already the latest, or written at the end of the same trigger round) is copied.
/// When there is none, the next trigger warns that the best was not saved (tensorpack's rule).
/// The best value is part of the resume state.
#[derive(Clone, Debug)]
pub struct MinSaver {
    stat: String,
    reverse: bool,
    filename: Option<String>,
    checkpoint_dir: Option<PathBuf>,
    dir: Option<PathBuf>,
    best: Option<(u64, f64)>,
    pending: Option<(u64, f64)>,
}

impl MinSaver {
    /// Keeps the checkpoint with the minimum of `stat`.
    pub fn new(stat: &str) -> MinSaver {
        MinSaver {
            stat: stat.to_string(),
            reverse: false,
            filename: None,
            checkpoint_dir: None,
            dir: None,
            best: None,
            pending: None,
        }
    }

    /// Names the copy `filename` (default `min-<stat>.safetensors` / `max-<stat>...`).
    pub fn filename(mut self, filename: &str) -> MinSaver {
        self.filename = Some(filename.to_string());
        self
    }

    /// The checkpoint directory (default: the logdir).
    pub fn checkpoint_dir(mut self, dir: impl AsRef<Path>) -> MinSaver {
        self.checkpoint_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// The best `(global_step, value)` so far.
    pub fn best(&self) -> Option<(u64, f64)> {
        self.best
    }

    /// The path of the copy (after setup).
    pub fn copy_path(&self) -> Option<PathBuf> {
        let prefix = if self.reverse { "max" } else { "min" };
        let name = self
            .filename
            .clone()
            .unwrap_or_else(|| format!("{prefix}-{}.safetensors", self.stat.replace('/', "-")));
        self.dir.as_ref().map(|d| d.join(name))
    }

    /// Copies checkpoint `path` to [`MinSaver::copy_path`] (atomically); clears the pending copy.
    fn copy(&mut self, path: &Path) -> Result<(), TrainError> {
        self.pending = None;
        let Some(dst) = self.copy_path() else {
            return Ok(());
        };
        let bytes = std::fs::read(path).map_err(TrainError::io(path))?;
        write_atomically(&dst, &bytes).map_err(TrainError::io(&dst))?;
        log::info!(
            target: "towerpack",
            "{}: copied {} to {}",
            self.name(),
            path.display(),
            dst.display()
        );
        Ok(())
    }

    fn better(&self, value: f64, best: f64) -> bool {
        if self.reverse {
            value > best
        } else {
            value < best
        }
    }
}

impl Callback for MinSaver {
    fn name(&self) -> String {
        let kind = if self.reverse { "MaxSaver" } else { "MinSaver" };
        format!("{kind}({})", self.stat)
    }

    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.dir = Some(checkpoint_dir_of(&self.name(), &self.checkpoint_dir, ctx)?);
        Ok(())
    }

    fn trigger(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if let Some((step, _)) = self.pending.take() {
            log::warn!(
                target: "towerpack",
                "{}: no checkpoint was written at global_step {step}, where {} was best; not \
                 saved (is a ModelSaver with the same directory triggered at the same time?)",
                self.name(),
                self.stat
            );
        }
        let Some(&(step, value)) = ctx.monitors().get_history(&self.stat).last() else {
            log::warn!(target: "towerpack", "{}: statistic {} has no value yet", self.name(), self.stat);
            return Ok(());
        };
        if self.best.is_none_or(|(_, b)| self.better(value, b)) {
            self.best = Some((step, value));
            self.pending = Some((step, value));
            // The checkpoint of this step may exist already (written in an earlier round at
            // the same global step, e.g. by a step-triggered ModelSaver): copy it now.
            if let Some(dir) = self.dir.clone()
                && let Some(latest) = latest_checkpoint(&dir)?
                && latest
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(step_of_file_name)
                    == Some(step)
            {
                self.copy(&latest)?;
            }
        }
        Ok(())
    }

    fn on_checkpoint_saved(
        &mut self,
        _: &mut TrainContext,
        saved: &SavedCheckpointInfo,
    ) -> Result<(), TrainError> {
        let Some((step, value)) = self.pending else {
            return Ok(());
        };
        if Some(&saved.dir) != self.dir.as_ref() || saved.global_step != step {
            return Ok(());
        }
        log::info!(target: "towerpack", "{} = {value} is the best so far", self.stat);
        self.copy(&saved.path)
    }

    fn save_state(&self) -> Option<serde_json::Value> {
        Some(json!({ "best": self.best }))
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), TrainError> {
        self.best = serde_json::from_value(state["best"].clone())
            .map_err(|e| TrainError::Resume(format!("{}: bad state: {e}", self.name())))?;
        Ok(())
    }
}

/// [`MinSaver`] for the maximum: `max-<stat>.safetensors` (tensorpack's `MaxSaver`).
pub struct MaxSaver;

impl MaxSaver {
    /// Keeps the checkpoint with the maximum of `stat`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(stat: &str) -> MinSaver {
        MinSaver {
            reverse: true,
            ..MinSaver::new(stat)
        }
    }
}
