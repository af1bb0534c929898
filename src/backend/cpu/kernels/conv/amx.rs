//! bf16 convolutions on AMX tiles (Intel Advanced Matrix Extensions: AMX-TILE + AMX-BF16,
//! Sapphire Rapids and later), for kernels whose operands the bf16 precision rounds
//! (`ConvGeom::round_operands`): the operands are rounded to bf16 as they are packed —
//! [`HalfFormat::Bf16`]'s rounding, so the values multiplied are the ones the reference executor
//! multiplies — and `tdpbf16ps` multiplies them with f32 accumulation. One tile instruction does
//! 16 × 16 × 32 multiply-adds: measured on this project's Sapphire Rapids machine, 490 G/s on one
//! core against 88 G/s for AVX-512 FMAs and 44 G/s for AVX512-BF16's `vdpbf16ps` (which is why
//! the vector bf16 dot product is not used).
//!
//! **Algorithm.** An implicit GEMM per image: the image is padded and rounded to bf16 once, then
//! panels of 64 output pixels gather their windows (`KH·KW·C` values, in the filter's row order,
//! zero past the end up to a multiple of 32) and multiply the packed filter ([`PackedB`]: the
//! VNNI pair layout `tdpbf16ps` reads, zero past the filter's rows and columns) into four
//! accumulator tiles, stored straight into the output rows (or, for partial panels and widths
//! that are not a multiple of 16, through a small buffer); the image's epilogue then runs while
//! its rows are hot. The input gradient of a stride-1 convolution is the
//! forward convolution of `dy` with the flipped filter (`backward_input::transposed_geometry`).
//!
//! **Numerics.** Products of bf16 values are exact in f32, so only the accumulation rounds; the
//! tile unit's summation order within a 32-deep step is its own (not bitwise the f32 kernels'
//! sequential order), so results agree with the vector path on the same rounded operands within
//! the f32 accumulation bound (tested: `tests/backend/cpu_conv_amx.rs`). The instruction treats bf16
//! subnormals (magnitudes below 2⁻¹²⁶) as zero and flushes subnormal results.
//!
//! **Use.** [`available`] probes the CPU (CPUID leaf 7: AMX-BF16, AMX-TILE) and asks Linux for
//! the tile-data state once per process (`arch_prctl(ARCH_REQ_XCOMP_PERM)`); the environment
//! variable `TOWERPACK_AMX=0` turns the tiles off for the process, and `CpuOptions::amx` for one
//! session. Tiles are configured (`ldtilecfg`) per task on the thread that runs it and released
//! after. Tile instructions have no stable Rust intrinsics, so they are written as inline
//! assembly: `ldtilecfg`, `tilezero`, `tileloadd`, `tdpbf16ps`, `tilestored`, `tilerelease`.

use std::arch::asm;
use std::cell::RefCell;
use std::sync::OnceLock;

use super::backward_input::{flip_filter, transposed_geometry};
use super::direct::{padded_hw, pixel_origins, segments};
use super::tiles::Segment;
use super::{Conv2dGeometry, ConvPass, check_operands};
use crate::backend::cpu::kernels::epilogue::Epilogue;
use crate::backend::cpu::kernels::parallel::{
    for_each_row_block, split_range, threads, worth_parallel,
};
use crate::backend::cpu::kernels::simd::{SimdLevel, carry, vectorized};
use crate::backend::cpu::kernels::{KernelError, shape_error};
use crate::lower::HalfFormat;
use rayon::prelude::*;

/// The environment variable that turns AMX off for the process (`0`, `off` or `false`).
pub const AMX_ENV: &str = "TOWERPACK_AMX";

/// Rows of a tile, and pixels per half panel.
const TILE_ROWS: usize = 16;
/// bf16 values in a tile row (64 bytes): the reduction depth of one `tdpbf16ps`.
const K_STEP: usize = 32;
/// f32 columns of an accumulator tile (64 bytes).
const N_BLOCK: usize = 16;
/// Output pixels per panel: four A tiles.
const PANEL_ROWS: usize = 4 * TILE_ROWS;

/// Loads tile `$t` from `$ptr`, rows `$stride` bytes apart.
macro_rules! tile_load {
    ($t:literal, $ptr:expr, $stride:expr) => {
        asm!(
            concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"),
            p = in(reg) $ptr,
            s = in(reg) $stride,
            options(nostack, readonly, preserves_flags)
        )
    };
}

/// Stores tile `$t` to `$ptr`, rows `$stride` bytes apart.
macro_rules! tile_store {
    ($t:literal, $ptr:expr, $stride:expr) => {
        asm!(
            concat!("tilestored [{p} + {s}*1], tmm", $t),
            p = in(reg) $ptr,
            s = in(reg) $stride,
            options(nostack, preserves_flags)
        )
    };
}

/// `tmm$c += tmm$a · tmm$b` (bf16 pairs, f32 accumulation).
macro_rules! tile_dot {
    ($c:literal, $a:literal, $b:literal) => {
        asm!(
            concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack, nomem, preserves_flags)
        )
    };
}

/// Zeroes tile `$t`.
macro_rules! tile_zero {
    ($t:literal) => {
        asm!(
            concat!("tilezero tmm", $t),
            options(nostack, nomem, preserves_flags)
        )
    };
}

