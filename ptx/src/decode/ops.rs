//! Decoding two- and three-operand arithmetic and logic: integer ops on the 32- and 64-bit
//! files, f32/f64 arithmetic with rounding and `.ftz`/`.sat`, half-precision arithmetic, predicate
//! logic. One-operand and bit-field ops are in `unary`, comparisons in `compare`, control flow,
//! `mov` and warp operations in `control`.

use super::class::{Class, float_flags, imm_ty, typed};
use super::operands::{Mods, arity};
use super::{Ctx, compare, control, unary};
use crate::inst::{BoolOp, FBinOp, HalfOp, IntOp, Op, Rnd, Scalar, ShiftOp};
use crate::parser::InstAst;

pub(super) fn decode(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let name = inst.opcode.as_str();
    match name {
        "add" | "sub" | "mul" | "div" | "rem" | "min" | "max" | "and" | "or" | "xor" | "shl"
        | "shr" | "copysign" => binary(ctx, inst),
        "mad" | "fma" => ternary(ctx, inst),
        "neg" | "abs" | "not" | "cnot" | "popc" | "clz" | "brev" | "sqrt" | "rsqrt" | "rcp"
        | "ex2" | "lg2" | "sin" | "cos" | "tanh" => unary::unary(ctx, inst),
        "bfe" | "bfi" | "prmt" | "lop3" => unary::bits(ctx, inst),
        "dp4a" | "dp2a" => dot(ctx, inst),
        "setp" => compare::setp(ctx, inst),
        "selp" => compare::selp(ctx, inst),
        "testp" => compare::testp(ctx, inst),
        _ => control::decode(ctx, inst),
    }
}

/// `shl`, or `shr` (arithmetic on signed types); `None` for other names.
fn shift_op(name: &str, signed: bool) -> Option<ShiftOp> {
    match name {
        "shl" => Some(ShiftOp::Shl),
        "shr" if signed => Some(ShiftOp::ShrS),
        "shr" => Some(ShiftOp::ShrU),
        _ => None,
    }
}

/// The integer arithmetic every width decodes alike: `add`, `sub`, `mul.lo`, `div`, `rem`,
/// `min`, `max` (signed or unsigned by `signed`); `None` for other names (and `mul` without
/// `.lo`).
fn int_arith(name: &str, signed: bool, mods: &mut Mods) -> Option<IntOp> {
    Some(match name {
        "add" => IntOp::Add,
        "sub" => IntOp::Sub,
        "mul" if mods.take("lo") => IntOp::MulLo,
        "div" if signed => IntOp::DivS,
        "div" => IntOp::DivU,
        "rem" if signed => IntOp::RemS,
        "rem" => IntOp::RemU,
        "min" if signed => IntOp::MinS,
        "min" => IntOp::MinU,
        "max" if signed => IntOp::MaxS,
        "max" => IntOp::MaxU,
        _ => return None,
    })
}

