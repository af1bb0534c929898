//! The printed `Program`s of the MLP (784-512-512-10) and CIFAR ResNet-20 training steps
//! (forward, backward, Momentum update, BatchNorm moving averages, the step counter), built by
//! `build_training_graph` exactly as `SimpleTrainer` builds them, at batch 2 so the text stays
//! small and stable. Fusion guards bound each program's kernels (a fusion regression adds
//! kernels or kernel outputs) and its planned peak scratch memory.

use std::sync::Arc;

use towerpack::backend::Step;
use towerpack::dsl::{InputSpec, Tensor};
use towerpack::ir::{Graph, NodeId, UnaryOp, Value};
use towerpack::lower::{
    ExprOp, HalfFormat, KernelKind, LowerOptions, Precision, Program, Storage, lower,
};
use towerpack::models::{CifarResNet, Mlp};
use towerpack::optim::{DynamicLossScale, Optimizer, finiteness, record_first_non_finite};
use towerpack::tensor::DType;
use towerpack::train::{
    BuiltGraph, DummyConstantInput, GraphSetup, InputSource, ModelDesc, ModelFn, SimpleTrainer,
    Trainer, build_training_graph,
};

/// The batch of the snapshotted programs.
const BATCH: usize = 2;

fn program(
    signature: Vec<InputSpec>,
    tower: impl Fn(&[Tensor]) -> Tensor + Send + Sync + 'static,
    batch: usize,
) -> Program {
    program_in(signature, tower, batch, Precision::Fp32)
}

fn program_in(
    signature: Vec<InputSpec>,
    tower: impl Fn(&[Tensor]) -> Tensor + Send + Sync + 'static,
    batch: usize,
    precision: Precision,
) -> Program {
    let model = ModelFn::new(signature, tower, Optimizer::momentum(0.1, 0.9));
    let tg = build_training_graph(&model, 0).expect("training graph");
    let options = LowerOptions {
        precision,
        ..LowerOptions::default()
    };
    lower(&tg.graph, &tg.step, batch, &options).expect("lower")
}

fn mlp_program(batch: usize) -> Program {
    let m = Mlp::default();
    program(m.inputs(), move |x| m.build(x), batch)
}

fn resnet20_program(batch: usize) -> Program {
    resnet20_program_in(batch, Precision::Fp32)
}

fn resnet20_program_in(batch: usize, precision: Precision) -> Program {
    let m = CifarResNet::new(3);
    program_in(m.inputs(), move |x| m.build(x), batch, precision)
}

fn snapshot(name: &str, p: &Program) {
    let text = format!("{p}\nkernels by kind: {:?}", p.kernel_histogram());
    insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!(name, text);
    });
}

fn count(p: &Program, kind: &str) -> usize {
    p.kernels.iter().filter(|k| k.kind.name() == kind).count()
}

/// Kernels writing variables' persistent storage, other than the step counter.
fn update_kernels(p: &Program) -> usize {
    p.kernels
        .iter()
        .filter(|k| {
            !k.name.starts_with("global_step")
                && k.outputs
                    .iter()
                    .any(|b| matches!(p.buffer(*b).storage, Storage::State { .. }))
        })
        .count()
}

/// Full-size elementwise kernels whose expression is a single op of a single load: fusion left
/// an operation on its own (a ReLU, a bias add) where it should have joined a neighbour.
/// Copies that make a strided slice contiguous for a fixed-function kernel (`.../copy`, e.g.
/// the channel slice of the zero-padded shortcut's gradient before average pooling's
/// gradient) are not counted.
fn lone_elementwise(p: &Program) -> Vec<String> {
    p.kernels
        .iter()
        .filter(|k| match &k.kind {
            KernelKind::Elementwise { shape, expr } => {
                shape.iter().product::<usize>() > 1024
                    && expr.ops.len() <= 2
                    && !k.name.ends_with("/copy")
            }
            _ => false,
        })
        .map(|k| k.name.clone())
        .collect()
}

#[test]
fn mlp_training_program() {
    snapshot("lower_mlp_training_program", &mlp_program(BATCH));
}

