//! Max and average pooling against hand values; MaxPoolGrad's first-maximum routing; both
//! gradients checked as adjoints on random geometries.

use crate::common::*;
use rand::Rng;
use towerpack::backend::reference::Precision;
use towerpack::ir::{Op, Padding, PoolAttrs, PoolKind, Value};
use towerpack::tensor::{DType, HostTensor};

const P64: Precision = Precision::F64;

fn pool(kind: PoolKind, window: [usize; 2], strides: [usize; 2], padding: Padding) -> PoolAttrs {
    PoolAttrs {
        kind,
        window,
        strides,
        padding,
    }
}

fn seq(shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor::from_f64_values(DType::F32, shape, (1..=n).map(|v| v as f64).collect()).expect("n")
}

#[test]
fn max_and_avg_pool_match_hand_values() {
    let x = seq(&[1, 4, 4, 1]);
    let max = pool(PoolKind::Max, [2, 2], [2, 2], Padding::Valid);
    assert_close(
        &run_op(Op::Pool(max), vec![x.clone()], P64),
        &[6.0, 8.0, 14.0, 16.0],
        0.0,
    );
    let avg = pool(PoolKind::Avg, [2, 2], [2, 2], Padding::Valid);
    assert_close(
        &run_op(Op::Pool(avg), vec![x], P64),
        &[3.5, 5.5, 11.5, 13.5],
        0.0,
    );

    // Same padding on 3x3 with a 2x2 window: the padding cell is after; the average divides by
    // the number of cells inside the input.
    let x = seq(&[1, 3, 3, 1]);
    let avg = pool(PoolKind::Avg, [2, 2], [1, 1], Padding::Same);
    let want = [3.0, 4.0, 4.5, 6.0, 7.0, 7.5, 7.5, 8.5, 9.0];
    assert_close(&run_op(Op::Pool(avg), vec![x], P64), &want, 0.0);

    // Max pooling never sees the padding: an all-negative input keeps negative maxima.
    let neg = f32s(&[1, 2, 2, 1], &[-4.0, -3.0, -2.0, -1.0]);
    let max = pool(PoolKind::Max, [2, 2], [1, 1], Padding::Same);
    assert_close(
        &run_op(Op::Pool(max), vec![neg], P64),
        &[-1.0, -1.0, -1.0, -1.0],
        0.0,
    );
}

#[test]
fn windows_entirely_in_explicit_padding_give_minus_infinity_or_zero() {
    let x = f32s(&[1, 1, 2, 1], &[3.0, 5.0]);
    let pads = Padding::Explicit([(0, 0), (2, 0)]);
    let max = pool(PoolKind::Max, [1, 1], [1, 1], pads);
    let want = [f64::NEG_INFINITY, f64::NEG_INFINITY, 3.0, 5.0];
    assert_close(&run_op(Op::Pool(max), vec![x.clone()], P64), &want, 0.0);
    let avg = pool(PoolKind::Avg, [1, 1], [1, 1], pads);
    assert_close(
        &run_op(Op::Pool(avg), vec![x], P64),
        &[0.0, 0.0, 3.0, 5.0],
        0.0,
    );
}

#[test]
fn max_pool_grad_routes_to_the_first_maximum() {
    // Ties: the window [[5, 5], [5, 1]] routes to its top-left cell (row-major scan).
    let x = f32s(&[1, 2, 2, 1], &[5.0, 5.0, 5.0, 1.0]);
    let a = pool(PoolKind::Max, [2, 2], [2, 2], Padding::Valid);
    let got = run_op(
        Op::MaxPoolGrad(a),
        vec![x, f32s(&[1, 1, 1, 1], &[3.0])],
        P64,
    );
    assert_close(&got, &[3.0, 0.0, 0.0, 0.0], 0.0);

    // Overlapping windows accumulate: 1x3 input [1, 9, 2], window 2, stride 1 (both pick 9).
    let x = f32s(&[1, 1, 3, 1], &[1.0, 9.0, 2.0]);
    let a = pool(PoolKind::Max, [1, 2], [1, 1], Padding::Valid);
    let got = run_op(
        Op::MaxPoolGrad(a),
        vec![x, f32s(&[1, 1, 2, 1], &[10.0, 0.5])],
        P64,
    );
    assert_close(&got, &[0.0, 10.5, 0.0], 0.0);

    // Channels are pooled independently.
    let x = f32s(&[1, 1, 2, 2], &[1.0, 4.0, 3.0, 2.0]);
    let a = pool(PoolKind::Max, [1, 2], [1, 1], Padding::Valid);
    let got = run_op(
        Op::MaxPoolGrad(a),
        vec![x, f32s(&[1, 1, 1, 2], &[1.0, 2.0])],
        P64,
    );
    assert_close(&got, &[0.0, 2.0, 1.0, 0.0], 0.0);
}

