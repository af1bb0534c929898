//! Whole training steps on the emulated CUDA device (or the GPU: `TOWERPACK_TEST_CUDA=gpu`): an
//! MLP trained by the simple trainer, and a two-tower replicated MLP spread over two devices
//! (gradients averaged across them), end with the same weights as the CPU backend; a bad label
//! is reported by the device. Steps captured once as a graph and replayed end with bitwise the
//! same variables as steps submitted launch by launch, see every step's new feeds, and fall
//! back cleanly when capture is unavailable; scratch memory starts poisoned.

use crate::cuda_common;
use crate::train_common;

use towerpack::autodiff::gradients;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::backend::{BackendError, Feed, Session, Step};
use towerpack::dsl::{Replication, Strategy, replicate};
use towerpack::ir::{BinaryOp, Graph, NodeId, Op, Value};
use towerpack::models::Mlp;
use towerpack::optim::Optimizer;
use towerpack::tensor::HostTensor;
use towerpack::train::{
    BackendChoice, ParameterServerTrainer, ReplicatedTrainer, SimpleTrainer,
    launch_train_with_config,
};

fn options() -> CudaOptions {
    CudaOptions {
        cache_dir: None,
        ..CudaOptions::default()
    }
}

/// Every variable of `a` within `tol` of `b` (relative to the variable's largest magnitude).
fn assert_same_variables(a: &dyn Session, b: &dyn Session, tol: f64) {
    for (id, def) in a.graph().variable_ids() {
        let (x, y) = (
            a.read_variable(id).expect("read").to_f64_vec(),
            b.read_variable(id).expect("read").to_f64_vec(),
        );
        assert_eq!(x.len(), y.len(), "{}: element counts", def.name);
        let scale = y.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            assert!(
                (p - q).abs() <= tol * scale,
                "{}[{i}]: cuda-emu {p} vs cpu {q} (scale {scale})",
                def.name
            );
        }
    }
}

#[test]
fn the_simple_trainer_trains_an_mlp_on_the_emulated_device_like_the_cpu_backend() {
    cuda_common::require_nvrtc();
    let run = |backend: BackendChoice| {
        let c = train_common::bare(train_common::config(
            train_common::mlp_model(0.1),
            train_common::train_flow(96, 32, 3),
            None,
        ))
        .backend(backend)
        .max_epoch(2);
        launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train")
    };
    let emu = run(cuda_common::backend(1));
    let cpu = run(BackendChoice::Cpu { threads: 2 });
    assert_eq!(emu.counters.global_step, 6);
    let moved = {
        let (id, _) = cpu
            .session
            .graph()
            .variable_ids()
            .next()
            .expect("a variable");
        let fresh = CpuSession::new(cpu.session.graph().clone(), CpuOptions::default());
        let mut fresh = fresh.expect("cpu");
        fresh.initialize_variables(7).expect("init");
        fresh.read_variable(id).expect("read") != cpu.session.read_variable(id).expect("read")
    };
    assert!(moved, "training changed the weights");
    assert_same_variables(&*emu.session, &*cpu.session, 1e-4);
}

/// The data-parallel trainers put their towers on CUDA devices through the same placement as on
/// the CPU: replicated and parameter-server training on two emulated devices (the fused
/// per-bucket averaging kernel rendered to CUDA, reading the other device's gradient arena)
/// ends with the CPU backend's weights.
#[test]
fn data_parallel_trainers_on_two_emulated_devices_train_like_the_cpu_backend() {
    cuda_common::require_nvrtc();
    let run = |backend: BackendChoice, replicated: bool| {
        let c = train_common::bare(train_common::config(
            train_common::mlp_model(0.1),
            train_common::train_flow(96, 16, 3),
            None,
        ))
        .backend(backend)
        .max_epoch(1);
        let report = if replicated {
            launch_train_with_config(c, &mut ReplicatedTrainer::new(2))
        } else {
            launch_train_with_config(c, &mut ParameterServerTrainer::new(2))
        };
        report.expect("train")
    };
    if !cuda_common::has_devices(2, "data_parallel_trainers") {
        return;
    }
    for replicated in [true, false] {
        let emu = run(cuda_common::backend(2), replicated);
        let cpu = run(BackendChoice::Cpu { threads: 2 }, replicated);
        // steps_per_epoch is the flow's length (6 batches), whatever the tower count.
        assert_eq!(emu.counters.global_step, 6);
        assert_same_variables(&*emu.session, &*cpu.session, 1e-4);
    }
}

