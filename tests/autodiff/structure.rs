//! Structure of the gradient pass: names and devices of gradient nodes, unreached variables,
//! pruning of branches that do not lead to the variables, shared variables across towers, and
//! the typed errors.

use std::collections::HashMap;
use towerpack::autodiff::{AutodiffError, gradients, gradients_of_values};
use towerpack::backend::reference::{Precision, evaluate};
use towerpack::ir::{
    BinaryOp, Conv2dAttrs, Graph, Initializer, NodeId, Op, Padding, PoolAttrs, PoolKind, ReduceOp,
    Shape, TensorType, UnaryOp, Value, VarFlags, VarId, VariableDef, verify,
};
use towerpack::tensor::{DType, HostTensor};

fn var(g: &mut Graph, name: &str, dims: &[usize]) -> VarId {
    g.declare_variable(VariableDef {
        name: name.into(),
        ty: TensorType::f32(Shape::fixed(dims)),
        init: Initializer::Zeros,
        flags: VarFlags {
            trainable: true,
            ..VarFlags::default()
        },
    })
    .expect("declare")
}

fn add(g: &mut Graph, name: &str, op: Op, inputs: &[Value], device: Option<u16>) -> Value {
    Value::first(g.add_node_on(name, op, inputs, device).expect(name))
}

fn input(g: &mut Graph, name: &str, shape: Shape, device: Option<u16>) -> Value {
    let ty = TensorType::f32(shape);
    add(
        g,
        name,
        Op::Input {
            name: name.into(),
            ty,
        },
        &[],
        device,
    )
}

fn sum_all(g: &mut Graph, name: &str, x: Value, device: Option<u16>) -> Value {
    let rank = g.value_type(x).rank();
    let op = Op::Reduce {
        op: ReduceOp::Sum,
        axes: (0..rank).collect(),
        keep_dims: false,
    };
    add(g, name, op, &[x], device)
}

/// A tower `tower{t}` on device `t`: `cost = mean(relu(conv(image, W)) ...) ` reading `W`.
fn conv_tower(g: &mut Graph, t: u16, w: VarId) -> (Value, NodeId) {
    let d = Some(t);
    let image = input(g, &format!("tower{t}/image"), Shape::batched(&[5, 5, 2]), d);
    let read = add(
        g,
        &format!("tower{t}/conv0/W"),
        Op::Variable { var: w },
        &[],
        d,
    );
    let conv = add(
        g,
        &format!("tower{t}/conv0/Conv2D"),
        Op::Conv2d(Conv2dAttrs::default()),
        &[image, read],
        d,
    );
    let relu = add(
        g,
        &format!("tower{t}/conv0/Relu"),
        Op::Unary(UnaryOp::Relu),
        &[conv],
        d,
    );
    let op = Op::Reduce {
        op: ReduceOp::Mean,
        axes: vec![0, 1, 2, 3],
        keep_dims: false,
    };
    (add(g, &format!("tower{t}/cost"), op, &[relu], d), read.node)
}

#[test]
fn gradient_nodes_are_named_after_their_forward_node_and_keep_its_device() {
    let mut g = Graph::new();
    let w = var(&mut g, "conv0/W", &[3, 3, 2, 4]);
    let (cost, _) = conv_tower(&mut g, 0, w);
    let before: Vec<NodeId> = g.node_ids().collect();
    let set = gradients(&mut g, cost, &[w], "tower0/gradients").expect("gradients");
    verify(&g).expect("the graph stays valid");
    assert_eq!(set.grads.len(), 1);
    assert!(set.unreached.is_empty());
    let new: Vec<NodeId> = g.node_ids().filter(|id| !before.contains(id)).collect();
    assert!(!new.is_empty());
    for &id in &new {
        let n = g.node(id);
        assert!(n.name.starts_with("tower0/gradients/"), "{}", n.name);
        assert_eq!(n.device, Some(0), "{} keeps the tower's device", n.name);
    }
    let filter = new
        .iter()
        .find(|&&id| matches!(g.node(id).op, Op::Conv2dBackpropFilter { .. }))
        .expect("a filter gradient");
    assert!(
        g.node(*filter)
            .name
            .starts_with("tower0/gradients/conv0/Conv2D_grad/"),
        "{}",
        g.node(*filter).name
    );
    // The image is not a variable: no gradient of the convolution's input is built.
    assert!(
        !new.iter()
            .any(|&id| matches!(g.node(id).op, Op::Conv2dBackpropInput { .. })),
        "no backprop-input for the first layer"
    );
    assert_eq!(g.value_type(set.grads[0].1), &g.variable(w).ty);
}

