//! The symbolic `Tensor`: operator overloading, op methods and their types, scoped and unique
//! node names, devices, and first-error recording with poisoned no-ops.

use towerpack::dsl::prelude::*;
use towerpack::ir::{BinaryOp, Graph, IrError, Op, ReduceOp, TensorType, UnaryOp};

fn f32_input(b: &Builder, name: &str, dims: &[usize]) -> Tensor {
    b.input(name, TensorType::f32(Shape::batched(dims)))
}

fn op_of(g: &Graph, t: &Tensor) -> Op {
    g.node(t.node().expect("not poisoned")).op.clone()
}

fn ty(t: &Tensor) -> String {
    t.ty().map(|t| t.to_string()).unwrap_or_default()
}

#[test]
fn operators_build_broadcasting_binary_ops() {
    let b = Builder::new();
    let x = f32_input(&b, "x", &[4]);
    let bias = b.constant(towerpack::tensor::HostTensor::zeros(DType::F32, &[4]));
    let cases: Vec<(Tensor, BinaryOp)> = vec![
        (&x + &bias, BinaryOp::Add),
        (&x - 1.0, BinaryOp::Sub),
        (2.0 * &x, BinaryOp::Mul),
        (x.clone() / bias.clone(), BinaryOp::Div),
        (1.0 - x.clone(), BinaryOp::Sub),
    ];
    b.with_graph(|g| {
        for (t, op) in &cases {
            assert_eq!(op_of(g, t), Op::Binary(*op));
            assert_eq!(ty(t), "f32[N,4]");
        }
        // `1.0 - x`: the scalar is the left operand.
        let ins = g.inputs(cases[4].0.node().expect("node"));
        assert_eq!(ins[1], x.value().expect("x"));
        assert!(matches!(g.node(ins[0].node).op, Op::Constant { .. }));
    });
    let neg = -&x;
    b.with_graph(|g| assert_eq!(op_of(g, &neg), Op::Unary(UnaryOp::Neg)));
}

#[test]
fn scalars_take_the_tensor_element_type() {
    let b = Builder::new();
    let i = b.input("i", TensorType::new(DType::I32, Shape::batched(&[])));
    let j = &i + 1.0;
    assert_eq!(ty(&j), "i32[N]");
    assert!(b.check().is_ok());
}

#[test]
fn every_op_method_has_the_expected_type() {
    let b = Builder::new();
    let x = f32_input(&b, "x", &[2, 3]);
    let m = f32_input(&b, "m", &[3]);
    let labels = b.input("labels", TensorType::new(DType::I64, Shape::batched(&[])));
    let w = b.constant(towerpack::tensor::HostTensor::zeros(DType::F32, &[3, 5]));
    let cases: Vec<(&str, Tensor, &str)> = vec![
        ("relu", x.relu(), "f32[N,2,3]"),
        ("sigmoid", x.sigmoid(), "f32[N,2,3]"),
        ("tanh", x.tanh(), "f32[N,2,3]"),
        ("exp", x.exp(), "f32[N,2,3]"),
        ("log", x.log(), "f32[N,2,3]"),
        ("sqrt", x.sqrt(), "f32[N,2,3]"),
        ("square", x.square(), "f32[N,2,3]"),
        ("matmul", x.matmul(&w), "f32[N,2,5]"),
        ("reshape", x.reshape(Shape::batched(&[6])), "f32[N,6]"),
        ("flatten", x.flatten(), "f32[N,6]"),
        ("transpose", x.transpose(&[0, 2, 1]), "f32[N,3,2]"),
        ("reduce_sum", x.reduce_sum(&[2]), "f32[N,2]"),
        ("reduce_mean", x.reduce_mean(&[1, 2]), "f32[N]"),
        ("reduce_max", x.reduce_max(&[0]), "f32[2,3]"),
        ("sum", x.sum(), "f32[]"),
        ("cast", x.cast(DType::I32), "i32[N,2,3]"),
        ("slice", x.slice(2, 1, 3), "f32[N,2,2]"),
        ("concat", concat(&[x.clone(), x.clone()], 1), "f32[N,4,3]"),
        ("pad", x.pad(&[(0, 0), (1, 1), (0, 2)]), "f32[N,4,5]"),
        ("argmax", m.argmax(1), "i64[N]"),
        ("one_hot", labels.one_hot(4), "f32[N,4]"),
        ("in_top_k", m.in_top_k(&labels, 1), "bool[N]"),
        ("softmax", m.softmax(1), "f32[N,3]"),
        ("log_softmax", m.log_softmax(1), "f32[N,3]"),
        ("greater", x.greater(0.0), "bool[N,2,3]"),
        (
            "select",
            select(&x.greater(0.0), &x, &x.scalar_like(0.0)),
            "f32[N,2,3]",
        ),
        ("not", m.less(&m).logical_not(), "bool[N,3]"),
        (
            "maximum",
            x.maximum(w.slice(1, 0, 3).reduce_sum(&[0])),
            "f32[N,2,3]",
        ),
        ("leaky_relu", x.leaky_relu(0.2), "f32[N,2,3]"),
        ("xent", m.sparse_softmax_cross_entropy(&labels), "f32[N]"),
    ];
    for (what, t, expected) in &cases {
        assert_eq!(ty(t), *expected, "{what}: {:?}", b.error());
    }
    let (mean, var) = x.moments(&[0, 1]);
    assert_eq!((ty(&mean), ty(&var)), ("f32[3]".into(), "f32[3]".into()));
    let max = x.reduce_max(&[1]);
    b.with_graph(|g| {
        assert_eq!(
            op_of(g, &max),
            Op::Reduce {
                op: ReduceOp::Max,
                axes: vec![1],
                keep_dims: false
            }
        )
    });
    b.finish().expect("a valid graph");
}

