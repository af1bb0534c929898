//! `LocallyShuffleData`: shuffles a stream that cannot be shuffled globally, window by window.
//!
//! Unlike tensorpack's sliding buffer (whose content depends on the whole history of a sequential
//! RNG), each pass is cut into consecutive windows of `buffer_size` datapoints and each window is
//! emitted in a permutation drawn from `(seed, pass, window)`. The position is then the input's
//! position at the window start plus an offset, which makes exact resume cheap.

use super::DataError;
use super::flow::{DataFlow, Datapoint, FlowState, Skipped, counter, flag};
use super::rng::{RandomKey, permutation};

const NAME: &str = "LocallyShuffleData";

/// Shuffles its input within consecutive windows of `buffer_size` datapoints.
pub struct LocallyShuffleData {
    inner: Box<dyn DataFlow>,
    buffer_size: usize,
    seed: u64,
    pass: u64,
    /// Windows started in this pass (the current one included).
    windows: u64,
    /// The rest of the current window, in reverse emission order.
    pending: Vec<Datapoint>,
    /// Size of the current window.
    window_len: usize,
    /// The input's position when the current window started (meaningful while `pending` holds
    /// datapoints).
    window_start: FlowState,
    /// The input's pass ended while filling the current window.
    inner_ended: bool,
}

impl LocallyShuffleData {
    /// Shuffles `inner` within windows of `buffer_size` (at least 1) with randomness from `seed`.
    pub fn new(
        inner: impl DataFlow + 'static,
        buffer_size: usize,
        seed: u64,
    ) -> Result<LocallyShuffleData, DataError> {
        if buffer_size == 0 {
            return Err(DataError::Config {
                flow: NAME,
                what: "buffer_size must be at least 1".to_string(),
            });
        }
        let window_start = inner.state();
        Ok(LocallyShuffleData {
            inner: Box::new(inner),
            buffer_size,
            seed,
            pass: 0,
            windows: 0,
            pending: Vec::new(),
            window_len: 0,
            window_start,
            inner_ended: false,
        })
    }

    /// Reads the next window (window number `self.windows`) from the input.
    fn fill_window(&mut self) -> Result<(), DataError> {
        self.window_start = self.inner.state();
        let mut window = Vec::with_capacity(self.buffer_size);
        while window.len() < self.buffer_size {
            match self.inner.next_datapoint()? {
                Some(dp) => window.push(dp),
                None => {
                    self.inner_ended = true;
                    break;
                }
            }
        }
        let key = RandomKey::new(self.seed, self.pass, self.windows);
        let order = permutation(window.len(), key);
        let mut slots: Vec<Option<Datapoint>> = window.into_iter().map(Some).collect();
        // `order` is a permutation, so each slot is taken exactly once.
        self.pending = order
            .iter()
            .rev()
            .filter_map(|&i| slots[i].take())
            .collect();
        self.window_len = self.pending.len();
        self.windows += 1;
        Ok(())
    }

    fn finish_pass(&mut self) {
        self.pass += 1;
        self.windows = 0;
        self.pending.clear();
        self.window_len = 0;
        self.inner_ended = false;
    }
}

impl DataFlow for LocallyShuffleData {
    fn name(&self) -> &'static str {
        NAME
    }

    fn reset_state(&mut self) -> Result<(), DataError> {
        self.inner.reset_state()
    }

    fn len(&self) -> Option<usize> {
        self.inner.len()
    }

    fn next_datapoint(&mut self) -> Result<Option<Datapoint>, DataError> {
        if self.pending.is_empty() {
            if self.inner_ended {
                self.finish_pass();
                return Ok(None);
            }
            self.fill_window()?;
        }
        match self.pending.pop() {
            Some(dp) => Ok(Some(dp)),
            None => {
                // The window came back empty: the input's pass ended.
                self.finish_pass();
                Ok(None)
            }
        }
    }

    fn skip(&mut self, n: usize) -> Result<Skipped, DataError> {
        let mut count = 0;
        while count < n {
            if self.pending.is_empty() {
                if self.next_datapoint()?.is_none() {
                    return Ok(Skipped {
                        count,
                        pass_ended: true,
                    });
                }
                count += 1;
                continue;
            }
            let take = (n - count).min(self.pending.len());
            self.pending.truncate(self.pending.len() - take);
            count += take;
        }
        Ok(Skipped {
            count,
            pass_ended: false,
        })
    }

    fn end_pass(&mut self) -> Result<(), DataError> {
        if !self.inner_ended {
            self.inner.end_pass()?;
        }
        self.finish_pass();
        Ok(())
    }

    /// Counters: `[pass, windows started, datapoints left in the window, window length,
    /// input pass ended (0/1), buffer_size]`. The input state is the input's position at the start
    /// of the current window when some of it is left (restore re-reads the window), else now.
    fn state(&self) -> FlowState {
        let inner = if self.pending.is_empty() {
            self.inner.state()
        } else {
            self.window_start.clone()
        };
        FlowState::new(
            NAME,
            vec![
                self.pass,
                self.windows,
                self.pending.len() as u64,
                self.window_len as u64,
                u64::from(self.inner_ended),
                self.buffer_size as u64,
            ],
            vec![inner],
        )
    }

    fn restore(&mut self, state: &FlowState) -> Result<(), DataError> {
        state.check(NAME, 6, 1)?;
        let c = &state.counters;
        if c[5] != self.buffer_size as u64 {
            return Err(DataError::BadState {
                flow: NAME,
                what: format!(
                    "the state was taken with buffer_size {}, this flow has {}",
                    c[5], self.buffer_size
                ),
            });
        }
        let left = counter(NAME, c[2])?;
        let window_len = counter(NAME, c[3])?;
        self.inner.restore(&state.inner[0])?;
        self.pass = c[0];
        self.pending.clear();
        self.window_len = window_len;
        self.inner_ended = flag(c[4]);
        self.windows = c[1];
        if left == 0 {
            // Between windows: the input stands where the next window starts (or past its end).
            return Ok(());
        }
        if c[1] == 0 {
            return Err(DataError::BadState {
                flow: NAME,
                what: format!("{left} datapoints left in a window that never started"),
            });
        }
        // Re-read the current window (deterministic) and drop what was already emitted.
        self.inner_ended = false;
        self.windows = c[1] - 1;
        self.fill_window()?;
        if self.window_len != window_len || left > window_len {
            return Err(DataError::BadState {
                flow: NAME,
                what: format!(
                    "the input now gives a window of {} datapoints, the state had {window_len}",
                    self.window_len
                ),
            });
        }
        self.pending.truncate(left);
        Ok(())
    }

    fn fork(&self) -> Result<Box<dyn DataFlow>, DataError> {
        Ok(Box::new(LocallyShuffleData {
            inner: self.inner.fork()?,
            buffer_size: self.buffer_size,
            seed: self.seed,
            pass: self.pass,
            windows: self.windows,
            pending: self.pending.clone(),
            window_len: self.window_len,
            window_start: self.window_start.clone(),
            inner_ended: self.inner_ended,
        }))
    }
}
