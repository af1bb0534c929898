//! `FeedInput`: reads a data flow on the training thread, one batch per tower per hooked run,
//! endlessly (pass after pass).

use crate::backend::Feed;
use crate::data::{DataFlow, FlowState};
use crate::dsl::InputSpec;
use crate::ir::NodeId;
use crate::train::error::TrainError;

use super::{InputSource, TowerFeeds, next_endless};

const NAME: &str = "FeedInput";

/// Feeds datapoints of a flow into the towers' inputs (tensorpack's `FeedInput(ds)`).
pub struct FeedInput {
    flow: Box<dyn DataFlow>,
    feeds: TowerFeeds,
    consumed: Option<FlowState>,
    pending_restore: Option<FlowState>,
    started: bool,
}

impl FeedInput {
    /// Feeds `flow`.
    pub fn new(flow: impl DataFlow + 'static) -> FeedInput {
        FeedInput::from_boxed(Box::new(flow))
    }

    /// Feeds an already boxed flow.
    pub fn from_boxed(flow: Box<dyn DataFlow>) -> FeedInput {
        FeedInput {
            flow,
            feeds: TowerFeeds::default(),
            consumed: None,
            pending_restore: None,
            started: false,
        }
    }
}

impl InputSource for FeedInput {
    fn name(&self) -> &'static str {
        NAME
    }

    fn setup(&mut self, signature: &[InputSpec]) -> Result<(), TrainError> {
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
        self.flow.len()
    }

    fn start(&mut self) -> Result<(), TrainError> {
        if self.started {
            return Ok(());
        }
        self.flow.reset_state()?;
        if let Some(state) = self.pending_restore.take() {
            self.flow.restore(&state)?;
        }
        self.consumed = Some(self.flow.state());
        self.started = true;
        Ok(())
    }

    fn next_feeds(&mut self) -> Result<Vec<Feed>, TrainError> {
        if !self.started {
            return Err(TrainError::Input {
                source_name: NAME.into(),
                message: "used before start()".into(),
            });
        }
        let mut out = Vec::new();
        for tower in 0..self.feeds.towers() {
            let (dp, state) = next_endless(NAME, &mut *self.flow)?;
            out.extend(self.feeds.feeds(NAME, tower, dp)?);
            self.consumed = Some(state);
        }
        Ok(out)
    }

    fn consumed_state(&self) -> Option<FlowState> {
        self.consumed.clone()
    }

    fn restore(&mut self, state: &FlowState) -> Result<(), TrainError> {
        if self.started {
            self.flow.restore(state)?;
            self.consumed = Some(state.clone());
        } else {
            self.pending_restore = Some(state.clone());
        }
        Ok(())
    }
}
