//! Lowering of the distributed trainer's graph: each gradient arena of a fused update is
//! all-reduced in place by ONE `AllReduce` kernel (per tower of the rank) where the gradients
//! lie — no concatenation, no slicing, no copy — before its update kernel; gradients that feed
//! no fused update (per-variable gradient scales) also travel in in-place buckets; compiled
//! steps with a stand-in collective match the reference executor with the collective written
//! into the graph; ranks whose steps differ (the chief's summaries) issue the same all-reduces
//! in the same order; a snapshot shows the program of one rank.

use std::sync::Arc;

use towerpack::backend::collective::SingleProcess;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::backend::reference::ReferenceSession;
use towerpack::backend::{BackendError, Collective, Session, Step};
use towerpack::ir::{BinaryOp, Graph, Op, ReduceOp, Value};
use towerpack::lower::{KernelKind, LowerOptions, Program, Storage, lower};
use towerpack::optim::{GradientProcessor, Optimizer};
use towerpack::tensor::HostTensor;
use towerpack::train::distributed::{DistributedOptions, DistributedTrainer};
use towerpack::train::*;

use crate::training_graphs;

use training_graphs::{BATCH, Built, build as build_graph, feeds, mlp};

/// How the model's gradients are processed and applied.
#[derive(Clone, Copy, Debug)]
enum Variant {
    /// Momentum SGD: fused updates.
    Momentum,
    /// Adam after global-norm clipping: fused updates whose arenas other kernels read too.
    ClippedAdam,
    /// Momentum SGD with the biases' gradients halved: weights and biases alternate in the
    /// state layout with different update expressions, so no update is fused.
    ScaledBiases,
}

fn model(variant: Variant) -> ModelFn {
    let m = mlp();
    let signature = m.inputs();
    let (optimizer, processors) = match variant {
        Variant::Momentum => (Optimizer::momentum(0.1, 0.9), vec![]),
        Variant::ClippedAdam => (
            Optimizer::adam(0.01),
            vec![GradientProcessor::global_norm_clip(0.5).expect("clip")],
        ),
        Variant::ScaledBiases => (
            Optimizer::momentum(0.1, 0.9),
            vec![GradientProcessor::scale_gradient(&[(".*/b", 0.5)]).expect("scale")],
        ),
    };
    ModelFn::new(signature, move |x| m.build(x), optimizer).with_processors(processors)
}

/// The graph `trainer` builds for `model` (the train op is the group `train_op`).
fn build(trainer: &mut dyn Trainer, model: ModelFn) -> Built {
    build_graph(model, |setup| {
        let built = trainer.setup_graph(setup).expect("setup");
        let train_op = setup.graph.find("train_op").expect("train_op");
        (built.towers, train_op)
    })
}

fn distributed(towers: usize, variant: Variant) -> Built {
    let options = DistributedOptions {
        towers_per_rank: towers,
        ..DistributedOptions::default()
    };
    let mut trainer = DistributedTrainer::new(Arc::new(SingleProcess::default()), options);
    build(&mut trainer, model(variant))
}

fn lowered(b: &Built, bucket_bytes: usize) -> Program {
    let options = LowerOptions {
        bucket_bytes,
        ..LowerOptions::default()
    };
    lower(&b.graph, &b.step, BATCH, &options).expect("lower")
}

fn all_reduces(p: &Program) -> Vec<usize> {
    (0..p.kernels.len())
        .filter(|&i| matches!(p.kernels[i].kind, KernelKind::AllReduce { .. }))
        .collect()
}

fn scratch_device(p: &Program, b: towerpack::lower::BufferId) -> u16 {
    match p.buffer(b).storage {
        Storage::Scratch { device, .. } => device,
        other => panic!("{b} is not scratch: {other:?}"),
    }
}

