//! Reductions: `Reduce` (sum, mean, max, min), `ArgMax` and `Moments`.
//!
//! Each output element gathers its input elements in row-major order, then folds them in that
//! order (float sums accumulate in `f64`). Max and min propagate NaN; an empty max is the
//! lowest value of the dtype (`-inf` for floats) and an empty min the highest, as TensorFlow.

use super::array::{Array, Elements, Output, unravel};
use crate::ir::ReduceOp;
use crate::tensor::DType;

/// The shape after reducing `axes` of `shape`.
fn reduced_shape(shape: &[usize], axes: &[usize], keep_dims: bool) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keep_dims) {
            (true, true) => Some(1),
            (true, false) => None,
            (false, _) => Some(d),
        })
        .collect()
}

/// For every output element of reducing `axes`, the flat indices of its inputs in row-major order.
pub(crate) fn groups(shape: &[usize], axes: &[usize]) -> Result<Vec<Vec<usize>>, String> {
    if let Some(a) = axes.iter().find(|&&a| a >= shape.len()) {
        return Err(format!("internal: axis {a} of {shape:?}"));
    }
    let kept = reduced_shape(shape, axes, true);
    let kept_total: usize = kept.iter().product();
    let mut out = vec![Vec::new(); kept_total];
    let total: usize = shape.iter().product();
    for i in 0..total {
        let c = unravel(i, shape);
        let mut o = 0;
        for (axis, &ci) in c.iter().enumerate() {
            let coord = if axes.contains(&axis) { 0 } else { ci };
            o = o * kept[axis] + coord;
        }
        out[o].push(i);
    }
    Ok(out)
}

/// The position (within `values`) of the first maximum; NaN counts as larger than everything.
pub(crate) fn first_max(values: impl IntoIterator<Item = f64>) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, v) in values.into_iter().enumerate() {
        let better = match best {
            None => true,
            Some((_, b)) => !b.is_nan() && (v.is_nan() || v > b),
        };
        if better {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i)
}

fn int_bounds(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        DType::U8 => (0, 255),
        _ => (i64::MIN, i64::MAX),
    }
}

fn fold_floats(op: ReduceOp, xs: impl Iterator<Item = f64>, count: usize) -> f64 {
    match op {
        ReduceOp::Sum => xs.sum(),
        ReduceOp::Mean => xs.sum::<f64>() / count as f64,
        ReduceOp::Max => xs.fold(f64::NEG_INFINITY, |m, x| {
            if m.is_nan() || x.is_nan() {
                f64::NAN
            } else {
                m.max(x)
            }
        }),
        ReduceOp::Min => xs.fold(f64::INFINITY, |m, x| {
            if m.is_nan() || x.is_nan() {
                f64::NAN
            } else {
                m.min(x)
            }
        }),
    }
}

/// `Reduce { op, axes, keep_dims }`.
pub(crate) fn reduce(
    x: &Array,
    op: ReduceOp,
    axes: &[usize],
    keep_dims: bool,
) -> Result<Output, String> {
    let groups = groups(&x.shape, axes)?;
    let shape = reduced_shape(&x.shape, axes, keep_dims);
    let data = match &x.data {
        Elements::Float(v) => Elements::Float(
            groups
                .iter()
                .map(|g| fold_floats(op, g.iter().map(|&i| v[i]), g.len()))
                .collect(),
        ),
        Elements::Int(v) => {
            let (lo, hi) = int_bounds(x.dtype);
            let fold = |g: &Vec<usize>| -> Result<i64, String> {
                let xs = g.iter().map(|&i| v[i]);
                Ok(match op {
                    ReduceOp::Sum => xs.fold(0i64, i64::wrapping_add),
                    ReduceOp::Max => xs.fold(lo, i64::max),
                    ReduceOp::Min => xs.fold(hi, i64::min),
                    ReduceOp::Mean => return Err("internal: integer reduce_mean".into()),
                })
            };
            Elements::Int(groups.iter().map(fold).collect::<Result<_, _>>()?)
        }
        Elements::Bool(_) => return Err("internal: reduction of bool".into()),
    };
    Ok(Output::new(shape, data))
}

/// `ArgMax { axis }`: the index of the first largest element along `axis`, as `i64`.
pub(crate) fn argmax(x: &Array, axis: usize) -> Result<Output, String> {
    let groups = groups(&x.shape, &[axis])?;
    let value = |i: usize| match &x.data {
        Elements::Float(v) => v[i],
        Elements::Int(v) => v[i] as f64,
        Elements::Bool(v) => f64::from(u8::from(v[i])),
    };
    // Integers compare exactly as themselves; widening to f64 would merge neighbours above 2^53.
    let pick = |g: &Vec<usize>| -> i64 {
        let pos = match &x.data {
            Elements::Int(v) => g
                .iter()
                .enumerate()
                .fold(None, |best: Option<(usize, i64)>, (p, &i)| match best {
                    Some((_, b)) if v[i] <= b => best,
                    _ => Some((p, v[i])),
                })
                .map(|(p, _)| p),
            _ => first_max(g.iter().map(|&i| value(i))),
        };
        pos.map_or(0, |p| p as i64)
    };
    let shape = reduced_shape(&x.shape, &[axis], false);
    Ok(Output::new(
        shape,
        Elements::Int(groups.iter().map(pick).collect()),
    ))
}

/// `Moments { axes, keep_dims }`: mean and biased variance `mean((x - mean)^2)`, two passes.
pub(crate) fn moments(x: &Array, axes: &[usize], keep_dims: bool) -> Result<[Output; 2], String> {
    let v = x.floats("moments input")?;
    let groups = groups(&x.shape, axes)?;
    let shape = reduced_shape(&x.shape, axes, keep_dims);
    let means: Vec<f64> = groups
        .iter()
        .map(|g| g.iter().map(|&i| v[i]).sum::<f64>() / g.len() as f64)
        .collect();
    let vars: Vec<f64> = groups
        .iter()
        .zip(&means)
        .map(|(g, &m)| g.iter().map(|&i| (v[i] - m) * (v[i] - m)).sum::<f64>() / g.len() as f64)
        .collect();
    Ok([
        Output::new(shape.clone(), Elements::Float(means)),
        Output::new(shape, Elements::Float(vars)),
    ])
}
