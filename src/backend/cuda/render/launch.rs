//! Launch shapes chosen from the work and the device: how many blocks a reduction splits its
//! reduced axis into, and which GEMM tile (and split of K) a matrix product or convolution runs
//! with. Pure functions of the problem's extents and a [`Target`] (the device's multiprocessor
//! count and the least work worth a block), so a shape is the same on every run: a split
//! launch combines its partials in a fixed order, and the result is bitwise reproducible.
//!
//! The aim is that every launch with enough work fills the device: at least as many blocks as
//! the device holds resident ([`Target::resident`]) whenever the work allows blocks of at least
//! the minimum size. Blocks are [`BLOCK`](super::BLOCK) threads everywhere.

use crate::lower::Precision;

/// What the launch shapes are chosen for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Streaming multiprocessors of the device.
    pub multiprocessors: u32,
    /// The fewest reduced points each lane of a block folds when a reduction is split (a split
    /// block reads at least `lanes × min_lane_iterations` points per output).
    pub min_lane_iterations: usize,
    /// The shortest range of K one block of a split GEMM covers: two K tiles by default, so
    /// the two shared stages still overlap one tile's loads with the other's products. (It was
    /// eight tiles: a small GEMM over a K of 128 — a linear layer's weight gradient at batch
    /// 128 — then ran in one block; whether splitting pays is [`fn@gemm`]'s cost's decision.)
    pub min_split_k: usize,
    /// Forces the GEMM tile (when it fits the shared memory): tests run every tile this way.
    pub tile: Option<Tile>,
    /// Whether the device has the tensor cores the TF32 `mma.sync` needs (compute capability
    /// 8.0 or newer). Without them BF16/FP16 GEMMs run on the SIMT tiles, which round their
    /// operands as well; TF32 is refused there (`prepared.rs`).
    pub tensor_cores: bool,
    /// Whether convolutions may read their input through shared-memory windows where their
    /// launch allows ([`CudaOptions::conv_windows`]): forward and input-gradient GEMMs through
    /// `kernels/gemm_core.cuh` tp_window (the same products in the same order, so the same bits
    /// either way), filter gradients through [`filter_windows`] (other partial sums). Default:
    /// [`windows_from_environment`].
    ///
    /// [`CudaOptions::conv_windows`]: crate::backend::cuda::CudaOptions::conv_windows
    pub windows: bool,
}

/// Multiprocessors of an NVIDIA H100 SXM, the default target (the emulated device reports none,
/// so it runs the launch shapes of an H100).
pub const H100_MULTIPROCESSORS: u32 = 132;

/// Blocks of 256 threads of the reduction body resident per multiprocessor (≤ 64 registers a
/// thread: 4 blocks fit the 64 K registers of an SM; ptxas reports 14–40).
pub const REDUCE_BLOCKS_PER_SM: usize = 4;

/// The most blocks one output (tile) of a reduction, or one GEMM tile, is split across.
pub const MAX_SPLIT: usize = 1024;

/// `TP_BK` of `kernels/gemm_core.cuh`: K advances in tiles of 16.
pub const GEMM_BK: usize = 16;

/// The environment variable that turns convolution windows off by default (`0`, `off` or
/// `false`): [`Target::windows`] and `CudaOptions::conv_windows`, so that one build can be
/// measured both ways on a GPU.
pub const WINDOWS_ENV: &str = "TOWERPACK_CUDA_WINDOWS";

/// Whether [`WINDOWS_ENV`] leaves convolution windows on (read once).
pub fn windows_from_environment() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| switch_from_environment(WINDOWS_ENV) != Some(false))
}

/// A switch in environment variable `var`: `Some(true)` for `1`, `on` or `true`, `Some(false)`
/// for `0`, `off` or `false` (any case, surrounding blanks ignored), `None` otherwise or unset.
pub fn switch_from_environment(var: &str) -> Option<bool> {
    let v = std::env::var(var).ok()?;
    let v = v.trim();
    let is = |words: [&str; 3]| words.iter().any(|w| v.eq_ignore_ascii_case(w));
    if is(["1", "on", "true"]) {
        Some(true)
    } else if is(["0", "off", "false"]) {
        Some(false)
    } else {
        None
    }
}

impl Default for Target {
    fn default() -> Target {
        Target::with_multiprocessors(H100_MULTIPROCESSORS)
    }
}

impl Target {
    /// The default thresholds on a device with `multiprocessors` SMs (at least 1).
    pub fn with_multiprocessors(multiprocessors: u32) -> Target {
        Target {
            multiprocessors: multiprocessors.max(1),
            min_lane_iterations: 8,
            min_split_k: 2 * GEMM_BK,
            tile: None,
            tensor_cores: true,
            windows: windows_from_environment(),
        }
    }

    /// Blocks the device holds at once when `per_sm` fit on each multiprocessor.
    pub fn resident(&self, per_sm: usize) -> usize {
        self.multiprocessors as usize * per_sm.max(1)
    }
}

/// A reduced extent cut into `parts` consecutive chunks of `chunk` (the last may be shorter,
/// none is empty). `parts == 1` is no split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Split {
    pub parts: usize,
    pub chunk: usize,
}

