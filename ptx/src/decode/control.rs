//! Decoding `mov` (registers, immediates, symbol addresses, special registers, vector pack and
//! unpack), control flow (`bra`, `ret`, `exit`, `trap`), barriers and fences, and the warp-wide
//! operations (`shfl.sync`, `vote.sync`, `activemask`, `bar.warp.sync`).

use super::operands::{Mods, arity, scalar};
use super::{Ctx, File};
use crate::inst::{Op, R, Scalar, ShflMode, SpecialReg, VoteMode};
use crate::parser::{InstAst, Operand};

pub(super) fn decode(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let name = inst.opcode.as_str();
    let o = &inst.operands;
    match name {
        "mov" => mov(ctx, inst),
        "bra" => {
            let mut mods = Mods::new(&inst.mods);
            mods.take("uni");
            mods.finish(name)?;
            arity(o, 1, name)?;
            match &o[0] {
                Operand::Name(label) => match ctx.label(label) {
                    Some(target) => Ok(Op::Bra { target }),
                    None => Err(format!("undefined label {label}")),
                },
                _ => Err("bra needs a label".into()),
            }
        }
        "ret" | "exit" => {
            let mut mods = Mods::new(&inst.mods);
            mods.take("uni");
            mods.finish(name)?;
            arity(o, 0, name)?;
            Ok(Op::Exit)
        }
        "trap" | "brkpt" => {
            Mods::new(&inst.mods).finish(name)?;
            Ok(Op::Trap)
        }
        "membar" | "fence" => Ok(Op::Fence),
        "nanosleep" | "prefetch" | "prefetchu" => Ok(Op::Nop),
        "bar" | "barrier" => barrier(ctx, inst),
        "shfl" => shfl(ctx, inst),
        "vote" => vote(ctx, inst),
        "activemask" => {
            let mut mods = Mods::new(&inst.mods);
            mods.take("b32");
            mods.finish(name)?;
            arity(o, 1, name)?;
            Ok(Op::Activemask {
                d: ctx.dst32(&o[0])?,
            })
        }
        _ => Err(format!("unsupported instruction `{name}`")),
    }
}

fn special(base: &str, comp: Option<&str>) -> Option<SpecialReg> {
    let axis = match comp {
        Some("x") => Some(0),
        Some("y") => Some(1),
        Some("z") => Some(2),
        _ => None,
    };
    Some(match (base, axis) {
        ("%tid", Some(a)) => SpecialReg::Tid(a),
        ("%ntid", Some(a)) => SpecialReg::Ntid(a),
        ("%ctaid", Some(a)) => SpecialReg::Ctaid(a),
        ("%nctaid", Some(a)) => SpecialReg::Nctaid(a),
        ("%laneid", None) => SpecialReg::LaneId,
        ("%warpid", None) => SpecialReg::WarpId,
        ("%nwarpid", None) => SpecialReg::NWarpId,
        ("%smid", None) => SpecialReg::SmId,
        ("%lanemask_eq", None) => SpecialReg::LanemaskEq,
        ("%lanemask_lt", None) => SpecialReg::LanemaskLt,
        ("%lanemask_le", None) => SpecialReg::LanemaskLe,
        ("%lanemask_gt", None) => SpecialReg::LanemaskGt,
        ("%lanemask_ge", None) => SpecialReg::LanemaskGe,
        ("%clock" | "%clock64", None) => SpecialReg::Clock,
        _ => return None,
    })
}

