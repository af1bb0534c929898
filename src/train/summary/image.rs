//! Image summaries: turns an image tensor into PNG-encoded `Summary.Image`s, with tensorpack's
//! layout rules (`Monitors.put_image`) and tag naming (`create_image_summary`).

use crate::tensor::{DType, HostTensor};

use super::MonitorError;
use super::proto::ImageProto;

/// The scale pixel values are given in. Values are scaled to `[0, 255]`, clamped, and rounded;
/// NaN becomes 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixelRange {
    /// Values in `[0, 255]` (the usual range of `u8` images; tensorpack's convention).
    Byte,
    /// Values in `[0, 1]` (the usual range of normalized float images).
    Unit,
}

impl PixelRange {
    fn to_byte(self, v: f64) -> u8 {
        let scaled = match self {
            PixelRange::Byte => v,
            PixelRange::Unit => v * 255.0,
        };
        // `as u8` maps NaN to 0 and saturates; clamp first so rounding cannot overflow.
        scaled.clamp(0.0, 255.0).round() as u8
    }
}

/// The `(N, H, W, C)` reading of an image tensor's shape, per tensorpack: `HW` is one grayscale
/// image; `HWC` with `C` in {1, 3, 4} is one image; any other rank-3 shape is `NHW` grayscale.
fn nhwc(tag: &str, shape: &[usize]) -> Result<[usize; 4], MonitorError> {
    let layout = match *shape {
        [h, w] => [1, h, w, 1],
        [h, w, c] if matches!(c, 1 | 3 | 4) => [1, h, w, c],
        [n, h, w] => [n, h, w, 1],
        [n, h, w, c] => [n, h, w, c],
        _ => {
            return Err(MonitorError::BadImage {
                tag: tag.to_string(),
                shape: shape.to_vec(),
                reason: "expected a rank 2, 3 or 4 (NHWC) tensor".into(),
            });
        }
    };
    let [n, h, w, c] = layout;
    let reason = if !(1..=4).contains(&c) {
        Some(format!(
            "{c} channels; expected 1 (gray), 2 (gray+alpha), 3 (RGB) or 4 (RGBA)"
        ))
    } else if n == 0 || h == 0 || w == 0 {
        Some("an image batch needs at least one non-empty image".to_string())
    } else if u32::try_from(h).is_err() || u32::try_from(w).is_err() {
        Some("image side larger than u32::MAX".to_string())
    } else {
        None
    };
    match reason {
        Some(reason) => Err(MonitorError::BadImage {
            tag: tag.to_string(),
            shape: shape.to_vec(),
            reason,
        }),
        None => Ok(layout),
    }
}

/// Encodes every image of `image` (layouts: see [`PixelRange`] and the module doc) as PNG.
///
/// Tags follow tensorpack: `tag` for a batch of one, `tag/0`, `tag/1`, ... otherwise.
pub fn encode_images(
    tag: &str,
    image: &HostTensor,
    range: PixelRange,
) -> Result<Vec<(String, ImageProto)>, MonitorError> {
    if !(image.dtype() == DType::U8 || image.dtype().is_float()) {
        return Err(MonitorError::BadImage {
            tag: tag.to_string(),
            shape: image.shape().to_vec(),
            reason: format!("dtype {} (expected u8 or a float type)", image.dtype()),
        });
    }
    let [n, h, w, c] = nhwc(tag, image.shape())?;
    let pixels: Vec<u8> = (0..image.len())
        .map(|i| range.to_byte(image.storage().get_f64(i)))
        .collect();
    let color = match c {
        1 => png::ColorType::Grayscale,
        2 => png::ColorType::GrayscaleAlpha,
        3 => png::ColorType::Rgb,
        _ => png::ColorType::Rgba,
    };
    let per_image = h * w * c;
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        let mut encoded = Vec::new();
        let png_error = |e: png::EncodingError| MonitorError::Png {
            tag: tag.to_string(),
            detail: e.to_string(),
        };
        // `nhwc` proved h and w fit in u32.
        let mut encoder = png::Encoder::new(&mut encoded, w as u32, h as u32);
        encoder.set_color(color);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(png_error)?;
        writer
            .write_image_data(&pixels[k * per_image..(k + 1) * per_image])
            .map_err(png_error)?;
        writer.finish().map_err(png_error)?;
        let name = if n == 1 {
            tag.to_string()
        } else {
            format!("{tag}/{k}")
        };
        out.push((
            name,
            ImageProto {
                height: h as u32,
                width: w as u32,
                colorspace: c as u32,
                encoded,
            },
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_follow_tensorpack() {
        assert_eq!(nhwc("t", &[4, 5]).ok(), Some([1, 4, 5, 1]));
        assert_eq!(nhwc("t", &[4, 5, 3]).ok(), Some([1, 4, 5, 3]));
        assert_eq!(nhwc("t", &[2, 4, 5]).ok(), Some([2, 4, 5, 1]));
        assert_eq!(nhwc("t", &[2, 4, 5, 4]).ok(), Some([2, 4, 5, 4]));
        assert!(nhwc("t", &[2, 4, 5, 7]).is_err());
        assert!(nhwc("t", &[0, 4, 5, 1]).is_err());
        assert!(nhwc("t", &[5]).is_err());
    }

    #[test]
    fn pixel_scaling_clamps_and_rounds() {
        assert_eq!(PixelRange::Unit.to_byte(1.0), 255);
        assert_eq!(PixelRange::Unit.to_byte(0.5), 128);
        assert_eq!(PixelRange::Unit.to_byte(2.0), 255);
        assert_eq!(PixelRange::Byte.to_byte(-3.0), 0);
        assert_eq!(PixelRange::Byte.to_byte(f64::NAN), 0);
        assert_eq!(PixelRange::Byte.to_byte(254.6), 255);
    }
}
