//! One IR node → ONNX nodes (opset 17), for every op of the closed [`Op`] enum: a mapping, or
//! an [`OnnxError::Unsupported`] naming the node, the op, its input types and the reason.
//!
//! | IR | ONNX |
//! |---|---|
//! | `identity`, `cast` | `Identity`, `Cast` (float → integer refused: towerpack saturates, ONNX does not define it) |
//! | unary ops | `Neg` `Abs` `Sign` `Exp` `Log` `Sqrt` `Reciprocal` `Relu` `Sigmoid` `Tanh` `Floor` `Not`; `rsqrt` = `Sqrt`+`Reciprocal`, `square` = `Mul(x, x)` |
//! | binary ops | `Add` `Sub` `Mul` `Div` (floats; integer division by zero is 0 in towerpack, so refused) `Pow` `Max` `Min` `Equal` `Less` `LessOrEqual` `Greater` `GreaterOrEqual` `And` `Or`; `ne` = `Not(Equal)` |
//! | `select` | `Where` |
//! | `reshape` | `Reshape` with the batch as `-1` |
//! | `transpose`, `broadcast`, `slice`, `concat`, `pad` | `Transpose`, `Expand`, `Slice`, `Concat`, `Pad` (constant 0) |
//! | `reduce_*`, `argmax`, `moments` | `ReduceSum` (axes input) / `ReduceMean` `ReduceMax` `ReduceMin` (axes attribute in opset 17), `ArgMax`; `moments` as two `ReduceMean`s |
//! | `matmul` | `MatMul` (a `Transpose` for `transpose_a`/`_b`) |
//! | `conv2d`, `conv2d_backprop_input` | `Conv`, `ConvTranspose` on NCHW with explicit (possibly asymmetric) `pads`; filters transposed HWIO → OIHW |
//! | `max_pool`, `avg_pool` | `MaxPool`, `AveragePool` (`count_include_pad = 0`, as TF) |
//! | `softmax`, `log_softmax` | `Softmax`, `LogSoftmax` on one axis |
//!
//! Losses, one-hot, in-top-k, random and collective ops, gradients of convolution and pooling,
//! assigns and groups have no mapping: they have no place in a served model, or no ONNX op with
//! the same semantics.

use super::emit::Emitter;
use super::error::{OnnxError, unsupported};
use super::layout::Layout;
use super::proto::{Attr, data_type};
use crate::ir::{
    BinaryOp, Conv2dAttrs, Dim, Graph, NodeId, Op, Padding, PoolAttrs, PoolKind, ReduceOp, UnaryOp,
    Value, window_output,
};

