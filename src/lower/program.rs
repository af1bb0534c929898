//! `Program`: the backend-neutral result of lowering — kernels over planned buffers.
//!
//! Kernels are data (a kind with its geometry, and fused expressions), never source text: the CPU
//! backend interprets them and the CUDA backend renders them to C. Buffers live in a per-device
//! scratch arena at offsets chosen by the memory planner, in a variable's persistent storage (so
//! assigns can be done in place), or among the program's constants. Variables live in a
//! per-device state arena whose layout ([`StateLayout`]) is fixed per graph.

use super::expr::FusedExpr;
use super::layout::StateLayout;
use crate::ir::{NodeId, PoolKind, ReduceOp, VarId};
use crate::tensor::{DType, HostTensor};
use smallvec::SmallVec;
use std::fmt;

/// Index of a buffer in [`Program::buffers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u32);

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

/// Where a buffer's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Storage {
    /// A region of `device`'s scratch arena, `offset` bytes from its start (64-byte aligned).
    Scratch { device: u16, offset: usize },
    /// Bytes of `device`'s persistent state arena (see [`super::layout::StateLayout`]): a
    /// variable, or a contiguous range of variables updated together.
    State { device: u16, offset: usize },
    /// Constant `i` of [`Program::constants`].
    Constant(u32),
}

/// A dense, row-major tensor buffer.
///
/// A buffer in [`Storage::State`] is either read-only — variables' values as at the start of
/// the step — or written by one kernel: the new value of a variable assigned in place, or of
/// a contiguous range of variables updated by one fused kernel. Kernels never read a start
/// value after a new value was written over it ([`mod@super::verify`] checks it).
#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    /// The graph value it holds (for errors and printing).
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub storage: Storage,
    /// For a range — a gradient arena, a bucket all-reduce's range, or a part of one — the
    /// scratch buffers it spans, back to back in this order, each written by its own kernel
    /// (or by a kernel writing the whole range). Empty for every other buffer.
    pub members: Vec<BufferId>,
}

impl Buffer {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True for a buffer without elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype.size_bytes()
    }
}

/// How a kernel reads an operand: element `offset + Σ index[d]·strides[d]` of `buffer` at point
/// `index` of the kernel's iteration space. A stride of 0 broadcasts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct View {
    pub buffer: BufferId,
    pub offset: usize,
    pub strides: SmallVec<[usize; 4]>,
}

impl View {
    /// The identity view of a contiguous buffer of `shape`.
    pub fn contiguous(buffer: BufferId, shape: &[usize]) -> View {
        View {
            buffer,
            offset: 0,
            strides: contiguous_strides(shape),
        }
    }

    /// True when this is the identity view of a contiguous tensor of `shape`.
    pub fn is_contiguous(&self, shape: &[usize]) -> bool {
        self.offset == 0 && same_strides(&self.strides, &contiguous_strides(shape), shape)
    }
}

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> SmallVec<[usize; 4]> {
    let mut s: SmallVec<[usize; 4]> = SmallVec::from_elem(0, shape.len());
    let mut acc = 1;
    for d in (0..shape.len()).rev() {
        s[d] = acc;
        acc *= shape[d];
    }
    s
}

/// Strides are equivalent when they agree on every axis longer than 1.
fn same_strides(a: &[usize], b: &[usize], shape: &[usize]) -> bool {
    a.len() == b.len() && (0..a.len()).all(|d| shape[d] <= 1 || a[d] == b[d])
}

/// Geometry of a (batched) matrix product `[batch, m, k] x [batch?, k, n] -> [batch, m, n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatMulGeom {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub transpose_a: bool,
    pub transpose_b: bool,
    /// False when the right operand is one `[k, n]` matrix shared by every batch entry.
    pub rhs_batched: bool,
    /// Both operands are rounded to this 16-bit format before they are multiplied (the casts
    /// the `autocast` pass put on them, absorbed by the kernel); products accumulate in f32.
    pub round_operands: Option<super::HalfFormat>,
}

