//! Gradients of reductions and normalisations: sums and means broadcast the adjoint back,
//! max/min divide it among ties (as TF), `Moments` (BatchNorm's statistics) is two elementwise
//! terms, and softmax, log-softmax and sparse softmax cross-entropy use their closed forms.

use super::Forward;
use crate::autodiff::AutodiffError;
use crate::autodiff::emit::{Emitter, keep_dims_shape};
use crate::ir::{BinaryOp, Op, ReduceOp, Shape, UnaryOp, Value};

type Grads = Result<Vec<Option<Value>>, AutodiffError>;

pub(super) fn reduce(
    e: &mut Emitter,
    fwd: &Forward,
    op: ReduceOp,
    axes: &[usize],
    keep_dims: bool,
    g: Value,
) -> Grads {
    let x = fwd.inputs[0];
    let tx = e.ty(x);
    let keep = keep_dims_shape(&tx.shape, axes);
    let gk = aligned(e, g, &keep, axes, keep_dims)?;
    let dx = match op {
        ReduceOp::Sum => e.broadcast(gk, &tx.shape)?,
        ReduceOp::Mean => {
            let n = e.count(&tx.shape, axes, tx.dtype)?;
            let scaled = e.div(gk, n)?;
            e.broadcast(scaled, &tx.shape)?
        }
        ReduceOp::Max | ReduceOp::Min => {
            let y = fwd.out();
            let yk = aligned(e, y, &keep, axes, keep_dims)?;
            let is_extreme = e.binary(BinaryOp::Eq, x, yk)?;
            let indicator = e.cast(is_extreme, tx.dtype)?;
            let ties = e.reduce_sum(indicator, axes.to_vec(), true)?;
            let share = e.div(gk, ties)?;
            e.mask(is_extreme, share, true)?
        }
    };
    Ok(vec![Some(dx)])
}

/// A reduction's output `v` in a shape that broadcasts against the reduction's input: `v`
/// itself when the dims were kept or the reduced axes lead (right-aligned broadcasting lines the
/// rest up), else `v` reshaped to the keep-dims shape `keep`.
fn aligned(
    e: &mut Emitter,
    v: Value,
    keep: &Shape,
    axes: &[usize],
    keep_dims: bool,
) -> Result<Value, AutodiffError> {
    let leading = axes.iter().all(|&a| a < axes.len());
    if keep_dims || leading {
        Ok(v)
    } else {
        e.reshape(v, keep)
    }
}

/// `mean = sum(x)/n`, `var = sum((x - mean)^2)/n`, so
/// `dx = (d_mean + 2 d_var (x - mean)) / n` (the mean's own dependence cancels in `var`).
pub(super) fn moments(
    e: &mut Emitter,
    fwd: &Forward,
    axes: &[usize],
    keep_dims: bool,
    dys: &[Option<Value>],
) -> Grads {
    let x = fwd.inputs[0];
    let tx = e.ty(x);
    let keep = keep_dims_shape(&tx.shape, axes);
    let to_keep = |e: &mut Emitter, v: Value| aligned(e, v, &keep, axes, keep_dims);
    let d_mean = dys.first().copied().flatten();
    let d_var = dys.get(1).copied().flatten();
    let var_term = match d_var {
        None => None,
        Some(gv) => {
            let gvk = to_keep(e, gv)?;
            let mean_k = to_keep(e, fwd.outputs[0])?;
            let centered = e.sub(x, mean_k)?;
            let two_gv = e.scale(gvk, "two", 2.0)?;
            Some(e.mul(two_gv, centered)?)
        }
    };
    let mean_term = match d_mean {
        None => None,
        Some(gm) => Some(to_keep(e, gm)?),
    };
    let sum = match (mean_term, var_term) {
        (None, None) => return Ok(vec![None]),
        (Some(m), None) => m,
        (None, Some(v)) => v,
        (Some(m), Some(v)) => e.add(m, v)?,
    };
    let n = e.count(&tx.shape, axes, tx.dtype)?;
    let scaled = e.div(sum, n)?;
    Ok(vec![Some(e.broadcast(scaled, &tx.shape)?)])
}

/// `dx = y (g - sum(g y))` along the axis.
pub(super) fn softmax(e: &mut Emitter, fwd: &Forward, axis: usize, g: Value) -> Grads {
    let y = fwd.out();
    let gy = e.mul(g, y)?;
    let s = e.reduce_sum(gy, vec![axis], true)?;
    let centered = e.sub(g, s)?;
    Ok(vec![Some(e.mul(centered, y)?)])
}

/// `dx = g - exp(y) sum(g)` along the axis.
pub(super) fn log_softmax(e: &mut Emitter, fwd: &Forward, axis: usize, g: Value) -> Grads {
    let y = fwd.out();
    let p = e.unary(UnaryOp::Exp, y)?;
    let s = e.reduce_sum(g, vec![axis], true)?;
    let ps = e.mul(p, s)?;
    Ok(vec![Some(e.sub(g, ps)?)])
}

/// `d logits = (softmax(logits) - one_hot(labels)) * g[:, None]`; labels get none.
pub(super) fn sparse_softmax_xent(e: &mut Emitter, fwd: &Forward, g: Value) -> Grads {
    let (logits, labels) = (fwd.inputs[0], fwd.inputs[1]);
    let tl = e.ty(logits);
    // Inference checked that the logits are [N, C] with a fixed C.
    let classes = tl.shape.dim(1).fixed().unwrap_or(1);
    let p = e.node("softmax", Op::Softmax { axis: 1 }, &[logits])?;
    let one_hot = e.node("one_hot", Op::OneHot { depth: classes }, &[labels])?;
    let one_hot = e.cast(one_hot, tl.dtype)?;
    let residual = e.sub(p, one_hot)?;
    let column = Shape::from_dims([tl.shape.dim(0), 1.into()]);
    let gk = e.reshape(g, &column)?;
    Ok(vec![Some(e.mul(residual, gk)?), None])
}
