//! The scoped side of the [`Builder`]: entering and leaving towers, variable and name scopes
//! (RAII guards), and variables (get, create, read, assign), all driven through the
//! [`VariableStore`](crate::tower::VariableStore) so the tower rules are checked on the way.

use super::builder::Tensor;
use super::builder::{Builder, DefaultGuard};
use super::error::DslError;
use crate::ir::{NodeId, Op, Value, VarId};
use crate::tensor::DType;
use crate::tower::{ScopeDepth, TowerContext, TowerError, VarSpec};
use std::collections::BTreeMap;

/// Closes a variable or name scope when dropped.
#[must_use = "the scope closes when this guard is dropped"]
pub struct ScopeGuard {
    builder: Builder,
    depth: Option<ScopeDepth>,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        if let (Some(d), Some(mut st)) = (self.depth, self.builder.try_st_mut()) {
            st.store.restore(d);
        }
    }
}

/// What a tower left behind when it exited.
pub(crate) struct TowerRecord {
    pub(crate) ctx: TowerContext,
    pub(crate) created: Vec<VarId>,
    pub(crate) collections: BTreeMap<String, Vec<Value>>,
}

/// Leaves the tower (and restores the default builder) when dropped.
#[must_use = "the tower context ends when this guard is dropped"]
pub struct TowerGuard {
    builder: Builder,
    active: bool,
    _default: DefaultGuard,
}

impl TowerGuard {
    pub(crate) fn exit(mut self) -> Option<TowerRecord> {
        self.active = false;
        self.builder.exit_tower()
    }
}

impl Drop for TowerGuard {
    fn drop(&mut self) {
        if self.active {
            self.builder.exit_tower();
        }
    }
}

impl Builder {
    // ---- towers --------------------------------------------------------------------------

    /// Enters tower `ctx` and makes this builder the default until the guard drops.
    /// Errors when a tower is already active (contexts cannot nest) or `ctx` is invalid.
    pub fn enter_tower(&self, ctx: TowerContext) -> Result<TowerGuard, DslError> {
        self.check()?;
        let at = ctx.display_name();
        let entered = {
            let Some(mut st) = self.st_mut() else {
                return Err(DslError::Reentrant);
            };
            let r = st.store.enter_tower(ctx);
            if r.is_ok() {
                st.reads.clear();
                st.tower_collections.clear();
            }
            r
        };
        if let Err(source) = entered {
            let err = DslError::Tower {
                at,
                source: Box::new(source),
            };
            self.record(err.clone());
            return Err(err);
        }
        Ok(TowerGuard {
            builder: self.clone(),
            active: true,
            _default: self.as_default(),
        })
    }

    fn exit_tower(&self) -> Option<TowerRecord> {
        let mut st = self.st_mut()?;
        let (ctx, created) = st.store.exit_tower()?;
        st.reads.clear();
        let collections = std::mem::take(&mut st.tower_collections);
        Some(TowerRecord {
            ctx,
            created,
            collections,
        })
    }

    // ---- scopes --------------------------------------------------------------------------

    fn scope_guard(&self, name: &str, r: Result<ScopeDepth, TowerError>) -> ScopeGuard {
        match r {
            Ok(depth) => ScopeGuard {
                builder: self.clone(),
                depth: Some(depth),
            },
            Err(source) => {
                let at = crate::tower::join_scope(&self.name_scope_name(), name);
                self.tower_fail(&at, source);
                self.inert_guard()
            }
        }
    }

    fn inert_guard(&self) -> ScopeGuard {
        ScopeGuard {
            builder: self.clone(),
            depth: None,
        }
    }

    /// Opens variable scope `name` and the name scope of the same name; reuse is inherited.
    pub fn variable_scope(&self, name: &str) -> ScopeGuard {
        let Some(r) = self
            .st_mut()
            .map(|mut st| st.store.push_variable_scope(name, None))
        else {
            return self.inert_guard();
        };
        self.scope_guard(name, r)
    }

    /// Opens variable scope `name` with reuse turned on when `reuse` is true (TF1: reuse cannot
    /// be turned off inside a reusing scope, so `false` inherits).
    pub fn variable_scope_with_reuse(&self, name: &str, reuse: bool) -> ScopeGuard {
        let Some(r) = self
            .st_mut()
            .map(|mut st| st.store.push_variable_scope(name, Some(reuse)))
        else {
            return self.inert_guard();
        };
        self.scope_guard(name, r)
    }

    /// Opens name scope `name` only: node names change, variable names do not.
    pub fn name_scope(&self, name: &str) -> ScopeGuard {
        let Some(r) = self.st_mut().map(|mut st| st.store.push_name_scope(name)) else {
            return self.inert_guard();
        };
        self.scope_guard(name, r)
    }

    /// `scope.reuse_variables()` on the current variable scope (only scopes the tower function
    /// opened may change).
    pub fn reuse_variables(&self) {
        let r = self.st_mut().map(|mut st| st.store.reuse_variables());
        if let Some(Err(source)) = r {
            let at = self.variable_scope_name();
            self.tower_fail(&at, source);
        }
    }