impl Split {
    /// No split: one chunk of `len`.
    pub fn whole(len: usize) -> Split {
        Split {
            parts: 1,
            chunk: len,
        }
    }
}

/// Splits an extent of `len` for `blocks` independent blocks so that together they reach
/// `want` blocks, each chunk at least `min_len` long and a multiple of `granule`.
pub fn split(blocks: usize, len: usize, granule: usize, min_len: usize, want: usize) -> Split {
    let granule = granule.max(1);
    let min_len = min_len.max(granule);
    let by_work = len / min_len;
    let by_device = want.div_ceil(blocks.max(1));
    let parts = by_work.min(by_device).clamp(1, MAX_SPLIT);
    if parts == 1 {
        return Split::whole(len);
    }
    let chunk = len.div_ceil(parts).next_multiple_of(granule);
    Split {
        parts: len.div_ceil(chunk),
        chunk,
    }
}

/// The split of a reduction whose `out_tiles` blocks each fold `red_len` points with `lanes`
/// lanes per output: enough blocks to fill the device, but no more than about `√red_len` per
/// output tile. A lane of a split block folds `red_len / (parts · lanes)` points, and the last
/// block's lane then adds `parts / lanes` partials — both chains of loads in flight a few at a
/// time, so their sum is least when the two are equal.
pub fn reduce_split(out_tiles: usize, red_len: usize, lanes: usize, target: &Target) -> Split {
    let balanced = out_tiles.saturating_mul(red_len.isqrt().max(1));
    split(
        out_tiles,
        red_len,
        1,
        lanes * target.min_lane_iterations,
        target.resident(REDUCE_BLOCKS_PER_SM).min(balanced),
    )
}

/// How a reduction of `shape` over `axes` runs (`kernels/reduce.cu`): `tile` consecutive outputs
/// per block, each folded by `lanes` lanes; `out_tiles` such tiles, each split along the reduced
/// axis into `split.parts` blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReduceLaunch {
    pub out_len: usize,
    pub red_len: usize,
    pub tile: usize,
    pub lanes: usize,
    pub out_tiles: usize,
    pub split: Split,
}

/// The launch shape of a reduction of `shape` over `axes` on `target`. Outputs lie side by side
/// in a block when the innermost moving axis is kept (coalesced reads), else one output per
/// block with every lane on its reduced points.
pub fn reduce_launch(shape: &[usize], axes: &[usize], target: &Target) -> ReduceLaunch {
    let out_len: usize = (0..shape.len())
        .filter(|d| !axes.contains(d))
        .map(|d| shape[d])
        .product();
    let red_len: usize = (0..shape.len())
        .filter(|d| axes.contains(d))
        .map(|d| shape[d])
        .product();
    let innermost_kept = (0..shape.len())
        .rev()
        .find(|&d| shape[d] > 1)
        .is_some_and(|d| !axes.contains(&d));
    let tile = if innermost_kept {
        out_len.next_power_of_two().min(32)
    } else {
        1
    };
    let lanes = super::BLOCK as usize / tile;
    let out_tiles = out_len.div_ceil(tile);
    ReduceLaunch {
        out_len,
        red_len,
        tile,
        lanes,
        out_tiles,
        split: reduce_split(out_tiles, red_len, lanes, target),
    }
}

/// A GEMM tile: `bm × bn` outputs per block of 256 threads, `tm × tn` per thread (threads laid
/// out `bn / tn` across and `bm / tm` down).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub bm: usize,
    pub bn: usize,
    pub tm: usize,
    pub tn: usize,
}

const fn tile(bm: usize, bn: usize, tm: usize, tn: usize) -> Tile {
    Tile { bm, bn, tm, tn }
}

/// The tiles `kernels/gemm_core.cuh` is instantiated with (each has 256 threads).
pub const TILES: [Tile; 13] = [
    tile(256, 16, 4, 4),
    tile(128, 16, 2, 4),
    tile(128, 32, 4, 4),
    tile(64, 64, 4, 4),
    tile(128, 64, 8, 4),
    tile(64, 128, 4, 8),
    tile(64, 32, 4, 2),
    tile(32, 64, 2, 4),
    tile(64, 16, 4, 1),
    tile(16, 64, 1, 4),
    tile(32, 32, 2, 2),
    tile(32, 16, 2, 1),
    tile(16, 16, 1, 1),
];

impl Tile {
    /// Threads across the tile's columns.
    pub fn threads_x(&self) -> usize {
        self.bn / self.tn
    }

    /// Fraction of the FP32 peak the inner loop can reach: it issues `tm·tn` FMAs per `tm + tn`
    /// shared-memory words, and an SM loads 32 words per 128 FMAs.
    pub fn efficiency(&self) -> f64 {
        let (tm, tn) = (self.tm as f64, self.tn as f64);
        (tm * tn / (tm + tn) / 4.0).min(1.0)
    }

