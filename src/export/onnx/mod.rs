//! ONNX export (tensorpack's `ModelExporter`, for the serving stacks that read ONNX:
//! onnxruntime, TensorRT, OpenVINO, browsers).
//!
//! [`OnnxExport`] builds the model's **inference tower** — the same tower function, built with
//! `is_training = false` and no name scope, exactly as [`crate::train::OfflinePredictor`] builds
//! it, so BatchNorm normalizes with its moving averages and dropout is the identity — and writes
//! the part of it that computes the requested outputs as an ONNX model:
//!
//! * **opset 17** ([`OPSET`]) of the default domain, IR version 8 ([`IR_VERSION`]);
//! * one initializer per variable read, under tensorpack's variable name (`conv0/W`,
//!   `conv0/bn/mean/EMA`, ...) holding the checkpoint's value unchanged (filters stay HWIO; a
//!   `Transpose` node makes ONNX's OIHW, which runtimes fold when they load the model);
//! * graph inputs named and shaped as the tower's signature (NHWC images, `N` as the symbolic
//!   batch dimension `"N"`), outputs named as the tower's tensors (`linear/output`);
//! * NCHW only where ONNX requires it (Conv, ConvTranspose, pooling): values stay NCHW through
//!   batch norm, activations, residual adds and padding, so a convnet is transposed once where
//!   images enter and once before its flattening `Reshape` ([`layout`]'s doc);
//! * BatchNorm in its inference form, as the tower computes it: `(x − mean/EMA) ·
//!   rsqrt(variance/EMA + ε) · gamma + beta`, elementwise (runtimes fold the constant parts).
//!
//! The IR graph is the input, not a lowered `Program` (those fuse kernels and fix the batch).
//! Every op of the path must map (table in [`ops`]); one that does not is an
//! [`OnnxError::Unsupported`] naming the scoped node, the op and its input types, and nothing is
//! written.
//!
//! ```no_run
//! use std::sync::Arc;
//! use towerpack::export::onnx::OnnxExport;
//! use towerpack::models::CifarResNet;
//! use towerpack::optim::Optimizer;
//! use towerpack::train::ModelFn;
//!
//! let net = CifarResNet::new(3);
//! let model = ModelFn::new(net.inputs(), move |x| net.build(x), Optimizer::momentum(0.1, 0.9));
//! let report = OnnxExport::new(Arc::new(model), &["linear/output"])
//!     .input_names(&["input"])
//!     .write("train_log/resnet".as_ref(), "resnet.onnx".as_ref())?;
//! println!("{report}");
//! # Ok::<(), towerpack::export::onnx::OnnxError>(())
//! ```

mod emit;
mod error;
pub mod layout;
pub mod ops;
pub mod proto;
mod walk;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost::Message;

pub use error::OnnxError;
pub use proto::pb;

use crate::dsl::{Builder, InputSpec, Tensor, TowerHandle};
use crate::ir::{Graph, NodeId, Op, Value};
use crate::tensor::HostTensor;
use crate::tower::TowerContext;
use crate::train::ModelDesc;
use crate::train::checkpoint::{is_training_only_name, load_checkpoint};

/// Step-wide training state of the optimizers, never part of a model (a second optimizer's
/// copy gets a `_1`, `_2`, … suffix: a GAN's `beta1_power_1`).
const TRAINING_STATE: [&str; 4] = ["global_step", "learning_rate", "beta1_power", "beta2_power"];

/// True for a checkpoint tensor that holds training state rather than a model variable.
fn is_training_state(name: &str) -> bool {
    let base = match name.rsplit_once('_') {
        Some((base, k)) if !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => name,
    };
    is_training_only_name(name) || TRAINING_STATE.contains(&name) || TRAINING_STATE.contains(&base)
}

/// The ONNX operator set the exporter targets (default domain).
pub const OPSET: i64 = 17;

/// The ONNX IR version of exported files (IR 8 is the one introduced with opset 17).
pub const IR_VERSION: i64 = 8;

/// A tower function: the model on its input tensors.
type TowerFn = Box<dyn Fn(&[Tensor]) -> Tensor>;

/// What to export: a tower function with its input signature, the inputs to keep and the
/// outputs to compute.
pub struct OnnxExport {
    signature: Vec<InputSpec>,
    tower: TowerFn,
    input_names: Option<Vec<String>>,
    output_names: Vec<String>,
    name: String,
    all_variables: bool,
}

/// An inference tower's graph with the `Input` nodes and output values to export.
struct InferenceTower {
    graph: Graph,
    inputs: Vec<NodeId>,
    outputs: Vec<Value>,
}

