//! [`ReferenceSession`]: the reference executor behind the [`Session`] trait, holding the
//! variable store between steps.

use super::Precision;
use super::array::Array;
use super::step::{accept_variable, run_step};
use crate::backend::{BackendError, Feed, Session, Step};
use crate::ir::{Graph, VarId, verify};
use crate::tensor::HostTensor;

/// Runs a verified graph op by op on the CPU: the oracle every other backend is tested against.
///
/// Variables start without a value; call [`Session::initialize_variables`] or
/// [`Session::write_variable`] before a step reads them. In [`Precision::F64`] mode the store
/// keeps floats in `f64`, [`Session::read_variable`] returns float variables as `f64` tensors, and
/// feeds and writes of float values may be any float dtype (widened, not rounded).
#[derive(Debug)]
pub struct ReferenceSession {
    graph: Graph,
    precision: Precision,
    variables: Vec<Option<Array>>,
}

impl ReferenceSession {
    /// A session computing in the graph's own dtypes ([`Precision::F32`]); verifies the graph.
    pub fn new(graph: Graph) -> Result<ReferenceSession, BackendError> {
        ReferenceSession::with_precision(graph, Precision::F32)
    }

    /// A session computing at precision `precision`; verifies the graph.
    pub fn with_precision(
        graph: Graph,
        precision: Precision,
    ) -> Result<ReferenceSession, BackendError> {
        verify(&graph)?;
        let variables = vec![None; graph.variables().len()];
        Ok(ReferenceSession {
            graph,
            precision,
            variables,
        })
    }

    /// The precision this session computes at.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    fn slot(&self, var: VarId) -> Result<usize, BackendError> {
        let i = var.0 as usize;
        if i < self.variables.len() {
            Ok(i)
        } else {
            Err(BackendError::UnknownVariable(var.0))
        }
    }
}

impl Session for ReferenceSession {
    fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Runs one step; its assigns are applied only if the whole step succeeds.
    fn run(&mut self, step: &Step, feeds: &[Feed]) -> Result<Vec<HostTensor>, BackendError> {
        let outcome = run_step(&self.graph, self.precision, &self.variables, feeds, step)?;
        for (var, value) in outcome.assigns {
            self.variables[var.0 as usize] = Some(value);
        }
        Ok(outcome.fetched)
    }

    fn read_variable(&self, var: VarId) -> Result<HostTensor, BackendError> {
        let i = self.slot(var)?;
        let def = self.graph.variable(var);
        self.variables[i]
            .as_ref()
            .map(|a| a.to_host(self.precision))
            .ok_or_else(|| BackendError::VariableMismatch {
                variable: def.name.clone(),
                expected: def.ty.to_string(),
                got: "no value (not initialized)".into(),
            })
    }

    fn write_variable(&mut self, var: VarId, value: &HostTensor) -> Result<(), BackendError> {
        let i = self.slot(var)?;
        let array = accept_variable(self.graph.variable(var), value, self.precision)?;
        self.variables[i] = Some(array);
        Ok(())
    }
}
