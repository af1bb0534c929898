//! Elementwise kernels: unary and binary ops, `Select` and `Cast`, with NumPy broadcasting.
//!
//! Every element goes through [`crate::ir::scalar`], the one definition of elementwise semantics
//! that all executors share: operands become `f64` (booleans 0/1, integers exact below 2^53),
//! the scalar function computes the result, and the result goes back to the output's carrier
//! (integers truncate toward zero, then wrap to their width as native arithmetic does when a
//! result overflows). Float results are rounded to their dtype by the executor afterwards.

use super::Precision;
use super::array::{Array, Elements, Output, broadcast_index, broadcast_shapes};
use crate::ir::{BinaryOp, UnaryOp, scalar};
use crate::tensor::DType;

/// Element `i` as the `f64` the scalar semantics works on.
fn scalar_at(data: &Elements, i: usize) -> f64 {
    match data {
        Elements::Float(v) => v[i],
        Elements::Int(v) => v[i] as f64,
        Elements::Bool(v) => f64::from(u8::from(v[i])),
    }
}

/// Stores scalar results in the carrier of `dtype`.
fn from_scalars(dtype: DType, values: impl Iterator<Item = f64>) -> Elements {
    if dtype.is_float() {
        Elements::Float(values.collect())
    } else if dtype.is_int() {
        // Truncation toward zero; `normalize` then wraps to the dtype's width.
        Elements::Int(values.map(|r| r as i64).collect())
    } else {
        Elements::Bool(values.map(|r| r != 0.0).collect())
    }
}

/// A unary op: `scalar::unary` on every element.
pub(crate) fn unary(op: UnaryOp, x: &Array) -> Result<Output, String> {
    let values = (0..x.len()).map(|i| scalar::unary(op, scalar_at(&x.data, i), x.dtype));
    Ok(Output::new(x.shape.clone(), from_scalars(x.dtype, values)))
}

/// A binary op on broadcast operands: `scalar::binary` on every pair. Comparisons and the
/// logical ops give `bool`; the others keep the operands' dtype.
pub(crate) fn binary(op: BinaryOp, a: &Array, b: &Array) -> Result<Output, String> {
    if a.dtype != b.dtype {
        return Err(format!(
            "internal: {} of {} and {}",
            op.name(),
            a.dtype,
            b.dtype
        ));
    }
    let shape = broadcast_shapes(&a.shape, &b.shape)?;
    let ai = broadcast_index(&a.shape, &shape)?;
    let bi = broadcast_index(&b.shape, &shape)?;
    let out_dtype = if op.is_comparison() || op.is_logical() {
        DType::Bool
    } else {
        a.dtype
    };
    let values = ai
        .iter()
        .zip(&bi)
        .map(|(&i, &j)| scalar::binary(op, scalar_at(&a.data, i), scalar_at(&b.data, j), a.dtype));
    Ok(Output::new(shape, from_scalars(out_dtype, values)))
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

/// Converts `x` to dtype `to` with `scalar::cast` (float to integer truncates toward zero and
/// saturates, NaN gives 0; anything to `bool` is `x != 0`). In [`Precision::F64`] mode a cast
/// to a float dtype keeps the `f64` value, like every other float result of that mode.
pub(crate) fn cast(x: &Array, to: DType, p: Precision) -> Result<Output, String> {
    let values = (0..x.len()).map(|i| {
        let v = scalar_at(&x.data, i);
        if to.is_float() && p == Precision::F64 {
            v
        } else {
            scalar::cast(v, to)
        }
    });
    Ok(Output::new(x.shape.clone(), from_scalars(to, values)))
}
