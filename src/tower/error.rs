//! The typed errors of towers and scopes: one variant per rule of a tower function, plus the
//! get-variable semantics (exists without reuse, missing under reuse, mismatched reuse).

use crate::ir::{IrError, TensorType};
use std::fmt;

/// What kind of name a [`TowerError::ReservedName`] or [`TowerError::InvalidName`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameKind {
    VariableScope,
    NameScope,
    Variable,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::VariableScope => "variable scope",
            NameKind::NameScope => "name scope",
            NameKind::Variable => "variable",
        })
    }
}

/// An error of tower contexts, scopes or variables.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TowerError {
    /// A tower context was entered while another one is active.
    #[error("cannot nest tower contexts: `{inner}` entered inside `{outer}`")]
    NestedTowerContext { outer: String, inner: String },
    /// A training tower was entered inside an open variable scope.
    #[error("cannot enter training tower `{tower}` inside the open variable scope `{scope}`")]
    TowerInsideScope { tower: String, scope: String },
    /// A training tower with its own variable scope was entered under reuse.
    #[error("training tower `{tower}` cannot have a variable scope (`{vs_name}`) under reuse")]
    VariableScopeUnderReuse { tower: String, vs_name: String },
    /// A tower with a variable scope name but no name scope name.
    #[error("tower with variable scope `{vs_name}` needs a non-empty name scope")]
    VariableScopeWithoutNameScope { vs_name: String },
    /// Tower index outside `0..total`.
    #[error("tower `{tower}`: index {index} is not below the tower count {total}")]
    TowerIndex {
        tower: String,
        index: usize,
        total: usize,
    },

    // ---- the rules of a tower function --------------------------------------------------
    /// Rule 4: a new trainable variable in a tower that does not own variables (an inference
    /// tower, or a training tower built under reuse). Use `get_variable`, not `new_variable`.
    #[error(
        "new trainable variable `{variable}` created in tower `{tower}`, which reuses \
         variables and owns none (use get_variable, which respects reuse)"
    )]
    NewTrainableInReuseTower { tower: String, variable: String },
    /// Rule 3: a trainable variable outside the tower's variable scope.
    #[error(
        "trainable variable `{variable}` does not start with the tower's variable scope `{vs_name}/`"
    )]
    VariableOutsideScope { variable: String, vs_name: String },
    /// Rule 3: a trainable variable name that repeats a variable-scope name.
    #[error("trainable variable `{variable}` uses the variable scope name `{scope}` twice")]
    DuplicateScopeName { variable: String, scope: String },
    /// Rule 3: a trainable variable whose name depends on the name scope.
    #[error(
        "trainable variable `{variable}` depends on the name scope `{name_scope}` (variable \
         scope is `{variable_scope}`); variable names must follow variable scopes only"
    )]
    NameScopeDependent {
        variable: String,
        name_scope: String,
        variable_scope: String,
    },
    /// Rule 4: `reuse_variables()` on a scope the tower function did not open.
    #[error(
        "cannot change the reuse of variable scope `{scope}`: the tower function did not open \
         it (open a new scope with reuse instead)"
    )]
    ForeignScopeReuse { scope: String },
    /// Rule 5: a scope or variable name containing the reserved word `tower`.
    #[error("{kind} name `{name}` contains the reserved word `tower`")]
    ReservedName { kind: NameKind, name: String },

    // ---- get-variable semantics ---------------------------------------------------------
    /// `get_variable` without reuse on an existing variable.
    #[error("variable `{name}` already exists; open the scope with reuse to share it")]
    VariableExists { name: String },
    /// `get_variable` under reuse on a variable that does not exist.
    #[error("variable `{name}` does not exist, but the scope reuses variables")]
    VariableMissing { name: String },
    /// `get_variable` under reuse with a different shape or dtype.
    #[error("variable `{name}` exists as {existing}, but {requested} was requested")]
    ReuseMismatch {
        name: String,
        existing: Box<TensorType>,
        requested: Box<TensorType>,
    },
    /// A scope or variable name that is not `/`-separated `[A-Za-z0-9_.-]` segments.
    #[error("{kind} name `{name}` is invalid: use `/`-separated segments of [A-Za-z0-9_.-]")]
    InvalidName { kind: NameKind, name: String },
    /// The graph refused a declaration.
    #[error(transparent)]
    Graph(#[from] IrError),
}
