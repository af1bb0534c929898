//! Kernel formation: turns a simplified step graph into kernel drafts over operands.
//!
//! Layout ops become strided views of materialised values; elementwise nodes are fused per
//! [`groups`]; reductions absorb the elementwise nodes that only feed them (and
//! reductions of one group over the same axes share a kernel); an elementwise group that
//! consumes a convolution or matrix product becomes that kernel's epilogue, one that consumes a
//! reduction's results point for point its finish.

use super::LowerError;
use super::expr::{ExprOp, FusedExpr};
use super::groups::{self, Grouping, is_fusable, is_view};
use super::passes::StepGraph;
use super::precision::HalfFormat;
use super::program::{ConvGeom, KernelKind, MatMulGeom};
use super::views::ViewMap;
use crate::ir::{Graph, NodeId, Op, Value, VarId};
use std::collections::{HashMap, HashSet};

mod epilogue_reductions;
mod epilogues;
mod expr_builder;
mod geometry;
mod prologues;
mod reduce_finish;
mod reductions;

use expr_builder::{ExprBuilder, dedupe};
use geometry::{conv_geom, pool_geom};

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
    /// Values stored in bf16 (the `half-storage` pass, [`super::half_storage`]); empty until
    /// it runs.
    pub half_stored: HashSet<Value>,
}

struct Former<'a> {
    graph: &'a Graph,
    /// GEMMs that round their operands ([`StepGraph::round_operands`]).
    round_operands: &'a HashMap<NodeId, HalfFormat>,
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

    fn kernel_node(&mut self, id: NodeId) -> Result<(), LowerError> {
        let node = self.graph.node(id).clone();
        let ins = self.graph.inputs(id);
        let out = Value::first(id);
        let oshape = self.shape(out);
        let ishape = |i: usize| self.shape(ins[i]);
        let round_operands = self.round_operands.get(&id).copied();
        let conv = |g: ConvGeom| ConvGeom {
            round_operands,
            ..g
        };
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
                        round_operands,
                    },
                    None,
                )
            }
            Op::Conv2d(attrs) => KernelKind::Conv2d(
                conv(conv_geom(attrs, &ishape(0), &ishape(1), &oshape)),
                None,
                None,
            ),
            Op::Conv2dBackpropInput { attrs, .. } => KernelKind::Conv2dBackpropInput(
                conv(conv_geom(attrs, &oshape, &ishape(1), &ishape(0))),
                None,
            ),
            Op::Conv2dBackpropFilter { attrs, .. } => KernelKind::Conv2dBackpropFilter(
                conv(conv_geom(attrs, &ishape(0), &oshape, &ishape(1))),
                None,
                None,
            ),
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
}

/// Which draft fusions [`kernelize`] makes beyond elementwise groups.
#[derive(Clone, Copy, Debug)]
pub struct Fusions {
    /// Fuse at all (elementwise groups, reductions, epilogues).
    pub fuse: bool,
    /// Per-channel reductions of convolution outputs join the convolutions' epilogues (see
    /// [`Epilogue::reductions`](super::Epilogue::reductions)).
    pub epilogue_reductions: bool,
    /// Batch norm's variances join them too (see
    /// [`ChannelReduction::Variance`](super::ChannelReduction::Variance)).
    pub epilogue_variances: bool,
    /// Convolutions compute their input in a prologue (see [`Prologue`](super::Prologue)).
    pub conv_prologues: bool,
}

/// Forms the kernels of `sg` for batch size `batch`, fusing as `fusions` says.
pub fn kernelize(sg: &StepGraph, batch: usize, fusions: Fusions) -> Result<Kernelized, LowerError> {
    let Fusions {
        fuse,
        epilogue_reductions,
        epilogue_variances,
        conv_prologues,
    } = fusions;
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
        round_operands: &sg.round_operands,
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
            f.fuse_epilogue_reductions(epilogue_variances);
        }
        let assigned: HashSet<Value> = assigns.iter().map(|(o, _)| o.base).collect();
        if epilogue_reductions && epilogue_variances {
            f.fuse_epilogue_finishes(&assigned);
        }
        f.fuse_reduce_finishes(&assigned);
        if conv_prologues {
            f.fuse_prologues(&external);
        }
    }
    Ok(Kernelized {
        drafts: f.drafts,
        producer: f.producer,
        fetches,
        assigns,
        half_stored: HashSet::new(),
    })
}
