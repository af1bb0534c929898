//! Errors of graph construction, inference and verification.
//!
//! Every variant names the node or variable at fault by its scoped name.

/// An error in the op graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IrError {
    /// The inputs of a node do not fit its op.
    #[error("node `{node}` ({op}): {message}; input types: [{}]", inputs.join(", "))]
    Type {
        node: String,
        op: String,
        inputs: Vec<String>,
        message: String,
    },
    #[error("node `{name}` already exists")]
    DuplicateNode { name: String },
    #[error("variable `{name}` already exists")]
    DuplicateVariable { name: String },
    #[error("`{name}` is not a valid name: use `/`-separated segments of [A-Za-z0-9_.-]")]
    InvalidName { name: String },
    #[error("node `{node}`: input {slot} refers to a value that does not exist")]
    UnknownValue { node: String, slot: usize },
    #[error("unknown node {0}")]
    UnknownNode(String),
    #[error("unknown variable `{0}`")]
    UnknownVariable(String),
    #[error("variable `{name}` must have a static shape, got {ty}")]
    SymbolicVariable { name: String, ty: String },
    #[error("initial value of variable `{name}` is {got}, but the variable is {ty}")]
    InitializerMismatch {
        name: String,
        ty: String,
        got: String,
    },
    #[error("the graph has a cycle through node `{node}`")]
    Cycle { node: String },
    #[error("cannot replace `{old}` ({old_ty}) with `{new}` ({new_ty}): types differ")]
    ReplaceTypeMismatch {
        old: String,
        new: String,
        old_ty: String,
        new_ty: String,
    },
    /// A structural rule of the IR is broken (found by the verifier).
    #[error("node `{node}`: {message}")]
    Invalid { node: String, message: String },
}