#[test]
fn avg_pool_grad_matches_hand_values() {
    // 1x3, window 2, stride 1, Same: windows {0,1}, {1,2}, {2}.
    let a = pool(PoolKind::Avg, [1, 2], [1, 1], Padding::Same);
    let op = Op::AvgPoolGrad {
        attrs: a,
        input_hw: [1, 3],
    };
    let got = run_op(op, vec![f32s(&[1, 1, 3, 1], &[2.0, 4.0, 8.0])], P64);
    assert_close(&got, &[1.0, 3.0, 10.0], 0.0);
}

#[test]
fn pool_gradients_are_adjoints_on_random_geometries() {
    let mut r = rng(51);
    let mut checked = 0;
    for _ in 0..150 {
        let window = [r.random_range(1..=3), r.random_range(1..=3)];
        // Explicit padding smaller than the window, so every window holds an input cell.
        let padding = match r.random_range(0..3) {
            0 => Padding::Same,
            1 => Padding::Valid,
            _ => Padding::Explicit([
                (r.random_range(0..window[0]), r.random_range(0..window[0])),
                (r.random_range(0..window[1]), r.random_range(0..window[1])),
            ]),
        };
        let strides = [r.random_range(1..=3), r.random_range(1..=3)];
        let shape = [
            r.random_range(1..=2),
            r.random_range(1..=6),
            r.random_range(1..=6),
            r.random_range(1..=3),
        ];
        let mut b = Builder::new();
        let x = b.constant(random(&mut r, DType::F64, &shape));
        let avg = pool(PoolKind::Avg, window, strides, padding);
        let max = pool(PoolKind::Max, window, strides, padding);
        let Ok(ya) = b.g.add_node("avg", Op::Pool(avg), &[x]) else {
            continue; // the window does not fit this input
        };
        let ym = b.op(Op::Pool(max), &[x]);
        let y_shape = b.g.node(ya).outputs[0].shape.to_static().expect("static");
        let dy = b.constant(random(&mut r, DType::F64, &y_shape));
        let da = b.op(
            Op::AvgPoolGrad {
                attrs: avg,
                input_hw: [shape[1], shape[2]],
            },
            &[dy],
        );
        let dm = b.op(Op::MaxPoolGrad(max), &[x, dy]);
        let outs = eval(&b.g, &[], &[Value::first(ya), ym, da, dm, x, dy], P64).expect("pools");
        let (xv, dyv) = (&outs[4], &outs[5]);
        // Average pooling is linear: AvgPoolGrad is its adjoint.
        let fwd = dot(&outs[0], dyv);
        assert!(
            (dot(xv, &outs[2]) - fwd).abs() <= 1e-12 * (1.0 + fwd.abs()),
            "avg {avg:?}"
        );
        // Max pooling selects one cell per window: MaxPoolGrad is the adjoint of that selection.
        let fwd = dot(&outs[1], dyv);
        assert!(
            (dot(xv, &outs[3]) - fwd).abs() <= 1e-12 * (1.0 + fwd.abs()),
            "max {max:?}"
        );
        checked += 1;
    }
    assert!(checked >= 80, "only {checked} geometries fit");
}
