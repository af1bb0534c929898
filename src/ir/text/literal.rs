//! Literals of the textual IR, printed and parsed with exact round trips: floats (shortest
//! round-trip decimal; `inf`, `-inf`, `nan`, or `nan(0x…)` with the bits of any other NaN),
//! quoted strings (Rust escapes), tensor types and tensor values of every dtype.

use crate::ir::{Dim, Shape, TensorType};
use crate::tensor::{DType, HostTensor, Storage};
use half::{bf16, f16};

/// Largest dimension the text accepts. With the bounds of [`MAX_STEP`] it keeps every size that
/// shape inference computes far from `u64` overflow.
pub(crate) const MAX_DIM: u64 = 1 << 40;
/// Largest stride, dilation or group count the text accepts.
pub(crate) const MAX_STEP: u64 = 1 << 20;
/// Largest element count of one shape the text accepts.
pub(crate) const MAX_ELEMENTS: u64 = 1 << 62;

/// `Some(message)` when `shape` breaks the size bounds of the text.
pub(crate) fn shape_too_large(shape: &Shape) -> Option<String> {
    let mut product: u64 = 1;
    for d in shape.dims() {
        if let Dim::Fixed(n) = *d {
            let n = n as u64;
            if n > MAX_DIM {
                return Some(format!("dimension {n} exceeds the limit 2^40"));
            }
            product = product.saturating_mul(n);
        }
    }
    (product > MAX_ELEMENTS).then(|| format!("shape {shape} has more than 2^62 elements"))
}

/// A float as printed: shortest decimal that parses back to the same bits.
pub(crate) fn fmt_f64(x: f64) -> String {
    if x.is_nan() {
        fmt_nan(x.to_bits(), f64::NAN.to_bits(), 16)
    } else {
        format!("{x:?}")
    }
}

/// An `f32` as printed (see [`fmt_f64`]).
pub(crate) fn fmt_f32(x: f32) -> String {
    if x.is_nan() {
        fmt_nan(u64::from(x.to_bits()), u64::from(f32::NAN.to_bits()), 8)
    } else {
        format!("{x:?}")
    }
}

fn fmt_half(value_f32: f32, bits: u16, nan_bits: u16) -> String {
    if value_f32.is_nan() {
        fmt_nan(u64::from(bits), u64::from(nan_bits), 4)
    } else {
        // Widening a half to f32 is exact, and the f32's shortest form narrows back exactly.
        format!("{value_f32:?}")
    }
}

fn fmt_nan(bits: u64, canonical: u64, hex_digits: usize) -> String {
    if bits == canonical {
        "nan".into()
    } else {
        format!("nan(0x{bits:0hex_digits$x})")
    }
}

/// The bits inside `nan(0x…)`, if `text` has that form.
fn nan_bits(text: &str) -> Option<Result<u64, String>> {
    let hex = text.strip_prefix("nan(0x")?.strip_suffix(')')?;
    Some(u64::from_str_radix(hex, 16).map_err(|_| format!("NaN bits `{hex}` do not fit 64 bits")))
}

/// Parses a float literal (or an integer literal used as a float) as `f64`, exactly.
pub(crate) fn parse_f64(text: &str) -> Result<f64, String> {
    match nan_bits(text) {
        Some(bits) => {
            let x = f64::from_bits(bits?);
            if x.is_nan() {
                Ok(x)
            } else {
                Err(format!("`{text}` is not the bit pattern of an f64 NaN"))
            }
        }
        None if text == "nan" => Ok(f64::NAN),
        None => text
            .parse::<f64>()
            .map_err(|_| format!("`{text}` is not a number")),
    }
}

/// Parses a float literal as `f32`, rounding a decimal once.
pub(crate) fn parse_f32(text: &str) -> Result<f32, String> {
    match nan_bits(text) {
        Some(bits) => {
            let x = u32::try_from(bits?)
                .map(f32::from_bits)
                .map_err(|_| format!("`{text}` has more than 32 bits"))?;
            if x.is_nan() {
                Ok(x)
            } else {
                Err(format!("`{text}` is not the bit pattern of an f32 NaN"))
            }
        }
        None if text == "nan" => Ok(f32::NAN),
        None => text
            .parse::<f32>()
            .map_err(|_| format!("`{text}` is not a number")),
    }
}