/// Geometry of a 2-D convolution over NHWC input and HWIO filter (`i = c / groups`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeom {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub oh: usize,
    pub ow: usize,
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// Padding `[top, bottom, left, right]`.
    pub pad: [usize; 4],
    pub groups: usize,
    /// Both operands are rounded to this 16-bit format before they are multiplied (as
    /// [`MatMulGeom::round_operands`]).
    pub round_operands: Option<super::HalfFormat>,
}

/// Geometry of a 2-D pooling window over NHWC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolGeom {
    pub kind: PoolKind,
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub oh: usize,
    pub ow: usize,
    pub window: [usize; 2],
    pub stride: [usize; 2],
    /// Padding `[top, bottom, left, right]`.
    pub pad: [usize; 4],
}

/// A fused elementwise computation applied to a kernel's result while it is hot.
///
/// `Load(0)` is the kernel's own result element; `Load(i)` for `i ≥ 1` reads the kernel's extra
/// input `main_inputs + i - 1` through its view over the output space. Its outputs are the
/// kernel's outputs.
///
/// With `reductions` (only when lowered with [`LowerOptions::epilogue_reductions`]), the last
/// `reductions.len()` outputs of `expr` are not stored per point: output `j` of them is
/// reduced with `reductions[j]` over every axis but the last (the channels), into a `[channels]`
/// buffer — batch-norm statistics and gradient sums gathered while the output is in cache.
/// The other outputs come first and are stored as usual.
///
/// [`LowerOptions::epilogue_reductions`]: super::LowerOptions::epilogue_reductions
#[derive(Clone, Debug, PartialEq)]
pub struct Epilogue {
    pub expr: FusedExpr,
    pub reductions: Vec<ChannelReduction>,
    /// Elementwise operations on the reductions' results, per channel, computed as they are
    /// stored instead of by a launch of its own: batch norm's `rsqrt(variance + ε)` after its
    /// variance. As a reduction's [`ReduceFinish`] over `[channels]`: `Load(j)` for
    /// `j < reductions.len()` reads reduction `j`'s result, `Load(reductions.len() + i)` the
    /// kernel's input `first_input + i`; its outputs are the kernel's last. Lowering makes one
    /// only of a single [`ChannelReduction::Variance`]'s result (which the CUDA kernels hold in
    /// the block that merges it).
    pub finish: Option<ReduceFinish>,
}

/// How an [`Epilogue`] reduces one of its outputs over every axis but the channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelReduction {
    Sum,
    Mean,
    /// The biased variance, `mean((x - mean(x))²)`, in one pass (only with
    /// [`LowerOptions::epilogue_variances`]): each block of rows sums `x - K` and `(x - K)²`
    /// about a value `K` of its own data, and the blocks' sums merge re-centred on one another's
    /// `K` — no second pass over `x` once its mean is known, and as accurate as the two-pass form
    /// whatever the data's offset.
    ///
    /// [`LowerOptions::epilogue_variances`]: super::LowerOptions::epilogue_variances
    Variance,
}

impl ChannelReduction {
    /// Its name as the program prints it (the reductions' names of [`ReduceOp::name`]).
    pub fn name(self) -> &'static str {
        match self {
            ChannelReduction::Sum => ReduceOp::Sum.name(),
            ChannelReduction::Mean => ReduceOp::Mean.name(),
            ChannelReduction::Variance => "reduce_variance",
        }
    }
}

impl Epilogue {
    /// An epilogue that stores every output of `expr`.
    pub fn elementwise(expr: FusedExpr) -> Epilogue {
        Epilogue {
            expr,
            reductions: Vec::new(),
            finish: None,
        }
    }

    /// Number of outputs stored per point (the kernel's first outputs).
    pub fn stored_outputs(&self) -> usize {
        self.expr.outputs.len() - self.reductions.len()
    }
}

