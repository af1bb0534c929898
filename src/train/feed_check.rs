//! The check of every value the trainer system feeds into an `Input` node — training batches
//! from an input source, validation batches of an `InferenceRunner`, a predictor's inputs:
//! the dtype must be the input's (never cast silently: cast explicitly with
//! [`CastData`](crate::data::CastData) or [`HostTensor::cast`]), the shape must fit, and a
//! batched input must get at least one example (an empty batch would train on a cost of 0).

use crate::ir::{Dim, TensorType};
use crate::tensor::HostTensor;

use super::error::TrainError;

/// Checks `value`, fed by `who` to input `input` of type `expected`.
pub(crate) fn check_feed(
    who: &str,
    input: &str,
    expected: &TensorType,
    value: &HostTensor,
) -> Result<(), TrainError> {
    let shape = value.shape();
    let fits = value.dtype() == expected.dtype
        && shape.len() == expected.rank()
        && expected
            .shape
            .dims()
            .iter()
            .zip(shape)
            .all(|(d, &n)| match d {
                Dim::Fixed(f) => *f == n,
                Dim::Batch => true,
            });
    if !fits {
        let hint = if value.dtype() != expected.dtype {
            format!(
                "; towerpack does not cast feeds: convert the data to {} (data::CastData, \
                 HostTensor::cast)",
                expected.dtype
            )
        } else {
            String::new()
        };
        return Err(TrainError::FeedMismatch {
            input: input.to_string(),
            who: who.to_string(),
            expected: expected.to_string(),
            got: TensorType::of_host(value).to_string(),
            hint,
        });
    }
    if expected.shape.has_batch() && shape.first() == Some(&0) {
        return Err(TrainError::EmptyBatch {
            input: input.to_string(),
            who: who.to_string(),
            got: TensorType::of_host(value).to_string(),
        });
    }
    Ok(())
}
