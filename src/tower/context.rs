//! `TowerContext`: which replica of the model is being built, in which scopes, and in which mode.
//!
//! Semantics follow tensorpack's `TrainTowerContext` / `PredictTowerContext`, including
//! `has_own_variables` and which collections a tower discards.

use super::collections::{MOVING_SUMMARY, SUMMARIES, UPDATE_OPS};
use super::error::TowerError;

/// The context a tower function runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TowerContext {
    ns_name: String,
    vs_name: String,
    is_training: bool,
    index: usize,
    total: usize,
    under_reuse: bool,
}

impl TowerContext {
    /// A training tower (tensorpack's `TrainTowerContext(ns, vs_name, index, total)`).
    pub fn training(ns_name: &str, vs_name: &str, index: usize, total: usize) -> TowerContext {
        TowerContext {
            ns_name: ns_name.to_string(),
            vs_name: vs_name.to_string(),
            is_training: true,
            index,
            total,
            under_reuse: false,
        }
    }

    /// An inference tower (tensorpack's `PredictTowerContext(ns, vs_name)`).
    pub fn inference(ns_name: &str, vs_name: &str) -> TowerContext {
        TowerContext {
            ns_name: ns_name.to_string(),
            vs_name: vs_name.to_string(),
            is_training: false,
            index: 0,
            total: 1,
            under_reuse: false,
        }
    }

    /// The same context entered under `variable_scope(reuse=True)` when `reuse` is true.
    pub fn with_reuse(mut self, reuse: bool) -> TowerContext {
        self.under_reuse = reuse;
        self
    }

    /// The name scope of the tower (`tower0`, `InferenceTower`, or empty).
    pub fn ns_name(&self) -> &str {
        &self.ns_name
    }

    /// The variable scope of the tower (empty, or `tower{i}` for replicated towers).
    pub fn vs_name(&self) -> &str {
        &self.vs_name
    }

    /// True for training towers.
    pub fn is_training(&self) -> bool {
        self.is_training
    }

    /// Index of the tower among the training towers (0 for inference towers).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Number of training towers.
    pub fn total(&self) -> usize {
        self.total
    }

    /// True when the tower was entered under reuse.
    pub fn is_under_reuse(&self) -> bool {
        self.under_reuse
    }

    /// The tower that emits summaries, moving summaries and BatchNorm EMA updates.
    pub fn is_main_training_tower(&self) -> bool {
        self.is_training && self.index == 0
    }

    /// Whether variables created here belong to this tower (tensorpack's rule): a training
    /// tower not under reuse that is the first tower or has its own variable scope; an
    /// inference tower not under reuse.
    pub fn has_own_variables(&self) -> bool {
        if self.is_training {
            !self.under_reuse && (self.index == 0 || !self.vs_name.is_empty())
        } else {
            !self.under_reuse
        }
    }

    /// True for replicated towers `i > 0`: their variables are per-replica copies (LOCAL).
    pub fn creates_local_variables(&self) -> bool {
        self.is_training && self.index > 0 && !self.vs_name.is_empty()
    }

    /// True when entries added to `collection` inside this tower are discarded: summaries and
    /// moving summaries outside the main training tower, and update ops of inference towers.
    pub fn discards(&self, collection: &str) -> bool {
        let summaries = collection == SUMMARIES || collection == MOVING_SUMMARY;
        if !self.is_training {
            summaries || collection == UPDATE_OPS
        } else {
            summaries && self.index > 0
        }
    }

    /// The logical device of nodes built here: the tower index for training towers.
    pub fn device(&self) -> Option<u16> {
        if self.is_training {
            u16::try_from(self.index).ok()
        } else {
            None
        }
    }

    /// A name for messages: the name scope, or `<root>` for the unnamed tower.
    pub fn display_name(&self) -> String {
        if self.ns_name.is_empty() {
            "<root>".to_string()
        } else {
            self.ns_name.clone()
        }
    }

    /// Checks the context's own consistency (before it is entered).
    pub fn validate(&self) -> Result<(), TowerError> {
        if !self.vs_name.is_empty() && self.ns_name.is_empty() {
            return Err(TowerError::VariableScopeWithoutNameScope {
                vs_name: self.vs_name.clone(),
            });
        }
        if self.is_training && self.under_reuse && !self.vs_name.is_empty() {
            return Err(TowerError::VariableScopeUnderReuse {
                tower: self.display_name(),
                vs_name: self.vs_name.clone(),
            });
        }
        if self.index >= self.total {
            return Err(TowerError::TowerIndex {
                tower: self.display_name(),
                index: self.index,
                total: self.total,
            });
        }
        Ok(())
    }
}
