//! The finiteness of many tensors (a step's losses and gradients) in one pass, naming the one
//! at fault, and a record of it kept on the device across steps: what `NonFiniteGuard` adds.
//!
//! A `CheckGradient` per gradient adds a reduction each: ResNet-20 has 59 gradients, each a
//! launch on a GPU. Here the tensors that share a device and a dtype are flattened and joined,
//! each padded with zeros (slices of one constant row) to a whole number of [`ROW`]-element
//! rows, so that no row holds elements of two tensors; ONE reduction then counts the non-finite
//! values of every row (`!(|g| < inf)`: NaN and ±inf alike), and the host maps a row with a
//! non-zero count back to its tensor ([`finiteness`]). The join is a copy of the tensors
//! (scratch as large as the parameters plus under a row per tensor, reused by the planner once
//! the count has read it).
//!
//! [`record_first_non_finite`] keeps, in two LOCAL variables, the counts of the first run in
//! which one was non-zero and how many runs ago that was, so the host may read it only now and
//! then and still name the tensor and the run: one elementwise kernel and one reduction a run.

use super::OptimError;
use super::process::{device, not_finite};
use super::state;
use crate::ir::{
    BinaryOp, Graph, Initializer, IrError, NodeId, Op, ReduceOp, Shape, TensorType, UnaryOp, Value,
    VarFlags, VarId, VariableDef,
};
use crate::tensor::{DType, HostTensor};
use std::ops::Range;

/// Elements per row of the joined tensors: a tensor wastes under one row of padding.
pub const ROW: usize = 1024;

/// The rows of one checked tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedRows {
    /// What the tensor is, for the error message (e.g. ``the gradient of `fc/W` ``).
    pub name: String,
    /// Its rows in [`Finiteness::counts`].
    pub rows: Range<usize>,
}

/// The finiteness of a group of tensors (one device, one dtype).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finiteness {
    /// `f32[rows]`: how many non-finite values each row of the joined tensors holds.
    pub counts: Value,
    /// The tensors in the order they were joined.
    pub rows: Vec<CheckedRows>,
}

impl Finiteness {
    /// The rows of all the groups, one after another: [`CheckedRows`] renumbered as in the
    /// concatenation of the groups' counts, in order.
    pub fn concatenated(groups: &[Finiteness]) -> Vec<CheckedRows> {
        let mut out = Vec::new();
        let mut base = 0;
        for g in groups {
            for r in &g.rows {
                out.push(CheckedRows {
                    name: r.name.clone(),
                    rows: base + r.rows.start..base + r.rows.end,
                });
            }
            base += g.rows.last().map_or(0, |r| r.rows.end);
        }
        out
    }

    /// The first tensor (in the order given) whose rows count a non-finite value in the
    /// fetched `counts`, or `None` when every one was finite.
    pub fn first_non_finite(&self, counts: &HostTensor) -> Result<Option<&str>, OptimError> {
        first_non_finite(&self.rows, counts)
    }
}

/// The first of `rows` that counts a non-finite value in `counts` (which `rows` cover exactly).
pub fn first_non_finite<'a>(
    rows: &'a [CheckedRows],
    counts: &HostTensor,
) -> Result<Option<&'a str>, OptimError> {
    let counts = counts.to_f64_vec();
    let expected = rows.last().map_or(0, |r| r.rows.end);
    if counts.len() != expected {
        return Err(OptimError::CheckFetch {
            expected,
            got: counts.len(),
        });
    }
    Ok(rows
        .iter()
        .find(|r| counts[r.rows.clone()].iter().any(|&c| c != 0.0))
        .map(|r| r.name.as_str()))
}

/// What tensors share to be joined: their device and dtype.
type JoinKey = (Option<u16>, DType);

/// [`finiteness`] of every gradient, each named ``the gradient of `<variable>` ``.
pub fn gradient_finiteness(
    graph: &mut Graph,
    scope: &str,
    grads: &[(VarId, Value)],
) -> Result<Vec<Finiteness>, OptimError> {
    let named: Vec<(String, Value)> = grads
        .iter()
        .map(|&(var, g)| (format!("the gradient of `{}`", graph.variable(var).name), g))
        .collect();
    finiteness(graph, scope, &named)
}

