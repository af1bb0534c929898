//! `RepeatedData` (several input passes, or all of them, as one pass) and `FixedSizeData`
//! (passes of exactly `size` datapoints, optionally continuing the input across passes).

use super::DataError;
use super::flow::{DataFlow, Datapoint, FlowState, Skipped, counter, flag};

const REPEATED: &str = "RepeatedData";
const FIXED: &str = "FixedSizeData";

/// Repeats its input: one pass of this flow is `times` passes of the input, or never ends
/// (`times = None`, tensorpack's `num=-1`; `len()` is then `None`).
pub struct RepeatedData {
    inner: Box<dyn DataFlow>,
    times: Option<usize>,
    /// Input passes finished within the current pass.
    repeats_done: usize,
    /// Datapoints the input has produced in its current pass (to detect an empty input).
    produced: u64,
}

impl RepeatedData {
    /// Repeats `inner` `times` times per pass (`None`: forever). `Some(0)` is refused.
    pub fn new(
        inner: impl DataFlow + 'static,
        times: Option<usize>,
    ) -> Result<RepeatedData, DataError> {
        if times == Some(0) {
            return Err(DataError::Config {
                flow: REPEATED,
                what: "times must be at least 1 (None repeats forever)".to_string(),
            });
        }
        Ok(RepeatedData {
            inner: Box::new(inner),
            times,
            repeats_done: 0,
            produced: 0,
        })
    }

    /// Accounts for the end of one input pass; true when this flow's own pass ended too.
    fn input_pass_ended(&mut self) -> Result<bool, DataError> {
        let empty = self.produced == 0;
        self.produced = 0;
        self.repeats_done += 1;
        match self.times {
            Some(t) if self.repeats_done >= t => {
                self.repeats_done = 0;
                Ok(true)
            }
            None if empty => Err(DataError::EmptyPass { flow: REPEATED }),
            _ => Ok(false),
        }
    }
}

impl DataFlow for RepeatedData {
    fn name(&self) -> &'static str {
        REPEATED
    }

    fn reset_state(&mut self) -> Result<(), DataError> {
        self.inner.reset_state()
    }

    fn len(&self) -> Option<usize> {
        self.inner.len()?.checked_mul(self.times?)
    }

    fn next_datapoint(&mut self) -> Result<Option<Datapoint>, DataError> {
        loop {
            if let Some(dp) = self.inner.next_datapoint()? {
                self.produced += 1;
                return Ok(Some(dp));
            }
            if self.input_pass_ended()? {
                return Ok(None);
            }
        }
    }

    fn skip(&mut self, n: usize) -> Result<Skipped, DataError> {
        let mut count = 0;
        while count < n {
            let s = self.inner.skip(n - count)?;
            count += s.count;
            self.produced += s.count as u64;
            if s.pass_ended && self.input_pass_ended()? {
                return Ok(Skipped {
                    count,
                    pass_ended: true,
                });
            }
        }
        Ok(Skipped {
            count,
            pass_ended: false,
        })
    }

    fn end_pass(&mut self) -> Result<(), DataError> {
        self.inner.end_pass()?;
        self.repeats_done = 0;
        self.produced = 0;
        Ok(())
    }

    /// Counters: `[input passes done in this pass, datapoints of the current input pass]`.
    fn state(&self) -> FlowState {
        FlowState::new(
            REPEATED,
            vec![self.repeats_done as u64, self.produced],
            vec![self.inner.state()],
        )
    }

    fn restore(&mut self, state: &FlowState) -> Result<(), DataError> {
        state.check(REPEATED, 2, 1)?;
        self.inner.restore(&state.inner[0])?;
        self.repeats_done = counter(REPEATED, state.counters[0])?;
        self.produced = state.counters[1];
        Ok(())
    }

    fn fork(&self) -> Result<Box<dyn DataFlow>, DataError> {
        Ok(Box::new(RepeatedData {
            inner: self.inner.fork()?,
            times: self.times,
            repeats_done: self.repeats_done,
            produced: self.produced,
        }))
    }
}

