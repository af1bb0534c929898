//! The one table between ops and their textual attributes, both ways: [`op_attrs`] prints the
//! attributes of an op and [`build_op`] reads them back; likewise [`fmt_initializer`] and
//! [`build_initializer`] for variable initializers. Keeping both directions side by side keeps
//! them in step.

use super::attrs::{
    AttrMap, as_bool, as_choice, as_dtype, as_f64, as_list, as_padding, as_pairs, as_reduce_op,
    as_shape, as_tensor, as_u64, as_usize, as_usize_list, as_usize_pair,
};
use super::error::{At, at};
use super::literal::{MAX_DIM, MAX_STEP, fmt_f64, fmt_string, fmt_tensor};
use crate::ir::{
    BinaryOp, Conv2dAttrs, Distribution, FanMode, Initializer, Op, Padding, PoolAttrs, PoolKind,
    ReduceOp, Shape, UnaryOp,
};

fn list(items: impl IntoIterator<Item = impl ToString>) -> String {
    let items: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    format!("[{}]", items.join(","))
}

fn pairs(items: &[(usize, usize)]) -> String {
    list(items.iter().map(|(a, b)| list([a, b])))
}

fn padding(p: Padding) -> String {
    match p {
        Padding::Same => "same".into(),
        Padding::Valid => "valid".into(),
        Padding::Explicit(p) => pairs(&p),
    }
}

fn conv_attrs(a: &Conv2dAttrs) -> Vec<(&'static str, String)> {
    vec![
        ("strides", list(a.strides)),
        ("padding", padding(a.padding)),
        ("dilations", list(a.dilations)),
        ("groups", a.groups.to_string()),
    ]
}

fn pool_attrs(a: &PoolAttrs, implied: PoolKind) -> Vec<(&'static str, String)> {
    let mut out = vec![
        ("window", list(a.window)),
        ("strides", list(a.strides)),
        ("padding", padding(a.padding)),
    ];
    // The gradient ops imply their pooling kind; the other one is printed only when set.
    if a.kind != implied {
        out.push(("kind", pool_kind_name(a.kind).into()));
    }
    out
}

fn pool_kind_name(k: PoolKind) -> &'static str {
    match k {
        PoolKind::Max => "max",
        PoolKind::Avg => "avg",
    }
}

fn shape_text(s: &Shape) -> String {
    s.to_string()
}

/// The attributes of `op` as printed, `(key, value)` in canonical order. The variable of
/// `variable`/`assign` is an operand, and the type of `input` is its output type: neither is an
/// attribute.
pub(crate) fn op_attrs(op: &Op) -> Vec<(&'static str, String)> {
    let b = |v: bool| v.to_string();
    match op {
        Op::Input { name, .. } => vec![("name", fmt_string(name))],
        Op::Constant { value } => vec![("value", fmt_tensor(value))],
        Op::Variable { .. }
        | Op::Assign { .. }
        | Op::Group
        | Op::Identity
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Select
        | Op::SparseSoftmaxCrossEntropy => vec![],
        Op::Cast { to } => vec![("to", to.to_string())],
        Op::Reshape { shape } | Op::Broadcast { shape } => vec![("shape", shape_text(shape))],
        Op::Transpose { perm } => vec![("perm", list(perm))],
        Op::Slice { axis, start, end } => vec![
            ("axis", axis.to_string()),
            ("start", start.to_string()),
            ("end", end.to_string()),
        ],
        Op::Concat { axis }
        | Op::ArgMax { axis }
        | Op::Softmax { axis }
        | Op::LogSoftmax { axis } => vec![("axis", axis.to_string())],
        Op::Pad { pads } => vec![("pads", pairs(pads))],
        Op::Reduce {
            axes, keep_dims, ..
        }
        | Op::Moments { axes, keep_dims } => {
            vec![("axes", list(axes)), ("keep_dims", b(*keep_dims))]
        }
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => vec![
            ("transpose_a", b(*transpose_a)),
            ("transpose_b", b(*transpose_b)),
        ],
        Op::Conv2d(a) => conv_attrs(a),
        Op::Conv2dBackpropInput { attrs, input_hw } => {
            let mut v = conv_attrs(attrs);
            v.push(("input_hw", list(input_hw)));
            v
        }
        Op::Conv2dBackpropFilter { attrs, filter_hw } => {
            let mut v = conv_attrs(attrs);
            v.push(("filter_hw", list(filter_hw)));
            v
        }
        Op::Pool(a) => pool_attrs(a, a.kind),
        Op::MaxPoolGrad(a) => pool_attrs(a, PoolKind::Max),
        Op::AvgPoolGrad { attrs, input_hw } => {
            let mut v = pool_attrs(attrs, PoolKind::Avg);
            v.insert(3, ("input_hw", list(input_hw)));
            v
        }
        Op::OneHot { depth } => vec![("depth", depth.to_string())],
        Op::InTopK { k } => vec![("k", k.to_string())],
        Op::RandomUniform { seed } => vec![("seed", seed.to_string())],
        Op::AllReduce { op } => vec![("op", op.name().trim_start_matches("reduce_").to_string())],
    }
}

