//! Data-parallel tower strategies (tensorpack's multi-GPU trainers): N training towers, one per
//! device, each taking its OWN batch from the input source (the total batch is the per-tower
//! batch × N), their gradients AVERAGED — never summed — into the update:
//!
//! - [`ParameterServerTrainer`] (`SyncMultiGPUTrainerParameterServer`): one set of variables on
//!   a chosen device or the host; the average is applied once.
//! - [`ReplicatedTrainer`] (`SyncMultiGPUTrainerReplicated`): one replica per device; every
//!   replica applies the same average; replica 0 is broadcast to the others before training
//!   and every epoch; checkpoints hold replica 0 only, so they load whatever the tower count.
//! - [`AsyncTrainer`] (`AsyncMultiGPUTrainer`): every tower applies its own gradient (scaled by
//!   1/N unless told otherwise), one update after another within a step.
//!
//! Only tower 0 (the main tower) updates BatchNorm's moving averages and emits summaries.
//!
//! **Devices.** Training tower `i` is logical device `i` of the lowered program (a parameter
//! server on the host is logical device N); [`TowerDevices`] maps them to [`Device`]s
//! (`Cpu(i)` on the CPU backend, where each runs on a worker of its own, the cores split
//! between them; `Cuda(i)` on the CUDA backend).
//!
//! **The fused averaging kernel.** A tower's gradients are written into its *gradient arena*
//! (per bucket, one contiguous scratch buffer; every tower's has the same layout: the bucket's
//! variables in state order). For each bucket of at most `bucket_bytes` of variables ONE kernel
//! reads the N arenas, averages them and applies the optimizer in the same pass (per replica's
//! device for the replicated trainer): lowering fuses the average into the update, and the arena
//! pass ([`crate::lower::arena`]) merges the per-variable updates over the bucket. Where the
//! update needs every gradient first (global-norm clipping) it stays per variable, still
//! averaged. [`Program::buckets`](crate::lower::Program::buckets) lists every fused kernel with
//! its arenas and member offsets; across processes, the distributed trainer's all-reduces are
//! bucketed over the same arenas ([`crate::lower::collectives`]).

mod async_update;
mod parameter_server;
mod replicated;

pub use async_update::{AsyncMultiGPUTrainer, AsyncTowers, AsyncTrainer};
pub use parameter_server::{
    ParameterServerTowers, ParameterServerTrainer, SyncMultiGPUTrainerParameterServer,
};
pub use replicated::{
    BroadcastReplicas, ReplicatedTowers, ReplicatedTrainer, SyncMultiGPUTrainerReplicated,
};

pub use crate::backend::Device;

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::Placement;
use crate::dsl::TowerHandle;
use crate::ir::{BinaryOp, Graph, Op, Value, VarId};
use crate::optim::{DynamicLossScale, ProcessedGradients, process_gradients};
use crate::tensor::HostTensor;

use super::error::{SetupError, TrainError};
use super::model::ModelDesc;
use super::tower_trainer::{
    TowerStrategy, TowerTrainer, build_training_towers_on, tower_gradients,
};
use super::trainer::GraphSetup;
use crate::dsl::Strategy;

/// The towers of a data-parallel strategy: where they run, and the bucket size of their fused
/// averaging-and-update kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TowerPlacement {
    pub devices: TowerDevices,
    /// Largest range of variables (bytes) one fused kernel updates (default: lowering's).
    pub bucket_bytes: Option<usize>,
}

/// A data-parallel [`TowerStrategy`]: made from its towers' placement, with defaults for the
/// rest. Gives its trainer the constructors `new(towers)` and `on(devices)`.
pub trait DataParallelStrategy: TowerStrategy + Sized {
    /// The strategy over `towers`, otherwise as tensorpack's defaults.
    fn over(towers: TowerPlacement) -> Self;

    /// Its towers' placement.
    fn towers_mut(&mut self) -> &mut TowerPlacement;
}

impl<S: DataParallelStrategy> TowerTrainer<S> {
    /// `towers` towers on the backend's first devices (`Cpu(0..towers)` on the CPU backend).
    pub fn new(towers: usize) -> TowerTrainer<S> {
        TowerTrainer::with_devices(TowerDevices::Count(towers))
    }

    /// One tower per device of `devices`, in order.
    pub fn on(devices: impl IntoIterator<Item = Device>) -> TowerTrainer<S> {
        TowerTrainer::with_devices(TowerDevices::On(devices.into_iter().collect()))
    }

    fn with_devices(devices: TowerDevices) -> TowerTrainer<S> {
        TowerTrainer::with_strategy(S::over(TowerPlacement {
            devices,
            bucket_bytes: None,
        }))
    }