/// A two-tower replicated MLP: tower `t` on logical device `t` with its own variables, the
/// gradients of both towers averaged on device 0, and both replicas updated with the average
/// (tower 1's update reads the average across devices).
struct Replicated {
    graph: Graph,
    step: Step,
    inputs: Vec<Vec<(String, NodeId)>>,
}

fn replicated_mlp() -> Replicated {
    let m = Mlp {
        input_shape: vec![6, 6],
        hidden: vec![16],
        classes: 10,
        weight_decay: 1e-4,
        dropout_rate: 0.0,
    };
    let r = replicate(
        &m.inputs(),
        &Replication::new(2, Strategy::Replicated),
        |x| m.build(x),
    )
    .expect("replicate");
    let mut g = r.graph;
    let mut per_tower = Vec::new();
    let mut costs = Vec::new();
    for t in &r.training {
        let cost = t.cost.expect("cost");
        costs.push(cost);
        let vars = t.gradient_variables(&g);
        per_tower.push(
            gradients(
                &mut g,
                cost,
                &vars,
                &format!("gradients{}", per_tower.len()),
            )
            .expect("grads")
            .grads,
        );
    }
    let half = Value::first(
        g.add_node_on(
            "average/half",
            Op::Constant {
                value: HostTensor::scalar_f32(0.5),
            },
            &[],
            Some(0),
        )
        .expect("constant"),
    );
    let mut averaged: Vec<Vec<(towerpack::ir::VarId, Value)>> = vec![Vec::new(), Vec::new()];
    for (j, ((v0, g0), (v1, g1))) in per_tower[0].iter().zip(&per_tower[1]).enumerate() {
        let sum = g
            .add_node_on(
                &format!("average/sum{j}"),
                Op::Binary(BinaryOp::Add),
                &[*g0, *g1],
                Some(0),
            )
            .expect("sum");
        let avg = g
            .add_node_on(
                &format!("average/mean{j}"),
                Op::Binary(BinaryOp::Mul),
                &[Value::first(sum), half],
                Some(0),
            )
            .expect("mean");
        averaged[0].push((*v0, Value::first(avg)));
        averaged[1].push((*v1, Value::first(avg)));
    }
    let opt = Optimizer::momentum(0.1, 0.9);
    let mut targets = Vec::new();
    for (t, grads) in averaged.iter().enumerate() {
        targets.push(
            opt.apply_gradients(&mut g, grads, &format!("train_op{t}"))
                .expect("apply")
                .train_op,
        );
    }
    Replicated {
        step: Step::new(costs, targets),
        inputs: r.training.iter().map(|t| t.inputs.clone()).collect(),
        graph: g,
    }
}

fn replicated_feeds(r: &Replicated, step: u64) -> Vec<Feed> {
    let mut out = Vec::new();
    for (t, inputs) in r.inputs.iter().enumerate() {
        let mut s = step * 31 + t as u64;
        let mut next = move || {
            s = towerpack::ir::rng::mix64(s.wrapping_add(1));
            s
        };
        for (name, id) in inputs {
            let t = if name == "label" {
                HostTensor::from_i32(&[4], (0..4).map(|_| (next() % 10) as i32).collect())
            } else {
                HostTensor::from_f32(
                    &[4, 6, 6],
                    (0..144)
                        .map(|_| (next() >> 40) as f32 / 16_777_216.0)
                        .collect(),
                )
            };
            out.push((*id, t.expect("sized")));
        }
    }
    out
}

