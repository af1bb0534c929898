//! The node builder of optimizer updates: names nodes under `{optimizer}/update/{var}/...`,
//! places them on the gradient's device and makes constants in the variable's dtype.

use super::OptimError;
use super::state::{self, constant, read};
use crate::ir::{BinaryOp, Graph, Op, UnaryOp, Value, VarId};
use crate::tensor::DType;

/// Emits the update nodes of one variable under `{scope}/update/{var}/...`, on the device of
/// its gradient, with constants in the variable's dtype.
pub(crate) struct Builder<'g> {
    graph: &'g mut Graph,
    scope: String,
    /// The variable whose update this builds (`None` for step-wide scalars).
    var_name: Option<String>,
    device: Option<u16>,
    dtype: DType,
}

impl<'g> Builder<'g> {
    pub fn new(graph: &'g mut Graph, scope: &str, var: VarId, grad: Value) -> Builder<'g> {
        let var_name = graph.variable(var).name.clone();
        let scope = format!("{scope}/update/{var_name}");
        let device = graph.node(grad.node).device;
        let dtype = graph.variable(var).ty.dtype;
        Builder {
            graph,
            scope,
            var_name: Some(var_name),
            device,
            dtype,
        }
    }

    /// A builder of `f32` step-wide scalars on no device.
    pub fn scalar(graph: &'g mut Graph, scope: &str) -> Builder<'g> {
        Builder {
            graph,
            scope: scope.to_string(),
            var_name: None,
            device: None,
            dtype: DType::F32,
        }
    }

    /// A read of `var`: `{scope}/read` for the updated variable itself, `{scope}/{slot}/read`
    /// for its slot `{var}/{slot}`, `{scope}/{name}/read` for anything else.
    pub fn read(&mut self, var: VarId) -> Result<Value, OptimError> {
        let name = &self.graph.variable(var).name;
        let what = match self.var_name.as_deref() {
            Some(own) if own == name => String::new(),
            Some(own) => name
                .strip_prefix(own)
                .and_then(|rest| rest.strip_prefix('/'))
                .map_or_else(|| format!("/{name}"), |slot| format!("/{slot}")),
            None => format!("/{name}"),
        };
        let name = format!("{}{what}/read", self.scope);
        read(self.graph, var, &name, self.device)
    }

    /// A scalar constant in the builder's dtype, named `{scope}/{name}`.
    pub fn constant(&mut self, name: &str, x: f64) -> Result<Value, OptimError> {
        let name = format!("{}/{name}", self.scope);
        constant(self.graph, &name, self.dtype, x, self.device)
    }

    pub fn node(&mut self, part: &str, op: Op, inputs: &[Value]) -> Result<Value, OptimError> {
        let name = format!("{}/{part}", self.scope);
        state::node(self.graph, &name, op, inputs, self.device)
    }

    pub fn bin(&mut self, op: BinaryOp, a: Value, b: Value) -> Result<Value, OptimError> {
        self.node(op.name(), Op::Binary(op), &[a, b])
    }

    /// A binary op named `{scope}/{name}`, for the values a reader looks for (`new`, `m`, ...).
    pub fn named(
        &mut self,
        name: &str,
        op: BinaryOp,
        a: Value,
        b: Value,
    ) -> Result<Value, OptimError> {
        self.node(name, Op::Binary(op), &[a, b])
    }

    pub fn un(&mut self, op: UnaryOp, a: Value) -> Result<Value, OptimError> {
        self.node(op.name(), Op::Unary(op), &[a])
    }

    /// `x` in the builder's dtype.
    pub fn cast(&mut self, x: Value) -> Result<Value, OptimError> {
        if self.graph.value_type(x).dtype == self.dtype {
            return Ok(x);
        }
        let to = self.dtype;
        self.node("cast", Op::Cast { to }, &[x])
    }

    pub fn graph(&mut self) -> &mut Graph {
        self.graph
    }
}
