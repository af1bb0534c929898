//! A convolution's input `x` as its kernels read it: a tensor, or computed image by image as the
//! kernel copies it into its padded buffer (a prologue: batch norm's apply and ReLU computed by
//! the convolution that reads their result, so that activation is never written out and read
//! back; see `lower::Prologue`).

use std::borrow::Cow;
use std::cell::RefCell;
use std::ops::Range;

/// Computes elements of a convolution's input on demand.
pub trait ComputeInput: Sync {
    /// Writes elements `start..start + out.len()` of the input (flat NHWC positions) into `out`.
    fn compute(&self, start: usize, out: &mut [f32]);
}

/// Where a convolution reads its input `x` from.
#[derive(Clone, Copy)]
pub enum ConvInput<'a> {
    /// The tensor itself.
    Tensor(&'a [f32]),
    /// A tensor of `len` elements computed as it is read.
    Computed {
        len: usize,
        compute: &'a dyn ComputeInput,
    },
}

impl<'a> From<&'a [f32]> for ConvInput<'a> {
    fn from(x: &'a [f32]) -> Self {
        ConvInput::Tensor(x)
    }
}

impl<'a> From<&'a Vec<f32>> for ConvInput<'a> {
    fn from(x: &'a Vec<f32>) -> Self {
        ConvInput::Tensor(x)
    }
}

thread_local! {
    /// One image of a computed input, per thread (reused: no allocation per image).
    static IMAGE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl<'a> ConvInput<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            ConvInput::Tensor(x) => x.len(),
            ConvInput::Computed { len, .. } => *len,
        }
    }

    /// Whether the input has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on elements `range` (one image): the tensor's own, or computed into this thread's
    /// image buffer. `f` must not read another computed image on this thread.
    pub fn with_image<R>(&self, range: Range<usize>, f: impl FnOnce(&[f32]) -> R) -> R {
        match self {
            ConvInput::Tensor(x) => f(&x[range]),
            ConvInput::Computed { compute, .. } => IMAGE.with(|cell| match cell.try_borrow_mut() {
                Ok(mut buf) => {
                    buf.resize(range.len(), 0.0);
                    compute.compute(range.start, &mut buf);
                    f(&buf)
                }
                // Only if `f` read another computed image on this thread: a buffer of its own.
                Err(_) => {
                    let mut buf = vec![0.0; range.len()];
                    compute.compute(range.start, &mut buf);
                    f(&buf)
                }
            }),
        }
    }

    /// The whole input: the tensor, or a computed copy (the portable im2col path).
    pub fn whole(&self) -> Cow<'a, [f32]> {
        match *self {
            ConvInput::Tensor(x) => Cow::Borrowed(x),
            ConvInput::Computed { len, compute } => {
                let mut out = vec![0.0; len];
                compute.compute(0, &mut out);
                Cow::Owned(out)
            }
        }
    }
}
