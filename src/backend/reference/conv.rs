//! 2-D convolution (NHWC input, HWIO filter) and its two gradients.
//!
//! One [`ConvGeometry`] enumerates every multiply-add term `y[yi] += x[xi] * w[wi]` of the
//! convolution (stride, TF padding via `ir::window_output`, dilation, groups). `Conv2d` sums the
//! terms into `y`; `Conv2dBackpropInput` scatters `dy[yi] * w[wi]` into `dx[xi]`;
//! `Conv2dBackpropFilter` scatters `x[xi] * dy[yi]` into `dw[wi]`. The gradients are therefore
//! the exact adjoints of the forward op, term by term.

use super::array::{Array, Elements, Output};
use crate::ir::{Conv2dAttrs, window_output};

/// The sizes of one convolution and the padding TF applies before each spatial axis.
#[derive(Clone, Copy, Debug)]
struct ConvGeometry {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    kh: usize,
    kw: usize,
    /// Input channels per group (the filter's third axis).
    cg: usize,
    o: usize,
    oh: usize,
    ow: usize,
    strides: [usize; 2],
    dilations: [usize; 2],
    pad_before: [usize; 2],
    groups: usize,
}

impl ConvGeometry {
    /// The geometry of convolving an `[n, h, w, c]` input with a `[kh, kw, cg, o]` filter.
    fn new(input: [usize; 4], filter: [usize; 4], attrs: &Conv2dAttrs) -> Result<Self, String> {
        let [n, h, w, c] = input;
        let [kh, kw, cg, o] = filter;
        let groups = attrs.groups;
        if groups == 0 || cg * groups != c || !o.is_multiple_of(groups) {
            return Err(format!(
                "internal: input {input:?} and filter {filter:?} with {groups} groups"
            ));
        }
        let (oh, pt, _) = window_output(
            h,
            kh,
            attrs.strides[0],
            attrs.dilations[0],
            attrs.padding,
            0,
        )?;
        let (ow, pl, _) = window_output(
            w,
            kw,
            attrs.strides[1],
            attrs.dilations[1],
            attrs.padding,
            1,
        )?;
        Ok(ConvGeometry {
            n,
            h,
            w,
            c,
            kh,
            kw,
            cg,
            o,
            oh,
            ow,
            strides: attrs.strides,
            dilations: attrs.dilations,
            pad_before: [pt, pl],
            groups,
        })
    }

    fn input_len(&self) -> usize {
        self.n * self.h * self.w * self.c
    }

    fn filter_len(&self) -> usize {
        self.kh * self.kw * self.cg * self.o
    }

    fn output_shape(&self) -> Vec<usize> {
        vec![self.n, self.oh, self.ow, self.o]
    }

    /// The input coordinate a tap reads on one spatial axis, or `None` in the padding.
    fn source(&self, axis: usize, out: usize, tap: usize) -> Option<usize> {
        let pos = out * self.strides[axis] + tap * self.dilations[axis];
        let size = [self.h, self.w][axis];
        pos.checked_sub(self.pad_before[axis]).filter(|&p| p < size)
    }

    /// Calls `f(yi, xi, wi)` for every term `y[yi] += x[xi] * w[wi]`, in the order
    /// `(n, oy, ox, o, ky, kx, ci)`: each output's terms are consecutive, taps in row-major order.
    fn for_each_term(&self, mut f: impl FnMut(usize, usize, usize)) {
        let og = self.o / self.groups;
        for b in 0..self.n {
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    for oc in 0..self.o {
                        let yi = ((b * self.oh + oy) * self.ow + ox) * self.o + oc;
                        let group = oc / og;
                        for ky in 0..self.kh {
                            let Some(iy) = self.source(0, oy, ky) else {
                                continue;
                            };
                            for kx in 0..self.kw {
                                let Some(ix) = self.source(1, ox, kx) else {
                                    continue;
                                };
                                for ci in 0..self.cg {
                                    let xi = ((b * self.h + iy) * self.w + ix) * self.c
                                        + group * self.cg
                                        + ci;
                                    let wi = ((ky * self.kw + kx) * self.cg + ci) * self.o + oc;
                                    f(yi, xi, wi);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn dims4(a: &Array, what: &str) -> Result<[usize; 4], String> {
    <[usize; 4]>::try_from(a.shape.as_slice())
        .map_err(|_| format!("internal: {what} has shape {:?}, expected rank 4", a.shape))
}

fn check_output(geo: &ConvGeometry, dy: &Array) -> Result<(), String> {
    if dy.shape != geo.output_shape() {
        return Err(format!(
            "internal: output gradient {:?}, convolution gives {:?}",
            dy.shape,
            geo.output_shape()
        ));
    }
    Ok(())
}

/// `Conv2d`: inputs `(x [N,H,W,C], w [KH,KW,C/groups,O])`.
pub(crate) fn conv2d(x: &Array, w: &Array, attrs: &Conv2dAttrs) -> Result<Output, String> {
    let geo = ConvGeometry::new(dims4(x, "input")?, dims4(w, "filter")?, attrs)?;
    let (xv, wv) = (x.floats("input")?, w.floats("filter")?);
    let mut y = vec![0.0; geo.output_shape().iter().product()];
    geo.for_each_term(|yi, xi, wi| y[yi] += xv[xi] * wv[wi]);
    Ok(Output::new(geo.output_shape(), Elements::Float(y)))
}

/// `Conv2dBackpropInput`: inputs `(dy [N,OH,OW,O], w)`, output `[N, H, W, C]`.
pub(crate) fn conv2d_backprop_input(
    dy: &Array,
    w: &Array,
    attrs: &Conv2dAttrs,
    input_hw: [usize; 2],
) -> Result<Output, String> {
    let f = dims4(w, "filter")?;
    let n = dims4(dy, "output gradient")?[0];
    let geo = ConvGeometry::new([n, input_hw[0], input_hw[1], f[2] * attrs.groups], f, attrs)?;
    check_output(&geo, dy)?;
    let (dyv, wv) = (dy.floats("output gradient")?, w.floats("filter")?);
    let mut dx = vec![0.0; geo.input_len()];
    geo.for_each_term(|yi, xi, wi| dx[xi] += dyv[yi] * wv[wi]);
    Ok(Output::new(
        vec![geo.n, geo.h, geo.w, geo.c],
        Elements::Float(dx),
    ))
}

/// `Conv2dBackpropFilter`: inputs `(x [N,H,W,C], dy [N,OH,OW,O])`, output `[KH, KW, C/groups, O]`.
pub(crate) fn conv2d_backprop_filter(
    x: &Array,
    dy: &Array,
    attrs: &Conv2dAttrs,
    filter_hw: [usize; 2],
) -> Result<Output, String> {
    let xs = dims4(x, "input")?;
    let o = dims4(dy, "output gradient")?[3];
    let groups = attrs.groups.max(1);
    let f = [filter_hw[0], filter_hw[1], xs[3] / groups, o];
    let geo = ConvGeometry::new(xs, f, attrs)?;
    check_output(&geo, dy)?;
    let (xv, dyv) = (x.floats("input")?, dy.floats("output gradient")?);
    let mut dw = vec![0.0; geo.filter_len()];
    geo.for_each_term(|yi, xi, wi| dw[wi] += xv[xi] * dyv[yi]);
    Ok(Output::new(f.to_vec(), Elements::Float(dw)))
}
