// Direct NHWC convolution, filter HWIO, one thread per output element.
struct ConvShape {
    int n, h, w, c;        // input
    int kh, kw, k;         // filter height, width, output channels
    int oh, ow;            // output spatial dims
    int stride_h, stride_w;
    int pad_h, pad_w;
};

extern "C" __global__ void conv2d_nhwc(const float* __restrict__ in, const float* __restrict__ filt,
                                       const float* __restrict__ bias, float* __restrict__ out,
                                       ConvShape s) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)s.n * s.oh * s.ow * s.k;
    if (idx >= total) return;
    int k = idx % s.k;
    long long t = idx / s.k;
    int ox = t % s.ow;
    t /= s.ow;
    int oy = t % s.oh;
    int n = t / s.oh;
    float acc = bias ? bias[k] : 0.0f;
    for (int fy = 0; fy < s.kh; ++fy) {
        int iy = oy * s.stride_h - s.pad_h + fy;
        if (iy < 0 || iy >= s.h) continue;
        for (int fx = 0; fx < s.kw; ++fx) {
            int ix = ox * s.stride_w - s.pad_w + fx;
            if (ix < 0 || ix >= s.w) continue;
            const float* ip = in + (((long long)n * s.h + iy) * s.w + ix) * s.c;
            const float* fp = filt + ((long long)(fy * s.kw + fx) * s.c) * s.k + k;
            for (int c = 0; c < s.c; ++c) acc = fmaf(ip[c], fp[(long long)c * s.k], acc);
        }
    }
    out[idx] = acc;
}
