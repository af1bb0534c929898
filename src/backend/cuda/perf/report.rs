//! The launch report: every launch of a program with its shape, resources, work and predicted
//! time on a GPU — one JSON line per launch (`--launch-report FILE` of the examples), and a
//! summary table.

use super::measure::{MeasuredLaunch, measure};
use super::model::{BlockCounts, Launch, Prediction, predict};
use super::ptxas::{PtxasReport, assemble};
use super::spec::GpuSpec;
use super::work::{Work, kernel_work};
use crate::backend::BackendError;
use crate::backend::cuda::nvrtc::{Arch, Compiler};
use crate::backend::cuda::render::launch::{ReduceLaunch, Target, reduce_launch};
use crate::backend::cuda::render::{self, KernelPlan};
use crate::lower::{KernelKind, Program};
use std::collections::HashMap;

/// One launch of a program, with its prediction.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchRow {
    /// The launch's position among the program's launches.
    pub index: usize,
    /// The kernel's position in the program, its node name and kind.
    pub kernel: usize,
    pub name: String,
    pub kind: &'static str,
    /// The hand-written body (`kernels/…`).
    pub body: &'static str,
    pub device: usize,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Static plus dynamic shared memory per block.
    pub shared_bytes: u32,
    /// ptxas's registers per thread for the GPU's architecture, when ptxas is available.
    pub registers: Option<u32>,
    pub work: Work,
    pub counts: BlockCounts,
    pub prediction: Prediction,
}

impl LaunchRow {
    /// Blocks of the grid.
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| u64::from(g)).product()
    }

    /// The row as one JSON object (numbers rounded for stable snapshots).
    pub fn to_json(&self) -> serde_json::Value {
        let round = |x: f64, digits: i32| {
            let f = 10f64.powi(digits);
            (x * f).round() / f
        };
        serde_json::json!({
            "launch": self.index,
            "kernel": self.kernel,
            "name": self.name,
            "kind": self.kind,
            "body": self.body,
            "device": self.device,
            "grid": self.grid,
            "block": self.block,
            "shared_bytes": self.shared_bytes,
            "registers": self.registers,
            "flops": self.work.flops,
            "dram_bytes": self.work.dram_bytes,
            "lane_iterations": self.work.lane_iterations,
            "block_warp_instructions": self.counts.warp_instructions,
            "block_load_epochs": self.counts.load_epochs,
            "block_shared_wavefronts": self.counts.shared_wavefronts,
            "block_global_sectors": self.counts.global_sectors,
            "blocks_per_sm": self.prediction.blocks_per_sm,
            "waves": self.prediction.waves,
            "bound": self.prediction.bound.name(),
            "predicted_us": round(self.prediction.us, 1),
        })
    }
}

/// Every launch of `program` with its prediction on `gpu`: block counts measured on the
/// emulated device ([`measure`]), registers from ptxas when `registers` is set and ptxas is
/// found (else `None`, and occupancy is limited by threads and shared memory only).
pub fn launch_report(
    program: &Program,
    compiler: &Compiler,
    gpu: &GpuSpec,
    registers: bool,
) -> Result<Vec<LaunchRow>, BackendError> {
    let measured = measure(program, compiler)?;
    let mut ptxas: HashMap<String, Option<PtxasReport>> = HashMap::new();
    let mut rows = Vec::with_capacity(measured.len());
    for (index, m) in measured.iter().enumerate() {
        rows.push(row(
            program, compiler, gpu, registers, &mut ptxas, index, m,
        )?);
    }
    Ok(rows)
}

fn row(
    program: &Program,
    compiler: &Compiler,
    gpu: &GpuSpec,
    registers: bool,
    ptxas: &mut HashMap<String, Option<PtxasReport>>,
    index: usize,
    m: &MeasuredLaunch,
) -> Result<LaunchRow, BackendError> {
    let k = &program.kernels[m.kernel];
    let unavailable = |message: String| BackendError::Kernel {
        node: k.name.clone(),
        op: k.kind.name().into(),
        message,
    };
    // The launch shapes the measurement rendered (`measure`: the H100's); a split reduction's
    // tail below is counted for the same shape.
    let target = Target::default();
    let KernelPlan::Launch(r) = render::render_kernel_for(program, m.kernel, &target)
        .map_err(|e| unavailable(e.to_string()))?
    else {
        return Err(unavailable("the kernel launches nothing".into()));
    };
    let regs = if registers {
        let source = r.source();
        match ptxas.get(&source) {
            Some(rep) => *rep,
            None => {
                let rep = compiler
                    .compile(&k.name, &source, Arch(gpu.arch))
                    .ok()
                    .and_then(|ptx| assemble(&ptx, &Arch(gpu.arch).sm(), r.body.entry()));
                ptxas.insert(source, rep);
                rep
            }
        }
    } else {
        None
    };
    let work = kernel_work(program, k);
    let shared_bytes = regs.map_or(m.static_shared, |r| r.shared_bytes) + m.dims.shared_bytes;
    // TF32, BF16 and FP16 programs multiply on the tensor cores in the GEMM family (the bodies
    // rendered with TP_TF32): BF16/FP16 ones (TP_ROUND) with the native 16-bit mma.
    let tensor = r.generated.contains("#define TP_TF32 1");
    let half = tensor && r.generated.contains("#define TP_ROUND ");
    // The block the model times: block 0 as measured, plus the combining tail it would have
    // as the last block of a split reduction.
    let counts = match &k.kind {
        KernelKind::Reduce {
            shape, axes, ops, ..
        } => {
            let shape = reduce_launch(shape, axes, &target);
            let warps = f64::from(m.dims.block.iter().product::<u32>().div_ceil(32));
            m.counts + split_reduce_tail(&shape, ops.len(), warps, COMBINE_IN_FLIGHT)
        }
        _ => m.counts,
    };
    let launch = Launch {
        grid: m.dims.grid,
        block: m.dims.block,
        shared_bytes,
        registers: regs.map(|r| r.registers),
        flops: if tensor { 0.0 } else { work.flops },
        tensor_flops: if tensor && !half { work.flops } else { 0.0 },
        half_tensor_flops: if half { work.flops } else { 0.0 },
        dram_bytes: work.dram_bytes,
        block_counts: Some(counts),
    };
    Ok(LaunchRow {
        index,
        kernel: m.kernel,
        name: k.name.clone(),
        kind: k.kind.name(),
        body: r.body.file(),
        device: usize::from(k.device),
        grid: m.dims.grid,
        block: m.dims.block,
        shared_bytes,
        registers: launch.registers,
        work,
        counts,
        prediction: predict(gpu, &launch),
    })
}