/// Whether the process may use AMX-BF16 tiles: the CPU has them, Linux granted the tile-data
/// state, and `TOWERPACK_AMX` does not turn them off. Probed once.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| !disabled_by_env() && probe())
}

fn disabled_by_env() -> bool {
    std::env::var(AMX_ENV).is_ok_and(|v| {
        let v = v.trim();
        v == "0" || v.eq_ignore_ascii_case("off") || v.eq_ignore_ascii_case("false")
    })
}

#[cfg(target_os = "linux")]
fn probe() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // Leaf 7 is in range when leaf 0 says so.
    if __cpuid_count(0, 0).eax < 7 {
        return false;
    }
    let leaf7 = __cpuid_count(7, 0);
    let (amx_bf16, amx_tile) = (leaf7.edx & (1 << 22) != 0, leaf7.edx & (1 << 24) != 0);
    if !(amx_bf16 && amx_tile && std::arch::is_x86_feature_detected!("avx512f")) {
        return false;
    }
    // Linux hands the 8 KiB tile-data state to processes that ask for it (kernel 5.16+).
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with integer arguments.
    let granted = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    granted == 0
}

#[cfg(not(target_os = "linux"))]
fn probe() -> bool {
    false
}

/// Why the tile kernels cannot run `g` at the SIMD level in force (`None`: they can). The
/// input gradient needs stride 1 and padding within the window's reach.
pub fn unsupported(g: &Conv2dGeometry, pass: ConvPass) -> Option<&'static str> {
    if !available() {
        return Some("this CPU or OS has no AMX-BF16 tiles (or TOWERPACK_AMX=0)");
    }
    if SimdLevel::current() < SimdLevel::Avx512 {
        return Some("AMX runs at the avx512 SIMD level only");
    }
    if g.groups != 1 {
        return Some("grouped convolution");
    }
    if pass == ConvPass::InputGradient && transposed_geometry(g, g.out_hw()).is_none() {
        return Some("the input gradient of a strided convolution, or padding past the window");
    }
    None
}

/// Whether the tile kernels are faster than the vector kernels for `pass` of `g`: when each
/// window holds at least 64 products (`KH·KW·C`, or `KH·KW·O` for the input gradient). Below
/// that the gathers cost more than the tiles save. Measured on ResNet-20's layers at batch
/// 128 (`cargo bench --bench cpu_kernels -- conv-algos`, one thread, a noisy machine): the
/// 3-channel stem (27 products) ran 2× slower on tiles and the 1×1 projections (16 and 32)
/// 0.7–1.2×; the 3×3 layers 1.3–1.8× faster at 16 channels (32×32 pixels), 1.3–2.8× at 32,
/// 2–3.8× at 64, in every pass.
pub fn pays_off(g: &Conv2dGeometry, pass: ConvPass) -> bool {
    let [kh, kw] = g.kernel_hw;
    let channels = match pass {
        ConvPass::Forward | ConvPass::FilterGradient => g.in_channels,
        ConvPass::InputGradient => g.out_channels,
    };
    kh * kw * channels >= 64
}

fn check_supported(
    kernel: &'static str,
    g: &Conv2dGeometry,
    pass: ConvPass,
) -> Result<(), KernelError> {
    match unsupported(g, pass) {
        None => Ok(()),
        Some(why) => Err(shape_error(
            kernel,
            format!(
                "the bf16 tile kernels cannot run {g:?}: {why} (at the {} SIMD level)",
                SimdLevel::current()
            ),
        )),
    }
}

/// `y = epilogue(conv2d(bf16(x), bf16(w)))` on AMX tiles, f32 accumulation (layouts as
/// [`super::conv2d_forward`]). An error where [`unsupported`] says why not.
pub fn forward(
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_forward_bf16", g, x.len(), w.len(), y.len())?;
    check_supported("conv2d_forward_bf16", g, ConvPass::Forward)?;
    let k_len = g.kernel_hw[0] * g.kernel_hw[1] * g.in_channels;
    let o = g.out_channels;
    let filter = PackedB::new(k_len, o, |k, n| w[k * o + n]);
    convolve(g, out_hw, x, &filter, y, epilogue)
}

/// `dx = epilogue(∂conv2d/∂x · bf16(dy))` with the bf16 filter on AMX tiles (layouts as
/// [`super::conv2d_backward_input`]); stride 1 only. An error where [`unsupported`] says why
/// not.
pub fn backward_input(
    g: &Conv2dGeometry,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_backward_input_bf16", g, dx.len(), w.len(), dy.len())?;
    check_supported("conv2d_backward_input_bf16", g, ConvPass::InputGradient)?;
    let Some(t) = transposed_geometry(g, out_hw) else {
        unreachable!("check_supported checked the transposed geometry")
    };
    let flipped = flip_filter(g, w);
    let k_len = t.kernel_hw[0] * t.kernel_hw[1] * t.in_channels;
    let c = t.out_channels;
    let filter = PackedB::new(k_len, c, |k, n| flipped[k * c + n]);
    let t_out = t.validate()?;
    convolve(&t, t_out, dy, &filter, dx, epilogue)
}

