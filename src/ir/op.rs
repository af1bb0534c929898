//! The operation set of the op graph: one typed enum, no trait objects.
//!
//! Elementwise ops broadcast like NumPy. Images are NHWC and convolution filters HWIO.
//! Variables are read by `Variable` nodes and written by `Assign` nodes. Within one step every
//! read sees the value the variable held when the step began, and the assigns take effect when
//! it ends.

use super::shape::{Shape, TensorType};
use crate::tensor::{DType, HostTensor};
use std::fmt;

/// Index of a variable in its graph's variable table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(pub u32);

/// Elementwise ops of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    Neg,
    Abs,
    Sign,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Square,
    Recip,
    Relu,
    Sigmoid,
    Tanh,
    Floor,
    /// Logical negation of a `bool` tensor.
    Not,
}

impl UnaryOp {
    /// Every unary op, in a fixed order.
    pub const ALL: [UnaryOp; 14] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sign,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Square,
        UnaryOp::Recip,
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Floor,
        UnaryOp::Not,
    ];

    /// The op's name in the textual IR.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Square => "square",
            UnaryOp::Recip => "recip",
            UnaryOp::Relu => "relu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Floor => "floor",
            UnaryOp::Not => "not",
        }
    }

    /// True for ops defined only on floating-point inputs.
    pub fn needs_float(self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Not
        )
    }
}

/// Elementwise ops of two broadcast operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// Logical and of `bool` tensors.
    And,
    /// Logical or of `bool` tensors.
    Or,
}

impl BinaryOp {
    /// Every binary op, in a fixed order.
    pub const ALL: [BinaryOp; 15] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::And,
        BinaryOp::Or,
    ];

    /// The op's name in the textual IR.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
        }
    }

    /// True for comparisons, whose result is `bool`.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }

    /// True for the logical ops, defined on `bool` only.
    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or)
    }
}

/// Reductions over a set of axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
}

impl ReduceOp {
    /// Every reduction, in a fixed order.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];

    /// The op's name in the textual IR (`reduce_sum`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "reduce_sum",
            ReduceOp::Mean => "reduce_mean",
            ReduceOp::Max => "reduce_max",
            ReduceOp::Min => "reduce_min",
        }
    }
}

/// Spatial padding of a convolution or pooling window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Padding {
    /// Output size `ceil(in / stride)`, padding split with the extra cell at the end (as TF).
    Same,
    /// No padding.
    Valid,
    /// Explicit `[(top, bottom), (left, right)]`.
    Explicit([(usize, usize); 2]),
}

/// Attributes of a 2-D convolution (NHWC input, HWIO filter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dAttrs {
    pub strides: [usize; 2],
    pub padding: Padding,
    pub dilations: [usize; 2],
    pub groups: usize,
}

impl Default for Conv2dAttrs {
    fn default() -> Self {
        Conv2dAttrs {
            strides: [1, 1],
            padding: Padding::Same,
            dilations: [1, 1],
            groups: 1,
        }
    }
}

/// Max or average pooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Max,
    Avg,
}

/// Attributes of a 2-D pooling window over NHWC.
///
/// Average pooling with padding divides by the number of cells inside the input (as TF).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolAttrs {
    pub kind: PoolKind,
    pub window: [usize; 2],
    pub strides: [usize; 2],
    pub padding: Padding,
}

/// How a variable's initial value is drawn.
#[derive(Clone, Debug, PartialEq)]
pub enum Initializer {
    Zeros,
    Ones,
    Constant(f64),
    /// Uniform in `[low, high)`.
    Uniform {
        low: f64,
        high: f64,
    },
    /// Normal with the given mean and standard deviation.
    Normal {
        mean: f64,
        stddev: f64,
    },
    /// Normal with re-drawing of samples outside two standard deviations.
    TruncatedNormal {
        mean: f64,
        stddev: f64,
    },
    /// Keras/TF `VarianceScaling`: `stddev = sqrt(scale / fan)`.
    VarianceScaling {
        scale: f64,
        mode: FanMode,
        distribution: Distribution,
    },
    /// An explicit value (its shape must equal the variable's).
    Value(HostTensor),
}

