//! Procedural macros of towerpack: `graph!`, the concise tower-function syntax.
//! It expands to the builder API of `towerpack::dsl`, so rustc type-checks every layer call.

use proc_macro::TokenStream;

/// Placeholder until the DSL lands: expands its body unchanged.
#[proc_macro]
pub fn graph(input: TokenStream) -> TokenStream {
    input
}
