//! Generated parts of the fixed-function kernels: the parameter struct (geometry as fields, so
//! one compiled module serves every shape), compile-time switches, launch geometry, and for
//! matrix products and convolutions the epilogue hook.

use super::fused::epilogue;
use super::index::linear;
use super::params::FieldKind;
use super::{
    BLOCK, LaunchDims, ParamStruct, RenderError, RenderedKernel, constant, expect_f32, index_type,
    kernel_extent,
};
use crate::backend::cuda::bodies::Body;
use crate::ir::PoolKind;
use crate::lower::{ConvGeom, Kernel, KernelKind, PoolGeom, Program, View};
use std::fmt::Write as _;

/// The largest GEMM tile edge (`TP_BM`, `TP_BN` of `kernels/gemm_core.cuh` are 16, 32 or 64).
const MAX_TILE: usize = 64;

fn grid_dim(what: &str, blocks: usize, limit: usize) -> Result<u32, RenderError> {
    if blocks > limit {
        return Err(RenderError::TooLarge {
            what: format!("grid dimension of {what}"),
            value: blocks,
        });
    }
    Ok(blocks.max(1) as u32)
}

/// The tile edge for a GEMM dimension of `extent`: the smallest of 16, 32, 64 covering it.
fn tile_edge(extent: usize) -> usize {
    extent.next_power_of_two().clamp(16, MAX_TILE)
}

/// Chooses the tile of an `m x n` GEMM (`z` of them), writes `TP_BM`/`TP_BN` into the
/// generated part `g`, and returns the grid.
fn tiled(
    g: &mut String,
    what: &str,
    m: usize,
    n: usize,
    z: usize,
) -> Result<LaunchDims, RenderError> {
    let (bm, bn) = (tile_edge(m), tile_edge(n));
    g.push_str(&constant("TP_BM", "int", bm));
    g.push_str(&constant("TP_BN", "int", bn));
    Ok(LaunchDims {
        grid: [
            grid_dim(what, m.div_ceil(bm), i32::MAX as usize)?,
            grid_dim(what, n.div_ceil(bn), 65_535)?,
            grid_dim(what, z, 65_535)?,
        ],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
    })
}

/// The common head of a generated part: which kernel, its index type and block size.
fn head(program: &Program, k: &Kernel) -> String {
    let extent = kernel_extent(program, k, 0);
    format!(
        "typedef {} tp_idx;\n{}",
        index_type(extent),
        constant("TP_BLOCK", "unsigned int", BLOCK)
    )
}

fn input(program: &Program, p: &mut ParamStruct, name: &str, v: &View) -> Result<(), RenderError> {
    let dtype = program.buffer(v.buffer).dtype;
    p.buffer(name, v.buffer, v.offset, dtype, false);
    Ok(())
}

fn f32_input(
    program: &Program,
    p: &mut ParamStruct,
    name: &str,
    v: &View,
) -> Result<(), RenderError> {
    expect_f32(name, program.buffer(v.buffer).dtype)?;
    input(program, p, name, v)
}

fn conv_fields(p: &mut ParamStruct, g: &ConvGeom) -> Result<(), RenderError> {
    p.int("batch", g.n)?
        .int("in_h", g.h)?
        .int("in_w", g.w)?
        .int("in_c", g.c)?
        .int("out_h", g.oh)?
        .int("out_w", g.ow)?
        .int("out_c", g.o)?
        .int("k_h", g.kh)?
        .int("k_w", g.kw)?
        .int("stride_h", g.stride[0])?
        .int("stride_w", g.stride[1])?
        .int("dil_h", g.dilation[0])?
        .int("dil_w", g.dilation[1])?
        .int("pad_top", g.pad[0])?
        .int("pad_left", g.pad[2])?
        .int("groups", g.groups.max(1))?;
    Ok(())
}

fn pool_fields(p: &mut ParamStruct, g: &PoolGeom) -> Result<(), RenderError> {
    p.int("batch", g.n)?
        .int("in_h", g.h)?
        .int("in_w", g.w)?
        .int("channels", g.c)?
        .int("out_h", g.oh)?
        .int("out_w", g.ow)?
        .int("win_h", g.window[0])?
        .int("win_w", g.window[1])?
        .int("stride_h", g.stride[0])?
        .int("stride_w", g.stride[1])?
        .int("pad_top", g.pad[0])?
        .int("pad_left", g.pad[2])?;
    Ok(())
}

