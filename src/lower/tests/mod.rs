//! Structural tests of lowering on small hand-built graphs: kernel counts, fusion decisions,
//! in-place assigns and memory plans. (Numeric differential tests against the reference
//! executor live with the CPU backend, which runs programs.)

pub(crate) mod structure;
