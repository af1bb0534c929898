//! Dynamic loss scaling for FP16 training, with PyTorch `GradScaler`'s semantics, built as
//! graph ops like every other optimizer piece.
//!
//! FP16's smallest subnormal is 2⁻²⁴: small gradients would round to zero as GEMM operands.
//! So the trainer differentiates `cost · scale` instead of `cost` ([`scale_loss`]), which
//! lifts every gradient of the backward pass by `scale`, and divides the gradients by `scale`
//! again before anything else sees them ([`unscale`]: gradient processors and the optimizer get
//! true gradients, so clipping thresholds mean what they say). When a gradient overflowed on the
//! way (an operand past 65504 became infinite), the step is skipped: [`gate`] makes every update
//! of the optimizer — variables, slots, Adam's beta powers — a `Select` between the new and the
//! current value on "every gradient is finite", and halves the scale. After `growth_interval`
//! finite steps in a row the scale doubles.
//!
//! The state is three checkpointed variables, [`LOSS_SCALE`] (`f32`), [`LOSS_SCALE_GOOD_STEPS`]
//! and [`LOSS_SCALE_SKIPPED_STEPS`] (`i32`), so a resumed run continues with the scale it had
//! and its count of skipped steps. The new scale, the "step applied" flag and the new count are
//! added to the graph's [`LOSS_SCALE_COLLECTION`] for the trainer's monitor, which reads the
//! count now and then rather than the flag after every step (a fetch makes the host wait for
//! the step).

use super::OptimError;
use super::process::{all_finite_times, device};
use super::rule::VariableUpdate;
use super::state::{self, constant, ensure_unassigned, get_or_create, read};
use crate::ir::{
    BinaryOp, Graph, Initializer, IrError, Op, Shape, TensorType, Value, VarFlags, VarId,
};
use crate::tensor::DType;

/// The loss-scale variable.
pub const LOSS_SCALE: &str = "LossScale/scale";
/// The variable counting finite steps since the scale last changed.
pub const LOSS_SCALE_GOOD_STEPS: &str = "LossScale/good_steps";
/// The variable counting the steps skipped for a non-finite gradient, over the whole run.
pub const LOSS_SCALE_SKIPPED_STEPS: &str = "LossScale/skipped_steps";
/// Graph collection holding `[new scale (f32 scalar), step applied (bool scalar), new count of
/// skipped steps (i32 scalar)]`.
pub const LOSS_SCALE_COLLECTION: &str = "loss_scale";
/// Graph collection of the gradients [`unscale`] made (`g · (1/scale)`), which [`gate`] checks
/// on their scaled operand.
pub const UNSCALED_GRADIENTS_COLLECTION: &str = "loss_scale/unscaled";

/// How the loss scale starts and moves (PyTorch `GradScaler`'s defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DynamicLossScale {
    /// The first scale (2¹⁶).
    pub initial_scale: f64,
    /// The scale is multiplied by this after `growth_interval` finite steps in a row (2).
    pub growth_factor: f64,
    /// The scale is multiplied by this when a step's gradients are not finite (0.5).
    pub backoff_factor: f64,
    /// Finite steps in a row before the scale grows (2000).
    pub growth_interval: u32,
}