/// Asserts that all-reduce kernel `i` reduces its own buffer in place, and returns it.
fn in_place(p: &Program, i: usize) -> towerpack::lower::BufferId {
    let k = &p.kernels[i];
    assert!(
        matches!(
            k.kind,
            KernelKind::AllReduce {
                op: ReduceOp::Mean,
                ..
            }
        ),
        "{k}"
    );
    assert_eq!(k.inputs.len(), 1, "{k}");
    assert_eq!(k.outputs, vec![k.inputs[0].buffer], "in place: {k}");
    assert_eq!(k.inputs[0].offset, 0, "{k}");
    assert_eq!(scratch_device(p, k.outputs[0]), k.device, "{k}");
    k.outputs[0]
}

#[test]
fn each_gradient_arena_is_all_reduced_in_place_once_before_its_update() {
    for towers in [1, 2] {
        let b = distributed(towers, Variant::Momentum);
        for (bucket_bytes, buckets) in [(1 << 20, 1), (600, 2)] {
            let p = lowered(&b, bucket_bytes);
            let what = format!("{towers} tower(s), {bucket_bytes} bytes");
            assert_eq!(p.buckets.len(), buckets, "{what}:\n{p}");
            assert_eq!(all_reduces(&p).len(), buckets * towers, "{what}:\n{p}");
            for bucket in &p.buckets {
                assert_eq!(bucket.arenas.len(), towers, "{what}");
                assert_eq!(bucket.all_reduces.len(), towers, "{what}: one per arena");
                for (t, (&arena, &k)) in bucket.arenas.iter().zip(&bucket.all_reduces).enumerate() {
                    assert_eq!(in_place(&p, k as usize), arena, "{what}");
                    assert!(k < bucket.kernel, "{what}: reduced before the update");
                    assert_eq!(scratch_device(&p, arena), t as u16, "tower t's arena");
                    let KernelKind::AllReduce { len, .. } = p.kernels[k as usize].kind else {
                        unreachable!("checked by in_place")
                    };
                    assert_eq!(len, bucket.len, "{what}: the whole arena");
                    // Nothing but its all-reduce and its update touches the arena as a whole:
                    // no copy in or out of it.
                    let readers: Vec<usize> = (0..p.kernels.len())
                        .filter(|&i| p.kernels[i].inputs.iter().any(|v| v.buffer == arena))
                        .collect();
                    assert_eq!(readers, vec![k as usize, bucket.kernel as usize], "{what}");
                }
            }
            assert!(
                !p.kernels
                    .iter()
                    .any(|k| matches!(k.kind, KernelKind::Concat { .. })),
                "{what}: no concatenation:\n{p}"
            );
        }
    }
}

#[test]
fn a_rank_runs_the_single_process_program_plus_one_all_reduce_per_bucket() {
    let single = build(&mut SimpleTrainer::new(), model(Variant::Momentum));
    let b = distributed(1, Variant::Momentum);
    for bucket_bytes in [1 << 20, 600] {
        let (one, rank) = (lowered(&single, bucket_bytes), lowered(&b, bucket_bytes));
        let mut want = one.kernel_histogram();
        want.push(("all_reduce", rank.buckets.len()));
        want.sort();
        assert_eq!(rank.kernel_histogram(), want, "{rank}");
        assert_eq!(
            rank.peak_bytes(),
            one.peak_bytes(),
            "no extra gradient memory"
        );
    }
}

#[test]
fn gradients_without_a_fused_update_are_all_reduced_in_place_in_buckets() {
    for towers in [1, 2] {
        let b = distributed(towers, Variant::ScaledBiases);
        // Parameters: fc0/W 512 bytes, fc0/b 64, linear/W 256, linear/b 16.
        for (bucket_bytes, per_tower) in [(1 << 20, 1..=1), (600, 2..=3), (4, 4..=4)] {
            let p = lowered(&b, bucket_bytes);
            assert!(p.buckets.is_empty(), "no fused update:\n{p}");
            let reduces = all_reduces(&p);
            let what = format!("{towers} tower(s), {bucket_bytes} bytes");
            assert!(
                per_tower.contains(&(reduces.len() / towers)),
                "{what}: {} all-reduces:\n{p}",
                reduces.len()
            );
            let mut elements = 0;
            for &i in &reduces {
                in_place(&p, i);
                let KernelKind::AllReduce { len, .. } = p.kernels[i].kind else {
                    unreachable!("checked by in_place")
                };
                assert!(4 * len <= bucket_bytes.max(512), "{what}: {len} elements");
                elements += len;
            }
            // fc0: 8·16 + 16, linear: 16·4 + 4 per tower.
            assert_eq!(elements, 212 * towers, "{what}: every gradient once");
        }
    }
}

