//! The parameter-server strategy (tensorpack's `SyncMultiGPUTrainerParameterServer`): towers
//! share one set of variables kept on a [`ParameterDevice`]; there the towers' gradients are
//! averaged and applied once per step.

use crate::train::error::TrainError;
use crate::train::tower_trainer::{TowerGraph, TowerStrategy, TowerTrainer, apply_optimizer};
use crate::train::trainer::{BuiltGraph, GraphSetup};

use super::{
    DataParallelStrategy, ParameterDevice, SharedTowers, TowerPlacement, average,
    build_shared_towers, main_loss,
};

/// Towers sharing one set of variables on a parameter device (see [`ParameterServerTrainer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParameterServerTowers {
    pub towers: TowerPlacement,
    /// Default: [`ParameterDevice::default_for`] the tower count.
    pub parameter_device: Option<ParameterDevice>,
}

/// tensorpack's `SyncMultiGPUTrainerParameterServer`: every tower takes its own batch and
/// computes gradients with the shared variables; the gradients are AVERAGED over the towers
/// (not summed: N towers at batch B train like one tower at batch N·B) and applied once, on
/// the parameter device, by one fused kernel per bucket.
///
/// ```
/// use towerpack::train::{Device, ParameterDevice, ParameterServerTrainer};
///
/// let on_two_workers = ParameterServerTrainer::new(2);
/// let explicit = ParameterServerTrainer::on([Device::Cpu(0), Device::Cpu(1)])
///     .parameter_device(ParameterDevice::Host);
/// # let _ = (on_two_workers, explicit);
/// ```
pub type ParameterServerTrainer = TowerTrainer<ParameterServerTowers>;

/// tensorpack's name of [`ParameterServerTrainer`].
pub type SyncMultiGPUTrainerParameterServer = ParameterServerTrainer;

impl TowerTrainer<ParameterServerTowers> {
    /// Keeps the variables on `device`.
    pub fn parameter_device(mut self, device: ParameterDevice) -> ParameterServerTrainer {
        self.strategy_mut().parameter_device = Some(device);
        self
    }
}

impl DataParallelStrategy for ParameterServerTowers {
    fn over(towers: TowerPlacement) -> ParameterServerTowers {
        ParameterServerTowers {
            towers,
            parameter_device: None,
        }
    }

    fn towers_mut(&mut self) -> &mut TowerPlacement {
        &mut self.towers
    }
}

impl TowerStrategy for ParameterServerTowers {
    fn name(&self) -> String {
        "SyncMultiGPUTrainerParameterServer".into()
    }

    fn build(&self, setup: &mut GraphSetup<'_>) -> Result<TowerGraph, TrainError> {
        let SharedTowers {
            model,
            towers,
            rows,
            device: ps,
            extra,
        } = build_shared_towers(setup, &self.towers, self.parameter_device, &self.name())?;
        let mut averaged = Vec::with_capacity(rows.len());
        for row in &rows {
            let var = row.vars[0];
            let scope = format!("average_gradients/{}", setup.graph.variable(var).name);
            averaged.push((var, average(setup.graph, &scope, &row.grads, ps)?));
        }
        let (train, processed) = apply_optimizer(
            setup.graph,
            model.as_ref(),
            &averaged,
            "train_op",
            setup.loss_scale.as_ref(),
        )?;
        Ok(TowerGraph {
            train_op: train.train_op,
            built: BuiltGraph {
                losses: vec![main_loss(setup.graph, &towers)?],
                gradients: processed.grads,
                numeric_checks: processed.checks,
                towers,
                placement: self.towers.devices.placement(extra),
                bucket_bytes: self.towers.bucket_bytes,
                ..BuiltGraph::default()
            },
        })
    }
}
