//! Decoding memory instructions (`ld`, `ldu`, `st`, `atom`, `red`), address conversions (`cvta`,
//! an identity here: generic addresses equal state-space addresses in the emulator's layout) and
//! conversions (`cvt`), with fast forms for the index arithmetic NVRTC emits most. The
//! tensor-core instructions (`mma`, `ldmatrix`, `cp.async`) are decoded by `tensor`.

use super::operands::{Mods, arity, scalar};
use super::{Ctx, File};
use crate::inst::{
    AddrBase, AtomOp, AtomTy, CvtSpec, MemAccess, MemSpace, Op, R, Rnd, Scalar, Tf32Rnd,
};
use crate::parser::{InstAst, Operand};

pub(super) fn decode(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    match inst.opcode.as_str() {
        "ld" | "ldu" => load(ctx, inst),
        "st" => store(ctx, inst),
        "atom" | "red" => atomic(ctx, inst),
        "cvt" => cvt(ctx, inst),
        "cvta" => cvta(ctx, inst),
        other => Err(format!("unsupported instruction `{other}`")),
    }
}

/// Removes cache, ordering and scope qualifiers that do not change results here, including
/// eviction and prefetch hints (`.L1::no_allocate`, `.L2::128B`, ...).
fn drop_hints(mods: &mut Mods) {
    for m in [
        "weak", "volatile", "relaxed", "acquire", "release", "acq_rel", "cta", "gpu", "sys", "nc",
        "ca", "cg", "cs", "lu", "cv", "wb", "wt",
    ] {
        mods.take(m);
    }
    mods.retain(|m| !(m.starts_with("L1::") || m.starts_with("L2::")));
}

fn space(mods: &mut Mods) -> MemSpace {
    if mods.take("shared::cta") {
        return MemSpace::Shared;
    }
    match mods.take_any(&["global", "shared", "local", "param"]) {
        Some("global") => MemSpace::Global,
        Some("shared") => MemSpace::Shared,
        Some("local") => MemSpace::Local,
        Some(_) => MemSpace::Param,
        None => MemSpace::Generic,
    }
}

fn vector(mods: &mut Mods) -> u8 {
    match mods.take_any(&["v2", "v4"]) {
        Some("v2") => 2,
        Some(_) => 4,
        None => 1,
    }
}

/// `[reg]`, `[reg+imm]`, `[symbol+imm]` or `[imm]`.
pub(super) fn address(ctx: &Ctx, op: &Operand) -> Result<(AddrBase, i64), String> {
    let Operand::Addr { base, offset } = op else {
        return Err("expected an address `[...]`".into());
    };
    match base {
        None => Ok((AddrBase::None, *offset)),
        Some(name) => match ctx.reg(name) {
            Some(r) if r.file == File::R64 => Ok((AddrBase::R64(r.idx), *offset)),
            Some(r) if r.file == File::R32 => Ok((AddrBase::R32(r.idx), *offset)),
            Some(_) => Err(format!("{name} cannot be an address")),
            None => match ctx.symbol(name) {
                Some(addr) => Ok((AddrBase::None, offset.wrapping_add(addr as i64))),
                None => Err(format!("undeclared register or symbol {name}")),
            },
        },
    }
}

fn elements(op: &Operand, count: u8) -> Result<Vec<&Operand>, String> {
    match (op, count) {
        (Operand::Vector(v), n) if v.len() == n as usize && n > 1 => Ok(v.iter().collect()),
        (Operand::Vector(_), _) => Err("vector operand size does not match .v2/.v4".into()),
        (other, 1) => Ok(vec![other]),
        _ => Err("a .v2/.v4 access needs a vector operand".into()),
    }
}

fn access_type(mods: &mut Mods, op: &str) -> Result<Scalar, String> {
    let ty = mods
        .take_type()
        .ok_or_else(|| format!("`{op}` needs a type"))?;
    if ty == Scalar::F16 || ty == Scalar::BF16 {
        return Ok(Scalar::B16);
    }
    Ok(ty)
}