/// Which fan `VarianceScaling` divides by. For HWIO filters `fan_in = H·W·I`, `fan_out = H·W·O`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FanMode {
    FanIn,
    FanOut,
    FanAvg,
}

/// The distribution of `VarianceScaling`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Distribution {
    /// Normal with stddev `sqrt(scale/fan)` (TF's "untruncated_normal").
    Normal,
    /// Truncated normal corrected so the stddev is `sqrt(scale/fan)`.
    TruncatedNormal,
    /// Uniform in `±sqrt(3·scale/fan)`.
    Uniform,
}

/// One operation of the graph. See the module docs for the conventions.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    // ---- sources -------------------------------------------------------------------------
    /// A value fed at each step; `name` is the input's signature name (e.g. `image`).
    Input {
        name: String,
        ty: TensorType,
    },
    /// A constant tensor with a static shape.
    Constant {
        value: HostTensor,
    },
    /// Reads the value a variable held when the step began.
    Variable {
        var: VarId,
    },

    // ---- side effects --------------------------------------------------------------------
    /// Sets a variable to its single input when the step ends. No outputs.
    Assign {
        var: VarId,
    },
    /// Groups side effects into one named target (e.g. `train_op`). Control inputs only.
    Group,

    // ---- elementwise ---------------------------------------------------------------------
    /// Passes its input through; gives a value a stable name (`tf.identity(x, name=...)`).
    Identity,
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// `cond ? a : b`, all three broadcast together.
    Select,
    /// Converts the element type.
    Cast {
        to: DType,
    },

    // ---- layout --------------------------------------------------------------------------
    /// Same elements, new shape (`N` may stay leading if the input is batched).
    Reshape {
        shape: Shape,
    },
    /// Permutes the axes; the batch axis must stay first.
    Transpose {
        perm: Vec<usize>,
    },
    /// Broadcasts to a larger shape.
    Broadcast {
        shape: Shape,
    },
    /// Elements `start..end` of one fixed axis.
    Slice {
        axis: usize,
        start: usize,
        end: usize,
    },
    /// Joins its inputs along a fixed axis.
    Concat {
        axis: usize,
    },
    /// Zero padding, `(before, after)` per axis.
    Pad {
        pads: Vec<(usize, usize)>,
    },

    // ---- reductions ----------------------------------------------------------------------
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        keep_dims: bool,
    },
    /// Index of the largest element along `axis` (first on ties), as `i64`.
    ArgMax {
        axis: usize,
    },
    /// Mean and (biased) variance over `axes`: two outputs.
    Moments {
        axes: Vec<usize>,
        keep_dims: bool,
    },

    // ---- linear algebra ------------------------------------------------------------------
    /// `[.., M, K] x [.., K, N]` after optional transposes of the two last axes; the batch
    /// axes of both operands are equal, or the right operand has rank 2.
    MatMul {
        transpose_a: bool,
        transpose_b: bool,
    },
    /// 2-D convolution: input NHWC, filter `[KH, KW, C/groups, O]`.
    Conv2d(Conv2dAttrs),
    /// Gradient of `Conv2d` with respect to its input (the transposed convolution):
    /// inputs `(dy, filter)`, output `[N, H, W, C]` with `input_hw = [H, W]`.
    Conv2dBackpropInput {
        attrs: Conv2dAttrs,
        input_hw: [usize; 2],
    },
    /// Gradient of `Conv2d` with respect to its filter: inputs `(x, dy)`,
    /// output `[KH, KW, C/groups, O]` with `filter_hw = [KH, KW]`.
    Conv2dBackpropFilter {
        attrs: Conv2dAttrs,
        filter_hw: [usize; 2],
    },

    // ---- pooling -------------------------------------------------------------------------
    Pool(PoolAttrs),
    /// Gradient of max pooling: inputs `(x, dy)`; routes each `dy` to the first maximum.
    MaxPoolGrad(PoolAttrs),
    /// Gradient of average pooling: input `dy`, output `[N, H, W, C]` with `input_hw = [H, W]`.
    AvgPoolGrad {
        attrs: PoolAttrs,
        input_hw: [usize; 2],
    },

    // ---- activations and losses ----------------------------------------------------------
    Softmax {
        axis: usize,
    },
    LogSoftmax {
        axis: usize,
    },
    /// Per-example cross-entropy: inputs `(logits [N, C], labels [N] integer)`, output `[N]`.
    SparseSoftmaxCrossEntropy,
    /// `[.., depth]` `f32` one-hot encoding of an integer tensor (out-of-range labels give 0s).
    OneHot {
        depth: usize,
    },
    /// Whether each target is among the `k` largest predictions: `([N, C], [N])` to `bool [N]`.
    InTopK {
        k: usize,
    },

    // ---- randomness ----------------------------------------------------------------------
    /// Uniform `[0, 1)` samples shaped like its first input, from a counter-based generator:
    /// the value at flat index `i` is a pure function of `(seed, counter, i)`, where `counter`
    /// (second input, an integer scalar) is explicit RNG state such as the global step.
    /// The exact function is [`crate::ir::rng`]: every backend reproduces its bits.
    /// Reduces its input elementwise across every participant of a collective (the processes
    /// of a distributed job): each one receives the sum (or mean, max, min) of everyone's
    /// input. With a single participant it is the identity. Data-parallel trainers put it on
    /// (bucketed) gradients; the backend's collective engine (MPI, NCCL) carries it out.
    AllReduce {
        op: ReduceOp,
    },
    RandomUniform {
        seed: u64,
    },
}

