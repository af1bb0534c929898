// 64x64-tiled SGEMM, C = alpha * A(MxK) * B(KxN) + beta * C, row-major.
// 256 threads, each computes a 4x4 block of C; shared-memory tiles of 64x16 (A) and 16x64 (B).
#define TM 64
#define TN 64
#define TK 16

extern "C" __global__ void __launch_bounds__(256) sgemm_64x64(const float* __restrict__ A,
                                                             const float* __restrict__ B,
                                                             float* __restrict__ C, int M, int N,
                                                             int K, float alpha, float beta) {
    __shared__ float As[TK][TM];
    __shared__ float Bs[TK][TN];
    int tid = threadIdx.x;
    int tx = tid % 16;  // column group
    int ty = tid / 16;  // row group
    int row0 = blockIdx.y * TM;
    int col0 = blockIdx.x * TN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += TK) {
        // Each thread loads 4 elements of A (64x16) and 4 of B (16x64).
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            int idx = tid + l * 256;
            int ar = idx / TK, ak = idx % TK;
            int gr = row0 + ar, gk = k0 + ak;
            As[ak][ar] = (gr < M && gk < K) ? A[(size_t)gr * K + gk] : 0.0f;
            int bk = idx / TN, bc = idx % TN;
            int gk2 = k0 + bk, gc = col0 + bc;
            Bs[bk][bc] = (gk2 < K && gc < N) ? B[(size_t)gk2 * N + gc] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; ++kk) {
            float4 a = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
            float4 b = *reinterpret_cast<const float4*>(&Bs[kk][tx * 4]);
            float av[4] = {a.x, a.y, a.z, a.w};
            float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int r = row0 + ty * 4 + i;
        if (r >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int c = col0 + tx * 4 + j;
            if (c < N) {
                size_t o = (size_t)r * N + c;
                C[o] = alpha * acc[i][j] + (beta == 0.0f ? 0.0f : beta * C[o]);
            }
        }
    }
}