fn mov(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let mut mods = Mods::new(&inst.mods);
    let ty_name = mods.take_last().ok_or("mov needs a type")?;
    mods.finish("mov")?;
    let o = &inst.operands;
    arity(o, 2, "mov")?;
    if ty_name == "pred" {
        if let Operand::Int(v) = o[1] {
            return Ok(Op::SetPred {
                d: ctx.pred_dst(&o[0])?,
                value: v != 0,
            });
        }
        return Ok(Op::MovPred {
            d: ctx.pred_dst(&o[0])?,
            a: ctx.pred_dst(&o[1])?,
        });
    }
    let ty = scalar(&ty_name).ok_or_else(|| format!("unsupported type .{ty_name} for mov"))?;
    let wide = ty.bits() == 64;
    // Special registers.
    let sreg = match &o[1] {
        Operand::Special(base, comp) => special(base, Some(comp)),
        Operand::Name(n) if ctx.reg(n).is_none() => special(n, None),
        _ => None,
    };
    if let Some(reg) = sreg {
        let d = if wide {
            ctx.dst64(&o[0])?
        } else {
            ctx.dst32(&o[0])?
        };
        return Ok(Op::Special { d, wide, reg });
    }
    if let Operand::Special(base, comp) = &o[1] {
        return Err(format!("unsupported special register {base}.{comp}"));
    }
    // Packing `{lo, hi}` and unpacking.
    if let Operand::Vector(parts) = &o[1] {
        if parts.len() != 2 {
            return Err("only two-element vector moves are supported".into());
        }
        return match ty.bits() {
            32 => Ok(Op::Pack16 {
                d: ctx.dst32(&o[0])?,
                lo: ctx.src32(&parts[0], Scalar::B16)?,
                hi: ctx.src32(&parts[1], Scalar::B16)?,
            }),
            64 => Ok(Op::Pack32 {
                d: ctx.dst64(&o[0])?,
                lo: ctx.src32(&parts[0], Scalar::B32)?,
                hi: ctx.src32(&parts[1], Scalar::B32)?,
            }),
            _ => Err(format!("vector mov of .{ty_name} is not supported")),
        };
    }
    if let Operand::Vector(parts) = &o[0] {
        if parts.len() != 2 {
            return Err("only two-element vector moves are supported".into());
        }
        let part = |ctx: &Ctx, p: &Operand| -> Result<Option<R>, String> {
            match p {
                Operand::Sink => Ok(None),
                other => ctx.dst32(other).map(Some),
            }
        };
        let (lo, hi) = (part(ctx, &parts[0])?, part(ctx, &parts[1])?);
        return match ty.bits() {
            32 => Ok(Op::Unpack16 {
                lo,
                hi,
                a: ctx.src32(&o[1], Scalar::B32)?,
            }),
            64 => Ok(Op::Unpack32 {
                lo,
                hi,
                a: ctx.src64(&o[1], Scalar::B64)?,
            }),
            _ => Err(format!("vector mov of .{ty_name} is not supported")),
        };
    }
    if wide {
        Ok(Op::Mov64 {
            d: ctx.dst64(&o[0])?,
            a: ctx.src64(&o[1], ty)?,
        })
    } else {
        Ok(Op::Mov32 {
            d: ctx.dst(&o[0], File::R32)?,
            a: ctx.src32(&o[1], ty)?,
        })
    }
}

fn barrier(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let mut mods = Mods::new(&inst.mods);
    let o = &inst.operands;
    if mods.take("warp") {
        mods.take("sync");
        mods.finish(&inst.opcode)?;
        arity(o, 1, "bar.warp.sync")?;
        return Ok(Op::WarpSync {
            mask: ctx.src32(&o[0], Scalar::B32)?,
        });
    }
    // `bar.sync a` / `bar a` / `barrier.sync[.aligned] a`; a thread count is not supported.
    mods.take("sync");
    mods.take("aligned");
    mods.finish(&inst.opcode)?;
    match o.len() {
        0 if inst.opcode == "barrier" => Ok(Op::Bar { id: ctx.const32(0) }),
        1 => Ok(Op::Bar {
            id: ctx.src32(&o[0], Scalar::B32)?,
        }),
        _ => Err("barriers with a thread count are not supported".into()),
    }
}

fn shfl(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let mut mods = Mods::new(&inst.mods);
    if !mods.take("sync") {
        return Err("only shfl.sync is supported (shfl without .sync is pre-Volta)".into());
    }
    let mode = match mods.take_any(&["up", "down", "bfly", "idx"]) {
        Some("up") => ShflMode::Up,
        Some("down") => ShflMode::Down,
        Some("bfly") => ShflMode::Bfly,
        Some(_) => ShflMode::Idx,
        None => return Err("shfl.sync needs .up/.down/.bfly/.idx".into()),
    };
    if !mods.take("b32") {
        return Err("shfl.sync needs .b32".into());
    }
    mods.finish("shfl")?;
    let o = &inst.operands;
    arity(o, 5, "shfl.sync")?;
    let (d, p) = match &o[0] {
        Operand::Pair(d, p) => (ctx.dst32(d)?, Some(ctx.pred_dst(p)?)),
        other => (ctx.dst32(other)?, None),
    };
    Ok(Op::Shfl {
        mode,
        d,
        p,
        a: ctx.src32(&o[1], Scalar::B32)?,
        b: ctx.src32(&o[2], Scalar::B32)?,
        c: ctx.src32(&o[3], Scalar::B32)?,
        mask: ctx.src32(&o[4], Scalar::B32)?,
    })
}

fn vote(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let mut mods = Mods::new(&inst.mods);
    if !mods.take("sync") {
        return Err("only vote.sync is supported".into());
    }
    let mode = match mods.take_any(&["all", "any", "uni", "ballot"]) {
        Some("all") => VoteMode::All,
        Some("any") => VoteMode::Any,
        Some("uni") => VoteMode::Uni,
        Some(_) => VoteMode::Ballot,
        None => return Err("vote.sync needs .all/.any/.uni/.ballot".into()),
    };
    let ty = if mode == VoteMode::Ballot {
        "b32"
    } else {
        "pred"
    };
    if !mods.take(ty) {
        return Err(format!("vote.sync in this mode needs .{ty}"));
    }
    mods.finish("vote")?;
    let o = &inst.operands;
    arity(o, 3, "vote.sync")?;
    let d = if mode == VoteMode::Ballot {
        ctx.dst32(&o[0])?
    } else {
        ctx.pred_dst(&o[0])?
    };
    let (a, neg) = ctx.pred_src(&o[1])?;
    Ok(Op::Vote {
        mode,
        d,
        a,
        neg,
        mask: ctx.src32(&o[2], Scalar::B32)?,
    })
}
