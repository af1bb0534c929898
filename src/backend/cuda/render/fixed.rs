//! Generated parts of the fixed-function kernels: the parameter struct, compile-time switches
//! and geometry, launch geometry, and for matrix products and convolutions the GEMM tile and
//! split chosen per launch ([`launch::gemm`]) and the epilogue hook. Convolution, matrix and
//! pooling geometry are compile-time constants (divisions by them compile to multiplications);
//! the other kernels take theirs as fields, so one module serves every shape.

use super::fused::{self, ReductionSlots, epilogue};
use super::index::linear;
use super::launch::{self, Target};
use super::params::FieldKind;
use super::{
    BLOCK, LaunchDims, ParamStruct, RenderError, RenderedKernel, aligned16, constant, define,
    expect_f32, index_type, kernel_extent,
};
use crate::backend::cuda::bodies::Body;
use crate::ir::PoolKind;
use crate::lower::{ConvGeom, HalfFormat, Kernel, KernelKind, PoolGeom, Precision, Program, View};
use crate::tensor::DType;
use std::fmt::Write as _;

fn grid_dim(what: &str, blocks: usize, limit: usize) -> Result<u32, RenderError> {
    if blocks > limit {
        return Err(RenderError::TooLarge {
            what: format!("grid dimension of {what}"),
            value: blocks,
        });
    }
    Ok(blocks.max(1) as u32)
}

/// A GEMM as the tiled core runs it: `z` products of `m × n` over `k`, and whether each operand
/// may be read 4 floats at a time (extents along the fast direction multiples of 4, 16-byte
/// aligned).
struct Gemm {
    m: usize,
    n: usize,
    k: usize,
    z: usize,
    vec_a: bool,
    vec_b: bool,
    /// The program's precision: TF32, BF16 and FP16 take the tensor-core variant of the core
    /// where the target has tensor cores.
    precision: Precision,
    /// The 16-bit format both operands are rounded to before they are multiplied (the
    /// kernel's `round_operands`): `TP_ROUND` of `kernels/gemm_core.cuh`.
    round: Option<HalfFormat>,
    /// A strided input gradient's phases ([`DgradPhases`]): independent GEMMs of `m` rows and
    /// at most `k` laid side by side along the grid's x, the tile's row blocks once per phase.
    phases: Option<DgradPhases>,
    /// A convolution whose A operand may be read through a shared-memory window
    /// ([`ConvWindow`]), where the chosen launch allows.
    window: Option<ConvWindow>,
    /// A convolution computing its input in a prologue: the loaders hold where each slot came
    /// from, and the prologue's operands — 3 resident blocks where the tile would bound the
    /// registers for 4 (at 64, ptxas 12.9 spilled 4–156 bytes of ResNet-20's bf16 prologue
    /// kernels).
    prologue: bool,
}

/// `TP_MIN_BLOCKS` of a launch bounded for `blocks` resident blocks: 3 instead of 4 with a
/// prologue ([`Gemm::prologue`]).
fn min_blocks(blocks: usize, prologue: bool) -> usize {
    if prologue && blocks == 4 { 3 } else { blocks }
}

/// The window of `kernels/gemm_core.cuh`'s `tp_window`: a convolution of stride and dilation 1
/// whose A rows are `rows × width` pixels per image (output pixels of the forward convolution,
/// input pixels of the input gradient) and whose K is `taps × channels` with the channels
/// (of a pixel of A's source) a multiple of the K tile. A row tile of whole rows of one image
/// reads one window of `tile rows + kh - 1` rows of `width + kw - 1` pixels for all its taps,
/// which the block then loads once instead of once per tap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ConvWindow {
    rows: usize,
    width: usize,
    kh: usize,
    kw: usize,
    channels: usize,
}

impl ConvWindow {
    /// The window of `cg`'s forward convolution (`input_gradient`: of its input gradient), if
    /// it has one (stride and dilation 1, one group, channels a multiple of the K tile, a
    /// filter of more than one tap).
    fn of(cg: &ConvGeom, input_gradient: bool) -> Option<ConvWindow> {
        let unit = cg.stride == [1, 1] && cg.dilation == [1, 1] && cg.groups.max(1) == 1;
        let (rows, width, channels) = if input_gradient {
            (cg.h, cg.w, cg.o)
        } else {
            (cg.oh, cg.ow, cg.c)
        };
        (unit && channels.is_multiple_of(launch::GEMM_BK) && channels > 0 && cg.kh * cg.kw > 1)
            .then_some(ConvWindow {
                rows,
                width,
                kh: cg.kh,
                kw: cg.kw,
                channels,
            })
    }

