//! The register-tile drivers of the direct convolution, generic over the microkernels of one
//! instruction set ([`TileKernels`], implemented by `avx512::Avx512` and `avx2::Avx2`): they
//! split the output pixels (or the reduction indices) into tiles and the output channels into
//! chunks of vectors, check every bound once per call, and run the microkernel of each tile
//! shape. Every output sums its products in the same order whatever the tile shape or the
//! instruction set (one FMA chain per output element, segments and taps in order), so the
//! AVX-512 and AVX2 paths give bit-identical results.

use crate::backend::cpu::kernels::round::copy_rows;
use crate::backend::cpu::kernels::simd::SimdLevel;
use crate::lower::HalfFormat;

/// One contiguous run of the reduction: for `j in 0..len`, the input value `a_off + j` elements
/// past a pixel's window origin multiplies filter row `k0 + j` (a row holds the output channels).
#[derive(Clone, Copy, Debug)]
pub(super) struct Segment {
    pub a_off: usize,
    pub k0: usize,
    pub len: usize,
}

/// The microkernels of one instruction set.
///
/// A tile is `R` rows (pixels, or reduction indices for the filter gradient) × `V` vectors of
/// `LANES` output channels, accumulated in registers: `R·V` accumulators plus `V` operand
/// vectors and a broadcast must fit the register file.
pub(super) trait TileKernels {
    /// The SIMD level the microkernels are compiled for.
    const LEVEL: SimdLevel;
    /// `f32` lanes of one vector.
    const LANES: usize;
    /// Most vectors of a pixel tile (forward and input gradient).
    const PIXEL_MAX_V: usize;
    /// Most vectors of a filter-gradient tile.
    const FILTER_MAX_V: usize;
    /// Whether the microkernels load whole vectors from filter rows (forward, input gradient)
    /// and `dy` rows (filter gradient): those rows must then be padded to a multiple of
    /// `LANES` (without lane masks, a partial vector would read past a row). Output stores are
    /// always kept to the valid channels.
    const PADDED_ROWS: bool;
    /// Whatever selects the valid lanes of a chunk's vectors.
    type Masks: Copy;

    /// Most rows of a tile of `v` vectors.
    fn max_rows(v: usize) -> usize;

    /// The lane selection of a chunk whose first `width` channels are valid (of `V·LANES`).
    fn masks(width: usize) -> Self::Masks;

    /// Forward tile: `out[r·out_ps + l] = Σ_seg Σ_j a[r·ps + seg.a_off + j] ·
    /// w[(seg.k0 + j)·w_stride + l]` for `r < rows` and the lanes `l < v·LANES` enabled by
    /// `masks`.
    ///
    /// # Safety
    /// The CPU runs `LEVEL`; `(rows, v)` is a shape `max_rows` allows with `v <=
    /// PIXEL_MAX_V`; for every segment and `r < rows`, `a + r·ps + a_off + len` is inside the
    /// source; filter rows `k0..k0 + len` from `w` are readable for `v·LANES` floats (when
    /// `PADDED_ROWS`) or for the enabled lanes; `out + r·out_ps` is writable for the enabled
    /// lanes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn forward(
        rows: usize,
        v: usize,
        a: *const f32,
        ps: usize,
        segments: &[Segment],
        w: *const f32,
        w_stride: usize,
        masks: Self::Masks,
        out: *mut f32,
        out_ps: usize,
    );

    /// Filter-gradient tile: `dw[r·dw_stride + l] += Σ_p a[pixel_offsets[p] + r] ·
    /// dy[p·dy_stride + l]` for `r < rows` and the lanes enabled by `masks`.
    ///
    /// # Safety
    /// The CPU runs `LEVEL`; `(rows, v)` is a shape `max_rows` allows with `v <=
    /// FILTER_MAX_V`; every `a + pixel_offsets[p] + rows` is inside the source; `dy` rows
    /// `p < pixel_offsets.len()` are readable for `v·LANES` floats (when `PADDED_ROWS`) or for
    /// the enabled lanes; `dw + r·dw_stride` is readable and writable for the enabled lanes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn filter(
        rows: usize,
        v: usize,
        a: *const f32,
        pixel_offsets: &[usize],
        dy: *const f32,
        dy_stride: usize,
        masks: Self::Masks,
        dw: *mut f32,
        dw_stride: usize,
    );
}

/// Splits `len` rows into the fewest tiles of at most `max` rows, as even as possible (the first
/// `len % tiles` one row longer), and returns the size of the tile starting at `done`.
fn tile_rows(max: usize, len: usize, done: usize) -> usize {
    let tiles = len.div_ceil(max);
    let (base, longer) = (len / tiles, len % tiles);
    if done < longer * (base + 1) {
        base + 1
    } else {
        base
    }
}

/// Output channel chunks `(first channel, vectors)`: up to `max_v` vectors of `lanes` each.
fn channel_chunks(o: usize, lanes: usize, max_v: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..o)
        .step_by(lanes * max_v)
        .map(move |start| (start, (o - start).div_ceil(lanes).min(max_v)))
}

/// The row length `K` reads whole vectors of: `channels`, rounded up to whole vectors when
/// `K::PADDED_ROWS`.
pub(super) fn row_stride<K: TileKernels>(channels: usize) -> usize {
    if K::PADDED_ROWS {
        channels.next_multiple_of(K::LANES)
    } else {
        channels
    }
}