/// Emits the ONNX nodes computing IR node `id` (not a source: those are the emitter's).
pub(super) fn emit_node(e: &mut Emitter, id: NodeId) -> Result<(), OnnxError> {
    let graph = e.graph;
    if let Some(reason) = refusal(graph, id) {
        return Err(unsupported(graph, id, reason));
    }
    let node = graph.node(id);
    let ins = graph.inputs(id);
    let out = Value::first(id);
    let out_rank = node.outputs.first().map_or(0, |t| t.rank());
    match &node.op {
        Op::Identity => same_layout(e, id, "Identity", &[]),
        Op::Cast { to } => {
            let from = graph.value_type(ins[0]).dtype;
            if from.is_float() && !to.is_float() {
                return Err(unsupported(
                    graph,
                    id,
                    "a float-to-integer cast saturates in towerpack but is undefined out of range \
                     in ONNX",
                ));
            }
            same_layout(
                e,
                id,
                "Cast",
                &[("to", Attr::Int(i64::from(data_type(*to))))],
            )
        }
        Op::Unary(u) => unary(e, id, *u),
        Op::Binary(b) => binary(e, id, *b),
        Op::Select => elementwise(e, id, "Where", &[]),
        Op::Reshape { shape } => {
            let x = e.plain(ins[0])?;
            let mut target = Vec::with_capacity(shape.rank());
            for d in shape.dims() {
                target.push(match d {
                    Dim::Batch => -1,
                    Dim::Fixed(0) => {
                        return Err(unsupported(
                            graph,
                            id,
                            "a zero-sized dimension next to the batch cannot be expressed with \
                             a -1 batch",
                        ));
                    }
                    Dim::Fixed(n) => *n as i64,
                });
            }
            let shape = e.i64_constant(&format!("{}/shape", node.name), &target);
            let y = e.define(out, Layout::plain(out_rank));
            e.push(id, "", "Reshape", &[&x, &shape], &[&y], &[]);
            Ok(())
        }
        Op::Transpose { perm } => {
            let x = e.plain(ins[0])?;
            let y = e.define(out, Layout::plain(out_rank));
            let perm = perm.iter().map(|&p| p as i64).collect();
            e.push(
                id,
                "",
                "Transpose",
                &[&x],
                &[&y],
                &[("perm", Attr::Ints(perm))],
            );
            Ok(())
        }
        Op::Broadcast { shape } => {
            let in_shape = graph.value_type(ins[0]).shape.clone();
            let offset = shape.rank().saturating_sub(in_shape.rank());
            let mut target = Vec::with_capacity(shape.rank());
            for (i, d) in shape.dims().iter().enumerate() {
                target.push(match d {
                    Dim::Fixed(n) => *n as i64,
                    // The input already carries the batch here: expanding by 1 keeps it.
                    Dim::Batch if i >= offset && in_shape.dim(i - offset) == Dim::Batch => 1,
                    Dim::Batch => {
                        return Err(unsupported(
                            graph,
                            id,
                            "broadcasting to the batch size needs the batch of another tensor",
                        ));
                    }
                });
            }
            let x = e.plain(ins[0])?;
            let shape = e.i64_constant(&format!("{}/shape", node.name), &target);
            let y = e.define(out, Layout::plain(out_rank));
            e.push(id, "", "Expand", &[&x, &shape], &[&y], &[]);
            Ok(())
        }
        Op::Slice { axis, start, end } => {
            let layout = e.layout_of(ins[0])?;
            let x = e.input_in(ins[0], &layout, id)?;
            let axis = layout.onnx_axis(*axis) as i64;
            let starts = e.i64_constant(&format!("{}/starts", node.name), &[*start as i64]);
            let ends = e.i64_constant(&format!("{}/ends", node.name), &[*end as i64]);
            let axes = e.i64_constant(&format!("{}/axes", node.name), &[axis]);
            let y = e.define(out, layout);
            e.push(id, "", "Slice", &[&x, &starts, &ends, &axes], &[&y], &[]);
            Ok(())
        }
        Op::Concat { axis } => {
            let layout = shared_layout(e, &ins, out_rank)?;
            let names = inputs_in(e, &ins, &layout, id)?;
            let axis = layout.onnx_axis(*axis) as i64;
            let y = e.define(out, layout);
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            e.push(id, "", "Concat", &refs, &[&y], &[("axis", Attr::Int(axis))]);
            Ok(())
        }
        Op::Pad { pads } => {
            let layout = e.layout_of(ins[0])?;
            let x = e.input_in(ins[0], &layout, id)?;
            let before: Vec<i64> = pads.iter().map(|p| p.0 as i64).collect();
            let after: Vec<i64> = pads.iter().map(|p| p.1 as i64).collect();
            let mut onnx_pads = layout.apply(&before);
            onnx_pads.extend(layout.apply(&after));
            let pads = e.i64_constant(&format!("{}/pads", node.name), &onnx_pads);
            let y = e.define(out, layout);
            e.push(id, "", "Pad", &[&x, &pads], &[&y], &[]);
            Ok(())
        }
        Op::Reduce {
            op,
            axes,
            keep_dims,
        } => {
            if axes.is_empty() {
                return same_layout(e, id, "Identity", &[]);
            }
            let layout = e.layout_of(ins[0])?;
            let x = e.input_in(ins[0], &layout, id)?;
            let out_layout = if *keep_dims {
                layout.clone()
            } else {
                layout.without_axes(axes)
            };
            let y = e.define(out, out_layout);
            reduce(e, id, "", *op, &x, &layout, axes, *keep_dims, &y);
            Ok(())
        }
        Op::ArgMax { axis } => {
            let layout = e.layout_of(ins[0])?;
            let x = e.input_in(ins[0], &layout, id)?;
            let onnx_axis = layout.onnx_axis(*axis) as i64;
            let y = e.define(out, layout.without_axes(&[*axis]));
            let attrs = [("axis", Attr::Int(onnx_axis)), ("keepdims", Attr::Int(0))];
            e.push(id, "", "ArgMax", &[&x], &[&y], &attrs);
            Ok(())
        }
        Op::Moments { axes, keep_dims } => {
            let layout = e.layout_of(ins[0])?;
            let x = e.input_in(ins[0], &layout, id)?;
            let out_layout = if *keep_dims {
                layout.clone()
            } else {
                layout.without_axes(axes)
            };
            let mean = e.define(out, out_layout.clone());
            let mean_kept = if *keep_dims {
                mean.clone()
            } else {
                let m = e.fresh(&format!("{}/mean_kept", node.name));
                reduce(
                    e,
                    id,
                    "mean_kept",
                    ReduceOp::Mean,
                    &x,
                    &layout,
                    axes,
                    true,
                    &m,
                );
                m
            };
            reduce(
                e,
                id,
                "mean",
                ReduceOp::Mean,
                &x,
                &layout,
                axes,
                *keep_dims,
                &mean,
            );
            let diff = e.fresh(&format!("{}/centered", node.name));
            e.push(id, "centered", "Sub", &[&x, &mean_kept], &[&diff], &[]);
            let sq = e.fresh(&format!("{}/squared", node.name));
            e.push(id, "squared", "Mul", &[&diff, &diff], &[&sq], &[]);
            let var = e.define(Value::new(id, 1), out_layout);
            reduce(
                e,
                id,
                "variance",
                ReduceOp::Mean,
                &sq,
                &layout,
                axes,
                *keep_dims,
                &var,
            );
            Ok(())
        }
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => {
            let mut operands = Vec::with_capacity(2);
            for (v, flip) in [(ins[0], *transpose_a), (ins[1], *transpose_b)] {
                let name = e.plain(v)?;
                if !flip {
                    operands.push(name);
                    continue;
                }
                let rank = graph.value_type(v).rank();
                let mut perm: Vec<i64> = (0..rank as i64).collect();
                perm.swap(rank - 2, rank - 1);
                let t = e.fresh(&format!("{name}/T"));
                e.push(
                    id,
                    "transpose",
                    "Transpose",
                    &[&name],
                    &[&t],
                    &[("perm", Attr::Ints(perm))],
                );
                operands.push(t);
            }
            let y = e.define(out, Layout::plain(out_rank));
            e.push(id, "", "MatMul", &[&operands[0], &operands[1]], &[&y], &[]);
            Ok(())
        }
        Op::Conv2d(attrs) => conv(e, id, attrs),
        Op::Conv2dBackpropInput { attrs, input_hw } => conv_transpose(e, id, attrs, *input_hw),
        Op::Pool(attrs) => pool(e, id, attrs),
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            let op_type = if matches!(node.op, Op::Softmax { .. }) {
                "Softmax"
            } else {
                "LogSoftmax"
            };
            let layout = e.layout_of(ins[0])?;
            let x = e.input_in(ins[0], &layout, id)?;
            let axis = layout.onnx_axis(*axis) as i64;
            let y = e.define(out, layout);
            e.push(id, "", op_type, &[&x], &[&y], &[("axis", Attr::Int(axis))]);
            Ok(())
        }
        Op::Input { .. } | Op::Constant { .. } | Op::Variable { .. } => Err(OnnxError::Internal(
            format!("source {} reached the op mapping", node.name),
        )),
        Op::Assign { .. }
        | Op::Group
        | Op::Conv2dBackpropFilter { .. }
        | Op::MaxPoolGrad(_)
        | Op::AvgPoolGrad { .. }
        | Op::SparseSoftmaxCrossEntropy
        | Op::OneHot { .. }
        | Op::InTopK { .. }
        | Op::RandomUniform { .. }
        | Op::AllReduce { .. } => Err(unsupported(
            graph,
            id,
            refusal(graph, id).unwrap_or("no mapping"),
        )),
    }
}

