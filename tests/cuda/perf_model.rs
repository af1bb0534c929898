//! The GPU performance model (`towerpack::backend::cuda::perf`), without a GPU:
//!
//! - **calibration**: the old kernels (before the multi-block rewrite) are predicted within 2×
//!   of what Nsight Compute measured on an H100 (`tests/perf/gpu-h100-ncu-resnet20-b128.csv`,
//!   700 launches of ResNet-20 at batch 128, copied from `shared/reference/`) for the kernels
//!   that account for 95% of the time. The work of those launches is the fixture
//!   `tests/perf/resnet20_b128_old_kernels.jsonl`, measured on the emulated device from the
//!   kernels of that commit (regenerate with `--ignored regenerate`; it then checks that the
//!   lowered step launches what the CSV lists, in order);
//! - **the launch report** of the ResNet-20 b128 training step, snapshotted;
//! - **no launch leaves the GPU mostly idle** (fewer blocks than SMs with more than a million
//!   lane-iterations of work) in the example programs — ignored until the multi-block kernels of
//!   branch gpuk land.

use crate::cuda_common;
#[path = "../../examples/common/launch_report.rs"]
mod launch_report;

use std::sync::Arc;
use towerpack::backend::cuda::nvrtc::{self, Compiler};
use towerpack::backend::cuda::perf::{self, BlockCounts, H100_SXM, Launch};
use towerpack::backend::cuda::render::launch::{ReduceLaunch, Split, Target, reduce_launch};
use towerpack::backend::cuda::render::{self, KernelPlan};
use towerpack::lower::KernelKind;
use towerpack::models::{CifarResNet, ConvNet, Mlp};
use towerpack::optim::Optimizer;
use towerpack::train::{ModelDesc, ModelFn};

const CSV: &str = include_str!("../perf/gpu-h100-ncu-resnet20-b128.csv");
const FIXTURE: &str = "tests/perf/resnet20_b128_old_kernels.jsonl";

/// The resnet example's model (`examples/resnet.rs`: momentum 0.9, learning rate 0.01).
fn resnet20() -> Arc<dyn ModelDesc> {
    let net = CifarResNet::new(3);
    Arc::new(ModelFn::new(
        net.inputs(),
        move |x| net.build(x),
        Optimizer::momentum(0.01, 0.9),
    ))
}

/// The mnist example's models (`examples/mnist.rs`).
fn mnist_mlp() -> Arc<dyn ModelDesc> {
    let mlp = Mlp {
        input_shape: vec![28, 28, 1],
        hidden: vec![256],
        ..Mlp::default()
    };
    Arc::new(ModelFn::new(
        mlp.inputs(),
        move |x| mlp.build(x),
        Optimizer::momentum(0.1, 0.9),
    ))
}

fn mnist_convnet() -> Arc<dyn ModelDesc> {
    let net = ConvNet {
        dropout_rate: 0.25,
        ..ConvNet::default()
    };
    Arc::new(ModelFn::new(
        net.inputs(),
        move |x| net.build(x),
        Optimizer::momentum(0.05, 0.9),
    ))
}

/// One launch Nsight Compute measured.
#[derive(Debug)]
struct Measured {
    kernel: String,
    grid: [u32; 3],
    block: [u32; 3],
    registers: u32,
    shared_bytes: u32,
    ns: f64,
}

/// The fields of a CSV line (quoted fields may hold commas).
fn fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for ch in line.chars() {
        match ch {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

fn triple(s: &str) -> [u32; 3] {
    let v: Vec<u32> = s
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .map(|x| x.trim().parse().expect("a dimension"))
        .collect();
    [v[0], v[1], v[2]]
}

fn measured() -> Vec<Measured> {
    let mut lines = CSV.lines();
    let header = fields(lines.next().expect("header"));
    let col = |name: &str| header.iter().position(|h| h == name).expect(name);
    let (k, g, b, r, s, t) = (
        col("kernel"),
        col("grid"),
        col("block"),
        col("registers"),
        col("shared_bytes"),
        col("time_ns"),
    );
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f = fields(l);
            let number = |i: usize| f[i].replace(',', "").parse::<f64>().expect("a number");
            Measured {
                kernel: f[k].clone(),
                grid: triple(&f[g]),
                block: triple(&f[b]),
                registers: number(r) as u32,
                shared_bytes: number(s) as u32,
                ns: number(t),
            }
        })
        .collect()
}

