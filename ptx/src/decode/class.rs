//! The arithmetic type of an instruction, as decoding sees it: its [`Class`] (which register
//! file and semantics), the scalar its immediates decode as, and the float flags (`.ftz`,
//! `.sat`) shared by every arithmetic decoder.

use super::operands::Mods;
use crate::inst::{FFlags, HalfTy, Scalar};
use crate::parser::InstAst;

/// What an arithmetic type means for decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Int32 { signed: bool },
    Int64 { signed: bool },
    Int16,
    F32,
    F64,
    Half(HalfTy),
    Pred,
}

pub(super) fn class_of(ty: &str) -> Option<Class> {
    Some(match ty {
        "s32" => Class::Int32 { signed: true },
        "u32" | "b32" => Class::Int32 { signed: false },
        "s64" => Class::Int64 { signed: true },
        "u64" | "b64" => Class::Int64 { signed: false },
        "s16" | "u16" | "b16" => Class::Int16,
        "f32" => Class::F32,
        "f64" => Class::F64,
        "f16" => Class::Half(HalfTy::F16),
        "f16x2" => Class::Half(HalfTy::F16x2),
        "bf16" => Class::Half(HalfTy::BF16),
        "bf16x2" => Class::Half(HalfTy::BF16x2),
        "pred" => Class::Pred,
        _ => return None,
    })
}

/// The scalar used to decode immediates of a class.
pub(super) fn imm_ty(c: Class) -> Scalar {
    match c {
        Class::Int32 { .. } => Scalar::B32,
        Class::Int64 { .. } => Scalar::B64,
        Class::Int16 => Scalar::B16,
        Class::F32 => Scalar::F32,
        Class::F64 => Scalar::F64,
        Class::Half(HalfTy::F16 | HalfTy::BF16) => Scalar::B16,
        Class::Half(_) => Scalar::B32,
        Class::Pred => Scalar::B32,
    }
}

/// Splits off the type (last modifier) and classifies it.
pub(super) fn typed(inst: &InstAst) -> Result<(Mods, Class, String), String> {
    let mut mods = Mods::new(&inst.mods);
    let ty = mods
        .take_last()
        .ok_or_else(|| format!("`{}` needs a type", inst.opcode))?;
    let class =
        class_of(&ty).ok_or_else(|| format!("unsupported type .{ty} for `{}`", inst.opcode))?;
    Ok((mods, class, ty))
}

pub(super) fn float_flags(mods: &mut Mods) -> FFlags {
    FFlags {
        ftz: mods.take("ftz"),
        sat: mods.take("sat"),
    }
}
