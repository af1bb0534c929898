//! SGD, Momentum (with Nesterov), Adam, gradient accumulation and user-defined
//! [`UpdateRule`]s, as graph ops.
//!
//! An optimizer turns `(variable, gradient)` pairs into [`VariableUpdate`]s (the new value of
//! each variable and slot, computed from reads at the start of the step), then into `Assign`
//! nodes grouped under one `Group` node (the `train_op`). The step is functional, so gating an
//! update (gradient accumulation) is a `Select` between the new and the current value.

use super::OptimError;
use super::accum::{self, ACCUM_COUNTER};
use super::adam::adam;
use super::builder::Builder;
use super::rule::{UpdateRule, VariableUpdate};
use super::state::{self, create_slot, ensure_unassigned, read};
use crate::ir::{BinaryOp, Graph, NodeId, Op, Value, VarId};
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

/// An optimizer. Weight decay is not its business: as in tensorpack, it belongs in the cost.
#[derive(Clone, Debug, PartialEq)]
pub enum Optimizer {
    /// `var -= lr * g`.
    Sgd { learning_rate: f64 },
    /// TF's `MomentumOptimizer`: `accum = momentum * accum + g`, then `var -= lr * accum`, or
    /// with `nesterov`, `var -= lr * g + lr * momentum * accum` (with the new `accum`).
    /// Slot: `{var}/Momentum`.
    Momentum {
        learning_rate: f64,
        momentum: f64,
        nesterov: bool,
    },
    /// TF's `AdamOptimizer` (v1). With `beta1_power = beta1^t` and `beta2_power = beta2^t`
    /// (non-slot variables starting at `beta1`, `beta2`, multiplied by `beta1`, `beta2` after
    /// every update):
    /// `lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power)`,
    /// `m = m + (g - m) * (1 - beta1)`, `v = v + (g^2 - v) * (1 - beta2)`,
    /// `var -= lr_t * m / (sqrt(v) + epsilon)`: epsilon is added to `sqrt(v)` after the bias
    /// correction moved into `lr_t` (TF's "epsilon hat"), not to `sqrt(v_hat)`.
    /// Slots: `{var}/Adam` (m) and `{var}/Adam_1` (v).
    Adam {
        learning_rate: f64,
        beta1: f64,
        beta2: f64,
        epsilon: f64,
    },
    /// tensorpack's `AccumGradOptimizer`: adds each step's gradient into the slot
    /// `{var}/AccumGrad`; every `steps`-th step, applies the inner optimizer to the accumulated
    /// SUM (not the mean: like a `steps`-times larger batch with a `steps`-times larger learning
    /// rate) and zeroes the slots. Other steps leave the variables and the inner optimizer's
    /// state unchanged. The counter is the `i32` variable `AccumGrad/counter`, counting
    /// 0..steps-1; `global_step` keeps counting every (micro-)step, as in tensorpack.
    AccumGrad { inner: Box<Optimizer>, steps: u32 },
    /// A rule defined outside this module (see [`UpdateRule`]), made with [`Optimizer::custom`].
    Custom(CustomRule),
}

/// A user-defined [`UpdateRule`] inside an [`Optimizer`]; two are equal when they are the same
/// rule object (clones of one `Optimizer::custom`).
#[derive(Clone)]
pub struct CustomRule(pub Arc<dyn UpdateRule>);

impl PartialEq for CustomRule {
    fn eq(&self, other: &CustomRule) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for CustomRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What [`Optimizer::apply_gradients`] built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainOp {
    /// The `Group` node gathering every assign: running it runs one optimization step.
    pub train_op: NodeId,
    /// The `Assign` nodes, one per updated variable, slot and optimizer state variable.
    pub assigns: Vec<NodeId>,
}

impl Optimizer {
    /// Plain gradient descent.
    pub fn sgd(learning_rate: f64) -> Optimizer {
        Optimizer::Sgd { learning_rate }
    }

    /// Momentum SGD.
    pub fn momentum(learning_rate: f64, momentum: f64) -> Optimizer {
        Optimizer::Momentum {
            learning_rate,
            momentum,
            nesterov: false,
        }
    }

    /// Momentum SGD with Nesterov's update.
    pub fn nesterov(learning_rate: f64, momentum: f64) -> Optimizer {
        Optimizer::Momentum {
            learning_rate,
            momentum,
            nesterov: true,
        }
    }