#[test]
fn a_replicated_mlp_on_two_emulated_devices_averages_like_the_cpu_backend() {
    cuda_common::require_nvrtc();
    if !cuda_common::has_devices(2, "a_replicated_mlp") {
        return;
    }
    let r = replicated_mlp();
    let mut emu = cuda_common::session(r.graph.clone(), 2, options());
    let mut cpu = CpuSession::new(r.graph.clone(), CpuOptions::default()).expect("cpu");
    emu.initialize_variables(5).expect("init");
    cpu.initialize_variables(5).expect("init");
    // Replicas start equal (as a replicated trainer's initial broadcast makes them).
    for s in [&mut emu as &mut dyn Session, &mut cpu as &mut dyn Session] {
        let g = s.graph().clone();
        for (id, def) in g.variable_ids() {
            if let Some(base) = def.name.strip_prefix("tower1/") {
                let src = g.find_variable(base).expect("tower 0 replica");
                let v = s.read_variable(src).expect("read");
                s.write_variable(id, &v).expect("write");
            }
        }
    }
    let program = emu.program(&r.step, 4).expect("program").clone();
    assert_eq!(program.devices(), 2, "{program}");
    assert!(
        program.waits.iter().any(|w| !w.is_empty()),
        "devices synchronise:\n{program}"
    );
    for step in 0..3 {
        let feeds = replicated_feeds(&r, step);
        let a = emu.run(&r.step, &feeds).expect("emu step");
        let b = cpu.run(&r.step, &feeds).expect("cpu step");
        for (x, y) in a.iter().zip(&b) {
            let (x, y) = (
                x.scalar_value().expect("cost"),
                y.scalar_value().expect("cost"),
            );
            assert!(
                (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                "step {step}: cost {x} vs {y}"
            );
        }
    }
    assert_same_variables(&emu, &cpu, 1e-5);
    // The replicas stayed identical: both applied the same averaged gradient.
    let g = emu.graph().clone();
    for (id, def) in g.variable_ids() {
        if let Some(base) = def.name.strip_prefix("tower1/") {
            let src = g.find_variable(base).expect("tower 0 replica");
            assert_eq!(
                emu.read_variable(id).expect("read"),
                emu.read_variable(src).expect("read"),
                "{}",
                def.name
            );
        }
    }
}

#[test]
fn a_label_out_of_range_is_reported_by_the_device_naming_the_kernel() {
    cuda_common::require_nvrtc();
    let tg = cuda_common::mlp();
    let mut emu = cuda_common::session(tg.graph.clone(), 1, options());
    emu.initialize_variables(1).expect("init");
    let mut feeds = cuda_common::feeds(&tg, 4, 9);
    for (id, t) in feeds.iter_mut() {
        if tg.inputs.iter().any(|(n, i)| n == "label" && i == id) {
            *t = HostTensor::from_i32(&[4], vec![1, 2, 12, 3]).expect("labels");
        }
    }
    match emu.run(&tg.step, &feeds) {
        Err(BackendError::Kernel { node, message, .. }) => {
            assert!(
                node.contains("SparseSoftmaxCrossEntropy"),
                "{node}: {message}"
            );
            assert!(message.contains("row 2"), "{message}");
        }
        other => panic!("expected the device to report the label: {other:?}"),
    }
}

/// A stand-in for a two-process job: every participant holds the same data, so a sum doubles.
struct TwoEqualRanks;

impl towerpack::backend::Collective for TwoEqualRanks {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        2
    }
    fn all_reduce(
        &self,
        data: &mut [f32],
        _op: towerpack::ir::ReduceOp,
    ) -> Result<(), BackendError> {
        data.iter_mut().for_each(|x| *x *= 2.0);
        Ok(())
    }
}

#[test]
fn all_reduce_kernels_go_through_the_sessions_collective() {
    cuda_common::require_nvrtc();
    let mut g = Graph::new();
    let ty = towerpack::ir::TensorType::new(
        towerpack::tensor::DType::F32,
        towerpack::ir::Shape::batched(&[3]),
    );
    let x = g
        .add_node(
            "x",
            Op::Input {
                name: "x".into(),
                ty,
            },
            &[],
        )
        .expect("input");
    let y = g
        .add_node(
            "y",
            Op::AllReduce {
                op: towerpack::ir::ReduceOp::Sum,
            },
            &[Value::first(x)],
        )
        .expect("all-reduce");
    let step = Step::fetch(vec![Value::first(y)]);
    let feeds = vec![(
        x,
        HostTensor::from_f32(&[2, 3], vec![1.0, -2.0, 3.5, 0.0, 7.0, -0.25]).expect("x"),
    )];
    let mut emu = cuda_common::session(g.clone(), 1, options());
    let alone = emu.run(&step, &feeds).expect("alone");
    assert_eq!(alone[0], feeds[0].1, "one participant: the identity");
    emu.join_collective(std::sync::Arc::new(TwoEqualRanks))
        .expect("join");
    let joined = emu.run(&step, &feeds).expect("joined");
    assert_eq!(
        joined[0].to_f32_vec(),
        vec![2.0, -4.0, 7.0, 0.0, 14.0, -0.5]
    );
}

