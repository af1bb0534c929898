//! Winograd F(4×4, 3×3) convolution (Lavin & Gray, "Fast Algorithms for Convolutional Neural
//! Networks", 2016) for the three passes of 3×3, stride-1, undilated, one-group convolutions: 36
//! multiplications for every 4×4 block of outputs where the direct kernels do 144, which is what
//! lets a CPU's FMA units, already running the direct kernels at 85–100% of their peak, go faster
//! still.
//!
//! **Forward**, for a group of images (one task): each image is copied into a zero-padded buffer
//! (its prologue computed on the way, like the direct kernels'), every 6×6 input tile `d` (stride
//! 4) becomes `V = Bᵀ d B`; for each of the 36 points `ξ` of the transformed tile, one GEMM over
//! the channels `M_ξ = V_ξ · U_ξ`, `U = G g Gᵀ` being the filter's transform (computed once per
//! call, in f64); each 4×4 output block is `Aᵀ M A`, and the epilogue runs on each finished
//! image. The **input gradient** of a stride-1 convolution is the forward convolution of `dy`
//! with the spatially flipped, channel-transposed filter (`transpose::transposed_geometry`),
//! so it runs the same code. The **filter gradient** is the chain rule through the same formula:
//! `∂U_ξ = Σ_tiles V_ξᵀ · (A ∂Y Aᵀ)_ξ`, then `∂g = Gᵀ ∂U G`.
//!
//! A tile's 36 transformed points are stored together (`[tiles][36][C]`), so each transform
//! writes or reads one contiguous block; the GEMMs read a point's rows 36·C apart. The GEMMs are
//! the direct convolution's register tiles (`tiles::tile_row` and `tiles::filter_image`, one
//! reduction segment of `C` channels), so they run at the same speed and give the same bits at
//! every SIMD level. The transforms run 16 channels at a time at AVX-512 and 8 at AVX2 with the
//! same instruction sequence per lane, so the AVX2 and AVX-512 levels give bit-identical
//! results here too. (They ran 8 channels at both levels at first, and were ~20% of the
//! ResNet-20 step at AVX-512; 16 lanes made that step ~8% faster, measured alternately.)
//!
//! **Numerics.** The transforms' coefficients (up to 5 in `Bᵀ`, 8 in `Aᵀ`, 1/24 in `G`) cost
//! accuracy: on the ResNet-20 shapes the three passes differ from an f64 reference by 2e-6–8e-6
//! of the outputs' largest magnitude, against 2e-7–9e-7 for the direct kernels (measured in
//! `winograd_matches_the_direct_kernels_on_resnet_shapes`; its bound is 2e-5). Training does
//! not see it (the held-out accuracy figures of the README); a model that needs the direct
//! kernels' accuracy pins [`super::ConvAlgorithm::Direct`].

use super::direct::{at_level, pad_image};
use super::tiles::{Segment, TileKernels, filter_image, row_stride, tile_row};
use super::transpose::{flip_filter, transposed_geometry};
use super::{Conv2dGeometry, ConvInput, check_operands};
use crate::backend::cpu::kernels::KernelError;
use crate::backend::cpu::kernels::epilogue::Epilogue;
use crate::backend::cpu::kernels::parallel::{
    for_each_row_block, scratch_of, split_range, threads, worth_parallel,
};
use crate::backend::cpu::kernels::simd::{SimdLevel, carry, vectorized};
use rayon::prelude::*;

/// Outputs per tile edge.
const OUT: usize = 4;
/// Inputs per tile edge: `OUT + 3 − 1`.
const TILE: usize = 6;
/// Points of a transformed tile, one GEMM each.
const POINTS: usize = TILE * TILE;
/// Channels per transform step (one AVX2 vector).
const LANES: usize = 8;
/// Tiles a task gathers at least (from several images when each has fewer), so that the GEMMs'
/// register tiles of up to 6 (AVX2) or 12 (AVX-512) rows of two vectors are full.
const MIN_TASK_TILES: usize = 24;

/// Whether Winograd can run the forward pass and the filter gradient of `g` at the SIMD level in
/// force: a 3×3 window,
/// stride 1, no dilation, one group, channel counts that are whole vectors of 8, and the AVX2 or
/// AVX-512 GEMM kernels.
pub(super) fn supported(g: &Conv2dGeometry) -> bool {
    g.groups == 1
        && g.kernel_hw == [3, 3]
        && g.strides == [1, 1]
        && g.dilations == [1, 1]
        && g.in_channels.is_multiple_of(LANES)
        && g.out_channels.is_multiple_of(LANES)
        && g.in_channels > 0
        && g.out_channels > 0
        && SimdLevel::current() >= SimdLevel::Avx2
}

/// Whether Winograd can run the input gradient of `g` (the forward pass of its transposed
/// convolution).
pub(super) fn supported_input(g: &Conv2dGeometry) -> bool {
    let out_hw = g.out_hw();
    supported(g) && transposed_geometry(g, out_hw).is_some_and(|t| supported(&t))
}

/// The environment variable that keeps the automatic choice off Winograd for the process (`0`,
/// `off` or `false`): every convolution then sums exact products, as the direct kernels do.
pub const WINOGRAD_ENV: &str = "TOWERPACK_WINOGRAD";

/// Whether `TOWERPACK_WINOGRAD` turns Winograd off (read once).
pub(super) fn disabled_by_env() -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DISABLED.get_or_init(|| crate::backend::cpu::kernels::switched_off_by_env(WINOGRAD_ENV))
}

/// Most bytes of one image's transformed input and output (`tiles · 36 · (C + O) · 4`) for
/// which Winograd pays off: beyond, they spill out of the caches. Measured with one thread, the
/// forward pass and filter gradient together, direct then Winograd: 112×112×64 (14 MiB)
/// 67–84 → 30–32 ms, 224×224×64 (55 MiB) 172–196 → 207–223 ms.
const MAX_IMAGE_TRANSFORM_BYTES: usize = 16 << 20;

