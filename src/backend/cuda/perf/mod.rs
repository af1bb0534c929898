//! A performance model of the CUDA backend's launches on a named GPU, for machines without
//! one (CI): each launch's time is predicted from its shape, its resources (registers from
//! ptxas, shared memory) and its work — arithmetic and DRAM traffic from the kernel's
//! geometry ([`work`]), the serial work of one block measured on the emulated device at full
//! size ([`measure`]: block 0 only) — as
//! `max(flops / peak·active, bytes / bandwidth, block time × waves) + launch cost`
//! ([`model`]), on a [`GpuSpec`] ([`spec`]: the H100 SXM first, its latencies calibrated against
//! Nsight Compute's times of the old kernels and its L1/TEX cost against Nsight Compute's busy
//! cycles of the TF32 kernels, both checked by `tests/cuda/perf_model.rs`).
//! [`report`] writes one JSON line per launch and flags launches that leave the GPU mostly
//! idle.

pub mod measure;
pub mod model;
pub mod ptxas;
pub mod report;
pub mod spec;
pub mod work;

pub use model::{BlockCounts, Bound, Launch, Prediction, l1_cycles, predict};
pub use report::{
    COMBINE_IN_FLIGHT, LaunchRow, idle_launches, json_lines, launch_report, split_reduce_tail,
    step_us, summary,
};
pub use spec::{GpuSpec, H100_SXM};
pub use work::{Work, kernel_work};