/// The rows of `channels` values of `data` copied to rows of `stride` (zeros after each row) in
/// `buf` and rounded to `round`'s format when there is one, or `data` itself when neither is
/// needed. `buf` keeps its zeros between the rows from call to call while the rows' shape
/// stays (one image after another), so nothing is allocated per image.
pub(super) fn with_row_stride_in<'a>(
    data: &'a [f32],
    channels: usize,
    stride: usize,
    round: Option<HalfFormat>,
    buf: &'a mut Vec<f32>,
) -> &'a [f32] {
    if channels == 0 || (stride == channels && round.is_none()) {
        return data;
    }
    let rows = data.len() / channels;
    if buf.len() != rows * stride {
        buf.clear();
        buf.resize(rows * stride, 0.0);
    }
    copy_rows(round, &data[..rows * channels], channels, buf, stride);
    buf
}

/// The furthest source element past a pixel's origin any segment reads, and the number of
/// filter rows the segments use.
fn extent(segs: &[Segment]) -> (usize, usize) {
    let reach = segs.iter().map(|s| s.a_off + s.len).max().unwrap_or(0);
    let rows = segs.iter().map(|s| s.k0 + s.len).max().unwrap_or(0);
    (reach, rows)
}

/// Computes `count` output pixels: pixel `t` reads the source from `source[t·ps..]` (plus each
/// segment's offset) and writes `channels` values at `out[t·out_ps..]`, where
/// `out[p, c] = Σ_seg Σ_j source[p·ps + a_off + j] · w[(k0 + j)·w_stride + c]`, and `w_stride`
/// is [`row_stride::<K>`] of `channels`.
///
/// Panics (a bug, not a user error) unless the CPU runs `K::LEVEL`, every read lies in `source`,
/// every filter row in `w` and every written pixel in `out`; these are checked once per call,
/// not per element.
#[allow(clippy::too_many_arguments)]
pub(super) fn tile_row<K: TileKernels>(
    source: &[f32],
    ps: usize,
    count: usize,
    segs: &[Segment],
    w: &[f32],
    w_stride: usize,
    channels: usize,
    out: &mut [f32],
    out_ps: usize,
) {
    if count == 0 || channels == 0 {
        return;
    }
    let (reach, rows) = extent(segs);
    assert!(
        w_stride == row_stride::<K>(channels)
            && (count - 1) * ps + reach <= source.len()
            && rows * w_stride <= w.len()
            && (count - 1) * out_ps + channels <= out.len(),
        "direct convolution tile out of bounds"
    );
    assert!(
        K::LEVEL <= SimdLevel::detected(),
        "{} kernels on this CPU",
        K::LEVEL
    );
    for (first, v) in channel_chunks(channels, K::LANES, K::PIXEL_MAX_V) {
        let masks = K::masks(channels - first);
        let mut t = 0;
        while t < count {
            let r = tile_rows(K::max_rows(v), count, t);
            // SAFETY: the CPU runs `K::LEVEL` (asserted above; the level in force never exceeds
            // the detected one) and the bounds were asserted above: the tile's pixels `t..t + r`
            // read below `(count - 1)·ps + reach`; filter rows below `rows` hold `w_stride`
            // values, whole vectors up to `row_stride(channels)` from the chunk's first channel
            // included; written pixels lie below `count`, lanes past `channels` masked off.
            unsafe {
                K::forward(
                    r,
                    v,
                    source.as_ptr().add(t * ps),
                    ps,
                    segs,
                    w.as_ptr().add(first),
                    w_stride,
                    masks,
                    out.as_mut_ptr().add(t * out_ps + first),
                    out_ps,
                );
            }
            t += r;
        }
    }
}

/// Adds one image's filter gradient to `dw` (`[rows, o]`): `dy_image` holds one row per entry
/// of `origins` (the window origins of the output pixels in the padded image), `dy_stride`
/// values apart, each readable for [`row_stride::<K>`] of `o` values.
///
/// Panics (a bug, not a user error) unless the CPU runs `K::LEVEL`, every read lies in `padded`
/// and `dy_image` and every filter row in `dw`; checked once per image, not per element.
pub(super) fn filter_image<K: TileKernels>(
    segs: &[Segment],
    origins: &[usize],
    padded: &[f32],
    dy_image: &[f32],
    dy_stride: usize,
    o: usize,
    dw: &mut [f32],
) {
    if o == 0 || origins.is_empty() {
        return;
    }
    let (reach, rows) = extent(segs);
    let last_origin = origins.iter().copied().max().unwrap_or(0);
    assert!(
        dy_stride >= row_stride::<K>(o)
            && last_origin + reach <= padded.len()
            && (origins.len() - 1) * dy_stride + row_stride::<K>(o) <= dy_image.len()
            && rows * o <= dw.len(),
        "direct filter-gradient tile out of bounds"
    );
    assert!(
        K::LEVEL <= SimdLevel::detected(),
        "{} kernels on this CPU",
        K::LEVEL
    );
    for (first, v) in channel_chunks(o, K::LANES, K::FILTER_MAX_V) {
        let masks = K::masks(o - first);
        for seg in segs {
            let mut j = 0;
            while j < seg.len {
                let r = tile_rows(K::max_rows(v), seg.len, j);
                // SAFETY: the CPU runs `K::LEVEL` and the bounds were asserted above: every
                // window origin plus `a_off + j + r <= a_off + len` stays below
                // `last_origin + reach`; `dy_image` holds `origins.len()` rows `dy_stride`
                // apart, each readable for whole vectors up to `row_stride(o)`; filter rows `k0 + j + r <= rows` of `o` exist, and
                // lanes past `o` are masked.
                unsafe {
                    K::filter(
                        r,
                        v,
                        padded.as_ptr().add(seg.a_off + j),
                        origins,
                        dy_image.as_ptr().add(first),
                        dy_stride,
                        masks,
                        dw.as_mut_ptr().add((seg.k0 + j) * o + first),
                        o,
                    );
                }
                j += r;
            }
        }
    }
}
