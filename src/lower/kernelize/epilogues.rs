//! Epilogue fusion: an elementwise draft that consumes a convolution's (forward, input or
//! filter gradient) or a matrix product's output (and whose other operands do not depend on it) becomes that kernel's epilogue, so the
//! product is written once, already transformed.

use super::{Former, Operand};
use crate::ir::{NodeId, Value};
use crate::lower::expr::{ExprId, ExprOp};
use crate::lower::program::{Epilogue, KernelKind};
use std::collections::HashSet;

impl Former<'_> {
    /// True when `target` depends on `source` through data edges.
    pub(super) fn depends(&self, target: NodeId, source: NodeId) -> bool {
        let floor = self.pos.get(&source).copied().unwrap_or(0);
        let mut stack = vec![target];
        let mut seen = HashSet::new();
        while let Some(id) = stack.pop() {
            if id == source {
                return true;
            }
            if !seen.insert(id) || self.pos.get(&id).copied().unwrap_or(0) < floor {
                continue;
            }
            stack.extend(self.graph.inputs(id).iter().map(|v| v.node));
        }
        false
    }

    /// True when live draft `from` reads, directly or transitively, a value draft `target`
    /// writes.
    pub(super) fn draft_reaches(&self, from: usize, target: usize) -> bool {
        let mut stack = vec![from];
        let mut seen = HashSet::new();
        while let Some(d) = stack.pop() {
            if d == target {
                return true;
            }
            if !seen.insert(d) {
                continue;
            }
            stack.extend(
                self.drafts[d]
                    .inputs
                    .iter()
                    .filter_map(|o| self.producer.get(&o.base).copied())
                    .filter(|&p| self.drafts[p].alive || p == target),
            );
        }
        false
    }

    /// Merges elementwise drafts into the convolution or matmul producing one of their operands.
    /// `external` holds the bases read by fetches and assigns.
    pub(super) fn fuse_epilogues(&mut self, external: &HashSet<Value>) {
        for gi in 0..self.drafts.len() {
            let KernelKind::Elementwise { shape, expr } = self.drafts[gi].kind.clone() else {
                continue;
            };
            // Epilogues store f32 (the backends' matmul and convolution kernels write f32
            // tiles): an elementwise kernel with another output (a comparison mask, a cast)
            // stays a kernel of its own.
            if !self.drafts[gi].alive
                || expr
                    .outputs
                    .iter()
                    .any(|&o| expr.dtype(o) != crate::tensor::DType::F32)
            {
                continue;
            }
            let candidate = self.drafts[gi]
                .inputs
                .iter()
                .enumerate()
                .find_map(|(s, op)| {
                    let &k = self.producer.get(&op.base)?;
                    let kd = &self.drafts[k];
                    let fusable_kind = matches!(
                        kd.kind,
                        KernelKind::Conv2d(_, None, None)
                            | KernelKind::Conv2dBackpropInput(_, None)
                            | KernelKind::Conv2dBackpropFilter(_, None, None)
                            | KernelKind::MatMul(_, None)
                    );
                    let ok = kd.alive
                        && fusable_kind
                        && kd.outputs.len() == 1
                        && kd.device == self.drafts[gi].device
                        && op.view.is_identity()
                        && op.view.shape == shape
                        && self.shape(op.base) == shape;
                    ok.then_some((s, k))
                });
            let Some((s, k)) = candidate else { continue };
            let v = self.drafts[k].outputs[0];
            let others: Vec<Operand> = self.drafts[gi]
                .inputs
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != s)
                .map(|(_, o)| o.clone())
                .collect();
            // The extra operands must not depend on the kernel (in the graph, or through
            // epilogues merged earlier), and must not make it wait for another device.
            if others.iter().any(|o| {
                o.base == v
                    || self.depends(o.base.node, v.node)
                    || self.producer.get(&o.base).is_some_and(|&p| {
                        self.drafts[p].device != self.drafts[k].device || self.draft_reaches(p, k)
                    })
            }) {
                continue;
            }
            let needs_raw = external.contains(&v)
                || self.drafts.iter().enumerate().any(|(i, d)| {
                    i != gi && i != k && d.alive && d.inputs.iter().any(|o| o.base == v)
                });
            // Remap loads: slot s → 0, others → 1.. in order.
            let mut epi = expr.with_slots(|i| {
                let i = usize::from(i);
                (if i == s {
                    0
                } else {
                    1 + i - usize::from(i > s)
                }) as u16
            });
            let raw = epi
                .ops
                .iter()
                .position(|(op, _)| *op == ExprOp::Load(0))
                .map(|p| p as ExprId);
            let mut outputs = self.drafts[gi].outputs.clone();
            if needs_raw {
                let r = raw
                    .unwrap_or_else(|| epi.push(ExprOp::Load(0), self.graph.value_type(v).dtype));
                epi.outputs.insert(0, r);
                outputs.insert(0, v);
            }
            let (g_anchor, g_name) = (self.drafts[gi].anchor, self.drafts[gi].name.clone());
            let kd = &mut self.drafts[k];
            let epilogue = Some(Epilogue::elementwise(epi));
            kd.kind = match kd.kind.clone() {
                KernelKind::Conv2d(g, _, p) => KernelKind::Conv2d(g, epilogue, p),
                KernelKind::Conv2dBackpropInput(g, _) => {
                    KernelKind::Conv2dBackpropInput(g, epilogue)
                }
                KernelKind::Conv2dBackpropFilter(g, _, p) => {
                    KernelKind::Conv2dBackpropFilter(g, epilogue, p)
                }
                KernelKind::MatMul(g, _) => KernelKind::MatMul(g, epilogue),
                other => other,
            };
            kd.inputs.extend(others);
            kd.outputs = outputs.clone();
            kd.anchor = kd.anchor.max(g_anchor);
            kd.name = g_name;
            self.drafts[gi].alive = false;
            for o in outputs {
                self.producer.insert(o, k);
            }
        }
    }
}
