//! Gradient processors (tensorpack's `gradproc`): rewrite a list of `(variable, gradient)` pairs
//! by adding graph ops. Variable names are matched by regexes that must match the WHOLE name
//! (tensorpack appends `$` and uses `re.match`).
//!
//! `CheckGradient` cannot stop a step from inside the graph (the IR has no `check_numerics`):
//! it adds a `bool` scalar per variable, true when every element of the gradient is finite.
//! The trainer fetches these [`NumericCheck`]s with the step that computes the gradients and
//! turns a false one into [`OptimError::NonFiniteGradient`] naming the variable, with
//! [`check_numerics`].

use super::OptimError;
use super::state;
use crate::ir::{BinaryOp, Graph, IrError, Op, ReduceOp, UnaryOp, Value, VarId};
use crate::tensor::{DType, HostTensor};
use regex::Regex;
use std::fmt;
use std::sync::Arc;

/// The function of a `MapGradient`: `(graph, name scope for new nodes, variable, gradient)`
/// to the new gradient, or `None` to drop it (the variable is then not updated).
pub type GradientFn =
    Arc<dyn Fn(&mut Graph, &str, VarId, Value) -> Result<Option<Value>, IrError> + Send + Sync>;

/// One gradient processor.
#[derive(Clone)]
pub enum GradientProcessor {
    /// `tf.clip_by_global_norm`: every gradient times
    /// `max_norm * min(1 / global_norm, 1 / max_norm)`, where `global_norm` is the L2 norm of all
    /// gradients together. A non-finite global norm makes every gradient NaN (as TF), so a
    /// `CheckGradient` after it reports the problem.
    GlobalNormClip { max_norm: f64 },
    /// Applies `func` to the gradients of variables whose name fully matches `regex`.
    MapGradient {
        pattern: String,
        regex: Regex,
        func: GradientFn,
    },
    /// Multiplies the gradients of matching variables; the first matching regex wins and a
    /// multiplier of 0 drops the gradient.
    ScaleGradient { rules: Vec<(Regex, f64)> },
    /// Adds an "all finite" check per gradient (see the module docs).
    CheckGradient,
}

/// A `bool` scalar that is true when the gradient of `var` is finite everywhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumericCheck {
    pub var: VarId,
    /// The variable's full name, for the error message.
    pub variable: String,
    pub all_finite: Value,
}

/// The output of [`process_gradients`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessedGradients {
    pub grads: Vec<(VarId, Value)>,
    /// The checks added by `CheckGradient`, to fetch with every training step.
    pub checks: Vec<NumericCheck>,
    /// Things a user should hear about (e.g. a `MapGradient` regex that matched nothing).
    pub warnings: Vec<String>,
}

/// `pattern` compiled to match whole names only.
fn full_match(pattern: &str) -> Result<Regex, OptimError> {
    Regex::new(&format!("^(?:{pattern})$")).map_err(|e| OptimError::InvalidRegex {
        pattern: pattern.to_string(),
        message: e.to_string(),
    })
}

impl GradientProcessor {
    /// `GlobalNormClip(max_norm)`.
    pub fn global_norm_clip(max_norm: f64) -> Result<GradientProcessor, OptimError> {
        if !(max_norm > 0.0 && max_norm.is_finite()) {
            return Err(OptimError::InvalidSetting {
                optimizer: "GlobalNormClip".into(),
                what: "max_norm".into(),
                value: max_norm.to_string(),
            });
        }
        Ok(GradientProcessor::GlobalNormClip { max_norm })
    }

    /// `MapGradient(func, regex)`.
    pub fn map_gradient(
        regex: &str,
        func: impl Fn(&mut Graph, &str, VarId, Value) -> Result<Option<Value>, IrError>
        + Send
        + Sync
        + 'static,
    ) -> Result<GradientProcessor, OptimError> {
        Ok(GradientProcessor::MapGradient {
            pattern: regex.to_string(),
            regex: full_match(regex)?,
            func: Arc::new(func),
        })
    }

