//! The `checkpoint` index file: TensorFlow's `CheckpointState` in protobuf text format, naming the
//! latest checkpoint and the ones the retention policy still manages, with their save times.
//!
//! ```text
//! model_checkpoint_path: "model-200.safetensors"
//! all_model_checkpoint_paths: "model-100.safetensors"
//! all_model_checkpoint_paths: "model-200.safetensors"
//! all_model_checkpoint_timestamps: 1700000000.5
//! all_model_checkpoint_timestamps: 1700000600.25
//! last_preserved_timestamp: 1699999000
//! ```
//! Paths are file names relative to the index's directory.

use std::path::{Path, PathBuf};

use super::CheckpointError;
use super::atomic::write_atomically;

/// The index file name (TensorFlow's).
pub const INDEX_FILE_NAME: &str = "checkpoint";

/// One checkpoint managed by the index.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexEntry {
    /// File name relative to the directory.
    pub file: String,
    /// Save time, seconds since the Unix epoch (0 when the index did not record it).
    pub timestamp: f64,
}

/// The parsed `checkpoint` file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckpointIndex {
    /// The latest checkpoint's file name.
    pub latest: Option<String>,
    /// Checkpoints subject to `max_to_keep`, oldest first. Checkpoints preserved by the hourly
    /// rule are no longer listed (as in TensorFlow), but stay on disk.
    pub entries: Vec<IndexEntry>,
    /// The save time of the last checkpoint preserved by the hourly rule (or the run start).
    pub last_preserved_timestamp: Option<f64>,
}

fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            _ => out.push(ch),
        }
    }
    out.push('"');
    out
}

fn unquote(raw: &str) -> Result<String, String> {
    let inner = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .ok_or_else(|| format!("expected a double-quoted string, got `{raw}`"))?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(ch) = chars.next() {
        if ch != '\\' {
            out.push(ch);
            continue;
        }
        match chars.next() {
            Some('"') => out.push('"'),
            Some('\'') => out.push('\''),
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            other => return Err(format!("unsupported escape `\\{}`", other.unwrap_or(' '))),
        }
    }
    Ok(out)
}

impl CheckpointIndex {
    /// The text form.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if let Some(latest) = &self.latest {
            out.push_str(&format!("model_checkpoint_path: {}\n", quote(latest)));
        }
        for e in &self.entries {
            out.push_str(&format!("all_model_checkpoint_paths: {}\n", quote(&e.file)));
        }
        for e in &self.entries {
            out.push_str(&format!(
                "all_model_checkpoint_timestamps: {:?}\n",
                e.timestamp
            ));
        }
        if let Some(t) = self.last_preserved_timestamp {
            out.push_str(&format!("last_preserved_timestamp: {t:?}\n"));
        }
        out
    }

    /// Parses the text form; `path` names the file in errors (with the line number).
    pub fn parse(path: &Path, text: &str) -> Result<CheckpointIndex, CheckpointError> {
        let error = |line: usize, detail: String| CheckpointError::Index {
            path: path.to_path_buf(),
            line,
            detail,
        };
        let mut index = CheckpointIndex::default();
        let mut files = Vec::new();
        let mut stamps = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line
                .split_once(':')
                .ok_or_else(|| error(line_no, format!("expected `key: value`, got `{line}`")))?;
            let value = value.trim();
            let number = || {
                value
                    .parse::<f64>()
                    .map_err(|_| error(line_no, format!("`{value}` is not a number")))
            };
            match key.trim() {
                "model_checkpoint_path" => {
                    index.latest = Some(unquote(value).map_err(|d| error(line_no, d))?)
                }
                "all_model_checkpoint_paths" => {
                    files.push(unquote(value).map_err(|d| error(line_no, d))?)
                }
                "all_model_checkpoint_timestamps" => stamps.push(number()?),
                "last_preserved_timestamp" => index.last_preserved_timestamp = Some(number()?),
                other => return Err(error(line_no, format!("unknown field `{other}`"))),
            }
        }
        if !stamps.is_empty() && stamps.len() != files.len() {
            return Err(error(
                text.lines().count(),
                format!("{} paths but {} timestamps", files.len(), stamps.len()),
            ));
        }
        index.entries = files
            .into_iter()
            .enumerate()
            .map(|(i, file)| IndexEntry {
                file,
                timestamp: stamps.get(i).copied().unwrap_or(0.0),
            })
            .collect();
        Ok(index)
    }

    /// The path of the index file in `dir`.
    pub fn path_in(dir: &Path) -> PathBuf {
        dir.join(INDEX_FILE_NAME)
    }

    /// Reads `<dir>/checkpoint`; `None` when it does not exist.
    pub fn read(dir: &Path) -> Result<Option<CheckpointIndex>, CheckpointError> {
        let path = Self::path_in(dir);
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&path, &text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(CheckpointError::Io { path, source }),
        }
    }

    /// Writes `<dir>/checkpoint` atomically.
    pub fn write(&self, dir: &Path) -> Result<(), CheckpointError> {
        let path = Self::path_in(dir);
        write_atomically(&path, self.to_text().as_bytes())
            .map_err(|source| CheckpointError::Io { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip() {
        let index = CheckpointIndex {
            latest: Some("model-20.safetensors".into()),
            entries: vec![
                IndexEntry {
                    file: "model-10.safetensors".into(),
                    timestamp: 1_700_000_000.5,
                },
                IndexEntry {
                    file: "we\"ird\\name".into(),
                    timestamp: 1_700_000_600.25,
                },
            ],
            last_preserved_timestamp: Some(1_699_999_000.0),
        };
        let text = index.to_text();
        assert_eq!(
            CheckpointIndex::parse(Path::new("c"), &text).ok(),
            Some(index)
        );
    }

    #[test]
    fn parse_errors_name_the_line() {
        let err = CheckpointIndex::parse(
            Path::new("d/checkpoint"),
            "model_checkpoint_path: \"a\"\nbogus: 3\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("d/checkpoint:2"), "{err}");
        let err = CheckpointIndex::parse(Path::new("c"), "model_checkpoint_path: a\n").unwrap_err();
        assert!(err.to_string().contains("double-quoted"), "{err}");
    }
}