impl Op {
    /// The op's kind name, as printed in the textual IR.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Constant { .. } => "constant",
            Op::Variable { .. } => "variable",
            Op::Assign { .. } => "assign",
            Op::Group => "group",
            Op::Identity => "identity",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Select => "select",
            Op::Cast { .. } => "cast",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Broadcast { .. } => "broadcast",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::Pad { .. } => "pad",
            Op::Reduce { op, .. } => op.name(),
            Op::ArgMax { .. } => "argmax",
            Op::Moments { .. } => "moments",
            Op::MatMul { .. } => "matmul",
            Op::Conv2d(_) => "conv2d",
            Op::Conv2dBackpropInput { .. } => "conv2d_backprop_input",
            Op::Conv2dBackpropFilter { .. } => "conv2d_backprop_filter",
            Op::Pool(a) => match a.kind {
                PoolKind::Max => "max_pool",
                PoolKind::Avg => "avg_pool",
            },
            Op::MaxPoolGrad(_) => "max_pool_grad",
            Op::AvgPoolGrad { .. } => "avg_pool_grad",
            Op::Softmax { .. } => "softmax",
            Op::LogSoftmax { .. } => "log_softmax",
            Op::SparseSoftmaxCrossEntropy => "sparse_softmax_cross_entropy",
            Op::OneHot { .. } => "one_hot",
            Op::InTopK { .. } => "in_top_k",
            Op::RandomUniform { .. } => "random_uniform",
            Op::AllReduce { .. } => "all_reduce",
        }
    }

    /// True for ops computed element by element (the candidates of elementwise fusion).
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Identity | Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. }
        )
    }

    /// True for ops with side effects (never removed, never merged).
    pub fn has_side_effects(&self) -> bool {
        matches!(self, Op::Assign { .. } | Op::Group)
    }

    /// True for sources: ops without data inputs.
    pub fn is_source(&self) -> bool {
        matches!(
            self,
            Op::Input { .. } | Op::Constant { .. } | Op::Variable { .. }
        )
    }

    /// The variable this op reads or writes, if any.
    pub fn variable(&self) -> Option<VarId> {
        match self {
            Op::Variable { var } | Op::Assign { var } => Some(*var),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind_name())
    }
}