fn parse_half<H: Copy>(
    text: &str,
    from_bits: fn(u16) -> H,
    from_f32: fn(f32) -> H,
    nan: H,
    is_nan: fn(H) -> bool,
) -> Result<H, String> {
    match nan_bits(text) {
        Some(bits) => {
            let x = u16::try_from(bits?)
                .map(from_bits)
                .map_err(|_| format!("`{text}` has more than 16 bits"))?;
            if is_nan(x) {
                Ok(x)
            } else {
                Err(format!("`{text}` is not the bit pattern of a NaN"))
            }
        }
        None if text == "nan" => Ok(nan),
        None => parse_f32(text).map(from_f32),
    }
}

/// A string as printed: double-quoted with Rust escapes.
pub(crate) fn fmt_string(s: &str) -> String {
    format!("{s:?}")
}

/// The contents of a quoted string token. Errors carry the byte offset of the bad escape
/// within the token.
pub(crate) fn unescape(token: &str) -> Result<String, (usize, String)> {
    let inner = token
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .ok_or((0, "a string must be enclosed in double quotes".to_string()))?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.char_indices();
    while let Some((i, c)) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        // Offset of the backslash within the token (which starts with the quote).
        let at = i + 1;
        let escaped = match chars.next() {
            Some((_, 'n')) => '\n',
            Some((_, 't')) => '\t',
            Some((_, 'r')) => '\r',
            Some((_, '0')) => '\0',
            Some((_, '\\')) => '\\',
            Some((_, '"')) => '"',
            Some((_, '\'')) => '\'',
            Some((_, 'u')) => {
                let rest = &inner[i + 2..];
                let close = rest.find('}').filter(|_| rest.starts_with('{'));
                let Some(close) = close else {
                    return Err((at, "expected `\\u{HEX}`".into()));
                };
                let code = u32::from_str_radix(&rest[1..close], 16)
                    .ok()
                    .and_then(char::from_u32)
                    .ok_or((
                        at,
                        format!("`{}` is not a Unicode scalar value", &rest[..=close]),
                    ))?;
                for _ in 0..=close {
                    chars.next();
                }
                code
            }
            Some((_, other)) => return Err((at, format!("unknown escape `\\{other}`"))),
            None => return Err((at, "unfinished escape".into())),
        };
        out.push(escaped);
    }
    Ok(out)
}

/// A tensor value as printed: `dtype[shape] [e0, e1, ...]`, elements in row-major order.
pub(crate) fn fmt_tensor(t: &HostTensor) -> String {
    let shape = Shape::fixed(t.shape());
    let elems: Vec<String> = match t.storage() {
        Storage::F32(v) => v.iter().map(|&x| fmt_f32(x)).collect(),
        Storage::F64(v) => v.iter().map(|&x| fmt_f64(x)).collect(),
        Storage::F16(v) => v
            .iter()
            .map(|x| fmt_half(x.to_f32(), x.to_bits(), f16::NAN.to_bits()))
            .collect(),
        Storage::BF16(v) => v
            .iter()
            .map(|x| fmt_half(x.to_f32(), x.to_bits(), bf16::NAN.to_bits()))
            .collect(),
        Storage::I32(v) => v.iter().map(ToString::to_string).collect(),
        Storage::I64(v) => v.iter().map(ToString::to_string).collect(),
        Storage::U8(v) => v.iter().map(ToString::to_string).collect(),
        Storage::Bool(v) => v.iter().map(ToString::to_string).collect(),
    };
    format!("{}{shape} [{}]", t.dtype(), elems.join(", "))
}

/// A tensor type as printed: `f32[N,32,32,3]`.
pub(crate) fn fmt_type(t: &TensorType) -> String {
    t.to_string()
}

/// One element of a tensor literal: its token text and whether it was an integer, a float or
/// a word (`true`/`false`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ElementKind {
    Int,
    Float,
    Word,
}

