// The tiled SGEMM main loop shared by matmul and the three implicit-GEMM convolutions.
//
// A block of TP_BLOCK = 256 threads computes a TP_BM x TP_BN tile of C = A.B. Each thread holds
// a 4x4 register block: rows ty + 16 i and columns tx + 16 j (tx = tid % 16, ty = tid / 16), so
// a warp's stores hit consecutive columns and its shared-memory reads are conflict free. K
// advances in TP_BK-deep tiles staged through shared memory (padded by one word per row).
//
// A and B are read through loaders, so the convolutions gather their operands on the fly:
//   struct Loader {
//     enum { K_FAST = ... };             // element k+1 of a line is next to element k in memory
//     typedef ... Line;                  // a fixed row of A (column of B), e.g. a base pointer
//     TP_DEV Line line(int mn) const;    // computed once per thread, outside the K loop
//     TP_DEV float at(const Line&, int k) const;   // the element, or 0 (convolution padding)
//   };
// K_FAST decides how the threads share a tile load: along k when lines are contiguous in k,
// along m (n) otherwise, so that neighbouring threads read neighbouring addresses.

#define TP_BM 64
#define TP_BN 64
#define TP_BK 16
static_assert(TP_BLOCK == 256, "the GEMM tile assumes 256 threads");

template <class LA, class LB>
TP_DEV void tp_gemm_tile(const LA& la, const LB& lb, int M, int N, int K, int m0, int n0,
                         float acc[4][4]) {
    __shared__ float as[TP_BK][TP_BM + 1];
    __shared__ float bs[TP_BK][TP_BN + 1];
    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16;
    // Each thread loads 4 elements of each tile; its (line, k-offset) pairs are fixed.
    int am[4], ak[4], bn[4], bk[4];
    typename LA::Line aline[4];
    typename LB::Line bline[4];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        const int e = tid + l * TP_BLOCK;
        am[l] = LA::K_FAST ? e / TP_BK : e % TP_BM;
        ak[l] = LA::K_FAST ? e % TP_BK : e / TP_BM;
        bn[l] = LB::K_FAST ? e / TP_BK : e % TP_BN;
        bk[l] = LB::K_FAST ? e % TP_BK : e / TP_BN;
        aline[l] = la.line(m0 + am[l] < M ? m0 + am[l] : 0);
        bline[l] = lb.line(n0 + bn[l] < N ? n0 + bn[l] : 0);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TP_BK) {
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const int m = m0 + am[l], ka = k0 + ak[l];
            as[ak[l]][am[l]] = (m < M && ka < K) ? la.at(aline[l], ka) : 0.0f;
            const int n = n0 + bn[l], kb = k0 + bk[l];
            bs[bk[l]][bn[l]] = (n < N && kb < K) ? lb.at(bline[l], kb) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TP_BK; ++kk) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
}

// Hands every in-range element of the tile to `store(m, n, value)`.
template <class S>
TP_DEV void tp_gemm_store(const S& store, int M, int N, int m0, int n0, float acc[4][4]) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + tx + 16 * j;
            if (m < M && n < N) store(m, n, acc[i][j]);
        }
    }
}