    /// Cuts the fused averaging-and-update kernels into buckets of at most `bytes` of
    /// variables (Horovod's tensor-fusion threshold).
    pub fn bucket_bytes(mut self, bytes: usize) -> TowerTrainer<S> {
        self.strategy_mut().towers_mut().bucket_bytes = Some(bytes);
        self
    }
}

/// Which devices the training towers run on: tower `i` is logical device `i`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TowerDevices {
    /// `n` towers on the backend's first `n` devices.
    Count(usize),
    /// One tower per device, in order.
    On(Vec<Device>),
}

impl TowerDevices {
    /// The number of towers.
    pub fn count(&self) -> usize {
        match self {
            TowerDevices::Count(n) => *n,
            TowerDevices::On(d) => d.len(),
        }
    }

    /// The placement of logical devices `0..count` (then `extra`, if any, on logical device
    /// `count`).
    pub fn placement(&self, extra: Option<Device>) -> Placement {
        let mut devices = match self {
            TowerDevices::Count(n) => vec![None; *n],
            TowerDevices::On(d) => d.iter().copied().map(Some).collect(),
        };
        devices.extend(extra.map(Some));
        Placement { devices }
    }

    /// Errors unless there is at least one tower.
    fn check(&self, trainer: &str) -> Result<usize, TrainError> {
        match self.count() {
            0 => Err(SetupError::NoTowers {
                trainer: trainer.into(),
            }
            .into()),
            n => Ok(n),
        }
    }
}

/// Where a parameter server (or the async trainer) keeps the shared variables and applies
/// their updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParameterDevice {
    /// The device of training tower `i`.
    Tower(usize),
    /// The host (tensorpack's `ps_device='cpu'`): logical device N, after the towers'.
    Host,
}

impl ParameterDevice {
    /// tensorpack's default: a tower's device for up to two towers, else the host.
    pub fn default_for(towers: usize) -> ParameterDevice {
        if towers <= 2 {
            ParameterDevice::Tower(0)
        } else {
            ParameterDevice::Host
        }
    }

    /// The logical device of the variables among `towers` towers, and the device to add to
    /// the placement for it.
    fn logical(self, towers: usize, trainer: &str) -> Result<(u16, Option<Device>), TrainError> {
        let (index, extra) = match self {
            ParameterDevice::Tower(i) if i < towers => (i, None),
            ParameterDevice::Tower(i) => {
                return Err(SetupError::TowerOutOfRange {
                    trainer: trainer.into(),
                    tower: i,
                    towers,
                }
                .into());
            }
            ParameterDevice::Host => (towers, Some(Device::Host)),
        };
        let index = logical_device(index)?;
        Ok((index, extra))
    }
}

/// Tower (or extra device) `index` as a logical device number.
fn logical_device(index: usize) -> Result<u16, TrainError> {
    u16::try_from(index).map_err(|_| SetupError::TooManyDevices { index }.into())
}

/// One trained variable: its copy in each tower (the same variable when towers share them,
/// tower `i`'s replica otherwise) and each tower's gradient of it.
struct GradientRow {
    vars: Vec<VarId>,
    grads: Vec<Value>,
}

/// The gradients of every tower, one row per variable of tower 0, in tower 0's order.
fn tower_gradient_rows(
    graph: &mut Graph,
    towers: &[TowerHandle],
    loss_scale: Option<&DynamicLossScale>,
) -> Result<Vec<GradientRow>, TrainError> {
    let mut rows: Vec<GradientRow> = Vec::new();
    let mut row_of: HashMap<VarId, usize> = HashMap::new();
    for (i, tower) in towers.iter().enumerate() {
        let prefix = format!("{}/gradients", tower.ns_name);
        let grads = tower_gradients(graph, tower, prefix.trim_start_matches('/'), loss_scale)?;
        if i == 0 {
            for (var, g) in grads {
                row_of.insert(var, rows.len());
                rows.push(GradientRow {
                    vars: vec![var],
                    grads: vec![g],
                });
            }
            continue;
        }
        if grads.len() != rows.len() {
            return Err(SetupError::GradientCount {
                tower: tower.ns_name.clone(),
                count: grads.len(),
                tower0: rows.len(),
            }
            .into());
        }
        for (var, g) in grads {
            let main = main_variable(graph, tower, var)?;
            let row = row_of.get(&main).copied().ok_or_else(|| {
                TrainError::from(SetupError::ExtraVariable {
                    tower: tower.ns_name.clone(),
                    variable: graph.variable(var).name.clone(),
                })
            })?;
            rows[row].vars.push(var);
            rows[row].grads.push(g);
        }
    }
    Ok(rows)
}

