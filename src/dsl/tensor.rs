//! The symbolic [`Tensor`]'s methods: one for every op of the IR (the type itself is defined
//! beside its [`Builder`], which creates every tensor). Methods never fail: a bad call poisons the result and the
//! builder records the first error (see [`super::Builder`]).

use super::builder::{Builder, Tensor, current_builder};
use super::error::DslError;
use crate::ir::{
    BinaryOp, Conv2dAttrs, Dim, NodeId, Op, PoolAttrs, ReduceOp, Shape, TensorType, UnaryOp, Value,
};
use crate::tensor::DType;
use std::fmt;

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.slot, self.name()) {
            (Some((_, ty)), Some(name)) => write!(f, "Tensor({name}: {ty})"),
            _ => f.write_str("Tensor(<poisoned>)"),
        }
    }
}

impl From<&Tensor> for Tensor {
    fn from(t: &Tensor) -> Tensor {
        t.clone()
    }
}

impl Tensor {
    // ---- accessors -----------------------------------------------------------------------

    /// The builder of the graph this tensor belongs to.
    pub fn builder(&self) -> &Builder {
        &self.builder
    }

    /// The graph value, unless poisoned.
    pub fn value(&self) -> Option<Value> {
        self.slot.as_ref().map(|(v, _)| *v)
    }

    /// The producing node, unless poisoned.
    pub fn node(&self) -> Option<NodeId> {
        self.value().map(|v| v.node)
    }

    /// The type, unless poisoned.
    pub fn ty(&self) -> Option<&TensorType> {
        self.slot.as_ref().map(|(_, t)| t)
    }

    /// The shape, unless poisoned.
    pub fn shape(&self) -> Option<&Shape> {
        self.ty().map(|t| &t.shape)
    }

    /// The element type, unless poisoned.
    pub fn dtype(&self) -> Option<DType> {
        self.ty().map(|t| t.dtype)
    }

    /// The rank, unless poisoned.
    pub fn rank(&self) -> Option<usize> {
        self.ty().map(|t| t.rank())
    }

    /// True when an earlier error poisoned this tensor.
    pub fn is_poisoned(&self) -> bool {
        self.slot.is_none()
    }

    /// The scoped name (`tower0/conv0/Conv2D`, or `name:port`), unless poisoned.
    pub fn name(&self) -> Option<String> {
        let v = self.value()?;
        self.builder
            .with_graph(|g| g.try_node(v.node).map(|_| g.value_name(v)))
    }

    pub(crate) fn op(&self, base: &str, op: Op) -> Tensor {
        self.builder.add_op(base, op, &[self])
    }

    // ---- naming and types ----------------------------------------------------------------

    /// An `Identity` node named `name` in the current name scope (`tf.identity(x, name=..)`),
    /// so callbacks can find the value (e.g. `wrong_vector`).
    pub fn named(&self, name: &str) -> Tensor {
        self.op(name, Op::Identity)
    }

    /// Converts the element type.
    pub fn cast(&self, to: DType) -> Tensor {
        self.op("Cast", Op::Cast { to })
    }

    // ---- layout --------------------------------------------------------------------------

    /// Same elements, new shape (use [`Shape::batched`] to keep the batch leading).
    pub fn reshape(&self, shape: Shape) -> Tensor {
        self.op("Reshape", Op::Reshape { shape })
    }

    /// `[N, d1, d2, ...]` to `[N, d1·d2·...]` (or any shape to `[size]` when unbatched).
    pub fn flatten(&self) -> Tensor {
        let Some(shape) = self.shape() else {
            return self.clone();
        };
        let target = if shape.has_batch() {
            Shape::from_dims([Dim::Batch, Dim::Fixed(shape.fixed_product())])
        } else {
            Shape::fixed(&[shape.fixed_product()])
        };
        self.reshape(target)
    }

    /// Permutes the axes.
    pub fn transpose(&self, perm: &[usize]) -> Tensor {
        self.op(
            "Transpose",
            Op::Transpose {
                perm: perm.to_vec(),
            },
        )
    }

