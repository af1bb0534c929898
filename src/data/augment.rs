//! Image augmentations on HWC images (`u8` or `f32`): center paste (pad to size), random crop,
//! horizontal flip, normalization; and `AugmentImageComponent`, which applies a chain of them to
//! one component of every datapoint with randomness keyed by `(seed, pass, index)`.

use super::DataError;
use super::flow::{DataFlow, forward_data_flow};
use super::map::MapDataComponent;
use super::rng::RandomKey;
use crate::tensor::{DType, HostTensor, Storage};
use std::sync::Arc;

/// One image transformation. `key` is the datapoint's own random stream; deterministic
/// augmentors ignore it.
pub trait ImageAugmentor: Send + Sync {
    /// The augmentor's name, for errors.
    fn name(&self) -> &'static str;
    /// Transforms one `[H, W, C]` image.
    fn augment(&self, image: HostTensor, key: RandomKey) -> Result<HostTensor, DataError>;
}

/// Applies `augmentors` in order to component `component` of every datapoint; augmentor `j`
/// draws from `RandomKey::new(seed, pass, index).derive(j)`. Its state is that of the `MapData`
/// inside.
pub struct AugmentImageComponent(MapDataComponent);

forward_data_flow!(AugmentImageComponent);

impl AugmentImageComponent {
    /// Wraps `inner` in the augmenting map.
    pub fn new(
        inner: impl DataFlow + 'static,
        component: usize,
        augmentors: Vec<Arc<dyn ImageAugmentor>>,
        seed: u64,
    ) -> AugmentImageComponent {
        AugmentImageComponent(MapDataComponent::new(
            inner,
            component,
            move |image, ctx| {
                let key = ctx.key(seed);
                augmentors
                    .iter()
                    .enumerate()
                    .try_fold(image, |img, (j, aug)| {
                        aug.augment(img, key.derive(j as u64))
                    })
            },
        ))
    }
}

/// Pixel types the spatial augmentations support.
trait Pixel: Copy {
    fn from_f64(x: f64) -> Self;
}
impl Pixel for u8 {
    fn from_f64(x: f64) -> u8 {
        x.clamp(0.0, 255.0) as u8
    }
}
impl Pixel for f32 {
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
}

/// The `(height, width, channels)` of an HWC image.
fn hwc(name: &'static str, image: &HostTensor) -> Result<(usize, usize, usize), DataError> {
    match *image.shape() {
        [h, w, c] => Ok((h, w, c)),
        ref other => Err(DataError::Augment {
            augmentor: name,
            what: format!("expected an HWC image of rank 3, got shape {other:?}"),
        }),
    }
}

/// Applies a generic pixel-moving function to a `u8` or `f32` image of `shape`.
macro_rules! per_pixel_type {
    ($name:expr, $image:expr, $shape:expr, |$v:ident| $body:expr) => {{
        let storage = match $image.storage() {
            Storage::U8($v) => Storage::U8($body),
            Storage::F32($v) => Storage::F32($body),
            other => {
                return Err(DataError::Augment {
                    augmentor: $name,
                    what: format!("unsupported image dtype {} (u8 or f32)", other.dtype()),
                });
            }
        };
        Ok(HostTensor::new($shape, storage)?)
    }};
}

/// Copies the `out_h × out_w` window at `(y0, x0)` of a `h × w × c` image.
fn crop_pixels<T: Pixel>(
    src: &[T],
    (w, c): (usize, usize),
    (y0, x0): (usize, usize),
    (out_h, out_w): (usize, usize),
) -> Vec<T> {
    let mut out = Vec::with_capacity(out_h * out_w * c);
    for y in y0..y0 + out_h {
        let row = (y * w + x0) * c;
        out.extend_from_slice(&src[row..row + out_w * c]);
    }
    out
}

/// Pastes a `h × w × c` image at the center of an `out_h × out_w` canvas filled with `fill`.
fn paste_pixels<T: Pixel>(
    src: &[T],
    (h, w, c): (usize, usize, usize),
    (out_h, out_w): (usize, usize),
    fill: T,
) -> Vec<T> {
    let mut out = vec![fill; out_h * out_w * c];
    let (y0, x0) = ((out_h - h) / 2, (out_w - w) / 2);
    for y in 0..h {
        let dst = ((y0 + y) * out_w + x0) * c;
        out[dst..dst + w * c].copy_from_slice(&src[y * w * c..(y + 1) * w * c]);
    }
    out
}

fn flip_pixels<T: Pixel>(src: &[T], (h, w, c): (usize, usize, usize)) -> Vec<T> {
    let mut out = Vec::with_capacity(src.len());
    for y in 0..h {
        for x in (0..w).rev() {
            let at = (y * w + x) * c;
            out.extend_from_slice(&src[at..at + c]);
        }
    }
    out
}

/// Pastes the image at the center of a `height × width` canvas filled with `background`
/// (tensorpack's `CenterPaste`; the usual "pad to size"). The image must fit.
#[derive(Clone, Debug)]
pub struct CenterPaste {
    pub height: usize,
    pub width: usize,
    pub background: f64,
}

impl CenterPaste {
    /// A zero-background paste onto `height × width`.
    pub fn new(height: usize, width: usize) -> CenterPaste {
        CenterPaste {
            height,
            width,
            background: 0.0,
        }
    }
}

