//! Decoding a parsed module into [`Kernel`]s, once, at load time: lays out parameters, shared and
//! local memory; resolves (scoped) register names to register-file indices, labels to
//! instruction indices, symbols to addresses, and immediates to constant registers. Opcodes are
//! decoded by `ops`, `unary`, `compare` (arithmetic, logic, comparisons), `control` (`mov`,
//! branches, barriers, warp operations), `mem` (loads, stores, atomics, `cvt`) and `tensor`
//! (`mma`, `ldmatrix`, `cp.async`); `undef` finds the registers a kernel may read before
//! writing.

mod class;
mod compare;
mod control;
mod mem;
mod operands;
mod ops;
mod tensor;
mod unary;
mod undef;

use std::collections::HashMap;

use crate::error::LoadError;
use crate::inst::{Inst, Op, R};
use crate::kernel::{Kernel, ParamInfo, RegCounts};
use crate::lexer::line_text;
use crate::memory::{LOCAL_BASE, PARAM_BASE, SHARED_BASE};
use crate::parser::{EntryAst, InstAst, ModuleAst, Operand, RegName, Stmt, VarDecl};

/// Which register file a register lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum File {
    R32,
    R64,
    Pred,
}

/// A declared register.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegRef {
    pub file: File,
    pub idx: R,
}

/// Per-kernel decoding state shared by the opcode decoders.
pub(crate) struct Ctx {
    scopes: Vec<HashMap<String, RegRef>>,
    counts: RegCounts,
    /// Symbol name → address (shared, local and param windows).
    symbols: HashMap<String, u64>,
    labels: HashMap<String, u32>,
    consts32: HashMap<u32, R>,
    consts64: HashMap<u64, R>,
    const32_list: Vec<(u32, u32)>,
    const64_list: Vec<(u32, u64)>,
}

/// Size in bytes of a PTX type name (`u32` → 4).
pub(crate) fn type_bytes(ty: &str) -> Option<u64> {
    Some(match ty {
        "b8" | "u8" | "s8" | "pred" => 1,
        "b16" | "u16" | "s16" | "f16" | "bf16" => 2,
        "b32" | "u32" | "s32" | "f32" | "f16x2" | "bf16x2" => 4,
        "b64" | "u64" | "s64" | "f64" => 8,
        _ => return None,
    })
}

fn round_up(x: u64, align: u64) -> u64 {
    x.div_ceil(align) * align
}

pub(crate) fn decode_module(m: &ModuleAst, src: &str) -> Result<Vec<Kernel>, LoadError> {
    m.entries.iter().map(|e| decode_entry(m, e, src)).collect()
}

fn entry_error(e: &EntryAst, src: &str, line: u32, message: impl Into<String>) -> LoadError {
    LoadError {
        kernel: Some(e.name.clone()),
        line,
        message: message.into(),
        text: line_text(src, line),
    }
}

