//! Graph-level passes of lowering, each a small rewrite of a [`StepGraph`]: extraction of the
//! step's subgraph, expansion of composite ops, common-subexpression elimination, constant folding with algebraic
//! simplification, and dead-code elimination.

mod cse;
mod dce;
mod expand;
mod extract;
mod fold;

pub use cse::cse;
pub use dce::dce;
pub use expand::expand;
pub use extract::{StepGraph, extract};
pub use fold::fold;
