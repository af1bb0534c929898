//! [`EventFileWriter`]: writes TensorBoard event files (`events.out.tfevents.<secs>.<host>.<pid>`)
//! holding scalars, histograms and images, framed as TFRecords (see [`super::record`]) around
//! hand-encoded `Event` protobufs (see [`super::proto`]).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::tensor::HostTensor;

use super::MonitorError;
use super::histogram::histogram_of;
use super::image::{PixelRange, encode_images};
use super::proto::{Event, EventContent, SummaryPayload, SummaryValue};
use super::record::write_record;

/// The `file_version` of the first event of every file.
pub const FILE_VERSION: &str = "brain.Event:2";

/// Seconds since the Unix epoch, as event files store them.
pub fn wall_time_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The host name used in event file names (`/proc/sys/kernel/hostname`, then `$HOSTNAME`).
fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .map(|ch| {
            if ch == '/' || ch.is_whitespace() {
                '_'
            } else {
                ch
            }
        })
        .collect();
    if clean.is_empty() {
        "localhost".to_string()
    } else {
        clean
    }
}

/// Event steps are `int64`; a `u64` step beyond `i64::MAX` (unreachable in practice) saturates.
fn event_step(step: u64) -> i64 {
    i64::try_from(step).unwrap_or(i64::MAX)
}

/// Writes one TensorBoard event file. Events are buffered; [`flush`](Self::flush) makes them
/// visible to readers, [`close`](Self::close) also syncs them to disk. Dropping the writer flushes
/// on a best-effort basis.
pub struct EventFileWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventFileWriter {
    /// Creates `logdir` if needed and a new event file in it, and writes the `file_version` event.
    ///
    /// The name is `events.out.tfevents.<secs>.<host>.<pid>`, with `.1`, `.2`, ... appended if a
    /// file of that name already exists (two writers opened within one second).
    pub fn create(logdir: &Path) -> Result<EventFileWriter, MonitorError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| MonitorError::Io { path, source }
        };
        std::fs::create_dir_all(logdir).map_err(io(logdir))?;
        let wall_time = wall_time_now();
        let base = format!(
            "events.out.tfevents.{}.{}.{}",
            wall_time as u64,
            host_name(),
            std::process::id()
        );
        let mut attempt = 0u32;
        let (path, file) = loop {
            let name = if attempt == 0 {
                base.clone()
            } else {
                format!("{base}.{attempt}")
            };
            let path = logdir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == ErrorKind::AlreadyExists && attempt < 10_000 => attempt += 1,
                Err(e) => return Err(io(&path)(e)),
            }
        };
        let mut writer = EventFileWriter {
            path,
            out: BufWriter::new(file),
        };
        writer.write_event(&Event {
            wall_time,
            step: 0,
            content: EventContent::FileVersion(FILE_VERSION.to_string()),
        })?;
        writer.flush()?;
        Ok(writer)
    }

    /// The path of the event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io_error(&self, source: std::io::Error) -> MonitorError {
        MonitorError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Appends one event (buffered).
    pub fn write_event(&mut self, event: &Event) -> Result<(), MonitorError> {
        write_record(&mut self.out, &event.encode()).map_err(|e| self.io_error(e))
    }

    /// Appends a summary event holding `values`, stamped now.
    pub fn write_summary(
        &mut self,
        step: u64,
        values: Vec<SummaryValue>,
    ) -> Result<(), MonitorError> {
        self.write_event(&Event {
            wall_time: wall_time_now(),
            step: event_step(step),
            content: EventContent::Summary(values),
        })
    }

    /// A scalar summary (`simple_value` is an `f32` in the format).
    pub fn put_scalar(&mut self, tag: &str, value: f64, step: u64) -> Result<(), MonitorError> {
        self.write_summary(
            step,
            vec![SummaryValue {
                tag: tag.to_string(),
                payload: SummaryPayload::Scalar(value as f32),
            }],
        )
    }

    /// A histogram summary of every element of `values` (any dtype), with TF's default buckets.
    /// Errors on NaN or infinite elements, as TensorFlow does.
    pub fn put_histogram(
        &mut self,
        tag: &str,
        values: &HostTensor,
        step: u64,
    ) -> Result<(), MonitorError> {
        let histo = histogram_of(tag, &values.to_f64_vec())?;
        self.write_summary(
            step,
            vec![SummaryValue {
                tag: tag.to_string(),
                payload: SummaryPayload::Histogram(histo),
            }],
        )
    }

    /// Image summaries of `image` (`HW`, `HWC`, `NHW` or `NHWC`; `u8` or float), PNG-encoded.
    /// A batch of N > 1 images is tagged `tag/0` … `tag/N-1` (tensorpack's rule).
    pub fn put_image(
        &mut self,
        tag: &str,
        image: &HostTensor,
        range: PixelRange,
        step: u64,
    ) -> Result<(), MonitorError> {
        let values = encode_images(tag, image, range)?
            .into_iter()
            .map(|(tag, img)| SummaryValue {
                tag,
                payload: SummaryPayload::Image(img),
            })
            .collect();
        self.write_summary(step, values)
    }

    /// Hands buffered events to the OS, so TensorBoard sees them.
    pub fn flush(&mut self) -> Result<(), MonitorError> {
        self.out.flush().map_err(|e| self.io_error(e))
    }

    /// Flushes, syncs the file to disk and closes it.
    pub fn close(mut self) -> Result<(), MonitorError> {
        self.flush()?;
        self.out.get_ref().sync_all().map_err(|e| self.io_error(e))
    }
}
