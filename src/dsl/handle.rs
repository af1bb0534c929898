//! Tower functions and their records: the input signature ([`InputSpec`]), building one tower
//! with its own inputs ([`Builder::build_tower`]) and the per-tower [`TowerHandle`]
//! (tensorpack's `TowerTensorHandle`).

use super::builder::Builder;
use super::builder::Tensor;
use super::error::DslError;
use crate::ir::{Graph, NodeId, Shape, TensorType, Value, VarId};
use crate::tensor::DType;
use crate::tower::{TowerContext, VarCollection, join_scope};
use std::collections::BTreeMap;

/// One input of a tower function: its signature name, element type and shape (`N` leading
/// for batched inputs, e.g. `Shape::batched(&[32, 32, 3])`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputSpec {
    pub name: String,
    pub dtype: DType,
    pub shape: Shape,
}

impl InputSpec {
    /// An input named `name`.
    pub fn new(name: &str, dtype: DType, shape: Shape) -> InputSpec {
        InputSpec {
            name: name.to_string(),
            dtype,
            shape,
        }
    }

    /// The input's tensor type.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.clone())
    }
}

/// Checks a signature as tensorpack does: names unique, non-empty, without `:`, `/` or spaces.
pub fn validate_signature(signature: &[InputSpec]) -> Result<(), DslError> {
    for (i, spec) in signature.iter().enumerate() {
        let bad = |why: &str| DslError::Signature {
            message: format!("input `{}` {why}", spec.name),
        };
        if spec.name.is_empty() || !crate::ir::is_valid_name(&spec.name) {
            return Err(bad("is not a valid name"));
        }
        if spec.name.contains(['/', ':', ' ']) {
            return Err(bad("may not contain `/`, `:` or spaces"));
        }
        if signature[..i].iter().any(|s| s.name == spec.name) {
            return Err(bad("appears twice"));
        }
        if spec.shape.batch_misplaced() {
            return Err(bad("has the batch size N in a non-leading position"));
        }
    }
    Ok(())
}

/// What one call of a tower function built.
#[derive(Clone, Debug, PartialEq)]
pub struct TowerHandle {
    pub ns_name: String,
    pub vs_name: String,
    pub index: usize,
    pub is_training: bool,
    pub has_own_variables: bool,
    /// The tower's own `Input` nodes, by signature name, in signature order.
    pub inputs: Vec<(String, NodeId)>,
    /// What the tower function returned.
    pub output: Value,
    /// The cost to minimize (training towers only): `output`, checked to be a float scalar.
    pub cost: Option<Value>,
    /// Variables this call created, in creation order.
    pub created_variables: Vec<VarId>,
    /// Collection entries this call added (after discarding frozen collections).
    pub collections: BTreeMap<String, Vec<Value>>,
}

impl TowerHandle {
    /// The tower's input node for signature name `name`.
    pub fn input(&self, name: &str) -> Option<NodeId> {
        self.inputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| *id)
    }

    /// `ns/name` (or `ns/name:port`) in `graph`; falls back to the input of that signature name.
    pub fn get_tensor(&self, graph: &Graph, name: &str) -> Option<Value> {
        graph
            .find_value(&join_scope(&self.ns_name, name))
            .or_else(|| self.input(name).map(Value::first))
    }

    /// The entries this tower added to `collection`.
    pub fn collection(&self, collection: &str) -> &[Value] {
        self.collections
            .get(collection)
            .map_or(&[], |v| v.as_slice())
    }

    /// Trainable variables this tower created (its own variables).
    pub fn own_trainable_variables(&self, graph: &Graph) -> Vec<VarId> {
        self.created_variables
            .iter()
            .copied()
            .filter(|&id| graph.variable(id).flags.trainable)
            .collect()
    }

    /// The variables to differentiate this tower's cost against (tensorpack's rule): its own
    /// trainable variables if it has its own variables, else every trainable variable.
    pub fn gradient_variables(&self, graph: &Graph) -> Vec<VarId> {
        if self.has_own_variables {
            self.own_trainable_variables(graph)
        } else {
            VarCollection::Trainable.variables(graph)
        }
    }
}

impl Builder {
    /// Calls tower function `f` once under `ctx`, on new `Input` nodes `<ns>/<name>` made from
    /// `signature`. Errors with the first error the function caused, or when the cost of a
    /// training tower is not a float scalar.
    pub fn build_tower<F>(
        &self,
        ctx: TowerContext,
        signature: &[InputSpec],
        f: F,
    ) -> Result<TowerHandle, DslError>
    where
        F: FnOnce(&[Tensor]) -> Tensor,
    {
        validate_signature(signature)?;
        let guard = self.enter_tower(ctx)?;
        let inputs: Vec<Tensor> = signature
            .iter()
            .map(|s| self.input(&s.name, s.ty()))
            .collect();
        let output = f(&inputs);
        let record = guard.exit();
        self.check()?;
        let Some(record) = record else {
            // enter_tower succeeded, so the tower was active until `exit`.
            return Err(DslError::Finished);
        };
        if !output.builder().same_as(self) {
            let err = DslError::MixedBuilders {
                node: join_scope(record.ctx.ns_name(), "<tower output>"),
            };
            self.record(err.clone());
            return Err(err);
        }
        let (Some(out), Some(ty)) = (output.value(), output.ty().cloned()) else {
            return Err(self.error().unwrap_or(DslError::Finished));
        };
        let ctx = record.ctx;
        let cost = if ctx.is_training() {
            if ty.rank() != 0 || !ty.dtype.is_float() {
                let err = DslError::CostNotScalar {
                    tower: ctx.display_name(),
                    ty: ty.to_string(),
                };
                self.record(err.clone());
                return Err(err);
            }
            Some(out)
        } else {
            None
        };
        let input_ids = signature
            .iter()
            .zip(&inputs)
            .filter_map(|(s, t)| t.node().map(|id| (s.name.clone(), id)))
            .collect();
        Ok(TowerHandle {
            ns_name: ctx.ns_name().to_string(),
            vs_name: ctx.vs_name().to_string(),
            index: ctx.index(),
            is_training: ctx.is_training(),
            has_own_variables: ctx.has_own_variables(),
            inputs: input_ids,
            output: out,
            cost,
            created_variables: record.created,
            collections: record.collections,
        })
    }
}
