// Gradients of 2-D max and average pooling over NHWC, as gathers (no atomics, deterministic):
// one thread per input cell sums the dy of every window covering it, visiting windows in the
// row-major order the CPU backend scatters them. Max pooling routes a window's dy to the FIRST
// maximum of its in-bounds cells (NaN counting as the largest); average pooling spreads it over
// the window's in-bounds cells.
//
// Generated hooks: TP_BLOCK, TP_MAX_POOL (constexpr bool), tp_idx, struct tp_params { x (max
//   only), dy, dx }, the geometry's constants as pool.cu. Grid-stride over the input cells.

// The in-bounds extent [lo, hi) of window `o` along one axis.
TP_DEV void tp_window(int o, int stride, int pad, int win, int len, int& lo, int& hi) {
    const int start = o * stride - pad;
    lo = max(start, 0);
    hi = min(start + win, len);
}

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_pool_grad(const tp_params p) {
    const tp_idx total = (tp_idx)TP_BATCH * TP_IN_H * TP_IN_W * TP_C;
    const tp_idx step = (tp_idx)gridDim.x * TP_BLOCK;
    for (tp_idx i = (tp_idx)blockIdx.x * TP_BLOCK + threadIdx.x; i < total; i += step) {
        const int c = i % TP_C;
        tp_idx t = i / TP_C;
        const int iw = t % TP_IN_W;
        t /= TP_IN_W;
        const int ih = t % TP_IN_H;
        const tp_idx n = t / TP_IN_H;
        // Output windows whose span includes (ih, iw): o with o*s - pad <= i < o*s - pad + win,
        // the first floor((i + pad - win) / s) + 1 (a negative numerator's truncated quotient
        // clamps to 0 as its floor would), the last floor((i + pad) / s).
        const int oh_lo = max((ih + TP_PAD_TOP - TP_WIN_H + TP_STRIDE_H) / TP_STRIDE_H, 0);
        const int oh_hi = min((ih + TP_PAD_TOP) / TP_STRIDE_H, TP_OUT_H - 1);
        const int ow_lo = max((iw + TP_PAD_LEFT - TP_WIN_W + TP_STRIDE_W) / TP_STRIDE_W, 0);
        const int ow_hi = min((iw + TP_PAD_LEFT) / TP_STRIDE_W, TP_OUT_W - 1);
        const tp_idx image = n * TP_IN_H * TP_IN_W * TP_C + c;
        const tp_idx out_image = n * TP_OUT_H * TP_OUT_W * TP_C + c;
        float sum = 0.0f;
        for (int oh = oh_lo; oh <= oh_hi; ++oh) {
            int h0, h1;
            tp_window(oh, TP_STRIDE_H, TP_PAD_TOP, TP_WIN_H, TP_IN_H, h0, h1);
            if (ih < h0 || ih >= h1) continue;
            for (int ow = ow_lo; ow <= ow_hi; ++ow) {
                int w0, w1;
                tp_window(ow, TP_STRIDE_W, TP_PAD_LEFT, TP_WIN_W, TP_IN_W, w0, w1);
                if (iw < w0 || iw >= w1) continue;
                const float d = p.dy[out_image + ((tp_idx)oh * TP_OUT_W + ow) * TP_C];
                if (TP_MAX_POOL) {
                    // Is (ih, iw) the first maximum of this window?
                    int bh = -1, bw = -1;
                    float best = 0.0f;
                    for (int h = h0; h < h1; ++h) {
                        for (int w = w0; w < w1; ++w) {
                            const float v = p.x[image + ((tp_idx)h * TP_IN_W + w) * TP_C];
                            if (bh < 0 || (best == best && (v > best || v != v))) {
                                best = v;
                                bh = h;
                                bw = w;
                            }
                        }
                    }
                    if (bh == ih && bw == iw) sum += d;
                } else {
                    sum += d * (1.0f / (float)max((h1 - h0) * (w1 - w0), 1));
                }
            }
        }
        p.dx[i] = sum;
    }
}
