//! 2-D max and average pooling over NHWC, and their gradients.
//!
//! [`PoolGeometry::for_each_window`] lists, for every output cell, the flat indices of the input
//! cells of its window that lie inside the input (padding cells are skipped), in row-major scan
//! order. Max pooling takes the first maximum (NaN wins); average pooling divides by the number
//! of in-bounds cells (as TF). `MaxPoolGrad` routes each `dy` to that first maximum, and
//! `AvgPoolGrad` spreads `dy / count` over the window: the adjoint of `AvgPool`. A window with no
//! cell inside the input (possible only with explicit padding) gives `-inf` (max) or 0 (avg).

use super::array::{Array, Elements, Output};
use super::reduce::first_max;
use crate::ir::{PoolAttrs, PoolKind, window_output};

/// The sizes of one pooling and the padding TF applies before each spatial axis.
#[derive(Clone, Copy, Debug)]
struct PoolGeometry {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    oh: usize,
    ow: usize,
    window: [usize; 2],
    strides: [usize; 2],
    pad_before: [usize; 2],
}

impl PoolGeometry {
    fn new(input: &[usize], attrs: &PoolAttrs) -> Result<Self, String> {
        let [n, h, w, c] = <[usize; 4]>::try_from(input)
            .map_err(|_| format!("internal: pooling input of shape {input:?}"))?;
        let (oh, pt, _) = window_output(h, attrs.window[0], attrs.strides[0], 1, attrs.padding, 0)?;
        let (ow, pl, _) = window_output(w, attrs.window[1], attrs.strides[1], 1, attrs.padding, 1)?;
        Ok(PoolGeometry {
            n,
            h,
            w,
            c,
            oh,
            ow,
            window: attrs.window,
            strides: attrs.strides,
            pad_before: [pt, pl],
        })
    }

    fn input_shape(&self) -> Vec<usize> {
        vec![self.n, self.h, self.w, self.c]
    }

    fn output_shape(&self) -> Vec<usize> {
        vec![self.n, self.oh, self.ow, self.c]
    }

    /// Calls `f(yi, cells)` for every output cell, `cells` being the in-bounds input indices of
    /// its window in row-major order.
    fn for_each_window(&self, mut f: impl FnMut(usize, &[usize])) {
        let mut cells = Vec::with_capacity(self.window[0] * self.window[1]);
        for b in 0..self.n {
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    for ch in 0..self.c {
                        cells.clear();
                        for ky in 0..self.window[0] {
                            let Some(iy) = (oy * self.strides[0] + ky)
                                .checked_sub(self.pad_before[0])
                                .filter(|&p| p < self.h)
                            else {
                                continue;
                            };
                            for kx in 0..self.window[1] {
                                let Some(ix) = (ox * self.strides[1] + kx)
                                    .checked_sub(self.pad_before[1])
                                    .filter(|&p| p < self.w)
                                else {
                                    continue;
                                };
                                cells.push(((b * self.h + iy) * self.w + ix) * self.c + ch);
                            }
                        }
                        let yi = ((b * self.oh + oy) * self.ow + ox) * self.c + ch;
                        f(yi, &cells);
                    }
                }
            }
        }
    }
}

/// `Pool`: max or average pooling.
pub(crate) fn pool(x: &Array, attrs: &PoolAttrs) -> Result<Output, String> {
    let geo = PoolGeometry::new(&x.shape, attrs)?;
    let xv = x.floats("input")?;
    let mut y = vec![0.0; geo.output_shape().iter().product()];
    geo.for_each_window(|yi, cells| {
        y[yi] = match attrs.kind {
            PoolKind::Max => {
                first_max(cells.iter().map(|&i| xv[i])).map_or(f64::NEG_INFINITY, |p| xv[cells[p]])
            }
            PoolKind::Avg if cells.is_empty() => 0.0,
            PoolKind::Avg => cells.iter().map(|&i| xv[i]).sum::<f64>() / cells.len() as f64,
        };
    });
    Ok(Output::new(geo.output_shape(), Elements::Float(y)))
}

fn check_gradient(geo: &PoolGeometry, dy: &Array) -> Result<(), String> {
    if dy.shape != geo.output_shape() {
        return Err(format!(
            "internal: gradient {:?}, pooling gives {:?}",
            dy.shape,
            geo.output_shape()
        ));
    }
    Ok(())
}

/// `MaxPoolGrad`: inputs `(x, dy)`; each `dy` goes to the first maximum of its window in `x`.
pub(crate) fn max_pool_grad(x: &Array, dy: &Array, attrs: &PoolAttrs) -> Result<Output, String> {
    let geo = PoolGeometry::new(&x.shape, attrs)?;
    check_gradient(&geo, dy)?;
    let (xv, dyv) = (x.floats("input")?, dy.floats("gradient")?);
    let mut dx = vec![0.0; xv.len()];
    geo.for_each_window(|yi, cells| {
        if let Some(p) = first_max(cells.iter().map(|&i| xv[i])) {
            dx[cells[p]] += dyv[yi];
        }
    });
    Ok(Output::new(geo.input_shape(), Elements::Float(dx)))
}

/// `AvgPoolGrad`: input `dy`, output `[N, H, W, C]` with `input_hw = [H, W]`.
pub(crate) fn avg_pool_grad(
    dy: &Array,
    attrs: &PoolAttrs,
    input_hw: [usize; 2],
) -> Result<Output, String> {
    let (n, c) = match dy.shape.as_slice() {
        &[n, _, _, c] => (n, c),
        other => return Err(format!("internal: gradient of shape {other:?}")),
    };
    let geo = PoolGeometry::new(&[n, input_hw[0], input_hw[1], c], attrs)?;
    check_gradient(&geo, dy)?;
    let dyv = dy.floats("gradient")?;
    let mut dx = vec![0.0; geo.input_shape().iter().product()];
    geo.for_each_window(|yi, cells| {
        for &i in cells {
            dx[i] += dyv[yi] / cells.len() as f64;
        }
    });
    Ok(Output::new(geo.input_shape(), Elements::Float(dx)))
}
