//! `stats.json`, tensorpack's `JSONWriter` format: a JSON list with one record per flush, each
//! holding the scalars put since the previous flush plus `epoch_num` and `global_step`.
//! Every write replaces the file atomically. Non-finite scalars are written as `null` (JSON has
//! no NaN) and read back as NaN.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::{Map, Number, Value};

use super::MonitorError;
use crate::train::checkpoint::write_atomically;
use crate::train::logdir::timestamped_sibling;

/// The file name inside the logger dir (fixed, as in tensorpack: tools look for it).
pub const STATS_FILE_NAME: &str = "stats.json";

const EPOCH_KEY: &str = "epoch_num";
const STEP_KEY: &str = "global_step";

/// One flushed record of `stats.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct StatsRecord {
    pub epoch_num: u64,
    pub global_step: u64,
    /// Scalar name → value. Names `epoch_num`/`global_step` are reserved for the fields above.
    pub scalars: BTreeMap<String, f64>,
}

impl StatsRecord {
    fn to_json(&self) -> Value {
        let mut map = Map::new();
        for (name, &v) in &self.scalars {
            // `from_f64` is None exactly for NaN and ±inf, which JSON cannot hold.
            let value = Number::from_f64(v).map_or(Value::Null, Value::Number);
            map.insert(name.clone(), value);
        }
        map.insert(EPOCH_KEY.into(), Value::from(self.epoch_num));
        map.insert(STEP_KEY.into(), Value::from(self.global_step));
        Value::Object(map)
    }

    fn from_json(index: usize, value: &Value) -> Result<StatsRecord, String> {
        let map = value
            .as_object()
            .ok_or_else(|| format!("record {index} is not an object"))?;
        let counter = |key: &str| {
            map.get(key)
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("record {index} has no non-negative integer `{key}`"))
        };
        let mut scalars = BTreeMap::new();
        for (name, v) in map {
            if name == EPOCH_KEY || name == STEP_KEY {
                continue;
            }
            let x = match v {
                Value::Null => f64::NAN,
                Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                other => return Err(format!("record {index}: `{name}` is not a number: {other}")),
            };
            scalars.insert(name.clone(), x);
        }
        Ok(StatsRecord {
            epoch_num: counter(EPOCH_KEY)?,
            global_step: counter(STEP_KEY)?,
            scalars,
        })
    }
}

fn parse_stats(path: &Path, bytes: &[u8]) -> Result<Vec<StatsRecord>, MonitorError> {
    let corrupt = |detail: String| MonitorError::CorruptStats {
        path: path.to_path_buf(),
        detail,
    };
    let value: Value = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    let list = value
        .as_array()
        .ok_or_else(|| corrupt("the top level is not a list".into()))?;
    list.iter()
        .enumerate()
        .map(|(i, v)| StatsRecord::from_json(i, v))
        .collect::<Result<_, _>>()
        .map_err(corrupt)
}

