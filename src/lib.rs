//! towerpack: a graph-compiling training DSL — tensorpack's tower and trainer system, rebuilt as a
//! compiler.
//!
//! The pipeline, one module per stage, each importing only earlier ones:
//! [`tensor`] (host data) → [`ir`] (op graph) → [`tower`] (towers, scopes, variables) →
//! [`dsl`] (builder and `graph!`) → [`autodiff`] → [`optim`] → [`lower`] (kernel `Program`) →
//! [`backend`] (reference executor, CPU, CUDA) → [`data`] → [`train`] (loop, callbacks).
//! [`atomic_file`] (crash-safe file replacement) serves any stage.
//! See `ARCHITECTURE.md` for the map.

pub mod atomic_file;
pub mod autodiff;
pub mod backend;
pub mod data;
pub mod dsl;
pub mod export;
pub mod ir;
pub mod lower;
pub mod models;
pub mod optim;
pub mod prelude;
pub mod tensor;
pub mod tower;
pub mod train;

pub use towerpack_macros::graph;

// `graph!` expands to `::towerpack::dsl::...` paths; this lets the crate's own models use it.
extern crate self as towerpack;
