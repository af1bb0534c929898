//! Elementwise kernels: unary and binary ops, `Select` and `Cast`, with NumPy broadcasting.
//!
//! Floats are computed in `f64` and rounded to their dtype afterwards by the executor. Integers
//! wrap on overflow (two's complement); integer `Div` truncates toward zero and fails on a zero
//! divisor, and integer `Pow` fails on a negative exponent, as TensorFlow's CPU kernels do.
//! NaN propagates through `Sign`, `Relu`, `Maximum` and `Minimum`.

use super::Precision;
use super::array::{Array, Elements, Output, broadcast_index, broadcast_shapes, round_float};
use crate::ir::{BinaryOp, UnaryOp};
use crate::tensor::DType;

fn float_unary(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        // Zero (of either sign) and NaN map to themselves.
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Square => x * x,
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Relu => {
            if x > 0.0 || x.is_nan() {
                x
            } else {
                0.0
            }
        }
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Not => f64::NAN,
    }
}

/// A unary op. Integers support `Neg`, `Abs`, `Sign`; booleans only `Not`.
pub(crate) fn unary(op: UnaryOp, x: &Array) -> Result<Output, String> {
    let data = match (&x.data, op) {
        (Elements::Float(v), _) if op != UnaryOp::Not => {
            Elements::Float(v.iter().map(|&a| float_unary(op, a)).collect())
        }
        (Elements::Int(v), UnaryOp::Neg) => {
            Elements::Int(v.iter().map(|a| a.wrapping_neg()).collect())
        }
        (Elements::Int(v), UnaryOp::Abs) => {
            Elements::Int(v.iter().map(|a| a.wrapping_abs()).collect())
        }
        (Elements::Int(v), UnaryOp::Sign) => Elements::Int(v.iter().map(|a| a.signum()).collect()),
        (Elements::Bool(v), UnaryOp::Not) => Elements::Bool(v.iter().map(|a| !a).collect()),
        (d, _) => {
            return Err(format!(
                "internal: {} is not defined on {} elements",
                op.name(),
                d.class()
            ));
        }
    };
    Ok(Output::new(x.shape.clone(), data))
}

/// Applies `f` to broadcast pairs of `a` and `b`.
fn zip_with<A: Copy, B: Copy, T>(
    a: &[A],
    ai: &[usize],
    b: &[B],
    bi: &[usize],
    mut f: impl FnMut(A, B) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    ai.iter().zip(bi).map(|(&i, &j)| f(a[i], b[j])).collect()
}

fn compare<T: PartialOrd>(op: BinaryOp, a: T, b: T) -> Result<bool, String> {
    Ok(match op {
        BinaryOp::Eq => a == b,
        BinaryOp::Ne => a != b,
        BinaryOp::Lt => a < b,
        BinaryOp::Le => a <= b,
        BinaryOp::Gt => a > b,
        BinaryOp::Ge => a >= b,
        _ => return Err(format!("internal: {} is not a comparison", op.name())),
    })
}

fn float_binary(op: BinaryOp, a: f64, b: f64) -> Result<f64, String> {
    Ok(match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum if a.is_nan() || b.is_nan() => f64::NAN,
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum if a.is_nan() || b.is_nan() => f64::NAN,
        BinaryOp::Minimum => a.min(b),
        _ => return Err(format!("internal: {} is not arithmetic", op.name())),
    })
}

/// `base^exp` with wrapping multiplication, by squaring.
fn int_pow(mut base: i64, mut exp: i64) -> i64 {
    let mut acc: i64 = 1;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exp >>= 1;
    }
    acc
}

fn int_binary(op: BinaryOp, a: i64, b: i64) -> Result<i64, String> {
    Ok(match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div if b == 0 => return Err("integer division by zero".into()),
        BinaryOp::Div => a.wrapping_div(b),
        BinaryOp::Pow if b < 0 => {
            return Err(format!(
                "integers to negative integer powers are not allowed ({a}^{b})"
            ));
        }
        BinaryOp::Pow => int_pow(a, b),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
        _ => return Err(format!("internal: {} is not arithmetic", op.name())),
    })
}

