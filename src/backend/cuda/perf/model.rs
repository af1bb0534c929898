//! The time of one launch on a [`GpuSpec`]:
//!
//! ```text
//! time = max(flops / (peak · active SMs / SMs),  dram bytes / bandwidth,  wave time · waves)
//!        (+ tensor-core flops / (TF32 or BF16/FP16 peak · active SMs / SMs) in the first term)
//!        + launch cost
//! ```
//!
//! Occupancy (blocks resident per SM) comes from the block's threads, registers and shared
//! memory; `waves` is how many rounds of resident blocks the grid needs. A wave takes as long as
//! the longest of its *issue* time (every warp-instruction of the blocks sharing an SM, spread
//! over its schedulers), its *L1/TEX* time (the unit serves global and shared memory alike: the
//! blocks' global sectors at [`GpuSpec::l1_cycles_per_sector`] each — uncoalesced accesses
//! show here — plus their shared-memory wavefronts, one per cycle — bank conflicts show here)
//! and the *latency* of one warp (its instructions at the calibrated stall per instruction,
//! plus one memory latency per load epoch — a run of global loads issued together). The
//! per-block counts come from the emulator ([`super::measure`]); without them the serial term
//! is left out.
//!
//! Known limits (calibration on the old kernels, `tests/cuda/perf_model.rs`): the launches that
//! hold 95% of the time — one to nine blocks of long reductions and filter gradients — are
//! within 0.78-1.27× of Nsight Compute; many-block GEMM-family launches are predicted up to 4.3×
//! too fast (0.23× for the 2048-block stage-1 convolutions, 0.48× for their input gradients;
//! tiny matmuls up to 2.4× too slow), because a load epoch ends only at a
//! branch or barrier, not where a warp first *uses* a loaded register, so the in-order stalls of
//! loaders that store each loaded value to shared memory at once are undercounted. Counting
//! load-use stalls in the emulator is the next refinement. The L1/TEX term is fitted to Nsight
//! Compute's busy cycles of the TF32 convolutions of a later step (0.54-1.25× per launch):
//! those launches are 3-4× slower on the H100 than the model says, and their L1 work explains
//! under half of it. Instructions are PTX's, which ptxas may turn into fewer (address
//! arithmetic, shuffles of 64-bit values). The block measured is block 0, which in a split
//! launch never combines: the report adds a split reduction's combining tail
//! (`report::split_reduce_tail`), which puts the batch norms' variances of that step at
//! 0.77-1.30× of their measured times (without it, 0.37-0.53×); the combines of split GEMMs
//! (`kernels/split.cuh`) are still left out.

use super::spec::GpuSpec;

/// What the model needs to know about one launch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Launch {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Static plus dynamic shared memory per block.
    pub shared_bytes: u32,
    /// Registers per thread (ptxas); `None`: assumed not to limit occupancy.
    pub registers: Option<u32>,
    pub flops: f64,
    /// Of the work, the operations done on the tensor cores in TF32 (TF32 GEMMs), timed
    /// against [`GpuSpec::tf32_tflops`] instead of the FP32 peak; 0 for FP32 kernels.
    pub tensor_flops: f64,
    /// Of the work, the operations done on the tensor cores in BF16/FP16 (the native m16n8k16
    /// `mma` of BF16/FP16 GEMMs), timed against [`GpuSpec::half_tflops`]; 0 otherwise.
    pub half_tensor_flops: f64,
    pub dram_bytes: f64,
    /// The busiest block's counts, when measured.
    pub block_counts: Option<BlockCounts>,
}

/// What one block executes, summed over its warps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockCounts {
    pub warp_instructions: f64,
    /// Runs of global loads issued together (each waits for memory once).
    pub load_epochs: f64,
    /// Shared-memory wavefronts (accesses, plus one per extra word a bank serves).
    pub shared_wavefronts: f64,
    /// Distinct 32-byte sectors of the global accesses (scattered lanes move more).
    pub global_sectors: f64,
}

impl std::ops::Add for BlockCounts {
    type Output = BlockCounts;

    /// The counts of both (a block that does both's work).
    fn add(self, other: BlockCounts) -> BlockCounts {
        BlockCounts {
            warp_instructions: self.warp_instructions + other.warp_instructions,
            load_epochs: self.load_epochs + other.load_epochs,
            shared_wavefronts: self.shared_wavefronts + other.shared_wavefronts,
            global_sectors: self.global_sectors + other.global_sectors,
        }
    }
}