    /// Adam with TF's defaults: `beta1 = 0.9`, `beta2 = 0.999`, `epsilon = 1e-8`.
    pub fn adam(learning_rate: f64) -> Optimizer {
        Optimizer::Adam {
            learning_rate,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        }
    }

    /// This optimizer applied to gradients summed over `steps` steps.
    pub fn accumulate(self, steps: u32) -> Optimizer {
        Optimizer::AccumGrad {
            inner: Box::new(self),
            steps,
        }
    }

    /// A user-defined update rule, e.g. AdamW (`tests/optim/custom_rule.rs`).
    pub fn custom(rule: impl UpdateRule + 'static) -> Optimizer {
        Optimizer::Custom(CustomRule(Arc::new(rule)))
    }

    /// The optimizer's name: the scope of its update nodes and the suffix of its slots.
    pub fn name(&self) -> &str {
        match self {
            Optimizer::Sgd { .. } => "SGD",
            Optimizer::Momentum { .. } => "Momentum",
            Optimizer::Adam { .. } => "Adam",
            Optimizer::AccumGrad { .. } => "AccumGrad",
            Optimizer::Custom(rule) => rule.0.name(),
        }
    }

    /// The initial learning rate (the innermost optimizer's).
    pub fn initial_learning_rate(&self) -> f64 {
        match self {
            Optimizer::Sgd { learning_rate }
            | Optimizer::Momentum { learning_rate, .. }
            | Optimizer::Adam { learning_rate, .. } => *learning_rate,
            Optimizer::AccumGrad { inner, .. } => inner.initial_learning_rate(),
            Optimizer::Custom(rule) => rule.0.initial_learning_rate(),
        }
    }

    /// Builds the update of every variable of `grads` and of the optimizer's state, and groups
    /// the assigns under a `Group` node named `train_op_name`.
    ///
    /// Call it ONCE per training graph with every `(variable, gradient)` pair (a replicated
    /// trainer passes every replica's pairs together): the state shared by all variables
    /// (Adam's beta powers, the accumulation counter) is updated by exactly one call, and a
    /// second call errors instead of assigning it twice. `learning_rate` is get-or-created
    /// with [`Optimizer::initial_learning_rate`].
    ///
    /// ```
    /// use towerpack::ir::{Graph, Initializer, Op, Shape, TensorType, Value, VarFlags, VariableDef};
    /// use towerpack::optim::Optimizer;
    ///
    /// let mut g = Graph::new();
    /// let ty = TensorType::f32(Shape::fixed(&[3, 3, 1, 8]));
    /// let flags = VarFlags { trainable: true, ..VarFlags::default() };
    /// let w = g.declare_variable(VariableDef {
    ///     name: "conv0/W".into(), ty: ty.clone(), init: Initializer::Zeros, flags,
    /// })?;
    /// let grad = Value::first(g.add_node("grad", Op::Input { name: "grad".into(), ty }, &[])?);
    ///
    /// let train = Optimizer::momentum(0.1, 0.9).apply_gradients(&mut g, &[(w, grad)], "train_op")?;
    /// assert_eq!(g.node(train.train_op).name, "train_op");
    /// assert!(g.find_variable("conv0/W/Momentum").is_some());
    /// assert!(g.find_variable("learning_rate").is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn apply_gradients(
        &self,
        graph: &mut Graph,
        grads: &[(VarId, Value)],
        train_op_name: &str,
    ) -> Result<TrainOp, OptimError> {
        self.apply_gradients_scaled(graph, grads, train_op_name, None)
    }

