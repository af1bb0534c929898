//! `DataFromList`: the in-memory source flow, optionally reshuffled on every pass with a
//! permutation drawn from `(seed, pass)`.

use super::DataError;
use super::flow::{DataFlow, Datapoint, FlowState, Skipped, counter, flag};
use super::rng::{RandomKey, permutation};
use std::sync::Arc;

const NAME: &str = "DataFromList";

/// Yields the datapoints of a list, in order or in a fresh permutation per pass.
///
/// The permutation of pass `p` depends only on `(seed, p)`, so passes differ from each other yet
/// every run (and every restored run) sees the same orders.
#[derive(Clone)]
pub struct DataFromList {
    items: Arc<Vec<Datapoint>>,
    shuffle_seed: Option<u64>,
    ready: bool,
    pass: u64,
    index: usize,
    /// The order of `pass` (absent when not shuffling).
    order: Option<(u64, Arc<Vec<usize>>)>,
}

impl DataFromList {
    /// The datapoints in list order every pass.
    pub fn new(items: Vec<Datapoint>) -> DataFromList {
        DataFromList::from_shared(Arc::new(items), None)
    }

    /// The datapoints in a new order every pass, drawn from `seed`.
    pub fn shuffled(items: Vec<Datapoint>, seed: u64) -> DataFromList {
        DataFromList::from_shared(Arc::new(items), Some(seed))
    }

    /// Shares an existing list (cheap to build several flows over one data set).
    pub fn from_shared(items: Arc<Vec<Datapoint>>, shuffle_seed: Option<u64>) -> DataFromList {
        DataFromList {
            items,
            shuffle_seed,
            ready: false,
            pass: 0,
            index: 0,
            order: None,
        }
    }

    /// The pass the next datapoint belongs to.
    pub fn current_pass(&self) -> u64 {
        self.pass
    }

    fn item_at(&mut self, position: usize) -> &Datapoint {
        let Some(seed) = self.shuffle_seed else {
            return &self.items[position];
        };
        let stale = !matches!(&self.order, Some((p, _)) if *p == self.pass);
        if stale {
            let perm = permutation(self.items.len(), RandomKey::for_pass(seed, self.pass));
            self.order = Some((self.pass, Arc::new(perm)));
        }
        match &self.order {
            Some((_, perm)) => &self.items[perm[position]],
            // Just filled above.
            None => &self.items[position],
        }
    }

    fn finish_pass(&mut self) {
        self.pass += 1;
        self.index = 0;
    }
}

impl DataFlow for DataFromList {
    fn name(&self) -> &'static str {
        NAME
    }

    fn reset_state(&mut self) -> Result<(), DataError> {
        self.ready = true;
        Ok(())
    }

    fn len(&self) -> Option<usize> {
        Some(self.items.len())
    }

    fn next_datapoint(&mut self) -> Result<Option<Datapoint>, DataError> {
        if !self.ready {
            return Err(DataError::NotReset { flow: NAME });
        }
        if self.index >= self.items.len() {
            self.finish_pass();
            return Ok(None);
        }
        let position = self.index;
        self.index += 1;
        Ok(Some(self.item_at(position).clone()))
    }

    fn skip(&mut self, n: usize) -> Result<Skipped, DataError> {
        if !self.ready {
            return Err(DataError::NotReset { flow: NAME });
        }
        let left = self.items.len() - self.index;
        if n <= left {
            self.index += n;
            return Ok(Skipped {
                count: n,
                pass_ended: false,
            });
        }
        self.finish_pass();
        Ok(Skipped {
            count: left,
            pass_ended: true,
        })
    }

    fn end_pass(&mut self) -> Result<(), DataError> {
        self.finish_pass();
        Ok(())
    }

    /// Counters: `[pass, index, list length, shuffles (0/1), shuffle seed]`; the last three only
    /// guard against restoring into a different data set or seed.
    fn state(&self) -> FlowState {
        FlowState::new(
            NAME,
            vec![
                self.pass,
                self.index as u64,
                self.items.len() as u64,
                u64::from(self.shuffle_seed.is_some()),
                self.shuffle_seed.unwrap_or(0),
            ],
            Vec::new(),
        )
    }

    fn restore(&mut self, state: &FlowState) -> Result<(), DataError> {
        state.check(NAME, 5, 0)?;
        let c = &state.counters;
        let len = counter(NAME, c[2])?;
        if len != self.items.len() {
            return Err(DataError::BadState {
                flow: NAME,
                what: format!(
                    "the state is of a list of {len} datapoints, this list has {}",
                    self.items.len()
                ),
            });
        }
        if flag(c[3]).then_some(c[4]) != self.shuffle_seed {
            return Err(DataError::BadState {
                flow: NAME,
                what: "the state was taken with another shuffle setting or seed".to_string(),
            });
        }
        let index = counter(NAME, c[1])?;
        if index > len {
            return Err(DataError::BadState {
                flow: NAME,
                what: format!("index {index} past the end of a list of {len}"),
            });
        }
        self.pass = c[0];
        self.index = index;
        Ok(())
    }

    fn fork(&self) -> Result<Box<dyn DataFlow>, DataError> {
        Ok(Box::new(self.clone()))
    }
}
