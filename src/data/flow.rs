//! The `DataFlow` trait (tensorpack's DataFlow, made resumable) and its serializable position,
//! `FlowState`.
//!
//! A flow yields datapoints one pass (epoch) at a time: `next_datapoint` returns `Ok(None)` once
//! at the end of each pass, and the call after that starts the next pass. All randomness is a
//! function of `(seed, pass, index)` (see [`super::RandomKey`]), so a flow's position is a few
//! counters, and `restore(state())` reproduces the exact continuation.

use super::DataError;
use crate::tensor::HostTensor;
use serde::{Deserialize, Serialize};

/// One datapoint: its components (e.g. `[image, label]`).
pub type Datapoint = Vec<HostTensor>;

/// The position of a flow: its own counters plus the positions of the flows it reads from.
///
/// `flow` names the flow kind, so restoring a state into a differently built pipeline fails with
/// a clear error instead of silently producing other data. Serializes to JSON (`to_json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowState {
    pub flow: String,
    pub counters: Vec<u64>,
    pub inner: Vec<FlowState>,
}

impl FlowState {
    /// A state of `flow` with `counters` and the states of its inputs.
    pub fn new(flow: &str, counters: Vec<u64>, inner: Vec<FlowState>) -> FlowState {
        FlowState {
            flow: flow.to_string(),
            counters,
            inner,
        }
    }

    /// The JSON text of this state.
    pub fn to_json(&self) -> String {
        // Serializing a struct of strings, integers and vectors cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses JSON written by [`FlowState::to_json`].
    pub fn from_json(text: &str) -> Result<FlowState, DataError> {
        Ok(serde_json::from_str(text)?)
    }

    /// Checks that this state was taken from a `flow` with `counters` counters and `inner` inputs.
    pub fn check(
        &self,
        flow: &'static str,
        counters: usize,
        inner: usize,
    ) -> Result<(), DataError> {
        if self.flow != flow {
            return Err(DataError::BadState {
                flow,
                what: format!("the state was taken from a {}", self.flow),
            });
        }
        if self.counters.len() != counters || self.inner.len() != inner {
            return Err(DataError::BadState {
                flow,
                what: format!(
                    "expected {counters} counters and {inner} input states, got {} and {}",
                    self.counters.len(),
                    self.inner.len()
                ),
            });
        }
        Ok(())
    }
}

/// What [`DataFlow::skip`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Datapoints skipped (at most the number asked for).
    pub count: usize,
    /// The pass ended inside the skip, and its end was consumed: the flow now stands at the start
    /// of the next pass (exactly as after `next_datapoint` returned `Ok(None)`).
    pub pass_ended: bool,
}

/// Where a datapoint stands: pass number and index within the pass (both from 0). Map functions
/// receive it to key their randomness (`ctx.key(seed)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatapointContext {
    pub pass: u64,
    pub index: u64,
}

impl DatapointContext {
    /// The random key of this datapoint under `seed`.
    pub fn key(self, seed: u64) -> super::RandomKey {
        super::RandomKey::new(seed, self.pass, self.index)
    }
}

/// A source of datapoints, iterated one pass at a time, with an exact, serializable position.
///
/// Contract (every implementation in this module honours it, and tests check it):
/// - `reset_state()` is called once before iterating (sources refuse to run without it).
/// - `next_datapoint()` yields the datapoints of the current pass, then `Ok(None)` once; the
///   following call starts the next pass. Pass numbers only ever increase.
/// - `state()` taken at any point, given to `restore()` on an identically built flow (after its
///   `reset_state()`), makes it continue with exactly the datapoints the original would have
///   produced. Randomness must therefore be counter-based, never a sequential RNG stream.
/// - `skip(n)` leaves the flow in exactly the state `n` calls of `next_datapoint` would (stopping
///   early at the end of the pass, see [`Skipped`]); flows override it when they can skip without
///   materializing datapoints, which is what lets `PrefetchData` split work between workers.
pub trait DataFlow: Send {
    /// The flow kind, used in states and error messages.
    fn name(&self) -> &'static str;

    /// Prepares the flow for iteration; call once before the first `next_datapoint`.
    fn reset_state(&mut self) -> Result<(), DataError>;

    /// The number of datapoints per pass, if known. Like tensorpack's `__len__` it **may be
    /// inaccurate**: a filtering map (which may drop datapoints) reports its input's length.
    /// `None` means unknown or infinite.
    fn len(&self) -> Option<usize>;

    /// `Some(true)` when a pass is known to be empty.
    fn is_empty(&self) -> Option<bool> {
        self.len().map(|n| n == 0)
    }

    /// The next datapoint of the current pass, or `Ok(None)` at its end (once per pass).
    fn next_datapoint(&mut self) -> Result<Option<Datapoint>, DataError>;

