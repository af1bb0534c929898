use crate::ir::*;
use crate::lower::*;
use crate::tensor::{DType, HostTensor};

pub(crate) fn var(g: &mut Graph, name: &str, shape: &[usize]) -> (VarId, Value) {
    let id = g
        .declare_variable(VariableDef {
            name: name.into(),
            ty: TensorType::f32(Shape::fixed(shape)),
            init: Initializer::Zeros,
            flags: VarFlags {
                trainable: true,
                ..VarFlags::default()
            },
        })
        .expect("declare");
    let r = g
        .add_node(&format!("{name}/read"), Op::Variable { var: id }, &[])
        .expect("read");
    (id, Value::first(r))
}

pub(crate) fn node(g: &mut Graph, name: &str, op: Op, ins: &[Value]) -> Value {
    Value::first(g.add_node(name, op, ins).expect(name))
}

fn constant(g: &mut Graph, name: &str, x: f32) -> Value {
    node(
        g,
        name,
        Op::Constant {
            value: HostTensor::scalar_f32(x),
        },
        &[],
    )
}

/// relu(x·W1 + b1)·W2 + b2, then an SGD update of W2 from a fake gradient.
fn mlp() -> (Graph, Step) {
    let mut g = Graph::new();
    let x = node(
        &mut g,
        "x",
        Op::Input {
            name: "x".into(),
            ty: TensorType::f32(Shape::batched(&[8])),
        },
        &[],
    );
    let (_, w1) = var(&mut g, "fc1/W", &[8, 16]);
    let (_, b1) = var(&mut g, "fc1/b", &[16]);
    let (w2v, w2) = var(&mut g, "fc2/W", &[16, 4]);
    let (_, b2) = var(&mut g, "fc2/b", &[4]);
    let mm = MatMul {
        transpose_a: false,
        transpose_b: false,
    };
    let h = node(&mut g, "fc1/matmul", mm.clone(), &[x, w1]);
    let h = node(&mut g, "fc1/add", Op::Binary(BinaryOp::Add), &[h, b1]);
    let h = node(&mut g, "fc1/relu", Op::Unary(UnaryOp::Relu), &[h]);
    let y = node(&mut g, "fc2/matmul", mm, &[h, w2]);
    let y = node(&mut g, "fc2/add", Op::Binary(BinaryOp::Add), &[y, b2]);
    let lr = constant(&mut g, "lr", 0.1);
    let step = node(&mut g, "upd/mul", Op::Binary(BinaryOp::Mul), &[w2, lr]);
    let w2n = node(&mut g, "upd/sub", Op::Binary(BinaryOp::Sub), &[w2, step]);
    let a = g
        .add_node("upd/assign", Op::Assign { var: w2v }, &[w2n])
        .expect("assign");
    (g, Step::new(vec![y], vec![a]))
}

use Op::MatMul;

#[test]
fn mlp_fuses_bias_and_relu_into_matmul_epilogues_and_updates_in_place() {
    let (g, step) = mlp();
    let p = lower(&g, &step, 32, &LowerOptions::default()).expect("lower");
    println!("{p}");
    assert_eq!(
        p.kernel_histogram(),
        vec![("elementwise", 1), ("matmul", 2)],
        "two matmuls with epilogues and one update kernel:\n{p}"
    );
    assert!(
        p.kernels
            .iter()
            .filter(|k| k.kind.epilogue().is_some())
            .count()
            == 2
    );
    assert!(
        p.writebacks.is_empty(),
        "the update writes fc2/W in place:\n{p}"
    );
    let upd = p.kernels.last().expect("update");
    assert!(matches!(
        p.buffer(upd.outputs[0]).storage,
        Storage::State { .. }
    ));
    // The update must run after the matmul that reads the old fc2/W.
    let reader = p
        .kernels
        .iter()
        .position(|k| k.name.starts_with("fc2"))
        .expect("fc2");
    let writer = p
        .kernels
        .iter()
        .position(|k| k.name.starts_with("upd"))
        .expect("upd");
    assert!(reader < writer);
    // Scratch: x (feed) and the hidden layer and the output; x dies after fc1.
    assert!(p.peak_bytes() > 0);
}

#[test]
fn without_fusion_every_op_is_a_kernel() {
    let (g, step) = mlp();
    let opts = LowerOptions {
        fuse: false,
        ..LowerOptions::default()
    };
    let p = lower(&g, &step, 32, &opts).expect("lower");
    assert_eq!(
        p.kernel_histogram(),
        vec![("elementwise", 5), ("matmul", 2)],
        "\n{p}"
    );
}

