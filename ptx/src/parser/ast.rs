//! The syntax tree of a PTX module: directives, entries with their parameters and performance
//! directives, and bodies of declarations, labels, scopes and instructions with raw operands.

/// A parsed module.
#[derive(Debug, Default)]
pub struct ModuleAst {
    pub version: Option<String>,
    pub target: Vec<String>,
    pub address_size: Option<u32>,
    /// Module-scope `.shared` variables (including `.extern .shared` dynamic arrays).
    pub shared: Vec<VarDecl>,
    pub entries: Vec<EntryAst>,
}

/// `.shared`/`.local` variable: `.align A .b8 name[N]` (N absent for `.extern` arrays `[]`).
#[derive(Debug, Clone)]
pub struct VarDecl {
    pub space: String,
    pub align: Option<u32>,
    pub ty: String,
    pub name: String,
    /// Total element count (product of all dimensions); `None` for an unsized `[]` array.
    pub count: Option<u64>,
    pub line: u32,
}

/// A kernel parameter `.param [.align A] .type name[N]`.
#[derive(Debug, Clone)]
pub struct ParamDecl {
    pub ty: String,
    pub align: Option<u32>,
    pub name: String,
    pub count: Option<u64>,
    pub line: u32,
}

/// One `.entry`.
#[derive(Debug)]
pub struct EntryAst {
    pub name: String,
    pub line: u32,
    pub params: Vec<ParamDecl>,
    pub maxntid: Option<Vec<u32>>,
    pub reqntid: Option<Vec<u32>>,
    pub body: Vec<Stmt>,
}

/// A register name in a `.reg` declaration.
#[derive(Debug, Clone)]
pub enum RegName {
    Single(String),
    /// `%r<N>` declares `%r0 .. %r{N-1}`.
    Range(String, u32),
}

/// A statement of an entry body.
#[derive(Debug)]
pub enum Stmt {
    Reg {
        ty: String,
        names: Vec<RegName>,
        line: u32,
    },
    Var(VarDecl),
    Label {
        name: String,
        line: u32,
    },
    Open,
    Close,
    Inst(InstAst),
}

/// An instruction: `[@[!]%p] opcode.mod.mod operand, ...;`.
#[derive(Debug, Clone)]
pub struct InstAst {
    pub guard: Option<(String, bool)>,
    pub opcode: String,
    pub mods: Vec<String>,
    pub operands: Vec<Operand>,
    pub line: u32,
}

/// An instruction operand.
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    /// A register, symbol or label name.
    Name(String),
    /// A special register with a component: `%tid.x` is `Special("%tid", "x")`.
    Special(String, String),
    /// An integer literal, as two's-complement bits.
    Int(u64),
    /// `0fXXXXXXXX`.
    F32(u32),
    /// `0dXXXXXXXXXXXXXXXX`.
    F64(u64),
    /// A decimal float literal.
    Dec(f64),
    /// `[base + offset]`, base a register or symbol, or absent (`[imm]`).
    Addr { base: Option<String>, offset: i64 },
    /// `{a, b, c, d}`.
    Vector(Vec<Operand>),
    /// `d|p` (dual destination).
    Pair(Box<Operand>, Box<Operand>),
    /// `!%p` (negated predicate source).
    Not(Box<Operand>),
    /// `_` in a vector.
    Sink,
}

/// Parses a PTX integer literal: decimal, `0x` hex, `0b` binary, `0`-prefixed octal, optional `U`.
pub fn parse_int(text: &str) -> Option<u64> {
    let t = text.strip_suffix('U').unwrap_or(text);
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if let Some(b) = t.strip_prefix("0b").or_else(|| t.strip_prefix("0B")) {
        u64::from_str_radix(b, 2).ok()
    } else if t.len() > 1 && t.starts_with('0') {
        u64::from_str_radix(&t[1..], 8).ok()
    } else {
        t.parse::<u64>().ok()
    }
}
