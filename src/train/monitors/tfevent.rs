//! `TFEventWriter`: the monitor that writes a TensorBoard event file in the logdir (scalars,
//! histograms, images and raw events), flushed at the end of every epoch and of training.

use std::path::Path;

use crate::tensor::HostTensor;
use crate::train::error::TrainError;
use crate::train::summary::proto::Event;
use crate::train::summary::{EventFileWriter, PixelRange};

use super::{MonitorSetup, StepStamp, TrainingMonitor};

/// Writes `events.out.tfevents.*` in the logdir (a no-op without one). Each value is stamped
/// with the global step. Images use tensorpack's convention: values in `[0, 255]`.
#[derive(Default)]
pub struct TFEventWriter {
    writer: Option<EventFileWriter>,
}

impl TFEventWriter {
    /// A writer for the run's logdir.
    pub fn new() -> TFEventWriter {
        TFEventWriter::default()
    }

    /// The event file, once training started.
    pub fn path(&self) -> Option<&Path> {
        self.writer.as_ref().map(|w| w.path())
    }
}

impl TrainingMonitor for TFEventWriter {
    fn setup(&mut self, setup: &MonitorSetup) -> Result<(), TrainError> {
        match &setup.logdir {
            Some(dir) => self.writer = Some(EventFileWriter::create(dir)?),
            None => log::warn!(
                target: "towerpack",
                "TFEventWriter: no logdir is set; no TensorBoard events are written"
            ),
        }
        Ok(())
    }

    fn process_scalar(&mut self, name: &str, value: f64, at: &StepStamp) -> Result<(), TrainError> {
        if let Some(w) = self.writer.as_mut() {
            w.put_scalar(name, value, at.global_step)?;
        }
        Ok(())
    }

    fn process_histogram(
        &mut self,
        name: &str,
        values: &HostTensor,
        at: &StepStamp,
    ) -> Result<(), TrainError> {
        if let Some(w) = self.writer.as_mut() {
            // A non-finite histogram is a statistic problem, not a training failure.
            if let Err(e) = w.put_histogram(name, values, at.global_step) {
                log::warn!(target: "towerpack", "TFEventWriter: skipped histogram: {e}");
            }
        }
        Ok(())
    }

    fn process_image(
        &mut self,
        name: &str,
        image: &HostTensor,
        at: &StepStamp,
    ) -> Result<(), TrainError> {
        if let Some(w) = self.writer.as_mut() {
            w.put_image(name, image, PixelRange::Byte, at.global_step)?;
        }
        Ok(())
    }

    fn process_event(&mut self, event: &Event) -> Result<(), TrainError> {
        if let Some(w) = self.writer.as_mut() {
            w.write_event(event)?;
        }
        Ok(())
    }

    fn trigger_epoch(&mut self, _: &StepStamp) -> Result<(), TrainError> {
        if let Some(w) = self.writer.as_mut() {
            w.flush()?;
        }
        Ok(())
    }

    fn after_train(&mut self, _: &StepStamp) -> Result<(), TrainError> {
        if let Some(w) = self.writer.take() {
            w.close()?;
        }
        Ok(())
    }
}
