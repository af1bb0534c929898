//! Shape and dtype inference: the output types of an op from its input types.
//!
//! Errors are plain messages here; [`Graph::add_node`](super::Graph::add_node) wraps them with
//! the node's scoped name, the op and the input types.

use super::op::{Conv2dAttrs, Op, Padding, PoolAttrs, ReduceOp, UnaryOp};
use super::shape::{Dim, Shape, TensorType};
use super::variable::VariableDef;
use crate::tensor::DType;
use smallvec::{SmallVec, smallvec};

type Outputs = SmallVec<[TensorType; 1]>;

fn arity(inputs: &[&TensorType], n: usize) -> Result<(), String> {
    if inputs.len() == n {
        Ok(())
    } else {
        Err(format!("expects {n} input(s), got {}", inputs.len()))
    }
}

fn float(t: &TensorType, what: &str) -> Result<(), String> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("{what} must be floating point, got {}", t.dtype))
    }
}

fn integer(t: &TensorType, what: &str) -> Result<(), String> {
    if matches!(t.dtype, DType::I32 | DType::I64 | DType::U8) {
        Ok(())
    } else {
        Err(format!("{what} must be an integer tensor, got {}", t.dtype))
    }
}

fn check_axes(axes: &[usize], rank: usize) -> Result<(), String> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= rank {
            return Err(format!("axis {a} out of range for rank {rank}"));
        }
        if axes[..i].contains(&a) {
            return Err(format!("axis {a} listed twice"));
        }
    }
    Ok(())
}

fn fixed_dim(d: Dim, what: &str) -> Result<usize, String> {
    d.fixed()
        .ok_or_else(|| format!("{what} must be a fixed size, not the batch size N"))
}

/// Output size and padding `(before, after)` of one spatial axis of a window op, as TF.
pub fn window_output(
    input: usize,
    window: usize,
    stride: usize,
    dilation: usize,
    padding: Padding,
    axis: usize,
) -> Result<(usize, usize, usize), String> {
    if window == 0 || stride == 0 || dilation == 0 {
        return Err("window, stride and dilation must be positive".into());
    }
    let eff = (window - 1) * dilation + 1;
    match padding {
        Padding::Valid => {
            if input < eff {
                return Err(format!(
                    "window {eff} (after dilation) exceeds input size {input} with valid padding"
                ));
            }
            Ok(((input - eff) / stride + 1, 0, 0))
        }
        Padding::Same => {
            let out = input.div_ceil(stride);
            let total = ((out - 1) * stride + eff).saturating_sub(input);
            Ok((out, total / 2, total - total / 2))
        }
        Padding::Explicit(p) => {
            let (before, after) = p[axis];
            let padded = input + before + after;
            if padded < eff {
                return Err(format!(
                    "window {eff} exceeds padded input size {padded} on spatial axis {axis}"
                ));
            }
            Ok(((padded - eff) / stride + 1, before, after))
        }
    }
}

fn spatial_out(
    h: usize,
    w: usize,
    window: [usize; 2],
    strides: [usize; 2],
    dilations: [usize; 2],
    padding: Padding,
) -> Result<[usize; 2], String> {
    let (oh, _, _) = window_output(h, window[0], strides[0], dilations[0], padding, 0)?;
    let (ow, _, _) = window_output(w, window[1], strides[1], dilations[1], padding, 1)?;
    Ok([oh, ow])
}

fn nhwc(t: &TensorType, what: &str) -> Result<(Dim, usize, usize, usize), String> {
    if t.rank() != 4 {
        return Err(format!(
            "{what} must be NHWC (rank 4), got rank {}",
            t.rank()
        ));
    }
    let d = t.shape.dims();
    Ok((
        d[0],
        fixed_dim(d[1], "height")?,
        fixed_dim(d[2], "width")?,
        fixed_dim(d[3], "channels")?,
    ))
}

