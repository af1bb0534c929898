// Gradient of a 2-D convolution with respect to its NHWC input, as an implicit GEMM on the tiled
// core: rows are input pixels, columns the group's input channels (N = c / groups), K runs over
// the filter taps that reach a row's pixels and the group's output channels (co fastest). A
// gathers dy at the output pixel each tap came from (zero where it falls outside; 4 channels at
// once when TP_VEC_A = 4); B reads the filter transposed in place. Element (pixel, ci) of dx
// goes through the epilogue hook; per-channel epilogue reductions (batch norm's gradient sums)
// are summed as the tile is stored.
//
// Strided convolutions are decomposed into phases (TP_PHASES_H x TP_PHASES_W = the strides):
// input pixel (h, w) only receives taps kh with (h + pad_top - kh.dil_h) a multiple of the
// stride, so the pixels are grouped by ((h + pad_top) mod stride_h, (w + pad_left) mod
// stride_w) and each phase is its own GEMM over just its taps (every TP_PER_H-th kh from the
// phase's first one, at most TP_TAPS_H of them; likewise along w). Without it three quarters
// of a 3x3 stride-2 gradient's products would be with zeros. A phase's rows are its pixels
// (n, jh, jw) with jh < TP_PH_H, jw < TP_PH_W (the largest phase's extents: rows past a smaller
// phase's extent are skipped, out.valid), its K the phase's tap rows times TP_TAPS_W taps times
// the group's channels (a tap past the filter's edge reads zeros). Blocks x are the phases'
// row tiles, TP_PHASE_TILES per phase in phase order, so split-K and the epilogue reductions
// combine over the whole grid as without phases. Unit strides give one phase: the plain GEMM.
//
// Generated hooks: as conv2d.cu, with pointers dy (stored as tp_dy_elem: float, or tp_bf16 for
//   a gradient stored in bf16) and filter; for a strided convolution
//   TP_PHASES_H, TP_PHASES_W, TP_PHASE_TILES, TP_PER_H, TP_PER_W, TP_TAPS_H, TP_TAPS_W, TP_PH_H,
//   TP_PH_W (render/fixed.rs DgradPhases; without them, one phase: the whole GEMM).
// Grid: (TP_PHASES_H * TP_PHASES_W * TP_PHASE_TILES, ceil(N / TP_BN), groups * TP_SPLIT_K).

#define TP_CG (TP_IN_C / TP_GROUPS)
#define TP_OG (TP_OUT_C / TP_GROUPS)
#ifndef TP_PHASES_H
#define TP_PHASES_H 1
#define TP_PHASES_W 1
#define TP_PER_H 1
#define TP_PER_W 1
#define TP_TAPS_H TP_K_H
#define TP_TAPS_W TP_K_W
#define TP_PH_H TP_IN_H
#define TP_PH_W TP_IN_W
#endif
#define TP_PHASES (TP_PHASES_H * TP_PHASES_W)
// The output row of a phase's row past the phase's pixels: no tap reaches it (negative).
#define TP_NO_ROW (-(1 << 29))

// One phase along one axis: its first input coordinate, how many it has, its first tap (or
// none: `taps` = 0) and how many taps it has.
struct tp_phase_axis {
    int first, count, tap0, taps;
};

// Phase `ph` of an axis of `in` pixels, `k` taps with dilation `dil`, stride `s`, padding
// `pad` before: pixels i with (i + pad) % s == ph, taps t with (t * dil) % s == ph (every
// `per`-th from the first).
TP_DEV tp_phase_axis tp_phase_along(int ph, int in, int k, int dil, int s, int pad, int per) {
    tp_phase_axis a;
    a.first = ((ph - pad) % s + s) % s;
    a.count = a.first < in ? (in - a.first + s - 1) / s : 0;
    a.tap0 = -1;
    for (int t = per - 1; t >= 0; --t)
        if (t * dil % s == ph) a.tap0 = t;
    a.taps = a.tap0 >= 0 && a.tap0 < k ? (k - a.tap0 + per - 1) / per : 0;
    return a;
}