/// One launch of the old kernels' ResNet-20 b128 step, as the fixture records it.
#[derive(Debug, serde::Deserialize, serde::Serialize)]
struct OldLaunch {
    name: String,
    entry: String,
    grid: [u32; 3],
    block: [u32; 3],
    dynamic_shared: u32,
    flops: f64,
    dram_bytes: f64,
    lane_iterations: f64,
    warp_instructions: f64,
    load_epochs: f64,
    shared_wavefronts: f64,
    global_sectors: f64,
}

fn fixture() -> Vec<OldLaunch> {
    let text = std::fs::read_to_string(FIXTURE).expect("the fixture (regenerate: --ignored)");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("a fixture line"))
        .collect()
}

/// Measures the ResNet-20 b128 step of the kernels of this checkout into the fixture, and
/// checks that it launches what Nsight Compute measured, in order. Run by hand on the commit
/// whose kernels the CSV measured: `cargo test --release --test cuda perf_model:: -- --ignored
/// regenerate`.
#[test]
#[ignore = "regenerates tests/perf/resnet20_b128_old_kernels.jsonl from this checkout's kernels"]
fn regenerate_the_old_kernel_fixture() {
    cuda_common::require_nvrtc();
    let program = launch_report::training_program(resnet20(), 128, 1).expect("program");
    let compiler = Compiler::new(nvrtc::default_cache_dir()).expect("nvrtc");
    let launches = perf::measure::measure(&program, &compiler).expect("measure");
    let mut text = String::new();
    let mut old = Vec::new();
    for m in &launches {
        let k = &program.kernels[m.kernel];
        let KernelPlan::Launch(r) = render::render_kernel(&program, m.kernel).expect("render")
        else {
            unreachable!("a measured launch launches")
        };
        let w = perf::kernel_work(&program, k);
        let o = OldLaunch {
            name: k.name.clone(),
            entry: r.body.entry().to_string(),
            grid: m.dims.grid,
            block: m.dims.block,
            dynamic_shared: m.dims.shared_bytes,
            flops: w.flops,
            dram_bytes: w.dram_bytes,
            lane_iterations: w.lane_iterations,
            warp_instructions: m.counts.warp_instructions,
            load_epochs: m.counts.load_epochs,
            shared_wavefronts: m.counts.shared_wavefronts,
            global_sectors: m.counts.global_sectors,
        };
        text += &serde_json::to_string(&o).expect("json");
        text.push('\n');
        old.push(o);
    }
    check_alignment(&old);
    std::fs::write(FIXTURE, text).expect("write the fixture");
}

/// The CSV's launch `i` is launch `i mod L` of the step (ncu timed the first steps in order).
fn check_alignment(old: &[OldLaunch]) {
    for (i, m) in measured().iter().enumerate() {
        let o = &old[i % old.len()];
        assert!(
            o.entry == m.kernel && o.grid == m.grid && o.block == m.block,
            "CSV launch {i} is {} {:?}, the step's launch {} is {} {:?} `{}`",
            m.kernel,
            m.grid,
            i % old.len(),
            o.entry,
            o.grid,
            o.name
        );
    }
}

/// Per kernel of the step (its launches averaged over the steps the CSV holds): measured µs,
/// predicted µs, launches.
fn calibration() -> Vec<(usize, f64, f64, usize)> {
    let old = fixture();
    check_alignment(&old);
    let mut per_kernel: Vec<(usize, f64, f64, usize)> =
        (0..old.len()).map(|k| (k, 0.0, 0.0, 0)).collect();
    for (i, m) in measured().iter().enumerate() {
        let o = &old[i % old.len()];
        let launch = Launch {
            grid: m.grid,
            block: m.block,
            shared_bytes: m.shared_bytes + o.dynamic_shared,
            registers: Some(m.registers),
            flops: o.flops,
            tensor_flops: 0.0,
            half_tensor_flops: 0.0,
            dram_bytes: o.dram_bytes,
            block_counts: Some(BlockCounts {
                warp_instructions: o.warp_instructions,
                load_epochs: o.load_epochs,
                shared_wavefronts: o.shared_wavefronts,
                global_sectors: o.global_sectors,
            }),
        };
        let p = perf::predict(&H100_SXM, &launch);
        let e = &mut per_kernel[i % old.len()];
        e.1 += m.ns / 1e3;
        e.2 += p.us;
        e.3 += 1;
    }
    per_kernel.retain(|e| e.3 > 0);
    per_kernel
        .iter()
        .map(|&(k, m, p, n)| (k, m / n as f64, p / n as f64, n))
        .collect()
}

