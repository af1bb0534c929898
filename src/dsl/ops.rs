//! Elementwise ops of [`Tensor`]: unary methods, binary methods and comparisons, and operator
//! overloading (`+ - * /`, unary `-`) between tensors, references and `f32` scalars.
//! Operands broadcast like NumPy; a scalar takes the tensor's element type.

use super::builder::Tensor;
use crate::ir::{BinaryOp, UnaryOp};
use std::ops::{Add, Div, Mul, Neg, Sub};

/// Something that can be the right operand of a binary op: a tensor or an `f32` scalar.
pub trait Operand {
    /// The operand as a tensor of `like`'s graph (scalars take `like`'s element type).
    fn to_tensor_like(self, like: &Tensor) -> Tensor;
}

impl Operand for Tensor {
    fn to_tensor_like(self, _: &Tensor) -> Tensor {
        self
    }
}

impl Operand for &Tensor {
    fn to_tensor_like(self, _: &Tensor) -> Tensor {
        self.clone()
    }
}

impl Operand for f32 {
    fn to_tensor_like(self, like: &Tensor) -> Tensor {
        like.scalar_like(self)
    }
}

macro_rules! unary_methods {
    ($($(#[$m:meta])* $method:ident => $op:ident, $name:literal;)*) => {
        impl Tensor {
            $(
                $(#[$m])*
                pub fn $method(&self) -> Tensor {
                    self.unary(UnaryOp::$op, $name)
                }
            )*
        }
    };
}

unary_methods! {
    /// `max(x, 0)`.
    relu => Relu, "Relu";
    /// `1 / (1 + e^-x)`.
    sigmoid => Sigmoid, "Sigmoid";
    /// Hyperbolic tangent.
    tanh => Tanh, "Tanh";
    /// `e^x`.
    exp => Exp, "Exp";
    /// Natural logarithm.
    log => Log, "Log";
    /// Square root.
    sqrt => Sqrt, "Sqrt";
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt, "Rsqrt";
    /// `x²`.
    square => Square, "Square";
    /// `1 / x`.
    recip => Recip, "Reciprocal";
    /// `|x|`.
    abs => Abs, "Abs";
    /// `-1`, `0` or `1`.
    sign => Sign, "Sign";
    /// Rounds down.
    floor => Floor, "Floor";
    /// Logical negation of a `bool` tensor.
    logical_not => Not, "LogicalNot";
}

macro_rules! binary_methods {
    ($($(#[$m:meta])* $method:ident => $op:ident, $name:literal;)*) => {
        impl Tensor {
            $(
                $(#[$m])*
                pub fn $method(&self, rhs: impl Operand) -> Tensor {
                    let rhs = rhs.to_tensor_like(self);
                    self.binary(BinaryOp::$op, &rhs, $name)
                }
            )*
        }
    };
}

binary_methods! {
    /// `x^y`.
    pow => Pow, "Pow";
    /// Elementwise maximum.
    maximum => Maximum, "Maximum";
    /// Elementwise minimum.
    minimum => Minimum, "Minimum";
    /// `x == y` as `bool`.
    equal => Eq, "Equal";
    /// `x != y` as `bool`.
    not_equal => Ne, "NotEqual";
    /// `x < y` as `bool`.
    less => Lt, "Less";
    /// `x <= y` as `bool`.
    less_equal => Le, "LessEqual";
    /// `x > y` as `bool`.
    greater => Gt, "Greater";
    /// `x >= y` as `bool`.
    greater_equal => Ge, "GreaterEqual";
    /// Logical and of `bool` tensors.
    logical_and => And, "LogicalAnd";
    /// Logical or of `bool` tensors.
    logical_or => Or, "LogicalOr";
}

impl Tensor {
    /// A scalar constant with this tensor's element type (`f32` if poisoned).
    pub fn scalar_like(&self, value: f32) -> Tensor {
        self.scalar_like_f64(f64::from(value))
    }

    /// [`Tensor::scalar_like`] from an `f64`, rounded once to the element type (so `1 - 0.9`
    /// computed in `f64` becomes the `f32` nearest 0.1).
    pub fn scalar_like_f64(&self, value: f64) -> Tensor {
        let dtype = self.dtype().unwrap_or(crate::tensor::DType::F32);
        self.builder.scalar(dtype, value)
    }

    /// `max(x, alpha·x)`.
    pub fn leaky_relu(&self, alpha: f32) -> Tensor {
        self.maximum(self * alpha)
    }
}

macro_rules! operator {
    ($Trait:ident, $method:ident, $op:ident, $name:literal) => {
        impl $Trait<&Tensor> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary(BinaryOp::$op, rhs, $name)
            }
        }
        impl $Trait<Tensor> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                self.binary(BinaryOp::$op, &rhs, $name)
            }
        }
        impl $Trait<&Tensor> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary(BinaryOp::$op, rhs, $name)
            }
        }
        impl $Trait<Tensor> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                self.binary(BinaryOp::$op, &rhs, $name)
            }
        }
        impl $Trait<f32> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: f32) -> Tensor {
                self.binary(BinaryOp::$op, &self.scalar_like(rhs), $name)
            }
        }
        impl $Trait<f32> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: f32) -> Tensor {
                self.binary(BinaryOp::$op, &self.scalar_like(rhs), $name)
            }
        }
        impl $Trait<&Tensor> for f32 {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                rhs.scalar_like(self).binary(BinaryOp::$op, rhs, $name)
            }
        }
        impl $Trait<Tensor> for f32 {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                rhs.scalar_like(self).binary(BinaryOp::$op, &rhs, $name)
            }
        }
    };
}

operator!(Add, add, Add, "add");
operator!(Sub, sub, Sub, "sub");
operator!(Mul, mul, Mul, "mul");
operator!(Div, div, Div, "truediv");

impl Neg for &Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        self.unary(UnaryOp::Neg, "Neg")
    }
}

impl Neg for Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        self.unary(UnaryOp::Neg, "Neg")
    }
}
