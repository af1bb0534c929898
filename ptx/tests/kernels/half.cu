#include <cuda_fp16.h>
#include <cuda_bf16.h>
// fp16/bf16 conversions and half arithmetic.
extern "C" __global__ void half_convert(const float* __restrict__ x, __half* __restrict__ h,
                                        __nv_bfloat16* __restrict__ b, float* __restrict__ h_back,
                                        float* __restrict__ b_back, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    __half hv = __float2half_rn(v);
    __nv_bfloat16 bv = __float2bfloat16_rn(v);
    h[i] = hv;
    b[i] = bv;
    h_back[i] = __half2float(hv);
    b_back[i] = __bfloat162float(bv);
}

extern "C" __global__ void half2_fma(const __half2* __restrict__ a, const __half2* __restrict__ b,
                                     const __half2* __restrict__ c, __half2* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = __hfma2(a[i], b[i], c[i]);
}
