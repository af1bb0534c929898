//! Variable declarations: a variable's scoped name, static type, initializer and the
//! collections (tensorpack's TRAINABLE / MODEL / LOCAL) it belongs to. The graph keeps a table
//! of them; type inference reads them for `Variable` nodes.

use super::op::Initializer;
use super::shape::TensorType;

/// How a variable is used, in tensorpack's collection terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct VarFlags {
    /// In TRAINABLE_VARIABLES: updated by gradient descent.
    pub trainable: bool,
    /// In MODEL_VARIABLES: needed for inference (e.g. BatchNorm's EMA statistics).
    pub model: bool,
    /// In LOCAL_VARIABLES: per-replica state that checkpoints do not save.
    pub local: bool,
}

/// A variable declaration: full scoped name, static type, initializer and collections.
#[derive(Clone, Debug, PartialEq)]
pub struct VariableDef {
    pub name: String,
    pub ty: TensorType,
    pub init: Initializer,
    pub flags: VarFlags,
}