/// `dw = ∂conv2d/∂w · dy` with `x` and `dy` rounded to bf16, on AMX tiles (layouts as
/// [`super::conv2d_backward_filter`]). Per image, `dwᵀ += bf16(dy)ᵀ · patches`: the output
/// gradient transposed (channels × pixels) times the patch rows, laid out in pixel pairs as
/// `tdpbf16ps` reads its right operand, accumulated in f32 over the images of each thread's
/// range; the ranges' sums are added in range order (deterministic for a thread count). An
/// error where [`unsupported`] says why not.
pub fn backward_filter(
    g: &Conv2dGeometry,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
) -> Result<(), KernelError> {
    let out_hw = check_operands(
        "conv2d_backward_filter_bf16",
        g,
        x.len(),
        dw.len(),
        dy.len(),
    )?;
    check_supported("conv2d_backward_filter_bf16", g, ConvPass::FilterGradient)?;
    let (c, o) = (g.in_channels, g.out_channels);
    let k_len = g.kernel_hw[0] * g.kernel_hw[1] * c;
    let pixels = out_hw[0] * out_hw[1];
    if k_len == 0 || o == 0 || pixels == 0 || g.batch == 0 {
        dw.fill(0.0);
        return Ok(());
    }
    let shape = FilterShape {
        k_len,
        k_padded: k_len.next_multiple_of(N_BLOCK),
        o,
        o_padded: o.next_multiple_of(TILE_ROWS),
        pixels,
        p_padded: pixels.next_multiple_of(K_STEP),
    };
    let parts = if worth_parallel(2 * g.macs()) {
        threads()
    } else {
        1
    };
    let ranges = split_range(g.batch, parts);
    let segs = segments(g);
    let origins = pixel_origins(g, out_hw);
    let image_len = g.in_hw[0] * g.in_hw[1] * c;
    let dy_len = pixels * o;
    let run = |images: std::ops::Range<usize>| -> Vec<f32> {
        let mut acc = vec![0.0; shape.o_padded * shape.k_padded];
        BUFFERS.with_borrow_mut(|b| {
            if b.filter_for != Some(shape) {
                b.pairs.clear();
                b.pairs.resize(shape.p_padded * shape.k_padded, 0);
                b.dy_t.clear();
                b.dy_t.resize(shape.o_padded * shape.p_padded, 0);
                b.two_rows.clear();
                b.two_rows.resize(2 * shape.k_padded, 0);
                b.filter_for = Some(shape);
            }
            // SAFETY: `backward_filter` runs only where `unsupported` found AMX available.
            let tiles = unsafe { Tiles::configure() };
            for n in images {
                let image = &x[n * image_len..(n + 1) * image_len];
                pad_image_bf16(g, image, &mut b.padded, &mut b.padded_for);
                pair_patches(
                    &segs,
                    &origins,
                    &b.padded,
                    shape,
                    &mut b.two_rows,
                    &mut b.pairs,
                );
                transpose_to_bf16(&dy[n * dy_len..(n + 1) * dy_len], shape, &mut b.dy_t);
                accumulate_filter(&tiles, &b.dy_t, &b.pairs, shape, &mut acc);
            }
        });
        acc
    };
    let partials: Vec<Vec<f32>> = if ranges.len() <= 1 {
        vec![run(0..g.batch)]
    } else {
        ranges.into_par_iter().map(carry(run)).collect()
    };
    for (k, dw_row) in dw.chunks_exact_mut(o).enumerate() {
        for (oc, d) in dw_row.iter_mut().enumerate() {
            let at = oc * shape.k_padded + k;
            *d = partials[1..]
                .iter()
                .fold(partials[0][at], |sum, p| sum + p[at]);
        }
    }
    Ok(())
}

/// The padded extents of a filter gradient's tile operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FilterShape {
    /// Patch length `KH·KW·C`, and rounded up to whole 16-column accumulator blocks.
    k_len: usize,
    k_padded: usize,
    /// Output channels, and rounded up to whole 16-row tiles.
    o: usize,
    o_padded: usize,
    /// Output pixels of an image, and rounded up to whole 32-deep steps.
    pixels: usize,
    p_padded: usize,
}

/// The patch rows of one image in pixel pairs: row `q` of `pairs` holds
/// `(patch[2q][k], patch[2q + 1][k])` for every `k` (`2·k_padded` values); rows past the last
/// pixel stay zero.
fn pair_patches(
    segs: &[Segment],
    origins: &[usize],
    padded: &[u16],
    shape: FilterShape,
    two_rows: &mut [u16],
    pairs: &mut [u16],
) {
    let kp = shape.k_padded;
    let reach = segs.iter().map(|s| s.a_off + s.len).max().unwrap_or(0);
    assert!(
        origins.iter().all(|&origin| origin + reach <= padded.len())
            && segs.iter().all(|s| s.k0 + s.len <= kp)
            && origins.len() == shape.pixels
            && two_rows.len() >= 2 * kp
            && pairs.len() >= shape.p_padded * kp,
        "tile filter gradient out of bounds"
    );
    for (q, pair) in origins.chunks(2).enumerate() {
        if pair.len() == 1 {
            two_rows[kp..kp + shape.k_len].fill(0);
        }
        // SAFETY: the window runs lie in `padded`, the rows in `two_rows` (asserted above); the
        // CPU runs AVX-512 (`unsupported` checked the level).
        unsafe { gather_windows(segs, pair, padded.as_ptr(), two_rows.as_mut_ptr(), kp) };
        // SAFETY: both rows hold `kp` values and pair row `q` holds `2·kp` (asserted above).
        unsafe { interleave(two_rows.as_ptr(), pairs.as_mut_ptr().add(q * 2 * kp), kp) };
    }
}