fn binary(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let (mut mods, class, ty) = typed(inst)?;
    let o = &inst.operands;
    arity(o, 3, &inst.opcode)?;
    let name = inst.opcode.as_str();
    let op = match class {
        Class::Int32 { signed } | Class::Int64 { signed } => {
            let wide = matches!(class, Class::Int64 { .. });
            if name == "mul" && mods.take("wide") {
                mods.finish(name)?;
                if wide {
                    return Err("mul.wide of 64-bit operands is not supported".into());
                }
                let d = ctx.dst64(&o[0])?;
                let (a, b) = (
                    ctx.src32(&o[1], Scalar::B32)?,
                    ctx.src32(&o[2], Scalar::B32)?,
                );
                return Ok(Op::MulWide { signed, d, a, b });
            }
            if let Some(op) = shift_op(name, signed) {
                mods.finish(name)?;
                let b = ctx.src32(&o[2], Scalar::B32)?;
                return Ok(if wide {
                    Op::Shift64 {
                        op,
                        d: ctx.dst64(&o[0])?,
                        a: ctx.src64(&o[1], Scalar::B64)?,
                        b,
                    }
                } else {
                    Op::Shift32 {
                        op,
                        d: ctx.dst32(&o[0])?,
                        a: ctx.src32(&o[1], Scalar::B32)?,
                        b,
                    }
                });
            }
            let int_op = match name {
                "add" if signed && !wide && mods.take("sat") => IntOp::AddSatS,
                "sub" if signed && !wide && mods.take("sat") => IntOp::SubSatS,
                "and" => IntOp::And,
                "or" => IntOp::Or,
                "xor" => IntOp::Xor,
                _ => match int_arith(name, signed, &mut mods) {
                    Some(op) => op,
                    None if name == "mul" && mods.take("hi") => {
                        if signed {
                            IntOp::MulHiS
                        } else {
                            IntOp::MulHiU
                        }
                    }
                    None => return Err(format!("unsupported `{name}` on .{ty}")),
                },
            };
            mods.finish(name)?;
            if wide {
                Op::Int64 {
                    op: int_op,
                    d: ctx.dst64(&o[0])?,
                    a: ctx.src64(&o[1], Scalar::B64)?,
                    b: ctx.src64(&o[2], Scalar::B64)?,
                }
            } else {
                Op::Int32 {
                    op: int_op,
                    d: ctx.dst32(&o[0])?,
                    a: ctx.src32(&o[1], Scalar::B32)?,
                    b: ctx.src32(&o[2], Scalar::B32)?,
                }
            }
        }
        Class::Int16 => {
            let signed = ty == "s16";
            if name == "mul" && mods.take("wide") {
                mods.finish(name)?;
                return Ok(Op::MulWide16 {
                    signed,
                    d: ctx.dst32(&o[0])?,
                    a: ctx.src32(&o[1], Scalar::B16)?,
                    b: ctx.src32(&o[2], Scalar::B16)?,
                });
            }
            if let Some(op) = shift_op(name, signed) {
                mods.finish(name)?;
                return Ok(Op::Shift16 {
                    op,
                    d: ctx.dst32(&o[0])?,
                    a: ctx.src32(&o[1], Scalar::B16)?,
                    b: ctx.src32(&o[2], Scalar::B32)?,
                });
            }
            let (a, b) = (
                ctx.src32(&o[1], Scalar::B16)?,
                ctx.src32(&o[2], Scalar::B16)?,
            );
            // 16-bit logic on zero-extended values stays within 16 bits.
            let logic = match name {
                "and" => Some(IntOp::And),
                "or" => Some(IntOp::Or),
                "xor" => Some(IntOp::Xor),
                _ => None,
            };
            if let Some(op) = logic {
                mods.finish(name)?;
                return Ok(Op::Int32 {
                    op,
                    d: ctx.dst32(&o[0])?,
                    a,
                    b,
                });
            }
            // Arithmetic: computed on (sign-)extended values, truncated to 16 bits.
            let int_op = int_arith(name, signed, &mut mods)
                .ok_or_else(|| format!("16-bit integer `{name}` is not supported"))?;
            mods.finish(name)?;
            Op::Int16 {
                op: int_op,
                signed,
                d: ctx.dst32(&o[0])?,
                a,
                b,
            }
        }
        Class::Pred => {
            let op = match name {
                "and" => BoolOp::And,
                "or" => BoolOp::Or,
                "xor" => BoolOp::Xor,
                _ => return Err(format!("`{name}` is not defined on predicates")),
            };
            mods.finish(name)?;
            Op::PredBin {
                op,
                d: ctx.pred_dst(&o[0])?,
                a: ctx.pred_dst(&o[1])?,
                b: ctx.pred_dst(&o[2])?,
            }
        }
        Class::F32 | Class::F64 => {
            let rnd = mods.take_rnd();
            let approx = mods.take("approx");
            let full = mods.take("full");
            let fl = float_flags(&mut mods);
            let directed = |make: fn(Rnd) -> FBinOp, plain: FBinOp| match rnd {
                None | Some(Rnd::Rn) => plain,
                Some(r) => make(r),
            };
            let fop = match name {
                "add" => directed(FBinOp::AddR, FBinOp::Add),
                "sub" => directed(FBinOp::SubR, FBinOp::Sub),
                "mul" => directed(FBinOp::MulR, FBinOp::Mul),
                "div" if approx => FBinOp::DivApprox,
                "div" if full => FBinOp::Div,
                "div" => match rnd {
                    Some(Rnd::Rn) => FBinOp::Div,
                    Some(r) => FBinOp::DivR(r),
                    None => {
                        return Err("div.f32/f64 needs .rn/.rz/.rm/.rp, .full or .approx".into());
                    }
                },
                "min" => FBinOp::Min,
                "max" => FBinOp::Max,
                "copysign" => FBinOp::Copysign,
                _ => return Err(format!("unsupported `{name}` on .{ty}")),
            };
            if (approx || full) && name != "div" {
                return Err(format!("`{name}` takes no .approx/.full"));
            }
            if matches!(fop, FBinOp::Min | FBinOp::Max | FBinOp::Copysign) && rnd.is_some() {
                return Err(format!("`{name}` takes no rounding modifier"));
            }
            mods.finish(name)?;
            if class == Class::F32 {
                if fl.sat && !matches!(name, "add" | "sub" | "mul") {
                    return Err(format!("`{name}` takes no .sat"));
                }
                Op::F32Bin {
                    op: fop,
                    fl,
                    d: ctx.dst32(&o[0])?,
                    a: ctx.src32(&o[1], Scalar::F32)?,
                    b: ctx.src32(&o[2], Scalar::F32)?,
                }
            } else {
                if fl.ftz || fl.sat {
                    return Err("f64 arithmetic takes no .ftz/.sat".into());
                }
                Op::F64Bin {
                    op: fop,
                    d: ctx.dst64(&o[0])?,
                    a: ctx.src64(&o[1], Scalar::F64)?,
                    b: ctx.src64(&o[2], Scalar::F64)?,
                }
            }
        }
        Class::Half(hty) => {
            if let Some(r) = mods.take_rnd()
                && r != Rnd::Rn
            {
                return Err("half-precision arithmetic supports only .rn".into());
            }
            let fl = float_flags(&mut mods);
            let hop = match name {
                "add" => HalfOp::Add,
                "sub" => HalfOp::Sub,
                "mul" => HalfOp::Mul,
                "min" => HalfOp::Min,
                "max" => HalfOp::Max,
                _ => return Err(format!("unsupported `{name}` on .{ty}")),
            };
            mods.finish(name)?;
            let it = imm_ty(class);
            let (a, b) = (ctx.src32(&o[1], it)?, ctx.src32(&o[2], it)?);
            Op::Half {
                op: hop,
                ty: hty,
                fl,
                d: ctx.dst32(&o[0])?,
                a,
                b,
                c: b,
            }
        }
    };
    Ok(op)
}

