//! `DummyConstantInput`: the same all-zero batch for every tower at every step, to measure the
//! graph's speed without any data pipeline.

use crate::backend::Feed;
use crate::data::FlowState;
use crate::dsl::InputSpec;
use crate::ir::NodeId;
use crate::tensor::HostTensor;
use crate::train::error::TrainError;

use super::{InputSource, TowerFeeds};

const NAME: &str = "DummyConstantInput";

/// Zeros of the given full shapes (batch dimension included), one per signature input.
pub struct DummyConstantInput {
    shapes: Vec<Vec<usize>>,
    feeds: TowerFeeds,
    batch: Vec<HostTensor>,
}

impl DummyConstantInput {
    /// Zeros of `shapes`, in signature order (tensorpack's `DummyConstantInput(shapes)`).
    pub fn new(shapes: Vec<Vec<usize>>) -> DummyConstantInput {
        DummyConstantInput {
            shapes,
            feeds: TowerFeeds::default(),
            batch: Vec::new(),
        }
    }
}

impl InputSource for DummyConstantInput {
    fn name(&self) -> &'static str {
        NAME
    }

    fn setup(&mut self, signature: &[InputSpec]) -> Result<(), TrainError> {
        if signature.len() != self.shapes.len() {
            return Err(TrainError::Input {
                source_name: NAME.into(),
                message: format!(
                    "{} shapes given for {} signature inputs",
                    self.shapes.len(),
                    signature.len()
                ),
            });
        }
        self.batch = signature
            .iter()
            .zip(&self.shapes)
            .map(|(spec, shape)| HostTensor::zeros(spec.dtype, shape))
            .collect();
        self.feeds.setup(signature);
        Ok(())
    }

    fn register_tower(&mut self, inputs: &[(String, NodeId)]) -> Result<(), TrainError> {
        self.feeds.register(NAME, inputs)
    }

    fn input_nodes(&self) -> Vec<NodeId> {
        self.feeds.nodes()
    }

    fn size(&self) -> Option<usize> {
        None
    }

    fn start(&mut self) -> Result<(), TrainError> {
        Ok(())
    }

    fn next_feeds(&mut self) -> Result<Vec<Feed>, TrainError> {
        let mut out = Vec::new();
        for tower in 0..self.feeds.towers() {
            out.extend(self.feeds.feeds(NAME, tower, self.batch.clone())?);
        }
        Ok(out)
    }

    fn consumed_state(&self) -> Option<FlowState> {
        None
    }

    fn restore(&mut self, _: &FlowState) -> Result<(), TrainError> {
        Ok(())
    }
}