struct tp_phase {
    tp_phase_axis h, w;
};

TP_DEV tp_phase tp_phase_of(int phase) {
    return {tp_phase_along(phase / TP_PHASES_W, TP_IN_H, TP_K_H, TP_DIL_H, TP_STRIDE_H, TP_PAD_TOP,
                           TP_PER_H),
            tp_phase_along(phase % TP_PHASES_W, TP_IN_W, TP_K_W, TP_DIL_W, TP_STRIDE_W, TP_PAD_LEFT,
                           TP_PER_W)};
}

#if TP_PHASES == 1
// One phase: the plain implicit GEMM over every pixel and tap, K = (kh, kw, co).
struct tp_conv_bwd_input_a {
    typedef tp_dy_elem Elem;  // dy's storage: f32, or bf16 (gemm_core.cuh tp_bf16)
    const Elem* dy;
    tp_phase ph;
    enum { K_FAST = true, VEC = TP_VEC_A, K_RUN = TP_OG, K_TILE = 0 };  // a tap's channels
    struct Line {
        const Elem* image;
        int hp, wp;
    };
    TP_DEV Line line(int m) const {
        const int w = m % TP_IN_W, t = m / TP_IN_W;
        const int h = t % TP_IN_H, n = t / TP_IN_H;
        return {dy + (tp_idx)n * TP_OUT_H * TP_OUT_W * TP_OUT_C, h + TP_PAD_TOP, w + TP_PAD_LEFT};
    }
    TP_DEV const Elem* at(const Line& l, int k) const {
        const int co = k % TP_OG, t = k / TP_OG;
        const int kw = t % TP_K_W, kh = t / TP_K_W;
        const int oh = l.hp - kh * TP_DIL_H, ow = l.wp - kw * TP_DIL_W;
        if (oh < 0 || ow < 0 || oh >= TP_OUT_H || ow >= TP_OUT_W) return nullptr;
        return l.image + ((tp_idx)oh * TP_OUT_W + ow) * TP_OUT_C + co;
    }
#if TP_WINDOW
    // The window of a row tile (kernels/gemm_core.cuh tp_window; stride and dilation 1, the
    // tile TP_BM / TP_IN_W whole input rows of one image): the rows h0 + pad_top - (K_H - 1) ..
    // and columns pad_left - (K_W - 1) .. of dy, what the taps of those rows read (a tap
    // (kh, kw) of row (r, w) reads window pixel (r + K_H - 1 - kh, w + K_W - 1 - kw)).
    enum {
        WIN_H = TP_BM / TP_IN_W + TP_K_H - 1,
        WIN_W = TP_IN_W + TP_K_W - 1,
        WIN_C = TP_OG,
        WIN_K = TP_K_H * TP_K_W * TP_OG
    };
    static_assert(TP_STRIDE_H == 1 && TP_STRIDE_W == 1 && TP_DIL_H == 1 && TP_DIL_W == 1 &&
                      TP_BM % TP_IN_W == 0 && TP_IN_H * TP_IN_W % TP_BM == 0,
                  "a window of whole input rows");
    static TP_DEV int win_row(int mm) { return mm / TP_IN_W * WIN_W + mm % TP_IN_W; }
    static TP_DEV int win_tap(int k) {
        const int t = k / TP_OG;
        return (TP_K_H - 1 - t / TP_K_W) * WIN_W + (TP_K_W - 1 - t % TP_K_W);
    }
    static TP_DEV int win_channel(int k) { return k % TP_OG; }
    TP_DEV const Elem* win_source(int m0, int px) const {
        const int n = m0 / (TP_IN_H * TP_IN_W), h0 = m0 / TP_IN_W % TP_IN_H;
        const int oh = h0 + TP_PAD_TOP - (TP_K_H - 1) + px / WIN_W;
        const int ow = TP_PAD_LEFT - (TP_K_W - 1) + px % WIN_W;
        if (oh < 0 || oh >= TP_OUT_H || ow < 0 || ow >= TP_OUT_W) return nullptr;
        return dy + (((tp_idx)n * TP_OUT_H + oh) * TP_OUT_W + ow) * TP_OUT_C;
    }
#endif
};