/// The exported graph, before it is encoded.
#[derive(Clone, Debug)]
pub struct Exported {
    /// The ONNX model.
    pub model: pb::ModelProto,
    /// Graph input names, in signature order.
    pub inputs: Vec<String>,
    /// Graph output names, in the requested order.
    pub outputs: Vec<String>,
    /// The variables the graph reads (its initializers named after them).
    pub variables: Vec<String>,
}

/// What [`OnnxExport::write`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportReport {
    /// The `.onnx` file.
    pub path: PathBuf,
    /// The checkpoint file the variables came from.
    pub checkpoint: PathBuf,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// Checkpoint tensors that are neither exported nor training state (optimizer slots and
    /// step-wide state such as `beta1_power`, `global_step`, `learning_rate`, summaries' moving
    /// averages), sorted.
    pub left_out: Vec<String>,
    /// ONNX nodes and initializers.
    pub nodes: usize,
    pub initializers: usize,
    /// Size of the file.
    pub bytes: usize,
}

impl fmt::Display for ExportReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "wrote {} (ONNX opset {OPSET}, {} nodes, {} initializers, {} bytes) from {}: \
             inputs {} → outputs {}",
            self.path.display(),
            self.nodes,
            self.initializers,
            self.bytes,
            self.checkpoint.display(),
            self.inputs.join(", "),
            self.outputs.join(", ")
        )?;
        if !self.left_out.is_empty() {
            write!(
                f,
                "; {} checkpoint variables not read by the export: {}",
                self.left_out.len(),
                abbreviated(&self.left_out)
            )?;
        }
        Ok(())
    }
}

/// The first few of `names`, then how many more.
fn abbreviated(names: &[String]) -> String {
    const SHOWN: usize = 4;
    let mut text = names
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(", … ({} more)", names.len() - SHOWN));
    }
    text
}

impl OnnxExport {
    /// Exports `output_names` (tensor names of the tower, e.g. `linear/output`) of `model`'s
    /// inference tower.
    pub fn new(model: Arc<dyn ModelDesc>, output_names: &[&str]) -> OnnxExport {
        let signature = model.inputs();
        OnnxExport::from_tower(signature, move |x| model.build_graph(x), output_names)
    }

    /// Exports a bare tower function on `signature` (e.g. the GAN's generator on `z`). With no
    /// `output_names`, the output is what the function returns.
    pub fn from_tower(
        signature: Vec<InputSpec>,
        tower: impl Fn(&[Tensor]) -> Tensor + 'static,
        output_names: &[&str],
    ) -> OnnxExport {
        OnnxExport {
            signature,
            tower: Box::new(tower),
            input_names: None,
            output_names: output_names.iter().map(|s| s.to_string()).collect(),
            name: "towerpack".to_string(),
            all_variables: false,
        }
    }

    /// Keeps only these inputs (default: the signature inputs the outputs depend on).
    pub fn input_names(mut self, names: &[&str]) -> OnnxExport {
        self.input_names = Some(names.iter().map(|s| s.to_string()).collect());
        self
    }

    /// Makes [`OnnxExport::write`] refuse a checkpoint holding model variables the export does
    /// not read (a checkpoint of another model or configuration, e.g. another depth). Off by
    /// default: exporting part of a model (the GAN's generator) leaves variables out on purpose.
    pub fn require_all_variables(mut self) -> OnnxExport {
        self.all_variables = true;
        self
    }

    /// The ONNX graph's name (default `towerpack`).
    pub fn graph_name(mut self, name: &str) -> OnnxExport {
        self.name = name.to_string();
        self
    }

