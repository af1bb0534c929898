//! The asynchronous strategy (tensorpack's `AsyncMultiGPUTrainer`): towers share the variables
//! and each applies its own gradient, without averaging.
//!
//! tensorpack lets the towers' updates race. A towerpack step is functional and deterministic,
//! so the race is given one fixed outcome: every tower computes its gradient from the weights
//! the step began with (each update is stale by up to N−1 others, as with real asynchronous
//! workers), and the N updates are applied one after another in tower order, each a full
//! optimizer step (momentum, Adam moments and beta powers advance N times per step).

use std::collections::{HashMap, HashSet};

use crate::ir::{Graph, NodeId, Op, Value, VarId};
use crate::optim::{Optimizer, VariableUpdate};
use crate::train::error::{SetupError, TrainError};
use crate::train::tower_trainer::{TowerGraph, TowerStrategy, TowerTrainer};
use crate::train::trainer::{BuiltGraph, GraphSetup};

use super::{
    DataParallelStrategy, ParameterDevice, SharedTowers, TowerPlacement, build_shared_towers,
    divide_by_count, main_loss, process,
};

/// Towers sharing variables, each applying its own update (see [`AsyncTrainer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsyncTowers {
    pub towers: TowerPlacement,
    /// Multiply each tower's gradient by 1/N before applying it (tensorpack's default).
    pub scale_gradient: bool,
    /// Where the shared variables live and are updated (default:
    /// [`ParameterDevice::default_for`] the tower count).
    pub parameter_device: Option<ParameterDevice>,
}

/// tensorpack's `AsyncMultiGPUTrainer`: every tower takes its own batch and applies its own
/// gradient to the shared variables, without averaging; with `scale_gradient` (the default)
/// each gradient is first multiplied by 1/N. Within a step the N updates are applied in tower
/// order, each computed from the weights the step began with (see the module docs). Gradient
/// processors run on each tower's gradients separately.
///
/// ```
/// use towerpack::train::AsyncTrainer;
///
/// let unscaled = AsyncTrainer::new(2).scale_gradient(false);
/// # let _ = unscaled;
/// ```
pub type AsyncTrainer = TowerTrainer<AsyncTowers>;

/// tensorpack's name of [`AsyncTrainer`].
pub type AsyncMultiGPUTrainer = AsyncTrainer;

impl TowerTrainer<AsyncTowers> {
    /// Whether each tower's gradient is multiplied by 1/N (default: yes).
    pub fn scale_gradient(mut self, scale: bool) -> AsyncTrainer {
        self.strategy_mut().scale_gradient = scale;
        self
    }

    /// Keeps the shared variables on `device`.
    pub fn parameter_device(mut self, device: ParameterDevice) -> AsyncTrainer {
        self.strategy_mut().parameter_device = Some(device);
        self
    }
}

impl DataParallelStrategy for AsyncTowers {
    fn over(towers: TowerPlacement) -> AsyncTowers {
        AsyncTowers {
            towers,
            scale_gradient: true,
            parameter_device: None,
        }
    }

    fn towers_mut(&mut self) -> &mut TowerPlacement {
        &mut self.towers
    }
}

impl TowerStrategy for AsyncTowers {
    fn name(&self) -> String {
        "AsyncMultiGPUTrainer".into()
    }

    fn build(&self, setup: &mut GraphSetup<'_>) -> Result<TowerGraph, TrainError> {
        if setup.loss_scale.is_some() {
            return Err(SetupError::LossScaleUnsupported {
                trainer: self.name(),
            }
            .into());
        }
        let SharedTowers {
            model,
            towers,
            rows,
            device: ps,
            extra,
        } = build_shared_towers(setup, &self.towers, self.parameter_device, &self.name())?;
        let n = towers.len();
        let mut per_tower = Vec::with_capacity(n);
        let mut main = None;
        for (t, tower) in towers.iter().enumerate() {
            let mut grads = Vec::with_capacity(rows.len());
            for row in &rows {
                let g = row.grads[t];
                let g = if self.scale_gradient && n > 1 {
                    scale(setup.graph, &tower.ns_name, row.vars[0], g, n)?
                } else {
                    g
                };
                grads.push((row.vars[0], g));
            }
            let processed = process(setup.graph, model.as_ref(), &grads)?;
            per_tower.push(processed.grads.clone());
            main.get_or_insert(processed);
        }
        let main = main.ok_or_else(|| SetupError::NoTrainingTower {
            trainer: "AsyncMultiGPUTrainer".into(),
        })?;
        let optimizer = model.optimizer();
        let updates = chained_updates(setup.graph, &optimizer, &per_tower, ps)?;
        let mut assigns = Vec::with_capacity(updates.len());
        for (var, new) in updates {
            let name = format!(
                "{}/update/{}",
                optimizer.name(),
                setup.graph.variable(var).name
            );
            let name = setup.graph.unique_name(&name);
            assigns.push(
                setup
                    .graph
                    .add_node_on(&name, Op::Assign { var }, &[new], Some(ps))?,
            );
        }
        let name = setup.graph.unique_name("train_op");
        let train_op = setup.graph.add_group(&name, &assigns)?;
        Ok(TowerGraph {
            train_op,
            built: BuiltGraph {
                losses: vec![main_loss(setup.graph, &towers)?],
                gradients: main.grads,
                numeric_checks: main.checks,
                towers,
                placement: self.towers.devices.placement(extra),
                bucket_bytes: self.towers.bucket_bytes,
                ..BuiltGraph::default()
            },
        })
    }
}

