//! Step semantics of `ReferenceSession` and `evaluate`: snapshot reads, assigns at the end,
//! feeds and batch binding, errors that name what is at fault, F64 mode and determinism.

use crate::common::*;
use std::collections::HashMap;
use towerpack::backend::reference::{Precision, ReferenceSession, evaluate};
use towerpack::backend::{BackendError, Session, Step};
use towerpack::ir::init::initial_value;
use towerpack::ir::{
    BinaryOp, Conv2dAttrs, Initializer, NodeId, Op, ReduceOp, Shape, TensorType, UnaryOp, Value,
    VarFlags, VarId, VariableDef,
};
use towerpack::tensor::{DType, HostTensor};

fn declare(b: &mut Builder, name: &str, shape: &[usize], init: Initializer) -> VarId {
    b.g.declare_variable(VariableDef {
        name: name.into(),
        ty: TensorType::f32(Shape::fixed(shape)),
        init,
        flags: VarFlags::default(),
    })
    .expect("declare")
}

fn assign(b: &mut Builder, name: &str, var: VarId, value: Value) -> NodeId {
    b.g.add_node(name, Op::Assign { var }, &[value])
        .expect("assign")
}

/// `w` (scalar, 1.0) with a step `w := w + 1` that also fetches a second, separate read of `w`.
fn counter_graph() -> (Builder, VarId, Value, NodeId) {
    let mut b = Builder::new();
    let w = declare(&mut b, "w", &[], Initializer::Constant(1.0));
    let read = b.op(Op::Variable { var: w }, &[]);
    let one = b.constant(f32s(&[], &[1.0]));
    let next = b.op(Op::Binary(BinaryOp::Add), &[read, one]);
    let inc = assign(&mut b, "w/assign", w, next);
    let late_read = b.op(Op::Variable { var: w }, &[]);
    (b, w, late_read, inc)
}

#[test]
fn reads_see_the_step_start_and_assigns_apply_at_the_end() {
    let (b, w, late_read, inc) = counter_graph();
    let mut s = ReferenceSession::new(b.g).expect("verified");
    s.initialize_variables(0).expect("init");
    let step = Step::new(vec![late_read], vec![inc]);
    for expected in [1.0, 2.0, 3.0] {
        let out = s.run(&step, &[]).expect("step");
        assert_eq!(out, vec![f32s(&[], &[expected])]);
    }
    assert_eq!(s.read_variable(w).expect("read"), f32s(&[], &[4.0]));
    // Without the assign as a target, nothing changes.
    s.run(&Step::fetch(vec![late_read]), &[])
        .expect("fetch only");
    assert_eq!(s.read_variable(w).expect("read"), f32s(&[], &[4.0]));
}

#[test]
fn a_swap_in_one_step_reads_both_old_values() {
    let mut b = Builder::new();
    let x = declare(
        &mut b,
        "x",
        &[2],
        Initializer::Value(f32s(&[2], &[1.0, 2.0])),
    );
    let y = declare(
        &mut b,
        "y",
        &[2],
        Initializer::Value(f32s(&[2], &[3.0, 4.0])),
    );
    let rx = b.op(Op::Variable { var: x }, &[]);
    let ry = b.op(Op::Variable { var: y }, &[]);
    let ax = assign(&mut b, "x/assign", x, ry);
    let ay = assign(&mut b, "y/assign", y, rx);
    let train = b.g.add_group("train_op", &[ax, ay]).expect("group");
    let mut s = ReferenceSession::new(b.g).expect("verified");
    s.initialize_variables(0).expect("init");
    // The group pulls in both assigns through its control inputs.
    assert!(
        s.run(&Step::new(vec![], vec![train]), &[])
            .expect("step")
            .is_empty()
    );
    assert_eq!(s.read_variable(x).expect("x"), f32s(&[2], &[3.0, 4.0]));
    assert_eq!(s.read_variable(y).expect("y"), f32s(&[2], &[1.0, 2.0]));
}