#[test]
fn building_while_reading_the_graph_is_an_error_not_a_panic() {
    let b = Builder::new();
    let x = f32_input(&b, "x", &[2]);
    let inside = b.with_graph(|_| x.relu());
    assert!(inside.is_poisoned());
    assert_eq!(b.error(), Some(DslError::Reentrant));
}

#[test]
fn names_are_scoped_and_made_unique_and_towers_set_devices() {
    let b = Builder::new();
    let sig = [InputSpec::new("x", DType::F32, Shape::batched(&[4]))];
    let h = b
        .build_tower(TowerContext::training("tower1", "", 1, 2), &sig, |x| {
            let _s = x[0].builder().name_scope("blk");
            let a = x[0].relu();
            let c = x[0].relu();
            let named = (a + c).named("wrong_vector");
            assert_eq!(named.name().as_deref(), Some("tower1/blk/wrong_vector"));
            named.sum()
        })
        .expect("tower");
    let g = b.finish().expect("graph");
    for name in ["tower1/blk/Relu", "tower1/blk/Relu_1", "tower1/blk/add"] {
        let id = g.find(name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(g.node(id).device, Some(1));
    }
    assert_eq!(
        h.get_tensor(&g, "blk/wrong_vector"),
        g.find_value("tower1/blk/wrong_vector")
    );
}

#[test]
fn the_first_error_is_kept_and_later_ops_are_no_ops() {
    let b = Builder::new();
    let sig = [
        InputSpec::new("x", DType::F32, Shape::batched(&[4])),
        InputSpec::new("y", DType::F32, Shape::batched(&[3])),
    ];
    let err = b
        .build_tower(TowerContext::training("tower0", "", 0, 1), &sig, |t| {
            let bad = &t[0] + &t[1];
            assert!(bad.is_poisoned());
            let later = bad.relu().matmul(&t[0]);
            assert!(later.is_poisoned());
            // A second, different error does not replace the first.
            let _ = t[0].transpose(&[5]);
            later.sum()
        })
        .expect_err("shape mismatch");
    let DslError::Graph(IrError::Type {
        node, op, inputs, ..
    }) = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!((node.as_str(), op.as_str()), ("tower0/add", "add"));
    assert_eq!(inputs, &["f32[N,4]", "f32[N,3]"]);
    assert_eq!(b.finish().expect_err("poisoned"), err);
    // Only the two inputs exist: the failed node and everything after it were never added.
    assert_eq!(b.with_graph(|g| g.node_count()), 2);
}

#[test]
fn tensors_of_two_builders_do_not_mix() {
    let (a, c) = (Builder::new(), Builder::new());
    let x = f32_input(&a, "x", &[2]);
    let y = f32_input(&c, "y", &[2]);
    assert!((&x + &y).is_poisoned());
    assert_eq!(
        a.error(),
        Some(DslError::MixedBuilders { node: "add".into() })
    );
}

#[test]
fn free_functions_need_a_current_graph() {
    let gs = global_step();
    assert!(gs.is_poisoned());
    assert_eq!(
        gs.builder().error(),
        Some(DslError::NoDefaultBuilder {
            what: "global_step"
        })
    );
    let b = Builder::new();
    let _d = b.as_default();
    let gs = global_step();
    assert_eq!(ty(&gs), "i64[]");
    assert!(gs.builder().same_as(&b));
    let again = global_step();
    assert_eq!(
        again.value(),
        gs.value(),
        "one read per graph outside towers"
    );
    b.with_graph(|g| {
        let def = &g.variables()[0];
        assert_eq!(def.name, "global_step");
        assert!(!def.flags.trainable);
    });
}
