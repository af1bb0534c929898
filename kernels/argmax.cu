// Index of the first maximum along the middle axis of an [outer, len, inner] f32 tensor, as
// i64; NaN counts as the largest value. One thread per (outer, inner) output.
//
// Generated hooks: TP_BLOCK, tp_idx, struct tp_params { x, y, outer, len, inner }.

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_argmax(const tp_params p) {
    const tp_idx total = (tp_idx)p.outer * p.inner;
    const tp_idx step = (tp_idx)gridDim.x * TP_BLOCK;
    for (tp_idx i = (tp_idx)blockIdx.x * TP_BLOCK + threadIdx.x; i < total; i += step) {
        const tp_idx o = i / p.inner, in = i % p.inner;
        const float* x = p.x + o * p.len * p.inner + in;
        long long best = 0;
        float best_v = -tp_inff();
        for (int l = 0; l < p.len; ++l) {
            const float v = x[(tp_idx)l * p.inner];
            if (best_v == best_v && (v != v || v > best_v || l == 0)) {
                best = l;
                best_v = v;
            }
        }
        p.y[i] = best;
    }
}