fn load(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let mut mods = Mods::new(&inst.mods);
    drop_hints(&mut mods);
    let space = space(&mut mods);
    let count = vector(&mut mods);
    let ty = access_type(&mut mods, "ld")?;
    mods.finish(&inst.opcode)?;
    let o = &inst.operands;
    arity(o, 2, "ld")?;
    let (base, offset) = address(ctx, &o[1])?;
    let width = (ty.bits() / 8) as u8;
    let mut d = [0 as R; 4];
    let mut wide_regs = None;
    for (i, e) in elements(&o[0], count)?.into_iter().enumerate() {
        let Operand::Name(name) = e else {
            return Err("load destinations must be registers".into());
        };
        let r = ctx
            .reg(name)
            .ok_or_else(|| format!("undeclared register {name}"))?;
        let wide = match r.file {
            File::R64 => true,
            File::R32 if width <= 4 => false,
            _ => return Err(format!("{name} cannot hold a {}-byte load", width)),
        };
        if wide_regs.replace(wide).is_some_and(|w| w != wide) {
            return Err("vector elements must be in one register file".into());
        }
        d[i] = r.idx;
    }
    Ok(Op::Ld {
        m: MemAccess {
            space,
            base,
            offset,
            width,
            count,
            signed: ty.is_signed(),
            wide_regs: wide_regs.unwrap_or(false),
        },
        d,
    })
}

fn store(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let mut mods = Mods::new(&inst.mods);
    drop_hints(&mut mods);
    let space = space(&mut mods);
    if space == MemSpace::Param {
        return Err("stores to .param are not supported".into());
    }
    let count = vector(&mut mods);
    let ty = access_type(&mut mods, "st")?;
    mods.finish("st")?;
    let o = &inst.operands;
    arity(o, 2, "st")?;
    let (base, offset) = address(ctx, &o[0])?;
    let width = (ty.bits() / 8) as u8;
    let elems = elements(&o[1], count)?;
    // Registers decide the file; immediates follow the access width.
    let wide = elems.iter().any(|e| match e {
        Operand::Name(n) => ctx.reg(n).is_some_and(|r| r.file == File::R64),
        _ => width == 8,
    });
    if width == 8 && !wide {
        return Err("a 64-bit store needs 64-bit sources".into());
    }
    let imm_ty = if wide { Scalar::B64 } else { ty };
    let mut s = [0 as R; 4];
    for (i, e) in elems.into_iter().enumerate() {
        s[i] = if wide {
            ctx.src64(e, imm_ty)?
        } else {
            ctx.src32(e, imm_ty)?
        };
    }
    Ok(Op::St {
        m: MemAccess {
            space,
            base,
            offset,
            width,
            count,
            signed: false,
            wide_regs: wide,
        },
        s,
    })
}

fn atomic(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let is_red = inst.opcode == "red";
    let mut mods = Mods::new(&inst.mods);
    drop_hints(&mut mods);
    let space = space(&mut mods);
    if matches!(space, MemSpace::Local | MemSpace::Param) {
        return Err(format!("atomics on {space:?} memory are not supported"));
    }
    let op = match mods.take_any(&[
        "add", "min", "max", "and", "or", "xor", "exch", "cas", "inc", "dec",
    ]) {
        Some("add") => AtomOp::Add,
        Some("min") => AtomOp::Min,
        Some("max") => AtomOp::Max,
        Some("and") => AtomOp::And,
        Some("or") => AtomOp::Or,
        Some("xor") => AtomOp::Xor,
        Some("exch") => AtomOp::Exch,
        Some("cas") => AtomOp::Cas,
        Some("inc") => AtomOp::Inc,
        Some(_) => AtomOp::Dec,
        None => return Err(format!("`{}` needs an operation", inst.opcode)),
    };
    let ty = match mods.take_type() {
        Some(Scalar::U32 | Scalar::B32) => AtomTy::U32,
        Some(Scalar::S32) => AtomTy::S32,
        Some(Scalar::U64 | Scalar::B64) => AtomTy::U64,
        Some(Scalar::S64) => AtomTy::S64,
        Some(Scalar::F32) => AtomTy::F32,
        Some(Scalar::F64) => AtomTy::F64,
        other => return Err(format!("unsupported atomic type {other:?}")),
    };
    mods.finish(&inst.opcode)?;
    let float = matches!(ty, AtomTy::F32 | AtomTy::F64);
    if float && !matches!(op, AtomOp::Add | AtomOp::Exch | AtomOp::Min | AtomOp::Max) {
        return Err(format!("atomic {op:?} is not defined on floats"));
    }
    let wide = matches!(ty, AtomTy::U64 | AtomTy::S64 | AtomTy::F64);
    if wide && matches!(op, AtomOp::Inc | AtomOp::Dec) {
        return Err("atomic inc/dec are 32-bit only".into());
    }
    let o = &inst.operands;
    let (first, want) = if is_red { (0, 2) } else { (1, 3) };
    arity(o, want + usize::from(op == AtomOp::Cas), &inst.opcode)?;
    if is_red && op == AtomOp::Cas {
        return Err("red has no cas".into());
    }
    let (base, offset) = address(ctx, &o[first])?;
    let sty = if wide { Scalar::B64 } else { Scalar::B32 };
    let ity = match ty {
        AtomTy::F32 => Scalar::F32,
        AtomTy::F64 => Scalar::F64,
        _ => sty,
    };
    let src = |ctx: &mut Ctx, op: &Operand| {
        if wide {
            ctx.src64(op, ity)
        } else {
            ctx.src32(op, ity)
        }
    };
    let b = src(ctx, &o[first + 1])?;
    let c = if op == AtomOp::Cas {
        src(ctx, &o[first + 2])?
    } else {
        b
    };
    let d = if is_red {
        None
    } else if wide {
        Some(ctx.dst64(&o[0])?)
    } else {
        Some(ctx.dst32(&o[0])?)
    };
    Ok(Op::Atom {
        space,
        base,
        offset,
        op,
        ty,
        d,
        b,
        c,
    })
}

