//! Summaries (TensorFlow's word for them): the files a training run writes for humans and tools —
//! TensorBoard event files ([`EventFileWriter`]) with scalars, histograms and images, and
//! `stats.json` ([`StatsJsonWriter`]). These are plain file formats and writers; the monitor
//! callbacks of the training loop (`train::monitors`) own them and decide when to call them.

pub mod histogram;
pub mod image;
pub mod json_writer;
pub mod proto;
pub mod record;
pub mod tfevents;

use std::path::PathBuf;

pub use histogram::{default_bucket_limits, histogram_of};
pub use image::{PixelRange, encode_images};
pub use json_writer::{
    STATS_FILE_NAME, StartOutcome, StatsJsonWriter, StatsRecord, load_existing_epoch_number,
    load_existing_json,
};
pub use record::{crc32c, mask_crc, masked_crc32c, read_records, unmask_crc};
pub use tfevents::{EventFileWriter, FILE_VERSION};

/// Errors of the monitor back ends. Each names the file, tag or record at fault.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: corrupt record at byte {offset}: {what}")]
    CorruptRecord {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    #[error("histogram `{tag}`: element {index} is {value} (histograms need finite values)")]
    NonFiniteHistogram {
        tag: String,
        index: usize,
        value: f64,
    },
    #[error("image `{tag}` of shape {shape:?}: {reason}")]
    BadImage {
        tag: String,
        shape: Vec<usize>,
        reason: String,
    },
    #[error("image `{tag}`: PNG encoding failed: {detail}")]
    Png { tag: String, detail: String },
    #[error("{path}: not a valid stats file: {detail}")]
    CorruptStats { path: PathBuf, detail: String },
}
