//! The reference executor: runs any verified graph op by op on the CPU. It is the oracle.
//!
//! Written for clarity, not speed: every kernel is a plain loop over an explicit index map or
//! geometry. Floats are carried in `f64` and each op's result is rounded to its dtype, so in
//! [`Precision::F32`] every op is the correctly rounded value of its exact result (up to `f64`
//! error); [`Precision::F64`] skips the rounding and returns floats as `f64` tensors, for
//! finite-difference gradient checks. Elementwise ops evaluate [`crate::ir::scalar`], the
//! shared definition of their semantics. Same inputs give the same bits.

mod array;
mod conv;
mod elementwise;
mod eval;
mod layout;
mod matmul;
mod nn;
mod pool;
mod reduce;
mod session;
mod step;

pub use session::ReferenceSession;
pub use step::evaluate;

/// The precision the reference executor computes float ops at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Every float op is computed in `f64` and rounded to the graph's dtype (`f32`, `f16`,
    /// `bf16`; `f64` stays `f64`). Fetched values have the graph's dtypes.
    #[default]
    F32,
    /// Every float op is computed in `f64` and not rounded; inputs and variables are widened.
    /// Fetched float values (and variables read back) are `f64` tensors whatever the graph's
    /// float dtype, and float feeds and variable writes may be of any float dtype.
    F64,
}
