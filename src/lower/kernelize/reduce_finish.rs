//! Finish fusion: an elementwise draft over a reduction's output space that reads the
//! reduction's results point for point becomes the reduction's [`ReduceFinish`], computed as the
//! results are stored instead of by a launch of its own (batch norm's `rsqrt(variance + ε)` after
//! every variance: a kernel of 16–64 points, all launch overhead). A variance computed in a
//! convolution's epilogue ([`ChannelReduction::Variance`]) takes such a draft as its epilogue's
//! finish ([`Epilogue::finish`]).

use super::{Former, Operand};
use crate::ir::Value;
use crate::lower::program::{ChannelReduction, KernelKind, ReduceFinish};
use std::collections::HashSet;

/// The fewest points a reduction folds into each output for it to take a finish: the finish runs
/// once per output, on the reduction's lanes that store it, so it must be small beside the
/// reduction's own work.
const MIN_REDUCED: usize = 16;

impl Former<'_> {
    /// Merges each elementwise draft that reads a reduction's results through identity views of
    /// its output space (and nothing else that depends on the reduction, nothing on another
    /// device) into that reduction as its finish. A reduction takes one finish. Drafts writing
    /// a value in `assigned` are left alone: variable updates merge into arena kernels
    /// ([`crate::lower::arena`]), one launch for many variables.
    pub(super) fn fuse_reduce_finishes(&mut self, assigned: &HashSet<Value>) {
        for gi in 0..self.drafts.len() {
            if !self.finish_candidate(gi, assigned) {
                continue;
            }
            let Some(r) = self.drafts[gi].inputs.iter().find_map(|op| {
                let &r = self.producer.get(&op.base)?;
                let rd = &self.drafts[r];
                (rd.alive && matches!(rd.kind, KernelKind::Reduce { finish: None, .. }))
                    .then_some(r)
            }) else {
                continue;
            };
            let Some((slots, extras)) = self.finish_operands(gi, r) else {
                continue;
            };
            self.absorb_finish(gi, r, &slots, extras, |kind, finish| {
                if let KernelKind::Reduce { finish: f, .. } = kind {
                    *f = Some(finish);
                }
            });
        }
    }

    /// Whether draft `gi` may become a finish: a live elementwise draft writing no value in
    /// `assigned` (variable updates merge into arena kernels instead).
    fn finish_candidate(&self, gi: usize, assigned: &HashSet<Value>) -> bool {
        let d = &self.drafts[gi];
        d.alive
            && matches!(d.kind, KernelKind::Elementwise { .. })
            && !d.outputs.iter().any(|o| assigned.contains(o))
    }

    /// Makes elementwise draft `gi` (its operand slots mapped by `slots`) the finish of draft
    /// `host`, which `place` stores it in; `extras` become `host`'s inputs, `gi`'s outputs its
    /// last outputs.
    fn absorb_finish(
        &mut self,
        gi: usize,
        host: usize,
        slots: &[u16],
        extras: Vec<Operand>,
        place: impl FnOnce(&mut KernelKind, ReduceFinish),
    ) {
        let KernelKind::Elementwise { shape, expr } = &self.drafts[gi].kind else {
            return;
        };
        let finish = ReduceFinish {
            shape: shape.clone(),
            expr: expr.with_slots(|s| slots[usize::from(s)]),
            first_input: self.drafts[host].inputs.len(),
        };
        let (outputs, anchor) = (self.drafts[gi].outputs.clone(), self.drafts[gi].anchor);
        self.drafts[gi].alive = false;
        let hd = &mut self.drafts[host];
        place(&mut hd.kind, finish);
        hd.inputs.extend(extras);
        hd.outputs.extend(outputs.iter().copied());
        hd.anchor = hd.anchor.max(anchor);
        for o in outputs {
            self.producer.insert(o, host);
        }
    }

    /// Merges each elementwise draft over `[channels]` that reads one epilogue variance's result
    /// point for point — and nothing else the convolution computes, nothing on another device —
    /// into that convolution's epilogue as its finish. An epilogue takes one finish; drafts
    /// writing a value in `assigned` are left alone (as [`Former::fuse_reduce_finishes`]).
    pub(super) fn fuse_epilogue_finishes(&mut self, assigned: &HashSet<Value>) {
        for gi in 0..self.drafts.len() {
            if !self.finish_candidate(gi, assigned) {
                continue;
            }
            let Some(k) = self.drafts[gi].inputs.iter().find_map(|op| {
                let &k = self.producer.get(&op.base)?;
                let kd = &self.drafts[k];
                let e = kd.kind.epilogue()?;
                (kd.alive
                    && matches!(kd.kind, KernelKind::Conv2d(..))
                    && e.finish.is_none()
                    && e.reductions.contains(&ChannelReduction::Variance))
                .then_some(k)
            }) else {
                continue;
            };
            let Some((slots, extras)) = self.epilogue_finish_operands(gi, k) else {
                continue;
            };
            self.absorb_finish(gi, k, &slots, extras, |kind, finish| {
                if let KernelKind::Conv2d(_, Some(e), _) = kind {
                    e.finish = Some(finish);
                }
            });
        }
    }

    /// How elementwise draft `gi` reads as convolution draft `k`'s epilogue finish: the slot of
    /// each of its operand slots (`j` for reduction `j`'s result, then one a distinct other
    /// operand after the results), and those other operands. `None` unless it reads exactly one
    /// of `k`'s results, a variance, over the channels point for point, and nothing else that
    /// depends on `k`.
    fn epilogue_finish_operands(&self, gi: usize, k: usize) -> Option<(Vec<u16>, Vec<Operand>)> {
        let (ed, kd) = (&self.drafts[gi], &self.drafts[k]);
        let (KernelKind::Elementwise { shape, .. }, Some(e)) = (&ed.kind, kd.kind.epilogue())
        else {
            return None;
        };
        let results = &kd.outputs[e.stored_outputs()..];
        let channels = self.shape(kd.outputs[0]).last().copied()?;
        if ed.device != kd.device || shape[..] != [channels] || results.len() != e.reductions.len()
        {
            return None;
        }
        let mut slots = Vec::with_capacity(ed.inputs.len());
        let mut extras: Vec<Operand> = Vec::new();
        let mut read = None;
        for op in &ed.inputs {
            if let Some(j) = results.iter().position(|&v| v == op.base) {
                if !self.reads_pointwise(op, shape)
                    || e.reductions[j] != ChannelReduction::Variance
                    || read.is_some_and(|r| r != j)
                {
                    return None;
                }
                read = Some(j);
                slots.push(j as u16);
                continue;
            }
            let dependent = kd
                .outputs
                .iter()
                .any(|v| self.depends(op.base.node, v.node))
                || self.producer.get(&op.base).is_some_and(|&p| {
                    self.drafts[p].device != kd.device || p == k || self.draft_reaches(p, k)
                });
            if dependent {
                return None;
            }
            slots.push((results.len() + extra_slot(&mut extras, op)) as u16);
        }
        read.map(|_| (slots, extras))
    }

    /// How elementwise draft `gi` reads as reduction draft `r`'s finish: the finish's slot of
    /// each of its operand slots (`j` for result `j`, then one slot per distinct other operand
    /// after the results), and those other operands. `None` when it cannot be a finish of `r`.
    fn finish_operands(&self, gi: usize, r: usize) -> Option<(Vec<u16>, Vec<Operand>)> {
        let (ed, rd) = (&self.drafts[gi], &self.drafts[r]);
        let (
            KernelKind::Elementwise { shape, .. },
            KernelKind::Reduce {
                shape: space,
                axes,
                ops,
                ..
            },
        ) = (&ed.kind, &rd.kind)
        else {
            return None;
        };
        let points: usize = shape.iter().product();
        let kept: usize = (0..space.len())
            .filter(|d| !axes.contains(d))
            .map(|d| space[d])
            .product();
        let reduced = space.iter().product::<usize>() / kept.max(1);
        if ed.device != rd.device || points == 0 || points != kept || reduced < MIN_REDUCED {
            return None;
        }
        let results = &rd.outputs[..ops.len()];
        let mut slots = Vec::with_capacity(ed.inputs.len());
        let mut extras: Vec<Operand> = Vec::new();
        for op in &ed.inputs {
            if let Some(j) = results.iter().position(|&v| v == op.base) {
                if !self.reads_pointwise(op, shape) {
                    return None;
                }
                slots.push(j as u16);
                continue;
            }
            let dependent = results.iter().any(|v| self.depends(op.base.node, v.node))
                || self.producer.get(&op.base).is_some_and(|&p| {
                    self.drafts[p].device != rd.device || self.draft_reaches(p, r)
                });
            if dependent {
                return None;
            }
            slots.push((ops.len() + extra_slot(&mut extras, op)) as u16);
        }
        Some((slots, extras))
    }

    /// Whether `op` reads its value point for point over `shape`: a result read otherwise
    /// (broadcast, transposed) is not the value a finish holds at its point.
    fn reads_pointwise(&self, op: &Operand, shape: &[usize]) -> bool {
        op.view.is_identity() && op.view.shape == shape && self.shape(op.base) == shape
    }
}

/// The index of `op` among a finish's other operands `extras`, added if it is new (one slot per
/// distinct operand).
fn extra_slot(extras: &mut Vec<Operand>, op: &Operand) -> usize {
    extras.iter().position(|x| x == op).unwrap_or_else(|| {
        extras.push(op.clone());
        extras.len() - 1
    })
}
