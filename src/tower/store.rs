//! The `VariableStore`: variable scopes (a stack with reuse flags), name scopes, the active
//! tower, and TF's get-variable semantics on top of the graph's variable table.
//!
//! Every variable a tower function creates passes the rules of [`super::rules`] here, so a
//! violation is a typed error at the point of creation rather than a log line.

use super::context::TowerContext;
use super::error::{NameKind, TowerError};
use super::rules::{Naming, Site, check_new_variable, check_scope_name, join, strip_scope};
use crate::ir::{
    Graph, Initializer, Shape, TensorType, VarFlags, VarId, VariableDef, is_valid_name,
};
use crate::tensor::DType;

/// What a variable should look like: shape, dtype, initializer and collections.
#[derive(Clone, Debug, PartialEq)]
pub struct VarSpec {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub init: Initializer,
    /// In TRAINABLE_VARIABLES.
    pub trainable: bool,
    /// In MODEL_VARIABLES (cleared for replica-local copies).
    pub model: bool,
}

impl VarSpec {
    /// A trainable `f32` variable of `shape`, zero-initialized.
    pub fn new(shape: &[usize]) -> VarSpec {
        VarSpec {
            shape: shape.to_vec(),
            dtype: DType::F32,
            init: Initializer::Zeros,
            trainable: true,
            model: false,
        }
    }

    /// Sets the initializer.
    pub fn init(mut self, init: Initializer) -> VarSpec {
        self.init = init;
        self
    }

    /// Sets the element type.
    pub fn dtype(mut self, dtype: DType) -> VarSpec {
        self.dtype = dtype;
        self
    }

    /// Sets whether the variable is trainable.
    pub fn trainable(mut self, trainable: bool) -> VarSpec {
        self.trainable = trainable;
        self
    }

    /// Sets whether the variable is in MODEL_VARIABLES.
    pub fn model(mut self, model: bool) -> VarSpec {
        self.model = model;
        self
    }

    /// The static type of the variable.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, Shape::fixed(&self.shape))
    }
}

#[derive(Clone, Debug)]
struct VarScope {
    /// Full path of the scope.
    name: String,
    reuse: bool,
}

#[derive(Clone, Debug)]
struct ActiveTower {
    ctx: TowerContext,
    /// Number of variable scopes when the tower function started (its own scope included).
    var_base: usize,
    name_base: usize,
    created: Vec<VarId>,
}

/// A position in the scope stacks, to return to when a scope closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScopeDepth {
    var: usize,
    name: usize,
}

/// Variable scopes, name scopes and the active tower of one graph under construction.
#[derive(Clone, Debug, Default)]
pub struct VariableStore {
    var_scopes: Vec<VarScope>,
    name_scopes: Vec<String>,
    tower: Option<ActiveTower>,
}

impl VariableStore {
    /// An empty store: root scopes, no reuse, no tower.
    pub fn new() -> VariableStore {
        VariableStore::default()
    }

    /// The active tower context, if any.
    pub fn tower(&self) -> Option<&TowerContext> {
        self.tower.as_ref().map(|t| &t.ctx)
    }

    /// Full path of the current variable scope (empty at the root).
    pub fn variable_scope(&self) -> &str {
        self.var_scopes.last().map_or("", |s| s.name.as_str())
    }

    /// Full path of the current name scope (empty at the root).
    pub fn name_scope(&self) -> &str {
        self.name_scopes.last().map_or("", |s| s.as_str())
    }

    /// Whether `get_variable` in the current scope reuses existing variables.
    pub fn reuse(&self) -> bool {
        self.var_scopes.last().is_some_and(|s| s.reuse)
    }

    /// The current depth of both scope stacks.
    pub fn depth(&self) -> ScopeDepth {
        ScopeDepth {
            var: self.var_scopes.len(),
            name: self.name_scopes.len(),
        }
    }

    /// Closes every scope opened after `depth`.
    pub fn restore(&mut self, depth: ScopeDepth) {
        self.var_scopes.truncate(depth.var);
        self.name_scopes.truncate(depth.name);
    }