/// `out[2k + j] = rows[j·len + k]` for `k < len` (a multiple of 16), `j < 2`.
///
/// # Safety
/// AVX-512F/BW are available; `rows` holds `2·len` values, `out` room for `2·len`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn interleave(rows: *const u16, out: *mut u16, len: usize) {
    use std::arch::x86_64::*;
    // Lane 2i takes element i of the first row (lanes 0–15), lane 2i + 1 element i of the second
    // (lanes 16–31).
    let index = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    for k in (0..len).step_by(16) {
        // SAFETY: `k + 16 <= len` for both rows and `2k + 32 <= 2·len` for `out`.
        unsafe {
            let first = _mm256_loadu_si256(rows.add(k).cast());
            let second = _mm256_loadu_si256(rows.add(len + k).cast());
            let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(first), second);
            _mm512_storeu_si512(out.add(2 * k).cast(), _mm512_permutexvar_epi16(index, both));
        }
    }
}

/// `dy_t[oc][p] = bf16(dy[p][oc])` for the image's pixels and channels; the padding stays zero.
fn transpose_to_bf16(dy: &[f32], shape: FilterShape, dy_t: &mut [u16]) {
    let (o, pp, pixels) = (shape.o, shape.p_padded, shape.pixels);
    assert!(
        dy.len() == pixels * o && dy_t.len() >= shape.o_padded * pp && pixels <= pp,
        "tile filter gradient out of bounds"
    );
    let whole = pixels / 16 * 16;
    if o * 15 < (1 << 31) / 4 {
        // SAFETY: AVX-512 runs (`unsupported` checked the level); every gathered index
        // `(p0 + i)·o + oc` with `p0 + i < whole` lies in `dy` and every store in `dy_t`
        // (asserted above); the byte offsets `i·o·4` fit in i32 (checked just above).
        unsafe { transpose_blocks(dy.as_ptr(), o, whole, pp, dy_t.as_mut_ptr()) };
    } else {
        for p in 0..whole {
            for oc in 0..o {
                dy_t[oc * pp + p] = bf16_bits(dy[p * o + oc]);
            }
        }
    }
    for p in whole..pixels {
        for oc in 0..o {
            dy_t[oc * pp + p] = bf16_bits(dy[p * o + oc]);
        }
    }
}

/// [`transpose_to_bf16`] for pixels `0..whole` (a multiple of 16): per channel, 16 pixels
/// gathered, rounded to bf16 (the bit arithmetic of [`HalfFormat::Bf16`]) and stored at once.
///
/// # Safety
/// AVX-512F/BW are available; `dy` holds `whole·o` values, `dy_t` rows of `pp >= whole` for
/// `o` channels; `15·o·4` fits in i32.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn transpose_blocks(dy: *const f32, o: usize, whole: usize, pp: usize, dy_t: *mut u16) {
    use std::arch::x86_64::*;
    let stride = o as i32;
    let index = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(stride),
    );
    let (one, bias, abs, inf, quiet) = (
        _mm512_set1_epi32(1),
        _mm512_set1_epi32(0x7fff),
        _mm512_set1_epi32(0x7fff_ffff),
        _mm512_set1_epi32(0x7f80_0000),
        _mm512_set1_epi32(0x0040_0000),
    );
    for oc in 0..o {
        for p0 in (0..whole).step_by(16) {
            // SAFETY: in bounds by the function's contract.
            unsafe {
                let bits = _mm512_i32gather_epi32::<4>(index, dy.add(p0 * o + oc).cast());
                // Round to nearest even: add 0x7fff plus the lowest kept bit, keep the high half.
                let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), one);
                let rounded = _mm512_add_epi32(bits, _mm512_add_epi32(bias, lsb));
                // NaN stays NaN (quieted), as `HalfFormat::round` keeps it.
                let nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, abs), inf);
                let value = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(bits, quiet));
                let high = _mm512_srli_epi32::<16>(value);
                _mm256_storeu_si256(dy_t.add(oc * pp + p0).cast(), _mm512_cvtepi32_epi16(high));
            }
        }
    }
}

/// `acc[oc][k] += Σ_p dy_t[oc][p] · patch[p][k]` over one image's (padded) pixels, in groups
/// of accumulator tiles: 2 × 2 where two channel tiles remain, else 1 × up to 4.
fn accumulate_filter(
    tiles: &Tiles,
    dy_t: &[u16],
    pairs: &[u16],
    shape: FilterShape,
    acc: &mut [f32],
) {
    let (kp, pp) = (shape.k_padded, shape.p_padded);
    assert!(
        dy_t.len() >= shape.o_padded * pp
            && pairs.len() >= pp * kp
            && acc.len() >= shape.o_padded * kp,
        "tile filter gradient out of bounds"
    );
    let (o_tiles, k_blocks) = (shape.o_padded / TILE_ROWS, kp / N_BLOCK);
    let mut ot = 0;
    while ot < o_tiles {
        let rows = if ot + 1 < o_tiles { 2 } else { 1 };
        let width = if rows == 2 { 2 } else { 4 };
        let mut kb = 0;
        while kb < k_blocks {
            let cols = width.min(k_blocks - kb);
            let group = FilterGroup { ot, kb, rows, cols };
            // SAFETY: the group's tiles lie inside the three buffers (asserted above: `ot +
            // rows <= o_tiles`, `kb + cols <= k_blocks`, `pp` a multiple of 32).
            unsafe { filter_group(tiles, dy_t, pairs, shape, acc, group) };
            kb += cols;
        }
        ot += rows;
    }
}