/// A fused elementwise computation that produces a convolution's input `x` as the kernel reads
/// it, instead of a kernel of its own writing `x` out (batch norm's apply and ReLU before a
/// convolution: [`LowerOptions::conv_prologues`]).
///
/// `Load(0)` reads the kernel's input 0 — a tensor of `x`'s shape, through an identity view —
/// and `Load(j)` for `j ≥ 1` reads the kernel's input `first_input + j - 1` through its view over
/// `x`'s space (per-channel values, scalars). `expr` has one `f32` output: `x` at that point.
/// Zero padding pads `x`, the prologue's result, not its operands.
///
/// [`LowerOptions::conv_prologues`]: super::LowerOptions::conv_prologues
#[derive(Clone, Debug, PartialEq)]
pub struct Prologue {
    pub expr: FusedExpr,
    pub first_input: usize,
}

impl Prologue {
    /// The kernel input `Load(j)` of [`Prologue::expr`] reads.
    pub fn input_of(&self, load: usize) -> usize {
        if load == 0 {
            0
        } else {
            self.first_input + load - 1
        }
    }
}

/// Elementwise operations on a reduction's results, computed by the reduction kernel as it
/// stores them instead of by a kernel of their own (batch norm's `rsqrt(variance + ε)`: a
/// launch of a handful of points after every variance).
///
/// `expr` runs once per output point, over `shape` (the reduction's output space: as many
/// points as the reduction has outputs, in the same order). `Load(j)` for `j < ops.len()` reads
/// reduction `j`'s result at that point (as stored: a mean already divided); `Load(ops.len() + i)`
/// reads the kernel's input `first_input + i` through its view over `shape`. Its outputs are the
/// kernel's outputs after the reductions'.
#[derive(Clone, Debug, PartialEq)]
pub struct ReduceFinish {
    pub shape: Vec<usize>,
    pub expr: FusedExpr,
    pub first_input: usize,
}

/// What a kernel computes. Inputs and outputs are listed on the [`Kernel`].
#[derive(Clone, Debug, PartialEq)]
pub enum KernelKind {
    /// `expr` at every point of `shape`; inputs are read through views over `shape`, outputs
    /// are contiguous tensors of `shape`.
    Elementwise { shape: Vec<usize>, expr: FusedExpr },
    /// Reductions of `shape` over `axes`: `prologue` computes, at each input point, one value per
    /// entry of `ops`; output `j` holds reduction `ops[j]` of prologue output `j`, with the
    /// reduced axes removed. With a [`ReduceFinish`], outputs `ops.len()..` are its expression's,
    /// computed from the reduced values as they are stored.
    Reduce {
        shape: Vec<usize>,
        axes: Vec<usize>,
        prologue: FusedExpr,
        ops: Vec<ReduceOp>,
        finish: Option<ReduceFinish>,
    },
    /// Inputs `(a, b, extra...)`.
    MatMul(MatMulGeom, Option<Epilogue>),
    /// Inputs `(x, filter, extra...)`; with a [`Prologue`], `x` is computed from input 0 and
    /// the prologue's inputs (the last ones).
    Conv2d(ConvGeom, Option<Epilogue>, Option<Prologue>),
    /// Inputs `(dy, filter, extra...)`; output `dx`.
    Conv2dBackpropInput(ConvGeom, Option<Epilogue>),
    /// Inputs `(x, dy, extra...)`; output `dfilter` (through the epilogue: a weight decay's
    /// term added as the gradient is stored). With a [`Prologue`], as [`KernelKind::Conv2d`].
    Conv2dBackpropFilter(ConvGeom, Option<Epilogue>, Option<Prologue>),
    /// Input `x`.
    Pool(PoolGeom),
    /// Inputs `(x, dy)`; output `dx` (each `dy` to the first maximum of its window).
    MaxPoolGrad(PoolGeom),
    /// Input `dy`; output `dx`.
    AvgPoolGrad(PoolGeom),
    /// Row-wise (log-)softmax of a `[rows, cols]` input.
    Softmax { rows: usize, cols: usize, log: bool },
    /// Inputs `(logits [rows, classes], labels [rows])`; output the per-row loss.
    SparseSoftmaxCrossEntropy { rows: usize, classes: usize },
    /// Argmax over the middle axis of `[outer, len, inner]`, as `i64`.
    ArgMax {
        outer: usize,
        len: usize,
        inner: usize,
    },
    /// Inputs `(predictions [rows, classes], targets [rows])`; output `bool [rows]`.
    InTopK {
        rows: usize,
        classes: usize,
        k: usize,
    },
    /// Joins the inputs along the middle axis of `[outer, size_i, inner]`.
    Concat {
        outer: usize,
        sizes: Vec<usize>,
        inner: usize,
    },
    /// Copies its input to its output (nothing to copy when the output is the input's own
    /// buffer: the in-place all-reduce of a bucket, see [`super::collectives`]), which the
    /// session's collective engine (if any) then reduces across the participants of a
    /// distributed job (`len` f32 elements).
    AllReduce { op: ReduceOp, len: usize },
    /// Zero padding of a `shape` input by `(before, after)` per axis.
    Pad {
        shape: Vec<usize>,
        pads: Vec<(usize, usize)>,
    },
}

