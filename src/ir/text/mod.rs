//! The textual form of the IR: a deterministic printer, a logos lexer and a recursive-descent
//! parser. The grammar, with example programs, is `grammar/towerpack-ir.ebnf`.
//!
//! ```text
//! var @fc/W : f32[4,3] trainable = variance_scaling(scale=1.0, mode=fan_avg, distribution=uniform)
//! %x = input() {name="x"} : f32[N,4]
//! %fc/W/read = variable(@fc/W) : f32[4,3]
//! %fc/MatMul = matmul(%x, %fc/W/read) {transpose_a=false, transpose_b=false} : f32[N,3]
//! ```
//!
//! [`fn@print`] and [`parse`] round-trip exactly: `print(&parse(&print(g), f)?) == print(g)`.

mod attrs;
mod build;
mod error;
mod lexer;
mod literal;
mod ops;
mod printer;
mod syntax;

pub use error::ParseError;

use crate::ir::Graph;

/// The canonical text of `graph`: a header comment, the variables in declaration order, the
/// nodes in [`Graph::topo_order`] with their inferred types, and the collections by name.
///
/// A graph with a cycle (which the verifier rejects) is printed in insertion order with an
/// `# error:` comment; its text does not parse.
pub fn print(graph: &Graph) -> String {
    printer::print_graph(graph)
}

/// Parses the text of a graph, infers its types, checks them against the declared ones and
/// verifies the result. `file` names the source in errors (`file:line:col: message`).
///
/// # Errors
/// The first lexical, syntactic or semantic error, positioned at the token at fault.
pub fn parse(source: &str, file: &str) -> Result<Graph, ParseError> {
    build::parse_graph(source, file)
}