/// Trains `tg` for `steps` steps at `batch` with fresh feeds every step; returns the session
/// and every step's fetched cost.
fn train_directly(
    tg: &cuda_common::TrainGraph,
    batch: usize,
    steps: u64,
    options: CudaOptions,
) -> (CudaSession, Vec<u32>) {
    let mut s = cuda_common::session(tg.graph.clone(), 1, options);
    s.initialize_variables(3).expect("init");
    let mut costs = Vec::new();
    for step in 0..steps {
        let out = s
            .run(&tg.step, &cuda_common::feeds(tg, batch, 100 + step))
            .expect("step");
        let cost = out[0].as_f32().expect("f32 cost")[0];
        costs.push(cost.to_bits());
    }
    (s, costs)
}

fn assert_bitwise_same_variables(a: &dyn Session, b: &dyn Session) {
    for (id, def) in a.graph().variable_ids() {
        let (x, y) = (
            a.read_variable(id).expect("read"),
            b.read_variable(id).expect("read"),
        );
        assert!(
            x.to_le_bytes() == y.to_le_bytes(),
            "{}: graph replay and launch-by-launch submission differ",
            def.name
        );
    }
}

#[test]
fn steps_replayed_as_a_graph_train_bitwise_like_steps_submitted_launch_by_launch() {
    cuda_common::require_nvrtc();
    for (tg, batch, steps) in [(cuda_common::mlp(), 4, 4), (cuda_common::resnet20(), 2, 2)] {
        let graphs = |on: bool| CudaOptions {
            graphs: on,
            ..options()
        };
        let (replayed, with) = train_directly(&tg, batch, steps, graphs(true));
        let (submitted, without) = train_directly(&tg, batch, steps, graphs(false));
        assert_eq!(
            replayed.graph_replays(),
            steps,
            "every step ran as a replayed graph ({:?})",
            replayed.graph_fallback()
        );
        assert_eq!(submitted.graph_replays(), 0);
        // Every step's cost is the same bits: the replayed graph saw that step's feeds.
        assert_eq!(with, without, "costs per step");
        assert!(
            with.windows(2).all(|w| w[0] != w[1]),
            "the costs change from step to step: {with:?}"
        );
        assert_bitwise_same_variables(&replayed, &submitted);
    }
}

/// A step whose only fetch is its feed: whatever the graph replays, it must return the feed of
/// the current step.
#[test]
fn a_replayed_graph_sees_the_feeds_of_every_step() {
    cuda_common::require_nvrtc();
    let mut g = Graph::new();
    let ty = towerpack::ir::TensorType::new(
        towerpack::tensor::DType::F32,
        towerpack::ir::Shape::batched(&[5]),
    );
    let x = g
        .add_node(
            "x",
            Op::Input {
                name: "x".into(),
                ty,
            },
            &[],
        )
        .expect("input");
    let y = g
        .add_node(
            "y",
            Op::Binary(BinaryOp::Add),
            &[Value::first(x), Value::first(x)],
        )
        .expect("add");
    let step = Step::fetch(vec![Value::first(y)]);
    let mut s = cuda_common::session(g, 1, options());
    for k in 0..4u8 {
        let values: Vec<f32> = (0..15).map(|i| f32::from(k) * 100.0 + i as f32).collect();
        let feed = HostTensor::from_f32(&[3, 5], values.clone()).expect("x");
        let out = s.run(&step, &[(x, feed)]).expect("step");
        let want: Vec<f32> = values.iter().map(|v| v + v).collect();
        assert_eq!(out[0].to_f32_vec(), want, "step {k}");
    }
    assert_eq!(s.graph_replays(), 4);
}

