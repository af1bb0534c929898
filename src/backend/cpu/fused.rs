//! The CPU engine for fused elementwise expressions.
//!
//! A [`FusedExpr`] is evaluated on chunks of `CHUNK` points: every SSA value is a register of
//! `CHUNK` lanes, and every instruction is one tight loop over a chunk (which the compiler
//! vectorises) — no per-element dispatch. Loads use the view's [`Access`] pattern. Values are
//! computed in four register classes: `f32` (also for f16/bf16, rounded on store), `f64`,
//! `i64` (every integer type) and `bool`.

use super::access::{Access, coalesce};
use super::kernels::round::to_bf16_bits;
use super::kernels::simd::vectorized;
use super::memory::{Lanes, RawBuf};
use crate::ir::rng;
use crate::lower::{ExprId, ExprOp, FusedExpr};
use crate::tensor::DType;

mod column_sums;
mod lane_ops;
mod plan;
mod registers;
#[cfg(test)]
mod tests;

pub(super) use column_sums::add_column_sums;
use lane_ops::{
    affine, binary, c_slice, cast, fill_const, round_bf16, select, select_compared, unary,
};
use plan::{AffineChain, Role};
use registers::{IDENTITIES, REGISTERS, Regs};

/// Points per chunk. (512 measured, 2026-11-28: the fused engine's own bench 19–22% faster,
/// but the fp32 ResNet-20 step 4% slower — its Winograd kernels share L1 with the register
/// file — and the bf16 step 2–3% faster; 256 kept.)
pub const CHUNK: usize = 256;

/// How far ahead (in points) the chunk loops prefetch their contiguous operands. Chunks of cold
/// operands otherwise arrive one short burst at a time, each waiting on memory: on ResNet-20 the
/// loads were ~7% of the training step (its epilogues read 2–3 full-size tensors each); two
/// chunks ahead, the backward-input convolution with batch norm's backward epilogue
/// (128×32×32×16) went from ~6.0 to ~5.3 ms, and the step gained ~10% (see the commit).
const PREFETCH_AHEAD: usize = 2 * CHUNK;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    F32,
    F64,
    I64,
    Bool,
}

fn class(d: DType) -> Class {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => Class::F32,
        DType::F64 => Class::F64,
        DType::I32 | DType::I64 | DType::U8 => Class::I64,
        DType::Bool => Class::Bool,
    }
}

/// A fused expression prepared for one kernel: classes, register slots and operand accesses.
#[derive(Clone, Debug)]
pub struct FusedProgram {
    expr: FusedExpr,
    classes: Vec<Class>,
    slots: Vec<usize>,
    counts: [usize; 4],
    accesses: Vec<Access>,
    /// The uncoalesced iteration shape (for `Index`).
    shape: Vec<usize>,
    /// Values whose lanes are the same in every chunk (computed once per run): constants,
    /// scalar operands, per-channel operands whose period divides `CHUNK`, and ops of those.
    invariant: Vec<bool>,
    /// The periods the invariant loads rely on: a run may hoist only from a start they divide.
    invariant_periods: Vec<usize>,
    /// The first `Load(0)` of `f32` (as an epilogue: the kernel's own value, unchanged).
    raw_load: Option<u32>,
    /// How each instruction is evaluated ([`plan`]).
    roles: Vec<Role>,
    /// The instructions that take a pass (not aliases or absorbed steps), in order.
    evaluated: Vec<usize>,
    /// Those of them that are not invariant: what each chunk runs after hoisting.
    varying: Vec<usize>,
    /// The fused instruction computing the one output, last of all, which
    /// [`FusedProgram::run_into`] lets write straight into its destination (a prologue's
    /// batch norm + ReLU: no copy out of a register).
    direct: Option<usize>,
    /// Loads that a fused instruction reads from the operand's memory instead of a register
    /// (see [`FusedProgram::streams`]).
    streamed: Vec<Streamed>,
}

impl FusedProgram {
    /// Prepares `expr` over `shape` with operand views `(offset, strides)`.
    pub fn new(expr: &FusedExpr, shape: &[usize], views: &[(usize, &[usize])]) -> FusedProgram {
        FusedProgram::build(expr, shape, views, expr.outputs.len())
    }

    /// Prepares `expr` as an epilogue whose outputs from `stored` on are column sums, run with
    /// [`FusedProgram::run_epilogue`] only: products that only those sums read are never
    /// stored, but multiplied as they are summed.
    pub fn new_epilogue(
        expr: &FusedExpr,
        shape: &[usize],
        views: &[(usize, &[usize])],
        stored: usize,
    ) -> FusedProgram {
        FusedProgram::build(expr, shape, views, stored)
    }

