// Reduction kernel with a fused prologue: output element o folds the prologue's values at the
// TP_RED input points that reduce into it. A block owns TP_TILE_O consecutive outputs; its
// TP_BLOCK / TP_TILE_O reduction lanes stride over the reduced points, then a shared-memory tree
// combines the lanes in a fixed order, so the result does not depend on scheduling.
//
// Split (TP_SPLIT > 1, chosen when few output tiles would leave the device idle): block
// (t, s) folds the reduced points [s * TP_CHUNK, (s + 1) * TP_CHUNK) of output tile t and stores
// its partials to the workspace (p.ws[s * TP_OUT + o]); the last block of tile t to arrive (an
// atomic count per tile, p.ws_count[t], after a fence) merges the TP_SPLIT partials, lane r
// taking s = r, r + LANES, ..., then the same tree, and resets the count. Which block is last
// does not change the order: the result is bitwise the same on every run.
//
// Generated hooks: TP_BLOCK, TP_TILE_O, TP_OUT, TP_RED, TP_SPLIT, TP_CHUNK, TP_FOLD_UNROLL, tp_idx,
//   struct tp_params, struct tp_acc, tp_init(acc), tp_fold(p, acc, o, r) (prologue at point
//   (o, r) folded into acc), tp_merge(acc, other), tp_finish(p, o, acc) (mean scaling,
//   conversion, store); when split, tp_ws_store / tp_ws_load (partials through L2).

// Merges the lanes of each output in `part` (the fixed tree); lane 0 of output lane_o then
// holds the block's value in part[lane_o].
TP_DEV void tp_reduce_lanes(tp_acc* part, unsigned int lane_r) {
    constexpr unsigned int LANES = TP_BLOCK / TP_TILE_O;
    __syncthreads();
    for (unsigned int s = LANES / 2; s > 0; s >>= 1) {
        if (lane_r < s) tp_merge(part[threadIdx.x], part[threadIdx.x + s * TP_TILE_O]);
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_reduce(const tp_params p) {
    __shared__ tp_acc part[TP_BLOCK];
    constexpr unsigned int LANES = TP_BLOCK / TP_TILE_O;
    const unsigned int lane_o = threadIdx.x % TP_TILE_O;
    const unsigned int lane_r = threadIdx.x / TP_TILE_O;
#if TP_SPLIT > 1
    __shared__ unsigned int last;
    const tp_idx o = (tp_idx)blockIdx.x * TP_TILE_O + lane_o;
    const tp_idx r0 = (tp_idx)blockIdx.y * TP_CHUNK;
    const tp_idx r1 = TP_RED - r0 < TP_CHUNK ? TP_RED : r0 + TP_CHUNK;
    tp_acc acc;
    tp_init(acc);
    if (o < TP_OUT) {
        // Eight points' loads in flight a lane: a split block's time is this chain and the
        // last block's combine below (render/launch.rs reduce_split balances the two).
#pragma unroll 8
        for (tp_idx r = r0 + lane_r; r < r1; r += LANES) tp_fold(p, acc, o, r);
    }
    part[threadIdx.x] = acc;
    tp_reduce_lanes(part, lane_r);
    if (lane_r == 0 && o < TP_OUT) tp_ws_store(&p.ws[(tp_idx)blockIdx.y * TP_OUT + o], part[threadIdx.x]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&p.ws_count[blockIdx.x], 1u) == TP_SPLIT - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    tp_init(acc);
    if (o < TP_OUT) {
        // Eight partials in flight a lane (the performance model's COMBINE_IN_FLIGHT).
#pragma unroll 8
        for (unsigned int s = lane_r; s < TP_SPLIT; s += LANES) {
            tp_acc other;
            tp_ws_load(&p.ws[(tp_idx)s * TP_OUT + o], other);
            tp_merge(acc, other);
        }
    }
    part[threadIdx.x] = acc;
    tp_reduce_lanes(part, lane_r);
    if (lane_r == 0 && o < TP_OUT) tp_finish(p, o, part[threadIdx.x]);
    if (threadIdx.x == 0) p.ws_count[blockIdx.x] = 0;
#else
    for (tp_idx o0 = (tp_idx)blockIdx.x * TP_TILE_O; o0 < TP_OUT; o0 += (tp_idx)gridDim.x * TP_TILE_O) {
        const tp_idx o = o0 + lane_o;
        tp_acc acc;
        tp_init(acc);
        if (o < TP_OUT) {
            // TP_FOLD_UNROLL points' loads in flight a lane where the prologue has at most two
            // results (render/fused.rs reduce); 1 otherwise: unrolled, ptxas (12.9, sm_90)
            // spills for some multi-output prologues.
#pragma unroll TP_FOLD_UNROLL
            for (tp_idx r = lane_r; r < TP_RED; r += LANES) tp_fold(p, acc, o, r);
        }
        part[threadIdx.x] = acc;
        tp_reduce_lanes(part, lane_r);
        if (lane_r == 0 && o < TP_OUT) tp_finish(p, o, part[threadIdx.x]);
        __syncthreads();
    }
#endif
}