/// Adds the finiteness counts of the `named` tensors to `graph` under `scope`: one
/// [`Finiteness`] per (device, dtype) of the tensors, in order of first appearance, each a
/// join and one reduction. A tensor of dynamic shape is an error.
pub fn finiteness(
    graph: &mut Graph,
    scope: &str,
    named: &[(String, Value)],
) -> Result<Vec<Finiteness>, OptimError> {
    let mut groups: Vec<(JoinKey, Vec<(String, Value)>)> = Vec::new();
    for (name, v) in named {
        let key = (device(graph, *v), graph.value_type(*v).dtype);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push((name.clone(), *v)),
            None => groups.push((key, vec![(name.clone(), *v)])),
        }
    }
    groups
        .into_iter()
        .enumerate()
        .map(|(i, ((dev, dtype), members))| {
            count_rows(graph, &format!("{scope}/{i}"), &members, dev, dtype)
        })
        .collect()
}

/// The join of `members` in rows and its per-row count of non-finite values.
fn count_rows(
    graph: &mut Graph,
    scope: &str,
    members: &[(String, Value)],
    dev: Option<u16>,
    dtype: DType,
) -> Result<Finiteness, OptimError> {
    let node = |graph: &mut Graph, part: &str, op: Op, ins: &[Value]| {
        state::node(graph, &format!("{scope}/{part}"), op, ins, dev)
    };
    // The padding: slices of one constant row of zeros (the join reads slices of a buffer
    // in place, where broadcasts of a scalar would each be written out first).
    let zeros = node(
        graph,
        "zeros",
        Op::Constant {
            value: HostTensor::zeros(dtype, &[ROW - 1]),
        },
        &[],
    )?;
    let mut parts = Vec::with_capacity(2 * members.len());
    let mut rows = Vec::with_capacity(members.len());
    let mut row = 0;
    for (name, g) in members {
        let g = *g;
        let t = graph.value_type(g);
        let Some(len) = t.shape.num_elements() else {
            return Err(OptimError::Ir(IrError::Invalid {
                node: scope.to_string(),
                message: format!(
                    "{name} has the dynamic shape {:?}: it cannot be checked",
                    t.shape
                ),
            }));
        };
        if len == 0 {
            // Nothing to check: no rows.
            rows.push(CheckedRows {
                name: name.clone(),
                rows: row..row,
            });
            continue;
        }
        let flat = if t.rank() == 1 {
            g
        } else {
            let shape = Shape::fixed(&[len]);
            node(graph, "flat", Op::Reshape { shape }, &[g])?
        };
        parts.push(flat);
        let n = len.div_ceil(ROW);
        let pad = n * ROW - len;
        if pad > 0 {
            let slice = Op::Slice {
                axis: 0,
                start: 0,
                end: pad,
            };
            parts.push(node(graph, "padding", slice, &[zeros])?);
        }
        rows.push(CheckedRows {
            name: name.clone(),
            rows: row..row + n,
        });
        row += n;
    }
    let joined = match parts.as_slice() {
        [] => {
            return Err(OptimError::Ir(IrError::Invalid {
                node: scope.to_string(),
                message: "every tensor to check is empty".into(),
            }));
        }
        [one] => *one,
        many => node(graph, "joined", Op::Concat { axis: 0 }, many)?,
    };
    let shape = Shape::fixed(&[row, ROW]);
    let joined = node(graph, "rows", Op::Reshape { shape }, &[joined])?;
    let abs = node(graph, "abs", Op::Unary(UnaryOp::Abs), &[joined])?;
    let bad = not_finite(graph, scope, abs, dtype, dev)?;
    let counts = node(
        graph,
        "count",
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![1],
            keep_dims: false,
        },
        &[bad],
    )?;
    Ok(Finiteness { counts, rows })
}

/// `bool` scalars that are true when all is well (a `CheckGradient`'s
/// [`NumericCheck::all_finite`](super::NumericCheck)), as a [`Finiteness`] of one row each:
/// the row counts 1 where the check is false. Named under `scope`.
pub fn failed_checks(
    graph: &mut Graph,
    scope: &str,
    checks: &[(String, Value)],
) -> Result<Finiteness, OptimError> {
    let mut parts = Vec::with_capacity(checks.len());
    let mut rows = Vec::with_capacity(checks.len());
    for (i, (name, ok)) in checks.iter().enumerate() {
        let node = |graph: &mut Graph, part: &str, op: Op, ins: &[Value]| {
            state::node(graph, &format!("{scope}/{i}/{part}"), op, ins, None)
        };
        let failed = node(graph, "failed", Op::Unary(UnaryOp::Not), &[*ok])?;
        let failed = node(graph, "cast", Op::Cast { to: DType::F32 }, &[failed])?;
        let shape = Shape::fixed(&[1]);
        parts.push(node(graph, "row", Op::Reshape { shape }, &[failed])?);
        rows.push(CheckedRows {
            name: name.clone(),
            rows: i..i + 1,
        });
    }
    let counts = match parts.as_slice() {
        [one] => *one,
        many => state::node(
            graph,
            &format!("{scope}/counts"),
            Op::Concat { axis: 0 },
            many,
            None,
        )?,
    };
    Ok(Finiteness { counts, rows })
}

