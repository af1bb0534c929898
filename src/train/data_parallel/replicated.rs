//! The replicated strategy (tensorpack's `SyncMultiGPUTrainerReplicated`): one replica of the
//! variables per tower, each updated on its own device with the average of every tower's
//! gradient, and [`BroadcastReplicas`], which copies replica 0 to the others.

use std::collections::HashMap;

use crate::backend::Step;
use crate::dsl::{Strategy, TowerHandle};
use crate::ir::{Graph, NodeId, Op, Value, VarId};
use crate::train::callback::Callback;
use crate::train::context::TrainContext;
use crate::train::error::{SetupError, TrainError};
use crate::train::tower_trainer::{
    TowerGraph, TowerStrategy, TowerTrainer, build_training_towers_on,
};
use crate::train::trainer::{BuiltGraph, GraphSetup};

use super::{
    DataParallelStrategy, TowerPlacement, average, logical_device, main_loss, process,
    tower_gradient_rows,
};

/// One replica of the variables per tower (see [`ReplicatedTrainer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicatedTowers {
    pub towers: TowerPlacement,
    /// Also broadcast replica 0 at the end of every epoch (tensorpack's default), not only
    /// before training.
    pub broadcast_every_epoch: bool,
}

/// tensorpack's `SyncMultiGPUTrainerReplicated`: tower `i` keeps its own replica of the
/// variables (tower 0's unprefixed, tower `i`'s under `tower{i}/`, LOCAL so never saved). Every
/// tower takes its own batch; the gradients are AVERAGED over the towers (not summed: N towers
/// at batch B train like one tower at batch N·B), and every replica applies that average on its
/// own device, one fused kernel per bucket reading every tower's gradient arena. Replica 0 is
/// copied to the others before training (after a checkpoint is restored) and every epoch, so a
/// checkpoint — which holds replica 0 only — loads into any number of towers.
///
/// Switching a run from one tower to two is this one line:
///
/// ```
/// use towerpack::train::{ReplicatedTrainer, SimpleTrainer, Trainer};
///
/// let one: Box<dyn Trainer> = Box::new(SimpleTrainer::new());
/// let two: Box<dyn Trainer> = Box::new(ReplicatedTrainer::new(2));
/// assert_eq!(two.name(), "SyncMultiGPUTrainerReplicated");
/// # let _ = one;
/// ```
pub type ReplicatedTrainer = TowerTrainer<ReplicatedTowers>;

/// tensorpack's name of [`ReplicatedTrainer`].
pub type SyncMultiGPUTrainerReplicated = ReplicatedTrainer;

impl TowerTrainer<ReplicatedTowers> {
    /// Whether replica 0 is also broadcast at the end of every epoch (default: yes).
    pub fn broadcast_every_epoch(mut self, every_epoch: bool) -> ReplicatedTrainer {
        self.strategy_mut().broadcast_every_epoch = every_epoch;
        self
    }
}

impl DataParallelStrategy for ReplicatedTowers {
    fn over(towers: TowerPlacement) -> ReplicatedTowers {
        ReplicatedTowers {
            towers,
            broadcast_every_epoch: true,
        }
    }

    fn towers_mut(&mut self) -> &mut TowerPlacement {
        &mut self.towers
    }
}

impl TowerStrategy for ReplicatedTowers {
    fn name(&self) -> String {
        "SyncMultiGPUTrainerReplicated".into()
    }

    fn build(&self, setup: &mut GraphSetup<'_>) -> Result<TowerGraph, TrainError> {
        let n = self.towers.devices.check(&self.name())?;
        let model = setup.model()?;
        let towers = build_training_towers_on(setup, n, Strategy::Replicated)?;
        let loss_scale = setup.loss_scale;
        let rows = tower_gradient_rows(setup.graph, &towers, loss_scale.as_ref())?;
        let mut pairs = Vec::new();
        let mut main = None;
        for (i, tower) in towers.iter().enumerate() {
            let device = logical_device(i)?;
            // Averaged and processed under replica 0's variables, so gradient processors match
            // the same names on every replica; then handed to replica i's variables.
            let mut averaged = Vec::with_capacity(rows.len());
            let mut replica_of: HashMap<VarId, VarId> = HashMap::new();
            for row in &rows {
                let (var, replica) = (row.vars[0], row.vars[i]);
                let name = &setup.graph.variable(var).name;
                let scope = format!("{}/average_gradients/{name}", tower.ns_name);
                averaged.push((var, average(setup.graph, &scope, &row.grads, device)?));
                replica_of.insert(var, replica);
            }
            let processed = process(setup.graph, model.as_ref(), &averaged)?;
            pairs.extend(processed.grads.iter().map(|(v, g)| (replica_of[v], *g)));
            main.get_or_insert(processed);
        }
        let main = main.ok_or_else(|| SetupError::NoTrainingTower {
            trainer: "ReplicatedTrainer".into(),
        })?;
        let train = model.optimizer().apply_gradients_scaled(
            setup.graph,
            &pairs,
            "train_op",
            loss_scale.as_ref(),
        )?;
        let mut callbacks: Vec<Box<dyn Callback>> = Vec::new();
        if n > 1 {
            callbacks.push(Box::new(BroadcastReplicas::new(
                build_broadcast(setup.graph, &towers)?,
                self.broadcast_every_epoch,
            )));
        }
        Ok(TowerGraph {
            train_op: train.train_op,
            built: BuiltGraph {
                losses: vec![main_loss(setup.graph, &towers)?],
                gradients: main.grads,
                numeric_checks: main.checks,
                towers,
                callbacks,
                placement: self.towers.devices.placement(None),
                bucket_bytes: self.towers.bucket_bytes,
            },
        })
    }
}

