//! Conv2d against hand values and an independent pad-dilate-correlate formulation; its two
//! gradients checked as exact adjoints on random geometries.

use crate::common::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use towerpack::backend::reference::Precision;
use towerpack::ir::{Conv2dAttrs, Op, Padding, Value, window_output};
use towerpack::tensor::{DType, HostTensor};

const P64: Precision = Precision::F64;

fn attrs(
    strides: [usize; 2],
    padding: Padding,
    dilations: [usize; 2],
    groups: usize,
) -> Conv2dAttrs {
    Conv2dAttrs {
        strides,
        padding,
        dilations,
        groups,
    }
}

fn seq(shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    let values = (1..=n).map(|v| v as f64).collect();
    HostTensor::from_f64_values(DType::F32, shape, values).expect("count")
}

#[test]
fn conv2d_matches_hand_values() {
    let diag = f32s(&[2, 2, 1, 1], &[1.0, 0.0, 0.0, 1.0]);
    let valid = attrs([1, 1], Padding::Valid, [1, 1], 1);
    let got = run_op(
        Op::Conv2d(valid),
        vec![seq(&[1, 3, 3, 1]), diag.clone()],
        P64,
    );
    assert_close(&got, &[6.0, 8.0, 12.0, 14.0], 0.0);

    // Same, stride 1, 2x2 kernel: the one padding cell goes after (bottom/right), as TF.
    let same = attrs([1, 1], Padding::Same, [1, 1], 1);
    let got = run_op(Op::Conv2d(same), vec![seq(&[1, 3, 3, 1]), diag], P64);
    assert_close(&got, &[6.0, 8.0, 3.0, 12.0, 14.0, 6.0, 7.0, 8.0, 9.0], 0.0);

    // Same, stride 2, 3x3 ones on 4x4: output 2x2, padding (0, 1) on both axes.
    let ones = f32s(&[3, 3, 1, 1], &[1.0; 9]);
    let same2 = attrs([2, 2], Padding::Same, [1, 1], 1);
    let got = run_op(Op::Conv2d(same2), vec![seq(&[1, 4, 4, 1]), ones], P64);
    assert_close(&got, &[54.0, 45.0, 72.0, 54.0], 0.0);

    // Dilation 2 along the width with two groups of one channel each.
    let x = f32s(&[1, 1, 3, 2], &[1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
    let w = f32s(&[1, 2, 1, 2], &[1.0, 3.0, 2.0, 4.0]);
    let grouped = attrs([1, 1], Padding::Valid, [1, 2], 2);
    let got = run_op(Op::Conv2d(grouped), vec![x, w], P64);
    assert_eq!(got.shape(), &[1, 1, 1, 2]);
    assert_close(&got, &[7.0, 150.0], 0.0);
}

#[test]
fn conv2d_gradients_match_hand_values() {
    // Stride-2 transposed convolution of a 1x1 filter scatters dy onto every other cell.
    let dy = f32s(&[1, 2, 2, 1], &[1.0, 2.0, 3.0, 4.0]);
    let a = attrs([2, 2], Padding::Valid, [1, 1], 1);
    let op = Op::Conv2dBackpropInput {
        attrs: a,
        input_hw: [3, 3],
    };
    let got = run_op(op, vec![dy, f32s(&[1, 1, 1, 1], &[2.0])], P64);
    assert_close(&got, &[2.0, 0.0, 4.0, 0.0, 0.0, 0.0, 6.0, 0.0, 8.0], 0.0);

    let valid = attrs([1, 1], Padding::Valid, [1, 1], 1);
    let op = Op::Conv2dBackpropFilter {
        attrs: valid,
        filter_hw: [2, 2],
    };
    let got = run_op(
        op,
        vec![seq(&[1, 2, 2, 1]), f32s(&[1, 1, 1, 1], &[2.0])],
        P64,
    );
    assert_eq!(got.shape(), &[2, 2, 1, 1]);
    assert_close(&got, &[2.0, 4.0, 6.0, 8.0], 0.0);
}

/// A random convolution geometry: `(x shape, filter shape, attrs)`.
fn random_geometry(r: &mut ChaCha8Rng) -> ([usize; 4], [usize; 4], Conv2dAttrs) {
    let groups = r.random_range(1..=3);
    let cg = r.random_range(1..=2);
    let og = r.random_range(1..=2);
    let padding = match r.random_range(0..3) {
        0 => Padding::Same,
        1 => Padding::Valid,
        _ => Padding::Explicit([
            (r.random_range(0..3), r.random_range(0..3)),
            (r.random_range(0..3), r.random_range(0..3)),
        ]),
    };
    let a = attrs(
        [r.random_range(1..=3), r.random_range(1..=3)],
        padding,
        [r.random_range(1..=2), r.random_range(1..=2)],
        groups,
    );
    let x = [
        r.random_range(1..=2),
        r.random_range(1..=7),
        r.random_range(1..=7),
        cg * groups,
    ];
    let f = [
        r.random_range(1..=3),
        r.random_range(1..=3),
        cg,
        og * groups,
    ];
    (x, f, a)
}

/// Conv2d written independently: pad the input explicitly, dilate the filter explicitly, then
/// correlate each group at every stride-th position.
fn naive_conv2d(x: &HostTensor, w: &HostTensor, a: &Conv2dAttrs) -> Option<(Vec<f64>, [usize; 4])> {
    let [n, h, wd, c] = <[usize; 4]>::try_from(x.shape()).ok()?;
    let [kh, kw, cg, o] = <[usize; 4]>::try_from(w.shape()).ok()?;
    let (oh, top, bottom) =
        window_output(h, kh, a.strides[0], a.dilations[0], a.padding, 0).ok()?;
    let (ow, left, right) =
        window_output(wd, kw, a.strides[1], a.dilations[1], a.padding, 1).ok()?;
    let (hp, wp) = (h + top + bottom, wd + left + right);
    let xv = x.to_f64_vec();
    let mut padded = vec![0.0; n * hp * wp * c];
    for b in 0..n {
        for i in 0..h {
            for j in 0..wd {
                for ch in 0..c {
                    padded[((b * hp + i + top) * wp + j + left) * c + ch] =
                        xv[((b * h + i) * wd + j) * c + ch];
                }
            }
        }
    }
    let (ekh, ekw) = ((kh - 1) * a.dilations[0] + 1, (kw - 1) * a.dilations[1] + 1);
    let wv = w.to_f64_vec();
    let mut dilated = vec![0.0; ekh * ekw * cg * o];
    for i in 0..kh {
        for j in 0..kw {
            for ci in 0..cg {
                for oc in 0..o {
                    dilated[((i * a.dilations[0] * ekw + j * a.dilations[1]) * cg + ci) * o + oc] =
                        wv[((i * kw + j) * cg + ci) * o + oc];
                }
            }
        }
    }
    let og = o / a.groups;
    let mut y = vec![0.0; n * oh * ow * o];
    for b in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                for oc in 0..o {
                    let g = oc / og;
                    let mut acc = 0.0;
                    for i in 0..ekh {
                        for j in 0..ekw {
                            for ci in 0..cg {
                                let (py, px) = (oy * a.strides[0] + i, ox * a.strides[1] + j);
                                acc += padded[((b * hp + py) * wp + px) * c + g * cg + ci]
                                    * dilated[((i * ekw + j) * cg + ci) * o + oc];
                            }
                        }
                    }
                    y[((b * oh + oy) * ow + ox) * o + oc] = acc;
                }
            }
        }
    }
    Some((y, [n, oh, ow, o]))
}