/// The records of `<dir>/stats.json`, or `None` if there is no such file.
pub fn load_existing_json(dir: &Path) -> Result<Option<Vec<StatsRecord>>, MonitorError> {
    let path = dir.join(STATS_FILE_NAME);
    match std::fs::read(&path) {
        Ok(bytes) => parse_stats(&path, &bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(MonitorError::Io { path, source }),
    }
}

/// The `epoch_num` of the last record of `<dir>/stats.json` (what AutoResume continues from), or
/// `None` if there is no file or it holds no record.
pub fn load_existing_epoch_number(dir: &Path) -> Result<Option<u64>, MonitorError> {
    Ok(load_existing_json(dir)?.and_then(|records| records.last().map(|r| r.epoch_num)))
}

/// What [`StatsJsonWriter::on_start`] did with an existing `stats.json`.
#[derive(Clone, Debug, PartialEq)]
pub enum StartOutcome {
    /// There was no file: a new one starts with the first flush.
    Fresh,
    /// The file continues this run (its last `epoch_num + 1 == starting_epoch`, or it was
    /// empty): new records are appended to its `existing` ones.
    Appending { existing: usize },
    /// The file did not continue this run (or was unreadable, see `reason`), so it was moved
    /// to `backup` and a new one starts.
    BackedUp { backup: PathBuf, reason: String },
}

/// Writes `<logdir>/stats.json` with tensorpack's `JSONWriter` semantics.
///
/// The training loop calls [`on_start`](Self::on_start) once before training, puts scalars as
/// they arrive, and calls [`flush`](Self::flush) at each trigger point; a flush with no new
/// scalars writes nothing.
#[derive(Debug)]
pub struct StatsJsonWriter {
    path: PathBuf,
    records: Vec<StatsRecord>,
    pending: BTreeMap<String, f64>,
}

impl StatsJsonWriter {
    /// A writer for `<logdir>/stats.json`. Touches no file until [`on_start`](Self::on_start).
    pub fn new(logdir: &Path) -> StatsJsonWriter {
        StatsJsonWriter {
            path: logdir.join(STATS_FILE_NAME),
            records: Vec::new(),
            pending: BTreeMap::new(),
        }
    }

    /// The path of `stats.json`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Decides whether an existing file continues this run: it is appended to when its last
    /// `epoch_num + 1 == starting_epoch` (or it holds no record); otherwise it is moved to
    /// `stats.json.<MMDD-HHMMSS>` (UTC) and a new file starts. An unreadable file is also moved
    /// aside rather than blocking training; the outcome says why.
    pub fn on_start(&mut self, starting_epoch: u64) -> Result<StartOutcome, MonitorError> {
        self.records.clear();
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(StartOutcome::Fresh),
            Err(source) => {
                return Err(MonitorError::Io {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let reason = match parse_stats(&self.path, &bytes) {
            Ok(records) => match records.last() {
                None => return Ok(StartOutcome::Appending { existing: 0 }),
                Some(last) if last.epoch_num.checked_add(1) == Some(starting_epoch) => {
                    let existing = records.len();
                    self.records = records;
                    return Ok(StartOutcome::Appending { existing });
                }
                Some(last) => format!(
                    "its last epoch_num={} is not the predecessor of starting_epoch={starting_epoch}",
                    last.epoch_num
                ),
            },
            Err(e) => e.to_string(),
        };
        let backup = timestamped_sibling(&self.path, SystemTime::now());
        std::fs::rename(&self.path, &backup).map_err(|source| MonitorError::Io {
            path: self.path.clone(),
            source,
        })?;
        Ok(StartOutcome::BackedUp { backup, reason })
    }

    /// Continues the file of a run resumed at `global_step` (towerpack's exact resume): records
    /// stamped after `global_step` were written by the part of the killed run that is redone, so
    /// they are dropped (and the file rewritten atomically); the rest are appended to. An
    /// unreadable file is moved aside as by [`on_start`](Self::on_start).
    pub fn on_resume(&mut self, global_step: u64) -> Result<StartOutcome, MonitorError> {
        self.records.clear();
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(StartOutcome::Fresh),
            Err(source) => {
                return Err(MonitorError::Io {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        match parse_stats(&self.path, &bytes) {
            Ok(mut records) => {
                let before = records.len();
                records.retain(|r| r.global_step <= global_step);
                if records.len() != before {
                    let json = Value::Array(records.iter().map(StatsRecord::to_json).collect());
                    write_atomically(&self.path, json.to_string().as_bytes()).map_err(
                        |source| MonitorError::Io {
                            path: self.path.clone(),
                            source,
                        },
                    )?;
                }
                let existing = records.len();
                self.records = records;
                Ok(StartOutcome::Appending { existing })
            }
            Err(e) => {
                let backup = timestamped_sibling(&self.path, SystemTime::now());
                std::fs::rename(&self.path, &backup).map_err(|source| MonitorError::Io {
                    path: self.path.clone(),
                    source,
                })?;
                Ok(StartOutcome::BackedUp {
                    backup,
                    reason: e.to_string(),
                })
            }
        }
    }

    /// Records `value` for `name`, replacing a value put earlier in the same period.
    pub fn put_scalar(&mut self, name: &str, value: f64) {
        self.pending.insert(name.to_string(), value);
    }

    /// [`put_scalar`](Self::put_scalar) for each pair.
    pub fn add_scalars<'a>(&mut self, scalars: impl IntoIterator<Item = (&'a str, f64)>) {
        for (name, value) in scalars {
            self.put_scalar(name, value);
        }
    }

    /// True when scalars were put since the last flush.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Every record written so far (including appended-to ones).
    pub fn records(&self) -> &[StatsRecord] {
        &self.records
    }

    /// If scalars were put since the last flush, closes them into a record stamped with
    /// `epoch_num` and `global_step` and rewrites the file atomically. Returns whether it wrote.
    pub fn flush(&mut self, epoch_num: u64, global_step: u64) -> Result<bool, MonitorError> {
        if self.pending.is_empty() {
            return Ok(false);
        }
        let mut record = StatsRecord {
            epoch_num,
            global_step,
            scalars: std::mem::take(&mut self.pending),
        };
        record.scalars.remove(EPOCH_KEY);
        record.scalars.remove(STEP_KEY);
        self.records.push(record);
        let json = Value::Array(self.records.iter().map(StatsRecord::to_json).collect());
        write_atomically(&self.path, json.to_string().as_bytes()).map_err(|source| {
            MonitorError::Io {
                path: self.path.clone(),
                source,
            }
        })?;
        Ok(true)
    }
}
