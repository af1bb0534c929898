//! The GPUs the performance model knows: what limits a launch on each (SMs, clocks, peaks,
//! per-SM resources) and the model's calibrated latencies.

/// One GPU, as the performance model sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuSpec {
    pub name: &'static str,
    /// Compute capability as `major * 10 + minor` (registers are counted by ptxas for it).
    pub arch: u32,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// SM clock (boost), GHz.
    pub clock_ghz: f64,
    /// Peak FP32 throughput (an FMA is two operations), TFLOP/s.
    pub fp32_tflops: f64,
    /// Peak dense TF32 tensor-core throughput (an FMA is two operations), TFLOP/s.
    pub tf32_tflops: f64,
    /// Peak dense BF16/FP16 tensor-core throughput with f32 accumulation (an FMA is two
    /// operations), TFLOP/s: the native `mma` m16n8k16 of BF16/FP16 programs.
    pub half_tflops: f64,
    /// DRAM bandwidth, GB/s.
    pub dram_gbs: f64,
    /// Per SM: resident threads, resident blocks, 32-bit registers, shared memory bytes.
    pub max_threads_per_sm: u32,
    pub max_blocks_per_sm: u32,
    pub registers_per_sm: u32,
    pub shared_per_sm: u32,
    /// Warp schedulers per SM (each issues one warp-instruction per cycle).
    pub schedulers_per_sm: u32,
    /// Registers are allocated per warp in units of this many.
    pub register_granularity: u32,
    /// Calibrated: cycles of an SM's L1/TEX unit per 32-byte sector of a global access (the
    /// tag and data stages; a `cp.async` also writes its sector into shared memory there). The
    /// unit serves shared memory too, one wavefront per cycle, so its busy cycles are
    /// `sectors · this + shared wavefronts`.
    pub l1_cycles_per_sector: f64,
    /// Calibrated: cycles a warp waits for global memory once per load epoch (a run of loads
    /// issued together), when no other warp hides it.
    pub memory_latency_cycles: f64,
    /// Calibrated: the average cycles between two instructions of one warp when no other warp
    /// hides the wait (dependent arithmetic, shared-memory latency, barriers). It is an
    /// average over the old kernels' instruction mixes, not a pipeline latency: a kernel with
    /// more independent work per thread will do better than this predicts.
    pub stall_cycles_per_instruction: f64,
    /// Calibrated: the shortest launch as Nsight Compute times it (launch, ramp-up and drain
    /// of an almost empty kernel), µs.
    pub launch_us: f64,
}

/// NVIDIA H100 SXM5 80 GB (HBM3): 132 SMs at 1.98 GHz boost, 67 TFLOP/s FP32, 495 TFLOP/s
/// dense TF32 and 989 dense BF16/FP16 on the tensor cores, 3.35 TB/s.
/// Latencies calibrated against Nsight Compute's times of towerpack's kernels on one
/// (`../shared/reference/gpu-h100.md`; `tests/cuda/perf_model.rs` checks the fit).
pub const H100_SXM: GpuSpec = GpuSpec {
    name: "H100 SXM",
    arch: 90,
    sms: 132,
    clock_ghz: 1.98,
    fp32_tflops: 67.0,
    // NVIDIA H100 SXM5 datasheet: TF32 Tensor Core 989 TFLOP/s with 2:4 sparsity, half of it
    // dense (the figure issue 17 quotes: 495).
    tf32_tflops: 494.7,
    // The same datasheet: BF16 and FP16 Tensor Core 1,979 TFLOP/s with sparsity, half of it
    // dense (twice TF32's, as the whitepaper's per-SM table has it: 2048 dense FP16/BF16 FMA
    // per clock against 1024 TF32).
    half_tflops: 989.4,
    dram_gbs: 3350.0,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 32,
    registers_per_sm: 65536,
    shared_per_sm: 233_472,
    schedulers_per_sm: 4,
    register_granularity: 256,
    // Nsight Compute's L1/TEX busy cycles of the 56 convolution launches over 8 µs of the TF32
    // ResNet-20 b128 step (tests/perf/gpu-h100-ncu-resnet20-b128-tf32.csv, kernels of 40b1600)
    // against the emulator's sectors and shared wavefronts of the same launches: the
    // least-squares fit is 0.60 cycles per sector and 1.03 per wavefront, each launch within
    // 0.54-1.25 of it (tests/cuda/perf_model.rs checks the band). The batch-norm reductions'
    // busy cycles are twice what this gives them (they are latency-bound, not L1-bound).
    l1_cycles_per_sector: 0.6,
    memory_latency_cycles: 860.0,
    stall_cycles_per_instruction: 12.0,
    launch_us: 2.5,
};

impl GpuSpec {
    /// The GPU named `name` (`h100`, `h100-sxm`, case-insensitive), if the model knows it.
    pub fn named(name: &str) -> Option<GpuSpec> {
        match name.to_ascii_lowercase().as_str() {
            "h100" | "h100-sxm" | "h100 sxm" | "h100_sxm" => Some(H100_SXM),
            _ => None,
        }
    }
}