/// `EmulatedDriver::set_host_only`: the session, its graph and its fetches run as ever, the
/// device executes nothing (what `TOWERPACK_EMU_HOST_ONLY` times: the host's share of a step).
#[test]
fn a_host_only_emulated_device_replays_steps_without_executing_them() {
    use towerpack::backend::cuda::driver::Driver;
    use towerpack::backend::cuda::driver::emulated::EmulatedDriver;
    cuda_common::require_nvrtc();
    let tg = cuda_common::mlp();
    // The costs of three steps, and the lane-instructions the device executed in them.
    let run = |host_only: bool| {
        let driver = std::sync::Arc::new(EmulatedDriver::new(1));
        let mut s =
            CudaSession::with_driver(tg.graph.clone(), driver.clone(), options()).expect("session");
        s.initialize_variables(3).expect("init");
        driver.set_host_only(host_only);
        let before = driver.lane_instructions().expect("counted");
        let costs: Vec<f32> = (0..3)
            .map(|step| {
                let out = s
                    .run(&tg.step, &cuda_common::feeds(&tg, 4, 100 + step))
                    .expect("step");
                out[0].as_f32().expect("f32")[0]
            })
            .collect();
        assert_eq!(s.graph_replays(), 3);
        (costs, driver.lane_instructions().expect("counted") - before)
    };
    let (costs, lanes) = run(false);
    assert!(costs.iter().all(|c| c.is_finite() && *c > 0.0), "{costs:?}");
    assert!(lanes > 0);
    let (costs, lanes) = run(true);
    assert_eq!(lanes, 0);
    // Nothing was downloaded into the fetch's pinned memory: it still holds its zeros.
    assert_eq!(costs, vec![0.0; 3]);
}

#[test]
fn without_graphs_on_the_device_a_step_falls_back_to_launch_by_launch_submission() {
    cuda_common::require_nvrtc();
    let tg = cuda_common::mlp();
    let driver = towerpack::backend::cuda::driver::emulated::EmulatedDriver::new(1);
    driver.set_graphs_available(false);
    let mut s = CudaSession::with_driver(tg.graph.clone(), std::sync::Arc::new(driver), options())
        .expect("session");
    s.initialize_variables(3).expect("init");
    let mut costs = Vec::new();
    for step in 0..3 {
        let out = s
            .run(&tg.step, &cuda_common::feeds(&tg, 4, 100 + step))
            .expect("step");
        costs.push(out[0].as_f32().expect("f32")[0].to_bits());
    }
    assert_eq!(s.graph_replays(), 0);
    let why = s.graph_fallback().expect("a reason");
    assert!(why.contains("graphs are disabled"), "{why}");
    let (replayed, with) = train_directly(&tg, 4, 3, options());
    assert_eq!(costs, with);
    assert_bitwise_same_variables(&s, &replayed);
}

/// A replayed step that fetches nothing is not waited for; a device error it reports surfaces
/// at the next synchronisation, naming the kernel.
#[test]
fn an_error_of_a_step_that_fetches_nothing_is_reported_at_the_next_synchronisation() {
    cuda_common::require_nvrtc();
    let mut tg = cuda_common::mlp();
    // The cost is assigned to a variable, not fetched: its cross-entropy kernel checks the
    // labels.
    let last = towerpack::optim::get_or_create(
        &mut tg.graph,
        "last_cost",
        towerpack::ir::TensorType::scalar(towerpack::tensor::DType::F32),
        towerpack::ir::Initializer::Zeros,
        Default::default(),
    )
    .expect("variable");
    let keep = tg
        .graph
        .add_node(
            "last_cost/assign",
            Op::Assign { var: last },
            &[tg.step.fetches[0]],
        )
        .expect("assign");
    let mut targets = tg.step.targets.clone();
    targets.push(keep);
    let quiet = Step::new(Vec::new(), targets);
    let mut s = cuda_common::session(tg.graph.clone(), 1, options());
    s.initialize_variables(1).expect("init");
    let good = cuda_common::feeds(&tg, 4, 1);
    assert!(s.run(&quiet, &good).expect("a good step").is_empty());
    let mut bad = good.clone();
    for (id, t) in bad.iter_mut() {
        if tg.inputs.iter().any(|(n, i)| n == "label" && i == id) {
            *t = HostTensor::from_i32(&[4], vec![1, 2, 3, 99]).expect("labels");
        }
    }
    // Replayed and not waited for: no error yet.
    s.run(&quiet, &bad).expect("the step is submitted");
    assert_eq!(s.graph_replays(), 2);
    let (var, _) = tg.graph.variable_ids().next().expect("a variable");
    match s.read_variable(var) {
        Err(BackendError::Kernel { node, message, .. }) => {
            assert!(
                node.contains("SparseSoftmaxCrossEntropy"),
                "{node}: {message}"
            );
            assert!(message.contains("row 3"), "{message}");
        }
        other => panic!("expected the device's report at the next read: {other:?}"),
    }
    // Reported once: the session goes on.
    s.read_variable(var).expect("read after the report");
    s.run(&quiet, &good).expect("a good step after");
    s.read_variable(var).expect("read");
}