#[test]
fn batch_norm_statistics_share_reductions_and_never_materialise_squares() {
    let mut g = Graph::new();
    let x = node(
        &mut g,
        "x",
        Op::Input {
            name: "x".into(),
            ty: TensorType::f32(Shape::batched(&[4, 4, 8])),
        },
        &[],
    );
    let m = g
        .add_node(
            "bn/moments",
            Op::Moments {
                axes: vec![0, 1, 2],
                keep_dims: false,
            },
            &[x],
        )
        .expect("moments");
    let (_, gamma) = var(&mut g, "bn/gamma", &[8]);
    let (_, beta) = var(&mut g, "bn/beta", &[8]);
    let eps = constant(&mut g, "bn/eps", 1e-5);
    let ve = node(
        &mut g,
        "bn/add_eps",
        Op::Binary(BinaryOp::Add),
        &[Value::new(m, 1), eps],
    );
    let rs = node(&mut g, "bn/rsqrt", Op::Unary(UnaryOp::Rsqrt), &[ve]);
    let sc = node(&mut g, "bn/scale", Op::Binary(BinaryOp::Mul), &[rs, gamma]);
    let xc = node(
        &mut g,
        "bn/center",
        Op::Binary(BinaryOp::Sub),
        &[x, Value::new(m, 0)],
    );
    let xn = node(&mut g, "bn/mul", Op::Binary(BinaryOp::Mul), &[xc, sc]);
    let y = node(&mut g, "bn/add", Op::Binary(BinaryOp::Add), &[xn, beta]);
    let y = node(&mut g, "relu", Op::Unary(UnaryOp::Relu), &[y]);
    let p = lower(&g, &Step::fetch(vec![y]), 16, &LowerOptions::default()).expect("lower");
    println!("{p}");
    // mean; variance (absorbing (x - mean)^2, finishing with the scale [C]); normalize+relu.
    assert_eq!(
        p.kernel_histogram(),
        vec![("elementwise", 1), ("reduce", 2)],
        "\n{p}"
    );
    let finished = p.kernels.iter().find_map(|k| match &k.kind {
        KernelKind::Reduce {
            finish: Some(f), ..
        } => Some((k, f)),
        _ => None,
    });
    let (variance, finish) = finished.expect("the scale is the variance's finish");
    assert_eq!(finish.shape, vec![8]);
    assert!(
        finish
            .expr
            .ops
            .iter()
            .any(|(op, _)| *op == ExprOp::Unary(UnaryOp::Rsqrt, 2)),
        "{p}"
    );
    // Its outputs: the variance, then the scale; its inputs: the prologue's, then eps and gamma.
    assert_eq!(variance.outputs.len(), 2, "{p}");
    assert_eq!(variance.inputs.len(), finish.first_input + 2, "{p}");
    let big = 16 * 4 * 4 * 8 * 4;
    let scratch_big = p
        .buffers
        .iter()
        .filter(|b| matches!(b.storage, Storage::Scratch { .. }) && b.bytes() == big)
        .count();
    assert_eq!(scratch_big, 2, "only x and the output are full-size:\n{p}");
}

#[test]
fn layout_ops_are_views_not_copies() {
    let mut g = Graph::new();
    let x = node(
        &mut g,
        "x",
        Op::Input {
            name: "x".into(),
            ty: TensorType::f32(Shape::fixed(&[2, 3, 4])),
        },
        &[],
    );
    let t = node(
        &mut g,
        "t",
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        &[x],
    );
    let s = node(
        &mut g,
        "s",
        Op::Slice {
            axis: 0,
            start: 1,
            end: 3,
        },
        &[t],
    );
    let e = node(&mut g, "e", Op::Unary(UnaryOp::Exp), &[s]);
    let p = lower(&g, &Step::fetch(vec![e]), 1, &LowerOptions::default()).expect("lower");
    assert_eq!(p.kernels.len(), 1, "\n{p}");
    let v = &p.kernels[0].inputs[0];
    assert_eq!((v.offset, v.strides.as_slice()), (1, &[1usize, 12, 4][..]));
    // Fetching the transposed view itself needs a copy into a contiguous buffer.
    let p = lower(&g, &Step::fetch(vec![t]), 1, &LowerOptions::default()).expect("lower");
    assert_eq!(p.kernel_histogram(), vec![("elementwise", 1)], "\n{p}");
    let _ = DType::F32;
}

