//! Fused elementwise expressions: the body of every fused kernel, as data.
//!
//! A `FusedExpr` is an SSA list evaluated once per point of an iteration space. Its leaves load
//! kernel operands (through strided views, so broadcasts, transposes and slices cost nothing),
//! constants, iteration indices and counter-based random numbers. Backends compile it: the CPU
//! backend into chunked loops, the CUDA backend into generated C. [`FusedExpr::eval`] is its
//! scalar semantics, built on [`crate::ir::scalar`].

use crate::ir::{BinaryOp, UnaryOp, rng, scalar};
use crate::tensor::DType;
use std::fmt;

/// Index of a value inside a [`FusedExpr`].
pub type ExprId = u32;

/// One SSA instruction of a fused expression.
#[derive(Clone, Debug, PartialEq)]
pub enum ExprOp {
    /// The element of kernel operand `i` at the current point.
    Load(u16),
    /// A constant (integers and booleans are exact in `f64`).
    Const(f64),
    Unary(UnaryOp, ExprId),
    Binary(BinaryOp, ExprId, ExprId),
    /// `cond ? a : b`.
    Select(ExprId, ExprId, ExprId),
    /// Conversion to the instruction's dtype.
    Cast(ExprId),
    /// The current point's index along iteration axis `axis` (an `i64`).
    Index(u8),
    /// `Op::RandomUniform`'s sample at the current flat index: keyed by `seed` and the integer
    /// scalar held by operand `counter`.
    Random {
        seed: u64,
        counter: u16,
    },
}

impl ExprOp {
    /// This instruction with each value it reads replaced by `f(value)` (loads, constants,
    /// indices and random numbers read none).
    pub fn with_operands(&self, f: impl Fn(ExprId) -> ExprId) -> ExprOp {
        match self {
            ExprOp::Unary(u, a) => ExprOp::Unary(*u, f(*a)),
            ExprOp::Binary(b, x, y) => ExprOp::Binary(*b, f(*x), f(*y)),
            ExprOp::Select(c, a, b) => ExprOp::Select(f(*c), f(*a), f(*b)),
            ExprOp::Cast(a) => ExprOp::Cast(f(*a)),
            other => other.clone(),
        }
    }

    /// The values this instruction reads, in order.
    pub fn operands(&self) -> impl Iterator<Item = ExprId> {
        match *self {
            ExprOp::Unary(_, a) | ExprOp::Cast(a) => [Some(a), None, None],
            ExprOp::Binary(_, x, y) => [Some(x), Some(y), None],
            ExprOp::Select(c, a, b) => [Some(c), Some(a), Some(b)],
            _ => [None; 3],
        }
        .into_iter()
        .flatten()
    }

    /// This instruction with the operand slot it reads (a load's, a random number's counter)
    /// replaced by `f(slot)`.
    pub fn with_slot(&self, f: impl Fn(u16) -> u16) -> ExprOp {
        match self {
            ExprOp::Load(l) => ExprOp::Load(f(*l)),
            ExprOp::Random { seed, counter } => ExprOp::Random {
                seed: *seed,
                counter: f(*counter),
            },
            other => other.clone(),
        }
    }
}

/// A fused elementwise computation with one or more outputs.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct FusedExpr {
    /// Instructions with the dtype of the value each produces; operands precede their users.
    pub ops: Vec<(ExprOp, DType)>,
    /// The values written out, one per kernel output.
    pub outputs: Vec<ExprId>,
}

impl FusedExpr {
    /// Appends an instruction and returns its id.
    pub fn push(&mut self, op: ExprOp, dtype: DType) -> ExprId {
        self.ops.push((op, dtype));
        (self.ops.len() - 1) as ExprId
    }

    /// The dtype of value `id`.
    pub fn dtype(&self, id: ExprId) -> DType {
        self.ops[id as usize].1
    }

