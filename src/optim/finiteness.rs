//! Every gradient's finiteness in one pass, naming the variable at fault: what
//! `NonFiniteGuard` fetches with each step.
//!
//! `CheckGradient` adds a reduction per gradient (ResNet-20: 65 of them, each a launch on a
//! GPU, 62 more kernels in the step). Here the gradients that share a device and a dtype are
//! flattened and joined, each padded with zeros to a whole number of [`ROW`]-element rows, so
//! that no row holds elements of two variables; ONE reduction then counts the non-finite values
//! of every row (`!(|g| < inf)`: NaN and ±inf alike), and the host maps a row with a non-zero
//! count back to its variable. The padding is read from one constant row of zeros. The join is a copy of the gradients (scratch as large as the
//! parameters plus under a row per variable, reused by the planner once the count has read it).

use super::OptimError;
use super::process::device;
use super::state;
use crate::ir::{BinaryOp, Graph, IrError, Op, ReduceOp, Shape, UnaryOp, Value, VarId};
use crate::tensor::{DType, HostTensor};
use std::ops::Range;

/// Elements per row of the joined gradients: a variable wastes under one row of padding.
pub const ROW: usize = 1024;

/// The rows of one checked variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedRows {
    pub var: VarId,
    /// The variable's full name, for the error message.
    pub variable: String,
    /// Its rows in [`GradientFiniteness::counts`].
    pub rows: Range<usize>,
}

/// The finiteness of a group of gradients (one device, one dtype).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GradientFiniteness {
    /// `f32[rows]`: how many non-finite values each row of the joined gradients holds.
    pub counts: Value,
    /// The variables in the order they were joined.
    pub rows: Vec<CheckedRows>,
}

impl GradientFiniteness {
    /// The first variable (in the order given) whose rows count a non-finite value in the
    /// fetched `counts`, or `None` when every gradient was finite.
    pub fn first_non_finite(&self, counts: &HostTensor) -> Result<Option<&str>, OptimError> {
        let counts = counts.to_f64_vec();
        let expected = self.rows.last().map_or(0, |r| r.rows.end);
        if counts.len() != expected {
            return Err(OptimError::CheckFetch {
                expected,
                got: counts.len(),
            });
        }
        Ok(self
            .rows
            .iter()
            .find(|r| counts[r.rows.clone()].iter().any(|&c| c != 0.0))
            .map(|r| r.variable.as_str()))
    }
}

/// What gradients share to be joined: their device and dtype.
type JoinKey = (Option<u16>, DType);

/// Adds the finiteness counts of `grads` to `graph` under `scope`: one [`GradientFiniteness`]
/// per (device, dtype) of the gradients, in order of first appearance, each a join and one
/// reduction. A gradient of dynamic shape is an error.
pub fn gradient_finiteness(
    graph: &mut Graph,
    scope: &str,
    grads: &[(VarId, Value)],
) -> Result<Vec<GradientFiniteness>, OptimError> {
    let mut groups: Vec<(JoinKey, Vec<(VarId, Value)>)> = Vec::new();
    for &(var, g) in grads {
        let key = (device(graph, g), graph.value_type(g).dtype);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push((var, g)),
            None => groups.push((key, vec![(var, g)])),
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
    members: &[(VarId, Value)],
    dev: Option<u16>,
    dtype: DType,
) -> Result<GradientFiniteness, OptimError> {
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
    for &(var, g) in members {
        let variable = graph.variable(var).name.clone();
        let t = graph.value_type(g);
        let Some(len) = t.shape.num_elements() else {
            return Err(OptimError::Ir(IrError::Invalid {
                node: scope.to_string(),
                message: format!(
                    "the gradient of `{variable}` has the dynamic shape {:?}: it cannot be checked",
                    t.shape
                ),
            }));
        };
        let flat = if t.rank() == 1 {
            g
        } else {
            let shape = Shape::fixed(&[len]);
            node(graph, "flat", Op::Reshape { shape }, &[g])?
        };
        parts.push(flat);
        let n = len.div_ceil(ROW).max(1);
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
            var,
            variable,
            rows: row..row + n,
        });
        row += n;
    }
    let joined = if parts.len() == 1 {
        parts[0]
    } else {
        node(graph, "joined", Op::Concat { axis: 0 }, &parts)?
    };
    let shape = Shape::fixed(&[row, ROW]);
    let joined = node(graph, "rows", Op::Reshape { shape }, &[joined])?;
    let abs = node(graph, "abs", Op::Unary(UnaryOp::Abs), &[joined])?;
    let inf = state::constant(graph, &format!("{scope}/inf"), dtype, f64::INFINITY, dev)?;
    let finite = node(graph, "finite", Op::Binary(BinaryOp::Lt), &[abs, inf])?;
    let bad = node(graph, "not_finite", Op::Unary(UnaryOp::Not), &[finite])?;
    let bad = node(graph, "cast", Op::Cast { to: DType::F32 }, &[bad])?;
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
    Ok(GradientFiniteness { counts, rows })
}