#[test]
fn shared_variables_take_gradients_only_from_the_costs_tower() {
    let mut g = Graph::new();
    let w = var(&mut g, "conv0/W", &[3, 3, 2, 4]);
    let (cost0, _) = conv_tower(&mut g, 0, w);
    let (_cost1, read1) = conv_tower(&mut g, 1, w);
    let before: Vec<NodeId> = g.node_ids().collect();
    let set = gradients(&mut g, cost0, &[w], "tower0/gradients").expect("gradients");
    assert_eq!(set.grads.len(), 1);
    for id in g.node_ids().filter(|id| !before.contains(id)) {
        let n = g.node(id);
        assert_eq!(n.device, Some(0), "{}", n.name);
        assert!(
            !g.inputs(id).iter().any(|v| v.node == read1),
            "{} reads tower1's variable",
            n.name
        );
    }
}

#[test]
fn several_reads_of_a_variable_sum_their_adjoints() {
    // cost = sum(W * a) + sum(W * b) over two reads of W: dcost/dW = a + b exactly.
    let mut g = Graph::new();
    let w = var(&mut g, "W", &[2, 3]);
    let a_vals = vec![0.5, -1.0, 2.0, 0.25, 3.0, -0.75];
    let b_vals = vec![1.0, 1.5, -2.0, 0.5, 0.0, 4.0];
    let mut terms = Vec::new();
    for (k, vals) in [&a_vals, &b_vals].into_iter().enumerate() {
        let read = add(
            &mut g,
            &format!("read{k}"),
            Op::Variable { var: w },
            &[],
            None,
        );
        let value =
            HostTensor::from_f32(&[2, 3], vals.iter().map(|&v| v as f32).collect()).expect("const");
        let c = add(&mut g, &format!("c{k}"), Op::Constant { value }, &[], None);
        let p = add(
            &mut g,
            &format!("p{k}"),
            Op::Binary(BinaryOp::Mul),
            &[read, c],
            None,
        );
        terms.push(sum_all(&mut g, &format!("s{k}"), p, None));
    }
    let cost = add(&mut g, "cost", Op::Binary(BinaryOp::Add), &terms, None);
    let set = gradients(&mut g, cost, &[w], "gradients").expect("gradients");
    let values = HashMap::from([(w, HostTensor::zeros(DType::F32, &[2, 3]))]);
    let got = evaluate(&g, &values, &[], &[set.grads[0].1], Precision::F64).expect("eval")[0]
        .to_f64_vec();
    let want: Vec<f64> = a_vals.iter().zip(&b_vals).map(|(a, b)| a + b).collect();
    assert_eq!(got, want);
}

#[test]
fn unreached_variables_are_reported_in_order() {
    let mut g = Graph::new();
    let used = var(&mut g, "fc/W", &[4, 3]);
    let unused = var(&mut g, "fc/unused", &[3]);
    let floored = var(&mut g, "fc/floored", &[3]);
    let step = g
        .declare_variable(VariableDef {
            name: "counter".into(),
            ty: TensorType::scalar(DType::I64),
            init: Initializer::Zeros,
            flags: VarFlags::default(),
        })
        .expect("declare");
    let x = input(&mut g, "x", Shape::batched(&[4]), None);
    let wr = add(&mut g, "fc/W/read", Op::Variable { var: used }, &[], None);
    let y = add(
        &mut g,
        "fc/MatMul",
        Op::MatMul {
            transpose_a: false,
            transpose_b: false,
        },
        &[x, wr],
        None,
    );
    // `floored` reaches the cost only through floor (no gradient); `counter` is an integer.
    let fr = add(
        &mut g,
        "fc/floored/read",
        Op::Variable { var: floored },
        &[],
        None,
    );
    let fl = add(&mut g, "fc/Floor", Op::Unary(UnaryOp::Floor), &[fr], None);
    let sr = add(
        &mut g,
        "counter/read",
        Op::Variable { var: step },
        &[],
        None,
    );
    let sf = add(
        &mut g,
        "counter/cast",
        Op::Cast { to: DType::F32 },
        &[sr],
        None,
    );
    let y = add(&mut g, "fc/add", Op::Binary(BinaryOp::Add), &[y, fl], None);
    let y = add(
        &mut g,
        "fc/scale",
        Op::Binary(BinaryOp::Mul),
        &[y, sf],
        None,
    );
    let cost = sum_all(&mut g, "cost", y, None);
    let set = gradients(&mut g, cost, &[unused, used, floored, step], "gradients").expect("ok");
    assert_eq!(
        set.grads.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        vec![used]
    );
    assert_eq!(set.unreached, vec![unused, floored, step]);
    verify(&g).expect("valid");
}

