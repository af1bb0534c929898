//! Gradients of layout ops: each is the adjoint layout op. Reshape reshapes back, transpose
//! applies the inverse permutation, broadcast reduce-sums, slice pads, concat slices, pad
//! slices.

use super::Forward;
use crate::autodiff::AutodiffError;
use crate::autodiff::emit::Emitter;
use crate::ir::{Op, Value};

type Grads = Result<Vec<Option<Value>>, AutodiffError>;

pub(super) fn gradient(e: &mut Emitter, fwd: &Forward, g: Value, needs: &[bool]) -> Grads {
    let x = fwd.inputs[0];
    let sx = e.shape(x);
    let dx = match &fwd.op {
        Op::Reshape { .. } => e.reshape(g, &sx)?,
        Op::Transpose { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            e.node("transpose", Op::Transpose { perm: inverse }, &[g])?
        }
        Op::Broadcast { .. } => e.unbroadcast(g, &sx)?,
        Op::Slice { axis, start, end } => {
            // The slice of a fixed axis (the verifier guarantees it is fixed).
            let n = sx.dim(*axis).fixed().unwrap_or(*end);
            let mut pads = vec![(0, 0); sx.rank()];
            pads[*axis] = (*start, n - end);
            e.node("pad", Op::Pad { pads }, &[g])?
        }
        Op::Pad { pads } => {
            let mut dx = g;
            for (axis, &(before, after)) in pads.iter().enumerate() {
                if before + after == 0 {
                    continue;
                }
                let n = sx.dim(axis).fixed().unwrap_or(0);
                let op = Op::Slice {
                    axis,
                    start: before,
                    end: before + n,
                };
                dx = e.node("slice", op, &[dx])?;
            }
            dx
        }
        Op::Concat { axis } => return concat(e, fwd, *axis, g, needs),
        _ => return Ok(vec![None; fwd.inputs.len()]),
    };
    Ok(vec![Some(dx)])
}

/// Each input of a concatenation receives its slice of the adjoint.
fn concat(e: &mut Emitter, fwd: &Forward, axis: usize, g: Value, needs: &[bool]) -> Grads {
    let mut out = Vec::with_capacity(fwd.inputs.len());
    let mut start = 0;
    let single = fwd.inputs.len() == 1;
    for (slot, &x) in fwd.inputs.iter().enumerate() {
        // Concatenated axes are fixed (checked when the node was added).
        let len = e.shape(x).dim(axis).fixed().unwrap_or(0);
        let end = start + len;
        if needs[slot] {
            let dx = if single {
                g
            } else {
                e.node("slice", Op::Slice { axis, start, end }, &[g])?
            };
            out.push(Some(dx));
        } else {
            out.push(None);
        }
        start = end;
    }
    Ok(out)
}