#[test]
fn resnet20_training_program() {
    snapshot("lower_resnet20_training_program", &resnet20_program(BATCH));
}

/// ResNet-20 in bf16: the fp32 program with every GEMM rounding its operands (the autocast
/// pass's casts absorbed, none launched alone), so exactly the fp32 program's kernels.
#[test]
fn resnet20_bf16_training_program() {
    snapshot(
        "lower_resnet20_bf16_training_program",
        &resnet20_program_in(BATCH, Precision::Bf16),
    );
}

/// At batch 128 in bf16 and fp16: the same kernels, kinds and buffers as fp32; every GEMM
/// rounds both operands to the 16-bit format; no elementwise kernel casts to 16 bits alone (a
/// kernel storing an activation in bf16 rounds it where it computes it: a cast to bf16 and
/// back, followed by no other cast). fp16 keeps every buffer f32; bf16 stores the
/// activations of the pass `half-storage` in bf16, which lowers the planned peak.
#[test]
fn resnet20_16_bit_programs_have_the_fp32_kernels() {
    let fp32 = resnet20_program(128);
    for (precision, format) in [
        (Precision::Bf16, HalfFormat::Bf16),
        (Precision::Fp16, HalfFormat::F16),
    ] {
        let p = resnet20_program_in(128, precision);
        assert_eq!(p.kernel_histogram(), fp32.kernel_histogram(), "{precision}");
        assert_eq!(p.buffers.len(), fp32.buffers.len(), "{precision}");
        let half_stored = p.buffers.iter().filter(|b| b.dtype == DType::BF16).count();
        eprintln!(
            "resnet20 b128 {precision}: peak {} MiB (fp32 {} MiB), {half_stored} buffers in bf16",
            p.peak_bytes() >> 20,
            fp32.peak_bytes() >> 20
        );
        if precision == Precision::Bf16 {
            // Measured: 27 activations and gradients, peak 99 → 71 MiB.
            assert_eq!(half_stored, 27, "{precision}");
            assert!(p.peak_bytes() * 4 < fp32.peak_bytes() * 3, "{precision}");
        } else {
            assert_eq!(half_stored, 0, "{precision}");
            assert_eq!(p.peak_bytes(), fp32.peak_bytes(), "{precision}");
        }
        let mut gemms = 0;
        for (k, k32) in p.kernels.iter().zip(&fp32.kernels) {
            assert_eq!(k.name, k32.name);
            let rounding = match &k.kind {
                KernelKind::MatMul(g, _) => Some(g.round_operands),
                KernelKind::Conv2d(g, ..)
                | KernelKind::Conv2dBackpropInput(g, _)
                | KernelKind::Conv2dBackpropFilter(g, ..) => Some(g.round_operands),
                _ => None,
            };
            if let Some(r) = rounding {
                assert_eq!(r, Some(format), "{k}");
                gemms += 1;
            }
            if let KernelKind::Elementwise { expr, .. } = &k.kind {
                let stores_half = k.outputs.iter().any(|&b| p.buffer(b).dtype == DType::BF16);
                assert!(
                    stores_half || !expr.to_string().contains(format.name()),
                    "a cast left alone: {k}"
                );
            }
        }
        // 19 convolutions with their filter gradients, 18 input gradients (none for the image),
        // the classifier's product and its two gradients.
        assert_eq!(gemms, 19 + 19 + 18 + 3, "every convolution and matmul");
    }
}

/// ResNet-20's `SimpleTrainer` step at `batch` in `precision`, with fp16's dynamic loss scale
/// when `loss_scale` (as `launch_train_with_config` builds it).
fn resnet20_trainer_program(batch: usize, precision: Precision, loss_scale: bool) -> Program {
    let (graph, train_op, _) = resnet20_trainer_graph(batch, loss_scale);
    let step = Step::new(Vec::new(), vec![train_op]);
    lower_in(&graph, &step, batch, precision)
}

