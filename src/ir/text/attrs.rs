//! Attribute values as written (`strides=[1,1]`, `padding=same`, `value=f32[2] [1.0, 2.0]`) and
//! their typed readers. [`AttrMap`] rejects duplicate, missing and unknown attributes, and every
//! error points at the key or value at fault.

use super::error::{At, at};
use super::literal::{self, ElementKind, MAX_DIM};
use crate::ir::{Dim, Padding, Shape};
use crate::tensor::{DType, HostTensor};
use std::ops::Range;

/// An attribute value as written.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AttrValue<'a> {
    Int(&'a str),
    Float(&'a str),
    /// An identifier: `same`, `fan_in`, `f32`, `true`, `N`, ...
    Word(&'a str),
    /// A string token, quotes and escapes included.
    Str(&'a str),
    List(Vec<Spanned<'a>>),
    /// `dtype[dims] [elements]`.
    Tensor {
        dtype: &'a str,
        dims: Vec<Spanned<'a>>,
        elems: Vec<Spanned<'a>>,
    },
}

/// A value with its byte span.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Spanned<'a> {
    pub value: AttrValue<'a>,
    pub span: Range<usize>,
}

/// `key=value`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Attr<'a> {
    pub key: &'a str,
    pub key_span: Range<usize>,
    pub value: Spanned<'a>,
}

impl AttrValue<'_> {
    fn describe(&self) -> String {
        match self {
            AttrValue::Int(t) | AttrValue::Float(t) | AttrValue::Word(t) | AttrValue::Str(t) => {
                format!("`{t}`")
            }
            AttrValue::List(_) => "a list".into(),
            AttrValue::Tensor { .. } => "a tensor".into(),
        }
    }
}

fn expected(v: &Spanned<'_>, what: &str) -> At {
    at(
        v.span.start,
        format!("expected {what}, found {}", v.value.describe()),
    )
}

/// A non-negative integer no larger than `max`.
pub(crate) fn as_u64(v: &Spanned<'_>, max: u64) -> Result<u64, At> {
    let AttrValue::Int(text) = v.value else {
        return Err(expected(v, "a non-negative integer"));
    };
    match text.parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(at(
            v.span.start,
            format!("{text} is out of range (0 to {max})"),
        )),
    }
}

/// A `usize` no larger than `max`.
pub(crate) fn as_usize(v: &Spanned<'_>, max: u64) -> Result<usize, At> {
    let n = as_u64(v, max)?;
    usize::try_from(n).map_err(|_| at(v.span.start, format!("{n} does not fit this machine")))
}

/// The items of a list, optionally of an exact length.
pub(crate) fn as_list<'v, 'a>(
    v: &'v Spanned<'a>,
    len: Option<usize>,
) -> Result<&'v [Spanned<'a>], At> {
    let AttrValue::List(items) = &v.value else {
        return Err(expected(v, "a list `[...]`"));
    };
    match len {
        Some(n) if items.len() != n => Err(at(
            v.span.start,
            format!("expected a list of {n} items, found {}", items.len()),
        )),
        _ => Ok(items),
    }
}

/// `[a,b]` of integers no larger than `max`.
pub(crate) fn as_usize_pair(v: &Spanned<'_>, max: u64) -> Result<[usize; 2], At> {
    let items = as_list(v, Some(2))?;
    Ok([as_usize(&items[0], max)?, as_usize(&items[1], max)?])
}

/// A list of integers no larger than `max`.
pub(crate) fn as_usize_list(v: &Spanned<'_>, max: u64) -> Result<Vec<usize>, At> {
    as_list(v, None)?.iter().map(|i| as_usize(i, max)).collect()
}