/// The old kernels that account for 95% of the measured time are predicted within 2× of
/// Nsight Compute's times on an H100 (each kernel of the step: its launches averaged).
#[test]
fn the_model_predicts_the_measured_old_kernels_within_2x() {
    let old = fixture();
    let mut rows = calibration();
    let total: f64 = rows.iter().map(|r| r.1 * r.3 as f64).sum();
    let predicted: f64 = rows.iter().map(|r| r.2 * r.3 as f64).sum();
    rows.sort_by(|a, b| (b.1 * b.3 as f64).total_cmp(&(a.1 * a.3 as f64)));
    let mut covered = 0.0;
    let mut table = String::from(
        "share  kernel                       grid  measured µs  predicted µs  ratio  name\n",
    );
    let mut outside = Vec::new();
    for &(k, m, p, n) in &rows {
        if covered >= 0.95 * total {
            break;
        }
        covered += m * n as f64;
        let ratio = p / m;
        table += &format!(
            "{:>5.1}% {:<28} {:>4} {:>12.1} {:>13.1} {:>6.2}  {}\n",
            100.0 * m * n as f64 / total,
            old[k].entry,
            old[k].grid[0],
            m,
            p,
            ratio,
            old[k].name
        );
        if !(0.5..=2.0).contains(&ratio) {
            outside.push(format!("{} `{}`: {ratio:.2}", old[k].entry, old[k].name));
        }
    }
    table += &format!(
        "all {} launches: measured {:.1} ms, predicted {:.1} ms ({:.2})\n",
        measured().len(),
        total / 1e3,
        predicted / 1e3,
        predicted / total
    );
    println!("{table}");
    assert!(
        outside.is_empty(),
        "outside the 2x band:\n{}\n{table}",
        outside.join("\n")
    );
}

/// Nsight Compute's table of the TF32 ResNet-20 b128 step on an H100 (2026-11-27, kernels of
/// commit 40b1600: `tests/perf/gpu-h100-tensor-core-layouts-2026-11-27.md`), and the launch
/// report of the same step at that commit (`resnet --batch 128 --precision tf32
/// --launch-report`): the emulator's counts of every launch's busiest block.
const TF32_CSV: &str = include_str!("../perf/gpu-h100-ncu-resnet20-b128-tf32.csv");
const TF32_FIXTURE: &str = include_str!("../perf/resnet20_b128_tf32_40b1600.jsonl");
/// The SM clock Nsight Compute locked the H100 at for those measurements, GHz.
const NCU_CLOCK_GHZ: f64 = 1.46;

