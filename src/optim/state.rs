//! Training-state variables: `learning_rate` and `global_step` (get-or-create by name), slot
//! variables of optimizers, and the small graph-building helpers the optimizers share.

use super::OptimError;
use crate::ir::{
    BinaryOp, Graph, Initializer, NodeId, Op, TensorType, Value, VarFlags, VarId, VariableDef,
};
use crate::tensor::{DType, HostTensor};

/// The name of the learning-rate variable (callbacks set it by this name).
pub const LEARNING_RATE: &str = "learning_rate";
/// The name of the global step variable.
pub const GLOBAL_STEP: &str = "global_step";

/// The variable `name` if it exists with type `ty`, else a new one declared with `init` and
/// `flags`. Errors when it exists with another type.
pub fn get_or_create(
    graph: &mut Graph,
    name: &str,
    ty: TensorType,
    init: Initializer,
    flags: VarFlags,
) -> Result<VarId, OptimError> {
    if let Some(id) = graph.find_variable(name) {
        let have = &graph.variable(id).ty;
        if *have != ty {
            return Err(OptimError::VariableType {
                name: name.to_string(),
                expected: ty.to_string(),
                got: have.to_string(),
            });
        }
        return Ok(id);
    }
    Ok(graph.declare_variable(VariableDef {
        name: name.to_string(),
        ty,
        init,
        flags,
    })?)
}

/// The `learning_rate` variable: a non-trainable `f32` scalar, saved in checkpoints, created
/// with `initial` if it does not exist yet (an existing one keeps its value: callbacks own it).
pub fn learning_rate(graph: &mut Graph, initial: f64) -> Result<VarId, OptimError> {
    get_or_create(
        graph,
        LEARNING_RATE,
        TensorType::scalar(DType::F32),
        Initializer::Constant(initial),
        VarFlags::default(),
    )
}

/// The `global_step` variable: a non-trainable `i64` scalar starting at 0, saved in
/// checkpoints. Optimizers do not increment it: the trainer's step counter does (tensorpack's
/// `MaintainStepCounter`), with [`increment_global_step`].
pub fn global_step(graph: &mut Graph) -> Result<VarId, OptimError> {
    get_or_create(
        graph,
        GLOBAL_STEP,
        TensorType::scalar(DType::I64),
        Initializer::Zeros,
        VarFlags::default(),
    )
}

/// An `Assign` node named `name` that sets `global_step` to its value plus one when the step
/// that runs it ends.
pub fn increment_global_step(graph: &mut Graph, name: &str) -> Result<NodeId, OptimError> {
    let step = global_step(graph)?;
    let read = read(graph, step, &format!("{name}/read"), None)?;
    let one = constant(graph, &format!("{name}/one"), DType::I64, 1.0, None)?;
    let next = node(
        graph,
        &format!("{name}/add"),
        Op::Binary(BinaryOp::Add),
        &[read, one],
        None,
    )?;
    let name = graph.unique_name(name);
    Ok(graph.add_node(&name, Op::Assign { var: step }, &[next])?)
}

/// The trainer's step counter (tensorpack's `MaintainStepCounter`): creates `global_step` if
/// needed and adds its increment, an `Assign` named `global_step_incr` (made unique).
pub fn add_step_counter(graph: &mut Graph) -> Result<NodeId, OptimError> {
    global_step(graph)?;
    let name = graph.unique_name("global_step_incr");
    increment_global_step(graph, &name)
}

/// Declares the slot variable `{var}/{suffix}`: zeros of `var`'s type, non-trainable, saved,
/// LOCAL when `var` is local (a replica's slots are per-replica state, like the replica).
pub fn create_slot(graph: &mut Graph, var: VarId, suffix: &str) -> Result<VarId, OptimError> {
    let def = graph.variable(var);
    let name = format!("{}/{suffix}", def.name);
    if graph.find_variable(&name).is_some() {
        return Err(OptimError::SlotExists {
            slot: name,
            variable: def.name.clone(),
        });
    }
    let slot = VariableDef {
        name,
        ty: def.ty.clone(),
        init: Initializer::Zeros,
        flags: VarFlags {
            trainable: false,
            model: false,
            local: def.flags.local,
        },
    };
    Ok(graph.declare_variable(slot)?)
}

/// The first of `name`, `name_1`, `name_2`, … that no update assigns yet, created if needed
/// (TF's uniquified non-slot variables): two optimizers of one graph — a GAN's generator and
/// discriminator — each get their own step-wide state, e.g. Adam's `beta1_power` and
/// `beta1_power_1`.
pub(crate) fn get_or_create_unassigned(
    graph: &mut Graph,
    name: &str,
    ty: TensorType,
    init: Initializer,
    flags: VarFlags,
) -> Result<VarId, OptimError> {
    // Every assigned candidate is a distinct variable of the graph, so one of the first
    // `variables + 1` names is free.
    let candidates = graph.variables().len() + 1;
    for k in 0..candidates {
        let candidate = if k == 0 {
            name.to_string()
        } else {
            format!("{name}_{k}")
        };
        let var = get_or_create(graph, &candidate, ty.clone(), init.clone(), flags)?;
        if ensure_unassigned(graph, var).is_ok() {
            return Ok(var);
        }
    }
    Err(OptimError::AlreadyAssigned {
        variable: name.to_string(),
    })
}

/// The i32 scalar step counter `name`, from zero, created if needed; an error when some update
/// already assigns it (one optimizer application owns it): gradient accumulation's counter,
/// the loss scale's good and skipped steps.
pub(crate) fn step_counter(graph: &mut Graph, name: &str) -> Result<VarId, OptimError> {
    let var = get_or_create(
        graph,
        name,
        TensorType::scalar(DType::I32),
        Initializer::Zeros,
        VarFlags::default(),
    )?;
    ensure_unassigned(graph, var)?;
    Ok(var)
}

/// Errors when some `Assign` node already writes `var` (a step may assign a variable once, so
/// state shared by all variables must be updated by a single optimizer application).
pub(crate) fn ensure_unassigned(graph: &Graph, var: VarId) -> Result<(), OptimError> {
    let assigned = graph
        .node_ids()
        .any(|id| graph.node(id).op == Op::Assign { var });
    if assigned {
        return Err(OptimError::AlreadyAssigned {
            variable: graph.variable(var).name.clone(),
        });
    }
    Ok(())
}

/// Adds `op` on `inputs` under a unique version of `name`, on `device`.
pub(crate) fn node(
    graph: &mut Graph,
    name: &str,
    op: Op,
    inputs: &[Value],
    device: Option<u16>,
) -> Result<Value, OptimError> {
    let name = graph.unique_name(name);
    Ok(Value::first(graph.add_node_on(&name, op, inputs, device)?))
}

/// A read of `var` as the step began, named (a unique version of) `name`, on `device`.
pub fn read(
    graph: &mut Graph,
    var: VarId,
    name: &str,
    device: Option<u16>,
) -> Result<Value, OptimError> {
    node(graph, name, Op::Variable { var }, &[], device)
}

/// A scalar constant.
pub(crate) fn constant(
    graph: &mut Graph,
    name: &str,
    dtype: DType,
    x: f64,
    device: Option<u16>,
) -> Result<Value, OptimError> {
    let value = HostTensor::scalar(dtype, x);
    node(graph, name, Op::Constant { value }, &[], device)
}
