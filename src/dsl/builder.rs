//! The graph [`Builder`] and the symbolic [`Tensor`]s it hands out: the builder owns the graph
//! under construction, its [`VariableStore`] and the first error. Ops never return `Result`:
//! the first failure is recorded with the scoped name and later ops become no-ops (as XLA's
//! `XlaBuilder`); the error surfaces when a tower function returns or the graph is finished.
//!
//! A thread-local stack of default builders (TF's default graph) lets layer code and the free
//! functions of the DSL find the graph and the tower context while a tower function runs.

use super::error::DslError;
use crate::ir::{Graph, NodeId, Op, TensorType, Value, VarId, verify};
use crate::tensor::{DType, HostTensor};
use crate::tower::{TowerContext, TowerError, VariableStore};
use std::cell::{Ref, RefCell, RefMut};
use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::rc::Rc;

/// A symbolic tensor: one output of a node. Cheap to clone.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) builder: Builder,
    /// `None` when the tensor is poisoned by an earlier error.
    pub(crate) slot: Option<(Value, TensorType)>,
}

pub(crate) struct State {
    pub(crate) graph: Graph,
    pub(crate) store: VariableStore,
    finished: bool,
    pub(super) seed: u64,
    /// Variable reads of the current tower, so each tower reads a variable once.
    pub(super) reads: HashMap<VarId, (Value, TensorType)>,
    /// Collection entries added by the current tower.
    pub(super) tower_collections: BTreeMap<String, Vec<Value>>,
}

/// The state and the first error, in separate cells so that an error can be recorded while the
/// graph is borrowed.
pub(crate) struct Shared {
    state: RefCell<State>,
    error: RefCell<Option<DslError>>,
}

/// A graph under construction. Cheap to clone: clones share the same graph.
///
/// Internal invariant: a mutable borrow of the state never spans user code (activations, tower
/// functions, `with_graph` closures), so shared borrows cannot fail; building an op inside
/// [`Builder::with_graph`] is caught and recorded as [`DslError::Reentrant`].
#[derive(Clone)]
pub struct Builder {
    pub(crate) inner: Rc<Shared>,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("graph", &self.st().graph)
            .field("error", &self.error())
            .finish()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

thread_local! {
    static DEFAULT: RefCell<Vec<Builder>> = const { RefCell::new(Vec::new()) };
}

/// The innermost default builder of this thread (set while a tower function runs).
pub fn current_builder() -> Option<Builder> {
    DEFAULT.with(|d| d.borrow().last().cloned())
}

/// Restores the previous default builder when dropped.
pub struct DefaultGuard {
    depth: usize,
    _not_send: PhantomData<Rc<()>>,
}

impl Drop for DefaultGuard {
    fn drop(&mut self) {
        DEFAULT.with(|d| {
            if let Ok(mut stack) = d.try_borrow_mut() {
                stack.truncate(self.depth);
            }
        });
    }
}

impl Builder {
    /// A builder of an empty graph, with graph seed 0.
    pub fn new() -> Builder {
        Builder::from_graph(Graph::new(), 0)
    }

    /// A builder of an empty graph whose random ops derive their seeds from `seed`.
    pub fn with_seed(seed: u64) -> Builder {
        Builder::from_graph(Graph::new(), seed)
    }

    /// Re-opens a finished graph to add to it (e.g. an inference tower built by a callback).
    /// Existing variables are found by name, so reuse works across the two sessions.
    pub fn from_graph(graph: Graph, seed: u64) -> Builder {
        Builder {
            inner: Rc::new(Shared {
                state: RefCell::new(State {
                    graph,
                    store: VariableStore::new(),
                    finished: false,
                    seed,
                    reads: HashMap::new(),
                    tower_collections: BTreeMap::new(),
                }),
                error: RefCell::new(None),
            }),
        }
    }

    /// Makes this the default builder of the thread until the guard drops.
    pub fn as_default(&self) -> DefaultGuard {
        let depth = DEFAULT.with(|d| {
            let mut stack = d.borrow_mut();
            stack.push(self.clone());
            stack.len() - 1
        });
        DefaultGuard {
            depth,
            _not_send: PhantomData,
        }
    }

