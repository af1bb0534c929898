//! Decoding one-operand operations (integer `neg/abs/not/cnot/brev/popc/clz`, float `neg/abs`,
//! `sqrt/rcp` with rounding, the `.approx` functions) and bit-field/byte operations
//! (`bfe`, `bfi`, `prmt`, `lop3`).

use super::Ctx;
use super::class::{Class, float_flags, imm_ty, typed};
use super::operands::arity;
use crate::inst::{FUnOp, HalfOp, IntOp, IntUnOp, Op, Rnd, Scalar};
use crate::parser::InstAst;

pub(super) fn unary(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let (mut mods, class, ty) = typed(inst)?;
    let o = &inst.operands;
    arity(o, 2, &inst.opcode)?;
    let name = inst.opcode.as_str();
    match class {
        Class::Int32 { .. } | Class::Int64 { .. } => {
            let wide = matches!(class, Class::Int64 { .. });
            mods.finish(name)?;
            let src = |ctx: &mut Ctx| {
                if wide {
                    ctx.src64(&o[1], Scalar::B64)
                } else {
                    ctx.src32(&o[1], Scalar::B32)
                }
            };
            if name == "popc" || name == "clz" {
                let (d, a) = (ctx.dst32(&o[0])?, src(ctx)?);
                return Ok(if name == "popc" {
                    Op::Popc { d, a, wide }
                } else {
                    Op::Clz { d, a, wide }
                });
            }
            let op = match name {
                "neg" => IntUnOp::Neg,
                "abs" => IntUnOp::Abs,
                "not" => IntUnOp::Not,
                "cnot" => IntUnOp::Cnot,
                "brev" => IntUnOp::Brev,
                _ => return Err(format!("unsupported `{name}` on .{ty}")),
            };
            let a = src(ctx)?;
            Ok(if wide {
                Op::IntUn64 {
                    op,
                    d: ctx.dst64(&o[0])?,
                    a,
                }
            } else {
                Op::IntUn32 {
                    op,
                    d: ctx.dst32(&o[0])?,
                    a,
                }
            })
        }
        Class::Int16 if name == "not" => {
            mods.finish(name)?;
            let mask = ctx.const32(0xffff);
            Ok(Op::Int32 {
                op: IntOp::Xor,
                d: ctx.dst32(&o[0])?,
                a: ctx.src32(&o[1], Scalar::B16)?,
                b: mask,
            })
        }
        Class::Pred if name == "not" => {
            mods.finish(name)?;
            Ok(Op::PredNot {
                d: ctx.pred_dst(&o[0])?,
                a: ctx.pred_dst(&o[1])?,
            })
        }
        Class::F32 | Class::F64 => {
            let rnd = mods.take_rnd();
            let approx = mods.take("approx");
            let fl = float_flags(&mut mods);
            let fop = match (name, approx, rnd) {
                ("neg", false, None) => FUnOp::Neg,
                ("abs", false, None) => FUnOp::Abs,
                ("sqrt", true, None) => FUnOp::SqrtApprox,
                ("sqrt", false, Some(Rnd::Rn)) => FUnOp::Sqrt,
                ("sqrt", false, Some(r)) => FUnOp::SqrtR(r),
                ("rcp", true, None) => FUnOp::RcpApprox,
                ("rcp", false, Some(Rnd::Rn)) => FUnOp::Rcp,
                ("rcp", false, Some(r)) => FUnOp::RcpR(r),
                ("rsqrt", true, None) => FUnOp::Rsqrt,
                ("ex2", true, None) => FUnOp::Ex2,
                ("lg2", true, None) => FUnOp::Lg2,
                ("sin", true, None) => FUnOp::Sin,
                ("cos", true, None) => FUnOp::Cos,
                ("tanh", true, None) => FUnOp::Tanh,
                _ => return Err(format!("unsupported form of `{name}` on .{ty}")),
            };
            mods.finish(name)?;
            if fl.sat {
                return Err(format!("`{name}` takes no .sat"));
            }
            if class == Class::F32 {
                Ok(Op::F32Un {
                    op: fop,
                    fl,
                    d: ctx.dst32(&o[0])?,
                    a: ctx.src32(&o[1], Scalar::F32)?,
                })
            } else {
                // `.ftz` on f64 (rcp.approx.ftz.f64) only concerns the approximation's input range.
                if matches!(
                    fop,
                    FUnOp::Ex2 | FUnOp::Lg2 | FUnOp::Sin | FUnOp::Cos | FUnOp::Tanh
                ) {
                    return Err(format!("`{name}` is not defined on .f64"));
                }
                Ok(Op::F64Un {
                    op: fop,
                    d: ctx.dst64(&o[0])?,
                    a: ctx.src64(&o[1], Scalar::F64)?,
                })
            }
        }
        Class::Half(hty) if name == "neg" || name == "abs" => {
            let fl = float_flags(&mut mods);
            mods.finish(name)?;
            let a = ctx.src32(&o[1], imm_ty(class))?;
            Ok(Op::Half {
                op: if name == "neg" {
                    HalfOp::Neg
                } else {
                    HalfOp::Abs
                },
                ty: hty,
                fl,
                d: ctx.dst32(&o[0])?,
                a,
                b: a,
                c: a,
            })
        }
        _ => Err(format!("unsupported `{name}` on .{ty}")),
    }
}

