//! The forward convolution and the stride-1 input gradient on AMX tiles: an implicit GEMM per
//! image, panels of 64 output pixels' windows times the packed filter (see the parent module).
//!
//! Stride-1 convolutions whose window rows are whole 16- or 32-deep steps (`KW·C` a multiple of
//! 16: every 3×3 layer of 16 channels or more) read their windows *in place*: the left tile of
//! 16 pixels is the padded image itself, rows `C` values apart (a window starts `C` values
//! after its left neighbour's), so nothing is gathered. Pixels are then counted along the
//! padded rows ("virtual" pixels `oh·Wp + ow`, whose window starts at `(oh·Wp + ow)·C`): the
//! `Wp − OW` of each row past the output are computed and dropped as the panel's products are
//! copied to the output. Other geometries gather each panel's windows first.

use std::arch::asm;

use super::{
    BUFFERS, Buffers, K_STEP, N_BLOCK, PANEL_ROWS, TILE_ROWS, Tiles, bf16_bits, check_supported,
    gather_windows, pad_image_bf16,
};
use crate::backend::cpu::kernels::KernelError;
use crate::backend::cpu::kernels::conv::direct::padded_hw;
use crate::backend::cpu::kernels::conv::direct::{pixel_origins, segments};
use crate::backend::cpu::kernels::conv::tiles::Segment;
use crate::backend::cpu::kernels::conv::transpose::flip_filter;
use crate::backend::cpu::kernels::conv::{Conv2dGeometry, ConvInput, ConvPass, check_operands};
use crate::backend::cpu::kernels::epilogue::Epilogue;
use crate::backend::cpu::kernels::parallel::{for_each_row_block, rows_target, worth_parallel};

/// `y = epilogue(conv2d(bf16(x), bf16(w)))` on AMX tiles, f32 accumulation (layouts as
/// [`crate::backend::cpu::kernels::conv2d_forward`]). An error where [`super::unsupported`] says why not.
pub fn forward(
    g: &Conv2dGeometry,
    x: ConvInput<'_>,
    w: &[f32],
    y: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_forward_bf16", g, x.len(), w.len(), y.len())?;
    check_supported("conv2d_forward_bf16", g, ConvPass::Forward)?;
    let k_len = g.kernel_hw[0] * g.kernel_hw[1] * g.in_channels;
    let o = g.out_channels;
    let windows = Windows::of(g);
    let filter = PackedB::new(k_len, o, windows.k_step(), |k, n| w[k * o + n]);
    convolve(g, out_hw, x, &filter, &windows, y, epilogue)
}

/// The input gradient of the stride-1 convolution `g` (its output `out_hw`; operands checked)
/// whose `transpose::transposed_geometry` is `t`: the forward convolution of `dy` with the flipped
/// filter.
pub(super) fn backward_input_stride1(
    g: &Conv2dGeometry,
    t: &Conv2dGeometry,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let flipped = flip_filter(g, w);
    let k_len = t.kernel_hw[0] * t.kernel_hw[1] * t.in_channels;
    let c = t.out_channels;
    let windows = Windows::of(t);
    let filter = PackedB::new(k_len, c, windows.k_step(), |k, n| flipped[k * c + n]);
    let t_out = t.validate()?;
    convolve(
        t,
        t_out,
        ConvInput::Tensor(dy),
        &filter,
        &windows,
        dx,
        epilogue,
    )
}

/// The forward convolution `g` of `x` by the packed filter, one image per task.
fn convolve(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    x: ConvInput<'_>,
    filter: &PackedB,
    windows: &Windows,
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
    let origins = match windows {
        Windows::Gathered { .. } => pixel_origins(g, out_hw),
        Windows::InPlace { .. } => Vec::new(),
    };
    let parallel = worth_parallel(2 * g.macs()) && g.batch > 1;
    // An epilogue that stores the rows itself (a bf16 output) gets each image from this
    // thread's scratch, in cache, instead of from `y`.
    let elsewhere = epilogue.stores_elsewhere();
    for_each_row_block(y, o, out_rows, parallel, |y_image, first_row, scratch| {
        let n = first_row / out_rows;
        let y_image = rows_target(y_image, scratch, elsewhere);
        BUFFERS.with_borrow_mut(|b| {
            let Buffers {
                padded,
                padded_for,
                panel,
                panel_for,
                products,
                ..
            } = b;
            x.with_image(n * image_len..(n + 1) * image_len, |image| {
                pad_image_bf16(g, image, padded, padded_for);
            });
            match windows {
                Windows::Gathered { segs } => {
                    // SAFETY: `convolve` runs only where `unsupported` found AMX available.
                    let tiles = unsafe { Tiles::configure() };
                    let buffers = (panel, panel_for, products);
                    image_gemm(&tiles, segs, &origins, padded, filter, buffers, y_image, o);
                }
                Windows::InPlace { k_step, offsets } => {
                    // SAFETY: as above; the step is 16 or 32 (`Windows::of`).
                    let tiles = unsafe { Tiles::configure_for(*k_step) };
                    let plan = InPlace {
                        c,
                        wp: padded_hw(g)[1],
                        out_hw,
                        offsets,
                    };
                    plan.image_gemm(&tiles, padded, filter, products, y_image);
                }
            }
        });
        if !epilogue.is_identity() {
            epilogue.apply(y_image, first_row, o);
        }
        Ok(())
    })
}