/// The partials one lane of a split reduction's combining block has in flight at once: the
/// `#pragma unroll` of its combine loop in `kernels/reduce.cu`.
pub const COMBINE_IN_FLIGHT: usize = 8;

/// What the last block of a split reduction (`kernels/reduce.cu`, `TP_SPLIT > 1`) does after
/// its own chunk, summed over its `warps`: the emulator measures block 0, which never combines.
/// After a fence and the arrival atomic (two memory round trips), each of its `lanes` lanes per
/// output reads `split / lanes` partials of `accumulators` values through L2, `in_flight` at a
/// time ([`COMBINE_IN_FLIGHT`] in the body as it is), then the block merges its lanes
/// (`tp_reduce_lanes`, one barrier per halving) and stores. Counted as the emulator counts: one
/// load epoch per run of loads in flight, instructions per loop iteration from the body (index,
/// bound, branch, one load and one merge per accumulator). Zero for a launch that is not split.
pub fn split_reduce_tail(
    r: &ReduceLaunch,
    accumulators: usize,
    warps: f64,
    in_flight: usize,
) -> BlockCounts {
    if r.split.parts <= 1 {
        return BlockCounts::default();
    }
    let per_lane = r.split.parts.div_ceil(r.lanes);
    let halvings = r.lanes.max(1).ilog2() as usize;
    let epochs = 2 + per_lane.div_ceil(in_flight.max(1));
    let instructions = 12 + per_lane * (3 + 2 * accumulators) + halvings * (4 + 2 * accumulators);
    BlockCounts {
        warp_instructions: warps * instructions as f64,
        load_epochs: warps * epochs as f64,
        ..BlockCounts::default()
    }
}

/// The rows as JSON lines.
pub fn json_lines(rows: &[LaunchRow]) -> String {
    rows.iter().map(|r| format!("{}\n", r.to_json())).collect()
}

/// The predicted step: the sum of the launches' times, µs.
pub fn step_us(rows: &[LaunchRow]) -> f64 {
    rows.iter().map(|r| r.prediction.us).sum()
}

/// Launches that leave most of `gpu` idle: fewer blocks than SMs while their work exceeds
/// `lane_iterations` (a million is far more than one SM should do alone).
pub fn idle_launches<'a>(
    rows: &'a [LaunchRow],
    gpu: &GpuSpec,
    lane_iterations: f64,
) -> Vec<&'a LaunchRow> {
    rows.iter()
        .filter(|r| r.blocks() < u64::from(gpu.sms) && r.work.lane_iterations > lane_iterations)
        .collect()
}

/// A summary: the predicted step and its time per body, largest first.
pub fn summary(rows: &[LaunchRow], gpu: &GpuSpec) -> String {
    let total = step_us(rows);
    let mut by_body: Vec<(&str, usize, f64)> = Vec::new();
    for r in rows {
        match by_body.iter_mut().find(|(b, _, _)| *b == r.body) {
            Some(e) => {
                e.1 += 1;
                e.2 += r.prediction.us;
            }
            None => by_body.push((r.body, 1, r.prediction.us)),
        }
    }
    by_body.sort_by(|a, b| b.2.total_cmp(&a.2));
    let mut s = format!(
        "predicted step on {}: {:.1} µs over {} launches\n",
        gpu.name,
        total,
        rows.len()
    );
    for (body, n, us) in by_body {
        s += &format!(
            "  {:<28} {:>4} launches {:>10.1} µs  {:>5.1}%\n",
            body,
            n,
            us,
            100.0 * us / total.max(1e-9)
        );
    }
    s
}