    /// Whether `get_variable` in the current scope reuses existing variables.
    pub fn reuse(&self) -> bool {
        self.st().store.reuse()
    }

    // ---- variables -----------------------------------------------------------------------

    /// Reads variable `id` in the current tower (once per tower: repeated reads share a node).
    pub fn read_variable(&self, id: VarId) -> Tensor {
        if self.is_poisoned() {
            return self.poisoned();
        }
        let cached = self.st().reads.get(&id).cloned();
        if let Some(slot) = cached {
            return Tensor {
                builder: self.clone(),
                slot: Some(slot),
            };
        }
        let (name, device) = {
            let st = self.st();
            let Some(def) = st.graph.variables().get(id.0 as usize) else {
                drop(st);
                return self.fail(DslError::Op {
                    node: format!("variable #{}", id.0),
                    message: "unknown variable".into(),
                });
            };
            let (ns, vs) = st
                .store
                .tower()
                .map_or(("", ""), |t| (t.ns_name(), t.vs_name()));
            let rel = crate::tower::strip_scope_prefix(&def.name, vs).unwrap_or(&def.name);
            let name = st.graph.unique_name(&crate::tower::join_scope(ns, rel));
            (name, st.store.tower().and_then(|t| t.device()))
        };
        let Some(mut st) = self.st_mut() else {
            return self.poisoned();
        };
        match st
            .graph
            .add_node_on(&name, Op::Variable { var: id }, &[], device)
        {
            Ok(node) => {
                let slot = (Value::first(node), st.graph.node(node).outputs[0].clone());
                st.reads.insert(id, slot.clone());
                drop(st);
                Tensor {
                    builder: self.clone(),
                    slot: Some(slot),
                }
            }
            Err(e) => {
                drop(st);
                self.fail(DslError::Graph(e))
            }
        }
    }

    fn variable_result(&self, name: &str, r: Result<VarId, TowerError>) -> Tensor {
        match r {
            Ok(id) => self.read_variable(id),
            Err(source) => {
                let at = crate::tower::join_scope(&self.variable_scope_name(), name);
                self.tower_fail(&at, source)
            }
        }
    }

    /// `tf.get_variable`: `<variable scope>/<name>`, created or (under reuse) shared; returns
    /// its read in the current tower.
    pub fn get_variable(&self, name: &str, spec: &VarSpec) -> Tensor {
        if self.is_poisoned() {
            return self.poisoned();
        }
        let r = {
            let Some(mut guard) = self.st_mut() else {
                return self.poisoned();
            };
            let st = &mut *guard;
            st.store.get_variable(&mut st.graph, name, spec)
        };
        self.variable_result(name, r)
    }

    /// `get_variable` by an absolute name, outside the current variable scope.
    pub fn get_variable_by_full_name(&self, full_name: &str, spec: &VarSpec) -> Tensor {
        if self.is_poisoned() {
            return self.poisoned();
        }
        let r = {
            let Some(mut guard) = self.st_mut() else {
                return self.poisoned();
            };
            let st = &mut *guard;
            st.store
                .get_variable_by_full_name(&mut st.graph, full_name, spec)
        };
        self.variable_result(full_name, r)
    }

    /// TF's `tf.Variable`: always a new variable named after the current name scope. Use it
    /// for per-tower non-trainable state; trainable ones break the tower rules.
    pub fn new_variable(&self, name: &str, spec: &VarSpec) -> Tensor {
        if self.is_poisoned() {
            return self.poisoned();
        }
        let r = {
            let Some(mut guard) = self.st_mut() else {
                return self.poisoned();
            };
            let st = &mut *guard;
            st.store.new_variable(&mut st.graph, name, spec)
        };
        self.variable_result(name, r)
    }

    /// The `global_step` variable (`i64` scalar, non-trainable), created on first use.
    pub fn global_step(&self) -> Tensor {
        if self.is_poisoned() {
            return self.poisoned();
        }
        let spec = VarSpec::new(&[]).dtype(DType::I64).trainable(false);
        let r = {
            let Some(mut guard) = self.st_mut() else {
                return self.poisoned();
            };
            let st = &mut *guard;
            st.store
                .get_or_create_global(&mut st.graph, "global_step", &spec)
        };
        self.variable_result("global_step", r)
    }

    /// Sets the variable read by `target` to `value` when the step ends; returns the `Assign`.
    pub fn assign(&self, target: &Tensor, value: &Tensor) -> Option<NodeId> {
        self.assign_as("Assign", target, value)
    }

    pub(crate) fn assign_as(&self, base: &str, target: &Tensor, value: &Tensor) -> Option<NodeId> {
        let node = target.node()?;
        let var = self.with_graph(|g| g.try_node(node).and_then(|n| n.op.variable()));
        let Some(var) = var else {
            let name = target.name().unwrap_or_default();
            self.record(DslError::Op {
                node: self.scoped_name(base),
                message: format!("assign target `{name}` is not a variable"),
            });
            return None;
        };
        self.add_effect(base, Op::Assign { var }, &[value])
    }
}
