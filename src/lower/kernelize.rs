//! Kernel formation: turns a simplified step graph into kernel drafts over operands.
//!
//! Layout ops become strided views of materialised values; elementwise nodes are fused per
//! [`groups`](super::groups); reductions absorb the elementwise nodes that only feed them (and
//! reductions of one group over the same axes share a kernel); an elementwise group that
//! consumes a convolution or matrix product becomes that kernel's epilogue.

use super::LowerError;
use super::expr::{ExprId, ExprOp, FusedExpr};
use super::groups::{self, Grouping, data_inputs, is_fusable, is_view};
use super::passes::StepGraph;
use super::program::{ConvGeom, Epilogue, KernelKind, MatMulGeom, PoolGeom};
use super::views::ViewMap;
use crate::ir::{Conv2dAttrs, Graph, NodeId, Op, PoolAttrs, Value, VarId, window_output};
use crate::tensor::DType;
use std::collections::{BTreeMap, HashMap, HashSet};

mod epilogue_reductions;

/// A kernel operand: a view of a materialised value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Operand {
    pub base: Value,
    pub view: ViewMap,
}

/// A kernel before scheduling and buffer assignment.
#[derive(Clone, Debug)]
pub struct Draft {
    pub name: String,
    pub device: u16,
    pub kind: KernelKind,
    pub inputs: Vec<Operand>,
    pub outputs: Vec<Value>,
    /// Topological position used to break scheduling ties (the last node it computes).
    pub anchor: usize,
    /// False once merged into another draft.
    pub alive: bool,
}

/// The result of kernel formation.
#[derive(Debug)]
pub struct Kernelized {
    pub drafts: Vec<Draft>,
    /// Materialised value → the draft that writes it.
    pub producer: HashMap<Value, usize>,
    /// The step's fetches, as contiguous operands.
    pub fetches: Vec<Operand>,
    /// `(value, variable)` for every assign of the step.
    pub assigns: Vec<(Operand, VarId)>,
}

struct Former<'a> {
    graph: &'a Graph,
    batch: usize,
    pos: HashMap<NodeId, usize>,
    grouping: Grouping,
    views: HashMap<Value, Operand>,
    drafts: Vec<Draft>,
    producer: HashMap<Value, usize>,
}

fn unsupported(graph: &Graph, id: NodeId, reason: impl Into<String>) -> LowerError {
    let n = graph.node(id);
    LowerError::Unsupported {
        node: n.name.clone(),
        op: n.op.kind_name().to_string(),
        reason: reason.into(),
    }
}