fn ternary(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let (mut mods, class, ty) = typed(inst)?;
    let o = &inst.operands;
    arity(o, 4, &inst.opcode)?;
    let name = inst.opcode.as_str();
    match class {
        Class::Int32 { signed } | Class::Int64 { signed } if name == "mad" => {
            let wide64 = matches!(class, Class::Int64 { .. });
            if mods.take("wide") {
                mods.finish(name)?;
                if wide64 {
                    return Err("mad.wide of 64-bit operands is not supported".into());
                }
                return Ok(Op::MadWide {
                    signed,
                    d: ctx.dst64(&o[0])?,
                    a: ctx.src32(&o[1], Scalar::B32)?,
                    b: ctx.src32(&o[2], Scalar::B32)?,
                    c: ctx.src64(&o[3], Scalar::B64)?,
                });
            }
            let hi = if mods.take("hi") {
                true
            } else if mods.take("lo") {
                false
            } else {
                return Err("integer mad needs .lo, .hi or .wide".into());
            };
            mods.finish(name)?;
            Ok(if wide64 {
                Op::Mad64 {
                    hi,
                    signed,
                    d: ctx.dst64(&o[0])?,
                    a: ctx.src64(&o[1], Scalar::B64)?,
                    b: ctx.src64(&o[2], Scalar::B64)?,
                    c: ctx.src64(&o[3], Scalar::B64)?,
                }
            } else {
                Op::Mad32 {
                    hi,
                    signed,
                    d: ctx.dst32(&o[0])?,
                    a: ctx.src32(&o[1], Scalar::B32)?,
                    b: ctx.src32(&o[2], Scalar::B32)?,
                    c: ctx.src32(&o[3], Scalar::B32)?,
                }
            })
        }
        Class::F32 | Class::F64 => {
            // `mad.rn.f32` is a fused multiply-add on every target we model.
            let rnd = mods.take_rnd().unwrap_or(Rnd::Rn);
            let fl = float_flags(&mut mods);
            mods.finish(name)?;
            if class == Class::F32 {
                Ok(Op::F32Fma {
                    rnd,
                    fl,
                    d: ctx.dst32(&o[0])?,
                    a: ctx.src32(&o[1], Scalar::F32)?,
                    b: ctx.src32(&o[2], Scalar::F32)?,
                    c: ctx.src32(&o[3], Scalar::F32)?,
                })
            } else {
                if fl.ftz || fl.sat {
                    return Err("f64 fma takes no .ftz/.sat".into());
                }
                Ok(Op::F64Fma {
                    rnd,
                    d: ctx.dst64(&o[0])?,
                    a: ctx.src64(&o[1], Scalar::F64)?,
                    b: ctx.src64(&o[2], Scalar::F64)?,
                    c: ctx.src64(&o[3], Scalar::F64)?,
                })
            }
        }
        Class::Half(hty) => {
            if mods.take_rnd().unwrap_or(Rnd::Rn) != Rnd::Rn {
                return Err("half-precision fma supports only .rn".into());
            }
            let fl = float_flags(&mut mods);
            mods.finish(name)?;
            let it = imm_ty(class);
            Ok(Op::Half {
                op: HalfOp::Fma,
                ty: hty,
                fl,
                d: ctx.dst32(&o[0])?,
                a: ctx.src32(&o[1], it)?,
                b: ctx.src32(&o[2], it)?,
                c: ctx.src32(&o[3], it)?,
            })
        }
        _ => Err(format!("unsupported `{name}` on .{ty}")),
    }
}

/// `dp4a.atype.btype d, a, b, c` and `dp2a.{lo,hi}.atype.btype d, a, b, c` (types `.u32` or
/// `.s32`, a's first).
fn dot(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let name = inst.opcode.as_str();
    let mut types: Vec<&str> = inst.mods.iter().map(String::as_str).collect();
    let half = if name == "dp2a" {
        let hi = match types.first() {
            Some(&"hi") => true,
            Some(&"lo") => false,
            _ => return Err("dp2a needs .lo or .hi first".into()),
        };
        types.remove(0);
        Some(hi)
    } else {
        None
    };
    let (a_signed, b_signed) = match types[..] {
        [a, b] if [a, b].iter().all(|t| *t == "u32" || *t == "s32") => (a == "s32", b == "s32"),
        _ => return Err(format!("`{name}` needs two types, each .u32 or .s32")),
    };
    let o = &inst.operands;
    arity(o, 4, name)?;
    Ok(Op::Dot {
        half,
        a_signed,
        b_signed,
        d: ctx.dst32(&o[0])?,
        a: ctx.src32(&o[1], Scalar::B32)?,
        b: ctx.src32(&o[2], Scalar::B32)?,
        c: ctx.src32(&o[3], Scalar::B32)?,
    })
}