/// Most bytes of the filter's transform (`36 · C · O · 4`, computed serially once per call) for
/// which Winograd pays off. Measured as above: 14×14×256 at batch 8 (9 MiB) 67 → 27–30 ms,
/// 7×7×512 at batch 16 (36 MiB) 207–209 → 214–238 ms.
const MAX_FILTER_TRANSFORM_BYTES: usize = 16 << 20;

/// Whether Winograd beats the direct kernels on `g` (the `Auto` choice): from 16 channels in and
/// out (measured on the ResNet-20 shapes, `cargo bench --bench cpu_kernels -- conv-algos`: 1.6–
/// 2.9× at 16–64 channels; 8-channel layers, where the transforms — which grow with the channel
/// counts, not with their product — weigh most, are not measured and stay direct), while one
/// image's and the filter's transforms stay in the caches' reach (the limits above).
pub(super) fn pays_off(g: &Conv2dGeometry) -> bool {
    let [oh, ow] = g.out_hw();
    let tiles = oh.div_ceil(OUT) * ow.div_ceil(OUT);
    let (c, o) = (g.in_channels, g.out_channels);
    c >= 16
        && o >= 16
        && tiles * POINTS * (c + o) * 4 <= MAX_IMAGE_TRANSFORM_BYTES
        && POINTS * c * o * 4 <= MAX_FILTER_TRANSFORM_BYTES
}

/// The forward convolution (see [`super::conv2d_forward`]); `supported(g)` must hold.
pub(super) fn forward(
    g: &Conv2dGeometry,
    x: ConvInput<'_>,
    w: &[f32],
    y: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    at_level!(forward_with(g, x, w, y, epilogue))
}

/// The input gradient (see [`super::conv2d_backward_input`]); `supported_input(g)` must hold.
pub(super) fn backward_input(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let Some(transposed) = transposed_geometry(g, out_hw) else {
        return Err(super::shape_error(
            "conv2d_backward_input",
            format!("Winograd needs padding of at most 2 on each side: {g:?}"),
        ));
    };
    let flipped = flip_filter(g, w);
    forward(&transposed, ConvInput::Tensor(dy), &flipped, dx, epilogue)
}

/// The filter gradient (see [`super::conv2d_backward_filter`]); `supported(g)` must hold. The
/// chain rule through `Y = Aᵀ[(G g Gᵀ) ⊙ V]A`: `∂U_ξ = Σ_tiles V_ξᵀ · (A ∂Y Aᵀ)_ξ` (one
/// reduction over the tiles per point, on the direct kernels' filter-gradient tiles), then
/// `∂g = Gᵀ ∂U G` (in f64). Images are split into one range per thread; the partial `∂U`s are
/// summed in range order.
pub(super) fn backward_filter(
    g: &Conv2dGeometry,
    x: ConvInput<'_>,
    dy: &[f32],
    dw: &mut [f32],
) -> Result<(), KernelError> {
    at_level!(backward_filter_with(g, x, dy, dw))
}

fn backward_filter_with<K: TileKernels>(
    g: &Conv2dGeometry,
    x: ConvInput<'_>,
    dy: &[f32],
    dw: &mut [f32],
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_backward_filter", g, x.len(), dw.len(), dy.len())?;
    let (c, o) = (g.in_channels, g.out_channels);
    let out_rows = out_hw[0] * out_hw[1];
    if out_rows == 0 || g.batch == 0 {
        dw.fill(0.0);
        return Ok(());
    }
    if !supported(g) {
        return Err(super::shape_error(
            "conv2d_backward_filter",
            format!("no Winograd kernels for {g:?}"),
        ));
    }
    let tiling = Tiling::new(out_hw);
    let tiles = tiling.tiles();
    let [ph, pw] = tiling.padded_hw;
    let parts = if worth_parallel(2 * g.macs()) {
        threads()
    } else {
        1
    };
    let origins: Vec<usize> = (0..tiles).map(|t| t * POINTS * c).collect();
    let run = |images: std::ops::Range<usize>| {
        let mut du = vec![0.0; POINTS * c * o];
        let mut padded = vec![0.0; ph * pw * c];
        let mut v = vec![0.0; tiles * POINTS * c];
        // One point's rows are read as whole vectors from `ξ·O` on: room past the last tile.
        let mut dm = vec![0.0; (tiles + 1) * POINTS * o];
        let mut dy_tiles = vec![0.0; OUT * tiling.tiles_hw[0] * OUT * tiling.tiles_hw[1] * o];
        for n in images {
            pad_image(g, &x, n, pw, &mut padded, None);
            transform_input(&tiling, c, &padded, &mut v, tiles, 0);
            let dy_image = &dy[n * out_rows * o..(n + 1) * out_rows * o];
            transform_gradient(&tiling, o, dy_image, &mut dy_tiles, &mut dm);
            for point in 0..POINTS {
                let segment = [Segment {
                    a_off: point * c,
                    k0: 0,
                    len: c,
                }];
                filter_image::<K>(
                    &segment,
                    &origins,
                    &v,
                    &dm[point * o..],
                    POINTS * o,
                    o,
                    &mut du[point * c * o..(point + 1) * c * o],
                );
            }
        }
        du
    };
    let ranges = split_range(g.batch, parts);
    let du = if ranges.len() <= 1 {
        run(0..g.batch)
    } else {
        let partials: Vec<Vec<f32>> = ranges.into_par_iter().map(carry(run)).collect();
        let mut total = partials[0].clone();
        for partial in &partials[1..] {
            total.iter_mut().zip(partial).for_each(|(t, p)| *t += p);
        }
        total
    };
    untransform_filter_gradient(&du, c, o, dw);
    Ok(())
}

/// The filter transform `G` (6 × 3) of F(4×4, 3×3): interpolation at 0, ±1, ±2 and ∞.
const G: [[f64; 3]; TILE] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];

/// The tiling of one image.
#[derive(Clone, Copy, Debug)]
struct Tiling {
    /// Output `[OH, OW]`.
    out_hw: [usize; 2],
    /// Tiles `[down, across]`.
    tiles_hw: [usize; 2],
    /// The zero-padded buffer's `[rows, cols]`: the padded input, grown to whole tiles.
    padded_hw: [usize; 2],
}