/// A binary op on broadcast operands. Comparisons give `bool`; `And`/`Or` take `bool`.
pub(crate) fn binary(op: BinaryOp, a: &Array, b: &Array) -> Result<Output, String> {
    let shape = broadcast_shapes(&a.shape, &b.shape)?;
    let ai = broadcast_index(&a.shape, &shape)?;
    let bi = broadcast_index(&b.shape, &shape)?;
    let data = match (&a.data, &b.data) {
        (Elements::Float(x), Elements::Float(y)) if op.is_comparison() => {
            Elements::Bool(zip_with(x, &ai, y, &bi, |p, q| compare(op, p, q))?)
        }
        (Elements::Float(x), Elements::Float(y)) => {
            Elements::Float(zip_with(x, &ai, y, &bi, |p, q| float_binary(op, p, q))?)
        }
        (Elements::Int(x), Elements::Int(y)) if op.is_comparison() => {
            Elements::Bool(zip_with(x, &ai, y, &bi, |p, q| compare(op, p, q))?)
        }
        (Elements::Int(x), Elements::Int(y)) => {
            Elements::Int(zip_with(x, &ai, y, &bi, |p, q| int_binary(op, p, q))?)
        }
        (Elements::Bool(x), Elements::Bool(y)) if op.is_comparison() => {
            Elements::Bool(zip_with(x, &ai, y, &bi, |p, q| compare(op, p, q))?)
        }
        (Elements::Bool(x), Elements::Bool(y)) => {
            Elements::Bool(zip_with(x, &ai, y, &bi, |p, q| match op {
                BinaryOp::And => Ok(p && q),
                BinaryOp::Or => Ok(p || q),
                _ => Err(format!("internal: {} is not defined on bool", op.name())),
            })?)
        }
        (x, y) => {
            return Err(format!(
                "internal: {} on {} and {} elements",
                op.name(),
                x.class(),
                y.class()
            ));
        }
    };
    Ok(Output::new(shape, data))
}

/// `cond ? a : b`, the three broadcast together.
pub(crate) fn select(cond: &Array, a: &Array, b: &Array) -> Result<Output, String> {
    let shape = broadcast_shapes(&cond.shape, &broadcast_shapes(&a.shape, &b.shape)?)?;
    let ci = broadcast_index(&cond.shape, &shape)?;
    let ai = broadcast_index(&a.shape, &shape)?;
    let bi = broadcast_index(&b.shape, &shape)?;
    let Elements::Bool(c) = &cond.data else {
        return Err("internal: select condition is not bool".into());
    };
    // Gather from each branch, then choose per element.
    let from_a = a.data.gather(&ai);
    let from_b = b.data.gather(&bi);
    fn choose<T: Copy>(c: &[bool], ci: &[usize], x: &[T], y: &[T]) -> Vec<T> {
        (0..x.len())
            .map(|i| if c[ci[i]] { x[i] } else { y[i] })
            .collect()
    }
    let data = match (from_a, from_b) {
        (Elements::Float(x), Elements::Float(y)) => Elements::Float(choose(c, &ci, &x, &y)),
        (Elements::Int(x), Elements::Int(y)) => Elements::Int(choose(c, &ci, &x, &y)),
        (Elements::Bool(x), Elements::Bool(y)) => Elements::Bool(choose(c, &ci, &x, &y)),
        (x, y) => {
            return Err(format!(
                "internal: select between {} and {} elements",
                x.class(),
                y.class()
            ));
        }
    };
    Ok(Output::new(shape, data))
}

/// Converts `x` to dtype `to`. Float to integer truncates toward zero (saturating at the type's
/// range; NaN gives 0), integer to integer wraps, anything to `bool` is `x != 0` (NaN is true),
/// `bool` to a number is 0 or 1. `i64`/`i32` to `f32` rounds once, directly.
pub(crate) fn cast(x: &Array, to: DType, p: Precision) -> Result<Output, String> {
    let data = match &x.data {
        Elements::Float(v) if to.is_float() => Elements::Float(v.clone()),
        Elements::Float(v) if to.is_int() => Elements::Int(
            v.iter()
                .map(|&a| match to {
                    DType::I32 => i64::from(a as i32),
                    DType::U8 => i64::from(a as u8),
                    _ => a as i64,
                })
                .collect(),
        ),
        Elements::Float(v) => Elements::Bool(v.iter().map(|&a| a != 0.0).collect()),
        Elements::Int(v) if to.is_float() => Elements::Float(
            v.iter()
                .map(|&a| match (p, to) {
                    (Precision::F32, DType::F32) => f64::from(a as f32),
                    _ => round_float(to, p, a as f64),
                })
                .collect(),
        ),
        Elements::Int(v) if to.is_int() => Elements::Int(v.clone()),
        Elements::Int(v) => Elements::Bool(v.iter().map(|&a| a != 0).collect()),
        Elements::Bool(v) if to.is_float() => {
            Elements::Float(v.iter().map(|&a| f64::from(u8::from(a))).collect())
        }
        Elements::Bool(v) if to.is_int() => {
            Elements::Int(v.iter().map(|&a| i64::from(a)).collect())
        }
        Elements::Bool(v) => Elements::Bool(v.clone()),
    };
    Ok(Output::new(x.shape.clone(), data))
}
