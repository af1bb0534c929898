// The tiled SGEMM main loop shared by matmul and the three implicit-GEMM convolutions.
//
// A block of TP_BLOCK = 256 threads, seen as 16 x 16, computes a TP_BM x TP_BN tile of C = A.B
// (edges 16, 32 or 64, chosen per launch from the problem's shape so that narrow matrices waste
// no lanes). Each thread holds a TM x TN register block (TM = TP_BM / 16, TN = TP_BN / 16): rows
// ty + 16 i and columns tx + 16 j (tx = tid % 16, ty = tid / 16), so a warp's stores hit
// consecutive columns and its shared-memory reads are conflict free. K advances in TP_BK-deep
// tiles staged through shared memory (padded by one word per row).
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
//
// Generated: TP_BM, TP_BN (16, 32 or 64).

#define TP_BK 16
#define TP_TM (TP_BM / 16)
#define TP_TN (TP_BN / 16)
static_assert(TP_BLOCK == 256, "the GEMM tile assumes 256 threads");
static_assert(TP_BM % 16 == 0 && TP_BN % 16 == 0 && TP_BM <= 64 && TP_BN <= 64, "tile edges");

template <class LA, class LB>
TP_DEV void tp_gemm_tile(const LA& la, const LB& lb, int M, int N, int K, int m0, int n0,
                         float acc[TP_TM][TP_TN]) {
    __shared__ float as[TP_BK][TP_BM + 1];
    __shared__ float bs[TP_BK][TP_BN + 1];
    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16;
    // Each thread loads TM elements of the A tile and TN of the B tile; its (line, k-offset)
    // pairs are fixed, so lines are computed once.
    int am[TP_TM], ak[TP_TM], bn[TP_TN], bk[TP_TN];
    typename LA::Line aline[TP_TM];
    typename LB::Line bline[TP_TN];
#pragma unroll
    for (int l = 0; l < TP_TM; ++l) {
        const int e = tid + l * TP_BLOCK;
        am[l] = LA::K_FAST ? e / TP_BK : e % TP_BM;
        ak[l] = LA::K_FAST ? e % TP_BK : e / TP_BM;
        aline[l] = la.line(m0 + am[l] < M ? m0 + am[l] : 0);
    }
#pragma unroll
    for (int l = 0; l < TP_TN; ++l) {
        const int e = tid + l * TP_BLOCK;
        bn[l] = LB::K_FAST ? e / TP_BK : e % TP_BN;
        bk[l] = LB::K_FAST ? e % TP_BK : e / TP_BN;
        bline[l] = lb.line(n0 + bn[l] < N ? n0 + bn[l] : 0);
    }
#pragma unroll
    for (int i = 0; i < TP_TM; ++i)
#pragma unroll
        for (int j = 0; j < TP_TN; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TP_BK) {
#pragma unroll
        for (int l = 0; l < TP_TM; ++l) {
            const int m = m0 + am[l], ka = k0 + ak[l];
            as[ak[l]][am[l]] = (m < M && ka < K) ? la.at(aline[l], ka) : 0.0f;
        }
#pragma unroll
        for (int l = 0; l < TP_TN; ++l) {
            const int n = n0 + bn[l], kb = k0 + bk[l];
            bs[bk[l]][bn[l]] = (n < N && kb < K) ? lb.at(bline[l], kb) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TP_BK; ++kk) {
            float av[TP_TM], bv[TP_TN];
#pragma unroll
            for (int i = 0; i < TP_TM; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < TP_TN; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < TP_TM; ++i)
#pragma unroll
                for (int j = 0; j < TP_TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
}

// Hands every in-range element of the tile to `store(m, n, value)`.
template <class S>
TP_DEV void tp_gemm_store(const S& store, int M, int N, int m0, int n0, float acc[TP_TM][TP_TN]) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < TP_TM; ++i) {
        const int m = m0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < TP_TN; ++j) {
            const int n = n0 + tx + 16 * j;
            if (m < M && n < N) store(m, n, acc[i][j]);
        }
    }
}