/// A stand-in for the ranks of a job: "reduces" every element `x` to `3x + 1`, whatever the
/// layout, so any lost, doubled or misplaced reduction shows.
struct ThreeXPlusOne;

impl Collective for ThreeXPlusOne {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        2
    }
    fn all_reduce(&self, data: &mut [f32], op: ReduceOp) -> Result<(), BackendError> {
        assert_eq!(op, ReduceOp::Mean);
        for x in data {
            *x = 3.0 * *x + 1.0;
        }
        Ok(())
    }
}

/// `graph` with every all-reduce replaced by `3x + 1`, for the reference executor.
fn with_collective_written_in(graph: &Graph) -> Graph {
    let mut g = graph.clone();
    let reduces: Vec<_> = g
        .node_ids()
        .filter(|&id| matches!(g.node(id).op, Op::AllReduce { .. }))
        .collect();
    for id in reduces {
        let x = g.inputs(id)[0];
        let device = g.node(id).device;
        let name = g.node(id).name.clone();
        let mut node = |suffix: &str, op: Op, inputs: &[Value]| {
            let n = g.unique_name(&format!("{name}/{suffix}"));
            Value::first(g.add_node_on(&n, op, inputs, device).expect("node"))
        };
        let three = node(
            "three",
            Op::Constant {
                value: HostTensor::scalar_f32(3.0),
            },
            &[],
        );
        let one = node(
            "one",
            Op::Constant {
                value: HostTensor::scalar_f32(1.0),
            },
            &[],
        );
        let scaled = node("scaled", Op::Binary(BinaryOp::Mul), &[x, three]);
        let shifted = node("shifted", Op::Binary(BinaryOp::Add), &[scaled, one]);
        g.replace_all_uses(Value::first(id), shifted)
            .expect("rewire");
    }
    g
}

/// Runs 3 steps of `b` on `session` (joined to [`ThreeXPlusOne`]) and on the reference
/// executor with the collective written into the graph; the costs and every variable agree.
fn check_against_reference(b: &Built, session: &mut dyn Session, what: &str) {
    session
        .join_collective(Arc::new(ThreeXPlusOne))
        .expect("join");
    let mut reference =
        ReferenceSession::new(with_collective_written_in(&b.graph)).expect("reference");
    reference.initialize_variables(3).expect("init");
    session.initialize_variables(3).expect("init");
    for s in 0..3 {
        let f = feeds(b, s);
        let want = reference.run(&b.step, &f).expect("reference");
        let got = session.run(&b.step, &f).expect("compiled");
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            let (w, g) = (w.to_f64_vec(), g.to_f64_vec());
            let scale = w.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            for (x, y) in w.iter().zip(&g) {
                assert!(
                    (x - y).abs() < 1e-5 * scale,
                    "{what}: fetch {i}: {y} vs {x}"
                );
            }
        }
    }
    for (id, def) in b.graph.variable_ids() {
        let (w, g) = (
            reference.read_variable(id).expect("ref").to_f64_vec(),
            session.read_variable(id).expect("compiled").to_f64_vec(),
        );
        let scale = w.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        for (x, y) in w.iter().zip(&g) {
            assert!(
                (x - y).abs() <= 1e-5 * scale,
                "{what}: {}: {y} vs reference {x}",
                def.name
            );
        }
    }
}

fn lower_options() -> LowerOptions {
    LowerOptions {
        bucket_bytes: 600,
        ..LowerOptions::default()
    }
}

