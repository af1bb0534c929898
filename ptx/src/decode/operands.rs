//! Operand resolution for the opcode decoders: registers by file, immediates and symbol addresses
//! as constant registers, predicate sources with optional negation, and modifier bookkeeping
//! (every modifier of an instruction must be understood, or loading fails).

use super::{Ctx, File};
use crate::inst::{R, Rnd, Scalar};
use crate::parser::Operand;

/// Parses a PTX type name.
pub(crate) fn scalar(name: &str) -> Option<Scalar> {
    use Scalar::*;
    Some(match name {
        "u8" => U8,
        "u16" => U16,
        "u32" => U32,
        "u64" => U64,
        "s8" => S8,
        "s16" => S16,
        "s32" => S32,
        "s64" => S64,
        "b8" => B8,
        "b16" => B16,
        "b32" => B32,
        "b64" => B64,
        "f16" => F16,
        "bf16" => BF16,
        "f32" => F32,
        "f64" => F64,
        _ => return None,
    })
}

/// The modifiers of one instruction; decoders `take` what they understand and `finish` rejects
/// the rest.
pub(crate) struct Mods {
    list: Vec<String>,
}

impl Mods {
    pub fn new(list: &[String]) -> Self {
        Mods {
            list: list.to_vec(),
        }
    }

    /// Removes `name` if present.
    pub fn take(&mut self, name: &str) -> bool {
        if let Some(i) = self.list.iter().position(|m| m == name) {
            self.list.remove(i);
            true
        } else {
            false
        }
    }

    /// Removes and returns the first of `names` present.
    pub fn take_any(&mut self, names: &[&'static str]) -> Option<&'static str> {
        names.iter().copied().find(|n| self.take(n))
    }

    /// Removes a float rounding modifier (`.rn/.rz/.rm/.rp`).
    pub fn take_rnd(&mut self) -> Option<Rnd> {
        self.take_any(&["rn", "rz", "rm", "rp"]).map(|r| match r {
            "rz" => Rnd::Rz,
            "rm" => Rnd::Rm,
            "rp" => Rnd::Rp,
            _ => Rnd::Rn,
        })
    }

    /// Removes an integer rounding modifier (`.rni/.rzi/.rmi/.rpi`).
    pub fn take_int_rnd(&mut self) -> Option<Rnd> {
        self.take_any(&["rni", "rzi", "rmi", "rpi"])
            .map(|r| match r {
                "rzi" => Rnd::Rz,
                "rmi" => Rnd::Rm,
                "rpi" => Rnd::Rp,
                _ => Rnd::Rn,
            })
    }

    /// Keeps only the modifiers for which `keep` holds.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.list.retain(|m| keep(m));
    }

    /// Removes the last modifier if it is a type name (`.f32`, `.s64`...).
    pub fn take_type(&mut self) -> Option<Scalar> {
        let last = self.list.last()?;
        let ty = scalar(last)?;
        self.list.pop();
        Some(ty)
    }

    /// Removes and returns the last modifier as raw text (`f16x2` and friends).
    pub fn take_last(&mut self) -> Option<String> {
        self.list.pop()
    }

    /// Fails on any modifier nobody took.
    pub fn finish(self, opcode: &str) -> Result<(), String> {
        if self.list.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "unsupported modifier(s) .{} of `{opcode}`",
                self.list.join(" .")
            ))
        }
    }
}

/// The bit pattern of immediate `op` for an operand of type `ty`, or `None` if `op` is not an
/// immediate.
pub(crate) fn imm_bits(op: &Operand, ty: Scalar) -> Result<Option<u64>, String> {
    let width_mask = |bits: u32| {
        if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        }
    };
    let v = match (op, ty) {
        (Operand::Int(v), Scalar::F32) => u64::from((*v as i64 as f32).to_bits()),
        (Operand::Int(v), Scalar::F64) => (*v as i64 as f64).to_bits(),
        (Operand::Int(v), t) => v & width_mask(t.bits()),
        (Operand::F32(b), Scalar::F64) => f64::from(f32::from_bits(*b)).to_bits(),
        (Operand::F32(b), t) if t.bits() >= 32 => u64::from(*b),
        (Operand::F64(b), Scalar::F32) => u64::from((f64::from_bits(*b) as f32).to_bits()),
        (Operand::F64(b), t) if t.bits() == 64 => *b,
        (Operand::Dec(v), Scalar::F32) => u64::from((*v as f32).to_bits()),
        (Operand::Dec(v), Scalar::F64) => v.to_bits(),
        (Operand::F32(_) | Operand::F64(_) | Operand::Dec(_), t) => {
            return Err(format!("literal {op:?} does not fit a .{t:?} operand"));
        }
        _ => return Ok(None),
    };
    Ok(Some(v))
}