/// The model's L1/TEX cost (`perf::l1_cycles`: sectors at the calibrated cycles each, shared
/// wavefronts at one) is within 0.5-1.3× of the busy cycles Nsight Compute measured (its L1/TEX
/// throughput percentage × duration × clock × SMs) for every convolution launch of the TF32
/// step over 8 µs (the forward and both gradients: the launches the cost was fitted on).
#[test]
fn the_l1_cost_matches_nsight_computes_l1_busy_cycles_of_the_tf32_step() {
    let mut lines = TF32_CSV.lines();
    let header = fields(lines.next().expect("header"));
    let col = |name: &str| header.iter().position(|h| h == name).expect(name);
    let (name, grid, time, l1) = (col("name"), col("grid"), col("time_ns"), col("l1_pct"));
    let report: Vec<serde_json::Value> = TF32_FIXTURE
        .lines()
        .map(|l| serde_json::from_str(l).expect("a report line"))
        .collect();
    let mut table = String::from("measured Mcycles  model Mcycles  ratio  name\n");
    let (mut checked, mut outside) = (0, Vec::new());
    for (i, line) in lines.filter(|l| !l.trim().is_empty()).enumerate() {
        let f = fields(line);
        let r = &report[i];
        assert_eq!(r["name"].as_str(), Some(f[name].as_str()), "launch {i}");
        let dims: Vec<u64> = f[grid]
            .split('x')
            .map(|d| d.parse().expect("a dimension"))
            .collect();
        let blocks: u64 = dims.iter().product();
        let reported: Vec<u64> = r["grid"]
            .as_array()
            .expect("grid")
            .iter()
            .map(|d| d.as_u64().expect("a dimension"))
            .collect();
        assert_eq!(dims, reported, "launch {i} `{}`", f[name]);
        let ns: f64 = f[time].parse().expect("time_ns");
        let convolution = r["kind"].as_str().is_some_and(|k| k.starts_with("conv2d"));
        if ns < 8000.0 || !convolution {
            continue;
        }
        let busy = f[l1].parse::<f64>().expect("l1_pct") / 100.0
            * ns
            * NCU_CLOCK_GHZ
            * f64::from(H100_SXM.sms);
        let counts = BlockCounts {
            warp_instructions: r["block_warp_instructions"].as_f64().expect("count"),
            load_epochs: r["block_load_epochs"].as_f64().expect("count"),
            shared_wavefronts: r["block_shared_wavefronts"].as_f64().expect("count"),
            global_sectors: r["block_global_sectors"].as_f64().expect("count"),
        };
        let model = blocks as f64 * perf::l1_cycles(&H100_SXM, &counts);
        let ratio = model / busy;
        table += &format!(
            "{:>16.2} {:>14.2} {:>6.2}  {}\n",
            busy / 1e6,
            model / 1e6,
            ratio,
            f[name]
        );
        checked += 1;
        if !(0.5..=1.3).contains(&ratio) {
            outside.push(format!("`{}`: {ratio:.2}", f[name]));
        }
    }
    println!("{table}");
    assert!(
        checked >= 50,
        "only {checked} convolution launches over 8 µs"
    );
    assert!(
        outside.is_empty(),
        "outside the band:\n{}\n{table}",
        outside.join("\n")
    );
}