struct tp_conv_bwd_input_b {
    const float* w;
    tp_phase ph;
    enum { K_FAST = true, VEC = TP_VEC_B, K_RUN = TP_OG, K_TILE = 0 };  // a tap's channels
    typedef const float* Line;
    TP_DEV Line line(int ci) const { return w + (tp_idx)ci * TP_OUT_C; }
    TP_DEV const float* at(const Line& l, int k) const {
        return l + (tp_idx)(k / TP_OG) * TP_CG * TP_OUT_C + k % TP_OG;
    }
};

struct tp_conv_bwd_input_out {
    int first_channel;
    tp_phase ph;
    TP_DEV bool valid(int) const { return true; }
    TP_DEV tp_idx flat(int m, int ci) const { return (tp_idx)m * TP_IN_C + first_channel + ci; }
    TP_DEV int channel(int ci) const { return first_channel + ci; }
};
#else
// Row m of a phase: image n, phase coordinates (jh, jw).
struct tp_phase_row {
    int n, jh, jw;
};

TP_DEV tp_phase_row tp_row_of(int m) {
    const int jw = m % TP_PH_W, t = m / TP_PH_W;
    return {t / TP_PH_H, t % TP_PH_H, jw};
}

// Element k of a phase's K: the tap's rank along h and w among the phase's taps, and the
// output channel.
struct tp_tap {
    int ih, iw, co;
};

TP_DEV tp_tap tp_tap_of(int k) {
    const int co = k % TP_OG, t = k / TP_OG;
    return {t / TP_TAPS_W, t % TP_TAPS_W, co};
}

// From one of a phase's taps to the next, kh grows by TP_PER_H and the output row it reads
// falls by TP_PER_H * TP_DIL_H / TP_STRIDE_H (= dil_h / gcd(dil_h, stride_h): whole rows).
#define TP_STEP_H (TP_PER_H * TP_DIL_H / TP_STRIDE_H)
#define TP_STEP_W (TP_PER_W * TP_DIL_W / TP_STRIDE_W)

struct tp_conv_bwd_input_a {
    typedef tp_dy_elem Elem;  // dy's storage: f32, or bf16 (gemm_core.cuh tp_bf16)
    const Elem* dy;
    tp_phase ph;
    enum { K_FAST = true, VEC = TP_VEC_A, K_RUN = TP_OG, K_TILE = 0 };  // a tap's channels
    // The output pixel (oh0, ow0) the phase's first tap reads for this row (exact divisions:
    // the phase's taps meet the stride), or TP_NO_ROW for a row past the phase's pixels.
    struct Line {
        const Elem* image;
        int oh0, ow0;
    };
    TP_DEV Line line(int m) const {
        const tp_phase_row r = tp_row_of(m);
        const bool valid = r.jh < ph.h.count && r.jw < ph.w.count;
        const int hp = ph.h.first + r.jh * TP_STRIDE_H + TP_PAD_TOP;
        const int wp = ph.w.first + r.jw * TP_STRIDE_W + TP_PAD_LEFT;
        return {dy + (tp_idx)r.n * TP_OUT_H * TP_OUT_W * TP_OUT_C,
                valid ? (hp - ph.h.tap0 * TP_DIL_H) / TP_STRIDE_H : TP_NO_ROW,
                (wp - ph.w.tap0 * TP_DIL_W) / TP_STRIDE_W};
    }
    TP_DEV const Elem* at(const Line& l, int k) const {
        const tp_tap t = tp_tap_of(k);
        const int oh = l.oh0 - t.ih * TP_STEP_H, ow = l.ow0 - t.iw * TP_STEP_W;
        if (t.iw >= ph.w.taps || (unsigned)oh >= TP_OUT_H || (unsigned)ow >= TP_OUT_W)
            return nullptr;
        return l.image + ((tp_idx)oh * TP_OUT_W + ow) * TP_OUT_C + t.co;
    }
};

