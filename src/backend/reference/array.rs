//! The executor's own value type: a row-major array whose elements live in one of three exact
//! carriers (`f64` for every float dtype, `i64` for every integer dtype, `bool`), tagged with the
//! graph's dtype. Every op result is brought back to its dtype by [`Array::normalize`]: floats are
//! rounded to `f32`/`f16`/`bf16` (in [`Precision::F32`]), integers wrap to their width.

use super::Precision;
use crate::ir::scalar;
use crate::tensor::{DType, HostTensor, Storage};
use half::f16;

/// The elements of an [`Array`], in the carrier of their dtype's class.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Elements {
    Float(Vec<f64>),
    Int(Vec<i64>),
    Bool(Vec<bool>),
}

impl Elements {
    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            Elements::Float(v) => v.len(),
            Elements::Int(v) => v.len(),
            Elements::Bool(v) => v.len(),
        }
    }

    /// The carrier's name, for internal error messages.
    pub(crate) fn class(&self) -> &'static str {
        match self {
            Elements::Float(_) => "float",
            Elements::Int(_) => "int",
            Elements::Bool(_) => "bool",
        }
    }

    /// `out[i] = self[index[i]]`. Callers build `index` from the shapes, so every entry is in range.
    pub(crate) fn gather(&self, index: &[usize]) -> Elements {
        fn pick<T: Copy>(v: &[T], index: &[usize]) -> Vec<T> {
            index.iter().map(|&i| v[i]).collect()
        }
        match self {
            Elements::Float(v) => Elements::Float(pick(v, index)),
            Elements::Int(v) => Elements::Int(pick(v, index)),
            Elements::Bool(v) => Elements::Bool(pick(v, index)),
        }
    }

    /// `out[i] = self[index[i]]`, or zero (`false`) where `index[i]` is `None`.
    pub(crate) fn gather_or_zero(&self, index: &[Option<usize>]) -> Elements {
        fn pick<T: Copy + Default>(v: &[T], index: &[Option<usize>]) -> Vec<T> {
            index
                .iter()
                .map(|i| i.map_or(T::default(), |i| v[i]))
                .collect()
        }
        match self {
            Elements::Float(v) => Elements::Float(pick(v, index)),
            Elements::Int(v) => Elements::Int(pick(v, index)),
            Elements::Bool(v) => Elements::Bool(pick(v, index)),
        }
    }

    /// Concatenation of `parts`, which must share one carrier.
    pub(crate) fn concat(parts: &[&Elements]) -> Result<Elements, String> {
        let mut out = match parts.first() {
            Some(Elements::Float(_)) => Elements::Float(Vec::new()),
            Some(Elements::Int(_)) => Elements::Int(Vec::new()),
            Some(Elements::Bool(_)) => Elements::Bool(Vec::new()),
            None => return Err("internal: nothing to concatenate".into()),
        };
        for part in parts {
            match (&mut out, part) {
                (Elements::Float(o), Elements::Float(p)) => o.extend_from_slice(p),
                (Elements::Int(o), Elements::Int(p)) => o.extend_from_slice(p),
                (Elements::Bool(o), Elements::Bool(p)) => o.extend_from_slice(p),
                (o, p) => {
                    return Err(format!(
                        "internal: cannot join {} and {} elements",
                        o.class(),
                        p.class()
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// A value during a step: the graph dtype, a concrete shape and the elements.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Array {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Elements,
}

/// What a kernel computes: a shape and elements. The executor tags it with the node's dtype.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Output {
    pub shape: Vec<usize>,
    pub data: Elements,
}

impl Output {
    /// An output of `shape` holding `data`.
    pub(crate) fn new(shape: Vec<usize>, data: Elements) -> Output {
        Output { shape, data }
    }
}

/// The carrier class a dtype computes in.
fn class_of(dtype: DType) -> &'static str {
    if dtype.is_float() {
        "float"
    } else if dtype.is_int() {
        "int"
    } else {
        "bool"
    }
}

/// Rounds `x` to what `dtype` can hold ([`scalar::round_to`]); a no-op in `F64` mode.
pub(crate) fn round_float(dtype: DType, p: Precision, x: f64) -> f64 {
    match p {
        Precision::F64 => x,
        Precision::F32 => scalar::round_to(x, dtype),
    }
}

/// Wraps `x` to the width of integer `dtype` (two's complement, as the hardware does).
pub(crate) fn wrap_int(dtype: DType, x: i64) -> i64 {
    match dtype {
        DType::I32 => i64::from(x as i32),
        DType::U8 => i64::from(x as u8),
        _ => x,
    }
}

fn host_floats(s: &Storage) -> Vec<f64> {
    (0..s.len()).map(|i| s.get_f64(i)).collect()
}

fn host_ints(s: &Storage) -> Vec<i64> {
    match s {
        Storage::I64(v) => v.clone(),
        Storage::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
        Storage::U8(v) => v.iter().map(|&x| i64::from(x)).collect(),
        Storage::Bool(v) => v.iter().map(|&x| i64::from(x)).collect(),
        // Floats truncate toward zero (only reachable if a caller skipped its dtype check).
        other => (0..other.len()).map(|i| other.get_f64(i) as i64).collect(),
    }
}

fn host_bools(s: &Storage) -> Vec<bool> {
    match s {
        Storage::Bool(v) => v.clone(),
        other => (0..other.len()).map(|i| other.get_f64(i) != 0.0).collect(),
    }
}

impl Array {
    /// Takes a host tensor as a value of graph dtype `dtype`, then normalizes it under `p`.
    pub(crate) fn from_host(host: &HostTensor, dtype: DType, p: Precision) -> Array {
        let s = host.storage();
        let data = if dtype.is_float() {
            Elements::Float(host_floats(s))
        } else if dtype.is_int() {
            Elements::Int(host_ints(s))
        } else {
            Elements::Bool(host_bools(s))
        };
        let mut a = Array {
            dtype,
            shape: host.shape().to_vec(),
            data,
        };
        a.normalize(p);
        a
    }

    /// Tags a kernel's output with its dtype, checking the carrier fits, and normalizes it.
    pub(crate) fn from_output(out: Output, dtype: DType, p: Precision) -> Result<Array, String> {
        if out.data.class() != class_of(dtype) {
            return Err(format!(
                "internal: kernel produced {} elements for a {dtype} output",
                out.data.class()
            ));
        }
        if out.data.len() != out.shape.iter().product::<usize>() {
            return Err(format!(
                "internal: kernel produced {} elements for shape {:?}",
                out.data.len(),
                out.shape
            ));
        }
        let mut a = Array {
            dtype,
            shape: out.shape,
            data: out.data,
        };
        a.normalize(p);
        Ok(a)
    }

    /// Rounds floats to the dtype (under `p`) and wraps integers to its width.
    pub(crate) fn normalize(&mut self, p: Precision) {
        let dtype = self.dtype;
        match &mut self.data {
            Elements::Float(v) => v.iter_mut().for_each(|x| *x = round_float(dtype, p, *x)),
            Elements::Int(v) => v.iter_mut().for_each(|x| *x = wrap_int(dtype, *x)),
            Elements::Bool(_) => {}
        }
    }

    /// The host tensor of this value: the graph dtype in `F32` mode; floats as `f64` in `F64` mode.
    pub(crate) fn to_host(&self, p: Precision) -> HostTensor {
        let storage = match &self.data {
            Elements::Float(v) => match (p, self.dtype) {
                (Precision::F64, _) | (_, DType::F64) => Storage::F64(v.clone()),
                // Values were rounded to the dtype by `normalize`, so these conversions are exact.
                (_, DType::F16) => Storage::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
                (_, DType::BF16) => {
                    Storage::BF16(v.iter().map(|&x| crate::tensor::bf16_from_f64(x)).collect())
                }
                _ => Storage::F32(v.iter().map(|&x| x as f32).collect()),
            },
            Elements::Int(v) => match self.dtype {
                DType::I32 => Storage::I32(v.iter().map(|&x| x as i32).collect()),
                DType::U8 => Storage::U8(v.iter().map(|&x| x as u8).collect()),
                _ => Storage::I64(v.clone()),
            },
            Elements::Bool(v) => Storage::Bool(v.clone()),
        };
        // The element count matches the shape: every Array is built with a checked count.
        HostTensor::new(self.shape.clone(), storage)
            .unwrap_or_else(|_| HostTensor::zeros(self.dtype, &self.shape))
    }

    /// The float elements, or an internal error naming `what`.
    pub(crate) fn floats(&self, what: &str) -> Result<&[f64], String> {
        match &self.data {
            Elements::Float(v) => Ok(v),
            other => Err(format!("internal: {what} holds {} elements", other.class())),
        }
    }

    /// The integer elements, or an internal error naming `what`.
    pub(crate) fn ints(&self, what: &str) -> Result<&[i64], String> {
        match &self.data {
            Elements::Int(v) => Ok(v),
            other => Err(format!("internal: {what} holds {} elements", other.class())),
        }
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        self.data.len()
    }
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// The coordinates of flat index `flat` in `shape`.
pub(crate) fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut coords = vec![0; shape.len()];
    for i in (0..shape.len()).rev() {
        if shape[i] > 0 {
            coords[i] = flat % shape[i];
            flat /= shape[i];
        }
    }
    coords
}

/// The flat index of `coords` in an array with `strides`.
pub(crate) fn ravel(coords: &[usize], strides: &[usize]) -> usize {
    coords.iter().zip(strides).map(|(c, s)| c * s).sum()
}

/// For every element of `out_shape`, the flat index of the element of `in_shape` that NumPy
/// broadcasting reads (shapes aligned on the right, size-1 axes stretched).
pub(crate) fn broadcast_index(
    in_shape: &[usize],
    out_shape: &[usize],
) -> Result<Vec<usize>, String> {
    let lead = out_shape
        .len()
        .checked_sub(in_shape.len())
        .ok_or_else(|| format!("internal: {in_shape:?} has more axes than {out_shape:?}"))?;
    let in_strides = strides(in_shape);
    // Stride of each output axis in the input: 0 where the input is missing or stretched.
    let mut eff = vec![0; out_shape.len()];
    for (j, (&d, &s)) in in_shape.iter().zip(&in_strides).enumerate() {
        let o = out_shape[lead + j];
        if d == o {
            eff[lead + j] = s;
        } else if d != 1 {
            return Err(format!(
                "internal: {in_shape:?} does not broadcast to {out_shape:?}"
            ));
        }
    }
    let total: usize = out_shape.iter().product();
    Ok((0..total)
        .map(|i| ravel(&unravel(i, out_shape), &eff))
        .collect())
}

/// The NumPy broadcast of two concrete shapes.
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let rank = a.len().max(b.len());
    let get = |s: &[usize], i: usize| (i + s.len()).checked_sub(rank).map_or(1, |j| s[j]);
    (0..rank)
        .map(|i| match (get(a, i), get(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_index_stretches_size_one_axes() {
        let idx = broadcast_index(&[2, 1], &[3, 2, 2]).expect("broadcasts");
        assert_eq!(idx, vec![0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1]);
        assert!(broadcast_index(&[3], &[2]).is_err());
        assert_eq!(
            broadcast_shapes(&[4, 1], &[3]).expect("broadcasts"),
            vec![4, 3]
        );
    }

    #[test]
    fn normalize_rounds_and_wraps_to_the_dtype() {
        let host = HostTensor::from_f64_values(DType::F64, &[2], vec![0.1, 1e300]).expect("2");
        let a = Array::from_host(&host, DType::F32, Precision::F32);
        assert_eq!(
            a.data,
            Elements::Float(vec![f64::from(0.1f32), f64::INFINITY])
        );
        let wide = Array::from_host(&host, DType::F32, Precision::F64);
        assert_eq!(wide.data, Elements::Float(vec![0.1, 1e300]));
        assert_eq!(wrap_int(DType::U8, -1), 255);
        assert_eq!(wrap_int(DType::I32, 1 << 31), -(1 << 31));
        assert_eq!(
            round_float(DType::F16, Precision::F32, 65520.0),
            f64::INFINITY
        );
    }
}
