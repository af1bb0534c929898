//! The scalar semantics of every elementwise op, in `f64`.
//!
//! This is the definition every executor follows: the reference executor evaluates it directly;
//! constant folding uses it; the CPU backend's vectorised kernels and the rendered CUDA C are
//! tested against it. Booleans are 0.0/1.0. Integer ops are exact for |x| < 2^53.
//! NaN propagates through `relu`, `maximum` and `minimum` (so the non-finite guard sees it).

use super::op::{BinaryOp, UnaryOp};
use crate::tensor::DType;

/// `op(x)` for an element of type `dtype`.
pub fn unary(op: UnaryOp, x: f64, dtype: DType) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x // 0, -0 or NaN
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
        UnaryOp::Sigmoid => {
            if x >= 0.0 {
                1.0 / (1.0 + (-x).exp())
            } else {
                let e = x.exp();
                e / (1.0 + e)
            }
        }
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Floor => {
            if dtype.is_float() {
                x.floor()
            } else {
                x
            }
        }
        UnaryOp::Not => f64::from(u8::from(x == 0.0)),
    }
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// `op(a, b)` for elements of type `dtype` (the operands' common type).
///
/// Integer division truncates toward zero, and division by zero gives 0 (never a trap).
pub fn binary(op: BinaryOp, a: f64, b: f64, dtype: DType) -> f64 {
    let flag = |c: bool| f64::from(u8::from(c));
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => {
            if dtype.is_float() {
                a / b
            } else if b == 0.0 {
                0.0
            } else {
                (a / b).trunc()
            }
        }
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum => nan_max(a, b),
        BinaryOp::Minimum => nan_min(a, b),
        BinaryOp::Eq => flag(a == b),
        BinaryOp::Ne => flag(a != b),
        BinaryOp::Lt => flag(a < b),
        BinaryOp::Le => flag(a <= b),
        BinaryOp::Gt => flag(a > b),
        BinaryOp::Ge => flag(a >= b),
        BinaryOp::And => flag(a != 0.0 && b != 0.0),
        BinaryOp::Or => flag(a != 0.0 || b != 0.0),
    }
}

/// Converts an element to `to` as `Op::Cast` does: float to integer truncates toward zero
/// (saturating, NaN to 0), anything to bool is `x != 0`, and float targets round to nearest.
pub fn cast(x: f64, to: DType) -> f64 {
    match to {
        DType::Bool => f64::from(u8::from(x != 0.0)),
        DType::I32 => f64::from(x as i32),
        DType::I64 => (x as i64) as f64,
        DType::U8 => f64::from(x as u8),
        DType::F32 => f64::from(x as f32),
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::BF16 => crate::tensor::bf16_from_f64(x).to_f64(),
        DType::F64 => x,
    }
}

/// Rounds an `f64` result to what an element of `dtype` can hold (the last step of every op).
pub fn round_to(x: f64, dtype: DType) -> f64 {
    if dtype.is_float() { cast(x, dtype) } else { x }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_cases_follow_the_documented_semantics() {
        assert_eq!(unary(UnaryOp::Sign, 0.0, DType::F32), 0.0);
        assert_eq!(unary(UnaryOp::Sign, -3.0, DType::F32), -1.0);
        assert!(unary(UnaryOp::Relu, f64::NAN, DType::F32).is_nan());
        assert_eq!(unary(UnaryOp::Relu, -2.0, DType::F32), 0.0);
        assert!(binary(BinaryOp::Maximum, f64::NAN, 1.0, DType::F32).is_nan());
        assert_eq!(binary(BinaryOp::Div, 7.0, -2.0, DType::I32), -3.0);
        assert_eq!(binary(BinaryOp::Div, 7.0, 0.0, DType::I64), 0.0);
        assert_eq!(cast(-2.7, DType::I32), -2.0);
        assert_eq!(cast(f64::NAN, DType::I32), 0.0);
        assert_eq!(cast(0.5, DType::Bool), 1.0);
        let s = unary(UnaryOp::Sigmoid, -800.0, DType::F64);
        assert!(s >= 0.0 && s.is_finite());
        assert_eq!(unary(UnaryOp::Sigmoid, 0.0, DType::F32), 0.5);
    }
}
