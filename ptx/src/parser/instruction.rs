//! Parsing one instruction: optional guard, opcode with modifiers, and operands — registers,
//! special registers (`%tid.x`), literals (`0f3F800000`, negative integers), addresses
//! (`[%rd1+-4]`), vectors (`{%f1, _}`), dual destinations (`%r1|%p1`) and negations (`!%p1`).

use super::ast::{InstAst, parse_int};
use super::{Operand, PResult, Parser};
use crate::error::LoadError;
use crate::lexer::Tok;

impl Parser<'_> {
    pub(super) fn instruction(&mut self) -> PResult<InstAst> {
        let line = self.line();
        let mut guard = None;
        if self.eat(Tok::At) {
            let neg = self.eat(Tok::Bang);
            let p = self
                .expect(Tok::Ident, "a predicate register")?
                .text
                .to_string();
            guard = Some((p, neg));
        }
        let opcode = self.expect(Tok::Ident, "an opcode")?.text.to_string();
        let mut mods = Vec::new();
        while let Some(t) = self.peek() {
            if t.tok != Tok::DotWord {
                break;
            }
            self.pos += 1;
            mods.push(t.text[1..].to_string());
        }
        let mut operands = Vec::new();
        if !self.eat(Tok::Semi) {
            let unknown = !crate::inst::OPCODES.contains(&opcode.as_str());
            let unsupported = |mut e: LoadError| {
                if unknown {
                    e.message = format!("unsupported instruction `{opcode}`");
                }
                e
            };
            loop {
                operands.push(self.operand().map_err(unsupported)?);
                if self.eat(Tok::Semi) {
                    break;
                }
                self.expect(Tok::Comma, "`,` or `;`").map_err(unsupported)?;
            }
        }
        Ok(InstAst {
            guard,
            opcode,
            mods,
            operands,
            line,
        })
    }

    fn operand(&mut self) -> PResult<Operand> {
        let first = self.simple_operand()?;
        if self.eat(Tok::Pipe) {
            let second = self.simple_operand()?;
            return Ok(Operand::Pair(Box::new(first), Box::new(second)));
        }
        Ok(first)
    }

    fn simple_operand(&mut self) -> PResult<Operand> {
        let t = self.next()?;
        match t.tok {
            Tok::Ident if t.text == "_" => Ok(Operand::Sink),
            Tok::Ident => {
                if let Some(n) = self.peek()
                    && n.tok == Tok::DotWord
                {
                    self.pos += 1;
                    return Ok(Operand::Special(
                        t.text.to_string(),
                        n.text[1..].to_string(),
                    ));
                }
                Ok(Operand::Name(t.text.to_string()))
            }
            Tok::Bang => Ok(Operand::Not(Box::new(self.simple_operand()?))),
            Tok::Minus | Tok::Int | Tok::F32Bits | Tok::F64Bits | Tok::DecFloat => {
                self.pos -= 1;
                self.literal()
            }
            Tok::LBracket => self.address(),
            Tok::LBrace => {
                let mut elems = Vec::new();
                loop {
                    elems.push(self.simple_operand()?);
                    if self.eat(Tok::RBrace) {
                        break;
                    }
                    self.expect(Tok::Comma, "`,` or `}`")?;
                }
                Ok(Operand::Vector(elems))
            }
            _ => {
                self.pos -= 1;
                self.err(format!("unexpected `{}` in an operand", t.text))
            }
        }
    }

    fn literal(&mut self) -> PResult<Operand> {
        let neg = self.eat(Tok::Minus);
        let t = self.next()?;
        let bad = |p: &Self| p.err(format!("bad literal `{}`", t.text));
        let lit = match t.tok {
            Tok::Int => match parse_int(t.text) {
                Some(v) => Operand::Int(if neg { v.wrapping_neg() } else { v }),
                None => return bad(self),
            },
            Tok::F32Bits => match u32::from_str_radix(&t.text[2..], 16) {
                Ok(bits) => Operand::F32(if neg { bits ^ 0x8000_0000 } else { bits }),
                Err(_) => return bad(self),
            },
            Tok::F64Bits => match u64::from_str_radix(&t.text[2..], 16) {
                Ok(bits) => Operand::F64(if neg { bits ^ (1 << 63) } else { bits }),
                Err(_) => return bad(self),
            },
            Tok::DecFloat => match t.text.parse::<f64>() {
                Ok(v) => Operand::Dec(if neg { -v } else { v }),
                Err(_) => return bad(self),
            },
            _ => {
                self.pos -= 1;
                return self.err(format!("expected a literal, found `{}`", t.text));
            }
        };
        Ok(lit)
    }

    /// After `[`: `base`, `base+imm`, `base+-imm`, `base-imm` or `imm`.
    fn address(&mut self) -> PResult<Operand> {
        let mut base = None;
        let mut offset = 0i64;
        if let Some(t) = self.peek()
            && t.tok == Tok::Ident
        {
            self.pos += 1;
            base = Some(t.text.to_string());
            // `[r+4]`, `[r+-4]` or `[r-4]` (the minus is part of the literal).
            let plus = self.eat(Tok::Plus);
            if plus || self.peek_is(Tok::Minus) {
                offset = self.signed_offset()?;
            }
        } else {
            offset = self.signed_offset()?;
        }
        self.expect(Tok::RBracket, "`]`")?;
        Ok(Operand::Addr { base, offset })
    }

    fn signed_offset(&mut self) -> PResult<i64> {
        match self.literal()? {
            Operand::Int(v) => Ok(v as i64),
            _ => self.err("address offsets must be integers"),
        }
    }
}
