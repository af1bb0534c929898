//! Decoding the tensor-core instructions: `mma.sync.aligned` (m16n8k16 with f16/bf16
//! multiplicands, m16n8k8 with f16/bf16/tf32, f32 accumulators, `.row.col`), `ldmatrix`
//! (`.m8n8.{x1,x2,x4}[.trans].b16`, shared or generic addresses) and `cp.async` (`.ca`/`.cg`
//! copies of 4/8/16 bytes with an optional `src-size` or `ignore-src` operand and cache
//! hints; `commit_group`, `wait_group N`, `wait_all`). Anything else of these families —
//! f16 accumulators, other shapes, `.bulk` copies, mbarrier arrivals — fails to load with a
//! message naming it.

use super::mem::address;
use super::operands::{Mods, arity};
use super::{Ctx, File};
use crate::inst::{CpAsyncSrc, MmaShape, MmaTy, Op, R, Scalar};
use crate::parser::{InstAst, Operand};

pub(super) fn decode(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    match inst.opcode.as_str() {
        "mma" => mma(ctx, inst),
        "ldmatrix" => ldmatrix(ctx, inst),
        "cp" => cp(ctx, inst),
        other => Err(format!("unsupported instruction `{other}`")),
    }
}

/// The registers of a brace-enclosed vector operand (a lone register counts as one).
fn vector<'a>(op: &'a Operand, what: &str) -> Result<Vec<&'a Operand>, String> {
    match op {
        Operand::Vector(v) => Ok(v.iter().collect()),
        Operand::Name(_) => Ok(vec![op]),
        _ => Err(format!("{what} must be a vector of registers")),
    }
}

fn regs<const N: usize>(
    ctx: &mut Ctx,
    op: &Operand,
    want: usize,
    what: &str,
    dst: bool,
) -> Result<[R; N], String> {
    let elems = vector(op, what)?;
    if elems.len() != want {
        return Err(format!(
            "{what} takes {want} registers, found {}",
            elems.len()
        ));
    }
    let mut out = [0 as R; N];
    for (i, e) in elems.into_iter().enumerate() {
        out[i] = if dst {
            ctx.dst32(e)?
        } else {
            ctx.src32(e, Scalar::B32)?
        };
    }
    // Unused slots repeat the last register, so readers never see a stale index.
    for i in want..N {
        out[i] = out[want - 1];
    }
    Ok(out)
}

fn mma(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let mut mods = Mods::new(&inst.mods);
    if !(mods.take("sync") && mods.take("aligned")) {
        return Err("mma needs .sync.aligned".into());
    }
    let shape = match mods.take_any(&["m16n8k16", "m16n8k8"]) {
        Some("m16n8k16") => MmaShape::M16N8K16,
        Some(_) => MmaShape::M16N8K8,
        None => return Err("unsupported mma shape (m16n8k16 and m16n8k8 are)".into()),
    };
    if !(mods.take("row") && mods.take("col")) {
        return Err("mma needs .row.col layouts".into());
    }
    let types: Vec<String> = (0..4).filter_map(|_| mods.take_last()).collect();
    mods.finish("mma")?;
    // Taken from the end: ctype, btype, atype, dtype.
    let [ctype, btype, atype, dtype] = types.as_slice() else {
        return Err("mma needs .dtype.atype.btype.ctype".into());
    };
    if dtype != "f32" || ctype != "f32" {
        return Err(format!(
            "mma with .{dtype} results and .{ctype} accumulators is not supported (f32 is)"
        ));
    }
    if atype != btype {
        return Err(format!("mma multiplicands .{atype} and .{btype} differ"));
    }
    let ty = match atype.as_str() {
        "f16" => MmaTy::F16,
        "bf16" => MmaTy::BF16,
        "tf32" => MmaTy::TF32,
        other => return Err(format!("mma on .{other} is not supported")),
    };
    if ty == MmaTy::TF32 && shape == MmaShape::M16N8K16 {
        return Err("tf32 mma has shapes m16n8k8 and m16n8k4 (m16n8k8 is supported)".into());
    }
    // Registers per operand: A holds M·K/32 elements, B K·N/32, packed two per register for
    // 16-bit types.
    let (na, nb) = match (shape, ty) {
        (MmaShape::M16N8K16, _) => (4, 2),
        (MmaShape::M16N8K8, MmaTy::TF32) => (4, 2),
        (MmaShape::M16N8K8, _) => (2, 1),
    };
    let o = &inst.operands;
    arity(o, 4, "mma")?;
    Ok(Op::Mma {
        shape,
        ty,
        d: regs::<4>(ctx, &o[0], 4, "the mma destination", true)?,
        a: regs::<4>(ctx, &o[1], na, "mma operand A", false)?,
        b: regs::<2>(ctx, &o[2], nb, "mma operand B", false)?,
        c: regs::<4>(ctx, &o[3], 4, "mma operand C", false)?,
    })
}