/// Accumulator tiles `rows × cols` starting at channel tile `ot`, column block `kb`.
#[derive(Clone, Copy)]
struct FilterGroup {
    ot: usize,
    kb: usize,
    rows: usize,
    cols: usize,
}

/// One group of [`accumulate_filter`]: loads its accumulators from `acc`, adds every pixel
/// step, stores them back. Tiles: accumulators 0–3 (row-major over the group), left operands
/// 4–5 (channel tiles), right operands 6–7.
///
/// # Safety
/// As [`accumulate_filter`] asserts; `rows · cols <= 4`, `rows == 2` only with `cols <= 2`.
unsafe fn filter_group(
    _tiles: &Tiles,
    dy_t: &[u16],
    pairs: &[u16],
    shape: FilterShape,
    acc: &mut [f32],
    group: FilterGroup,
) {
    let (kp, pp) = (shape.k_padded, shape.p_padded);
    let (a_stride, b_stride, c_stride) = (2 * pp, 4 * kp, 4 * kp);
    let FilterGroup { ot, kb, rows, cols } = group;
    // SAFETY (whole block): every tile lies in its buffer (the caller's contract).
    unsafe {
        let acc = acc.as_mut_ptr();
        let c = |r: usize, j: usize| acc.add((ot + r) * TILE_ROWS * kp + (kb + j) * N_BLOCK);
        let a =
            |r: usize, step: usize| dy_t.as_ptr().add((ot + r) * TILE_ROWS * pp + step * K_STEP);
        let b = |step: usize, j: usize| {
            pairs
                .as_ptr()
                .add(step * TILE_ROWS * 2 * kp + (kb + j) * 2 * N_BLOCK)
        };
        let steps = pp / K_STEP;
        if rows == 2 {
            tile_load!(0, c(0, 0), c_stride);
            tile_load!(2, c(1, 0), c_stride);
            if cols == 2 {
                tile_load!(1, c(0, 1), c_stride);
                tile_load!(3, c(1, 1), c_stride);
            }
            for step in 0..steps {
                tile_load!(4, a(0, step), a_stride);
                tile_load!(5, a(1, step), a_stride);
                tile_load!(6, b(step, 0), b_stride);
                tile_dot!(0, 4, 6);
                tile_dot!(2, 5, 6);
                if cols == 2 {
                    tile_load!(7, b(step, 1), b_stride);
                    tile_dot!(1, 4, 7);
                    tile_dot!(3, 5, 7);
                }
            }
            tile_store!(0, c(0, 0), c_stride);
            tile_store!(2, c(1, 0), c_stride);
            if cols == 2 {
                tile_store!(1, c(0, 1), c_stride);
                tile_store!(3, c(1, 1), c_stride);
            }
        } else {
            tile_load!(0, c(0, 0), c_stride);
            if cols > 1 {
                tile_load!(1, c(0, 1), c_stride);
            }
            if cols > 2 {
                tile_load!(2, c(0, 2), c_stride);
            }
            if cols > 3 {
                tile_load!(3, c(0, 3), c_stride);
            }
            for step in 0..steps {
                tile_load!(4, a(0, step), a_stride);
                tile_load!(6, b(step, 0), b_stride);
                tile_dot!(0, 4, 6);
                if cols > 1 {
                    tile_load!(7, b(step, 1), b_stride);
                    tile_dot!(1, 4, 7);
                }
                if cols > 2 {
                    tile_load!(6, b(step, 2), b_stride);
                    tile_dot!(2, 4, 6);
                }
                if cols > 3 {
                    tile_load!(7, b(step, 3), b_stride);
                    tile_dot!(3, 4, 7);
                }
            }
            tile_store!(0, c(0, 0), c_stride);
            if cols > 1 {
                tile_store!(1, c(0, 1), c_stride);
            }
            if cols > 2 {
                tile_store!(2, c(0, 2), c_stride);
            }
            if cols > 3 {
                tile_store!(3, c(0, 3), c_stride);
            }
        }
    }
}

/// The forward convolution `g` of `x` by the packed filter, one image per task.
fn convolve(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    x: &[f32],
    filter: &PackedB,
    y: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let (c, o) = (g.in_channels, g.out_channels);
    let out_rows = out_hw[0] * out_hw[1];
    epilogue.check(g.batch * out_rows, o)?;
    if out_rows == 0 || o == 0 {
        return Ok(());
    }
    let image_len = g.in_hw[0] * g.in_hw[1] * c;
    let segs = segments(g);
    let origins = pixel_origins(g, out_hw);
    let parallel = worth_parallel(2 * g.macs()) && g.batch > 1;
    for_each_row_block(y, o, out_rows, parallel, |y_image, first_row, _| {
        let n = first_row / out_rows;
        BUFFERS.with_borrow_mut(|b| {
            let Buffers {
                padded,
                padded_for,
                panel,
                panel_for,
                products,
                ..
            } = b;
            let image = &x[n * image_len..(n + 1) * image_len];
            pad_image_bf16(g, image, padded, padded_for);
            // SAFETY: `convolve` runs only where `unsupported` found AMX available.
            let tiles = unsafe { Tiles::configure() };
            let buffers = (panel, panel_for, products);
            image_gemm(&tiles, &segs, &origins, padded, filter, buffers, y_image, o);
        });
        if !epilogue.is_identity() {
            epilogue.apply(y_image, first_row, o);
        }
        Ok(())
    })
}