    /// Enters tower `ctx`: opens its variable scope (with its reuse) and its name scope.
    ///
    /// Errors when a tower is already active, the context is inconsistent, or a training
    /// tower is entered inside an open variable scope.
    pub fn enter_tower(&mut self, ctx: TowerContext) -> Result<(), TowerError> {
        if let Some(t) = &self.tower {
            return Err(TowerError::NestedTowerContext {
                outer: t.ctx.display_name(),
                inner: ctx.display_name(),
            });
        }
        ctx.validate()?;
        if ctx.is_training() && !self.variable_scope().is_empty() {
            return Err(TowerError::TowerInsideScope {
                tower: ctx.display_name(),
                scope: self.variable_scope().to_string(),
            });
        }
        for (kind, name) in [
            (NameKind::NameScope, ctx.ns_name()),
            (NameKind::VariableScope, ctx.vs_name()),
        ] {
            if !name.is_empty() && !is_valid_name(name) {
                return Err(TowerError::InvalidName {
                    kind,
                    name: name.to_string(),
                });
            }
        }
        let vs = join(self.variable_scope(), ctx.vs_name());
        let reuse = self.reuse() || ctx.is_under_reuse();
        self.var_scopes.push(VarScope { name: vs, reuse });
        let ns = join(self.name_scope(), ctx.ns_name());
        self.name_scopes.push(ns);
        self.tower = Some(ActiveTower {
            ctx,
            var_base: self.var_scopes.len(),
            name_base: self.name_scopes.len(),
            created: Vec::new(),
        });
        Ok(())
    }

    /// Leaves the active tower, closing its scopes; returns its context and the variables it
    /// created, in creation order.
    pub fn exit_tower(&mut self) -> Option<(TowerContext, Vec<VarId>)> {
        let t = self.tower.take()?;
        self.var_scopes.truncate(t.var_base.saturating_sub(1));
        self.name_scopes.truncate(t.name_base.saturating_sub(1));
        Some((t.ctx, t.created))
    }

    /// The variables created so far by the active tower.
    pub fn created_in_tower(&self) -> &[VarId] {
        self.tower.as_ref().map_or(&[], |t| t.created.as_slice())
    }

    fn in_tower_function(&self) -> bool {
        self.tower.is_some()
    }

    fn check_segment(&self, kind: NameKind, name: &str) -> Result<(), TowerError> {
        if !is_valid_name(name) {
            return Err(TowerError::InvalidName {
                kind,
                name: name.to_string(),
            });
        }
        if self.in_tower_function() {
            check_scope_name(kind, name)?;
        }
        Ok(())
    }

    /// Opens variable scope `name` (and the name scope of the same name), like
    /// `tf.variable_scope(name, reuse=...)`: `reuse = Some(true)` turns reuse on for it and its
    /// children; `None` or `Some(false)` inherits the parent's reuse (as TF1 does).
    pub fn push_variable_scope(
        &mut self,
        name: &str,
        reuse: Option<bool>,
    ) -> Result<ScopeDepth, TowerError> {
        self.check_segment(NameKind::VariableScope, name)?;
        let depth = self.depth();
        let reuse = self.reuse() || reuse == Some(true);
        let full = join(self.variable_scope(), name);
        self.var_scopes.push(VarScope { name: full, reuse });
        let ns = join(self.name_scope(), name);
        self.name_scopes.push(ns);
        Ok(depth)
    }

    /// Opens name scope `name` only (node names change, variable names do not).
    pub fn push_name_scope(&mut self, name: &str) -> Result<ScopeDepth, TowerError> {
        self.check_segment(NameKind::NameScope, name)?;
        let depth = self.depth();
        let ns = join(self.name_scope(), name);
        self.name_scopes.push(ns);
        Ok(depth)
    }

    /// `scope.reuse_variables()` on the current variable scope. Inside a tower function only
    /// scopes the function opened itself may change (rule 4).
    pub fn reuse_variables(&mut self) -> Result<(), TowerError> {
        let len = self.var_scopes.len();
        if let Some(t) = &self.tower
            && len <= t.var_base
        {
            return Err(TowerError::ForeignScopeReuse {
                scope: self.variable_scope().to_string(),
            });
        }
        match self.var_scopes.last_mut() {
            Some(s) => s.reuse = true,
            // The root scope outside any tower: reuse from here on.
            None => self.var_scopes.push(VarScope {
                name: String::new(),
                reuse: true,
            }),
        }
        Ok(())
    }

    /// `tf.get_variable(name)`: the variable `<variable scope>/<name>`, created unless the
    /// scope reuses variables; under reuse it must exist with the same shape and dtype.
    pub fn get_variable(
        &mut self,
        graph: &mut Graph,
        name: &str,
        spec: &VarSpec,
    ) -> Result<VarId, TowerError> {
        if !is_valid_name(name) {
            return Err(TowerError::InvalidName {
                kind: NameKind::Variable,
                name: name.to_string(),
            });
        }
        let full = join(self.variable_scope(), name);
        self.get_or_create(graph, &full, spec, Naming::VariableScope)
    }

