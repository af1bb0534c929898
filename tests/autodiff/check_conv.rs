//! Gradient checks of convolutions, their backprop ops (differentiated as forward ops) and
//! pooling against central differences in f64, on random geometries: strides, dilations,
//! SAME/VALID/explicit padding and groups.

use crate::autodiff_support;

use autodiff_support::{Case, Worst, symbolic};
use towerpack::ir::{Conv2dAttrs, Op, Padding, PoolAttrs, PoolKind, window_output};

const CASES: u64 = 25;

/// A random padding.
fn padding(c: &mut Case) -> Padding {
    match c.size(0, 2) {
        0 => Padding::Same,
        1 => Padding::Valid,
        _ => Padding::Explicit([(c.size(0, 2), c.size(0, 2)), (c.size(0, 2), c.size(0, 2))]),
    }
}

/// A random convolution: `(x dims, filter dims, attrs, output dims)`.
fn conv_geometry(c: &mut Case) -> (Vec<usize>, Vec<usize>, Conv2dAttrs, Vec<usize>) {
    loop {
        let groups = c.size(1, 2);
        let (cin, cout) = (c.size(1, 2), c.size(1, 2));
        let (n, h, w) = (c.size(1, 2), c.size(2, 6), c.size(2, 6));
        let (kh, kw) = (c.size(1, 3), c.size(1, 3));
        let attrs = Conv2dAttrs {
            strides: [c.size(1, 2), c.size(1, 2)],
            padding: padding(c),
            dilations: [c.size(1, 2), c.size(1, 2)],
            groups,
        };
        let oh = window_output(
            h,
            kh,
            attrs.strides[0],
            attrs.dilations[0],
            attrs.padding,
            0,
        );
        let ow = window_output(
            w,
            kw,
            attrs.strides[1],
            attrs.dilations[1],
            attrs.padding,
            1,
        );
        if let (Ok((oh, _, _)), Ok((ow, _, _))) = (oh, ow) {
            let x = vec![n, h, w, cin * groups];
            let f = vec![kh, kw, cin, cout * groups];
            let y = vec![n, oh, ow, cout * groups];
            return (x, f, attrs, y);
        }
    }
}

/// A random pooling: `(x dims, attrs, output dims)`.
fn pool_geometry(c: &mut Case, kind: PoolKind) -> (Vec<usize>, PoolAttrs, Vec<usize>) {
    loop {
        let (n, h, w, ch) = (c.size(1, 2), c.size(2, 6), c.size(2, 6), c.size(1, 3));
        let attrs = PoolAttrs {
            kind,
            window: [c.size(1, 3), c.size(1, 3)],
            strides: [c.size(1, 2), c.size(1, 2)],
            padding: padding(c),
        };
        let oh = window_output(h, attrs.window[0], attrs.strides[0], 1, attrs.padding, 0);
        let ow = window_output(w, attrs.window[1], attrs.strides[1], 1, attrs.padding, 1);
        if let (Ok((oh, _, _)), Ok((ow, _, _))) = (oh, ow) {
            return (vec![n, h, w, ch], attrs, vec![n, oh, ow, ch]);
        }
    }
}

#[test]
fn conv2d_matches_finite_differences() {
    let mut worst = Worst("conv2d", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(5000 + i);
        let (xd, fd, attrs, _) = conv_geometry(&mut c);
        let batched = c.coin();
        let x = c.random_input("x", &xd, batched, -1.0, 1.0);
        let w = c.random_input("w", &fd, false, -1.0, 1.0);
        let y = c.node("y", Op::Conv2d(attrs), &[x, w]);
        worst.see(c.check(&[y], &[x, w]));
    }
}

#[test]
fn conv2d_backprop_input_is_differentiated_as_a_forward_op() {
    let mut worst = Worst("conv2d_backprop_input", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(5100 + i);
        let (xd, fd, attrs, yd) = conv_geometry(&mut c);
        let batched = c.coin();
        let dy = c.random_input("dy", &yd, batched, -1.0, 1.0);
        let w = c.random_input("w", &fd, false, -1.0, 1.0);
        let op = Op::Conv2dBackpropInput {
            attrs,
            input_hw: [xd[1], xd[2]],
        };
        let dx = c.node("dx", op, &[dy, w]);
        worst.see(c.check(&[dx], &[dy, w]));
    }
}

#[test]
fn conv2d_backprop_filter_is_differentiated_as_a_forward_op() {
    let mut worst = Worst("conv2d_backprop_filter", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(5200 + i);
        let (xd, fd, attrs, yd) = conv_geometry(&mut c);
        let batched = c.coin();
        let x = c.random_input("x", &xd, batched, -1.0, 1.0);
        let dy = c.random_input("dy", &yd, batched, -1.0, 1.0);
        let op = Op::Conv2dBackpropFilter {
            attrs,
            filter_hw: [fd[0], fd[1]],
        };
        let dw = c.node("dw", op, &[x, dy]);
        worst.see(c.check(&[dw], &[x, dy]));
    }
}

#[test]
fn pooling_matches_finite_differences() {
    let mut worst = Worst("max_pool/avg_pool", 0.0);
    for i in 0..CASES * 2 {
        let mut c = Case::new(5300 + i);
        let kind = if i % 2 == 0 {
            PoolKind::Max
        } else {
            PoolKind::Avg
        };
        let (xd, attrs, _) = pool_geometry(&mut c, kind);
        let batched = c.coin();
        let n = xd.iter().product();
        // Distinct values: every window has a unique maximum.
        let values = c.distinct(n, -2.0, 2.0);
        let x = c.input("x", symbolic(&xd, batched), &xd, values);
        let y = c.node("y", Op::Pool(attrs), &[x]);
        worst.see(c.check(&[y], &[x]));
    }
}

#[test]
fn avg_pool_grad_is_differentiated_as_a_forward_op() {
    let mut worst = Worst("avg_pool_grad", 0.0);
    for i in 0..CASES {
        let mut c = Case::new(5400 + i);
        let (xd, attrs, yd) = pool_geometry(&mut c, PoolKind::Avg);
        let batched = c.coin();
        let dy = c.random_input("dy", &yd, batched, -1.0, 1.0);
        let op = Op::AvgPoolGrad {
            attrs,
            input_hw: [xd[1], xd[2]],
        };
        let dx = c.node("dx", op, &[dy]);
        worst.see(c.check(&[dx], &[dy]));
    }
}

#[test]
fn a_conv_relu_pool_stack_matches_finite_differences() {
    // The shape of the convnet the trainer will run: conv -> relu -> max pool -> mean.
    let mut worst = Worst("conv/relu/pool stack", 0.0);
    for i in 0..CASES / 2 {
        let mut c = Case::new(5500 + i);
        let (xd, fd, attrs, _) = conv_geometry(&mut c);
        let x = c.random_input("x", &xd, true, -1.0, 1.0);
        let w = c.random_input("w", &fd, false, -1.0, 1.0);
        let y = c.node("y", Op::Conv2d(attrs), &[x, w]);
        let r = c.node("r", Op::Unary(towerpack::ir::UnaryOp::Tanh), &[y]);
        let p = c.node(
            "p",
            Op::Pool(PoolAttrs {
                kind: PoolKind::Avg,
                window: [2, 2],
                strides: [2, 2],
                padding: Padding::Same,
            }),
            &[r],
        );
        worst.see(c.check(&[p], &[x, w]));
    }
}
