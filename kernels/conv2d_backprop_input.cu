// Gradient of a 2-D convolution with respect to its NHWC input, as an implicit GEMM on the tiled
// core: rows are input pixels (M = n.h.w), columns the group's input channels (N = c / groups),
// K runs over (kh, kw, co) with co fastest. A gathers dy at the output pixel each tap came from
// (zero where the stride skips it or it falls outside); B reads the filter transposed in place.
// Element (m, ci) of dx goes through the epilogue hook.
//
// Generated hooks: as conv2d.cu, with pointers dy and filter.
// Grid: (ceil(M / TP_BM), ceil(N / TP_BN), groups).

struct tp_conv_bwd_input_a {
    const tp_params& p;
    const float* dy;
    int og;
    enum { K_FAST = true };
    struct Line {
        const float* image;
        int hp, wp;
    };
    TP_DEV Line line(int m) const {
        const int w = m % p.in_w, t = m / p.in_w;
        const int h = t % p.in_h, n = t / p.in_h;
        return {dy + (tp_idx)n * p.out_h * p.out_w * p.out_c, h + p.pad_top, w + p.pad_left};
    }
    TP_DEV float at(const Line& l, int k) const {
        const int co = k % og, t = k / og;
        const int kw = t % p.k_w, kh = t / p.k_w;
        const int ohs = l.hp - kh * p.dil_h, ows = l.wp - kw * p.dil_w;
        if (ohs < 0 || ows < 0 || ohs % p.stride_h != 0 || ows % p.stride_w != 0) return 0.0f;
        const int oh = ohs / p.stride_h, ow = ows / p.stride_w;
        if (oh >= p.out_h || ow >= p.out_w) return 0.0f;
        return l.image[((tp_idx)oh * p.out_w + ow) * p.out_c + co];
    }
};

struct tp_conv_bwd_input_b {
    const float* w;
    int o, cg, og;
    enum { K_FAST = true };
    typedef const float* Line;
    TP_DEV Line line(int ci) const { return w + (tp_idx)ci * o; }
    TP_DEV float at(const Line& l, int k) const { return l[(tp_idx)(k / og) * cg * o + k % og]; }
};

struct tp_conv_bwd_input_store {
    const tp_params& p;
    int first_channel;
    TP_DEV void operator()(int m, int ci, float v) const {
        tp_epilogue(p, (tp_idx)m * p.in_c + first_channel + ci, v);
    }
};

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_conv2d_backprop_input(const tp_params p) {
    const int g = blockIdx.z, cg = p.in_c / p.groups, og = p.out_c / p.groups;
    const tp_conv_bwd_input_a la = {p, p.dy + g * og, og};
    const tp_conv_bwd_input_b lb = {p.filter + g * og, p.out_c, cg, og};
    const int M = p.batch * p.in_h * p.in_w, K = p.k_h * p.k_w * og;
    const int m0 = blockIdx.x * TP_BM, n0 = blockIdx.y * TP_BN;
    float acc[TP_TM][TP_TN];
    tp_gemm_tile(la, lb, M, cg, K, m0, n0, acc);
    const tp_conv_bwd_input_store store = {p, g * cg};
    tp_gemm_store(store, M, cg, m0, n0, acc);
}
