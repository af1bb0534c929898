// Split reductions across CTAs with a deterministic combine: every CTA stores its partial sum
// (plain stores), fences (`membar.gl`), and counts itself in with an atomic; the CTA that counts
// last fences again and adds the partials in CTA order, writes the total and resets the counter
// for the next launch. The result does not depend on which CTA finishes last.
extern "C" __global__ void split_sum(const float* x, int n, int chunk, float* partials,
                                     unsigned int* counter, float* out) {
    __shared__ float part[256];
    __shared__ bool last;
    const int begin = blockIdx.x * chunk;
    const int end = min(begin + chunk, n);
    float v = 0.0f;
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) v += x[i];
    part[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        __stcg(&partials[blockIdx.x], part[0]);
        __threadfence();
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (unsigned int b = 0; b < gridDim.x; ++b) total += __ldcg(&partials[b]);
        *out = total;
        *counter = 0;
    }
}

// 128-bit loads and stores of global and shared memory: y[i] = x[i] * scale, one float4 per
// thread, staged through shared memory and read back from a neighbouring thread's slot.
extern "C" __global__ void vec4_rotate(const float4* x, float4* y, int n4, float scale) {
    __shared__ float4 stage[256];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float4 v = i < n4 ? __ldg(&x[i]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    stage[threadIdx.x] = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
    __syncthreads();
    const int j = (threadIdx.x + 1) % blockDim.x;
    const int src = blockIdx.x * blockDim.x + j;
    if (src < n4) y[src] = stage[j];
}