/// Per-thread buffers of the tile kernels. Their zeros (the image's padding, the panel's tail
/// columns) are written when the geometry changes and kept from image to image, since every
/// image overwrites only the rest.
#[derive(Default)]
struct Buffers {
    /// The zero-padded image in bf16.
    padded: Vec<u16>,
    /// The geometry `padded`'s zeros were laid out for.
    padded_for: Option<Conv2dGeometry>,
    /// A panel of gathered windows: `PANEL_ROWS × k_padded` bf16, zero past each row's
    /// `k_len` values.
    panel: Vec<u16>,
    /// `(k_len, k_padded)` of `panel`'s zeros.
    panel_for: (usize, usize),
    /// The panel's products: `PANEL_ROWS × n_padded` f32.
    products: Vec<f32>,
    /// The filter gradient's operands: patch rows in pixel pairs, the transposed output
    /// gradient, two gathered patch rows; zero where [`FilterShape`] pads them.
    pairs: Vec<u16>,
    dy_t: Vec<u16>,
    two_rows: Vec<u16>,
    /// The shape their zeros were laid out for.
    filter_for: Option<FilterShape>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
}

/// The bf16 bits of `x` rounded to nearest even ([`HalfFormat::Bf16`]).
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    (HalfFormat::Bf16.round(x).to_bits() >> 16) as u16
}

/// Rounds `xs` to bf16 into `out` (as long), vectorised at the SIMD level in force.
fn to_bf16(xs: &[f32], out: &mut [u16]) {
    vectorized!({
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = bf16_bits(x);
        }
    })
}

/// `image` (`[H, W, C]`) rounded to bf16 into the middle of a padded buffer whose border is
/// zero (zeroed here when `laid_out_for` is another geometry's).
fn pad_image_bf16(
    g: &Conv2dGeometry,
    image: &[f32],
    padded: &mut Vec<u16>,
    laid_out_for: &mut Option<Conv2dGeometry>,
) {
    let c = g.in_channels;
    let [hp, wp] = padded_hw(g);
    let layout = Conv2dGeometry { batch: 1, ..*g };
    if *laid_out_for != Some(layout) {
        padded.clear();
        padded.resize(hp * wp * c, 0);
        *laid_out_for = Some(layout);
    }
    let row_len = g.in_hw[1] * c;
    for (ih, row) in image.chunks_exact(row_len.max(1)).enumerate() {
        let start = ((ih + g.padding.top) * wp + g.padding.left) * c;
        to_bf16(row, &mut padded[start..start + row_len]);
    }
}

/// The right-hand operand `B[k][n]` (`k_len × n_len`) rounded to bf16 in the layout
/// `tdpbf16ps` reads: for each 32-deep step of `k` and each block of 16 columns, a 16-row tile
/// whose row `r` holds the pairs `(B[2r][n], B[2r + 1][n])` for its 16 columns; zero past
/// `k_len` and `n_len`.
struct PackedB {
    data: Vec<u16>,
    steps: usize,
    blocks: usize,
}

/// bf16 values in one packed tile.
const TILE_VALUES: usize = TILE_ROWS * K_STEP;

impl PackedB {
    fn new(k_len: usize, n_len: usize, value: impl Fn(usize, usize) -> f32) -> PackedB {
        let (steps, blocks) = (k_len.div_ceil(K_STEP), n_len.div_ceil(N_BLOCK));
        let mut data = vec![0; steps * blocks * TILE_VALUES];
        for k in 0..k_len {
            let (step, depth) = (k / K_STEP, k % K_STEP);
            for n in 0..n_len {
                let (block, col) = (n / N_BLOCK, n % N_BLOCK);
                let tile = (step * blocks + block) * TILE_VALUES;
                data[tile + (depth / 2) * K_STEP + col * 2 + depth % 2] = bf16_bits(value(k, n));
            }
        }
        PackedB {
            data,
            steps,
            blocks,
        }
    }

    /// The reduction length the tiles cover (a multiple of 32).
    fn k_padded(&self) -> usize {
        self.steps * K_STEP
    }

    /// The columns the tiles cover (a multiple of 16).
    fn n_padded(&self) -> usize {
        self.blocks * N_BLOCK
    }

    /// The tile of step `step`, column block `block`.
    fn tile(&self, step: usize, block: usize) -> *const u16 {
        self.data[(step * self.blocks + block) * TILE_VALUES..].as_ptr()
    }
}