/// Why node `id` cannot be exported, if it cannot — whatever the layouts of its operands, so
/// the exporter checks every node with it before writing anything.
pub(super) fn refusal(graph: &Graph, id: NodeId) -> Option<&'static str> {
    let node = graph.node(id);
    let first_dtype = || {
        graph
            .inputs(id)
            .first()
            .and_then(|&v| graph.try_value_type(v))
            .map(|t| t.dtype)
    };
    match &node.op {
        Op::Assign { .. } | Op::Group => {
            Some("a side effect (variable update); export an inference tower")
        }
        Op::Conv2dBackpropFilter { .. } | Op::MaxPoolGrad(_) | Op::AvgPoolGrad { .. } => {
            Some("a gradient op; export an inference tower")
        }
        Op::SparseSoftmaxCrossEntropy => {
            Some("a training loss; export the logits (e.g. `linear/output`) instead")
        }
        Op::OneHot { .. } => Some("ONNX OneHot wraps negative labels where towerpack gives zeros"),
        Op::InTopK { .. } => Some("no ONNX op tests top-k membership"),
        Op::RandomUniform { .. } => Some(
            "towerpack's counter-based random numbers cannot be reproduced by ONNX's generators \
             (dropout in training mode?)",
        ),
        Op::AllReduce { .. } => Some("a cross-process collective of distributed training"),
        Op::Binary(BinaryOp::Div) if first_dtype().is_some_and(|d| !d.is_float()) => {
            Some("integer division by zero gives 0 in towerpack and is undefined in ONNX")
        }
        Op::Cast { to } if first_dtype().is_some_and(|d| d.is_float()) && !to.is_float() => Some(
            "a float-to-integer cast saturates in towerpack but is undefined out of range in ONNX",
        ),
        Op::Conv2dBackpropInput { attrs, .. } if attrs.groups != 1 => {
            Some("grouped transposed convolutions are not mapped")
        }
        _ => None,
    }
}

