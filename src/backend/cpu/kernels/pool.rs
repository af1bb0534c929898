//! 2-D pooling over NHWC: max and average windows (forward and backward) and global average
//! pooling. Windows ignore padding: max pooling takes the maximum of the cells inside the input,
//! average pooling divides by the number of those cells (as TF). Max pooling's gradient goes to
//! the FIRST maximum of each window in row-major window order. Each image is one task.

use super::conv::Padding2d;
use super::parallel::{for_each_row_block, worth_parallel};
use super::simd::vectorized;
use super::{KernelError, check_len, shape_error};

/// The shapes of a pooling: input `[batch, H, W, channels]`, output `[batch, OH, OW, channels]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dGeometry {
    pub batch: usize,
    pub in_hw: [usize; 2],
    pub channels: usize,
    pub window: [usize; 2],
    pub strides: [usize; 2],
    pub padding: Padding2d,
}

impl Pool2dGeometry {
    /// Checks the parameters and returns the output's `[OH, OW]`.
    pub fn validate(&self) -> Result<[usize; 2], KernelError> {
        if self.window.contains(&0) || self.strides.contains(&0) {
            return Err(shape_error(
                "pool2d",
                format!("window and strides must be positive in {self:?}"),
            ));
        }
        let p = self.padding;
        let padded = [
            self.in_hw[0] + p.top + p.bottom,
            self.in_hw[1] + p.left + p.right,
        ];
        if padded[0] < self.window[0] || padded[1] < self.window[1] {
            return Err(shape_error(
                "pool2d",
                format!("the window is larger than the padded input in {self:?}"),
            ));
        }
        Ok([
            (padded[0] - self.window[0]) / self.strides[0] + 1,
            (padded[1] - self.window[1]) / self.strides[1] + 1,
        ])
    }

    /// Elements of the input.
    pub fn input_len(&self) -> usize {
        self.batch * self.in_hw[0] * self.in_hw[1] * self.channels
    }

    /// Elements of the output (zero when the geometry is invalid).
    pub fn output_len(&self) -> usize {
        let [oh, ow] = self.validate().unwrap_or([0, 0]);
        self.batch * oh * ow * self.channels
    }

    /// The in-bounds input rows and columns of the window of output pixel `(oh, ow)`.
    fn window_at(&self, oh: usize, ow: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let span = |o: usize, d: usize, before: usize| {
            let start = (o * self.strides[d]) as isize - before as isize;
            let end = start + self.window[d] as isize;
            start.max(0) as usize..end.clamp(0, self.in_hw[d] as isize) as usize
        };
        (
            span(oh, 0, self.padding.top),
            span(ow, 1, self.padding.left),
        )
    }

    fn check(
        &self,
        kernel: &'static str,
        input: usize,
        output: usize,
    ) -> Result<[usize; 2], KernelError> {
        let out_hw = self.validate()?;
        check_len(kernel, "input", input, self.input_len())?;
        check_len(kernel, "output", output, self.output_len())?;
        Ok(out_hw)
    }

    /// Runs `f(image, out_image)` per image: `image` indexes the batch, `out` is that image's
    /// chunk of the per-image-chunked buffer `out`, `out_image_len` long.
    fn per_image<F>(&self, out: &mut [f32], out_image_len: usize, work: usize, f: F)
    where
        F: Fn(usize, &mut [f32]) + Sync + Send,
    {
        if out_image_len == 0 {
            return;
        }
        let parallel = worth_parallel(work) && self.batch > 1;
        // The closure never fails, so neither does the loop.
        let _ = for_each_row_block(out, out_image_len, 1, parallel, |chunk, image, _| {
            f(image, chunk);
            Ok(())
        });
    }
}

