//! CIFAR-10, binary version: `data_batch_1.bin` … `data_batch_5.bin` (training) and
//! `test_batch.bin`, each a sequence of 3,073-byte records (1 label byte, then the 32×32 red,
//! green and blue planes). Loaded as NHWC `u8` images (`to_f32` for floats).

use super::DataError;
use super::idx::read_file;
use super::images::LabeledImages;
use crate::tensor::{HostTensor, Storage};
use std::path::{Path, PathBuf};

/// Image side.
pub const CIFAR_SIDE: usize = 32;
/// Bytes of one record: a label and three 32×32 planes.
pub const CIFAR_RECORD: usize = 1 + 3 * CIFAR_SIDE * CIFAR_SIDE;
/// Number of classes.
pub const CIFAR_CLASSES: usize = 10;

/// Which part of CIFAR-10 to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CifarSplit {
    /// `data_batch_1.bin` … `data_batch_5.bin` (50,000 images).
    Train,
    /// `test_batch.bin` (10,000 images).
    Test,
}

impl CifarSplit {
    /// The file names of this split, in load order.
    pub fn file_names(self) -> Vec<String> {
        match self {
            CifarSplit::Train => (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
            CifarSplit::Test => vec!["test_batch.bin".to_string()],
        }
    }
}

/// Loads a split from `dir`, the folder holding the `.bin` files (or the folder holding the
/// tarball's `cifar-10-batches-bin/`).
pub fn load_cifar10(dir: &Path, split: CifarSplit) -> Result<LabeledImages, DataError> {
    let dir = resolve_dir(dir)?;
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    for name in split.file_names() {
        read_cifar10_batch(&dir.join(name), &mut pixels, &mut labels)?;
    }
    let n = labels.len();
    let images = HostTensor::new(vec![n, CIFAR_SIDE, CIFAR_SIDE, 3], Storage::U8(pixels))?;
    LabeledImages::new(images, HostTensor::from_i32(&[n], labels)?)
}

fn resolve_dir(dir: &Path) -> Result<PathBuf, DataError> {
    if !dir.is_dir() {
        return Err(DataError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "CIFAR-10 directory not found (expected the binary version's .bin files)",
            ),
        });
    }
    let nested = dir.join("cifar-10-batches-bin");
    if !dir.join("test_batch.bin").exists() && nested.is_dir() {
        return Ok(nested);
    }
    Ok(dir.to_path_buf())
}

/// Appends the records of one batch file: HWC pixels to `pixels`, labels to `labels`.
pub fn read_cifar10_batch(
    path: &Path,
    pixels: &mut Vec<u8>,
    labels: &mut Vec<i32>,
) -> Result<(), DataError> {
    let bytes = read_file(path)?;
    let name = path.display().to_string();
    let error = |offset: usize, what: String| DataError::Format {
        path: name.clone(),
        offset: offset as u64,
        stream: "",
        what,
    };
    if bytes.is_empty() {
        return Err(error(
            0,
            format!("expected {CIFAR_RECORD}-byte records, the file is empty"),
        ));
    }
    let whole = bytes.len() / CIFAR_RECORD;
    if bytes.len() % CIFAR_RECORD != 0 {
        let offset = whole * CIFAR_RECORD;
        return Err(error(
            offset,
            format!(
                "record {whole} is truncated: expected {CIFAR_RECORD} bytes, the file ends after {}",
                bytes.len() - offset
            ),
        ));
    }
    let plane = CIFAR_SIDE * CIFAR_SIDE;
    pixels.reserve(whole * 3 * plane);
    for (r, record) in bytes.chunks_exact(CIFAR_RECORD).enumerate() {
        let label = record[0];
        if usize::from(label) >= CIFAR_CLASSES {
            return Err(error(
                r * CIFAR_RECORD,
                format!("label {label} of record {r} is not a class 0..=9"),
            ));
        }
        labels.push(i32::from(label));
        let planes = &record[1..];
        for p in 0..plane {
            pixels.extend_from_slice(&[planes[p], planes[plane + p], planes[2 * plane + p]]);
        }
    }
    Ok(())
}
