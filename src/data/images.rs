//! `LabeledImages`: an image-classification data set in memory (NHWC images + `i32` labels),
//! as the MNIST and CIFAR-10 loaders return it, with splitting, dtype conversion, padding and
//! conversion to a `DataFromList` of `[image, label]` datapoints.

use super::DataError;
use super::flow::Datapoint;
use super::source::DataFromList;
use crate::tensor::{DType, HostTensor, Storage};
use std::sync::Arc;

/// Images `[N, H, W, C]` (`u8` as loaded, or `f32`) with labels `[N]` `i32`.
#[derive(Clone, Debug, PartialEq)]
pub struct LabeledImages {
    images: HostTensor,
    labels: HostTensor,
}

fn config(what: String) -> DataError {
    DataError::Config {
        flow: "LabeledImages",
        what,
    }
}

impl LabeledImages {
    /// Pairs NHWC `images` with `[N]` `i32` `labels`.
    pub fn new(images: HostTensor, labels: HostTensor) -> Result<LabeledImages, DataError> {
        let n = match *images.shape() {
            [n, _, _, _] => n,
            ref other => return Err(config(format!("images must be NHWC, got shape {other:?}"))),
        };
        if labels.shape() != [n] || labels.dtype() != DType::I32 {
            return Err(config(format!(
                "labels must be i32 of shape [{n}], got {}{:?}",
                labels.dtype(),
                labels.shape()
            )));
        }
        Ok(LabeledImages { images, labels })
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there is no example.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The images, `[N, H, W, C]`.
    pub fn images(&self) -> &HostTensor {
        &self.images
    }

    /// The labels, `[N]` `i32`.
    pub fn labels(&self) -> &HostTensor {
        &self.labels
    }

    /// `[H, W, C]` of one image.
    pub fn image_shape(&self) -> &[usize] {
        &self.images.shape()[1..]
    }

    /// How many examples carry each label `0..classes` (labels outside are not counted).
    pub fn label_counts(&self, classes: usize) -> Vec<usize> {
        let mut counts = vec![0; classes];
        for label in self.labels.to_f64_vec() {
            if let Some(c) = counts.get_mut(label as usize) {
                *c += 1;
            }
        }
        counts
    }

    /// Examples `start..start + count`.
    pub fn slice(&self, start: usize, count: usize) -> Result<LabeledImages, DataError> {
        if start.checked_add(count).is_none_or(|end| end > self.len()) {
            return Err(config(format!(
                "examples {start}..+{count} out of range 0..{}",
                self.len()
            )));
        }
        Ok(LabeledImages {
            images: slice_leading(&self.images, start, count)?,
            labels: slice_leading(&self.labels, start, count)?,
        })
    }

    /// The first `n` examples and the rest.
    pub fn split_at(&self, n: usize) -> Result<(LabeledImages, LabeledImages), DataError> {
        let head = self.slice(0, n)?;
        let tail = self.slice(n, self.len() - n)?;
        Ok((head, tail))
    }

    /// The per-pixel mean image `[H, W, C]` as `f32` (tensorpack's `get_per_pixel_mean`), the
    /// usual input normalization of CIFAR models. Errors on an empty set.
    pub fn mean_image(&self) -> Result<HostTensor, DataError> {
        let n = self.len();
        if n == 0 {
            return Err(config(
                "the mean image of an empty set is undefined".to_string(),
            ));
        }
        let pixels = self.images.len() / n;
        let mut sum = vec![0f64; pixels];
        let storage = self.images.storage();
        for i in 0..self.images.len() {
            sum[i % pixels] += storage.get_f64(i);
        }
        let mean = sum.into_iter().map(|s| (s / n as f64) as f32).collect();
        Ok(HostTensor::from_f32(self.image_shape(), mean)?)
    }

    /// The same examples as `f32` with `mean` (an `[H, W, C]` image, e.g. [`Self::mean_image`]
    /// of the training set) subtracted from every image.
    pub fn subtract_image(&self, mean: &HostTensor) -> Result<LabeledImages, DataError> {
        if mean.shape() != self.image_shape() {
            return Err(config(format!(
                "cannot subtract a {:?} mean image from {:?} images",
                mean.shape(),
                self.image_shape()
            )));
        }
        let mean = mean.to_f32_vec();
        let mut images = self.images.cast(DType::F32);
        if let Storage::F32(v) = images.storage_mut() {
            for (i, x) in v.iter_mut().enumerate() {
                *x -= mean[i % mean.len()];
            }
        }
        Ok(LabeledImages {
            images,
            labels: self.labels.clone(),
        })
    }

    /// The same examples with `f32` images multiplied by `scale` (e.g. `1.0 / 255.0`).
    pub fn to_f32(&self, scale: f32) -> LabeledImages {
        let mut images = self.images.cast(DType::F32);
        if let Storage::F32(v) = images.storage_mut() {
            v.iter_mut().for_each(|x| *x *= scale);
        }
        LabeledImages {
            images,
            labels: self.labels.clone(),
        }
    }

    /// Zero-pads every image by `pad` pixels on each side and replicates a single channel to
    /// `channels` (e.g. MNIST `28×28×1` → `32×32×3` with `pad = 2, channels = 3`).
    pub fn pad_and_replicate(
        &self,
        pad: usize,
        channels: usize,
    ) -> Result<LabeledImages, DataError> {
        let [n, h, w, c] = *self.images.shape() else {
            return Err(config("images must be NHWC".to_string()));
        };
        if c != 1 && c != channels {
            return Err(config(format!("cannot turn {c} channels into {channels}")));
        }
        let (oh, ow) = (h + 2 * pad, w + 2 * pad);
        fn build<T: Copy + Default>(
            src: &[T],
            dims: [usize; 4],
            pad: usize,
            channels: usize,
        ) -> Vec<T> {
            let [n, h, w, c] = dims;
            let (oh, ow) = (h + 2 * pad, w + 2 * pad);
            let mut out = vec![T::default(); n * oh * ow * channels];
            for i in 0..n {
                for y in 0..h {
                    for x in 0..w {
                        let dst = ((i * oh + y + pad) * ow + x + pad) * channels;
                        for k in 0..channels {
                            out[dst + k] = src[((i * h + y) * w + x) * c + k % c];
                        }
                    }
                }
            }
            out
        }
        let dims = [n, h, w, c];
        let storage = match self.images.storage() {
            Storage::U8(v) => Storage::U8(build(v, dims, pad, channels)),
            Storage::F32(v) => Storage::F32(build(v, dims, pad, channels)),
            other => {
                return Err(config(format!(
                    "padding supports u8 and f32 images, not {}",
                    other.dtype()
                )));
            }
        };
        Ok(LabeledImages {
            images: HostTensor::new(vec![n, oh, ow, channels], storage)?,
            labels: self.labels.clone(),
        })
    }

    /// One `[image [H, W, C], label []]` datapoint per example.
    pub fn datapoints(&self) -> Result<Vec<Datapoint>, DataError> {
        let shape = self.image_shape().to_vec();
        (0..self.len())
            .map(|i| {
                let image = slice_leading(&self.images, i, 1)?.reshape(&shape)?;
                let label = slice_leading(&self.labels, i, 1)?.reshape(&[])?;
                Ok(vec![image, label])
            })
            .collect()
    }

    /// A source flow over [`LabeledImages::datapoints`], reshuffled every pass when
    /// `shuffle_seed` is given.
    pub fn to_flow(&self, shuffle_seed: Option<u64>) -> Result<DataFromList, DataError> {
        Ok(DataFromList::from_shared(
            Arc::new(self.datapoints()?),
            shuffle_seed,
        ))
    }
}

/// Rows `start..start + count` of the leading axis of `t`.
fn slice_leading(t: &HostTensor, start: usize, count: usize) -> Result<HostTensor, DataError> {
    let row: usize = t.shape()[1..].iter().product();
    let range = start * row..(start + count) * row;
    macro_rules! take {
        ($($variant:ident),*) => {
            match t.storage() {
                $(Storage::$variant(v) => Storage::$variant(v[range].to_vec()),)*
            }
        };
    }
    let storage = take!(F32, F64, F16, BF16, I32, I64, U8, Bool);
    let mut shape = t.shape().to_vec();
    shape[0] = count;
    Ok(HostTensor::new(shape, storage)?)
}