/// A one-input op that keeps its input's layout.
fn same_layout(
    e: &mut Emitter,
    id: NodeId,
    op_type: &str,
    attrs: &[(&str, Attr)],
) -> Result<(), OnnxError> {
    let x = e.graph.inputs(id)[0];
    let layout = e.layout_of(x)?;
    let name = e.input_in(x, &layout, id)?;
    let y = e.define(Value::first(id), layout);
    e.push(id, "", op_type, &[&name], &[&y], attrs);
    Ok(())
}

/// The layout an op over `ins` computes in: that of its first full-rank operand held in a
/// non-plain layout (so a chain of NCHW values stays NCHW), else plain.
fn shared_layout(e: &Emitter, ins: &[Value], rank: usize) -> Result<Layout, OnnxError> {
    for &v in ins {
        let l = e.layout_of(v)?;
        if l.rank() == rank && !l.is_plain() {
            return Ok(l);
        }
    }
    Ok(Layout::plain(rank))
}

fn inputs_in(
    e: &mut Emitter,
    ins: &[Value],
    layout: &Layout,
    id: NodeId,
) -> Result<Vec<String>, OnnxError> {
    ins.iter().map(|&v| e.input_in(v, layout, id)).collect()
}

/// A broadcasting elementwise op computed in the operands' shared layout.
fn elementwise(
    e: &mut Emitter,
    id: NodeId,
    op_type: &str,
    attrs: &[(&str, Attr)],
) -> Result<(), OnnxError> {
    let ins = e.graph.inputs(id);
    let rank = e.graph.node(id).outputs.first().map_or(0, |t| t.rank());
    let layout = shared_layout(e, &ins, rank)?;
    let names = inputs_in(e, &ins, &layout, id)?;
    let y = e.define(Value::first(id), layout);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    e.push(id, "", op_type, &refs, &[&y], attrs);
    Ok(())
}

