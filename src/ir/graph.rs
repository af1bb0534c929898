//! The op graph: a petgraph `StableGraph` of typed nodes, its variable table and collections.
//!
//! Data edges carry `(producer port, consumer slot)`; control edges order side effects (a `Group`
//! depends on the assigns it gathers). Node types are inferred when a node is added, so a graph
//! is well-typed at every moment of its construction.

use super::error::IrError;
use super::infer::infer_types;
use super::op::{Initializer, Op, VarId};
use super::shape::TensorType;
use super::variable::VariableDef;
use petgraph::Direction;
use petgraph::stable_graph::{NodeIndex, StableGraph};
use petgraph::visit::EdgeRef;
use smallvec::SmallVec;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt;

/// Identifies a node of a [`Graph`]; stays valid when other nodes are removed.
pub type NodeId = NodeIndex<u32>;

/// One output of a node: the unit of data flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value {
    pub node: NodeId,
    pub port: u16,
}

impl Value {
    /// Output `port` of `node`.
    pub fn new(node: NodeId, port: u16) -> Value {
        Value { node, port }
    }

    /// The first (usually only) output of `node`.
    pub fn first(node: NodeId) -> Value {
        Value { node, port: 0 }
    }
}

/// An edge of the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Edge {
    /// Output `port` of the source feeds input `slot` of the target.
    Data { port: u16, slot: u16 },
    /// The target runs after the source (side-effect ordering only).
    Control,
}

/// A node: its scoped name, its op, its inferred output types and an optional logical device
/// (the tower it was built for; lowering maps it onto a real device).
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub outputs: SmallVec<[TensorType; 1]>,
    pub device: Option<u16>,
}

/// The op graph.
#[derive(Clone, Default)]
pub struct Graph {
    graph: StableGraph<Node, Edge, petgraph::Directed, u32>,
    names: HashMap<String, NodeId>,
    variables: Vec<VariableDef>,
    variable_names: HashMap<String, VarId>,
    collections: BTreeMap<String, Vec<Value>>,
}

