//! `test_data_speed`: tensorpack's `TestDataSpeed`, pulling datapoints through a flow and
//! reporting the rate (a ratio to compare pipelines side by side, not an absolute figure).

use super::DataError;
use super::flow::DataFlow;
use std::time::{Duration, Instant};

/// What [`test_data_speed`] measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DataSpeed {
    pub datapoints: usize,
    pub elapsed: Duration,
}

impl DataSpeed {
    /// Datapoints per second.
    pub fn per_second(&self) -> f64 {
        self.datapoints as f64 / self.elapsed.as_secs_f64().max(1e-12)
    }
}

/// Pulls `count` datapoints from `flow` (crossing pass ends) and times it. The flow must have
/// been `reset_state()`; its position advances. An empty pass is an error.
pub fn test_data_speed(flow: &mut dyn DataFlow, count: usize) -> Result<DataSpeed, DataError> {
    let start = Instant::now();
    let mut datapoints = 0;
    let mut empty_run = false;
    while datapoints < count {
        if flow.next_datapoint()?.is_some() {
            datapoints += 1;
            empty_run = false;
        } else if std::mem::replace(&mut empty_run, true) {
            return Err(DataError::EmptyPass { flow: flow.name() });
        }
    }
    Ok(DataSpeed {
        datapoints,
        elapsed: start.elapsed(),
    })
}