#[test]
fn double_assign_and_failed_steps_change_nothing() {
    let (mut b, w, late_read, inc) = counter_graph();
    let zero = b.constant(f32s(&[], &[0.0]));
    let reset = assign(&mut b, "w/reset", w, zero);
    let labels = b.constant(i64s(&[1], &[5]));
    let logits = b.constant(f32s(&[1, 2], &[0.0, 0.0]));
    let xent =
        b.g.add_node(
            "loss/xent",
            Op::SparseSoftmaxCrossEntropy,
            &[logits, labels],
        )
        .expect("xent");
    let mut s = ReferenceSession::new(b.g).expect("verified");
    s.initialize_variables(0).expect("init");
    let err = s
        .run(&Step::new(vec![], vec![inc, reset]), &[])
        .unwrap_err();
    assert_eq!(
        err,
        BackendError::DoubleAssign {
            variable: "w".into()
        }
    );
    let err = s
        .run(&Step::new(vec![Value::first(xent)], vec![inc]), &[])
        .unwrap_err();
    assert!(
        matches!(&err, BackendError::Kernel { node, .. } if node == "loss/xent"),
        "{err}"
    );
    assert_eq!(s.read_variable(w).expect("read"), f32s(&[], &[1.0]));
    assert_eq!(
        s.run(&Step::fetch(vec![late_read]), &[]).expect("read"),
        vec![f32s(&[], &[1.0])]
    );
}

#[test]
fn only_the_ancestors_of_the_step_run() {
    let mut b = Builder::new();
    b.input("unused", DType::F32, Shape::batched(&[3]));
    let logits = b.constant(f32s(&[1, 2], &[0.0, 0.0]));
    let label = b.constant(i64s(&[1], &[2]));
    let bad = b.op(Op::SparseSoftmaxCrossEntropy, &[logits, label]);
    let ok = b.constant(f32s(&[], &[2.5]));
    let doubled = b.op(Op::Binary(BinaryOp::Add), &[ok, ok]);
    // Neither the unfed input nor the failing cross-entropy is needed.
    let out = eval(&b.g, &[], &[doubled], Precision::F32).expect("step");
    assert_eq!(out, vec![f32s(&[], &[5.0])]);
    let err = eval(&b.g, &[], &[bad], Precision::F32).unwrap_err();
    assert!(matches!(err, BackendError::Kernel { .. }), "{err}");
}

#[test]
fn feeds_are_checked_and_bind_the_batch_size() {
    let mut b = Builder::new();
    let x = b.input("image", DType::F32, Shape::batched(&[2]));
    let y = b.input("label", DType::I64, Shape::batched(&[]));
    let sum = b.op(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![1],
            keep_dims: false,
        },
        &[x],
    );
    let yf = b.op(Op::Cast { to: DType::F32 }, &[y]);
    let out = b.op(Op::Binary(BinaryOp::Add), &[sum, yf]);
    let c = b.constant(f32s(&[], &[0.0]));
    let p = Precision::F32;
    for n in [1, 3] {
        let xs = random(&mut rng(n as u64), DType::F32, &[n, 2]);
        let ys = i64s(&[n], &vec![2; n]);
        let got = eval(&b.g, &[(x.node, xs.clone()), (y.node, ys)], &[out], p).expect("step");
        assert_eq!(got[0].shape(), &[n]);
        let xv = xs.to_f32_vec();
        let want: Vec<f64> = (0..n)
            .map(|i| f64::from(xv[2 * i] + xv[2 * i + 1] + 2.0))
            .collect();
        assert_close(&got[0], &want, 0.0);
    }
    let xs = f32s(&[2, 2], &[0.0; 4]);
    let err = eval(&b.g, &[(x.node, xs.clone())], &[out], p).unwrap_err();
    assert_eq!(
        err,
        BackendError::MissingFeed {
            input: "label".into()
        }
    );
    let err = eval(
        &b.g,
        &[(x.node, xs.clone()), (y.node, i64s(&[3], &[0; 3]))],
        &[out],
        p,
    )
    .unwrap_err();
    assert_eq!(
        err,
        BackendError::BatchMismatch {
            input: "label".into(),
            expected: 2,
            got: 3
        }
    );
    let err = eval(&b.g, &[(x.node, f32s(&[2, 3], &[0.0; 6]))], &[sum], p).unwrap_err();
    assert!(
        matches!(&err, BackendError::FeedMismatch { input, expected, got }
        if input == "image" && expected == "f32[N,2]" && got == "f32[2,3]"),
        "{err}"
    );
    let err = eval(&b.g, &[(y.node, i32s(&[2], &[0; 2]))], &[yf], p).unwrap_err();
    assert!(
        matches!(&err, BackendError::FeedMismatch { got, .. } if got == "i32[2]"),
        "{err}"
    );
    let twice = [(y.node, i64s(&[1], &[0])), (y.node, i64s(&[1], &[0]))];
    let err = eval(&b.g, &twice, &[yf], p).unwrap_err();
    assert!(
        matches!(&err, BackendError::FeedMismatch { input, .. } if input == "label"),
        "{err}"
    );
    let err = eval(&b.g, &[(c.node, f32s(&[], &[1.0]))], &[c], p).unwrap_err();
    let name = b.g.node(c.node).name.clone();
    assert_eq!(err, BackendError::FeedNotInput { node: name });
}