impl KernelKind {
    /// Short name used in printed programs and generated kernel names.
    pub fn name(&self) -> &'static str {
        match self {
            KernelKind::Elementwise { .. } => "elementwise",
            KernelKind::Reduce { .. } => "reduce",
            KernelKind::MatMul(..) => "matmul",
            KernelKind::Conv2d(..) => "conv2d",
            KernelKind::Conv2dBackpropInput(..) => "conv2d_backprop_input",
            KernelKind::Conv2dBackpropFilter(..) => "conv2d_backprop_filter",
            KernelKind::Pool(g) => match g.kind {
                PoolKind::Max => "max_pool",
                PoolKind::Avg => "avg_pool",
            },
            KernelKind::MaxPoolGrad(_) => "max_pool_grad",
            KernelKind::AvgPoolGrad(_) => "avg_pool_grad",
            KernelKind::Softmax { log: false, .. } => "softmax",
            KernelKind::Softmax { log: true, .. } => "log_softmax",
            KernelKind::SparseSoftmaxCrossEntropy { .. } => "sparse_softmax_cross_entropy",
            KernelKind::ArgMax { .. } => "argmax",
            KernelKind::InTopK { .. } => "in_top_k",
            KernelKind::Concat { .. } => "concat",
            KernelKind::Pad { .. } => "pad",
            KernelKind::AllReduce { .. } => "all_reduce",
        }
    }

    /// The epilogue of a kernel kind that takes one.
    pub fn epilogue(&self) -> Option<&Epilogue> {
        match self {
            KernelKind::MatMul(_, e)
            | KernelKind::Conv2d(_, e, _)
            | KernelKind::Conv2dBackpropInput(_, e)
            | KernelKind::Conv2dBackpropFilter(_, e, _) => e.as_ref(),
            _ => None,
        }
    }

    /// The prologue computing a convolution's input `x`, if it has one.
    pub fn prologue(&self) -> Option<&Prologue> {
        match self {
            KernelKind::Conv2d(_, _, p) | KernelKind::Conv2dBackpropFilter(_, _, p) => p.as_ref(),
            _ => None,
        }
    }

    /// The positions among a kernel's `inputs` inputs that its epilogue's `Load(1..)` read: after
    /// the main inputs, before a prologue's and an epilogue finish's.
    pub fn epilogue_inputs(&self, inputs: usize) -> std::ops::Range<usize> {
        let prologue = self.prologue().map_or(inputs, |p| p.first_input);
        let finish = self
            .epilogue()
            .and_then(|e| e.finish.as_ref())
            .map_or(inputs, |f| f.first_input);
        let end = prologue.min(finish).min(inputs);
        self.main_inputs().min(end)..end
    }

    /// Number of inputs the kernel itself reads before any epilogue inputs.
    pub fn main_inputs(&self) -> usize {
        match self {
            KernelKind::MatMul(..)
            | KernelKind::Conv2d(..)
            | KernelKind::Conv2dBackpropInput(..)
            | KernelKind::Conv2dBackpropFilter(..)
            | KernelKind::MaxPoolGrad(_)
            | KernelKind::SparseSoftmaxCrossEntropy { .. }
            | KernelKind::InTopK { .. } => 2,
            _ => 1,
        }
    }
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The scoped name of the (last) graph node it computes.
    pub name: String,
    /// The logical device whose stream runs it.
    pub device: u16,
    pub kind: KernelKind,
    pub inputs: Vec<View>,
    pub outputs: Vec<BufferId>,
}