#[test]
fn compiled_distributed_steps_match_the_reference_with_the_collective_in_the_graph() {
    let variants = [
        Variant::Momentum,
        Variant::ClippedAdam,
        Variant::ScaledBiases,
    ];
    for (towers, variant) in [1, 2].into_iter().flat_map(|t| variants.map(|v| (t, v))) {
        let b = distributed(towers, variant);
        let options = CpuOptions {
            threads: 2,
            lower: lower_options(),
            ..CpuOptions::default()
        };
        let mut cpu = CpuSession::new(b.graph.clone(), options).expect("cpu");
        check_against_reference(
            &b,
            &mut cpu,
            &format!("cpu, {towers} tower(s), {variant:?}"),
        );
    }
}

#[test]
fn the_cuda_backend_runs_the_in_place_bucket_all_reduces_through_its_collective() {
    if let Err(e) = towerpack::backend::cuda::nvrtc::ensure_nvrtc() {
        panic!("this test needs NVRTC: {e} (pip install nvidia-cuda-nvrtc-cu12==12.9.86)");
    }
    for variant in [Variant::Momentum, Variant::ScaledBiases] {
        let b = distributed(2, variant);
        let options = CudaOptions {
            lower: lower_options(),
            cache_dir: None,
            ..CudaOptions::default()
        };
        let mut emu = CudaSession::emulated(b.graph.clone(), 2, options).expect("cuda-emu");
        check_against_reference(&b, &mut emu, &format!("cuda-emu, 2 towers, {variant:?}"));
    }
}

/// The program, then each bucket: its update kernel, its arenas and the all-reduce of each,
/// and its members at their offsets.
fn describe(b: &Built, p: &Program) -> String {
    let mut text = format!("{p}\nbuckets:\n");
    for bucket in &p.buckets {
        let arenas: Vec<String> = bucket
            .arenas
            .iter()
            .zip(&bucket.all_reduces)
            .map(|(a, k)| format!("{a} (all-reduced in place by k{k})"))
            .collect();
        let members: Vec<String> = (0..bucket.offsets.len())
            .map(|i| {
                let var = bucket.outputs[0][i];
                format!("{}@{}", b.graph.variable(var).name, bucket.offsets[i])
            })
            .collect();
        text.push_str(&format!(
            "  k{}: {} elements, arenas [{}], members [{}]\n",
            bucket.kernel,
            bucket.len,
            arenas.join(", "),
            members.join(", ")
        ));
    }
    text
}

#[test]
fn snapshot_of_a_two_tower_rank_program() {
    let b = distributed(2, Variant::Momentum);
    let p = lowered(&b, 600);
    insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("lower_distributed_two_tower_rank_program", describe(&b, &p));
    });
}

/// The value a step reading `name` at the start of the step fetches (a parameter summary).
fn variable_read(g: &Graph, name: &str) -> Value {
    let var = g.find_variable(name).expect("variable");
    g.node_ids()
        .find(|&id| matches!(g.node(id).op, Op::Variable { var: v } if v == var))
        .map(Value::first)
        .expect("read")
}

/// Tower 0's gradient of `name` before its all-reduce (a gradient summary).
fn gradient_before_all_reduce(g: &Graph, name: &str) -> Value {
    g.node_ids()
        .filter(|&id| {
            matches!(g.node(id).op, Op::AllReduce { .. })
                && g.node(id).name.ends_with(&format!("/{name}"))
        })
        .min()
        .map(|id| g.inputs(id)[0])
        .expect("all-reduce")
}

/// `(device, op, elements)` of every all-reduce kernel, in program order.
fn collective_sequence(p: &Program) -> Vec<(u16, ReduceOp, usize)> {
    all_reduces(p)
        .into_iter()
        .map(|i| match p.kernels[i].kind {
            KernelKind::AllReduce { op, len } => (p.kernels[i].device, op, len),
            _ => unreachable!("all_reduces"),
        })
        .collect()
}

