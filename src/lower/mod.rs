//! Lowering: compiles one step of an op graph into a backend-neutral kernel [`Program`].
//!
//! Lowering is a list of named passes run by a [`Pipeline`] ([`pipeline`] lists them and
//! says how to print the IR after any pass, time them and verify after each):
//! 1. [`passes`]: extract the step's subgraph, expand composite ops, round the operands of
//!    GEMMs to 16 bits under bf16/fp16 ([`autocast`]), fold constants and simplify, eliminate
//!    common subexpressions and dead code, let GEMM kernels absorb their operand casts — all
//!    graph-to-graph rewrites;
//! 2. [`groups`] and [`kernelize`]: elementwise fusion (chains and trees, broadcast operands,
//!    layout ops as strided [`views`]), reductions absorbing their producers, epilogues of
//!    convolutions and matrix products, prologues computing a convolution's input ([`Prologue`]);
//! 3. [`arena`]: identical per-variable update kernels over contiguous variables merge into one
//!    kernel over the state range and a gradient arena (with data-parallel towers this is the
//!    fused gradient-averaging kernel), cut into buckets; then [`collectives`]: the
//!    per-gradient all-reduces of a distributed step become one in-place all-reduce per
//!    bucket, planned on the whole graph (each gradient arena is a bucket's range or part of
//!    it);
//! 4. `emit` with [`memplan`]: scheduling, in-place assigns, buffers and the arena plan;
//!    then the cross-device waits of programs spread over several devices;
//! 5. [`mod@verify`]: a simulation of the step over the planned memory proves every read sees the
//!    value it means (see [`LowerOptions::verify`]).
//!
//! The result is data ([`program`], [`expr`]): the CPU backend runs it, the CUDA backend renders
//! it. Lowering never imports a backend.

pub mod arena;
pub mod autocast;
pub mod collectives;
mod emit;
mod error;
pub mod expr;
pub mod groups;
pub mod half_storage;
pub mod kernelize;
pub mod layout;
pub mod memplan;
pub mod passes;
pub mod pipeline;
pub mod precision;
pub mod program;
pub mod verify;
pub mod views;
mod waits;

#[cfg(test)]
pub(crate) mod tests;

pub use error::LowerError;
pub use expr::{ExprId, ExprOp, FusedExpr};
pub use layout::{StateLayout, StateSlot};
pub use pipeline::{Dump, Lowered, Pass, PassContext, PassReport, Pipeline};
pub use precision::{HalfFormat, Precision, PrecisionParseError};
pub use program::{
    Bucket, Buffer, BufferId, ChannelReduction, ConvGeom, Epilogue, Kernel, KernelKind, MatMulGeom,
    PoolGeom, Program, Prologue, ReduceFinish, Region, Storage, View,
};
pub use verify::{VerifyError, verify};

use crate::ir::{Graph, Step};