    /// [`apply_gradients`](Self::apply_gradients) under a dynamic loss scale (FP16): `grads`
    /// are already unscaled ([`super::unscale`]); every update happens only when they are all
    /// finite, and the scale moves ([`super::gate_on_finite`]).
    pub fn apply_gradients_scaled(
        &self,
        graph: &mut Graph,
        grads: &[(VarId, Value)],
        train_op_name: &str,
        loss_scale: Option<&super::DynamicLossScale>,
    ) -> Result<TrainOp, OptimError> {
        let mut updates = self.updates(graph, grads)?;
        if let Some(config) = loss_scale {
            updates = super::gate_on_finite(graph, config, grads, updates)?;
        }
        let mut written = HashSet::new();
        for u in &updates {
            if !written.insert(u.var) {
                return Err(OptimError::AlreadyAssigned {
                    variable: graph.variable(u.var).name.clone(),
                });
            }
        }
        let mut assigns = Vec::with_capacity(updates.len());
        for u in &updates {
            let device = graph.node(u.new.node).device;
            let name = format!("{}/update/{}", self.name(), graph.variable(u.var).name);
            let name = graph.unique_name(&name);
            assigns.push(graph.add_node_on(&name, Op::Assign { var: u.var }, &[u.new], device)?);
        }
        let name = graph.unique_name(train_op_name);
        let train_op = graph.add_group(&name, &assigns)?;
        Ok(TrainOp { train_op, assigns })
    }

    /// The updates of every variable of `grads`, of its slots and of the optimizer's own state,
    /// without assigning them.
    pub fn updates(
        &self,
        graph: &mut Graph,
        grads: &[(VarId, Value)],
    ) -> Result<Vec<VariableUpdate>, OptimError> {
        check_gradients(graph, grads)?;
        self.check_settings()?;
        self.check_fresh(graph, grads)?;
        if let Optimizer::AccumGrad { inner, steps } = self {
            return accum::accumulate(graph, grads, *steps, &mut |g, sums| inner.updates(g, sums));
        }
        let lr_var = state::learning_rate(graph, self.initial_learning_rate())?;
        let scope = self.name();
        let lr = read(graph, lr_var, &format!("{scope}/learning_rate"), None)?;
        match self {
            Optimizer::Sgd { .. } => {
                let mut out = Vec::new();
                for &(var, g) in grads {
                    let mut b = Builder::new(graph, scope, var, g);
                    let cur = b.read(var)?;
                    let lr = b.cast(lr)?;
                    let step = b.bin(BinaryOp::Mul, lr, g)?;
                    let new = b.named("new", BinaryOp::Sub, cur, step)?;
                    out.push(VariableUpdate {
                        var,
                        current: cur,
                        new,
                    });
                }
                Ok(out)
            }
            Optimizer::Momentum {
                momentum, nesterov, ..
            } => {
                let mut out = Vec::new();
                for &(var, g) in grads {
                    let slot = create_slot(graph, var, "Momentum")?;
                    let mut b = Builder::new(graph, scope, var, g);
                    let (cur, acc) = (b.read(var)?, b.read(slot)?);
                    let lr = b.cast(lr)?;
                    let mu = b.constant("momentum", *momentum)?;
                    let decayed = b.bin(BinaryOp::Mul, mu, acc)?;
                    let acc_new = b.named("accum", BinaryOp::Add, decayed, g)?;
                    let direction = if *nesterov {
                        // lr*g + lr*mu*accum = lr * (g + mu*accum)
                        let look_ahead = b.bin(BinaryOp::Mul, mu, acc_new)?;
                        b.bin(BinaryOp::Add, g, look_ahead)?
                    } else {
                        acc_new
                    };
                    let step = b.bin(BinaryOp::Mul, lr, direction)?;
                    let new = b.named("new", BinaryOp::Sub, cur, step)?;
                    out.push(VariableUpdate {
                        var,
                        current: cur,
                        new,
                    });
                    out.push(VariableUpdate {
                        var: slot,
                        current: acc,
                        new: acc_new,
                    });
                }
                Ok(out)
            }
            Optimizer::Adam {
                beta1,
                beta2,
                epsilon,
                ..
            } => adam(graph, grads, lr, *beta1, *beta2, *epsilon),
            Optimizer::Custom(rule) => rule.0.updates(graph, grads, lr),
            // Handled above.
            Optimizer::AccumGrad { .. } => Ok(Vec::new()),
        }
    }

    /// The slot suffixes this optimizer (and the one it wraps) creates per variable.
    fn slot_suffixes(&self) -> Vec<String> {
        match self {
            Optimizer::Sgd { .. } => vec![],
            Optimizer::Momentum { .. } => vec!["Momentum".into()],
            Optimizer::Adam { .. } => vec!["Adam".into(), "Adam_1".into()],
            Optimizer::AccumGrad { inner, .. } => {
                let mut s = vec!["AccumGrad".to_string()];
                s.extend(inner.slot_suffixes());
                s
            }
            Optimizer::Custom(rule) => rule.0.slot_suffixes(),
        }
    }