/// A contiguous tensor inside a buffer: `shape` elements from element `offset`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    pub buffer: BufferId,
    pub offset: usize,
    pub shape: Vec<usize>,
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.buffer)?;
        if self.offset != 0 {
            write!(f, "+{}", self.offset)?;
        }
        write!(f, "{:?}", self.shape)
    }
}

/// A fused update kernel over a bucket of contiguous variables (see [`super::arena`]): what a
/// backend needs to find the gradient arenas of the bucket, and the all-reduces over them.
///
/// Each arena is one contiguous scratch buffer of `len` elements laid out like the bucket's
/// state range: member `i`'s gradient at elements `offsets[i]..offsets[i] + sizes[i]`. With
/// data-parallel towers there is one arena per tower, in the order the kernel reads them, all
/// with this same layout; the kernel averages them and applies the update in one pass. In a
/// distributed step, each arena is first all-reduced in place across the job's participants
/// by one `AllReduce` kernel ([`Bucket::all_reduces`]), so the kernel's average over the
/// towers is the average over every tower of every participant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// The kernel, an index into [`Program::kernels`].
    pub kernel: u32,
    /// The gradient arenas the kernel reads (scratch buffers of `len` elements).
    pub arenas: Vec<BufferId>,
    /// The `AllReduce` kernels (indices into [`Program::kernels`], each before `kernel`) that
    /// reduce arenas of this bucket in place: one per arena of all-reduced gradients in a
    /// distributed step, none otherwise. Their input and output are the range of a bucket of
    /// all-reduces, which is the arena buffer itself or contains it (the arena then starts
    /// at its first member's place in the range).
    pub all_reduces: Vec<u32>,
    /// The variables the kernel writes: `outputs[j][i]` is member `i` of its output `j` (a
    /// variable and, say, its momentum slot), in arena order.
    pub outputs: Vec<Vec<VarId>>,
    /// Element offset of each member in the arenas and in the state ranges.
    pub offsets: Vec<usize>,
    /// Elements per bucket.
    pub len: usize,
}

/// The lowered form of one step of a graph, for one batch size.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Program {
    /// The batch size `N` was bound to.
    pub batch: usize,
    pub buffers: Vec<Buffer>,
    pub constants: Vec<HostTensor>,
    /// Kernels in execution order.
    pub kernels: Vec<Kernel>,
    /// Feeds: each `Input` node's value is copied into its buffer before the first kernel.
    pub feeds: Vec<(NodeId, BufferId)>,
    /// The step's fetches, in order; read after the last kernel.
    pub fetches: Vec<Region>,
    /// Assigns not done in place: region copied into the variable after the last kernel.
    pub writebacks: Vec<(Region, VarId)>,
    /// Bytes of scratch arena per device.
    pub arena_bytes: Vec<usize>,
    /// Where the graph's variables live (the same for every program of a graph).
    pub state: StateLayout,
    /// Cross-device ordering: kernel `i` starts only after kernels `waits[i]` (on other
    /// devices) have finished. Each device runs its own kernels in order, so these are the only
    /// synchronisation points: true data dependencies and reuse of memory another device still
    /// reads. Empty when the program uses one device.
    pub waits: Vec<Vec<u32>>,
    /// The fused update kernels and their gradient arenas, in kernel order.
    pub buckets: Vec<Bucket>,
    /// How its matrix products and convolutions multiply (from
    /// [`LowerOptions::precision`](super::LowerOptions::precision)).
    pub precision: super::Precision,
}

