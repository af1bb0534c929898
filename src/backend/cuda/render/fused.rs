//! Generated hooks of fused kernels: elementwise kernels (`tp_point`), reductions with a fused
//! prologue (`tp_acc`, `tp_init`, `tp_fold`, `tp_merge`, `tp_finish`), the epilogues of
//! matrix products and convolutions (`tp_epilogue`) and the prologues of convolutions
//! (`tp_prologue`).

use super::cexpr::{self, PointSource, compute_type};
use super::index::{Axis, coordinate, linear};
use super::launch::{self, Target};
use super::params::FieldKind;
use super::{
    BLOCK, LaunchDims, ParamStruct, RenderError, RenderedKernel, constant, define, index_type,
    kernel_extent, load_expr, overlaps,
};
use crate::backend::cuda::bodies::Body;
use crate::ir::ReduceOp;
use crate::lower::{
    BufferId, ChannelReduction, FusedExpr, Kernel, KernelKind, Program, ReduceFinish, View,
};
use crate::tensor::DType;
use std::fmt::Write as _;

/// An operand of a fused expression: the parameter it is read through and its view.
struct Operand<'a> {
    field: String,
    dtype: DType,
    view: &'a View,
    read_only: bool,
}

/// Adds one read-only pointer field per view (named `{prefix}{i}`) and one writable field per
/// output (`out{j}`); returns the operands.
fn operand_fields<'a>(
    program: &Program,
    params: &mut ParamStruct,
    views: &'a [View],
    prefix: &str,
    outputs: &[BufferId],
) -> Vec<Operand<'a>> {
    let ops: Vec<Operand> = views
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let dtype = program.buffer(v.buffer).dtype;
            let field = format!("{prefix}{i}");
            // Views carry their offset in the pointer, so the generated text does not.
            params.buffer(&field, v.buffer, v.offset, dtype, false);
            let read_only = !outputs.iter().any(|&o| overlaps(program, o, v.buffer));
            Operand {
                field,
                dtype,
                view: v,
                read_only,
            }
        })
        .collect();
    for (j, &o) in outputs.iter().enumerate() {
        params.buffer(&format!("out{j}"), o, 0, program.buffer(o).dtype, true);
    }
    ops
}

/// The statements storing expression outputs `values` at index `at`.
fn stores(program: &Program, outputs: &[BufferId], values: &[String], at: &str) -> String {
    let mut s = String::new();
    for (j, (&o, v)) in outputs.iter().zip(values).enumerate() {
        let dtype = program.buffer(o).dtype;
        let _ = writeln!(s, "    p.out{j}[{at}] = {};", cexpr::to_storage(v, dtype));
    }
    s
}

/// Points of an elementwise space or an epilogue: flat position `var` over `shape`.
struct FlatPoint<'a> {
    var: &'a str,
    shape: &'a [usize],
    operands: &'a [Operand<'a>],
    /// Operand slot 0 is the kernel's own value (epilogues), read from this expression.
    own: Option<&'a str>,
    /// Per operand, whether it is read once per output channel (an epilogue's column operands:
    /// `col.{field}`, see [`epilogue`]) rather than at this point.
    columns: &'a [bool],
}

impl PointSource for FlatPoint<'_> {
    fn load(&self, operand: u16) -> Result<String, RenderError> {
        let slot = usize::from(operand);
        let op = match self.own {
            Some(own) if slot == 0 => return Ok(own.to_string()),
            Some(_) => self.operands.get(slot - 1),
            None => self.operands.get(slot),
        }
        .ok_or_else(|| RenderError::Unsupported(format!("operand {slot} has no input")))?;
        let index = slot - usize::from(self.own.is_some());
        if self.columns.get(index).copied().unwrap_or(false) {
            return Ok(format!("col.{}", op.field));
        }
        let axes: Vec<Axis> = self
            .shape
            .iter()
            .copied()
            .zip(op.view.strides.iter().copied())
            .collect();
        let raw = load_expr(
            &format!("p.{}", op.field),
            &linear(self.var, &axes),
            op.read_only,
        );
        Ok(cexpr::from_storage(&raw, op.dtype))
    }

    fn index(&self, axis: u8) -> String {
        coordinate(self.var, self.shape, usize::from(axis))
    }

    fn flat(&self) -> String {
        self.var.to_string()
    }
}