/// The batch norms' variances, reductions split across 128-527 blocks whose last block adds
/// every block's partials, are predicted within 0.6-1.4× of what Nsight Compute timed for them
/// in the TF32 step: each predicted as profiled — block 0's counts at that commit (the fixture),
/// its split, and the combining tail of the body as it was then (four partials in flight a
/// lane) — with the tail counted. Measuring block 0 alone, the model left the tail out and
/// predicted 0.37-0.53× of the measured times.
///
/// The variances now join the convolutions' epilogues (`ChannelReduction::Variance`), so the
/// step has these reductions no more: each is lowered here as a reduction of its own again, the
/// moments of an input (no convolution to join) of the profiled shape.
#[test]
fn split_reductions_are_predicted_near_their_nsight_compute_times() {
    let report: Vec<serde_json::Value> = TF32_FIXTURE
        .lines()
        .map(|l| serde_json::from_str(l).expect("a report line"))
        .collect();
    let mut lines = TF32_CSV.lines();
    let header = fields(lines.next().expect("header"));
    let col = |name: &str| header.iter().position(|h| h == name).expect(name);
    let (name, time) = (col("name"), col("time_ns"));
    let mut table = String::from("measured µs  predicted µs  ratio  grid  name\n");
    let (mut checked, mut outside) = (0, Vec::new());
    for (i, f) in lines
        .filter(|l| !l.trim().is_empty())
        .map(fields)
        .enumerate()
    {
        if !f[name].ends_with("bn/moments/variance") {
            continue;
        }
        let r = &report[i];
        assert_eq!(r["name"].as_str(), Some(f[name].as_str()), "launch {i}");
        let program = two_pass_moments(r["lane_iterations"].as_f64().expect("points"));
        let k = program
            .kernels
            .iter()
            .find(|k| k.name == "bn/moments/variance")
            .expect("the variance's reduction");
        let KernelKind::Reduce {
            shape, axes, ops, ..
        } = &k.kind
        else {
            panic!("`{}` is not a reduction", f[name]);
        };
        let dims = |key: &str| -> [u32; 3] {
            let v: Vec<u32> = r[key]
                .as_array()
                .expect(key)
                .iter()
                .map(|d| d.as_u64().expect("a dimension") as u32)
                .collect();
            [v[0], v[1], v[2]]
        };
        let (grid, block) = (dims("grid"), dims("block"));
        let number = |key: &str| r[key].as_f64().expect(key);
        // The profiled launch: this reduction's tile and lanes, the profiled split.
        let profiled = ReduceLaunch {
            split: Split {
                parts: grid[1] as usize,
                chunk: 0,
            },
            ..reduce_launch(shape, axes, &Target::default())
        };
        let warps = f64::from(block.iter().product::<u32>() / 32);
        let counts = BlockCounts {
            warp_instructions: number("block_warp_instructions"),
            load_epochs: number("block_load_epochs"),
            shared_wavefronts: number("block_shared_wavefronts"),
            global_sectors: number("block_global_sectors"),
        } + perf::split_reduce_tail(&profiled, ops.len(), warps, 4);
        let launch = Launch {
            grid,
            block,
            shared_bytes: number("shared_bytes") as u32,
            registers: r["registers"].as_u64().map(|x| x as u32),
            flops: number("flops"),
            tensor_flops: 0.0,
            half_tensor_flops: 0.0,
            dram_bytes: number("dram_bytes"),
            block_counts: Some(counts),
        };
        let predicted = perf::predict(&H100_SXM, &launch).us;
        let measured = f[time].parse::<f64>().expect("time_ns") / 1e3;
        let ratio = predicted / measured;
        table += &format!(
            "{measured:>11.1} {predicted:>13.1} {ratio:>6.2}  {:?}  {}\n",
            grid, f[name]
        );
        checked += 1;
        if !(0.6..=1.4).contains(&ratio) {
            outside.push(format!("`{}`: {ratio:.2}", f[name]));
        }
    }
    println!("{table}");
    assert_eq!(checked, 19, "one variance per batch norm\n{table}");
    assert!(
        outside.is_empty(),
        "outside the band:\n{}\n{table}",
        outside.join("\n")
    );
}

/// The two-pass moments (no shift) of an NHWC input of ResNet-20's b128 shape with `points`
/// elements, lowered as the CUDA backend lowers them.
fn two_pass_moments(points: f64) -> towerpack::lower::Program {
    use towerpack::backend::Step;
    use towerpack::ir::{Graph, Op, Shape, TensorType, Value};
    let hwc = match points as usize {
        2_097_152 => [32, 32, 16],
        1_048_576 => [16, 16, 32],
        524_288 => [8, 8, 64],
        other => panic!("no ResNet-20 b128 activation has {other} points"),
    };
    let mut g = Graph::new();
    let op = Op::Input {
        name: "x".into(),
        ty: TensorType::f32(Shape::batched(&hwc)),
    };
    let x = Value::first(g.add_node("x", op, &[]).expect("input"));
    let op = Op::Moments {
        axes: vec![0, 1, 2],
        keep_dims: false,
    };
    let m = g.add_node("bn/moments", op, &[x]).expect("moments");
    let step = Step::new(vec![Value::new(m, 0), Value::new(m, 1)], Vec::new());
    let options = towerpack::backend::cuda::CudaOptions::default().lowering();
    towerpack::lower::lower(&g, &step, 128, &options).expect("lower")
}

/// The launch report of the ResNet-20 b128 training step (the resnet example's `--bench`
/// step) on the H100 model, snapshotted: shapes, resources, work and predicted times.
#[test]
fn snapshot_of_the_resnet20_b128_launch_report() {
    cuda_common::require_nvrtc();
    // The registers column comes from ptxas: fail clearly without it (CI installs it).
    let _ = cuda_common::ptxas();
    let rows = launch_report::report(resnet20(), 128, 1, &H100_SXM).expect("report");
    let text = format!(
        "{}\n{}",
        perf::summary(&rows, &H100_SXM),
        perf::json_lines(&rows)
    );
    insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("cuda_launch_report_resnet20_b128", text);
    });
}

