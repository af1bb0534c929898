//! Gradient accumulation over `n` steps (tensorpack's `AccumGradOptimizer`) without control
//! flow: a step reads every variable as it was when the step began and assigns at the end, so
//! each update is a `Select` on "this is the n-th step" between the new and the current value.

use super::OptimError;
use super::builder::Builder;
use super::rule::VariableUpdate;
use super::state::{self, create_slot};
use crate::ir::{BinaryOp, Graph, Op, Value, VarId};
use crate::tensor::DType;

/// The name of the accumulation counter.
pub const ACCUM_COUNTER: &str = "AccumGrad/counter";

/// The updates of the inner optimizer applied to `(variable, gradient sum)` pairs.
pub(crate) type InnerUpdates<'a> =
    dyn FnMut(&mut Graph, &[(VarId, Value)]) -> Result<Vec<VariableUpdate>, OptimError> + 'a;

/// The updates of accumulating `grads` into `{var}/AccumGrad` slots and, every `steps`-th step,
/// applying `inner` (the wrapped optimizer's updates) to the accumulated sums.
pub(crate) fn accumulate(
    graph: &mut Graph,
    grads: &[(VarId, Value)],
    steps: u32,
    inner: &mut InnerUpdates<'_>,
) -> Result<Vec<VariableUpdate>, OptimError> {
    let counter = state::step_counter(graph, ACCUM_COUNTER)?;
    let count = state::read(graph, counter, "AccumGrad/counter/read", None)?;
    let mut s = Builder::scalar(graph, "AccumGrad/counter");
    let one = state::constant(s.graph(), "AccumGrad/counter/one", DType::I32, 1.0, None)?;
    let period = state::constant(
        s.graph(),
        "AccumGrad/counter/period",
        DType::I32,
        f64::from(steps),
        None,
    )?;
    let zero = state::constant(s.graph(), "AccumGrad/counter/zero", DType::I32, 0.0, None)?;
    let next = s.bin(BinaryOp::Add, count, one)?;
    // `>=` rather than `==`: a counter restored from a run with a larger period still fires.
    let apply = s.bin(BinaryOp::Ge, next, period)?;
    let count_new = s.node("select", Op::Select, &[apply, zero, next])?;

    let mut out = Vec::with_capacity(grads.len() * 2 + 1);
    let mut sums = Vec::with_capacity(grads.len());
    for &(var, g) in grads {
        let slot = create_slot(graph, var, "AccumGrad")?;
        let mut b = Builder::new(graph, "AccumGrad", var, g);
        let acc = b.read(slot)?;
        let sum = b.named("sum", BinaryOp::Add, acc, g)?;
        let zero = b.constant("zero", 0.0)?;
        let acc_new = b.node("accum", Op::Select, &[apply, zero, sum])?;
        out.push(VariableUpdate {
            var: slot,
            current: acc,
            new: acc_new,
        });
        sums.push((var, sum));
    }
    for u in inner(graph, &sums)? {
        let name = format!("AccumGrad/apply/{}", graph.variable(u.var).name);
        let device = graph.node(u.new.node).device;
        let gated = state::node(graph, &name, Op::Select, &[apply, u.new, u.current], device)?;
        out.push(VariableUpdate { new: gated, ..u });
    }
    out.push(VariableUpdate {
        var: counter,
        current: count,
        new: count_new,
    });
    Ok(out)
}