impl Program {
    /// The buffer `id`.
    pub fn buffer(&self, id: BufferId) -> &Buffer {
        &self.buffers[id.0 as usize]
    }

    /// Total planned scratch bytes over all devices (the peak: the arena holds every live
    /// buffer at once).
    pub fn peak_bytes(&self) -> usize {
        self.arena_bytes.iter().sum()
    }

    /// The logical devices the program's kernels run on (at least device 0).
    pub fn devices(&self) -> usize {
        self.kernels
            .iter()
            .map(|k| usize::from(k.device) + 1)
            .max()
            .unwrap_or(1)
    }

    /// Number of kernels of each kind, sorted by kind name.
    pub fn kernel_histogram(&self) -> Vec<(&'static str, usize)> {
        let mut h: std::collections::BTreeMap<&'static str, usize> = Default::default();
        for k in &self.kernels {
            *h.entry(k.kind.name()).or_default() += 1;
        }
        h.into_iter().collect()
    }
}

fn write_view(f: &mut fmt::Formatter<'_>, v: &View) -> fmt::Result {
    write!(f, "{}", v.buffer)?;
    if v.offset != 0 {
        write!(f, "+{}", v.offset)?;
    }
    write!(f, "{:?}", v.strides.as_slice())
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} `{}` dev{} (",
            self.kind.name(),
            self.name,
            self.device
        )?;
        for (i, v) in self.inputs.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write_view(f, v)?;
        }
        f.write_str(") -> ")?;
        let outs: Vec<String> = self.outputs.iter().map(|b| b.to_string()).collect();
        write!(f, "[{}]", outs.join(", "))?;
        match &self.kind {
            KernelKind::Elementwise { shape, expr } => write!(f, "\n      over {shape:?}: {expr}"),
            KernelKind::Reduce {
                shape,
                axes,
                prologue,
                ops,
                finish,
            } => {
                let names: Vec<&str> = ops.iter().map(|o| o.name()).collect();
                write!(
                    f,
                    "\n      {} of {shape:?} over axes {axes:?}: {prologue}",
                    names.join(",")
                )?;
                match finish {
                    Some(r) => {
                        let results = match ops.len() {
                            1 => "in0: the result".to_string(),
                            n => format!("in0..in{}: the results", n - 1),
                        };
                        write!(
                            f,
                            "\n      finish over {:?} ({results}; in{}..: inputs {}..): {}",
                            r.shape,
                            ops.len(),
                            r.first_input,
                            r.expr
                        )
                    }
                    None => Ok(()),
                }
            }
            KernelKind::MatMul(g, e) => {
                write!(
                    f,
                    "\n      MatMulGeom {{ batch: {}, m: {}, n: {}, k: {}, transpose_a: {}, \
                     transpose_b: {}, rhs_batched: {} }}",
                    g.batch, g.m, g.n, g.k, g.transpose_a, g.transpose_b, g.rhs_batched
                )?;
                write_rounding(f, g.round_operands)?;
                write_epilogue(f, e.as_ref())
            }
            KernelKind::Conv2d(g, e, p) | KernelKind::Conv2dBackpropFilter(g, e, p) => {
                write_conv(f, g)?;
                if let Some(p) = p {
                    write!(
                        f,
                        "\n      prologue (inputs 0, {}..): {}",
                        p.first_input, p.expr
                    )?;
                }
                write_epilogue(f, e.as_ref())
            }
            KernelKind::Conv2dBackpropInput(g, e) => {
                write_conv(f, g)?;
                write_epilogue(f, e.as_ref())
            }
            KernelKind::Pool(g) | KernelKind::MaxPoolGrad(g) | KernelKind::AvgPoolGrad(g) => {
                write!(
                    f,
                    "\n      {}x{}x{}x{} window {:?} stride {:?} pad {:?}",
                    g.n, g.h, g.w, g.c, g.window, g.stride, g.pad
                )
            }
            other => {
                let dbg = format!("{other:?}");
                let body = dbg.split_once(' ').map_or("", |(_, b)| b);
                if body.is_empty() {
                    Ok(())
                } else {
                    write!(f, "\n      {body}")
                }
            }
        }
    }
}

