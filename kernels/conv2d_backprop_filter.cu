// Gradient of a 2-D convolution with respect to its HWIO filter, as an implicit GEMM on the tiled
// core: rows are filter taps (M = kh.kw.ci, ci fastest), columns the group's output channels
// (N = o / groups), K runs over output pixels (n.oh.ow). A gathers x at the input pixel each tap
// reads for that output pixel (zero in the padding; 4 channels of a tap at once when
// TP_VEC_A = 4); B reads dy in place. K is long and M.N small, so K is split across
// TP_SPLIT_K blocks per tile whose partial tiles are combined in a fixed order
// (kernels/split.cuh): enough blocks to fill the device, the same bits on every run.
//
// Generated hooks: as conv2d.cu (x stored as tp_x_elem, dy as tp_dy_elem), with pointers x and
// dy; tp_epilogue stores dw; with
// TP_PROLOGUE, tp_prologue computes x as conv2d.cu's does (both paths below).
// Grid: (ceil(M / TP_BM), ceil(N / TP_BN), groups * TP_SPLIT_K).
//
// With TP_FWIN (tensor cores, dilation 1, one group, output channels in multiples of 16:
// render/launch.rs filter_windows) the block reads windows instead, below.

#define TP_CG (TP_IN_C / TP_GROUPS)
#define TP_OG (TP_OUT_C / TP_GROUPS)

#if TP_FWIN
// The filter gradient through windows. A block owns the gradient of 16 input channels
// (ci0 = 16 blockIdx.x) by 16 output channels (co0 = 16 blockIdx.y) for every tap, and a run
// of TP_FWIN_PER windows (blockIdx.z: the split of K): a window is TP_FWIN_ROWS whole output
// rows of one image — the K of its dy pixels — with the input pixels all the taps read for
// them, ((rows - 1) s_h + kh) x ((ow - 1) s_w + kw), zeros past the image's edge and past the
// last input channel (a block's 16 channels may run past ci: conv0's 3). The block loads a
// window's x and dy pixels once into shared memory (x 4 channels a copy where TP_VEC_A = 4,
// else one), pixel-major with a pixel's 16 channels contiguous and 8 elements of pad (FW_ROW:
// at stride 1 the 8 rows of a fragment read hit distinct banks, at stride 2 two ways), waits
// once, and multiplies every tap from there: tap (kh, kw)'s A fragment for output pixels k.. is
// the window pixels (s_h·row, s_w·column) shifted by kh rows and kw columns; B is dy as it
// lies. The pipelined core gathered x for 64 rows of M (a third of the taps) per block, once
// per K tile and tap, with a wait and a barrier per 16 pixels.
//
// Warps: warp w computes output channels co0 + 8 (w % 2) .. + 7 of every tap (one m16n8
// accumulator per tap, 16 input channels by 8 output channels) over the K tiles
// q, q + 4, .. of each window, q = w / 2; the four quarters' sums are added in order q = 0..3
// through shared memory at the end, then the tile goes the common way (tp_gemm_output: the
// split's fixed-order combine, the epilogue). Operands as in the pipelined core: 16-bit ones
// rounded by cvt.rn as the window is stored (ldmatrix .trans fragments, m16n8k16 mma), TF32's
// f32 values rounded by cvt.rna as fragments are read (m16n8k8 mma). Each element of the
// result is a sum of f32 partial sums in a fixed order: the same bits on every run (not the
// pipelined core's bits: its K runs in other partial sums).
//
// Generated: TP_FWIN_ROWS, TP_FWIN_PER, TP_VEC_A; TP_BM = taps x 16, TP_BN = 16,
// TP_TM = taps, TP_TN = 1, TP_SPLIT_K = blocks per tile, TP_GROUP. Grid: (ceil(ci / 16),
// co / 16, TP_SPLIT_K).
static_assert(TP_DIL_H == 1 && TP_DIL_W == 1 && TP_GROUPS == 1 && TP_TF32,
              "windows of dilation 1, one group, on the tensor cores");
static_assert(TP_OUT_C % 16 == 0, "16 output channels per pair of fragments");
static_assert(TP_VEC_A == 1 || (TP_VEC_A == 4 && TP_IN_C % 4 == 0),
              "x copied 4 channels at a time only where a pixel's channels come in fours");