    /// `ScaleGradient([(regex, multiplier), ...])`.
    pub fn scale_gradient(rules: &[(&str, f64)]) -> Result<GradientProcessor, OptimError> {
        let rules = rules
            .iter()
            .map(|&(p, m)| Ok((full_match(p)?, m)))
            .collect::<Result<_, OptimError>>()?;
        Ok(GradientProcessor::ScaleGradient { rules })
    }

    /// `CheckGradient()`.
    pub fn check_gradient() -> GradientProcessor {
        GradientProcessor::CheckGradient
    }

    fn name(&self) -> &'static str {
        match self {
            GradientProcessor::GlobalNormClip { .. } => "GlobalNormClip",
            GradientProcessor::MapGradient { .. } => "MapGradient",
            GradientProcessor::ScaleGradient { .. } => "ScaleGradient",
            GradientProcessor::CheckGradient => "CheckGradient",
        }
    }
}

impl fmt::Debug for GradientProcessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GradientProcessor::GlobalNormClip { max_norm } => {
                write!(f, "GlobalNormClip({max_norm})")
            }
            GradientProcessor::MapGradient { pattern, .. } => write!(f, "MapGradient({pattern:?})"),
            GradientProcessor::ScaleGradient { rules } => {
                let r: Vec<_> = rules.iter().map(|(re, m)| (re.as_str(), m)).collect();
                write!(f, "ScaleGradient({r:?})")
            }
            GradientProcessor::CheckGradient => f.write_str("CheckGradient"),
        }
    }
}

/// Runs `processors` in order over `grads`.
pub fn process_gradients(
    graph: &mut Graph,
    grads: &[(VarId, Value)],
    processors: &[GradientProcessor],
) -> Result<ProcessedGradients, OptimError> {
    let mut out = ProcessedGradients {
        grads: grads.to_vec(),
        ..ProcessedGradients::default()
    };
    for p in processors {
        let scope = graph.unique_name(p.name());
        out.grads = match p {
            GradientProcessor::GlobalNormClip { max_norm } => {
                clip_by_global_norm(graph, &scope, &out.grads, *max_norm)?
            }
            GradientProcessor::MapGradient {
                pattern,
                regex,
                func,
            } => {
                let mut kept = Vec::with_capacity(out.grads.len());
                let mut matched = false;
                for &(var, g) in &out.grads {
                    let name = graph.variable(var).name.clone();
                    if !regex.is_match(&name) {
                        kept.push((var, g));
                        continue;
                    }
                    matched = true;
                    let Some(new) = func(graph, &format!("{scope}/{name}"), var, g)? else {
                        continue;
                    };
                    let (want, got) = (graph.value_type(g), graph.try_value_type(new));
                    if got != Some(want) {
                        return Err(OptimError::GradientType {
                            variable: name,
                            variable_ty: want.to_string(),
                            gradient_ty: got.map_or("nothing".into(), |t| t.to_string()),
                        });
                    }
                    kept.push((var, new));
                }
                if !matched {
                    out.warnings.push(format!(
                        "MapGradient: regex `{pattern}` matched no variable"
                    ));
                }
                kept
            }
            GradientProcessor::ScaleGradient { rules } => {
                let mut kept = Vec::with_capacity(out.grads.len());
                for &(var, g) in &out.grads {
                    let name = graph.variable(var).name.clone();
                    match rules.iter().find(|(re, _)| re.is_match(&name)) {
                        None => kept.push((var, g)),
                        Some((_, m)) if *m == 0.0 => {}
                        Some((_, m)) if *m == 1.0 => kept.push((var, g)),
                        Some((_, m)) => {
                            let s = format!("{scope}/{name}");
                            kept.push((var, scale(graph, &s, g, *m)?));
                        }
                    }
                }
                kept
            }
            GradientProcessor::CheckGradient => {
                for &(var, g) in &out.grads {
                    let variable = graph.variable(var).name.clone();
                    let all_finite = all_finite(graph, &format!("{scope}/{variable}"), g)?;
                    out.checks.push(NumericCheck {
                        var,
                        variable,
                        all_finite,
                    });
                }
                out.grads
            }
        };
    }
    Ok(out)
}

