// Deliberately broken kernels: the emulator must report each with its kernel name and PTX line.
extern "C" __global__ void oob_write(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i + n] = 1.0f;  // writes past the end of a buffer of n floats
}

extern "C" __global__ void divergent_shuffle(float* out) {
    int lane = threadIdx.x & 31;
    float v = (float)lane;
    for (int i = 0; i < lane; ++i) v = __shfl_down_sync(0xffffffffu, v, 1);  // lanes diverge
    out[threadIdx.x] = v;
}

extern "C" __global__ void missing_barrier(float* out) {
    __shared__ float s[64];
    s[threadIdx.x] = (float)threadIdx.x;
    if (threadIdx.x < 32) {
        __syncthreads();  // only the first warp arrives: the others have exited
        out[threadIdx.x] = s[63 - threadIdx.x];
    }
}

extern "C" __global__ void spin_forever(volatile int* flag, int* out) {
    while (flag[0] == 0) {
    }
    out[threadIdx.x] = 1;
}