/// The variable of tower 0 that `var` of `tower` stands for: itself when shared, else the
/// variable named without the tower's variable scope.
fn main_variable(graph: &Graph, tower: &TowerHandle, var: VarId) -> Result<VarId, TrainError> {
    if tower.vs_name.is_empty() {
        return Ok(var);
    }
    let name = &graph.variable(var).name;
    name.strip_prefix(&format!("{}/", tower.vs_name))
        .and_then(|main| graph.find_variable(main))
        .ok_or_else(|| {
            TrainError::from(SetupError::ReplicaWithoutCounterpart {
                variable: name.clone(),
                tower: tower.ns_name.clone(),
            })
        })
}

/// Towers sharing one set of variables kept on a parameter device: what the parameter-server
/// and asynchronous strategies start from.
struct SharedTowers {
    model: Arc<dyn ModelDesc>,
    towers: Vec<TowerHandle>,
    rows: Vec<GradientRow>,
    /// The logical device of the variables and their updates.
    device: u16,
    /// The device to add to the placement for it (the host), if any.
    extra: Option<Device>,
}

/// Builds the training towers of `placement` over shared variables on `parameter_device`
/// (default: [`ParameterDevice::default_for`] the tower count), and their gradients.
fn build_shared_towers(
    setup: &mut GraphSetup<'_>,
    placement: &TowerPlacement,
    parameter_device: Option<ParameterDevice>,
    trainer: &str,
) -> Result<SharedTowers, TrainError> {
    let n = placement.devices.check(trainer)?;
    let (device, extra) = parameter_device
        .unwrap_or_else(|| ParameterDevice::default_for(n))
        .logical(n, trainer)?;
    let model = setup.model()?;
    let towers = build_training_towers_on(setup, n, Strategy::Shared)?;
    let rows = tower_gradient_rows(setup.graph, &towers, setup.loss_scale.as_ref())?;
    Ok(SharedTowers {
        model,
        towers,
        rows,
        device,
        extra,
    })
}

/// `value · (1/count)` on `device`: a constant `{scope}/inverse_count` times `value`, the
/// product named `product`.
fn divide_by_count(
    graph: &mut Graph,
    scope: &str,
    product: &str,
    value: Value,
    count: usize,
    device: Option<u16>,
) -> Result<Value, TrainError> {
    let dtype = graph.value_type(value).dtype;
    let inverse = HostTensor::scalar(dtype, 1.0 / count as f64);
    let name = graph.unique_name(&format!("{scope}/inverse_count"));
    let inverse = graph.add_node_on(&name, Op::Constant { value: inverse }, &[], device)?;
    let name = graph.unique_name(product);
    let scaled = graph.add_node_on(
        &name,
        Op::Binary(BinaryOp::Mul),
        &[value, Value::first(inverse)],
        device,
    )?;
    Ok(Value::first(scaled))
}

/// `(g₀ + g₁ + … + gₙ₋₁) · (1/n)` on logical device `device`, summed in tower order (so every
/// replica computes the bit-identical average); the gradient itself when `n == 1`.
fn average(
    graph: &mut Graph,
    scope: &str,
    grads: &[Value],
    device: u16,
) -> Result<Value, TrainError> {
    let (&first, rest) = grads
        .split_first()
        .ok_or_else(|| SetupError::NothingToAverage {
            scope: scope.into(),
        })?;
    if rest.is_empty() {
        return Ok(first);
    }
    let mut sum = first;
    for &g in rest {
        let name = graph.unique_name(&format!("{scope}/sum"));
        sum = Value::first(graph.add_node_on(
            &name,
            Op::Binary(BinaryOp::Add),
            &[sum, g],
            Some(device),
        )?);
    }
    let product = format!("{scope}/mean");
    divide_by_count(graph, scope, &product, sum, grads.len(), Some(device))
}

/// Runs the model's gradient processors over `grads`, logging their warnings.
fn process(
    graph: &mut Graph,
    model: &dyn ModelDesc,
    grads: &[(VarId, Value)],
) -> Result<ProcessedGradients, TrainError> {
    let processed = process_gradients(graph, grads, &model.gradient_processors())?;
    for w in &processed.warnings {
        log::warn!(target: "towerpack", "{w}");
    }
    Ok(processed)
}

/// The named cost of the main tower.
fn main_loss(graph: &Graph, towers: &[TowerHandle]) -> Result<(String, Value), TrainError> {
    let cost = towers
        .first()
        .and_then(|t| t.cost)
        .ok_or_else(|| SetupError::NoCost {
            tower: towers.first().map_or(String::new(), |t| t.ns_name.clone()),
        })?;
    Ok((graph.value_name(cost), cost))
}
