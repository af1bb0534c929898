//! Gradients of elementwise ops: unary math, broadcasting binary ops, `Select` and float casts.
//! Every rule is a few primitive elementwise ops (so the compiler can fuse them), followed by a
//! reduce-sum back to the operand's shape where the forward op broadcast.

use super::Forward;
use crate::autodiff::AutodiffError;
use crate::autodiff::emit::Emitter;
use crate::ir::{BinaryOp, UnaryOp, Value};

type Grads = Result<Vec<Option<Value>>, AutodiffError>;

/// `d/dx op(x)`, using the output `y` where that is cheaper (as TF does).
pub(super) fn unary(e: &mut Emitter, fwd: &Forward, op: UnaryOp, g: Value) -> Grads {
    let x = fwd.inputs[0];
    let y = fwd.out();
    let dtype = e.ty(x).dtype;
    let dx = match op {
        UnaryOp::Neg => e.neg(g)?,
        UnaryOp::Abs => {
            let s = e.unary(UnaryOp::Sign, x)?;
            e.mul(g, s)?
        }
        // Zero almost everywhere: no gradient (TF's Floor has none; Sign's is all zeros).
        UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Not => return Ok(vec![None]),
        UnaryOp::Exp => e.mul(g, y)?,
        UnaryOp::Log => e.div(g, x)?,
        UnaryOp::Sqrt => {
            // 1 / (2 sqrt(x)) = 0.5 / y
            let half = e.scale(g, "half", 0.5)?;
            e.div(half, y)?
        }
        UnaryOp::Rsqrt => {
            // d x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
            let y2 = e.unary(UnaryOp::Square, y)?;
            let y3 = e.mul(y2, y)?;
            let gy3 = e.mul(g, y3)?;
            e.scale(gy3, "minus_half", -0.5)?
        }
        UnaryOp::Square => {
            let two_x = e.scale(x, "two", 2.0)?;
            e.mul(g, two_x)?
        }
        UnaryOp::Recip => {
            // d 1/x = -1/x^2 = -y^2
            let y2 = e.unary(UnaryOp::Square, y)?;
            let gy2 = e.mul(g, y2)?;
            e.neg(gy2)?
        }
        UnaryOp::Relu => {
            let zero = e.scalar("zero", dtype, 0.0)?;
            let positive = e.binary(BinaryOp::Gt, y, zero)?;
            e.select(positive, g, zero)?
        }
        UnaryOp::Sigmoid => {
            // y (1 - y)
            let one = e.scalar("one", dtype, 1.0)?;
            let one_minus = e.sub(one, y)?;
            let slope = e.mul(y, one_minus)?;
            e.mul(g, slope)?
        }
        UnaryOp::Tanh => {
            // 1 - y^2
            let one = e.scalar("one", dtype, 1.0)?;
            let y2 = e.unary(UnaryOp::Square, y)?;
            let slope = e.sub(one, y2)?;
            e.mul(g, slope)?
        }
    };
    Ok(vec![Some(dx)])
}

/// Gradients of a broadcasting binary op; comparisons and logical ops have bool outputs and
/// never reach here.
pub(super) fn binary(
    e: &mut Emitter,
    fwd: &Forward,
    op: BinaryOp,
    g: Value,
    needs: &[bool],
) -> Grads {
    let (a, b) = (fwd.inputs[0], fwd.inputs[1]);
    let z = fwd.out();
    let (sa, sb) = (e.shape(a), e.shape(b));
    let dtype = e.ty(z).dtype;
    let mut da = None;
    let mut db = None;
    match op {
        BinaryOp::Add | BinaryOp::Sub => {
            if needs[0] {
                da = Some(e.unbroadcast(g, &sa)?);
            }
            if needs[1] {
                let s = e.unbroadcast(g, &sb)?;
                db = Some(if op == BinaryOp::Sub { e.neg(s)? } else { s });
            }
        }
        BinaryOp::Mul => {
            if needs[0] {
                let p = e.mul(g, b)?;
                da = Some(e.unbroadcast(p, &sa)?);
            }
            if needs[1] {
                let p = e.mul(g, a)?;
                db = Some(e.unbroadcast(p, &sb)?);
            }
        }
        BinaryOp::Div => {
            if needs[0] {
                let q = e.div(g, b)?;
                da = Some(e.unbroadcast(q, &sa)?);
            }
            if needs[1] {
                // d(a/b)/db = -a/b^2 = -z/b
                let gz = e.mul(g, z)?;
                let q = e.div(gz, b)?;
                let s = e.unbroadcast(q, &sb)?;
                db = Some(e.neg(s)?);
            }
        }
        BinaryOp::Pow => {
            if needs[0] {
                // b a^(b-1)
                let one = e.scalar("one", dtype, 1.0)?;
                let bm1 = e.sub(b, one)?;
                let p = e.binary(BinaryOp::Pow, a, bm1)?;
                let slope = e.mul(b, p)?;
                let q = e.mul(g, slope)?;
                da = Some(e.unbroadcast(q, &sa)?);
            }
            if needs[1] {
                // z log(a), with log taken as 0 where a <= 0 (as TF).
                let zero = e.scalar("zero", dtype, 0.0)?;
                let positive = e.binary(BinaryOp::Gt, a, zero)?;
                let log_a = e.unary(UnaryOp::Log, a)?;
                let safe_log = e.select(positive, log_a, zero)?;
                let gz = e.mul(g, z)?;
                let q = e.mul(gz, safe_log)?;
                db = Some(e.unbroadcast(q, &sb)?);
            }
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            // Ties go to the left operand, as TF.
            let cmp = if op == BinaryOp::Maximum {
                BinaryOp::Ge
            } else {
                BinaryOp::Le
            };
            let left_wins = e.binary(cmp, a, b)?;
            if needs[0] {
                let m = e.mask(left_wins, g, true)?;
                da = Some(e.unbroadcast(m, &sa)?);
            }
            if needs[1] {
                let m = e.mask(left_wins, g, false)?;
                db = Some(e.unbroadcast(m, &sb)?);
            }
        }
        BinaryOp::Eq
        | BinaryOp::Ne
        | BinaryOp::Lt
        | BinaryOp::Le
        | BinaryOp::Gt
        | BinaryOp::Ge
        | BinaryOp::And
        | BinaryOp::Or => {}
    }
    Ok(vec![da, db])
}

/// `select(c, a, b)`: the adjoint goes to `a` where `c` holds, to `b` elsewhere.
pub(super) fn select(e: &mut Emitter, fwd: &Forward, g: Value, needs: &[bool]) -> Grads {
    let (c, a, b) = (fwd.inputs[0], fwd.inputs[1], fwd.inputs[2]);
    let mut out = vec![None, None, None];
    if needs[1] {
        let m = e.mask(c, g, true)?;
        let sa = e.shape(a);
        out[1] = Some(e.unbroadcast(m, &sa)?);
    }
    if needs[2] {
        let m = e.mask(c, g, false)?;
        let sb = e.shape(b);
        out[2] = Some(e.unbroadcast(m, &sb)?);
    }
    Ok(out)
}

/// A cast between float types casts the adjoint back. (Casts from or to non-floats carry no
/// gradient: the pass never asks for them.)
pub(super) fn cast(e: &mut Emitter, fwd: &Forward, g: Value) -> Grads {
    let to = e.ty(fwd.inputs[0]).dtype;
    Ok(vec![Some(e.cast(g, to)?)])
}