    /// Broadcasts to `shape`.
    pub fn broadcast_to(&self, shape: Shape) -> Tensor {
        self.op("BroadcastTo", Op::Broadcast { shape })
    }

    /// Elements `start..end` of `axis`.
    pub fn slice(&self, axis: usize, start: usize, end: usize) -> Tensor {
        self.op("Slice", Op::Slice { axis, start, end })
    }

    /// Zero padding, `(before, after)` per axis.
    pub fn pad(&self, pads: &[(usize, usize)]) -> Tensor {
        self.op(
            "Pad",
            Op::Pad {
                pads: pads.to_vec(),
            },
        )
    }

    // ---- reductions ----------------------------------------------------------------------

    /// Reduces over `axes` with `op`, keeping reduced axes as size 1 when `keep_dims`.
    pub fn reduce(&self, op: ReduceOp, axes: &[usize], keep_dims: bool) -> Tensor {
        let base = match op {
            ReduceOp::Sum => "Sum",
            ReduceOp::Mean => "Mean",
            ReduceOp::Max => "Max",
            ReduceOp::Min => "Min",
        };
        let axes = axes.to_vec();
        self.op(
            base,
            Op::Reduce {
                op,
                axes,
                keep_dims,
            },
        )
    }

    fn all_axes(&self) -> Vec<usize> {
        (0..self.rank().unwrap_or(0)).collect()
    }

    /// Sum over `axes`.
    pub fn reduce_sum(&self, axes: &[usize]) -> Tensor {
        self.reduce(ReduceOp::Sum, axes, false)
    }

    /// Mean over `axes`.
    pub fn reduce_mean(&self, axes: &[usize]) -> Tensor {
        self.reduce(ReduceOp::Mean, axes, false)
    }

    /// Maximum over `axes`.
    pub fn reduce_max(&self, axes: &[usize]) -> Tensor {
        self.reduce(ReduceOp::Max, axes, false)
    }

    /// Minimum over `axes`.
    pub fn reduce_min(&self, axes: &[usize]) -> Tensor {
        self.reduce(ReduceOp::Min, axes, false)
    }

    /// Sum of all elements (a scalar).
    pub fn sum(&self) -> Tensor {
        self.reduce(ReduceOp::Sum, &self.all_axes(), false)
    }

    /// Mean of all elements (a scalar).
    pub fn mean(&self) -> Tensor {
        self.reduce(ReduceOp::Mean, &self.all_axes(), false)
    }

    /// Index of the largest element along `axis`, as `i64`.
    pub fn argmax(&self, axis: usize) -> Tensor {
        self.op("ArgMax", Op::ArgMax { axis })
    }

    /// Mean and biased variance over `axes`.
    pub fn moments(&self, axes: &[usize]) -> (Tensor, Tensor) {
        let op = Op::Moments {
            axes: axes.to_vec(),
            keep_dims: false,
        };
        let mut outs = self.builder.add_outputs("moments", op, &[self]).into_iter();
        match (outs.next(), outs.next()) {
            (Some(m), Some(v)) => (m, v),
            _ => (self.builder.poisoned(), self.builder.poisoned()),
        }
    }

    // ---- linear algebra and windows ------------------------------------------------------

    /// `self · rhs` over the last two axes.
    pub fn matmul(&self, rhs: &Tensor) -> Tensor {
        self.matmul_t(rhs, false, false)
    }

    /// `matmul` with optional transposes of the two last axes of each operand.
    pub fn matmul_t(&self, rhs: &Tensor, transpose_a: bool, transpose_b: bool) -> Tensor {
        let op = Op::MatMul {
            transpose_a,
            transpose_b,
        };
        self.builder.add_op("MatMul", op, &[self, rhs])
    }

    /// Raw 2-D convolution of NHWC `self` with an HWIO `filter` (layers: [`struct@super::Conv2D`]).
    pub fn conv2d(&self, filter: &Tensor, attrs: Conv2dAttrs) -> Tensor {
        self.builder
            .add_op("Conv2D", Op::Conv2d(attrs), &[self, filter])
    }

