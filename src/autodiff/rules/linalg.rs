//! Gradients of matrix products, convolutions and pooling. All are linear in each input, so
//! each gradient is another op of the same family: a convolution's gradients are its two
//! backprop ops, theirs are convolutions and backprops again, and average pooling and its
//! gradient are each other's adjoints.

use super::Forward;
use crate::autodiff::AutodiffError;
use crate::autodiff::emit::Emitter;
use crate::ir::{Op, PoolKind, Value};

type Grads = Result<Vec<Option<Value>>, AutodiffError>;

/// `Z = op(A) op(B)`: `dA = G B^T`, `dB = A^T G`, expressed with transpose flags; with a rank-2
/// right operand and a batched left one, `dB` is summed over the batch axes.
pub(super) fn matmul(
    e: &mut Emitter,
    fwd: &Forward,
    ta: bool,
    tb: bool,
    g: Value,
    needs: &[bool],
) -> Grads {
    let (a, b) = (fwd.inputs[0], fwd.inputs[1]);
    let (ra, rb) = (e.ty(a).rank(), e.ty(b).rank());
    let mm = |e: &mut Emitter, l: Value, r: Value, tl: bool, tr: bool| {
        let op = Op::MatMul {
            transpose_a: tl,
            transpose_b: tr,
        };
        e.node("matmul", op, &[l, r])
    };
    let mut da = None;
    let mut db = None;
    if needs[0] {
        da = Some(if !ta {
            // dA = G op(B)^T
            mm(e, g, b, false, !tb)?
        } else if rb == 2 && ra > 2 {
            // da = dA^T, but a rank-2 left operand cannot meet a batched right one.
            let d = mm(e, g, b, false, !tb)?;
            let mut perm: Vec<usize> = (0..ra).collect();
            perm.swap(ra - 2, ra - 1);
            e.node("transpose", Op::Transpose { perm }, &[d])?
        } else {
            // da = (G op(B)^T)^T = op(B) G^T
            mm(e, b, g, tb, true)?
        });
    }
    if needs[1] {
        let d = if !tb {
            // dB = op(A)^T G
            mm(e, a, g, !ta, false)?
        } else {
            // db = dB^T = G^T op(A)
            mm(e, g, a, true, ta)?
        };
        db = Some(if rb == 2 && ra > 2 {
            e.reduce_sum(d, (0..ra - 2).collect(), false)?
        } else {
            d
        });
    }
    Ok(vec![da, db])
}

/// Convolutions, their backprops and pooling.
pub(super) fn window(e: &mut Emitter, fwd: &Forward, g: Value, needs: &[bool]) -> Grads {
    let hw = |e: &Emitter, v: Value| -> [usize; 2] {
        // Window ops have static spatial sizes (checked by inference).
        let s = e.shape(v);
        [s.dim(1).fixed().unwrap_or(0), s.dim(2).fixed().unwrap_or(0)]
    };
    let filter_hw = |e: &Emitter, w: Value| -> [usize; 2] {
        let s = e.shape(w);
        [s.dim(0).fixed().unwrap_or(0), s.dim(1).fixed().unwrap_or(0)]
    };
    let mut out = vec![None; fwd.inputs.len()];
    match &fwd.op {
        Op::Conv2d(attrs) => {
            // inputs (x, w)
            let (x, w) = (fwd.inputs[0], fwd.inputs[1]);
            if needs[0] {
                let op = Op::Conv2dBackpropInput {
                    attrs: *attrs,
                    input_hw: hw(e, x),
                };
                out[0] = Some(e.node("backprop_input", op, &[g, w])?);
            }
            if needs[1] {
                let op = Op::Conv2dBackpropFilter {
                    attrs: *attrs,
                    filter_hw: filter_hw(e, w),
                };
                out[1] = Some(e.node("backprop_filter", op, &[x, g])?);
            }
        }
        Op::Conv2dBackpropInput { attrs, .. } => {
            // inputs (dy, w), output dx: <G, BI(dy, w)> = <conv(G, w), dy>.
            let (dy, w) = (fwd.inputs[0], fwd.inputs[1]);
            if needs[0] {
                out[0] = Some(e.node("conv2d", Op::Conv2d(*attrs), &[g, w])?);
            }
            if needs[1] {
                let op = Op::Conv2dBackpropFilter {
                    attrs: *attrs,
                    filter_hw: filter_hw(e, w),
                };
                out[1] = Some(e.node("backprop_filter", op, &[g, dy])?);
            }
        }
        Op::Conv2dBackpropFilter { attrs, .. } => {
            // inputs (x, dy), output dw: <G, BF(x, dy)> = <conv(x, G), dy>.
            let (x, dy) = (fwd.inputs[0], fwd.inputs[1]);
            if needs[0] {
                let op = Op::Conv2dBackpropInput {
                    attrs: *attrs,
                    input_hw: hw(e, x),
                };
                out[0] = Some(e.node("backprop_input", op, &[dy, g])?);
            }
            if needs[1] {
                out[1] = Some(e.node("conv2d", Op::Conv2d(*attrs), &[x, g])?);
            }
        }
        Op::Pool(attrs) => {
            let x = fwd.inputs[0];
            out[0] = Some(match attrs.kind {
                PoolKind::Max => e.node("max_pool_grad", Op::MaxPoolGrad(*attrs), &[x, g])?,
                PoolKind::Avg => {
                    let op = Op::AvgPoolGrad {
                        attrs: *attrs,
                        input_hw: hw(e, x),
                    };
                    e.node("avg_pool_grad", op, &[g])?
                }
            });
        }
        Op::AvgPoolGrad { attrs, .. } => {
            let avg = crate::ir::PoolAttrs {
                kind: PoolKind::Avg,
                ..*attrs
            };
            out[0] = Some(e.node("avg_pool", Op::Pool(avg), &[g])?);
        }
        _ => {}
    }
    Ok(out)
}