#[test]
fn variables_are_checked_on_write_and_read() {
    let (b, w, late_read, _) = counter_graph();
    let g = b.g.clone();
    let mut s = ReferenceSession::new(b.g).expect("verified");
    let err = s.run(&Step::fetch(vec![late_read]), &[]).unwrap_err();
    assert!(
        matches!(&err, BackendError::Kernel { message, .. } if message.contains("variable `w` has no value")),
        "{err}"
    );
    assert!(matches!(
        s.read_variable(w),
        Err(BackendError::VariableMismatch { .. })
    ));
    let err = s.write_variable(w, &f32s(&[1], &[0.0])).unwrap_err();
    assert!(
        matches!(&err, BackendError::VariableMismatch { variable, expected, got }
        if variable == "w" && expected == "f32[]" && got == "f32[1]"),
        "{err}"
    );
    assert!(
        s.write_variable(w, &f64s(&[], &[0.0])).is_err(),
        "f64 into f32 in F32 mode"
    );
    assert_eq!(
        s.read_variable(VarId(9)),
        Err(BackendError::UnknownVariable(9))
    );
    s.initialize_variables(3).expect("init");
    let def = g.variable(w);
    assert_eq!(s.read_variable(w).expect("read"), initial_value(def, 3));

    let mut vars = HashMap::new();
    vars.insert(w, f32s(&[], &[7.0]));
    let got = evaluate(&g, &vars, &[], &[late_read], Precision::F32).expect("evaluate");
    assert_eq!(got, vec![f32s(&[], &[7.0])]);
    vars.insert(VarId(4), f32s(&[], &[7.0]));
    let err = evaluate(&g, &vars, &[], &[late_read], Precision::F32).unwrap_err();
    assert_eq!(err, BackendError::UnknownVariable(4));
}

#[test]
fn unknown_fetches_are_errors() {
    let (b, _, _, inc) = counter_graph();
    let mut s = ReferenceSession::new(b.g).expect("verified");
    let err = s
        .run(&Step::fetch(vec![Value::first(inc)]), &[])
        .unwrap_err();
    assert_eq!(err, BackendError::UnknownValue("w/assign:0".into()));
}

