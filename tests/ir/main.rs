//! Tests of the textual IR (`towerpack::ir::text`): round trips of random graphs, the grammar's
//! examples, positioned errors, a mutation fuzzer, the `towerpack` command, and a reviewed
//! snapshot of a two-tower residual block.

mod cli;
mod errors;
mod fuzz;
mod grammar;
mod random_graph;
mod random_steps;
mod roundtrip;

use towerpack::ir::text::{parse, print};
use towerpack::ir::{
    BinaryOp, Conv2dAttrs, Distribution, FanMode, Graph, Initializer, Op, PoolAttrs, PoolKind,
    ReduceOp, Shape, TensorType, UnaryOp, Value, VarFlags, VarId, VariableDef,
};
use towerpack::tensor::{DType, HostTensor};

fn var(g: &mut Graph, name: &str, shape: &[usize], init: Initializer, flags: VarFlags) -> VarId {
    let ty = TensorType::f32(Shape::fixed(shape));
    g.declare_variable(VariableDef {
        name: name.into(),
        ty,
        init,
        flags,
    })
    .expect("variable")
}

fn node(g: &mut Graph, name: &str, op: Op, inputs: &[Value], device: u16) -> Value {
    Value::first(g.add_node_on(name, op, inputs, Some(device)).expect(name))
}

