// Sparse softmax cross-entropy: loss[r] = logsumexp(logits[r]) - logits[r, label[r]]. One warp
// per row. A label outside [0, classes) makes the row's loss NaN and reports (code, row) to the
// status word, which the session turns into an error naming the kernel.
//
// Generated hooks: TP_BLOCK, tp_idx, tp_label, struct tp_params { logits, labels, loss, status,
//   rows, classes, code }. Uses warp.cuh. Grid: ceil(rows / (TP_BLOCK / 32)) blocks.

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_sparse_xent(const tp_params p) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * (TP_BLOCK / 32) + threadIdx.x / 32;
    if (row >= p.rows) return;  // whole warps leave together
    const float* x = p.logits + (tp_idx)row * p.classes;
    float m, s;
    tp_row_max_sum(x, p.classes, m, s);
    if (lane == 0) {
        const long long label = (long long)p.labels[row];
        if (label < 0 || label >= p.classes) {
            tp_report(p.status, p.code, (unsigned int)row);
            p.loss[row] = tp_nanf();
        } else {
            p.loss[row] = tp_lse(m, s) - x[label];
        }
    }
}
