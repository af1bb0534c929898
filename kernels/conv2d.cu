// 2-D convolution forward, NHWC input and HWIO filter, as an implicit GEMM on the tiled core:
// rows are output pixels (M = n.oh.ow), columns the group's output channels (N = o / groups),
// K runs over (kh, kw, ci) with ci fastest, so A is gathered from x on the fly (zero padding)
// and B is the filter read in place. Output element (m, co) goes through the epilogue hook.
//
// Generated hooks: TP_BLOCK, tp_idx, struct tp_params { x, filter, conv geometry (batch, in_h, in_w, in_c,
//   out_h, out_w, out_c, k_h, k_w, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, groups),
//   tp_epilogue(p, flat, value). Grid: (ceil(M / TP_BM), ceil(N / TP_BN), groups).

struct tp_conv_fwd_a {
    const tp_params& p;
    const float* x;
    int cg;
    enum { K_FAST = true };
    struct Line {
        const float* image;
        int ih0, iw0;
    };
    TP_DEV Line line(int m) const {
        const int ow = m % p.out_w, t = m / p.out_w;
        const int oh = t % p.out_h, n = t / p.out_h;
        return {x + (tp_idx)n * p.in_h * p.in_w * p.in_c, oh * p.stride_h - p.pad_top,
                ow * p.stride_w - p.pad_left};
    }
    TP_DEV float at(const Line& l, int k) const {
        const int ci = k % cg, t = k / cg;
        const int kw = t % p.k_w, kh = t / p.k_w;
        const int ih = l.ih0 + kh * p.dil_h, iw = l.iw0 + kw * p.dil_w;
        if (ih < 0 || ih >= p.in_h || iw < 0 || iw >= p.in_w) return 0.0f;
        return l.image[((tp_idx)ih * p.in_w + iw) * p.in_c + ci];
    }
};

struct tp_conv_fwd_b {
    const float* w;
    int o;
    enum { K_FAST = false };
    typedef const float* Line;
    TP_DEV Line line(int co) const { return w + co; }
    TP_DEV float at(const Line& l, int k) const { return l[(tp_idx)k * o]; }
};

struct tp_conv_fwd_store {
    const tp_params& p;
    int first_channel;
    TP_DEV void operator()(int m, int co, float v) const {
        tp_epilogue(p, (tp_idx)m * p.out_c + first_channel + co, v);
    }
};

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_conv2d(const tp_params p) {
    const int g = blockIdx.z, cg = p.in_c / p.groups, og = p.out_c / p.groups;
    const tp_conv_fwd_a la = {p, p.x + g * cg, cg};
    const tp_conv_fwd_b lb = {p.filter + g * og, p.out_c};
    const int M = p.batch * p.out_h * p.out_w, K = p.k_h * p.k_w * cg;
    const int m0 = blockIdx.x * TP_BM, n0 = blockIdx.y * TP_BN;
    float acc[TP_TM][TP_TN];
    tp_gemm_tile(la, lb, M, og, K, m0, n0, acc);
    const tp_conv_fwd_store store = {p, g * og};
    tp_gemm_store(store, M, og, m0, n0, acc);
}