impl Tiling {
    fn new(out_hw: [usize; 2]) -> Self {
        let tiles_hw = [out_hw[0].div_ceil(OUT), out_hw[1].div_ceil(OUT)];
        // A valid geometry has `OH + 2` padded rows; whole tiles read `4·tiles + 2 >= OH + 2`.
        let padded_hw = [OUT * tiles_hw[0] + 2, OUT * tiles_hw[1] + 2];
        Tiling {
            out_hw,
            tiles_hw,
            padded_hw,
        }
    }

    fn tiles(&self) -> usize {
        self.tiles_hw[0] * self.tiles_hw[1]
    }
}

fn forward_with<K: TileKernels>(
    g: &Conv2dGeometry,
    x: ConvInput<'_>,
    w: &[f32],
    y: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_forward", g, x.len(), w.len(), y.len())?;
    let (c, o) = (g.in_channels, g.out_channels);
    let out_rows = out_hw[0] * out_hw[1];
    epilogue.check(g.batch * out_rows, o)?;
    if out_rows == 0 || o == 0 || g.batch == 0 {
        return Ok(());
    }
    if !supported(g) {
        return Err(super::shape_error(
            "conv2d_forward",
            format!("no Winograd kernels for {g:?}"),
        ));
    }
    let tiling = Tiling::new(out_hw);
    let tiles = tiling.tiles();
    let parallel = worth_parallel(2 * g.macs()) && g.batch > 1;
    // Enough images per task to fill the GEMMs' register tiles, as long as every thread still
    // gets a task.
    let per_thread = if parallel {
        g.batch.div_ceil(threads())
    } else {
        g.batch
    };
    let images = MIN_TASK_TILES.div_ceil(tiles).clamp(1, per_thread.max(1));
    let u_stride = row_stride::<K>(o);
    let u = transform_filter(w, c, o, u_stride);
    let [ph, pw] = tiling.padded_hw;
    let padded_len = ph * pw * c;
    for_each_row_block(
        y,
        o,
        out_rows * images,
        parallel,
        |y_block, first_row, scratch| {
            let n0 = first_row / out_rows;
            let count = y_block.len() / (out_rows * o);
            let rows = count * tiles;
            let scratch = scratch_of(scratch, padded_len + POINTS * rows * (c + o));
            let (padded, rest) = scratch.split_at_mut(padded_len);
            let (v, m) = rest.split_at_mut(POINTS * rows * c);
            for i in 0..count {
                pad_image(g, &x, n0 + i, pw, padded, None);
                transform_input(&tiling, c, padded, v, rows, i * tiles);
            }
            let segment = [Segment {
                a_off: 0,
                k0: 0,
                len: c,
            }];
            for point in 0..POINTS {
                tile_row::<K>(
                    &v[point * c..],
                    POINTS * c,
                    rows,
                    &segment,
                    &u[point * c * u_stride..(point + 1) * c * u_stride],
                    u_stride,
                    o,
                    &mut m[point * o..],
                    POINTS * o,
                );
            }
            for (i, y_image) in y_block.chunks_exact_mut(out_rows * o).enumerate() {
                transform_output(&tiling, o, m, rows, i * tiles, y_image);
                // One epilogue call per image, as the direct kernels make: its blocks (and so
                // batch-norm statistics' summation order) do not depend on the task size.
                if !epilogue.is_identity() {
                    epilogue.apply(y_image, first_row + i * out_rows, o);
                }
            }
            Ok(())
        },
    )
}

/// The filter's transform `U = G g Gᵀ` for every input channel `ci` and output channel `k`:
/// `u[(ξ·C + ci)·stride + k]`, zeros past `o` in each row.
fn transform_filter(w: &[f32], c: usize, o: usize, stride: usize) -> Vec<f32> {
    let mut u = vec![0.0; POINTS * c * stride];
    sandwich(
        &G,
        c,
        o,
        (w, |i, j, ci| ((i * 3 + j) * c + ci) * o),
        (&mut u, |r, s, ci| ((r * TILE + s) * c + ci) * stride),
    );
    u
}

/// `∂g = Gᵀ ∂U G` for every input channel `ci` and output channel `k`, from
/// `du[(ξ·C + ci)·O + k]` into the HWIO `dw`.
fn untransform_filter_gradient(du: &[f32], c: usize, o: usize, dw: &mut [f32]) {
    let g_t: [[f64; TILE]; 3] = std::array::from_fn(|i| std::array::from_fn(|r| G[r][i]));
    sandwich(
        &g_t,
        c,
        o,
        (du, |r, s, ci| ((r * TILE + s) * c + ci) * o),
        (dw, |i, j, ci| ((i * 3 + j) * c + ci) * o),
    );
}

/// `Y = P X Pᵀ` (`P` is `N × K`) for every input channel `ci`, vectorized over the `o` output
/// channels: `X[i][j]` is the row of `o` values at `x.1(i, j, ci)` in `x.0`, `Y[r][s]` is
/// written at `y.1(r, s, ci)` in `y.0`. In f64 (two stages, `P X` then `· Pᵀ`, skipping `P`'s
/// zeros), rounded once: the filter transforms in both directions.
fn sandwich<const K: usize, const N: usize>(
    p: &[[f64; K]; N],
    c: usize,
    o: usize,
    x: (&[f32], impl Fn(usize, usize, usize) -> usize),
    y: (&mut [f32], impl Fn(usize, usize, usize) -> usize),
) {
    let ((x, x_at), (y, y_at)) = (x, y);
    // (P X)[r][j] for one input channel: N × K rows of `o` values.
    let mut px = vec![0.0f64; N * K * o];
    let mut acc = vec![0.0f64; o];
    vectorized!({
        for ci in 0..c {
            for r in 0..N {
                for j in 0..K {
                    let row = &mut px[(r * K + j) * o..][..o];
                    row.fill(0.0);
                    for (i, &coef) in p[r].iter().enumerate().filter(|(_, c)| **c != 0.0) {
                        row.iter_mut()
                            .zip(&x[x_at(i, j, ci)..][..o])
                            .for_each(|(a, &v)| *a += coef * f64::from(v));
                    }
                }
            }
            for r in 0..N {
                for (s, p_s) in p.iter().enumerate() {
                    acc.fill(0.0);
                    for (j, &coef) in p_s.iter().enumerate().filter(|(_, c)| **c != 0.0) {
                        let row = &px[(r * K + j) * o..][..o];
                        acc.iter_mut().zip(row).for_each(|(a, &v)| *a += coef * v);
                    }
                    let dst = &mut y[y_at(r, s, ci)..][..o];
                    dst.iter_mut().zip(&acc).for_each(|(d, &a)| *d = a as f32);
                }
            }
        }
    });
}

