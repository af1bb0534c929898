//! Costs and tower-aware bookkeeping: cross-entropies, `regularize_cost` (tensorpack's
//! semantics), and the summary / regularization collections.

use crate::dsl::builder::Tensor;
use crate::dsl::builder::{Builder, current_builder};
use crate::dsl::error::DslError;
use crate::dsl::tensor::orphan;
use crate::ir::VarId;
use crate::tensor::DType;
use crate::tower::{
    MOVING_SUMMARY, REGULARIZATION_LOSSES, SUMMARIES, VarCollection, strip_scope_prefix,
};

/// Mean over the batch of the softmax cross-entropy of `logits` `[N, C]` against integer
/// `labels` `[N]` (`tf.reduce_mean(sparse_softmax_cross_entropy_with_logits(...))`).
pub fn sparse_softmax_cross_entropy(logits: &Tensor, labels: &Tensor) -> Tensor {
    logits
        .sparse_softmax_cross_entropy(labels)
        .reduce_mean(&[0])
}

/// Elementwise `max(x, 0) - x·z + log(1 + e^-|x|)`: the numerically stable cross-entropy of
/// sigmoid(`logits`) against targets `labels` in `[0, 1]`.
pub fn sigmoid_cross_entropy_with_logits(logits: &Tensor, labels: &Tensor) -> Tensor {
    let softplus_neg_abs = ((-logits.abs()).exp() + 1.0).log();
    logits.relu() - logits * labels + softplus_neg_abs
}

fn with_current(what: &'static str, f: impl FnOnce(&Builder) -> Tensor) -> Tensor {
    match current_builder() {
        Some(b) => f(&b),
        None => orphan(what),
    }
}

/// `l2_scale · Σ ||v||² / 2` over the trainable variables whose name matches `regex` (searched
/// anywhere, as `re.search`). Names are matched without the tower's variable-scope prefix.
/// Returns 0 in inference towers; in a tower with its own variables it covers only those
/// (replicated mode), otherwise every trainable variable. The result is named
/// `regularize_cost`.
pub fn regularize_cost(regex: &str, l2_scale: f32) -> Tensor {
    with_current("regularize_cost", |b| {
        builder_regularize_cost(b, regex, l2_scale)
    })
}

fn builder_regularize_cost(b: &Builder, regex: &str, l2_scale: f32) -> Tensor {
    let re = match regex::Regex::new(regex) {
        Ok(re) => re,
        Err(e) => {
            return b.fail(DslError::Op {
                node: b.scoped_name("regularize_cost"),
                message: format!("invalid regex `{regex}`: {e}"),
            });
        }
    };
    let ctx = b.tower_context();
    if ctx.as_ref().is_some_and(|c| !c.is_training()) {
        return b.scalar(DType::F32, 0.0).named("regularize_cost");
    }
    let candidates: Vec<VarId> = match &ctx {
        Some(c) if c.has_own_variables() => b.variables_created_in_tower(),
        _ => b.with_graph(|g| VarCollection::Trainable.variables(g)),
    };
    let vs = ctx.as_ref().map_or("", |c| c.vs_name()).to_string();
    let matched: Vec<VarId> = b.with_graph(|g| {
        candidates
            .into_iter()
            .filter(|&id| {
                let def = g.variable(id);
                let rel = strip_scope_prefix(&def.name, &vs).unwrap_or(&def.name);
                def.flags.trainable && re.is_match(rel)
            })
            .collect()
    });
    let total = {
        let _internals = b.name_scope("regularize_cost_internals");
        matched
            .iter()
            .map(|&id| b.read_variable(id).square().sum())
            .reduce(|acc, t| acc + t)
    };
    match total {
        Some(t) => (t * (l2_scale / 2.0)).named("regularize_cost"),
        None => b.scalar(DType::F32, 0.0).named("regularize_cost"),
    }
}

fn add_scalar_to(collection: &str, t: &Tensor, what: &str) {
    let Some(ty) = t.ty() else {
        return;
    };
    if ty.rank() != 0 || !ty.dtype.is_float() {
        let node = t.name().unwrap_or_default();
        t.builder().record(DslError::Op {
            node,
            message: format!("{what} needs a float scalar, got {ty}"),
        });
        return;
    }
    t.builder().add_to_collection(collection, t);
}

/// Records a float scalar for a moving-average summary (MOVING_SUMMARY). Only the main training
/// tower keeps it; other towers discard it.
pub fn add_moving_summary(t: &Tensor) {
    add_scalar_to(MOVING_SUMMARY, t, "add_moving_summary");
}

/// Records a tensor to summarize (SUMMARIES), main training tower only.
pub fn add_tensor_summary(t: &Tensor) {
    t.builder().add_to_collection(SUMMARIES, t);
}

/// Records a float scalar regularization term (REGULARIZATION_LOSSES).
pub fn add_regularization_loss(t: &Tensor) {
    add_scalar_to(REGULARIZATION_LOSSES, t, "add_regularization_loss");
}

/// The sum of the REGULARIZATION_LOSSES the current tower added (0 if none), named
/// `regularize_cost`.
pub fn regularize_cost_from_collection() -> Tensor {
    with_current("regularize_cost_from_collection", |b| {
        let entries = b.tower_collection(REGULARIZATION_LOSSES);
        let total = entries
            .into_iter()
            .map(|v| b.tensor_of(v))
            .reduce(|acc, t| acc + t);
        match total {
            Some(t) => t.named("regularize_cost"),
            None => b.scalar(DType::F32, 0.0).named("regularize_cost"),
        }
    })
}