    /// True when `self` and `other` build the same graph.
    pub fn same_as(&self, other: &Builder) -> bool {
        Rc::ptr_eq(&self.inner, &other.inner)
    }

    /// Shared access to the state (never fails: see the type's invariant).
    pub(super) fn st(&self) -> Ref<'_, State> {
        self.inner.state.borrow()
    }

    /// Mutable access to the state if it is free, recording nothing (for `Drop` impls).
    pub(super) fn try_st_mut(&self) -> Option<RefMut<'_, State>> {
        self.inner.state.try_borrow_mut().ok()
    }

    /// Mutable access to the state; `None` (with [`DslError::Reentrant`] recorded) when the
    /// graph is being read by a `with_graph` closure.
    pub(super) fn st_mut(&self) -> Option<RefMut<'_, State>> {
        match self.inner.state.try_borrow_mut() {
            Ok(st) => Some(st),
            Err(_) => {
                self.record(DslError::Reentrant);
                None
            }
        }
    }

    /// The graph seed.
    pub fn seed(&self) -> u64 {
        self.st().seed
    }

    /// The first error recorded, if any.
    pub fn error(&self) -> Option<DslError> {
        self.inner.error.borrow().clone()
    }

    /// `Err` with the first recorded error, if any.
    pub fn check(&self) -> Result<(), DslError> {
        self.error().map_or(Ok(()), Err)
    }

    /// Runs `f` on the graph as built so far.
    pub fn with_graph<R>(&self, f: impl FnOnce(&Graph) -> R) -> R {
        f(&self.st().graph)
    }

    /// The active tower context, if a tower function is running.
    pub fn tower_context(&self) -> Option<TowerContext> {
        self.st().store.tower().cloned()
    }

    /// The variables created so far by the active tower, in creation order.
    pub fn variables_created_in_tower(&self) -> Vec<VarId> {
        self.st().store.created_in_tower().to_vec()
    }

    /// Full path of the current variable scope.
    pub fn variable_scope_name(&self) -> String {
        self.st().store.variable_scope().to_string()
    }

    /// Full path of the current name scope.
    pub fn name_scope_name(&self) -> String {
        self.st().store.name_scope().to_string()
    }

    /// Takes the finished graph out of the builder, verified. Errors with the first recorded
    /// error; later ops on this builder's tensors are no-ops.
    pub fn finish(&self) -> Result<Graph, DslError> {
        self.check()?;
        let Some(mut st) = self.st_mut() else {
            return Err(DslError::Reentrant);
        };
        if st.finished {
            return Err(DslError::Finished);
        }
        st.finished = true;
        st.store = VariableStore::new();
        let graph = std::mem::take(&mut st.graph);
        verify(&graph)?;
        Ok(graph)
    }

    // ---- errors --------------------------------------------------------------------------

    /// Records `err` if it is the first error; returns a poisoned tensor.
    pub(crate) fn fail(&self, err: DslError) -> Tensor {
        self.record(err);
        self.poisoned()
    }

    pub(crate) fn record(&self, err: DslError) {
        if let Ok(mut first) = self.inner.error.try_borrow_mut()
            && first.is_none()
        {
            *first = Some(err);
        }
    }

    pub(crate) fn tower_fail(&self, at: &str, source: TowerError) -> Tensor {
        self.fail(DslError::Tower {
            at: at.to_string(),
            source: Box::new(source),
        })
    }

    pub(crate) fn poisoned(&self) -> Tensor {
        Tensor {
            builder: self.clone(),
            slot: None,
        }
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.inner.error.borrow().is_some() || self.st().finished
    }

    // ---- nodes ---------------------------------------------------------------------------

    /// The unique scoped name of a new node `base` in the current name scope.
    pub(crate) fn scoped_name(&self, base: &str) -> String {
        let st = self.st();
        let full = crate::tower::join_scope(st.store.name_scope(), base);
        st.graph.unique_name(&full)
    }

    fn check_inputs(&self, base: &str, inputs: &[&Tensor]) -> Option<Vec<Value>> {
        if self.is_poisoned() {
            return None;
        }
        let mut values = Vec::with_capacity(inputs.len());
        for t in inputs {
            if !t.builder.same_as(self) {
                let node = self.scoped_name(base);
                self.record(DslError::MixedBuilders { node });
                return None;
            }
            values.push(t.value()?);
        }
        Some(values)
    }

    /// Adds a node computing `op` on `inputs`; returns all its outputs.
    pub(crate) fn add_outputs(&self, base: &str, op: Op, inputs: &[&Tensor]) -> Vec<Tensor> {
        let Some(values) = self.check_inputs(base, inputs) else {
            return Vec::new();
        };
        let name = self.scoped_name(base);
        let Some(mut st) = self.st_mut() else {
            return Vec::new();
        };
        let device = st.store.tower().and_then(|t| t.device());
        match st.graph.add_node_on(&name, op, &values, device) {
            Ok(id) => {
                let outputs = st.graph.node(id).outputs.clone();
                drop(st);
                outputs
                    .into_iter()
                    .enumerate()
                    .map(|(port, ty)| Tensor {
                        builder: self.clone(),
                        slot: Some((Value::new(id, port as u16), ty)),
                    })
                    .collect()
            }
            Err(e) => {
                drop(st);
                self.record(DslError::Graph(e));
                Vec::new()
            }
        }
    }

    /// Adds a node with one output.
    pub(crate) fn add_op(&self, base: &str, op: Op, inputs: &[&Tensor]) -> Tensor {
        self.add_outputs(base, op, inputs)
            .into_iter()
            .next()
            .unwrap_or_else(|| self.poisoned())
    }

    /// Adds a node without outputs (an `Assign` or `Group`); returns its id.
    pub(crate) fn add_effect(&self, base: &str, op: Op, inputs: &[&Tensor]) -> Option<NodeId> {
        let values = self.check_inputs(base, inputs)?;
        let name = self.scoped_name(base);
        let mut st = self.st_mut()?;
        let device = st.store.tower().and_then(|t| t.device());
        match st.graph.add_node_on(&name, op, &values, device) {
            Ok(id) => Some(id),
            Err(e) => {
                drop(st);
                self.record(DslError::Graph(e));
                None
            }
        }
    }

    /// A constant tensor.
    pub fn constant(&self, value: HostTensor) -> Tensor {
        self.add_op("Const", Op::Constant { value }, &[])
    }

    /// A scalar constant of type `dtype`.
    pub fn scalar(&self, dtype: DType, value: f64) -> Tensor {
        self.constant(HostTensor::scalar(dtype, value))
    }

    /// An input fed at each step, as node `<name scope>/<name>`.
    pub fn input(&self, name: &str, ty: TensorType) -> Tensor {
        let op = Op::Input {
            name: name.to_string(),
            ty,
        };
        self.add_op(name, op, &[])
    }

    /// Appends `t` to `collection`, unless the active tower discards that collection.
    pub fn add_to_collection(&self, collection: &str, t: &Tensor) {
        if let Some(v) = t.value() {
            self.add_value_to_collection(collection, v);
        }
    }

    /// Appends a node without outputs (e.g. an `Assign`) to `collection`.
    pub fn add_node_to_collection(&self, collection: &str, node: NodeId) {
        self.add_value_to_collection(collection, Value::first(node));
    }

    fn add_value_to_collection(&self, collection: &str, v: Value) {
        if self.is_poisoned() {
            return;
        }
        let Some(mut st) = self.st_mut() else {
            return;
        };
        if st.store.tower().is_some_and(|t| t.discards(collection)) {
            return;
        }
        st.graph.add_to_collection(collection, v);
        if st.store.tower().is_some() {
            st.tower_collections
                .entry(collection.to_string())
                .or_default()
                .push(v);
        }
    }

    /// The entries the active tower added to `collection` so far.
    pub fn tower_collection(&self, collection: &str) -> Vec<Value> {
        let st = self.st();
        st.tower_collections
            .get(collection)
            .cloned()
            .unwrap_or_default()
    }

    /// The tensor of an existing value of this graph (poisoned if it has no such output).
    pub fn tensor_of(&self, value: Value) -> Tensor {
        let ty = self.with_graph(|g| g.try_value_type(value).cloned());
        match ty {
            Some(ty) => Tensor {
                builder: self.clone(),
                slot: Some((value, ty)),
            },
            None => self.fail(DslError::Op {
                node: format!("#{}:{}", value.node.index(), value.port),
                message: "no such value in this graph".into(),
            }),
        }
    }
}