    /// The shared state variables this optimizer (and the one it wraps) assigns.
    fn state_names(&self) -> Vec<&'static str> {
        match self {
            Optimizer::Sgd { .. } | Optimizer::Momentum { .. } | Optimizer::Custom(_) => vec![],
            // Adam's beta powers are per application (`beta1_power`, `beta1_power_1`, ...).
            Optimizer::Adam { .. } => vec![],
            Optimizer::AccumGrad { inner, .. } => {
                let mut s = vec![ACCUM_COUNTER];
                s.extend(inner.state_names());
                s
            }
        }
    }

    /// Errors, before anything is added to the graph, when a slot already exists or a shared
    /// state variable is already assigned (the optimizer was applied before).
    fn check_fresh(&self, graph: &Graph, grads: &[(VarId, Value)]) -> Result<(), OptimError> {
        for &(var, _) in grads {
            let name = &graph.variable(var).name;
            for suffix in self.slot_suffixes() {
                let slot = format!("{name}/{suffix}");
                if graph.find_variable(&slot).is_some() {
                    return Err(OptimError::SlotExists {
                        slot,
                        variable: name.clone(),
                    });
                }
            }
        }
        for state_name in self.state_names() {
            if let Some(id) = graph.find_variable(state_name) {
                ensure_unassigned(graph, id)?;
            }
        }
        Ok(())
    }

    fn check_settings(&self) -> Result<(), OptimError> {
        let bad = |what: &str, value: f64| {
            Err(OptimError::InvalidSetting {
                optimizer: self.name().to_string(),
                what: what.to_string(),
                value: value.to_string(),
            })
        };
        // Every optimizer's, custom rules' and accumulation's inner one included.
        let learning_rate = self.initial_learning_rate();
        if !learning_rate.is_finite() || learning_rate < 0.0 {
            return bad("learning_rate (finite and at least 0)", learning_rate);
        }
        match self {
            Optimizer::Momentum { momentum, .. } if !momentum.is_finite() => {
                bad("momentum", *momentum)
            }
            Optimizer::Adam { beta1, .. } if !(0.0..1.0).contains(beta1) => bad("beta1", *beta1),
            Optimizer::Adam { beta2, .. } if !(0.0..1.0).contains(beta2) => bad("beta2", *beta2),
            Optimizer::Adam { epsilon, .. } if epsilon.is_nan() || *epsilon < 0.0 => {
                bad("epsilon", *epsilon)
            }
            Optimizer::AccumGrad { steps: 0, .. } => bad("steps", 0.0),
            Optimizer::Custom(rule) => rule.0.check_settings(),
            Optimizer::AccumGrad { inner, .. }
                if matches!(**inner, Optimizer::AccumGrad { .. }) =>
            {
                Err(OptimError::InvalidSetting {
                    optimizer: self.name().to_string(),
                    what: "inner optimizer (nested accumulation)".to_string(),
                    value: inner.name().to_string(),
                })
            }
            _ => Ok(()),
        }
    }
}

/// Every gradient has its variable's float type, and no variable appears twice.
fn check_gradients(graph: &Graph, grads: &[(VarId, Value)]) -> Result<(), OptimError> {
    let mut seen = HashSet::new();
    for &(var, g) in grads {
        if var.0 as usize >= graph.variables().len() {
            return Err(OptimError::UnknownVariable(var.0));
        }
        let def = graph.variable(var);
        if !seen.insert(var) {
            return Err(OptimError::DuplicateGradient {
                variable: def.name.clone(),
            });
        }
        if !def.ty.dtype.is_float() {
            return Err(OptimError::NotFloat {
                variable: def.name.clone(),
                ty: def.ty.to_string(),
            });
        }
        let Some(gt) = graph.try_value_type(g) else {
            return Err(OptimError::UnknownGradient {
                variable: def.name.clone(),
            });
        };
        if *gt != def.ty {
            return Err(OptimError::GradientType {
                variable: def.name.clone(),
                variable_ty: def.ty.to_string(),
                gradient_ty: gt.to_string(),
            });
        }
    }
    Ok(())
}
