//! Prologue fusion: an elementwise draft whose value only convolutions read as their input `x`
//! (forward and filter gradient) and fused expressions over its own space read whole — batch
//! norm's apply and ReLU before a convolution — is not written out. Each convolution computes it
//! as it copies its input (a [`Prologue`]), and each fused expression (an epilogue, another
//! elementwise kernel) recomputes it inline from the same operands. The activation is then never
//! written and read back: the draft read one full-size tensor and wrote one, its readers read
//! the same full-size tensor instead, and the per-channel values it also reads stay in cache.
//!
//! Run last ([`LowerOptions::conv_prologues`]), after every other draft fusion, so the input
//! layouts it relies on (main inputs, then an epilogue's, then a prologue's) are final.
//!
//! [`LowerOptions::conv_prologues`]: crate::lower::LowerOptions::conv_prologues

use super::{Former, Operand, dedupe};
use crate::ir::Value;
use crate::lower::expr::{ExprId, ExprOp, FusedExpr};
use crate::lower::program::{KernelKind, Prologue};
use crate::tensor::DType;
use std::collections::HashSet;

/// Most instructions (loads and constants aside) a prologue may repeat in each of its readers.
const MAX_PROLOGUE_OPS: usize = 12;

/// An operand other than the full-size one must be at least this many times smaller than the
/// space (per-channel values, scalars): every reader then reads it from cache.
const SMALL_RATIO: usize = 16;

/// How a draft reads the value a prologue replaces.
enum Reader {
    /// A convolution reading it as `x` (input 0), and perhaps in its epilogue too.
    Convolution { epilogue_too: bool },
    /// A fused expression reading it whole: an elementwise kernel, or an epilogue over it.
    Inline,
}

/// Where a draft's fused expression numbers its operands: `Load(l)` for `l ≥ base_load` reads
/// input `first + l - base_load`; inputs `first..end` are its operands.
struct Loads {
    first: usize,
    base_load: usize,
    end: usize,
}

