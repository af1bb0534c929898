//! A recursive-descent parser from PTX tokens to a syntax tree ([`ast`]): module directives,
//! entries with their parameters and performance directives, and bodies of register/variable
//! declarations, labels, scopes and instructions (see `instruction` for operands). Types and
//! registers are checked later, by `decode`.

mod ast;
mod instruction;

pub use ast::*;

use crate::error::LoadError;
use crate::lexer::{Tok, Token, line_text, tokenize};

/// Parses a PTX module.
pub fn parse(src: &str) -> Result<ModuleAst, LoadError> {
    if src.lines().count() > u32::MAX as usize / 2 {
        return Err(LoadError::syntax(0, "PTX text too large", ""));
    }
    let tokens = tokenize(src)?;
    let mut p = Parser {
        src,
        toks: tokens,
        pos: 0,
    };
    p.module()
}

struct Parser<'a> {
    src: &'a str,
    toks: Vec<Token<'a>>,
    pos: usize,
}

type PResult<T> = Result<T, LoadError>;

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<Token<'a>> {
        self.toks.get(self.pos).copied()
    }

    fn peek_is(&self, tok: Tok) -> bool {
        self.peek().is_some_and(|t| t.tok == tok)
    }

    fn peek_word(&self, word: &str) -> bool {
        self.peek().is_some_and(|t| t.text == word)
    }

    fn line(&self) -> u32 {
        self.peek()
            .or_else(|| self.toks.last().copied())
            .map_or(0, |t| t.line)
    }

    fn err<T>(&self, message: impl Into<String>) -> PResult<T> {
        let line = self.line();
        Err(LoadError::syntax(line, message, line_text(self.src, line)))
    }

    fn next(&mut self) -> PResult<Token<'a>> {
        match self.peek() {
            Some(t) => {
                self.pos += 1;
                Ok(t)
            }
            None => self.err("unexpected end of PTX"),
        }
    }

    fn expect(&mut self, tok: Tok, what: &str) -> PResult<Token<'a>> {
        match self.peek() {
            Some(t) if t.tok == tok => {
                self.pos += 1;
                Ok(t)
            }
            Some(t) => self.err(format!("expected {what}, found `{}`", t.text)),
            None => self.err(format!("expected {what}, found end of PTX")),
        }
    }

    fn eat(&mut self, tok: Tok) -> bool {
        if self.peek_is(tok) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn eat_word(&mut self, word: &str) -> bool {
        if self.peek_word(word) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Skips the rest of the current source line (for `.loc`/`.file` debug directives).
    fn skip_line(&mut self, line: u32) {
        while self.peek().is_some_and(|t| t.line == line) {
            self.pos += 1;
        }
    }

    fn module(&mut self) -> PResult<ModuleAst> {
        let mut m = ModuleAst::default();
        while let Some(t) = self.peek() {
            match t.text {
                ".version" => {
                    self.pos += 1;
                    m.version = Some(self.next()?.text.to_string());
                }
                ".target" => {
                    self.pos += 1;
                    m.target
                        .push(self.expect(Tok::Ident, "a target name")?.text.to_string());
                    while self.eat(Tok::Comma) {
                        m.target
                            .push(self.expect(Tok::Ident, "a target name")?.text.to_string());
                    }
                }
                ".address_size" => {
                    self.pos += 1;
                    let n = self.int_literal()?;
                    if n != 64 {
                        return self.err("only .address_size 64 is supported");
                    }
                    m.address_size = Some(64);
                }
                ".file" | ".loc" => {
                    self.pos += 1;
                    self.skip_line(t.line);
                }
                ".visible" | ".weak" | ".extern" | ".entry" | ".shared" | ".func" | ".global"
                | ".const" => self.module_item(&mut m)?,
                _ => return self.err(format!("unsupported module directive `{}`", t.text)),
            }
        }
        Ok(m)
    }

    fn module_item(&mut self, m: &mut ModuleAst) -> PResult<()> {
        let mut is_extern = false;
        loop {
            if self.eat_word(".visible") || self.eat_word(".weak") {
                continue;
            }
            if self.eat_word(".extern") {
                is_extern = true;
                continue;
            }
            break;
        }
        let t = self.next()?;
        match t.text {
            ".entry" => {
                let entry = self.entry(t.line)?;
                m.entries.push(entry);
                Ok(())
            }
            ".shared" => {
                let decl = self.var_decl(".shared", is_extern, t.line)?;
                m.shared.push(decl);
                Ok(())
            }
            ".func" => {
                self.pos -= 1;
                self.err("device functions (.func) and calls are not supported")
            }
            other => {
                self.pos -= 1;
                self.err(format!(
                    "module-scope `{other}` variables are not supported"
                ))
            }
        }
    }

    fn int_literal(&mut self) -> PResult<u64> {
        let t = self.expect(Tok::Int, "an integer")?;
        match parse_int(t.text) {
            Some(v) => Ok(v),
            None => self.err(format!("bad integer literal `{}`", t.text)),
        }
    }

    fn small_int(&mut self) -> PResult<u32> {
        let v = self.int_literal()?;
        match u32::try_from(v) {
            Ok(v) => Ok(v),
            Err(_) => self.err(format!("integer {v} too large")),
        }
    }

    /// After `.shared`/`.local`: `[.align A] .type name[dims];`.
    fn var_decl(&mut self, space: &str, is_extern: bool, line: u32) -> PResult<VarDecl> {
        let mut align = None;
        if self.eat_word(".align") {
            align = Some(self.small_int()?);
        }
        let ty = self.expect(Tok::DotWord, "a type")?.text[1..].to_string();
        let name = self.expect(Tok::Ident, "a variable name")?.text.to_string();
        let mut count = Some(1u64);
        let mut dims = 0;
        while self.eat(Tok::LBracket) {
            dims += 1;
            if self.eat(Tok::RBracket) {
                count = None;
                continue;
            }
            let n = self.int_literal()?;
            self.expect(Tok::RBracket, "`]`")?;
            count = match count.and_then(|c| c.checked_mul(n)) {
                Some(c) => Some(c),
                None => return self.err("array size overflows"),
            };
        }
        if count.is_none() && (dims != 1 || !is_extern) {
            return self.err("an unsized array must be a one-dimensional `.extern` array");
        }
        if self.peek_is(Tok::Eq) {
            return self.err("variable initialisers are not supported");
        }
        self.expect(Tok::Semi, "`;`")?;
        Ok(VarDecl {
            space: space.to_string(),
            align,
            ty,
            name,
            count,
            line,
        })
    }

    fn entry(&mut self, line: u32) -> PResult<EntryAst> {
        let name = self.expect(Tok::Ident, "a kernel name")?.text.to_string();
        let mut params = Vec::new();
        if self.eat(Tok::LParen) && !self.eat(Tok::RParen) {
            loop {
                params.push(self.param()?);
                if self.eat(Tok::RParen) {
                    break;
                }
                self.expect(Tok::Comma, "`,` or `)`")?;
            }
        }
        let mut entry = EntryAst {
            name,
            line,
            params,
            maxntid: None,
            reqntid: None,
            body: Vec::new(),
        };
        while let Some(t) = self.peek() {
            match t.text {
                ".maxntid" | ".reqntid" => {
                    self.pos += 1;
                    let mut dims = vec![self.small_int()?];
                    while self.eat(Tok::Comma) {
                        dims.push(self.small_int()?);
                    }
                    if t.text == ".maxntid" {
                        entry.maxntid = Some(dims);
                    } else {
                        entry.reqntid = Some(dims);
                    }
                }
                ".minnctapersm" | ".maxnreg" | ".maxnctapersm" => {
                    self.pos += 1;
                    self.small_int()?;
                }
                ".pragma" => {
                    self.pos += 1;
                    self.expect(Tok::Str, "a pragma string")?;
                    self.expect(Tok::Semi, "`;`")?;
                }
                _ => break,
            }
        }
        let named = |mut e: LoadError| {
            e.kernel = Some(entry.name.clone());
            e
        };
        self.expect(Tok::LBrace, "`{` opening the kernel body")
            .map_err(named)?;
        let mut body = Vec::new();
        self.body(&mut body).map_err(named)?;
        entry.body = body;
        Ok(entry)
    }

    fn param(&mut self) -> PResult<ParamDecl> {
        let line = self.line();
        let t = self.expect(Tok::DotWord, "`.param`")?;
        if t.text != ".param" {
            return self.err(format!("expected `.param`, found `{}`", t.text));
        }
        let mut align = None;
        let mut ty = None;
        // Attributes: `.align N`, `.ptr`, `.global`, `.shared`... and exactly one type.
        while let Some(t) = self.peek() {
            if t.tok != Tok::DotWord {
                break;
            }
            self.pos += 1;
            match t.text {
                ".align" => align = Some(self.small_int()?),
                ".ptr" | ".global" | ".shared" | ".local" | ".const" => {}
                other => ty = Some(other[1..].to_string()),
            }
        }
        let Some(ty) = ty else {
            return self.err("parameter without a type");
        };
        let name = self
            .expect(Tok::Ident, "a parameter name")?
            .text
            .to_string();
        let mut count = None;
        if self.eat(Tok::LBracket) {
            count = Some(self.int_literal()?);
            self.expect(Tok::RBracket, "`]`")?;
        }
        Ok(ParamDecl {
            ty,
            align,
            name,
            count,
            line,
        })
    }

    /// Statements until the `}` closing the kernel body (nested `{ }` become Open/Close).
    fn body(&mut self, out: &mut Vec<Stmt>) -> PResult<()> {
        let mut depth = 0usize;
        loop {
            let Some(t) = self.peek() else {
                return self.err("unterminated kernel body");
            };
            match (t.tok, t.text) {
                (Tok::RBrace, _) => {
                    self.pos += 1;
                    if depth == 0 {
                        return Ok(());
                    }
                    depth -= 1;
                    out.push(Stmt::Close);
                }
                (Tok::LBrace, _) => {
                    self.pos += 1;
                    depth += 1;
                    out.push(Stmt::Open);
                }
                (Tok::DotWord, ".reg") => {
                    self.pos += 1;
                    out.push(self.reg_decl(t.line)?);
                }
                (Tok::DotWord, ".shared" | ".local") => {
                    self.pos += 1;
                    out.push(Stmt::Var(self.var_decl(t.text, false, t.line)?));
                }
                (Tok::DotWord, ".pragma") => {
                    self.pos += 1;
                    self.expect(Tok::Str, "a pragma string")?;
                    self.expect(Tok::Semi, "`;`")?;
                }
                (Tok::DotWord, ".loc" | ".file") => {
                    self.pos += 1;
                    self.skip_line(t.line);
                }
                (Tok::DotWord, other) => {
                    return self.err(format!("unsupported directive `{other}` in a kernel body"));
                }
                (Tok::Ident, _)
                    if self
                        .toks
                        .get(self.pos + 1)
                        .is_some_and(|n| n.tok == Tok::Colon) =>
                {
                    self.pos += 2;
                    out.push(Stmt::Label {
                        name: t.text.to_string(),
                        line: t.line,
                    });
                }
                (Tok::Ident | Tok::At, _) => out.push(Stmt::Inst(self.instruction()?)),
                _ => return self.err(format!("unexpected `{}`", t.text)),
            }
        }
    }

    fn reg_decl(&mut self, line: u32) -> PResult<Stmt> {
        let mut ty = None;
        while let Some(t) = self.peek() {
            if t.tok != Tok::DotWord {
                break;
            }
            self.pos += 1;
            if t.text.starts_with(".v") {
                return self.err("vector registers are not supported");
            }
            ty = Some(t.text[1..].to_string());
        }
        let Some(ty) = ty else {
            return self.err("`.reg` without a type");
        };
        let mut names = Vec::new();
        loop {
            let name = self.expect(Tok::Ident, "a register name")?.text.to_string();
            if self.eat(Tok::Lt) {
                let n = self.small_int()?;
                self.expect(Tok::Gt, "`>`")?;
                names.push(RegName::Range(name, n));
            } else {
                names.push(RegName::Single(name));
            }
            if !self.eat(Tok::Comma) {
                break;
            }
        }
        self.expect(Tok::Semi, "`;`")?;
        Ok(Stmt::Reg { ty, names, line })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
.version 8.8
.target sm_80
.address_size 64
.extern .shared .align 16 .b8 dyn[];
.visible .entry k(
	.param .u64 k_param_0,
	.param .align 4 .b8 k_param_1[48]
)
.maxntid 256, 1, 1
{
	.reg .pred 	%p<2>;
	.reg .b16 	%rs<3>;
	.shared .align 4 .b8 tile[16][64];
	ld.param.u64 	%rd1, [k_param_0];
	mov.u32 	%r1, %tid.x;
	@!%p1 bra 	$L__BB0_2;
	{ .reg .f16 low; mov.b32 %f4, {0,%rs2};}
	shfl.sync.down.b32 	%r14|%p3, %r10, %r12, %r11, -1;
	ld.shared.v4.f32 	{%f1, %f2, %f3, %f4}, [%rd5+-16];
$L__BB0_2:
	.pragma "nounroll";
	ret;
}
"#;

    #[test]
    fn parses_a_representative_entry() {
        let m = parse(SMALL).unwrap();
        assert_eq!(m.version.as_deref(), Some("8.8"));
        assert_eq!(m.shared.len(), 1);
        assert_eq!(m.shared[0].count, None);
        let e = &m.entries[0];
        assert_eq!(e.name, "k");
        assert_eq!(e.params[1].count, Some(48));
        assert_eq!(e.params[1].align, Some(4));
        assert_eq!(e.maxntid.as_deref(), Some(&[256, 1, 1][..]));
        let insts: Vec<&InstAst> = e
            .body
            .iter()
            .filter_map(|s| if let Stmt::Inst(i) = s { Some(i) } else { None })
            .collect();
        assert_eq!(
            insts[1].operands[1],
            Operand::Special("%tid".into(), "x".into())
        );
        assert_eq!(insts[2].guard, Some(("%p1".to_string(), true)));
        assert_eq!(
            insts[3].operands[1],
            Operand::Vector(vec![Operand::Int(0), Operand::Name("%rs2".into())])
        );
        assert!(matches!(insts[4].operands[0], Operand::Pair(..)));
        assert_eq!(insts[4].operands[4], Operand::Int(u64::MAX));
        assert_eq!(
            insts[5].operands[1],
            Operand::Addr {
                base: Some("%rd5".into()),
                offset: -16
            }
        );
        let shared = e.body.iter().find_map(|s| match s {
            Stmt::Var(v) => Some(v.count),
            _ => None,
        });
        assert_eq!(shared, Some(Some(1024)));
    }

    #[test]
    fn integer_literal_forms() {
        assert_eq!(parse_int("42"), Some(42));
        assert_eq!(parse_int("0x10"), Some(16));
        assert_eq!(parse_int("010"), Some(8));
        assert_eq!(parse_int("0b101"), Some(5));
        assert_eq!(parse_int("7U"), Some(7));
        assert_eq!(parse_int("0"), Some(0));
    }

    #[test]
    fn device_functions_are_rejected_with_line() {
        let err = parse(".version 8.8\n.func foo()\n{\nret;\n}\n").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.message.contains(".func"), "{err}");
    }
}
