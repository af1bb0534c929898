//! Rendering: every kernel of a lowered [`Program`] becomes CUDA C.
//!
//! A kernel's source is the prelude (`kernels/common.cuh`), a *generated part* and one of the
//! hand-written bodies of `kernels/` ([`Body`]). The generated part holds the launch constants
//! the body relies on (`TP_BLOCK`, extents), the parameter struct ([`params`]: one descriptor
//! yields the C struct and the host packing) and the hooks the body calls: fused expressions
//! ([`cexpr`]) over strided views ([`index`]) for elementwise kernels, reduction prologues and
//! the epilogues of matrix products and convolutions ([`fused`]); fixed-function geometry for
//! the rest ([`fixed`]). Launch shapes — grids, GEMM tiles, splits of long reductions — come
//! from [`launch`]. Nothing is ever spliced into a body's text.

pub mod cexpr;
pub mod fixed;
pub mod fused;
pub mod index;
pub mod launch;
pub mod params;

use super::bodies::{Body, COMMON};
use crate::ir::ReduceOp;
use crate::lower::{BufferId, KernelKind, Program, Storage};
use crate::tensor::DType;
pub use launch::Target;
pub use params::{AddressOf, FieldKind, ParamStruct};

/// Threads per block of every kernel.
pub const BLOCK: u32 = 256;
/// The most blocks a grid-stride kernel launches.
const MAX_BLOCKS: usize = 8192;

/// Why a kernel cannot be rendered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RenderError {
    #[error("`{what}` is {value}, beyond what a 32-bit kernel parameter holds")]
    TooLarge { what: String, value: usize },
    #[error("{0}")]
    Unsupported(String),
}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchDims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

impl LaunchDims {
    /// A grid of blocks of [`BLOCK`] threads, no dynamic shared memory.
    pub fn blocks(grid: [u32; 3]) -> LaunchDims {
        LaunchDims {
            grid,
            block: [BLOCK, 1, 1],
            shared_bytes: 0,
        }
    }

    /// A 1-D grid of `blocks` blocks of [`BLOCK`] threads.
    pub fn linear(blocks: usize) -> LaunchDims {
        LaunchDims::blocks([u32::try_from(blocks.max(1)).unwrap_or(u32::MAX), 1, 1])
    }

    /// A grid-stride launch over `points` items.
    pub fn over(points: usize) -> LaunchDims {
        LaunchDims::linear(points.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS))
    }
}

/// One kernel launch, rendered.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderedKernel {
    pub body: Body,
    /// The generated part of the source (what varies per launch).
    pub generated: String,
    pub params: ParamStruct,
    pub launch: LaunchDims,
    /// Bytes of zeroed device memory the launch needs beside its buffers (partials and arrival
    /// counters of a split reduction; see [`FieldKind::Workspace`]), 0 for none. The kernel
    /// leaves its counters at zero again, so the workspace is allocated once and reused by
    /// every launch (and every replay of a captured step).
    pub workspace_bytes: usize,
}

impl RenderedKernel {
    /// The complete CUDA C source NVRTC compiles.
    pub fn source(&self) -> String {
        let mut s = String::with_capacity(COMMON.len() + self.generated.len() + 8192);
        s.push_str(COMMON);
        s.push_str("\n// ---- generated ----\n");
        s.push_str(&self.generated);
        for h in self.body.headers() {
            s.push('\n');
            s.push_str(h);
        }
        s.push_str("\n// ---- kernels/");
        s.push_str(self.body.file());
        s.push_str(" ----\n");
        s.push_str(self.body.text());
        s
    }
}

/// What running one kernel of a program takes.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelPlan {
    /// One launch of a rendered kernel.
    Launch(RenderedKernel),
    /// A device copy of `len` f32 elements, then a cross-process reduction (no kernel).
    AllReduce { op: ReduceOp, len: usize },
    /// Nothing to do (an empty iteration space).
    Empty,
}

/// Renders kernel `index` of `program` for the default [`Target`] (an H100).
pub fn render_kernel(program: &Program, index: usize) -> Result<KernelPlan, RenderError> {
    render_kernel_for(program, index, &Target::default())
}