fn cvta(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let mut mods = Mods::new(&inst.mods);
    mods.take("to");
    if mods
        .take_any(&["global", "shared", "local", "param"])
        .is_none()
    {
        return Err("cvta needs a state space".into());
    }
    let ty = mods.take_type().ok_or("cvta needs .u32 or .u64")?;
    mods.finish("cvta")?;
    let o = &inst.operands;
    arity(o, 2, "cvta")?;
    match ty {
        Scalar::U64 => Ok(Op::Mov64 {
            d: ctx.dst64(&o[0])?,
            a: ctx.src64(&o[1], Scalar::U64)?,
        }),
        Scalar::U32 => Ok(Op::Mov32 {
            d: ctx.dst32(&o[0])?,
            a: ctx.src32(&o[1], Scalar::U32)?,
        }),
        _ => Err("cvta needs .u32 or .u64".into()),
    }
}

fn cvt(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let mut mods = Mods::new(&inst.mods);
    let rna = mods.take("rna");
    let frnd = mods.take_rnd();
    let irnd = mods.take_int_rnd();
    let ftz = mods.take("ftz");
    let sat = mods.take("sat");
    let relu = mods.take("relu");
    let satfinite = mods.take("satfinite");
    let from_name = mods.take_last().ok_or("cvt needs two types")?;
    let to_name = mods.take_last().ok_or("cvt needs two types")?;
    mods.finish("cvt")?;
    let o = &inst.operands;
    let from = scalar(&from_name).ok_or_else(|| format!("unsupported cvt source .{from_name}"))?;
    let half_dst = matches!(to_name.as_str(), "f16" | "bf16" | "f16x2" | "bf16x2");
    if satfinite && !(half_dst || to_name == "tf32") {
        return Err(".satfinite needs a f16, bf16 or tf32 destination".into());
    }
    if rna && to_name != "tf32" {
        return Err(".rna is only defined for conversions to .tf32".into());
    }
    if to_name == "tf32" {
        arity(o, 2, "cvt")?;
        let rnd = match (rna, frnd) {
            (true, None) => Tf32Rnd::Rna,
            (false, Some(Rnd::Rn)) => Tf32Rnd::Rn,
            (false, Some(Rnd::Rz)) => Tf32Rnd::Rz,
            _ => return Err("cvt to .tf32 takes one of .rna, .rn, .rz".into()),
        };
        if from != Scalar::F32 || irnd.is_some() || ftz || sat || (relu && rnd == Tf32Rnd::Rna) {
            return Err("unsupported cvt to .tf32".into());
        }
        return Ok(Op::CvtTf32 {
            rnd,
            relu,
            satfinite,
            d: ctx.dst32(&o[0])?,
            a: ctx.src32(&o[1], Scalar::F32)?,
        });
    }
    if to_name == "f16x2" || to_name == "bf16x2" {
        arity(o, 3, "cvt")?;
        if from != Scalar::F32 || irnd.is_some() || ftz || sat {
            return Err(format!("unsupported cvt to .{to_name}"));
        }
        return Ok(Op::CvtPack {
            bf16: to_name == "bf16x2",
            rnd: frnd.ok_or("cvt to a packed half type needs a rounding mode")?,
            relu,
            satfinite,
            d: ctx.dst32(&o[0])?,
            a: ctx.src32(&o[1], Scalar::F32)?,
            b: ctx.src32(&o[2], Scalar::F32)?,
        });
    }
    arity(o, 2, "cvt")?;
    let to = scalar(&to_name).ok_or_else(|| format!("unsupported cvt destination .{to_name}"))?;
    if frnd.is_some() && irnd.is_some() {
        return Err("cvt takes one rounding modifier".into());
    }
    // Which conversions need which rounding modifier (PTX ISA, cvt).
    let needs_frnd = (to.is_float() && !from.is_float())
        || (to.is_float() && from.is_float() && to.bits() < from.bits());
    let needs_irnd = !to.is_float() && from.is_float();
    let allows_irnd = needs_irnd || (to.is_float() && from.is_float() && to == from);
    if needs_frnd && frnd.is_none() {
        return Err("this conversion needs .rn/.rz/.rm/.rp".into());
    }
    if needs_irnd && irnd.is_none() {
        return Err("this conversion needs .rni/.rzi/.rmi/.rpi".into());
    }
    if (frnd.is_some() && !needs_frnd) || (irnd.is_some() && !allows_irnd) {
        return Err("rounding modifier not allowed on this conversion".into());
    }
    if relu && !(to == Scalar::F16 || to == Scalar::BF16) {
        return Err(".relu needs a half destination".into());
    }
    let spec = CvtSpec {
        from,
        to,
        rnd: frnd.or(irnd).unwrap_or(Rnd::Rn),
        integral: irnd.is_some(),
        ftz,
        sat,
        relu,
        satfinite,
    };
    // Registers may be wider than the conversion's types (`cvt.s64.s32 %rd2, %rd1` reads the
    // low 32 bits); the register's own file decides where the operand lives.
    let file_of = |op: &Operand, bits: u32| match op {
        Operand::Name(n) => ctx.reg(n).map_or(bits == 64, |r| r.file == File::R64),
        _ => bits == 64,
    };
    let wide_src = file_of(&o[1], from.bits());
    let wide_dst = file_of(&o[0], to.bits());
    if (from.bits() == 64 && !wide_src) || (to.bits() == 64 && !wide_dst) {
        return Err("a 64-bit conversion operand needs a 64-bit register".into());
    }
    let a = if wide_src {
        ctx.src64(&o[1], from)?
    } else {
        ctx.src32(&o[1], from)?
    };
    let d = if wide_dst {
        ctx.dst64(&o[0])?
    } else {
        ctx.dst32(&o[0])?
    };
    // Fast forms: integer widening/narrowing without saturation, and int → f32 rn.
    let plain = !ftz && !sat && !relu && !satfinite;
    if plain
        && !from.is_float()
        && !to.is_float()
        && wide_src == (from.bits() == 64)
        && wide_dst == (to.bits() == 64)
    {
        match (from.bits(), to.bits()) {
            (32, 64) if from.is_signed() => return Ok(Op::SignExtend32To64 { d, a }),
            (32, 64) => return Ok(Op::ZeroExtend32To64 { d, a }),
            (64, 32) => return Ok(Op::Truncate64To32 { d, a }),
            _ => {}
        }
    }
    if plain && to == Scalar::F32 && spec.rnd == Rnd::Rn && !wide_src && !wide_dst {
        match from {
            Scalar::S32 => return Ok(Op::S32ToF32 { d, a }),
            Scalar::U32 => return Ok(Op::U32ToF32 { d, a }),
            _ => {}
        }
    }
    Ok(Op::Cvt {
        spec,
        d,
        a,
        wide_src,
        wide_dst,
    })
}
