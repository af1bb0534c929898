//! `CastData`: converts one component of every datapoint to another dtype — the explicit cast
//! a user asks for when a flow's dtype differs from the model's input (towerpack never casts a
//! feed silently: u8 pixels fed to an `f32` input are an error naming the input).

use super::DataFlow;
use super::flow::forward_data_flow;
use super::map::MapDataComponent;
use crate::tensor::DType;

/// Casts component `component` of every datapoint to `dtype` (values converted as
/// [`HostTensor::cast`](crate::tensor::HostTensor::cast) does: `255u8` becomes `255.0f32`,
/// not `1.0`; scale with [`MapDataComponent`] if the model expects `[0, 1]`). Its state is that
/// of the map inside, so it resumes exactly.
pub struct CastData(MapDataComponent);

forward_data_flow!(CastData);

impl CastData {
    /// Casts component `component` (0-based) of `inner`'s datapoints to `dtype`; a datapoint
    /// without that component is an error naming the index.
    pub fn new(inner: impl DataFlow + 'static, component: usize, dtype: DType) -> CastData {
        CastData(MapDataComponent::new(inner, component, move |value, _| {
            Ok(value.cast(dtype))
        }))
    }
}
