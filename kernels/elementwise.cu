// Fused elementwise kernel: one generated expression evaluated at every point of an iteration
// space (src/lower/expr.rs). Grid-stride loop over flat points; with TP_UNROLL > 1 a thread
// takes TP_UNROLL points a stride apart at once (tp_points: all their loads, then all their
// stores, so that many loads are in flight a thread), and the points left one at a time.
//
// Generated hooks: TP_BLOCK, TP_POINTS, TP_UNROLL, tp_idx, struct tp_params,
//   tp_point(p, i): loads the operands at flat point i, evaluates, stores every output;
//   tp_points(p, i, step) (TP_UNROLL > 1): the same for points i, i + step, ...

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_elementwise(const tp_params p) {
    const tp_idx step = (tp_idx)gridDim.x * TP_BLOCK;
    tp_idx i = (tp_idx)blockIdx.x * TP_BLOCK + threadIdx.x;
#if TP_UNROLL > 1
    for (; i + (TP_UNROLL - 1) * step < TP_POINTS; i += TP_UNROLL * step) tp_points(p, i, step);
#endif
    for (; i < TP_POINTS; i += step) tp_point(p, i);
}
