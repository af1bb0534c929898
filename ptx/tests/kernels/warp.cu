// Warp-level and synchronisation behaviour: shuffles with sub-warp widths, votes, reconvergence
// after lane-dependent loops, barriers inside loops, atomics under contention, local arrays.

extern "C" __global__ void shuffles(const int* in, int* out, int delta, int src, int width) {
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    int v = in[tid];
    out[4 * tid + 0] = __shfl_up_sync(0xffffffffu, v, delta, width);
    out[4 * tid + 1] = __shfl_down_sync(0xffffffffu, v, delta, width);
    out[4 * tid + 2] = __shfl_xor_sync(0xffffffffu, v, delta, width);
    out[4 * tid + 3] = __shfl_sync(0xffffffffu, v, src, width);
}

extern "C" __global__ void votes(const int* in, unsigned* out) {
    int tid = threadIdx.x;
    int p = in[tid] != 0;
    out[6 * tid + 0] = __ballot_sync(0xffffffffu, p);
    out[6 * tid + 1] = __any_sync(0xffffffffu, p);
    out[6 * tid + 2] = __all_sync(0xffffffffu, p);
    out[6 * tid + 3] = __uni_sync(0xffffffffu, p);
    unsigned active = 0;
    if (in[tid] > 1) active = __activemask();
    out[6 * tid + 4] = active;
    out[6 * tid + 5] = __popc(__ballot_sync(0xffffffffu, in[tid] > 1));
}

// Lanes loop a lane-dependent number of times (with a data-dependent early exit), take
// different branches, then reconverge for a full-warp shuffle reduction.
extern "C" __global__ void reconverge(const int* trips, int* out) {
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x & 31;
    int acc = 0;
    for (int i = 0; i < trips[tid]; ++i) {
        if ((i + lane) % 3 == 0) {
            acc += i;
        } else if ((i ^ lane) & 1) {
            acc -= 1;
            if (acc < -50) break;
        } else {
            acc *= 2;
            acc %= 1000;
        }
    }
    __syncwarp();
    int total = acc;
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    out[2 * tid] = acc;
    out[2 * tid + 1] = total;
}

// A barrier inside a loop whose trip count is uniform but whose work per warp differs; each
// round every thread reads a neighbour's value written before the barrier.
extern "C" __global__ void barrier_rounds(const float* in, float* out, int rounds) {
    __shared__ float buf[256];
    int t = threadIdx.x;
    float v = in[blockIdx.x * blockDim.x + t];
    for (int r = 0; r < rounds; ++r) {
        buf[t] = v;
        __syncthreads();
        float left = buf[(t + blockDim.x - 1) % blockDim.x];
        if ((t >> 5) & 1) {
            for (int k = 0; k < (t & 7); ++k) left *= 0.5f;
        }
        __syncthreads();
        v = 0.5f * v + left;
    }
    out[blockIdx.x * blockDim.x + t] = v;
}

// Every thread of every CTA hits a handful of counters.
extern "C" __global__ void contention(unsigned* counters, int* extremes, unsigned long long* wide,
                                      float* fsum, unsigned* ring) {
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&counters[0], 1u);
    atomicAdd(&counters[1 + (tid & 3)], (unsigned)tid);
    atomicMax(&extremes[0], tid * 7 % 1009);
    atomicMin(&extremes[1], -(tid * 13 % 1013));
    atomicAdd(wide, 1ull << 32);
    atomicAdd(fsum, 0.25f);
    atomicInc(&ring[0], 99u);
    atomicDec(&ring[1], 99u);
    atomicOr(&ring[2], 1u << (tid & 31));
    atomicExch(&ring[3], 7u);
    int old = atomicCAS(&extremes[2], 0, tid + 1);
    if (old == 0) atomicAdd(&counters[5], 1u);
}

// A per-thread array indexed dynamically: NVRTC places it in local memory.
extern "C" __global__ void local_array(const int* idx, int* out) {
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    int a[16];
    for (int i = 0; i < 16; ++i) a[i] = tid * 100 + i;
    for (int i = 0; i < 4; ++i) a[idx[4 * tid + i] & 15] += i + 1;
    int s = 0;
    for (int i = 0; i < 4; ++i) s += a[idx[4 * tid + 3 - i] & 15] * (i + 1);
    out[tid] = s;
}
