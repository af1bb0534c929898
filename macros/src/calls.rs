//! Rewriting of layer calls: `Layer(pos.., key = value, ..)` becomes
//! `Layer(pos..).key(value)...build()`, with each method spanned at its keyword so that a
//! misspelled keyword is reported where it was written.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Expr, ExprCall, Stmt};

/// Constructors that look like layers but are not.
const NOT_LAYERS: [&str; 6] = ["Some", "Ok", "Err", "Reverse", "Wrapping", "Saturating"];

fn is_camel_case(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && name
            .chars()
            .any(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// True when `call` calls a layer: a CamelCase function named by one identifier or by a path
/// whose previous segment is a module (lowercase), not an enum variant.
fn is_layer_call(call: &ExprCall) -> bool {
    let Expr::Path(p) = &*call.func else {
        return false;
    };
    if p.qself.is_some() {
        return false;
    }
    let segs: Vec<String> = p
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    let Some(last) = segs.last() else {
        return false;
    };
    if !is_camel_case(last) || NOT_LAYERS.contains(&last.as_str()) {
        return false;
    }
    match segs.len() {
        1 => true,
        n => segs[n - 2]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase()),
    }
}

/// A keyword argument: `key = value` with a plain identifier on the left.
fn keyword(arg: &Expr) -> Option<(&syn::Ident, &Expr)> {
    let Expr::Assign(a) = arg else {
        return None;
    };
    let Expr::Path(p) = &*a.left else {
        return None;
    };
    Some((p.path.get_ident()?, &a.right))
}

struct LayerCalls;

impl VisitMut for LayerCalls {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        visit_mut::visit_expr_mut(self, expr);
        let Expr::Call(call) = expr else {
            return;
        };
        let has_keywords = call.args.iter().any(|a| keyword(a).is_some());
        if !is_layer_call(call) {
            if has_keywords {
                let err = quote_spanned!(call.func.span()=>
                    compile_error!("keyword arguments are only for layer calls (CamelCase functions)")
                );
                *expr = syn::parse_quote!(#err);
            }
            return;
        }
        *expr = match expand_layer_call(call) {
            Ok(tokens) => syn::parse_quote!(#tokens),
            Err(err) => syn::parse_quote!(#err),
        };
    }
}

fn expand_layer_call(call: &ExprCall) -> Result<TokenStream, TokenStream> {
    let mut positional = Vec::new();
    let mut setters = Vec::new();
    for arg in &call.args {
        match keyword(arg) {
            Some((key, value)) => setters.push(quote_spanned!(key.span()=> .#key(#value))),
            None if !setters.is_empty() => {
                return Err(quote_spanned!(arg.span()=>
                    compile_error!("positional argument after a keyword argument")
                ));
            }
            None => positional.push(arg.to_token_stream()),
        }
    }
    let func = &call.func;
    let span = call.span();
    Ok(quote_spanned!(span=> #func(#(#positional),*) #(#setters)* .build()))
}

/// Expands the statements of a `graph!` body into a block.
pub fn expand(mut stmts: Vec<Stmt>) -> TokenStream {
    for stmt in &mut stmts {
        LayerCalls.visit_stmt_mut(stmt);
    }
    quote!({ #(#stmts)* })
}
