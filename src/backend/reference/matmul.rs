//! `MatMul`: batched `[.., M, K] x [.., K, N]` with optional transposes of the two last axes;
//! a rank-2 right operand is shared by every batch. Each dot product accumulates in `f64`, in
//! increasing `k`.

use super::array::{Array, Elements, Output};

/// The `(rows, cols)` of the last two axes, and the product of the leading (batch) axes.
fn matrix_dims(shape: &[usize]) -> Result<(usize, usize, usize), String> {
    let r = shape.len();
    if r < 2 {
        return Err(format!("internal: matmul operand of shape {shape:?}"));
    }
    Ok((shape[..r - 2].iter().product(), shape[r - 2], shape[r - 1]))
}

/// `MatMul { transpose_a, transpose_b }`.
pub(crate) fn matmul(
    a: &Array,
    b: &Array,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<Output, String> {
    let (av, bv) = (a.floats("left operand")?, b.floats("right operand")?);
    let (batch, ar, ac) = matrix_dims(&a.shape)?;
    let (b_batch, br, bc) = matrix_dims(&b.shape)?;
    let (m, k) = if transpose_a { (ac, ar) } else { (ar, ac) };
    let (kb, n) = if transpose_b { (bc, br) } else { (br, bc) };
    let shared_rhs = b.shape.len() == 2;
    if k != kb || (!shared_rhs && b_batch != batch) {
        return Err(format!(
            "internal: matmul of {:?} and {:?} (transposes {transpose_a}, {transpose_b})",
            a.shape, b.shape
        ));
    }
    // Element (i, kk) of the left matrix of batch `t`, (kk, j) of the right one.
    let lhs = |t: usize, i: usize, kk: usize| {
        let base = t * ar * ac;
        if transpose_a {
            av[base + kk * m + i]
        } else {
            av[base + i * k + kk]
        }
    };
    let rhs = |t: usize, kk: usize, j: usize| {
        let base = if shared_rhs { 0 } else { t * br * bc };
        if transpose_b {
            bv[base + j * k + kk]
        } else {
            bv[base + kk * n + j]
        }
    };
    let mut out = Vec::with_capacity(batch * m * n);
    for t in 0..batch {
        for i in 0..m {
            for j in 0..n {
                out.push((0..k).map(|kk| lhs(t, i, kk) * rhs(t, kk, j)).sum());
            }
        }
    }
    let mut shape = a.shape[..a.shape.len() - 2].to_vec();
    shape.extend([m, n]);
    Ok(Output::new(shape, Elements::Float(out)))
}