#[test]
fn state_layout_keeps_slot_families_in_variable_order() {
    let mut g = Graph::new();
    let mut ids = Vec::new();
    for (name, n) in [("a/W", 3usize), ("b/W", 5)] {
        ids.push(var(&mut g, name, &[n]).0);
    }
    let slot = |g: &mut Graph, name: &str, n: usize| {
        g.declare_variable(VariableDef {
            name: name.into(),
            ty: TensorType::f32(Shape::fixed(&[n])),
            init: Initializer::Zeros,
            flags: VarFlags::default(),
        })
        .expect("slot")
    };
    let gs = g
        .declare_variable(VariableDef {
            name: "global_step".into(),
            ty: TensorType::scalar(DType::I64),
            init: Initializer::Zeros,
            flags: VarFlags::default(),
        })
        .expect("gs");
    // Declared out of order on purpose.
    let mb = slot(&mut g, "b/W/Momentum", 5);
    let ma = slot(&mut g, "a/W/Momentum", 3);
    let l = StateLayout::new(&g);
    let off = |v: VarId| l.slot(v).offset;
    assert_eq!((off(ids[0]), off(ids[1])), (0, 12));
    assert_eq!(
        (off(ma), off(mb)),
        (32, 44),
        "slots follow their variables' order"
    );
    assert_eq!(off(gs) % 8, 0);
    assert!(off(gs) >= 64);
}

/// A step that fetches a variable and assigns it returns the value the step began with, on
/// the CPU backend as on the reference executor (reported by the trainer's tests).
#[test]
fn fetching_an_assigned_variable_returns_its_old_value() {
    use crate::backend::Session;
    use crate::backend::cpu::{CpuOptions, CpuSession};
    use crate::backend::reference::ReferenceSession;
    for family in [1usize, 3] {
        let mut g = Graph::new();
        let mut fetches = Vec::new();
        let mut assigns = Vec::new();
        for i in 0..family {
            let (v, r) = var(&mut g, &format!("v{i}"), &[2]);
            let one = constant(&mut g, &format!("one{i}"), 1.0);
            let n = node(
                &mut g,
                &format!("next{i}"),
                Op::Binary(BinaryOp::Add),
                &[r, one],
            );
            assigns.push(
                g.add_node(&format!("assign{i}"), Op::Assign { var: v }, &[n])
                    .expect("assign"),
            );
            fetches.push(r);
        }
        let step = Step::new(fetches, assigns);
        let mut cpu = CpuSession::new(g.clone(), CpuOptions::default()).expect("cpu");
        let mut reference = ReferenceSession::new(g).expect("reference");
        cpu.initialize_variables(0).expect("init");
        reference.initialize_variables(0).expect("init");
        for round in 0..2 {
            let (c, r) = (
                cpu.run(&step, &[]).expect("cpu"),
                reference.run(&step, &[]).expect("ref"),
            );
            assert_eq!(c, r, "family of {family}, round {round}");
            assert_eq!(c[0].to_f64_vec(), vec![f64::from(round); 2]);
        }
    }
}

/// `AllReduce` lowers to a kernel that copies and hands the data to the session's collective:
/// the identity without one (as the reference executor), the participants' reduction with one.
#[test]
fn all_reduce_goes_through_the_collective() {
    use crate::backend::cpu::{CpuOptions, CpuSession};
    use crate::backend::{BackendError, Collective, Session};
    struct TwoEqualRanks;
    impl Collective for TwoEqualRanks {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            2
        }
        fn all_reduce(&self, data: &mut [f32], op: ReduceOp) -> Result<(), BackendError> {
            // Two participants holding the same data: sum doubles, mean keeps it.
            if op == ReduceOp::Sum {
                data.iter_mut().for_each(|x| *x *= 2.0);
            }
            Ok(())
        }
    }
    let mut g = Graph::new();
    let x = node(
        &mut g,
        "x",
        Op::Input {
            name: "x".into(),
            ty: TensorType::f32(Shape::batched(&[3])),
        },
        &[],
    );
    let y = node(&mut g, "y", Op::Unary(UnaryOp::Exp), &[x]);
    let s = node(&mut g, "s", Op::AllReduce { op: ReduceOp::Sum }, &[y]);
    let text = crate::ir::text::print(&g);
    assert!(text.contains("all_reduce(%y) {op=sum}"), "{text}");
    assert_eq!(
        crate::ir::text::print(&crate::ir::text::parse(&text, "t").expect("parse")),
        text
    );
    let feed = vec![(
        x.node,
        HostTensor::from_f32(&[2, 3], vec![0.0; 6]).expect("6"),
    )];
    let step = Step::fetch(vec![s]);
    let mut alone = CpuSession::new(g.clone(), CpuOptions::default()).expect("cpu");
    assert_eq!(
        alone.run(&step, &feed).expect("run")[0].to_f64_vec(),
        vec![1.0; 6]
    );
    let mut joined = CpuSession::new(g, CpuOptions::default()).expect("cpu");
    joined.set_collective(std::sync::Arc::new(TwoEqualRanks));
    assert_eq!(
        joined.run(&step, &feed).expect("run")[0].to_f64_vec(),
        vec![2.0; 6]
    );
}