/// Renders a fixed-function kernel; `None` when it has nothing to do. `index` is the kernel's
/// position in the program (its status code is `index + 1`).
pub fn render(
    program: &Program,
    k: &Kernel,
    index: usize,
    _target: &super::Target,
) -> Result<Option<RenderedKernel>, RenderError> {
    let mut p = ParamStruct::default();
    let mut g = head(program, k);
    let out0 = k.outputs[0];
    let out_len = program.buffer(out0).len();
    let (body, launch) = match &k.kind {
        KernelKind::MatMul(mg, _) => {
            if out_len == 0 {
                return Ok(None);
            }
            g.push_str(&constant("TP_TRANS_A", "bool", mg.transpose_a));
            g.push_str(&constant("TP_TRANS_B", "bool", mg.transpose_b));
            f32_input(program, &mut p, "a", &k.inputs[0])?;
            f32_input(program, &mut p, "b", &k.inputs[1])?;
            p.int("m", mg.m)?
                .int("n", mg.n)?
                .int("k", mg.k)?
                .int("a_batch_stride", mg.m * mg.k)?
                .int(
                    "b_batch_stride",
                    if mg.rhs_batched { mg.k * mg.n } else { 0 },
                )?;
            let launch = tiled(&mut g, &k.name, mg.m, mg.n, mg.batch)?;
            epilogue(program, k, &mut p, &mut g)?;
            (Body::MatMul, launch)
        }
        KernelKind::Conv2d(cg, _) => {
            if out_len == 0 {
                return Ok(None);
            }
            f32_input(program, &mut p, "x", &k.inputs[0])?;
            f32_input(program, &mut p, "filter", &k.inputs[1])?;
            conv_fields(&mut p, cg)?;
            let groups = cg.groups.max(1);
            let launch = tiled(&mut g, &k.name, cg.n * cg.oh * cg.ow, cg.o / groups, groups)?;
            epilogue(program, k, &mut p, &mut g)?;
            (Body::Conv2d, launch)
        }
        KernelKind::Conv2dBackpropInput(cg, _) => {
            if out_len == 0 {
                return Ok(None);
            }
            f32_input(program, &mut p, "dy", &k.inputs[0])?;
            f32_input(program, &mut p, "filter", &k.inputs[1])?;
            conv_fields(&mut p, cg)?;
            let groups = cg.groups.max(1);
            let launch = tiled(&mut g, &k.name, cg.n * cg.h * cg.w, cg.c / groups, groups)?;
            epilogue(program, k, &mut p, &mut g)?;
            (Body::Conv2dBackpropInput, launch)
        }
        KernelKind::Conv2dBackpropFilter(cg) => {
            if out_len == 0 {
                return Ok(None);
            }
            f32_input(program, &mut p, "x", &k.inputs[0])?;
            f32_input(program, &mut p, "dy", &k.inputs[1])?;
            conv_fields(&mut p, cg)?;
            let groups = cg.groups.max(1);
            let m = cg.kh * cg.kw * (cg.c / groups);
            let launch = tiled(&mut g, &k.name, m, cg.o / groups, groups)?;
            epilogue(program, k, &mut p, &mut g)?;
            (Body::Conv2dBackpropFilter, launch)
        }
        KernelKind::Pool(pg) => {
            g.push_str(&constant("TP_MAX_POOL", "bool", pg.kind == PoolKind::Max));
            f32_input(program, &mut p, "x", &k.inputs[0])?;
            p.buffer("y", out0, 0, program.buffer(out0).dtype, true);
            pool_fields(&mut p, pg)?;
            g.push_str(&p.declaration());
            (Body::Pool, LaunchDims::over(out_len))
        }
        KernelKind::MaxPoolGrad(pg) | KernelKind::AvgPoolGrad(pg) => {
            let max = matches!(k.kind, KernelKind::MaxPoolGrad(_));
            g.push_str(&constant("TP_MAX_POOL", "bool", max));
            // Average pooling's gradient never reads x: the field points at dy.
            let (x, dy) = if max {
                (&k.inputs[0], &k.inputs[1])
            } else {
                (&k.inputs[0], &k.inputs[0])
            };
            f32_input(program, &mut p, "x", x)?;
            f32_input(program, &mut p, "dy", dy)?;
            p.buffer("dx", out0, 0, program.buffer(out0).dtype, true);
            pool_fields(&mut p, pg)?;
            g.push_str(&p.declaration());
            (Body::PoolGrad, LaunchDims::over(out_len))
        }
        KernelKind::Softmax { rows, cols, log } => {
            g.push_str(&constant("TP_LOG", "bool", log));
            f32_input(program, &mut p, "x", &k.inputs[0])?;
            p.buffer("y", out0, 0, program.buffer(out0).dtype, true);
            p.int("rows", *rows)?.int("cols", *cols)?;
            g.push_str(&p.declaration());
            (Body::Softmax, warp_rows(*rows))
        }
        KernelKind::SparseSoftmaxCrossEntropy { rows, classes } => {
            f32_input(program, &mut p, "logits", &k.inputs[0])?;
            input(program, &mut p, "labels", &k.inputs[1])?;
            p.buffer("loss", out0, 0, program.buffer(out0).dtype, true)
                .push("status", FieldKind::Status);
            p.int("rows", *rows)?
                .int("classes", *classes)?
                .int("code", index + 1)?;
            g.push_str(&p.declaration());
            (Body::SparseXent, warp_rows(*rows))
        }
        KernelKind::ArgMax { outer, len, inner } => {
            f32_input(program, &mut p, "x", &k.inputs[0])?;
            p.buffer("y", out0, 0, program.buffer(out0).dtype, true);
            p.int("outer", *outer)?
                .int("len", *len)?
                .int("inner", *inner)?;
            g.push_str(&p.declaration());
            (Body::ArgMax, LaunchDims::over(outer * inner))
        }
        KernelKind::InTopK {
            rows,
            classes,
            k: top,
        } => {
            f32_input(program, &mut p, "preds", &k.inputs[0])?;
            input(program, &mut p, "targets", &k.inputs[1])?;
            p.buffer("y", out0, 0, program.buffer(out0).dtype, true);
            p.int("rows", *rows)?
                .int("classes", *classes)?
                .int("k", *top)?;
            g.push_str(&p.declaration());
            (Body::InTopK, LaunchDims::over(*rows))
        }
        KernelKind::Concat { outer, sizes, .. } => {
            gather_head(
                program,
                k,
                &mut p,
                &mut g,
                outer * sizes.iter().sum::<usize>(),
            );
            g.push_str("TP_DEV tp_elem tp_gather(const tp_params& p, tp_idx i) {\n");
            let total: usize = sizes.iter().sum();
            let _ = writeln!(g, "    const tp_idx row = i / {total};");
            let _ = writeln!(g, "    tp_idx col = i % {total};");
            for (j, s) in sizes.iter().enumerate() {
                let _ = writeln!(g, "    if (col < {s}) return p.in{j}[row * {s} + col];");
                let _ = writeln!(g, "    col -= {s};");
            }
            g.push_str("    return (tp_elem)0;  // unreachable: col < total\n}\n");
            (Body::Gather, LaunchDims::over(out_len))
        }
        KernelKind::Pad { shape, pads } => {
            let out_shape: Vec<usize> = shape
                .iter()
                .zip(pads)
                .map(|(d, (b, a))| d + b + a)
                .collect();
            gather_head(program, k, &mut p, &mut g, out_len);
            g.push_str("TP_DEV tp_elem tp_gather(const tp_params& p, tp_idx i) {\n");
            let in_strides = crate::lower::program::contiguous_strides(shape);
            let mut terms = Vec::new();
            for (d, ((&n, &(before, _)), &s)) in shape.iter().zip(pads).zip(&in_strides).enumerate()
            {
                let c = super::index::coordinate("i", &out_shape, d);
                let _ = writeln!(g, "    const tp_idx c{d} = {c};");
                if before > 0 {
                    let _ = writeln!(
                        g,
                        "    if (c{d} < {before} || c{d} >= {}) return (tp_elem)0;",
                        before + n
                    );
                } else if n != out_shape[d] {
                    let _ = writeln!(g, "    if (c{d} >= {n}) return (tp_elem)0;");
                }
                if s != 0 && n > 1 {
                    let shifted = if before > 0 {
                        format!("(c{d} - {before})")
                    } else {
                        format!("c{d}")
                    };
                    terms.push(linear(&shifted, &[(n, s)]));
                }
            }
            let index = if terms.is_empty() {
                "0".to_string()
            } else {
                terms.join(" + ")
            };
            let _ = writeln!(g, "    return p.in0[{index}];\n}}");
            (Body::Gather, LaunchDims::over(out_len))
        }
        KernelKind::Elementwise { .. }
        | KernelKind::Reduce { .. }
        | KernelKind::AllReduce { .. } => {
            return Err(RenderError::Unsupported(format!(
                "kernel `{}` ({}) is not a fixed-function kernel",
                k.name,
                k.kind.name()
            )));
        }
    };
    Ok(Some(RenderedKernel {
        body,
        generated: g,
        params: p,
        launch,
        workspace_bytes: 0,
    }))
}

/// One warp per row, `BLOCK / 32` rows per block.
fn warp_rows(rows: usize) -> LaunchDims {
    LaunchDims::linear(rows.div_ceil(BLOCK as usize / 32))
}

/// Fields and typedefs of a gather kernel: `out`, then `in{j}` per input.
fn gather_head(program: &Program, k: &Kernel, p: &mut ParamStruct, g: &mut String, points: usize) {
    let dtype = program.buffer(k.outputs[0]).dtype;
    let _ = writeln!(g, "typedef {} tp_elem;", super::params::storage_type(dtype));
    g.push_str(&constant("TP_POINTS", "tp_idx", points));
    p.buffer("out", k.outputs[0], 0, dtype, true);
    for (j, v) in k.inputs.iter().enumerate() {
        p.buffer(&format!("in{j}"), v.buffer, v.offset, dtype, false);
    }
    g.push_str(&p.declaration());
}
