//! Reduction drafts: one kernel per reduction node, the elementwise producers that only feed a
//! reduction absorbed as its prologue, and reductions of one group over the same axes merged
//! into one kernel (so a batch norm's statistics read their input once).

use super::{Draft, Former, dedupe};
use crate::ir::{NodeId, Op, Value};
use crate::lower::expr::{ExprId, ExprOp, FusedExpr};
use crate::lower::program::KernelKind;
use std::collections::BTreeMap;

impl Former<'_> {
    /// For every draft, the set of drafts it reads from, directly or transitively (a bitset
    /// over draft indices; computed iteratively, parents first).
    pub(super) fn draft_ancestors(&self) -> Vec<Vec<u64>> {
        let n = self.drafts.len();
        let words = n.div_ceil(64);
        let parents: Vec<Vec<usize>> = self
            .drafts
            .iter()
            .enumerate()
            .map(|(d, draft)| {
                let mut p: Vec<usize> = draft
                    .inputs
                    .iter()
                    .filter_map(|o| self.producer.get(&o.base).copied())
                    .filter(|&p| p != d)
                    .collect();
                p.sort_unstable();
                p.dedup();
                p
            })
            .collect();
        let mut sets: Vec<Option<Vec<u64>>> = vec![None; n];
        for root in 0..n {
            // Post-order walk: a draft's set is the union of its parents' sets and the parents.
            let mut stack = vec![(root, false)];
            while let Some((d, expanded)) = stack.pop() {
                if sets[d].is_some() {
                    continue;
                }
                if !expanded {
                    stack.push((d, true));
                    stack.extend(
                        parents[d]
                            .iter()
                            .filter(|&&p| sets[p].is_none())
                            .map(|&p| (p, false)),
                    );
                    continue;
                }
                let mut set = vec![0u64; words];
                for &p in &parents[d] {
                    set[p / 64] |= 1 << (p % 64);
                    // Parents are done: the walk pushed them after `d` (the graph is acyclic).
                    if let Some(ps) = &sets[p] {
                        for (w, x) in set.iter_mut().zip(ps) {
                            *w |= x;
                        }
                    }
                }
                sets[d] = Some(set);
            }
        }
        sets.into_iter().map(Option::unwrap_or_default).collect()
    }

    /// Merges independent reductions over the same space and axes into one multi-output
    /// kernel, so one pass over the data serves them all (batch-norm's backward needs three
    /// or four sums over the same activations).
    pub(super) fn merge_reductions(&mut self) {
        let contains =
            |set: &[u64], i: usize| set.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1);
        let mut ancestors = self.draft_ancestors();
        let mut order: Vec<usize> = (0..self.drafts.len())
            .filter(|&i| {
                self.drafts[i].alive && matches!(self.drafts[i].kind, KernelKind::Reduce { .. })
            })
            .collect();
        order.sort_by_key(|&i| self.drafts[i].anchor);
        // Open merged kernels: (draft index, members).
        let mut open: Vec<(usize, Vec<usize>)> = Vec::new();
        for d in order {
            let key = |k: &KernelKind| match k {
                KernelKind::Reduce { shape, axes, .. } => Some((shape.clone(), axes.clone())),
                _ => None,
            };
            let dkey = key(&self.drafts[d].kind);
            let target = open.iter().position(|(s, members)| {
                key(&self.drafts[*s].kind) == dkey
                    && self.drafts[*s].device == self.drafts[d].device
                    && members
                        .iter()
                        .all(|&m| !contains(&ancestors[d], m) && !contains(&ancestors[m], d))
            });
            match target {
                None => open.push((d, vec![d])),
                Some(t) => {
                    let s = open[t].0;
                    self.absorb_reduction(s, d);
                    open[t].1.push(d);
                    // The merged kernel now reads what `d` read.
                    ancestors = self.draft_ancestors();
                }
            }
        }
    }

    /// Moves reduction draft `d` into reduction draft `s`.
    pub(super) fn absorb_reduction(&mut self, s: usize, d: usize) {
        let taken = std::mem::replace(&mut self.drafts[d].alive, false);
        debug_assert!(taken);
        let (
            KernelKind::Reduce {
                prologue: pd,
                ops: od,
                ..
            },
            inputs_d,
            outputs_d,
            anchor_d,
        ) = (
            self.drafts[d].kind.clone(),
            self.drafts[d].inputs.clone(),
            self.drafts[d].outputs.clone(),
            self.drafts[d].anchor,
        )
        else {
            return;
        };
        let sd = &mut self.drafts[s];
        let KernelKind::Reduce { prologue, ops, .. } = &mut sd.kind else {
            return;
        };
        // Operand slots of `d` in `s`'s operand list (deduplicated).
        let slots: Vec<u16> = inputs_d
            .iter()
            .map(|o| match sd.inputs.iter().position(|x| x == o) {
                Some(i) => i as u16,
                None => {
                    sd.inputs.push(o.clone());
                    (sd.inputs.len() - 1) as u16
                }
            })
            .collect();
        let shift = prologue.ops.len() as ExprId;
        for (op, dt) in &pd.ops {
            let op = op
                .with_slot(|k| slots[usize::from(k)])
                .with_operands(|a| a + shift);
            prologue.ops.push((op, *dt));
        }
        prologue
            .outputs
            .extend(pd.outputs.iter().map(|o| o + shift));
        ops.extend(od);
        *prologue = dedupe(prologue);
        sd.outputs.extend(outputs_d.iter().copied());
        sd.anchor = sd.anchor.max(anchor_d);
        for o in outputs_d {
            self.producer.insert(o, s);
        }
    }

    pub(super) fn reduce_drafts(&mut self, reduces: &[NodeId]) {
        // Reductions absorbing the same group over the same axes share one kernel.
        let mut buckets: BTreeMap<(usize, Vec<usize>), Vec<NodeId>> = BTreeMap::new();
        let mut single = Vec::new();
        for &r in reduces {
            let x = self.graph.inputs(r)[0];
            let Op::Reduce { axes, .. } = &self.graph.node(r).op else {
                continue;
            };
            match self.grouping.group_of.get(&x.node) {
                Some(&g) if self.grouping.absorbed.contains(&x) => {
                    buckets.entry((g, axes.clone())).or_default().push(r);
                }
                _ => single.push(r),
            }
        }
        for ((g, axes), rs) in buckets {
            let targets: Vec<Value> = rs.iter().map(|&r| self.graph.inputs(r)[0]).collect();
            let (prologue, inputs) = self.group_expr(g, &targets, false);
            let ops = rs
                .iter()
                .filter_map(|&r| match self.graph.node(r).op {
                    Op::Reduce { op, .. } => Some(op),
                    _ => None,
                })
                .collect();
            let last = *rs.last().unwrap_or(&rs[0]);
            let draft = Draft {
                name: self.graph.node(last).name.clone(),
                device: self.grouping.groups[g].device,
                kind: KernelKind::Reduce {
                    shape: self.grouping.groups[g].shape.clone(),
                    axes,
                    prologue,
                    ops,
                    finish: None,
                },
                inputs,
                outputs: rs.iter().map(|&r| Value::first(r)).collect(),
                anchor: rs
                    .iter()
                    .filter_map(|r| self.pos.get(r))
                    .copied()
                    .max()
                    .unwrap_or(0),
                alive: true,
            };
            self.push(draft);
        }
        for r in single {
            let x = self.graph.inputs(r)[0];
            let Op::Reduce { op, axes, .. } = self.graph.node(r).op.clone() else {
                continue;
            };
            let operand = self.resolve(x);
            let mut prologue = FusedExpr::default();
            let l = prologue.push(ExprOp::Load(0), self.graph.value_type(x).dtype);
            prologue.outputs = vec![l];
            let draft = Draft {
                name: self.graph.node(r).name.clone(),
                device: self.device(r),
                kind: KernelKind::Reduce {
                    shape: self.shape(x),
                    axes,
                    prologue,
                    ops: vec![op],
                    finish: None,
                },
                inputs: vec![operand],
                outputs: vec![Value::first(r)],
                anchor: self.pos.get(&r).copied().unwrap_or(0),
                alive: true,
            };
            self.push(draft);
        }
    }
}
