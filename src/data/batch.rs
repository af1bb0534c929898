//! `BatchData`: stacks consecutive datapoints into batches (a new leading dimension per
//! component), with tensorpack's `remainder` rule for the last, partial batch of a pass.

use super::DataError;
use super::flow::{DataFlow, Datapoint, FlowState, Skipped, flag};
use crate::tensor::{HostTensor, Storage};

const NAME: &str = "BatchData";

/// Groups `batch_size` datapoints into one whose components are stacked along a new axis 0.
///
/// Per pass it yields `n / batch_size` batches, plus one smaller batch of the leftover
/// `n % batch_size` datapoints when `remainder` is set (otherwise they are dropped).
pub struct BatchData {
    inner: Box<dyn DataFlow>,
    batch_size: usize,
    remainder: bool,
    /// The input's pass already ended (its end consumed) while filling the last batch we yielded;
    /// our own end of pass is still to be reported.
    pending_end: bool,
}

impl BatchData {
    /// Batches `inner`. Errors when `batch_size` is 0, or (without `remainder`) when the input is
    /// known to be shorter than one batch.
    pub fn new(
        inner: impl DataFlow + 'static,
        batch_size: usize,
        remainder: bool,
    ) -> Result<BatchData, DataError> {
        if batch_size == 0 {
            return Err(DataError::Config {
                flow: NAME,
                what: "batch_size must be at least 1".to_string(),
            });
        }
        if let Some(n) = inner.len().filter(|&n| !remainder && n < batch_size) {
            return Err(DataError::Config {
                flow: NAME,
                what: format!(
                    "batch_size {batch_size} exceeds the {n} datapoints of a pass (use remainder)"
                ),
            });
        }
        Ok(BatchData {
            inner: Box::new(inner),
            batch_size,
            remainder,
            pending_end: false,
        })
    }
}

impl DataFlow for BatchData {
    fn name(&self) -> &'static str {
        NAME
    }

    fn reset_state(&mut self) -> Result<(), DataError> {
        self.inner.reset_state()
    }

    fn len(&self) -> Option<usize> {
        let n = self.inner.len()?;
        let extra = usize::from(self.remainder && n % self.batch_size != 0);
        Some(n / self.batch_size + extra)
    }

    fn next_datapoint(&mut self) -> Result<Option<Datapoint>, DataError> {
        if self.pending_end {
            self.pending_end = false;
            return Ok(None);
        }
        let mut items = Vec::with_capacity(self.batch_size);
        while items.len() < self.batch_size {
            match self.inner.next_datapoint()? {
                Some(dp) => items.push(dp),
                None => {
                    if self.remainder && !items.is_empty() {
                        self.pending_end = true;
                        return Ok(Some(stack_datapoints(&items)?));
                    }
                    return Ok(None);
                }
            }
        }
        Ok(Some(stack_datapoints(&items)?))
    }

    fn skip(&mut self, n: usize) -> Result<Skipped, DataError> {
        if n == 0 {
            return Ok(Skipped {
                count: 0,
                pass_ended: false,
            });
        }
        if self.pending_end {
            self.pending_end = false;
            return Ok(Skipped {
                count: 0,
                pass_ended: true,
            });
        }
        let inner = self.inner.skip(n.saturating_mul(self.batch_size))?;
        if !inner.pass_ended {
            return Ok(Skipped {
                count: n,
                pass_ended: false,
            });
        }
        let full = inner.count / self.batch_size;
        let partial = self.remainder && inner.count % self.batch_size != 0;
        if partial && full + 1 == n {
            // The partial batch was the last one asked for: our end is still to come.
            self.pending_end = true;
            return Ok(Skipped {
                count: n,
                pass_ended: false,
            });
        }
        Ok(Skipped {
            count: full + usize::from(partial),
            pass_ended: true,
        })
    }

    fn end_pass(&mut self) -> Result<(), DataError> {
        if self.pending_end {
            self.pending_end = false;
            Ok(())
        } else {
            self.inner.end_pass()
        }
    }

    /// Counters: `[pending end of pass (0/1), batch_size]`.
    fn state(&self) -> FlowState {
        FlowState::new(
            NAME,
            vec![u64::from(self.pending_end), self.batch_size as u64],
            vec![self.inner.state()],
        )
    }

    fn restore(&mut self, state: &FlowState) -> Result<(), DataError> {
        state.check(NAME, 2, 1)?;
        if state.counters[1] != self.batch_size as u64 {
            return Err(DataError::BadState {
                flow: NAME,
                what: format!(
                    "the state was taken with batch_size {}, this flow has {}",
                    state.counters[1], self.batch_size
                ),
            });
        }
        self.inner.restore(&state.inner[0])?;
        self.pending_end = flag(state.counters[0]);
        Ok(())
    }

    fn fork(&self) -> Result<Box<dyn DataFlow>, DataError> {
        Ok(Box::new(BatchData {
            inner: self.inner.fork()?,
            batch_size: self.batch_size,
            remainder: self.remainder,
            pending_end: self.pending_end,
        }))
    }
}

/// Stacks datapoints component by component into tensors with a new leading axis.
///
/// Every datapoint must have the same number of components, and each component the same shape
/// and dtype across datapoints; errors name the offending component and position.
pub fn stack_datapoints(items: &[Datapoint]) -> Result<Datapoint, DataError> {
    let Some(first) = items.first() else {
        return Ok(Vec::new());
    };
    for (position, dp) in items.iter().enumerate() {
        if dp.len() != first.len() {
            return Err(DataError::ComponentCount {
                position,
                expected: first.len(),
                got: dp.len(),
            });
        }
    }
    (0..first.len())
        .map(|component| {
            let parts: Vec<&HostTensor> = items.iter().map(|dp| &dp[component]).collect();
            stack_component(component, &parts)
        })
        .collect()
}

fn stack_component(component: usize, parts: &[&HostTensor]) -> Result<HostTensor, DataError> {
    let head = parts[0];
    for (position, t) in parts.iter().enumerate() {
        if t.shape() != head.shape() || t.dtype() != head.dtype() {
            return Err(DataError::BatchShape {
                component,
                position,
                expected: head.shape().to_vec(),
                expected_dtype: head.dtype(),
                got: t.shape().to_vec(),
                got_dtype: t.dtype(),
            });
        }
    }
    let total = head.len() * parts.len();
    macro_rules! concat {
        ($($variant:ident),*) => {
            match head.storage() {
                $(Storage::$variant(_) => {
                    let mut out = Vec::with_capacity(total);
                    for t in parts {
                        if let Storage::$variant(v) = t.storage() {
                            out.extend_from_slice(v);
                        }
                    }
                    Storage::$variant(out)
                })*
            }
        };
    }
    let storage = concat!(F32, F64, F16, BF16, I32, I64, U8, Bool);
    let mut shape = Vec::with_capacity(head.shape().len() + 1);
    shape.push(parts.len());
    shape.extend_from_slice(head.shape());
    Ok(HostTensor::new(shape, storage)?)
}