#[test]
fn branches_that_do_not_lead_to_the_variables_get_no_gradient_nodes() {
    // cost = sum(tanh(x) * 2) + sum(x W): only the matmul branch leads to W.
    let mut g = Graph::new();
    let w = var(&mut g, "W", &[3, 2]);
    let x = input(&mut g, "x", Shape::batched(&[3]), None);
    let t = add(&mut g, "side/Tanh", Op::Unary(UnaryOp::Tanh), &[x], None);
    let side = sum_all(&mut g, "side/sum", t, None);
    let wr = add(&mut g, "W/read", Op::Variable { var: w }, &[], None);
    let mm = Op::MatMul {
        transpose_a: false,
        transpose_b: false,
    };
    let y = add(&mut g, "fc/MatMul", mm, &[x, wr], None);
    let main = sum_all(&mut g, "fc/sum", y, None);
    let cost = add(
        &mut g,
        "cost",
        Op::Binary(BinaryOp::Add),
        &[side, main],
        None,
    );
    let before = g.node_count();
    gradients(&mut g, cost, &[w], "gradients").expect("gradients");
    let names: Vec<String> = g
        .node_ids()
        .skip(before)
        .map(|id| g.node(id).name.clone())
        .collect();
    assert!(names.iter().all(|n| !n.contains("side/")), "{names:?}");
    // ones, the cost's add passes through, sum -> broadcast of the scalar, one matmul.
    let matmuls = g
        .node_ids()
        .skip(before)
        .filter(|&id| matches!(g.node(id).op, Op::MatMul { .. }))
        .count();
    assert_eq!(matmuls, 1, "only dW, not dx: {names:?}");
    assert!(names.len() <= 5, "small gradient graph: {names:?}");
}

#[test]
fn a_cost_that_is_not_a_float_scalar_is_a_typed_error_naming_it() {
    let mut g = Graph::new();
    let w = var(&mut g, "W", &[3]);
    let r = add(&mut g, "tower0/W/read", Op::Variable { var: w }, &[], None);
    let e = add(&mut g, "tower0/loss", Op::Unary(UnaryOp::Exp), &[r], None);
    let err = gradients(&mut g, e, &[w], "tower0/gradients").unwrap_err();
    assert!(matches!(err, AutodiffError::CostNotScalar { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("tower0/loss") && msg.contains("f32[3]"),
        "{msg}"
    );

    let am = add(&mut g, "tower0/argmax", Op::ArgMax { axis: 0 }, &[r], None);
    let err = gradients(&mut g, am, &[w], "tower0/gradients").unwrap_err();
    assert!(err.to_string().contains("i64[]"), "{err}");
}

#[test]
fn differentiating_max_pool_grad_is_a_typed_error_naming_the_node() {
    // Gradient of a gradient through max pooling: the second pass must pass MaxPoolGrad.
    let mut g = Graph::new();
    let x = input(&mut g, "x", Shape::batched(&[4, 4, 1]), None);
    let pool = PoolAttrs {
        kind: PoolKind::Max,
        window: [2, 2],
        strides: [2, 2],
        padding: Padding::Valid,
    };
    let p = add(&mut g, "pool", Op::Pool(pool), &[x], None);
    let cost = sum_all(&mut g, "cost", p, None);
    let dx = gradients_of_values(&mut g, cost, &[x], "gradients").expect("first order")[0]
        .expect("reached");
    let grad_node = g.node(dx.node).name.clone();
    assert!(matches!(g.node(dx.node).op, Op::MaxPoolGrad(_)));
    let sq = add(&mut g, "sq", Op::Unary(UnaryOp::Square), &[dx], None);
    let cost2 = sum_all(&mut g, "cost2", sq, None);
    let err = gradients_of_values(&mut g, cost2, &[x], "gradients2").unwrap_err();
    match &err {
        AutodiffError::NotDifferentiable { node, op, .. } => {
            assert_eq!(node, &grad_node);
            assert_eq!(op, "max_pool_grad");
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn unknown_values_and_variables_are_typed_errors() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", Shape::scalar(), None);
    let err = gradients(&mut g, x, &[VarId(7)], "gradients").unwrap_err();
    assert_eq!(err, AutodiffError::UnknownVariable(7));
    let ghost = Value::new(x.node, 3);
    let err = gradients_of_values(&mut g, x, &[ghost], "gradients").unwrap_err();
    assert!(matches!(err, AutodiffError::UnknownValue { .. }), "{err}");
    // The gradient of a value with respect to itself is one.
    let g1 = gradients_of_values(&mut g, x, &[x], "gradients").expect("ok")[0].expect("self");
    let one = evaluate(
        &g,
        &HashMap::new(),
        &[(x.node, HostTensor::scalar_f32(3.0))],
        &[g1],
        Precision::F32,
    )
    .expect("eval");
    assert_eq!(one[0].to_f64_vec(), vec![1.0]);
}