fn hwio(t: &TensorType) -> Result<[usize; 4], String> {
    let s = t
        .shape
        .to_static()
        .filter(|s| s.len() == 4)
        .ok_or_else(|| format!("filter must be static HWIO (rank 4), got {}", t.shape))?;
    Ok([s[0], s[1], s[2], s[3]])
}

fn conv_checks(a: &Conv2dAttrs, c_in: usize, f: [usize; 4]) -> Result<(), String> {
    if a.groups == 0 {
        return Err("groups must be positive".into());
    }
    if f[2] * a.groups != c_in {
        return Err(format!(
            "input channels {c_in} != filter input channels {} x groups {}",
            f[2], a.groups
        ));
    }
    if !f[3].is_multiple_of(a.groups) {
        return Err(format!(
            "output channels {} not divisible by groups {}",
            f[3], a.groups
        ));
    }
    Ok(())
}

fn pool_out(a: &PoolAttrs, h: usize, w: usize) -> Result<[usize; 2], String> {
    spatial_out(h, w, a.window, a.strides, [1, 1], a.padding)
}

fn reduced(shape: &Shape, axes: &[usize], keep_dims: bool) -> Shape {
    Shape::from_dims(shape.dims().iter().enumerate().filter_map(|(i, d)| {
        if axes.contains(&i) {
            keep_dims.then_some(Dim::Fixed(1))
        } else {
            Some(*d)
        }
    }))
}

fn valid_shape(s: &Shape) -> Result<(), String> {
    if s.batch_misplaced() {
        Err(format!("the batch size N may only lead a shape, got {s}"))
    } else {
        Ok(())
    }
}

/// Infers the output types of `op` applied to inputs of types `inputs`: dispatches to the
/// op's family below.
pub fn infer_types(
    op: &Op,
    inputs: &[&TensorType],
    variables: &[VariableDef],
) -> Result<Outputs, String> {
    match op {
        Op::Input { .. }
        | Op::Constant { .. }
        | Op::Variable { .. }
        | Op::Assign { .. }
        | Op::Group
        | Op::Identity => infer_sources(op, inputs, variables),
        Op::Unary(..) | Op::Binary(..) | Op::Select | Op::Cast { .. } => {
            infer_elementwise(op, inputs)
        }
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Broadcast { .. }
        | Op::Slice { .. }
        | Op::Concat { .. }
        | Op::Pad { .. } => infer_layout(op, inputs),
        Op::Reduce { .. } | Op::ArgMax { .. } | Op::Moments { .. } => infer_reductions(op, inputs),
        Op::MatMul { .. } => infer_matmul(op, inputs),
        Op::Conv2d(..) | Op::Conv2dBackpropInput { .. } | Op::Conv2dBackpropFilter { .. } => {
            infer_convolutions(op, inputs)
        }
        Op::Pool(..) | Op::MaxPoolGrad(..) | Op::AvgPoolGrad { .. } => infer_pooling(op, inputs),
        Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::SparseSoftmaxCrossEntropy
        | Op::OneHot { .. }
        | Op::InTopK { .. } => infer_classification(op, inputs),
        Op::AllReduce { .. } | Op::RandomUniform { .. } => infer_collectives_random(op, inputs),
    }
}

/// The output of one value.
fn one(t: TensorType) -> Result<Outputs, String> {
    Ok(smallvec![t])
}

/// The error of a family function given an op of another family (never reached through
/// [`infer_types`]).
fn other_family(op: &Op, family: &str) -> String {
    format!("internal error: {op:?} is not {family} op")
}