    /// Skips up to `n` datapoints of the current pass. The default pulls and drops them.
    fn skip(&mut self, n: usize) -> Result<Skipped, DataError> {
        let mut count = 0;
        while count < n {
            if self.next_datapoint()?.is_none() {
                return Ok(Skipped {
                    count,
                    pass_ended: true,
                });
            }
            count += 1;
        }
        Ok(Skipped {
            count,
            pass_ended: false,
        })
    }

    /// Abandons the rest of the current pass (even one not yet started), so that the next call to
    /// `next_datapoint` starts the following pass. Sources, maps, batching and shuffling drop what
    /// was left of the pass (as if pulled); `FixedSizeData` with `keep_state` leaves its input
    /// where it stands, so its next pass continues from there. The default skips to the end, which
    /// never returns on an infinite flow; every flow here overrides it.
    fn end_pass(&mut self) -> Result<(), DataError> {
        while !self.skip(usize::MAX)?.pass_ended {}
        Ok(())
    }

    /// The current position.
    fn state(&self) -> FlowState;

    /// Moves to a position returned by `state()` of an identically built flow.
    fn restore(&mut self, state: &FlowState) -> Result<(), DataError>;

    /// An independent copy at the same position (PrefetchData gives one to each worker).
    fn fork(&self) -> Result<Box<dyn DataFlow>, DataError> {
        Err(DataError::NotForkable { flow: self.name() })
    }

    /// Iterates the rest of the current pass.
    fn pass(&mut self) -> Pass<'_, Self>
    where
        Self: Sized,
    {
        Pass::new(self)
    }

    /// Collects the rest of the current pass.
    fn collect_pass(&mut self) -> Result<Vec<Datapoint>, DataError>
    where
        Self: Sized,
    {
        Pass::new(self).collect()
    }
}

impl DataFlow for Box<dyn DataFlow> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn reset_state(&mut self) -> Result<(), DataError> {
        (**self).reset_state()
    }
    fn len(&self) -> Option<usize> {
        (**self).len()
    }
    fn next_datapoint(&mut self) -> Result<Option<Datapoint>, DataError> {
        (**self).next_datapoint()
    }
    fn skip(&mut self, n: usize) -> Result<Skipped, DataError> {
        (**self).skip(n)
    }
    fn end_pass(&mut self) -> Result<(), DataError> {
        (**self).end_pass()
    }
    fn state(&self) -> FlowState {
        (**self).state()
    }
    fn restore(&mut self, state: &FlowState) -> Result<(), DataError> {
        (**self).restore(state)
    }
    fn fork(&self) -> Result<Box<dyn DataFlow>, DataError> {
        (**self).fork()
    }
}

/// An iterator over the rest of one pass; stops after the end of the pass or the first error.
pub struct Pass<'a, F: DataFlow + ?Sized> {
    flow: &'a mut F,
    done: bool,
}

impl<'a, F: DataFlow + ?Sized> Pass<'a, F> {
    /// Iterates the rest of `flow`'s current pass.
    pub fn new(flow: &'a mut F) -> Pass<'a, F> {
        Pass { flow, done: false }
    }
}

impl<F: DataFlow + ?Sized> Iterator for Pass<'_, F> {
    type Item = Result<Datapoint, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.flow.next_datapoint() {
            Ok(Some(dp)) => Some(Ok(dp)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Reads a boolean counter written as 0/1.
pub(crate) fn flag(value: u64) -> bool {
    value != 0
}

/// Converts a saved counter back to `usize`.
pub(crate) fn counter(flow: &'static str, value: u64) -> Result<usize, DataError> {
    usize::try_from(value).map_err(|_| DataError::BadState {
        flow,
        what: format!("counter {value} does not fit this machine's usize"),
    })
}

/// Implements [`DataFlow`] for a newtype by forwarding every method to its field `.0`.
macro_rules! forward_data_flow {
    ($ty:ty) => {
        impl $crate::data::DataFlow for $ty {
            fn name(&self) -> &'static str {
                self.0.name()
            }
            fn reset_state(&mut self) -> Result<(), $crate::data::DataError> {
                self.0.reset_state()
            }
            fn len(&self) -> Option<usize> {
                self.0.len()
            }
            fn next_datapoint(
                &mut self,
            ) -> Result<Option<$crate::data::Datapoint>, $crate::data::DataError> {
                self.0.next_datapoint()
            }
            fn skip(&mut self, n: usize) -> Result<$crate::data::Skipped, $crate::data::DataError> {
                self.0.skip(n)
            }
            fn end_pass(&mut self) -> Result<(), $crate::data::DataError> {
                self.0.end_pass()
            }
            fn state(&self) -> $crate::data::FlowState {
                self.0.state()
            }
            fn restore(
                &mut self,
                state: &$crate::data::FlowState,
            ) -> Result<(), $crate::data::DataError> {
                self.0.restore(state)
            }
            fn fork(&self) -> Result<Box<dyn $crate::data::DataFlow>, $crate::data::DataError> {
                self.0.fork()
            }
        }
    };
}
pub(crate) use forward_data_flow;
