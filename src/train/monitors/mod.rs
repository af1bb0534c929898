//! Monitors (tensorpack's `trainer.monitors`): the dispatcher every callback puts scalars,
//! histograms, images and events into, its `(global_step, value)` scalar history, and the
//! [`TrainingMonitor`] back ends — [`JSONWriter`] (`stats.json`), [`TFEventWriter`]
//! (TensorBoard) and [`ScalarPrinter`] — driven over the file formats of [`super::summary`].
//!
//! Tags lose a leading `tower<k>/` and a trailing `-summary`, as tensorpack's `put_summary` does,
//! so every tower's statistics land under one name.

mod json;
mod printer;
mod tfevent;

pub use json::JSONWriter;
pub use printer::{ScalarPrinter, format_5g};
pub use tfevent::TFEventWriter;

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::tensor::HostTensor;

use super::any::AsAny;
use super::counters::LoopCounters;
use super::error::TrainError;
use super::summary::proto::Event;

/// When a value was put: the loop counters at that moment.
pub type StepStamp = LoopCounters;

/// What monitors learn once, in `before_train`.
#[derive(Clone, Debug)]
pub struct MonitorSetup {
    /// Where files go; `None` makes file-writing monitors no-ops (tensorpack's `NoOpMonitor`).
    pub logdir: Option<PathBuf>,
    pub counters: LoopCounters,
    /// The global step a resumed run restored (`None` for a fresh run).
    pub resumed_at: Option<u64>,
}

/// A monitor back end. Every method has a do-nothing default.
#[allow(unused_variables)]
pub trait TrainingMonitor: AsAny {
    /// The name used in logs.
    fn name(&self) -> String {
        super::any::short_type_name(std::any::type_name_of_val(self))
    }
    /// Once, before training (after any resume).
    fn setup(&mut self, setup: &MonitorSetup) -> Result<(), TrainError> {
        Ok(())
    }
    fn process_scalar(&mut self, name: &str, value: f64, at: &StepStamp) -> Result<(), TrainError> {
        Ok(())
    }
    fn process_histogram(
        &mut self,
        name: &str,
        values: &HostTensor,
        at: &StepStamp,
    ) -> Result<(), TrainError> {
        Ok(())
    }
    /// `image` is HW, HWC, NHW or NHWC, `u8` (0..255) or float (0..1).
    fn process_image(
        &mut self,
        name: &str,
        image: &HostTensor,
        at: &StepStamp,
    ) -> Result<(), TrainError> {
        Ok(())
    }
    fn process_event(&mut self, event: &Event) -> Result<(), TrainError> {
        Ok(())
    }
    fn trigger_step(&mut self, at: &StepStamp) -> Result<(), TrainError> {
        Ok(())
    }
    fn trigger_epoch(&mut self, at: &StepStamp) -> Result<(), TrainError> {
        Ok(())
    }
    fn after_train(&mut self, at: &StepStamp) -> Result<(), TrainError> {
        Ok(())
    }
}

/// tensorpack's default monitors: `[TFEventWriter, JSONWriter, ScalarPrinter]`.
pub fn default_monitors() -> Vec<Box<dyn TrainingMonitor>> {
    vec![
        Box::new(TFEventWriter::new()),
        Box::new(JSONWriter::new()),
        Box::new(ScalarPrinter::new()),
    ]
}

/// A tag as monitors store it: a leading `tower<digits>/` and a trailing `-summary` removed.
pub fn normalize_tag(tag: &str) -> String {
    let mut t = tag;
    if let Some(rest) = t.strip_prefix("tower") {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with('/') {
            t = &rest[digits + 1..];
        }
    }
    t.strip_suffix("-summary").unwrap_or(t).to_string()
}

/// The dispatcher: forwards every put to each back end in order and keeps the scalar history.
#[derive(Default)]
pub struct Monitors {
    backends: Vec<Box<dyn TrainingMonitor>>,
    history: BTreeMap<String, Vec<(u64, f64)>>,
}

impl Monitors {
    /// A dispatcher over `backends`.
    pub fn new(backends: Vec<Box<dyn TrainingMonitor>>) -> Monitors {
        Monitors {
            backends,
            history: BTreeMap::new(),
        }
    }

