// Batched matrix product C[b] = op(A[b]) . op(B[b]) (B shared by every batch entry when
// TP_B_BATCH_STRIDE is 0) on the tiled GEMM core; C goes through the epilogue hook. A long K
// with few outputs is split across TP_SPLIT_K blocks per tile (combined in a fixed order).
//
// Generated hooks: TP_BLOCK, TP_TRANS_A, TP_TRANS_B, TP_M, TP_N, TP_K, TP_A_BATCH_STRIDE,
//   TP_B_BATCH_STRIDE, the GEMM constants of gemm_core.cuh, tp_idx, struct tp_params { a, b,
//   epilogue operands, outputs, workspace }, tp_epilogue(p, flat, value) (stores every output).
// Grid: (ceil(m / TP_BM), ceil(n / TP_BN), batch * TP_SPLIT_K).

struct tp_matmul_a {
    const float* base;
    enum { K_FAST = !TP_TRANS_A, VEC = TP_VEC_A, K_RUN = TP_K, K_TILE = 0 };  // a whole row
    typedef const float* Line;
    TP_DEV Line line(int r) const { return TP_TRANS_A ? base + r : base + (tp_idx)r * TP_K; }
    TP_DEV const float* at(const Line& l, int kk) const {
        return TP_TRANS_A ? l + (tp_idx)kk * TP_M : l + kk;
    }
};

struct tp_matmul_b {
    const float* base;
    enum { K_FAST = TP_TRANS_B, VEC = TP_VEC_B, K_RUN = TP_K, K_TILE = 0 };  // a whole column
    typedef const float* Line;
    TP_DEV Line line(int c) const { return TP_TRANS_B ? base + (tp_idx)c * TP_K : base + c; }
    TP_DEV const float* at(const Line& l, int kk) const {
        return TP_TRANS_B ? l + kk : l + (tp_idx)kk * TP_N;
    }
};

struct tp_matmul_out {
    tp_idx base;
    TP_DEV bool valid(int) const { return true; }
    TP_DEV tp_idx flat(int m, int n) const { return base + (tp_idx)m * TP_N + n; }
    TP_DEV int channel(int n) const { return n; }
};

extern "C" __global__ void TP_GEMM_BOUNDS tp_matmul(const tp_params p) {
    const int batch = blockIdx.z / TP_SPLIT_K, split = blockIdx.z % TP_SPLIT_K;
    const tp_matmul_a la = {p.a + batch * (tp_idx)TP_A_BATCH_STRIDE};
    const tp_matmul_b lb = {p.b + batch * (tp_idx)TP_B_BATCH_STRIDE};
    const int m0 = blockIdx.x * TP_BM, n0 = blockIdx.y * TP_BN;
    const int k0 = split * TP_K_CHUNK, k1 = TP_K - k0 < TP_K_CHUNK ? TP_K : k0 + TP_K_CHUNK;
    float acc[TP_TM][TP_TN];
    tp_gemm_tile(la, lb, TP_M, TP_N, k0, k1, m0, n0, acc);
    const tp_matmul_out out = {batch * (tp_idx)TP_M * TP_N};
    tp_gemm_output(p, out, TP_M, TP_N, m0, n0,
                   (batch * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x, split, acc);
}