fn read_conv(m: &mut AttrMap<'_>) -> Result<Conv2dAttrs, At> {
    Ok(Conv2dAttrs {
        strides: as_usize_pair(m.get("strides")?, MAX_STEP)?,
        padding: as_padding(m.get("padding")?)?,
        dilations: as_usize_pair(m.get("dilations")?, MAX_STEP)?,
        groups: as_usize(m.get("groups")?, MAX_STEP)?,
    })
}

/// Pool attributes; the gradient ops (`with_kind`) also take an optional `kind`.
fn read_pool(m: &mut AttrMap<'_>, implied: PoolKind, with_kind: bool) -> Result<PoolAttrs, At> {
    let window = as_usize_pair(m.get("window")?, MAX_DIM)?;
    let strides = as_usize_pair(m.get("strides")?, MAX_STEP)?;
    let padding = as_padding(m.get("padding")?)?;
    let given = if with_kind { m.optional("kind") } else { None };
    let kind = match given {
        None => implied,
        Some(v) => match as_choice(v, &["max", "avg"])? {
            "max" => PoolKind::Max,
            _ => PoolKind::Avg,
        },
    };
    Ok(PoolAttrs {
        kind,
        window,
        strides,
        padding,
    })
}

fn axis(m: &mut AttrMap<'_>) -> Result<usize, At> {
    as_usize(m.get("axis")?, u64::MAX)
}

fn reshape_target(m: &mut AttrMap<'_>) -> Result<Shape, At> {
    let v = m.get("shape")?;
    as_shape(as_list(v, None)?, &v.span)
}

/// Builds an op of a kind that needs no context beyond its attributes (every kind but `input`,
/// `variable` and `assign`). `Ok(None)` when `kind` names no such op.
pub(crate) fn build_op(kind: &str, m: &mut AttrMap<'_>) -> Result<Option<Op>, At> {
    if let Some(&u) = UnaryOp::ALL.iter().find(|u| u.name() == kind) {
        return Ok(Some(Op::Unary(u)));
    }
    if let Some(&b) = BinaryOp::ALL.iter().find(|b| b.name() == kind) {
        return Ok(Some(Op::Binary(b)));
    }
    if let Some(&op) = ReduceOp::ALL.iter().find(|r| r.name() == kind) {
        return Ok(Some(Op::Reduce {
            op,
            axes: as_usize_list(m.get("axes")?, u64::MAX)?,
            keep_dims: as_bool(m.get("keep_dims")?)?,
        }));
    }
    let op = match kind {
        "constant" => Op::Constant {
            value: as_tensor(m.get("value")?)?,
        },
        "group" => Op::Group,
        "identity" => Op::Identity,
        "select" => Op::Select,
        "sparse_softmax_cross_entropy" => Op::SparseSoftmaxCrossEntropy,
        "cast" => Op::Cast {
            to: as_dtype(m.get("to")?)?,
        },
        "reshape" => Op::Reshape {
            shape: reshape_target(m)?,
        },
        "broadcast" => Op::Broadcast {
            shape: reshape_target(m)?,
        },
        "transpose" => Op::Transpose {
            perm: as_usize_list(m.get("perm")?, u64::MAX)?,
        },
        "slice" => Op::Slice {
            axis: axis(m)?,
            start: as_usize(m.get("start")?, u64::MAX)?,
            end: as_usize(m.get("end")?, u64::MAX)?,
        },
        "concat" => Op::Concat { axis: axis(m)? },
        "pad" => Op::Pad {
            pads: as_pairs(m.get("pads")?, MAX_DIM)?,
        },
        "argmax" => Op::ArgMax { axis: axis(m)? },
        "moments" => Op::Moments {
            axes: as_usize_list(m.get("axes")?, u64::MAX)?,
            keep_dims: as_bool(m.get("keep_dims")?)?,
        },
        "matmul" => Op::MatMul {
            transpose_a: as_bool(m.get("transpose_a")?)?,
            transpose_b: as_bool(m.get("transpose_b")?)?,
        },
        "conv2d" => Op::Conv2d(read_conv(m)?),
        "conv2d_backprop_input" => Op::Conv2dBackpropInput {
            attrs: read_conv(m)?,
            input_hw: as_usize_pair(m.get("input_hw")?, MAX_DIM)?,
        },
        "conv2d_backprop_filter" => Op::Conv2dBackpropFilter {
            attrs: read_conv(m)?,
            filter_hw: as_usize_pair(m.get("filter_hw")?, MAX_DIM)?,
        },
        "max_pool" => Op::Pool(read_pool(m, PoolKind::Max, false)?),
        "avg_pool" => Op::Pool(read_pool(m, PoolKind::Avg, false)?),
        "max_pool_grad" => Op::MaxPoolGrad(read_pool(m, PoolKind::Max, true)?),
        "avg_pool_grad" => {
            let attrs = read_pool(m, PoolKind::Avg, true)?;
            Op::AvgPoolGrad {
                attrs,
                input_hw: as_usize_pair(m.get("input_hw")?, MAX_DIM)?,
            }
        }
        "softmax" => Op::Softmax { axis: axis(m)? },
        "log_softmax" => Op::LogSoftmax { axis: axis(m)? },
        "one_hot" => Op::OneHot {
            depth: as_usize(m.get("depth")?, MAX_DIM)?,
        },
        "in_top_k" => Op::InTopK {
            k: as_usize(m.get("k")?, u64::MAX)?,
        },
        "all_reduce" => Op::AllReduce {
            op: as_reduce_op(m.get("op")?)?,
        },
        "random_uniform" => Op::RandomUniform {
            seed: as_u64(m.get("seed")?, u64::MAX)?,
        },
        _ => return Ok(None),
    };
    Ok(Some(op))
}