/// ResNet-20's `SimpleTrainer` graph at `batch`: the graph, its train op and what the trainer
/// built (losses, gradients).
fn resnet20_trainer_graph(batch: usize, loss_scale: bool) -> (Graph, NodeId, BuiltGraph) {
    let m = CifarResNet::new(3);
    let model: Arc<dyn ModelDesc> = Arc::new(ModelFn::new(
        m.inputs(),
        move |x| m.build(x),
        Optimizer::momentum(0.1, 0.9),
    ));
    let signature = model.inputs();
    let mut input =
        DummyConstantInput::new(signature.iter().map(|s| s.shape.resolve(batch)).collect());
    input.setup(&signature).expect("input");
    let mut graph = Graph::new();
    let mut trainer = SimpleTrainer::new();
    let built = trainer
        .setup_graph(&mut GraphSetup {
            graph: &mut graph,
            seed: 0,
            input: &mut input,
            model: Some(model),
            loss_scale: loss_scale.then(DynamicLossScale::default),
        })
        .expect("setup");
    let train_op = trainer.train_op().expect("train op");
    (graph, train_op, built)
}

fn lower_in(graph: &Graph, step: &Step, batch: usize, precision: Precision) -> Program {
    let options = LowerOptions {
        precision,
        ..LowerOptions::default()
    };
    lower(graph, step, batch, &options).expect("lower")
}

/// `NonFiniteGuard`'s graph at batch 128, against a step that computes the same losses (as the
/// default `MovingAverageSummary` does every step): the losses and the 59 gradients joined in
/// rows with ONE count per row, and the device's record of the first non-finite run in ONE
/// elementwise kernel and ONE reduction — 4 kernels, where a `CheckGradient` per gradient
/// added about one reduction per gradient.
#[test]
fn resnet20_non_finite_guard_adds_four_kernels() {
    let (mut graph, train_op, built) = resnet20_trainer_graph(128, false);
    assert_eq!(built.gradients.len(), 59);
    let losses: Vec<Value> = built.losses.iter().map(|l| l.1).collect();
    let unguarded = lower_in(
        &graph,
        &Step::new(losses.clone(), vec![train_op]),
        128,
        Precision::Fp32,
    );
    let mut named: Vec<(String, Value)> = built
        .losses
        .iter()
        .map(|(n, v)| (format!("loss `{n}`"), *v))
        .collect();
    named.extend(
        built
            .gradients
            .iter()
            .map(|&(var, g)| (graph.variable(var).name.clone(), g)),
    );
    let groups = finiteness(&mut graph, "NonFiniteGuard/finite", &named).expect("checks");
    let counts: Vec<Value> = groups.iter().map(|g| g.counts).collect();
    let record =
        record_first_non_finite(&mut graph, "NonFiniteGuard/record", &counts).expect("record");
    let p = lower_in(
        &graph,
        &Step::new(losses, vec![train_op, record.update]),
        128,
        Precision::Fp32,
    );
    let added: Vec<(&str, &str)> = p
        .kernels
        .iter()
        .filter(|k| k.name.starts_with("NonFiniteGuard/"))
        .map(|k| (k.kind.name(), k.name.as_str()))
        .collect();
    assert_eq!(
        added,
        [
            ("concat", "NonFiniteGuard/finite/0/joined"),
            ("reduce", "NonFiniteGuard/finite/0/count"),
            ("elementwise", "NonFiniteGuard/record/new_first"),
            ("reduce", "NonFiniteGuard/record/new_since"),
        ]
    );
    assert_eq!(p.kernels.len(), unguarded.kernels.len() + 4, "{p}");
}