/// Sources, variables and structure: inputs, constants, variable reads and assigns, groups, identity.
fn infer_sources(
    op: &Op,
    inputs: &[&TensorType],
    variables: &[VariableDef],
) -> Result<Outputs, String> {
    match op {
        Op::Input { ty, .. } => {
            arity(inputs, 0)?;
            valid_shape(&ty.shape)?;
            one(ty.clone())
        }
        Op::Constant { value } => {
            arity(inputs, 0)?;
            one(TensorType::new(value.dtype(), Shape::fixed(value.shape())))
        }
        Op::Variable { var } => {
            arity(inputs, 0)?;
            let def = variables
                .get(var.0 as usize)
                .ok_or_else(|| format!("unknown variable #{}", var.0))?;
            one(def.ty.clone())
        }
        Op::Assign { var } => {
            arity(inputs, 1)?;
            let def = variables
                .get(var.0 as usize)
                .ok_or_else(|| format!("unknown variable #{}", var.0))?;
            if *inputs[0] != def.ty {
                return Err(format!(
                    "value of type {} cannot be assigned to variable {} of type {}",
                    inputs[0], def.name, def.ty
                ));
            }
            Ok(SmallVec::new())
        }
        Op::Group => {
            arity(inputs, 0)?;
            Ok(SmallVec::new())
        }
        Op::Identity => {
            arity(inputs, 1)?;
            one(inputs[0].clone())
        }
        other => Err(other_family(other, "a source")),
    }
}

/// Elementwise ops: unary, binary (with broadcasting), select and casts.
fn infer_elementwise(op: &Op, inputs: &[&TensorType]) -> Result<Outputs, String> {
    match op {
        Op::Unary(u) => {
            arity(inputs, 1)?;
            let t = inputs[0];
            match u {
                UnaryOp::Not if t.dtype != DType::Bool => {
                    return Err(format!("not needs bool, got {}", t.dtype));
                }
                UnaryOp::Not => {}
                _ if u.needs_float() => float(t, "operand")?,
                _ if t.dtype == DType::Bool => {
                    return Err(format!("{} is not defined on bool", u.name()));
                }
                _ => {}
            }
            one(t.clone())
        }
        Op::Binary(b) => {
            arity(inputs, 2)?;
            let (x, y) = (inputs[0], inputs[1]);
            if x.dtype != y.dtype {
                return Err(format!(
                    "operand dtypes differ ({} vs {}); insert a cast",
                    x.dtype, y.dtype
                ));
            }
            let shape = Shape::broadcast(&x.shape, &y.shape)
                .ok_or_else(|| format!("shapes {} and {} do not broadcast", x.shape, y.shape))?;
            let dtype = if b.is_comparison() {
                DType::Bool
            } else if b.is_logical() {
                if x.dtype != DType::Bool {
                    return Err(format!("{} needs bool operands, got {}", b.name(), x.dtype));
                }
                DType::Bool
            } else {
                if x.dtype == DType::Bool {
                    return Err(format!("{} is not defined on bool", b.name()));
                }
                x.dtype
            };
            one(TensorType::new(dtype, shape))
        }
        Op::Select => {
            arity(inputs, 3)?;
            let (c, a, b) = (inputs[0], inputs[1], inputs[2]);
            if c.dtype != DType::Bool {
                return Err(format!("condition must be bool, got {}", c.dtype));
            }
            if a.dtype != b.dtype {
                return Err(format!("branch dtypes differ ({} vs {})", a.dtype, b.dtype));
            }
            let ab = Shape::broadcast(&a.shape, &b.shape)
                .and_then(|s| Shape::broadcast(&c.shape, &s))
                .ok_or_else(|| {
                    format!(
                        "shapes {}, {} and {} do not broadcast",
                        c.shape, a.shape, b.shape
                    )
                })?;
            one(TensorType::new(a.dtype, ab))
        }
        Op::Cast { to } => {
            arity(inputs, 1)?;
            one(TensorType::new(*to, inputs[0].shape.clone()))
        }
        other => Err(other_family(other, "an elementwise")),
    }
}

