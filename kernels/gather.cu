// Data movement by gather: out[i] = tp_gather(p, i) for every output element, where the
// generated hook says where element i comes from (concatenation, zero padding). Elements are
// copied as raw words of their size (tp_elem), whatever their dtype.
//
// Generated hooks: TP_BLOCK, TP_POINTS, tp_idx, tp_elem, struct tp_params { out, in0.. },
//   tp_gather(p, i).

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_gather_kernel(const tp_params p) {
    const tp_idx step = (tp_idx)gridDim.x * TP_BLOCK;
    for (tp_idx i = (tp_idx)blockIdx.x * TP_BLOCK + threadIdx.x; i < TP_POINTS; i += step) {
        p.out[i] = tp_gather(p, i);
    }
}
