// Block reductions: warp shuffles, shared memory across warps, one atomic per block.
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

extern "C" __global__ void block_sum(const float* x, float* out, int n) {
    __shared__ float partial[32];
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += x[i];
    v = warp_sum(v);
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int nwarps = (blockDim.x + 31) >> 5;
        v = lane < nwarps ? partial[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
        if (lane == 0) atomicAdd(out, v);
    }
}

__device__ float atomic_max_float(float* addr, float value) {
    int* as_int = reinterpret_cast<int*>(addr);
    int old = *as_int;
    while (__int_as_float(old) < value) {
        int assumed = old;
        old = atomicCAS(as_int, assumed, __float_as_int(value));
        if (old == assumed) break;
    }
    return __int_as_float(old);
}

extern "C" __global__ void block_max(const float* x, float* out, int n) {
    __shared__ float partial[32];
    float v = -__int_as_float(0x7f800000);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        v = fmaxf(v, x[i]);
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, offset));
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        int nwarps = (blockDim.x + 31) >> 5;
        float m = partial[0];
        for (int w = 1; w < nwarps; ++w) m = fmaxf(m, partial[w]);
        atomic_max_float(out, m);
    }
}

// Integer histogram with shared-memory atomics, then global atomics (u32) and a u64 counter.
extern "C" __global__ void histogram(const unsigned* keys, unsigned* bins, unsigned long long* total,
                                     int n, int nbins) {
    extern __shared__ unsigned local_bins[];
    for (int b = threadIdx.x; b < nbins; b += blockDim.x) local_bins[b] = 0;
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&local_bins[keys[i] % nbins], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < nbins; b += blockDim.x) {
        unsigned c = local_bins[b];
        if (c) {
            atomicAdd(&bins[b], c);
            atomicAdd(total, (unsigned long long)c);
        }
    }
}
