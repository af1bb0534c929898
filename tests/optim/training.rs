//! The whole chain on a tiny problem: gradients from the autodiff pass, momentum updates and
//! the global step in one `train_op`, run by the reference executor, fit a random linear model.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::autodiff::gradients;
use towerpack::backend::Session;
use towerpack::backend::reference::ReferenceSession;
use towerpack::ir::{
    BinaryOp, Graph, Initializer, Op, ReduceOp, Shape, Step, TensorType, UnaryOp, Value, VarFlags,
    VariableDef,
};
use towerpack::optim::{Optimizer, global_step, increment_global_step};
use towerpack::tensor::HostTensor;

#[test]
fn momentum_fits_a_linear_model_through_the_gradient_pass() {
    let (k, m, batch) = (4, 2, 16);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let true_w: Vec<f32> = (0..k * m).map(|_| rng.random_range(-1.0..1.0)).collect();
    let true_b: Vec<f32> = (0..m).map(|_| rng.random_range(-1.0..1.0)).collect();

    let mut g = Graph::new();
    let trainable = VarFlags {
        trainable: true,
        ..VarFlags::default()
    };
    let w = g
        .declare_variable(VariableDef {
            name: "fc/W".into(),
            ty: TensorType::f32(Shape::fixed(&[k, m])),
            init: Initializer::Normal {
                mean: 0.0,
                stddev: 0.1,
            },
            flags: trainable,
        })
        .expect("W");
    let b = g
        .declare_variable(VariableDef {
            name: "fc/b".into(),
            ty: TensorType::f32(Shape::fixed(&[m])),
            init: Initializer::Zeros,
            flags: trainable,
        })
        .expect("b");
    let node = |g: &mut Graph, name: &str, op: Op, ins: &[Value]| {
        Value::first(g.add_node(name, op, ins).expect(name))
    };
    let x_ty = TensorType::f32(Shape::batched(&[k]));
    let y_ty = TensorType::f32(Shape::batched(&[m]));
    let x = node(
        &mut g,
        "x",
        Op::Input {
            name: "x".into(),
            ty: x_ty,
        },
        &[],
    );
    let y = node(
        &mut g,
        "y",
        Op::Input {
            name: "y".into(),
            ty: y_ty,
        },
        &[],
    );
    let wr = node(&mut g, "fc/W/read", Op::Variable { var: w }, &[]);
    let br = node(&mut g, "fc/b/read", Op::Variable { var: b }, &[]);
    let mm = Op::MatMul {
        transpose_a: false,
        transpose_b: false,
    };
    let xw = node(&mut g, "fc/MatMul", mm, &[x, wr]);
    let pred = node(&mut g, "fc/add", Op::Binary(BinaryOp::Add), &[xw, br]);
    let err = node(&mut g, "err", Op::Binary(BinaryOp::Sub), &[pred, y]);
    let sq = node(&mut g, "sq", Op::Unary(UnaryOp::Square), &[err]);
    let mean = Op::Reduce {
        op: ReduceOp::Mean,
        axes: vec![0, 1],
        keep_dims: false,
    };
    let cost = node(&mut g, "cost", mean, &[sq]);

    let grads = gradients(&mut g, cost, &[w, b], "gradients").expect("gradients");
    assert!(grads.unreached.is_empty());
    let train = Optimizer::momentum(0.1, 0.9)
        .apply_gradients(&mut g, &grads.grads, "apply")
        .expect("apply");
    let inc = increment_global_step(&mut g, "global_step/increment").expect("inc");
    let train_op = g
        .add_group("train_op", &[train.train_op, inc])
        .expect("group");
    let step_var = global_step(&mut g).expect("global_step");

    let mut s = ReferenceSession::new(g).expect("session");
    s.initialize_variables(3).expect("init");
    let mut last = f64::INFINITY;
    let steps = 300;
    for _ in 0..steps {
        let xs: Vec<f32> = (0..batch * k)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let mut ys = Vec::with_capacity(batch * m);
        for r in 0..batch {
            for c in 0..m {
                let dot: f32 = (0..k).map(|i| xs[r * k + i] * true_w[i * m + c]).sum();
                ys.push(true_b[c] + dot);
            }
        }
        let feeds = [
            (x.node, HostTensor::from_f32(&[batch, k], xs).expect("x")),
            (y.node, HostTensor::from_f32(&[batch, m], ys).expect("y")),
        ];
        last = s
            .run(&Step::new(vec![cost], vec![train_op]), &feeds)
            .expect("step")[0]
            .scalar_value()
            .expect("scalar");
    }
    assert!(last < 1e-6, "final loss {last}");
    let learned = s.read_variable(w).expect("W").to_f32_vec();
    for (l, t) in learned.iter().zip(&true_w) {
        assert!((l - t).abs() < 1e-3, "{learned:?} vs {true_w:?}");
    }
    let count = s
        .read_variable(step_var)
        .expect("step")
        .scalar_value()
        .expect("scalar");
    assert_eq!(count, f64::from(steps));
}