impl Former<'_> {
    /// Replaces every eligible elementwise draft by prologues and inline recomputations in
    /// its readers (see the module doc). `external` holds the bases fetches and assigns read.
    pub(super) fn fuse_prologues(&mut self, external: &HashSet<Value>) {
        for d in 0..self.drafts.len() {
            let Some((full, readers)) = self.prologue_plan(d, external) else {
                continue;
            };
            let v = self.drafts[d].outputs[0];
            for (c, reader) in readers {
                match reader {
                    Reader::Convolution { epilogue_too } => {
                        if epilogue_too {
                            self.inline_into(c, d, v);
                        }
                        self.give_prologue(c, d, full);
                    }
                    Reader::Inline => self.inline_into(c, d, v),
                }
            }
            self.drafts[d].alive = false;
        }
    }

    /// Whether draft `d` can become prologues: its full-size operand and its readers.
    fn prologue_plan(
        &self,
        d: usize,
        external: &HashSet<Value>,
    ) -> Option<(usize, Vec<(usize, Reader)>)> {
        let dd = &self.drafts[d];
        let KernelKind::Elementwise { shape, expr } = &dd.kind else {
            return None;
        };
        if !dd.alive || dd.outputs.len() != 1 || expr.outputs.len() != 1 {
            return None;
        }
        let v = dd.outputs[0];
        let work = expr
            .ops
            .iter()
            .filter(|(op, _)| !matches!(op, ExprOp::Load(_) | ExprOp::Const(_)))
            .count();
        if external.contains(&v)
            || expr.dtype(expr.outputs[0]) != DType::F32
            || expr.uses_random()
            || work > MAX_PROLOGUE_OPS
            || self.shape(v) != *shape
        {
            return None;
        }
        let space: usize = shape.iter().product();
        let whole = |o: &Operand| o.view.is_identity() && o.view.shape == *shape;
        let mut full = None;
        for (i, o) in dd.inputs.iter().enumerate() {
            if whole(o) && self.shape(o.base) == *shape && full.is_none() {
                full = Some(i);
            } else if self.shape(o.base).iter().product::<usize>() * SMALL_RATIO > space {
                return None;
            }
        }
        let full = full?;
        let mut readers = Vec::new();
        for (c, cd) in self.drafts.iter().enumerate() {
            let reads: Vec<usize> = (0..cd.inputs.len())
                .filter(|&i| cd.inputs[i].base == v)
                .collect();
            if c == d || !cd.alive || reads.is_empty() {
                continue;
            }
            if cd.device != dd.device || !reads.iter().all(|&i| whole(&cd.inputs[i])) {
                return None;
            }
            let reader = match &cd.kind {
                KernelKind::Conv2d(_, _, None) | KernelKind::Conv2dBackpropFilter(_, _, None)
                    if reads[0] == 0 =>
                {
                    let epilogue_too = reads.len() > 1;
                    if epilogue_too && !self.epilogue_reads_whole(c, &reads[1..], shape) {
                        return None;
                    }
                    Reader::Convolution { epilogue_too }
                }
                KernelKind::Elementwise { shape: s, .. } if s == shape => Reader::Inline,
                kind if kind.epilogue().is_some()
                    && self.epilogue_reads_whole(c, &reads, shape) =>
                {
                    Reader::Inline
                }
                _ => return None,
            };
            readers.push((c, reader));
        }
        readers
            .iter()
            .any(|(_, r)| matches!(r, Reader::Convolution { .. }))
            .then_some((full, readers))
    }

    /// Whether inputs `reads` of draft `c` are operands of its epilogue, which runs over
    /// `shape` (not of its prologue or its epilogue's finish).
    fn epilogue_reads_whole(&self, c: usize, reads: &[usize], shape: &[usize]) -> bool {
        let cd = &self.drafts[c];
        let operands = cd.kind.epilogue_inputs(cd.inputs.len());
        cd.kind.epilogue().is_some()
            && cd.outputs.first().is_some_and(|&o| self.shape(o) == shape)
            && reads.iter().all(|i| operands.contains(i))
    }

    /// The operands of draft `c`'s fused expression (its own, or its epilogue's).
    fn loads_of(&self, c: usize) -> Loads {
        let cd = &self.drafts[c];
        match &cd.kind {
            KernelKind::Elementwise { .. } => Loads {
                first: 0,
                base_load: 0,
                end: cd.inputs.len(),
            },
            kind => Loads {
                first: kind.main_inputs(),
                base_load: 1,
                end: kind.epilogue_inputs(cd.inputs.len()).end,
            },
        }
    }

    /// Recomputes `v` (draft `d`'s value) inline wherever draft `c`'s fused expression loads
    /// it, from `d`'s operands, and drops `c`'s inputs that read `v`.
    fn inline_into(&mut self, c: usize, d: usize, v: Value) {
        let KernelKind::Elementwise { expr: sub, .. } = self.drafts[d].kind.clone() else {
            return;
        };
        let sub_inputs = self.drafts[d].inputs.clone();
        let mut loads = self.loads_of(c);
        let Some(mut expr) = fused_expr(&self.drafts[c].kind).cloned() else {
            return;
        };
        let load_of = |p: usize, l: &Loads| (l.base_load + p - l.first) as u16;
        // `d`'s operands among `c`'s, added where missing (before a prologue's inputs).
        let mut sub_loads = Vec::with_capacity(sub_inputs.len());
        for o in &sub_inputs {
            let cd = &self.drafts[c];
            let p = match (loads.first..loads.end).find(|&p| cd.inputs[p] == *o) {
                Some(p) => p,
                None => {
                    self.insert_input(c, loads.end, o.clone());
                    loads.end += 1;
                    loads.end - 1
                }
            };
            sub_loads.push(load_of(p, &loads) as usize);
        }
        let reads: Vec<usize> = (loads.first..loads.end)
            .filter(|&p| self.drafts[c].inputs[p].base == v)
            .collect();
        let read_loads: Vec<u16> = reads.iter().map(|&p| load_of(p, &loads)).collect();
        expr = inline_loads(&expr, &read_loads, &sub, &sub_loads);
        for &p in reads.iter().rev() {
            let gone = load_of(p, &loads);
            self.remove_input(c, p);
            loads.end -= 1;
            expr = expr.with_slots(|l| if l > gone { l - 1 } else { l });
        }
        set_fused_expr(&mut self.drafts[c].kind, dedupe(&expr));
    }

    /// Makes convolution `c` compute its input 0 (draft `d`'s value) with `d`'s expression, from
    /// `d`'s operand `full` (its new input 0) and the others (appended).
    fn give_prologue(&mut self, c: usize, d: usize, full: usize) {
        let KernelKind::Elementwise { expr, .. } = self.drafts[d].kind.clone() else {
            return;
        };
        let inputs = self.drafts[d].inputs.clone();
        let first_input = self.drafts[c].inputs.len();
        // `full` becomes load 0, the others 1.. in order.
        let full = full as u16;
        let expr = expr.with_slots(|l| match l {
            l if l == full => 0,
            l if l < full => l + 1,
            l => l,
        });
        let cd = &mut self.drafts[c];
        cd.inputs[0] = inputs[usize::from(full)].clone();
        cd.inputs.extend(
            inputs
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != usize::from(full))
                .map(|(_, o)| o.clone()),
        );
        let prologue = Some(Prologue { expr, first_input });
        cd.kind = match cd.kind.clone() {
            KernelKind::Conv2d(g, e, _) => KernelKind::Conv2d(g, e, prologue),
            KernelKind::Conv2dBackpropFilter(g, e, _) => {
                KernelKind::Conv2dBackpropFilter(g, e, prologue)
            }
            other => other,
        };
    }

    /// Inserts input `o` of draft `c` at position `at`, moving a prologue's and an epilogue
    /// finish's inputs after it.
    fn insert_input(&mut self, c: usize, at: usize, o: Operand) {
        let cd = &mut self.drafts[c];
        cd.inputs.insert(at, o);
        shift_later_inputs(&mut cd.kind, at, true);
    }

    /// Removes input `at` of draft `c`, moving a prologue's and an epilogue finish's inputs
    /// after it.
    fn remove_input(&mut self, c: usize, at: usize) {
        let cd = &mut self.drafts[c];
        cd.inputs.remove(at);
        shift_later_inputs(&mut cd.kind, at, false);
    }
}

