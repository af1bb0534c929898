//! Pooling layers over NHWC: `MaxPooling`, `AvgPooling` (window `pool_size`, strides default to
//! the window, padding default valid) and `GlobalAvgPooling` (`[N, C]`).

use super::{Pair, layer, nhwc, nonzero_pair, required, run_layer};
use crate::dsl::Tensor;
use crate::dsl::argscope::apply_argscope;
use crate::ir::{Padding, PoolAttrs, PoolKind};

layer! {
    /// Max pooling; `pool_size` is required.
    MaxPooling {
        pool_size: Pair,
        strides: Pair,
        padding: Padding,
    }
}

layer! {
    /// Average pooling (cells outside the input are not counted); `pool_size` is required.
    AvgPooling {
        pool_size: Pair,
        strides: Pair,
        padding: Padding,
    }
}

fn pool(
    kind: PoolKind,
    x: &Tensor,
    pool_size: Option<Pair>,
    strides: Option<Pair>,
    padding: Option<Padding>,
) -> Result<Tensor, String> {
    nhwc(x)?;
    let window = nonzero_pair(required(pool_size, "pool_size")?, "pool_size")?;
    let strides = nonzero_pair(strides.unwrap_or(window), "strides")?;
    let attrs = PoolAttrs {
        kind,
        window: window.0,
        strides: strides.0,
        padding: padding.unwrap_or(Padding::Valid),
    };
    Ok(x.pool(attrs))
}

impl MaxPooling {
    /// Adds the layer.
    pub fn build(mut self) -> Tensor {
        apply_argscope(&mut self);
        let (size, strides, padding) = (self.pool_size, self.strides, self.padding);
        run_layer("MaxPooling", &self.name, self.input, |_, x| {
            pool(PoolKind::Max, x, size, strides, padding)
        })
    }
}

impl AvgPooling {
    /// Adds the layer.
    pub fn build(mut self) -> Tensor {
        apply_argscope(&mut self);
        let (size, strides, padding) = (self.pool_size, self.strides, self.padding);
        run_layer("AvgPooling", &self.name, self.input, |_, x| {
            pool(PoolKind::Avg, x, size, strides, padding)
        })
    }
}

layer! {
    /// Mean over height and width: NHWC to `[N, C]`.
    GlobalAvgPooling {}
}

impl GlobalAvgPooling {
    /// Adds the layer.
    pub fn build(mut self) -> Tensor {
        apply_argscope(&mut self);
        run_layer("GlobalAvgPooling", &self.name, self.input, |_, x| {
            nhwc(x)?;
            Ok(x.reduce_mean(&[1, 2]))
        })
    }
}