/// Turns fetched [`NumericCheck`] values (in the order of `checks`) into an error naming the
/// first variable whose gradient is not finite.
pub fn check_numerics(checks: &[NumericCheck], fetched: &[HostTensor]) -> Result<(), OptimError> {
    if checks.len() != fetched.len() {
        return Err(OptimError::CheckFetch {
            expected: checks.len(),
            got: fetched.len(),
        });
    }
    for (c, t) in checks.iter().zip(fetched) {
        if t.scalar_value().ok() != Some(1.0) {
            return Err(OptimError::NonFiniteGradient {
                variable: c.variable.clone(),
            });
        }
    }
    Ok(())
}

pub(crate) fn device(graph: &Graph, v: Value) -> Option<u16> {
    graph.node(v.node).device
}

fn reduce_all(
    graph: &mut Graph,
    name: &str,
    op: ReduceOp,
    x: Value,
    device: Option<u16>,
) -> Result<Value, OptimError> {
    let rank = graph.value_type(x).rank();
    if rank == 0 {
        return Ok(x);
    }
    let op = Op::Reduce {
        op,
        axes: (0..rank).collect(),
        keep_dims: false,
    };
    state::node(graph, name, op, &[x], device)
}

/// `g * m` with `m` in `g`'s dtype.
fn scale(graph: &mut Graph, scope: &str, g: Value, m: f64) -> Result<Value, OptimError> {
    let (dtype, dev) = (graph.value_type(g).dtype, device(graph, g));
    let k = state::constant(graph, &format!("{scope}/multiplier"), dtype, m, dev)?;
    state::node(
        graph,
        &format!("{scope}/mul"),
        Op::Binary(BinaryOp::Mul),
        &[g, k],
        dev,
    )
}

fn clip_by_global_norm(
    graph: &mut Graph,
    scope: &str,
    grads: &[(VarId, Value)],
    max_norm: f64,
) -> Result<Vec<(VarId, Value)>, OptimError> {
    let Some(&(_, first)) = grads.first() else {
        return Ok(Vec::new());
    };
    let dtype = graph.value_type(first).dtype;
    let mut total: Option<Value> = None;
    for &(var, g) in grads {
        let s = format!("{scope}/{}", graph.variable(var).name);
        let dev = device(graph, g);
        let sq = state::node(
            graph,
            &format!("{s}/square"),
            Op::Unary(UnaryOp::Square),
            &[g],
            dev,
        )?;
        let mut sum = reduce_all(graph, &format!("{s}/sum_sq"), ReduceOp::Sum, sq, dev)?;
        if graph.value_type(sum).dtype != dtype {
            sum = state::node(
                graph,
                &format!("{s}/cast"),
                Op::Cast { to: dtype },
                &[sum],
                dev,
            )?;
        }
        total = Some(match total {
            None => sum,
            Some(t) => {
                let name = format!("{scope}/total");
                state::node(graph, &name, Op::Binary(BinaryOp::Add), &[t, sum], None)?
            }
        });
    }
    let total = total.unwrap_or(first);
    let node = |graph: &mut Graph, part: &str, op: Op, ins: &[Value]| {
        state::node(graph, &format!("{scope}/{part}"), op, ins, None)
    };
    // scale = max_norm * min(1/norm, 1/max_norm) + (norm - norm): NaN when norm is not finite.
    let norm = node(graph, "global_norm", Op::Unary(UnaryOp::Sqrt), &[total])?;
    let inv_norm = node(graph, "inv_norm", Op::Unary(UnaryOp::Recip), &[norm])?;
    let inv_max = state::constant(
        graph,
        &format!("{scope}/inv_max"),
        dtype,
        1.0 / max_norm,
        None,
    )?;
    let limited = node(
        graph,
        "min",
        Op::Binary(BinaryOp::Minimum),
        &[inv_norm, inv_max],
    )?;
    let max = state::constant(graph, &format!("{scope}/max_norm"), dtype, max_norm, None)?;
    let finite_scale = node(graph, "scale", Op::Binary(BinaryOp::Mul), &[limited, max])?;
    let nan_if_inf = node(
        graph,
        "nan_if_inf",
        Op::Binary(BinaryOp::Sub),
        &[norm, norm],
    )?;
    let factor = node(
        graph,
        "factor",
        Op::Binary(BinaryOp::Add),
        &[finite_scale, nan_if_inf],
    )?;
    let mut out = Vec::with_capacity(grads.len());
    for &(var, g) in grads {
        let s = format!("{scope}/{}", graph.variable(var).name);
        let (gd, dev) = (graph.value_type(g).dtype, device(graph, g));
        let mut f = factor;
        if gd != dtype {
            f = state::node(graph, &format!("{s}/cast"), Op::Cast { to: gd }, &[f], dev)?;
        }
        let clipped = state::node(
            graph,
            &format!("{s}/clipped"),
            Op::Binary(BinaryOp::Mul),
            &[g, f],
            dev,
        )?;
        out.push((var, clipped));
    }
    Ok(out)
}

