//! Convolutions over activations stored in bf16 (`lower::half_storage`): the adapters that let
//! the f32 convolution kernels read a bf16 input and write a bf16 output without a pass of
//! their own over either.
//!
//! - A bf16 input `x` is a [`ComputeInput`] ([`Widened`]): the kernels already take their input
//!   image by image as they copy it into their padded buffers, so each image is widened to f32
//!   (exact) on that copy.
//! - A bf16 output is computed [`by_images`]: a group of images at a time into an f32 buffer of
//!   this thread, each block of rows the kernel finishes passed through the kernel's epilogue
//!   and rounded (nearest even) into the output right away, on the kernel's threads while the
//!   rows are in cache ([`ToBf16`]). Every convolution kernel computes each image
//!   independently, so the output is the f32 kernel's, rounded. The f32 buffer ([`GROUP_BYTES`],
//!   more for images so large that fewer than one per worker thread fit) is the thread's,
//!   reused step after step, outside the planned memory.

use super::kernels::round::from_bf16_bits;
use super::kernels::{ComputeInput, ConvInput, Epilogue, KernelError};
use super::memory::RawBuf;
use crate::tensor::DType;
use std::cell::RefCell;
use std::ops::Range;

/// Bytes of f32 output one group of [`by_images`] computes (unless one image per worker thread
/// is more): ResNet-20's largest activation at batch 128 (8 MiB) in one group. Each group is
/// one parallel run of the kernel; smaller groups cost a hand-over to the worker threads each.
const GROUP_BYTES: usize = 16 << 20;

/// A bf16 tensor read as f32: `len` elements from element `offset` of `raw`.
pub struct Widened {
    pub raw: RawBuf,
    pub offset: usize,
}

impl ComputeInput for Widened {
    fn compute(&self, start: usize, out: &mut [f32]) {
        // SAFETY: the executor checked the view's reach over the whole input (`check_bounds`),
        // and the kernels ask for ranges inside the input; bf16 buffers hold 2-byte elements.
        let bits = unsafe {
            std::slice::from_raw_parts(
                self.raw.ptr.cast::<u16>().add(self.offset + start),
                out.len(),
            )
        };
        from_bf16_bits(bits, out);
    }
}

/// The elements of a computed input from `start` on, as an input of their own.
struct Part<'a> {
    inner: &'a dyn ComputeInput,
    start: usize,
}

impl ComputeInput for Part<'_> {
    fn compute(&self, start: usize, out: &mut [f32]) {
        self.inner.compute(self.start + start, out);
    }
}

/// Runs `f` on elements `range` of `x` (whole images), as the input of a convolution over
/// those images.
pub fn with_part<R>(
    x: &ConvInput<'_>,
    range: Range<usize>,
    f: impl FnOnce(ConvInput<'_>) -> R,
) -> R {
    match *x {
        ConvInput::Tensor(t) => f(ConvInput::Tensor(&t[range])),
        ConvInput::Computed { compute, .. } => {
            let len = range.len();
            let part = Part {
                inner: compute,
                start: range.start,
            };
            f(ConvInput::Computed {
                len,
                compute: &part,
            })
        }
    }
}

/// The epilogue of a part of a bf16-stored output that starts at row `row0`: the kernel's
/// epilogue (told the rows' place in the whole output), then the rows rounded into `out`, as
/// each block of rows is finished (on the kernel's threads, while the rows are in cache).
struct ToBf16<'a> {
    inner: &'a dyn Epilogue,
    row0: usize,
    out: RawBuf,
}

impl Epilogue for ToBf16<'_> {
    fn apply(&self, rows: &mut [f32], first_row: usize, cols: usize) {
        let row = self.row0 + first_row;
        // SAFETY: `by_images` checked that `out` holds the whole output; the kernel hands out
        // disjoint blocks of rows inside its part, so the bf16 rows written are disjoint and
        // this kernel's own.
        let bits = unsafe {
            std::slice::from_raw_parts_mut(self.out.ptr.cast::<u16>().add(row * cols), rows.len())
        };
        self.inner.apply_to_bf16(rows, row, cols, bits);
    }

    fn stores_elsewhere(&self) -> bool {
        true
    }

    fn block_rows_multiple(&self, cols: usize) -> usize {
        self.inner.block_rows_multiple(cols)
    }
}

