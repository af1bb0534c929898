//! Errors of lowering. Each names the node or variable at fault.

use crate::ir::IrError;

/// Why a step could not be lowered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LowerError {
    #[error(transparent)]
    Ir(#[from] IrError),
    #[error("the lowered program is wrong (a lowering bug): {0}")]
    Verify(#[from] super::verify::VerifyError),
    /// The IR failed its check after a pass (with verify-each).
    #[error("after pass `{pass}`: {source}")]
    AfterPass {
        pass: &'static str,
        source: Box<LowerError>,
    },
    /// The passes of a pipeline do not fit together (a pass got the wrong form of IR).
    #[error("lowering pipeline: {0}")]
    Pipeline(String),
    #[error("variable `{variable}` is assigned more than once in one step")]
    DoubleAssign { variable: String },
    #[error("`{node}` cannot be fetched: {reason}")]
    BadFetch { node: String, reason: String },
    #[error("`{node}` cannot be a step target: only assign and group nodes can")]
    BadTarget { node: String },
    #[error("node `{node}` ({op}): {reason}")]
    Unsupported {
        node: String,
        op: String,
        reason: String,
    },
}
