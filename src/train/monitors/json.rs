//! `JSONWriter`: the monitor that keeps `<logdir>/stats.json` (see
//! [`StatsJsonWriter`](crate::train::summary::StatsJsonWriter) for the format and the
//! append-or-back-up rule; a resumed run drops the records of the redone steps and appends).

use crate::train::error::TrainError;
use crate::train::summary::{StartOutcome, StatsJsonWriter, StatsRecord};

use super::{MonitorSetup, StepStamp, TrainingMonitor};

/// Writes `stats.json`: one record per flush, flushed at every `trigger_step` except the last
/// step of an epoch, and at every `trigger_epoch`, when new scalars arrived.
#[derive(Debug, Default)]
pub struct JSONWriter {
    writer: Option<StatsJsonWriter>,
}

impl JSONWriter {
    /// A writer for the run's logdir (a no-op without one).
    pub fn new() -> JSONWriter {
        JSONWriter::default()
    }

    /// The records written so far (including those of an appended-to file).
    pub fn records(&self) -> &[StatsRecord] {
        self.writer.as_ref().map_or(&[], |w| w.records())
    }

    fn flush(&mut self, at: &StepStamp) -> Result<(), TrainError> {
        if let Some(w) = self.writer.as_mut() {
            w.flush(at.epoch_num, at.global_step)?;
        }
        Ok(())
    }
}

impl TrainingMonitor for JSONWriter {
    fn setup(&mut self, setup: &MonitorSetup) -> Result<(), TrainError> {
        let Some(dir) = &setup.logdir else {
            log::warn!(target: "towerpack", "JSONWriter: no logdir is set; stats.json is not written");
            return Ok(());
        };
        let mut writer = StatsJsonWriter::new(dir);
        let outcome = match setup.resumed_at {
            Some(step) => writer.on_resume(step)?,
            None => writer.on_start(setup.counters.starting_epoch)?,
        };
        match outcome {
            StartOutcome::Fresh => {}
            StartOutcome::Appending { existing } => log::info!(
                target: "towerpack",
                "Found {} with {existing} records; appending to it", writer.path().display()
            ),
            StartOutcome::BackedUp { backup, reason } => log::warn!(
                target: "towerpack",
                "{} does not continue this run ({reason}); moved it to {}",
                writer.path().display(),
                backup.display()
            ),
        }
        self.writer = Some(writer);
        Ok(())
    }

    fn process_scalar(&mut self, name: &str, value: f64, _: &StepStamp) -> Result<(), TrainError> {
        if let Some(w) = self.writer.as_mut() {
            w.put_scalar(name, value);
        }
        Ok(())
    }

    fn trigger_step(&mut self, at: &StepStamp) -> Result<(), TrainError> {
        if at.is_last_step_of_epoch() {
            return Ok(()); // trigger_epoch flushes it with the epoch's statistics
        }
        self.flush(at)
    }

    fn trigger_epoch(&mut self, at: &StepStamp) -> Result<(), TrainError> {
        self.flush(at)
    }

    fn after_train(&mut self, at: &StepStamp) -> Result<(), TrainError> {
        self.flush(at)
    }
}
