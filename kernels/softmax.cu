// Row-wise softmax (or log-softmax, TP_LOG) of a [rows, cols] matrix. One warp per row.
//
// Generated hooks: TP_BLOCK, TP_LOG (constexpr bool), tp_idx, struct tp_params { x, y, rows,
//   cols }. Uses warp.cuh. Grid: ceil(rows / (TP_BLOCK / 32)) blocks.

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_softmax(const tp_params p) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * (TP_BLOCK / 32) + threadIdx.x / 32;
    if (row >= p.rows) return;  // whole warps leave together
    const float* x = p.x + (tp_idx)row * p.cols;
    float* y = p.y + (tp_idx)row * p.cols;
    float m, s;
    tp_row_max_sum(x, p.cols, m, s);
    if (TP_LOG) {
        const float lse = tp_lse(m, s);
        for (int c = lane; c < p.cols; c += 32) y[c] = x[c] - lse;
    } else {
        const float inv = 1.0f / s;
        for (int c = lane; c < p.cols; c += 32) y[c] = expf(x[c] - m) * inv;
    }
}