/// Max pooling: `y[n, oh, ow, c]` is the maximum of `x` over the window's in-bounds cells; NaN
/// counts as larger than everything (it propagates, as in the reference executor).
pub fn max_pool_forward(g: &Pool2dGeometry, x: &[f32], y: &mut [f32]) -> Result<(), KernelError> {
    let [oh_len, ow_len] = g.check("max_pool_forward", x.len(), y.len())?;
    let (c, [h, w]) = (g.channels, g.in_hw);
    let work = g.output_len() * g.window[0] * g.window[1];
    g.per_image(y, oh_len * ow_len * c, work, |n, y_image| {
        vectorized!({
            let image = &x[n * h * w * c..(n + 1) * h * w * c];
            for (p, out) in y_image.chunks_exact_mut(c).enumerate() {
                let (rows, cols) = g.window_at(p / ow_len, p % ow_len);
                out.fill(f32::NEG_INFINITY);
                for ih in rows {
                    for iw in cols.clone() {
                        let cell = &image[(ih * w + iw) * c..(ih * w + iw + 1) * c];
                        // `v <= o` is false for a NaN `v`, so NaN wins; a NaN `o` stays.
                        out.iter_mut()
                            .zip(cell)
                            .for_each(|(o, &v)| *o = if o.is_nan() || v <= *o { *o } else { v });
                    }
                }
            }
        })
    });
    Ok(())
}

/// Gradient of max pooling: `dx` (overwritten, shaped like `x`) receives each `dy` at the first
/// maximum of its window (row-major window order). Windows with no in-bounds cell drop theirs.
pub fn max_pool_backward(
    g: &Pool2dGeometry,
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) -> Result<(), KernelError> {
    let [oh_len, ow_len] = g.check("max_pool_backward", x.len(), dy.len())?;
    check_len("max_pool_backward", "dx", dx.len(), x.len())?;
    let (c, [h, w]) = (g.channels, g.in_hw);
    let work = g.output_len() * g.window[0] * g.window[1];
    g.per_image(dx, h * w * c, work, |n, dx_image| {
        vectorized!({
            let image = &x[n * h * w * c..(n + 1) * h * w * c];
            let dy_image = &dy[n * oh_len * ow_len * c..(n + 1) * oh_len * ow_len * c];
            dx_image.fill(0.0);
            let mut best = vec![0.0f32; c];
            let mut at = vec![usize::MAX; c];
            for (p, grad) in dy_image.chunks_exact(c).enumerate() {
                let (rows, cols) = g.window_at(p / ow_len, p % ow_len);
                at.fill(usize::MAX);
                for ih in rows {
                    for iw in cols.clone() {
                        let cell = (ih * w + iw) * c;
                        let values = &image[cell..cell + c];
                        for ((b, a), &v) in best.iter_mut().zip(at.iter_mut()).zip(values) {
                            // The first maximum, NaN counting as the largest (as the forward).
                            if *a == usize::MAX || (!b.is_nan() && (v > *b || v.is_nan())) {
                                *b = v;
                                *a = cell;
                            }
                        }
                    }
                }
                for (ch, (&a, &d)) in at.iter().zip(grad).enumerate() {
                    if a != usize::MAX {
                        dx_image[a + ch] += d;
                    }
                }
            }
        })
    });
    Ok(())
}

/// Average pooling: `y` is the mean of `x` over the window's in-bounds cells.
pub fn avg_pool_forward(g: &Pool2dGeometry, x: &[f32], y: &mut [f32]) -> Result<(), KernelError> {
    let [oh_len, ow_len] = g.check("avg_pool_forward", x.len(), y.len())?;
    let (c, [h, w]) = (g.channels, g.in_hw);
    let work = g.output_len() * g.window[0] * g.window[1];
    g.per_image(y, oh_len * ow_len * c, work, |n, y_image| {
        vectorized!({
            let image = &x[n * h * w * c..(n + 1) * h * w * c];
            for (p, out) in y_image.chunks_exact_mut(c).enumerate() {
                let (rows, cols) = g.window_at(p / ow_len, p % ow_len);
                let count = rows.len() * cols.len();
                out.fill(0.0);
                for ih in rows {
                    for iw in cols.clone() {
                        let cell = &image[(ih * w + iw) * c..(ih * w + iw + 1) * c];
                        out.iter_mut().zip(cell).for_each(|(o, &v)| *o += v);
                    }
                }
                let scale = 1.0 / count.max(1) as f32;
                out.iter_mut().for_each(|o| *o *= scale);
            }
        })
    });
    Ok(())
}