/// A fused elementwise kernel over `shape`.
pub fn elementwise(
    program: &Program,
    k: &Kernel,
    shape: &[usize],
    expr: &FusedExpr,
) -> Result<RenderedKernel, RenderError> {
    let points: usize = shape.iter().product();
    let mut params = ParamStruct::default();
    let operands = operand_fields(program, &mut params, &k.inputs, "in", &k.outputs);
    let extent = kernel_extent(program, k, points);
    let mut g = String::new();
    let _ = writeln!(g, "typedef {} tp_idx;", index_type(extent));
    g.push_str(&constant("TP_BLOCK", "unsigned int", BLOCK));
    g.push_str(&constant("TP_POINTS", "tp_idx", points));
    g.push_str(&params.declaration());
    g.push_str("TP_DEV void tp_point(const tp_params& p, tp_idx i) {\n");
    let src = FlatPoint {
        var: "i",
        shape,
        operands: &operands,
        own: None,
        columns: &[],
    };
    let outs = cexpr::render(expr, &src, "v", "    ", &mut g)?;
    g.push_str(&stores(program, &k.outputs, &outs, "i"));
    g.push_str("}\n");
    Ok(RenderedKernel {
        body: Body::Elementwise,
        generated: g,
        params,
        launch: LaunchDims::over(points),
        workspace_bytes: 0,
    })
}

