//! Tests of the reference executor (`backend::reference`): every op against hand-computed values
//! and independent formulations, and the step semantics of `ReferenceSession`.

mod common;
mod conv;
mod elementwise;
mod layout;
mod linalg;
mod nn;
mod pool;
mod reduce;
mod session;
