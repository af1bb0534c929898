//! Lowering: compiles one step of an op graph into a backend-neutral kernel [`Program`].
//!
//! The passes, in order (each a small module with its own tests):
//! 1. [`passes`]: extract the step's subgraph, expand composite ops, fold constants and simplify,
//!    eliminate common subexpressions and dead code — all graph-to-graph rewrites;
//! 2. [`groups`] and [`kernelize`]: elementwise fusion (chains and trees, broadcast operands,
//!    layout ops as strided [`views`]), reductions absorbing their producers, epilogues of
//!    convolutions and matrix products;
//! 3. [`emit`] with [`memplan`]: scheduling, in-place assigns, buffers and the arena plan.
//!
//! The result is data ([`program`], [`expr`]): the CPU backend runs it, the CUDA backend renders
//! it. Lowering never imports a backend.

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

#[cfg(test)]
mod tests;

pub use error::LowerError;
pub use expr::{ExprId, ExprOp, FusedExpr};
pub use layout::{StateLayout, StateSlot};
pub use program::{
    Buffer, BufferId, ConvGeom, Epilogue, Kernel, KernelKind, MatMulGeom, PoolGeom, Program,
    Region, Storage, View,
};

use crate::ir::{Graph, Step};

/// Knobs of lowering. The defaults are what training uses; tests turn passes off to compare.
#[derive(Clone, Copy, Debug)]
pub struct LowerOptions {
    /// Fuse elementwise ops into kernels, reductions and epilogues.
    pub fuse: bool,
    /// Run folding, simplification and CSE.
    pub simplify: bool,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            fuse: true,
            simplify: true,
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
        passes::fold(&mut sg)?;
        passes::cse(&mut sg)?;
    }
    passes::dce(&mut sg)?;
    let kernels = kernelize::kernelize(&sg, batch, options.fuse)?;
    emit::emit(&sg, kernels, batch, StateLayout::new(graph))
}
