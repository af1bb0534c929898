//! bf16 convolutions on AMX tiles (Intel Advanced Matrix Extensions: AMX-TILE + AMX-BF16,
//! Sapphire Rapids and later), for kernels whose operands the bf16 precision rounds
//! (`ConvGeom::round_operands`): the operands are rounded to bf16 as they are packed —
//! [`HalfFormat::Bf16`]'s rounding, so the values multiplied are the ones the reference executor
//! multiplies — and `tdpbf16ps` multiplies them with f32 accumulation. One tile instruction does
//! 16 × 16 × 32 multiply-adds: measured on this project's Sapphire Rapids machine, 490 G/s on one
//! core against 88 G/s for AVX-512 FMAs and 44 G/s for AVX512-BF16's `vdpbf16ps` (which is why
//! the vector bf16 dot product is not used there; on an AMD Zen 4 without AMX, `vdpbf16ps`
//! runs at 2.0× the FMAs' rate instead — docs/performance.md, Precision — and would read this
//! module's packed operands as they are).
//!
//! **Algorithm.** An implicit GEMM per image: the image is padded and rounded to bf16 once, then
//! panels of 64 output pixels multiply their windows (`KH·KW·C` values, in the filter's row
//! order) by the packed filter (`implicit_gemm::PackedB`: the VNNI pair layout `tdpbf16ps`
//! reads, zero past the filter's rows and columns) into four accumulator tiles. Stride-1
//! convolutions whose window rows are whole 16- or 32-deep steps read the windows in place from
//! the padded image (a tile's rows `C` values apart); others gather each panel's windows first
//! (zero past the end up to a multiple of 32). The products go straight into the output rows
//! (or through a small buffer: partial panels, widths that are not a multiple of 16, the
//! in-place panels' dropped pixels); the image's epilogue then runs while its rows are hot. The
//! input gradient of a stride-1 convolution is the forward convolution of `dy` with the flipped
//! filter (`transpose::transposed_geometry`); a strided one is computed phase by phase
//! (`phases`: each phase of `dx` a stride-1 correlation of `dy` with its taps).
//!
//! **Numerics.** Products of bf16 values are exact in f32, so only the accumulation rounds; the
//! tile unit's summation order within a 32-deep step is its own (not bitwise the f32 kernels'
//! sequential order), so results agree with the vector path on the same rounded operands within
//! the f32 accumulation bound (tested: `tests/backend/cpu_conv_amx.rs`). The instruction treats bf16
//! subnormals (magnitudes below 2⁻¹²⁶) as zero and flushes subnormal results.
//!
//! **Files.** This module: the probe, the tile configuration, the pieces the algorithms share
//! (the padded bf16 image, the window gather, per-thread buffers) and the input gradient's
//! choice by stride; `implicit_gemm`: the forward pass and the stride-1 input gradient;
//! `phases`: the strided input gradient (on `implicit_gemm`'s panels); `filter`: the filter
//! gradient.
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

use super::direct::padded_hw;
use super::tiles::Segment;
use super::transpose::transposed_geometry;
use super::{Conv2dGeometry, ConvPass, check_operands};
use crate::backend::cpu::kernels::epilogue::Epilogue;
use crate::backend::cpu::kernels::simd::SimdLevel;
use crate::backend::cpu::kernels::{KernelError, shape_error};
use crate::lower::HalfFormat;

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
    *AVAILABLE
        .get_or_init(|| !crate::backend::cpu::kernels::switched_off_by_env(AMX_ENV) && probe())
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

/// Why the tile kernels cannot run `g` at the SIMD level in force (`None`: they can): every
/// pass of a one-group convolution, any stride, padding and dilation, runs on tiles where the
/// CPU has them.
pub fn unsupported(g: &Conv2dGeometry, _pass: ConvPass) -> Option<&'static str> {
    if !available() {
        return Some("this CPU or OS has no AMX-BF16 tiles (or TOWERPACK_AMX=0)");
    }
    if SimdLevel::current() < SimdLevel::Avx512 {
        return Some("AMX runs at the avx512 SIMD level only");
    }
    if g.groups != 1 {
        return Some("grouped convolution");
    }
    None
}