/// `y[p][n] = Σ_seg Σ_j padded[origins[p] + seg.a_off + j] · B[seg.k0 + j][n]` for the pixels
/// of one image, 64 at a time. Whole panels of an output whose width is a multiple of 16 are
/// stored by the tiles straight into `y`; others go through `products`.
#[allow(clippy::too_many_arguments)]
fn image_gemm(
    tiles: &Tiles,
    segs: &[Segment],
    origins: &[usize],
    padded: &[u16],
    filter: &PackedB,
    (panel, panel_for, products): (&mut Vec<u16>, &mut (usize, usize), &mut Vec<f32>),
    y: &mut [f32],
    o: usize,
) {
    let (kp, np) = (filter.k_padded(), filter.n_padded());
    let (reach, k_len) = segs.iter().fold((0, 0), |(reach, k), s| {
        (reach.max(s.a_off + s.len), k.max(s.k0 + s.len))
    });
    assert!(
        origins.iter().all(|&origin| origin + reach <= padded.len())
            && segs.iter().all(|s| s.k0 + s.len <= k_len)
            && k_len <= kp
            && y.len() >= origins.len() * o,
        "tile convolution out of bounds"
    );
    if *panel_for != (k_len, kp) {
        panel.clear();
        panel.resize(PANEL_ROWS * kp, 0);
        *panel_for = (k_len, kp);
    }
    products.resize(PANEL_ROWS * np, 0.0);
    for (first, pixels) in origins.chunks(PANEL_ROWS).enumerate() {
        // SAFETY: every window run lies in `padded` and every panel row holds `k_len <= kp`
        // values (asserted above); the CPU runs AVX-512 (the level `unsupported` checked).
        unsafe { gather_windows(segs, pixels, padded.as_ptr(), panel.as_mut_ptr(), kp) };
        // Rows past the last pixel multiply zeros (the last panel of an image); the tail of
        // every row past `k_len` stays zero (`panel_for`).
        if pixels.len() < PANEL_ROWS {
            panel[pixels.len() * kp..].fill(0);
        }
        let y_panel = &mut y[first * PANEL_ROWS * o..];
        if pixels.len() == PANEL_ROWS && np == o {
            // SAFETY: 64 rows of `o` are inside `y` (asserted above: a whole panel of pixels).
            unsafe { multiply_panel(tiles, panel, filter, y_panel.as_mut_ptr(), o) };
        } else {
            // SAFETY: `products` holds 64 rows of `np`.
            unsafe { multiply_panel(tiles, panel, filter, products.as_mut_ptr(), np) };
            for (r, y_row) in y_panel.chunks_exact_mut(o).take(pixels.len()).enumerate() {
                y_row.copy_from_slice(&products[r * np..r * np + o]);
            }
        }
    }
}

/// Row `r` of the panel (`kp` apart) gets the window of pixel `pixels[r]`: every segment's run
/// of the padded image at its place in the filter's row order. Compiled for AVX-512 with the
/// copies inlined (a call per run cost as much as the tile products).
///
/// # Safety
/// AVX-512F/BW are available; every `padded + origin + a_off .. + len` is readable and the
/// panel holds `pixels.len()` rows of `kp >= k0 + len`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn gather_windows(
    segs: &[Segment],
    pixels: &[usize],
    padded: *const u16,
    panel: *mut u16,
    kp: usize,
) {
    for (r, &origin) in pixels.iter().enumerate() {
        for seg in segs {
            // SAFETY: in bounds by the function's contract.
            unsafe {
                copy_run(
                    padded.add(origin + seg.a_off),
                    panel.add(r * kp + seg.k0),
                    seg.len,
                )
            };
        }
    }
}

/// Copies `len` bf16 values from `src` to `dst`, 32 at a time (the last run masked).
///
/// # Safety
/// AVX-512F/BW are available; `src` and `dst` are valid for `len` values.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn copy_run(src: *const u16, dst: *mut u16, len: usize) {
    use std::arch::x86_64::{_mm512_mask_storeu_epi16, _mm512_maskz_loadu_epi16};
    let mut i = 0;
    while i < len {
        let left = (len - i).min(32);
        let mask = if left == 32 {
            u32::MAX
        } else {
            (1u32 << left) - 1
        };
        // SAFETY: lanes `i..i + left` of both runs are in bounds; the others are masked off.
        unsafe {
            let v = _mm512_maskz_loadu_epi16(mask, src.add(i).cast());
            _mm512_mask_storeu_epi16(dst.add(i).cast(), mask, v);
        }
        i += 32;
    }
}

/// Tiles configured on this thread: 0–3 accumulators (16 rows × 16 f32), 4–5 left operands
/// (16 rows × 32 bf16), 6–7 right operands (16 rows of 16 bf16 pairs). Released on drop.
struct Tiles(std::marker::PhantomData<*const ()>);

/// The 64-byte operand of `ldtilecfg` (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

impl Tiles {
    /// # Safety
    /// [`available`] returned true.
    unsafe fn configure() -> Tiles {
        let mut config = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes_per_row: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            config.bytes_per_row[t] = 64;
            config.rows[t] = TILE_ROWS as u8;
        }
        // SAFETY: the CPU has AMX-TILE and the OS granted the state (the caller's contract);
        // the configuration is a valid palette-1 layout.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly, preserves_flags));
        }
        Tiles(std::marker::PhantomData)
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: tiles were configured on this thread (`Tiles` is neither `Send` nor `Sync`).
        unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
    }
}