#[test]
fn f64_mode_skips_rounding_and_returns_f64() {
    // (1e8 + 1) - 1e8 is 0 in f32 (1e8 + 1 rounds to 1e8) and 1 in f64.
    let mut b = Builder::new();
    let x = b.input("x", DType::F32, Shape::fixed(&[]));
    let big = b.constant(f32s(&[], &[1e8]));
    let one = b.constant(f32s(&[], &[1.0]));
    let w = declare(&mut b, "w", &[], Initializer::Zeros);
    let sum = b.op(Op::Binary(BinaryOp::Add), &[big, one]);
    let diff = b.op(Op::Binary(BinaryOp::Sub), &[sum, big]);
    let plus_x = b.op(Op::Binary(BinaryOp::Add), &[diff, x]);
    let store = assign(&mut b, "w/assign", w, plus_x);
    let feed32 = [(x.node, f32s(&[], &[0.0]))];
    let out = eval(&b.g, &feed32, &[diff], Precision::F32).expect("f32");
    assert_eq!(out, vec![f32s(&[], &[0.0])]);
    let out = eval(&b.g, &feed32, &[diff], Precision::F64).expect("f64");
    assert_eq!(out, vec![f64s(&[], &[1.0])]);

    // F64 sessions take f64 feeds for f32 inputs and keep f64 variables.
    let mut s = ReferenceSession::with_precision(b.g, Precision::F64).expect("verified");
    assert_eq!(s.precision(), Precision::F64);
    s.initialize_variables(0).expect("init");
    let out = s.run(
        &Step::new(vec![plus_x], vec![store]),
        &[(x.node, f64s(&[], &[1e-12]))],
    );
    assert_eq!(out.expect("step"), vec![f64s(&[], &[1.0 + 1e-12])]);
    assert_eq!(s.read_variable(w).expect("read"), f64s(&[], &[1.0 + 1e-12]));
}

#[test]
fn f64_mode_supports_finite_difference_gradient_checks() {
    // d/dx sum(sigmoid(x)) = s(1 - s), checked by a central difference in f64.
    let mut b = Builder::new();
    let x = b.input("x", DType::F32, Shape::fixed(&[3]));
    let s = b.op(Op::Unary(UnaryOp::Sigmoid), &[x]);
    let loss = b.op(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0],
            keep_dims: false,
        },
        &[s],
    );
    let point = [-1.5, 0.25, 2.0];
    let h = 1e-5;
    for i in 0..3 {
        let at = |delta: f64| {
            let mut p = point;
            p[i] += delta;
            let out =
                eval(&b.g, &[(x.node, f64s(&[3], &p))], &[loss], Precision::F64).expect("loss");
            out[0].scalar_value().expect("scalar")
        };
        let numeric = (at(h) - at(-h)) / (2.0 * h);
        let sig = 1.0 / (1.0 + (-point[i]).exp());
        assert!(
            (numeric - sig * (1.0 - sig)).abs() < 1e-9,
            "x[{i}]: {numeric}"
        );
    }
}

#[test]
fn identical_steps_give_identical_bits() {
    let build = || {
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, Shape::batched(&[5, 5, 2]));
        let w = declare(
            &mut b,
            "conv/W",
            &[3, 3, 2, 4],
            Initializer::Normal {
                mean: 0.0,
                stddev: 1.0,
            },
        );
        let wr = b.op(Op::Variable { var: w }, &[]);
        let y = b.op(
            Op::Conv2d(Conv2dAttrs {
                strides: [2, 2],
                ..Conv2dAttrs::default()
            }),
            &[x, wr],
        );
        let step = b.constant(i64s(&[], &[3]));
        let noise = b.op(Op::RandomUniform { seed: 9 }, &[y, step]);
        let mixed = b.op(Op::Binary(BinaryOp::Mul), &[y, noise]);
        let soft = b.op(Op::Softmax { axis: 3 }, &[mixed]);
        let mean = b.op(
            Op::Reduce {
                op: ReduceOp::Mean,
                axes: vec![0, 1, 2, 3],
                keep_dims: false,
            },
            &[soft],
        );
        (b, x, mean, soft)
    };
    let input = random(&mut rng(77), DType::F32, &[2, 5, 5, 2]);
    let run = || {
        let (b, x, mean, soft) = build();
        let mut s = ReferenceSession::new(b.g).expect("verified");
        s.initialize_variables(5).expect("init");
        s.run(&Step::fetch(vec![mean, soft]), &[(x.node, input.clone())])
            .expect("step")
    };
    let (first, second) = (run(), run());
    let bytes = |v: &[HostTensor]| v.iter().map(HostTensor::to_le_bytes).collect::<Vec<_>>();
    assert_eq!(bytes(&first), bytes(&second));
    assert_eq!(first[1].shape(), &[2, 3, 3, 4]);
}