/// The `tp_epilogue` hook of a matrix product or convolution: operand 0 is the kernel's value,
/// operands `1..` read the extra inputs `k.inputs[main..]` over the output's shape; every output
/// is stored at `flat`. Without an epilogue the value is stored as output 0.
///
/// Operands that vary along the output's last axis only — batch norm's per-channel scale and
/// mean, a bias, a scalar — are *column operands*: `tp_epi_column(p, c)` reads them once for
/// channel `c` into a `tp_epi_col`, which the GEMM core fills once per column of a thread's
/// register block and hands to every element of that column (`tp_epilogue(p, flat, col, acc)`),
/// instead of each element loading them again. (A column operand that may alias an output is
/// read at the point, as before: its value could change as the tile is stored.)
///
/// With per-channel reductions (convolutions only), the hook also takes `float* red` (the
/// calling thread's sums for the element's channel) and adds the reduced outputs of the
/// expression into it instead of storing them; `tp_epi_finish(p, r, channel, sum)` stores
/// sum or mean `r` of a channel once the blocks' sums are combined (a mean divided by the rows).
/// A sum or mean takes one slot of `red`, in the epilogue's order; after them each variance
/// ([`ChannelReduction::Variance`]) takes two: `x - K` and `(x - K)²` about the block's shift
/// `K`, which the hook reads from `shift[v * TP_BN]` (its channel's) and
/// `tp_epi_shift(p, flat, col, acc, shift)` computes at the tile's first row;
/// `tp_epi_var_finish(p, v, channel, var)` stores variance `v`. `TP_EPI_RED` counts the slots,
/// `TP_EPI_PLAIN` the sums and means, `TP_EPI_VAR` the variances (`gemm_core.cuh`).
pub fn epilogue(
    program: &Program,
    k: &Kernel,
    params: &mut ParamStruct,
    g: &mut String,
) -> Result<(), RenderError> {
    let range = k.kind.epilogue_inputs(k.inputs.len());
    let operands = operand_fields(program, params, &k.inputs[range], "e", &k.outputs);
    // The finish's inputs (`f{i}`), read once per channel by the block storing a variance.
    let finish = k.kind.epilogue().and_then(|e| e.finish.as_ref());
    let finish_operands: Vec<Operand> = finish.map_or_else(Vec::new, |f| {
        let views = k.inputs.get(f.first_input..).unwrap_or_default();
        views
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let (field, dtype) = (format!("f{i}"), program.buffer(v.buffer).dtype);
                params.buffer(&field, v.buffer, v.offset, dtype, false);
                Operand {
                    field,
                    dtype,
                    view: v,
                    read_only: true,
                }
            })
            .collect()
    });
    g.push_str(&params.declaration());
    let shape = &program.buffer(k.outputs[0]).shape;
    let columns = column_operands(&operands);
    column_hook(&operands, &columns, g);
    let reductions = k.kind.epilogue().map_or(&[][..], |e| &e.reductions[..]);
    let slots = ReductionSlots::of(reductions);
    if reductions.is_empty() {
        g.push_str(
            "TP_DEV void tp_epilogue(const tp_params& p, tp_idx flat, const tp_epi_col& col, \
             float acc) {\n",
        );
    } else {
        if !matches!(
            k.kind,
            KernelKind::Conv2d(..) | KernelKind::Conv2dBackpropInput(..)
        ) {
            return Err(RenderError::Unsupported(format!(
                "`{}`: per-channel reductions in a {} epilogue",
                k.name,
                k.kind.name()
            )));
        }
        if slots.variances > 0 && !matches!(k.kind, KernelKind::Conv2d(..)) {
            // The shift is read at the tile's first row, which strided input gradients may skip.
            return Err(RenderError::Unsupported(format!(
                "`{}`: a variance in a {} epilogue",
                k.name,
                k.kind.name()
            )));
        }
        let shift = if slots.variances > 0 {
            ", const float* shift"
        } else {
            ""
        };
        let _ = writeln!(
            g,
            "TP_DEV void tp_epilogue(const tp_params& p, tp_idx flat, const tp_epi_col& col, \
             float acc, float* red{shift}) {{"
        );
    }
    let src = FlatPoint {
        var: "flat",
        shape,
        operands: &operands,
        own: Some("acc"),
        columns: &columns,
    };
    match k.kind.epilogue() {
        None => g.push_str(&stores(program, &k.outputs[..1], &["acc".into()], "flat")),
        Some(e) => {
            let outs = cexpr::render(&e.expr, &src, "v", "    ", g)?;
            let stored = e.stored_outputs();
            g.push_str(&stores(
                program,
                &k.outputs[..stored],
                &outs[..stored],
                "flat",
            ));
            for (j, (&id, v)) in e.expr.outputs[stored..]
                .iter()
                .zip(&outs[stored..])
                .enumerate()
            {
                if e.expr.dtype(id) != DType::F32 {
                    return Err(RenderError::Unsupported(format!(
                        "`{}`: a per-channel epilogue reduction of {}",
                        k.name,
                        e.expr.dtype(id)
                    )));
                }
                match slots.of[j] {
                    Slot::Plain(s) => {
                        let _ = writeln!(g, "    red[{s}] += {v};");
                    }
                    Slot::Variance(i, s) => {
                        let _ = writeln!(
                            g,
                            "    {{ const float d = {v} - shift[{i} * TP_BN]; red[{s}] += d; \
                             red[{}] += d * d; }}",
                            s + 1
                        );
                    }
                }
            }
        }
    }
    g.push_str("}\n");
    if reductions.is_empty() {
        return Ok(());
    }
    let Some(e) = k.kind.epilogue() else {
        return Ok(());
    };
    let stored = e.stored_outputs();
    let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
    let store = |j: usize, value: &str| -> String {
        let out = k.outputs[stored + j];
        let dtype = program.buffer(out).dtype;
        let v = cexpr::to_storage(&cexpr::cast(value, DType::F32, dtype), dtype);
        format!("p.out{}[c] = {v};", stored + j)
    };
    g.push_str("TP_DEV void tp_epi_finish(const tp_params& p, int r, int c, float sum) {\n");
    for (j, op) in reductions.iter().enumerate() {
        let Slot::Plain(s) = slots.of[j] else {
            continue;
        };
        let value = match op {
            ChannelReduction::Mean => {
                format!("sum / {}", cexpr::literal(rows as f64, DType::F32))
            }
            _ => "sum".to_string(),
        };
        let _ = writeln!(g, "    if (r == {s}) {}", store(j, &value));
    }
    g.push_str("}\n");
    if slots.variances > 0 {
        // The shift: each variance's value at the point, computed as the hook computes it.
        g.push_str(
            "TP_DEV void tp_epi_shift(const tp_params& p, tp_idx flat, const tp_epi_col& col, \
             float acc, float* shift) {\n",
        );
        let outs = cexpr::render(&e.expr, &src, "v", "    ", g)?;
        for (j, v) in outs[stored..].iter().enumerate() {
            if let Slot::Variance(i, _) = slots.of[j] {
                let _ = writeln!(g, "    shift[{i} * TP_BN] = {v};");
            }
        }
        g.push_str("}\n");
        g.push_str(
            "TP_DEV void tp_epi_var_finish(const tp_params& p, int v, int c, float var) {\n",
        );
        for j in 0..reductions.len() {
            let Slot::Variance(i, _) = slots.of[j] else {
                continue;
            };
            let Some(f) = finish.filter(|f| reads_only_result(f, reductions.len(), j)) else {
                let _ = writeln!(g, "    if (v == {i}) {}", store(j, "var"));
                continue;
            };
            // The finish of this variance: its result as stored, then the finish's outputs.
            let _ = writeln!(g, "    if (v == {i}) {{");
            let _ = writeln!(g, "        {}", store(j, "var"));
            let out = k.outputs[stored + j];
            let dtype = program.buffer(out).dtype;
            let held = cexpr::from_storage(
                &cexpr::to_storage(&cexpr::cast("var", DType::F32, dtype), dtype),
                dtype,
            );
            let _ = writeln!(g, "        const {} r = {held};", compute_type(dtype));
            let mut results = vec!["0".to_string(); reductions.len()];
            results[j] = "r".into();
            let point = FinishPoint {
                results: &results,
                inputs: FlatPoint {
                    var: "c",
                    shape: &f.shape,
                    operands: &finish_operands,
                    own: None,
                    columns: &[],
                },
            };
            let values = cexpr::render(&f.expr, &point, "f", "        ", g)?;
            let first = stored + reductions.len();
            store_finish(
                program,
                k,
                "epilogue finish",
                &values,
                first,
                "        ",
                "c",
                g,
            )?;
            g.push_str("    }\n");
        }
        g.push_str("}\n");
        let placed = (0..reductions.len()).any(|j| {
            matches!(slots.of[j], Slot::Variance(..))
                && finish.is_some_and(|f| reads_only_result(f, reductions.len(), j))
        });
        if finish.is_some() && !placed {
            return Err(RenderError::Unsupported(format!(
                "`{}`: an epilogue finish that reads other than one variance's result",
                k.name
            )));
        }
    }
    Ok(())
}