static_assert(TP_OUT_H % TP_FWIN_ROWS == 0 && TP_FWIN_ROWS * TP_OUT_W % 64 == 0,
              "a window is whole rows, 16-pixel K tiles, as many per quarter");
static_assert(TP_BM == TP_K_H * TP_K_W * 16 && TP_BN == 16 && TP_TM == TP_K_H * TP_K_W &&
                  TP_TN == 1,
              "the output tile: every tap of 16 input channels by 16 output channels");
enum {
    FW_TAPS = TP_K_H * TP_K_W,
    FW_WIN_H = (TP_FWIN_ROWS - 1) * TP_STRIDE_H + TP_K_H,
    FW_WIN_W = (TP_OUT_W - 1) * TP_STRIDE_W + TP_K_W,
    FW_X = FW_WIN_H * FW_WIN_W,                        // x pixels of a window
    FW_DY = TP_FWIN_ROWS * TP_OUT_W,                   // dy pixels (its K)
    FW_ROW = 24,                                       // elements per pixel in shared memory
    // x copies per pixel: 4 of 4 channels, or the channels one by one (fewer than 16 of them:
    // the rest of the pixel's 16 are zeroed once, by tp_fw_zero_channels).
    FW_XV = TP_VEC_A == 4 ? 4 : (TP_IN_C < 16 ? TP_IN_C : 16),
    FW_TILES = FW_DY / 16,                             // K tiles of a window
    FW_WINDOWS = TP_BATCH * (TP_OUT_H / TP_FWIN_ROWS)  // windows of the whole K
};
#if TP_ROUND
typedef unsigned short tp_fw_elem;
#else
typedef float tp_fw_elem;
#endif
enum {
    FW_FLOATS = ((FW_X + FW_DY) * FW_ROW * (int)sizeof(tp_fw_elem) / 4 + 3) / 4 * 4,
    FW_C_ROW = 16 + 8,  // floats per row of the accumulator tile
    FW_C_FLOATS = TP_BM * FW_C_ROW
};

// Copies COUNT source vectors of VEC elements into the window, PER_PIXEL a pixel: vector e from
// src(e) (null: zeros; storage Prep::Elem) to elements dst + e / PER_PIXEL * FW_ROW +
// e % PER_PIXEL * VEC (pixel-major), each through prep(source, value) once loaded (x's
// prologue, Prep::COMPUTE; dy's is none).
// 16-bit windows through registers (cp.async cannot convert), GROUP vectors a thread in flight
// at once; TF32 ones with cp.async (the caller commits and waits; no prologue).
template <int VEC, int PER_PIXEL, int COUNT, int GROUP, class Src, class Prep>
TP_DEV void tp_fw_copy(const Src& src, const Prep& prep, tp_fw_elem* dst) {
#if TP_ROUND
    constexpr int PER = (COUNT + TP_BLOCK - 1) / TP_BLOCK;
    // The registers a copy travels in: f32, or stored bf16 bits with nothing to compute
    // (gemm_core.cuh tp_travel).
    typedef typename tp_travel<VEC, typename Prep::Elem, Prep::COMPUTE>::type T;
#pragma unroll 1
    for (int j0 = 0; j0 < PER; j0 += GROUP) {
        typename T::type v[GROUP];
#pragma unroll
        for (int d = 0; d < GROUP; ++d) {
            const int e = threadIdx.x + (j0 + d) * TP_BLOCK;
            const auto from = j0 + d < PER && e < COUNT ? src(e) : nullptr;
            if constexpr (VEC == 4)
                v[d] = T::load_if(from != nullptr, reinterpret_cast<unsigned long long>(from), from);
            else
                v[d] = from ? T::load(from) : T::zero();
        }
#pragma unroll
        for (int d = 0; d < GROUP; ++d) {
            const int e = threadIdx.x + (j0 + d) * TP_BLOCK;
            if (j0 + d < PER && e < COUNT) {
                // The source again (arithmetic), now that the loads have landed.
                v[d] = prep(src(e), v[d]);
                tp_fw_elem* to = dst + e / PER_PIXEL * FW_ROW + e % PER_PIXEL * VEC;
                if constexpr (VEC == 4)
                    *reinterpret_cast<uint2*>(to) = tp_stage_bits(v[d]);
                else
                    *to = tp_stage_bits(v[d]);
            }
        }
    }
#else
    static_assert(!TP_PROLOGUE, "cp.async cannot compute a prologue");
    if constexpr (VEC == 1) {
        // Rolled: unrolled, ptxas keeps every copy's address at once and spills (conv0's x).
#pragma unroll 1
        for (int e = threadIdx.x; e < COUNT; e += TP_BLOCK)
            tp_copy_async<4>(dst + e / PER_PIXEL * FW_ROW + e % PER_PIXEL, src(e));
    } else {
        for (int e = threadIdx.x; e < COUNT; e += TP_BLOCK)
            tp_copy_async<16>(dst + e / PER_PIXEL * FW_ROW + e % PER_PIXEL * 4, src(e));
    }
#endif
}

