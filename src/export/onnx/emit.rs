//! The [`Emitter`]: the ONNX names of the exported values (and the layout each was produced in)
//! and the ONNX nodes and initializers accumulated while [`super::walk`] visits the needed IR
//! nodes and [`super::ops`] maps each one.
//!
//! Naming: a value in the plain (IR) layout is called by its IR name (`conv0/Conv2D`,
//! `moments:1`), a variable by its variable name (`conv0/W`), a tower input by its signature
//! name; every name the exporter invents (a value in another layout, a shape constant, a
//! transposed weight) is derived from the IR name it serves and made unique, so the ONNX graph
//! reads like the tower.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::error::OnnxError;
use super::layout::Layout;
use super::proto::{self, Attr, pb};
use crate::ir::{Graph, NodeId, Op, Value, VarId};
use crate::tensor::HostTensor;

/// Who a reserved ONNX name belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Value(Value),
    Variable(VarId),
}

/// An IR value as exported: its ONNX name and the layout it was produced in.
#[derive(Clone, Debug)]
struct Emitted {
    name: String,
    layout: Layout,
}

/// The state of one export: the graph being read and the ONNX graph being written.
pub(super) struct Emitter<'a> {
    pub(super) graph: &'a Graph,
    variables: &'a BTreeMap<String, HostTensor>,
    /// Every ONNX value name in use or reserved.
    names: HashSet<String>,
    node_names: HashSet<String>,
    values: HashMap<Value, Emitted>,
    /// Values converted to another layout (or broadcast-reshaped for one), by target layout.
    forms: HashMap<(Value, Layout), String>,
    /// Filters transposed from HWIO to ONNX's OIHW.
    oihw: HashMap<Value, String>,
    exported_variables: HashSet<VarId>,
    nodes: Vec<pb::NodeProto>,
    initializers: Vec<pb::TensorProto>,
}

impl<'a> Emitter<'a> {
    /// An empty ONNX graph reading `graph`, with variables from `variables` (by name).
    pub(super) fn new(
        graph: &'a Graph,
        variables: &'a BTreeMap<String, HostTensor>,
    ) -> Emitter<'a> {
        Emitter {
            graph,
            variables,
            names: HashSet::new(),
            node_names: HashSet::new(),
            values: HashMap::new(),
            forms: HashMap::new(),
            oihw: HashMap::new(),
            exported_variables: HashSet::new(),
            nodes: Vec::new(),
            initializers: Vec::new(),
        }
    }

    /// The nodes and initializers emitted so far.
    pub(super) fn finish(self) -> (Vec<pb::NodeProto>, Vec<pb::TensorProto>) {
        (self.nodes, self.initializers)
    }

    /// A `Constant` node's value as an initializer.
    pub(super) fn constant(&mut self, id: NodeId, value: &HostTensor) {
        let name = self.define(Value::first(id), Layout::plain(value.shape().len()));
        self.initializers.push(proto::tensor(&name, value));
    }
}

