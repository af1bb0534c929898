//! Lowering: compiles one step of an op graph into a backend-neutral kernel [`Program`].
//!
//! The passes, in order (each a small module with its own tests):
//! 1. [`passes`]: extract the step's subgraph, expand composite ops, fold constants and simplify,
//!    eliminate common subexpressions and dead code — all graph-to-graph rewrites;
//! 2. [`groups`] and [`kernelize`]: elementwise fusion (chains and trees, broadcast operands,
//!    layout ops as strided [`views`]), reductions absorbing their producers, epilogues of
//!    convolutions and matrix products;
//! 3. [`arena`]: identical per-variable update kernels over contiguous variables merge into one
//!    kernel over the state range and a gradient arena (with data-parallel towers this is the
//!    fused gradient-averaging kernel), cut into buckets; then [`collectives`]: the
//!    per-gradient all-reduces of a distributed step become one in-place all-reduce per
//!    bucket, planned on the whole graph (each gradient arena is a bucket's range or part of
//!    it);
//! 4. [`emit`] with [`memplan`]: scheduling, in-place assigns, buffers and the arena plan;
//!    then the cross-device waits of programs spread over several devices.
//!
//! The result is data ([`program`], [`expr`]): the CPU backend runs it, the CUDA backend renders
//! it. Lowering never imports a backend.

pub mod arena;
pub mod collectives;
mod emit;
mod error;
pub mod expr;
pub mod groups;
pub mod kernelize;
pub mod layout;
pub mod memplan;
pub mod passes;
pub mod program;
pub mod views;
mod waits;

#[cfg(test)]
mod tests;

pub use error::LowerError;
pub use expr::{ExprId, ExprOp, FusedExpr};
pub use layout::{StateLayout, StateSlot};
pub use program::{
    Bucket, Buffer, BufferId, ConvGeom, Epilogue, Kernel, KernelKind, MatMulGeom, PoolGeom,
    Program, Region, Storage, View,
};

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
    /// run them (the CUDA kernels combine the blocks' sums in a fixed order); the CUDA trainer
    /// lowers with them, `CudaOptions::default` still without.
    pub epilogue_reductions: bool,
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
        }
    }
}

/// Lowers `step` of `graph` with the batch size bound to `batch`.
///
/// The state layout is computed from the whole graph, so every step of one graph addresses
/// its variables identically.
pub fn lower(
    graph: &Graph,
    step: &Step,
    batch: usize,
    options: &LowerOptions,
) -> Result<Program, LowerError> {
    let mut sg = passes::extract(graph, step)?;
    passes::expand(&mut sg)?;
    if options.simplify {
        passes::fold(&mut sg, batch)?;
        passes::cse(&mut sg)?;
    }
    passes::dce(&mut sg)?;
    let mut kernels = kernelize::kernelize(&sg, batch, options.fuse, options.epilogue_reductions)?;
    let layout = StateLayout::new(graph);
    // Bucketed all-reduces are planned on the whole graph: the same on every participant of
    // a job whatever its step.
    let plan = collectives::CollectivePlan::new(graph, options.bucket_bytes)?;
    let (arenas, collectives) = if options.fuse && options.arena_fusion {
        let all_reduced = plan.value_slots(&kernels);
        let arenas = arena::fuse_updates(
            &sg.graph,
            &mut kernels,
            &layout,
            batch,
            options.bucket_bytes,
            &all_reduced,
        );
        let collectives =
            collectives::fuse_all_reduces(&sg.graph, &mut kernels, &arenas, &plan, batch);
        (arenas, collectives)
    } else {
        (Vec::new(), Vec::new())
    };
    emit::emit(&sg, kernels, batch, layout, arenas, collectives, &plan)
}