/// A convolution's prologue ([`Prologue`]): adds one read-only field per prologue input
/// (`pro{i}`, inputs `first_input..`) to `params`, before the caller declares it, and returns
/// the hook to write after the declaration, `tp_prologue(p, flat, x)`: x's element `flat` (over
/// x's space `space`, NHWC) computed from its stored value `x` — operand 0, the kernel's input
/// 0 — and the other operands read at the point through their views (per-channel values,
/// scalars). `kernels/gemm_core.cuh` calls it as the convolution stages x. `None` without a
/// prologue.
///
/// [`Prologue`]: crate::lower::Prologue
pub fn prologue(
    program: &Program,
    k: &Kernel,
    space: &[usize],
    params: &mut ParamStruct,
) -> Result<Option<String>, RenderError> {
    let Some(pro) = k.kind.prologue() else {
        return Ok(None);
    };
    let views = k.inputs.get(pro.first_input..).unwrap_or_default();
    let mut operands = operand_fields(program, params, views, "pro", &[]);
    // Its outputs are the epilogue's fields; an operand that may alias one is not read through
    // the read-only cache.
    for op in &mut operands {
        op.read_only = !k
            .outputs
            .iter()
            .any(|&o| overlaps(program, o, op.view.buffer));
    }
    let mut g =
        String::from("TP_DEV float tp_prologue(const tp_params& p, tp_idx flat, float x) {\n");
    let src = FlatPoint {
        var: "flat",
        shape: space,
        operands: &operands,
        own: Some("x"),
        columns: &[],
    };
    let outs = cexpr::render(&pro.expr, &src, "v", "    ", &mut g)?;
    match (outs.as_slice(), pro.expr.outputs.first()) {
        ([x], Some(&id)) if pro.expr.dtype(id) == DType::F32 => {
            let _ = writeln!(g, "    return {x};\n}}");
        }
        _ => {
            return Err(RenderError::Unsupported(format!(
                "`{}`: a prologue computes one f32 value per point of x",
                k.name
            )));
        }
    }
    prologue4(program, &pro.expr, space, &operands, &mut g)?;
    Ok(Some(g))
}

/// The four-channel hooks of a prologue: four consecutive channels of a pixel (the first a
/// multiple of 4), a per-channel operand read as one 16-byte vector and a scalar once — both
/// *held* (`tp_pro_held`, read by `tp_prologue_hold` at any element of the 4 channels, so that
/// a caller whose channels do not change reads them once) — the rest at each element:
/// `tp_prologue4_held(p, h, flat, x)` and `tp_prologue4(p, flat, x)`.
fn prologue4(
    program: &Program,
    expr: &FusedExpr,
    space: &[usize],
    operands: &[Operand],
    g: &mut String,
) -> Result<(), RenderError> {
    let channels = space.last().copied().unwrap_or(1);
    let mut held = Vec::with_capacity(operands.len());
    let mut hold = String::new();
    g.push_str("struct tp_pro_held {\n");
    for (j, op) in operands.iter().enumerate() {
        let strides = &op.view.strides;
        let (last, rest) = strides.split_last().map_or((0, &[][..]), |(l, r)| (*l, r));
        let uniform = rest.iter().all(|&s| s == 0);
        let f32_cached = op.dtype == DType::F32 && op.read_only && uniform;
        held.push(if f32_cached && last == 0 {
            let _ = writeln!(g, "    float s{j};");
            let _ = writeln!(hold, "    h.s{j} = __ldg(p.{});", op.field);
            Some(Held::Scalar(format!("h.s{j}")))
        } else if f32_cached
            && last == 1
            && channels.is_multiple_of(4)
            && super::aligned16(program, op.view)
        {
            let _ = writeln!(g, "    float4 q{j};");
            let _ = writeln!(
                hold,
                "    h.q{j} = __ldg(reinterpret_cast<const float4*>(&p.{}[flat % {channels}]));",
                op.field
            );
            Some(Held::Vector(format!("h.q{j}")))
        } else {
            None
        });
    }
    g.push_str("};\n");
    g.push_str("TP_DEV tp_pro_held tp_prologue_hold(const tp_params& p, tp_idx flat) {\n");
    g.push_str("    tp_pro_held h;\n");
    g.push_str(&hold);
    g.push_str("    return h;\n}\n");
    g.push_str(
        "TP_DEV float4 tp_prologue4_held(const tp_params& p, const tp_pro_held& h, tp_idx flat, \
         float4 x) {\n",
    );
    let mut lanes = Vec::with_capacity(4);
    for (lane, c) in ["x", "y", "z", "w"].into_iter().enumerate() {
        let var = format!("(flat + {lane})");
        let own = format!("x.{c}");
        let src = PrologueLane {
            component: c,
            held: &held,
            point: FlatPoint {
                var: &var,
                shape: space,
                operands,
                own: Some(&own),
                columns: &[],
            },
        };
        let prefix = format!("{c}v");
        lanes.push(cexpr::render(expr, &src, &prefix, "    ", g)?.remove(0));
    }
    let _ = writeln!(g, "    return make_float4({});\n}}", lanes.join(", "));
    g.push_str(
        "TP_DEV float4 tp_prologue4(const tp_params& p, tp_idx flat, float4 x) {\n    \
         return tp_prologue4_held(p, tp_prologue_hold(p, flat), flat, x);\n}\n",
    );
    Ok(())
}