/// Gradient of average pooling: each `dy` is spread evenly over its window's in-bounds cells;
/// `dx` is `[N, H, W, C]` (overwritten).
pub fn avg_pool_backward(
    g: &Pool2dGeometry,
    dy: &[f32],
    dx: &mut [f32],
) -> Result<(), KernelError> {
    let [oh_len, ow_len] = g.check("avg_pool_backward", dx.len(), dy.len())?;
    let (c, [h, w]) = (g.channels, g.in_hw);
    let work = g.output_len() * g.window[0] * g.window[1];
    g.per_image(dx, h * w * c, work, |n, dx_image| {
        vectorized!({
            let dy_image = &dy[n * oh_len * ow_len * c..(n + 1) * oh_len * ow_len * c];
            dx_image.fill(0.0);
            for (p, grad) in dy_image.chunks_exact(c).enumerate() {
                let (rows, cols) = g.window_at(p / ow_len, p % ow_len);
                let scale = 1.0 / (rows.len() * cols.len()).max(1) as f32;
                for ih in rows {
                    for iw in cols.clone() {
                        let cell = &mut dx_image[(ih * w + iw) * c..(ih * w + iw + 1) * c];
                        cell.iter_mut()
                            .zip(grad)
                            .for_each(|(d, &g)| *d += g * scale);
                    }
                }
            }
        })
    });
    Ok(())
}

/// Global average pooling: `y[n, c]` is the mean of `x[n, :, :, c]` over `pixels = H·W` cells.
pub fn global_avg_pool_forward(
    batch: usize,
    pixels: usize,
    channels: usize,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), KernelError> {
    check_len(
        "global_avg_pool_forward",
        "x",
        x.len(),
        batch * pixels * channels,
    )?;
    check_len("global_avg_pool_forward", "y", y.len(), batch * channels)?;
    if channels == 0 {
        return Ok(());
    }
    let scale = 1.0 / pixels.max(1) as f32;
    vectorized!({
        for (n, out) in y.chunks_exact_mut(channels).enumerate() {
            out.fill(0.0);
            let image = &x[n * pixels * channels..(n + 1) * pixels * channels];
            for cell in image.chunks_exact(channels) {
                out.iter_mut().zip(cell).for_each(|(o, &v)| *o += v);
            }
            out.iter_mut().for_each(|o| *o *= scale);
        }
    });
    Ok(())
}

/// Gradient of global average pooling: `dx[n, p, c] = dy[n, c] / pixels`.
pub fn global_avg_pool_backward(
    batch: usize,
    pixels: usize,
    channels: usize,
    dy: &[f32],
    dx: &mut [f32],
) -> Result<(), KernelError> {
    check_len("global_avg_pool_backward", "dy", dy.len(), batch * channels)?;
    check_len(
        "global_avg_pool_backward",
        "dx",
        dx.len(),
        batch * pixels * channels,
    )?;
    if channels == 0 || pixels == 0 {
        return Ok(());
    }
    let scale = 1.0 / pixels as f32;
    vectorized!({
        for (grad, image) in dy
            .chunks_exact(channels)
            .zip(dx.chunks_exact_mut(pixels * channels))
        {
            for cell in image.chunks_exact_mut(channels) {
                cell.iter_mut().zip(grad).for_each(|(d, &g)| *d = g * scale);
            }
        }
    });
    Ok(())
}