/// `--kernel-sources DIR`: one CUDA C source and one compute_90 PTX per launched kernel of the
/// step, named by kernel index and scoped name (dots kept: `res1.0/add` is
/// `NNN_res1.0_add.cu`), the PTX NVRTC's for that source.
#[test]
fn kernel_sources_writes_every_launch_as_cuda_c_and_ptx() {
    cuda_common::require_nvrtc();
    let dir = tempfile::tempdir().expect("tempdir");
    let net = CifarResNet::new(1);
    let model: Arc<dyn ModelDesc> = Arc::new(ModelFn::new(
        net.inputs(),
        move |x| net.build(x),
        Optimizer::momentum(0.01, 0.9),
    ));
    let program = launch_report::training_program(model.clone(), 2, 1).expect("the lowered step");
    let launched: Vec<(usize, String)> = (0..program.kernels.len())
        .filter_map(
            |i| match render::render_kernel(&program, i).expect("render") {
                KernelPlan::Launch(r) => Some((i, r.body.entry().to_string())),
                _ => None,
            },
        )
        .collect();
    let written =
        launch_report::write_sources(model, 2, 1, towerpack::lower::Precision::Fp32, dir.path())
            .expect("write the sources");
    assert_eq!(written, launched.len());
    let files = std::fs::read_dir(dir.path()).expect("the folder").count();
    assert_eq!(files, 2 * launched.len(), "a .cu and a .ptx per launch");
    for (i, entry) in &launched {
        let stem = format!("{i:03}_{}", program.kernels[*i].name.replace('/', "_"));
        let cu = std::fs::read_to_string(dir.path().join(format!("{stem}.cu"))).expect(&stem);
        let ptx = std::fs::read_to_string(dir.path().join(format!("{stem}.ptx"))).expect(&stem);
        assert!(cu.contains("// ---- generated ----"), "{stem}.cu");
        assert!(
            ptx.contains(".target sm_90"),
            "{stem}.ptx is not compute_90's"
        );
        assert!(
            ptx.contains(&format!(".entry {entry}(")),
            "{stem}.ptx lacks {entry}"
        );
    }
    assert!(
        launched
            .iter()
            .any(|(i, _)| program.kernels[*i].name.contains("res1.0/")),
        "the case has scoped names with dots"
    );
}

/// Launches of a program that leave an H100 mostly idle: fewer blocks than its SMs with more
/// than a million lane-iterations of work.
fn idle(model: Arc<dyn ModelDesc>, batch: usize) -> Vec<String> {
    let program = launch_report::training_program(model, batch, 1).expect("program");
    idle_when_shaped_for(&program, &render::Target::default())
}

/// [`idle`] with the launch shapes chosen for `target` (another device than an H100).
fn idle_when_shaped_for(
    program: &towerpack::lower::Program,
    target: &render::Target,
) -> Vec<String> {
    let mut out = Vec::new();
    for (i, k) in program.kernels.iter().enumerate() {
        let KernelPlan::Launch(r) = render::render_kernel_for(program, i, target).expect("render")
        else {
            continue;
        };
        let blocks: u64 = r.launch.grid.iter().map(|&g| u64::from(g)).product();
        let work = perf::kernel_work(program, k);
        if blocks < u64::from(H100_SXM.sms) && work.lane_iterations > 1e6 {
            out.push(format!(
                "k{i} {} `{}`: {blocks} blocks for {:.1e} lane-iterations",
                r.body.file(),
                k.name,
                work.lane_iterations
            ));
        }
    }
    out
}

/// The detector itself: launches shaped for a one-SM device (reductions and filter gradients
/// not split) are flagged on an H100 — the test below cannot pass by flagging nothing. (The
/// step's large reductions joined the convolutions' epilogues: a reduction of a
/// stage-1-sized activation stands in for them.)
#[test]
fn the_idle_check_flags_launches_shaped_for_a_smaller_device() {
    let one_sm = render::Target {
        multiprocessors: 1,
        ..render::Target::default()
    };
    let program = launch_report::training_program(resnet20(), 128, 1).expect("program");
    let mut found = idle_when_shaped_for(&program, &one_sm);
    found.extend(idle_when_shaped_for(
        &two_pass_moments(2_097_152.0),
        &one_sm,
    ));
    assert!(found.iter().any(|l| l.contains("reduce.cu")), "{found:#?}");
    assert!(
        found.iter().any(|l| l.contains("conv2d_backprop_filter")),
        "{found:#?}"
    );
}