impl Former<'_> {
    fn shape(&self, v: Value) -> Vec<usize> {
        self.graph.value_type(v).shape.resolve(self.batch)
    }

    fn device(&self, id: NodeId) -> u16 {
        self.graph.node(id).device.unwrap_or(0)
    }

    fn push(&mut self, draft: Draft) -> usize {
        let i = self.drafts.len();
        for &o in &draft.outputs {
            self.producer.insert(o, i);
        }
        self.drafts.push(draft);
        i
    }

    /// The operand through which `v` is read.
    fn resolve(&self, v: Value) -> Operand {
        self.views.get(&v).cloned().unwrap_or_else(|| Operand {
            base: v,
            view: ViewMap::identity(&self.shape(v)),
        })
    }

    /// `v` as a contiguous operand (an offset is allowed), copying it if it is a strided view.
    fn contiguous(&mut self, v: Value) -> Operand {
        let r = self.resolve(v);
        let shape = self.shape(v);
        if let Some(view) = r.view.reshape(&shape).filter(|v| v.is_dense()) {
            return Operand { base: r.base, view };
        }
        self.materialize(v, r)
    }

    /// Writes the view `r` of `v` into a fresh contiguous buffer holding `v`.
    fn materialize(&mut self, v: Value, r: Operand) -> Operand {
        let shape = self.shape(v);
        let dtype = self.graph.value_type(v).dtype;
        let mut expr = FusedExpr::default();
        let x = expr.push(ExprOp::Load(0), dtype);
        expr.outputs = vec![x];
        let anchor = self.pos.get(&v.node).copied().unwrap_or(0);
        self.push(Draft {
            name: format!("{}/copy", self.graph.node(v.node).name),
            device: self.device(v.node),
            kind: KernelKind::Elementwise {
                shape: shape.clone(),
                expr,
            },
            inputs: vec![r],
            outputs: vec![v],
            anchor,
            alive: true,
        });
        self.views.remove(&v);
        Operand {
            base: v,
            view: ViewMap::identity(&shape),
        }
    }

    fn view_node(&mut self, id: NodeId) {
        let v = Value::first(id);
        let input = self.graph.inputs(id)[0];
        let out_shape = self.shape(v);
        let mut r = self.resolve(input);
        let composed = match &self.graph.node(id).op {
            Op::Reshape { .. } | Op::Identity => r.view.reshape(&out_shape),
            Op::Transpose { perm } => Some(r.view.transpose(perm)),
            Op::Slice { axis, start, end } => Some(r.view.slice(*axis, *start, *end)),
            Op::Broadcast { .. } => Some(r.view.broadcast_to(&out_shape)),
            _ => None,
        };
        let view = match composed {
            Some(view) => view,
            None => {
                r = self.materialize(input, r);
                r.view
                    .reshape(&out_shape)
                    .unwrap_or_else(|| ViewMap::identity(&out_shape))
            }
        };
        self.views.insert(v, Operand { base: r.base, view });
    }

    /// Builds the fused expression computing `outputs` over group `g`'s space: members of `g`
    /// and absorbed (recomputed) members of other groups are computed inline, everything else
    /// is loaded through its view. For the group's own kernel (`own`) every member is inline;
    /// another kernel (a reduction absorbing members) loads the members `g` writes out.
    fn group_expr(&self, g: usize, outputs: &[Value], own: bool) -> (FusedExpr, Vec<Operand>) {
        let mut b = ExprBuilder {
            former: self,
            g,
            own,
            shape: self.grouping.groups[g].shape.clone(),
            expr: FusedExpr::default(),
            operands: Vec::new(),
            vals: HashMap::new(),
        };
        for &o in outputs {
            b.value(o);
        }
        let ExprBuilder {
            mut expr,
            operands,
            vals,
            ..
        } = b;
        expr.outputs = outputs
            .iter()
            .filter_map(|v| vals.get(v).copied())
            .collect();
        (expr, operands)
    }

    fn group_drafts(&mut self) {
        for g in 0..self.grouping.groups.len() {
            let outputs = self.grouping.outputs[g].clone();
            if outputs.is_empty() {
                continue;
            }
            let (expr, inputs) = self.group_expr(g, &outputs, true);
            let grp = &self.grouping.groups[g];
            let last = outputs
                .iter()
                .map(|v| v.node)
                .max_by_key(|n| self.pos.get(n).copied().unwrap_or(0))
                .unwrap_or(grp.members[0]);
            let draft = Draft {
                name: self.graph.node(last).name.clone(),
                device: grp.device,
                kind: KernelKind::Elementwise {
                    shape: grp.shape.clone(),
                    expr,
                },
                inputs,
                outputs,
                anchor: self.pos.get(&last).copied().unwrap_or(0),
                alive: true,
            };
            self.push(draft);
        }
    }

    /// For every draft, the set of drafts it reads from, directly or transitively (a bitset
    /// over draft indices; computed iteratively, parents first).
    fn draft_ancestors(&self) -> Vec<Vec<u64>> {
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
    fn merge_reductions(&mut self) {
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
    fn absorb_reduction(&mut self, s: usize, d: usize) {
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
            let op = match op {
                ExprOp::Load(k) => ExprOp::Load(slots[usize::from(*k)]),
                ExprOp::Random { seed, counter } => ExprOp::Random {
                    seed: *seed,
                    counter: slots[usize::from(*counter)],
                },
                ExprOp::Unary(u, a) => ExprOp::Unary(*u, a + shift),
                ExprOp::Binary(b, x, y) => ExprOp::Binary(*b, x + shift, y + shift),
                ExprOp::Select(c, a, b) => ExprOp::Select(c + shift, a + shift, b + shift),
                ExprOp::Cast(a) => ExprOp::Cast(a + shift),
                other => other.clone(),
            };
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

    fn reduce_drafts(&mut self, reduces: &[NodeId]) {
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
                },
                inputs: vec![operand],
                outputs: vec![Value::first(r)],
                anchor: self.pos.get(&r).copied().unwrap_or(0),
                alive: true,
            };
            self.push(draft);
        }
    }

    fn kernel_node(&mut self, id: NodeId) -> Result<(), LowerError> {
        let node = self.graph.node(id).clone();
        let ins = self.graph.inputs(id);
        let out = Value::first(id);
        let oshape = self.shape(out);
        let ishape = |i: usize| self.shape(ins[i]);
        let kind = match &node.op {
            Op::MatMul {
                transpose_a,
                transpose_b,
            } => {
                let (a, b) = (ishape(0), ishape(1));
                let (ra, rb) = (a.len(), b.len());
                let (m, k) = if *transpose_a {
                    (a[ra - 1], a[ra - 2])
                } else {
                    (a[ra - 2], a[ra - 1])
                };
                let n = if *transpose_b { b[rb - 2] } else { b[rb - 1] };
                KernelKind::MatMul(
                    MatMulGeom {
                        batch: a[..ra - 2].iter().product(),
                        m,
                        n,
                        k,
                        transpose_a: *transpose_a,
                        transpose_b: *transpose_b,
                        rhs_batched: rb > 2,
                    },
                    None,
                )
            }
            Op::Conv2d(attrs) => {
                KernelKind::Conv2d(conv_geom(attrs, &ishape(0), &ishape(1), &oshape), None)
            }
            Op::Conv2dBackpropInput { attrs, .. } => KernelKind::Conv2dBackpropInput(
                conv_geom(attrs, &oshape, &ishape(1), &ishape(0)),
                None,
            ),
            Op::Conv2dBackpropFilter { attrs, .. } => {
                KernelKind::Conv2dBackpropFilter(conv_geom(attrs, &ishape(0), &oshape, &ishape(1)))
            }
            Op::Pool(a) => KernelKind::Pool(pool_geom(a, &ishape(0), &oshape)),
            Op::MaxPoolGrad(a) => KernelKind::MaxPoolGrad(pool_geom(a, &ishape(0), &ishape(1))),
            Op::AvgPoolGrad { attrs, .. } => {
                KernelKind::AvgPoolGrad(pool_geom(attrs, &oshape, &ishape(0)))
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                let s = ishape(0);
                if *axis + 1 != s.len() {
                    return Err(unsupported(
                        self.graph,
                        id,
                        "softmax is lowered over the last axis only; transpose first",
                    ));
                }
                KernelKind::Softmax {
                    rows: s[..*axis].iter().product(),
                    cols: s[*axis],
                    log: matches!(node.op, Op::LogSoftmax { .. }),
                }
            }
            Op::SparseSoftmaxCrossEntropy => {
                let s = ishape(0);
                KernelKind::SparseSoftmaxCrossEntropy {
                    rows: s[0],
                    classes: s[1],
                }
            }
            Op::ArgMax { axis } => {
                let s = ishape(0);
                KernelKind::ArgMax {
                    outer: s[..*axis].iter().product(),
                    len: s[*axis],
                    inner: s[*axis + 1..].iter().product(),
                }
            }
            Op::InTopK { k } => {
                let s = ishape(0);
                KernelKind::InTopK {
                    rows: s[0],
                    classes: s[1],
                    k: *k,
                }
            }
            Op::Concat { axis } => {
                let inner: usize = oshape[*axis + 1..].iter().product();
                KernelKind::Concat {
                    outer: oshape[..*axis].iter().product(),
                    sizes: (0..ins.len()).map(|i| ishape(i)[*axis] * inner).collect(),
                    inner,
                }
            }
            Op::AllReduce { op } => KernelKind::AllReduce {
                op: *op,
                len: oshape.iter().product(),
            },
            Op::Pad { pads } => KernelKind::Pad {
                shape: ishape(0),
                pads: pads.clone(),
            },
            other => {
                return Err(unsupported(
                    self.graph,
                    id,
                    format!(
                        "no kernel for {} (it should have been expanded or fused)",
                        other.kind_name()
                    ),
                ));
            }
        };
        let inputs = ins.iter().map(|&v| self.contiguous(v)).collect();
        let anchor = self.pos.get(&id).copied().unwrap_or(0);
        self.push(Draft {
            name: node.name.clone(),
            device: self.device(id),
            kind,
            inputs,
            outputs: vec![out],
            anchor,
            alive: true,
        });
        Ok(())
    }

    /// True when `target` depends on `source` through data edges.
    fn depends(&self, target: NodeId, source: NodeId) -> bool {
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
    fn draft_reaches(&self, from: usize, target: usize) -> bool {
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
    fn fuse_epilogues(&mut self, external: &HashSet<Value>) {
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
                        KernelKind::Conv2d(_, None)
                            | KernelKind::Conv2dBackpropInput(_, None)
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
            let mut epi = FusedExpr::default();
            let mut raw = None;
            for (op, dt) in &expr.ops {
                let op = match op {
                    ExprOp::Load(i) | ExprOp::Random { counter: i, .. } => {
                        let i = usize::from(*i);
                        let new = if i == s {
                            0
                        } else {
                            1 + i - usize::from(i > s)
                        } as u16;
                        match op {
                            ExprOp::Load(_) => ExprOp::Load(new),
                            ExprOp::Random { seed, .. } => ExprOp::Random {
                                seed: *seed,
                                counter: new,
                            },
                            _ => op.clone(),
                        }
                    }
                    other => other.clone(),
                };
                let id = epi.push(op.clone(), *dt);
                if op == ExprOp::Load(0) && raw.is_none() {
                    raw = Some(id);
                }
            }
            epi.outputs = expr.outputs.clone();
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
                KernelKind::Conv2d(g, _) => KernelKind::Conv2d(g, epilogue),
                KernelKind::Conv2dBackpropInput(g, _) => {
                    KernelKind::Conv2dBackpropInput(g, epilogue)
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

fn conv_geom(a: &Conv2dAttrs, x: &[usize], w: &[usize], y: &[usize]) -> ConvGeom {
    let pad = |axis: usize, input: usize, k: usize| {
        window_output(
            input,
            k,
            a.strides[axis],
            a.dilations[axis],
            a.padding,
            axis,
        )
        .map(|(_, b, e)| (b, e))
        .unwrap_or((0, 0))
    };
    let (pt, pb) = pad(0, x[1], w[0]);
    let (pl, pr) = pad(1, x[2], w[1]);
    ConvGeom {
        n: x[0],
        h: x[1],
        w: x[2],
        c: x[3],
        oh: y[1],
        ow: y[2],
        o: y[3],
        kh: w[0],
        kw: w[1],
        stride: a.strides,
        dilation: a.dilations,
        pad: [pt, pb, pl, pr],
        groups: a.groups,
    }
}

fn pool_geom(a: &PoolAttrs, x: &[usize], y: &[usize]) -> PoolGeom {
    let pad = |axis: usize, input: usize| {
        window_output(input, a.window[axis], a.strides[axis], 1, a.padding, axis)
            .map(|(_, b, e)| (b, e))
            .unwrap_or((0, 0))
    };
    let (pt, pb) = pad(0, x[1]);
    let (pl, pr) = pad(1, x[2]);
    PoolGeom {
        kind: a.kind,
        n: x[0],
        h: x[1],
        w: x[2],
        c: x[3],
        oh: y[1],
        ow: y[2],
        window: a.window,
        stride: a.strides,
        pad: [pt, pb, pl, pr],
    }
}

/// Forms the kernels of `sg` for batch size `batch`.
/// With `epilogue_reductions`, per-channel reductions of convolution outputs join the
/// convolutions' epilogues (see [`Epilogue::reductions`]).
pub fn kernelize(
    sg: &StepGraph,
    batch: usize,
    fuse: bool,
    epilogue_reductions: bool,
) -> Result<Kernelized, LowerError> {
    let graph = &sg.graph;
    let order = sg.live_nodes()?;
    let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut consumers: HashMap<Value, Vec<NodeId>> = HashMap::new();
    for &id in &order {
        for v in graph.inputs(id) {
            let c = consumers.entry(v).or_default();
            if !c.contains(&id) {
                c.push(id);
            }
        }
    }
    let mut pinned: HashSet<Value> = sg.fetches.iter().copied().collect();
    let mut assigns_raw = Vec::new();
    for &a in &sg.assigns {
        if let Op::Assign { var } = graph.node(a).op {
            let v = graph.inputs(a)[0];
            pinned.insert(v);
            assigns_raw.push((v, var));
        }
    }
    let shape_of = |v: Value| graph.value_type(v).shape.resolve(batch);
    let device_of = |id: NodeId| graph.node(id).device.unwrap_or(0);
    let grouping = groups::group(
        &groups::GroupInput {
            graph,
            order: &order,
            pos: &pos,
            shape_of: &shape_of,
            device_of: &device_of,
            pinned: &pinned,
            fuse,
        },
        &consumers,
    );
    let mut f = Former {
        graph,
        batch,
        pos,
        grouping,
        views: HashMap::new(),
        drafts: Vec::new(),
        producer: HashMap::new(),
    };
    let mut reduces = Vec::new();
    for &id in &order {
        let op = &graph.node(id).op;
        if op.is_source() || is_fusable(op) || matches!(op, Op::Assign { .. } | Op::Group) {
            continue;
        }
        if is_view(op) {
            f.view_node(id);
        } else if matches!(op, Op::Reduce { .. }) {
            reduces.push(id);
        } else {
            f.kernel_node(id)?;
        }
    }
    f.group_drafts();
    f.reduce_drafts(&reduces);
    if fuse {
        f.merge_reductions();
    }
    let fetches: Vec<Operand> = sg.fetches.iter().map(|&v| f.contiguous(v)).collect();
    let assigns: Vec<(Operand, VarId)> = assigns_raw
        .into_iter()
        .map(|(v, var)| (f.contiguous(v), var))
        .collect();
    if fuse {
        let external: HashSet<Value> = fetches
            .iter()
            .chain(assigns.iter().map(|(o, _)| o))
            .map(|o| o.base)
            .collect();
        f.fuse_epilogues(&external);
        if epilogue_reductions {
            f.fuse_epilogue_reductions();
        }
    }
    Ok(Kernelized {
        drafts: f.drafts,
        producer: f.producer,
        fetches,
        assigns,
    })
}

/// Value numbering of a fused expression: identical instructions on identical operands are
/// computed once (merged prologues load the same operands and repeat subexpressions).
fn dedupe(e: &FusedExpr) -> FusedExpr {
    let mut out = FusedExpr::default();
    let mut remap: Vec<ExprId> = Vec::with_capacity(e.ops.len());
    let mut seen: HashMap<String, ExprId> = HashMap::new();
    for (op, dt) in &e.ops {
        let r = |id: &ExprId| remap[*id as usize];
        let op = match op {
            ExprOp::Unary(u, a) => ExprOp::Unary(*u, r(a)),
            ExprOp::Binary(b, x, y) => ExprOp::Binary(*b, r(x), r(y)),
            ExprOp::Select(c, a, b) => ExprOp::Select(r(c), r(a), r(b)),
            ExprOp::Cast(a) => ExprOp::Cast(r(a)),
            other => other.clone(),
        };
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
struct ExprBuilder<'f, 'g> {
    former: &'f Former<'g>,
    g: usize,
    /// Building group `g`'s own kernel (else: a reduction prologue recomputing members).
    own: bool,
    shape: Vec<usize>,
    expr: FusedExpr,
    operands: Vec<Operand>,
    vals: HashMap<Value, ExprId>,
}

impl ExprBuilder<'_, '_> {
    fn slot(&mut self, o: Operand) -> u16 {
        match self.operands.iter().position(|x| *x == o) {
            Some(i) => i as u16,
            None => {
                self.operands.push(o);
                (self.operands.len() - 1) as u16
            }
        }
    }

    /// `w` loaded through its view, broadcast to the kernel's space.
    fn load(&mut self, w: Value) -> ExprId {
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
    fn value(&mut self, w: Value) -> ExprId {
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

    fn node(&mut self, m: NodeId) -> ExprId {
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