// What tp_fw_copy does to x's loaded elements: its prologue (TP_PROLOGUE), from their source;
// copied 4 channels at a time, a thread's are the same 4 of every pixel (ci0 + 4 (thread % 4):
// the block and FW_XV are multiples of 4), whose per-channel operands it holds.
struct tp_fw_x_prep {
    typedef tp_x_elem Elem;          // what it reads
    enum { COMPUTE = TP_PROLOGUE };  // whether it computes anything
    const tp_params& p;
#if TP_PROLOGUE
    tp_pro_held held;
    TP_DEV float operator()(const tp_x_elem* from, float v) const {
        return tp_prologue_from(p, from, v);
    }
    TP_DEV float4 operator()(const tp_x_elem* from, float4 v) const {
        return tp_prologue_held_from(p, held, from, v);
    }
#else
    template <class V>
    TP_DEV V operator()(const tp_x_elem*, V v) const { return v; }
#endif
};
// ... and to dy's: nothing.
struct tp_fw_as_is {
    typedef tp_dy_elem Elem;
    enum { COMPUTE = 0 };
    template <class V>
    TP_DEV V operator()(const Elem*, V v) const { return v; }
};

// Loads window `window` of the block's channels (x and dy start at ci0 and co0) into shared
// memory (`win`: FW_FLOATS floats) and waits for it; 16-bit windows GROUP vectors a thread at a
// time. x's elements go through the prologue (TP_PROLOGUE: its per-channel operands read once
// a window; held across the block's windows, beside the accumulators, they spill), dy's as
// they are.
template <int GROUP>
TP_DEV void tp_fw_fill(const tp_params& p, const tp_x_elem* x, const tp_dy_elem* dy, int ci0,
                       int window, tp_fw_elem* win) {
#if TP_PROLOGUE
    const tp_fw_x_prep prep{p, tp_prologue_hold(p, ci0 + threadIdx.x % 4 * 4)};
#else
    const tp_fw_x_prep prep{p};
#endif
    const int n = window / (TP_OUT_H / TP_FWIN_ROWS);
    const int oh0 = window % (TP_OUT_H / TP_FWIN_ROWS) * TP_FWIN_ROWS;
    tp_fw_copy<TP_VEC_A, FW_XV, FW_X * FW_XV, GROUP>(
        [&](int e) -> const tp_x_elem* {
            const int px = e / FW_XV, c = e % FW_XV * TP_VEC_A;
            const int ih = oh0 * TP_STRIDE_H - TP_PAD_TOP + px / FW_WIN_W;
            const int iw = px % FW_WIN_W - TP_PAD_LEFT;
            if (ih < 0 || ih >= TP_IN_H || iw < 0 || iw >= TP_IN_W || ci0 + c >= TP_IN_C) return nullptr;
            return x + (((tp_idx)n * TP_IN_H + ih) * TP_IN_W + iw) * TP_IN_C + c;
        },
        prep, win);
    tp_fw_copy<4, 4, FW_DY * 4, GROUP>(
        [&](int e) -> const tp_dy_elem* {
            return dy + (((tp_idx)n * TP_OUT_H + oh0) * TP_OUT_W + e / 4) * TP_OUT_C + e % 4 * 4;
        },
        tp_fw_as_is{}, win + FW_X * FW_ROW);
#if !TP_ROUND
    tp_copy_commit();
    tp_copy_wait_all();
#endif
    __syncthreads();
}