/// A dimension list `[N,3,4]` (`N` is the batch), within the size bounds of the text.
pub(crate) fn as_shape(items: &[Spanned<'_>], span: &Range<usize>) -> Result<Shape, At> {
    let dims: Vec<Dim> = items
        .iter()
        .map(|d| match d.value {
            AttrValue::Word("N") => Ok(Dim::Batch),
            AttrValue::Int(_) => as_usize(d, MAX_DIM).map(Dim::Fixed),
            _ => Err(expected(d, "a dimension (an integer or N)")),
        })
        .collect::<Result<_, At>>()?;
    let shape = Shape::from_dims(dims);
    match literal::shape_too_large(&shape) {
        Some(message) => Err(at(span.start, message)),
        None => Ok(shape),
    }
}

/// `true` or `false`.
pub(crate) fn as_bool(v: &Spanned<'_>) -> Result<bool, At> {
    match v.value {
        AttrValue::Word("true") => Ok(true),
        AttrValue::Word("false") => Ok(false),
        _ => Err(expected(v, "`true` or `false`")),
    }
}

/// A float (an integer literal is accepted too), exactly.
pub(crate) fn as_f64(v: &Spanned<'_>) -> Result<f64, At> {
    match v.value {
        AttrValue::Float(t) | AttrValue::Int(t) => {
            literal::parse_f64(t).map_err(|m| at(v.span.start, m))
        }
        _ => Err(expected(v, "a number")),
    }
}

/// An element type name.
pub(crate) fn as_dtype(v: &Spanned<'_>) -> Result<DType, At> {
    match v.value {
        AttrValue::Word(w) => DType::from_name(w).ok_or_else(|| {
            at(
                v.span.start,
                format!("unknown dtype `{w}` (f32, f64, f16, bf16, i32, i64, u8 or bool)"),
            )
        }),
        _ => Err(expected(v, "a dtype")),
    }
}

/// One word out of `choices`.
pub(crate) fn as_choice<'a>(v: &Spanned<'a>, choices: &[&str]) -> Result<&'a str, At> {
    match v.value {
        AttrValue::Word(w) if choices.contains(&w) => Ok(w),
        _ => Err(expected(v, &format!("one of {}", choices.join(", ")))),
    }
}

/// A quoted string, unescaped.
pub(crate) fn as_string(v: &Spanned<'_>) -> Result<String, At> {
    match v.value {
        AttrValue::Str(token) => {
            literal::unescape(token).map_err(|(off, m)| at(v.span.start + off, m))
        }
        _ => Err(expected(v, "a string")),
    }
}

/// The reduction of an `all_reduce`: `sum`, `mean`, `max` or `min`.
pub(crate) fn as_reduce_op(v: &Spanned<'_>) -> Result<crate::ir::ReduceOp, At> {
    use crate::ir::ReduceOp;
    match v.value {
        AttrValue::Word("sum") => Ok(ReduceOp::Sum),
        AttrValue::Word("mean") => Ok(ReduceOp::Mean),
        AttrValue::Word("max") => Ok(ReduceOp::Max),
        AttrValue::Word("min") => Ok(ReduceOp::Min),
        _ => Err(expected(v, "`sum`, `mean`, `max` or `min`")),
    }
}

/// `same`, `valid` or explicit `[[top,bottom],[left,right]]`.
pub(crate) fn as_padding(v: &Spanned<'_>) -> Result<Padding, At> {
    match v.value {
        AttrValue::Word("same") => Ok(Padding::Same),
        AttrValue::Word("valid") => Ok(Padding::Valid),
        AttrValue::List(_) => {
            let rows = as_list(v, Some(2))?;
            Ok(Padding::Explicit([
                pair(as_usize_pair(&rows[0], MAX_DIM)?),
                pair(as_usize_pair(&rows[1], MAX_DIM)?),
            ]))
        }
        _ => Err(expected(
            v,
            "`same`, `valid` or [[top,bottom],[left,right]]",
        )),
    }
}

fn pair([a, b]: [usize; 2]) -> (usize, usize) {
    (a, b)
}