/// `sum(!(|g| < inf)) == 0`: NaN and ±inf both fail `|g| < inf`.
pub(crate) fn all_finite(graph: &mut Graph, scope: &str, g: Value) -> Result<Value, OptimError> {
    all_finite_times(graph, scope, g, None)
}

/// `f32` 1 where `abs` (magnitudes, of `dtype`) is not `< inf` — NaN and ±inf alike — and 0
/// elsewhere: the one definition of a non-finite value the checks count. Nodes named under
/// `scope`, on `dev`.
pub(crate) fn not_finite(
    graph: &mut Graph,
    scope: &str,
    abs: Value,
    dtype: DType,
    dev: Option<u16>,
) -> Result<Value, OptimError> {
    let node = |graph: &mut Graph, part: &str, op: Op, ins: &[Value]| {
        state::node(graph, &format!("{scope}/{part}"), op, ins, dev)
    };
    let inf = state::constant(graph, &format!("{scope}/inf"), dtype, f64::INFINITY, dev)?;
    let finite = node(graph, "finite", Op::Binary(BinaryOp::Lt), &[abs, inf])?;
    let bad = node(graph, "not_finite", Op::Unary(UnaryOp::Not), &[finite])?;
    node(graph, "cast", Op::Cast { to: DType::F32 }, &[bad])
}

/// [`all_finite`] of `g · factor` for a positive scalar `factor` (when given), computed as
/// `|g| · factor < inf` — the same value as `|g · factor|`, so the check does not share the
/// product `g · factor` with the update that reads it (the update then fuses its own copy).
pub(crate) fn all_finite_times(
    graph: &mut Graph,
    scope: &str,
    g: Value,
    factor: Option<Value>,
) -> Result<Value, OptimError> {
    let (dtype, dev) = (graph.value_type(g).dtype, device(graph, g));
    let node = |graph: &mut Graph, part: &str, op: Op, ins: &[Value]| {
        state::node(graph, &format!("{scope}/{part}"), op, ins, dev)
    };
    let mut abs = node(graph, "abs", Op::Unary(UnaryOp::Abs), &[g])?;
    if let Some(factor) = factor {
        abs = node(
            graph,
            "abs_times",
            Op::Binary(BinaryOp::Mul),
            &[abs, factor],
        )?;
    }
    let bad = not_finite(graph, scope, abs, dtype, dev)?;
    let count = reduce_all(graph, &format!("{scope}/count"), ReduceOp::Sum, bad, dev)?;
    let zero = state::constant(graph, &format!("{scope}/zero"), DType::F32, 0.0, dev)?;
    node(
        graph,
        "all_finite",
        Op::Binary(BinaryOp::Eq),
        &[count, zero],
    )
}