/// True when `name` is a valid node or variable name: non-empty `/`-separated segments of
/// `[A-Za-z0-9_.-]`.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('/').all(|seg| {
            !seg.is_empty()
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        })
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    // ---- construction ------------------------------------------------------------------

    /// Adds a node computing `op` on `inputs`, inferring its output types.
    ///
    /// Errors when the name is taken or invalid, an input does not exist, or the types do not
    /// fit the op (the error names the node, the op and the input types).
    pub fn add_node(&mut self, name: &str, op: Op, inputs: &[Value]) -> Result<NodeId, IrError> {
        self.add_node_on(name, op, inputs, None)
    }

    /// [`Graph::add_node`] with a logical device.
    pub fn add_node_on(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[Value],
        device: Option<u16>,
    ) -> Result<NodeId, IrError> {
        self.check_new_name(name)?;
        let mut input_types: SmallVec<[&TensorType; 4]> = SmallVec::new();
        for (slot, v) in inputs.iter().enumerate() {
            let ty = self
                .try_value_type(*v)
                .ok_or_else(|| IrError::UnknownValue {
                    node: name.to_string(),
                    slot,
                })?;
            input_types.push(ty);
        }
        let outputs =
            infer_types(&op, &input_types, &self.variables).map_err(|message| IrError::Type {
                node: name.to_string(),
                op: op.kind_name().to_string(),
                inputs: input_types.iter().map(|t| t.to_string()).collect(),
                message,
            })?;
        drop(input_types);
        let id = self.graph.add_node(Node {
            name: name.to_string(),
            op,
            outputs,
            device,
        });
        for (slot, v) in inputs.iter().enumerate() {
            self.graph.add_edge(
                v.node,
                id,
                Edge::Data {
                    port: v.port,
                    slot: slot as u16,
                },
            );
        }
        self.names.insert(name.to_string(), id);
        Ok(id)
    }

    /// Adds a `Group` node that runs after every node of `deps`.
    pub fn add_group(&mut self, name: &str, deps: &[NodeId]) -> Result<NodeId, IrError> {
        let id = self.add_node(name, Op::Group, &[])?;
        for &d in deps {
            self.add_control_edge(d, id)?;
        }
        Ok(id)
    }

    /// Makes `to` run after `from`.
    pub fn add_control_edge(&mut self, from: NodeId, to: NodeId) -> Result<(), IrError> {
        for id in [from, to] {
            if !self.graph.contains_node(id) {
                return Err(IrError::UnknownNode(format!("#{}", id.index())));
            }
        }
        self.graph.add_edge(from, to, Edge::Control);
        Ok(())
    }

    /// Declares a variable; errors when its name is taken or invalid.
    pub fn declare_variable(&mut self, def: VariableDef) -> Result<VarId, IrError> {
        if !is_valid_name(&def.name) {
            return Err(IrError::InvalidName {
                name: def.name.clone(),
            });
        }
        if self.variable_names.contains_key(&def.name) {
            return Err(IrError::DuplicateVariable {
                name: def.name.clone(),
            });
        }
        if def.ty.shape.to_static().is_none() {
            return Err(IrError::SymbolicVariable {
                name: def.name.clone(),
                ty: def.ty.to_string(),
            });
        }
        if let Initializer::Value(v) = &def.init {
            let expected = def.ty.shape.to_static().unwrap_or_default();
            if v.shape() != expected.as_slice() || v.dtype() != def.ty.dtype {
                return Err(IrError::InitializerMismatch {
                    name: def.name.clone(),
                    ty: def.ty.to_string(),
                    got: TensorType::of_host(v).to_string(),
                });
            }
        }
        let id = VarId(self.variables.len() as u32);
        self.variable_names.insert(def.name.clone(), id);
        self.variables.push(def);
        Ok(id)
    }

    /// Appends `value` to the named collection (created on first use).
    pub fn add_to_collection(&mut self, collection: &str, value: Value) {
        self.collections
            .entry(collection.to_string())
            .or_default()
            .push(value);
    }

    /// A name not yet used by a node: `base`, else `base_1`, `base_2`, ... (as TF does).
    pub fn unique_name(&self, base: &str) -> String {
        if !self.names.contains_key(base) {
            return base.to_string();
        }
        (1..)
            .map(|i| format!("{base}_{i}"))
            .find(|n| !self.names.contains_key(n))
            .unwrap_or_else(|| base.to_string())
    }

    fn check_new_name(&self, name: &str) -> Result<(), IrError> {
        if !is_valid_name(name) {
            return Err(IrError::InvalidName {
                name: name.to_string(),
            });
        }
        if self.names.contains_key(name) {
            return Err(IrError::DuplicateNode {
                name: name.to_string(),
            });
        }
        Ok(())
    }

    // ---- queries -----------------------------------------------------------------------

    /// The node `id`.
    ///
    /// # Panics
    /// When `id` is not a node of this graph (ids come from this graph, so this is a bug).
    pub fn node(&self, id: NodeId) -> &Node {
        &self.graph[id]
    }

    /// The node `id`, if it exists.
    pub fn try_node(&self, id: NodeId) -> Option<&Node> {
        self.graph.node_weight(id)
    }

    /// True when `id` is a node of this graph.
    pub fn contains(&self, id: NodeId) -> bool {
        self.graph.contains_node(id)
    }

    /// The node with the given scoped name.
    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.names.get(name).copied()
    }

    /// The value named `name` or `name:port`.
    pub fn find_value(&self, name: &str) -> Option<Value> {
        if let Some(id) = self.find(name) {
            return Some(Value::first(id));
        }
        let (base, port) = name.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let id = self.find(base)?;
        (usize::from(port) < self.graph[id].outputs.len()).then_some(Value::new(id, port))
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.graph.node_count()
    }

    /// Every node id, in insertion order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.graph.node_indices()
    }

    /// The type of `v`; panics if `v` does not exist (use [`Graph::try_value_type`] otherwise).
    pub fn value_type(&self, v: Value) -> &TensorType {
        &self.graph[v.node].outputs[usize::from(v.port)]
    }

    /// The type of `v`, if it exists.
    pub fn try_value_type(&self, v: Value) -> Option<&TensorType> {
        self.graph
            .node_weight(v.node)
            .and_then(|n| n.outputs.get(usize::from(v.port)))
    }

    /// The data inputs of `id`, in slot order.
    pub fn inputs(&self, id: NodeId) -> SmallVec<[Value; 4]> {
        let mut ins: SmallVec<[(u16, Value); 4]> = self
            .graph
            .edges_directed(id, Direction::Incoming)
            .filter_map(|e| match *e.weight() {
                Edge::Data { port, slot } => Some((slot, Value::new(e.source(), port))),
                Edge::Control => None,
            })
            .collect();
        ins.sort_by_key(|(slot, _)| *slot);
        ins.into_iter().map(|(_, v)| v).collect()
    }

    /// The control predecessors of `id`, sorted by id.
    pub fn control_inputs(&self, id: NodeId) -> SmallVec<[NodeId; 4]> {
        let mut deps: SmallVec<[NodeId; 4]> = self
            .graph
            .edges_directed(id, Direction::Incoming)
            .filter(|e| *e.weight() == Edge::Control)
            .map(|e| e.source())
            .collect();
        deps.sort();
        deps
    }

    /// The consumers of `v`: `(node, slot)` pairs, sorted.
    pub fn uses(&self, v: Value) -> Vec<(NodeId, u16)> {
        let mut out: Vec<(NodeId, u16)> = self
            .graph
            .edges_directed(v.node, Direction::Outgoing)
            .filter_map(|e| match *e.weight() {
                Edge::Data { port, slot } if port == v.port => Some((e.target(), slot)),
                _ => None,
            })
            .collect();
        out.sort();
        out
    }

    /// Every node that consumes an output of `id` or depends on it by a control edge.
    pub fn successors(&self, id: NodeId) -> SmallVec<[NodeId; 4]> {
        let mut s: SmallVec<[NodeId; 4]> = self
            .graph
            .neighbors_directed(id, Direction::Outgoing)
            .collect();
        s.sort();
        s.dedup();
        s
    }

    /// Every node `id` consumes or depends on.
    pub fn predecessors(&self, id: NodeId) -> SmallVec<[NodeId; 4]> {
        let mut s: SmallVec<[NodeId; 4]> = self
            .graph
            .neighbors_directed(id, Direction::Incoming)
            .collect();
        s.sort();
        s.dedup();
        s
    }

    /// The variable table, indexed by [`VarId`].
    pub fn variables(&self) -> &[VariableDef] {
        &self.variables
    }

    /// Variable `id`.
    ///
    /// # Panics
    /// When `id` was not declared in this graph.
    pub fn variable(&self, id: VarId) -> &VariableDef {
        &self.variables[id.0 as usize]
    }

    /// The variable with the given full name.
    pub fn find_variable(&self, name: &str) -> Option<VarId> {
        self.variable_names.get(name).copied()
    }

    /// Every variable id with its declaration.
    pub fn variable_ids(&self) -> impl Iterator<Item = (VarId, &VariableDef)> + '_ {
        self.variables
            .iter()
            .enumerate()
            .map(|(i, d)| (VarId(i as u32), d))
    }

    /// The named collections.
    pub fn collections(&self) -> &BTreeMap<String, Vec<Value>> {
        &self.collections
    }

    /// The members of one collection (empty if it does not exist).
    pub fn collection(&self, name: &str) -> &[Value] {
        self.collections.get(name).map_or(&[], |v| v.as_slice())
    }

    /// The name of `v` as printed: `name` for port 0, else `name:port`.
    pub fn value_name(&self, v: Value) -> String {
        let n = &self.graph[v.node].name;
        if v.port == 0 {
            n.clone()
        } else {
            format!("{n}:{}", v.port)
        }
    }

    /// Every node in a deterministic topological order: among ready nodes, the one added first.
    ///
    /// Errors when the graph has a cycle, naming one node on it.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, IrError> {
        let mut indeg: HashMap<NodeId, usize> = HashMap::with_capacity(self.node_count());
        let mut ready = BinaryHeap::new();
        for id in self.graph.node_indices() {
            let d = self.graph.edges_directed(id, Direction::Incoming).count();
            indeg.insert(id, d);
            if d == 0 {
                ready.push(std::cmp::Reverse(id));
            }
        }
        let mut order = Vec::with_capacity(self.node_count());
        while let Some(std::cmp::Reverse(id)) = ready.pop() {
            order.push(id);
            for e in self.graph.edges_directed(id, Direction::Outgoing) {
                let t = e.target();
                if let Some(d) = indeg.get_mut(&t) {
                    *d -= 1;
                    if *d == 0 {
                        ready.push(std::cmp::Reverse(t));
                    }
                }
            }
        }
        if order.len() != self.node_count() {
            let stuck = self
                .graph
                .node_indices()
                .find(|id| indeg.get(id).copied().unwrap_or(0) > 0)
                .map(|id| self.graph[id].name.clone())
                .unwrap_or_default();
            return Err(IrError::Cycle { node: stuck });
        }
        Ok(order)
    }

    /// The nodes needed to compute `roots` (values and side-effect nodes), in topological order.
    pub fn ancestors_of(&self, roots: &[NodeId]) -> Result<Vec<NodeId>, IrError> {
        let mut needed = std::collections::HashSet::new();
        let mut stack: Vec<NodeId> = roots.to_vec();
        while let Some(id) = stack.pop() {
            if needed.insert(id) {
                stack.extend(self.graph.neighbors_directed(id, Direction::Incoming));
            }
        }
        Ok(self
            .topo_order()?
            .into_iter()
            .filter(|id| needed.contains(id))
            .collect())
    }

    // ---- rewriting (used by passes) ----------------------------------------------------

    /// Points every consumer of `old` (and every collection entry) at `new` instead.
    /// Errors when the two values have different types.
    pub fn replace_all_uses(&mut self, old: Value, new: Value) -> Result<(), IrError> {
        let (Some(to), Some(tn)) = (self.try_value_type(old), self.try_value_type(new)) else {
            return Err(IrError::UnknownNode(format!(
                "#{} or #{}",
                old.node.index(),
                new.node.index()
            )));
        };
        if to != tn {
            return Err(IrError::ReplaceTypeMismatch {
                old: self.value_name(old),
                new: self.value_name(new),
                old_ty: to.to_string(),
                new_ty: tn.to_string(),
            });
        }
        let edges: Vec<_> = self
            .graph
            .edges_directed(old.node, Direction::Outgoing)
            .filter_map(|e| match *e.weight() {
                Edge::Data { port, slot } if port == old.port => Some((e.id(), e.target(), slot)),
                _ => None,
            })
            .collect();
        for (eid, target, slot) in edges {
            self.graph.remove_edge(eid);
            self.graph.add_edge(
                new.node,
                target,
                Edge::Data {
                    port: new.port,
                    slot,
                },
            );
        }
        for members in self.collections.values_mut() {
            for m in members.iter_mut() {
                if *m == old {
                    *m = new;
                }
            }
        }
        Ok(())
    }

    /// Points data input `slot` of `node` at `new` instead of what it reads now. Errors when
    /// the node has no such input or `new` has another type.
    pub fn replace_input(&mut self, node: NodeId, slot: u16, new: Value) -> Result<(), IrError> {
        let edge = self
            .graph
            .edges_directed(node, Direction::Incoming)
            .find_map(|e| match *e.weight() {
                Edge::Data { port, slot: s } if s == slot => {
                    Some((e.id(), Value::new(e.source(), port)))
                }
                _ => None,
            });
        let Some((eid, old)) = edge else {
            return Err(IrError::UnknownNode(format!(
                "input {slot} of #{}",
                node.index()
            )));
        };
        let (Some(to), Some(tn)) = (self.try_value_type(old), self.try_value_type(new)) else {
            return Err(IrError::UnknownNode(format!("#{}", new.node.index())));
        };
        if to != tn {
            return Err(IrError::ReplaceTypeMismatch {
                old: self.value_name(old),
                new: self.value_name(new),
                old_ty: to.to_string(),
                new_ty: tn.to_string(),
            });
        }
        self.graph.remove_edge(eid);
        self.graph.add_edge(
            new.node,
            node,
            Edge::Data {
                port: new.port,
                slot,
            },
        );
        Ok(())
    }

    /// Removes node `id` with its edges and collection entries.
    pub fn remove_node(&mut self, id: NodeId) -> Option<Node> {
        let node = self.graph.remove_node(id)?;
        self.names.remove(&node.name);
        for members in self.collections.values_mut() {
            members.retain(|m| m.node != id);
        }
        Some(node)
    }

    /// Renames node `id`; errors when the new name is taken or invalid.
    pub fn rename_node(&mut self, id: NodeId, name: &str) -> Result<(), IrError> {
        self.check_new_name(name)?;
        let old = std::mem::replace(&mut self.graph[id].name, name.to_string());
        self.names.remove(&old);
        self.names.insert(name.to_string(), id);
        Ok(())
    }

    /// Sets the logical device of node `id`.
    pub fn set_device(&mut self, id: NodeId, device: Option<u16>) {
        if let Some(n) = self.graph.node_weight_mut(id) {
            n.device = device;
        }
    }

    /// The underlying petgraph graph, read-only (for algorithms and visualisation).
    pub fn petgraph(&self) -> &StableGraph<Node, Edge, petgraph::Directed, u32> {
        &self.graph
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("nodes", &self.node_count())
            .field("variables", &self.variables.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, Conv2dAttrs, Shape, TensorType, UnaryOp, VarFlags, verify};
    use crate::tensor::DType;

    fn input(g: &mut Graph, name: &str, shape: Shape) -> Value {
        let ty = TensorType::f32(shape);
        Value::first(
            g.add_node(
                name,
                Op::Input {
                    name: name.into(),
                    ty,
                },
                &[],
            )
            .expect("input"),
        )
    }

    #[test]
    fn type_errors_name_the_node_the_op_and_the_shapes() {
        let mut g = Graph::new();
        let x = input(&mut g, "tower0/image", Shape::batched(&[32, 32, 3]));
        let w = input(&mut g, "tower0/w", Shape::fixed(&[3, 3, 16, 16]));
        let err = g
            .add_node(
                "tower0/conv0/Conv2D",
                Op::Conv2d(Conv2dAttrs::default()),
                &[x, w],
            )
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("tower0/conv0/Conv2D"), "{msg}");
        assert!(msg.contains("conv2d"), "{msg}");
        assert!(
            msg.contains("f32[N,32,32,3]") && msg.contains("f32[3,3,16,16]"),
            "{msg}"
        );
    }

    #[test]
    fn replace_all_uses_rewires_consumers_and_collections() {
        let mut g = Graph::new();
        let a = input(&mut g, "a", Shape::fixed(&[4]));
        let b = input(&mut g, "b", Shape::fixed(&[4]));
        let r = g
            .add_node("r", Op::Unary(UnaryOp::Relu), &[a])
            .expect("relu");
        let s = g
            .add_node("s", Op::Binary(BinaryOp::Add), &[Value::first(r), a])
            .expect("add");
        g.add_to_collection("losses", Value::first(r));
        g.replace_all_uses(Value::first(r), b).expect("same type");
        assert_eq!(g.inputs(s).as_slice(), &[b, a]);
        assert_eq!(g.collection("losses"), &[b]);
        assert!(g.uses(Value::first(r)).is_empty());
        verify(&g).expect("still valid");
    }

    #[test]
    fn topo_order_is_deterministic_and_names_are_unique() {
        let mut g = Graph::new();
        let a = input(&mut g, "a", Shape::scalar());
        let n1 = g.add_node("n", Op::Unary(UnaryOp::Exp), &[a]).expect("exp");
        assert!(matches!(
            g.add_node("n", Op::Unary(UnaryOp::Exp), &[a]),
            Err(IrError::DuplicateNode { .. })
        ));
        assert_eq!(g.unique_name("n"), "n_1");
        let order = g.topo_order().expect("acyclic");
        assert_eq!(order, vec![a.node, n1]);
        assert!(matches!(
            g.add_node("bad name", Op::Unary(UnaryOp::Exp), &[a]),
            Err(IrError::InvalidName { .. })
        ));
    }

    #[test]
    fn assign_checks_the_variable_type() {
        let mut g = Graph::new();
        let v = g
            .declare_variable(VariableDef {
                name: "w".into(),
                ty: TensorType::f32(Shape::fixed(&[2])),
                init: crate::ir::Initializer::Zeros,
                flags: VarFlags::default(),
            })
            .expect("declare");
        let x = input(&mut g, "x", Shape::fixed(&[3]));
        let err = g
            .add_node("w/assign", Op::Assign { var: v }, &[x])
            .unwrap_err();
        assert!(
            err.to_string().contains("cannot be assigned to variable w"),
            "{err}"
        );
        let i = g
            .add_node(
                "i",
                Op::Constant {
                    value: crate::tensor::HostTensor::zeros(DType::F32, &[2]),
                },
                &[],
            )
            .expect("const");
        let asg = g
            .add_node("w/assign_1", Op::Assign { var: v }, &[Value::first(i)])
            .expect("assign");
        let grp = g.add_group("train_op", &[asg]).expect("group");
        assert_eq!(g.control_inputs(grp).as_slice(), &[asg]);
        verify(&g).expect("valid");
    }
}
