//! Procedural macros of towerpack: `graph!`, the concise tower-function syntax.
//! It expands to the builder API of `towerpack::dsl`, so rustc type-checks every layer call.

mod blocks;
mod calls;

use proc_macro::TokenStream;
use syn::parse::Parser;

/// Writes the body of a tower function concisely; expands to plain `towerpack::dsl` calls.
///
/// The body is a Rust block (`let`, `for`, `if`, closures, method calls, operators all work as
/// usual) with three additions:
///
/// * **Layer calls with keyword arguments.** A call of a CamelCase function — a single
///   identifier such as `Conv2D`, or a path through a module such as `layers::Conv2D` — is a
///   layer call. Its positional arguments are passed as they are (the layer name, then the
///   input) and every `key = value` argument becomes the builder method `.key(value)`; the call
///   ends with `.build()`:
///
///   ```ignore
///   Conv2D("conv0", image / 128.0, filters = 16, kernel_size = 3)
///   // expands to
///   Conv2D("conv0", image / 128.0).filters(16).kernel_size(3).build()
///   ```
///
///   A misspelled keyword is a compile error at the keyword (`no method named filtrs`).
///   `Some`, `Ok`, `Err` and enum variants (`Padding::Explicit(..)`) are left alone; call other
///   tuple-struct constructors through a path (`self::Pair(..)`) or outside the macro.
///
/// * **Scope blocks.** `scope NAME { ... }` opens a variable scope (and the name scope of the
///   same name) for the block; `scope NAME, reuse = true { ... }` opens it with reuse;
///   `name_scope NAME { ... }` opens a name scope only. `NAME` is any expression giving a
///   `&str` or `String` (`"res1.0"`, `name`, `format!("res{}.{}", s, k)`); wrap a name that
///   contains braces in parentheses. The block's value is the value of the whole construct:
///
///   ```ignore
///   let l = scope "stage1" { Conv2D("conv1", l, filters = 32, kernel_size = 3) };
///   ```
///
/// * **Argscope blocks.** `argscope Conv2D(kernel_size = 3, use_bias = false), BatchNorm(momentum
///   = 0.99) { ... }` sets default arguments of those layers inside the block (tensorpack's
///   `argscope`); arguments given explicitly at a call win.
///
/// Scope and argscope blocks are recognised at the start of a statement or after `=`, `=>` or
/// `,`. Tokens inside other macro calls (`vec![..]`, `format!(..)`) are not rewritten.
///
/// A complete example (a pre-activation residual block as in tensorpack's CIFAR ResNet):
///
/// ```ignore
/// use towerpack::dsl::prelude::*;
/// use towerpack::graph;
///
/// fn residual(name: &str, l: Tensor, increase_dim: bool, first: bool) -> Tensor {
///     let in_channel = l.shape().and_then(|s| s.dims()[3].fixed()).unwrap_or(0);
///     let (out_channel, stride) = if increase_dim { (in_channel * 2, 2) } else { (in_channel, 1) };
///     graph! {
///         scope name {
///             let b1 = if first { l.clone() } else { bn_relu(&l) };
///             let c1 = Conv2D("conv1", b1, filters = out_channel, strides = stride,
///                             activation = bn_relu);
///             let c2 = Conv2D("conv2", c1, filters = out_channel);
///             let shortcut = if increase_dim {
///                 let pooled = AvgPooling("pool", &l, pool_size = 2);
///                 pooled.pad(&[(0, 0), (0, 0), (0, 0), (in_channel / 2, in_channel / 2)])
///             } else {
///                 l.clone()
///             };
///             c2 + shortcut
///         }
///     }
/// }
/// ```
///
/// The examples here are compiled and run as tests in `towerpack::dsl` and `tests/dsl_*.rs`.
#[proc_macro]
pub fn graph(input: TokenStream) -> TokenStream {
    let tokens = blocks::rewrite(proc_macro2::TokenStream::from(input));
    let stmts = match syn::Block::parse_within.parse2(tokens) {
        Ok(stmts) => stmts,
        Err(e) => return e.to_compile_error().into(),
    };
    calls::expand(stmts).into()
}