fn unary(e: &mut Emitter, id: NodeId, op: UnaryOp) -> Result<(), OnnxError> {
    let direct = match op {
        UnaryOp::Neg => "Neg",
        UnaryOp::Abs => "Abs",
        UnaryOp::Sign => "Sign",
        UnaryOp::Exp => "Exp",
        UnaryOp::Log => "Log",
        UnaryOp::Sqrt => "Sqrt",
        UnaryOp::Recip => "Reciprocal",
        UnaryOp::Relu => "Relu",
        UnaryOp::Sigmoid => "Sigmoid",
        UnaryOp::Tanh => "Tanh",
        UnaryOp::Not => "Not",
        UnaryOp::Floor => {
            let dtype = e.graph.value_type(e.graph.inputs(id)[0]).dtype;
            // Floor of an integer is the integer (ONNX's Floor takes floats only).
            if dtype.is_float() {
                "Floor"
            } else {
                "Identity"
            }
        }
        UnaryOp::Rsqrt | UnaryOp::Square => {
            let x = e.graph.inputs(id)[0];
            let layout = e.layout_of(x)?;
            let name = e.input_in(x, &layout, id)?;
            let y = e.define(Value::first(id), layout);
            if op == UnaryOp::Square {
                e.push(id, "", "Mul", &[&name, &name], &[&y], &[]);
            } else {
                let s = e.fresh(&format!("{}/sqrt", e.graph.node(id).name));
                e.push(id, "sqrt", "Sqrt", &[&name], &[&s], &[]);
                e.push(id, "", "Reciprocal", &[&s], &[&y], &[]);
            }
            return Ok(());
        }
    };
    same_layout(e, id, direct, &[])
}

fn binary(e: &mut Emitter, id: NodeId, op: BinaryOp) -> Result<(), OnnxError> {
    let op_type = match op {
        BinaryOp::Add => "Add",
        BinaryOp::Sub => "Sub",
        BinaryOp::Mul => "Mul",
        BinaryOp::Div => "Div",
        BinaryOp::Pow => "Pow",
        BinaryOp::Maximum => "Max",
        BinaryOp::Minimum => "Min",
        BinaryOp::Eq => "Equal",
        BinaryOp::Lt => "Less",
        BinaryOp::Le => "LessOrEqual",
        BinaryOp::Gt => "Greater",
        BinaryOp::Ge => "GreaterOrEqual",
        BinaryOp::And => "And",
        BinaryOp::Or => "Or",
        BinaryOp::Ne => {
            // Not(Equal(a, b)), both in the shared layout.
            let ins = e.graph.inputs(id);
            let layout = shared_layout(e, &ins, e.graph.node(id).outputs[0].rank())?;
            let names = inputs_in(e, &ins, &layout, id)?;
            let eq = e.fresh(&format!("{}/equal", e.graph.node(id).name));
            e.push(id, "equal", "Equal", &[&names[0], &names[1]], &[&eq], &[]);
            let y = e.define(Value::first(id), layout);
            e.push(id, "", "Not", &[&eq], &[&y], &[]);
            return Ok(());
        }
    };
    elementwise(e, id, op_type, &[])
}

