//! Reductions joining convolution epilogues: a per-channel reduction (`Sum`/`Mean` over every
//! axis but the last) of a convolution's output — batch norm's statistics in the forward pass,
//! its gradient sums in the backward pass — is computed in the convolution's epilogue while each
//! block of output rows is still in cache, instead of by a later kernel that reads the whole
//! output (and the other operands of the sums) back from memory.
//!
//! Batch norm's variance, `mean((x - mean)²)` over the same axes, reads the mean the epilogue
//! computes: it cannot be one of these sums. With variances on, it joins as a
//! [`ChannelReduction::Variance`] of the value the mean reduces, computed in one pass.

use super::{Former, Operand, dedupe};
use crate::ir::{BinaryOp, ReduceOp, UnaryOp, Value};
use crate::lower::expr::{ExprId, ExprOp, FusedExpr};
use crate::lower::program::{ChannelReduction, Epilogue, KernelKind};
use std::collections::HashMap;

impl Former<'_> {
    /// Moves every eligible reduction draft into the epilogue of the convolution producing its
    /// input (see [`Epilogue::reductions`]); with `variances`, also the variances of values an
    /// epilogue already averages (see [`ChannelReduction::Variance`]).
    pub(super) fn fuse_epilogue_reductions(&mut self, variances: bool) {
        for r in 0..self.drafts.len() {
            if !self.drafts[r].alive {
                continue;
            }
            if let Some(k) = self.epilogue_host(r) {
                self.join_epilogue(r, k);
            }
        }
        if !variances {
            return;
        }
        // After every mean has joined (a mean's draft may come after its variance's).
        for r in 0..self.drafts.len() {
            if !self.drafts[r].alive {
                continue;
            }
            if let Some((k, value)) = self.variance_host(r) {
                self.join_variance(r, k, value);
            }
        }
    }

    /// The convolution draft whose epilogue can compute reduction draft `r` as a variance, and
    /// the epilogue value it is the variance of: `r` is the per-channel mean of `(x - m)²`
    /// where `x` is a stored output of a forward convolution `k` (read through an identity
    /// view of its whole shape) and `m` is `k`'s epilogue mean of that same value, broadcast
    /// over the channels — batch norm's two-pass variance (`lower::passes::expand`).
    fn variance_host(&self, r: usize) -> Option<(usize, ExprId)> {
        let rd = &self.drafts[r];
        let KernelKind::Reduce {
            shape,
            axes,
            prologue,
            ops,
            finish: None,
        } = &rd.kind
        else {
            return None;
        };
        let rank = shape.len();
        if rank < 2 || !axes.iter().copied().eq(0..rank - 1) || ops[..] != [ReduceOp::Mean] {
            return None;
        }
        // The prologue is exactly Square(Sub(Load x, Load m)).
        let [out] = prologue.outputs[..] else {
            return None;
        };
        let op = |id: ExprId| prologue.ops.get(id as usize).map(|(o, _)| o);
        let Some(&ExprOp::Unary(UnaryOp::Square, centred)) = op(out) else {
            return None;
        };
        let Some(&ExprOp::Binary(BinaryOp::Sub, xi, mi)) = op(centred) else {
            return None;
        };
        let (Some(&ExprOp::Load(xl)), Some(&ExprOp::Load(ml))) = (op(xi), op(mi)) else {
            return None;
        };
        if prologue.ops.len() != 4 || rd.inputs.len() != 2 || xl == ml {
            return None;
        }
        let (x, m) = (&rd.inputs[usize::from(xl)], &rd.inputs[usize::from(ml)]);
        let &k = self.producer.get(&x.base)?;
        let kd = &self.drafts[k];
        let (KernelKind::Conv2d(_, Some(e), _), true) = (&kd.kind, kd.alive) else {
            return None;
        };
        let stored = e.stored_outputs();
        let own = kd.outputs[..stored].iter().position(|&o| o == x.base)?;
        let value = e.expr.outputs[own];
        let whole = x.view.is_identity() && x.view.shape == *shape && self.shape(x.base) == *shape;
        // m: k's mean of the same value, read per channel.
        let j = kd.outputs[stored..].iter().position(|&o| o == m.base)?;
        let strides = &m.view.strides;
        let per_channel = strides.len() == rank
            && strides[..rank - 1].iter().all(|&s| s == 0)
            && strides[rank - 1] == 1
            && m.view.offset == 0;
        let its_mean =
            e.reductions[j] == ChannelReduction::Mean && e.expr.outputs[stored + j] == value;
        (whole && per_channel && its_mean && kd.device == rd.device).then_some((k, value))
    }

    /// Appends the variance of epilogue value `value` to convolution draft `k`'s epilogue as
    /// reduction draft `r`'s result.
    fn join_variance(&mut self, r: usize, k: usize, value: ExprId) {
        let (r_outputs, r_anchor) = (self.drafts[r].outputs.clone(), self.drafts[r].anchor);
        let kd = &mut self.drafts[k];
        let KernelKind::Conv2d(g, Some(mut e), p) = kd.kind.clone() else {
            return;
        };
        e.expr.outputs.push(value);
        e.reductions.push(ChannelReduction::Variance);
        kd.kind = KernelKind::Conv2d(g, Some(e), p);
        kd.outputs.extend(r_outputs.iter().copied());
        kd.anchor = kd.anchor.max(r_anchor);
        self.drafts[r].alive = false;
        for o in r_outputs {
            self.producer.insert(o, k);
        }
    }

    /// The convolution draft whose epilogue can compute reduction draft `r`, if any: `r` sums
    /// (or averages) over every axis but the last, reads at least one output of the convolution
    /// through an identity view of its whole shape, and reads nothing else that depends on the
    /// convolution or lives on another device.
    fn epilogue_host(&self, r: usize) -> Option<usize> {
        let rd = &self.drafts[r];
        let KernelKind::Reduce {
            shape, axes, ops, ..
        } = &rd.kind
        else {
            return None;
        };
        let rank = shape.len();
        let per_channel = rank >= 2 && axes.iter().copied().eq(0..rank - 1);
        if !per_channel
            || !ops
                .iter()
                .all(|o| matches!(o, ReduceOp::Sum | ReduceOp::Mean))
        {
            return None;
        }
        let k = rd.inputs.iter().find_map(|op| {
            let &k = self.producer.get(&op.base)?;
            let kd = &self.drafts[k];
            let conv = matches!(
                kd.kind,
                KernelKind::Conv2d(..) | KernelKind::Conv2dBackpropInput(..)
            );
            (kd.alive && conv && kd.device == rd.device).then_some(k)
        })?;
        let stored = self.stored_outputs(k);
        let independent = rd.inputs.iter().all(|op| {
            if stored.contains(&op.base) {
                return op.view.is_identity()
                    && op.view.shape == *shape
                    && self.shape(op.base) == *shape;
            }
            !self.drafts[k].outputs.contains(&op.base)
                && self.producer.get(&op.base).is_none_or(|&p| {
                    self.drafts[p].device == self.drafts[k].device && !self.draft_reaches(p, k)
                })
        });
        independent.then_some(k)
    }

    /// The outputs of convolution draft `k` stored per point (not reductions).
    fn stored_outputs(&self, k: usize) -> &[Value] {
        let kd = &self.drafts[k];
        let n = kd
            .kind
            .epilogue()
            .map_or(kd.outputs.len(), Epilogue::stored_outputs);
        &kd.outputs[..n]
    }

    /// Appends reduction draft `r`'s prologue to convolution draft `k`'s epilogue.
    fn join_epilogue(&mut self, r: usize, k: usize) {
        let KernelKind::Reduce { prologue, ops, .. } = self.drafts[r].kind.clone() else {
            return;
        };
        let r_inputs = self.drafts[r].inputs.clone();
        let (mut expr, mut reductions) = match self.drafts[k].kind.epilogue() {
            Some(e) => (e.expr.clone(), e.reductions.clone()),
            None => {
                let v = self.drafts[k].outputs[0];
                let mut e = FusedExpr::default();
                let raw = e.push(ExprOp::Load(0), self.graph.value_type(v).dtype);
                e.outputs = vec![raw];
                (e, Vec::new())
            }
        };
        // The epilogue value of each stored output, and the epilogue operand slot of every
        // other input of the reduction (extra inputs of the kernel, deduplicated).
        let own: HashMap<Value, ExprId> = self
            .stored_outputs(k)
            .iter()
            .copied()
            .zip(expr.outputs.iter().copied())
            .collect();
        let main = self.drafts[k].kind.main_inputs();
        let slot_of = |o: &Operand, kd_inputs: &mut Vec<Operand>| -> u16 {
            let at = kd_inputs[main..].iter().position(|x| x == o);
            let i = at.unwrap_or_else(|| {
                kd_inputs.push(o.clone());
                kd_inputs.len() - 1 - main
            });
            (1 + i) as u16
        };
        let mut k_inputs = self.drafts[k].inputs.clone();
        let mut remap: Vec<ExprId> = Vec::with_capacity(prologue.ops.len());
        for (op, dt) in &prologue.ops {
            let id = match op {
                ExprOp::Load(i) => {
                    let o = &r_inputs[usize::from(*i)];
                    match own.get(&o.base) {
                        Some(&v) => v,
                        None => {
                            let s = slot_of(o, &mut k_inputs);
                            expr.push(ExprOp::Load(s), *dt)
                        }
                    }
                }
                ExprOp::Random { seed, counter } => {
                    let s = slot_of(&r_inputs[usize::from(*counter)], &mut k_inputs);
                    expr.push(
                        ExprOp::Random {
                            seed: *seed,
                            counter: s,
                        },
                        *dt,
                    )
                }
                ExprOp::Unary(u, a) => expr.push(ExprOp::Unary(*u, remap[*a as usize]), *dt),
                ExprOp::Binary(b, x, y) => expr.push(
                    ExprOp::Binary(*b, remap[*x as usize], remap[*y as usize]),
                    *dt,
                ),
                ExprOp::Select(c, a, b) => expr.push(
                    ExprOp::Select(remap[*c as usize], remap[*a as usize], remap[*b as usize]),
                    *dt,
                ),
                ExprOp::Cast(a) => expr.push(ExprOp::Cast(remap[*a as usize]), *dt),
                other => expr.push(other.clone(), *dt),
            };
            remap.push(id);
        }
        expr.outputs
            .extend(prologue.outputs.iter().map(|o| remap[*o as usize]));
        reductions.extend(ops.iter().map(|o| match o {
            ReduceOp::Mean => ChannelReduction::Mean,
            // `epilogue_host` admits sums and means only.
            _ => ChannelReduction::Sum,
        }));
        let epilogue = Some(Epilogue {
            expr: dedupe(&expr),
            reductions,
            finish: None,
        });
        let (r_outputs, r_anchor) = (self.drafts[r].outputs.clone(), self.drafts[r].anchor);
        let kd = &mut self.drafts[k];
        kd.kind = match kd.kind.clone() {
            KernelKind::Conv2d(g, _, p) => KernelKind::Conv2d(g, epilogue, p),
            KernelKind::Conv2dBackpropInput(g, _) => KernelKind::Conv2dBackpropInput(g, epilogue),
            other => other,
        };
        kd.inputs = k_inputs;
        kd.outputs.extend(r_outputs.iter().copied());
        kd.anchor = kd.anchor.max(r_anchor);
        self.drafts[r].alive = false;
        for o in r_outputs {
            self.producer.insert(o, k);
        }
    }
}