/// Two towers of one residual block sharing their variables (read once, outside the towers),
/// as tensorpack's SyncMultiGPUTrainer builds them; tower 0 updates the BatchNorm EMA.
fn two_tower_block() -> Graph {
    let mut g = Graph::new();
    let trainable = VarFlags {
        trainable: true,
        model: true,
        local: false,
    };
    let model = VarFlags {
        trainable: false,
        model: true,
        local: false,
    };
    let he = Initializer::VarianceScaling {
        scale: 2.0,
        mode: FanMode::FanOut,
        distribution: Distribution::Normal,
    };
    let w = var(&mut g, "res0/conv1/W", &[3, 3, 4, 4], he, trainable);
    let gamma = var(&mut g, "res0/bn1/gamma", &[4], Initializer::Ones, trainable);
    let ema = var(&mut g, "res0/bn1/mean/EMA", &[4], Initializer::Zeros, model);
    let fc = var(
        &mut g,
        "linear/W",
        &[4, 10],
        Initializer::Normal {
            mean: 0.0,
            stddev: 0.01,
        },
        trainable,
    );
    let reads: Vec<Value> = [
        (w, "res0/conv1/W/read"),
        (gamma, "res0/bn1/gamma/read"),
        (ema, "res0/bn1/mean/EMA/read"),
        (fc, "linear/W/read"),
    ]
    .iter()
    .map(|&(v, name)| Value::first(g.add_node(name, Op::Variable { var: v }, &[]).expect(name)))
    .collect();
    let decay = Value::first(
        g.add_node(
            "ema_decay",
            Op::Constant {
                value: HostTensor::scalar_f32(0.9),
            },
            &[],
        )
        .expect("const"),
    );
    let rest = Value::first(
        g.add_node(
            "ema_one_minus_decay",
            Op::Constant {
                value: HostTensor::scalar_f32(0.1),
            },
            &[],
        )
        .expect("const"),
    );
    let mut losses = Vec::new();
    let mut ema_assign = None;
    for t in 0..2u16 {
        let s = |n: &str| format!("tower{t}/{n}");
        let x = node(
            &mut g,
            &s("input"),
            Op::Input {
                name: "input".into(),
                ty: TensorType::f32(Shape::batched(&[8, 8, 4])),
            },
            &[],
            t,
        );
        let label = node(
            &mut g,
            &s("label"),
            Op::Input {
                name: "label".into(),
                ty: TensorType::new(DType::I32, Shape::batched(&[])),
            },
            &[],
            t,
        );
        let conv = node(
            &mut g,
            &s("res0/conv1/Conv2D"),
            Op::Conv2d(Conv2dAttrs::default()),
            &[x, reads[0]],
            t,
        );
        let m = g
            .add_node_on(
                &s("res0/bn1/moments"),
                Op::Moments {
                    axes: vec![0, 1, 2],
                    keep_dims: false,
                },
                &[conv],
                Some(t),
            )
            .expect("moments");
        let centered = node(
            &mut g,
            &s("res0/bn1/sub"),
            Op::Binary(BinaryOp::Sub),
            &[conv, Value::new(m, 0)],
            t,
        );
        let inv = node(
            &mut g,
            &s("res0/bn1/rsqrt"),
            Op::Unary(UnaryOp::Rsqrt),
            &[Value::new(m, 1)],
            t,
        );
        let normed = node(
            &mut g,
            &s("res0/bn1/mul"),
            Op::Binary(BinaryOp::Mul),
            &[centered, inv],
            t,
        );
        let scaled = node(
            &mut g,
            &s("res0/bn1/output"),
            Op::Binary(BinaryOp::Mul),
            &[normed, reads[1]],
            t,
        );
        let sum = node(
            &mut g,
            &s("res0/add"),
            Op::Binary(BinaryOp::Add),
            &[scaled, x],
            t,
        );
        let relu = node(
            &mut g,
            &s("res0/output"),
            Op::Unary(UnaryOp::Relu),
            &[sum],
            t,
        );
        let pool = PoolAttrs {
            kind: PoolKind::Avg,
            window: [8, 8],
            strides: [1, 1],
            padding: towerpack::ir::Padding::Valid,
        };
        let gap = node(&mut g, &s("gap/AvgPool"), Op::Pool(pool), &[relu], t);
        let flat = node(
            &mut g,
            &s("gap/Reshape"),
            Op::Reshape {
                shape: Shape::batched(&[4]),
            },
            &[gap],
            t,
        );
        let logits = node(
            &mut g,
            &s("linear/MatMul"),
            Op::MatMul {
                transpose_a: false,
                transpose_b: false,
            },
            &[flat, reads[3]],
            t,
        );
        let xent = node(
            &mut g,
            &s("xent"),
            Op::SparseSoftmaxCrossEntropy,
            &[logits, label],
            t,
        );
        let cost = node(
            &mut g,
            &s("cost"),
            Op::Reduce {
                op: ReduceOp::Mean,
                axes: vec![0],
                keep_dims: false,
            },
            &[xent],
            t,
        );
        losses.push(cost);
        if t == 0 {
            let kept = node(
                &mut g,
                "res0/bn1/mean/EMA/decayed",
                Op::Binary(BinaryOp::Mul),
                &[reads[2], decay],
                t,
            );
            let fresh = node(
                &mut g,
                "res0/bn1/mean/EMA/fresh",
                Op::Binary(BinaryOp::Mul),
                &[Value::new(m, 0), rest],
                t,
            );
            let new = node(
                &mut g,
                "res0/bn1/mean/EMA/new",
                Op::Binary(BinaryOp::Add),
                &[kept, fresh],
                t,
            );
            ema_assign = Some(
                g.add_node_on(
                    "res0/bn1/mean/EMA/assign",
                    Op::Assign { var: ema },
                    &[new],
                    Some(t),
                )
                .expect("assign"),
            );
        }
    }
    let assign = ema_assign.expect("tower 0 ran");
    g.add_group("train_op", &[assign]).expect("group");
    for l in losses {
        g.add_to_collection("losses", l);
    }
    g.add_to_collection("update_ops", Value::first(assign));
    g
}

#[test]
fn a_two_tower_residual_block_prints_for_review() {
    let g = two_tower_block();
    towerpack::ir::verify(&g).expect("valid graph");
    let text = print(&g);
    assert_eq!(print(&parse(&text, "block.tp").expect("parses")), text);
    insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("ir_text_two_tower_residual_block", text);
    });
}