/// Writes `A ∂Y Aᵀ` of every tile of one image's output gradient `dy_image` (`[OH, OW, O]`)
/// into `dm` (`[tiles][36][O]`), through `dy_tiles`, the gradient copied to whole tiles (zeros
/// past the output).
fn transform_gradient(
    tiling: &Tiling,
    o: usize,
    dy_image: &[f32],
    dy_tiles: &mut [f32],
    dm: &mut [f32],
) {
    let [th, tw] = tiling.tiles_hw;
    let [oh_len, ow_len] = tiling.out_hw;
    let row_len = OUT * tw * o;
    assert!(
        SimdLevel::detected() >= SimdLevel::Avx2
            && o.is_multiple_of(LANES)
            && dy_image.len() == oh_len * ow_len * o
            && dy_tiles.len() >= OUT * th * row_len
            && dm.len() >= th * tw * POINTS * o,
        "Winograd gradient transform out of bounds"
    );
    for (r, dst) in dy_tiles
        .chunks_exact_mut(row_len)
        .take(OUT * th)
        .enumerate()
    {
        if r < oh_len {
            let src = &dy_image[r * ow_len * o..(r + 1) * ow_len * o];
            dst[..src.len()].copy_from_slice(src);
            dst[src.len()..].fill(0.0);
        } else {
            dst.fill(0.0);
        }
    }
    for ty in 0..th {
        for tx in 0..tw {
            let tile = ty * tw + tx;
            let origin = OUT * ty * row_len + OUT * tx * o;
            for_each_vector(o, |k0, wide| {
                let (src, dst) = (
                    dy_tiles[origin + k0..].as_ptr(),
                    dm[tile * POINTS * o + k0..].as_mut_ptr(),
                );
                // SAFETY: AVX2 and FMA were detected (asserted above), AVX-512 where `wide`
                // (the level in force); the tile's 4×4 values lie in `dy_tiles` (whole tiles),
                // its 36 points in the block of `tile` in `dm`, and the vector's channels end
                // at `o` at the latest.
                unsafe {
                    if wide {
                        transforms::avx512::gradient_tile(src, row_len, o, dst, o)
                    } else {
                        transforms::avx2::gradient_tile(src, row_len, o, dst, o)
                    }
                }
            });
        }
    }
}

/// Writes `V = Bᵀ d B` of every tile of one padded image into `v` (`[rows][36][C]`: each tile's
/// points together, so that the transform writes one contiguous block), the image's tiles from
/// row `first_tile`.
fn transform_input(
    tiling: &Tiling,
    c: usize,
    padded: &[f32],
    v: &mut [f32],
    rows: usize,
    first_tile: usize,
) {
    let [th, tw] = tiling.tiles_hw;
    let [ph, pw] = tiling.padded_hw;
    assert!(
        SimdLevel::detected() >= SimdLevel::Avx2
            && c.is_multiple_of(LANES)
            && padded.len() >= ph * pw * c
            && v.len() >= POINTS * rows * c
            && first_tile + th * tw <= rows,
        "Winograd input transform out of bounds"
    );
    for ty in 0..th {
        for tx in 0..tw {
            let tile = first_tile + ty * tw + tx;
            let origin = (OUT * ty * pw + OUT * tx) * c;
            for_each_vector(c, |c0, wide| {
                let (src, dst) = (
                    padded[origin + c0..].as_ptr(),
                    v[tile * POINTS * c + c0..].as_mut_ptr(),
                );
                // SAFETY: AVX2 and FMA were detected (asserted above), AVX-512 where `wide`.
                // The tile's 6×6 pixels from `origin` lie in the padded image (`OUT·(tiles −
                // 1) + TILE <= padded` rows and columns, and the vector's channels end at `c`
                // at the latest); its 36 points land in the block of tile `tile < rows` of `v`.
                unsafe {
                    if wide {
                        transforms::avx512::input_tile(src, pw * c, c, dst, c)
                    } else {
                        transforms::avx2::input_tile(src, pw * c, c, dst, c)
                    }
                }
            });
        }
    }
}

/// Writes `Aᵀ M A` of one image's tiles (rows `first_tile..` of `m`, `[rows][36][O]`) into its
/// `[OH, OW, O]` output, dropping the rows and columns of edge tiles past the output.
fn transform_output(
    tiling: &Tiling,
    o: usize,
    m: &[f32],
    rows: usize,
    first_tile: usize,
    y_image: &mut [f32],
) {
    let [th, tw] = tiling.tiles_hw;
    let [oh_len, ow_len] = tiling.out_hw;
    assert!(
        SimdLevel::detected() >= SimdLevel::Avx2
            && o.is_multiple_of(LANES)
            && m.len() >= POINTS * rows * o
            && first_tile + th * tw <= rows
            && y_image.len() >= oh_len * ow_len * o,
        "Winograd output transform out of bounds"
    );
    for ty in 0..th {
        for tx in 0..tw {
            let tile = first_tile + ty * tw + tx;
            let extent = [OUT.min(oh_len - OUT * ty), OUT.min(ow_len - OUT * tx)];
            let origin = (OUT * ty * ow_len + OUT * tx) * o;
            for_each_vector(o, |k0, wide| {
                let (src, dst) = (
                    m[tile * POINTS * o + k0..].as_ptr(),
                    y_image[origin + k0..].as_mut_ptr(),
                );
                // SAFETY: AVX2 and FMA were detected (asserted above), AVX-512 where `wide`;
                // the tile's 36 points are the block of tile `tile < rows` of `m`; the
                // `extent` rows and columns of the block from `origin` lie in the `[OH, OW]`
                // output, and the vector's channels end at `o` at the latest.
                unsafe {
                    if wide {
                        transforms::avx512::output_tile(src, o, dst, ow_len * o, o, extent)
                    } else {
                        transforms::avx2::output_tile(src, o, dst, ow_len * o, o, extent)
                    }
                }
            });
        }
    }
}

