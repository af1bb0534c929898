//! The node emitter of gradient rules: names new nodes after the forward node they
//! differentiate, places them on its device, and offers the small building blocks every rule
//! shares (elementwise ops, typed scalar constants, un-broadcasting, element counts).

use super::AutodiffError;
use crate::ir::{BinaryOp, Dim, Graph, NodeId, Op, ReduceOp, Shape, TensorType, UnaryOp, Value};
use crate::tensor::{DType, HostTensor};

/// Emits the gradient nodes of one forward node.
pub(crate) struct Emitter<'g> {
    pub graph: &'g mut Graph,
    /// `{prefix}/{forward}_grad`: the scope of every node this emitter adds.
    base: String,
    device: Option<u16>,
    /// Scoped name and op of the forward node, for error messages.
    fwd_name: String,
    fwd_op: &'static str,
}

impl<'g> Emitter<'g> {
    /// An emitter for the gradient of `fwd`, naming nodes under `base`.
    pub fn new(graph: &'g mut Graph, base: String, fwd: NodeId) -> Emitter<'g> {
        let node = graph.node(fwd);
        let (device, fwd_name, fwd_op) = (node.device, node.name.clone(), node.op.kind_name());
        Emitter {
            graph,
            base,
            device,
            fwd_name,
            fwd_op,
        }
    }

    /// The error for an input of the forward node that has no gradient rule.
    pub fn not_differentiable(&self, slot: usize, reason: &str) -> AutodiffError {
        AutodiffError::NotDifferentiable {
            node: self.fwd_name.clone(),
            op: self.fwd_op.to_string(),
            slot,
            reason: reason.to_string(),
        }
    }

    /// The type of `v`.
    pub fn ty(&self, v: Value) -> TensorType {
        self.graph.value_type(v).clone()
    }

    /// The shape of `v`.
    pub fn shape(&self, v: Value) -> Shape {
        self.graph.value_type(v).shape.clone()
    }

    /// Adds `op` on `inputs` as `{base}/{part}` (made unique) and returns its first output.
    pub fn node(&mut self, part: &str, op: Op, inputs: &[Value]) -> Result<Value, AutodiffError> {
        let name = self.graph.unique_name(&format!("{}/{part}", self.base));
        let id = self
            .graph
            .add_node_on(&name, op, inputs, self.device)
            .map_err(|source| AutodiffError::Rule {
                node: self.fwd_name.clone(),
                op: self.fwd_op.to_string(),
                source: Box::new(source),
            })?;
        Ok(Value::first(id))
    }

    /// A scalar constant of `dtype`, named `{base}/{name}`.
    pub fn scalar(&mut self, name: &str, dtype: DType, x: f64) -> Result<Value, AutodiffError> {
        let value = HostTensor::scalar(dtype, x);
        self.node(name, Op::Constant { value }, &[])
    }

    pub fn unary(&mut self, op: UnaryOp, x: Value) -> Result<Value, AutodiffError> {
        self.node(op.name(), Op::Unary(op), &[x])
    }

    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Result<Value, AutodiffError> {
        self.node(op.name(), Op::Binary(op), &[a, b])
    }

    pub fn add(&mut self, a: Value, b: Value) -> Result<Value, AutodiffError> {
        self.binary(BinaryOp::Add, a, b)
    }

    pub fn sub(&mut self, a: Value, b: Value) -> Result<Value, AutodiffError> {
        self.binary(BinaryOp::Sub, a, b)
    }

    pub fn mul(&mut self, a: Value, b: Value) -> Result<Value, AutodiffError> {
        self.binary(BinaryOp::Mul, a, b)
    }

    pub fn div(&mut self, a: Value, b: Value) -> Result<Value, AutodiffError> {
        self.binary(BinaryOp::Div, a, b)
    }

    pub fn neg(&mut self, a: Value) -> Result<Value, AutodiffError> {
        self.unary(UnaryOp::Neg, a)
    }

    /// `a * c` for a constant `c` of `a`'s dtype, named `{base}/{name}`.
    pub fn scale(&mut self, a: Value, name: &str, c: f64) -> Result<Value, AutodiffError> {
        let k = self.scalar(name, self.ty(a).dtype, c)?;
        self.mul(a, k)
    }

    /// `cond ? a : b`.
    pub fn select(&mut self, cond: Value, a: Value, b: Value) -> Result<Value, AutodiffError> {
        self.node("select", Op::Select, &[cond, a, b])
    }

    /// `cond ? g : 0` (or `cond ? 0 : g` when `keep_on_true` is false).
    pub fn mask(
        &mut self,
        cond: Value,
        g: Value,
        keep_on_true: bool,
    ) -> Result<Value, AutodiffError> {
        let zero = self.scalar("zero", self.ty(g).dtype, 0.0)?;
        if keep_on_true {
            self.select(cond, g, zero)
        } else {
            self.select(cond, zero, g)
        }
    }

    pub fn cast(&mut self, x: Value, to: DType) -> Result<Value, AutodiffError> {
        if self.ty(x).dtype == to {
            return Ok(x);
        }
        self.node("cast", Op::Cast { to }, &[x])
    }

    /// `x` reshaped to `shape` (no node when it already has that shape).
    pub fn reshape(&mut self, x: Value, shape: &Shape) -> Result<Value, AutodiffError> {
        if &self.shape(x) == shape {
            return Ok(x);
        }
        let op = Op::Reshape {
            shape: shape.clone(),
        };
        self.node("reshape", op, &[x])
    }

    /// `x` broadcast to `shape` (no node when it already has that shape).
    pub fn broadcast(&mut self, x: Value, shape: &Shape) -> Result<Value, AutodiffError> {
        if &self.shape(x) == shape {
            return Ok(x);
        }
        let op = Op::Broadcast {
            shape: shape.clone(),
        };
        self.node("broadcast", op, &[x])
    }

    pub fn reduce_sum(
        &mut self,
        x: Value,
        axes: Vec<usize>,
        keep_dims: bool,
    ) -> Result<Value, AutodiffError> {
        if axes.is_empty() {
            return Ok(x);
        }
        let op = Op::Reduce {
            op: ReduceOp::Sum,
            axes,
            keep_dims,
        };
        self.node("reduce_sum", op, &[x])
    }

    /// Sums the adjoint `g` of a broadcast result back to an operand of shape `target`.
    pub fn unbroadcast(&mut self, g: Value, target: &Shape) -> Result<Value, AutodiffError> {
        let s = self.shape(g);
        if &s == target {
            return Ok(g);
        }
        let lead = s.rank() - target.rank();
        let mut axes: Vec<usize> = (0..lead).collect();
        let mut stretched = false;
        for (i, d) in target.dims().iter().enumerate() {
            if *d == Dim::Fixed(1) && s.dim(lead + i) != Dim::Fixed(1) {
                axes.push(lead + i);
                stretched = true;
            }
        }
        if !stretched {
            return self.reduce_sum(g, axes, false);
        }
        let summed = self.reduce_sum(g, axes, true)?;
        self.reshape(summed, target)
    }

    /// A scalar of `dtype` holding the number of elements of the `axes` of `shape` (an exact
    /// integer, so dividing by it rounds once). When the batch axis is among them, the count is
    /// computed in the graph: the batch size is only known when a step runs.
    pub fn count(
        &mut self,
        shape: &Shape,
        axes: &[usize],
        dtype: DType,
    ) -> Result<Value, AutodiffError> {
        let fixed: usize = axes.iter().filter_map(|&a| shape.dim(a).fixed()).product();
        if !axes.iter().any(|&a| shape.dim(a) == Dim::Batch) {
            return self.scalar("count", dtype, fixed as f64);
        }
        let one = self.scalar("one", dtype, 1.0)?;
        let op = Op::Broadcast {
            shape: Shape::batched(&[]),
        };
        let ones = self.node("batch_ones", op, &[one])?;
        let op = Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0],
            keep_dims: false,
        };
        let batch = self.node("batch_size", op, &[ones])?;
        if fixed == 1 {
            return Ok(batch);
        }
        let k = self.scalar("count", dtype, fixed as f64)?;
        self.mul(batch, k)
    }
}

/// `shape` with the `axes` kept as size 1 (the `keep_dims` form of a reduction).
pub(crate) fn keep_dims_shape(shape: &Shape, axes: &[usize]) -> Shape {
    Shape::from_dims(
        shape.dims().iter().enumerate().map(
            |(i, d)| {
                if axes.contains(&i) { Dim::Fixed(1) } else { *d }
            },
        ),
    )
}