/// The right-hand operand `B[k][n]` (`k_len × n_len`) rounded to bf16 in the layout
/// `tdpbf16ps` reads: for each `k_step`-deep step of `k` (32, or 16) and each block of 16
/// columns, a tile of `k_step / 2` rows whose row `r` holds the pairs `(B[2r][n],
/// B[2r + 1][n])` for its 16 columns; zero past `k_len` and `n_len`.
pub(super) struct PackedB {
    data: Vec<u16>,
    steps: usize,
    blocks: usize,
    k_step: usize,
}

impl PackedB {
    pub(super) fn new(
        k_len: usize,
        n_len: usize,
        k_step: usize,
        value: impl Fn(usize, usize) -> f32,
    ) -> PackedB {
        let (steps, blocks) = (k_len.div_ceil(k_step), n_len.div_ceil(N_BLOCK));
        let tile_values = k_step * N_BLOCK;
        let mut data = vec![0; steps * blocks * tile_values];
        for k in 0..k_len {
            let (step, depth) = (k / k_step, k % k_step);
            for n in 0..n_len {
                let (block, col) = (n / N_BLOCK, n % N_BLOCK);
                let tile = (step * blocks + block) * tile_values;
                data[tile + (depth / 2) * 2 * N_BLOCK + col * 2 + depth % 2] =
                    bf16_bits(value(k, n));
            }
        }
        PackedB {
            data,
            steps,
            blocks,
            k_step,
        }
    }

    /// The reduction length the tiles cover (a multiple of the step).
    fn k_padded(&self) -> usize {
        self.steps * self.k_step
    }

    /// The columns the tiles cover (a multiple of 16).
    fn n_padded(&self) -> usize {
        self.blocks * N_BLOCK
    }

    /// The tile of step `step`, column block `block`.
    fn tile(&self, step: usize, block: usize) -> *const u16 {
        self.data[(step * self.blocks + block) * self.k_step * N_BLOCK..].as_ptr()
    }
}

/// How a convolution's left tiles are read: gathered into panels (32-deep steps), or in place
/// from the padded image (stride 1, window rows of whole steps: see the module doc).
enum Windows {
    /// Gathered run by run: the window's runs of the padded image (`direct::segments`).
    Gathered { segs: Vec<Segment> },
    InPlace {
        k_step: usize,
        /// Per step, where its values start past a window's origin (bf16 elements).
        offsets: Vec<usize>,
    },
}

impl Windows {
    /// In place where it can be and costs at most a quarter more tile work than gathering:
    /// counted along the padded rows, an image of `OH × OW` pixels spans `(OH − 1)·Wp + OW`
    /// (17 panels of 64 instead of 16 at 32×32, 5 instead of 4 at 16×16: faster, the gathers
    /// cost more; 2 instead of 1 at 8×8: slower, measured with `cargo bench --bench
    /// cpu_kernels -- conv-algos`).
    fn of(g: &Conv2dGeometry) -> Windows {
        let segs = segments(g);
        let [oh, ow] = g.out_hw();
        let [_, wp] = padded_hw(g);
        let spanned = (oh.max(1) - 1) * wp + ow;
        let cheap = 4 * spanned.div_ceil(PANEL_ROWS) <= 5 * (oh * ow).div_ceil(PANEL_ROWS);
        let contiguous = segs
            .iter()
            .scan(0, |k, s| {
                let next = s.k0 == *k;
                *k += s.len;
                Some(next)
            })
            .all(|next| next);
        let step = [K_STEP, K_STEP / 2]
            .into_iter()
            .find(|&step| segs.iter().all(|s| s.len.is_multiple_of(step)));
        match step {
            Some(k_step) if g.strides == [1, 1] && contiguous && cheap && !segs.is_empty() => {
                Windows::InPlace {
                    k_step,
                    offsets: segs
                        .iter()
                        .flat_map(|s| (0..s.len / k_step).map(move |i| s.a_off + i * k_step))
                        .collect(),
                }
            }
            _ => Windows::Gathered { segs },
        }
    }