impl Emitter<'_> {
    /// Reserves the IR name of every value of `ids` (variables: the variable's name), so names
    /// invented later never take one.
    pub(super) fn reserve_names<'n>(
        &mut self,
        ids: impl Iterator<Item = &'n NodeId>,
    ) -> Result<(), OnnxError> {
        let mut owners: HashMap<String, Owner> = HashMap::new();
        for &id in ids {
            let node = self.graph.node(id);
            let claims: Vec<(String, Owner)> = match node.op {
                Op::Variable { var } => {
                    vec![(self.graph.variable(var).name.clone(), Owner::Variable(var))]
                }
                _ => (0..node.outputs.len())
                    .map(|port| {
                        let v = Value::new(id, port as u16);
                        (self.graph.value_name(v), Owner::Value(v))
                    })
                    .collect(),
            };
            for (name, owner) in claims {
                match owners.get(&name) {
                    Some(o) if *o != owner => return Err(OnnxError::NameClash(name)),
                    _ => {
                        owners.insert(name.clone(), owner);
                        self.names.insert(name);
                    }
                }
            }
        }
        Ok(())
    }

    /// A new value name derived from `base`.
    pub(super) fn fresh(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut i = 1;
        while self.names.contains(&name) {
            name = format!("{base}_{i}");
            i += 1;
        }
        self.names.insert(name.clone());
        name
    }

    fn fresh_node_name(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut i = 1;
        while self.node_names.contains(&name) {
            name = format!("{base}_{i}");
            i += 1;
        }
        self.node_names.insert(name.clone());
        name
    }

    /// Records that IR value `v` is produced in `layout` and returns its ONNX name: the IR name
    /// in the plain layout, a derived one otherwise.
    pub(super) fn define(&mut self, v: Value, layout: Layout) -> String {
        let ir_name = self.graph.value_name(v);
        let name = if layout.is_plain() {
            ir_name
        } else {
            self.fresh(&format!("{ir_name}/{}", layout.tag()))
        };
        self.forms.insert((v, layout.clone()), name.clone());
        self.values.insert(
            v,
            Emitted {
                name: name.clone(),
                layout,
            },
        );
        name
    }

    /// Appends a node of type `op_type` named after IR node `owner` (+ `suffix` for helpers).
    pub(super) fn push(
        &mut self,
        owner: NodeId,
        suffix: &str,
        op_type: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: &[(&str, Attr)],
    ) {
        let base = if suffix.is_empty() {
            self.graph.node(owner).name.clone()
        } else {
            format!("{}/{suffix}", self.graph.node(owner).name)
        };
        let name = self.fresh_node_name(&base);
        self.nodes
            .push(proto::node(&name, op_type, inputs, outputs, attrs));
    }

    /// A new `int64` initializer (shapes, pads, axes) named after `base`.
    pub(super) fn i64_constant(&mut self, base: &str, values: &[i64]) -> String {
        let name = self.fresh(base);
        self.initializers.push(proto::i64_tensor(&name, values));
        name
    }

    /// The layout `v` was produced in.
    pub(super) fn layout_of(&self, v: Value) -> Result<Layout, OnnxError> {
        self.values
            .get(&v)
            .map(|e| e.layout.clone())
            .ok_or_else(|| self.not_emitted(v))
    }

    fn not_emitted(&self, v: Value) -> OnnxError {
        // The walk is in topological order, so every input is emitted before its consumers.
        OnnxError::Internal(format!(
            "{} used before it was exported",
            self.graph.value_name(v)
        ))
    }

    /// The ONNX name of `v` in the plain (IR) layout.
    pub(super) fn plain(&mut self, v: Value) -> Result<String, OnnxError> {
        let rank = self.layout_of(v)?.rank();
        self.input_in(v, &Layout::plain(rank), v.node)
    }

    /// The ONNX name of `v` as an operand of an op computing in `want`: `v` transposed to
    /// `want` when it has the same rank; when it has a lower rank (an elementwise operand that
    /// broadcasts, e.g. a per-channel `[C]` vector against NCHW), `v` reshaped (and if need be
    /// transposed) so that NumPy broadcasting in `want` lines up the same elements.
    /// `user` is the node that needs it (named in errors).
    pub(super) fn input_in(
        &mut self,
        v: Value,
        want: &Layout,
        user: NodeId,
    ) -> Result<String, OnnxError> {
        let current = self
            .values
            .get(&v)
            .cloned()
            .ok_or_else(|| self.not_emitted(v))?;
        if current.layout == *want {
            return Ok(current.name);
        }
        if let Some(name) = self.forms.get(&(v, want.clone())) {
            return Ok(name.clone());
        }
        let rank = current.layout.rank();
        let ir_name = self.graph.value_name(v);
        let name = if rank == want.rank() {
            let out = if want.is_plain() {
                // Reserved for this value: its plain form carries the IR name.
                ir_name.clone()
            } else {
                self.fresh(&format!("{ir_name}/{}", want.tag()))
            };
            let perm = current.layout.transpose_to(want);
            let what = format!(
                "to_{}",
                if want.is_plain() {
                    "plain".to_string()
                } else {
                    want.tag()
                }
            );
            self.push(
                v.node,
                &what,
                "Transpose",
                &[&current.name],
                &[&out],
                &[("perm", Attr::Ints(perm))],
            );
            out
        } else if rank < want.rank() {
            let src = self.plain(v)?;
            if want.is_plain() {
                // NumPy broadcasting aligns on the right, as the IR does.
                return Ok(src);
            }
            let dims = self.graph.value_type(v).shape.to_static().ok_or_else(|| {
                super::error::unsupported(
                    self.graph,
                    user,
                    format!("operand {ir_name} broadcasts with a batch dimension"),
                )
            })?;
            let mut full = vec![1usize; want.rank() - rank];
            full.extend_from_slice(&dims);
            let target = want.apply(&full);
            let kept: Vec<usize> = want
                .perm()
                .iter()
                .copied()
                .filter(|&a| full[a] != 1)
                .collect();
            let out = self.fresh(&format!("{ir_name}/{}", want.tag()));
            let as_i64 = |d: &[usize]| d.iter().map(|&x| x as i64).collect::<Vec<_>>();
            if kept.windows(2).all(|w| w[0] < w[1]) {
                // Only size-1 axes move: a reshape suffices (e.g. [C] -> [C, 1, 1]).
                let shape =
                    self.i64_constant(&format!("{ir_name}/{}_shape", want.tag()), &as_i64(&target));
                self.push(
                    v.node,
                    &format!("to_{}", want.tag()),
                    "Reshape",
                    &[&src, &shape],
                    &[&out],
                    &[],
                );
            } else {
                let shape = self.i64_constant(
                    &format!("{ir_name}/rank{}_shape", want.rank()),
                    &as_i64(&full),
                );
                let mid = self.fresh(&format!("{ir_name}/rank{}", want.rank()));
                self.push(
                    v.node,
                    &format!("rank{}", want.rank()),
                    "Reshape",
                    &[&src, &shape],
                    &[&mid],
                    &[],
                );
                let perm: Vec<i64> = want.perm().iter().map(|&p| p as i64).collect();
                self.push(
                    v.node,
                    &format!("to_{}", want.tag()),
                    "Transpose",
                    &[&mid],
                    &[&out],
                    &[("perm", Attr::Ints(perm))],
                );
            }
            out
        } else {
            return Err(OnnxError::Internal(format!(
                "operand {ir_name} of {} has a higher rank than the op's layout",
                self.graph.node(user).name
            )));
        };
        self.forms.insert((v, want.clone()), name.clone());
        Ok(name)
    }

    /// The filter `w` (HWIO) as ONNX's `[O, I, KH, KW]`, transposed once per filter. The
    /// initializer keeps the checkpoint's HWIO value under the variable's name; ONNX runtimes
    /// fold the transpose of a constant when they load the model.
    pub(super) fn filter_oihw(&mut self, w: Value) -> Result<String, OnnxError> {
        if let Some(name) = self.oihw.get(&w) {
            return Ok(name.clone());
        }
        let src = self.plain(w)?;
        let out = self.fresh(&format!("{src}/OIHW"));
        self.push(
            w.node,
            "to_OIHW",
            "Transpose",
            &[&src],
            &[&out],
            &[("perm", Attr::Ints(vec![3, 2, 0, 1]))],
        );
        self.oihw.insert(w, out.clone());
        Ok(out)
    }

    /// A `Variable` node: its value is the initializer named after the variable, added once.
    pub(super) fn variable(&mut self, id: NodeId, var: VarId) -> Result<(), OnnxError> {
        let def = self.graph.variable(var);
        let v = Value::first(id);
        let layout = Layout::plain(def.ty.rank());
        self.forms.insert((v, layout.clone()), def.name.clone());
        self.values.insert(
            v,
            Emitted {
                name: def.name.clone(),
                layout,
            },
        );
        if !self.exported_variables.insert(var) {
            return Ok(());
        }
        let value = self
            .variables
            .get(&def.name)
            .ok_or_else(|| OnnxError::MissingVariable(def.name.clone()))?;
        let declared = def.ty.shape.to_static();
        if value.dtype() != def.ty.dtype || declared.as_deref() != Some(value.shape()) {
            return Err(OnnxError::VariableMismatch {
                name: def.name.clone(),
                declared: def.ty.to_string(),
                value: crate::ir::TensorType::of_host(value).to_string(),
            });
        }
        self.initializers.push(proto::tensor(&def.name, value));
        Ok(())
    }
}