    /// The `minBlocksPerMultiprocessor` of the kernel's `__launch_bounds__` (`TP_MIN_BLOCKS`,
    /// 0 for none): 16 accumulators get 4 (≤ 64 registers: with loaders that find a K tile's
    /// addresses once per tile, ptxas 12.9 fits every ResNet-20 and MNIST GEMM body into 64
    /// registers for sm_90 without spilling, where a bound of 2 let it take 89–106 and halved
    /// the blocks an SM holds), 32 get 1 (≤ 255); smaller register blocks keep ptxas's choice
    /// (≤ 64 registers).
    pub fn min_blocks(&self) -> usize {
        match self.tm * self.tn {
            0..=8 => 0,
            9..=16 => 4,
            _ => 1,
        }
    }

    /// [`min_blocks`](Self::min_blocks) of the tensor-core variants (TF32, and the native
    /// BF16/FP16 one with operands rounded into 16-bit stages): as the SIMT core's, but small
    /// register blocks get 4 (≤ 64 registers) rather than ptxas's own choice, which spilled 4
    /// bytes at 32 registers for the split 32×32 tile on sm_80 (ptxas 12.9). 16 accumulators
    /// get 4 in every variant: the native 16-bit bodies took 71–72 registers and spilled 4–8
    /// bytes at 64 until the epilogue's column combine stopped keeping `blockIdx`'s values live
    /// across the K loop (`kernels/gemm_core.cuh`); now they fit 64 on sm_90 (sm_80: 3 blocks,
    /// `TP_GEMM_BOUNDS`).
    pub fn tensor_min_blocks(&self) -> usize {
        match self.min_blocks() {
            0 => 4,
            n => n,
        }
    }

    /// Blocks resident per SM, as the registers allow (64 K per SM).
    pub fn blocks_per_sm(&self) -> usize {
        match self.min_blocks() {
            0 => 3,
            n => n,
        }
    }

    /// The warp layout of the tensor-core variant (`TP_WARPS_M × TP_WARPS_N` warps over the
    /// tile, each warp a `bm/warps_m × bn/warps_n` tile of m16n8 fragments), or `None` when the
    /// tile has fewer than 8 such fragments (32×16, 16×16: no TF32 variant). Of the layouts,
    /// the one reading the fewest shared words per `mma` (`(4·mi + 2·ni) / (mi·ni)`).
    pub fn tensor_warps(&self) -> Option<(usize, usize)> {
        let warps = BLOCK_WARPS;
        [1, 2, 4, 8]
            .into_iter()
            .filter_map(|wm| {
                let (wtm, wtn) = (self.bm / wm, self.bn / (warps / wm));
                let ok = self.bm.is_multiple_of(wm)
                    && self.bn.is_multiple_of(warps / wm)
                    && wtm.is_multiple_of(16)
                    && wtn.is_multiple_of(8)
                    && wtm > 0
                    && wtn > 0;
                ok.then(|| {
                    let (mi, ni) = (wtm / 16, wtn / 8);
                    let words = (4 * mi + 2 * ni) as f64 / (mi * ni) as f64;
                    (words, (wm, warps / wm))
                })
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, layout)| layout)
    }

    /// Like [`efficiency`](Self::efficiency) for the tensor-core variant, against the same FP32
    /// peak (so it exceeds 1): an SM's tensor cores do [`TENSOR_FMA_RATIO`] times its FP32
    /// FMAs, one m16n8k8 `mma` (1024 FMAs) per clock, but each `mma` of a warp tile of
    /// `mi × ni` fragments waits for `(4·mi + 2·ni) / (mi·ni)` shared-memory wavefronts (one per
    /// clock per SM) and issues about twice as many instructions (loads and `cvt`s; 4 per clock
    /// per SM), so the slower of the three sets the pace.
    pub fn tensor_efficiency(&self) -> f64 {
        let Some((wm, wn)) = self.tensor_warps() else {
            return self.efficiency();
        };
        let (mi, ni) = ((self.bm / wm / 16) as f64, (self.bn / wn / 8) as f64);
        let words = (4.0 * mi + 2.0 * ni) / (mi * ni);
        let issue = (2.0 * (4.0 * mi + 2.0 * ni) + mi * ni) / (mi * ni) / 4.0;
        TENSOR_FMA_RATIO / words.max(issue).max(1.0)
    }

    /// Bytes of static shared memory of the tensor-core variant, at most: two f32 stages per
    /// operand (the 16-bit ones are smaller), each line-major, `edge × (BK + 4)` floats, when
    /// the operand's lines run along K, else k-major, `BK × (edge + 8)` (`kernels/gemm_core.cuh`,
    /// `tp_operand::at`; the larger of the two is counted), or, when larger, the accumulator
    /// tile they become after the K loop (`bm × (bn + 8)` floats); the flag and the epilogue
    /// reductions' sums.
    pub fn tensor_shared_bytes(&self, red_outputs: usize) -> usize {
        let stage = |edge: usize| (edge * (GEMM_BK + 4)).max(GEMM_BK * (edge + 8));
        let stages = 2 * (stage(self.bm) + stage(self.bn));
        let c = self.bm * (self.bn + 8);
        stages.max(c) * 4 + 16 + 8 * red_outputs * self.bn * 4
    }

