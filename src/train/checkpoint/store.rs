//! Checkpoint directories: saving `model-<global_step>.safetensors` atomically and updating the
//! `checkpoint` index, finding the latest, listing, loading (by file, prefix or directory) and
//! deleting. [`CheckpointManager`] adds the retention policy on top.
//!
//! Crash safety: the model file is renamed into place before the index names it, and old files
//! are deleted only after the index stops naming them, so the index never names a partial or
//! missing file because of a crash.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::atomic::write_atomically;
use super::format::{decode, encode};
use super::index::{CheckpointIndex, INDEX_FILE_NAME};
use super::retention::{RetentionPolicy, RetentionState};
use super::{Checkpoint, CheckpointError};
use crate::tensor::HostTensor;

const PREFIX: &str = "model-";
const EXTENSION: &str = ".safetensors";

/// The file name of the checkpoint of `global_step`: `model-<global_step>.safetensors`.
pub fn checkpoint_file_name(global_step: u64) -> String {
    format!("{PREFIX}{global_step}{EXTENSION}")
}

/// The global step of a checkpoint file name (`model-123.safetensors` → 123).
pub fn step_of_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(EXTENSION)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Every `model-<step>.safetensors` in `dir`, sorted by step. A missing dir has none. Temp files
/// of unfinished writes are hidden names and never listed.
pub fn list_checkpoints(dir: &Path) -> Result<Vec<(PathBuf, u64)>, CheckpointError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(dir)(e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_error(dir))?;
        if let Some(step) = entry.file_name().to_str().and_then(step_of_file_name) {
            found.push((entry.path(), step));
        }
    }
    found.sort_by_key(|(_, step)| *step);
    Ok(found)
}

/// The latest checkpoint of `dir`: the one the `checkpoint` index names, or, without an index
/// (or one naming none), the highest-step file. `None` when there is none. An index naming a
/// file that does not exist is an error, not a silent fallback.
pub fn latest_checkpoint(dir: &Path) -> Result<Option<PathBuf>, CheckpointError> {
    if let Some(latest) = CheckpointIndex::read(dir)?.and_then(|i| i.latest) {
        let path = dir.join(&latest);
        if path.is_file() {
            return Ok(Some(path));
        }
        return Err(CheckpointError::IndexNamesMissingFile {
            index: dir.join(INDEX_FILE_NAME),
            file: latest,
        });
    }
    Ok(list_checkpoints(dir)?.pop().map(|(path, _)| path))
}

/// Resolves what a user may pass as a checkpoint: a file, a `model-123` prefix, a directory or
/// its `checkpoint` index file (both resolved to the latest checkpoint).
pub fn resolve_checkpoint_path(path: &Path) -> Result<PathBuf, CheckpointError> {
    let from_dir = |dir: &Path| {
        latest_checkpoint(dir)?.ok_or_else(|| CheckpointError::NoCheckpoint {
            dir: dir.to_path_buf(),
        })
    };
    if path.is_dir() {
        return from_dir(path);
    }
    if path.is_file() {
        if path.file_name().is_some_and(|n| n == INDEX_FILE_NAME) {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            return from_dir(dir);
        }
        return Ok(path.to_path_buf());
    }
    let mut with_ext = path.as_os_str().to_owned();
    with_ext.push(EXTENSION);
    let with_ext = PathBuf::from(with_ext);
    if with_ext.is_file() {
        return Ok(with_ext);
    }
    Err(CheckpointError::NotFound {
        path: path.to_path_buf(),
    })
}

/// Loads a checkpoint (any form [`resolve_checkpoint_path`] accepts).
pub fn load_checkpoint(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let file = resolve_checkpoint_path(path)?;
    let bytes = std::fs::read(&file).map_err(io_error(&file))?;
    decode(&file, &bytes)
}

