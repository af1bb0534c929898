//! Decoding arithmetic, logic, comparison and selection opcodes: integer ops on the 32- and 64-bit
//! files, f32/f64 arithmetic with rounding and `.ftz`/`.sat`, half-precision arithmetic, `setp`,
//! `selp`, `testp` and predicate logic. Control flow, `mov` and warp operations are in `control`.

use super::operands::{Mods, arity};
use super::{Ctx, control};
use crate::inst::{
    BoolOp, Cmp, CmpTy, FBinOp, FFlags, FUnOp, HalfOp, HalfTy, IntOp, IntUnOp, Op, Rnd, Scalar,
    ShiftOp,
};
use crate::parser::InstAst;

/// What an arithmetic type means for decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Int32 { signed: bool },
    Int64 { signed: bool },
    Int16,
    F32,
    F64,
    Half(HalfTy),
    Pred,
}

fn class_of(ty: &str) -> Option<Class> {
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
fn imm_ty(c: Class) -> Scalar {
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

pub(super) fn decode(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
    let name = inst.opcode.as_str();
    match name {
        "add" | "sub" | "mul" | "div" | "rem" | "min" | "max" | "and" | "or" | "xor" | "shl"
        | "shr" | "copysign" => binary(ctx, inst),
        "mad" | "fma" => ternary(ctx, inst),
        "neg" | "abs" | "not" | "cnot" | "popc" | "clz" | "brev" | "sqrt" | "rsqrt" | "rcp"
        | "ex2" | "lg2" | "sin" | "cos" | "tanh" => unary(ctx, inst),
        "bfe" | "bfi" | "prmt" | "lop3" => bits(ctx, inst),
        "setp" => setp(ctx, inst),
        "selp" => selp(ctx, inst),
        "testp" => testp(ctx, inst),
        _ => control::decode(ctx, inst),
    }
}

/// Splits off the type (last modifier) and classifies it.
fn typed(inst: &InstAst) -> Result<(Mods, Class, String), String> {
    let mut mods = Mods::new(&inst.mods);
    let ty = mods
        .take_last()
        .ok_or_else(|| format!("`{}` needs a type", inst.opcode))?;
    let class =
        class_of(&ty).ok_or_else(|| format!("unsupported type .{ty} for `{}`", inst.opcode))?;
    Ok((mods, class, ty))
}

fn float_flags(mods: &mut Mods) -> FFlags {
    FFlags {
        ftz: mods.take("ftz"),
        sat: mods.take("sat"),
    }
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
            if name == "shl" || name == "shr" {
                let op = match (name, signed) {
                    ("shl", _) => ShiftOp::Shl,
                    (_, true) => ShiftOp::ShrS,
                    _ => ShiftOp::ShrU,
                };
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
                "add" => IntOp::Add,
                "sub" => IntOp::Sub,
                "mul" if mods.take("lo") => IntOp::MulLo,
                "mul" if mods.take("hi") => {
                    if signed {
                        IntOp::MulHiS
                    } else {
                        IntOp::MulHiU
                    }
                }
                "div" if signed => IntOp::DivS,
                "div" => IntOp::DivU,
                "rem" if signed => IntOp::RemS,
                "rem" => IntOp::RemU,
                "min" if signed => IntOp::MinS,
                "min" => IntOp::MinU,
                "max" if signed => IntOp::MaxS,
                "max" => IntOp::MaxU,
                "and" => IntOp::And,
                "or" => IntOp::Or,
                "xor" => IntOp::Xor,
                _ => return Err(format!("unsupported `{name}` on .{ty}")),
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
            if name == "mul" && mods.take("wide") {
                mods.finish(name)?;
                return Ok(Op::MulWide16 {
                    signed: ty == "s16",
                    d: ctx.dst32(&o[0])?,
                    a: ctx.src32(&o[1], Scalar::B16)?,
                    b: ctx.src32(&o[2], Scalar::B16)?,
                });
            }
            // 16-bit logic on zero-extended values stays within 16 bits.
            let int_op = match name {
                "and" => IntOp::And,
                "or" => IntOp::Or,
                "xor" => IntOp::Xor,
                _ => return Err(format!("16-bit integer `{name}` is not supported")),
            };
            mods.finish(name)?;
            Op::Int32 {
                op: int_op,
                d: ctx.dst32(&o[0])?,
                a: ctx.src32(&o[1], Scalar::B16)?,
                b: ctx.src32(&o[2], Scalar::B16)?,
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

fn unary(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
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

fn bits(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
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

fn setp(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
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
    let is_int = matches!(cty, CmpTy::S32 | CmpTy::U32 | CmpTy::S64 | CmpTy::U64);
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

fn selp(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
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

fn testp(ctx: &mut Ctx, inst: &InstAst) -> Result<Op, String> {
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