/// The transforms of one tile and one vector of channels: 8 (AVX2 + FMA) or 16 (AVX-512) at a
/// time. Every lane runs the same instructions whatever the width, so both widths give the same
/// bits, and each level gives the other's.
mod transforms {
    use super::{OUT, TILE};
    use std::arch::x86_64::*;

    /// A vector of channels: the operations the transforms use.
    pub(super) trait Vector: Copy {
        /// Channels per vector.
        const LANES: usize;
        /// # Safety
        /// The CPU has the vector's features; `p` is readable for `LANES` floats.
        unsafe fn load(p: *const f32) -> Self;
        /// # Safety
        /// The CPU has the vector's features; `p` is writable for `LANES` floats.
        unsafe fn store(self, p: *mut f32);
        /// # Safety
        /// The CPU has the vector's features (so for the operations below).
        unsafe fn splat(x: f32) -> Self;
        /// # Safety
        /// As [`Vector::splat`].
        unsafe fn zero() -> Self;
        /// # Safety
        /// As [`Vector::splat`].
        unsafe fn add(self, other: Self) -> Self;
        /// # Safety
        /// As [`Vector::splat`].
        unsafe fn sub(self, other: Self) -> Self;
        /// # Safety
        /// As [`Vector::splat`].
        unsafe fn mul(self, other: Self) -> Self;
        /// `a·b + c`, rounded once.
        ///
        /// # Safety
        /// As [`Vector::splat`].
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
        /// `c − a·b`, rounded once.
        ///
        /// # Safety
        /// As [`Vector::splat`].
        unsafe fn fnmadd(a: Self, b: Self, c: Self) -> Self;
    }

