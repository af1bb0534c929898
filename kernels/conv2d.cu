// 2-D convolution forward, NHWC input and HWIO filter, as an implicit GEMM on the tiled core:
// rows are output pixels (M = n.oh.ow), columns the group's output channels (N = o / groups),
// K runs over (kh, kw, ci) with ci fastest, so A is gathered from x on the fly (zero padding;
// 4 channels of a tap at once when TP_VEC_A = 4) and B is the filter read in place. Output
// element (m, co) goes through the epilogue hook; per-channel epilogue reductions (batch-norm
// statistics) are summed over the rows as the tile is stored (kernels/gemm_core.cuh).
//
// Generated hooks: TP_BLOCK, tp_idx, the geometry (TP_BATCH, TP_IN_H, TP_IN_W, TP_IN_C,
//   TP_OUT_H, TP_OUT_W, TP_OUT_C, TP_K_H, TP_K_W, TP_STRIDE_H, TP_STRIDE_W, TP_DIL_H, TP_DIL_W,
//   TP_PAD_TOP, TP_PAD_LEFT, TP_GROUPS: compile-time, so divisions are multiplications), the
//   GEMM constants of gemm_core.cuh, struct tp_params { x, filter, epilogue operands, outputs,
//   workspace }, tp_x_elem (x's storage: float, or tp_bf16 for an activation stored in bf16),
//   tp_epilogue; with TP_PROLOGUE, tp_prologue(p, flat, x) computes x (a
//   convolution prologue: gemm_core.cuh).
// Grid: (ceil(M / TP_BM), ceil(N / TP_BN), groups * TP_SPLIT_K).

#define TP_CG (TP_IN_C / TP_GROUPS)
#define TP_OG (TP_OUT_C / TP_GROUPS)

struct tp_conv_fwd_a {
    typedef tp_x_elem Elem;  // x's storage: f32, or bf16 (gemm_core.cuh tp_bf16)
    const Elem* x;
    const tp_params& p;  // the prologue's operands (TP_PROLOGUE)
    enum { K_FAST = true, VEC = TP_VEC_A, K_RUN = TP_CG, K_TILE = 0 };  // a tap's channels
    enum { PROLOGUE = TP_PROLOGUE };
    struct Line {
        const Elem* image;
        int ih0, iw0;
    };
    TP_DEV Line line(int m) const {
        const int ow = m % TP_OUT_W, t = m / TP_OUT_W;
        const int oh = t % TP_OUT_H, n = t / TP_OUT_H;
        return {x + (tp_idx)n * TP_IN_H * TP_IN_W * TP_IN_C, oh * TP_STRIDE_H - TP_PAD_TOP,
                ow * TP_STRIDE_W - TP_PAD_LEFT};
    }
    TP_DEV const Elem* at(const Line& l, int k) const {
        const int ci = k % TP_CG, t = k / TP_CG;
        const int kw = t % TP_K_W, kh = t / TP_K_W;
        const int ih = l.ih0 + kh * TP_DIL_H, iw = l.iw0 + kw * TP_DIL_W;
        // Arithmetic, not a branch (tp_keep_if): the loads of a thread's elements, predicated
        // on the address, then go out together (gemm_core.cuh tp_vec::load_or_zero).
        const bool inside = ((unsigned)ih < TP_IN_H) & ((unsigned)iw < TP_IN_W);
        return tp_keep_if(inside, l.image + ((tp_idx)ih * TP_IN_W + iw) * TP_IN_C + ci);
    }
#if TP_WINDOW
    // The window of a row tile (kernels/gemm_core.cuh tp_window; stride and dilation 1, the
    // tile TP_BM / TP_OUT_W whole output rows of one image): input rows oh0 - pad_top .. and
    // columns -pad_left .., what the taps of those rows read.
    enum {
        WIN_H = TP_BM / TP_OUT_W + TP_K_H - 1,
        WIN_W = TP_OUT_W + TP_K_W - 1,
        WIN_C = TP_CG,
        WIN_K = TP_K_H * TP_K_W * TP_CG
    };
    static_assert(TP_STRIDE_H == 1 && TP_STRIDE_W == 1 && TP_DIL_H == 1 && TP_DIL_W == 1 &&
                      TP_BM % TP_OUT_W == 0 && TP_OUT_H * TP_OUT_W % TP_BM == 0,
                  "a window of whole output rows");
    // The window pixel of tap (0, 0) of the tile's row mm, and the pixel offset and first
    // channel of the K tile starting at k.
    static TP_DEV int win_row(int mm) { return mm / TP_OUT_W * WIN_W + mm % TP_OUT_W; }
    static TP_DEV int win_tap(int k) {
        const int t = k / TP_CG;
        return t / TP_K_W * WIN_W + t % TP_K_W;
    }
    static TP_DEV int win_channel(int k) { return k % TP_CG; }
    // The channels of window pixel px of the tile starting at row m0, or null past the image.
    TP_DEV const Elem* win_source(int m0, int px) const {
        const int n = m0 / (TP_OUT_H * TP_OUT_W), oh0 = m0 / TP_OUT_W % TP_OUT_H;
        const int ih = oh0 - TP_PAD_TOP + px / WIN_W, iw = px % WIN_W - TP_PAD_LEFT;
        if (ih < 0 || ih >= TP_IN_H || iw < 0 || iw >= TP_IN_W) return nullptr;
        return x + (((tp_idx)n * TP_IN_H + ih) * TP_IN_W + iw) * TP_IN_C;
    }
#endif
};

struct tp_conv_fwd_b {
    const float* w;
    enum { K_FAST = false, VEC = TP_VEC_B, K_RUN = 1, K_TILE = 0 };
    typedef const float* Line;
    TP_DEV Line line(int co) const { return w + co; }
    TP_DEV const float* at(const Line& l, int k) const { return l + (tp_idx)k * TP_OUT_C; }
};

struct tp_conv_fwd_out {
    int first_channel;
    TP_DEV bool valid(int) const { return true; }
    TP_DEV tp_idx flat(int m, int co) const { return (tp_idx)m * TP_OUT_C + first_channel + co; }
    TP_DEV int channel(int co) const { return first_channel + co; }
};

extern "C" __global__ void TP_GEMM_BOUNDS tp_conv2d(const tp_params p) {
    // One group: g is the constant 0, not a value ptxas keeps live across the K loop.
    const int g = TP_GROUPS == 1 ? 0 : blockIdx.z / TP_SPLIT_K, split = blockIdx.z % TP_SPLIT_K;
    const tp_conv_fwd_a la = {p.x + g * TP_CG, p};
    const tp_conv_fwd_b lb = {p.filter + g * TP_OG};
    constexpr int M = TP_BATCH * TP_OUT_H * TP_OUT_W, K = TP_K_H * TP_K_W * TP_CG;
    const int m0 = blockIdx.x * TP_BM, n0 = blockIdx.y * TP_BN;
    const int k0 = split * TP_K_CHUNK, k1 = K - k0 < TP_K_CHUNK ? K : k0 + TP_K_CHUNK;
    float acc[TP_TM][TP_TN];
    tp_gemm_tile(la, lb, M, TP_OG, k0, k1, m0, n0, acc);
    const tp_conv_fwd_out out = {g * TP_OG};
    tp_gemm_output(p, out, M, TP_OG, m0, n0, (g * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x,
                   split, acc);
}