/// An operand `tp_prologue4` reads once for its four elements (a member of `tp_pro_held`).
enum Held {
    /// 4 consecutive channels' values: element `i` is the vector's component `i`.
    Vector(String),
    /// One value for all four.
    Scalar(String),
}

/// One of the four elements of [`prologue`]'s `tp_prologue4`: operands held for the four
/// read from there, the others at the element.
struct PrologueLane<'a> {
    component: &'static str,
    held: &'a [Option<Held>],
    point: FlatPoint<'a>,
}

impl PointSource for PrologueLane<'_> {
    fn load(&self, operand: u16) -> Result<String, RenderError> {
        let slot = usize::from(operand);
        match slot.checked_sub(1).and_then(|j| self.held.get(j)) {
            Some(Some(Held::Vector(name))) => Ok(format!("{name}.{}", self.component)),
            Some(Some(Held::Scalar(name))) => Ok(name.clone()),
            _ => self.point.load(operand),
        }
    }

    fn index(&self, axis: u8) -> String {
        self.point.index(axis)
    }

    fn flat(&self) -> String {
        self.point.flat()
    }
}

/// Whether finish `f` of an epilogue with `results` per-channel results reads result `j` and no
/// other.
fn reads_only_result(f: &ReduceFinish, results: usize, j: usize) -> bool {
    let loads = f.expr.ops.iter().filter_map(|(op, _)| match op {
        crate::lower::expr::ExprOp::Load(s) if usize::from(*s) < results => Some(usize::from(*s)),
        _ => None,
    });
    let mut any = false;
    for s in loads {
        if s != j {
            return false;
        }
        any = true;
    }
    any
}

/// Where each of an epilogue's per-channel reductions accumulates in the GEMM core's `red`
/// array: sums and means first, one slot each, then the variances, two each.
#[derive(Debug)]
pub struct ReductionSlots {
    /// Per reduction, in the epilogue's order.
    of: Vec<Slot>,
    /// Sums and means.
    pub plain: usize,
    /// Variances.
    pub variances: usize,
}

#[derive(Clone, Copy, Debug)]
enum Slot {
    /// A sum or mean's slot.
    Plain(usize),
    /// Variance `i`'s first slot (`x - K`; `(x - K)²` is the next).
    Variance(usize, usize),
}

impl ReductionSlots {
    /// The slots of `reductions`.
    pub fn of(reductions: &[ChannelReduction]) -> ReductionSlots {
        let plain = reductions
            .iter()
            .filter(|&&r| r != ChannelReduction::Variance)
            .count();
        let (mut p, mut v) = (0, 0);
        let of = reductions
            .iter()
            .map(|r| match r {
                ChannelReduction::Variance => {
                    v += 1;
                    Slot::Variance(v - 1, plain + 2 * (v - 1))
                }
                _ => {
                    p += 1;
                    Slot::Plain(p - 1)
                }
            })
            .collect();
        ReductionSlots {
            of,
            plain,
            variances: v,
        }
    }

