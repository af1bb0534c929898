//! The logos lexer for PTX text: identifiers (registers `%r1`, labels `$L__BB0_2`, symbols),
//! dotted directive/modifier words (`.reg`, `.f32`), integer and float literals (`0f3F800000`,
//! `0d...`, hex, octal, binary, decimal), strings and punctuation. Comments are skipped.
//! Every token carries its 1-based source line, for error messages.

use logos::Logos;

use crate::error::LoadError;

/// A PTX token. Numbers keep their text; the parser converts them in context.
#[derive(Logos, Debug, Clone, Copy, PartialEq, Eq)]
#[logos(skip r"[ \t\r\n\f]+")]
#[logos(skip(r"//[^\n]*", allow_greedy = true))]
#[logos(skip r"/\*([^*]|\*+[^*/])*\*+/")]
pub enum Tok {
    /// `%r1`, `%tid`, `$L__BB0_2`, `_Z3foo`, `sm_80`, `ld` (opcode roots) ...
    #[regex(r"[A-Za-z_$%][A-Za-z0-9_$]*")]
    Ident,
    /// `.reg`, `.f32`, `.x`, `.v4`, `.2d`, `.L2::128B`, `.shared::cta` ... (with the dot).
    #[regex(r"\.[A-Za-z0-9_][A-Za-z0-9_]*(::[A-Za-z0-9_]+)*")]
    DotWord,
    /// Decimal, hex (`0x..`), octal (`0..`) or binary (`0b..`) integers, optional `U` suffix.
    #[regex(r"[0-9]+U?")]
    #[regex(r"0[xX][0-9a-fA-F]+U?")]
    #[regex(r"0[bB][01]+U?")]
    Int,
    /// `0f` + 8 hex digits: the bits of an f32.
    #[regex(r"0[fF][0-9a-fA-F]{8}")]
    F32Bits,
    /// `0d` + 16 hex digits: the bits of an f64.
    #[regex(r"0[dD][0-9a-fA-F]{16}")]
    F64Bits,
    /// A decimal float such as `8.8` (the `.version` number) or `1.5e3`.
    #[regex(r"[0-9]+\.[0-9]+([eE][+-]?[0-9]+)?")]
    DecFloat,
    #[regex(r#""[^"\n]*""#)]
    Str,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("<")]
    Lt,
    #[token(">")]
    Gt,
    #[token(",")]
    Comma,
    #[token(";")]
    Semi,
    #[token(":")]
    Colon,
    #[token("|")]
    Pipe,
    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("@")]
    At,
    #[token("!")]
    Bang,
    #[token("=")]
    Eq,
}

/// A token with its text and 1-based line.
#[derive(Debug, Clone, Copy)]
pub struct Token<'a> {
    pub tok: Tok,
    pub text: &'a str,
    pub line: u32,
}

/// Lexes a whole PTX module. An unknown character is an error with its line.
pub fn tokenize(src: &str) -> Result<Vec<Token<'_>>, LoadError> {
    let mut out = Vec::new();
    let mut lex = Tok::lexer(src);
    let mut line = 1u32;
    let mut scanned = 0usize;
    while let Some(result) = lex.next() {
        let span = lex.span();
        line += count_newlines(&src[scanned..span.start]);
        scanned = span.start;
        let text = lex.slice();
        match result {
            Ok(tok) => out.push(Token { tok, text, line }),
            Err(()) => {
                return Err(LoadError::syntax(
                    line,
                    format!("unexpected character {text:?}"),
                    line_text(src, line),
                ));
            }
        }
    }
    Ok(out)
}

fn count_newlines(s: &str) -> u32 {
    // A source line count never exceeds u32 for the PTX sizes we accept (checked by the caller).
    s.bytes().filter(|&b| b == b'\n').count() as u32
}

/// The text of 1-based line `line` of `src`, whitespace runs collapsed, for error messages.
pub fn line_text(src: &str, line: u32) -> String {
    let raw = src
        .lines()
        .nth(line.saturating_sub(1) as usize)
        .unwrap_or("");
    raw.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<(Tok, &str)> {
        tokenize(src)
            .unwrap()
            .into_iter()
            .map(|t| (t.tok, t.text))
            .collect()
    }

    #[test]
    fn lexes_instruction_with_modifiers_and_literals() {
        let toks = kinds("@!%p1 fma.rn.f32 %f3, %f1, 0f3F800000, 0dBFF0000000000000; // c\n");
        assert_eq!(
            toks,
            vec![
                (Tok::At, "@"),
                (Tok::Bang, "!"),
                (Tok::Ident, "%p1"),
                (Tok::Ident, "fma"),
                (Tok::DotWord, ".rn"),
                (Tok::DotWord, ".f32"),
                (Tok::Ident, "%f3"),
                (Tok::Comma, ","),
                (Tok::Ident, "%f1"),
                (Tok::Comma, ","),
                (Tok::F32Bits, "0f3F800000"),
                (Tok::Comma, ","),
                (Tok::F64Bits, "0dBFF0000000000000"),
                (Tok::Semi, ";"),
            ]
        );
    }

    #[test]
    fn tracks_lines_across_comments() {
        let toks = tokenize("a /* x\n y */ b\n// z\nc").unwrap();
        let lines: Vec<u32> = toks.iter().map(|t| t.line).collect();
        assert_eq!(lines, vec![1, 2, 4]);
    }

    #[test]
    fn version_number_and_addresses() {
        let toks = kinds(".version 8.8\n[%rd1+-4]");
        assert_eq!(toks[1], (Tok::DecFloat, "8.8"));
        assert_eq!(toks[4], (Tok::Plus, "+"));
        assert_eq!(toks[5], (Tok::Minus, "-"));
        assert_eq!(toks[6], (Tok::Int, "4"));
    }

    #[test]
    fn unknown_character_is_an_error_with_line() {
        let err = tokenize("ret;\n  #bad").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }
}
