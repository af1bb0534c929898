// libdevice math: expf (relies on fma.rm), logf, tanhf, sigmoid; plus sqrtf and integer helpers.
extern "C" __global__ void math_functions(const float* __restrict__ x, float* __restrict__ e,
                                          float* __restrict__ l, float* __restrict__ t,
                                          float* __restrict__ sig, float* __restrict__ sq, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    e[i] = expf(v);
    l[i] = logf(fabsf(v) + 1e-3f);
    t[i] = tanhf(v);
    sig[i] = 1.0f / (1.0f + expf(-v));
    sq[i] = sqrtf(fabsf(v));
}

// Integer and conversion helpers: rounding modes, 64-bit arithmetic, bit operations.
extern "C" __global__ void int_ops(const float* __restrict__ x, const long long* __restrict__ w,
                                   int* __restrict__ rounded, long long* __restrict__ wide,
                                   unsigned* __restrict__ bits, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    rounded[4 * i + 0] = __float2int_rn(v);
    rounded[4 * i + 1] = __float2int_rz(v);
    rounded[4 * i + 2] = __float2int_rd(v);
    rounded[4 * i + 3] = __float2int_ru(v);
    long long a = w[i];
    wide[3 * i + 0] = a * 2654435761LL + (a >> 7);
    wide[3 * i + 1] = a / 1000003LL - a % 97LL;
    wide[3 * i + 2] = (long long)__float2ll_rn(v * 1024.0f) ^ (a << 3);
    unsigned u = __float_as_uint(v);
    bits[3 * i + 0] = __popc(u) + (__clz(u) << 8);
    bits[3 * i + 1] = __brev(u);
    bits[3 * i + 2] = __umulhi(u, 0x9e3779b9u) + (unsigned)max((int)u, -5) + min(u, 77u);
}
