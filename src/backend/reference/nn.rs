//! Activations, losses and sampling: `Softmax`, `LogSoftmax`, `SparseSoftmaxCrossEntropy`,
//! `OneHot`, `InTopK` and `RandomUniform`.
//!
//! Softmax and log-softmax subtract the maximum before exponentiating (numerically stable).
//! `InTopK` follows TensorFlow's kernel exactly: a target is in the top `k` when fewer than `k`
//! classes score strictly higher (so ties at the boundary count as in), and the answer is `false`
//! when the target is out of range or any score of the row is not finite.

use super::array::{Array, Elements, Output};
use super::reduce::groups;
use crate::ir::rng::{step_key, uniform_at};

/// `(max, ln(sum(exp(x - max))))` of one slice: the pieces of a stable (log-)softmax.
fn log_sum_exp_parts(xs: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let max = xs.clone().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = xs.map(|x| (x - max).exp()).sum();
    (max, sum.ln())
}

/// `Softmax { axis }` (`log = false`) or `LogSoftmax { axis }` (`log = true`).
pub(crate) fn softmax(x: &Array, axis: usize, log: bool) -> Result<Output, String> {
    let v = x.floats("input")?;
    let mut out = vec![0.0; v.len()];
    for g in groups(&x.shape, &[axis])? {
        let (max, log_sum) = log_sum_exp_parts(g.iter().map(|&i| v[i]));
        for &i in &g {
            let shifted = v[i] - max - log_sum;
            out[i] = if log { shifted } else { shifted.exp() };
        }
    }
    Ok(Output::new(x.shape.clone(), Elements::Float(out)))
}

/// `SparseSoftmaxCrossEntropy`: `-log_softmax(logits[i])[labels[i]]` per row. A label outside
/// `[0, C)` is an error, as TensorFlow's CPU kernel.
pub(crate) fn sparse_softmax_cross_entropy(
    logits: &Array,
    labels: &Array,
) -> Result<Output, String> {
    let (v, l) = (logits.floats("logits")?, labels.ints("labels")?);
    let (rows, classes) = match logits.shape.as_slice() {
        &[r, c] if l.len() == r => (r, c),
        other => {
            return Err(format!(
                "internal: logits {other:?} with labels {:?}",
                labels.shape
            ));
        }
    };
    let mut out = Vec::with_capacity(rows);
    for (r, &label) in l.iter().enumerate() {
        let row = &v[r * classes..(r + 1) * classes];
        let class = usize::try_from(label)
            .ok()
            .filter(|&c| c < classes)
            .ok_or_else(|| {
                format!(
                    "received a label value of {label} in row {r}, which is outside the valid range [0, {classes})"
                )
            })?;
        let (max, log_sum) = log_sum_exp_parts(row.iter().copied());
        out.push(-(row[class] - max - log_sum));
    }
    Ok(Output::new(vec![rows], Elements::Float(out)))
}

/// `OneHot { depth }`: a trailing axis of `depth` with 1 at the index; out of range gives zeros.
pub(crate) fn one_hot(indices: &Array, depth: usize) -> Result<Output, String> {
    let idx = indices.ints("indices")?;
    let mut out = vec![0.0; idx.len() * depth];
    for (i, &k) in idx.iter().enumerate() {
        if let Some(k) = usize::try_from(k).ok().filter(|&k| k < depth) {
            out[i * depth + k] = 1.0;
        }
    }
    let mut shape = indices.shape.clone();
    shape.push(depth);
    Ok(Output::new(shape, Elements::Float(out)))
}

/// `InTopK { k }`: `predictions [N, C]`, `targets [N]` to `bool [N]` (semantics in the module docs).
pub(crate) fn in_top_k(predictions: &Array, targets: &Array, k: usize) -> Result<Output, String> {
    let (p, t) = (predictions.floats("predictions")?, targets.ints("targets")?);
    let (rows, classes) = match predictions.shape.as_slice() {
        &[r, c] if t.len() == r => (r, c),
        other => {
            return Err(format!(
                "internal: predictions {other:?} with targets {:?}",
                targets.shape
            ));
        }
    };
    let out = (0..rows)
        .map(|r| {
            let row = &p[r * classes..(r + 1) * classes];
            let Some(target) = usize::try_from(t[r]).ok().filter(|&c| c < classes) else {
                return false;
            };
            if !row.iter().all(|x| x.is_finite()) {
                return false;
            }
            let higher = row.iter().filter(|&&x| x > row[target]).count();
            higher < k
        })
        .collect();
    Ok(Output::new(vec![rows], Elements::Bool(out)))
}

/// `RandomUniform { seed }`: inputs `(like, counter)`; element `i` is
/// `uniform_at(step_key(seed, counter), i)`.
pub(crate) fn random_uniform(like: &Array, counter: &Array, seed: u64) -> Result<Output, String> {
    let counter = match counter.ints("counter")? {
        &[c] => c,
        other => return Err(format!("internal: counter with {} elements", other.len())),
    };
    let key = step_key(seed, counter);
    let out = (0..like.len())
        .map(|i| f64::from(uniform_at(key, i as u64)))
        .collect();
    Ok(Output::new(like.shape.clone(), Elements::Float(out)))
}