#[test]
fn no_launch_of_the_example_programs_leaves_the_gpu_mostly_idle() {
    let mut found = Vec::new();
    for (name, model, batch) in [
        ("resnet20 b128", resnet20(), 128),
        ("resnet20 b64", resnet20(), 64),
        ("mnist mlp b64", mnist_mlp(), 64),
        ("mnist convnet b64", mnist_convnet(), 64),
    ] {
        found.extend(
            idle(model, batch)
                .into_iter()
                .map(|l| format!("{name}: {l}")),
        );
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The predicted ResNet-20 b128 training step on the H100 model in TF32, BF16 and FP16
/// (tensor-core GEMMs; BF16/FP16 on the native m16n8k16 `mma`, FP16 with its loss scale)
/// against FP32: printed (`-- --nocapture`) for `kernels/README.md`, and each must be predicted
/// faster than FP32 — a prediction, not a measurement.
#[test]
fn the_tf32_resnet20_b128_step_is_predicted_faster_than_fp32() {
    use towerpack::lower::{LowerOptions, Precision, lower};
    cuda_common::require_nvrtc();
    let _ = cuda_common::ptxas();
    let compiler = Compiler::new(nvrtc::default_cache_dir()).expect("NVRTC");
    let mut totals = Vec::new();
    for precision in [
        Precision::Fp32,
        Precision::Tf32,
        Precision::Bf16,
        Precision::Fp16,
    ] {
        // fp16 with its loss scale, as a run builds it.
        let (graph, step) =
            launch_report::training_step_in(resnet20(), 128, 1, precision).expect("step");
        let options = LowerOptions {
            precision,
            ..towerpack::backend::cuda::CudaOptions::default().lowering()
        };
        let program = lower(&graph, &step, 128, &options).expect("lower");
        let rows = perf::launch_report(&program, &compiler, &H100_SXM, true).expect("report");
        // The GEMM launch shapes: kind, tile and split of K, with how many launches take each.
        let mut shapes: std::collections::BTreeMap<String, usize> = Default::default();
        for i in 0..program.kernels.len() {
            let Ok(KernelPlan::Launch(r)) = render::render_kernel(&program, i) else {
                continue;
            };
            let value = |name: &str| {
                r.generated.lines().find_map(|l| {
                    let rest = l.strip_prefix(&format!("#define {name} "))?;
                    Some(
                        rest.trim_start_matches("((int)")
                            .trim_end_matches(')')
                            .to_string(),
                    )
                })
            };
            if let (Some(bm), Some(bn), Some(split)) =
                (value("TP_BM"), value("TP_BN"), value("TP_SPLIT_K"))
            {
                let kind = program.kernels[i].kind.name();
                *shapes
                    .entry(format!("{kind} {bm}x{bn} split {split}"))
                    .or_default() += 1;
            }
        }
        for (shape, n) in &shapes {
            eprintln!("{precision}: {n:>3} × {shape}");
        }
        let gemm: f64 = rows
            .iter()
            .filter(|r| r.body.starts_with("conv2d") || r.body == "matmul.cu")
            .map(|r| r.prediction.us)
            .sum();
        eprintln!(
            "{precision}: GEMM family {gemm:.1} µs\n{}",
            perf::summary(&rows, &H100_SXM)
        );
        totals.push(perf::step_us(&rows));
    }
    eprintln!(
        "predicted step: fp32 {:.1} µs, tf32 {:.1} µs ({:.2}×), bf16 {:.1} µs, fp16 {:.1} µs",
        totals[0],
        totals[1],
        totals[0] / totals[1],
        totals[2],
        totals[3]
    );
    assert!(totals[1..].iter().all(|&t| t < totals[0]), "{totals:?}");
}