/// `ReduceSum` takes its axes as an input in opset 13+; the others as an attribute until 18.
#[allow(clippy::too_many_arguments)]
fn reduce(
    e: &mut Emitter,
    id: NodeId,
    suffix: &str,
    op: ReduceOp,
    x: &str,
    layout: &Layout,
    axes: &[usize],
    keep_dims: bool,
    y: &str,
) {
    let onnx_axes: Vec<i64> = axes.iter().map(|&a| layout.onnx_axis(a) as i64).collect();
    let keep = ("keepdims", Attr::Int(i64::from(keep_dims)));
    match op {
        ReduceOp::Sum => {
            let name = &e.graph.node(id).name;
            let axes = e.i64_constant(&format!("{name}/axes"), &onnx_axes);
            e.push(id, suffix, "ReduceSum", &[x, &axes], &[y], &[keep]);
        }
        ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min => {
            let op_type = match op {
                ReduceOp::Mean => "ReduceMean",
                ReduceOp::Max => "ReduceMax",
                _ => "ReduceMin",
            };
            e.push(
                id,
                suffix,
                op_type,
                &[x],
                &[y],
                &[("axes", Attr::Ints(onnx_axes)), keep],
            );
        }
    }
}

/// The fixed spatial sizes `[H, W]` of the NHWC value `v`.
fn spatial(e: &Emitter, id: NodeId, v: Value) -> Result<[usize; 2], OnnxError> {
    let shape = &e.graph.value_type(v).shape;
    match (shape.rank(), shape.dims().get(1), shape.dims().get(2)) {
        (4, Some(Dim::Fixed(h)), Some(Dim::Fixed(w))) => Ok([*h, *w]),
        _ => Err(unsupported(e.graph, id, "the spatial sizes must be fixed")),
    }
}

/// `(output size, pad before, pad after)` of each spatial axis, as the IR computes them.
fn windows(
    graph: &Graph,
    id: NodeId,
    hw: [usize; 2],
    window: [usize; 2],
    strides: [usize; 2],
    dilations: [usize; 2],
    padding: Padding,
) -> Result<[(usize, usize, usize); 2], OnnxError> {
    let mut out = [(0, 0, 0); 2];
    for axis in 0..2 {
        out[axis] = window_output(
            hw[axis],
            window[axis],
            strides[axis],
            dilations[axis],
            padding,
            axis,
        )
        .map_err(|m| unsupported(graph, id, m))?;
    }
    Ok(out)
}