/// fp16 with its dynamic loss scale at batch 128: the fp32 step's kernels plus only the loss
/// scale's own — ONE non-finite count over every gradient (the scaled gradients flattened and
/// joined, then one reduction: not one per gradient shape), the scale's reciprocal, one scalar
/// kernel for the verdict and the scale's update, and the two scalar seeds of the backward pass
/// that fp32 folds to constants (`d(cost·scale)/dcost` and the mean's share of it, now
/// multiples of the scale variable). The unscaled gradients `g · (1/scale)` are never written
/// out (each update computes its own) and the gated updates stay ONE arena kernel, as in fp32.
#[test]
fn resnet20_fp16_loss_scale_adds_only_its_checks() {
    let fp32 = resnet20_trainer_program(128, Precision::Fp32, false);
    let p = resnet20_trainer_program(128, Precision::Fp16, true);
    let named = |prefix: &str| {
        p.kernels
            .iter()
            .filter(|k| k.name.starts_with(prefix))
            .collect::<Vec<_>>()
    };
    let checks = named("LossScale/finite/");
    let kinds: Vec<(&str, &str)> = checks
        .iter()
        .map(|k| (k.kind.name(), k.name.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("concat", "LossScale/finite/0/joined"),
            ("reduce", "LossScale/finite/0/count")
        ],
        "one join of every gradient, one count"
    );
    assert_eq!(named("LossScale/unscale/").len(), 1, "only the reciprocal");
    assert_eq!(
        update_kernels(&p),
        update_kernels(&fp32) + 1,
        "the gated updates in one kernel, plus the scale's own:\n{p}"
    );
    assert_eq!(
        p.kernels.len(),
        fp32.kernels.len() + checks.len() + 4,
        "{} kernels against fp32's {}",
        p.kernels.len(),
        fp32.kernels.len()
    );
}

/// MLP at batch 256: 3 forward products with bias(+ReLU) epilogues, 5 backward products (the
/// ReLU mask and the weight decay in their epilogues), one merged bias-gradient reduction per
/// layer pair, one update kernel over every variable.
#[test]
fn mlp_fusion_guards() {
    let p = mlp_program(256);
    assert!(p.kernels.len() <= 20, "{} kernels:\n{p}", p.kernels.len());
    assert_eq!(count(&p, "matmul"), 8, "{p}");
    assert!(count(&p, "elementwise") <= 4, "{p}");
    assert!(count(&p, "reduce") <= 6, "{p}");
    assert_eq!(update_kernels(&p), 1, "one fused Momentum update:\n{p}");
    assert_eq!(lone_elementwise(&p), Vec::<String>::new(), "{p}");
    // Every forward matmul applies its bias (and ReLU) in its epilogue.
    let forward = p
        .kernels
        .iter()
        .filter(|k| matches!(&k.kind, KernelKind::MatMul(g, Some(_)) if !g.transpose_a && !g.transpose_b))
        .count();
    assert_eq!(forward, 3, "{p}");
}

/// The MLP's planned scratch at batch 256: the fed images (256×784), the activations kept for
/// the backward pass (2 × 256×512 ReLU outputs, 256×10 logits), the gradient arena of all
/// 669,706 parameters and two 256×512 backward temporaries, with buffers reused — 5.34 MiB
/// (5,601,408 bytes), bounded at 5.5 MiB.
#[test]
fn mlp_peak_memory() {
    let p = mlp_program(256);
    let arena = 669_706 * 4;
    assert!(p.peak_bytes() >= arena, "{} bytes", p.peak_bytes());
    assert!(p.peak_bytes() <= 11 << 19, "{} bytes:\n{p}", p.peak_bytes());
}

