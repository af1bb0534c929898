//! The geometry of convolution and pooling kernels (paddings, strides, extents) from the
//! ops' attributes and their operands' shapes.

use crate::ir::{Conv2dAttrs, PoolAttrs, window_output};
use crate::lower::program::{ConvGeom, PoolGeom};

pub(super) fn conv_geom(a: &Conv2dAttrs, x: &[usize], w: &[usize], y: &[usize]) -> ConvGeom {
    let pad = |axis: usize, input: usize, k: usize| {
        window_output(
            input,
            k,
            a.strides[axis],
            a.dilations[axis],
            a.padding,
            axis,
        )
        .map(|(_, b, e)| (b, e))
        .unwrap_or((0, 0))
    };
    let (pt, pb) = pad(0, x[1], w[0]);
    let (pl, pr) = pad(1, x[2], w[1]);
    ConvGeom {
        n: x[0],
        h: x[1],
        w: x[2],
        c: x[3],
        oh: y[1],
        ow: y[2],
        o: y[3],
        kh: w[0],
        kw: w[1],
        stride: a.strides,
        dilation: a.dilations,
        pad: [pt, pb, pl, pr],
        groups: a.groups,
        round_operands: None,
    }
}

pub(super) fn pool_geom(a: &PoolAttrs, x: &[usize], y: &[usize]) -> PoolGeom {
    let pad = |axis: usize, input: usize| {
        window_output(input, a.window[axis], a.strides[axis], 1, a.padding, axis)
            .map(|(_, b, e)| (b, e))
            .unwrap_or((0, 0))
    };
    let (pt, pb) = pad(0, x[1]);
    let (pl, pr) = pad(1, x[2]);
    PoolGeom {
        kind: a.kind,
        n: x[0],
        h: x[1],
        w: x[2],
        c: x[3],
        oh: y[1],
        ow: y[2],
        window: a.window,
        stride: a.strides,
        pad: [pt, pb, pl, pr],
    }
}
