// TF's in_top_k: whether each row's target is among its k largest predictions (fewer than k
// entries strictly greater than the target's). A row with a non-finite score or an
// out-of-range target is never in the top k. One thread per row.
//
// Generated hooks: TP_BLOCK, tp_idx, tp_label, struct tp_params { preds, targets, y, rows,
//   classes, k }.

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_in_top_k(const tp_params p) {
    const tp_idx step = (tp_idx)gridDim.x * TP_BLOCK;
    for (tp_idx r = (tp_idx)blockIdx.x * TP_BLOCK + threadIdx.x; r < (tp_idx)p.rows; r += step) {
        const float* row = p.preds + r * p.classes;
        const long long t = (long long)p.targets[r];
        bool hit = t >= 0 && t < p.classes;
        const float score = hit ? row[t] : 0.0f;
        int greater = 0;
        for (int c = 0; c < p.classes; ++c) {
            const float v = row[c];
            if (!isfinite(v)) hit = false;
            if (v > score) ++greater;
        }
        p.y[r] = (unsigned char)(hit && greater < p.k);
    }
}