thread_local! {
    /// The f32 output of one group of images (reused: no allocation per step).
    static GROUP: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs a convolution of `batch` images whose output `out` (bf16, `image_len` elements per
/// image, rows `cols` wide) is computed a group of images at a time ([`GROUP_BYTES`] of f32
/// output, or one image per worker thread of the pool if that is more: the kernels spread a
/// group's images over the threads, so a smaller group would leave threads idle): `run(images, y, e)` computes the output of `images`
/// into the f32 `y` with the epilogue `e`, which applies `epilogue` to each finished block
/// and rounds it into `out` ([`ToBf16`]).
pub fn by_images(
    out: &RawBuf,
    (batch, image_len, cols): (usize, usize, usize),
    epilogue: &dyn Epilogue,
    run: impl Fn(Range<usize>, &mut [f32], &dyn Epilogue) -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    by_groups_of(GROUP_BYTES, out, (batch, image_len, cols), epilogue, run)
}

/// [`by_images`] with groups of at most `group_bytes` of f32 output.
fn by_groups_of(
    group_bytes: usize,
    out: &RawBuf,
    (batch, image_len, cols): (usize, usize, usize),
    epilogue: &dyn Epilogue,
    run: impl Fn(Range<usize>, &mut [f32], &dyn Epilogue) -> Result<(), KernelError>,
) -> Result<(), KernelError> {
    if out.dtype != DType::BF16 || out.len < batch * image_len {
        return Err(KernelError::Shape {
            kernel: "conv2d (bf16 output)",
            message: format!(
                "output is {} with {} elements, needs bf16 {batch} images of {image_len}",
                out.dtype, out.len
            ),
        });
    }
    let group = (group_bytes / (4 * image_len.max(1)))
        .max(rayon::current_num_threads())
        .clamp(1, batch.max(1));
    GROUP.with_borrow_mut(|y| {
        y.resize(group * image_len, 0.0);
        let mut first = 0;
        while first < batch {
            let end = (first + group).min(batch);
            let e = ToBf16 {
                inner: epilogue,
                row0: first * image_len / cols.max(1),
                out: *out,
            };
            run(first..end, &mut y[..(end - first) * image_len], &e)?;
            first = end;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::round::random_values;
    use crate::backend::cpu::kernels::round::to_bf16_bits;
    use crate::backend::cpu::kernels::{
        ChannelEpilogue, Conv2dGeometry, ConvAlgorithm, Padding2d, conv2d_forward_with,
    };

    /// A convolution of 5 images with a residual epilogue, its input stored in bf16 and its
    /// output computed 1, 2 or all 5 images at a time into bf16 (at least one image per worker
    /// thread): bitwise the f32 convolution of the widened input, rounded — the epilogue reads
    /// the residual rows of the right images.
    #[test]
    fn groups_of_images_give_the_rounded_f32_convolution() {
        let mut g = Conv2dGeometry::new(5, [6, 7], 16, 16, [3, 3]);
        g.padding = Padding2d::uniform(1);
        let (x32, w) = (
            random_values(g.input_len(), 1),
            random_values(g.filter_len(), 2),
        );
        let residual = random_values(g.output_len(), 3);
        let mut x16 = vec![0u16; x32.len()];
        to_bf16_bits(&x32, &mut x16);
        let mut widened = vec![0.0; x16.len()];
        from_bf16_bits(&x16, &mut widened);
        let e = ChannelEpilogue {
            residual: Some(&residual),
            relu: true,
            ..ChannelEpilogue::default()
        };
        let auto = ConvAlgorithm::Auto;
        let mut want = vec![0.0; g.output_len()];
        conv2d_forward_with(auto, &g, widened.as_slice(), &w, &mut want, &e, None).unwrap();
        let mut want16 = vec![0u16; want.len()];
        to_bf16_bits(&want, &mut want16);
        let input = Widened {
            raw: RawBuf {
                ptr: x16.as_mut_ptr().cast(),
                dtype: DType::BF16,
                len: x16.len(),
            },
            offset: 0,
        };
        let x = ConvInput::Computed {
            len: g.input_len(),
            compute: &input,
        };
        let (image_in, image_out) = (g.input_len() / 5, g.output_len() / 5);
        // (images per group by bytes, worker threads) → the groups the kernel is run on: never
        // fewer images than threads.
        let cases: [(usize, usize, &[usize]); 4] = [
            (1, 1, &[1, 1, 1, 1, 1]),
            (2, 1, &[2, 2, 1]),
            (5, 1, &[5]),
            (1, 3, &[3, 2]),
        ];
        for (images, threads, groups) in cases {
            let mut got = vec![0u16; want.len()];
            let out = RawBuf {
                ptr: got.as_mut_ptr().cast(),
                dtype: DType::BF16,
                len: got.len(),
            };
            let shape = (5, image_out, 16);
            let ran = std::sync::Mutex::new(Vec::new());
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                by_groups_of(images * image_out * 4, &out, shape, &e, |part, y, e| {
                    ran.lock().unwrap().push(part.len());
                    let pg = Conv2dGeometry {
                        batch: part.len(),
                        ..g
                    };
                    let range = part.start * image_in..part.end * image_in;
                    with_part(&x, range, |x| {
                        conv2d_forward_with(auto, &pg, x, &w, y, e, None)
                    })
                })
            })
            .unwrap();
            assert_eq!(
                ran.into_inner().unwrap(),
                groups,
                "{images} images, {threads} threads"
            );
            assert_eq!(got, want16, "{images} images, {threads} threads");
        }
    }
}
