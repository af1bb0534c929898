// Reduction kernel with a fused prologue: output element o folds the prologue's values at the
// TP_RED input points that reduce into it. A block owns TP_TILE_O consecutive outputs; its
// TP_BLOCK / TP_TILE_O reduction lanes stride over the reduced points, then a shared-memory tree
// combines the lanes in a fixed order, so the result does not depend on scheduling.
//
// Generated hooks: TP_BLOCK, TP_TILE_O, TP_OUT, TP_RED, tp_idx, struct tp_params, struct tp_acc,
//   tp_init(acc), tp_fold(p, acc, o, r) (prologue at point (o, r) folded into acc),
//   tp_merge(acc, other), tp_finish(p, o, acc) (mean scaling, conversion, store).

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_reduce(const tp_params p) {
    __shared__ tp_acc part[TP_BLOCK];
    constexpr unsigned int LANES = TP_BLOCK / TP_TILE_O;
    const unsigned int lane_o = threadIdx.x % TP_TILE_O;
    const unsigned int lane_r = threadIdx.x / TP_TILE_O;
    for (tp_idx o0 = (tp_idx)blockIdx.x * TP_TILE_O; o0 < TP_OUT; o0 += (tp_idx)gridDim.x * TP_TILE_O) {
        const tp_idx o = o0 + lane_o;
        tp_acc acc;
        tp_init(acc);
        if (o < TP_OUT) {
            // Not unrolled: unrolled, ptxas (12.9, sm_90) spills for some multi-output prologues.
#pragma unroll 1
            for (tp_idx r = lane_r; r < TP_RED; r += LANES) tp_fold(p, acc, o, r);
        }
        part[threadIdx.x] = acc;
        __syncthreads();
        for (unsigned int s = LANES / 2; s > 0; s >>= 1) {
            if (lane_r < s) tp_merge(part[threadIdx.x], part[threadIdx.x + s * TP_TILE_O]);
            __syncthreads();
        }
        if (lane_r == 0 && o < TP_OUT) tp_finish(p, o, part[threadIdx.x]);
        __syncthreads();
    }
}
