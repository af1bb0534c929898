// Gradient of a 2-D convolution with respect to its HWIO filter, as an implicit GEMM on the tiled
// core: rows are filter taps (M = kh.kw.ci, ci fastest), columns the group's output channels
// (N = o / groups), K runs over output pixels (n.oh.ow). A gathers x at the input pixel each tap
// reads for that output pixel (zero in the padding; 4 channels of a tap at once when
// TP_VEC_A = 4); B reads dy in place. K is long and M.N small, so K is split across
// TP_SPLIT_K blocks per tile whose partial tiles are combined in a fixed order
// (kernels/split.cuh): enough blocks to fill the device, the same bits on every run.
//
// Generated hooks: as conv2d.cu, with pointers x and dy; tp_epilogue stores dw.
// Grid: (ceil(M / TP_BM), ceil(N / TP_BN), groups * TP_SPLIT_K).

#define TP_CG (TP_IN_C / TP_GROUPS)
#define TP_OG (TP_OUT_C / TP_GROUPS)

struct tp_conv_bwd_filter_a {
    const float* x;
    // With TP_OUT_W a multiple of TP_BK, a K tile's pixels lie in one output row: the input row
    // they read is found once per tile (K_TILE), and each pixel is a step along it.
    enum { K_FAST = false, VEC = TP_VEC_A, K_RUN = 1, K_TILE = TP_OUT_W % TP_BK == 0 };
    struct Line {
        const float* channel;
        int dh, dw;
    };
    // The input row a K tile's pixels read for this line's tap (null when the tap falls in
    // the padding above or below) and the input column of its first pixel.
    struct Tile {
        const float* row;
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
    TP_DEV const float* at(const Line&, const Tile& t, int j) const {
        const int iw = t.iw0 + j * TP_STRIDE_W;
        return t.row && (unsigned)iw < TP_IN_W ? t.row + (tp_idx)iw * TP_IN_C : nullptr;
    }
    TP_DEV Line line(int m) const {
        const int ci = m % TP_CG, t = m / TP_CG;
        const int kw = t % TP_K_W, kh = t / TP_K_W;
        return {x + ci, kh * TP_DIL_H - TP_PAD_TOP, kw * TP_DIL_W - TP_PAD_LEFT};
    }
    TP_DEV const float* at(const Line& l, int k) const {
        const int ow = k % TP_OUT_W, t = k / TP_OUT_W;
        const int oh = t % TP_OUT_H, n = t / TP_OUT_H;
        const int ih = oh * TP_STRIDE_H + l.dh, iw = ow * TP_STRIDE_W + l.dw;
        if (ih < 0 || ih >= TP_IN_H || iw < 0 || iw >= TP_IN_W) return nullptr;
        return l.channel + (((tp_idx)n * TP_IN_H + ih) * TP_IN_W + iw) * TP_IN_C;
    }
};

struct tp_conv_bwd_filter_b {
    const float* dy;
    enum { K_FAST = false, VEC = TP_VEC_B, K_RUN = 1, K_TILE = 0 };
    typedef const float* Line;
    TP_DEV Line line(int co) const { return dy + co; }
    TP_DEV const float* at(const Line& l, int k) const { return l + (tp_idx)k * TP_OUT_C; }
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
    const tp_conv_bwd_filter_a la = {p.x + g * TP_CG};
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