/// The scratch memory of a prepared program starts filled with the poison pattern on the
/// emulated device, so a kernel reading a value no kernel wrote computes with NaN.
#[test]
fn scratch_memory_starts_poisoned_on_the_emulated_device() {
    cuda_common::require_nvrtc();
    let tg = cuda_common::mlp();
    let mut s = CudaSession::emulated(tg.graph.clone(), 1, options()).expect("emu");
    let mut program = s.program(&tg.step, 4).expect("program").clone();
    let b = program
        .kernels
        .iter()
        .flat_map(|k| k.outputs.iter().copied())
        .find(|&b| {
            matches!(
                program.buffer(b).storage,
                towerpack::lower::Storage::Scratch { .. }
            )
        })
        .expect("a scratch buffer");
    program.kernels.clear();
    program.waits.clear();
    program.writebacks.clear();
    let out = s.run_program(program, &[], &[b]).expect("run nothing");
    let bytes = out[0].to_le_bytes();
    assert!(!bytes.is_empty());
    for w in bytes.chunks_exact(4) {
        assert_eq!(
            u32::from_le_bytes([w[0], w[1], w[2], w[3]]),
            towerpack::backend::cuda::driver::POISON_WORD
        );
    }
}

/// `NonFiniteGuard` on the device (the emulated one, or the GPU with
/// `TOWERPACK_TEST_CUDA=gpu`): its join, count and record run as CUDA kernels, and the run
/// stops naming the gradient and the step where it first went NaN — step 13 of `sqrt(w·x)` fed
/// `x = 0` in batch 12 (a finite loss, a 0/0 gradient) — found at the step-21 check, while the
/// NaN weights made every later loss NaN too.
#[test]
fn the_non_finite_guard_names_the_first_bad_step_on_the_device() {
    use towerpack::data::{BatchData, DataFromList};
    use towerpack::dsl::prelude::*;
    use towerpack::train::callbacks::NonFiniteGuard;
    use towerpack::train::{ModelFn, TrainConfig, TrainError};
    cuda_common::require_nvrtc();
    let inputs = vec![InputSpec::new(
        "x",
        towerpack::tensor::DType::F32,
        towerpack::ir::Shape::batched(&[1]),
    )];
    let tower = |x: &[Tensor]| {
        let w = get_variable(
            "w",
            &VarSpec::new(&[1]).init(towerpack::ir::Initializer::Ones),
        );
        (&w * &x[0]).sqrt().mean().named("cost")
    };
    let items = (0..30 * 4)
        .map(|i| {
            let x = if i / 4 == 12 { 0.0 } else { 1.0 };
            vec![HostTensor::from_f32(&[1], vec![x]).expect("x")]
        })
        .collect();
    let flow = BatchData::new(DataFromList::new(items), 4, false).expect("batch");
    let model = ModelFn::new(inputs, tower, Optimizer::sgd(0.05));
    let c = train_common::bare(TrainConfig::new(model).dataflow(flow))
        .backend(cuda_common::backend(1))
        .callback(NonFiniteGuard::new())
        .max_epoch(1);
    match launch_train_with_config(c, &mut SimpleTrainer::new()).err() {
        Some(TrainError::NonFinite {
            tensor,
            global_step,
        }) => assert_eq!((tensor.as_str(), global_step), ("the gradient of `w`", 13)),
        other => panic!("expected a non-finite gradient, got {other:?}"),
    }
}
