//! The CUDA backend: code generation and NVRTC, the emulated device (kernels, ops, faults, split
//! launches, TF32 tensor-core kernels, BF16/FP16 operand rounding, training), no-GPU behaviour
//! and the performance model.
//!
//! One test binary per stage (linking the crate once per binary dominates the build); each
//! module is one former `tests/<stage>_<topic>.rs` file.

#[path = "../cuda_common/mod.rs"]
mod cuda_common;
#[path = "../train_common/mod.rs"]
mod train_common;

mod compile;
mod emu_faults;
mod emu_half;
mod emu_half_storage;
mod emu_kernels;
mod emu_ops;
mod emu_prologues;
mod emu_split;
mod emu_tf32;
mod emu_training;
mod gemm_case;
mod no_gpu;
mod perf_model;
mod trainer_runs;
