//! The `half-storage` pass of [`Precision::Bf16`](super::Precision::Bf16): activations stored
//! in bf16.
//!
//! After kernel formation the program's memory is mostly the values kernels write out and read
//! back — activations (a convolution's output, a residual sum) and the gradients that flow back
//! through them. Under bf16 this pass stores such a value in 16 bits: the kernel computing it
//! rounds it to bf16 (nearest even) right where it computes it ([`round_where_computed`]: a
//! cast to bf16 and back in its fused expression, so the kernel's other outputs — batch-norm
//! statistics an epilogue takes, a second output — are computed from the rounded value too),
//! stores the 16 bits, and every kernel reading it widens it back to f32 as it loads it
//! (exact). Arithmetic inside a kernel stays f32: the rounding this adds is once per stored
//! value, as a compiled framework's bf16 does (PyTorch Inductor or XLA round a bf16 activation
//! where a kernel stores it, not after every op). Its meaning as a graph is
//! [`round_values`]: the reference executor, running the graph with those round trips,
//! computes what the program does up to f32 summation order (`tests/lower/half_storage.rs`).
//!
//! A value is stored in bf16 when all of these hold ([`choose`]):
//! - it is an f32 tensor of rank ≥ 2 and at least [`MIN_ELEMENTS`] elements (activation-sized:
//!   per-channel statistics, logits and losses stay f32);
//! - it is not a feed, a variable, a fetch, an assigned value, nor a member of a gradient arena
//!   or an all-reduce range (what leaves the step, and the optimizer's inputs, stay f32: the
//!   master weights and their gradients are f32, as autocast's are);
//! - the kernel writing it is an elementwise kernel, or a forward or input-gradient convolution
//!   (its output 0, rounded image by image after the epilogue);
//! - every kernel reading it reads it through a fused expression (an elementwise or reduction
//!   kernel, an epilogue's or a prologue's operand) or as a convolution's input `x` (forward,
//!   filter gradient), never as a matrix or a convolution's filter, nor through a
//!   fixed-function kernel (pooling, padding, softmax, ...), which read f32; nor as a
//!   convolution gradient's `dy` unless `LowerOptions::half_gradients` says so (the CUDA
//!   backend's convolutions read it in bf16 too, the CPU's do not).
//!
//! The result is a set of values whose buffers `emit` gives the dtype bf16; the backend needs
//! nothing else to know (a buffer's dtype says how to load and store it). Both backends lower
//! with it (`LowerOptions::half_activations`; on CUDA unless `CudaOptions::half_activations`
//! is off): the CPU's convolutions widen a bf16 `x` image by image (`backend/cpu/half_io.rs`),
//! the CUDA ones as they load it (`kernels/gemm_core.cuh` tp_bf16).

use super::arena::{ArenaKernel, ArenaOperand};
use super::collectives::CollectiveBucket;
use super::kernelize::Kernelized;
use super::passes::StepGraph;
use super::program::KernelKind;
use crate::ir::Value;
use crate::tensor::DType;
use std::collections::{HashMap, HashSet};

/// The fewest elements a value stored in 16 bits has (a 64 KiB f32 tensor).
pub const MIN_ELEMENTS: usize = 16 * 1024;

/// Whether a kernel of `kind` reads its input `slot` through a fused expression or as a
/// convolution's `x` (which both backends' convolutions take in f32 or bf16) — or, with
/// `gradients` (`LowerOptions::half_gradients`), as a convolution gradient's `dy`.
fn reads_half(kind: &KernelKind, slot: usize, gradients: bool) -> bool {
    match kind {
        KernelKind::Elementwise { .. } | KernelKind::Reduce { .. } => true,
        // x, then epilogue and prologue operands: everything but the filter.
        KernelKind::Conv2d(..) => slot != 1,
        // x, dy, then epilogue and prologue operands.
        KernelKind::Conv2dBackpropFilter(..) => slot != 1 || gradients,
        // dy and the filter are GEMM operands; epilogue operands are fused loads.
        KernelKind::Conv2dBackpropInput(..) => slot >= 2 || (slot == 0 && gradients),
        // The GEMM operands are read as f32 matrices.
        KernelKind::MatMul(..) => slot >= 2,
        _ => false,
    }
}

/// Whether a kernel of `kind` writes its output `slot` in any float storage.
fn writes_half(kind: &KernelKind, slot: usize) -> bool {
    match kind {
        KernelKind::Elementwise { .. } => true,
        KernelKind::Conv2d(..) | KernelKind::Conv2dBackpropInput(..) => slot == 0,
        _ => false,
    }
}