    /// Every slot: `TP_EPI_RED`.
    pub fn total(&self) -> usize {
        self.plain + 2 * self.variances
    }
}

/// Which of an epilogue's operands are column operands (see [`epilogue`]): read-only, with
/// stride 0 along every axis but the last.
fn column_operands(operands: &[Operand]) -> Vec<bool> {
    operands
        .iter()
        .map(|op| {
            let strides = &op.view.strides;
            op.read_only
                && strides[..strides.len().saturating_sub(1)]
                    .iter()
                    .all(|&s| s == 0)
        })
        .collect()
}

/// `struct tp_epi_col` (one member per column operand, named as its field, in its compute
/// type) and `tp_epi_column(p, c)`, which reads them for channel `c` of the output's last axis.
fn column_hook(operands: &[Operand], columns: &[bool], g: &mut String) {
    let column = || {
        operands
            .iter()
            .zip(columns)
            .filter(|(_, c)| **c)
            .map(|(op, _)| op)
    };
    g.push_str("struct tp_epi_col {\n");
    for op in column() {
        let _ = writeln!(g, "    {} {};", compute_type(op.dtype), op.field);
    }
    g.push_str("};\n");
    g.push_str("TP_DEV tp_epi_col tp_epi_column(const tp_params& p, int c) {\n");
    g.push_str("    tp_epi_col col;\n");
    for op in column() {
        let index = match op.view.strides.last().copied().unwrap_or(0) {
            0 => "0".to_string(),
            1 => "c".to_string(),
            s => format!("(tp_idx)c * {s}"),
        };
        let raw = load_expr(&format!("p.{}", op.field), &index, true);
        let _ = writeln!(
            g,
            "    col.{} = {};",
            op.field,
            cexpr::from_storage(&raw, op.dtype)
        );
    }
    g.push_str("    return col;\n}\n");
}

/// Points of a reduction: output `o` over the kept axes, reduced position `r` over the rest.
struct ReducePoint<'a> {
    shape: &'a [usize],
    kept: Vec<usize>,
    reduced: Vec<usize>,
    operands: &'a [Operand<'a>],
}

impl ReducePoint<'_> {
    /// `Σ coordinate · stride` over the space, split into its kept and reduced halves.
    fn linear(&self, strides: &[usize]) -> String {
        let part = |var: &str, axes: &[usize]| -> String {
            let a: Vec<Axis> = axes.iter().map(|&d| (self.shape[d], strides[d])).collect();
            linear(var, &a)
        };
        let (o, r) = (part("o", &self.kept), part("r", &self.reduced));
        match (o.as_str(), r.as_str()) {
            ("0", _) => r,
            (_, "0") => o,
            _ => format!("{o} + {r}"),
        }
    }
}

impl PointSource for ReducePoint<'_> {
    fn load(&self, operand: u16) -> Result<String, RenderError> {
        let op = self
            .operands
            .get(usize::from(operand))
            .ok_or_else(|| RenderError::Unsupported(format!("operand {operand} has no input")))?;
        let raw = load_expr(
            &format!("p.{}", op.field),
            &self.linear(&op.view.strides),
            op.read_only,
        );
        Ok(cexpr::from_storage(&raw, op.dtype))
    }

    fn index(&self, axis: u8) -> String {
        let axis = usize::from(axis);
        let unit: Vec<usize> = (0..self.shape.len())
            .map(|d| usize::from(d == axis))
            .collect();
        self.linear(&unit)
    }

    fn flat(&self) -> String {
        self.linear(&crate::lower::program::contiguous_strides(self.shape))
    }
}

fn identity(op: ReduceOp, ty: &str) -> &'static str {
    match (op, ty) {
        (ReduceOp::Sum | ReduceOp::Mean, "float") => "0.0f",
        (ReduceOp::Sum | ReduceOp::Mean, "double") => "0.0",
        (ReduceOp::Sum | ReduceOp::Mean, _) => "0",
        (ReduceOp::Max, "float") => "-tp_inff()",
        (ReduceOp::Max, "double") => "-tp_inf()",
        (ReduceOp::Max, _) => "(long long)0x8000000000000000ULL",
        (ReduceOp::Min, "float") => "tp_inff()",
        (ReduceOp::Min, "double") => "tp_inf()",
        (ReduceOp::Min, _) => "0x7fffffffffffffffLL",
    }
}

fn combine(op: ReduceOp, acc: &str, v: &str) -> String {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => format!("{acc} += {v};"),
        ReduceOp::Max => format!("{acc} = tp_max({acc}, {v});"),
        ReduceOp::Min => format!("{acc} = tp_min({acc}, {v});"),
    }
}