fn describe(op: &Operand) -> String {
    match op {
        Operand::Name(n) => n.clone(),
        Operand::Special(a, b) => format!("{a}.{b}"),
        other => format!("{other:?}"),
    }
}

impl Ctx {
    /// A source in the 32-bit file: a register, an immediate or a symbol address.
    pub fn src32(&mut self, op: &Operand, ty: Scalar) -> Result<R, String> {
        if let Some(bits) = imm_bits(op, ty)? {
            return Ok(self.const32(bits as u32));
        }
        match op {
            Operand::Name(name) => match self.reg(name) {
                Some(r) if r.file == File::R32 => Ok(r.idx),
                Some(_) => Err(format!("{name} is not a 32-bit (or narrower) register")),
                None => match self.symbol(name) {
                    Some(addr) => match u32::try_from(addr) {
                        Ok(a) => Ok(self.const32(a)),
                        Err(_) => Err(format!("address of {name} does not fit 32 bits")),
                    },
                    None => Err(format!("undeclared register or symbol {name}")),
                },
            },
            other => Err(format!(
                "expected a 32-bit source, found {}",
                describe(other)
            )),
        }
    }

    /// A source in the 64-bit file: a register, an immediate or a symbol address.
    pub fn src64(&mut self, op: &Operand, ty: Scalar) -> Result<R, String> {
        if let Some(bits) = imm_bits(op, ty)? {
            return Ok(self.const64(bits));
        }
        match op {
            Operand::Name(name) => match self.reg(name) {
                Some(r) if r.file == File::R64 => Ok(r.idx),
                Some(_) => Err(format!("{name} is not a 64-bit register")),
                None => match self.symbol(name) {
                    Some(addr) => Ok(self.const64(addr)),
                    None => Err(format!("undeclared register or symbol {name}")),
                },
            },
            other => Err(format!(
                "expected a 64-bit source, found {}",
                describe(other)
            )),
        }
    }

    /// A source of type `ty`, in whichever file `ty` lives.
    pub fn src(&mut self, op: &Operand, ty: Scalar) -> Result<R, String> {
        if ty.bits() == 64 {
            self.src64(op, ty)
        } else {
            self.src32(op, ty)
        }
    }

    /// A destination register of the given file.
    pub fn dst(&self, op: &Operand, file: File) -> Result<R, String> {
        match op {
            Operand::Name(name) => match self.reg(name) {
                Some(r) if r.file == file => Ok(r.idx),
                Some(r) => Err(format!(
                    "{name} is in the {:?} register file, expected {file:?}",
                    r.file
                )),
                None => Err(format!("undeclared register {name}")),
            },
            other => Err(format!(
                "expected a destination register, found {}",
                describe(other)
            )),
        }
    }

    pub fn dst32(&self, op: &Operand) -> Result<R, String> {
        self.dst(op, File::R32)
    }

    pub fn dst64(&self, op: &Operand) -> Result<R, String> {
        self.dst(op, File::R64)
    }

    /// A predicate source, possibly negated (`!%p1`).
    pub fn pred_src(&self, op: &Operand) -> Result<(R, bool), String> {
        match op {
            Operand::Name(n) => Ok((self.pred_reg(n)?, false)),
            Operand::Not(inner) => match inner.as_ref() {
                Operand::Name(n) => Ok((self.pred_reg(n)?, true)),
                other => Err(format!("expected a predicate, found {}", describe(other))),
            },
            other => Err(format!("expected a predicate, found {}", describe(other))),
        }
    }

    /// A predicate destination.
    pub fn pred_dst(&self, op: &Operand) -> Result<R, String> {
        match op {
            Operand::Name(n) => self.pred_reg(n),
            other => Err(format!("expected a predicate, found {}", describe(other))),
        }
    }
}

/// Checks the operand count.
pub(crate) fn arity(ops: &[Operand], n: usize, opcode: &str) -> Result<(), String> {
    if ops.len() == n {
        Ok(())
    } else {
        Err(format!(
            "`{opcode}` takes {n} operands, found {}",
            ops.len()
        ))
    }
}