#[test]
fn conv2d_matches_an_independent_formulation_on_random_geometries() {
    let mut r = rng(41);
    let mut checked = 0;
    for _ in 0..200 {
        let (xs, fs, a) = random_geometry(&mut r);
        let x = random(&mut r, DType::F64, &xs);
        let w = random(&mut r, DType::F64, &fs);
        let Some((want, shape)) = naive_conv2d(&x, &w, &a) else {
            continue; // the window does not fit this input
        };
        let got = run_op(Op::Conv2d(a), vec![x, w], P64);
        assert_eq!(got.shape(), &shape, "{a:?}");
        assert_close(&got, &want, 1e-12);
        checked += 1;
    }
    assert!(checked >= 100, "only {checked} geometries fit");
}

#[test]
fn conv2d_gradients_are_exact_adjoints_on_random_geometries() {
    let mut r = rng(42);
    let mut checked = 0;
    for _ in 0..200 {
        let (xs, fs, a) = random_geometry(&mut r);
        let mut b = Builder::new();
        let x = b.constant(random(&mut r, DType::F64, &xs));
        let w = b.constant(random(&mut r, DType::F64, &fs));
        let Ok(conv) = b.g.add_node("conv", Op::Conv2d(a), &[x, w]) else {
            continue; // the window does not fit this input
        };
        let y_shape = b.g.node(conv).outputs[0].shape.to_static().expect("static");
        let dy = b.constant(random(&mut r, DType::F64, &y_shape));
        let bpi = b.op(
            Op::Conv2dBackpropInput {
                attrs: a,
                input_hw: [xs[1], xs[2]],
            },
            &[dy, w],
        );
        let bpf = b.op(
            Op::Conv2dBackpropFilter {
                attrs: a,
                filter_hw: [fs[0], fs[1]],
            },
            &[x, dy],
        );
        let outs =
            eval(&b.g, &[], &[Value::first(conv), bpi, bpf, x, w, dy], P64).expect("conv step");
        let (y, dx, dw, xv, wv, dyv) = (&outs[0], &outs[1], &outs[2], &outs[3], &outs[4], &outs[5]);
        let forward = dot(y, dyv);
        let scale = 1.0 + forward.abs();
        assert!(
            (dot(xv, dx) - forward).abs() <= 1e-12 * scale,
            "input adjoint, {a:?}"
        );
        assert!(
            (dot(wv, dw) - forward).abs() <= 1e-12 * scale,
            "filter adjoint, {a:?}"
        );
        checked += 1;
    }
    assert!(checked >= 100, "only {checked} geometries fit");
}