    /// Whether launch `l` (tile columns `bn`, `red_outputs` epilogue reductions) can take the
    /// window: tensor cores, row tiles of whole rows of one image, and the window with the
    /// K tiles of B a block multiplies (all of K, or its split's chunk) in the static shared
    /// memory — counted in the precision's element (`half`: 16-bit operands) with the larger
    /// pads, an upper bound of `tp_window`'s layout.
    fn fits(
        &self,
        l: &launch::GemmLaunch,
        tensor: bool,
        half: bool,
        k: usize,
        red_outputs: usize,
    ) -> bool {
        let t = l.tile;
        let whole_rows =
            t.bm.is_multiple_of(self.width) && (self.rows * self.width).is_multiple_of(t.bm);
        let bk = launch::GEMM_BK;
        let chunk = if l.split.parts > 1 { l.split.chunk } else { k };
        let element = if half { 2 } else { 4 };
        let window = (t.bm / self.width.max(1) + self.kh - 1)
            * (self.width + self.kw - 1)
            * (self.channels + 8);
        let b = chunk.div_ceil(bk) * (bk * (t.bn + 8)).max(t.bn * (bk + 8));
        let bytes =
            ((window + b) * element).max(t.bm * (t.bn + 8) * 4) + 16 + 8 * red_outputs * t.bn * 4;
        tensor && chunk.is_multiple_of(bk) && whole_rows && bytes <= launch::MAX_SHARED
    }
}

/// The phases of a strided convolution's input gradient (`kernels/conv2d_backprop_input.cu`):
/// input pixel `(h, w)` receives only the taps `kh` with `h + pad_top - kh·dil_h` a multiple of
/// the stride, so the pixels split by `(h + pad_top) mod s_h` (and along w) into `s_h·s_w`
/// GEMMs over their own taps: every `per`-th tap, at most `taps` of them, for at most `rows`
/// pixels per axis. A 3×3 stride-2 gradient then multiplies 3 taps per pixel on average (4, 2,
/// 2 and 4 of which 2.25 are real) instead of 9, of which the stride skips three quarters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DgradPhases {
    stride: [usize; 2],
    per: [usize; 2],
    taps: [usize; 2],
    rows: [usize; 2],
}

impl DgradPhases {
    fn of(cg: &ConvGeom) -> DgradPhases {
        let axis = |i: usize, input: usize, k: usize| {
            let s = cg.stride[i].max(1);
            let per = s / gcd(cg.dilation[i].max(1), s);
            (per, k.div_ceil(per), input.div_ceil(s))
        };
        let (ph, th, rh) = axis(0, cg.h, cg.kh);
        let (pw, tw, rw) = axis(1, cg.w, cg.kw);
        DgradPhases {
            stride: [cg.stride[0].max(1), cg.stride[1].max(1)],
            per: [ph, pw],
            taps: [th, tw],
            rows: [rh, rw],
        }
    }

    fn count(&self) -> usize {
        self.stride[0] * self.stride[1]
    }