#[test]
fn a_full_training_graph_round_trips_through_the_textual_ir() {
    // Gradients, processors, accumulation and Adam: every name the two passes generate must
    // be printable and parse back to the same graph.
    use towerpack::optim::{GradientProcessor, process_gradients};
    let mut g = Graph::new();
    let trainable = VarFlags {
        trainable: true,
        ..VarFlags::default()
    };
    let mut vars = Vec::new();
    for (name, dims) in [
        ("fc0/W", vec![6, 5]),
        ("fc0/b", vec![5]),
        ("fc1/W", vec![5, 3]),
    ] {
        vars.push(
            g.declare_variable(VariableDef {
                name: name.into(),
                ty: TensorType::f32(Shape::fixed(&dims)),
                init: Initializer::Zeros,
                flags: trainable,
            })
            .expect(name),
        );
    }
    let node = |g: &mut Graph, name: &str, op: Op, ins: &[Value]| {
        Value::first(g.add_node(name, op, ins).expect(name))
    };
    let x_ty = TensorType::f32(Shape::batched(&[6]));
    let l_ty = TensorType::new(towerpack::tensor::DType::I64, Shape::batched(&[]));
    let x = node(
        &mut g,
        "input",
        Op::Input {
            name: "input".into(),
            ty: x_ty,
        },
        &[],
    );
    let label = node(
        &mut g,
        "label",
        Op::Input {
            name: "label".into(),
            ty: l_ty,
        },
        &[],
    );
    let reads: Vec<Value> = vars
        .iter()
        .map(|&v| {
            let name = format!("{}/read", g.variable(v).name);
            node(&mut g, &name, Op::Variable { var: v }, &[])
        })
        .collect();
    let mm = Op::MatMul {
        transpose_a: false,
        transpose_b: false,
    };
    let h = node(&mut g, "fc0/MatMul", mm.clone(), &[x, reads[0]]);
    let h = node(
        &mut g,
        "fc0/BiasAdd",
        Op::Binary(BinaryOp::Add),
        &[h, reads[1]],
    );
    let h = node(&mut g, "fc0/Relu", Op::Unary(UnaryOp::Relu), &[h]);
    let logits = node(&mut g, "fc1/MatMul", mm, &[h, reads[2]]);
    let xent = node(
        &mut g,
        "xent",
        Op::SparseSoftmaxCrossEntropy,
        &[logits, label],
    );
    let mean = Op::Reduce {
        op: ReduceOp::Mean,
        axes: vec![0],
        keep_dims: false,
    };
    let cost = node(&mut g, "cost", mean, &[xent]);
    let grads = gradients(&mut g, cost, &vars, "gradients").expect("gradients");
    let procs = [
        GradientProcessor::global_norm_clip(5.0).expect("clip"),
        GradientProcessor::scale_gradient(&[(".*/b", 2.0)]).expect("scale"),
        GradientProcessor::check_gradient(),
    ];
    let processed = process_gradients(&mut g, &grads.grads, &procs).expect("process");
    Optimizer::adam(1e-3)
        .accumulate(2)
        .apply_gradients(&mut g, &processed.grads, "train_op")
        .expect("apply");
    increment_global_step(&mut g, "global_step/increment").expect("inc");
    towerpack::ir::verify(&g).expect("valid");
    let text = towerpack::ir::text::print(&g);
    let parsed = towerpack::ir::text::parse(&text, "training.tpir")
        .unwrap_or_else(|e| panic!("{}", e.render()));
    assert_eq!(towerpack::ir::text::print(&parsed), text);
    assert_eq!(parsed.node_count(), g.node_count());
}
