//! Gradient rules, one file per op family. A rule receives the adjoints of the forward node's
//! outputs (`None` = zero) and which inputs need a gradient, and returns one optional gradient
//! per input, of exactly the input's type, built from IR ops.

mod elementwise;
mod layout;
mod linalg;
mod reduce;

use super::AutodiffError;
use super::emit::Emitter;
use crate::ir::{Graph, NodeId, Op, ReduceOp, Value};

/// The forward node being differentiated.
pub(crate) struct Forward {
    pub op: Op,
    pub inputs: Vec<Value>,
    pub outputs: Vec<Value>,
}

impl Forward {
    /// A snapshot of node `id` (its op, inputs and outputs).
    pub fn of(graph: &Graph, id: NodeId) -> Forward {
        let node = graph.node(id);
        Forward {
            op: node.op.clone(),
            inputs: graph.inputs(id).to_vec(),
            outputs: (0..node.outputs.len())
                .map(|p| Value::new(id, p as u16))
                .collect(),
        }
    }

    /// Output 0.
    pub fn out(&self) -> Value {
        self.outputs[0]
    }
}

/// The gradients of `fwd`'s inputs given the adjoints `dys` of its outputs. Only inputs with
/// `needs[slot]` are computed; the others are `None`.
pub(crate) fn gradient(
    e: &mut Emitter,
    fwd: &Forward,
    dys: &[Option<Value>],
    needs: &[bool],
) -> Result<Vec<Option<Value>>, AutodiffError> {
    let none = || Ok(vec![None; fwd.inputs.len()]);
    if let Op::Moments { axes, keep_dims } = &fwd.op {
        return reduce::moments(e, fwd, axes, *keep_dims, dys);
    }
    // Every other op has at most one output; the pass only calls a rule with some adjoint.
    let Some(&Some(g)) = dys.first() else {
        return none();
    };
    match &fwd.op {
        Op::Input { .. } | Op::Constant { .. } | Op::Variable { .. } => none(),
        Op::Assign { .. } | Op::Group => none(),
        Op::Identity => Ok(vec![Some(g)]),
        // Sum and mean across participants are linear: each participant's input receives the
        // same reduction of every participant's adjoint.
        Op::AllReduce {
            op: op @ (ReduceOp::Sum | ReduceOp::Mean),
        } => Ok(vec![Some(e.node(
            "all_reduce",
            Op::AllReduce { op: *op },
            &[g],
        )?)]),
        Op::AllReduce { .. } => Err(e.not_differentiable(
            0,
            "an all-reduce max or min has no gradient rule (use sum or mean)",
        )),
        Op::Unary(u) => elementwise::unary(e, fwd, *u, g),
        Op::Binary(b) => elementwise::binary(e, fwd, *b, g, needs),
        Op::Select => elementwise::select(e, fwd, g, needs),
        Op::Cast { .. } => elementwise::cast(e, fwd, g),
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Broadcast { .. }
        | Op::Slice { .. }
        | Op::Concat { .. }
        | Op::Pad { .. } => layout::gradient(e, fwd, g, needs),
        Op::Reduce {
            op,
            axes,
            keep_dims,
        } => reduce::reduce(e, fwd, *op, axes, *keep_dims, g),
        Op::Softmax { axis } => reduce::softmax(e, fwd, *axis, g),
        Op::LogSoftmax { axis } => reduce::log_softmax(e, fwd, *axis, g),
        Op::SparseSoftmaxCrossEntropy => reduce::sparse_softmax_xent(e, fwd, g),
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => linalg::matmul(e, fwd, *transpose_a, *transpose_b, g, needs),
        Op::Conv2d(_)
        | Op::Conv2dBackpropInput { .. }
        | Op::Conv2dBackpropFilter { .. }
        | Op::Pool(_)
        | Op::AvgPoolGrad { .. } => linalg::window(e, fwd, g, needs),
        Op::MaxPoolGrad(_) => {
            let slot = needs.iter().position(|&n| n).unwrap_or(0);
            Err(e.not_differentiable(
                slot,
                "second-order max pooling has no gradient rule; \
                 differentiate the cost once, not its gradient",
            ))
        }
        // Outputs of these are not floats (or, for RandomUniform, do not depend on the inputs'
        // values), so no gradient flows into their inputs.
        Op::RandomUniform { .. }
        | Op::ArgMax { .. }
        | Op::OneHot { .. }
        | Op::InTopK { .. }
        | Op::Moments { .. } => none(),
    }
}
