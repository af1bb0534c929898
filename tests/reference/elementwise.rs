//! Unary, binary, select and cast against hand-computed values, rounding and wrapping rules.

use crate::common::*;
use rand::Rng;
use towerpack::backend::reference::Precision;
use towerpack::ir::{BinaryOp, Op, UnaryOp, Value, scalar};
use towerpack::tensor::{DType, HostTensor};

const P32: Precision = Precision::F32;
const P64: Precision = Precision::F64;

#[test]
fn float_unary_ops_match_hand_values() {
    let ln2 = 2f64.ln();
    let ln3 = 3f64.ln();
    let cases: [(UnaryOp, Vec<f64>, Vec<f64>); 13] = [
        (UnaryOp::Neg, vec![-2.0, 0.5], vec![2.0, -0.5]),
        (UnaryOp::Abs, vec![-2.0, 0.5], vec![2.0, 0.5]),
        (UnaryOp::Sign, vec![-3.0, 0.0, 0.25], vec![-1.0, 0.0, 1.0]),
        (
            UnaryOp::Exp,
            vec![0.0, 1.0, ln3],
            vec![1.0, std::f64::consts::E, 3.0],
        ),
        (
            UnaryOp::Log,
            vec![1.0, std::f64::consts::E, 0.0],
            vec![0.0, 1.0, f64::NEG_INFINITY],
        ),
        (UnaryOp::Sqrt, vec![4.0, 0.25], vec![2.0, 0.5]),
        (UnaryOp::Rsqrt, vec![4.0, 0.25], vec![0.5, 2.0]),
        (UnaryOp::Square, vec![3.0, -0.5], vec![9.0, 0.25]),
        (UnaryOp::Recip, vec![4.0, -0.5], vec![0.25, -2.0]),
        (UnaryOp::Relu, vec![-1.0, 0.0, 2.0], vec![0.0, 0.0, 2.0]),
        (
            UnaryOp::Sigmoid,
            vec![0.0, ln3, -ln3],
            vec![0.5, 0.75, 0.25],
        ),
        (UnaryOp::Tanh, vec![0.0, ln2, -ln2], vec![0.0, 0.6, -0.6]),
        (UnaryOp::Floor, vec![-1.5, 1.5, 2.0], vec![-2.0, 1.0, 2.0]),
    ];
    for (op, x, want) in cases {
        let got = run_op(Op::Unary(op), vec![f64s(&[x.len()], &x)], P64);
        assert_eq!(got.dtype(), DType::F64);
        assert_close(&got, &want, 1e-15);
        // The same op on f32 is the f64 result rounded once to f32.
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let got32 = run_op(Op::Unary(op), vec![f32s(&[x.len()], &x32)], P32);
        assert_eq!(got32.dtype(), DType::F32, "{op:?}");
        let exact = run_op(Op::Unary(op), vec![f32s(&[x.len()], &x32)], P64).to_f64_vec();
        let rounded: Vec<f64> = exact.iter().map(|&v| f64::from(v as f32)).collect();
        assert_close(&got32, &rounded, 0.0);
    }
}

#[test]
fn nan_propagates_through_sign_relu_maximum_and_minimum() {
    let x = f32s(&[2], &[f32::NAN, 1.0]);
    for op in [UnaryOp::Sign, UnaryOp::Relu] {
        assert_close(
            &run_op(Op::Unary(op), vec![x.clone()], P32),
            &[f64::NAN, 1.0],
            0.0,
        );
    }
    let y = f32s(&[2], &[1.0, f32::NAN]);
    for op in [BinaryOp::Maximum, BinaryOp::Minimum] {
        let got = run_op(Op::Binary(op), vec![x.clone(), y.clone()], P32);
        assert_close(&got, &[f64::NAN, f64::NAN], 0.0);
    }
}

#[test]
fn integer_and_bool_unary_ops_wrap_like_hardware() {
    let x = i32s(&[4], &[-5, 0, 7, i32::MIN]);
    assert_close(
        &run_op(Op::Unary(UnaryOp::Neg), vec![x.clone()], P32),
        &[5.0, 0.0, -7.0, -2147483648.0],
        0.0,
    );
    assert_close(
        &run_op(Op::Unary(UnaryOp::Abs), vec![x.clone()], P32),
        &[5.0, 0.0, 7.0, -2147483648.0],
        0.0,
    );
    assert_close(
        &run_op(Op::Unary(UnaryOp::Sign), vec![x], P32),
        &[-1.0, 0.0, 1.0, -1.0],
        0.0,
    );
    let u =
        towerpack::tensor::HostTensor::from_f64_values(DType::U8, &[2], vec![1.0, 0.0]).expect("2");
    let neg = run_op(Op::Unary(UnaryOp::Neg), vec![u], P32);
    assert_eq!(
        (neg.dtype(), neg.to_f64_vec()),
        (DType::U8, vec![255.0, 0.0])
    );
    let not = run_op(
        Op::Unary(UnaryOp::Not),
        vec![bools(&[2], &[true, false])],
        P32,
    );
    assert_eq!(not, bools(&[2], &[false, true]));
}