    /// The inference tower with the input nodes and output values to export.
    fn tower(&self) -> Result<InferenceTower, OnnxError> {
        let builder = Builder::with_seed(0);
        let tower: TowerHandle =
            builder.build_tower(TowerContext::inference("", ""), &self.signature, |x| {
                (self.tower)(x)
            })?;
        let graph = builder.finish()?;
        let outputs = if self.output_names.is_empty() {
            vec![tower.output]
        } else {
            self.output_names
                .iter()
                .map(|n| {
                    tower
                        .get_tensor(&graph, n)
                        .ok_or_else(|| OnnxError::UnknownTensor {
                            name: n.clone(),
                            what: "a tensor",
                        })
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        let inputs = match &self.input_names {
            Some(names) => names
                .iter()
                .map(|n| {
                    tower
                        .input(n)
                        .or_else(|| graph.find(n))
                        .filter(|&id| matches!(graph.node(id).op, Op::Input { .. }))
                        .ok_or_else(|| OnnxError::UnknownTensor {
                            name: n.clone(),
                            what: "an input",
                        })
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => {
                // The signature inputs the outputs need, in signature order.
                let mut needed = std::collections::HashSet::new();
                let mut stack: Vec<NodeId> = outputs.iter().map(|v| v.node).collect();
                while let Some(id) = stack.pop() {
                    if needed.insert(id) {
                        stack.extend(graph.inputs(id).iter().map(|v| v.node));
                    }
                }
                tower
                    .inputs
                    .iter()
                    .map(|(_, id)| *id)
                    .filter(|id| needed.contains(id))
                    .collect()
            }
        };
        Ok(InferenceTower {
            graph,
            inputs,
            outputs,
        })
    }

    /// The ONNX model with variables from `variables` (variable name → value, e.g. a
    /// checkpoint's tensors).
    pub fn export(&self, variables: &BTreeMap<String, HostTensor>) -> Result<Exported, OnnxError> {
        let t = self.tower()?;
        let graph_proto =
            walk::export_graph(&t.graph, &t.inputs, &t.outputs, variables, &self.name)?;
        let names = |v: &[pb::ValueInfoProto]| -> Vec<String> {
            v.iter().filter_map(|i| i.name.clone()).collect()
        };
        let (input_names, output_names) = (names(&graph_proto.input), names(&graph_proto.output));
        let initializers: std::collections::HashSet<&str> = graph_proto
            .initializer
            .iter()
            .filter_map(|t| t.name.as_deref())
            .collect();
        let exported_variables = t
            .graph
            .variables()
            .iter()
            .filter(|d| initializers.contains(d.name.as_str()))
            .map(|d| d.name.clone())
            .collect();
        let model = pb::ModelProto {
            ir_version: Some(IR_VERSION),
            opset_import: vec![pb::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(OPSET),
            }],
            producer_name: Some("towerpack".to_string()),
            producer_version: Some(env!("CARGO_PKG_VERSION").to_string()),
            doc_string: Some(
                "The inference tower of a towerpack model (NHWC inputs, batch dimension N)."
                    .to_string(),
            ),
            graph: Some(graph_proto),
            ..Default::default()
        };
        Ok(Exported {
            model,
            inputs: input_names,
            outputs: output_names,
            variables: exported_variables,
        })
    }

    /// Exports with the variables of `checkpoint` (a checkpoint file, or a directory whose
    /// latest checkpoint is used) and writes the `.onnx` file `out` atomically.
    pub fn write(&self, checkpoint: &Path, out: &Path) -> Result<ExportReport, OnnxError> {
        let ckpt = load_checkpoint(checkpoint)?;
        let mut exported = self.export(&ckpt.tensors)?;
        let left_out: Vec<String> = ckpt
            .tensors
            .keys()
            .filter(|n| !exported.variables.contains(n))
            .filter(|n| !is_training_state(n))
            .cloned()
            .collect();
        if self.all_variables && !left_out.is_empty() {
            return Err(OnnxError::UnreadVariables {
                checkpoint: ckpt.path,
                count: left_out.len(),
                names: abbreviated(&left_out),
            });
        }
        let mut meta = vec![(
            "towerpack.checkpoint",
            ckpt.path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        )];
        if let Some(step) = ckpt.global_step() {
            meta.push(("towerpack.global_step", step.to_string()));
        }
        exported.model.metadata_props = meta
            .into_iter()
            .map(|(k, v)| pb::StringStringEntryProto {
                key: Some(k.to_string()),
                value: Some(v),
            })
            .collect();
        let bytes = exported.model.encode_to_vec();
        crate::atomic_file::write_atomically(out, &bytes).map_err(|source| OnnxError::Io {
            path: out.to_path_buf(),
            source,
        })?;
        let graph = exported.model.graph.as_ref();
        Ok(ExportReport {
            path: out.to_path_buf(),
            checkpoint: ckpt.path,
            inputs: exported.inputs,
            outputs: exported.outputs,
            left_out,
            nodes: graph.map_or(0, |g| g.node.len()),
            initializers: graph.map_or(0, |g| g.initializer.len()),
            bytes: bytes.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::is_training_state;

    #[test]
    fn training_state_is_told_from_model_variables() {
        for name in [
            "global_step",
            "learning_rate",
            "beta1_power",
            "beta2_power_1",
            "conv0/W/Momentum",
            "EMA/train_error",
        ] {
            assert!(is_training_state(name), "{name}");
        }
        for name in [
            "conv0/W",
            "conv0/bn/mean/EMA",
            "linear/b",
            "beta1_power_x",
            "res1_2/W",
        ] {
            assert!(!is_training_state(name), "{name}");
        }
    }
}