/// Size of the C struct `tp_acc` whose members have C types `types` (each aligned to its size,
/// the struct padded to its largest member).
fn acc_size(types: &[&str]) -> usize {
    let mut end = 0usize;
    let mut align = 1usize;
    for t in types {
        let size = if *t == "float" { 4 } else { 8 };
        end = end.next_multiple_of(size) + size;
        align = align.max(size);
    }
    end.next_multiple_of(align).max(1)
}

/// The statements storing a finish's `values` (a reduction's, or an epilogue's) into the
/// kernel's outputs `first..` at index `at`; `what` names the finish in the error when the
/// kernel has fewer outputs than the finish computes.
#[allow(clippy::too_many_arguments)]
fn store_finish(
    program: &Program,
    k: &Kernel,
    what: &str,
    values: &[String],
    first: usize,
    indent: &str,
    at: &str,
    g: &mut String,
) -> Result<(), RenderError> {
    for (o, v) in values.iter().enumerate() {
        let slot = first + o;
        let out = k.outputs.get(slot).copied().ok_or_else(|| {
            RenderError::Unsupported(format!(
                "the {what} of `{}` has more outputs than the kernel",
                k.name
            ))
        })?;
        let v = cexpr::to_storage(v, program.buffer(out).dtype);
        let _ = writeln!(g, "{indent}p.out{slot}[{at}] = {v};");
    }
    Ok(())
}

/// How many points a lane of an unsplit reduction folds per loop iteration (`TP_FOLD_UNROLL`,
/// `kernels/reduce.cu`): four, so that four points' loads are in flight at once, where the
/// prologue has at most two results; one otherwise (unrolled, ptxas spills for some prologues
/// with more: batch norm's gradient sums).
fn fold_unroll(results: usize) -> usize {
    if results <= 2 { 4 } else { 1 }
}