#[test]
fn binary_float_ops_broadcast_like_numpy() {
    let a = f32s(&[2, 1], &[1.0, 4.0]);
    let b = f32s(&[3], &[2.0, 0.5, -1.0]);
    let cases: [(BinaryOp, [f64; 6]); 7] = [
        (BinaryOp::Add, [3.0, 1.5, 0.0, 6.0, 4.5, 3.0]),
        (BinaryOp::Sub, [-1.0, 0.5, 2.0, 2.0, 3.5, 5.0]),
        (BinaryOp::Mul, [2.0, 0.5, -1.0, 8.0, 2.0, -4.0]),
        (BinaryOp::Div, [0.5, 2.0, -1.0, 2.0, 8.0, -4.0]),
        (BinaryOp::Pow, [1.0, 1.0, 1.0, 16.0, 2.0, 0.25]),
        (BinaryOp::Maximum, [2.0, 1.0, 1.0, 4.0, 4.0, 4.0]),
        (BinaryOp::Minimum, [1.0, 0.5, -1.0, 2.0, 0.5, -1.0]),
    ];
    for (op, want) in cases {
        let got = run_op(Op::Binary(op), vec![a.clone(), b.clone()], P32);
        assert_eq!(got.shape(), &[2, 3], "{op:?}");
        assert_close(&got, &want, 0.0);
    }
}

#[test]
fn random_broadcasts_match_an_explicit_coordinate_loop() {
    let mut r = rng(11);
    for _ in 0..20 {
        let (i, j, k) = (
            r.random_range(1..4),
            r.random_range(1..4),
            r.random_range(1..4),
        );
        let a = random(&mut r, DType::F64, &[i, 1, k]);
        let b = random(&mut r, DType::F64, &[j, 1]);
        let got = run_op(Op::Binary(BinaryOp::Sub), vec![a.clone(), b.clone()], P64);
        assert_eq!(got.shape(), &[i, j, k]);
        let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
        let mut want = Vec::new();
        for x in 0..i {
            for by in &bv {
                for z in 0..k {
                    want.push(av[x * k + z] - by);
                }
            }
        }
        assert_close(&got, &want, 0.0);
    }
}

#[test]
fn comparisons_give_bool_on_every_dtype() {
    let a = f32s(&[3], &[1.0, 2.0, 3.0]);
    let b = f32s(&[1], &[2.0]);
    let cases = [
        (BinaryOp::Eq, [false, true, false]),
        (BinaryOp::Ne, [true, false, true]),
        (BinaryOp::Lt, [true, false, false]),
        (BinaryOp::Le, [true, true, false]),
        (BinaryOp::Gt, [false, false, true]),
        (BinaryOp::Ge, [false, true, true]),
    ];
    for (op, want) in cases {
        let got = run_op(Op::Binary(op), vec![a.clone(), b.clone()], P32);
        assert_eq!(got, bools(&[3], &want), "{op:?} f32");
        let ints = run_op(
            Op::Binary(op),
            vec![i64s(&[3], &[1, 2, 3]), i64s(&[], &[2])],
            P32,
        );
        assert_eq!(ints, bools(&[3], &want), "{op:?} i64");
    }
    let t = bools(&[2], &[false, true]);
    let lt = run_op(
        Op::Binary(BinaryOp::Lt),
        vec![t.clone(), bools(&[], &[true])],
        P32,
    );
    assert_eq!(lt, bools(&[2], &[true, false]));
    let and = run_op(
        Op::Binary(BinaryOp::And),
        vec![t.clone(), bools(&[2], &[true, true])],
        P32,
    );
    assert_eq!(and, bools(&[2], &[false, true]));
    let or = run_op(Op::Binary(BinaryOp::Or), vec![t, bools(&[], &[false])], P32);
    assert_eq!(or, bools(&[2], &[false, true]));
}