    fn k_step(&self) -> usize {
        match self {
            Windows::Gathered { .. } => K_STEP,
            Windows::InPlace { k_step, .. } => *k_step,
        }
    }
}

/// Where a panel's left tiles are: row `r` (a pixel) at step `s` starts at
/// `rows + r·row_stride + offsets[s]` (bf16 elements).
#[derive(Clone, Copy)]
struct Left<'a> {
    rows: *const u16,
    row_stride: usize,
    offsets: &'a [usize],
}

impl Left<'_> {
    /// The rows from `first` on.
    fn rows_after(self, first: usize) -> Self {
        Left {
            // Only ever dereferenced by the tile loads, inside the caller's bounds.
            rows: self.rows.wrapping_add(first * self.row_stride),
            ..self
        }
    }
}

/// `y[p][n] = Σ_seg Σ_j padded[origins[p] + seg.a_off + j] · B[seg.k0 + j][n]` for the pixels
/// of one image, 64 at a time. Whole panels of an output whose width is a multiple of 16 are
/// stored by the tiles straight into `y`; others go through `products`.
#[allow(clippy::too_many_arguments)]
pub(super) fn image_gemm(
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
    let offsets: Vec<usize> = (0..filter.steps).map(|s| s * K_STEP).collect();
    let left = Left {
        rows: panel.as_ptr(),
        row_stride: kp,
        offsets: &offsets,
    };
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
            // SAFETY: the panel's 64 rows of `kp` (the steps cover `kp`) and 64 rows of `o`
            // inside `y` (asserted above: a whole panel of pixels).
            unsafe { multiply_panel(tiles, left, filter, y_panel.as_mut_ptr(), o) };
        } else {
            // SAFETY: the panel as above; `products` holds 64 rows of `np`.
            unsafe { multiply_panel(tiles, left, filter, products.as_mut_ptr(), np) };
            for (r, y_row) in y_panel.chunks_exact_mut(o).take(pixels.len()).enumerate() {
                y_row.copy_from_slice(&products[r * np..r * np + o]);
            }
        }
    }
}

/// A stride-1 convolution of one image whose windows are read in place (see the module doc):
/// a padded image of `c` channels, rows `wp` pixels wide, whose window of output pixel `(i, j)`
/// (of `out_hw`) starts at `(i·wp + j)·c` and whose steps start `offsets` past that.
pub(super) struct InPlace<'a> {
    pub(super) c: usize,
    pub(super) wp: usize,
    pub(super) out_hw: [usize; 2],
    pub(super) offsets: &'a [usize],
}

impl InPlace<'_> {
    /// `y` (the image's output rows) from the padded image, 64 virtual pixels at a time. The
    /// padded buffer grows by zeros where the last panel's tiles read past the image.
    pub(super) fn image_gemm(
        &self,
        tiles: &Tiles,
        padded: &mut Vec<u16>,
        filter: &PackedB,
        products: &mut Vec<f32>,
        y: &mut [f32],
    ) {
        let (c, wp) = (self.c, self.wp);
        let [oh, ow] = self.out_hw;
        let o = y.len() / (oh * ow);
        let np = filter.n_padded();
        // Through the last output pixel, in pixels along the padded rows.
        let virtual_len = (oh - 1) * wp + ow;
        let panels = virtual_len.div_ceil(PANEL_ROWS);
        let reach = self.offsets.iter().max().map_or(0, |&m| m + filter.k_step);
        let need = (panels * PANEL_ROWS - 1) * c + reach;
        if padded.len() < need {
            padded.resize(need, 0);
        }
        assert!(
            self.offsets.len() == filter.steps && wp >= ow && o <= np && y.len() == oh * ow * o,
            "tile convolution out of bounds"
        );
        products.resize(PANEL_ROWS * np, 0.0);
        for panel in 0..panels {
            let first = panel * PANEL_ROWS;
            let left = Left {
                rows: padded.as_ptr(),
                row_stride: c,
                offsets: self.offsets,
            }
            .rows_after(first);
            // SAFETY: row `first + r < panels · 64` at any step reads `k_step` values from
            // `(first + r)·c + offset < need <= padded.len()` on; `products` holds 64 rows of
            // `np`.
            unsafe { multiply_panel(tiles, left, filter, products.as_mut_ptr(), np) };
            // The panel's pixels inside the output, run by run along an output row: one copy
            // per run where the products' rows are as wide as the output's.
            let mut r = 0;
            while r < PANEL_ROWS && first + r < virtual_len {
                let p = first + r;
                let (row_of, col) = (p / wp, p % wp);
                if col >= ow {
                    // Past the output row: on to the next one.
                    r += wp - col;
                    continue;
                }
                let run = (ow - col).min(PANEL_ROWS - r).min(virtual_len - p);
                let at = (row_of * ow + col) * o;
                if np == o {
                    y[at..at + run * o].copy_from_slice(&products[r * np..(r + run) * np]);
                } else {
                    let rows = products[r * np..].chunks(np).take(run);
                    for (dst, src) in y[at..at + run * o].chunks_exact_mut(o).zip(rows) {
                        dst.copy_from_slice(&src[..o]);
                    }
                }
                r += run;
            }
        }
    }
}