    /// `impl Vector` for one vector type from its intrinsics.
    macro_rules! vector {
        ($t:ty, $lanes:expr, $load:ident, $store:ident, $set1:ident, $zero:ident, $add:ident,
         $sub:ident, $mul:ident, $fmadd:ident, $fnmadd:ident) => {
            impl Vector for $t {
                const LANES: usize = $lanes;
                #[inline(always)]
                unsafe fn load(p: *const f32) -> Self {
                    // SAFETY: by the contract.
                    unsafe { $load(p) }
                }
                #[inline(always)]
                unsafe fn store(self, p: *mut f32) {
                    // SAFETY: by the contract.
                    unsafe { $store(p, self) }
                }
                #[inline(always)]
                unsafe fn splat(x: f32) -> Self {
                    // SAFETY: by the contract.
                    unsafe { $set1(x) }
                }
                #[inline(always)]
                unsafe fn zero() -> Self {
                    // SAFETY: by the contract.
                    unsafe { $zero() }
                }
                #[inline(always)]
                unsafe fn add(self, other: Self) -> Self {
                    // SAFETY: by the contract.
                    unsafe { $add(self, other) }
                }
                #[inline(always)]
                unsafe fn sub(self, other: Self) -> Self {
                    // SAFETY: by the contract.
                    unsafe { $sub(self, other) }
                }
                #[inline(always)]
                unsafe fn mul(self, other: Self) -> Self {
                    // SAFETY: by the contract.
                    unsafe { $mul(self, other) }
                }
                #[inline(always)]
                unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
                    // SAFETY: by the contract.
                    unsafe { $fmadd(a, b, c) }
                }
                #[inline(always)]
                unsafe fn fnmadd(a: Self, b: Self, c: Self) -> Self {
                    // SAFETY: by the contract.
                    unsafe { $fnmadd(a, b, c) }
                }
            }
        };
    }

    vector!(
        __m256,
        8,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        _mm256_setzero_ps,
        _mm256_add_ps,
        _mm256_sub_ps,
        _mm256_mul_ps,
        _mm256_fmadd_ps,
        _mm256_fnmadd_ps
    );
    vector!(
        __m512,
        16,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        _mm512_setzero_ps,
        _mm512_add_ps,
        _mm512_sub_ps,
        _mm512_mul_ps,
        _mm512_fmadd_ps,
        _mm512_fnmadd_ps
    );

    /// `Bᵀ d` of one column of 6 inputs.
    #[inline(always)]
    unsafe fn input_1d<V: Vector>(d: [V; TILE]) -> [V; TILE] {
        // SAFETY: the callers run with the vector's features enabled.
        unsafe {
            let (two, four, five) = (V::splat(2.0), V::splat(4.0), V::splat(5.0));
            let d31 = d[3].sub(d[1]);
            let d42 = d[4].sub(d[2]);
            [
                V::fmadd(four, d[0], V::fnmadd(five, d[2], d[4])),
                V::fnmadd(four, d[1].add(d[2]), d[3].add(d[4])),
                V::fmadd(four, d[1].sub(d[2]), d[4].sub(d[3])),
                V::fmadd(two, d31, d42),
                V::fnmadd(two, d31, d42),
                V::fmadd(four, d[1], V::fnmadd(five, d[3], d[5])),
            ]
        }
    }

    /// `Aᵀ m` of one column of 6 transformed values.
    #[inline(always)]
    unsafe fn output_1d<V: Vector>(m: [V; TILE]) -> [V; OUT] {
        // SAFETY: the callers run with the vector's features enabled.
        unsafe {
            let (two, four, eight) = (V::splat(2.0), V::splat(4.0), V::splat(8.0));
            let (sum12, diff12) = (m[1].add(m[2]), m[1].sub(m[2]));
            let (sum34, diff34) = (m[3].add(m[4]), m[3].sub(m[4]));
            [
                m[0].add(sum12).add(sum34),
                V::fmadd(two, diff34, diff12),
                V::fmadd(four, sum34, sum12),
                V::fmadd(eight, diff34, diff12).add(m[5]),
            ]
        }
    }

    /// `A ∂y` of one column of 4 output gradients.
    #[inline(always)]
    unsafe fn gradient_1d<V: Vector>(d: [V; OUT]) -> [V; TILE] {
        // SAFETY: the callers run with the vector's features enabled.
        unsafe {
            let (two, four, eight) = (V::splat(2.0), V::splat(4.0), V::splat(8.0));
            let sum02 = d[0].add(d[2]);
            let sum13 = d[1].add(d[3]);
            // d0 + 4·d2 and 2·d1 + 8·d3.
            let even = V::fmadd(four, d[2], d[0]);
            let odd = V::fmadd(eight, d[3], two.mul(d[1]));
            [
                d[0],
                sum02.add(sum13),
                sum02.sub(sum13),
                even.add(odd),
                even.sub(odd),
                d[3],
            ]
        }
    }

    /// The separable 2-D transform `F d Fᵀ` of one tile's vector of channels, `f` being `F`
    /// applied to one column: value `(i, j)` of the `N × N` block at `src + i·row + j·pixel`,
    /// result `(r, s)` of the `M × M` block stored at `dst + (r·M + s)·point_stride`.
    ///
    /// # Safety
    /// The CPU has the vector's features; the block is readable and the results writable for
    /// `V::LANES` floats each.
    #[inline(always)]
    unsafe fn separable<V: Vector, const N: usize, const M: usize>(
        src: *const f32,
        row: usize,
        pixel: usize,
        f: impl Fn([V; N]) -> [V; M],
        dst: *mut f32,
        point_stride: usize,
    ) {
        // SAFETY: by the contract.
        unsafe {
            // Columns first: t[r][j] = (F d)[r][j]. Plain loops: building `t` with nested
            // `array::from_fn` closures compiled them outside this function's SIMD context
            // (measured 5× slower).
            let mut t = [[V::zero(); N]; M];
            #[allow(clippy::needless_range_loop)]
            for j in 0..N {
                let column = std::array::from_fn(|i| V::load(src.add(i * row + j * pixel)));
                for (r, value) in f(column).into_iter().enumerate() {
                    t[r][j] = value;
                }
            }
            // Then rows: (t Fᵀ)[r][s].
            for (r, values) in t.into_iter().enumerate() {
                for (s, value) in f(values).into_iter().enumerate() {
                    value.store(dst.add((r * M + s) * point_stride));
                }
            }
        }
    }

    /// `Y = Aᵀ M A` of one tile's vector of channels: point `ξ` at `src + ξ·point_stride`,
    /// output `(a, b)` stored at `dst + a·row + b·pixel` for `a < extent[0]`, `b < extent[1]`.
    ///
    /// # Safety
    /// The CPU has the vector's features; the 36 points are readable and the `extent` outputs
    /// writable for `V::LANES` floats each.
    #[inline(always)]
    unsafe fn output_tile<V: Vector>(
        src: *const f32,
        point_stride: usize,
        dst: *mut f32,
        row: usize,
        pixel: usize,
        extent: [usize; 2],
    ) {
        // SAFETY: by the contract.
        unsafe {
            let mut s = [V::zero(); OUT * TILE];
            for j in 0..TILE {
                let column =
                    std::array::from_fn(|i| V::load(src.add((i * TILE + j) * point_stride)));
                for (a, value) in output_1d(column).into_iter().enumerate() {
                    s[a * TILE + j] = value;
                }
            }
            let row_values = |a: usize| std::array::from_fn(|j| s[a * TILE + j]);
            if extent == [OUT, OUT] {
                // Whole tiles (all but the edges): loops of constant length, unrolled.
                for a in 0..OUT {
                    for (b, value) in output_1d(row_values(a)).into_iter().enumerate() {
                        value.store(dst.add(a * row + b * pixel));
                    }
                }
            } else {
                for a in 0..extent[0] {
                    let values = output_1d(row_values(a));
                    for (b, value) in values.into_iter().enumerate().take(extent[1]) {
                        value.store(dst.add(a * row + b * pixel));
                    }
                }
            }
        }
    }

    /// The entry points of one vector width, compiled for its instruction set.
    macro_rules! width {
        ($name:ident, $vector:ty, $features:literal) => {
            pub(super) mod $name {
                use super::*;

                /// Channels per call.
                pub(in super::super) const LANES: usize = <$vector as Vector>::LANES;

                /// `V = Bᵀ d B` of one tile's vector of channels: pixel `(i, j)` at `src +
                /// i·row + j·pixel`, point `ξ` stored at `dst + ξ·point_stride`.
                ///
                /// # Safety
                /// The CPU has this width's features; the 36 pixels are readable and the 36
                /// points writable for `LANES` floats each.
                #[target_feature(enable = $features)]
                pub(in super::super) unsafe fn input_tile(
                    src: *const f32,
                    row: usize,
                    pixel: usize,
                    dst: *mut f32,
                    point_stride: usize,
                ) {
                    // SAFETY: by the contract; `input_1d` needs this width's features.
                    unsafe {
                        super::separable::<$vector, TILE, TILE>(
                            src,
                            row,
                            pixel,
                            #[inline(always)]
                            |d| super::input_1d(d),
                            dst,
                            point_stride,
                        )
                    }
                }

                /// `∂M = A ∂Y Aᵀ` of one tile's vector of channels: output gradient `(a, b)`
                /// at `src + a·row + b·pixel`, point `ξ` stored at `dst + ξ·point_stride`.
                ///
                /// # Safety
                /// The CPU has this width's features; the 16 gradients are readable and the
                /// 36 points writable for `LANES` floats each.
                #[target_feature(enable = $features)]
                pub(in super::super) unsafe fn gradient_tile(
                    src: *const f32,
                    row: usize,
                    pixel: usize,
                    dst: *mut f32,
                    point_stride: usize,
                ) {
                    // SAFETY: by the contract; `gradient_1d` needs this width's features.
                    unsafe {
                        super::separable::<$vector, OUT, TILE>(
                            src,
                            row,
                            pixel,
                            #[inline(always)]
                            |d| super::gradient_1d(d),
                            dst,
                            point_stride,
                        )
                    }
                }

                /// [`output_tile`](super::output_tile) at this width.
                ///
                /// # Safety
                /// The CPU has this width's features; as `output_tile`.
                #[target_feature(enable = $features)]
                pub(in super::super) unsafe fn output_tile(
                    src: *const f32,
                    point_stride: usize,
                    dst: *mut f32,
                    row: usize,
                    pixel: usize,
                    extent: [usize; 2],
                ) {
                    // SAFETY: by the contract.
                    unsafe {
                        super::output_tile::<$vector>(src, point_stride, dst, row, pixel, extent)
                    }
                }
            }
        };
    }

    width!(avx2, __m256, "avx2,fma");
    width!(avx512, __m512, "avx512f,avx2,fma");
}