/// Layout ops: reshape, transpose, broadcast, slice, concat, pad.
fn infer_layout(op: &Op, inputs: &[&TensorType]) -> Result<Outputs, String> {
    match op {
        Op::Reshape { shape } => {
            arity(inputs, 1)?;
            valid_shape(shape)?;
            let src = &inputs[0].shape;
            if shape.has_batch() != src.has_batch() {
                return Err(format!(
                    "reshape {src} to {shape}: the batch size N must stay leading on both sides"
                ));
            }
            if src.fixed_product() != shape.fixed_product() {
                return Err(format!(
                    "reshape {src} to {shape} changes the element count"
                ));
            }
            one(TensorType::new(inputs[0].dtype, shape.clone()))
        }
        Op::Transpose { perm } => {
            arity(inputs, 1)?;
            let s = &inputs[0].shape;
            if perm.len() != s.rank() {
                return Err(format!("perm {perm:?} does not match rank {}", s.rank()));
            }
            check_axes(perm, s.rank())?;
            let out = Shape::from_dims(perm.iter().map(|&p| s.dim(p)));
            valid_shape(&out)?;
            one(TensorType::new(inputs[0].dtype, out))
        }
        Op::Broadcast { shape } => {
            arity(inputs, 1)?;
            valid_shape(shape)?;
            if !inputs[0].shape.broadcasts_to(shape) {
                return Err(format!("{} does not broadcast to {shape}", inputs[0].shape));
            }
            one(TensorType::new(inputs[0].dtype, shape.clone()))
        }
        Op::Slice { axis, start, end } => {
            arity(inputs, 1)?;
            let s = &inputs[0].shape;
            if *axis >= s.rank() {
                return Err(format!("axis {axis} out of range for rank {}", s.rank()));
            }
            let n = fixed_dim(s.dim(*axis), "sliced axis")?;
            if start >= end || *end > n {
                return Err(format!("slice {start}..{end} out of range for size {n}"));
            }
            let mut d = s.0.clone();
            d[*axis] = Dim::Fixed(end - start);
            one(TensorType::new(inputs[0].dtype, Shape(d)))
        }
        Op::Concat { axis } => {
            if inputs.is_empty() {
                return Err("needs at least one input".into());
            }
            let first = inputs[0];
            if *axis >= first.rank() {
                return Err(format!(
                    "axis {axis} out of range for rank {}",
                    first.rank()
                ));
            }
            let mut total = 0;
            for t in inputs {
                if t.dtype != first.dtype || t.rank() != first.rank() {
                    return Err(format!("inputs {} and {} cannot be concatenated", first, t));
                }
                for i in 0..first.rank() {
                    if i != *axis && t.shape.dim(i) != first.shape.dim(i) {
                        return Err(format!(
                            "inputs {} and {} differ outside axis {axis}",
                            first, t
                        ));
                    }
                }
                total += fixed_dim(t.shape.dim(*axis), "concatenated axis")?;
            }
            let mut d = first.shape.0.clone();
            d[*axis] = Dim::Fixed(total);
            one(TensorType::new(first.dtype, Shape(d)))
        }
        Op::Pad { pads } => {
            arity(inputs, 1)?;
            let s = &inputs[0].shape;
            if pads.len() != s.rank() {
                return Err(format!("{} pads for rank {}", pads.len(), s.rank()));
            }
            let mut d = s.0.clone();
            for (i, &(b, a)) in pads.iter().enumerate() {
                if b + a > 0 {
                    d[i] = Dim::Fixed(fixed_dim(s.dim(i), "padded axis")? + b + a);
                }
            }
            one(TensorType::new(inputs[0].dtype, Shape(d)))
        }
        other => Err(other_family(other, "a layout")),
    }
}