fn decode_entry(m: &ModuleAst, e: &EntryAst, src: &str) -> Result<Kernel, LoadError> {
    let err = |line: u32, msg: String| entry_error(e, src, line, msg);
    let mut ctx = Ctx {
        scopes: vec![HashMap::new()],
        counts: RegCounts::default(),
        symbols: HashMap::new(),
        labels: HashMap::new(),
        consts32: HashMap::new(),
        consts64: HashMap::new(),
        const32_list: Vec::new(),
        const64_list: Vec::new(),
    };

    // Parameters, packed with natural (or declared) alignment as cuLaunchKernel does.
    let mut params = Vec::new();
    let mut offset = 0u64;
    let mut param_align = 1u64;
    for p in &e.params {
        let Some(elem) = type_bytes(&p.ty) else {
            return Err(err(p.line, format!("unsupported parameter type .{}", p.ty)));
        };
        let size = elem * p.count.unwrap_or(1);
        let align = p.align.map_or(elem, u64::from).max(1);
        if !align.is_power_of_two() {
            return Err(err(
                p.line,
                format!("alignment {align} is not a power of two"),
            ));
        }
        offset = round_up(offset, align);
        ctx.symbols.insert(p.name.clone(), PARAM_BASE + offset);
        params.push(ParamInfo {
            name: p.name.clone(),
            offset: offset as usize,
            size: size as usize,
            align: align as usize,
        });
        offset += size;
        param_align = param_align.max(align);
    }
    let param_bytes = round_up(offset, param_align) as usize;
    if param_bytes > 32764 {
        return Err(err(
            e.line,
            format!("{param_bytes} bytes of parameters exceed 32764"),
        ));
    }

    // Shared memory: module-scope variables this entry references, then its own; the dynamic
    // (`.extern`) array goes last.
    let referenced = referenced_names(e);
    let mut shared_off = 0u64;
    let mut dynamic = None;
    let mut local_off = 0u64;
    let mut place =
        |v: &VarDecl, shared_off: &mut u64, local_off: &mut u64| -> Result<(), LoadError> {
            let Some(elem) = type_bytes(&v.ty) else {
                return Err(err(v.line, format!("unsupported variable type .{}", v.ty)));
            };
            let align = v.align.map_or(elem, u64::from).max(1);
            if !align.is_power_of_two() {
                return Err(err(
                    v.line,
                    format!("alignment {align} is not a power of two"),
                ));
            }
            let Some(count) = v.count else {
                dynamic = Some((v.name.clone(), align.max(16)));
                return Ok(());
            };
            let (cursor, base) = if v.space == ".shared" {
                (shared_off, SHARED_BASE)
            } else {
                (local_off, LOCAL_BASE)
            };
            let start = round_up(*cursor, align);
            ctx.symbols.insert(v.name.clone(), base + start);
            *cursor = start + elem * count;
            Ok(())
        };
    for v in &m.shared {
        if referenced.contains(v.name.as_str()) {
            place(v, &mut shared_off, &mut local_off)?;
        }
    }
    for s in &e.body {
        if let Stmt::Var(v) = s {
            place(v, &mut shared_off, &mut local_off)?;
        }
    }
    let uses_dynamic_shared = dynamic.is_some();
    if let Some((name, align)) = dynamic {
        shared_off = round_up(shared_off, align);
        ctx.symbols.insert(name, SHARED_BASE + shared_off);
    }
    if shared_off > crate::memory::SHARED_WINDOW {
        return Err(err(
            e.line,
            format!("{shared_off} bytes of shared memory are too many"),
        ));
    }
    if local_off > crate::memory::LOCAL_WINDOW {
        return Err(err(
            e.line,
            format!("{local_off} bytes of local memory are too many"),
        ));
    }

    // Labels → instruction indices.
    let mut pc = 0u32;
    for s in &e.body {
        match s {
            Stmt::Label { name, line } if ctx.labels.insert(name.clone(), pc).is_some() => {
                return Err(err(*line, format!("label {name} defined twice")));
            }
            Stmt::Inst(_) => pc += 1,
            _ => {}
        }
    }

    // Declarations and instructions, in order (registers are scoped by `{ }`).
    let mut code = Vec::new();
    let mut lines = Vec::new();
    for s in &e.body {
        match s {
            Stmt::Reg { ty, names, line } => {
                ctx.declare(ty, names).map_err(|msg| err(*line, msg))?
            }
            Stmt::Open => ctx.scopes.push(HashMap::new()),
            Stmt::Close => {
                ctx.scopes.pop();
            }
            Stmt::Inst(inst) => {
                let decoded = decode_inst(&mut ctx, inst).map_err(|msg| err(inst.line, msg))?;
                code.push(decoded);
                lines.push(inst.line);
            }
            Stmt::Var(_) | Stmt::Label { .. } => {}
        }
    }
    // Falling off the end of the body exits.
    code.push(Inst {
        guard: None,
        op: Op::Exit,
    });
    lines.push(lines.last().copied().unwrap_or(e.line));

    let dims = |d: &Option<Vec<u32>>, what: &str| -> Result<Option<[u32; 3]>, LoadError> {
        match d {
            None => Ok(None),
            Some(v) if (1..=3).contains(&v.len()) => {
                let mut out = [1u32; 3];
                out[..v.len()].copy_from_slice(v);
                Ok(Some(out))
            }
            Some(_) => Err(err(e.line, format!("{what} takes one to three dimensions"))),
        }
    };
    let undefined = undef::maybe_undefined(&code, ctx.counts, &ctx.const32_list, &ctx.const64_list);
    Ok(Kernel {
        zero32: undefined.r32,
        zero64: undefined.r64,
        zero_pred: undefined.pred,
        name: e.name.clone(),
        params,
        param_bytes,
        code,
        lines,
        regs: ctx.counts,
        consts32: ctx.const32_list,
        consts64: ctx.const64_list,
        static_shared: shared_off as usize,
        uses_dynamic_shared,
        local_bytes: round_up(local_off, 8) as usize,
        maxntid: dims(&e.maxntid, ".maxntid")?,
        reqntid: dims(&e.reqntid, ".reqntid")?,
    })
}