    /// The back ends, in order.
    pub fn backends(&self) -> &[Box<dyn TrainingMonitor>] {
        &self.backends
    }

    /// The first back end of type `M`, if any.
    pub fn backend<M: TrainingMonitor>(&self) -> Option<&M> {
        self.backends
            .iter()
            .find_map(|b| (**b).as_any().downcast_ref::<M>())
    }

    /// Puts a scalar at `at`: recorded in the history and sent to every back end.
    pub fn put_scalar(&mut self, name: &str, value: f64, at: &StepStamp) -> Result<(), TrainError> {
        let name = normalize_tag(name);
        self.history
            .entry(name.clone())
            .or_default()
            .push((at.global_step, value));
        self.backends
            .iter_mut()
            .try_for_each(|b| b.process_scalar(&name, value, at))
    }

    /// Puts a histogram of every element of `values`.
    pub fn put_histogram(
        &mut self,
        name: &str,
        values: &HostTensor,
        at: &StepStamp,
    ) -> Result<(), TrainError> {
        let name = normalize_tag(name);
        self.backends
            .iter_mut()
            .try_for_each(|b| b.process_histogram(&name, values, at))
    }

    /// Puts an image (or a batch of images).
    pub fn put_image(
        &mut self,
        name: &str,
        image: &HostTensor,
        at: &StepStamp,
    ) -> Result<(), TrainError> {
        let name = normalize_tag(name);
        self.backends
            .iter_mut()
            .try_for_each(|b| b.process_image(&name, image, at))
    }

    /// Puts a raw event, stamped with the global step (and now, if its time is 0).
    pub fn put_event(&mut self, mut event: Event, at: &StepStamp) -> Result<(), TrainError> {
        event.step = i64::try_from(at.global_step).unwrap_or(i64::MAX);
        if event.wall_time == 0.0 {
            event.wall_time = super::summary::tfevents::wall_time_now();
        }
        self.backends
            .iter_mut()
            .try_for_each(|b| b.process_event(&event))
    }

    /// The latest value of scalar `name` (tensorpack's `get_latest`, `None` for its KeyError).
    pub fn get_latest(&self, name: &str) -> Option<f64> {
        self.history
            .get(name)
            .and_then(|h| h.last())
            .map(|&(_, v)| v)
    }

    /// Every `(global_step, value)` of scalar `name`, oldest first (empty if none).
    pub fn get_history(&self, name: &str) -> &[(u64, f64)] {
        self.history.get(name).map_or(&[], |h| h.as_slice())
    }

    /// The names of every scalar put so far.
    pub fn scalar_names(&self) -> Vec<String> {
        self.history.keys().cloned().collect()
    }

    pub(crate) fn setup(&mut self, setup: &MonitorSetup) -> Result<(), TrainError> {
        self.backends.iter_mut().try_for_each(|b| b.setup(setup))
    }

    pub(crate) fn trigger_step(&mut self, at: &StepStamp) -> Result<(), TrainError> {
        self.backends
            .iter_mut()
            .try_for_each(|b| b.trigger_step(at))
    }

    pub(crate) fn trigger_epoch(&mut self, at: &StepStamp) -> Result<(), TrainError> {
        self.backends
            .iter_mut()
            .try_for_each(|b| b.trigger_epoch(at))
    }

    /// Runs every back end's `after_train`, even after a failure; returns the first error.
    pub(crate) fn after_train(&mut self, at: &StepStamp) -> Result<(), TrainError> {
        let mut first = None;
        for b in &mut self.backends {
            if let Err(e) = b.after_train(at) {
                log::error!(target: "towerpack", "monitor {} after_train failed: {e}", b.name());
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::normalize_tag;

    #[test]
    fn tower_prefixes_and_summary_suffixes_are_stripped() {
        assert_eq!(normalize_tag("tower0/cost"), "cost");
        assert_eq!(normalize_tag("tower12/a/b-summary"), "a/b");
        assert_eq!(normalize_tag("towerx/cost"), "towerx/cost");
        assert_eq!(normalize_tag("tower/cost"), "tower/cost");
        assert_eq!(normalize_tag("validation_error"), "validation_error");
    }
}