/// Renders kernel `index` of `program` with launch shapes chosen for `target`.
pub fn render_kernel_for(
    program: &Program,
    index: usize,
    target: &Target,
) -> Result<KernelPlan, RenderError> {
    let k = &program.kernels[index];
    Ok(match &k.kind {
        KernelKind::Elementwise { shape, expr } => {
            if shape.iter().product::<usize>() == 0 {
                return Ok(KernelPlan::Empty);
            }
            KernelPlan::Launch(fused::elementwise(program, k, shape, expr)?)
        }
        KernelKind::Reduce {
            shape,
            axes,
            prologue,
            ops,
            finish,
        } => {
            let kept: usize = (0..shape.len())
                .filter(|d| !axes.contains(d))
                .map(|d| shape[d])
                .product();
            if kept == 0 {
                return Ok(KernelPlan::Empty);
            }
            KernelPlan::Launch(fused::reduce(
                program,
                k,
                shape,
                axes,
                (prologue, ops, finish.as_ref()),
                target,
            )?)
        }
        KernelKind::AllReduce { op, len } => {
            expect_f32(
                "the all-reduce input",
                program.buffer(k.inputs[0].buffer).dtype,
            )?;
            KernelPlan::AllReduce { op: *op, len: *len }
        }
        _ => match fixed::render(program, k, index, target)? {
            Some(r) => KernelPlan::Launch(r),
            None => KernelPlan::Empty,
        },
    })
}

/// A preprocessor integer of the generated part (for `#if` in bodies, which cannot evaluate the
/// casts of [`constant`]).
pub fn define(name: &str, value: usize) -> String {
    format!("#define {name} {value}\n")
}

/// The index type a kernel touching at most `extent` elements (or points) needs.
pub fn index_type(extent: usize) -> &'static str {
    if extent < (1usize << 31) {
        "unsigned int"
    } else {
        "unsigned long long"
    }
}

/// A compile-time constant of the generated part. A macro, not a namespace-scope `constexpr`:
/// NVRTC materialises those as module-scope `.global` variables.
pub fn constant(name: &str, c_type: &str, value: impl std::fmt::Display) -> String {
    format!("#define {name} (({c_type}){value})\n")
}

/// The byte range a buffer occupies in its storage, to decide aliasing.
fn storage_range(program: &Program, b: BufferId) -> (Storage, usize, usize) {
    let buf = program.buffer(b);
    let (start, key) = match buf.storage {
        Storage::Scratch { device, offset } => (offset, Storage::Scratch { device, offset: 0 }),
        Storage::State { device, offset } => (offset, Storage::State { device, offset: 0 }),
        Storage::Constant(i) => (0, Storage::Constant(i)),
    };
    (key, start, start + buf.bytes())
}

/// True when `view`'s first element is 16-byte aligned in device memory (storages and staging
/// copies start 256-byte aligned), so 128-bit loads may read it.
pub fn aligned16(program: &Program, view: &crate::lower::View) -> bool {
    let (_, start, _) = storage_range(program, view.buffer);
    let size = program.buffer(view.buffer).dtype.size_bytes();
    (start + view.offset * size).is_multiple_of(16)
}

/// True when buffers `a` and `b` share bytes.
pub fn overlaps(program: &Program, a: BufferId, b: BufferId) -> bool {
    let (ka, sa, ea) = storage_range(program, a);
    let (kb, sb, eb) = storage_range(program, b);
    ka == kb && sa < eb && sb < ea
}

/// Loads through the read-only cache unless the kernel also writes the buffer.
pub fn load_expr(ptr: &str, index: &str, read_only: bool) -> String {
    if read_only {
        format!("__ldg(&{ptr}[{index}])")
    } else {
        format!("{ptr}[{index}]")
    }
}

/// The largest index a kernel computes: its buffers' lengths and `points` of its space.
pub fn kernel_extent(program: &Program, k: &crate::lower::Kernel, points: usize) -> usize {
    k.inputs
        .iter()
        .map(|v| v.buffer)
        .chain(k.outputs.iter().copied())
        .map(|b| program.buffer(b).len())
        .fold(points, usize::max)
}

/// Checks that `dtype` is f32 for a fixed-function operand.
pub fn expect_f32(what: &str, dtype: DType) -> Result<(), RenderError> {
    if dtype == DType::F32 {
        Ok(())
    } else {
        Err(RenderError::Unsupported(format!(
            "{what} is {dtype}; the CUDA kernels of this kind take f32"
        )))
    }
}
