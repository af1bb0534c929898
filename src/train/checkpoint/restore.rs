//! Matching checkpoint tensors to graph variables (tensorpack's `SaverRestore`, `DictRestore` and
//! `SaverRestoreRelaxed`): names match exactly (a trailing `:0` is ignored on both sides), an
//! optional prefix is stripped from graph names, and names present on one side only are reported
//! in both directions — except "training-only" names, which are expected to differ.
//!
//! Decision on `global_step` and `learning_rate`: they are NOT training-only (tensorpack does not
//! treat them so either); a checkpoint without `global_step` restarts the step count, which a
//! user should hear about.

use std::collections::{BTreeMap, BTreeSet};

use crate::tensor::{DType, HostTensor};

/// A variable on the graph side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VariableSpec {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// How strictly values must match their variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreMode {
    /// Dtype and shape must be equal; a difference is an error.
    Exact,
    /// Reshape when the element count matches, cast float↔float and widen integers
    /// (u8→i32/i64, i32→i64); anything else is reported and skipped.
    Relaxed,
}

/// Options of [`match_for_restore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreOptions {
    pub mode: RestoreMode,
    /// Graph variables named `<prefix>/x` are matched to checkpoint key `x`.
    pub prefix: Option<String>,
    /// Names (checkpoint-side, `:0` optional) to leave alone.
    pub ignore: Vec<String>,
}

impl RestoreOptions {
    /// Exact mode, no prefix, nothing ignored.
    pub fn exact() -> RestoreOptions {
        RestoreOptions {
            mode: RestoreMode::Exact,
            prefix: None,
            ignore: Vec::new(),
        }
    }

    /// Relaxed mode, no prefix, nothing ignored.
    pub fn relaxed() -> RestoreOptions {
        RestoreOptions {
            mode: RestoreMode::Relaxed,
            ..RestoreOptions::exact()
        }
    }
}

/// An exact-mode mismatch: the variable, and both sides' dtype and shape.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "cannot restore variable `{name}`: the graph has {graph_dtype}{graph_shape:?}, the \
     checkpoint has {checkpoint_dtype}{checkpoint_shape:?}"
)]
pub struct RestoreError {
    pub name: String,
    pub graph_dtype: DType,
    pub graph_shape: Vec<usize>,
    pub checkpoint_dtype: DType,
    pub checkpoint_shape: Vec<usize>,
}

/// A relaxed-mode value that was converted or skipped: the variable and both sides.
#[derive(Clone, Debug, PartialEq)]
pub struct Adjustment {
    pub name: String,
    pub from: (DType, Vec<usize>),
    pub to: (DType, Vec<usize>),
}

/// Everything that did not match one to one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestoreReport {
    /// Checkpoint keys no graph variable uses (training-only names excluded).
    pub only_in_checkpoint: Vec<String>,
    /// Graph variables with no checkpoint key (training-only names excluded).
    pub only_in_graph: Vec<String>,
    /// Unmatched training-only names, either side: expected, not warned about.
    pub training_only_unmatched: Vec<String>,
    /// Names skipped because the options ignore them (graph names, and checkpoint keys no graph
    /// variable asked for).
    pub ignored: Vec<String>,
    /// Relaxed mode: values reshaped and/or cast to fit.
    pub converted: Vec<Adjustment>,
    /// Relaxed mode: values that could not fit, skipped.
    pub incompatible: Vec<Adjustment>,
}

impl RestoreReport {
    /// The lines to log as warnings (one per kind of mismatch), tensorpack-style.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.only_in_graph.is_empty() {
            out.push(format!(
                "The following variables are in the graph, but not found in the checkpoint: {}",
                self.only_in_graph.join(", ")
            ));
        }
        if !self.only_in_checkpoint.is_empty() {
            out.push(format!(
                "The following variables are in the checkpoint, but not found in the graph: {}",
                self.only_in_checkpoint.join(", ")
            ));
        }
        for a in &self.converted {
            out.push(format!(
                "Variable `{}` is {}{:?} in the graph; loaded a {}{:?} value after converting it",
                a.name, a.to.0, a.to.1, a.from.0, a.from.1
            ));
        }
        for a in &self.incompatible {
            out.push(format!(
                "Variable `{}` is {}{:?} in the graph but {}{:?} in the checkpoint; skipped",
                a.name, a.to.0, a.to.1, a.from.0, a.from.1
            ));
        }
        out
    }
}

/// What to assign: graph variable name → value of the graph's dtype and shape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestorePlan {
    pub assignments: Vec<(String, HostTensor)>,
    pub report: RestoreReport,
}