    fn build(
        expr: &FusedExpr,
        shape: &[usize],
        views: &[(usize, &[usize])],
        summed: usize,
    ) -> FusedProgram {
        let strides: Vec<&[usize]> = views.iter().map(|(_, s)| *s).collect();
        let (cshape, cstrides) = coalesce(shape, &strides);
        let accesses: Vec<Access> = views
            .iter()
            .zip(&cstrides)
            .map(|((off, _), s)| Access::classify(*off, &cshape, s))
            .collect();
        let classes: Vec<Class> = expr.ops.iter().map(|(_, dt)| class(*dt)).collect();
        let mut invariant = Vec::with_capacity(expr.ops.len());
        let mut invariant_periods = Vec::new();
        for (op, _) in &expr.ops {
            let inv = |id: &u32| invariant.get(*id as usize).copied().unwrap_or(false);
            let v = match op {
                ExprOp::Load(k) => match &accesses[usize::from(*k)] {
                    Access::Scalar { .. } => true,
                    &Access::Periodic { period, .. } if CHUNK.is_multiple_of(period) => {
                        invariant_periods.push(period);
                        true
                    }
                    _ => false,
                },
                ExprOp::Const(_) => true,
                ExprOp::Index(_) | ExprOp::Random { .. } => false,
                _ => op.operands().all(|a| inv(&a)),
            };
            invariant.push(v);
        }
        let contiguous_load = |v: ExprId| {
            matches!(expr.ops[v as usize], (ExprOp::Load(k), _)
                if matches!(accesses[usize::from(k)], Access::Contiguous { .. })
                    && classes[v as usize] == Class::F32)
        };
        let (roles, readers) = plan::plan(
            expr,
            |v| classes[v as usize] == Class::F32,
            |v| invariant[v as usize],
            contiguous_load,
            summed,
        );
        // A load of a contiguous operand that one fused instruction alone reads is read
        // straight from the operand's memory: by a chain where it is stored in f32 or bf16,
        // by a select on a comparison where it is stored in f32.
        let mut streamed = vec![Streamed::No; expr.ops.len()];
        let mut stream = |v: ExprId, how: Streamed| {
            if contiguous_load(v) && readers[v as usize] == 1 {
                streamed[v as usize] = how;
            }
        };
        for (role, (op, dt)) in roles.iter().zip(&expr.ops) {
            match (role, op) {
                (Role::Chain(AffineChain { x, .. }), _) => stream(*x, Streamed::Widened),
                // The round of an f32 value to bf16 (an output kept in bf16).
                (Role::Eval, ExprOp::Cast(a)) if *dt == DType::BF16 => stream(*a, Streamed::F32),
                (Role::SelectCompared(_, p, q), ExprOp::Select(_, a, b)) => {
                    for v in [p, q, a, b] {
                        stream(*v, Streamed::F32);
                    }
                }
                _ => {}
            }
        }
        // Registers: the `f32` ones after the identities; an alias shares its operand's, an
        // absorbed step needs none.
        let mut counts = [0usize; 4];
        let mut slots = Vec::with_capacity(expr.ops.len());
        for (i, c) in classes.iter().enumerate() {
            let k = *c as usize;
            let slot = match roles[i] {
                Role::Alias(a) => slots[a as usize],
                ref role if role.takes_pass() => {
                    counts[k] += 1;
                    counts[k] - 1
                        + if *c == Class::F32 {
                            IDENTITIES.len()
                        } else {
                            0
                        }
                }
                // Absorbed and summed values have no register.
                _ => usize::MAX,
            };
            slots.push(slot);
        }
        let evaluated: Vec<usize> = (0..roles.len())
            .filter(|&i| roles[i].takes_pass())
            .collect();
        let varying = evaluated
            .iter()
            .copied()
            .filter(|&i| !invariant[i])
            .collect();
        let direct = match (expr.outputs.as_slice(), evaluated.last()) {
            ([v], Some(&last)) if *v as usize == last && !matches!(roles[last], Role::Eval) => {
                Some(last)
            }
            _ => None,
        };
        let raw_load = expr
            .ops
            .iter()
            .position(|(op, dt)| *op == ExprOp::Load(0) && class(*dt) == Class::F32)
            .map(|i| i as u32);
        FusedProgram {
            raw_load,
            expr: expr.clone(),
            classes,
            slots,
            counts,
            accesses,
            shape: shape.to_vec(),
            evaluated,
            varying,
            direct,
            streamed,
            invariant,
            invariant_periods,
            roles,
        }
    }

    /// Prefetches what the contiguous operands from `first` on read at flat positions
    /// `start..start + n`.
    #[inline]
    fn prefetch(&self, inputs: &[RawBuf], first: usize, start: usize, n: usize) {
        for (access, input) in self.accesses.iter().zip(inputs).skip(first) {
            if let Access::Contiguous { offset } = access {
                input.prefetch(offset + start, n);
            }
        }
    }

    /// The access pattern of operand `i`.
    pub fn access(&self, i: usize) -> &Access {
        &self.accesses[i]
    }

    /// Number of operands.
    pub fn operands(&self) -> usize {
        self.accesses.len()
    }