fn as_i64(v: [usize; 2]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// The `[KH, KW]` of the HWIO filter `w`.
fn kernel(e: &Emitter, id: NodeId, w: Value) -> Result<[usize; 2], OnnxError> {
    let dims = e.graph.value_type(w).shape.to_static();
    match dims.as_deref() {
        Some([kh, kw, _, _]) => Ok([*kh, *kw]),
        _ => Err(unsupported(
            e.graph,
            id,
            "the filter must be a fixed HWIO tensor",
        )),
    }
}

fn conv(e: &mut Emitter, id: NodeId, attrs: &Conv2dAttrs) -> Result<(), OnnxError> {
    let ins = e.graph.inputs(id);
    let hw = spatial(e, id, ins[0])?;
    let k = kernel(e, id, ins[1])?;
    let [(_, top, bottom), (_, left, right)] = windows(
        e.graph,
        id,
        hw,
        k,
        attrs.strides,
        attrs.dilations,
        attrs.padding,
    )?;
    let x = e.input_in(ins[0], &Layout::nchw(), id)?;
    let w = e.filter_oihw(ins[1])?;
    let y = e.define(Value::first(id), Layout::nchw());
    let pads = vec![top as i64, left as i64, bottom as i64, right as i64];
    e.push(
        id,
        "",
        "Conv",
        &[&x, &w],
        &[&y],
        &[
            ("kernel_shape", Attr::Ints(as_i64(k))),
            ("strides", Attr::Ints(as_i64(attrs.strides))),
            ("dilations", Attr::Ints(as_i64(attrs.dilations))),
            ("group", Attr::Int(attrs.groups as i64)),
            ("pads", Attr::Ints(pads)),
        ],
    );
    Ok(())
}

/// The transposed convolution: the gradient of a `Conv2d` from an `[H, W]` input, which ONNX's
/// `ConvTranspose` computes with the forward convolution's leading pads, trailing pads that crop
/// the full output to `[H, W]`, and `output_padding` where the forward convolution never read
/// the last rows (they receive zeros).
fn conv_transpose(
    e: &mut Emitter,
    id: NodeId,
    attrs: &Conv2dAttrs,
    input_hw: [usize; 2],
) -> Result<(), OnnxError> {
    let ins = e.graph.inputs(id);
    let dy_hw = spatial(e, id, ins[0])?;
    let k = kernel(e, id, ins[1])?;
    let geometry = windows(
        e.graph,
        id,
        input_hw,
        k,
        attrs.strides,
        attrs.dilations,
        attrs.padding,
    )?;
    let mut begin = [0i64; 2];
    let mut end = [0i64; 2];
    let mut output_padding = [0i64; 2];
    for axis in 0..2 {
        let (out, before, _) = geometry[axis];
        if out != dy_hw[axis] {
            return Err(unsupported(
                e.graph,
                id,
                format!(
                    "the gradient input has {} cells on spatial axis {axis}, the convolution of \
                     {} gives {out}",
                    dy_hw[axis], input_hw[axis]
                ),
            ));
        }
        let s = attrs.strides[axis] as i64;
        let d = attrs.dilations[axis] as i64;
        let full = s * (out as i64 - 1) + (k[axis] as i64 - 1) * d + 1;
        let crop = full - before as i64 - input_hw[axis] as i64;
        begin[axis] = before as i64;
        end[axis] = crop.max(0);
        output_padding[axis] = (-crop).max(0);
    }
    let dy = e.input_in(ins[0], &Layout::nchw(), id)?;
    let w = e.filter_oihw(ins[1])?;
    let y = e.define(Value::first(id), Layout::nchw());
    let mut node_attrs = vec![
        ("kernel_shape", Attr::Ints(as_i64(k))),
        ("strides", Attr::Ints(as_i64(attrs.strides))),
        ("dilations", Attr::Ints(as_i64(attrs.dilations))),
        ("pads", Attr::Ints(vec![begin[0], begin[1], end[0], end[1]])),
    ];
    if output_padding != [0, 0] {
        node_attrs.push(("output_padding", Attr::Ints(output_padding.to_vec())));
    }
    e.push(id, "", "ConvTranspose", &[&dy, &w], &[&y], &node_attrs);
    Ok(())
}

fn pool(e: &mut Emitter, id: NodeId, attrs: &PoolAttrs) -> Result<(), OnnxError> {
    let ins = e.graph.inputs(id);
    let hw = spatial(e, id, ins[0])?;
    let [(_, top, bottom), (_, left, right)] = windows(
        e.graph,
        id,
        hw,
        attrs.window,
        attrs.strides,
        [1, 1],
        attrs.padding,
    )?;
    let x = e.input_in(ins[0], &Layout::nchw(), id)?;
    let y = e.define(Value::first(id), Layout::nchw());
    let mut node_attrs = vec![
        ("kernel_shape", Attr::Ints(as_i64(attrs.window))),
        ("strides", Attr::Ints(as_i64(attrs.strides))),
        (
            "pads",
            Attr::Ints(vec![top as i64, left as i64, bottom as i64, right as i64]),
        ),
    ];
    let op_type = match attrs.kind {
        PoolKind::Max => "MaxPool",
        PoolKind::Avg => {
            // TF (and towerpack) divide by the cells inside the input, not the window.
            node_attrs.push(("count_include_pad", Attr::Int(0)));
            "AveragePool"
        }
    };
    e.push(id, "", op_type, &[&x], &[&y], &node_attrs);
    Ok(())
}
