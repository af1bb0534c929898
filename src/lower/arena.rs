//! Arena fusion: one kernel updates many variables.
//!
//! Optimizers build the same update expression for every variable (`w ← w − lr·(μ·m + g)`).
//! With data-parallel towers `g = (g⁰ + … + gᴺ⁻¹)·(1/N)`: the average reads every tower's
//! gradient across devices, so fusion gives it its own group and then moves it into the update
//! ([`super::groups`]); each tower's gradient stays materialised where its tower computed it.
//! After elementwise fusion each variable has its own update kernel. When several such kernels
//! compute the same expression with the same shared scalars, and the variables they read and
//! write sit back to back in the state layout, they merge into one kernel over the whole range:
//! the variables' bytes are already contiguous ([`StateLayout`]), and the
//! memory planner is asked to place their gradients contiguously in the same order — the
//! *gradient arena*, one per tower (and per bucket), each on its tower's device, all with the
//! same layout. Ranges are cut into buckets of at most `bucket_bytes`, so a bucket's kernel can
//! run as soon as its own gradients exist. Replicas of replicated training update their own
//! variables with their own kernels, which read the same arenas.
//!
//! [`Program::buckets`](super::Program::buckets) lists every merged kernel with its arenas and
//! member offsets: what a backend needs to render it (the CUDA backend). In a distributed step,
//! [`super::collectives`] reduces each arena across processes before the bucket's kernel runs:
//! one in-place `AllReduce` kernel over the range of a bucket of all-reduces, which the arena is
//! or is a contiguous part of.

use super::expr::ExprOp;
use super::kernelize::{Draft, Kernelized, Operand};
use super::layout::StateLayout;
use super::program::KernelKind;
use crate::ir::{Graph, Op, Value, VarId};
use crate::tensor::DType;
use std::collections::{BTreeMap, HashMap, HashSet};

/// One operand of a fused update kernel, per member variable.
#[derive(Clone, Debug, PartialEq)]
pub enum ArenaOperand {
    /// A variable family: member `i` reads variable `vars[i]` (contiguous in the state arena).
    State { vars: Vec<VarId> },
    /// Gradient-like values: member `i` reads `values[i]`, placed contiguously by the planner.
    Arena { values: Vec<Value> },
    /// The same broadcast operand (e.g. the learning rate) for every member.
    Shared(Operand),
}

/// A kernel updating a contiguous range of variables in one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct ArenaKernel {
    pub name: String,
    pub device: u16,
    pub dtype_of_outputs: Vec<DType>,
    /// The member update kernel's expression (the same for every member).
    pub expr: super::expr::FusedExpr,
    pub operands: Vec<ArenaOperand>,
    /// Output `j` of member `i` is written to `outputs[j][i]`.
    pub outputs: Vec<Vec<VarId>>,
    /// Elements per member (the variables' sizes).
    pub sizes: Vec<usize>,
    /// Scheduling position: the latest of its members'.
    pub anchor: usize,
}