    /// The kernel's phase constants (none for one phase: the kernel's defaults are the plain
    /// GEMM).
    fn write(&self, g: &mut String, tiles_per_phase: usize) -> Result<(), RenderError> {
        if self.count() == 1 {
            return Ok(());
        }
        g.push_str(&define("TP_PHASES_H", self.stride[0]));
        g.push_str(&define("TP_PHASES_W", self.stride[1]));
        for (name, v) in [
            ("TP_PHASE_TILES", tiles_per_phase),
            ("TP_PER_H", self.per[0]),
            ("TP_PER_W", self.per[1]),
            ("TP_TAPS_H", self.taps[0]),
            ("TP_TAPS_W", self.taps[1]),
            ("TP_PH_H", self.rows[0]),
            ("TP_PH_W", self.rows[1]),
        ] {
            int_const(g, name, v)?;
        }
        Ok(())
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Whether launch `l` of `gm` reads A through window `w` on `target`: windows allowed, A read in
/// vectors, tensor cores, and the window and the K tiles of B a block multiplies fit
/// ([`ConvWindow::fits`]).
fn takes_window(
    gm: &Gemm,
    w: ConvWindow,
    l: &launch::GemmLaunch,
    red_outputs: usize,
    target: &Target,
) -> bool {
    let tensor = on_tensor_cores(gm, &l.tile, target);
    target.windows && gm.vec_a && w.fits(l, tensor, gm.round.is_some(), gm.k, red_outputs)
}

/// Whether `gm` on `tile` runs the tensor-core variant of the core: its precision takes the
/// tensor cores, `target` has them, and the tile has a tensor-core warp layout.
fn on_tensor_cores(gm: &Gemm, tile: &launch::Tile, target: &Target) -> bool {
    gm.precision.tensor_cores() && target.tensor_cores && tile.tensor_warps().is_some()
}

/// A launch of `gm` that reads A through window `w`, for a convolution whose cost-chosen launch
/// cannot (its row tiles are not whole image rows, or the window does not fit beside B): among
/// the tiles with a tensor-core variant that span all of N — so that no two blocks load the
/// same window — and whose launches take the window and still fill the device, the one
/// wasting the fewest tile cells past M and N, then the fewest splits. The tile chooser's cost
/// ([`launch::gemm_in`]) counts every tap's reload of A, which a window reads once: ResNet's
/// 8×8 stage, whose 256 × 16 tiles span four images and a quarter of the channels, takes
/// 64 × 64 tiles of one image each (H100 model: 17.5 → 11.8 µs a forward convolution; its input
/// gradients, whose four epilogue reductions leave no such tile room, keep theirs). The grid
/// differs from the pipelined core's, so the partial sums do too (tested against the CPU within
/// the precision's bound).
fn window_launch(
    gm: &Gemm,
    w: ConvWindow,
    red_outputs: usize,
    target: &Target,
) -> Option<launch::GemmLaunch> {
    launch::TILES
        .into_iter()
        .filter(|t| t.tensor_warps().is_some() && t.bn >= gm.n)
        .filter_map(|t| {
            let forced = Target {
                tile: Some(t),
                ..*target
            };
            let l = launch::gemm_in(
                gm.precision,
                gm.m,
                gm.n,
                gm.k,
                gm.z,
                true,
                red_outputs,
                &forced,
            );
            let [gx, gy, gz] = l.grid(gm.m, gm.n, gm.z);
            let fills = gx * gy * gz >= target.multiprocessors as usize;
            (l.tile == t && fills && takes_window(gm, w, &l, red_outputs, target)).then_some(l)
        })
        .min_by_key(|l| {
            let cells = gm.m.next_multiple_of(l.tile.bm) * gm.n.next_multiple_of(l.tile.bn);
            (cells, l.split.parts)
        })
}

/// Chooses the launch of `gm` for `target` (`red`: the epilogue's per-channel reductions),
/// writes the GEMM constants into `g` and the workspace fields into `p`;
/// returns the launch dimensions and the workspace bytes.
fn tiled(
    g: &mut String,
    p: &mut ParamStruct,
    what: &str,
    gm: &Gemm,
    red: &ReductionSlots,
    target: &Target,
) -> Result<(LaunchDims, usize), RenderError> {
    // The warps' sums take a slot a sum or mean and two a variance (whose shifts share them).
    let red_outputs = red.total();
    for (name, v) in [("m", gm.m), ("n", gm.n), ("k", gm.k)] {
        if v > i32::MAX as usize {
            return Err(RenderError::TooLarge {
                what: format!("GEMM extent {name} of {what}"),
                value: v,
            });
        }
    }
    let phases = gm.phases.map_or(1, |ph| ph.count());
    let chosen = launch::gemm_in(
        gm.precision,
        gm.m,
        gm.n,
        gm.k,
        gm.z * phases,
        // Every GEMM may split K, epilogue reductions or not (the combining block of a
        // tile's splits is the row tile's member of the column combine).
        true,
        red_outputs,
        target,
    );
    let l = match gm.window {
        Some(w) if !takes_window(gm, w, &chosen, red_outputs, target) => {
            window_launch(gm, w, red_outputs, target).unwrap_or(chosen)
        }
        _ => chosen,
    };
    let t = l.tile;
    let [tiles_per_phase, gy, gz] = l.grid(gm.m, gm.n, gm.z);
    let gx = tiles_per_phase * phases;
    if let Some(ph) = gm.phases {
        ph.write(g, tiles_per_phase)?;
    }
    let grid = [
        grid_dim(what, gx, i32::MAX as usize)?,
        grid_dim(what, gy, 65_535)?,
        grid_dim(what, gz, 65_535)?,
    ];
    for (name, v) in [
        ("TP_BM", t.bm),
        ("TP_BN", t.bn),
        ("TP_TM", t.tm),
        ("TP_TN", t.tn),
    ] {
        g.push_str(&constant(name, "int", v));
    }
    // Whole column tiles: the output loop tests no column (kernels/gemm_core.cuh).
    g.push_str(&define(
        "TP_N_WHOLE",
        usize::from(gm.n.is_multiple_of(t.bn)),
    ));
    g.push_str(&constant("TP_VEC_A", "int", if gm.vec_a { 4 } else { 1 }));
    g.push_str(&constant("TP_VEC_B", "int", if gm.vec_b { 4 } else { 1 }));
    let tensor = on_tensor_cores(gm, &t, target);
    let blocks = if tensor {
        t.tensor_min_blocks()
    } else {
        t.min_blocks()
    };
    g.push_str(&define("TP_MIN_BLOCKS", min_blocks(blocks, gm.prologue)));
    g.push_str(&define("TP_SPLIT_K", l.split.parts));
    g.push_str(&constant("TP_K_CHUNK", "int", l.split.chunk.max(1)));
    g.push_str(&define("TP_GROUP", l.group));
    g.push_str(&define("TP_EPI_RED", red_outputs));
    g.push_str(&define("TP_EPI_PLAIN", red.plain));
    g.push_str(&define("TP_EPI_VAR", red.variances));
    // The tensor-core variant of the core (FP32 programs' generated parts stay as they were).
    if let (true, Some((wm, wn))) = (tensor, t.tensor_warps()) {
        g.push_str(&define("TP_TF32", 1));
        g.push_str(&define("TP_WARPS_M", wm));
        g.push_str(&define("TP_WARPS_N", wn));
    }
    // A convolution's window, where the launch takes it.
    if gm
        .window
        .is_some_and(|w| takes_window(gm, w, &l, red_outputs, target))
    {
        g.push_str(&define("TP_WINDOW", 1));
    }
    // Operand rounding, on every tile (SIMT or tensor-core, split or not).
    if let Some(format) = gm.round {
        g.push_str(&define("TP_ROUND", round_code(format)));
    }
    // The combines' slots, members, group and partial length, when partials cross blocks: the
    // split's partial tiles, then the epilogue reductions' per-row-tile sums.
    let mut workspace = split_workspace(p, gx * gy * gm.z, l.split.parts, l.group, t.bm * t.bn);
    if red_outputs > 0 {
        let group = launch::combine_group(gx);
        g.push_str(&define("TP_RED_GROUP", group));
        if red.plain > 0 {
            let (bytes, counters) =
                launch::combine_workspace(gy * gm.z, gx, group, red.plain * t.bn);
            let at = workspace.next_multiple_of(256);
            workspace_fields(p, "red_ws", at, at + counters);
            workspace = at + bytes;
        }
        if red.variances > 0 {
            // One (n, K, S, Q) a variance and column (`kernels/split.cuh` tp_var_combine).
            let len = 4 * red.variances * t.bn;
            let (bytes, counters) = launch::combine_workspace(gy * gm.z, gx, group, len);
            let at = workspace.next_multiple_of(256);
            workspace_fields(p, "var_ws", at, at + counters);
            workspace = at + bytes;
        }
    }
    Ok((LaunchDims::blocks(grid), workspace))
}

/// The windows filter gradient `cg` (its GEMM `gm`) runs through on `target`, if any
/// ([`launch::filter_windows`]): tensor cores, windows allowed ([`Target::windows`]), dilation
/// 1, one group, 128-bit loads of dy (of x too where `gm.vec_a`, else one channel at a time).
fn filter_windows_of(
    cg: &ConvGeom,
    gm: &Gemm,
    target: &Target,
) -> Option<(launch::FilterGradient, launch::FilterWindows)> {
    let unit = cg.dilation == [1, 1] && cg.groups.max(1) == 1;
    if !(gm.precision.tensor_cores() && target.tensor_cores && target.windows && unit && gm.vec_b) {
        return None;
    }
    let f = launch::FilterGradient {
        batch: cg.n,
        out_h: cg.oh,
        out_w: cg.ow,
        kh: cg.kh,
        kw: cg.kw,
        stride: cg.stride,
        in_c: cg.c,
        out_c: cg.o,
        elem_bytes: if gm.round.is_some() { 2 } else { 4 },
    };
    launch::filter_windows(&f, target).map(|fw| (f, fw))
}

/// Writes the constants of filter gradient `f` through windows `fw`
/// (`kernels/conv2d_backprop_filter.cu` `TP_FWIN`) into `g` and the split's workspace fields
/// into `p`; returns the launch dimensions and the workspace bytes.
fn filter_windowed(
    g: &mut String,
    p: &mut ParamStruct,
    what: &str,
    f: &launch::FilterGradient,
    fw: &launch::FilterWindows,
    gm: &Gemm,
) -> Result<(LaunchDims, usize), RenderError> {
    let taps = f.kh * f.kw;
    let grid = [
        grid_dim(what, f.in_c.div_ceil(16), i32::MAX as usize)?,
        grid_dim(what, f.out_c / 16, 65_535)?,
        grid_dim(what, fw.split, 65_535)?,
    ];
    g.push_str(&define("TP_FWIN", 1));
    int_const(g, "TP_FWIN_ROWS", fw.rows)?;
    int_const(g, "TP_FWIN_PER", fw.per_block)?;
    for (name, v) in [
        ("TP_BM", taps * 16),
        ("TP_BN", 16),
        ("TP_TM", taps),
        ("TP_TN", 1),
    ] {
        g.push_str(&constant(name, "int", v));
    }
    g.push_str(&define("TP_N_WHOLE", 1));
    // x copied 4 channels at a time, or one by one.
    g.push_str(&constant("TP_VEC_A", "int", if gm.vec_a { 4 } else { 1 }));
    g.push_str(&constant("TP_VEC_B", "int", 4));
    g.push_str(&define("TP_MIN_BLOCKS", min_blocks(4, gm.prologue)));
    g.push_str(&define("TP_SPLIT_K", fw.split));
    int_const(g, "TP_K_CHUNK", fw.per_block * fw.rows * f.out_w)?;
    g.push_str(&define("TP_GROUP", fw.group));
    g.push_str(&define("TP_EPI_RED", 0));
    g.push_str(&define("TP_TF32", 1));
    if let Some(format) = gm.round {
        g.push_str(&define("TP_ROUND", round_code(format)));
    }
    let workspace = split_workspace(p, f.tiles(), fw.split, fw.group, taps * 16 * 16);
    Ok((LaunchDims::blocks(grid), workspace))
}

/// The target convolution `k` (its GEMM `gm`) renders for: `target`, but without tensor cores
/// where `k` has a prologue and would otherwise take the f32 tensor-core tiles (TF32, or a
/// 16-bit program's GEMM whose operands were rounded before it), which copy x into shared
/// memory with `cp.async` and so cannot compute it on the way: the SIMT tiles multiply the
/// same f32 values exactly (`CudaOptions::lowering` lowers TF32 programs without prologues, so
/// this is the exception, not the rule).
fn prologue_target(k: &Kernel, gm: &Gemm, target: &Target) -> Target {
    let copies = gm.precision.tensor_cores() && gm.round.is_none();
    Target {
        tensor_cores: target.tensor_cores && !(copies && k.kind.prologue().is_some()),
        ..*target
    }
}

/// Convolution `k`'s prologue, if it has one ([`fused::prologue`]): its operand fields in `p`,
/// `TP_PROLOGUE` in `g`, and the returned hook for the caller to write after the parameter
/// struct's declaration (empty without a prologue).
fn conv_prologue(
    program: &Program,
    k: &Kernel,
    cg: &ConvGeom,
    p: &mut ParamStruct,
    g: &mut String,
) -> Result<String, RenderError> {
    if k.kind.prologue().is_none() {
        return Ok(String::new());
    }
    g.push_str(&define("TP_PROLOGUE", 1));
    Ok(fused::prologue(program, k, &[cg.n, cg.h, cg.w, cg.c], p)?.unwrap_or_default())
}

/// The workspace fields of a split of K (`parts` blocks per each of `slots` output tiles of `len`
/// floats, combined in groups of `group`: `kernels/split.cuh`) at the start of the launch's
/// workspace; returns its bytes (none without a split).
fn split_workspace(
    p: &mut ParamStruct,
    slots: usize,
    parts: usize,
    group: usize,
    len: usize,
) -> usize {
    if parts <= 1 {
        return 0;
    }
    let (bytes, counters) = launch::combine_workspace(slots, parts, group, len);
    workspace_fields(p, "ws", 0, counters);
    bytes
}

/// The partials (`name`, floats at `offset`) and arrival counters (`name_count` at `counters`)
/// of a combine in the launch's workspace.
fn workspace_fields(p: &mut ParamStruct, name: &str, offset: usize, counters: usize) {
    p.push(
        name,
        FieldKind::Workspace {
            offset,
            elem: "float",
        },
    )
    .push(
        format!("{name}_count"),
        FieldKind::Workspace {
            offset: counters,
            elem: "unsigned int",
        },
    );
}

/// `TP_ROUND` of `kernels/gemm_core.cuh` for operands rounded to `format`.
fn round_code(format: HalfFormat) -> usize {
    match format {
        HalfFormat::Bf16 => 1,
        HalfFormat::F16 => 2,
    }
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

/// A convolution's activation operand — `x` (forward and filter gradient) or `dy` (input and
/// filter gradients) — stored in f32 or, kept in bf16 (`lower::half_storage`), in bf16, which
/// the kernels widen as they load it or copy into their 16-bit stages (`kernels/gemm_core.cuh`
/// tp_bf16): the field `name`, and `tp_<name>_elem` naming its storage. bf16 only where the
/// kernel rounds its operands to bf16 anyway (its loads go through registers; TF32's f32
/// stages are filled by cp.async, which copies f32).
fn conv_operand(
    program: &Program,
    p: &mut ParamStruct,
    g: &mut String,
    name: &str,
    v: &View,
    cg: &ConvGeom,
) -> Result<(), RenderError> {
    let dtype = program.buffer(v.buffer).dtype;
    let takes = dtype == DType::F32
        || (dtype == DType::BF16 && cg.round_operands == Some(HalfFormat::Bf16));
    if !takes {
        return Err(RenderError::Unsupported(format!(
            "{name} is {dtype}; the CUDA convolutions take f32, or bf16 where they multiply in bf16"
        )));
    }
    let _ = writeln!(
        g,
        "typedef {} tp_{name}_elem;",
        super::params::storage_type(dtype)
    );
    input(program, p, name, v)
}

/// The convolution's geometry as compile-time constants of the generated part (one module per
/// shape: divisions by them become multiplications).
fn conv_consts(g: &mut String, cg: &ConvGeom) -> Result<(), RenderError> {
    let consts = [
        ("TP_BATCH", cg.n),
        ("TP_IN_H", cg.h),
        ("TP_IN_W", cg.w),
        ("TP_IN_C", cg.c),
        ("TP_OUT_H", cg.oh),
        ("TP_OUT_W", cg.ow),
        ("TP_OUT_C", cg.o),
        ("TP_K_H", cg.kh),
        ("TP_K_W", cg.kw),
        ("TP_STRIDE_H", cg.stride[0]),
        ("TP_STRIDE_W", cg.stride[1]),
        ("TP_DIL_H", cg.dilation[0]),
        ("TP_DIL_W", cg.dilation[1]),
        ("TP_PAD_TOP", cg.pad[0]),
        ("TP_PAD_LEFT", cg.pad[2]),
        ("TP_GROUPS", cg.groups.max(1)),
    ];
    // Products the kernels form in `int`: pixels, filter taps and the per-image extents.
    let extents = [
        cg.n * cg.oh * cg.ow,
        cg.n * cg.h * cg.w,
        cg.kh * cg.kw * cg.c.max(cg.o),
        cg.h * cg.w * cg.c,
        cg.oh * cg.ow * cg.o,
    ];
    for (name, v) in consts
        .iter()
        .copied()
        .chain(extents.map(|e| ("convolution extent", e)))
    {
        if v > i32::MAX as usize {
            return Err(RenderError::TooLarge {
                what: name.to_string(),
                value: v,
            });
        }
    }
    for (name, v) in consts {
        g.push_str(&constant(name, "int", v));
    }
    Ok(())
}

/// Writes pooling's geometry as the compile-time constants of `kernels/pool.cu` and
/// `pool_grad.cu` into `out`: their index arithmetic divides by the extents, which then
/// compiles to multiplications. An extent past `int` is a render error naming it.
fn pool_constants(out: &mut String, g: &PoolGeom) -> Result<(), RenderError> {
    for (name, v) in [
        ("TP_BATCH", g.n),
        ("TP_IN_H", g.h),
        ("TP_IN_W", g.w),
        ("TP_C", g.c),
        ("TP_OUT_H", g.oh),
        ("TP_OUT_W", g.ow),
        ("TP_WIN_H", g.window[0]),
        ("TP_WIN_W", g.window[1]),
        ("TP_STRIDE_H", g.stride[0]),
        ("TP_STRIDE_W", g.stride[1]),
        ("TP_PAD_TOP", g.pad[0]),
        ("TP_PAD_LEFT", g.pad[2]),
    ] {
        int_const(out, name, v)?;
    }
    Ok(())
}

/// Renders a fixed-function kernel; `None` when it has nothing to do. `index` is the kernel's
/// position in the program (its status code is `index + 1`).
pub fn render(
    program: &Program,
    k: &Kernel,
    index: usize,
    target: &Target,
) -> Result<Option<RenderedKernel>, RenderError> {
    let mut p = ParamStruct::default();
    let mut workspace_bytes = 0;
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
            let b_stride = if mg.rhs_batched { mg.k * mg.n } else { 0 };
            for (name, v) in [
                ("TP_M", mg.m),
                ("TP_N", mg.n),
                ("TP_K", mg.k),
                ("TP_A_BATCH_STRIDE", mg.m * mg.k),
                ("TP_B_BATCH_STRIDE", b_stride),
            ] {
                int_const(&mut g, name, v)?;
            }
            let gm = Gemm {
                precision: program.precision,
                round: mg.round_operands,
                m: mg.m,
                n: mg.n,
                k: mg.k,
                z: mg.batch,
                vec_a: (if mg.transpose_a { mg.m } else { mg.k }).is_multiple_of(4)
                    && aligned16(program, &k.inputs[0]),
                vec_b: (if mg.transpose_b { mg.k } else { mg.n }).is_multiple_of(4)
                    && aligned16(program, &k.inputs[1]),
                phases: None,
                window: None,
                prologue: k.kind.prologue().is_some(),
            };
            let red = epilogue_reductions(k);
            let (launch, ws) = tiled(&mut g, &mut p, &k.name, &gm, &red, target)?;
            workspace_bytes = ws;
            epilogue(program, k, &mut p, &mut g)?;
            (Body::MatMul, launch)
        }
        KernelKind::Conv2d(cg, ..) => {
            if out_len == 0 {
                return Ok(None);
            }
            conv_operand(program, &mut p, &mut g, "x", &k.inputs[0], cg)?;
            f32_input(program, &mut p, "filter", &k.inputs[1])?;
            conv_consts(&mut g, cg)?;
            let groups = cg.groups.max(1);
            let (cgr, og) = (cg.c / groups, cg.o / groups);
            let gm = Gemm {
                precision: program.precision,
                round: cg.round_operands,
                m: cg.n * cg.oh * cg.ow,
                n: og,
                k: cg.kh * cg.kw * cgr,
                z: groups,
                vec_a: cgr.is_multiple_of(4)
                    && cg.c.is_multiple_of(4)
                    && aligned16(program, &k.inputs[0]),
                vec_b: og.is_multiple_of(4)
                    && cg.o.is_multiple_of(4)
                    && aligned16(program, &k.inputs[1]),
                phases: None,
                window: ConvWindow::of(cg, false),
                prologue: k.kind.prologue().is_some(),
            };
            let red = epilogue_reductions(k);
            let target = &prologue_target(k, &gm, target);
            let (launch, ws) = tiled(&mut g, &mut p, &k.name, &gm, &red, target)?;
            workspace_bytes = ws;
            let hook = conv_prologue(program, k, cg, &mut p, &mut g)?;
            epilogue(program, k, &mut p, &mut g)?;
            g.push_str(&hook);
            (Body::Conv2d, launch)
        }
        KernelKind::Conv2dBackpropInput(cg, _) => {
            if out_len == 0 {
                return Ok(None);
            }
            conv_operand(program, &mut p, &mut g, "dy", &k.inputs[0], cg)?;
            f32_input(program, &mut p, "filter", &k.inputs[1])?;
            conv_consts(&mut g, cg)?;
            let groups = cg.groups.max(1);
            let (cgr, og) = (cg.c / groups, cg.o / groups);
            let vec = og.is_multiple_of(4) && cg.o.is_multiple_of(4);
            let phases = DgradPhases::of(cg);
            let gm = Gemm {
                precision: program.precision,
                round: cg.round_operands,
                m: cg.n * phases.rows[0] * phases.rows[1],
                n: cgr,
                k: phases.taps[0] * phases.taps[1] * og,
                z: groups,
                vec_a: vec && aligned16(program, &k.inputs[0]),
                vec_b: vec && aligned16(program, &k.inputs[1]),
                phases: Some(phases),
                window: ConvWindow::of(cg, true),
                prologue: false,
            };
            let red = epilogue_reductions(k);
            let (launch, ws) = tiled(&mut g, &mut p, &k.name, &gm, &red, target)?;
            workspace_bytes = ws;
            epilogue(program, k, &mut p, &mut g)?;
            (Body::Conv2dBackpropInput, launch)
        }
        KernelKind::Conv2dBackpropFilter(cg, ..) => {
            if out_len == 0 {
                return Ok(None);
            }
            conv_operand(program, &mut p, &mut g, "x", &k.inputs[0], cg)?;
            conv_operand(program, &mut p, &mut g, "dy", &k.inputs[1], cg)?;
            conv_consts(&mut g, cg)?;
            let groups = cg.groups.max(1);
            let (cgr, og) = (cg.c / groups, cg.o / groups);
            let gm = Gemm {
                precision: program.precision,
                round: cg.round_operands,
                m: cg.kh * cg.kw * cgr,
                n: og,
                k: cg.n * cg.oh * cg.ow,
                z: groups,
                vec_a: cgr.is_multiple_of(4)
                    && cg.c.is_multiple_of(4)
                    && aligned16(program, &k.inputs[0]),
                vec_b: og.is_multiple_of(4)
                    && cg.o.is_multiple_of(4)
                    && aligned16(program, &k.inputs[1]),
                phases: None,
                window: None,
                prologue: k.kind.prologue().is_some(),
            };
            let target = &prologue_target(k, &gm, target);
            let (launch, ws) = match filter_windows_of(cg, &gm, target) {
                Some((f, fw)) => filter_windowed(&mut g, &mut p, &k.name, &f, &fw, &gm)?,
                None => tiled(
                    &mut g,
                    &mut p,
                    &k.name,
                    &gm,
                    &ReductionSlots::of(&[]),
                    target,
                )?,
            };
            workspace_bytes = ws;
            let hook = conv_prologue(program, k, cg, &mut p, &mut g)?;
            epilogue(program, k, &mut p, &mut g)?;
            g.push_str(&hook);
            (Body::Conv2dBackpropFilter, launch)
        }
        KernelKind::Pool(pg) => {
            g.push_str(&constant("TP_MAX_POOL", "bool", pg.kind == PoolKind::Max));
            f32_input(program, &mut p, "x", &k.inputs[0])?;
            p.buffer("y", out0, 0, program.buffer(out0).dtype, true);
            pool_constants(&mut g, pg)?;
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
            pool_constants(&mut g, pg)?;
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
        workspace_bytes,
    }))
}

/// An `int` constant of the generated part; a value beyond `i32` is an error naming it.
fn int_const(g: &mut String, name: &str, value: usize) -> Result<(), RenderError> {
    if value > i32::MAX as usize {
        return Err(RenderError::TooLarge {
            what: name.to_string(),
            value,
        });
    }
    g.push_str(&constant(name, "int", value));
    Ok(())
}

/// Per-channel reductions in the kernel's epilogue.
fn epilogue_reductions(k: &Kernel) -> ReductionSlots {
    ReductionSlots::of(k.kind.epilogue().map_or(&[][..], |e| &e.reductions[..]))
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