    /// Raw transposed convolution: the gradient of a convolution with respect to its input,
    /// producing `[N, out_hw, C]` (layers: [`struct@super::Conv2DTranspose`]).
    pub fn conv2d_transpose(
        &self,
        filter: &Tensor,
        attrs: Conv2dAttrs,
        out_hw: [usize; 2],
    ) -> Tensor {
        let op = Op::Conv2dBackpropInput {
            attrs,
            input_hw: out_hw,
        };
        self.builder
            .add_op("Conv2DBackpropInput", op, &[self, filter])
    }

    /// Raw pooling (layers: [`struct@super::MaxPooling`], [`struct@super::AvgPooling`]).
    pub fn pool(&self, attrs: PoolAttrs) -> Tensor {
        let base = match attrs.kind {
            crate::ir::PoolKind::Max => "MaxPool",
            crate::ir::PoolKind::Avg => "AvgPool",
        };
        self.op(base, Op::Pool(attrs))
    }

    // ---- classification ------------------------------------------------------------------

    /// Softmax along `axis`.
    pub fn softmax(&self, axis: usize) -> Tensor {
        self.op("Softmax", Op::Softmax { axis })
    }

    /// Log-softmax along `axis`.
    pub fn log_softmax(&self, axis: usize) -> Tensor {
        self.op("LogSoftmax", Op::LogSoftmax { axis })
    }

    /// Per-example cross-entropy of logits `[N, C]` against integer labels `[N]`.
    pub fn sparse_softmax_cross_entropy(&self, labels: &Tensor) -> Tensor {
        self.builder.add_op(
            "SparseSoftmaxCrossEntropyWithLogits",
            Op::SparseSoftmaxCrossEntropy,
            &[self, labels],
        )
    }

    /// `f32` one-hot encoding of an integer tensor.
    pub fn one_hot(&self, depth: usize) -> Tensor {
        self.op("one_hot", Op::OneHot { depth })
    }

    /// Whether each target is among the `k` largest predictions of `self` (`[N, C]`).
    pub fn in_top_k(&self, targets: &Tensor, k: usize) -> Tensor {
        self.builder
            .add_op("InTopK", Op::InTopK { k }, &[self, targets])
    }

    /// Uniform `[0, 1)` samples shaped like `self`, from the counter-based generator.
    pub fn random_uniform_like(&self, seed: u64, counter: &Tensor) -> Tensor {
        self.builder.add_op(
            "RandomUniform",
            Op::RandomUniform { seed },
            &[self, counter],
        )
    }

    /// `self ? a : b`, elementwise with broadcasting (`self` is `bool`).
    pub fn select(&self, a: &Tensor, b: &Tensor) -> Tensor {
        self.builder.add_op("Select", Op::Select, &[self, a, b])
    }

    pub(crate) fn unary(&self, op: UnaryOp, base: &str) -> Tensor {
        self.op(base, Op::Unary(op))
    }

    pub(crate) fn binary(&self, op: BinaryOp, rhs: &Tensor, base: &str) -> Tensor {
        self.builder.add_op(base, Op::Binary(op), &[self, rhs])
    }
}

/// Joins `tensors` along `axis` (`tf.concat`).
pub fn concat(tensors: &[Tensor], axis: usize) -> Tensor {
    let Some(first) = tensors.first() else {
        return match current_builder() {
            Some(b) => b.fail(DslError::Op {
                node: b.scoped_name("concat"),
                message: "concat of no tensors".into(),
            }),
            None => orphan("concat"),
        };
    };
    let refs: Vec<&Tensor> = tensors.iter().collect();
    first.builder.add_op("concat", Op::Concat { axis }, &refs)
}

/// `cond ? a : b` (`tf.where`).
pub fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
    cond.select(a, b)
}

/// A poisoned tensor of a fresh builder carrying [`DslError::NoDefaultBuilder`]: what the free
/// functions of the DSL return when no graph is being built.
pub(crate) fn orphan(what: &'static str) -> Tensor {
    Builder::new().fail(DslError::NoDefaultBuilder { what })
}