    /// Bytes of static shared memory: two stages of `BK × (bm + 4)` and `BK × (bn + 4)` floats,
    /// the combine's flag, and with `red_outputs` per-channel epilogue reductions the warps' sums
    /// (`8 × red_outputs × bn` floats).
    pub fn shared_bytes(&self, red_outputs: usize) -> usize {
        2 * GEMM_BK * (self.bm + 4 + self.bn + 4) * 4 + 16 + 8 * red_outputs * self.bn * 4
    }
}

/// Warps in a block of [`BLOCK`](super::BLOCK) threads.
const BLOCK_WARPS: usize = super::BLOCK as usize / 32;

/// Dense TF32 tensor-core FMAs per FP32 FMA of one H100 SM per clock: 1024 against 128 (NVIDIA
/// H100 Tensor Core GPU Architecture whitepaper, table "H100 SXM5 … per SM": 1024 dense TF32
/// FMA/clock/SM vs 128 FP32; the datasheet's 495 dense TF32 TFLOP/s against 67 FP32 TFLOP/s is
/// 7.4×, its tensor figure being quoted at a lower clock). An A100 SM has the same 8:1 ratio at
/// half of each (512 : 64).
pub const TENSOR_FMA_RATIO: f64 = 8.0;

/// Static shared memory a block may declare.
pub const MAX_SHARED: usize = 48 << 10;

/// Where the arrival counters of a split launch start in its workspace: after `partial_bytes`
/// of partials.
pub fn counters_offset(partial_bytes: usize) -> usize {
    partial_bytes.next_multiple_of(256)
}

/// Bytes of workspace of the two-level combine of `kernels/split.cuh` for `slots` slots of
/// `members` partials of `len` floats in groups of `group`, and where its counters start.
pub fn combine_workspace(slots: usize, members: usize, group: usize, len: usize) -> (usize, usize) {
    let groups = members.div_ceil(group.max(1));
    let sums = if groups > 1 { groups } else { 0 };
    let counters = counters_offset(slots * (members + sums) * len * 4);
    (counters + slots * (groups + 1) * 4, counters)
}

/// How a GEMM of `m × n` outputs (`z` of them) over `k` runs: its tile, its split of K, and
/// the group size of the two-level combine of the split's partials (`kernels/split.cuh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmLaunch {
    pub tile: Tile,
    pub split: Split,
    pub group: usize,
}

impl GemmLaunch {
    /// Blocks along rows and columns, and along z (`z × split parts`).
    pub fn grid(&self, m: usize, n: usize, z: usize) -> [usize; 3] {
        [
            m.div_ceil(self.tile.bm),
            n.div_ceil(self.tile.bn),
            z * self.split.parts,
        ]
    }
}

/// A float moved by a split's combining block costs about this many FMAs of block time.
const COMBINE_WORD: f64 = 16.0;

/// The estimated time (in FMA-slots of one SM) of `t` with `s` over the problem (its
/// tensor-core variant when `tensor`).
#[allow(clippy::too_many_arguments)]
fn gemm_cost(
    tensor: bool,
    t: &Tile,
    s: &Split,
    group: usize,
    m: usize,
    n: usize,
    z: usize,
    target: &Target,
) -> f64 {
    let tiles = m.div_ceil(t.bm) * n.div_ceil(t.bn) * z;
    let blocks = tiles * s.parts;
    let occ = t.blocks_per_sm();
    let waves = blocks.div_ceil(target.resident(occ)) as f64;
    let area = (t.bm * t.bn) as f64;
    // Main loop, then the epilogue's per-output work.
    let efficiency = if tensor {
        t.tensor_efficiency()
    } else {
        t.efficiency()
    };
    let block = area * s.chunk.next_multiple_of(GEMM_BK) as f64 / efficiency + 4.0 * area;
    let combine = if s.parts > 1 {
        let groups = s.parts.div_ceil(group);
        (group + if groups > 1 { groups } else { 0 }) as f64 * area * COMBINE_WORD
    } else {
        0.0
    };
    // The blocks an SM runs side by side: as many as it holds in a full wave, fewer when the
    // grid is small — but an SM with fewer than `LATENCY_HIDING_BLOCKS` is latency bound, not
    // faster per block, whether the grid is small or the tile leaves room for fewer.
    let sharing = blocks
        .div_ceil(target.multiprocessors as usize)
        .min(occ)
        .max(LATENCY_HIDING_BLOCKS);
    waves * (sharing as f64) * block + combine
}

/// How many 8-warp GEMM blocks an SM needs to hide its warps' latency: with fewer, a wave
/// takes as long as with this many (the performance model's `serial` bound: one warp's
/// latency exceeds the issue time of fewer than 3 blocks' warp-instructions on the GEMM
/// bodies). Charging a small grid for the blocks it really runs lets a half-full wave take
/// smaller tiles, and a split of K fill an SM to this many blocks.
const LATENCY_HIDING_BLOCKS: usize = 3;

/// The level-1 group size of a combine over `parts` partials: about √parts, so both levels of
/// the combine read few partials.
pub fn combine_group(parts: usize) -> usize {
    if parts <= 8 {
        parts.max(1)
    } else {
        (parts as f64).sqrt().ceil() as usize
    }
}

