//! Input sources (tensorpack's `InputSource`): where the batches of a hooked run come from.
//!
//! Towers read their data from `Input` nodes; an input source knows every training tower's
//! input nodes (registered once per tower while the graph is built) and, for each hooked run
//! whose step reads an input, hands out ONE batch PER TOWER — tensorpack's data-parallel
//! semantics: the total batch is the per-tower batch times the number of towers. A hooked run
//! that reads no input (e.g. `NoOpTrainer`'s empty steps) takes nothing; tensorpack's
//! `FeedInput` would consume a datapoint anyway, its `QueueInput` would not — here every source
//! behaves like the latter.
//!
//! Each batch travels with the position of its data flow right after it, so the source knows
//! the CONSUMED position even when a background thread reads ahead: that is what a checkpoint
//! stores and what [`InputSource::restore`] continues from.
//!
//! - [`FeedInput`]: reads the flow on the training thread.
//! - [`QueueInput`]: a background thread fills a bounded queue; reports `QueueInput/queue_size`.
//! - [`DummyConstantInput`]: the same zeros every step, for benchmarking the graph.

mod dummy;
mod feed;
mod queue;

pub use dummy::DummyConstantInput;
pub use feed::FeedInput;
pub use queue::QueueInput;

use crate::backend::Feed;
use crate::data::{Datapoint, FlowState};
use crate::dsl::InputSpec;
use crate::ir::NodeId;

use super::callback::Callback;
use super::error::TrainError;
use super::feed_check::check_feed;

/// A source of batches for the training towers.
pub trait InputSource {
    /// The source kind, for messages.
    fn name(&self) -> &'static str;

    /// Learns the input signature (once, before any tower is built).
    fn setup(&mut self, signature: &[InputSpec]) -> Result<(), TrainError>;

    /// Registers the `Input` nodes of the next training tower, in signature order.
    fn register_tower(&mut self, inputs: &[(String, NodeId)]) -> Result<(), TrainError>;

    /// Every registered input node (a hooked run takes data only if its step reads one).
    fn input_nodes(&self) -> Vec<NodeId>;

    /// Batches per epoch, if known (the default `steps_per_epoch`).
    fn size(&self) -> Option<usize>;

    /// Prepares iteration (`reset_state`, a restored position, threads): before training.
    fn start(&mut self) -> Result<(), TrainError>;

    /// The feeds of one hooked run: one batch for each registered tower, in tower order.
    fn next_feeds(&mut self) -> Result<Vec<Feed>, TrainError>;

    /// Stops background work (after training, also after a failure).
    fn stop(&mut self) {}

    /// The position after the last batch handed out (`None` when the source has no position).
    fn consumed_state(&self) -> Option<FlowState>;

    /// Continues from `state` (a [`consumed_state`](Self::consumed_state) of an identically
    /// built source) when started. Call before [`start`](Self::start).
    fn restore(&mut self, state: &FlowState) -> Result<(), TrainError>;

    /// Callbacks the source needs (registered first, tensorpack's order); e.g. the queue size
    /// statistic.
    fn callbacks(&mut self) -> Vec<Box<dyn Callback>> {
        Vec::new()
    }
}

/// The per-tower input nodes of a source and the conversion of datapoints into feeds.
#[derive(Clone, Debug, Default)]
pub struct TowerFeeds {
    signature: Vec<InputSpec>,
    towers: Vec<Vec<NodeId>>,
}

impl TowerFeeds {
    /// Records the signature.
    pub fn setup(&mut self, signature: &[InputSpec]) {
        self.signature = signature.to_vec();
    }

    /// The signature.
    pub fn signature(&self) -> &[InputSpec] {
        &self.signature
    }

    /// Registers a tower's input nodes (by signature name; every signature input is needed).
    pub fn register(
        &mut self,
        source: &str,
        inputs: &[(String, NodeId)],
    ) -> Result<(), TrainError> {
        let mut nodes = Vec::with_capacity(self.signature.len());
        for spec in &self.signature {
            let node = inputs
                .iter()
                .find(|(n, _)| *n == spec.name)
                .map(|(_, id)| *id)
                .ok_or_else(|| TrainError::Input {
                    source_name: source.to_string(),
                    message: format!(
                        "tower {} has no input node for signature input `{}`",
                        self.towers.len(),
                        spec.name
                    ),
                })?;
            nodes.push(node);
        }
        self.towers.push(nodes);
        Ok(())
    }

    /// Number of registered towers.
    pub fn towers(&self) -> usize {
        self.towers.len()
    }

    /// Every registered node.
    pub fn nodes(&self) -> Vec<NodeId> {
        self.towers.iter().flatten().copied().collect()
    }

    /// Feeds of tower `tower` from `datapoint`: one component per signature input, each of the
    /// input's dtype and shape (never cast: an error names the input, what it takes and what
    /// came), batched inputs with at least one example.
    pub fn feeds(
        &self,
        source: &str,
        tower: usize,
        datapoint: Datapoint,
    ) -> Result<Vec<Feed>, TrainError> {
        let nodes = self.towers.get(tower).ok_or_else(|| TrainError::Input {
            source_name: source.to_string(),
            message: format!("no tower {tower} was registered"),
        })?;
        if datapoint.len() != nodes.len() {
            return Err(TrainError::Input {
                source_name: source.to_string(),
                message: format!(
                    "a datapoint has {} components, the input signature has {} ({})",
                    datapoint.len(),
                    nodes.len(),
                    self.signature
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        let who = format!("the training data ({source})");
        nodes
            .iter()
            .zip(datapoint)
            .zip(&self.signature)
            .map(|((&node, value), spec)| {
                check_feed(&who, &spec.name, &spec.ty(), &value)?;
                Ok((node, value))
            })
            .collect()
    }
}

/// The next datapoint of an endless read of `flow`: passes follow one another (tensorpack's
/// `RepeatedData(ds, -1)`), with the position right after the datapoint. Errors on an empty pass.
pub(crate) fn next_endless(
    source: &str,
    flow: &mut dyn crate::data::DataFlow,
) -> Result<(Datapoint, FlowState), TrainError> {
    for _ in 0..2 {
        if let Some(dp) = flow.next_datapoint()? {
            return Ok((dp, flow.state()));
        }
    }
    Err(TrainError::Input {
        source_name: source.to_string(),
        message: format!("its {} produced an empty pass", flow.name()),
    })
}