    /// Runs `f` with this thread's register file, sized for this program.
    fn with_regs<R>(&self, f: impl FnOnce(&mut Regs, &mut [usize]) -> R) -> R {
        REGISTERS.with(|cell| match cell.try_borrow_mut() {
            Ok(mut regs) => {
                regs.ensure(&self.counts);
                let mut idx = std::mem::take(&mut regs.idx);
                let out = f(&mut regs, &mut idx);
                regs.idx = idx;
                out
            }
            // Only reachable if a kernel ran inside another on this thread: use a fresh file.
            Err(_) => {
                let mut regs = Regs::default();
                regs.ensure(&self.counts);
                let mut idx = std::mem::take(&mut regs.idx);
                f(&mut regs, &mut idx)
            }
        })
    }

    /// Evaluates points `start..end`, reading `inputs` and writing `outputs` (contiguous over the
    /// iteration space, written at the same flat positions).
    ///
    /// # Safety
    /// Every operand access must stay inside its buffer for these points (checked by the caller
    /// with [`Access::extent`]), outputs must hold `end` elements, and no other thread may write
    /// the output positions `start..end` concurrently.
    pub unsafe fn run(&self, start: usize, end: usize, inputs: &[RawBuf], outputs: &[RawBuf]) {
        // SAFETY: forwarded from the caller's contract.
        self.with_regs(|regs, idx| unsafe { self.run_with(regs, idx, start, end, inputs, outputs) })
    }

    #[allow(clippy::too_many_arguments)] // the register file, scratch, the range and operands.
    unsafe fn run_with(
        &self,
        regs: &mut Regs,
        idx: &mut [usize],
        start: usize,
        end: usize,
        inputs: &[RawBuf],
        outputs: &[RawBuf],
    ) {
        // SAFETY: forwarded from the caller's contract.
        unsafe {
            self.chunk_loop(
                regs,
                idx,
                (start, end),
                inputs,
                Around::default(),
                |regs, s, n, _| {
                    // The outputs' lines too: an output that is not written in place (an f32
                    // gradient of bf16 operands) is otherwise fetched one store miss at a time
                    // (ResNet-20 bf16: the elementwise kernels 10.5 -> 9.9 ms a step).
                    let ahead = s + PREFETCH_AHEAD;
                    for out in outputs {
                        out.prefetch(ahead, n.min(end.saturating_sub(ahead)));
                    }
                    for (o, &v) in self.expr.outputs.iter().enumerate() {
                        // SAFETY: outputs hold `end` elements; this range is this call's own.
                        self.store(regs, v, &outputs[o], s, n);
                    }
                },
            )
        }
    }

    /// The one chunk loop of every entry point: computes the hoisted invariants, then for each
    /// chunk of `start..end` prefetches the contiguous operands `PREFETCH_AHEAD` points ahead,
    /// evaluates the expression, and hands the chunk to `each(regs, chunk_start, n, rows)`.
    /// With `rows` (an epilogue: operand 0 is the producing kernel's result for `start..end`),
    /// each chunk reads its rows as operand 0 and `each` gets them to write back into. With
    /// `direct` (`end - start` values), the instruction [`FusedProgram::direct`] names writes
    /// its lanes there instead of into its register.
    ///
    /// # Safety
    /// As [`FusedProgram::run`] for the inputs; `rows`, when given, holds `end - start` values.
    unsafe fn chunk_loop(
        &self,
        regs: &mut Regs,
        idx: &mut [usize],
        (start, end): (usize, usize),
        inputs: &[RawBuf],
        Around {
            mut rows,
            mut direct,
        }: Around<'_>,
        mut each: impl FnMut(&mut Regs, usize, usize, Option<&mut [f32]>),
    ) {
        assert!(
            rows.is_some() || !self.roles.iter().any(|r| matches!(r, Role::Summed(..))),
            "a program prepared with new_epilogue runs with run_epilogue"
        );
        // An epilogue's operand 0 is its rows: contiguous (so never hoisted) and already in
        // cache (so not prefetched).
        let first_prefetched = usize::from(rows.is_some());
        // SAFETY: forwarded from the caller's contract.
        let hoisted = unsafe { self.hoist(regs, idx, start, end, inputs, None) };
        self.prefetch(
            inputs,
            first_prefetched,
            start,
            PREFETCH_AHEAD.min(end - start),
        );
        let mut s = start;
        while s < end {
            let n = (end - s).min(CHUNK);
            let ahead = (end - s).saturating_sub(PREFETCH_AHEAD).min(n);
            self.prefetch(inputs, first_prefetched, s + PREFETCH_AHEAD, ahead);
            let at = s - start..s - start + n;
            let local = rows.as_deref().map(|r| &r[at.clone()]);
            let to = direct.as_deref_mut().map(|d| &mut d[at.clone()]);
            // SAFETY: forwarded from the caller's contract.
            unsafe { self.chunk(regs, &mut idx[..n], s, n, inputs, local, to, hoisted) };
            each(regs, s, n, rows.as_deref_mut().map(|r| &mut r[at]));
            s += n;
        }
    }