#[test]
fn integer_arithmetic_truncates_and_wraps() {
    let a = i32s(&[4], &[-7, 7, i32::MAX, 3]);
    let b = i32s(&[4], &[2, -2, 1, 4]);
    let div = run_op(Op::Binary(BinaryOp::Div), vec![a.clone(), b.clone()], P32);
    assert_eq!(div, i32s(&[4], &[-3, -3, i32::MAX, 0]));
    let add = run_op(Op::Binary(BinaryOp::Add), vec![a.clone(), b.clone()], P32);
    assert_eq!(add, i32s(&[4], &[-5, 5, i32::MIN, 7]));
    let pow = run_op(
        Op::Binary(BinaryOp::Pow),
        vec![i32s(&[3], &[3, -2, 2]), i32s(&[3], &[4, 3, 31])],
        P32,
    );
    assert_eq!(pow, i32s(&[3], &[81, -8, i32::MIN]));
    let u8s = |v: &[f64]| {
        towerpack::tensor::HostTensor::from_f64_values(DType::U8, &[v.len()], v.to_vec())
            .expect("len")
    };
    let sum = run_op(
        Op::Binary(BinaryOp::Add),
        vec![u8s(&[200.0, 3.0]), u8s(&[100.0, 5.0])],
        P32,
    );
    assert_eq!(sum, u8s(&[44.0, 8.0]));
    let diff = run_op(
        Op::Binary(BinaryOp::Sub),
        vec![u8s(&[3.0]), u8s(&[5.0])],
        P32,
    );
    assert_eq!(diff, u8s(&[254.0]));
}

#[test]
fn integer_division_by_zero_gives_zero_and_negative_powers_truncate() {
    // As ir::scalar defines them: never a trap.
    let div = run_op(
        Op::Binary(BinaryOp::Div),
        vec![i64s(&[2], &[1, 2]), i64s(&[2], &[1, 0])],
        P32,
    );
    assert_eq!(div, i64s(&[2], &[1, 0]));
    let pow = run_op(
        Op::Binary(BinaryOp::Pow),
        vec![i64s(&[3], &[2, 1, -1]), i64s(&[3], &[-1, -2, -3])],
        P32,
    );
    assert_eq!(pow, i64s(&[3], &[0, 1, -1]));
}