/// A reduction of `shape` over `axes` with a fused prologue. When its outputs give too few
/// blocks to fill `target` and the reduced axis is long, the reduced points are split across
/// `TP_SPLIT` blocks per output tile (`blockIdx.y`), whose partials the last of them combines
/// in a fixed order (`kernels/reduce.cu`).
pub fn reduce(
    program: &Program,
    k: &Kernel,
    shape: &[usize],
    axes: &[usize],
    (prologue, ops, finish): (&FusedExpr, &[ReduceOp], Option<&ReduceFinish>),
    target: &Target,
) -> Result<RenderedKernel, RenderError> {
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    let reduced: Vec<usize> = (0..shape.len()).filter(|d| axes.contains(d)).collect();
    let launch::ReduceLaunch {
        out_len,
        red_len,
        tile,
        out_tiles,
        split,
        ..
    } = launch::reduce_launch(shape, axes, target);
    let mut params = ParamStruct::default();
    let operands = operand_fields(program, &mut params, &k.inputs, "in", &k.outputs);
    let points = out_len * red_len;
    let extent = kernel_extent(program, k, points.max(split.parts * out_len));
    let types: Vec<&str> = prologue
        .outputs
        .iter()
        .map(|&o| compute_type(prologue.dtype(o)))
        .map(|t| if t == "bool" { "long long" } else { t })
        .collect();
    let mut workspace_bytes = 0;
    if split.parts > 1 {
        let partials = split.parts * out_len * acc_size(&types);
        let counters = launch::counters_offset(partials);
        params
            .push(
                "ws",
                FieldKind::Workspace {
                    offset: 0,
                    elem: "tp_acc",
                },
            )
            .push(
                "ws_count",
                FieldKind::Workspace {
                    offset: counters,
                    elem: "unsigned int",
                },
            );
        workspace_bytes = counters + 4 * out_tiles;
    }
    let mut g = String::new();
    let _ = writeln!(g, "typedef {} tp_idx;", index_type(extent));
    g.push_str(&constant("TP_BLOCK", "unsigned int", BLOCK));
    g.push_str(&constant("TP_TILE_O", "unsigned int", tile));
    g.push_str(&constant("TP_OUT", "tp_idx", out_len));
    g.push_str(&constant("TP_RED", "tp_idx", red_len));
    g.push_str(&define("TP_SPLIT", split.parts));
    g.push_str(&constant("TP_CHUNK", "tp_idx", split.chunk));
    g.push_str(&define("TP_FOLD_UNROLL", fold_unroll(types.len())));
    g.push_str("struct tp_acc {\n");
    for (j, t) in types.iter().enumerate() {
        let _ = writeln!(g, "    {t} a{j};");
    }
    g.push_str("};\n");
    g.push_str(&params.declaration());
    g.push_str("TP_DEV void tp_init(tp_acc& acc) {\n");
    for (j, (t, &op)) in types.iter().zip(ops).enumerate() {
        let _ = writeln!(g, "    acc.a{j} = {};", identity(op, t));
    }
    g.push_str("}\nTP_DEV void tp_fold(const tp_params& p, tp_acc& acc, tp_idx o, tp_idx r) {\n");
    let src = ReducePoint {
        shape,
        kept,
        reduced,
        operands: &operands,
    };
    let outs = cexpr::render(prologue, &src, "v", "    ", &mut g)?;
    for (j, (v, &op)) in outs.iter().zip(ops).enumerate() {
        let _ = writeln!(g, "    {}", combine(op, &format!("acc.a{j}"), v));
    }
    g.push_str("}\nTP_DEV void tp_merge(tp_acc& acc, const tp_acc& other) {\n");
    for (j, &op) in ops.iter().enumerate() {
        let _ = writeln!(
            g,
            "    {}",
            combine(op, &format!("acc.a{j}"), &format!("other.a{j}"))
        );
    }
    g.push_str("}\nTP_DEV void tp_finish(const tp_params& p, tp_idx o, const tp_acc& acc) {\n");
    // With a finish, each result is also held as stored (its compute type) for the finish.
    let mut results = Vec::new();
    for (j, ((&out, t), &op)) in k.outputs.iter().zip(&types).zip(ops).enumerate() {
        let mut v = format!("acc.a{j}");
        if op == ReduceOp::Mean {
            v = format!("({v} / ({t})TP_RED)");
        }
        let dtype = program.buffer(out).dtype;
        let stored = cexpr::to_storage(&cexpr::cast(&v, acc_dtype(t), dtype), dtype);
        if finish.is_some() {
            let r = format!("r{j}");
            let _ = writeln!(
                g,
                "    const {} {r} = {};",
                compute_type(dtype),
                cexpr::from_storage(&stored, dtype)
            );
            let _ = writeln!(g, "    p.out{j}[o] = {};", cexpr::to_storage(&r, dtype));
            results.push(r);
        } else {
            let _ = writeln!(g, "    p.out{j}[o] = {stored};");
        }
    }
    if let Some(f) = finish {
        let point = FinishPoint {
            results: &results,
            inputs: FlatPoint {
                var: "o",
                shape: &f.shape,
                operands: operands.get(f.first_input..).unwrap_or_default(),
                own: None,
                columns: &[],
            },
        };
        let values = cexpr::render(&f.expr, &point, "f", "    ", &mut g)?;
        store_finish(
            program,
            k,
            "finish",
            &values,
            ops.len(),
            "    ",
            "o",
            &mut g,
        )?;
    }
    g.push_str("}\n");
    if split.parts > 1 {
        // Partials bypass L1 (written and read by different blocks of the launch).
        g.push_str("TP_DEV void tp_ws_store(tp_acc* at, const tp_acc& acc) {\n");
        for j in 0..types.len() {
            let _ = writeln!(g, "    __stcg(&at->a{j}, acc.a{j});");
        }
        g.push_str("}\nTP_DEV void tp_ws_load(const tp_acc* at, tp_acc& acc) {\n");
        for j in 0..types.len() {
            let _ = writeln!(g, "    acc.a{j} = __ldcg(&at->a{j});");
        }
        g.push_str("}\n");
    }
    let launch = if split.parts > 1 {
        LaunchDims::blocks([
            u32::try_from(out_tiles).map_err(|_| RenderError::TooLarge {
                what: format!("output tiles of `{}`", k.name),
                value: out_tiles,
            })?,
            split.parts as u32,
            1,
        ])
    } else {
        LaunchDims::linear(out_tiles.min(1 << 20))
    };
    Ok(RenderedKernel {
        body: Body::Reduce,
        generated: g,
        params,
        launch,
        workspace_bytes,
    })
}

/// A reduction's finish at output `o`: slots below `results.len()` read the results as stored,
/// the others the kernel's inputs from the finish's first over its space.
struct FinishPoint<'a> {
    results: &'a [String],
    inputs: FlatPoint<'a>,
}

impl PointSource for FinishPoint<'_> {
    fn load(&self, operand: u16) -> Result<String, RenderError> {
        let slot = usize::from(operand);
        match self.results.get(slot) {
            Some(r) => Ok(r.clone()),
            None => self.inputs.load((slot - self.results.len()) as u16),
        }
    }

    fn index(&self, axis: u8) -> String {
        self.inputs.index(axis)
    }

    fn flat(&self) -> String {
        self.inputs.flat()
    }
}

/// The dtype whose compute type is accumulator type `t`.
fn acc_dtype(t: &str) -> DType {
    match t {
        "float" => DType::F32,
        "double" => DType::F64,
        _ => DType::I64,
    }
}
