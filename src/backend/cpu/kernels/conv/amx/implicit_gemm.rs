//! The forward convolution and the stride-1 input gradient on AMX tiles: an implicit GEMM per
//! image, panels of 64 output pixels' windows times the packed filter (see the parent module).

use std::arch::asm;

use super::{
    BUFFERS, Buffers, K_STEP, N_BLOCK, PANEL_ROWS, TILE_ROWS, Tiles, bf16_bits, check_supported,
    gather_windows, pad_image_bf16,
};
use crate::backend::cpu::kernels::KernelError;
use crate::backend::cpu::kernels::conv::backward_input::{flip_filter, transposed_geometry};
use crate::backend::cpu::kernels::conv::direct::{pixel_origins, segments};
use crate::backend::cpu::kernels::conv::tiles::Segment;
use crate::backend::cpu::kernels::conv::{Conv2dGeometry, ConvPass, check_operands};
use crate::backend::cpu::kernels::epilogue::Epilogue;
use crate::backend::cpu::kernels::parallel::{for_each_row_block, worth_parallel};

/// `y = epilogue(conv2d(bf16(x), bf16(w)))` on AMX tiles, f32 accumulation (layouts as
/// [`crate::backend::cpu::kernels::conv2d_forward`]). An error where [`super::unsupported`] says why not.
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
/// [`crate::backend::cpu::kernels::conv2d_backward_input`]); stride 1 only. An error where [`super::unsupported`] says why
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
