//! Towers and scopes: [`TowerContext`] (which replica is being built and how), the
//! [`VariableStore`] with variable scopes, name scopes, reuse and get-variable semantics, the
//! collection names, and the enforced rules of a tower function ([`TowerError`]).
//!
//! This stage knows the op graph ([`crate::ir`]) but no tensors or layers: the DSL drives it.

mod collections;
mod context;
mod error;
mod rules;
mod store;

pub use collections::{
    MOVING_SUMMARY, NODE_COLLECTIONS, REGULARIZATION_LOSSES, SUMMARIES, UPDATE_OPS, VarCollection,
};
pub use context::TowerContext;
pub use error::{NameKind, TowerError};
pub use rules::{
    RESERVED_WORD, contains_reserved_word, join as join_scope, strip_scope as strip_scope_prefix,
};
pub use store::{ScopeDepth, VarSpec, VariableStore};