    /// Evaluates points `start..start + out.len()` into `out`, from the expression's one output
    /// (of class `f32`: [`FusedProgram::single_f32_output`]). A convolution's prologue computes
    /// its input image by image with it.
    ///
    /// # Safety
    /// As [`FusedProgram::run`] for the inputs.
    pub unsafe fn run_into(&self, start: usize, inputs: &[RawBuf], out: &mut [f32]) {
        let Some(&v) = self.expr.outputs.first() else {
            return;
        };
        let lanes = self.slots[v as usize] * CHUNK;
        let end = start + out.len();
        if self.direct.is_some() {
            // The output's instruction writes straight into `out`.
            // SAFETY: forwarded from the caller's contract.
            return self.with_regs(|regs, idx| unsafe {
                self.chunk_loop(
                    regs,
                    idx,
                    (start, end),
                    inputs,
                    Around {
                        rows: None,
                        direct: Some(out),
                    },
                    |_, _, _, _| {},
                )
            });
        }
        // SAFETY: forwarded from the caller's contract.
        self.with_regs(|regs, idx| unsafe {
            self.chunk_loop(
                regs,
                idx,
                (start, end),
                inputs,
                Around::default(),
                |regs, s, n, _| {
                    out[s - start..s - start + n].copy_from_slice(&regs.f32[lanes..lanes + n]);
                },
            )
        })
    }

    /// Whether the expression has exactly one output, of class `f32` (what
    /// [`FusedProgram::run_into`] needs).
    pub fn single_f32_output(&self) -> bool {
        matches!(self.expr.outputs.as_slice(), [v] if self.classes[*v as usize] == Class::F32)
    }

    /// Evaluates points `start..end` chunk by chunk and hands each chunk's outputs (as `f32`
    /// lanes; other classes are converted) to `sink(chunk_start, lanes)`.
    ///
    /// # Safety
    /// As [`FusedProgram::run`] for the inputs.
    pub unsafe fn for_each_chunk(
        &self,
        start: usize,
        end: usize,
        inputs: &[RawBuf],
        mut sink: impl FnMut(usize, &[&[f32]]),
    ) {
        // SAFETY: forwarded from the caller's contract.
        self.with_regs(|regs, idx| unsafe {
            self.for_each_chunk_with(regs, idx, start, end, inputs, &mut sink)
        })
    }

    #[allow(clippy::too_many_arguments)] // the register file, scratch, the range and the sink.
    unsafe fn for_each_chunk_with(
        &self,
        regs: &mut Regs,
        idx: &mut [usize],
        start: usize,
        end: usize,
        inputs: &[RawBuf],
        sink: &mut impl FnMut(usize, &[&[f32]]),
    ) {
        let mut converted: Vec<Vec<f32>> = vec![Vec::new(); self.expr.outputs.len()];
        // SAFETY: forwarded from the caller's contract.
        unsafe {
            self.chunk_loop(
                regs,
                idx,
                (start, end),
                inputs,
                Around::default(),
                |regs, s, n, _| {
                    for (o, &v) in self.expr.outputs.iter().enumerate() {
                        let lanes = self.slots[v as usize] * CHUNK;
                        let c = &mut converted[o];
                        c.clear();
                        match self.classes[v as usize] {
                            Class::F32 => {}
                            Class::F64 => {
                                c.extend(regs.f64[lanes..lanes + n].iter().map(|&x| x as f32))
                            }
                            Class::I64 => {
                                c.extend(regs.i64[lanes..lanes + n].iter().map(|&x| x as f32))
                            }
                            Class::Bool => c.extend(
                                regs.bool[lanes..lanes + n]
                                    .iter()
                                    .map(|&x| f32::from(u8::from(x))),
                            ),
                        }
                    }
                    let views: Vec<&[f32]> = self
                        .expr
                        .outputs
                        .iter()
                        .zip(&converted)
                        .map(|(&v, c)| {
                            let lanes = self.slots[v as usize] * CHUNK;
                            match self.classes[v as usize] {
                                Class::F32 => &regs.f32[lanes..lanes + n],
                                _ => c.as_slice(),
                            }
                        })
                        .collect();
                    sink(s, &views);
                },
            )
        }
    }