/// tensorpack's `is_training_name`: optimizer slots (`*/Momentum`, `*/Adam`, `*/Adam_1`,
/// RMSProp, Adagrad, Adadelta), moving-average summaries (`EMA/`), gradient accumulators
/// (`AccumGrad`) and `apply_gradients*`; and towerpack's FP16 loss scale (`LossScale/`). A `:0`
/// suffix is ignored.
pub fn is_training_only_name(name: &str) -> bool {
    let name = strip_output_index(name);
    const SLOT_SUFFIXES: [&str; 8] = [
        "/Adam",
        "/Adam_1",
        "/Momentum",
        "/Adadelta",
        "/Adadelta_1",
        "/RMSProp",
        "/RMSProp_1",
        "/Adagrad",
    ];
    SLOT_SUFFIXES.iter().any(|s| name.ends_with(s))
        || name.starts_with("EMA/")
        || name.contains("/EMA/")
        || name.starts_with("AccumGrad")
        || name.ends_with("/AccumGrad")
        || name.starts_with("apply_gradients")
        || name.starts_with("LossScale/")
}

fn strip_output_index(name: &str) -> &str {
    name.strip_suffix(":0").unwrap_or(name)
}

fn is_widening_int(from: DType, to: DType) -> bool {
    matches!(
        (from, to),
        (DType::U8, DType::I32) | (DType::U8, DType::I64) | (DType::I32, DType::I64)
    )
}

/// Matches `graph` variables to `checkpoint` tensors (see the module doc). Exact mode fails on
/// the first dtype or shape difference; relaxed mode converts or skips and reports.
pub fn match_for_restore(
    graph: &[VariableSpec],
    checkpoint: &BTreeMap<String, HostTensor>,
    options: &RestoreOptions,
) -> Result<RestorePlan, RestoreError> {
    // Normalized key → original key; "x" sorts before "x:0", so a plain name wins a collision.
    let mut keys: BTreeMap<&str, &str> = BTreeMap::new();
    for key in checkpoint.keys() {
        keys.entry(strip_output_index(key)).or_insert(key.as_str());
    }
    let ignore: BTreeSet<&str> = options
        .ignore
        .iter()
        .map(|n| strip_output_index(n))
        .collect();
    let mut used: BTreeSet<&str> = BTreeSet::new();
    let mut plan = RestorePlan::default();
    for var in graph {
        let graph_name = strip_output_index(&var.name);
        let key = options
            .prefix
            .as_deref()
            .and_then(|p| graph_name.strip_prefix(p)?.strip_prefix('/'))
            .unwrap_or(graph_name);
        if ignore.contains(key) || ignore.contains(graph_name) {
            plan.report.ignored.push(var.name.clone());
            used.insert(key);
            continue;
        }
        let Some(original) = keys.get(key) else {
            if is_training_only_name(key) {
                plan.report.training_only_unmatched.push(var.name.clone());
            } else {
                plan.report.only_in_graph.push(var.name.clone());
            }
            continue;
        };
        used.insert(key);
        let value = &checkpoint[*original];
        let adjustment = Adjustment {
            name: var.name.clone(),
            from: (value.dtype(), value.shape().to_vec()),
            to: (var.dtype, var.shape.clone()),
        };
        if value.dtype() == var.dtype && value.shape() == var.shape.as_slice() {
            plan.assignments.push((var.name.clone(), value.clone()));
            continue;
        }
        if options.mode == RestoreMode::Exact {
            return Err(RestoreError {
                name: var.name.clone(),
                graph_dtype: var.dtype,
                graph_shape: var.shape.clone(),
                checkpoint_dtype: value.dtype(),
                checkpoint_shape: value.shape().to_vec(),
            });
        }
        let dtype_ok = value.dtype() == var.dtype
            || (value.dtype().is_float() && var.dtype.is_float())
            || is_widening_int(value.dtype(), var.dtype);
        let count_ok = value.len() == var.shape.iter().product::<usize>();
        if !(dtype_ok && count_ok) {
            plan.report.incompatible.push(adjustment);
            continue;
        }
        match value.cast(var.dtype).reshape(&var.shape) {
            Ok(converted) => {
                plan.assignments.push((var.name.clone(), converted));
                plan.report.converted.push(adjustment);
            }
            // Unreachable after the element-count check; reported rather than trusted.
            Err(_) => plan.report.incompatible.push(adjustment),
        }
    }
    for (key, original) in &keys {
        if used.contains(key) {
            continue;
        }
        if ignore.contains(key) {
            plan.report.ignored.push(original.to_string());
            continue;
        }
        if is_training_only_name(key) {
            plan.report
                .training_only_unmatched
                .push(original.to_string());
        } else {
            plan.report.only_in_checkpoint.push(original.to_string());
        }
    }
    // Keys shadowed by a collision ("x:0" next to "x") are unused checkpoint entries too.
    for key in checkpoint.keys() {
        if keys.get(strip_output_index(key)) != Some(&key.as_str()) {
            plan.report.only_in_checkpoint.push(key.clone());
        }
    }
    Ok(plan)
}
