// Gradients of 2-D max and average pooling over NHWC, as gathers (no atomics, deterministic):
// one thread per input cell sums the dy of every window covering it, visiting windows in the
// row-major order the CPU backend scatters them. Max pooling routes a window's dy to the FIRST
// maximum of its in-bounds cells (NaN counting as the largest); average pooling spreads it over
// the window's in-bounds cells.
//
// Generated hooks: TP_BLOCK, TP_MAX_POOL (constexpr bool), tp_idx, struct tp_params { x (max
//   only), dy, dx, geometry as pool.cu }. Grid-stride over the input cells.

// The in-bounds extent [lo, hi) of window `o` along one axis.
TP_DEV void tp_window(int o, int stride, int pad, int win, int len, int& lo, int& hi) {
    const int start = o * stride - pad;
    lo = max(start, 0);
    hi = min(start + win, len);
}

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_pool_grad(const tp_params p) {
    const tp_idx total = (tp_idx)p.batch * p.in_h * p.in_w * p.channels;
    const tp_idx step = (tp_idx)gridDim.x * TP_BLOCK;
    for (tp_idx i = (tp_idx)blockIdx.x * TP_BLOCK + threadIdx.x; i < total; i += step) {
        const int c = i % p.channels;
        tp_idx t = i / p.channels;
        const int iw = t % p.in_w;
        t /= p.in_w;
        const int ih = t % p.in_h;
        const tp_idx n = t / p.in_h;
        // Output windows whose span can include (ih, iw).
        const int oh_lo = max((ih + p.pad_top - p.win_h) / p.stride_h, 0);
        const int oh_hi = min((ih + p.pad_top) / p.stride_h, p.out_h - 1);
        const int ow_lo = max((iw + p.pad_left - p.win_w) / p.stride_w, 0);
        const int ow_hi = min((iw + p.pad_left) / p.stride_w, p.out_w - 1);
        const tp_idx image = n * p.in_h * p.in_w * p.channels + c;
        const tp_idx out_image = n * p.out_h * p.out_w * p.channels + c;
        float sum = 0.0f;
        for (int oh = oh_lo; oh <= oh_hi; ++oh) {
            int h0, h1;
            tp_window(oh, p.stride_h, p.pad_top, p.win_h, p.in_h, h0, h1);
            if (ih < h0 || ih >= h1) continue;
            for (int ow = ow_lo; ow <= ow_hi; ++ow) {
                int w0, w1;
                tp_window(ow, p.stride_w, p.pad_left, p.win_w, p.in_w, w0, w1);
                if (iw < w0 || iw >= w1) continue;
                const float d = p.dy[out_image + ((tp_idx)oh * p.out_w + ow) * p.channels];
                if (TP_MAX_POOL) {
                    // Is (ih, iw) the first maximum of this window?
                    int bh = -1, bw = -1;
                    float best = 0.0f;
                    for (int h = h0; h < h1; ++h) {
                        for (int w = w0; w < w1; ++w) {
                            const float v = p.x[image + ((tp_idx)h * p.in_w + w) * p.channels];
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