/// Saves `tensors` and `metadata` as `<dir>/model-<global_step>.safetensors` (atomically) and
/// makes it the latest in the index; deletes nothing. Returns the file's path.
pub fn save_checkpoint(
    dir: &Path,
    global_step: u64,
    tensors: &[(String, HostTensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<PathBuf, CheckpointError> {
    let mut manager = CheckpointManager::open(dir, RetentionPolicy::keep_all(), now_secs())?;
    Ok(manager
        .save(global_step, tensors, metadata, now_secs())?
        .path)
}

/// Deletes a checkpoint file (any form [`resolve_checkpoint_path`] accepts) and removes it from
/// the index; if it was the latest, the newest remaining indexed one becomes the latest.
pub fn delete_checkpoint(path: &Path) -> Result<(), CheckpointError> {
    let file = resolve_checkpoint_path(path)?;
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(mut index) = CheckpointIndex::read(&dir)? {
        index.entries.retain(|e| e.file != name);
        if index.latest.as_deref() == Some(name.as_str()) {
            index.latest = index.entries.last().map(|e| e.file.clone());
        }
        index.write(&dir)?;
    }
    std::fs::remove_file(&file).map_err(io_error(&file))
}

/// The result of [`CheckpointManager::save`].
#[derive(Debug)]
pub struct SavedCheckpoint {
    /// The new checkpoint file.
    pub path: PathBuf,
    /// Old checkpoints deleted by the retention policy.
    pub deleted: Vec<PathBuf>,
    /// Old checkpoints kept for good by the hourly rule.
    pub preserved: Vec<PathBuf>,
    /// Deletions that failed (the save itself succeeded); `ModelSaver` logs and continues.
    pub failed_deletes: Vec<(PathBuf, std::io::Error)>,
}

/// A checkpoint directory with a retention policy: what `ModelSaver` drives.
#[derive(Debug)]
pub struct CheckpointManager {
    dir: PathBuf,
    policy: RetentionPolicy,
    state: RetentionState,
}

impl CheckpointManager {
    /// Opens `dir` (created if needed), continuing the retention state of an existing index.
    /// `now` is the run's start time, which the hourly rule counts from in a new directory.
    pub fn open(
        dir: &Path,
        policy: RetentionPolicy,
        now: f64,
    ) -> Result<CheckpointManager, CheckpointError> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let state = match CheckpointIndex::read(dir)? {
            Some(index) => RetentionState {
                managed: index.entries,
                last_preserved_timestamp: index.last_preserved_timestamp.unwrap_or(now),
            },
            None => RetentionState::new(now),
        };
        Ok(CheckpointManager {
            dir: dir.to_path_buf(),
            policy,
            state,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Saves the checkpoint of `global_step` at time `now`, makes it the latest, then applies
    /// the retention policy.
    pub fn save(
        &mut self,
        global_step: u64,
        tensors: &[(String, HostTensor)],
        metadata: &BTreeMap<String, String>,
        now: f64,
    ) -> Result<SavedCheckpoint, CheckpointError> {
        let name = checkpoint_file_name(global_step);
        let path = self.dir.join(&name);
        let bytes = encode(tensors, metadata)?;
        write_atomically(&path, &bytes).map_err(io_error(&path))?;
        let mut state = self.state.clone();
        let decision = state.record_save(&self.policy, &name, now);
        CheckpointIndex {
            latest: Some(name),
            entries: state.managed.clone(),
            last_preserved_timestamp: Some(state.last_preserved_timestamp),
        }
        .write(&self.dir)?;
        self.state = state;
        let mut saved = SavedCheckpoint {
            path,
            deleted: Vec::new(),
            preserved: decision
                .preserved
                .iter()
                .map(|f| self.dir.join(f))
                .collect(),
            failed_deletes: Vec::new(),
        };
        for file in decision.delete {
            let old = self.dir.join(file);
            match std::fs::remove_file(&old) {
                Ok(()) => saved.deleted.push(old),
                // Already gone (e.g. removed by hand) is what we wanted.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => saved.deleted.push(old),
                Err(e) => saved.failed_deletes.push((old, e)),
            }
        }
        Ok(saved)
    }
}