/// Knobs of lowering. The defaults are what training uses; tests turn passes off to compare.
#[derive(Clone, Copy, Debug)]
pub struct LowerOptions {
    /// Fuse elementwise ops into kernels, reductions and epilogues.
    pub fuse: bool,
    /// Run folding, simplification and CSE.
    pub simplify: bool,
    /// Merge identical variable updates into kernels over contiguous ranges, and all-reduces
    /// into in-place all-reduces over such ranges (needs `fuse`).
    pub arena_fusion: bool,
    /// Largest range (bytes of the updated variables) one fused update kernel covers; also
    /// the largest bucket of all-reduces (per device).
    pub bucket_bytes: usize,
    /// Let convolution epilogues compute per-channel reductions of their output (batch-norm
    /// statistics and gradient sums; see [`Epilogue::reductions`]; needs `fuse`). Both backends
    /// run them (the CUDA kernels combine the blocks' sums in a fixed order) and lower with them
    /// by default.
    pub epilogue_reductions: bool,
    /// Let batch norm's variance of a convolution's output join the convolution's epilogue too
    /// ([`ChannelReduction::Variance`], one pass; needs `epilogue_reductions`), where the mean
    /// already does: no kernel reads the output back for its variance. The CUDA backend lowers
    /// with them (`CudaOptions::lowering`). The CPU backend computes them, from the stored rows
    /// in f64, but is not faster for them (ResNet-20 b128, 2-core Xeon: within the noise), so it
    /// is off by default.
    pub epilogue_variances: bool,
    /// Let convolutions compute their input as they read it (a [`Prologue`]: batch norm's apply
    /// and ReLU) instead of an elementwise kernel writing it out and every reader loading it
    /// back; readers that are fused expressions recompute it inline (needs `fuse`). The CPU
    /// backend runs them; the CUDA backend only where `CudaOptions::conv_prologues` asks (off by
    /// default) and never under [`Precision::Tf32`]; otherwise it lowers without them whatever
    /// this says.
    pub conv_prologues: bool,
    /// Let the kernel computing a variable's new value write it straight into the variable's
    /// storage when nothing reads the old value afterwards (else a write-back copies it at the
    /// end of the step).
    pub in_place_assigns: bool,
    /// Check the program with [`verify()`] before returning it: every read sees the value it
    /// means (no unwritten or overwritten bytes), ranges are whole, devices are ordered. On
    /// by default: about 2 ms for ResNet-50's step, 1.5% of its lowering.
    pub verify: bool,
    /// How matrix products and convolutions multiply ([`Precision`]; default f32). Recorded on
    /// the [`Program`] (`Program::precision`): the CUDA backend renders TF32 tensor-core GEMMs
    /// for [`Precision::Tf32`]; the CPU backend, which has no TF32 units, computes in f32.
    pub precision: Precision,
    /// Under [`Precision::Bf16`], store activations in bf16 where every kernel writing and
    /// reading them can ([`half_storage`]): half the bytes written and read back, rounded once
    /// per kernel as it stores them. On by default (the CUDA backend also asks
    /// `CudaOptions::half_activations`). No effect in other precisions.
    pub half_activations: bool,
    /// With [`LowerOptions::half_activations`], also store in bf16 the gradients convolutions
    /// read as `dy` (input and filter gradients, which round it to bf16 anyway as they
    /// multiply it) where every other reader can too ([`half_storage`]). Off by default: the
    /// CPU's convolutions read `dy` in f32 only (widening it image by image was measured
    /// slower there); the CUDA backend turns it on (`CudaOptions::half_gradients`).
    pub half_gradients: bool,
}

impl LowerOptions {
    /// Whether the `half-storage` pass runs: [`LowerOptions::half_activations`] under
    /// [`Precision::Bf16`] (and so whether [`LowerOptions::half_gradients`] takes effect).
    pub fn stores_half(&self) -> bool {
        self.half_activations && self.precision == Precision::Bf16
    }
}

/// Default bucket size of fused updates: Horovod's tensor-fusion threshold.
pub const DEFAULT_BUCKET_BYTES: usize = 64 << 20;

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            fuse: true,
            simplify: true,
            arena_fusion: true,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            epilogue_reductions: true,
            epilogue_variances: false,
            conv_prologues: true,
            in_place_assigns: true,
            verify: true,
            precision: Precision::Fp32,
            half_activations: true,
            half_gradients: false,
        }
    }
}

/// Lowers `step` of `graph` with the batch size bound to `batch`, through the standard
/// [`Pipeline`] of `options`.
///
/// The state layout is computed from the whole graph, so every step of one graph addresses
/// its variables identically. With `TOWERPACK_DUMP` or `TOWERPACK_TIME_PASSES=1` set (see
/// [`pipeline`]), the IR after the passes named and each pass's time go to standard error.
pub fn lower(
    graph: &Graph,
    step: &Step,
    batch: usize,
    options: &LowerOptions,
) -> Result<Program, LowerError> {
    let (program, report) = lower_with_report(graph, step, batch, options)?;
    for p in &report.passes {
        if let Some(dump) = &p.dump {
            eprintln!("// ----- IR after `{}` -----\n{dump}", p.name);
        }
    }
    if std::env::var("TOWERPACK_TIME_PASSES").is_ok_and(|v| v == "1") {
        eprintln!("lowering passes (batch {batch}):\n{report}");
    }
    Ok(program)
}

/// [`lower`], returning also what each pass did (times, rewrite counts, dumps) instead of
/// printing it.
pub fn lower_with_report(
    graph: &Graph,
    step: &Step,
    batch: usize,
    options: &LowerOptions,
) -> Result<(Program, PassReport), LowerError> {
    Pipeline::standard(options).run(graph, step, batch, options)
}