fn fan_mode_name(m: FanMode) -> &'static str {
    match m {
        FanMode::FanIn => "fan_in",
        FanMode::FanOut => "fan_out",
        FanMode::FanAvg => "fan_avg",
    }
}

fn distribution_name(d: Distribution) -> &'static str {
    match d {
        Distribution::Normal => "normal",
        Distribution::TruncatedNormal => "truncated_normal",
        Distribution::Uniform => "uniform",
    }
}

/// An initializer as printed: `zeros`, `normal(mean=0.0, stddev=0.01)`, ...
pub(crate) fn fmt_initializer(init: &Initializer) -> String {
    match init {
        Initializer::Zeros => "zeros".into(),
        Initializer::Ones => "ones".into(),
        Initializer::Constant(c) => format!("constant(value={})", fmt_f64(*c)),
        Initializer::Uniform { low, high } => {
            format!("uniform(low={}, high={})", fmt_f64(*low), fmt_f64(*high))
        }
        Initializer::Normal { mean, stddev } => format!(
            "normal(mean={}, stddev={})",
            fmt_f64(*mean),
            fmt_f64(*stddev)
        ),
        Initializer::TruncatedNormal { mean, stddev } => format!(
            "truncated_normal(mean={}, stddev={})",
            fmt_f64(*mean),
            fmt_f64(*stddev)
        ),
        Initializer::VarianceScaling {
            scale,
            mode,
            distribution,
        } => format!(
            "variance_scaling(scale={}, mode={}, distribution={})",
            fmt_f64(*scale),
            fan_mode_name(*mode),
            distribution_name(*distribution)
        ),
        Initializer::Value(t) => format!("value(tensor={})", fmt_tensor(t)),
    }
}

/// Reads an initializer named `name` (written at `offset`) with its arguments.
pub(crate) fn build_initializer(
    name: &str,
    offset: usize,
    m: &mut AttrMap<'_>,
) -> Result<Initializer, At> {
    Ok(match name {
        "zeros" => Initializer::Zeros,
        "ones" => Initializer::Ones,
        "constant" => Initializer::Constant(as_f64(m.get("value")?)?),
        "uniform" => Initializer::Uniform {
            low: as_f64(m.get("low")?)?,
            high: as_f64(m.get("high")?)?,
        },
        "normal" => Initializer::Normal {
            mean: as_f64(m.get("mean")?)?,
            stddev: as_f64(m.get("stddev")?)?,
        },
        "truncated_normal" => Initializer::TruncatedNormal {
            mean: as_f64(m.get("mean")?)?,
            stddev: as_f64(m.get("stddev")?)?,
        },
        "variance_scaling" => {
            let scale = as_f64(m.get("scale")?)?;
            let mode = [FanMode::FanIn, FanMode::FanOut, FanMode::FanAvg];
            let names = mode.map(fan_mode_name);
            let chosen = as_choice(m.get("mode")?, &names)?;
            let mode = mode[names.iter().position(|n| *n == chosen).unwrap_or(0)];
            let dists = [
                Distribution::Normal,
                Distribution::TruncatedNormal,
                Distribution::Uniform,
            ];
            let names = dists.map(distribution_name);
            let chosen = as_choice(m.get("distribution")?, &names)?;
            let distribution = dists[names.iter().position(|n| *n == chosen).unwrap_or(0)];
            Initializer::VarianceScaling {
                scale,
                mode,
                distribution,
            }
        }
        "value" => Initializer::Value(as_tensor(m.get("tensor")?)?),
        other => {
            return Err(at(
                offset,
                format!(
                    "unknown initializer `{other}` (zeros, ones, constant, uniform, normal, \
                     truncated_normal, variance_scaling or value)"
                ),
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradient_pools_print_their_kind_only_when_it_is_not_implied() {
        let a = PoolAttrs {
            kind: PoolKind::Avg,
            window: [2, 2],
            strides: [2, 2],
            padding: Padding::Explicit([(0, 1), (1, 0)]),
        };
        let keys = |op: &Op| op_attrs(op).into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(keys(&Op::MaxPoolGrad(a)).last(), Some(&"kind"));
        let avg = Op::AvgPoolGrad {
            attrs: a,
            input_hw: [4, 4],
        };
        assert_eq!(keys(&avg), ["window", "strides", "padding", "input_hw"]);
        assert_eq!(op_attrs(&Op::MaxPoolGrad(a))[2].1, "[[0,1],[1,0]]");
    }
}
