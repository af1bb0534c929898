//! Autodiff: numeric gradient checks per op family and the structure of gradient graphs.
//!
//! One test binary per stage (linking the crate once per binary dominates the build); each
//! module is one former `tests/<stage>_<topic>.rs` file.

#[path = "../autodiff_support/mod.rs"]
mod autodiff_support;

mod check_conv;
mod check_elementwise;
mod check_layout;
mod check_reduce;
mod structure;
