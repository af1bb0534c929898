// Gradient of a 2-D convolution with respect to its NHWC input, as an implicit GEMM on the tiled
// core: rows are input pixels (M = n.h.w), columns the group's input channels (N = c / groups),
// K runs over (kh, kw, co) with co fastest. A gathers dy at the output pixel each tap came from
// (zero where the stride skips it or it falls outside; 4 channels at once when TP_VEC_A = 4); B
// reads the filter transposed in place. Element (m, ci) of dx goes through the epilogue hook;
// per-channel epilogue reductions (batch norm's gradient sums) are summed as the tile is stored.
//
// Generated hooks: as conv2d.cu, with pointers dy and filter.
// Grid: (ceil(M / TP_BM), ceil(N / TP_BN), groups * TP_SPLIT_K).

#define TP_CG (TP_IN_C / TP_GROUPS)
#define TP_OG (TP_OUT_C / TP_GROUPS)

struct tp_conv_bwd_input_a {
    const float* dy;
    enum { K_FAST = true, VEC = TP_VEC_A };
    struct Line {
        const float* image;
        int hp, wp;
    };
    TP_DEV Line line(int m) const {
        const int w = m % TP_IN_W, t = m / TP_IN_W;
        const int h = t % TP_IN_H, n = t / TP_IN_H;
        return {dy + (tp_idx)n * TP_OUT_H * TP_OUT_W * TP_OUT_C, h + TP_PAD_TOP, w + TP_PAD_LEFT};
    }
    TP_DEV const float* at(const Line& l, int k) const {
        const int co = k % TP_OG, t = k / TP_OG;
        const int kw = t % TP_K_W, kh = t / TP_K_W;
        const int ohs = l.hp - kh * TP_DIL_H, ows = l.wp - kw * TP_DIL_W;
        if (ohs < 0 || ows < 0 || ohs % TP_STRIDE_H != 0 || ows % TP_STRIDE_W != 0) return nullptr;
        const int oh = ohs / TP_STRIDE_H, ow = ows / TP_STRIDE_W;
        if (oh >= TP_OUT_H || ow >= TP_OUT_W) return nullptr;
        return l.image + ((tp_idx)oh * TP_OUT_W + ow) * TP_OUT_C + co;
    }
};

struct tp_conv_bwd_input_b {
    const float* w;
    enum { K_FAST = true, VEC = TP_VEC_B };
    typedef const float* Line;
    TP_DEV Line line(int ci) const { return w + (tp_idx)ci * TP_OUT_C; }
    TP_DEV const float* at(const Line& l, int k) const {
        return l + (tp_idx)(k / TP_OG) * TP_CG * TP_OUT_C + k % TP_OG;
    }
};

struct tp_conv_bwd_input_out {
    int first_channel;
    TP_DEV tp_idx flat(int m, int ci) const { return (tp_idx)m * TP_IN_C + first_channel + ci; }
    TP_DEV int channel(int ci) const { return first_channel + ci; }
};

extern "C" __global__ void TP_GEMM_BOUNDS tp_conv2d_backprop_input(const tp_params p) {
    const int g = blockIdx.z / TP_SPLIT_K, split = blockIdx.z % TP_SPLIT_K;
    const tp_conv_bwd_input_a la = {p.dy + g * TP_OG};
    const tp_conv_bwd_input_b lb = {p.filter + g * TP_OG};
    constexpr int M = TP_BATCH * TP_IN_H * TP_IN_W, K = TP_K_H * TP_K_W * TP_OG;
    const int m0 = blockIdx.x * TP_BM, n0 = blockIdx.y * TP_BN;
    const int k0 = split * TP_K_CHUNK, k1 = K - k0 < TP_K_CHUNK ? K : k0 + TP_K_CHUNK;
    float acc[TP_TM][TP_TN];
    tp_gemm_tile(la, lb, M, TP_CG, k0, k1, m0, n0, acc);
    const tp_conv_bwd_input_out out = {g * TP_CG};
    tp_gemm_output(p, out, M, TP_CG, m0, n0, (g * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x,
                   split, acc);
}