/// The chief of a job fetches summaries the other ranks do not (a variable's value, a
/// gradient), which changes what its step fuses — an update whose variable is fetched is not
/// fused, a gradient that is fetched cannot be reduced in place — yet every rank must issue
/// the same all-reduces in the same order, or the job pairs different buffers (or hangs). The
/// chief's steps match the reference too: arenas that are a part of a bucket's range, and
/// members copied into the range, are reduced.
#[test]
fn ranks_whose_steps_differ_issue_the_same_all_reduces() {
    let mut parts = 0;
    for (towers, variant) in [
        (1, Variant::Momentum),
        (2, Variant::Momentum),
        (2, Variant::ClippedAdam),
        (2, Variant::ScaledBiases),
    ] {
        let b = distributed(towers, variant);
        let g = &b.graph;
        let summaries = [
            vec![variable_read(g, "fc0/b")],
            vec![variable_read(g, "linear/W")],
            vec![gradient_before_all_reduce(g, "linear/W")],
            vec![
                gradient_before_all_reduce(g, "fc0/W"),
                variable_read(g, "linear/b"),
            ],
        ];
        for bucket_bytes in [1 << 20, 600] {
            let options = LowerOptions {
                bucket_bytes,
                ..LowerOptions::default()
            };
            let worker = lower(g, &b.step, BATCH, &options).expect("lower");
            let want = collective_sequence(&worker);
            assert!(!want.is_empty(), "{worker}");
            for extra in &summaries {
                let mut fetches = b.step.fetches.clone();
                fetches.extend(extra.iter().copied());
                let step = Step::new(fetches, b.step.targets.clone());
                let chief = lower(g, &step, BATCH, &options).expect("lower");
                let what = format!(
                    "{towers} tower(s), {variant:?}, {bucket_bytes} bytes, chief also fetches {}",
                    extra
                        .iter()
                        .map(|&v| g.value_name(v))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                assert_eq!(
                    collective_sequence(&chief),
                    want,
                    "{what}:\nworker:\n{worker}\nchief:\n{chief}"
                );
                for &k in &all_reduces(&chief) {
                    in_place(&chief, k);
                }
                for bucket in &chief.buckets {
                    // Arenas of all-reduced gradients each lie in a reduced range (with
                    // clipping, the update reads the clipped average instead).
                    let reduced = !matches!(variant, Variant::ClippedAdam);
                    let want_reduces = if reduced { bucket.arenas.len() } else { 0 };
                    assert_eq!(bucket.all_reduces.len(), want_reduces, "{what}");
                    for (&arena, &k) in bucket.arenas.iter().zip(&bucket.all_reduces) {
                        assert!(k < bucket.kernel, "{what}: reduced before the update");
                        let range = chief.kernels[k as usize].outputs[0];
                        let (
                            Storage::Scratch { offset: a, .. },
                            Storage::Scratch { offset: r, .. },
                        ) = (chief.buffer(arena).storage, chief.buffer(range).storage)
                        else {
                            panic!("{what}: scratch arenas");
                        };
                        let (a_len, r_len) = (
                            chief.buffer(arena).shape.iter().product::<usize>(),
                            chief.buffer(range).shape.iter().product::<usize>(),
                        );
                        assert!(
                            r <= a && a + 4 * a_len <= r + 4 * r_len,
                            "{what}: {arena} lies in {range}"
                        );
                        parts += usize::from(a_len < r_len);
                    }
                }
                if bucket_bytes == 600 {
                    let chief_built = Built {
                        graph: g.clone(),
                        step,
                        towers: b.towers.clone(),
                        signature: b.signature.clone(),
                    };
                    let mut cpu = CpuSession::new(
                        g.clone(),
                        CpuOptions {
                            threads: 2,
                            lower: options,
                            ..CpuOptions::default()
                        },
                    )
                    .expect("cpu");
                    check_against_reference(&chief_built, &mut cpu, &what);
                }
            }
        }
    }
    assert!(
        parts > 0,
        "some fused update reads a part of a bucket's range"
    );
}