/// A record kept on the device, across steps, of the first run in which a count of non-finite
/// values was non-zero, and of every count in that run: what lets `NonFiniteGuard` fetch only
/// now and then (a fetch makes the host wait for the step) and still name the first tensor at
/// fault and the run it went non-finite in. Its two variables are LOCAL (never checkpointed):
/// a run starts with an empty record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FiniteRecord {
    /// The update, to run with every run that computes the counts.
    pub update: NodeId,
    /// `f32` scalar, after this run's update: how many runs ago the first non-finite count
    /// was seen, counting this run as 1 (0: none yet). Exact up to 2^24 runs.
    pub since: Value,
    /// `f32[rows]`, after this run's update: the counts of that first run (zeros before it).
    pub first: Value,
}

/// Adds a [`FiniteRecord`] of `counts` (`f32` vectors of non-negative counts, concatenated in
/// order) to `graph`, its variables and nodes named under `scope`.
pub fn record_first_non_finite(
    graph: &mut Graph,
    scope: &str,
    counts: &[Value],
) -> Result<FiniteRecord, OptimError> {
    let node = |graph: &mut Graph, part: &str, op: Op, ins: &[Value]| {
        state::node(graph, &format!("{scope}/{part}"), op, ins, None)
    };
    let counts = match counts {
        [one] => *one,
        many => node(graph, "counts", Op::Concat { axis: 0 }, many)?,
    };
    let Some(len) = graph.value_type(counts).shape.num_elements() else {
        return Err(OptimError::Ir(IrError::Invalid {
            node: scope.to_string(),
            message: "the counts of non-finite values have a dynamic shape".into(),
        }));
    };
    let local = |graph: &mut Graph, name: &str, shape: &[usize]| {
        graph.declare_variable(VariableDef {
            name: graph.unique_name(&format!("{scope}/{name}")),
            ty: TensorType::f32(Shape::fixed(shape)),
            init: Initializer::Zeros,
            flags: VarFlags {
                trainable: false,
                model: false,
                local: true,
            },
        })
    };
    let first_var = local(graph, "first", &[len])?;
    let since_var = local(graph, "since", &[])?;
    let first = state::read(graph, first_var, &format!("{scope}/first/read"), None)?;
    let since = state::read(graph, since_var, &format!("{scope}/since/read"), None)?;
    // `since` read alongside every count (a broadcast view: the ops below are all of the
    // counts' shape, so they fuse into one elementwise kernel and one reduction).
    let shape = Shape::fixed(&[len]);
    let since_each = node(graph, "since/each", Op::Broadcast { shape }, &[since])?;
    // Until a non-finite count is recorded (`since == 0`), each run's counts are the record.
    let zero = state::constant(graph, &format!("{scope}/zero"), DType::F32, 0.0, None)?;
    let empty = node(
        graph,
        "empty",
        Op::Binary(BinaryOp::Eq),
        &[since_each, zero],
    )?;
    let empty = node(graph, "empty_f32", Op::Cast { to: DType::F32 }, &[empty])?;
    let taken = node(graph, "taken", Op::Binary(BinaryOp::Mul), &[empty, counts])?;
    let new_first = node(
        graph,
        "new_first",
        Op::Binary(BinaryOp::Add),
        &[first, taken],
    )?;
    // Once recorded, the record holds a non-zero count, and every run from then on adds one:
    // `since + min(max(record), 1)`, computed as `max(since + min(record, 1))`.
    let one = state::constant(graph, &format!("{scope}/one"), DType::F32, 1.0, None)?;
    let seen = node(
        graph,
        "seen",
        Op::Binary(BinaryOp::Minimum),
        &[new_first, one],
    )?;
    let later = node(
        graph,
        "later",
        Op::Binary(BinaryOp::Add),
        &[since_each, seen],
    )?;
    let new_since = node(
        graph,
        "new_since",
        Op::Reduce {
            op: ReduceOp::Max,
            axes: vec![0],
            keep_dims: false,
        },
        &[later],
    )?;
    let assign = |graph: &mut Graph, var: VarId, part: &str, value: Value| {
        let name = graph.unique_name(&format!("{scope}/{part}"));
        graph.add_node(&name, Op::Assign { var }, &[value])
    };
    let assigns = [
        assign(graph, first_var, "first/assign", new_first)?,
        assign(graph, since_var, "since/assign", new_since)?,
    ];
    let name = graph.unique_name(&format!("{scope}/update"));
    let update = graph.add_group(&name, &assigns)?;
    Ok(FiniteRecord {
        update,
        since: new_since,
        first: new_first,
    })
}
