//! Token-level rewriting of the block forms that are not Rust syntax: `scope NAME { .. }`,
//! `scope NAME, reuse = EXPR { .. }`, `name_scope NAME { .. }` and
//! `argscope Layer(k = v, ..), .. { .. }`. Each becomes a Rust block holding an RAII guard.

use proc_macro2::{Delimiter, Group, Ident, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned};

/// Rewrites every block form in `input`, recursively inside groups.
pub fn rewrite(input: TokenStream) -> TokenStream {
    let tokens: Vec<TokenTree> = input.into_iter().collect();
    let mut out: Vec<TokenTree> = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        if let Some((expansion, next)) = block_form(&tokens, i, out.last()) {
            out.extend(expansion);
            i = next;
            continue;
        }
        out.push(match &tokens[i] {
            TokenTree::Group(g) => {
                let mut ng = Group::new(g.delimiter(), rewrite(g.stream()));
                ng.set_span(g.span());
                TokenTree::Group(ng)
            }
            t => t.clone(),
        });
        i += 1;
    }
    out.into_iter().collect()
}

/// True when a block form may start after `prev`: at the start of a statement or expression.
fn at_statement_start(prev: Option<&TokenTree>) -> bool {
    match prev {
        None => true,
        Some(TokenTree::Punct(p)) => matches!(p.as_char(), ';' | '=' | ',' | '>'),
        Some(TokenTree::Group(g)) => g.delimiter() == Delimiter::Brace,
        _ => false,
    }
}

fn header_starts_well(t: &TokenTree) -> bool {
    match t {
        TokenTree::Literal(_) | TokenTree::Ident(_) => true,
        TokenTree::Group(g) => g.delimiter() == Delimiter::Parenthesis,
        TokenTree::Punct(p) => p.as_char() == '&',
    }
}

/// Recognises a block form starting at `tokens[i]`; returns its expansion and the index after it.
fn block_form(
    tokens: &[TokenTree],
    i: usize,
    prev: Option<&TokenTree>,
) -> Option<(TokenStream, usize)> {
    let TokenTree::Ident(kw) = &tokens[i] else {
        return None;
    };
    let kind = kw.to_string();
    if !matches!(kind.as_str(), "scope" | "name_scope" | "argscope") || !at_statement_start(prev) {
        return None;
    }
    if !header_starts_well(tokens.get(i + 1)?) {
        return None;
    }
    // The header runs to the first brace group at this level; a `;` means this is not ours.
    let mut j = i + 1;
    let body = loop {
        match tokens.get(j)? {
            TokenTree::Group(g) if g.delimiter() == Delimiter::Brace => break g,
            TokenTree::Punct(p) if p.as_char() == ';' => return None,
            _ => j += 1,
        }
    };
    let header: Vec<TokenTree> = tokens[i + 1..j].to_vec();
    let body = rewrite(body.stream());
    let expansion = match kind.as_str() {
        "argscope" => argscope_block(kw, &header, body),
        _ => scope_block(kw, &kind, &header, body),
    };
    Some((expansion, j + 1))
}

/// Splits `tokens` at top-level commas.
fn split_commas(tokens: &[TokenTree]) -> Vec<Vec<TokenTree>> {
    let mut parts = vec![Vec::new()];
    for t in tokens {
        match t {
            TokenTree::Punct(p) if p.as_char() == ',' => parts.push(Vec::new()),
            t => parts
                .last_mut()
                .map(|part| part.push(t.clone()))
                .unwrap_or(()),
        }
    }
    parts.retain(|p| !p.is_empty());
    parts
}

fn scope_block(kw: &Ident, kind: &str, header: &[TokenTree], body: TokenStream) -> TokenStream {
    let span = kw.span();
    let parts = split_commas(header);
    let Some((name, options)) = parts.split_first() else {
        return quote_spanned!(span=> compile_error!("expected a scope name"));
    };
    let name: TokenStream = name.iter().cloned().collect();
    let name = quote!(::core::convert::AsRef::<str>::as_ref(&(#name)));
    let guard = Ident::new("__towerpack_scope", Span::mixed_site());
    let mut reuse: Option<TokenStream> = None;
    for opt in options {
        match opt.as_slice() {
            [TokenTree::Ident(k), TokenTree::Punct(eq), rest @ ..]
                if k == "reuse" && eq.as_char() == '=' && kind == "scope" && !rest.is_empty() =>
            {
                reuse = Some(rest.iter().cloned().collect());
            }
            _ => {
                return quote_spanned!(span=>
                    compile_error!("expected `scope NAME { .. }` or `scope NAME, reuse = EXPR { .. }`")
                );
            }
        }
    }
    let open = match (kind, reuse) {
        ("name_scope", _) => quote_spanned!(span=> ::towerpack::dsl::name_scope(#name)),
        (_, Some(r)) => {
            quote_spanned!(span=> ::towerpack::dsl::variable_scope_with_reuse(#name, #r))
        }
        _ => quote_spanned!(span=> ::towerpack::dsl::variable_scope(#name)),
    };
    quote_spanned! {span=>
        {
            let #guard = #open;
            #body
        }
    }
}

fn argscope_block(kw: &Ident, header: &[TokenTree], body: TokenStream) -> TokenStream {
    let span = kw.span();
    let mut guards = Vec::new();
    for (k, part) in split_commas(header).iter().enumerate() {
        let [TokenTree::Ident(layer), TokenTree::Group(args)] = part.as_slice() else {
            return quote_spanned!(span=>
                compile_error!("expected `argscope Layer(key = value, ..), .. { .. }`")
            );
        };
        if args.delimiter() != Delimiter::Parenthesis {
            return quote_spanned!(args.span()=> compile_error!("expected `(key = value, ..)`"));
        }
        let mut setters = Vec::new();
        for kv in split_commas(&args.stream().into_iter().collect::<Vec<_>>()) {
            match kv.as_slice() {
                [TokenTree::Ident(key), TokenTree::Punct(eq), value @ ..]
                    if eq.as_char() == '=' && !value.is_empty() =>
                {
                    let value: TokenStream = value.iter().cloned().collect();
                    setters.push(quote_spanned!(key.span()=> .#key(#value)));
                }
                _ => {
                    return quote_spanned!(args.span()=>
                        compile_error!("argscope arguments are `key = value`")
                    );
                }
            }
        }
        let guard = Ident::new(&format!("__towerpack_argscope{k}"), Span::mixed_site());
        guards.push(quote_spanned! {layer.span()=>
            let #guard = ::towerpack::dsl::argscope(#layer::defaults() #(#setters)*);
        });
    }
    quote_spanned! {span=>
        {
            #(#guards)*
            #body
        }
    }
}
