//! [`LossScaleMonitor`]: makes FP16's dynamic loss scale visible — the `loss_scale` monitor
//! scalar after every step, a warning naming each skipped step, and the running count of
//! skipped steps (`loss_scale/skipped_steps`). The engine registers it whenever the run has a
//! loss scale ([`TrainConfig::loss_scale`](crate::train::TrainConfig::loss_scale)); it reads
//! what the trainer put in [`crate::optim::LOSS_SCALE_COLLECTION`].

use crate::ir::Value;
use crate::optim::LOSS_SCALE_COLLECTION;
use crate::tensor::HostTensor;
use crate::train::callback::{Callback, RunArgs};
use crate::train::context::TrainContext;
use crate::train::error::TrainError;

/// Fetches the new loss scale and whether the step was applied, with every step.
#[derive(Debug, Default)]
pub struct LossScaleMonitor {
    /// `(new scale, step applied)`, when the graph has a loss scale.
    values: Option<(Value, Value)>,
    skipped: u64,
}

impl LossScaleMonitor {
    /// A monitor of the graph's loss scale (inert when it has none).
    pub fn new() -> LossScaleMonitor {
        LossScaleMonitor::default()
    }

    /// Steps skipped so far for non-finite gradients.
    pub fn skipped_steps(&self) -> u64 {
        self.skipped
    }
}

impl Callback for LossScaleMonitor {
    fn chief_only(&self) -> bool {
        false
    }

    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if let [scale, applied] = ctx.graph().collection(LOSS_SCALE_COLLECTION) {
            self.values = Some((*scale, *applied));
        }
        Ok(())
    }

    fn before_run(&mut self, _: &TrainContext) -> Result<RunArgs, TrainError> {
        Ok(match self.values {
            Some((scale, applied)) => RunArgs::fetch(vec![scale, applied]),
            None => RunArgs::none(),
        })
    }

    fn after_run(
        &mut self,
        ctx: &mut TrainContext,
        fetched: &[HostTensor],
    ) -> Result<(), TrainError> {
        let [scale, applied] = fetched else {
            return Ok(());
        };
        let scale = scale.scalar_value().unwrap_or(f64::NAN);
        if applied.scalar_value().ok() != Some(1.0) {
            self.skipped += 1;
            log::warn!(
                target: "towerpack",
                "Step {} skipped: a gradient was not finite under the loss scale; \
                 the scale is now {scale}",
                ctx.global_step()
            );
            ctx.put_scalar("loss_scale/skipped_steps", self.skipped as f64)?;
        }
        ctx.put_scalar("loss_scale", scale)
    }
}
