//! Decoding comparisons and selection: `setp` (all comparison spellings, `.and/.or/.xor` with a
//! third predicate, dual destinations), `selp` and `testp`.

use super::Ctx;
use super::class::{Class, typed};
use super::operands::arity;
use crate::inst::{BoolOp, Cmp, CmpTy, HalfTy, Op, Scalar};
use crate::parser::InstAst;

fn cmp_of(s: &str) -> Option<Cmp> {
    Some(match s {
        "eq" => Cmp::Eq,
        "ne" => Cmp::Ne,
        "lt" | "lo" => Cmp::Lt,
        "le" | "ls" => Cmp::Le,
        "gt" | "hi" => Cmp::Gt,
        "ge" | "hs" => Cmp::Ge,
        "equ" => Cmp::Equ,
        "neu" => Cmp::Neu,
        "ltu" => Cmp::Ltu,
        "leu" => Cmp::Leu,
        "gtu" => Cmp::Gtu,
        "geu" => Cmp::Geu,
        "num" => Cmp::Num,
        "nan" => Cmp::Nan,
        _ => return None,
    })
}

pub(super) fn setp(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let (mut mods, class, ty) = typed(inst)?;
    let o = &inst.operands;
    // `lo/ls/hi/hs` are the unsigned spellings; on unsigned types lt/le/gt/ge compare unsigned.
    let unsigned_cmp = inst
        .mods
        .iter()
        .any(|m| matches!(m.as_str(), "lo" | "ls" | "hi" | "hs"));
    let cmp = inst
        .mods
        .iter()
        .find_map(|m| cmp_of(m))
        .ok_or("setp needs a comparison")?;
    let cmp_name = inst
        .mods
        .iter()
        .find(|m| cmp_of(m).is_some())
        .cloned()
        .unwrap_or_default();
    mods.take(&cmp_name);
    let bool_op = match mods.take_any(&["and", "or", "xor"]) {
        Some("and") => Some(BoolOp::And),
        Some("or") => Some(BoolOp::Or),
        Some(_) => Some(BoolOp::Xor),
        None => None,
    };
    let ftz = mods.take("ftz");
    mods.finish("setp")?;
    let signed_ty = ty.starts_with('s');
    let (cty, ity) = match class {
        Class::Int16 if signed_ty && !unsigned_cmp => (CmpTy::S16, Scalar::B16),
        Class::Int16 => (CmpTy::U16, Scalar::B16),
        Class::Int32 { .. } if signed_ty && !unsigned_cmp => (CmpTy::S32, Scalar::B32),
        Class::Int32 { .. } => (CmpTy::U32, Scalar::B32),
        Class::Int64 { .. } if signed_ty && !unsigned_cmp => (CmpTy::S64, Scalar::B64),
        Class::Int64 { .. } => (CmpTy::U64, Scalar::B64),
        Class::F32 => (CmpTy::F32, Scalar::F32),
        Class::F64 => (CmpTy::F64, Scalar::F64),
        Class::Half(HalfTy::F16) => (CmpTy::F16, Scalar::B16),
        Class::Half(HalfTy::BF16) => (CmpTy::BF16, Scalar::B16),
        _ => return Err(format!("setp on .{ty} is not supported")),
    };
    let is_int = matches!(
        cty,
        CmpTy::S16 | CmpTy::U16 | CmpTy::S32 | CmpTy::U32 | CmpTy::S64 | CmpTy::U64
    );
    if is_int
        && !matches!(
            cmp,
            Cmp::Eq | Cmp::Ne | Cmp::Lt | Cmp::Le | Cmp::Gt | Cmp::Ge
        )
    {
        return Err(format!("comparison .{cmp_name} is not defined on integers"));
    }
    if ftz && is_int {
        return Err("setp.ftz needs a float type".into());
    }
    let want = if bool_op.is_some() { 4 } else { 3 };
    arity(o, want, "setp")?;
    let (p, q) = match &o[0] {
        crate::parser::Operand::Pair(p, q) => (ctx.pred_dst(p)?, Some(ctx.pred_dst(q)?)),
        other => (ctx.pred_dst(other)?, None),
    };
    let a = ctx.src(&o[1], ity)?;
    let b = ctx.src(&o[2], ity)?;
    let combine = match bool_op {
        Some(op) => {
            let (c, neg) = ctx.pred_src(&o[3])?;
            Some((op, c, neg))
        }
        None => None,
    };
    // `.ftz` only changes subnormal comparisons against zero; we compare exactly (documented).
    Ok(Op::Setp {
        cmp,
        ty: cty,
        p,
        q,
        a,
        b,
        combine,
    })
}

pub(super) fn selp(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let (mods, class, ty) = typed(inst)?;
    mods.finish("selp")?;
    let o = &inst.operands;
    arity(o, 4, "selp")?;
    let (p, neg) = ctx.pred_src(&o[3])?;
    if neg {
        return Err("selp takes a plain predicate".into());
    }
    let sty = super::operands::scalar(&ty).ok_or_else(|| format!("selp on .{ty}"))?;
    match class {
        Class::Int64 { .. } | Class::F64 => Ok(Op::Selp64 {
            d: ctx.dst64(&o[0])?,
            a: ctx.src64(&o[1], sty)?,
            b: ctx.src64(&o[2], sty)?,
            p,
        }),
        Class::Int32 { .. } | Class::F32 | Class::Int16 | Class::Half(_) => Ok(Op::Selp32 {
            d: ctx.dst32(&o[0])?,
            a: ctx.src32(&o[1], sty)?,
            b: ctx.src32(&o[2], sty)?,
            p,
        }),
        Class::Pred => Err("selp on .pred is not supported".into()),
    }
}

pub(super) fn testp(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let (mut mods, class, ty) = typed(inst)?;
    let kind = match mods.take_any(&[
        "finite",
        "infinite",
        "number",
        "notanumber",
        "normal",
        "subnormal",
    ]) {
        Some("finite") => 0,
        Some("infinite") => 1,
        Some("number") => 2,
        Some("notanumber") => 3,
        Some("normal") => 4,
        Some(_) => 5,
        None => return Err("testp needs a test".into()),
    };
    mods.finish("testp")?;
    let o = &inst.operands;
    arity(o, 2, "testp")?;
    let p = ctx.pred_dst(&o[0])?;
    match class {
        Class::F32 => Ok(Op::Testp {
            kind,
            wide: false,
            p,
            a: ctx.src32(&o[1], Scalar::F32)?,
        }),
        Class::F64 => Ok(Op::Testp {
            kind,
            wide: true,
            p,
            a: ctx.src64(&o[1], Scalar::F64)?,
        }),
        _ => Err(format!("testp on .{ty} is not supported")),
    }
}