/// The convolution a filter gradient through windows computes (`kernels/conv2d_backprop_filter.cu`
/// `TP_FWIN`): dilation 1 and one group are the caller's to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FilterGradient {
    pub batch: usize,
    pub out_h: usize,
    pub out_w: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub in_c: usize,
    pub out_c: usize,
    /// Bytes of an element in shared memory: 2 for operands rounded to 16 bits, 4 for TF32.
    pub elem_bytes: usize,
}

/// How a filter gradient runs through windows: `rows` whole output rows per window, `per_block`
/// windows multiplied in turn by each block, `split` blocks per output tile (16 input by 16
/// output channels, every tap) whose partial tiles are combined in groups of `group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FilterWindows {
    pub rows: usize,
    pub per_block: usize,
    pub split: usize,
    pub group: usize,
}

/// Elements per pixel of a filter-gradient window in shared memory: 16 channels and 8 of pad
/// (`FW_ROW`).
const FILTER_WINDOW_ROW: usize = 24;

/// The most taps a filter gradient through windows accumulates: one m16n8 accumulator (4
/// registers a lane) per tap, 36 registers at 3×3 within the 64 of 4 resident blocks.
const FILTER_WINDOW_TAPS: usize = 9;

impl FilterGradient {
    /// Output tiles: 16 input channels (the last may run past the input's) by 16 output
    /// channels each.
    pub fn tiles(&self) -> usize {
        self.in_c.div_ceil(16) * (self.out_c / 16)
    }

    /// Static shared memory of a block with windows of `rows` output rows: the window's x and
    /// dy pixels, or the accumulator tile (taps × 16 rows of 24 floats) when that is larger.
    pub fn shared_bytes(&self, rows: usize) -> usize {
        let [sh, sw] = self.stride;
        let window_h = (rows - 1) * sh + self.kh;
        let window_w = (self.out_w - 1) * sw + self.kw;
        let pixels = window_h * window_w + rows * self.out_w;
        let window = (pixels * FILTER_WINDOW_ROW * self.elem_bytes).next_multiple_of(16);
        window.max(self.kh * self.kw * 16 * FILTER_WINDOW_ROW * 4)
    }
}

/// The windows of filter gradient `f` on `target`, or `None` where they do not apply: output
/// channels multiples of 16, at most `FILTER_WINDOW_TAPS` (9) taps, and a window of whole output rows
/// whose K tiles (16 pixels) the block's four quarters share evenly, within the shared memory
/// (the largest such window: the fewer rows a window has, the more of its x pixels are the
/// rows the taps reach above and below). Each block then multiplies enough windows in turn that
/// the blocks fit on the device at once, 4 to an SM (64 registers).
pub fn filter_windows(f: &FilterGradient, target: &Target) -> Option<FilterWindows> {
    let taps = f.kh * f.kw;
    if !f.out_c.is_multiple_of(16)
        || f.in_c == 0
        || f.out_c == 0
        || f.batch == 0
        || f.out_w == 0
        || f.stride.contains(&0)
        || !(1..=FILTER_WINDOW_TAPS).contains(&taps)
    {
        return None;
    }
    let rows = (1..=f.out_h).rev().find(|&r| {
        f.out_h.is_multiple_of(r)
            && (r * f.out_w).is_multiple_of(64)
            && f.shared_bytes(r) + 64 <= MAX_SHARED
    })?;
    let windows = f.batch * (f.out_h / rows);
    let per_block = (f.tiles() * windows)
        .div_ceil(target.resident(4))
        .max(windows.div_ceil(MAX_SPLIT));
    let split = windows.div_ceil(per_block);
    Some(FilterWindows {
        rows,
        per_block,
        split,
        group: combine_group(split),
    })
}

/// Chooses the tile (and, when `may_split`, the split of K) of an `m × n` GEMM over `k`, `z`
/// times, whose epilogue takes `red_outputs` per-channel reductions: among the [`TILES`]
/// fitting the shared memory, and splits reaching the resident blocks, the launches with at
/// least one block per SM when there are any (a launch never leaves SMs idle to run bigger
/// tiles), and of those the cheapest by `gemm_cost`.
pub fn gemm(
    m: usize,
    n: usize,
    k: usize,
    z: usize,
    may_split: bool,
    red_outputs: usize,
    target: &Target,
) -> GemmLaunch {
    gemm_in(Precision::Fp32, m, n, k, z, may_split, red_outputs, target)
}

