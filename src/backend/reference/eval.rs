//! Dispatch of one compute op to its kernel.
//!
//! Sources (`Input`, `Constant`, `Variable`) and side effects (`Assign`, `Group`) are handled by
//! the step executor; everything else comes here with its evaluated inputs and the concrete
//! output shapes of the node (the batch size already bound).

use super::array::{Array, Output};
use super::{Precision, conv, elementwise, layout, matmul, nn, pool, reduce};
use crate::ir::Op;

fn arity<'a, const N: usize>(inputs: &[&'a Array]) -> Result<[&'a Array; N], String> {
    <[&Array; N]>::try_from(inputs)
        .map_err(|_| format!("internal: expected {N} input(s), got {}", inputs.len()))
}

fn first_shape(out_shapes: &[Vec<usize>]) -> Result<&[usize], String> {
    out_shapes
        .first()
        .map(Vec::as_slice)
        .ok_or_else(|| "internal: node has no output".to_string())
}

/// Computes `op` on `inputs`; `out_shapes` are the node's concrete output shapes.
pub(crate) fn eval_op(
    op: &Op,
    inputs: &[&Array],
    out_shapes: &[Vec<usize>],
    p: Precision,
) -> Result<Vec<Output>, String> {
    let one = |o: Output| Ok(vec![o]);
    match op {
        Op::Input { .. }
        | Op::Constant { .. }
        | Op::Variable { .. }
        | Op::Assign { .. }
        | Op::Group => Err(format!("internal: {} is not a compute op", op.kind_name())),
        // One process is the only participant of the collective.
        Op::AllReduce { .. } => {
            let [x] = arity(inputs)?;
            one(Output::new(x.shape.clone(), x.data.clone()))
        }
        Op::Identity => {
            let [x] = arity(inputs)?;
            one(Output::new(x.shape.clone(), x.data.clone()))
        }
        Op::Unary(u) => {
            let [x] = arity(inputs)?;
            one(elementwise::unary(*u, x)?)
        }
        Op::Binary(b) => {
            let [x, y] = arity(inputs)?;
            one(elementwise::binary(*b, x, y)?)
        }
        Op::Select => {
            let [c, a, b] = arity(inputs)?;
            one(elementwise::select(c, a, b)?)
        }
        Op::Cast { to } => {
            let [x] = arity(inputs)?;
            one(elementwise::cast(x, *to, p)?)
        }
        Op::Reshape { .. } => {
            let [x] = arity(inputs)?;
            one(layout::reshape(x, first_shape(out_shapes)?)?)
        }
        Op::Transpose { perm } => {
            let [x] = arity(inputs)?;
            one(layout::transpose(x, perm)?)
        }
        Op::Broadcast { .. } => {
            let [x] = arity(inputs)?;
            one(layout::broadcast(x, first_shape(out_shapes)?)?)
        }
        Op::Slice { axis, start, end } => {
            let [x] = arity(inputs)?;
            one(layout::slice(x, *axis, *start, *end)?)
        }
        Op::Concat { axis } => one(layout::concat(inputs, *axis)?),
        Op::Pad { pads } => {
            let [x] = arity(inputs)?;
            one(layout::pad(x, pads)?)
        }
        Op::Reduce {
            op,
            axes,
            keep_dims,
        } => {
            let [x] = arity(inputs)?;
            one(reduce::reduce(x, *op, axes, *keep_dims)?)
        }
        Op::ArgMax { axis } => {
            let [x] = arity(inputs)?;
            one(reduce::argmax(x, *axis)?)
        }
        Op::Moments { axes, keep_dims } => {
            let [x] = arity(inputs)?;
            Ok(reduce::moments(x, axes, *keep_dims)?.into())
        }
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => {
            let [a, b] = arity(inputs)?;
            one(matmul::matmul(a, b, *transpose_a, *transpose_b)?)
        }
        Op::Conv2d(attrs) => {
            let [x, w] = arity(inputs)?;
            one(conv::conv2d(x, w, attrs)?)
        }
        Op::Conv2dBackpropInput { attrs, input_hw } => {
            let [dy, w] = arity(inputs)?;
            one(conv::conv2d_backprop_input(dy, w, attrs, *input_hw)?)
        }
        Op::Conv2dBackpropFilter { attrs, filter_hw } => {
            let [x, dy] = arity(inputs)?;
            one(conv::conv2d_backprop_filter(x, dy, attrs, *filter_hw)?)
        }
        Op::Pool(attrs) => {
            let [x] = arity(inputs)?;
            one(pool::pool(x, attrs)?)
        }
        Op::MaxPoolGrad(attrs) => {
            let [x, dy] = arity(inputs)?;
            one(pool::max_pool_grad(x, dy, attrs)?)
        }
        Op::AvgPoolGrad { attrs, input_hw } => {
            let [dy] = arity(inputs)?;
            one(pool::avg_pool_grad(dy, attrs, *input_hw)?)
        }
        Op::Softmax { axis } => {
            let [x] = arity(inputs)?;
            one(nn::softmax(x, *axis, false)?)
        }
        Op::LogSoftmax { axis } => {
            let [x] = arity(inputs)?;
            one(nn::softmax(x, *axis, true)?)
        }
        Op::SparseSoftmaxCrossEntropy => {
            let [logits, labels] = arity(inputs)?;
            one(nn::sparse_softmax_cross_entropy(logits, labels)?)
        }
        Op::OneHot { depth } => {
            let [x] = arity(inputs)?;
            one(nn::one_hot(x, *depth)?)
        }
        Op::InTopK { k } => {
            let [predictions, targets] = arity(inputs)?;
            one(nn::in_top_k(predictions, targets, *k)?)
        }
        Op::RandomUniform { seed } => {
            let [like, counter] = arity(inputs)?;
            one(nn::random_uniform(like, counter, *seed)?)
        }
    }
}
