//! The example binaries: command lines, interrupts, agreement with the reference executor, and ONNX
//! export.
//!
//! One test binary per stage (linking the crate once per binary dominates the build); each
//! module is one former `tests/<stage>_<topic>.rs` file.

mod cli;
mod export_onnx;
mod interrupt;
mod reference;