/// Runs `f(c0, wide)` on every vector of `channels` (a multiple of 8): 16 channels at a time
/// (`wide`) where the level in force is AVX-512, else 8.
#[inline(always)]
fn for_each_vector(channels: usize, mut f: impl FnMut(usize, bool)) {
    let wide = SimdLevel::current() == SimdLevel::Avx512;
    let mut c0 = 0;
    while c0 < channels {
        let take_wide = wide && c0 + transforms::avx512::LANES <= channels;
        f(c0, take_wide);
        c0 += if take_wide {
            transforms::avx512::LANES
        } else {
            transforms::avx2::LANES
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::conv::Padding2d;
    use crate::backend::cpu::kernels::epilogue::NoEpilogue;
    use rand::{Rng, SeedableRng};

    fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    /// Calls `f(x index, w index, y index)` for every product of the convolution `g`.
    fn for_each_product(g: &Conv2dGeometry, mut f: impl FnMut(usize, usize, usize)) {
        let [oh_len, ow_len] = g.out_hw();
        let [h, wd] = g.in_hw;
        let (c, o) = (g.in_channels, g.out_channels);
        for n in 0..g.batch {
            for oh in 0..oh_len {
                for ow in 0..ow_len {
                    for kh in 0..3 {
                        for kw in 0..3 {
                            let ih = (oh + kh) as isize - g.padding.top as isize;
                            let iw = (ow + kw) as isize - g.padding.left as isize;
                            if ih < 0 || iw < 0 || ih >= h as isize || iw >= wd as isize {
                                continue;
                            }
                            let xi = ((n * h + ih as usize) * wd + iw as usize) * c;
                            let yi = ((n * oh_len + oh) * ow_len + ow) * o;
                            for ci in 0..c {
                                for k in 0..o {
                                    f(xi + ci, ((kh * 3 + kw) * c + ci) * o + k, yi + k);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The forward convolution in f64, by its definition.
    fn reference(g: &Conv2dGeometry, x: &[f32], w: &[f32]) -> Vec<f64> {
        let mut y = vec![0.0; g.output_len()];
        for_each_product(g, |xi, wi, yi| y[yi] += f64::from(x[xi]) * f64::from(w[wi]));
        y
    }

    /// The input and filter gradients in f64, by their definitions.
    fn reference_gradients(
        g: &Conv2dGeometry,
        x: &[f32],
        w: &[f32],
        dy: &[f32],
    ) -> (Vec<f64>, Vec<f64>) {
        let (mut dx, mut dw) = (vec![0.0; g.input_len()], vec![0.0; g.filter_len()]);
        for_each_product(g, |xi, wi, yi| {
            dx[xi] += f64::from(dy[yi]) * f64::from(w[wi]);
            dw[wi] += f64::from(dy[yi]) * f64::from(x[xi]);
        });
        (dx, dw)
    }

    /// The automatic choice takes Winograd on ResNet-20's and ResNet-50's mid-sized layers,
    /// not where the measured limits say it loses (8 channels, 224×224 images, 512×512
    /// filters).
    #[test]
    fn winograd_pays_off_within_the_measured_limits() {
        let layer = |hw: usize, c: usize, o: usize| Conv2dGeometry {
            padding: Padding2d::uniform(1),
            ..Conv2dGeometry::new(8, [hw, hw], c, o, [3, 3])
        };
        for (hw, c, o) in [
            (32, 16, 16),
            (16, 32, 32),
            (8, 64, 64),
            (56, 64, 64),
            (14, 256, 256),
        ] {
            assert!(pays_off(&layer(hw, c, o)), "{hw}×{hw}×{c}→{o}");
        }
        for (hw, c, o) in [(32, 8, 16), (224, 64, 64), (7, 512, 512)] {
            assert!(!pays_off(&layer(hw, c, o)), "{hw}×{hw}×{c}→{o}");
        }
    }

    /// A tensor served as a computed input, row by row.
    struct Served<'a>(&'a [f32]);

    impl crate::backend::cpu::kernels::ComputeInput for Served<'_> {
        fn compute(&self, start: usize, out: &mut [f32]) {
            out.copy_from_slice(&self.0[start..start + out.len()]);
        }
    }

    /// A computed input (a prologue), computed and copied into the padded buffer row by row,
    /// gives the bits of the tensor itself: Winograd's forward and filter gradient, and the
    /// direct kernels', which pad the same way.
    #[test]
    fn computed_inputs_give_the_bits_of_the_tensor() {
        use crate::backend::cpu::kernels::conv::direct;
        if SimdLevel::current() < SimdLevel::Avx2 {
            return;
        }
        let g = Conv2dGeometry {
            padding: Padding2d {
                top: 2,
                bottom: 0,
                left: 1,
                right: 2,
            },
            ..Conv2dGeometry::new(3, [9, 7], 16, 24, [3, 3])
        };
        let (x, w, dy) = (
            random(g.input_len(), 1),
            random(g.filter_len(), 2),
            random(g.output_len(), 3),
        );
        let served = Served(&x);
        let computed = ConvInput::Computed {
            len: x.len(),
            compute: &served,
        };
        let passes = |x: ConvInput<'_>| {
            let mut y = [vec![0.0; g.output_len()], vec![0.0; g.output_len()]];
            let mut dw = [vec![0.0; g.filter_len()], vec![0.0; g.filter_len()]];
            forward(&g, x, &w, &mut y[0], &NoEpilogue).unwrap();
            backward_filter(&g, x, &dy, &mut dw[0]).unwrap();
            direct::forward(&g, x, &w, &mut y[1], &NoEpilogue, None).unwrap();
            direct::backward_filter(&g, x, &dy, &mut dw[1], None).unwrap();
            (y, dw)
        };
        assert!(passes(ConvInput::Tensor(&x)) == passes(computed));
    }

    /// Winograd's three passes against f64 references on ResNet-20's stride-1 shapes (a few
    /// images), next to the direct kernels': the error bound of the module docs.
    #[test]
    fn winograd_matches_the_direct_kernels_on_resnet_shapes() {
        use crate::backend::cpu::kernels::conv::direct;
        if SimdLevel::current() < SimdLevel::Avx2 {
            return;
        }
        for (seed, (hw, ch)) in [(32, 16), (16, 32), (8, 64)].into_iter().enumerate() {
            let g = Conv2dGeometry {
                padding: Padding2d::uniform(1),
                ..Conv2dGeometry::new(4, [hw, hw], ch, ch, [3, 3])
            };
            let seed = 10 * seed as u64;
            let (x, w, dy) = (
                random(g.input_len(), seed),
                random(g.filter_len(), seed + 1),
                random(g.output_len(), seed + 2),
            );
            let want_y = reference(&g, &x, &w);
            let (want_dx, want_dw) = reference_gradients(&g, &x, &w, &dy);
            let out_hw = g.out_hw();
            let mut y = vec![f32::NAN; g.output_len()];
            let mut dx = vec![f32::NAN; g.input_len()];
            let mut dw = vec![f32::NAN; g.filter_len()];
            forward(&g, ConvInput::Tensor(&x), &w, &mut y, &NoEpilogue).unwrap();
            backward_input(&g, out_hw, &dy, &w, &mut dx, &NoEpilogue).unwrap();
            backward_filter(&g, ConvInput::Tensor(&x), &dy, &mut dw).unwrap();
            let winograd = [
                relative_error(&y, &want_y),
                relative_error(&dx, &want_dx),
                relative_error(&dw, &want_dw),
            ];
            direct::forward(&g, ConvInput::Tensor(&x), &w, &mut y, &NoEpilogue, None).unwrap();
            direct::backward_filter(&g, ConvInput::Tensor(&x), &dy, &mut dw, None).unwrap();
            let direct = [relative_error(&y, &want_y), relative_error(&dw, &want_dw)];
            eprintln!(
                "{hw}x{hw}x{ch}: Winograd y {:.1e} dx {:.1e} dw {:.1e}; direct y {:.1e} dw {:.1e}",
                winograd[0], winograd[1], winograd[2], direct[0], direct[1]
            );
            for err in winograd {
                assert!(err < 2e-5, "{g:?}: Winograd errors {winograd:?}");
            }
        }
    }

    /// Largest difference from the reference, relative to the reference's largest magnitude.
    fn relative_error(got: &[f32], want: &[f64]) -> f64 {
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
        got.iter()
            .zip(want)
            .map(|(g, w)| (f64::from(*g) - w).abs())
            .fold(0.0, f64::max)
            / scale
    }

    #[test]
    fn forward_matches_the_definition_on_edge_tiles_and_uneven_padding() {
        if SimdLevel::current() < SimdLevel::Avx2 {
            return;
        }
        // Outputs that are not whole tiles (7×5, 3×9), asymmetric padding, 8 and 24 channels.
        let cases = [
            ([7, 5], Padding2d::uniform(1), 8, 16),
            (
                [5, 11],
                Padding2d {
                    top: 0,
                    bottom: 2,
                    left: 2,
                    right: 0,
                },
                24,
                8,
            ),
            ([4, 4], Padding2d::default(), 16, 24),
        ];
        for (seed, (in_hw, padding, c, o)) in cases.into_iter().enumerate() {
            let g = Conv2dGeometry {
                padding,
                ..Conv2dGeometry::new(3, in_hw, c, o, [3, 3])
            };
            let x = random(g.input_len(), seed as u64);
            let w = random(g.filter_len(), 100 + seed as u64);
            let mut y = vec![f32::NAN; g.output_len()];
            forward(&g, ConvInput::Tensor(&x), &w, &mut y, &NoEpilogue).unwrap();
            let err = relative_error(&y, &reference(&g, &x, &w));
            eprintln!("{in_hw:?} {c}->{o}: relative error {err:e}");
            assert!(err < 1e-5, "{g:?}: relative error {err:e}");
        }
    }

    #[test]
    fn every_level_gives_the_same_bits() {
        let levels: Vec<SimdLevel> = SimdLevel::available()
            .into_iter()
            .filter(|&l| l >= SimdLevel::Avx2)
            .collect();
        let g = Conv2dGeometry {
            padding: Padding2d::uniform(1),
            ..Conv2dGeometry::new(2, [9, 10], 16, 32, [3, 3])
        };
        let x = random(g.input_len(), 7);
        let w = random(g.filter_len(), 8);
        let outputs: Vec<Vec<f32>> = levels
            .iter()
            .map(|level| {
                level.run(|| {
                    let mut y = vec![0.0; g.output_len()];
                    forward(&g, ConvInput::Tensor(&x), &w, &mut y, &NoEpilogue).unwrap();
                    y
                })
            })
            .collect();
        for (level, y) in levels.iter().zip(&outputs).skip(1) {
            assert!(y == &outputs[0], "{level} differs from {}", levels[0]);
        }
    }
}