/// Moves the first input of a prologue and of an epilogue finish one place later (`later`) or
/// earlier when an input at or before it is inserted or removed at `at`.
fn shift_later_inputs(kind: &mut KernelKind, at: usize, later: bool) {
    let shift = |first: &mut usize| {
        if *first >= at {
            if later {
                *first += 1;
            } else {
                *first -= 1;
            }
        }
    };
    let (epilogue, prologue) = match kind {
        KernelKind::Conv2d(_, e, p) | KernelKind::Conv2dBackpropFilter(_, e, p) => (e, p.as_mut()),
        KernelKind::MatMul(_, e) | KernelKind::Conv2dBackpropInput(_, e) => (e, None),
        _ => return,
    };
    if let Some(p) = prologue {
        shift(&mut p.first_input);
    }
    if let Some(f) = epilogue.as_mut().and_then(|e| e.finish.as_mut()) {
        shift(&mut f.first_input);
    }
}

/// The fused expression of a kernel: an elementwise kernel's own, or its epilogue's.
fn fused_expr(kind: &KernelKind) -> Option<&FusedExpr> {
    match kind {
        KernelKind::Elementwise { expr, .. } => Some(expr),
        kind => kind.epilogue().map(|e| &e.expr),
    }
}

/// Replaces the fused expression of a kernel (see [`fused_expr`]).
fn set_fused_expr(kind: &mut KernelKind, new: FusedExpr) {
    match kind {
        KernelKind::Elementwise { expr, .. } => *expr = new,
        KernelKind::MatMul(_, Some(e))
        | KernelKind::Conv2d(_, Some(e), _)
        | KernelKind::Conv2dBackpropInput(_, Some(e))
        | KernelKind::Conv2dBackpropFilter(_, Some(e), _) => e.expr = new,
        _ => {}
    }
}

/// `expr` with each value loaded from one of `reads` computed by `sub` instead, whose `Load(j)`
/// becomes `Load(sub_loads[j])`.
fn inline_loads(
    expr: &FusedExpr,
    reads: &[u16],
    sub: &FusedExpr,
    sub_loads: &[usize],
) -> FusedExpr {
    let mut out = FusedExpr::default();
    let mut sub_value: Option<ExprId> = None;
    let mut remap: Vec<ExprId> = Vec::with_capacity(expr.ops.len());
    for (op, dt) in &expr.ops {
        if let ExprOp::Load(l) = op
            && reads.contains(l)
        {
            let id = *sub_value.get_or_insert_with(|| {
                let mut inner: Vec<ExprId> = Vec::with_capacity(sub.ops.len());
                for (sop, sdt) in &sub.ops {
                    let sop = match sop {
                        ExprOp::Load(j) => ExprOp::Load(sub_loads[usize::from(*j)] as u16),
                        other => other.with_operands(|id| inner[id as usize]),
                    };
                    inner.push(out.push(sop, *sdt));
                }
                inner[sub.outputs[0] as usize]
            });
            remap.push(id);
            continue;
        }
        remap.push(out.push(op.with_operands(|id| remap[id as usize]), *dt));
    }
    out.outputs = expr.outputs.iter().map(|o| remap[*o as usize]).collect();
    out
}