impl ImageAugmentor for CenterPaste {
    fn name(&self) -> &'static str {
        "CenterPaste"
    }

    fn augment(&self, image: HostTensor, _key: RandomKey) -> Result<HostTensor, DataError> {
        let (h, w, c) = hwc(self.name(), &image)?;
        if h > self.height || w > self.width {
            return Err(DataError::Augment {
                augmentor: self.name(),
                what: format!(
                    "image {h}x{w} does not fit in {}x{}",
                    self.height, self.width
                ),
            });
        }
        let size = (self.height, self.width);
        let bg = self.background;
        per_pixel_type!(self.name(), image, vec![size.0, size.1, c], |v| {
            paste_pixels(v, (h, w, c), size, Pixel::from_f64(bg))
        })
    }
}

/// Crops a `height × width` window at a uniformly random position.
#[derive(Clone, Debug)]
pub struct RandomCrop {
    pub height: usize,
    pub width: usize,
}

impl RandomCrop {
    /// A random `height × width` crop.
    pub fn new(height: usize, width: usize) -> RandomCrop {
        RandomCrop { height, width }
    }
}

impl ImageAugmentor for RandomCrop {
    fn name(&self) -> &'static str {
        "RandomCrop"
    }

    fn augment(&self, image: HostTensor, key: RandomKey) -> Result<HostTensor, DataError> {
        let (h, w, c) = hwc(self.name(), &image)?;
        if h < self.height || w < self.width {
            return Err(DataError::Augment {
                augmentor: self.name(),
                what: format!(
                    "image {h}x{w} is smaller than the crop {}x{}",
                    self.height, self.width
                ),
            });
        }
        let y0 = key.below(0, (h - self.height + 1) as u64) as usize;
        let x0 = key.below(1, (w - self.width + 1) as u64) as usize;
        let out = (self.height, self.width);
        per_pixel_type!(self.name(), image, vec![out.0, out.1, c], |v| crop_pixels(
            v,
            (w, c),
            (y0, x0),
            out
        ))
    }
}

/// Mirrors the image left–right with probability `probability` (tensorpack's
/// `Flip(horiz=True)`, default 0.5).
#[derive(Clone, Debug)]
pub struct Flip {
    pub probability: f64,
}

impl Flip {
    /// A horizontal flip with probability 0.5.
    pub fn horizontal() -> Flip {
        Flip { probability: 0.5 }
    }
}

impl ImageAugmentor for Flip {
    fn name(&self) -> &'static str {
        "Flip"
    }

    fn augment(&self, image: HostTensor, key: RandomKey) -> Result<HostTensor, DataError> {
        let dims = hwc(self.name(), &image)?;
        if key.uniform(0) >= self.probability {
            return Ok(image);
        }
        per_pixel_type!(self.name(), image, vec![dims.0, dims.1, dims.2], |v| {
            flip_pixels(v, dims)
        })
    }
}

/// Normalization to `f32`: `(x - mean[c]) / std[c]` per channel, or subtraction of a per-pixel
/// mean image (tensorpack's CIFAR example). Input may be any numeric dtype.
#[derive(Clone, Debug)]
pub enum Normalize {
    PerChannel {
        mean: Vec<f32>,
        std: Vec<f32>,
    },
    /// Built by [`Normalize::mean_image`], which stores the mean as `f32`.
    MeanImage {
        mean: HostTensor,
    },
}

impl Normalize {
    /// `(x - mean[c]) / std[c]` for channel `c`.
    pub fn per_channel(mean: Vec<f32>, std: Vec<f32>) -> Normalize {
        Normalize::PerChannel { mean, std }
    }

    /// `x - mean` elementwise, `mean` an HWC image of the same shape (kept as `f32`).
    pub fn mean_image(mean: &HostTensor) -> Normalize {
        Normalize::MeanImage {
            mean: mean.cast(DType::F32),
        }
    }
}

impl ImageAugmentor for Normalize {
    fn name(&self) -> &'static str {
        "Normalize"
    }

    fn augment(&self, image: HostTensor, _key: RandomKey) -> Result<HostTensor, DataError> {
        let (h, w, c) = hwc(self.name(), &image)?;
        let widened;
        let values: &[f32] = match image.storage() {
            Storage::F32(v) => v,
            Storage::U8(v) => {
                widened = v.iter().map(|&b| f32::from(b)).collect::<Vec<f32>>();
                &widened
            }
            _ => {
                widened = image.to_f32_vec();
                &widened
            }
        };
        let out: Vec<f32> = match self {
            Normalize::PerChannel { mean, std } => {
                if mean.len() != c || std.len() != c {
                    return Err(DataError::Augment {
                        augmentor: self.name(),
                        what: format!(
                            "{} means and {} stds for an image of {c} channels",
                            mean.len(),
                            std.len()
                        ),
                    });
                }
                values
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| (v - mean[i % c]) / std[i % c])
                    .collect()
            }
            Normalize::MeanImage { mean } => {
                if mean.shape() != image.shape() {
                    return Err(DataError::Augment {
                        augmentor: self.name(),
                        what: format!("mean image {:?} vs image {:?}", mean.shape(), image.shape()),
                    });
                }
                let mean = mean.as_f32()?;
                values.iter().zip(mean).map(|(&v, &m)| v - m).collect()
            }
        };
        Ok(HostTensor::from_f32(&[h, w, c], out)?)
    }
}