/// Makes every kernel writing a value of `chosen` compute with the value it stores: the
/// fused expression producing it (an elementwise kernel's, a convolution epilogue's output 0)
/// rounds it to bf16 right where it is computed, so the kernel's other outputs — batch norm's
/// statistics taken in a convolution's epilogue, a second output of an elementwise kernel — are
/// computed from the rounded value, as every later reader sees it. The backend's store of the
/// rounded value is then exact.
pub fn round_where_computed(k: &mut Kernelized, chosen: &HashSet<Value>) {
    for d in k.drafts.iter_mut().filter(|d| d.alive) {
        let stored: Vec<usize> = d
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, v)| chosen.contains(v))
            .map(|(slot, _)| slot)
            .collect();
        if stored.is_empty() {
            continue;
        }
        let expr = match &mut d.kind {
            KernelKind::Elementwise { expr, .. } => Some(expr),
            KernelKind::Conv2d(_, Some(e), _) | KernelKind::Conv2dBackpropInput(_, Some(e)) => {
                Some(&mut e.expr)
            }
            // No epilogue: the kernel's output is stored as computed, rounded as it is stored.
            _ => None,
        };
        if let Some(expr) = expr {
            for slot in stored {
                let id = expr.outputs[slot];
                *expr = expr.with_rounded(id, DType::BF16);
            }
        }
    }
}

/// The values of a kernelized step that are stored in bf16 (see the [module docs](self));
/// with `gradients`, also those convolution gradients read as `dy`.
pub fn choose(
    sg: &StepGraph,
    k: &Kernelized,
    batch: usize,
    arenas: &[ArenaKernel],
    collectives: &[CollectiveBucket],
    gradients: bool,
) -> HashSet<Value> {
    let graph = &sg.graph;
    let mut excluded: HashSet<Value> = k
        .fetches
        .iter()
        .chain(k.assigns.iter().map(|(o, _)| o))
        .map(|o| o.base)
        .collect();
    for a in arenas {
        for operand in &a.operands {
            match operand {
                ArenaOperand::Arena { values } => excluded.extend(values.iter().copied()),
                ArenaOperand::Shared(o) => {
                    excluded.insert(o.base);
                }
                ArenaOperand::State { .. } => {}
            }
        }
    }
    for c in collectives {
        excluded.extend(c.inputs.iter().chain(&c.outputs).copied());
    }
    // Every (kernel, input slot) reading each value.
    let mut readers: HashMap<Value, Vec<(usize, usize)>> = HashMap::new();
    for (i, d) in k.drafts.iter().enumerate().filter(|(_, d)| d.alive) {
        for (slot, o) in d.inputs.iter().enumerate() {
            readers.entry(o.base).or_default().push((i, slot));
        }
    }
    let mut chosen = HashSet::new();
    for d in k.drafts.iter().filter(|d| d.alive) {
        for (slot, &v) in d.outputs.iter().enumerate() {
            let ty = graph.value_type(v);
            let shape = ty.shape.resolve(batch);
            let eligible = ty.dtype == DType::F32
                && shape.len() >= 2
                && shape.iter().product::<usize>() >= MIN_ELEMENTS
                && !excluded.contains(&v)
                && writes_half(&d.kind, slot)
                && readers.get(&v).is_some_and(|rs| {
                    rs.iter()
                        .all(|&(r, s)| reads_half(&k.drafts[r].kind, s, gradients))
                });
            if eligible {
                chosen.insert(v);
            }
        }
    }
    chosen
}

/// The graph-level meaning of storing `values` in bf16: each is read through
/// `cast(cast(v, bf16), f32)` by every op that read it (one round trip per value, named
/// `…/autocast`, on the value's device). The reference executor runs a graph rewritten this
/// way to check a program whose buffers of those values are bf16: the program computes, up to
/// f32 summation order, what this graph does. Errors name a value that is not an f32 tensor.
pub fn round_values(
    graph: &mut crate::ir::Graph,
    values: &[Value],
) -> Result<(), super::LowerError> {
    for &v in values {
        if graph.value_type(v).dtype != DType::F32 {
            return Err(super::LowerError::Unsupported {
                node: graph.value_name(v),
                op: graph.node(v.node).op.kind_name().to_string(),
                reason: format!(
                    "only f32 values are stored in bf16, this one is {}",
                    graph.value_type(v).dtype
                ),
            });
        }
        let uses = graph.uses(v);
        let device = graph.node(v.node).device;
        let rounded = super::autocast::add_round_trip(graph, v, super::HalfFormat::Bf16, device)?;
        for (node, slot) in uses {
            graph.replace_input(node, slot, rounded)?;
        }
    }
    Ok(())
}