fn ldmatrix(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let mut mods = Mods::new(&inst.mods);
    if !(mods.take("sync") && mods.take("aligned")) {
        return Err("ldmatrix needs .sync.aligned".into());
    }
    if !mods.take("m8n8") {
        return Err("unsupported ldmatrix shape (m8n8 is supported)".into());
    }
    let num = match mods.take_any(&["x1", "x2", "x4"]) {
        Some("x1") => 1,
        Some("x2") => 2,
        Some(_) => 4,
        None => return Err("ldmatrix needs .x1, .x2 or .x4".into()),
    };
    let trans = mods.take("trans");
    // Shared or generic addressing: both are shared-window addresses here.
    let _ = mods.take("shared") || mods.take("shared::cta");
    if !mods.take("b16") {
        return Err("ldmatrix needs .b16 elements".into());
    }
    mods.finish("ldmatrix")?;
    let o = &inst.operands;
    arity(o, 2, "ldmatrix")?;
    let d = regs::<4>(ctx, &o[0], num as usize, "the ldmatrix destination", true)?;
    let (base, offset) = address(ctx, &o[1])?;
    Ok(Op::Ldmatrix {
        num,
        trans,
        d,
        base,
        offset,
    })
}

fn cp(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let mut mods = Mods::new(&inst.mods);
    if !mods.take("async") {
        return Err("only cp.async is supported".into());
    }
    let o = &inst.operands;
    if mods.take("commit_group") {
        mods.finish("cp.async.commit_group")?;
        arity(o, 0, "cp.async.commit_group")?;
        return Ok(Op::CpAsyncCommit);
    }
    if mods.take("wait_all") {
        mods.finish("cp.async.wait_all")?;
        arity(o, 0, "cp.async.wait_all")?;
        return Ok(Op::CpAsyncWait { n: 0, all: true });
    }
    if mods.take("wait_group") {
        mods.finish("cp.async.wait_group")?;
        arity(o, 1, "cp.async.wait_group")?;
        let Operand::Int(n) = o[0] else {
            return Err("cp.async.wait_group takes an integer constant".into());
        };
        let n = u32::try_from(n).map_err(|_| "cp.async.wait_group count out of range")?;
        return Ok(Op::CpAsyncWait { n, all: false });
    }
    let global_only = match mods.take_any(&["ca", "cg"]) {
        Some("cg") => true,
        Some(_) => false,
        None => return Err("unsupported cp.async form (.ca/.cg copies, commit/wait are)".into()),
    };
    if !(mods.take("shared") || mods.take("shared::cta")) || !mods.take("global") {
        return Err("cp.async copies .shared{::cta}.global".into());
    }
    let cache_policy = mods.take("L2::cache_hint");
    mods.retain(|m| !m.starts_with("L2::"));
    mods.finish("cp.async")?;
    let extra = usize::from(cache_policy);
    if o.len() < 3 + extra || o.len() > 4 + extra {
        return Err(format!(
            "cp.async takes [dst], [src], size, an optional src-size or ignore-src{}",
            if cache_policy {
                " and a cache policy"
            } else {
                ""
            }
        ));
    }
    if cache_policy {
        // The 64-bit cache policy is a hint: checked, never used.
        ctx.src64(&o[o.len() - 1], Scalar::B64)?;
    }
    let dst = address(ctx, &o[0])?;
    let src = address(ctx, &o[1])?;
    let size = match o[2] {
        Operand::Int(s @ (4 | 8 | 16)) => s as u8,
        _ => return Err("cp.async copies 4, 8 or 16 bytes (an integer constant)".into()),
    };
    if global_only && size != 16 {
        return Err("cp.async.cg copies 16 bytes".into());
    }
    let from = if o.len() == 4 + extra {
        match &o[3] {
            Operand::Int(n) if *n <= u64::from(size) => {
                CpAsyncSrc::Bytes(ctx.src32(&o[3], Scalar::U32)?)
            }
            Operand::Int(_) => return Err("cp.async src-size exceeds the copy size".into()),
            Operand::Name(n) if ctx.reg(n).is_some_and(|r| r.file == File::Pred) => {
                CpAsyncSrc::Ignore(ctx.pred_reg(n)?, false)
            }
            Operand::Not(_) => {
                let (p, neg) = ctx.pred_src(&o[3])?;
                CpAsyncSrc::Ignore(p, neg)
            }
            other => CpAsyncSrc::Bytes(ctx.src32(other, Scalar::U32)?),
        }
    } else {
        CpAsyncSrc::Full
    };
    Ok(Op::CpAsync {
        dst,
        src,
        size,
        from,
    })
}
