//! `DataError`: every failure of the data stage — file formats (path + byte offset), pipeline
//! configuration, batching shape mismatches, state restore, and prefetch workers.

use crate::tensor::{DType, TensorError};
use std::path::PathBuf;

/// Errors of loaders, flows and augmentations.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file (or directory) could not be read at all.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file was read but its bytes do not have the expected layout. `offset` counts bytes of
    /// the stream the format is defined on: for a gzip file, the decompressed stream (`stream`
    /// says so), otherwise the file itself.
    #[error("{path}: offset {offset}{stream}: {what}")]
    Format {
        path: String,
        offset: u64,
        stream: &'static str,
        what: String,
    },
    /// The gzip container itself is broken (`offset` is in the compressed file).
    #[error(
        "{path}: offset {offset}: bad gzip stream ({detail}) after {decompressed} decompressed bytes"
    )]
    Gzip {
        path: String,
        offset: u64,
        decompressed: u64,
        detail: String,
    },
    /// An image file and its label file disagree on the number of examples.
    #[error("{images} holds {image_count} images but {labels} holds {label_count} labels")]
    CountMismatch {
        images: String,
        image_count: usize,
        labels: String,
        label_count: usize,
    },
    /// A source flow was iterated before `reset_state()`.
    #[error("{flow}: next_datapoint() called before reset_state()")]
    NotReset { flow: &'static str },
    /// A flow was built with arguments it cannot honour.
    #[error("{flow}: {what}")]
    Config { flow: &'static str, what: String },
    /// A datapoint does not have the component a combinator was told to use.
    #[error("{flow}: component index {index} out of range for a datapoint of {count} components")]
    ComponentIndex {
        flow: &'static str,
        index: usize,
        count: usize,
    },
    /// Datapoints of one batch have different numbers of components.
    #[error(
        "BatchData: datapoint {position} of the batch has {got} components, datapoint 0 has {expected}"
    )]
    ComponentCount {
        position: usize,
        expected: usize,
        got: usize,
    },
    /// One component has different shapes or dtypes across the datapoints of a batch.
    #[error(
        "BatchData: component {component} of datapoint {position} of the batch is {got_dtype}{got:?}, datapoint 0 has {expected_dtype}{expected:?}"
    )]
    BatchShape {
        component: usize,
        position: usize,
        expected: Vec<usize>,
        expected_dtype: DType,
        got: Vec<usize>,
        got_dtype: DType,
    },
    /// A flow that must loop over its input (RepeatedData forever, FixedSizeData) found an
    /// entire pass of the input empty, which would loop forever.
    #[error("{flow}: an entire pass of the input flow produced no datapoint")]
    EmptyPass { flow: &'static str },
    /// A user function or augmentation failed on one datapoint.
    #[error("{flow}: datapoint {index} of pass {pass}: {source}")]
    Datapoint {
        flow: &'static str,
        pass: u64,
        index: u64,
        #[source]
        source: Box<DataError>,
    },
    /// An image augmentation cannot handle this image.
    #[error("{augmentor}: {what}")]
    Augment {
        augmentor: &'static str,
        what: String,
    },
    /// A saved position does not fit this flow.
    #[error("cannot restore {flow}: {what}")]
    BadState { flow: &'static str, what: String },
    /// A saved position could not be (de)serialized.
    #[error("flow state JSON: {0}")]
    StateJson(#[from] serde_json::Error),
    /// `fork()` is not supported by this flow (PrefetchData with several workers needs it).
    #[error("{flow} cannot be forked (PrefetchData with several workers needs independent copies)")]
    NotForkable { flow: &'static str },
    /// A prefetch worker died without reporting an error.
    #[error("PrefetchData worker {worker} panicked: {message}")]
    WorkerPanicked { worker: usize, message: String },
    /// A host-tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// A free-form error raised by user code inside a map function.
    #[error("{0}")]
    Custom(String),
}

impl DataError {
    /// A free-form error for user map functions.
    pub fn msg(message: impl Into<String>) -> DataError {
        DataError::Custom(message.into())
    }
}
