// 2-D max or average pooling over NHWC, one thread per output element. Windows ignore padding:
// max takes the largest in-bounds cell (NaN counts as the largest), average divides by the
// number of in-bounds cells (as TF and the CPU backend).
//
// Generated hooks: TP_BLOCK, TP_MAX_POOL (constexpr bool), tp_idx, struct tp_params { x, y,
//   batch, in_h, in_w, channels, out_h, out_w, win_h, win_w, stride_h, stride_w, pad_top,
//   pad_left }. Grid-stride over the outputs.

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_pool(const tp_params p) {
    const tp_idx total = (tp_idx)p.batch * p.out_h * p.out_w * p.channels;
    const tp_idx step = (tp_idx)gridDim.x * TP_BLOCK;
    for (tp_idx i = (tp_idx)blockIdx.x * TP_BLOCK + threadIdx.x; i < total; i += step) {
        const int c = i % p.channels;
        tp_idx t = i / p.channels;
        const int ow = t % p.out_w;
        t /= p.out_w;
        const int oh = t % p.out_h;
        const tp_idx n = t / p.out_h;
        const int h0 = oh * p.stride_h - p.pad_top, w0 = ow * p.stride_w - p.pad_left;
        const int h1 = min(h0 + p.win_h, p.in_h), w1 = min(w0 + p.win_w, p.in_w);
        const float* image = p.x + n * p.in_h * p.in_w * p.channels + c;
        float acc = TP_MAX_POOL ? -tp_inff() : 0.0f;
        for (int ih = max(h0, 0); ih < h1; ++ih) {
            for (int iw = max(w0, 0); iw < w1; ++iw) {
                const float v = image[((tp_idx)ih * p.in_w + iw) * p.channels];
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
