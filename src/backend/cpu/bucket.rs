//! The CPU engine of fused update kernels: the kernels of
//! [`Program::buckets`](crate::lower::Program::buckets), which average every tower's gradient
//! arena and apply the optimizer over a range of variables in one pass.
//!
//! Such a kernel streams several large arrays once and computes little, so its speed is memory
//! bandwidth. The general engine ([`super::fused`]) runs it correctly at about half a plain
//! copy's rate (`benches/data_parallel.rs`); this one covers its usual form — every operand a
//! contiguous `f32` range or an `f32` scalar, `f32` arithmetic only — with SSA registers over
//! chunks of points and software prefetch of every stream ahead of the chunk being computed.
//! Anything else stays with the general engine.

use super::memory::RawBuf;
use crate::ir::{BinaryOp, UnaryOp};
use crate::lower::{ExprOp, FusedExpr};
use crate::tensor::DType;

/// Points per chunk.
const CHUNK: usize = 256;

/// How far ahead of the chunk being computed every stream is prefetched, in points.
const PREFETCH_AHEAD: usize = 512;

/// Floats per cache line.
const LINE: usize = 16;

/// How an operand is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operand {
    /// Element `offset + point`.
    Contiguous { offset: usize },
    /// Element `offset` at every point.
    Scalar { offset: usize },
}

/// One instruction; registers are the expression's value ids.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Instr {
    Load(usize),
    Const(f32),
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
}

/// A fused update kernel prepared for this engine.
#[derive(Clone, Debug)]
pub struct BucketProgram {
    instrs: Vec<Instr>,
    /// Registers whose lanes are the same at every point (scalars, constants, and ops of
    /// them): computed once per run.
    invariant: Vec<bool>,
    operands: Vec<Operand>,
    outputs: Vec<usize>,
}