impl Default for DynamicLossScale {
    fn default() -> DynamicLossScale {
        DynamicLossScale {
            initial_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

impl DynamicLossScale {
    /// Errors unless the factors and the initial scale are finite, positive and sensible.
    pub fn check(&self) -> Result<(), OptimError> {
        let bad = |what: &str, value: f64| OptimError::InvalidSetting {
            optimizer: "DynamicLossScale".into(),
            what: what.into(),
            value: value.to_string(),
        };
        if !(self.initial_scale.is_finite() && self.initial_scale > 0.0) {
            return Err(bad("initial_scale", self.initial_scale));
        }
        if !(self.growth_factor.is_finite() && self.growth_factor > 1.0) {
            return Err(bad("growth_factor", self.growth_factor));
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            return Err(bad("backoff_factor", self.backoff_factor));
        }
        if self.growth_interval == 0 {
            return Err(bad("growth_interval", 0.0));
        }
        Ok(())
    }

    /// The scale variable, created if needed.
    fn scale_variable(&self, graph: &mut Graph) -> Result<VarId, OptimError> {
        get_or_create(
            graph,
            LOSS_SCALE,
            TensorType::scalar(DType::F32),
            Initializer::Constant(self.initial_scale),
            VarFlags::default(),
        )
    }
}

/// `cost · scale`, the value to differentiate, on `cost`'s device. `cost` must be an `f32`
/// scalar.
pub fn scale_loss(
    graph: &mut Graph,
    config: &DynamicLossScale,
    cost: Value,
) -> Result<Value, OptimError> {
    config.check()?;
    let ty = graph.value_type(cost).clone();
    if ty != TensorType::scalar(DType::F32) {
        return Err(OptimError::LossScaleCost {
            cost: graph.value_name(cost),
            ty: ty.to_string(),
        });
    }
    let var = config.scale_variable(graph)?;
    let dev = graph.node(cost.node).device;
    let base = graph.node(cost.node).name.clone();
    let s = read(graph, var, &format!("{base}/loss_scale"), dev)?;
    state::node(
        graph,
        &format!("{base}/scaled"),
        Op::Binary(BinaryOp::Mul),
        &[cost, s],
        dev,
    )
}

/// Every gradient divided by the loss scale (multiplied by its reciprocal: the scale is a
/// power of two, so this is exact), on the gradient's device.
pub fn unscale(
    graph: &mut Graph,
    config: &DynamicLossScale,
    grads: &[(VarId, Value)],
) -> Result<Vec<(VarId, Value)>, OptimError> {
    let var = config.scale_variable(graph)?;
    let mut out = Vec::with_capacity(grads.len());
    // One reciprocal per device and dtype, shared by its gradients (so `gate` can tell the
    // gradients scaled alike apart by their factor).
    let mut inverses: Vec<((Option<u16>, DType), Value)> = Vec::new();
    for &(v, g) in grads {
        let dev = device(graph, g);
        let scope = format!("LossScale/unscale/{}", graph.variable(v).name);
        let dtype = graph.value_type(g).dtype;
        let inv = match inverses.iter().find(|(k, _)| *k == (dev, dtype)) {
            Some(&(_, inv)) => inv,
            None => {
                let inv = inverse(graph, var, "LossScale/unscale", dev, dtype)?;
                inverses.push(((dev, dtype), inv));
                inv
            }
        };
        let u = state::node(
            graph,
            &format!("{scope}/grad"),
            Op::Binary(BinaryOp::Mul),
            &[g, inv],
            dev,
        )?;
        graph.add_to_collection(UNSCALED_GRADIENTS_COLLECTION, u);
        out.push((v, u));
    }
    Ok(out)
}

/// What the gradients one check counts over share: their device and the factor they are
/// unscaled by (none for a gradient that is not).
type CheckedAlike = (Option<u16>, Option<Value>);

/// `values` flattened to one dimension and joined end to end (one value: just flattened), on
/// `device`: what one reduction can count over.
fn join_flat(
    graph: &mut Graph,
    scope: &str,
    values: &[Value],
    device: Option<u16>,
) -> Result<Value, OptimError> {
    let mut flat = Vec::with_capacity(values.len());
    for &v in values {
        let t = graph.value_type(v);
        let Some(len) = t.shape.num_elements() else {
            return Err(OptimError::Ir(IrError::Invalid {
                node: scope.to_string(),
                message: format!(
                    "a gradient of dynamic shape {:?} cannot be checked",
                    t.shape
                ),
            }));
        };
        flat.push(if t.rank() == 1 {
            v
        } else {
            let shape = Shape::fixed(&[len]);
            state::node(
                graph,
                &format!("{scope}/flat"),
                Op::Reshape { shape },
                &[v],
                device,
            )?
        });
    }
    if flat.len() == 1 {
        return Ok(flat[0]);
    }
    state::node(
        graph,
        &format!("{scope}/joined"),
        Op::Concat { axis: 0 },
        &flat,
        device,
    )
}

/// `1 / scale` read on `device`, as `dtype`, named under `scope`.
fn inverse(
    graph: &mut Graph,
    var: VarId,
    scope: &str,
    device: Option<u16>,
    dtype: DType,
) -> Result<Value, OptimError> {
    let s = read(graph, var, &format!("{scope}/scale"), device)?;
    let inv = state::node(
        graph,
        &format!("{scope}/inverse"),
        Op::Unary(crate::ir::UnaryOp::Recip),
        &[s],
        device,
    )?;
    if dtype == DType::F32 {
        return Ok(inv);
    }
    state::node(
        graph,
        &format!("{scope}/cast"),
        Op::Cast { to: dtype },
        &[inv],
        device,
    )
}

/// `updates` applied only when every gradient of `grads` is finite (else each variable keeps its
/// value), plus the updates of the scale and its counters. Registers `[new scale, applied, new
/// skipped count]` in [`LOSS_SCALE_COLLECTION`].
pub fn gate(
    graph: &mut Graph,
    config: &DynamicLossScale,
    grads: &[(VarId, Value)],
    updates: Vec<VariableUpdate>,
) -> Result<Vec<VariableUpdate>, OptimError> {
    config.check()?;
    let scale_var = config.scale_variable(graph)?;
    ensure_unassigned(graph, scale_var)?;
    // The two step counters, assigned by this gate only.
    let good_var = state::step_counter(graph, LOSS_SCALE_GOOD_STEPS)?;
    let skipped_var = state::step_counter(graph, LOSS_SCALE_SKIPPED_STEPS)?;
    // Every gradient finite. A gradient still as `unscale` made it, `g · (1/scale)`, is checked
    // as `|g| · (1/scale)`: the same value, but the unscaled product then has one reader, the
    // update, which fuses it (checking the product itself would make the lowering write every
    // unscaled gradient out, and the updates could not merge into one arena kernel). The
    // gradients checked alike (same device, same factor) are flattened and joined, so ONE
    // reduction counts their non-finite values rather than one per gradient shape. The join is a
    // copy of the gradients (scratch as large as the parameters, reused by the planner once the
    // count has read it): one pass of memory traffic for the launches of a reduction per shape.
    let mut checks: Vec<(CheckedAlike, Vec<Value>)> = Vec::new();
    for &(_, g) in grads {
        let unscaled = graph.collection(UNSCALED_GRADIENTS_COLLECTION).contains(&g)
            && graph.node(g.node).op == Op::Binary(BinaryOp::Mul);
        let (operand, factor) = match graph.inputs(g.node).as_slice() {
            &[scaled, inverse] if unscaled => (scaled, Some(inverse)),
            _ => (g, None),
        };
        let key = (device(graph, operand), factor);
        match checks.iter_mut().find(|(k, _)| *k == key) {
            Some((_, operands)) => operands.push(operand),
            None => checks.push((key, vec![operand])),
        }
    }
    let mut applied: Option<Value> = None;
    for (i, ((dev, factor), operands)) in checks.into_iter().enumerate() {
        let scope = format!("LossScale/finite/{i}");
        let joined = join_flat(graph, &scope, &operands, dev)?;
        let ok = all_finite_times(graph, &scope, joined, factor)?;
        applied = Some(match applied {
            None => ok,
            Some(a) => state::node(
                graph,
                "LossScale/all_finite",
                Op::Binary(BinaryOp::And),
                &[a, ok],
                None,
            )?,
        });
    }
    let Some(applied) = applied else {
        return Ok(updates);
    };
    let mut out = Vec::with_capacity(updates.len() + 2);
    for u in updates {
        let name = format!("LossScale/apply/{}", graph.variable(u.var).name);
        let device = graph.node(u.new.node).device;
        let gated = state::node(
            graph,
            &name,
            Op::Select,
            &[applied, u.new, u.current],
            device,
        )?;
        out.push(VariableUpdate { new: gated, ..u });
    }

    let n = |graph: &mut Graph, part: &str, op: Op, ins: &[Value]| {
        state::node(graph, &format!("LossScale/{part}"), op, ins, None)
    };
    let scale = read(graph, scale_var, "LossScale/scale/read", None)?;
    let good = read(graph, good_var, "LossScale/good_steps/read", None)?;
    let one = constant(graph, "LossScale/one", DType::I32, 1.0, None)?;
    let zero = constant(graph, "LossScale/zero", DType::I32, 0.0, None)?;
    let interval = constant(
        graph,
        "LossScale/growth_interval",
        DType::I32,
        f64::from(config.growth_interval),
        None,
    )?;
    let grow_by = constant(
        graph,
        "LossScale/growth_factor",
        DType::F32,
        config.growth_factor,
        None,
    )?;
    let back_by = constant(
        graph,
        "LossScale/backoff_factor",
        DType::F32,
        config.backoff_factor,
        None,
    )?;
    let counted = n(graph, "counted", Op::Binary(BinaryOp::Add), &[good, one])?;
    // `>=`: a counter restored from a run with a longer interval still grows.
    let grow = n(
        graph,
        "grow",
        Op::Binary(BinaryOp::Ge),
        &[counted, interval],
    )?;
    let grown = n(graph, "grown", Op::Binary(BinaryOp::Mul), &[scale, grow_by])?;
    let kept = n(graph, "kept", Op::Select, &[grow, grown, scale])?;
    let backed_off = n(
        graph,
        "backed_off",
        Op::Binary(BinaryOp::Mul),
        &[scale, back_by],
    )?;
    let scale_new = n(graph, "new_scale", Op::Select, &[applied, kept, backed_off])?;
    let good_kept = n(graph, "good_kept", Op::Select, &[grow, zero, counted])?;
    let good_new = n(
        graph,
        "new_good_steps",
        Op::Select,
        &[applied, good_kept, zero],
    )?;
    let skipped = read(graph, skipped_var, "LossScale/skipped_steps/read", None)?;
    let one_more = n(
        graph,
        "skipped_plus_one",
        Op::Binary(BinaryOp::Add),
        &[skipped, one],
    )?;
    let skipped_new = n(
        graph,
        "new_skipped_steps",
        Op::Select,
        &[applied, skipped, one_more],
    )?;
    out.push(VariableUpdate {
        var: scale_var,
        current: scale,
        new: scale_new,
    });
    out.push(VariableUpdate {
        var: good_var,
        current: good,
        new: good_new,
    });
    out.push(VariableUpdate {
        var: skipped_var,
        current: skipped,
        new: skipped_new,
    });
    graph.add_to_collection(LOSS_SCALE_COLLECTION, scale_new);
    graph.add_to_collection(LOSS_SCALE_COLLECTION, applied);
    graph.add_to_collection(LOSS_SCALE_COLLECTION, skipped_new);
    Ok(out)
}
