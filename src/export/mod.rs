//! Export: a trained model in formats other tools serve. The last stage of the pipeline — it may
//! read any earlier one (the DSL builds the inference tower, `train::checkpoint` supplies the
//! variables) and nothing imports it.
//!
//! [`onnx`] writes a model's inference tower with a checkpoint's variables as an ONNX file
//! (tensorpack's `ModelExporter`, for onnxruntime and the other ONNX runtimes).

pub mod onnx;