/// `c[r][n] = Σ_s Σ_j left(r, s)[j] · B[s·k_step + j][n]` for the panel's 64 rows and every
/// column block of `filter`: pairs of blocks as two 32-row halves of 2 × 2 accumulator tiles, a
/// last odd block as 4 × 1 (64 rows). Four independent accumulators keep the tile unit busy:
/// one `tdpbf16ps` takes several times its issue interval to complete.
///
/// # Safety
/// Tiles are configured for `filter.k_step`; `left` has one offset per step and its 64 rows
/// are readable for `k_step` values at every offset; `c` is writable for 64 rows of
/// `ldc >= filter.n_padded()` f32 (`ldc` apart).
unsafe fn multiply_panel(tiles: &Tiles, left: Left<'_>, filter: &PackedB, c: *mut f32, ldc: usize) {
    assert!(
        left.offsets.len() == filter.steps && ldc >= filter.n_padded(),
        "tile panel out of bounds"
    );
    let mut block = 0;
    while block + 1 < filter.blocks {
        for half in 0..2 {
            let rows = half * 2 * TILE_ROWS;
            // SAFETY: rows `rows..rows + 32` of the panel and of `c` (the contract).
            unsafe {
                two_by_two(
                    tiles,
                    left.rows_after(rows),
                    filter,
                    block,
                    c.add(rows * ldc),
                    ldc,
                )
            };
        }
        block += 2;
    }
    if block < filter.blocks {
        // SAFETY: the 64 rows of the panel and of `c` (the contract).
        unsafe { four_by_one(tiles, left, filter, block, c, ldc) };
    }
}

/// 32 rows × column blocks `block` and `block + 1`: accumulators 0 (rows 0–15, `block`),
/// 1 (0–15, `block + 1`), 2 (16–31, `block`), 3 (16–31, `block + 1`).
///
/// # Safety
/// As [`multiply_panel`]'s, for 32 rows; `block + 1 < filter.blocks`.
unsafe fn two_by_two(
    _tiles: &Tiles,
    left: Left<'_>,
    filter: &PackedB,
    block: usize,
    c: *mut f32,
    ldc: usize,
) {
    let (a_stride, b_stride, c_stride) = (2 * left.row_stride, 4 * N_BLOCK, 4 * ldc);
    let low = left.rows_after(TILE_ROWS).rows;
    // SAFETY (whole block): every tile lies in the regions of the contract.
    unsafe {
        let c_low = c.add(TILE_ROWS * ldc);
        tile_zero!(0);
        tile_zero!(1);
        tile_zero!(2);
        tile_zero!(3);
        for (step, &offset) in left.offsets.iter().enumerate() {
            tile_load!(4, left.rows.add(offset), a_stride);
            tile_load!(6, filter.tile(step, block), b_stride);
            tile_dot!(0, 4, 6);
            tile_load!(7, filter.tile(step, block + 1), b_stride);
            tile_dot!(1, 4, 7);
            tile_load!(5, low.add(offset), a_stride);
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
/// As [`multiply_panel`]'s; `block < filter.blocks`.
unsafe fn four_by_one(
    _tiles: &Tiles,
    left: Left<'_>,
    filter: &PackedB,
    block: usize,
    c: *mut f32,
    ldc: usize,
) {
    let (a_stride, b_stride, c_stride) = (2 * left.row_stride, 4 * N_BLOCK, 4 * ldc);
    let quarter = TILE_ROWS * left.row_stride;
    // SAFETY (whole block): every tile lies in the regions of the contract.
    unsafe {
        tile_zero!(0);
        tile_zero!(1);
        tile_zero!(2);
        tile_zero!(3);
        for (step, &offset) in left.offsets.iter().enumerate() {
            let a_step = left.rows.add(offset);
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