impl ArenaKernel {
    /// Total elements of the range.
    pub fn len(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// True for a kernel without elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Role {
    State,
    Arena,
    Shared(String),
}

/// A member candidate: one update draft, with its operands' roles resolved.
struct Member {
    draft: usize,
    roles: Vec<(Role, Option<VarId>, Option<Value>)>,
    outs: Vec<VarId>,
    size: usize,
}

fn read_of(graph: &Graph, v: Value) -> Option<VarId> {
    match graph.node(v.node).op {
        Op::Variable { var } => Some(var),
        _ => None,
    }
}

/// Merges update drafts into arena kernels. `assigned` maps each assigned value to its
/// variable; the merged assigns are removed from `k.assigns`. `all_reduced` gives the bucket
/// and member index of every all-reduce result ([`super::collectives`]): an arena of such
/// results only holds consecutive members of one bucket, so it lies inside the bucket's range.
pub fn fuse_updates(
    graph: &Graph,
    k: &mut Kernelized,
    layout: &StateLayout,
    batch: usize,
    bucket_bytes: usize,
    all_reduced: &HashMap<Value, (u32, u32)>,
) -> Vec<ArenaKernel> {
    let assigned: HashMap<Value, VarId> = k
        .assigns
        .iter()
        .filter(|(o, var)| {
            let shape = graph.variable(*var).ty.shape.resolve(batch);
            o.view.is_identity() && o.view.shape == shape
        })
        .map(|(o, var)| (o.base, *var))
        .collect();
    // Values read by anything but their own assign (another kernel, a fetch) must stay
    // materialised, so their update kernel cannot dissolve into a fused one.
    let mut read_elsewhere: HashSet<Value> = k.fetches.iter().map(|o| o.base).collect();
    // Variables whose start-of-step value is fetched cannot be overwritten in place.
    let fetched_vars: HashSet<VarId> = k
        .fetches
        .iter()
        .filter_map(|o| read_of(graph, o.base))
        .collect();
    for d in k.drafts.iter().filter(|d| d.alive) {
        read_elsewhere.extend(d.inputs.iter().map(|o| o.base));
    }
    let mut assign_count: HashMap<Value, usize> = HashMap::new();
    for (o, _) in &k.assigns {
        *assign_count.entry(o.base).or_default() += 1;
    }
    // Within a family every member reads its own gradients; families may share them (every
    // replica's update reads every tower's gradient arena).
    let mut used_grads: HashMap<String, HashSet<Value>> = HashMap::new();
    let mut families: BTreeMap<String, Vec<Member>> = BTreeMap::new();
    for (i, d) in k.drafts.iter().enumerate() {
        if !d.alive {
            continue;
        }
        let KernelKind::Elementwise { shape, expr } = &d.kind else {
            continue;
        };
        if expr
            .ops
            .iter()
            .any(|(op, _)| matches!(op, ExprOp::Index(_) | ExprOp::Random { .. }))
        {
            continue;
        }
        let Some(outs) = d
            .outputs
            .iter()
            .map(|o| assigned.get(o).copied())
            .collect::<Option<Vec<VarId>>>()
        else {
            continue;
        };
        if d.outputs
            .iter()
            .any(|o| read_elsewhere.contains(o) || assign_count.get(o).copied() != Some(1))
            || outs.iter().any(|v| fetched_vars.contains(v))
        {
            continue;
        }
        let mut roles = Vec::with_capacity(d.inputs.len());
        let mut ok = true;
        for o in &d.inputs {
            let full = o.view.is_identity() && &o.view.shape == shape;
            if let (true, Some(var)) = (full, read_of(graph, o.base)) {
                roles.push((Role::State, Some(var), None));
            } else if full && k.producer.contains_key(&o.base) {
                roles.push((Role::Arena, None, Some(o.base)));
            } else if o.view.strides.iter().all(|&s| s == 0) {
                // The same scalar whatever the rank of the view that broadcasts it.
                roles.push((
                    Role::Shared(format!("{:?}@{}", o.base, o.view.offset)),
                    None,
                    None,
                ));
            } else {
                ok = false;
                break;
            }
        }
        // A member's outputs must not feed another member.
        let own_outputs: HashSet<Value> = d.outputs.iter().copied().collect();
        if !ok
            || roles
                .iter()
                .any(|(_, _, v)| v.is_some_and(|v| own_outputs.contains(&v)))
        {
            continue;
        }
        let key = format!(
            "dev{} {} {:?}",
            d.device,
            expr,
            roles.iter().map(|r| &r.0).collect::<Vec<_>>()
        );
        let used = used_grads.entry(key.clone()).or_default();
        let grads: Vec<Value> = roles.iter().filter_map(|r| r.2).collect();
        let distinct: HashSet<Value> = grads.iter().copied().collect();
        if distinct.len() != grads.len() || grads.iter().any(|g| used.contains(g)) {
            continue;
        }
        used.extend(grads);
        families.entry(key).or_default().push(Member {
            draft: i,
            roles,
            outs,
            size: shape.iter().product(),
        });
    }
    let mut kernels = Vec::new();
    let mut merged_drafts: Vec<Vec<usize>> = Vec::new();
    for (_, mut members) in families {
        if members.len() < 2 {
            continue;
        }
        members.sort_by_key(|m| (layout.slot(m.outs[0]).device, layout.slot(m.outs[0]).offset));
        // Cut into runs where every variable family stays contiguous and every arena on one
        // device, then into buckets.
        let device_of = |v: Value| k.producer.get(&v).map(|&d| k.drafts[d].device);
        let contiguous = |a: &Member, b: &Member| {
            let next = |x: VarId, y: VarId| {
                let (sx, sy) = (layout.slot(x), layout.slot(y));
                sx.device == sy.device && sx.offset + sx.bytes == sy.offset
            };
            a.outs.iter().zip(&b.outs).all(|(&x, &y)| next(x, y))
                && a.roles
                    .iter()
                    .zip(&b.roles)
                    .all(|(ra, rb)| match (ra.1, rb.1, ra.2, rb.2) {
                        (Some(x), Some(y), _, _) => next(x, y),
                        (_, _, Some(x), Some(y)) => {
                            let next_member = match (all_reduced.get(&x), all_reduced.get(&y)) {
                                (None, None) => true,
                                (Some(a), Some(b)) => a.0 == b.0 && b.1 == a.1 + 1,
                                _ => false,
                            };
                            device_of(x) == device_of(y) && next_member
                        }
                        _ => true,
                    })
        };
        let mut runs: Vec<Vec<Member>> = Vec::new();
        let bytes = |m: &Member| layout.slot(m.outs[0]).bytes;
        for m in members {
            match runs.last_mut() {
                Some(run)
                    if run.last().is_some_and(|last| contiguous(last, &m))
                        && run.iter().map(bytes).sum::<usize>() + bytes(&m)
                            <= bucket_bytes.max(1) =>
                {
                    run.push(m)
                }
                _ => runs.push(vec![m]),
            }
        }
        for run in runs.into_iter().filter(|r| r.len() >= 2) {
            let first = &k.drafts[run[0].draft];
            let KernelKind::Elementwise { expr, .. } = &first.kind else {
                continue;
            };
            let operands = (0..run[0].roles.len())
                .map(|j| match &run[0].roles[j].0 {
                    Role::State => ArenaOperand::State {
                        vars: run.iter().filter_map(|m| m.roles[j].1).collect(),
                    },
                    Role::Arena => ArenaOperand::Arena {
                        values: run.iter().filter_map(|m| m.roles[j].2).collect(),
                    },
                    Role::Shared(_) => ArenaOperand::Shared(first.inputs[j].clone()),
                })
                .collect();
            let outputs = (0..run[0].outs.len())
                .map(|j| run.iter().map(|m| m.outs[j]).collect())
                .collect();
            let last = &k.drafts[run[run.len() - 1].draft];
            let kernel = ArenaKernel {
                name: format!("{}..{}", first.name, last.name),
                device: first.device,
                dtype_of_outputs: expr.outputs.iter().map(|&o| expr.dtype(o)).collect(),
                expr: expr.clone(),
                operands,
                outputs,
                sizes: run.iter().map(|m| m.size).collect(),
                anchor: run
                    .iter()
                    .map(|m| k.drafts[m.draft].anchor)
                    .max()
                    .unwrap_or(0),
            };
            merged_drafts.push(run.iter().map(|m| m.draft).collect());
            kernels.push(kernel);
        }
    }
    // A gradient lives in one arena: kernels sharing gradients must read the same arenas
    // (replicas cut into the same buckets); a kernel that would split one is not fused.
    let mut arena_of: HashMap<Value, Vec<Value>> = HashMap::new();
    let mut merged_values: HashSet<Value> = HashSet::new();
    let mut kept = Vec::with_capacity(kernels.len());
    for (kernel, drafts) in kernels.into_iter().zip(merged_drafts) {
        let arenas: Vec<&Vec<Value>> = kernel
            .operands
            .iter()
            .filter_map(|o| match o {
                ArenaOperand::Arena { values } => Some(values),
                _ => None,
            })
            .collect();
        let consistent = arenas.iter().all(|values| {
            values
                .iter()
                .all(|v| arena_of.get(v).is_none_or(|a| a == *values))
        });
        if !consistent {
            continue;
        }
        for values in arenas {
            for v in values {
                arena_of.insert(*v, values.clone());
            }
        }
        for i in drafts {
            let d: &mut Draft = &mut k.drafts[i];
            d.alive = false;
            merged_values.extend(d.outputs.iter().copied());
        }
        kept.push(kernel);
    }
    k.assigns.retain(|(o, _)| !merged_values.contains(&o.base));
    kept
}
