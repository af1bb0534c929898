//! Building a group's [`FusedExpr`]: the expression builder that turns the elementwise nodes
//! of a fusion group into instructions over operand slots, and value numbering (`dedupe`) of
//! the result.

use super::{Former, Operand};
use crate::ir::{NodeId, Op, Value};
use crate::lower::expr::{ExprId, ExprOp, FusedExpr};
use crate::lower::groups::data_inputs;
use crate::tensor::DType;
use std::collections::HashMap;

/// Value numbering of a fused expression: identical instructions on identical operands are
/// computed once (merged prologues load the same operands and repeat subexpressions).
pub(super) fn dedupe(e: &FusedExpr) -> FusedExpr {
    let mut out = FusedExpr::default();
    let mut remap: Vec<ExprId> = Vec::with_capacity(e.ops.len());
    let mut seen: HashMap<String, ExprId> = HashMap::new();
    for (op, dt) in &e.ops {
        let op = op.with_operands(|id| remap[id as usize]);
        let key = format!("{op:?}:{dt:?}");
        let id = match seen.get(&key) {
            Some(&id) => id,
            None => {
                let id = out.push(op, *dt);
                seen.insert(key, id);
                id
            }
        };
        remap.push(id);
    }
    out.outputs = e.outputs.iter().map(|o| remap[*o as usize]).collect();
    out
}

/// Builds one fused expression by walking the graph from the values a kernel writes.
pub(super) struct ExprBuilder<'f, 'g> {
    pub(super) former: &'f Former<'g>,
    pub(super) g: usize,
    /// Building group `g`'s own kernel (else: a reduction prologue recomputing members).
    pub(super) own: bool,
    pub(super) shape: Vec<usize>,
    pub(super) expr: FusedExpr,
    pub(super) operands: Vec<Operand>,
    pub(super) vals: HashMap<Value, ExprId>,
}

impl ExprBuilder<'_, '_> {
    pub(super) fn slot(&mut self, o: Operand) -> u16 {
        match self.operands.iter().position(|x| *x == o) {
            Some(i) => i as u16,
            None => {
                self.operands.push(o);
                (self.operands.len() - 1) as u16
            }
        }
    }

    /// `w` loaded through its view, broadcast to the kernel's space.
    pub(super) fn load(&mut self, w: Value) -> ExprId {
        let r = self.former.resolve(w);
        let o = Operand {
            base: r.base,
            view: r.view.broadcast_to(&self.shape),
        };
        let s = self.slot(o);
        self.expr
            .push(ExprOp::Load(s), self.former.graph.value_type(w).dtype)
    }

    /// The expression of `w`: computed inline when it belongs to this kernel's group or is
    /// recomputed by its consumers, loaded otherwise.
    pub(super) fn value(&mut self, w: Value) -> ExprId {
        if let Some(&e) = self.vals.get(&w) {
            return e;
        }
        let grouping = &self.former.grouping;
        let inline = match grouping.group_of.get(&w.node) {
            Some(&gw) => (gw == self.g && self.own) || grouping.recomputed(w),
            None => false,
        };
        let e = if inline {
            self.node(w.node)
        } else {
            self.load(w)
        };
        self.vals.insert(w, e);
        e
    }

    pub(super) fn node(&mut self, m: NodeId) -> ExprId {
        let graph = self.former.graph;
        let node = graph.node(m);
        let dtype = node.outputs[0].dtype;
        let ins = data_inputs(graph, m);
        match &node.op {
            Op::Unary(u) => {
                let a = self.value(ins[0]);
                self.expr.push(ExprOp::Unary(*u, a), dtype)
            }
            Op::Binary(b) => {
                let a = self.value(ins[0]);
                let c = self.value(ins[1]);
                self.expr.push(ExprOp::Binary(*b, a, c), dtype)
            }
            Op::Select => {
                let c = self.value(ins[0]);
                let a = self.value(ins[1]);
                let b = self.value(ins[2]);
                self.expr.push(ExprOp::Select(c, a, b), dtype)
            }
            Op::Cast { .. } => {
                let a = self.value(ins[0]);
                self.expr.push(ExprOp::Cast(a), dtype)
            }
            Op::RandomUniform { seed } => {
                let r = self.former.resolve(ins[0]);
                let s = self.slot(Operand {
                    base: r.base,
                    view: r.view.broadcast_to(&self.shape),
                });
                self.expr.push(
                    ExprOp::Random {
                        seed: *seed,
                        counter: s,
                    },
                    dtype,
                )
            }
            Op::OneHot { depth } => {
                let r = self.former.resolve(ins[0]);
                let label_type = graph.value_type(ins[0]).dtype;
                let s = self.slot(Operand {
                    base: r.base,
                    view: r.view.with_trailing_broadcast(&[*depth]),
                });
                let label = self.expr.push(ExprOp::Load(s), label_type);
                let label = self.expr.push(ExprOp::Cast(label), DType::I64);
                let index = self
                    .expr
                    .push(ExprOp::Index((self.shape.len() - 1) as u8), DType::I64);
                let hit = self.expr.push(
                    ExprOp::Binary(crate::ir::BinaryOp::Eq, label, index),
                    DType::Bool,
                );
                self.expr.push(ExprOp::Cast(hit), dtype)
            }
            // Group members are elementwise; anything else is read.
            _ => self.load(Value::first(m)),
        }
    }
}
