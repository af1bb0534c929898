//! The naming rules of a tower function, as pure checks on names.
//!
//! Checked in a fixed order so each violation reports the most specific rule: a new trainable in
//! a reuse tower, then outside the tower's variable scope, then name-scope dependence, then a
//! repeated scope name, then the reserved word.

use super::context::TowerContext;
use super::error::{NameKind, TowerError};

/// The reserved word: no scope or variable created by a tower function may contain it.
pub const RESERVED_WORD: &str = "tower";

/// True when `name` contains [`RESERVED_WORD`], ignoring ASCII case.
pub fn contains_reserved_word(name: &str) -> bool {
    name.to_ascii_lowercase().contains(RESERVED_WORD)
}

/// `a/b`, or whichever is non-empty: the path of scope `b` opened inside scope `a`.
pub fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}/{b}"),
    }
}

/// `name` with the `prefix/` removed, if it starts with it (an empty prefix matches all).
pub fn strip_scope<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    if prefix.is_empty() {
        return Some(name);
    }
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('/'))
}

/// Checks a scope name opened inside a tower function.
pub(crate) fn check_scope_name(kind: NameKind, name: &str) -> Result<(), TowerError> {
    if contains_reserved_word(name) {
        return Err(TowerError::ReservedName {
            kind,
            name: name.to_string(),
        });
    }
    Ok(())
}

/// How a new variable got its full name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Naming {
    /// From the variable scope (`get_variable`): the correct way.
    VariableScope,
    /// From the name scope (`new_variable`, TF's `tf.Variable`).
    NameScope,
    /// An absolute name given by the caller.
    Absolute,
}

/// Where a new variable is being created.
pub(crate) struct Site<'a> {
    pub full: &'a str,
    pub naming: Naming,
    pub name_scope: &'a str,
    pub variable_scope: &'a str,
    /// The part of the name chosen inside the tower function (after the tower's own scope).
    pub user_part: &'a str,
    pub trainable: bool,
}

/// Checks a new variable against the rules of the tower `ctx`.
pub(crate) fn check_new_variable(ctx: &TowerContext, site: &Site<'_>) -> Result<(), TowerError> {
    let full = site.full;
    let vs = ctx.vs_name();
    if site.trainable {
        if !ctx.has_own_variables() {
            return Err(TowerError::NewTrainableInReuseTower {
                tower: ctx.display_name(),
                variable: full.to_string(),
            });
        }
        let Some(rest) = strip_scope(full, vs) else {
            return Err(TowerError::VariableOutsideScope {
                variable: full.to_string(),
                vs_name: vs.to_string(),
            });
        };
        let ns = ctx.ns_name();
        let ns_prefixed = !ns.is_empty() && ns != vs && strip_scope(full, ns).is_some();
        if ns_prefixed
            || (site.naming == Naming::NameScope && site.name_scope != site.variable_scope)
        {
            return Err(TowerError::NameScopeDependent {
                variable: full.to_string(),
                name_scope: site.name_scope.to_string(),
                variable_scope: site.variable_scope.to_string(),
            });
        }
        if !vs.is_empty() && rest.split('/').any(|seg| seg == vs) {
            return Err(TowerError::DuplicateScopeName {
                variable: full.to_string(),
                scope: vs.to_string(),
            });
        }
    }
    if contains_reserved_word(site.user_part) {
        return Err(TowerError::ReservedName {
            kind: NameKind::Variable,
            name: full.to_string(),
        });
    }
    Ok(())
}