#[test]
fn every_elementwise_op_follows_ir_scalar_on_every_dtype() {
    let grid = |dtype: DType| -> Vec<f64> {
        match dtype {
            DType::Bool => vec![0.0, 1.0],
            DType::U8 => vec![0.0, 1.0, 2.0, 7.0, 200.0, 255.0],
            DType::I32 | DType::I64 => vec![-7.0, -2.0, -1.0, 0.0, 1.0, 3.0, 2147483647.0],
            _ => vec![
                -2.5,
                -1.0,
                -0.0,
                0.0,
                0.5,
                3.0,
                70000.0,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::NAN,
            ],
        }
    };
    // What the reference must store: the scalar result rounded (floats) or wrapped (integers).
    let stored = |r: f64, dtype: DType| -> f64 {
        match dtype {
            DType::I32 => f64::from((r as i64) as i32),
            DType::U8 => f64::from((r as i64) as u8),
            DType::I64 => (r as i64) as f64,
            DType::Bool => f64::from(u8::from(r != 0.0)),
            _ => scalar::round_to(r, dtype),
        }
    };
    let same = |a: f64, b: f64| (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits();
    let mut checked = 0;
    for dtype in DType::ALL {
        let n = grid(dtype).len();
        let as_tensor = |shape: &[usize], v: &[f64]| {
            HostTensor::from_f64_values(dtype, shape, v.to_vec()).expect("grid")
        };
        // The operands as the dtype holds them (70000 is infinite in f16).
        let values = as_tensor(&[n], &grid(dtype)).to_f64_vec();
        for op in UnaryOp::ALL {
            let mut b = Builder::new();
            let x = b.constant(as_tensor(&[n], &values));
            let Ok(id) = b.g.add_node("u", Op::Unary(op), &[x]) else {
                continue; // not defined on this dtype
            };
            let got = eval(&b.g, &[], &[Value::first(id)], P32).expect("unary")[0].to_f64_vec();
            for (v, g) in values.iter().zip(got) {
                let want = stored(scalar::unary(op, *v, dtype), dtype);
                assert!(same(g, want), "{op:?} {dtype} {v}: got {g}, want {want}");
            }
            checked += 1;
        }
        for op in BinaryOp::ALL {
            let mut b = Builder::new();
            let x = b.constant(as_tensor(&[n, 1], &values));
            let y = b.constant(as_tensor(&[n], &values));
            let Ok(id) = b.g.add_node("b", Op::Binary(op), &[x, y]) else {
                continue; // not defined on this dtype
            };
            let out_dtype = b.g.node(id).outputs[0].dtype;
            let got = eval(&b.g, &[], &[Value::first(id)], P32).expect("binary")[0].to_f64_vec();
            for (i, g) in got.into_iter().enumerate() {
                let (u, v) = (values[i / n], values[i % n]);
                let want = stored(scalar::binary(op, u, v, dtype), out_dtype);
                assert!(
                    same(g, want),
                    "{op:?} {dtype} ({u}, {v}): got {g}, want {want}"
                );
            }
            checked += 1;
        }
        for to in DType::ALL {
            let got = run_op(Op::Cast { to }, vec![as_tensor(&[n], &values)], P32).to_f64_vec();
            for (v, g) in values.iter().zip(got) {
                let want = stored(scalar::cast(*v, to), to);
                assert!(
                    same(g, want),
                    "cast {dtype} -> {to} of {v}: got {g}, want {want}"
                );
            }
        }
    }
    assert!(checked > 100, "only {checked} op/dtype pairs");
}

#[test]
fn select_broadcasts_condition_and_branches() {
    let cond = bools(&[2, 1], &[true, false]);
    let a = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32s(&[], &[-1.0]);
    let got = run_op(Op::Select, vec![cond, a, b], P32);
    assert_eq!(got, f32s(&[2, 3], &[1.0, 2.0, 3.0, -1.0, -1.0, -1.0]));
}

#[test]
fn casts_truncate_saturate_and_round() {
    let x = f32s(&[6], &[-1.7, 2.9, 0.0, -0.0, f32::NAN, 0.5]);
    let to_i32 = run_op(Op::Cast { to: DType::I32 }, vec![x.clone()], P32);
    assert_eq!(to_i32, i32s(&[6], &[-1, 2, 0, 0, 0, 0]));
    let to_bool = run_op(Op::Cast { to: DType::Bool }, vec![x], P32);
    assert_eq!(
        to_bool,
        bools(&[6], &[true, true, false, false, true, true])
    );
    let from_bool = run_op(
        Op::Cast { to: DType::F32 },
        vec![bools(&[2], &[true, false])],
        P32,
    );
    assert_eq!(from_bool, f32s(&[2], &[1.0, 0.0]));
    // Out-of-range conversions saturate (ir::scalar::cast), integer sources included.
    let wide = i64s(&[2], &[(1 << 32) + 5, -1]);
    assert_eq!(
        run_op(Op::Cast { to: DType::I32 }, vec![wide.clone()], P32),
        i32s(&[2], &[i32::MAX, -1])
    );
    let to_u8 = run_op(Op::Cast { to: DType::U8 }, vec![wide], P32);
    assert_eq!(to_u8.to_f64_vec(), vec![255.0, 0.0]);
    // In F64 mode a cast between float dtypes keeps the f64 value; in F32 mode it rounds.
    let tenth = f64s(&[1], &[0.1]);
    let kept = run_op(Op::Cast { to: DType::F32 }, vec![tenth.clone()], P64);
    assert_eq!(kept, f64s(&[1], &[0.1]));
    let rounded = run_op(Op::Cast { to: DType::F32 }, vec![tenth], P32);
    assert_eq!(rounded, f32s(&[1], &[0.1]));
    // 2^24 + 1 is not an f32: it rounds (to even) once.
    let big = run_op(
        Op::Cast { to: DType::F32 },
        vec![i64s(&[1], &[(1 << 24) + 1])],
        P32,
    );
    assert_eq!(big, f32s(&[1], &[16_777_216.0]));
    // f32 -> f16 rounds to the nearest f16; f16 results stay f16.
    let h = run_op(
        Op::Cast { to: DType::F16 },
        vec![f32s(&[2], &[1.0 + 1.0 / 4096.0, 70000.0])],
        P32,
    );
    assert_eq!(h.dtype(), DType::F16);
    assert_close(&h, &[1.0, f64::INFINITY], 0.0);
}

#[test]
fn half_precision_ops_round_every_result_back() {
    // In f16, 1 + 2^-11 is a tie that rounds to even (1.0); 1 + 3*2^-11 rounds up to 1 + 2^-9.
    let one = run_op(
        Op::Cast { to: DType::F16 },
        vec![f32s(&[2], &[1.0, 1.0])],
        P32,
    );
    let eps = run_op(
        Op::Cast { to: DType::F16 },
        vec![f32s(&[2], &[1.0 / 2048.0, 3.0 / 2048.0])],
        P32,
    );
    let sum = run_op(
        Op::Binary(BinaryOp::Add),
        vec![one.clone(), eps.clone()],
        P32,
    );
    assert_eq!(sum.dtype(), DType::F16);
    assert_close(&sum, &[1.0, 1.0 + 1.0 / 512.0], 0.0);
    let bf = run_op(
        Op::Cast { to: DType::BF16 },
        vec![f32s(&[1], &[1.0 + 1.0 / 512.0])],
        P32,
    );
    assert_eq!(bf.dtype(), DType::BF16);
    assert_close(&bf, &[1.0], 0.0);
    // In F64 mode the same sum is exact and comes back as f64.
    let exact = run_op(Op::Binary(BinaryOp::Add), vec![one, eps], P64);
    assert_eq!(exact.dtype(), DType::F64);
    assert_close(&exact, &[1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0], 0.0);
}

#[test]
fn identity_passes_values_through() {
    let x = i64s(&[2], &[i64::MAX, -3]);
    assert_eq!(run_op(Op::Identity, vec![x.clone()], P32), x);
}