/// The group `sync_variables_from_device`: for every replica `i > 0`, every variable
/// `tower{i}/X` — weights, optimizer slots, BatchNorm statistics — assigned the value of `X`
/// (tensorpack's `get_post_init_ops`), each copy on its replica's device.
fn build_broadcast(graph: &mut Graph, towers: &[TowerHandle]) -> Result<NodeId, TrainError> {
    let mut assigns = Vec::new();
    let mut synced: Vec<VarId> = Vec::new();
    for (i, tower) in towers.iter().enumerate().skip(1) {
        let device = Some(logical_device(i)?);
        let prefix = format!("{}/", tower.vs_name);
        let sources: Vec<(VarId, VarId)> = graph
            .variable_ids()
            .filter_map(|(id, def)| {
                let replica = graph.find_variable(&format!("{prefix}{}", def.name))?;
                Some((id, replica))
            })
            .collect();
        for (source, replica) in sources {
            let (from, to) = (graph.variable(source), graph.variable(replica));
            if from.ty != to.ty {
                return Err(SetupError::ReplicaType {
                    replica: to.name.clone(),
                    replica_type: to.ty.to_string(),
                    source_name: from.name.clone(),
                    source_type: from.ty.to_string(),
                }
                .into());
            }
            let scope = format!("sync_variables_from_device/{}", to.name);
            let name = graph.unique_name(&format!("{scope}/read"));
            let read = graph.add_node_on(&name, Op::Variable { var: source }, &[], device)?;
            let name = graph.unique_name(&scope);
            let assign = graph.add_node_on(
                &name,
                Op::Assign { var: replica },
                &[Value::first(read)],
                device,
            )?;
            assigns.push(assign);
            synced.push(replica);
        }
        // tensorpack's check: every variable of the replica's scope must have a source.
        for (id, def) in graph.variable_ids() {
            if def.name.starts_with(&prefix) && !synced.contains(&id) {
                if def.flags.trainable {
                    return Err(SetupError::ReplicaWithoutSource {
                        replica: def.name.clone(),
                        source_name: def.name[prefix.len()..].to_string(),
                    }
                    .into());
                }
                log::warn!(
                    target: "towerpack",
                    "[ReplicatedTrainer] `{}` has no source in replica 0 and is not broadcast",
                    def.name
                );
            }
        }
    }
    log::info!(
        target: "towerpack",
        "'sync_variables_from_device' includes {} operations.",
        assigns.len()
    );
    let name = graph.unique_name("sync_variables_from_device");
    Ok(graph.add_group(&name, &assigns)?)
}

/// Copies replica 0's variables to every other replica: before training (after a checkpoint
/// was restored into replica 0) and, when `every_epoch`, on every epoch's trigger. Runs on
/// every worker, chief or not.
#[derive(Clone, Debug)]
pub struct BroadcastReplicas {
    op: NodeId,
    every_epoch: bool,
}

impl BroadcastReplicas {
    /// Runs the group `op` (built by the trainer) before training and, when `every_epoch`,
    /// every epoch.
    pub fn new(op: NodeId, every_epoch: bool) -> BroadcastReplicas {
        BroadcastReplicas { op, every_epoch }
    }

    fn broadcast(&self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        ctx.run(&Step::new(Vec::new(), vec![self.op]), &[])?;
        Ok(())
    }
}

impl Callback for BroadcastReplicas {
    fn chief_only(&self) -> bool {
        false
    }

    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.broadcast(ctx)
    }

    fn trigger_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if self.every_epoch {
            self.broadcast(ctx)?;
        }
        Ok(())
    }
}