fn write_conv(f: &mut fmt::Formatter<'_>, g: &ConvGeom) -> fmt::Result {
    write!(
        f,
        "\n      {}x{}x{}x{} * {}x{}x{}x{} -> {}x{} stride {:?} dilation {:?} pad {:?} groups {}",
        g.n,
        g.h,
        g.w,
        g.c,
        g.kh,
        g.kw,
        g.c / g.groups.max(1),
        g.o,
        g.oh,
        g.ow,
        g.stride,
        g.dilation,
        g.pad,
        g.groups
    )?;
    write_rounding(f, g.round_operands)
}

/// The operand rounding of a GEMM kernel, when it has one.
fn write_rounding(f: &mut fmt::Formatter<'_>, r: Option<super::HalfFormat>) -> fmt::Result {
    match r {
        Some(h) => write!(f, "\n      operands rounded to {h}"),
        None => Ok(()),
    }
}

fn write_epilogue(f: &mut fmt::Formatter<'_>, e: Option<&Epilogue>) -> fmt::Result {
    let Some(e) = e else { return Ok(()) };
    write!(f, "\n      epilogue: {}", e.expr)?;
    if !e.reductions.is_empty() {
        let names: Vec<&str> = e.reductions.iter().map(|o| o.name()).collect();
        write!(
            f,
            "\n      per channel: {} of the last {} outputs",
            names.join(","),
            names.len()
        )?;
    }
    if let Some(r) = &e.finish {
        write!(
            f,
            "\n      finish over {:?} (in0..in{}: the per-channel results; in{}..: inputs {}..): {}",
            r.shape,
            e.reductions.len().saturating_sub(1),
            e.reductions.len(),
            r.first_input,
            r.expr
        )?;
    }
    Ok(())
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "program: batch {}, {} kernels, {} buffers, scratch {} bytes",
            self.batch,
            self.kernels.len(),
            self.buffers.len(),
            self.peak_bytes()
        )?;
        // FP32 programs print as before; another precision is named.
        if self.precision != super::Precision::Fp32 {
            writeln!(f, "precision: {}", self.precision)?;
        }
        writeln!(f, "buffers:")?;
        for (i, b) in self.buffers.iter().enumerate() {
            let place = match b.storage {
                Storage::Scratch { device, offset } => format!("scratch dev{device} @{offset}"),
                Storage::State { device, offset } => format!("state dev{device} @{offset}"),
                Storage::Constant(c) => format!("constant #{c}"),
            };
            writeln!(f, "  b{i} {}{:?} {place}  `{}`", b.dtype, b.shape, b.name)?;
        }
        writeln!(f, "kernels:")?;
        for (i, k) in self.kernels.iter().enumerate() {
            writeln!(f, "  k{i} {k}")?;
            if let Some(w) = self.waits.get(i).filter(|w| !w.is_empty()) {
                let w: Vec<String> = w.iter().map(|j| format!("k{j}")).collect();
                writeln!(f, "      waits for {}", w.join(", "))?;
            }
        }
        let feeds: Vec<String> = self.feeds.iter().map(|(_, b)| b.to_string()).collect();
        let fetches: Vec<String> = self.fetches.iter().map(|r| r.to_string()).collect();
        let wb: Vec<String> = self
            .writebacks
            .iter()
            .map(|(r, v)| format!("{r}->#{}", v.0))
            .collect();
        writeln!(f, "feeds: [{}]", feeds.join(", "))?;
        writeln!(f, "fetches: [{}]", fetches.join(", "))?;
        write!(f, "writebacks: [{}]", wb.join(", "))
    }
}