/// ResNet-20 at batch 128: per convolution, one forward kernel (residual adds in epilogues,
/// and the mean of the batch norm that follows), one backward-filter and one backward-input
/// kernel (the ReLU mask and the shortcut gradient in its epilogue, at most two stored
/// outputs: batch norm's backward recomputes its products of the gradient instead of storing
/// them, and takes its four per-channel sums in the same epilogue); per batch norm, its
/// apply+ReLU computed by the convolutions that read it, in their prologues, and recomputed by
/// the epilogues that read it (never written out); per batch norm, its rsqrt(var + eps) finished
/// by the variance's reduction.
#[test]
fn resnet20_fusion_guards() {
    let p = resnet20_program(128);
    assert!(p.kernels.len() <= 146, "{} kernels", p.kernels.len());
    assert_eq!(count(&p, "conv2d"), 19);
    assert_eq!(count(&p, "conv2d_backprop_filter"), 19);
    assert_eq!(count(&p, "conv2d_backprop_input"), 18);
    assert!(count(&p, "reduce") <= 30, "{:?}", p.kernel_histogram());
    let reductions = |kind: &str| -> Vec<usize> {
        p.kernels
            .iter()
            .filter(|k| k.kind.name() == kind)
            .map(|k| k.kind.epilogue().map_or(0, |e| e.reductions.len()))
            .collect()
    };
    assert_eq!(reductions("conv2d"), vec![1; 19], "every batch-norm mean");
    assert_eq!(
        reductions("conv2d_backprop_input"),
        vec![4; 18],
        "batch norm's backward sums"
    );
    assert!(count(&p, "elementwise") <= 66, "{:?}", p.kernel_histogram());
    // Batch norm's per-channel gradient terms are recomputed by the kernels that read them,
    // every filter gradient adds its weight decay in its epilogue, and the forward pass's
    // rsqrt(var + eps) is its variance's finish, one per batch norm: no per-channel
    // elementwise kernel is left.
    let per_channel: Vec<&str> = p
        .kernels
        .iter()
        .filter(|k| {
            matches!(&k.kind, KernelKind::Elementwise { shape, .. }
                if !shape.is_empty() && shape.iter().product::<usize>() <= 64)
        })
        .map(|k| k.name.as_str())
        .collect();
    assert!(per_channel.is_empty(), "{per_channel:?}");
    let finished: Vec<&str> = p
        .kernels
        .iter()
        .filter(|k| {
            matches!(
                &k.kind,
                KernelKind::Reduce {
                    finish: Some(f),
                    ..
                } if f.expr.ops.iter().any(|(op, _)| matches!(op, ExprOp::Unary(UnaryOp::Rsqrt, _)))
            )
        })
        .map(|k| k.name.as_str())
        .collect();
    assert!(
        finished.iter().all(|n| n.ends_with("bn/moments/variance")),
        "{finished:?}"
    );
    assert_eq!(finished.len(), 19, "{finished:?}");
    for k in p
        .kernels
        .iter()
        .filter(|k| k.kind.name() == "conv2d_backprop_filter")
    {
        assert!(k.kind.epilogue().is_some(), "{k}");
    }
    assert_eq!(
        update_kernels(&p),
        2,
        "one variable update, one moving-average update"
    );
    assert_eq!(lone_elementwise(&p), Vec::<String>::new());
    for k in &p.kernels {
        if let KernelKind::Conv2dBackpropInput(_, e) = &k.kind {
            assert!(e.as_ref().is_some_and(|e| e.stored_outputs() <= 2), "{k}");
        }
    }
    // No batch norm apply + ReLU is written out: every convolution reading one (conv0's
    // input scaling too) computes it in its prologue, forward and filter gradient alike.
    let relus: Vec<&str> = p
        .kernels
        .iter()
        .filter(|k| k.name.ends_with("/Relu") && matches!(k.kind, KernelKind::Elementwise { .. }))
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(relus, Vec::<&str>::new());
    let prologues = |kind: &str| {
        p.kernels
            .iter()
            .filter(|k| k.kind.name() == kind && k.kind.prologue().is_some())
            .count()
    };
    assert_eq!(prologues("conv2d"), 19);
    assert_eq!(prologues("conv2d_backprop_filter"), 19);
}

/// ResNet-20's planned scratch at batch 128: the activations kept for the backward pass
/// dominate (per stage n·32²·16 floats per tensor at stage 1), with buffers reused — 99.5 MiB
/// (104,340,992 bytes), bounded at 110 MiB. Batch norm's apply + ReLU is computed by the
/// convolutions that read it (`LowerOptions::conv_prologues`), never stored: written out before
/// every convolution and kept for the backward pass, it took the peak to 187.5 MiB.
#[test]
fn resnet20_peak_memory() {
    let p = resnet20_program(128);
    let one_activation = 128 * 32 * 32 * 16 * 4;
    assert!(
        p.peak_bytes() >= 10 * one_activation,
        "{} bytes",
        p.peak_bytes()
    );
    assert!(p.peak_bytes() <= 110 << 20, "{} bytes", p.peak_bytes());
}
