// Warp-wide reductions with butterfly shuffles: every lane ends with the result. All 32 lanes
// must call them together (the emulated device reports divergent calls as errors).

TP_DEV float tp_warp_max(float v) {
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, s));
    return v;
}

TP_DEV float tp_warp_sum(float v) {
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
    return v;
}

// The maximum and the sum of exp(x - max) of one row of `cols` floats, lane-strided.
TP_DEV void tp_row_max_sum(const float* x, int cols, float& m, float& s) {
    const int lane = threadIdx.x % 32;
    m = -tp_inff();
    for (int c = lane; c < cols; c += 32) m = fmaxf(m, x[c]);
    m = tp_warp_max(m);
    s = 0.0f;
    for (int c = lane; c < cols; c += 32) s += expf(x[c] - m);
    s = tp_warp_sum(s);
}

// log-sum-exp from the row's maximum and sum; a row of -inf stays -inf (as the CPU backend).
TP_DEV float tp_lse(float m, float s) { return m == -tp_inff() ? m : m + logf(s); }