/// Reductions: reduce, argmax, moments.
fn infer_reductions(op: &Op, inputs: &[&TensorType]) -> Result<Outputs, String> {
    match op {
        Op::Reduce {
            op,
            axes,
            keep_dims,
        } => {
            arity(inputs, 1)?;
            let t = inputs[0];
            check_axes(axes, t.rank())?;
            if t.dtype == DType::Bool {
                return Err("cannot reduce bool; cast it first".into());
            }
            if *op == ReduceOp::Mean && !t.dtype.is_float() {
                return Err(format!("reduce_mean needs floats, got {}", t.dtype));
            }
            one(TensorType::new(
                t.dtype,
                reduced(&t.shape, axes, *keep_dims),
            ))
        }
        Op::ArgMax { axis } => {
            arity(inputs, 1)?;
            let t = inputs[0];
            check_axes(&[*axis], t.rank())?;
            one(TensorType::new(
                DType::I64,
                reduced(&t.shape, &[*axis], false),
            ))
        }
        Op::Moments { axes, keep_dims } => {
            arity(inputs, 1)?;
            let t = inputs[0];
            float(t, "input")?;
            check_axes(axes, t.rank())?;
            let r = TensorType::new(t.dtype, reduced(&t.shape, axes, *keep_dims));
            Ok(smallvec![r.clone(), r])
        }
        other => Err(other_family(other, "a reduction")),
    }
}

/// Matrix products.
fn infer_matmul(op: &Op, inputs: &[&TensorType]) -> Result<Outputs, String> {
    match op {
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => {
            arity(inputs, 2)?;
            let (a, b) = (inputs[0], inputs[1]);
            float(a, "left operand")?;
            if a.dtype != b.dtype {
                return Err(format!(
                    "operand dtypes differ ({} vs {})",
                    a.dtype, b.dtype
                ));
            }
            if a.rank() < 2 || b.rank() < 2 {
                return Err("operands must have rank >= 2".into());
            }
            let (ra, rb) = (a.rank(), b.rank());
            let (m, ka) = if *transpose_a {
                (a.shape.dim(ra - 1), a.shape.dim(ra - 2))
            } else {
                (a.shape.dim(ra - 2), a.shape.dim(ra - 1))
            };
            let (kb, n) = if *transpose_b {
                (b.shape.dim(rb - 1), b.shape.dim(rb - 2))
            } else {
                (b.shape.dim(rb - 2), b.shape.dim(rb - 1))
            };
            if ka != kb {
                return Err(format!("contracted dimensions differ ({ka} vs {kb})"));
            }
            let batch_a = &a.shape.dims()[..ra - 2];
            let batch_b = &b.shape.dims()[..rb - 2];
            if rb != 2 && batch_a != batch_b {
                return Err(format!(
                    "batch dimensions differ ({} vs {})",
                    a.shape, b.shape
                ));
            }
            let mut d: SmallVec<[Dim; 4]> = batch_a.iter().copied().collect();
            d.push(m);
            d.push(n);
            let out = Shape(d);
            valid_shape(&out)?;
            one(TensorType::new(a.dtype, out))
        }
        other => Err(other_family(other, "a matrix")),
    }
}