/// Every name used as an operand or address base in the entry (to find referenced symbols).
fn referenced_names(e: &EntryAst) -> std::collections::HashSet<&str> {
    fn walk<'a>(op: &'a Operand, out: &mut std::collections::HashSet<&'a str>) {
        match op {
            Operand::Name(n) => {
                out.insert(n.as_str());
            }
            Operand::Addr { base: Some(n), .. } => {
                out.insert(n.as_str());
            }
            Operand::Vector(v) => v.iter().for_each(|o| walk(o, out)),
            Operand::Pair(a, b) => {
                walk(a, out);
                walk(b, out);
            }
            Operand::Not(a) => walk(a, out),
            _ => {}
        }
    }
    let mut out = std::collections::HashSet::new();
    for s in &e.body {
        if let Stmt::Inst(i) = s {
            i.operands.iter().for_each(|o| walk(o, &mut out));
        }
    }
    out
}

fn decode_inst(ctx: &mut Ctx, inst: &InstAst) -> Result<Inst, String> {
    let guard = match &inst.guard {
        None => None,
        Some((name, neg)) => Some((ctx.pred_reg(name)?, *neg)),
    };
    if !crate::inst::OPCODES.contains(&inst.opcode.as_str()) {
        return Err(format!("unsupported instruction `{}`", inst.opcode));
    }
    let op = match inst.opcode.as_str() {
        "ld" | "ldu" | "st" | "atom" | "red" | "cvt" | "cvta" => mem::decode(ctx, inst)?,
        "cp" | "ldmatrix" | "mma" => tensor::decode(ctx, inst)?,
        _ => ops::decode(ctx, inst)?,
    };
    Ok(Inst { guard, op })
}

impl Ctx {
    fn declare(&mut self, ty: &str, names: &[RegName]) -> Result<(), String> {
        // 8- and 16-bit registers live in the 32-bit file, zero- or sign-extended.
        let file = match ty {
            "pred" => File::Pred,
            "b8" | "u8" | "s8" | "b16" | "u16" | "s16" | "f16" | "bf16" => File::R32,
            "b32" | "u32" | "s32" | "f32" | "f16x2" | "bf16x2" => File::R32,
            "b64" | "u64" | "s64" | "f64" => File::R64,
            other => return Err(format!("unsupported register type .{other}")),
        };
        for n in names {
            match n {
                RegName::Single(name) => self.add_reg(name.clone(), file),
                RegName::Range(prefix, count) => {
                    for i in 0..*count {
                        self.add_reg(format!("{prefix}{i}"), file);
                    }
                }
            }
        }
        Ok(())
    }

    fn add_reg(&mut self, name: String, file: File) {
        let counter = match file {
            File::R32 => &mut self.counts.r32,
            File::R64 => &mut self.counts.r64,
            File::Pred => &mut self.counts.pred,
        };
        let idx = *counter as R;
        *counter += 1;
        // The scope stack always holds the kernel scope: Close never pops it (`body` balances braces).
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name, RegRef { file, idx });
        }
    }

    /// Looks a register up through the scope stack, innermost first.
    pub(crate) fn reg(&self, name: &str) -> Option<RegRef> {
        self.scopes.iter().rev().find_map(|s| s.get(name).copied())
    }

    pub(crate) fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols.get(name).copied()
    }

    pub(crate) fn label(&self, name: &str) -> Option<u32> {
        self.labels.get(name).copied()
    }

    pub(crate) fn pred_reg(&self, name: &str) -> Result<R, String> {
        match self.reg(name) {
            Some(r) if r.file == File::Pred => Ok(r.idx),
            Some(_) => Err(format!("{name} is not a predicate register")),
            None => Err(format!("undeclared register {name}")),
        }
    }

    /// A constant register in the 32-bit file holding `value` in every lane.
    pub(crate) fn const32(&mut self, value: u32) -> R {
        if let Some(&r) = self.consts32.get(&value) {
            return r;
        }
        let r = self.counts.r32 as R;
        self.counts.r32 += 1;
        self.consts32.insert(value, r);
        self.const32_list.push((r, value));
        r
    }

    /// A constant register in the 64-bit file holding `value` in every lane.
    pub(crate) fn const64(&mut self, value: u64) -> R {
        if let Some(&r) = self.consts64.get(&value) {
            return r;
        }
        let r = self.counts.r64 as R;
        self.counts.r64 += 1;
        self.consts64.insert(value, r);
        self.const64_list.push((r, value));
        r
    }
}