/// [`fn@gemm`] for a program of `precision`: with tensor cores (TF32, BF16, FP16 on a target that
/// has them), among the tiles that have a tensor-core variant ([`Tile::tensor_warps`]) and by
/// its cost ([`Tile::tensor_efficiency`]); a forced tile without one falls back to the choice
/// among those.
#[allow(clippy::too_many_arguments)]
pub fn gemm_in(
    precision: Precision,
    m: usize,
    n: usize,
    k: usize,
    z: usize,
    may_split: bool,
    red_outputs: usize,
    target: &Target,
) -> GemmLaunch {
    let tensor = precision.tensor_cores() && target.tensor_cores;
    let mut best: Option<((bool, f64), GemmLaunch)> = None;
    let fits = |t: &Tile| {
        if tensor {
            t.tensor_warps().is_some() && t.tensor_shared_bytes(red_outputs) <= MAX_SHARED
        } else {
            t.shared_bytes(red_outputs) <= MAX_SHARED
        }
    };
    let candidates: Vec<Tile> = match target.tile.filter(fits) {
        Some(t) => vec![t],
        None => TILES.into_iter().filter(fits).collect(),
    };
    for t in candidates {
        let tiles = m.div_ceil(t.bm) * n.div_ceil(t.bn) * z.max(1);
        let max_parts = if may_split {
            split(
                tiles,
                k,
                GEMM_BK,
                target.min_split_k,
                target.resident(t.blocks_per_sm()),
            )
            .parts
        } else {
            1
        };
        let mut parts = 1;
        while parts <= max_parts {
            let s = if parts == 1 {
                Split::whole(k)
            } else {
                let chunk = k.div_ceil(parts).next_multiple_of(GEMM_BK);
                Split {
                    parts: k.div_ceil(chunk),
                    chunk,
                }
            };
            let group = combine_group(s.parts);
            let idle = tiles * s.parts < target.multiprocessors as usize;
            let cost = (
                idle,
                gemm_cost(tensor, &t, &s, group, m, n, z.max(1), target),
            );
            if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                best = Some((
                    cost,
                    GemmLaunch {
                        tile: t,
                        split: s,
                        group,
                    },
                ));
            }
            parts = if parts == max_parts {
                parts + 1
            } else {
                (parts * 2).min(max_parts)
            };
        }
    }
    best.map_or(
        GemmLaunch {
            // Every tile fits without epilogue reductions: the smallest (with a tensor-core
            // variant for TF32).
            tile: TILES
                .into_iter()
                .rev()
                .find(|t| !tensor || t.tensor_warps().is_some())
                .unwrap_or(TILES[TILES.len() - 1]),
            split: Split::whole(k),
            group: 1,
        },
        |(_, g)| g,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tile_has_256_threads_and_fits_48k_of_shared_memory() {
        for t in TILES {
            assert_eq!(t.threads_x() * (t.bm / t.tm), 256, "{t:?}");
            assert_eq!(t.bm % t.tm + t.bn % t.tn, 0, "{t:?}");
            assert!(t.shared_bytes(4) <= MAX_SHARED, "{t:?}");
        }
    }

    #[test]
    fn splits_cover_the_extent_with_nonempty_chunks_of_the_granule() {
        for len in [1usize, 15, 16, 17, 1000, 2048, 131_072, 131_073] {
            for (blocks, want, granule, min) in [
                (1, 528, 1, 64),
                (3, 396, 16, 128),
                (64, 8, 1, 1),
                (1, 2, 16, 16),
            ] {
                let s = split(blocks, len, granule, min, want);
                assert!(s.parts >= 1 && s.parts <= MAX_SPLIT);
                if s.parts > 1 {
                    assert_eq!(s.chunk % granule, 0);
                    assert!(s.chunk >= min, "{s:?}");
                    // Every part starts inside the extent.
                    assert!((s.parts - 1) * s.chunk < len, "{len} {s:?}");
                    assert!(s.parts * s.chunk >= len);
                    assert!(blocks * s.parts <= want.max(blocks) + blocks, "{s:?}");
                } else {
                    assert_eq!(s.chunk, len);
                }
            }
        }
    }

    #[test]
    fn long_reductions_into_few_outputs_split_into_balanced_chains_up_to_the_device() {
        let h100 = Target::default();
        // Batch-norm statistics of 16 channels at batch 128 (32×32): one tile of 16 outputs,
        // √131,072 = 362 blocks (a lane folds 23 points, then the last block's lane adds 23
        // partials).
        let s = reduce_split(1, 131_072, 16, &h100);
        assert!(s.parts * s.chunk >= 131_072 && s.parts == 362, "{s:?}");
        // Longer ones fill the device and no more; two tiles of 64 channels at stage 3 take
        // √8,192 = 90 blocks each.
        let long = reduce_split(1, 1 << 22, 16, &h100);
        assert_eq!(long.parts, h100.resident(REDUCE_BLOCKS_PER_SM), "{long:?}");
        assert_eq!(reduce_split(2, 8_192, 8, &h100).parts, 90);
        // A short reduction is not split; many outputs need no split.
        assert_eq!(reduce_split(1, 100, 16, &h100).parts, 1);
        assert_eq!(reduce_split(10_000, 131_072, 16, &h100).parts, 1);
        // A lower threshold (as tests use) splits small shapes.
        let small = Target {
            min_lane_iterations: 1,
            ..Target::with_multiprocessors(2)
        };
        assert_eq!(reduce_split(1, 100, 16, &small).parts, 6);
    }

    fn filter_gradient(hw: usize, channels: usize, k: usize, elem_bytes: usize) -> FilterGradient {
        FilterGradient {
            batch: 128,
            out_h: hw,
            out_w: hw,
            kh: k,
            kw: k,
            stride: [1, 1],
            in_c: channels,
            out_c: channels,
            elem_bytes,
        }
    }

    #[test]
    fn resnet20s_filter_gradients_take_the_largest_windows_and_fill_an_h100_once() {
        let h100 = Target::default();
        // (image, channels, bytes) -> (rows, windows a block, blocks a tile).
        for ((hw, ch, bytes), want) in [
            ((32, 16, 2), (8, 1, 512)),
            ((32, 16, 4), (4, 2, 512)),
            ((16, 32, 2), (16, 1, 128)),
            ((16, 32, 4), (8, 2, 128)),
            ((8, 64, 2), (8, 4, 32)),
            ((8, 64, 4), (8, 4, 32)),
        ] {
            let f = filter_gradient(hw, ch, 3, bytes);
            let fw = filter_windows(&f, &h100).expect("windows");
            assert_eq!((fw.rows, fw.per_block, fw.split), want, "{f:?}");
            assert!(f.shared_bytes(fw.rows) + 64 <= MAX_SHARED, "{f:?}");
            // Every bigger window of whole rows and 64-pixel multiples overflows the shared memory.
            for r in (fw.rows + 1..=hw).filter(|r| hw % r == 0 && r * hw % 64 == 0) {
                assert!(f.shared_bytes(r) + 64 > MAX_SHARED, "{f:?}: {r} rows");
            }
            let blocks = fw.split * f.tiles();
            assert!(blocks <= h100.resident(4), "{f:?}: {blocks} blocks");
            assert!(blocks * 2 > h100.resident(4), "{f:?}: {blocks} blocks");
            assert_eq!(fw.group, combine_group(fw.split));
        }
    }

    #[test]
    fn filter_windows_refuse_what_the_kernel_cannot_hold() {
        let h100 = Target::default();
        // Output channels not multiples of 16, 25 taps (100 accumulator registers), rows too
        // wide for a window of 64-pixel multiples in the shared memory.
        let mut odd = filter_gradient(32, 16, 3, 2);
        odd.out_c = 24;
        assert_eq!(filter_windows(&odd, &h100), None);
        assert_eq!(filter_windows(&filter_gradient(32, 16, 5, 2), &h100), None);
        assert_eq!(filter_windows(&filter_gradient(224, 16, 3, 4), &h100), None);
        // Few windows: one each, every block its own.
        let mut small = filter_gradient(8, 16, 3, 2);
        small.batch = 2;
        let fw = filter_windows(&small, &h100).expect("windows");
        assert_eq!((fw.rows, fw.per_block, fw.split), (8, 1, 2));
    }

    #[test]
    fn resnet20s_first_and_strided_filter_gradients_take_windows_too() {
        let h100 = Target::default();
        // conv0: 3 input channels, one tile of 16 (13 of them zeros).
        let mut conv0 = filter_gradient(32, 16, 3, 2);
        conv0.in_c = 3;
        assert_eq!(conv0.tiles(), 1);
        let fw = filter_windows(&conv0, &h100).expect("conv0");
        assert_eq!((fw.rows, fw.split), (8, 512));
        // res2.0/conv1: 32×32×16 → 16×16×32 at stride 2: windows of 8 output rows read 17 × 33
        // input pixels.
        let mut strided = filter_gradient(16, 32, 3, 2);
        strided.in_c = 16;
        strided.stride = [2, 2];
        assert_eq!(strided.shared_bytes(8), (17 * 33 + 8 * 16) * 24 * 2);
        let fw = filter_windows(&strided, &h100).expect("res2.0/conv1");
        assert_eq!((fw.rows, strided.tiles()), (8, 2));
        assert!(strided.shared_bytes(16) + 64 > MAX_SHARED);
    }

    #[test]
    fn the_filter_gradient_of_resnet20_is_split_along_k() {
        let h100 = Target::default();
        // 3×3×16 → 16 at batch 128, 32×32: M = 144, N = 16, K = 131072.
        let g = gemm(144, 16, 131_072, 1, true, 0, &h100);
        let [gx, gy, gz] = g.grid(144, 16, 1);
        assert!(gx * gy * gz >= h100.multiprocessors as usize, "{g:?}");
        assert!(g.split.parts > 1);
        assert_eq!(g.split.chunk % GEMM_BK, 0);
        // Without the permission to split, the same problem runs on a handful of blocks.
        let unsplit = gemm(144, 16, 131_072, 1, false, 0, &h100);
        assert_eq!(unsplit.split.parts, 1);
    }

    #[test]
    fn tensor_core_tiles_have_a_warp_layout_and_fit_with_epilogue_reductions() {
        let with: Vec<Tile> = TILES
            .into_iter()
            .filter(|t| t.tensor_warps().is_some())
            .collect();
        assert_eq!(with.len(), 11, "all but 32×16 and 16×16");
        for t in with {
            let (wm, wn) = t.tensor_warps().unwrap();
            assert_eq!(wm * wn, 8, "{t:?}");
            assert_eq!((t.bm / wm) % 16 + (t.bn / wn) % 8, 0, "{t:?}");
            // Without epilogue reductions every one fits; with 4 (batch norm's backward sums)
            // 64×128 does not (its 64 × 136 accumulator tile and 16 KB of warp sums) and is
            // left out by `gemm_in`.
            assert!(t.tensor_shared_bytes(0) <= MAX_SHARED, "{t:?}");
            assert_eq!(
                t.tensor_shared_bytes(4) <= MAX_SHARED,
                (t.bm, t.bn) != (64, 128),
                "{t:?}"
            );
            assert!(t.tensor_efficiency() > t.efficiency(), "{t:?}");
        }
        assert_eq!(tile(256, 16, 4, 4).tensor_warps(), Some((8, 1)));
        assert_eq!(tile(128, 64, 8, 4).tensor_warps(), Some((4, 2)));
        // Every TF32 launch takes a tile with a tensor-core variant, even a tiny one.
        let h100 = Target::default();
        for (m, n, k) in [
            (3, 5, 7),
            (131_072, 16, 144),
            (144, 16, 131_072),
            (8192, 64, 576),
        ] {
            for red in [0, 4] {
                let g = gemm_in(Precision::Tf32, m, n, k, 1, true, red, &h100);
                assert!(g.tile.tensor_warps().is_some(), "{g:?}");
                assert!(g.tile.tensor_shared_bytes(red) <= MAX_SHARED, "{g:?}");
            }
        }
    }

    #[test]
    fn half_precisions_take_tensor_core_tiles_and_fp32_ones_without_tensor_cores() {
        let h100 = Target::default();
        let old_gpu = Target {
            tensor_cores: false,
            ..h100
        };
        for (m, n, k) in [(3, 5, 7), (131_072, 16, 144), (144, 16, 131_072)] {
            for red in [0, 4] {
                for precision in [Precision::Bf16, Precision::Fp16] {
                    let on = |t: &Target| gemm_in(precision, m, n, k, 1, true, red, t);
                    // With tensor cores: TF32's launch (the same tiles, the same cost).
                    let tf32 = gemm_in(Precision::Tf32, m, n, k, 1, true, red, &h100);
                    assert_eq!(on(&h100), tf32);
                    // Without: FP32's (the SIMT tiles, all 13 of them candidates).
                    assert_eq!(on(&old_gpu), gemm(m, n, k, 1, true, red, &old_gpu));
                }
            }
        }
    }

    #[test]
    fn the_forward_convolution_takes_a_tall_tile_and_splits_k_only_when_short_of_blocks() {
        let h100 = Target::default();
        let g = gemm(131_072, 16, 144, 1, true, 0, &h100);
        assert_eq!(g.split.parts, 1);
        assert_eq!((g.tile.bm, g.tile.bn), (256, 16));
        // Stage 3 (8×8×64 at batch 128, batch-norm mean in the epilogue): 16-accumulator
        // tiles with K split so that every SM runs enough blocks to hide their latency.
        let g = gemm(8192, 64, 576, 1, true, 1, &h100);
        let blocks: usize = g.grid(8192, 64, 1).iter().product();
        assert!(g.split.parts > 1, "{g:?}");
        assert!(g.tile.tm * g.tile.tn >= 16, "{g:?}");
        assert!(blocks >= 3 * h100.multiprocessors as usize, "{g:?}");
        // Without a split: a tile small enough that every SM gets a block, rather than 64×64
        // tiles on 128 blocks.
        let g = gemm(8192, 64, 576, 1, false, 1, &h100);
        let blocks: usize = g.grid(8192, 64, 1).iter().product();
        assert!(blocks >= h100.multiprocessors as usize, "{g:?}");
        // On a device with fewer SMs the same problem takes a larger register block.
        let small = gemm(
            8192,
            64,
            576,
            1,
            false,
            1,
            &Target::with_multiprocessors(16),
        );
        assert!(small.tile.tm * small.tile.tn >= 16, "{small:?}");
    }

    #[test]
    fn a_small_gemm_over_a_short_k_splits_it_rather_than_run_one_block() {
        let h100 = Target::default();
        // ResNet-20's classifier weight gradient at batch 128: 64 × 10 outputs over K = 128.
        for precision in [Precision::Fp32, Precision::Bf16] {
            let g = gemm_in(precision, 64, 10, 128, 1, true, 0, &h100);
            assert!(g.split.parts >= 2, "{precision:?}: {g:?}");
            assert!(g.split.chunk >= 2 * GEMM_BK, "{precision:?}: {g:?}");
        }
    }

    #[test]
    fn a_tile_an_sm_holds_once_is_charged_as_latency_bound() {
        // 32 accumulators per thread: one block per SM. A wave of them takes as long as
        // `LATENCY_HIDING_BLOCKS` blocks' issue, so it costs more than a wave of 16-accumulator
        // tiles of the same total work that an SM holds four of.
        let h100 = Target::default();
        let (big, small) = (tile(128, 64, 8, 4), tile(64, 64, 4, 4));
        assert_eq!(big.blocks_per_sm(), 1);
        let whole = Split::whole(288);
        let cost = |t: &Tile, m| gemm_cost(false, t, &whole, 1, m, 64, 1, &h100);
        let per_output = |t: &Tile, m: usize| cost(t, m) / (m * 64) as f64;
        let m = 128 * 132;
        assert!(per_output(&big, m) > per_output(&small, m));
    }
}