/// Passes of exactly `size` datapoints.
///
/// With `keep_state` the input continues across passes (a new input pass starts whenever the
/// previous one is exhausted, mid-pass if need be); without it, every pass starts a fresh input
/// pass, abandoning the rest of the previous one.
pub struct FixedSizeData {
    inner: Box<dyn DataFlow>,
    size: usize,
    keep_state: bool,
    emitted: usize,
    /// The input stands at the start of a pass (nothing of it produced yet).
    inner_fresh: bool,
}

impl FixedSizeData {
    /// Passes of `size` datapoints drawn from `inner`.
    pub fn new(inner: impl DataFlow + 'static, size: usize, keep_state: bool) -> FixedSizeData {
        FixedSizeData {
            inner: Box::new(inner),
            size,
            keep_state,
            emitted: 0,
            inner_fresh: true,
        }
    }

    fn finish_pass(&mut self) -> Result<(), DataError> {
        self.emitted = 0;
        if !self.keep_state && !self.inner_fresh {
            self.inner.end_pass()?;
            self.inner_fresh = true;
        }
        Ok(())
    }
}

impl DataFlow for FixedSizeData {
    fn name(&self) -> &'static str {
        FIXED
    }

    fn reset_state(&mut self) -> Result<(), DataError> {
        self.inner.reset_state()
    }

    fn len(&self) -> Option<usize> {
        Some(self.size)
    }

    fn next_datapoint(&mut self) -> Result<Option<Datapoint>, DataError> {
        if self.emitted >= self.size {
            self.finish_pass()?;
            return Ok(None);
        }
        loop {
            if let Some(dp) = self.inner.next_datapoint()? {
                self.inner_fresh = false;
                self.emitted += 1;
                return Ok(Some(dp));
            }
            if self.inner_fresh {
                return Err(DataError::EmptyPass { flow: FIXED });
            }
            self.inner_fresh = true;
        }
    }

    fn skip(&mut self, n: usize) -> Result<Skipped, DataError> {
        let wanted = n.min(self.size - self.emitted);
        let mut count = 0;
        while count < wanted {
            let s = self.inner.skip(wanted - count)?;
            if s.pass_ended && s.count == 0 && self.inner_fresh {
                return Err(DataError::EmptyPass { flow: FIXED });
            }
            count += s.count;
            self.emitted += s.count;
            self.inner_fresh = s.pass_ended || (self.inner_fresh && s.count == 0);
        }
        if n > wanted {
            self.finish_pass()?;
            return Ok(Skipped {
                count,
                pass_ended: true,
            });
        }
        Ok(Skipped {
            count,
            pass_ended: false,
        })
    }

    fn end_pass(&mut self) -> Result<(), DataError> {
        self.finish_pass()
    }

    /// Counters: `[datapoints emitted in this pass, input at a pass start (0/1), size]`.
    fn state(&self) -> FlowState {
        FlowState::new(
            FIXED,
            vec![
                self.emitted as u64,
                u64::from(self.inner_fresh),
                self.size as u64,
            ],
            vec![self.inner.state()],
        )
    }

    fn restore(&mut self, state: &FlowState) -> Result<(), DataError> {
        state.check(FIXED, 3, 1)?;
        let c = &state.counters;
        if c[2] != self.size as u64 || c[0] > c[2] {
            return Err(DataError::BadState {
                flow: FIXED,
                what: format!(
                    "the state is of size {} at {}, this flow has size {}",
                    c[2], c[0], self.size
                ),
            });
        }
        self.inner.restore(&state.inner[0])?;
        self.emitted = counter(FIXED, c[0])?;
        self.inner_fresh = flag(c[1]);
        Ok(())
    }

    fn fork(&self) -> Result<Box<dyn DataFlow>, DataError> {
        Ok(Box::new(FixedSizeData {
            inner: self.inner.fork()?,
            size: self.size,
            keep_state: self.keep_state,
            emitted: self.emitted,
            inner_fresh: self.inner_fresh,
        }))
    }
}