/// Whether the tile kernels are faster than the vector kernels for `pass` of `g`: when each
/// window holds at least 64 products (`KH·KW·C`, or `KH·KW·O` for the input gradient). Below
/// that the gathers cost more than the tiles save. Measured on ResNet-20's layers at batch
/// 128 (`cargo bench --bench cpu_kernels -- conv-algos`, one thread, a noisy machine): the
/// 3-channel stem (27 products) ran 2× slower on tiles and the 1×1 projections (16 and 32)
/// 0.7–1.2×; the 3×3 layers 1.3–1.8× faster at 16 channels (32×32 pixels), 1.3–2.8× at 32,
/// 2–3.8× at 64, in every pass. The strided input gradients (phase by phase, `amx/phases.rs`),
/// measured the same way on 2026-11-28: the 3×3 stride-2 layers 1.8× (16→32 channels) and 2.0×
/// (32→64) faster on tiles, the 1×1 stride-2 projections 1.25× faster at 64 output channels
/// (64 products) and 0.94× at 32 (32 products: left to the vector kernels) — the same rule.
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

mod filter;
mod implicit_gemm;
mod phases;

use filter::FilterShape;
pub use filter::backward_filter;
pub use implicit_gemm::forward;

/// `dx = epilogue(∂conv2d/∂x · bf16(dy))` with the bf16 filter on AMX tiles (layouts as
/// [`crate::backend::cpu::kernels::conv2d_backward_input`]): at stride 1 the forward
/// convolution of `dy` with the flipped filter (`implicit_gemm`), otherwise phase by phase
/// (`phases`). An error where [`unsupported`] says why not.
pub fn backward_input(
    g: &Conv2dGeometry,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_backward_input_bf16", g, dx.len(), w.len(), dy.len())?;
    check_supported("conv2d_backward_input_bf16", g, ConvPass::InputGradient)?;
    match transposed_geometry(g, out_hw) {
        Some(t) => implicit_gemm::backward_input_stride1(g, &t, dy, w, dx, epilogue),
        // Strides (or padding past the window's reach): phase by phase.
        None => phases::backward_input(g, out_hw, dy, w, dx, epilogue),
    }
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
    /// A strided input gradient's products for one phase of the image (`phases`).
    phase_out: Vec<f32>,
    /// The filter gradient's operands: patch rows in pixel pairs, the transposed output
    /// gradient, two gathered patch rows; zero where [`FilterShape`] pads them.
    pairs: Vec<u16>,
    dy_t: Vec<u16>,
    two_rows: Vec<u16>,
    /// The padded image's neighbouring pixels interleaved, for a filter gradient that reads
    /// its patch pairs in place (`filter::pair_pixels`).
    pixel_pairs: Vec<u16>,
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
    crate::backend::cpu::kernels::round::to_bf16_bits(xs, out);
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
/// (16 rows × 32 bf16, or 16 for 16-deep steps), 6–7 right operands (16 rows of 16 bf16 pairs,
/// or 8). Released on drop.
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
    /// Tiles for 32-deep steps (every operand tile 16 rows of 64 bytes).
    ///
    /// # Safety
    /// [`available`] returned true.
    unsafe fn configure() -> Tiles {
        // SAFETY: the caller's contract.
        unsafe { Tiles::configure_for(K_STEP) }
    }

    /// Tiles for `k_step`-deep steps (32 or 16): left operands 16 rows of `k_step` bf16, right
    /// operands `k_step / 2` rows of 16 pairs, accumulators 16 rows of 16 f32.
    ///
    /// # Safety
    /// [`available`] returned true; `k_step` is 16 or 32.
    unsafe fn configure_for(k_step: usize) -> Tiles {
        debug_assert!(k_step == 16 || k_step == K_STEP);
        let mut config = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes_per_row: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            let (bytes, rows) = match t {
                4 | 5 => (2 * k_step, TILE_ROWS),
                6 | 7 => (2 * N_BLOCK * 2, k_step / 2),
                _ => (4 * N_BLOCK, TILE_ROWS),
            };
            config.bytes_per_row[t] = bytes as u16;
            config.rows[t] = rows as u8;
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
