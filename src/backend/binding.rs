//! Checks shared by the compiled backends: feeds against their `Input` nodes (binding the batch
//! size) and host values against variable declarations. Errors name the input or variable.

use super::{BackendError, Feed};
use crate::ir::{Dim, Graph, Op, TensorType, VarId, VariableDef};
use crate::tensor::HostTensor;

/// Checks every feed against its input's type and returns the batch size they bind (1 when no
/// batched input is fed).
pub fn bind_feeds(graph: &Graph, feeds: &[Feed]) -> Result<usize, BackendError> {
    let mut batch: Option<usize> = None;
    for (id, value) in feeds {
        let node = graph
            .try_node(*id)
            .ok_or_else(|| BackendError::UnknownValue(format!("#{}", id.index())))?;
        let Op::Input { name, ty } = &node.op else {
            return Err(BackendError::FeedNotInput {
                node: node.name.clone(),
            });
        };
        let shape = value.shape();
        let fits = value.dtype() == ty.dtype
            && shape.len() == ty.rank()
            && ty.shape.dims().iter().zip(shape).all(|(d, &s)| match d {
                Dim::Fixed(n) => *n == s,
                Dim::Batch => true,
            });
        if !fits {
            return Err(BackendError::FeedMismatch {
                input: name.clone(),
                expected: ty.to_string(),
                got: TensorType::of_host(value).to_string(),
            });
        }
        if ty.shape.has_batch() {
            match batch {
                Some(b) if b != shape[0] => {
                    return Err(BackendError::BatchMismatch {
                        input: name.clone(),
                        expected: b,
                        got: shape[0],
                    });
                }
                _ => batch = Some(shape[0]),
            }
        }
    }
    Ok(batch.unwrap_or(1))
}

/// The declaration of `var` and its static shape; with `value`, checks that it fits.
pub fn variable<'g>(
    graph: &'g Graph,
    var: VarId,
    value: Option<&HostTensor>,
) -> Result<(&'g VariableDef, Vec<usize>), BackendError> {
    let def = graph
        .variables()
        .get(var.0 as usize)
        .ok_or(BackendError::UnknownVariable(var.0))?;
    let shape = def.ty.shape.to_static().unwrap_or_default();
    if let Some(value) = value
        && (value.dtype() != def.ty.dtype || value.shape() != shape.as_slice())
    {
        return Err(BackendError::VariableMismatch {
            variable: def.name.clone(),
            expected: def.ty.to_string(),
            got: TensorType::of_host(value).to_string(),
        });
    }
    Ok((def, shape))
}

/// The value of `var` (declared as `def`, of static `shape`) from its state bytes, as a
/// backend reads it back.
pub fn variable_from_bytes(
    def: &VariableDef,
    shape: &[usize],
    bytes: &[u8],
) -> Result<HostTensor, BackendError> {
    HostTensor::from_le_bytes(def.ty.dtype, shape, bytes).map_err(|e| {
        BackendError::VariableMismatch {
            variable: def.name.clone(),
            expected: def.ty.to_string(),
            got: e.to_string(),
        }
    })
}

/// Prepared programs by (step, batch size): each distinct pair is lowered and prepared once.
pub struct ProgramCache<P> {
    entries: std::collections::HashMap<u64, Vec<(super::Step, usize, P)>>,
}

impl<P> Default for ProgramCache<P> {
    fn default() -> Self {
        ProgramCache {
            entries: std::collections::HashMap::new(),
        }
    }
}

impl<P> ProgramCache<P> {
    fn key(step: &super::Step, batch: usize) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        step.hash(&mut h);
        batch.hash(&mut h);
        h.finish()
    }

    /// The entry of (`step`, `batch`), if prepared.
    pub fn get(&self, step: &super::Step, batch: usize) -> Option<&P> {
        self.entries
            .get(&Self::key(step, batch))?
            .iter()
            .find(|(s, b, _)| s == step && *b == batch)
            .map(|(_, _, p)| p)
    }

    /// The entry of (`step`, `batch`), mutably.
    pub fn get_mut(&mut self, step: &super::Step, batch: usize) -> Option<&mut P> {
        self.entries
            .get_mut(&Self::key(step, batch))?
            .iter_mut()
            .find(|(s, b, _)| s == step && *b == batch)
            .map(|(_, _, p)| p)
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &P> {
        self.entries.values().flatten().map(|(_, _, p)| p)
    }

    /// Stores `prepared` for (`step`, `batch`).
    pub fn insert(&mut self, step: &super::Step, batch: usize, prepared: P) {
        self.entries
            .entry(Self::key(step, batch))
            .or_default()
            .push((step.clone(), batch, prepared));
    }
}