/// Convolutions and their gradients (NHWC inputs, HWIO filters).
fn infer_convolutions(op: &Op, inputs: &[&TensorType]) -> Result<Outputs, String> {
    match op {
        Op::Conv2d(attrs) => {
            arity(inputs, 2)?;
            let (x, w) = (inputs[0], inputs[1]);
            float(x, "input")?;
            if x.dtype != w.dtype {
                return Err(format!(
                    "input and filter dtypes differ ({} vs {})",
                    x.dtype, w.dtype
                ));
            }
            let (n, h, wd, c) = nhwc(x, "input")?;
            let f = hwio(w)?;
            conv_checks(attrs, c, f)?;
            let [oh, ow] = spatial_out(
                h,
                wd,
                [f[0], f[1]],
                attrs.strides,
                attrs.dilations,
                attrs.padding,
            )?;
            one(TensorType::new(
                x.dtype,
                Shape::from_dims([n, oh.into(), ow.into(), f[3].into()]),
            ))
        }
        Op::Conv2dBackpropInput { attrs, input_hw } => {
            arity(inputs, 2)?;
            let (dy, w) = (inputs[0], inputs[1]);
            float(dy, "gradient")?;
            let (n, oh, ow, o) = nhwc(dy, "output gradient")?;
            let f = hwio(w)?;
            if f[3] != o {
                return Err(format!(
                    "gradient channels {o} != filter output channels {}",
                    f[3]
                ));
            }
            let c = f[2] * attrs.groups;
            conv_checks(attrs, c, f)?;
            let [eh, ew] = spatial_out(
                input_hw[0],
                input_hw[1],
                [f[0], f[1]],
                attrs.strides,
                attrs.dilations,
                attrs.padding,
            )?;
            if [eh, ew] != [oh, ow] {
                return Err(format!(
                    "input size {input_hw:?} convolves to {eh}x{ew}, but the gradient is {oh}x{ow}"
                ));
            }
            one(TensorType::new(
                dy.dtype,
                Shape::from_dims([n, input_hw[0].into(), input_hw[1].into(), c.into()]),
            ))
        }
        Op::Conv2dBackpropFilter { attrs, filter_hw } => {
            arity(inputs, 2)?;
            let (x, dy) = (inputs[0], inputs[1]);
            float(x, "input")?;
            let (_, h, w, c) = nhwc(x, "input")?;
            let (_, oh, ow, o) = nhwc(dy, "output gradient")?;
            if attrs.groups == 0 || !c.is_multiple_of(attrs.groups) {
                return Err(format!(
                    "channels {c} not divisible by groups {}",
                    attrs.groups
                ));
            }
            let f = [filter_hw[0], filter_hw[1], c / attrs.groups, o];
            conv_checks(attrs, c, f)?;
            let [eh, ew] = spatial_out(
                h,
                w,
                *filter_hw,
                attrs.strides,
                attrs.dilations,
                attrs.padding,
            )?;
            if [eh, ew] != [oh, ow] {
                return Err(format!(
                    "input {h}x{w} convolves to {eh}x{ew}, but the gradient is {oh}x{ow}"
                ));
            }
            one(TensorType::new(x.dtype, Shape::fixed(&f)))
        }
        other => Err(other_family(other, "a convolution")),
    }
}

/// Pooling and its gradients.
fn infer_pooling(op: &Op, inputs: &[&TensorType]) -> Result<Outputs, String> {
    match op {
        Op::Pool(attrs) => {
            arity(inputs, 1)?;
            let x = inputs[0];
            float(x, "input")?;
            let (n, h, w, c) = nhwc(x, "input")?;
            let [oh, ow] = pool_out(attrs, h, w)?;
            one(TensorType::new(
                x.dtype,
                Shape::from_dims([n, oh.into(), ow.into(), c.into()]),
            ))
        }
        Op::MaxPoolGrad(attrs) => {
            arity(inputs, 2)?;
            let (x, dy) = (inputs[0], inputs[1]);
            let (n, h, w, c) = nhwc(x, "input")?;
            let [oh, ow] = pool_out(attrs, h, w)?;
            let expect = Shape::from_dims([n, oh.into(), ow.into(), c.into()]);
            if dy.shape != expect || dy.dtype != x.dtype {
                return Err(format!("gradient must be {}{expect}, got {dy}", x.dtype));
            }
            one(x.clone())
        }
        Op::AvgPoolGrad { attrs, input_hw } => {
            arity(inputs, 1)?;
            let dy = inputs[0];
            let (n, oh, ow, c) = nhwc(dy, "output gradient")?;
            let [eh, ew] = pool_out(attrs, input_hw[0], input_hw[1])?;
            if [eh, ew] != [oh, ow] {
                return Err(format!(
                    "input size {input_hw:?} pools to {eh}x{ew}, but the gradient is {oh}x{ow}"
                ));
            }
            one(TensorType::new(
                dy.dtype,
                Shape::from_dims([n, input_hw[0].into(), input_hw[1].into(), c.into()]),
            ))
        }
        other => Err(other_family(other, "a pooling")),
    }
}