/// A list of `[before,after]` pairs.
pub(crate) fn as_pairs(v: &Spanned<'_>, max: u64) -> Result<Vec<(usize, usize)>, At> {
    as_list(v, None)?
        .iter()
        .map(|p| as_usize_pair(p, max).map(pair))
        .collect()
}

/// A tensor literal `dtype[dims] [elements]`.
pub(crate) fn as_tensor(v: &Spanned<'_>) -> Result<HostTensor, At> {
    let AttrValue::Tensor { dtype, dims, elems } = &v.value else {
        return Err(expected(v, "a tensor `dtype[dims] [elements]`"));
    };
    let dtype = DType::from_name(dtype)
        .ok_or_else(|| at(v.span.start, format!("unknown dtype `{dtype}`")))?;
    let shape = as_shape(dims, &v.span)?;
    let Some(dims) = shape.to_static() else {
        return Err(at(
            v.span.start,
            "a tensor value needs a static shape (no N)",
        ));
    };
    let count: usize = dims.iter().product();
    if count != elems.len() {
        return Err(at(
            v.span.start,
            format!(
                "shape {shape} needs {count} elements, found {}",
                elems.len()
            ),
        ));
    }
    let texts = elems
        .iter()
        .map(|e| match e.value {
            AttrValue::Int(t) => Ok((ElementKind::Int, t)),
            AttrValue::Float(t) => Ok((ElementKind::Float, t)),
            AttrValue::Word(t) => Ok((ElementKind::Word, t)),
            _ => Err(expected(e, "a number, `true` or `false`")),
        })
        .collect::<Result<Vec<_>, At>>()?;
    let storage =
        literal::parse_storage(dtype, &texts).map_err(|(i, m)| at(elems[i].span.start, m))?;
    HostTensor::new(dims, storage).map_err(|e| at(v.span.start, e.to_string()))
}

/// The attributes of one op or initializer, read once each by key.
pub(crate) struct AttrMap<'a> {
    owner: String,
    offset: usize,
    attrs: Vec<Attr<'a>>,
    used: Vec<bool>,
    known: Vec<&'static str>,
}

impl<'a> AttrMap<'a> {
    /// The attributes of `owner` (an op kind or initializer name written at `offset`); errors on a
    /// key given twice.
    pub fn new(owner: &str, offset: usize, attrs: Vec<Attr<'a>>) -> Result<AttrMap<'a>, At> {
        for (i, a) in attrs.iter().enumerate() {
            if attrs[..i].iter().any(|b| b.key == a.key) {
                return Err(at(
                    a.key_span.start,
                    format!("attribute `{}` is given twice", a.key),
                ));
            }
        }
        let used = vec![false; attrs.len()];
        Ok(AttrMap {
            owner: owner.to_string(),
            offset,
            attrs,
            used,
            known: Vec::new(),
        })
    }

    /// The value of `key`, if given.
    pub fn optional(&mut self, key: &'static str) -> Option<&Spanned<'a>> {
        self.known.push(key);
        let i = self.attrs.iter().position(|a| a.key == key)?;
        self.used[i] = true;
        Some(&self.attrs[i].value)
    }

    /// The value of `key`; errors at the owner when it is missing.
    pub fn get(&mut self, key: &'static str) -> Result<&Spanned<'a>, At> {
        let (owner, offset) = (self.owner.clone(), self.offset);
        self.optional(key)
            .ok_or_else(|| at(offset, format!("`{owner}` needs attribute `{key}`")))
    }

    /// Errors at the first attribute no reader asked for.
    pub fn finish(self) -> Result<(), At> {
        match self.attrs.iter().zip(&self.used).find(|(_, used)| !**used) {
            None => Ok(()),
            Some((a, _)) => {
                let takes = if self.known.is_empty() {
                    "takes no attributes".to_string()
                } else {
                    format!("takes {}", self.known.join(", "))
                };
                Err(at(
                    a.key_span.start,
                    format!("unknown attribute `{}`: `{}` {takes}", a.key, self.owner),
                ))
            }
        }
    }
}