/// `g / towers`, on the gradient's device.
fn scale(
    graph: &mut Graph,
    tower: &str,
    var: VarId,
    g: Value,
    towers: usize,
) -> Result<Value, TrainError> {
    let device = graph.node(g.node).device;
    let scope = format!("{tower}/scale_gradient/{}", graph.variable(var).name);
    divide_by_count(graph, &scope, &scope, g, towers, device)
}

/// The end-of-step value of every variable the optimizer updates when it is applied to
/// `per_tower[0]`, then to `per_tower[1]` starting from the result, and so on. The first
/// application is built by the optimizer; each later one is a copy of its nodes in which reads
/// of updated variables take the previous application's results and tower 0's gradients are
/// replaced by tower t's. Every node is placed on logical device `device`.
fn chained_updates(
    graph: &mut Graph,
    optimizer: &Optimizer,
    per_tower: &[Vec<(VarId, Value)>],
    device: u16,
) -> Result<Vec<(VarId, Value)>, TrainError> {
    let before: HashSet<NodeId> = graph.node_ids().collect();
    let first: Vec<VariableUpdate> = optimizer.updates(graph, &per_tower[0])?;
    let created: Vec<NodeId> = graph
        .topo_order()?
        .into_iter()
        .filter(|id| !before.contains(id))
        .collect();
    for &id in &created {
        graph.set_device(id, Some(device));
    }
    let mut current: HashMap<VarId, Value> = first.iter().map(|u| (u.var, u.new)).collect();
    let gradient_vars: Vec<VarId> = per_tower[0].iter().map(|(v, _)| *v).collect();
    for grads in &per_tower[1..] {
        let vars: Vec<VarId> = grads.iter().map(|(v, _)| *v).collect();
        if vars != gradient_vars {
            return Err(SetupError::ProcessorsDiffer {
                trainer: "AsyncMultiGPUTrainer".into(),
            }
            .into());
        }
        let mut map: HashMap<Value, Value> = per_tower[0]
            .iter()
            .zip(grads)
            .map(|(&(_, g0), &(_, g))| (g0, g))
            .collect();
        for &id in &created {
            let node = graph.node(id).clone();
            if !graph.control_inputs(id).is_empty() {
                return Err(SetupError::NotRepeatable {
                    trainer: "AsyncMultiGPUTrainer".into(),
                    node: node.name,
                }
                .into());
            }
            if let Op::Variable { var } = node.op
                && let Some(&value) = current.get(&var)
            {
                map.insert(Value::first(id), value);
                continue;
            }
            let inputs: Vec<Value> = graph
                .inputs(id)
                .iter()
                .map(|v| map.get(v).copied().unwrap_or(*v))
                .collect();
            let name = graph.unique_name(&node.name);
            let copy = graph.add_node_on(&name, node.op.clone(), &inputs, Some(device))?;
            for port in 0..node.outputs.len() {
                let port = u16::try_from(port).unwrap_or(u16::MAX);
                map.insert(Value::new(id, port), Value::new(copy, port));
            }
        }
        for u in &first {
            let new = map.get(&u.new).copied().unwrap_or(u.new);
            current.insert(u.var, new);
        }
    }
    Ok(first
        .iter()
        .map(|u| (u.var, current.get(&u.var).copied().unwrap_or(u.new)))
        .collect())
}
