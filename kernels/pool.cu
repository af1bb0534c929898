// 2-D max or average pooling over NHWC, one thread per output element. Windows ignore padding:
// max takes the largest in-bounds cell (NaN counts as the largest), average divides by the
// number of in-bounds cells (as TF and the CPU backend).
//
// Generated hooks: TP_BLOCK, TP_MAX_POOL (constexpr bool), tp_idx, struct tp_params { x, y },
//   and the geometry as compile-time constants (divisions by them compile to multiplications):
//   TP_BATCH, TP_IN_H, TP_IN_W, TP_C, TP_OUT_H, TP_OUT_W, TP_WIN_H, TP_WIN_W, TP_STRIDE_H,
//   TP_STRIDE_W, TP_PAD_TOP, TP_PAD_LEFT. Grid-stride over the outputs.

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_pool(const tp_params p) {
    const tp_idx total = (tp_idx)TP_BATCH * TP_OUT_H * TP_OUT_W * TP_C;
    const tp_idx step = (tp_idx)gridDim.x * TP_BLOCK;
    for (tp_idx i = (tp_idx)blockIdx.x * TP_BLOCK + threadIdx.x; i < total; i += step) {
        const int c = i % TP_C;
        tp_idx t = i / TP_C;
        const int ow = t % TP_OUT_W;
        t /= TP_OUT_W;
        const int oh = t % TP_OUT_H;
        const tp_idx n = t / TP_OUT_H;
        const int h0 = oh * TP_STRIDE_H - TP_PAD_TOP, w0 = ow * TP_STRIDE_W - TP_PAD_LEFT;
        const int h1 = min(h0 + TP_WIN_H, TP_IN_H), w1 = min(w0 + TP_WIN_W, TP_IN_W);
        const float* image = p.x + n * TP_IN_H * TP_IN_W * TP_C + c;
        float acc = TP_MAX_POOL ? -tp_inff() : 0.0f;
        for (int ih = max(h0, 0); ih < h1; ++ih) {
            for (int iw = max(w0, 0); iw < w1; ++iw) {
                const float v = image[((tp_idx)ih * TP_IN_W + iw) * TP_C];
                if (TP_MAX_POOL) {
                    acc = (acc != acc || v <= acc) ? acc : v;
                } else {
                    acc += v;
                }
            }
        }
        if (!TP_MAX_POOL) {
            const int count = max(h1 - max(h0, 0), 0) * max(w1 - max(w0, 0), 0);
            acc *= 1.0f / (float)max(count, 1);
        }
        p.y[i] = acc;
    }
}
