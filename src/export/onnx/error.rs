//! [`OnnxError`]: everything that can stop an export, each naming what is at fault — the scoped
//! node, its op and its input types for a graph that cannot be expressed in ONNX; the variable
//! and both types for a checkpoint that does not fit; the file for I/O.

use std::path::PathBuf;

use crate::dsl::DslError;
use crate::ir::{Graph, NodeId};
use crate::train::checkpoint::CheckpointError;

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// A node on the path from the inputs to the outputs has no faithful ONNX form.
    #[error(
        "node `{node}` ({op}, inputs {inputs}) has no ONNX mapping: {reason}; nothing was written"
    )]
    Unsupported {
        /// The node's scoped name.
        node: String,
        /// The op's kind name as printed in the textual IR (`random_uniform`, ...).
        op: String,
        /// The node's input types, e.g. `[f32[N,28,28,1], i64[]]`.
        inputs: String,
        /// Why it cannot be mapped.
        reason: String,
    },
    /// The tower function could not be built.
    #[error("building the inference tower: {0}")]
    Tower(#[from] DslError),
    /// An input or output name is not a tensor of the tower.
    #[error("`{name}` is not {what} of the inference tower")]
    UnknownTensor { name: String, what: &'static str },
    /// An output needs a tower input that the caller did not list.
    #[error("output `{output}` depends on input `{input}`, which is not among the exported inputs")]
    MissingInput { output: String, input: String },
    /// An output is a graph source (an input, a constant or a variable), not a computed value.
    #[error("output `{0}` is an input, constant or variable of the tower, not a computed value")]
    SourceOutput(String),
    /// No outputs were asked for.
    #[error("an export needs at least one output")]
    NoOutputs,
    /// A variable the outputs read has no value.
    #[error("variable `{0}` is read by the exported outputs but has no value in the checkpoint")]
    MissingVariable(String),
    /// A variable's value has another type than the variable.
    #[error("variable `{name}` is declared {declared}, but its value is {value}")]
    VariableMismatch {
        name: String,
        declared: String,
        value: String,
    },
    /// With [`super::OnnxExport::require_all_variables`]: the checkpoint holds model variables
    /// the export does not read.
    #[error(
        "{checkpoint}: {count} variables of the checkpoint are not read by the exported tower \
         ({names}); is it a checkpoint of another model or configuration?"
    )]
    UnreadVariables {
        checkpoint: PathBuf,
        count: usize,
        names: String,
    },
    /// Two different tensors would get the same ONNX name.
    #[error("the ONNX name `{0}` would stand for two different tensors")]
    NameClash(String),
    /// A bug of the exporter (a value used before it was exported, ...).
    #[error("internal error of the ONNX exporter: {0}")]
    Internal(String),
    /// The graph has a cycle (cannot happen for a graph built by the DSL).
    #[error("the tower graph is not a DAG: {0}")]
    Graph(#[from] crate::ir::IrError),
    /// The checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The `.onnx` file could not be written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The error for node `id` that cannot be exported, with its op and input types.
pub(super) fn unsupported(graph: &Graph, id: NodeId, reason: impl Into<String>) -> OnnxError {
    let node = graph.node(id);
    let inputs: Vec<String> = graph
        .inputs(id)
        .iter()
        .map(|&v| {
            graph
                .try_value_type(v)
                .map_or_else(|| "?".to_string(), |t| t.to_string())
        })
        .collect();
    OnnxError::Unsupported {
        node: node.name.clone(),
        op: node.op.kind_name().to_string(),
        inputs: format!("[{}]", inputs.join(", ")),
        reason: reason.into(),
    }
}