impl BucketProgram {
    /// Prepares `expr` over the 1-D space of `points` points with operand views
    /// `(offset, strides)` over buffers of `dtypes`, if this engine covers it.
    pub fn new(
        expr: &FusedExpr,
        shape: &[usize],
        views: &[(usize, &[usize])],
        dtypes: &[DType],
    ) -> Option<BucketProgram> {
        if shape.len() != 1 || dtypes.iter().any(|&d| d != DType::F32) {
            return None;
        }
        let operands = views
            .iter()
            .map(|&(offset, strides)| match strides {
                [1] => Some(Operand::Contiguous { offset }),
                [0] => Some(Operand::Scalar { offset }),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        let mut instrs = Vec::with_capacity(expr.ops.len());
        let mut invariant: Vec<bool> = Vec::with_capacity(expr.ops.len());
        for (op, dtype) in &expr.ops {
            if *dtype != DType::F32 {
                return None;
            }
            let inv = |id: &u32| invariant.get(*id as usize).copied().unwrap_or(false);
            let (instr, inv) = match op {
                ExprOp::Load(k) => {
                    let k = usize::from(*k);
                    let scalar = matches!(operands.get(k)?, Operand::Scalar { .. });
                    (Instr::Load(k), scalar)
                }
                ExprOp::Const(x) => (Instr::Const(*x as f32), true),
                ExprOp::Unary(u, a) if supported_unary(*u) => {
                    (Instr::Unary(*u, *a as usize), inv(a))
                }
                ExprOp::Binary(b, x, y) if supported_binary(*b) => (
                    Instr::Binary(*b, *x as usize, *y as usize),
                    inv(x) && inv(y),
                ),
                _ => return None,
            };
            instrs.push(instr);
            invariant.push(inv);
        }
        Some(BucketProgram {
            instrs,
            invariant,
            operands,
            outputs: expr.outputs.iter().map(|&o| o as usize).collect(),
        })
    }

    /// The number of elements operand `k` of a run over `points` points reaches.
    pub fn extent(&self, k: usize, points: usize) -> usize {
        match self.operands[k] {
            Operand::Contiguous { offset } => offset + points,
            Operand::Scalar { offset } => offset + 1,
        }
    }

    /// The number of operands.
    pub fn operands(&self) -> usize {
        self.operands.len()
    }

    /// Evaluates points `start..end`, reading `inputs` and writing `outputs` (contiguous, at
    /// the points' positions).
    ///
    /// # Safety
    /// Every operand's [`extent`](BucketProgram::extent) for `end` points is within its
    /// buffer, outputs hold `end` `f32` elements, inputs are `f32`, and no other thread writes
    /// output positions `start..end` concurrently. An output may be an input read at the same
    /// positions (an update in place): each chunk is read before it is written.
    pub unsafe fn run(&self, start: usize, end: usize, inputs: &[RawBuf], outputs: &[RawBuf]) {
        let mut regs = vec![0f32; self.instrs.len() * CHUNK];
        // Invariant registers: computed once, every lane alike.
        for i in 0..self.instrs.len() {
            if self.invariant[i] {
                // SAFETY: scalar operands were bounds-checked by the caller.
                unsafe { self.execute(i, &mut regs, inputs, 0, CHUNK) };
            }
        }
        let mut s = start;
        while s < end {
            let n = (end - s).min(CHUNK);
            self.prefetch(inputs, s + PREFETCH_AHEAD, end);
            for i in 0..self.instrs.len() {
                if !self.invariant[i] {
                    // SAFETY: forwarded from the caller's contract.
                    unsafe { self.execute(i, &mut regs, inputs, s, n) };
                }
            }
            for (out, &r) in outputs.iter().zip(&self.outputs) {
                // SAFETY: the caller guarantees `end` elements and exclusive positions.
                let dst = unsafe { out.f32_slice_mut(s, n) };
                dst.copy_from_slice(&regs[r * CHUNK..r * CHUNK + n]);
            }
            s += n;
        }
    }

    /// Asks the cache for the chunk at `at` of every contiguous operand (nothing past `end`).
    fn prefetch(&self, inputs: &[RawBuf], at: usize, end: usize) {
        if at >= end {
            return;
        }
        let n = (end - at).min(CHUNK);
        for (op, buf) in self.operands.iter().zip(inputs) {
            if let Operand::Contiguous { offset } = op {
                let base = buf.ptr.cast::<f32>().wrapping_add(offset + at);
                for line in (0..n).step_by(LINE) {
                    prefetch(base.wrapping_add(line));
                }
            }
        }
    }

    /// Instruction `i` on the `n` points from `s`, into register `i`.
    ///
    /// # Safety
    /// Operand `k` of a `Load` holds the elements these points read.
    unsafe fn execute(&self, i: usize, regs: &mut [f32], inputs: &[RawBuf], s: usize, n: usize) {
        // SSA: operands precede their users, so they lie below register `i`.
        let (done, rest) = regs.split_at_mut(i * CHUNK);
        let out = &mut rest[..n];
        let reg = |r: usize| &done[r * CHUNK..r * CHUNK + n];
        match self.instrs[i] {
            Instr::Load(k) => match self.operands[k] {
                Operand::Contiguous { offset } => {
                    // SAFETY: forwarded from the caller's contract.
                    out.copy_from_slice(unsafe { inputs[k].f32_slice(offset + s, n) });
                }
                Operand::Scalar { offset } => {
                    // SAFETY: forwarded from the caller's contract.
                    out.fill(unsafe { inputs[k].f32_slice(offset, 1) }[0]);
                }
            },
            Instr::Const(x) => out.fill(x),
            Instr::Unary(u, a) => {
                let a = reg(a);
                match u {
                    UnaryOp::Neg => map1(out, a, |x| -x),
                    UnaryOp::Abs => map1(out, a, f32::abs),
                    UnaryOp::Sqrt => map1(out, a, f32::sqrt),
                    UnaryOp::Rsqrt => map1(out, a, |x| 1.0 / x.sqrt()),
                    UnaryOp::Square => map1(out, a, |x| x * x),
                    _ => map1(out, a, |x| 1.0 / x),
                }
            }
            Instr::Binary(b, x, y) => {
                let (x, y) = (reg(x), reg(y));
                match b {
                    BinaryOp::Add => map2(out, x, y, |p, q| p + q),
                    BinaryOp::Sub => map2(out, x, y, |p, q| p - q),
                    BinaryOp::Mul => map2(out, x, y, |p, q| p * q),
                    BinaryOp::Div => map2(out, x, y, |p, q| p / q),
                    BinaryOp::Maximum => map2(out, x, y, |p, q| {
                        if p.is_nan() || q.is_nan() {
                            f32::NAN
                        } else {
                            p.max(q)
                        }
                    }),
                    _ => map2(out, x, y, |p, q| {
                        if p.is_nan() || q.is_nan() {
                            f32::NAN
                        } else {
                            p.min(q)
                        }
                    }),
                }
            }
        }
    }
}

/// The unary ops this engine computes (as the general engine does).
fn supported_unary(u: UnaryOp) -> bool {
    matches!(
        u,
        UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Square
            | UnaryOp::Recip
    )
}

/// The binary ops this engine computes (as the general engine does).
fn supported_binary(b: BinaryOp) -> bool {
    matches!(
        b,
        BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Maximum
            | BinaryOp::Minimum
    )
}

fn map1(out: &mut [f32], a: &[f32], f: impl Fn(f32) -> f32) {
    for (o, &x) in out.iter_mut().zip(a) {
        *o = f(x);
    }
}

fn map2(out: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

/// A hint that the cache line at `p` will be read soon. Never faults, whatever the address.
#[inline(always)]
fn prefetch(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it reads nothing and never faults, even on an address
    // outside any allocation.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch(p.cast::<i8>(), _MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::fused::FusedProgram;
    use crate::backend::cpu::memory::Arena;
    use rand::{Rng, SeedableRng};

    /// A random update-like expression over `loads` operands (the first `scalars` scalar).
    fn random_expr(rng: &mut rand_chacha::ChaCha8Rng, loads: u16) -> FusedExpr {
        let mut e = FusedExpr::default();
        for k in 0..loads {
            e.push(ExprOp::Load(k), DType::F32);
        }
        e.push(ExprOp::Const(0.5), DType::F32);
        let unary = [
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Sqrt,
            UnaryOp::Rsqrt,
            UnaryOp::Square,
            UnaryOp::Recip,
        ];
        let binary = [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Maximum,
            BinaryOp::Minimum,
        ];
        for _ in 0..12 {
            let n = e.ops.len() as u32;
            let op = if rng.random_bool(0.3) {
                ExprOp::Unary(
                    unary[rng.random_range(0..unary.len())],
                    rng.random_range(0..n),
                )
            } else {
                ExprOp::Binary(
                    binary[rng.random_range(0..binary.len())],
                    rng.random_range(0..n),
                    rng.random_range(0..n),
                )
            };
            e.push(op, DType::F32);
        }
        let last = e.ops.len() as u32;
        e.outputs = vec![last - 1, last - 4];
        e
    }

    #[test]
    fn matches_the_general_engine_on_random_updates() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for case in 0..40 {
            let points = rng.random_range(1..3000);
            let expr = random_expr(&mut rng, 5);
            let strides: Vec<[usize; 1]> = (0..5).map(|k| [usize::from(k >= 2)]).collect();
            let views: Vec<(usize, &[usize])> = strides
                .iter()
                .enumerate()
                .map(|(k, s)| (k * 3, s.as_slice()))
                .collect();
            let bucket =
                BucketProgram::new(&expr, &[points], &views, &[DType::F32; 5]).expect("covered");
            let fused = FusedProgram::new(&expr, &[points], &views);
            let mut arenas: Vec<Arena> = (0..5).map(|_| Arena::new(4 * (points + 16))).collect();
            let inputs: Vec<RawBuf> = arenas
                .iter_mut()
                .map(|a| {
                    let len = points + 16;
                    let raw = RawBuf {
                        ptr: a.ptr(),
                        dtype: DType::F32,
                        len,
                    };
                    // SAFETY: the arena holds `len` f32 values.
                    let data = unsafe { raw.f32_slice_mut(0, len) };
                    for x in data {
                        *x = rng.random_range(-2.0..2.0);
                    }
                    raw
                })
                .collect();
            let mut out_arenas: Vec<Arena> = (0..4).map(|_| Arena::new(4 * points)).collect();
            let outs: Vec<RawBuf> = out_arenas
                .iter_mut()
                .map(|a| RawBuf {
                    ptr: a.ptr(),
                    dtype: DType::F32,
                    len: points,
                })
                .collect();
            let split = rng.random_range(0..=points);
            // SAFETY: operands reach at most 12 + points elements of points + 16; outputs
            // hold `points` elements; one thread.
            unsafe {
                bucket.run(0, split, &inputs, &outs[..2]);
                bucket.run(split, points, &inputs, &outs[..2]);
                fused.run(0, points, &inputs, &outs[2..]);
            }
            for o in 0..2 {
                // SAFETY: both hold `points` f32 values written above.
                let (a, b) = unsafe {
                    (
                        outs[o].f32_slice(0, points),
                        outs[o + 2].f32_slice(0, points),
                    )
                };
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                        "case {case}, output {o}, point {i}: {x} vs {y}\n{expr}"
                    );
                }
            }
        }
    }

    #[test]
    fn other_forms_stay_with_the_general_engine() {
        let mut e = FusedExpr::default();
        let x = e.push(ExprOp::Load(0), DType::F32);
        let y = e.push(ExprOp::Unary(UnaryOp::Exp, x), DType::F32);
        e.outputs = vec![y];
        let one: &[usize] = &[1];
        assert!(BucketProgram::new(&e, &[8], &[(0, one)], &[DType::F32]).is_none());
        e.ops[1] = (ExprOp::Unary(UnaryOp::Neg, x), DType::F32);
        assert!(BucketProgram::new(&e, &[8], &[(0, one)], &[DType::F32]).is_some());
        assert!(BucketProgram::new(&e, &[8], &[(0, one)], &[DType::F64]).is_none());
        assert!(BucketProgram::new(&e, &[8], &[(0, &[2])], &[DType::F32]).is_none());
        assert!(BucketProgram::new(&e, &[2, 4], &[(0, &[4, 1])], &[DType::F32]).is_none());
    }
}
