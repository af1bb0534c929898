//! MNIST: loading an image/label IDX pair from disk, and `mnist10k`, the 10,000 real digits
//! compiled into the binary (`data/mnist10k/`), split deterministically into the first 8,000 for
//! training and the last 2,000 for validation.

use super::DataError;
use super::idx::{idx_label_offset, parse_idx_images, parse_idx_labels, read_file};
use super::images::LabeledImages;
use crate::tensor::{HostTensor, Storage};
use std::path::Path;

/// Number of digit classes.
pub const MNIST_CLASSES: usize = 10;
/// Examples in the embedded set.
pub const MNIST10K_LEN: usize = 10_000;
/// The embedded set's training part: its first 8,000 examples.
pub const MNIST10K_TRAIN: usize = 8_000;
/// The embedded set's validation part: its last 2,000 examples.
pub const MNIST10K_VALIDATION: usize = 2_000;

const MNIST10K_IMAGES: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/mnist10k/images-idx3-ubyte.gz"
));
const MNIST10K_LABELS: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/mnist10k/labels-idx1-ubyte.gz"
));

/// A training part and a validation part of one data set.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainValidation {
    pub train: LabeledImages,
    pub validation: LabeledImages,
}

/// Loads an MNIST image file and its label file (IDX, raw or gzip) as `[N, 28, 28, 1]` `u8`
/// images and `[N]` `i32` labels. The counts must agree and labels must be digits.
pub fn load_mnist(images: &Path, labels: &Path) -> Result<LabeledImages, DataError> {
    parse_mnist(
        &images.display().to_string(),
        &read_file(images)?,
        &labels.display().to_string(),
        &read_file(labels)?,
    )
}

/// [`load_mnist`] on bytes already in memory; the names are used in errors.
pub fn parse_mnist(
    images_name: &str,
    images_file: &[u8],
    labels_name: &str,
    labels_file: &[u8],
) -> Result<LabeledImages, DataError> {
    let images = parse_idx_images(images_name, images_file)?;
    let labels = parse_idx_labels(labels_name, labels_file)?;
    if images.count != labels.len() {
        return Err(DataError::CountMismatch {
            images: images_name.to_string(),
            image_count: images.count,
            labels: labels_name.to_string(),
            label_count: labels.len(),
        });
    }
    if let Some(i) = labels.iter().position(|&l| usize::from(l) >= MNIST_CLASSES) {
        return Err(DataError::Format {
            path: labels_name.to_string(),
            offset: idx_label_offset(i),
            stream: if labels_file.starts_with(&[0x1f, 0x8b]) {
                " (of the gunzipped stream)"
            } else {
                ""
            },
            what: format!("label {} of example {i} is not a digit 0..=9", labels[i]),
        });
    }
    let n = images.count;
    let image_tensor = HostTensor::new(
        vec![n, images.rows, images.cols, 1],
        Storage::U8(images.pixels),
    )?;
    let label_tensor = HostTensor::from_i32(&[n], labels.iter().map(|&l| i32::from(l)).collect())?;
    LabeledImages::new(image_tensor, label_tensor)
}

/// The embedded 10,000 MNIST digits (`[10000, 28, 28, 1]` `u8`, labels `i32`), parsed with the
/// same IDX loader as files on disk. The order was shuffled once when the set was made.
pub fn mnist10k() -> Result<LabeledImages, DataError> {
    parse_mnist(
        "embedded mnist10k/images-idx3-ubyte.gz",
        MNIST10K_IMAGES,
        "embedded mnist10k/labels-idx1-ubyte.gz",
        MNIST10K_LABELS,
    )
}

/// The embedded digits split deterministically: the FIRST 8,000 examples for training, the LAST
/// 2,000 for validation (no reshuffle is needed: the files are already shuffled).
pub fn mnist10k_split() -> Result<TrainValidation, DataError> {
    let (train, validation) = mnist10k()?.split_at(MNIST10K_TRAIN)?;
    Ok(TrainValidation { train, validation })
}