/// Which term of the model sets a launch's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Arithmetic throughput of the SMs the grid occupies.
    Compute,
    /// DRAM bandwidth.
    Memory,
    /// The blocks' own serial work (instruction issue or latency), times the waves.
    Serial,
    /// The launch cost dominates (an almost empty kernel).
    Launch,
}

impl Bound {
    pub fn name(self) -> &'static str {
        match self {
            Bound::Compute => "compute",
            Bound::Memory => "memory",
            Bound::Serial => "serial",
            Bound::Launch => "launch",
        }
    }
}

/// A launch's predicted time and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    pub us: f64,
    pub bound: Bound,
    /// Blocks resident per SM.
    pub blocks_per_sm: u32,
    pub waves: u32,
    /// The three terms, µs.
    pub compute_us: f64,
    pub memory_us: f64,
    pub serial_us: f64,
}

/// Blocks of `launch` one SM of `gpu` holds at once (at least 1).
pub fn blocks_per_sm(gpu: &GpuSpec, launch: &Launch) -> u32 {
    let threads = launch.block.iter().product::<u32>().max(1);
    let warps = threads.div_ceil(32);
    let by_threads = gpu.max_threads_per_sm / (warps * 32);
    let by_registers = launch.registers.map_or(u32::MAX, |r| {
        let per_warp = (r.max(1) * 32).next_multiple_of(gpu.register_granularity);
        gpu.registers_per_sm / (per_warp * warps)
    });
    let by_shared = gpu
        .shared_per_sm
        .checked_div(launch.shared_bytes)
        .unwrap_or(u32::MAX);
    gpu.max_blocks_per_sm
        .min(by_threads)
        .min(by_registers)
        .min(by_shared)
        .max(1)
}

/// Cycles the L1/TEX unit of an SM is busy with one block's accesses: its global sectors at
/// [`GpuSpec::l1_cycles_per_sector`] and its shared-memory wavefronts at one per cycle.
pub fn l1_cycles(gpu: &GpuSpec, c: &BlockCounts) -> f64 {
    c.global_sectors * gpu.l1_cycles_per_sector + c.shared_wavefronts
}

/// The predicted time of `launch` on `gpu`.
pub fn predict(gpu: &GpuSpec, launch: &Launch) -> Prediction {
    let blocks = launch
        .grid
        .iter()
        .map(|&g| u64::from(g))
        .product::<u64>()
        .max(1);
    let threads = launch.block.iter().product::<u32>().max(1);
    let warps = f64::from(threads.div_ceil(32));
    let per_sm = blocks_per_sm(gpu, launch);
    let sms = u64::from(gpu.sms);
    let waves = blocks.div_ceil(sms * u64::from(per_sm));
    let active = blocks.min(sms) as f64 / sms as f64;
    let compute_us = launch.flops / (gpu.fp32_tflops * 1e6 * active)
        + launch.tensor_flops / (gpu.tf32_tflops * 1e6 * active)
        + launch.half_tensor_flops / (gpu.half_tflops * 1e6 * active);
    let memory_us = launch.dram_bytes / (gpu.dram_gbs * 1e3);
    let serial_us = launch.block_counts.map_or(0.0, |c| {
        // Blocks sharing an SM in a full wave (fewer when the grid is small).
        let sharing = (blocks.div_ceil(sms).min(u64::from(per_sm))) as f64;
        let issue = sharing * c.warp_instructions / f64::from(gpu.schedulers_per_sm);
        let l1 = sharing * l1_cycles(gpu, &c);
        let per_warp = c.warp_instructions / warps;
        let epochs = c.load_epochs / warps;
        let latency =
            per_warp * gpu.stall_cycles_per_instruction + epochs * gpu.memory_latency_cycles;
        issue.max(l1).max(latency) * waves as f64 / (gpu.clock_ghz * 1e3)
    });
    let (mut bound, mut longest) = (Bound::Compute, compute_us);
    for (b, t) in [(Bound::Memory, memory_us), (Bound::Serial, serial_us)] {
        if t > longest {
            (bound, longest) = (b, t);
        }
    }
    if longest < gpu.launch_us {
        bound = Bound::Launch;
    }
    Prediction {
        us: longest + gpu.launch_us,
        bound,
        blocks_per_sm: per_sm,
        waves: u32::try_from(waves).unwrap_or(u32::MAX),
        compute_us,
        memory_us,
        serial_us,
    }
}