    /// `get_variable` by an absolute name, ignoring the current variable scope (the reuse of
    /// the current scope still applies). Inside a tower the rules still apply to the name.
    pub fn get_variable_by_full_name(
        &mut self,
        graph: &mut Graph,
        full_name: &str,
        spec: &VarSpec,
    ) -> Result<VarId, TowerError> {
        if !is_valid_name(full_name) {
            return Err(TowerError::InvalidName {
                kind: NameKind::Variable,
                name: full_name.to_string(),
            });
        }
        self.get_or_create(graph, full_name, spec, Naming::Absolute)
    }

    /// TF's `tf.Variable(name=...)`: always creates a new variable named after the current
    /// *name scope*, made unique with `_1`, `_2`, ...; ignores reuse. Fine for per-tower
    /// non-trainable state; for trainable variables it breaks the tower rules.
    pub fn new_variable(
        &mut self,
        graph: &mut Graph,
        name: &str,
        spec: &VarSpec,
    ) -> Result<VarId, TowerError> {
        if !is_valid_name(name) {
            return Err(TowerError::InvalidName {
                kind: NameKind::Variable,
                name: name.to_string(),
            });
        }
        let base = join(self.name_scope(), name);
        let full = if graph.find_variable(&base).is_none() {
            base
        } else {
            (1..)
                .map(|i| format!("{base}_{i}"))
                .find(|n| graph.find_variable(n).is_none())
                .unwrap_or(base)
        };
        self.create(graph, &full, spec, Naming::NameScope)
    }

    /// A graph-global variable such as `global_step`: fetched by its absolute name if it
    /// exists (same type required), otherwise created outside every scope and tower rule.
    pub fn get_or_create_global(
        &mut self,
        graph: &mut Graph,
        name: &str,
        spec: &VarSpec,
    ) -> Result<VarId, TowerError> {
        if let Some(id) = graph.find_variable(name) {
            return check_same_type(graph, id, spec);
        }
        let def = VariableDef {
            name: name.to_string(),
            ty: spec.ty(),
            init: spec.init.clone(),
            flags: VarFlags {
                trainable: spec.trainable,
                model: spec.model,
                local: false,
            },
        };
        Ok(graph.declare_variable(def)?)
    }

    fn get_or_create(
        &mut self,
        graph: &mut Graph,
        full: &str,
        spec: &VarSpec,
        naming: Naming,
    ) -> Result<VarId, TowerError> {
        match graph.find_variable(full) {
            Some(_) if !self.reuse() => Err(TowerError::VariableExists {
                name: full.to_string(),
            }),
            Some(id) => check_same_type(graph, id, spec),
            None if self.reuse() => Err(TowerError::VariableMissing {
                name: full.to_string(),
            }),
            None => self.create(graph, full, spec, naming),
        }
    }

    fn create(
        &mut self,
        graph: &mut Graph,
        full: &str,
        spec: &VarSpec,
        naming: Naming,
    ) -> Result<VarId, TowerError> {
        let mut flags = VarFlags {
            trainable: spec.trainable,
            model: spec.model,
            local: false,
        };
        if let Some(t) = &self.tower {
            let own_prefix = match naming {
                Naming::NameScope => t.ctx.ns_name(),
                Naming::VariableScope | Naming::Absolute => t.ctx.vs_name(),
            };
            let site = Site {
                full,
                naming,
                name_scope: self.name_scope(),
                variable_scope: self.variable_scope(),
                user_part: strip_scope(full, own_prefix).unwrap_or(full),
                trainable: spec.trainable,
            };
            check_new_variable(&t.ctx, &site)?;
            if t.ctx.creates_local_variables() {
                flags.local = true;
                flags.model = false;
            }
        }
        let id = graph.declare_variable(VariableDef {
            name: full.to_string(),
            ty: spec.ty(),
            init: spec.init.clone(),
            flags,
        })?;
        if let Some(t) = &mut self.tower {
            t.created.push(id);
        }
        Ok(id)
    }
}

fn check_same_type(graph: &Graph, id: VarId, spec: &VarSpec) -> Result<VarId, TowerError> {
    let def = graph.variable(id);
    let requested = spec.ty();
    if def.ty != requested {
        return Err(TowerError::ReuseMismatch {
            name: def.name.clone(),
            existing: Box::new(def.ty.clone()),
            requested: Box::new(requested),
        });
    }
    Ok(id)
}
