// Fused elementwise kernel: one generated expression evaluated at every point of an iteration
// space (src/lower/expr.rs). Grid-stride loop over flat points.
//
// Generated hooks: TP_BLOCK, TP_POINTS, tp_idx, struct tp_params,
//   tp_point(p, i): loads the operands at flat point i, evaluates, stores every output.

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_elementwise(const tp_params p) {
    const tp_idx step = (tp_idx)gridDim.x * TP_BLOCK;
    for (tp_idx i = (tp_idx)blockIdx.x * TP_BLOCK + threadIdx.x; i < TP_POINTS; i += step) {
        tp_point(p, i);
    }
}