/// Softmax, losses and classification ops: softmax, log-softmax, sparse cross-entropy, one-hot, in-top-k.
fn infer_classification(op: &Op, inputs: &[&TensorType]) -> Result<Outputs, String> {
    match op {
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            arity(inputs, 1)?;
            float(inputs[0], "input")?;
            check_axes(&[*axis], inputs[0].rank())?;
            one(inputs[0].clone())
        }
        Op::SparseSoftmaxCrossEntropy => {
            arity(inputs, 2)?;
            let (logits, labels) = (inputs[0], inputs[1]);
            float(logits, "logits")?;
            integer(labels, "labels")?;
            if logits.rank() != 2 || labels.rank() != 1 {
                return Err(format!(
                    "needs logits [N, C] and labels [N], got {} and {}",
                    logits.shape, labels.shape
                ));
            }
            if logits.shape.dim(0) != labels.shape.dim(0) {
                return Err(format!(
                    "logits and labels disagree on the batch ({} vs {})",
                    logits.shape.dim(0),
                    labels.shape.dim(0)
                ));
            }
            fixed_dim(logits.shape.dim(1), "number of classes")?;
            one(TensorType::new(
                logits.dtype,
                Shape::from_dims([logits.shape.dim(0)]),
            ))
        }
        Op::OneHot { depth } => {
            arity(inputs, 1)?;
            integer(inputs[0], "indices")?;
            if *depth == 0 {
                return Err("depth must be positive".into());
            }
            let mut d = inputs[0].shape.0.clone();
            d.push(Dim::Fixed(*depth));
            one(TensorType::new(DType::F32, Shape(d)))
        }
        Op::InTopK { k } => {
            arity(inputs, 2)?;
            let (p, t) = (inputs[0], inputs[1]);
            float(p, "predictions")?;
            integer(t, "targets")?;
            if p.rank() != 2 || t.rank() != 1 || p.shape.dim(0) != t.shape.dim(0) {
                return Err(format!(
                    "needs predictions [N, C] and targets [N], got {} and {}",
                    p.shape, t.shape
                ));
            }
            if *k == 0 {
                return Err("k must be positive".into());
            }
            one(TensorType::new(
                DType::Bool,
                Shape::from_dims([p.shape.dim(0)]),
            ))
        }
        other => Err(other_family(other, "a classification")),
    }
}

/// Collectives and random ops.
fn infer_collectives_random(op: &Op, inputs: &[&TensorType]) -> Result<Outputs, String> {
    match op {
        Op::AllReduce { .. } => {
            arity(inputs, 1)?;
            float(inputs[0], "input")?;
            one(inputs[0].clone())
        }
        Op::RandomUniform { .. } => {
            arity(inputs, 2)?;
            let counter = inputs[1];
            if counter.rank() != 0 || !matches!(counter.dtype, DType::I32 | DType::I64) {
                return Err(format!("counter must be an integer scalar, got {counter}"));
            }
            one(TensorType::new(DType::F32, inputs[0].shape.clone()))
        }
        other => Err(other_family(other, "a collective or random")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_padding_matches_tensorflow() {
        // TF: out = ceil(in / stride); pad_total = max((out-1)*s + k - in, 0), extra at the end.
        assert_eq!(window_output(32, 3, 1, 1, Padding::Same, 0), Ok((32, 1, 1)));
        assert_eq!(window_output(32, 3, 2, 1, Padding::Same, 0), Ok((16, 0, 1)));
        assert_eq!(window_output(7, 2, 2, 1, Padding::Same, 0), Ok((4, 0, 1)));
        assert_eq!(window_output(32, 3, 1, 2, Padding::Same, 0), Ok((32, 2, 2)));
        assert_eq!(
            window_output(32, 3, 2, 1, Padding::Valid, 0),
            Ok((15, 0, 0))
        );
    }
}
