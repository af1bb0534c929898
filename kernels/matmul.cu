// Batched matrix product C[b] = op(A[b]) . op(B[b]) (B shared by every batch entry when
// b_batch_stride is 0) on the tiled GEMM core; C goes through the epilogue hook.
//
// Generated hooks: TP_BLOCK, TP_TRANS_A, TP_TRANS_B, tp_idx, struct tp_params { a, b, m, n, k,
//   a_batch_stride, b_batch_stride, ... }, tp_epilogue(p, flat, value) (stores every output).
// Grid: (ceil(m / TP_BM), ceil(n / TP_BN), batch).

struct tp_matmul_a {
    const float* base;
    int m, k;
    enum { K_FAST = !TP_TRANS_A };
    typedef const float* Line;
    TP_DEV Line line(int r) const { return TP_TRANS_A ? base + r : base + (tp_idx)r * k; }
    TP_DEV float at(const Line& l, int kk) const { return TP_TRANS_A ? l[(tp_idx)kk * m] : l[kk]; }
};

struct tp_matmul_b {
    const float* base;
    int n, k;
    enum { K_FAST = TP_TRANS_B };
    typedef const float* Line;
    TP_DEV Line line(int c) const { return TP_TRANS_B ? base + (tp_idx)c * k : base + c; }
    TP_DEV float at(const Line& l, int kk) const { return TP_TRANS_B ? l[kk] : l[(tp_idx)kk * n]; }
};

struct tp_matmul_store {
    const tp_params& p;
    tp_idx base;
    TP_DEV void operator()(int m, int n, float v) const {
        tp_epilogue(p, base + (tp_idx)m * p.n + n, v);
    }
};

extern "C" __global__ void __launch_bounds__(TP_BLOCK) tp_matmul(const tp_params p) {
    const tp_idx batch = blockIdx.z;
    const tp_matmul_a la = {p.a + batch * (tp_idx)p.a_batch_stride, p.m, p.k};
    const tp_matmul_b lb = {p.b + batch * (tp_idx)p.b_batch_stride, p.n, p.k};
    const int m0 = blockIdx.x * TP_BM, n0 = blockIdx.y * TP_BN;
    float acc[TP_TM][TP_TN];
    tp_gemm_tile(la, lb, p.m, p.n, p.k, m0, n0, acc);
    const tp_matmul_store store = {p, batch * (tp_idx)p.m * p.n};
    tp_gemm_store(store, p.m, p.n, m0, n0, acc);
}