/// Builds the storage of a `dtype` tensor from element literals. Errors name the index of the
/// bad element.
pub(crate) fn parse_storage(
    dtype: DType,
    elems: &[(ElementKind, &str)],
) -> Result<Storage, (usize, String)> {
    fn each<T>(
        elems: &[(ElementKind, &str)],
        f: impl Fn(ElementKind, &str) -> Result<T, String>,
    ) -> Result<Vec<T>, (usize, String)> {
        elems
            .iter()
            .enumerate()
            .map(|(i, &(k, t))| f(k, t).map_err(|m| (i, m)))
            .collect()
    }
    fn number(k: ElementKind, t: &str, dtype: DType) -> Result<&str, String> {
        match k {
            ElementKind::Word => Err(format!("`{t}` is not a {dtype} element")),
            ElementKind::Int | ElementKind::Float => Ok(t),
        }
    }
    fn int<T: std::str::FromStr>(k: ElementKind, t: &str, dtype: DType) -> Result<T, String> {
        if k != ElementKind::Int {
            return Err(format!("`{t}` is not a {dtype} element (an integer)"));
        }
        t.parse()
            .map_err(|_| format!("{t} is out of range for {dtype}"))
    }
    Ok(match dtype {
        DType::F32 => Storage::F32(each(elems, |k, t| parse_f32(number(k, t, dtype)?))?),
        DType::F64 => Storage::F64(each(elems, |k, t| parse_f64(number(k, t, dtype)?))?),
        DType::F16 => Storage::F16(each(elems, |k, t| {
            parse_half(
                number(k, t, dtype)?,
                f16::from_bits,
                f16::from_f32,
                f16::NAN,
                f16::is_nan,
            )
        })?),
        DType::BF16 => Storage::BF16(each(elems, |k, t| {
            parse_half(
                number(k, t, dtype)?,
                bf16::from_bits,
                bf16::from_f32,
                bf16::NAN,
                bf16::is_nan,
            )
        })?),
        DType::I32 => Storage::I32(each(elems, |k, t| int(k, t, dtype))?),
        DType::I64 => Storage::I64(each(elems, |k, t| int(k, t, dtype))?),
        DType::U8 => Storage::U8(each(elems, |k, t| int(k, t, dtype))?),
        DType::Bool => Storage::Bool(each(elems, |k, t| match (k, t) {
            (ElementKind::Word, "true") => Ok(true),
            (ElementKind::Word, "false") => Ok(false),
            _ => Err(format!("`{t}` is not a bool element (true or false)")),
        })?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_round_trip_bit_exactly() {
        let specials = [
            0.0,
            -0.0,
            0.1,
            1e-300,
            f64::MIN_POSITIVE / 3.0,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            f64::from_bits(0xfff0_0000_0000_0001),
        ];
        for x in specials {
            let back = parse_f64(&fmt_f64(x)).expect("parses");
            assert_eq!(back.to_bits(), x.to_bits(), "{}", fmt_f64(x));
        }
        for x in [0.1f32, -3.5e-42, f32::from_bits(0x7fc0_0001), f32::NAN] {
            let back = parse_f32(&fmt_f32(x)).expect("parses");
            assert_eq!(back.to_bits(), x.to_bits(), "{}", fmt_f32(x));
        }
        assert!(parse_f64("nan(0x3ff0000000000000)").is_err());
    }

    #[test]
    fn strings_round_trip_through_rust_escapes() {
        for s in ["", "image", "a \"q\" \\ \n\t\r\0 é \u{7f} \u{200b}", "'"] {
            assert_eq!(unescape(&fmt_string(s)).as_deref(), Ok(s));
        }
        assert_eq!(unescape(r#""a\qb""#).unwrap_err().0, 2);
        assert!(unescape(r#""\u{d800}""#).is_err());
        assert!(unescape(r#""\u{41""#).is_err());
    }

    #[test]
    fn every_half_bit_pattern_round_trips() {
        for bits in 0..=u16::MAX {
            for (text, back) in [
                {
                    let h = f16::from_bits(bits);
                    let t = fmt_half(h.to_f32(), bits, f16::NAN.to_bits());
                    let b = parse_half(&t, f16::from_bits, f16::from_f32, f16::NAN, f16::is_nan)
                        .map(f16::to_bits);
                    (t, b)
                },
                {
                    let h = bf16::from_bits(bits);
                    let t = fmt_half(h.to_f32(), bits, bf16::NAN.to_bits());
                    let b =
                        parse_half(&t, bf16::from_bits, bf16::from_f32, bf16::NAN, bf16::is_nan)
                            .map(bf16::to_bits);
                    (t, b)
                },
            ] {
                assert_eq!(back, Ok(bits), "{text}");
            }
        }
    }
}
