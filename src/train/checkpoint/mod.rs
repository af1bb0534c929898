//! Checkpoints: `model-<global_step>.safetensors` files (named tensors of any dtype plus a
//! string→string metadata map for resume state) and TensorFlow's `checkpoint` index in a
//! directory, written crash-safely; the retention policy of `ModelSaver`; and matching a
//! checkpoint to graph variables for restore (exact or relaxed). npz is not supported.

/// Crash-safe file replacement (shared with the CUDA backend's kernel cache).
pub use crate::atomic_file as atomic;
pub mod format;
pub mod index;
pub mod restore;
pub mod retention;
pub mod store;

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::tensor::HostTensor;

pub use atomic::{sync_dir, write_atomically};
pub use index::{CheckpointIndex, INDEX_FILE_NAME, IndexEntry};
pub use restore::{
    Adjustment, RestoreError, RestoreMode, RestoreOptions, RestorePlan, RestoreReport,
    VariableSpec, is_training_only_name, match_for_restore,
};
pub use retention::{RetentionDecision, RetentionPolicy, RetentionState};
pub use store::{
    CheckpointManager, SavedCheckpoint, checkpoint_file_name, delete_checkpoint, latest_checkpoint,
    list_checkpoints, load_checkpoint, resolve_checkpoint_path, save_checkpoint, step_of_file_name,
};

/// A loaded checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The file it was read from.
    pub path: PathBuf,
    /// Tensor name → value.
    pub tensors: BTreeMap<String, HostTensor>,
    /// The safetensors `__metadata__` map (resume state as JSON strings, by convention).
    pub metadata: BTreeMap<String, String>,
}

impl Checkpoint {
    /// The global step in the file name (`model-123.safetensors` → 123), if it follows it.
    pub fn global_step(&self) -> Option<u64> {
        self.path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(step_of_file_name)
    }
}

/// Errors of checkpoint files and directories. Each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no such checkpoint file, prefix or directory")]
    NotFound { path: PathBuf },
    #[error("{dir}: no checkpoint in this directory")]
    NoCheckpoint { dir: PathBuf },
    #[error("{path}: truncated checkpoint: the file has {len} bytes, its header needs {needed}")]
    Truncated {
        path: PathBuf,
        needed: u64,
        len: u64,
    },
    #[error("{path}: not a safetensors file: {detail}")]
    NotSafetensors { path: PathBuf, detail: String },
    #[error("{path}: corrupt checkpoint: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("{path}: tensor `{tensor}` has dtype {dtype}, which towerpack tensors do not have")]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("cannot save tensor `{name}`: {reason}")]
    InvalidTensorName { name: String, reason: String },
    #[error("cannot encode checkpoint: {detail}")]
    Encode { detail: String },
    #[error("{path}:{line}: {detail}")]
    Index {
        path: PathBuf,
        line: usize,
        detail: String,
    },
    #[error("{index} names `{file}` as the latest checkpoint, but that file does not exist")]
    IndexNamesMissingFile { index: PathBuf, file: String },
}
