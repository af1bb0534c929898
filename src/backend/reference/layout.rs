//! Layout kernels: `Reshape`, `Transpose`, `Broadcast`, `Slice`, `Concat` and `Pad`.
//!
//! Each builds, for every output element, the flat index of the input element it copies (an
//! explicit gather), so the same code serves every dtype.

use super::array::{Array, Elements, Output, broadcast_index, ravel, strides, unravel};

/// Same elements in row-major order, new shape.
pub(crate) fn reshape(x: &Array, shape: &[usize]) -> Result<Output, String> {
    if shape.iter().product::<usize>() != x.len() {
        return Err(format!(
            "cannot reshape {:?} ({} elements) to {shape:?}",
            x.shape,
            x.len()
        ));
    }
    Ok(Output::new(shape.to_vec(), x.data.clone()))
}

/// Output axis `i` is input axis `perm[i]`.
pub(crate) fn transpose(x: &Array, perm: &[usize]) -> Result<Output, String> {
    let mut seen = vec![false; perm.len()];
    let is_permutation = perm.len() == x.shape.len()
        && perm
            .iter()
            .all(|&p| p < perm.len() && !std::mem::replace(&mut seen[p], true));
    if !is_permutation {
        return Err(format!("internal: perm {perm:?} for shape {:?}", x.shape));
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let in_strides = strides(&x.shape);
    // The input stride of each output axis.
    let moved: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let index: Vec<usize> = (0..x.len())
        .map(|i| ravel(&unravel(i, &out_shape), &moved))
        .collect();
    Ok(Output::new(out_shape, x.data.gather(&index)))
}

/// NumPy broadcast of `x` to `shape`.
pub(crate) fn broadcast(x: &Array, shape: &[usize]) -> Result<Output, String> {
    let index = broadcast_index(&x.shape, shape)?;
    Ok(Output::new(shape.to_vec(), x.data.gather(&index)))
}

/// Elements `start..end` of `axis`.
pub(crate) fn slice(x: &Array, axis: usize, start: usize, end: usize) -> Result<Output, String> {
    if axis >= x.shape.len() || start > end || end > x.shape[axis] {
        return Err(format!(
            "internal: slice {start}..{end} of axis {axis} of {:?}",
            x.shape
        ));
    }
    let mut out_shape = x.shape.clone();
    out_shape[axis] = end - start;
    let in_strides = strides(&x.shape);
    let total: usize = out_shape.iter().product();
    let index: Vec<usize> = (0..total)
        .map(|i| {
            let mut c = unravel(i, &out_shape);
            c[axis] += start;
            ravel(&c, &in_strides)
        })
        .collect();
    Ok(Output::new(out_shape, x.data.gather(&index)))
}

/// Joins `parts` along `axis`.
pub(crate) fn concat(parts: &[&Array], axis: usize) -> Result<Output, String> {
    let first = parts
        .first()
        .ok_or_else(|| "internal: concat of nothing".to_string())?;
    let fits = |p: &Array| {
        p.shape.len() == first.shape.len()
            && (0..p.shape.len()).all(|i| i == axis || p.shape[i] == first.shape[i])
    };
    if axis >= first.shape.len() || !parts.iter().all(|p| fits(p)) {
        let shapes: Vec<_> = parts.iter().map(|p| &p.shape).collect();
        return Err(format!("internal: concat of {shapes:?} along axis {axis}"));
    }
    let mut out_shape = first.shape.clone();
    out_shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
    // Gather from the joined buffer of all parts: part `k` starts at `offsets[k]`.
    let mut offsets = Vec::with_capacity(parts.len());
    let mut running = 0;
    for p in parts {
        offsets.push(running);
        running += p.len();
    }
    let all = Elements::concat(&parts.iter().map(|p| &p.data).collect::<Vec<_>>())?;
    let part_strides: Vec<Vec<usize>> = parts.iter().map(|p| strides(&p.shape)).collect();
    let total: usize = out_shape.iter().product();
    let mut index = Vec::with_capacity(total);
    for i in 0..total {
        let mut c = unravel(i, &out_shape);
        let mut k = 0;
        while c[axis] >= parts[k].shape[axis] {
            c[axis] -= parts[k].shape[axis];
            k += 1;
        }
        index.push(offsets[k] + ravel(&c, &part_strides[k]));
    }
    Ok(Output::new(out_shape, all.gather(&index)))
}

/// Zero padding: `(before, after)` zeros around every axis.
pub(crate) fn pad(x: &Array, pads: &[(usize, usize)]) -> Result<Output, String> {
    if pads.len() != x.shape.len() {
        return Err(format!("internal: {} pads for {:?}", pads.len(), x.shape));
    }
    let out_shape: Vec<usize> = x
        .shape
        .iter()
        .zip(pads)
        .map(|(&d, &(b, a))| b + d + a)
        .collect();
    let in_strides = strides(&x.shape);
    let total: usize = out_shape.iter().product();
    let index: Vec<Option<usize>> = (0..total)
        .map(|i| {
            let c = unravel(i, &out_shape);
            let mut src = Vec::with_capacity(c.len());
            for (axis, &ci) in c.iter().enumerate() {
                let before = pads[axis].0;
                if ci < before || ci - before >= x.shape[axis] {
                    return None;
                }
                src.push(ci - before);
            }
            Some(ravel(&src, &in_strides))
        })
        .collect();
    Ok(Output::new(out_shape, x.data.gather_or_zero(&index)))
}