    /// Number of operand slots the expression loads from (one more than the largest `Load`).
    pub fn operand_count(&self) -> usize {
        self.ops
            .iter()
            .filter_map(|(op, _)| match op {
                ExprOp::Load(i) | ExprOp::Random { counter: i, .. } => Some(usize::from(*i) + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// This expression with every operand slot `l` (of loads and random counters) replaced by
    /// `f(l)`: how a fused expression moves into a kernel whose inputs are numbered otherwise.
    pub fn with_slots(&self, f: impl Fn(u16) -> u16) -> FusedExpr {
        FusedExpr {
            ops: self
                .ops
                .iter()
                .map(|(op, dt)| (op.with_slot(&f), *dt))
                .collect(),
            outputs: self.outputs.clone(),
        }
    }

    /// This expression with value `id` rounded to the 16-bit float `format` (`cast(cast(v,
    /// format), f32)`, inserted right after `id`): every later instruction and every output
    /// that read `id` reads the rounded value. How a kernel storing an output in 16 bits
    /// (`half_storage`) makes what it computes from that output agree with what it stores.
    pub fn with_rounded(&self, id: ExprId, format: DType) -> FusedExpr {
        let at = id as usize + 1;
        // Old ids past `id` move up by the two casts; readers of `id` read the second cast.
        let moved = |x: ExprId| if x > id { x + 2 } else { x };
        let rounded = id + 2;
        let read = |x: ExprId| if x == id { rounded } else { moved(x) };
        let mut ops = Vec::with_capacity(self.ops.len() + 2);
        ops.extend(self.ops[..at].iter().cloned());
        let dtype = self.ops[id as usize].1;
        ops.push((ExprOp::Cast(id), format));
        ops.push((ExprOp::Cast(id + 1), dtype));
        ops.extend(
            self.ops[at..]
                .iter()
                .map(|(op, dt)| (op.with_operands(read), *dt)),
        );
        FusedExpr {
            ops,
            outputs: self.outputs.iter().map(|&o| read(o)).collect(),
        }
    }

    /// True when the expression draws random numbers (its flat index must be the op's).
    pub fn uses_random(&self) -> bool {
        self.ops
            .iter()
            .any(|(op, _)| matches!(op, ExprOp::Random { .. }))
    }

    /// Evaluates the expression at one point: `load(i)` gives operand `i`'s element there,
    /// `index` the point's coordinates and `flat` its row-major position. Returns the outputs.
    pub fn eval(&self, load: impl Fn(u16) -> f64, index: &[usize], flat: usize) -> Vec<f64> {
        let mut vals = Vec::with_capacity(self.ops.len());
        for (op, dtype) in &self.ops {
            let dtype = *dtype;
            let v = |id: &ExprId| -> f64 { vals[*id as usize] };
            let x = match op {
                ExprOp::Load(i) => load(*i),
                ExprOp::Const(c) => scalar::round_to(*c, dtype),
                ExprOp::Unary(u, a) => scalar::round_to(scalar::unary(*u, v(a), dtype), dtype),
                ExprOp::Binary(b, l, r) => {
                    let operand_type = self.dtype(*l);
                    scalar::round_to(scalar::binary(*b, v(l), v(r), operand_type), dtype)
                }
                ExprOp::Select(c, a, b) => {
                    if v(c) != 0.0 {
                        v(a)
                    } else {
                        v(b)
                    }
                }
                ExprOp::Cast(a) => scalar::cast(v(a), dtype),
                ExprOp::Index(axis) => index.get(usize::from(*axis)).copied().unwrap_or(0) as f64,
                ExprOp::Random { seed, counter } => {
                    let key = rng::step_key(*seed, load(*counter) as i64);
                    f64::from(rng::uniform_at(key, flat as u64))
                }
            };
            vals.push(x);
        }
        self.outputs.iter().map(|&o| vals[o as usize]).collect()
    }
}

impl fmt::Display for FusedExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (op, dtype)) in self.ops.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "v{i}:{dtype}=")?;
            match op {
                ExprOp::Load(k) => write!(f, "in{k}")?,
                ExprOp::Const(c) => write!(f, "{c:?}")?,
                ExprOp::Unary(u, a) => write!(f, "{}(v{a})", u.name())?,
                ExprOp::Binary(b, l, r) => write!(f, "{}(v{l},v{r})", b.name())?,
                ExprOp::Select(c, a, b) => write!(f, "select(v{c},v{a},v{b})")?,
                ExprOp::Cast(a) => write!(f, "cast(v{a})")?,
                ExprOp::Index(axis) => write!(f, "index{axis}")?,
                ExprOp::Random { seed, counter } => write!(f, "random(seed={seed},in{counter})")?,
            }
        }
        f.write_str(" -> ")?;
        for (i, o) in self.outputs.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "v{o}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `with_rounded` puts the round trip right after the value: later instructions and
    /// outputs read the rounded value, earlier ones and other values are unchanged.
    #[test]
    fn with_rounded_makes_every_later_reader_see_the_rounded_value() {
        // outputs: in0 + in1 and (in0 + in1) * in0
        let mut e = FusedExpr::default();
        let a = e.push(ExprOp::Load(0), DType::F32);
        let b = e.push(ExprOp::Load(1), DType::F32);
        let s = e.push(ExprOp::Binary(BinaryOp::Add, a, b), DType::F32);
        let p = e.push(ExprOp::Binary(BinaryOp::Mul, s, a), DType::F32);
        e.outputs = vec![s, p];
        let r = e.with_rounded(s, DType::BF16);
        assert_eq!(r.ops.len(), 6);
        assert_eq!(r.ops[3], (ExprOp::Cast(2), DType::BF16));
        assert_eq!(r.ops[4], (ExprOp::Cast(3), DType::F32));
        assert_eq!(r.ops[5], (ExprOp::Binary(BinaryOp::Mul, 4, 0), DType::F32));
        assert_eq!(r.outputs, vec![4, 5]);
        // 1 + 2⁻¹⁰ is not a bf16 value (7 mantissa bits): it rounds to 1.
        let x = 1.0 + 2f64.powi(-10);
        let load = |i: u16| if i == 0 { x } else { 0.0 };
        assert_eq!(e.eval(load, &[], 0), vec![x, x * x]);
        assert_eq!(r.eval(load, &[], 0), vec![1.0, x]);
    }

    #[test]
    fn eval_follows_the_ir_semantics_and_rounds_to_the_dtype() {
        // relu(in0 * 0.1 + in1) as f32, plus a bool output (in0 > 0)
        let mut e = FusedExpr::default();
        let a = e.push(ExprOp::Load(0), DType::F32);
        let b = e.push(ExprOp::Load(1), DType::F32);
        let c = e.push(ExprOp::Const(0.1), DType::F32);
        let m = e.push(ExprOp::Binary(BinaryOp::Mul, a, c), DType::F32);
        let s = e.push(ExprOp::Binary(BinaryOp::Add, m, b), DType::F32);
        let r = e.push(ExprOp::Unary(UnaryOp::Relu, s), DType::F32);
        let z = e.push(ExprOp::Const(0.0), DType::F32);
        let g = e.push(ExprOp::Binary(BinaryOp::Gt, a, z), DType::Bool);
        e.outputs = vec![r, g];
        let out = e.eval(|i| [3.0, -0.2][usize::from(i)], &[0], 0);
        let expected = f64::from(3.0f32 * 0.1f32 - 0.2f32);
        assert_eq!(out, vec![expected, 1.0]);
        assert_eq!(e.operand_count(), 2);
        assert!(e.to_string().contains("relu(v4)"));
    }
}