pub(super) fn bits(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let (mods, class, ty) = typed(inst)?;
    let name = inst.opcode.as_str();
    mods.finish(name)?;
    let o = &inst.operands;
    let b32 = Scalar::B32;
    match (name, class) {
        ("bfe", Class::Int32 { signed }) => {
            arity(o, 4, name)?;
            Ok(Op::Bfe32 {
                signed,
                d: ctx.dst32(&o[0])?,
                a: ctx.src32(&o[1], b32)?,
                pos: ctx.src32(&o[2], b32)?,
                len: ctx.src32(&o[3], b32)?,
            })
        }
        ("bfe", Class::Int64 { signed }) => {
            arity(o, 4, name)?;
            Ok(Op::Bfe64 {
                signed,
                d: ctx.dst64(&o[0])?,
                a: ctx.src64(&o[1], Scalar::B64)?,
                pos: ctx.src32(&o[2], b32)?,
                len: ctx.src32(&o[3], b32)?,
            })
        }
        ("bfi", Class::Int32 { .. }) => {
            arity(o, 5, name)?;
            Ok(Op::Bfi32 {
                d: ctx.dst32(&o[0])?,
                f: ctx.src32(&o[1], b32)?,
                b: ctx.src32(&o[2], b32)?,
                pos: ctx.src32(&o[3], b32)?,
                len: ctx.src32(&o[4], b32)?,
            })
        }
        ("bfi", Class::Int64 { .. }) => {
            arity(o, 5, name)?;
            Ok(Op::Bfi64 {
                d: ctx.dst64(&o[0])?,
                f: ctx.src64(&o[1], Scalar::B64)?,
                b: ctx.src64(&o[2], Scalar::B64)?,
                pos: ctx.src32(&o[3], b32)?,
                len: ctx.src32(&o[4], b32)?,
            })
        }
        ("prmt", Class::Int32 { .. }) => {
            arity(o, 4, name)?;
            Ok(Op::Prmt {
                d: ctx.dst32(&o[0])?,
                a: ctx.src32(&o[1], b32)?,
                b: ctx.src32(&o[2], b32)?,
                c: ctx.src32(&o[3], b32)?,
            })
        }
        ("lop3", Class::Int32 { .. }) => {
            arity(o, 5, name)?;
            let lut = match super::operands::imm_bits(&o[4], Scalar::B8)? {
                Some(v) => v as u8,
                None => return Err("lop3 needs an immediate lookup table".into()),
            };
            Ok(Op::Lop3 {
                d: ctx.dst32(&o[0])?,
                a: ctx.src32(&o[1], b32)?,
                b: ctx.src32(&o[2], b32)?,
                c: ctx.src32(&o[3], b32)?,
                lut,
            })
        }
        _ => Err(format!("unsupported `{name}` on .{ty}")),
    }
}