struct tp_conv_bwd_input_b {
    const float* w;
    tp_phase ph;
    enum { K_FAST = true, VEC = TP_VEC_B, K_RUN = TP_OG, K_TILE = 0 };  // a tap's channels
    typedef const float* Line;
    // Input channel ci at the phase's first tap (the filter's origin for a phase without taps,
    // which reads nothing).
    TP_DEV Line line(int ci) const {
        const int kh = ph.h.tap0 > 0 ? ph.h.tap0 : 0, kw = ph.w.tap0 > 0 ? ph.w.tap0 : 0;
        return w + (tp_idx)ci * TP_OUT_C + (tp_idx)(kh * TP_K_W + kw) * TP_CG * TP_OUT_C;
    }
    TP_DEV const float* at(const Line& l, int k) const {
        const tp_tap t = tp_tap_of(k);
        if (t.iw >= ph.w.taps) return nullptr;
        const int taps = t.ih * TP_PER_H * TP_K_W + t.iw * TP_PER_W;
        return l + (tp_idx)taps * TP_CG * TP_OUT_C + t.co;
    }
};

struct tp_conv_bwd_input_out {
    int first_channel;
    tp_phase ph;
    TP_DEV bool valid(int m) const {
        const tp_phase_row r = tp_row_of(m);
        return r.jh < ph.h.count && r.jw < ph.w.count;
    }
    TP_DEV tp_idx flat(int m, int ci) const {
        const tp_phase_row r = tp_row_of(m);
        const int h = ph.h.first + r.jh * TP_STRIDE_H, w = ph.w.first + r.jw * TP_STRIDE_W;
        return (((tp_idx)r.n * TP_IN_H + h) * TP_IN_W + w) * TP_IN_C + first_channel + ci;
    }
    TP_DEV int channel(int ci) const { return first_channel + ci; }
};
#endif

extern "C" __global__ void TP_GEMM_BOUNDS tp_conv2d_backprop_input(const tp_params p) {
    // One group: g is the constant 0, not a value ptxas keeps live across the K loop.
    const int g = TP_GROUPS == 1 ? 0 : blockIdx.z / TP_SPLIT_K, split = blockIdx.z % TP_SPLIT_K;
#if TP_PHASES == 1
    const int phase = 0, tile = blockIdx.x;
#else
    const int phase = blockIdx.x / TP_PHASE_TILES, tile = blockIdx.x % TP_PHASE_TILES;
#endif
    const tp_phase ph = tp_phase_of(phase);
    const tp_conv_bwd_input_a la = {p.dy + g * TP_OG, ph};
    const tp_conv_bwd_input_b lb = {p.filter + g * TP_OG, ph};
    constexpr int M = TP_BATCH * TP_PH_H * TP_PH_W;
    // The phase's tap rows (none when it has no taps along w: its pixels receive nothing).
    const int K = (ph.w.taps > 0 ? ph.h.taps : 0) * TP_TAPS_W * TP_OG;
    const int m0 = tile * TP_BM, n0 = blockIdx.y * TP_BN;
    // A split past the phase's K has nothing to add: its partial is zeros.
    const int k0 = split * TP_K_CHUNK, k1 = K - k0 < TP_K_CHUNK ? K : k0 + TP_K_CHUNK;
    float acc[TP_TM][TP_TN];
    tp_gemm_tile(la, lb, M, TP_CG, k0, k1, m0, n0, acc);
    const tp_conv_bwd_input_out out = {g * TP_CG, ph};
    tp_gemm_output(p, out, M, TP_CG, m0, n0, (g * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x,
                   split, acc);
}
