// Gradient of a 2-D convolution with respect to its HWIO filter, as an implicit GEMM on the tiled
// core: rows are filter taps (M = kh.kw.ci, ci fastest), columns the group's output channels
// (N = o / groups), K runs over output pixels (n.oh.ow). A gathers x at the input pixel each tap
// reads for that output pixel (zero in the padding); B reads dy in place.
//
// Generated hooks: as conv2d.cu, with pointers x and dy; tp_epilogue stores dw.
// Grid: (ceil(M / TP_BM), ceil(N / TP_BN), groups).

struct tp_conv_bwd_filter_a {
    const tp_params& p;
    const float* x;
    int cg;
    enum { K_FAST = false };
    struct Line {
        const float* channel;
        int dh, dw;
    };
    TP_DEV Line line(int m) const {
        const int ci = m % cg, t = m / cg;
        const int kw = t % p.k_w, kh = t / p.k_w;
        return {x + ci, kh * p.dil_h - p.pad_top, kw * p.dil_w - p.pad_left};
    }
    TP_DEV float at(const Line& l, int k) const {
        const int ow = k % p.out_w, t = k / p.out_w;
        const int oh = t % p.out_h, n = t / p.out_h;
        const int ih = oh * p.stride_h + l.dh, iw = ow * p.stride_w + l.dw;
        if (ih < 0 || ih >= p.in_h || iw < 0 || iw >= p.in_w) return 0.0f;
        return l.channel[(((tp_idx)n * p.in_h + ih) * p.in_w + iw) * p.in_c];
    }
};

struct tp_conv_bwd_filter_b {
    const float* dy;
    int o;
    enum { K_FAST = false };
    typedef const float* Line;
    TP_DEV Line line(int co) const { return dy + co; }
    TP_DEV float at(const Line& l, int k) const { return l[(tp_idx)k * o]; }
};

struct tp_conv_bwd_filter_store {
    const tp_params& p;
    int first_channel;
    TP_DEV void operator()(int m, int co, float v) const {
        tp_epilogue(p, (tp_idx)m * p.out_c + first_channel + co, v);
    }
};

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_conv2d_backprop_filter(const tp_params p) {
    const int g = blockIdx.z, cg = p.in_c / p.groups, og = p.out_c / p.groups;
    const tp_conv_bwd_filter_a la = {p, p.x + g * cg, cg};
    const tp_conv_bwd_filter_b lb = {p.dy + g * og, p.out_c};
    const int M = p.k_h * p.k_w * cg, K = p.batch * p.out_h * p.out_w;
    const int m0 = blockIdx.x * TP_BM, n0 = blockIdx.y * TP_BN;
    float acc[TP_TM][TP_TN];
    tp_gemm_tile(la, lb, M, og, K, m0, n0, acc);
    const tp_conv_bwd_filter_store store = {p, g * og};
    tp_gemm_store(store, M, og, m0, n0, acc);
}