/// `products[r][n] = Σ_k panel[r][k] · B[k][n]` for the panel's 64 rows and every column block
/// of `filter`: pairs of blocks as two 32-row halves of 2 × 2 accumulator tiles, a last odd
/// block as 4 × 1 (64 rows). Four independent accumulators keep the tile unit busy: one
/// `tdpbf16ps` takes several times its issue interval to complete.
///
/// # Safety
/// `c` is writable for 64 rows of `ldc >= filter.n_padded()` f32 (`ldc` apart).
unsafe fn multiply_panel(tiles: &Tiles, panel: &[u16], filter: &PackedB, c: *mut f32, ldc: usize) {
    let kp = filter.k_padded();
    assert!(
        panel.len() >= PANEL_ROWS * kp && ldc >= filter.n_padded(),
        "tile panel out of bounds"
    );
    let mut block = 0;
    while block + 1 < filter.blocks {
        for half in 0..2 {
            let rows = half * 2 * TILE_ROWS;
            // SAFETY: rows `rows..rows + 32` of the panel (asserted above) and of `c` (the
            // caller's contract) are inside them.
            unsafe {
                two_by_two(
                    tiles,
                    panel[rows * kp..].as_ptr(),
                    filter,
                    block,
                    c.add(rows * ldc),
                    kp,
                    ldc,
                )
            };
        }
        block += 2;
    }
    if block < filter.blocks {
        // SAFETY: the 64 rows of the panel (asserted above) and of `c` (the caller's contract).
        unsafe { four_by_one(tiles, panel.as_ptr(), filter, block, c, kp, ldc) };
    }
}

/// 32 rows × column blocks `block` and `block + 1`: accumulators 0 (rows 0–15, `block`),
/// 1 (0–15, `block + 1`), 2 (16–31, `block`), 3 (16–31, `block + 1`).
///
/// # Safety
/// Tiles are configured (`_tiles`); `a` points at 32 rows of `kp` bf16, `c` at 32 rows of `ldc`
/// f32; `block + 1 < filter.blocks`.
unsafe fn two_by_two(
    _tiles: &Tiles,
    a: *const u16,
    filter: &PackedB,
    block: usize,
    c: *mut f32,
    kp: usize,
    ldc: usize,
) {
    let (a_stride, b_stride, c_stride) = (2 * kp, 2 * K_STEP, 4 * ldc);
    // SAFETY (whole block): every tile lies in the regions of the contract.
    unsafe {
        let a_low = a.add(TILE_ROWS * kp);
        let c_low = c.add(TILE_ROWS * ldc);
        tile_zero!(0);
        tile_zero!(1);
        tile_zero!(2);
        tile_zero!(3);
        for step in 0..filter.steps {
            tile_load!(4, a.add(step * K_STEP), a_stride);
            tile_load!(6, filter.tile(step, block), b_stride);
            tile_dot!(0, 4, 6);
            tile_load!(7, filter.tile(step, block + 1), b_stride);
            tile_dot!(1, 4, 7);
            tile_load!(5, a_low.add(step * K_STEP), a_stride);
            tile_dot!(2, 5, 6);
            tile_dot!(3, 5, 7);
        }
        let col = block * N_BLOCK;
        tile_store!(0, c.add(col), c_stride);
        tile_store!(1, c.add(col + N_BLOCK), c_stride);
        tile_store!(2, c_low.add(col), c_stride);
        tile_store!(3, c_low.add(col + N_BLOCK), c_stride);
    }
}

/// 64 rows × column block `block`: accumulator `i` holds rows `16i..16i + 16`.
///
/// # Safety
/// Tiles are configured (`_tiles`); `a` points at 64 rows of `kp` bf16, `c` at 64 rows of `ldc`
/// f32; `block < filter.blocks`.
unsafe fn four_by_one(
    _tiles: &Tiles,
    a: *const u16,
    filter: &PackedB,
    block: usize,
    c: *mut f32,
    kp: usize,
    ldc: usize,
) {
    let (a_stride, b_stride, c_stride) = (2 * kp, 2 * K_STEP, 4 * ldc);
    let quarter = TILE_ROWS * kp;
    // SAFETY (whole block): every tile lies in the regions of the contract.
    unsafe {
        tile_zero!(0);
        tile_zero!(1);
        tile_zero!(2);
        tile_zero!(3);
        for step in 0..filter.steps {
            let a_step = a.add(step * K_STEP);
            tile_load!(6, filter.tile(step, block), b_stride);
            tile_load!(4, a_step, a_stride);
            tile_dot!(0, 4, 6);
            tile_load!(5, a_step.add(quarter), a_stride);
            tile_dot!(1, 5, 6);
            tile_load!(4, a_step.add(2 * quarter), a_stride);
            tile_dot!(2, 4, 6);
            tile_load!(5, a_step.add(3 * quarter), a_stride);
            tile_dot!(3, 5, 6);
        }
        let col = block * N_BLOCK;
        tile_store!(0, c.add(col), c_stride);
        tile_store!(1, c.add(TILE_ROWS * ldc + col), c_stride);
        tile_store!(2, c.add(2 * TILE_ROWS * ldc + col), c_stride);
        tile_store!(3, c.add(3 * TILE_ROWS * ldc + col), c_stride);
    }
}