// Zeros every x pixel's channels from FW_XV on, which no copy writes (fewer than 16 input
// channels copied one by one), for all the block's windows; the first fill's barrier orders it.
TP_DEV void tp_fw_zero_channels(tp_fw_elem* win) {
    if constexpr (TP_VEC_A == 1 && FW_XV < 16) {
        for (int e = threadIdx.x; e < FW_X * (16 - FW_XV); e += TP_BLOCK)
            win[e / (16 - FW_XV) * FW_ROW + FW_XV + e % (16 - FW_XV)] = tp_fw_elem(0);
    }
}

// The window pixel tap (0, 0) reads for output pixel k of the window.
TP_DEV int tp_fw_pixel(int k) {
    return k / TP_OUT_W * TP_STRIDE_H * FW_WIN_W + k % TP_OUT_W * TP_STRIDE_W;
}

// The offset, in elements, of tap `tap`'s window pixel from tap (0, 0)'s.
TP_DEV int tp_fw_tap(int tap) { return (tap / TP_K_W * FW_WIN_W + tap % TP_K_W) * FW_ROW; }

// c[tap] += this warp's products of the window in shared memory: output channels nf * 8 .. of
// every tap over K tiles q, q + 4, .. (each 16 dy pixels).
TP_DEV void tp_fw_multiply(const tp_fw_elem* win, float c[FW_TAPS][4], int q, int nf) {
    const tp_fw_elem* dys = win + FW_X * FW_ROW;
    const int lane = threadIdx.x % 32;
#if TP_ROUND
    // ldmatrix rows: A's four 8x8 matrices (m 0-7 / 8-15 by (lane >> 3) & 1, k 0-7 / 8-15 by
    // lane >> 4) are rows k of the window (.trans: a0..a3 of m16n8k16), B's two k 0-7 / 8-15
    // of dy's rows (lanes 0-15).
    const int ka = (lane & 7) + (lane >> 4) * 8, ma = ((lane >> 3) & 1) * 8;
    const int kb = (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll 1
    for (int kt = q; kt < FW_TILES; kt += 4) {
        const int k = kt * 16 + ka;
        const tp_fw_elem* a = win + tp_fw_pixel(k) * FW_ROW + ma;
        unsigned int bf[2];
        tp_ldmatrix_x2_trans(bf, dys + (kt * 16 + kb) * FW_ROW + nf * 8);
#pragma unroll
        for (int tap = 0; tap < FW_TAPS; ++tap) {
            unsigned int af[4];
            tp_ldmatrix_x4_trans(af, a + tp_fw_tap(tap));
            tp_mma16(c[tap], af, bf);
        }
    }
#else
    // m16n8k8 TF32 fragments (g = lane / 4, t = lane % 4): a0..a3 = A[g][t], A[g+8][t],
    // A[g][t+4], A[g+8][t+4] with A[m][k] the window's channel m of output pixel k's tap
    // pixel; b0, b1 = B[t][g], B[t+4][g], dy's channel nf * 8 + g.
    const int g = lane / 4, t = lane % 4;
#pragma unroll 1
    for (int kt = q; kt < FW_TILES; kt += 4) {
#pragma unroll
        for (int ks = 0; ks < 16; ks += 8) {
            const int k0 = kt * 16 + ks + t, k1 = k0 + 4;
            const float* a0 = win + tp_fw_pixel(k0) * FW_ROW + g;
            const float* a1 = win + tp_fw_pixel(k1) * FW_ROW + g;
            unsigned int bf[2];
            bf[0] = tp_tf32(dys[k0 * FW_ROW + nf * 8 + g]);
            bf[1] = tp_tf32(dys[k1 * FW_ROW + nf * 8 + g]);
#pragma unroll
            for (int tap = 0; tap < FW_TAPS; ++tap) {
                const int off = tp_fw_tap(tap);
                unsigned int af[4];
                af[0] = tp_tf32(a0[off]);
                af[1] = tp_tf32(a0[off + 8]);
                af[2] = tp_tf32(a1[off]);
                af[3] = tp_tf32(a1[off + 8]);
                tp_mma_tf32(c[tap], af, bf);
            }
        }
    }
#endif
}

struct tp_fw_out {
    int ci0, co0;
    // Row m of the tile is tap m / 16, input channel ci0 + m % 16 (an output where that is a
    // channel of x): HWIO row tap * ci + channel.
    TP_DEV bool valid(int m) const { return ci0 + m % 16 < TP_IN_C; }
    TP_DEV tp_idx flat(int m, int co) const {
        return ((tp_idx)(m / 16) * TP_IN_C + ci0 + m % 16) * TP_OUT_C + co0 + co;
    }
    TP_DEV int channel(int co) const { return co0 + co; }
};

extern "C" __global__ void TP_GEMM_BOUNDS tp_conv2d_backprop_filter(const tp_params p) {
    __shared__ __align__(16) float smem[FW_FLOATS > FW_C_FLOATS ? FW_FLOATS : FW_C_FLOATS];
    tp_fw_elem* win = reinterpret_cast<tp_fw_elem*>(smem);
    const int ci0 = blockIdx.x * 16, co0 = blockIdx.y * 16, split = blockIdx.z;
    const tp_x_elem* x = p.x + ci0;
    const tp_dy_elem* dy = p.dy + co0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, q = warp / 2, nf = warp % 2;
    const int w1 = (split + 1) * TP_FWIN_PER < FW_WINDOWS ? (split + 1) * TP_FWIN_PER : FW_WINDOWS;
    // The first window before the accumulators exist (4 vectors a thread in flight at once);
    // later ones 2 at a time, beside the 36 accumulator registers of 3x3 (64 in all, or ptxas
    // spills).
    int w = split * TP_FWIN_PER;
    tp_fw_zero_channels(win);
    tp_fw_fill<4>(p, x, dy, ci0, w, win);
    float c[FW_TAPS][4];
#pragma unroll
    for (int tap = 0; tap < FW_TAPS; ++tap)
#pragma unroll
        for (int r = 0; r < 4; ++r) c[tap][r] = 0.0f;
#pragma unroll 1
    for (;;) {
        tp_fw_multiply(win, c, q, nf);
        __syncthreads();  // every warp is past its reads before the next window (or the tile)
        if (++w >= w1) break;
        // (One at a time with a prologue: its operands take the registers of the second.)
        tp_fw_fill<TP_PROLOGUE ? 1 : 2>(p, x, dy, ci0, w, win);
    }
    // The quarters' accumulators, added in order q = 0..3 into the tile: rows tap * 16 + g (+8),
    // columns nf * 8 + 2t (+1) (the m16n8 accumulator layout).
    float* cs = smem;
    const int g = lane / 4, t = lane % 4;
#pragma unroll 1
    for (int r = 0; r < 4; ++r) {
        if (q == r) {
#pragma unroll
            for (int tap = 0; tap < FW_TAPS; ++tap) {
                float2* lo = reinterpret_cast<float2*>(cs + (tap * 16 + g) * FW_C_ROW + nf * 8 + 2 * t);
                float2* hi = lo + 8 * FW_C_ROW / 2;
                float2 a = make_float2(c[tap][0], c[tap][1]), b = make_float2(c[tap][2], c[tap][3]);
                if (r) {
                    const float2 sa = *lo, sb = *hi;
                    a = make_float2(sa.x + a.x, sa.y + a.y);
                    b = make_float2(sb.x + b.x, sb.y + b.y);
                }
                *lo = a;
                *hi = b;
            }
        }
        __syncthreads();
    }
    float acc[TP_TM][TP_TN];
    const int tx = threadIdx.x % TP_TX, ty = threadIdx.x / TP_TX;
#pragma unroll
    for (int i = 0; i < TP_TM; ++i) tp_read_shared<TP_TN>(cs + (ty * TP_TM + i) * FW_C_ROW + tx, acc[i]);
    const tp_fw_out out = {ci0, co0};
    tp_gemm_output(p, out, TP_BM, TP_BN, 0, 0, blockIdx.y * gridDim.x + blockIdx.x, split, acc);
}
#else

struct tp_conv_bwd_filter_a {
    typedef tp_x_elem Elem;  // x's storage: f32, or bf16 (gemm_core.cuh tp_bf16)
    const Elem* x;
    const tp_params& p;  // the prologue's operands (TP_PROLOGUE)
    enum { PROLOGUE = TP_PROLOGUE };
    // With TP_OUT_W a multiple of TP_BK, a K tile's pixels lie in one output row: the input row
    // they read is found once per tile (K_TILE), and each pixel is a step along it.
    enum { K_FAST = false, VEC = TP_VEC_A, K_RUN = 1, K_TILE = TP_OUT_W % TP_BK == 0 };
    struct Line {
        const Elem* channel;
        int dh, dw;
    };
    // The input row a K tile's pixels read for this line's tap (null when the tap falls in
    // the padding above or below) and the input column of its first pixel.
    struct Tile {
        const Elem* row;
        int iw0;
    };
    TP_DEV Tile tile(const Line& l, int k0) const {
        const int ow = k0 % TP_OUT_W, t = k0 / TP_OUT_W;
        const int oh = t % TP_OUT_H, n = t / TP_OUT_H;
        const int ih = oh * TP_STRIDE_H + l.dh;
        const bool inside = ih >= 0 && ih < TP_IN_H;
        return {inside ? l.channel + ((tp_idx)n * TP_IN_H + ih) * TP_IN_W * TP_IN_C : nullptr,
                ow * TP_STRIDE_W + l.dw};
    }
    TP_DEV const Elem* at(const Line&, const Tile& t, int j) const {
        const int iw = t.iw0 + j * TP_STRIDE_W;
        return t.row && (unsigned)iw < TP_IN_W ? t.row + (tp_idx)iw * TP_IN_C : nullptr;
    }
    TP_DEV Line line(int m) const {
        const int ci = m % TP_CG, t = m / TP_CG;
        const int kw = t % TP_K_W, kh = t / TP_K_W;
        return {x + ci, kh * TP_DIL_H - TP_PAD_TOP, kw * TP_DIL_W - TP_PAD_LEFT};
    }
    TP_DEV const Elem* at(const Line& l, int k) const {
        const int ow = k % TP_OUT_W, t = k / TP_OUT_W;
        const int oh = t % TP_OUT_H, n = t / TP_OUT_H;
        const int ih = oh * TP_STRIDE_H + l.dh, iw = ow * TP_STRIDE_W + l.dw;
        if (ih < 0 || ih >= TP_IN_H || iw < 0 || iw >= TP_IN_W) return nullptr;
        return l.channel + (((tp_idx)n * TP_IN_H + ih) * TP_IN_W + iw) * TP_IN_C;
    }
};

struct tp_conv_bwd_filter_b {
    typedef tp_dy_elem Elem;  // dy's storage: f32, or bf16 (gemm_core.cuh tp_bf16)
    const Elem* dy;
    enum { K_FAST = false, VEC = TP_VEC_B, K_RUN = 1, K_TILE = 0 };
    typedef const Elem* Line;
    TP_DEV Line line(int co) const { return dy + co; }
    TP_DEV const Elem* at(const Line& l, int k) const { return l + (tp_idx)k * TP_OUT_C; }
};

struct tp_conv_bwd_filter_out {
    int first_channel;
    TP_DEV bool valid(int) const { return true; }
    TP_DEV tp_idx flat(int m, int co) const { return (tp_idx)m * TP_OUT_C + first_channel + co; }
    TP_DEV int channel(int co) const { return first_channel + co; }
};

extern "C" __global__ void TP_GEMM_BOUNDS tp_conv2d_backprop_filter(const tp_params p) {
    // One group: g is the constant 0, not a value ptxas keeps live across the K loop.
    const int g = TP_GROUPS == 1 ? 0 : blockIdx.z / TP_SPLIT_K, split = blockIdx.z % TP_SPLIT_K;
    const tp_conv_bwd_filter_a la = {p.x + g * TP_CG, p};
    const tp_conv_bwd_filter_b lb = {p.dy + g * TP_OG};
    constexpr int M = TP_K_H * TP_K_W * TP_CG, K = TP_BATCH * TP_OUT_H * TP_OUT_W;
    const int m0 = blockIdx.x * TP_BM, n0 = blockIdx.y * TP_BN;
    const int k0 = split * TP_K_CHUNK, k1 = K - k0 < TP_K_CHUNK ? K : k0 + TP_K_CHUNK;
    float acc[TP_TM][TP_TN];
    tp_gemm_tile(la, lb, M, TP_OG, k0, k1, m0, n0, acc);
    const tp_conv_bwd_filter_out out = {g * TP_OG};
    tp_gemm_output(p, out, M, TP_OG, m0, n0, (g * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x,
                   split, acc);
}
#endif