    /// Runs as an epilogue on `rows` (the producing kernel's result for flat positions
    /// `first..first + rows.len()`, read as operand 0): output 0 is written back into `rows`,
    /// outputs `1..stored` into `outputs[1..stored]`, and each output `stored + j` is summed per
    /// column (rows are `cols` wide) into `sums[j·cols..(j + 1)·cols]`.
    ///
    /// # Safety
    /// As [`FusedProgram::run`] for operands `1..` and `outputs[1..stored]`.
    #[allow(clippy::too_many_arguments)] // the rows, their operands and the column sums.
    pub unsafe fn run_epilogue(
        &self,
        rows: &mut [f32],
        first: usize,
        inputs: &[RawBuf],
        outputs: &[RawBuf],
        stored: usize,
        cols: usize,
        sums: &mut [f64],
    ) {
        let sink = EpilogueSink {
            outputs,
            stored,
            cols,
            sums,
            bf16: None,
        };
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.epilogue_with_regs(rows, first, inputs, sink) }
    }

    /// [`FusedProgram::run_epilogue`] for an output kept in bf16: output 0 is written into
    /// `bits` (as long as `rows`), rounded to nearest even, instead of back into `rows` (which
    /// are left as any values) — the bits [`to_bf16_bits`] gives of the rows `run_epilogue`
    /// leaves, without the pass that writes them back.
    ///
    /// # Safety
    /// As [`FusedProgram::run_epilogue`].
    #[allow(clippy::too_many_arguments)] // as run_epilogue's, and the bits.
    pub unsafe fn run_epilogue_to_bf16(
        &self,
        rows: &mut [f32],
        first: usize,
        inputs: &[RawBuf],
        outputs: &[RawBuf],
        stored: usize,
        cols: usize,
        sums: &mut [f64],
        bits: &mut [u16],
    ) {
        assert_eq!(bits.len(), rows.len(), "one bf16 value per row value");
        let sink = EpilogueSink {
            outputs,
            stored,
            cols,
            sums,
            bf16: Some(bits),
        };
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.epilogue_with_regs(rows, first, inputs, sink) }
    }

    /// The two epilogue entry points on this thread's register file.
    ///
    /// # Safety
    /// As [`FusedProgram::run_epilogue`].
    unsafe fn epilogue_with_regs(
        &self,
        rows: &mut [f32],
        first: usize,
        inputs: &[RawBuf],
        sink: EpilogueSink<'_>,
    ) {
        // SAFETY: forwarded from the caller's contract.
        self.with_regs(|regs, idx| unsafe {
            self.run_epilogue_with(regs, idx, rows, first, inputs, sink)
        })
    }

    #[allow(clippy::too_many_arguments)] // the register file, scratch, the rows and operands.
    unsafe fn run_epilogue_with(
        &self,
        regs: &mut Regs,
        idx: &mut [usize],
        rows: &mut [f32],
        first: usize,
        inputs: &[RawBuf],
        sink: EpilogueSink<'_>,
    ) {
        let EpilogueSink {
            outputs,
            stored,
            cols,
            sums,
            mut bf16,
        } = sink;
        // Per-column partial sums of one chunk, in f32 (a chunk adds at most CHUNK / cols
        // values to a column), flushed into the f64 sums after each chunk.
        let mut part = vec![0.0f32; cols * self.expr.outputs.len().saturating_sub(stored)];
        let end = first + rows.len();
        // SAFETY: forwarded from the caller's contract.
        unsafe {
            self.chunk_loop(
                regs,
                idx,
                (first, end),
                inputs,
                Around {
                    rows: Some(rows),
                    direct: None,
                },
                |regs, s, n, rows| {
                    if stored < self.expr.outputs.len() {
                        self.fold_reductions(regs, stored, s, n, &mut part, sums);
                    }
                    let Some(rows) = rows else { return };
                    for (o, &v) in self.expr.outputs.iter().enumerate().take(stored) {
                        let lanes = self.slots[v as usize] * CHUNK;
                        if let (0, Some(bits)) = (o, bf16.as_deref_mut()) {
                            let bits = &mut bits[s - first..s - first + n];
                            // What `run_epilogue` leaves in the rows, rounded from there.
                            let values = match self.classes[v as usize] {
                                _ if Some(v) == self.raw_load => &*rows,
                                Class::F32 => &regs.f32[lanes..lanes + n],
                                Class::F64 => {
                                    for (d, x) in rows.iter_mut().zip(&regs.f64[lanes..lanes + n]) {
                                        *d = *x as f32;
                                    }
                                    &*rows
                                }
                                // Not written back: the rows as the kernel left them.
                                Class::I64 | Class::Bool => &*rows,
                            };
                            to_bf16_bits(values, bits);
                            continue;
                        }
                        if o == 0 && Some(v) == self.raw_load {
                            // The epilogue leaves the kernel's value as it is.
                            continue;
                        }
                        if o == 0 {
                            match self.classes[v as usize] {
                                Class::F32 => rows.copy_from_slice(&regs.f32[lanes..lanes + n]),
                                Class::F64 => {
                                    for (d, x) in rows.iter_mut().zip(&regs.f64[lanes..lanes + n]) {
                                        *d = *x as f32;
                                    }
                                }
                                _ => {}
                            }
                        } else {
                            // SAFETY: forwarded from the caller's contract.
                            self.store(regs, v, &outputs[o], s, n);
                        }
                    }
                },
            )
        }
    }

    /// Folds the chunk's reduction outputs (`stored..`) into their columns (see
    /// [`FusedProgram::run_epilogue`]): per-column f32 partials of the chunk, added to `sums`.
    fn fold_reductions(
        &self,
        regs: &Regs,
        stored: usize,
        s: usize,
        n: usize,
        part: &mut [f32],
        sums: &mut [f64],
    ) {
        let reduced = self.expr.outputs.len() - stored;
        let cols = part.len() / reduced.max(1);
        if cols == 0 {
            return;
        }
        vectorized!({
            for (j, &v) in self.expr.outputs[stored..].iter().enumerate() {
                let register = |v: ExprId| {
                    let at = self.slots[v as usize] * CHUNK;
                    &regs.f32[at..at + n]
                };
                // The lanes summed: a register, or two whose product is summed (`Summed`).
                let (lanes, factors) = match self.roles[v as usize] {
                    Role::Summed(x, y) => (register(x), Some(register(y))),
                    _ => (&[][..], None),
                };
                let phase = s % cols;
                let sums = &mut sums[j * cols..(j + 1) * cols];
                if factors.is_some()
                    && phase == 0
                    && n.is_multiple_of(cols)
                    && add_column_sums(lanes, factors, sums)
                {
                    // Narrow whole rows, multiplied as they are summed.
                    continue;
                }
                let converted: Vec<f32>;
                let mut products: [f32; CHUNK];
                let lanes: &[f32] = match (factors, self.classes[v as usize]) {
                    (Some(factors), _) => {
                        // Rows that are not whole or not 16–64 wide: the products, then the
                        // general sums below.
                        products = [0.0; CHUNK];
                        let products = &mut products[..n];
                        for ((p, &x), &y) in products.iter_mut().zip(lanes).zip(factors) {
                            *p = x * y;
                        }
                        products
                    }
                    (None, Class::F32) => register(v),
                    (None, _) => {
                        let at = self.slots[v as usize] * CHUNK;
                        converted = regs.f64[at..at + n].iter().map(|&x| x as f32).collect();
                        &converted
                    }
                };
                let part = &mut part[j * cols..(j + 1) * cols];
                if phase == 0 && n.is_multiple_of(cols) && add_column_sums(lanes, None, sums) {
                    // Narrow whole rows: summed in registers, straight into `sums`.
                    continue;
                }
                if phase == 0 && n.is_multiple_of(cols) {
                    // Whole rows (the common case): no per-column index arithmetic.
                    for row in lanes.chunks_exact(cols) {
                        part.iter_mut().zip(row).for_each(|(p, &x)| *p += x);
                    }
                } else {
                    let (mut at, mut phase) = (0, phase);
                    while at < n {
                        let m = (cols - phase).min(n - at);
                        part[phase..phase + m]
                            .iter_mut()
                            .zip(&lanes[at..at + m])
                            .for_each(|(p, &x)| *p += x);
                        at += m;
                        phase = 0;
                    }
                }
                for (t, p) in sums.iter_mut().zip(part.iter_mut()) {
                    *t += f64::from(*p);
                    *p = 0.0;
                }
            }
        })
    }

    /// Computes the invariant values once, if every chunk of `start..end` will see the same
    /// lanes (the chunks start at multiples of `CHUNK` from `start`, and every invariant period
    /// divides `start`). Returns whether it did.
    unsafe fn hoist(
        &self,
        r: &mut Regs,
        idx: &mut [usize],
        start: usize,
        end: usize,
        inputs: &[RawBuf],
        operand0: Option<&[f32]>,
    ) -> bool {
        let worth = end - start > CHUNK && self.invariant.iter().any(|&v| v);
        if !worth
            || self
                .invariant_periods
                .iter()
                .any(|p| !start.is_multiple_of(*p))
        {
            return false;
        }
        // Evaluate only the invariant instructions, over a full chunk.
        for &i in &self.evaluated {
            let (op, dt) = &self.expr.ops[i];
            if self.invariant[i] {
                // SAFETY: forwarded from the caller; invariant loads stay within one period
                // (or one element) of their offset, which the bounds check covered.
                unsafe {
                    self.instruction(r, idx, i, op, *dt, start, CHUNK, inputs, operand0, None)
                };
            }
        }
        true
    }

    /// Evaluates every instruction on the chunk of `n` points starting at flat position `s`
    /// (skipping the invariant ones when they were hoisted).
    #[allow(clippy::too_many_arguments)] // registers, scratch, the chunk, operands, and modes.
    unsafe fn chunk(
        &self,
        r: &mut Regs,
        idx: &mut [usize],
        s: usize,
        n: usize,
        inputs: &[RawBuf],
        operand0: Option<&[f32]>,
        mut direct: Option<&mut [f32]>,
        hoisted: bool,
    ) {
        // Compiled for the widest vector unit the CPU has: the instruction loops below are
        // inlined here, so they vectorise to AVX-512 (or AVX2) instead of SSE2.
        vectorized!({
            let run = if hoisted {
                &self.varying
            } else {
                &self.evaluated
            };
            for &i in run {
                let (op, dt) = &self.expr.ops[i];
                let to = direct.as_deref_mut().filter(|_| self.direct == Some(i));
                // SAFETY: forwarded from the caller's contract.
                unsafe { self.instruction(r, idx, i, op, *dt, s, n, inputs, operand0, to) };
            }
        })
    }

    /// Evaluates instruction `i` on the chunk of `n` points starting at `s`.
    #[allow(clippy::too_many_arguments)] // the instruction, its chunk and its operands.
    #[inline(always)]
    unsafe fn instruction(
        &self,
        r: &mut Regs,
        idx: &mut [usize],
        i: usize,
        op: &ExprOp,
        dt: DType,
        s: usize,
        n: usize,
        inputs: &[RawBuf],
        operand0: Option<&[f32]>,
        direct: Option<&mut [f32]>,
    ) {
        let idx = &mut idx[..n];
        let dt = &dt;
        // Where a fused instruction writes: its register, or `direct`; it reads registers
        // before its own.
        let out = self.slots[i] * CHUNK;
        fn split(lanes: &mut [f32], out: usize, n: usize) -> (&[f32], &mut [f32]) {
            let (src, dst) = lanes.split_at_mut(out);
            (src, &mut dst[..n])
        }
        match &self.roles[i] {
            Role::Eval => {}
            Role::Alias(_) | Role::Absorbed | Role::Summed(..) => return,
            Role::Chain(chain) => {
                let AffineChain { x, steps, relu } = chain;
                let register = |v: &u32| self.slots[*v as usize] * CHUNK;
                // An absent step reads its identity register (`IDENTITIES`).
                let identity = [0, CHUNK, CHUNK, 2 * CHUNK];
                let steps: [usize; 4] =
                    std::array::from_fn(|j| steps[j].as_ref().map_or(identity[j], register));
                let (src, dst) = match direct {
                    Some(d) => (&r.f32[..out], d),
                    None => split(&mut r.f32, out, n),
                };
                // SAFETY: forwarded from the caller's contract.
                match unsafe { self.stream_of(*x, s, n, inputs, operand0) } {
                    Some(Stream::F32(xs)) => affine(xs, src, steps, *relu, dst),
                    Some(Stream::Bf16(xs)) => affine(xs, src, steps, *relu, dst),
                    None => {
                        let x = register(x);
                        affine(&src[x..x + n], src, steps, *relu, dst)
                    }
                }
                return;
            }
            Role::SelectCompared(cmp, p, q) => {
                let ExprOp::Select(_, a, b) = op else {
                    unreachable!("planned for a select");
                };
                let (src, dst) = match direct {
                    Some(d) => (&r.f32[..out], d),
                    None => split(&mut r.f32, out, n),
                };
                let lanes = [p, q, a, b].map(|v| {
                    // SAFETY: forwarded from the caller's contract.
                    match unsafe { self.stream_of(*v, s, n, inputs, operand0) } {
                        Some(Stream::F32(lanes)) => lanes,
                        _ => {
                            let at = self.slots[*v as usize] * CHUNK;
                            &src[at..at + n]
                        }
                    }
                });
                select_compared(lanes, *cmp, dst);
                return;
            }
        }
        {
            let c = self.classes[i];
            match op {
                ExprOp::Load(k) => {
                    let k = usize::from(*k);
                    if self.streams(i, k, inputs, operand0) {
                        // The fused instruction reading it takes the lanes from the operand.
                        return;
                    }
                    if let (0, Some(local)) = (k, operand0) {
                        r.f32[out..out + n].copy_from_slice(&local[..n]);
                        return;
                    }
                    // SAFETY: the caller checked every index against the buffer.
                    unsafe { inputs[k].load(&self.accesses[k], s, idx, c_slice(r, c, out, n)) };
                }
                ExprOp::Const(x) => fill_const(r, c, out, n, *x, *dt),
                ExprOp::Unary(u, a) => {
                    let a = self.slots[*a as usize] * CHUNK;
                    unary(r, c, *u, a, out, n);
                }
                ExprOp::Binary(b, x, y) => {
                    let ca = self.classes[*x as usize];
                    let (x, y) = (
                        self.slots[*x as usize] * CHUNK,
                        self.slots[*y as usize] * CHUNK,
                    );
                    binary(r, ca, c, *b, x, y, out, n);
                }
                ExprOp::Select(cond, a, b) => {
                    let cs = self.slots[*cond as usize] * CHUNK;
                    let (a, b) = (
                        self.slots[*a as usize] * CHUNK,
                        self.slots[*b as usize] * CHUNK,
                    );
                    select(r, c, cs, a, b, out, n);
                }
                ExprOp::Cast(a) => {
                    // SAFETY: forwarded from the caller's contract.
                    if let Some(Stream::F32(xs)) =
                        unsafe { self.stream_of(*a, s, n, inputs, operand0) }
                    {
                        // Only a round to bf16 reads its operand where it is stored (`build`).
                        round_bf16(xs, &mut r.f32[out..out + n]);
                        return;
                    }
                    let ca = self.classes[*a as usize];
                    let a = self.slots[*a as usize] * CHUNK;
                    cast(r, ca, c, *dt, a, out, n);
                }
                ExprOp::Index(axis) => {
                    let axis = usize::from(*axis);
                    let inner: usize = self.shape[axis + 1..].iter().product();
                    let size = self.shape.get(axis).copied().unwrap_or(1).max(1);
                    for (j, v) in r.i64[out..out + n].iter_mut().enumerate() {
                        *v = (((s + j) / inner.max(1)) % size) as i64;
                    }
                }
                ExprOp::Random { seed, counter } => {
                    let k = usize::from(*counter);
                    self.accesses[k].indices(s, &mut idx[..1]);
                    let mut ctr = [0i64; 1];
                    // SAFETY: the caller checked the counter's index.
                    unsafe { inputs[k].gather(&idx[..1], Lanes::I64(&mut ctr)) };
                    let key = rng::step_key(*seed, ctr[0]);
                    for (j, v) in r.f32[out..out + n].iter_mut().enumerate() {
                        *v = rng::uniform_at(key, (s + j) as u64);
                    }
                }
            }
        }
    }

    /// Whether the load `i` of operand `k` is read where it is stored this run: an epilogue's
    /// rows, or a buffer of `f32` (or bf16, where its reader widens).
    fn streams(&self, i: usize, k: usize, inputs: &[RawBuf], operand0: Option<&[f32]>) -> bool {
        match self.streamed[i] {
            Streamed::No => false,
            how => {
                (k == 0 && operand0.is_some())
                    || inputs[k].dtype == DType::F32
                    || (inputs[k].dtype == DType::BF16 && how == Streamed::Widened)
            }
        }
    }

    /// The lanes of value `v` for points `s..s + n` straight from its operand's memory, if `v`
    /// is a streamed load ([`FusedProgram::streamed`]) of an operand that [`FusedProgram::streams`].
    ///
    /// # Safety
    /// As [`FusedProgram::run`]: the operand holds these points (the bounds check covered them).
    unsafe fn stream_of<'a>(
        &self,
        v: ExprId,
        s: usize,
        n: usize,
        inputs: &'a [RawBuf],
        operand0: Option<&'a [f32]>,
    ) -> Option<Stream<'a>> {
        let ExprOp::Load(k) = self.expr.ops[v as usize].0 else {
            return None;
        };
        let k = usize::from(k);
        if !self.streams(v as usize, k, inputs, operand0) {
            return None;
        }
        if let (0, Some(rows)) = (k, operand0) {
            return Some(Stream::F32(&rows[..n]));
        }
        let Access::Contiguous { offset } = self.accesses[k] else {
            return None;
        };
        let buffer = &inputs[k];
        // SAFETY: the caller's bounds check covered `offset + s + n`; bf16 buffers hold two
        // bytes per element at even offsets of the 64-byte aligned arena.
        Some(unsafe {
            match buffer.dtype {
                DType::BF16 => Stream::Bf16(std::slice::from_raw_parts(
                    buffer.ptr.cast::<u16>().add(offset + s),
                    n,
                )),
                _ => Stream::F32(buffer.f32_slice(offset + s, n)),
            }
        })
    }

    unsafe fn store(&self, r: &Regs, v: u32, out: &RawBuf, s: usize, n: usize) {
        let c = self.classes[v as usize];
        let lanes = self.slots[v as usize] * CHUNK;
        // SAFETY: the caller guarantees `s + n` elements and exclusive access to them.
        unsafe {
            match c {
                Class::F32 => out.scatter_contiguous(s, Lanes::F32Ref(&r.f32[lanes..lanes + n])),
                Class::F64 => out.scatter_contiguous(s, Lanes::F64Ref(&r.f64[lanes..lanes + n])),
                Class::I64 => out.scatter_contiguous(s, Lanes::I64Ref(&r.i64[lanes..lanes + n])),
                Class::Bool => out.scatter_contiguous(s, Lanes::BoolRef(&r.bool[lanes..lanes + n])),
            }
        }
    }
}

/// Whether a load is read where it is stored, and by what (see [`FusedProgram::streams`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Streamed {
    No,
    /// By a chain, which widens bf16 lanes as it reads them.
    Widened,
    /// By a select on a comparison: `f32` storage only.
    F32,
}

/// What the chunk loop reads and writes of the caller's memory besides the operands: an
/// epilogue's `rows` (operand 0, handed to `each` to write back into) and the destination
/// `direct` of the instruction [`FusedProgram::direct`] names.
#[derive(Default)]
struct Around<'a> {
    rows: Option<&'a mut [f32]>,
    direct: Option<&'a mut [f32]>,
}

/// A streamed load's lanes for one chunk, as stored.
enum Stream<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
}

/// Where an epilogue's outputs go: stored outputs, and per-column sums of the others; output
/// 0 into the rows, or rounded into `bf16`.
struct EpilogueSink<'a> {
    outputs: &'a [RawBuf],
    stored: usize,
    cols: usize,
    sums: &'a mut [f64],
    bf16: Option<&'a mut [u16]>,
}
