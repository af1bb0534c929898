// towerpack CUDA prelude: the scalar semantics of src/ir/scalar.rs and src/ir/rng.rs for device
// code. Every kernel's source starts with this file, then its generated part (parameter struct,
// constants and hooks), then its hand-written body. Everything is __forceinline__: the emulated
// device executes no calls, and NVRTC inlines these anyway.
//
// Only instructions of the emulator's PTX subset may result (no tensor cores, no cp.async).
// Compiled with --fmad=false, so `a * b + c` rounds twice exactly as the reference executor;
// kernels that want fused multiply-adds (GEMM) call fmaf explicitly.

#define TP_DEV __device__ __forceinline__

// A canonical quiet NaN (Rust's f32::NAN / f64::NAN bits).
TP_DEV float tp_nanf() { return __int_as_float(0x7fc00000); }
TP_DEV double tp_nan() { return __longlong_as_double(0x7ff8000000000000LL); }
TP_DEV float tp_inff() { return __int_as_float(0x7f800000); }
TP_DEV double tp_inf() { return __longlong_as_double(0x7ff0000000000000LL); }

// Maximum and minimum propagate NaN (scalar.rs `nan_max` / `nan_min`).
TP_DEV float tp_max(float a, float b) { return (a != a || b != b) ? tp_nanf() : fmaxf(a, b); }
TP_DEV float tp_min(float a, float b) { return (a != a || b != b) ? tp_nanf() : fminf(a, b); }
TP_DEV double tp_max(double a, double b) { return (a != a || b != b) ? tp_nan() : fmax(a, b); }
TP_DEV double tp_min(double a, double b) { return (a != a || b != b) ? tp_nan() : fmin(a, b); }
TP_DEV long long tp_max(long long a, long long b) { return a > b ? a : b; }
TP_DEV long long tp_min(long long a, long long b) { return a < b ? a : b; }

// relu keeps NaN; sign keeps 0, -0 and NaN.
TP_DEV float tp_relu(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }
TP_DEV double tp_relu(double x) { return (x > 0.0 || x != x) ? x : 0.0; }
TP_DEV long long tp_relu(long long x) { return x > 0 ? x : 0; }
TP_DEV float tp_sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }
TP_DEV double tp_sign(double x) { return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : x); }
TP_DEV long long tp_sign(long long x) { return x > 0 ? 1 : (x < 0 ? -1 : 0); }

// The logistic function without overflow for large |x|.
TP_DEV float tp_sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    const float e = expf(x);
    return e / (1.0f + e);
}
TP_DEV double tp_sigmoid(double x) {
    if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

// Integer division truncates toward zero; division by zero gives 0 (never a trap).
TP_DEV long long tp_idiv(long long a, long long b) { return b == 0 ? 0 : a / b; }

// Float to integer truncates toward zero, saturating, NaN to 0 (Rust `as`).
TP_DEV long long tp_f2i32(double x) {
    if (x != x) return 0;
    if (x <= -2147483648.0) return -2147483648LL;
    if (x >= 2147483647.0) return 2147483647LL;
    return (long long)__double2int_rz(x);
}
TP_DEV long long tp_f2i64(double x) {
    if (x != x) return 0;
    if (x <= -9223372036854775808.0) return (long long)0x8000000000000000ULL;
    if (x >= 9223372036854775807.0) return 0x7fffffffffffffffLL;
    return __double2ll_rz(x);
}
TP_DEV long long tp_f2u8(double x) {
    if (x != x || x <= 0.0) return 0;
    if (x >= 255.0) return 255;
    return (long long)__double2int_rz(x);
}
TP_DEV long long tp_sat_i32(long long x) {
    return x < -2147483648LL ? -2147483648LL : (x > 2147483647LL ? 2147483647LL : x);
}
TP_DEV long long tp_sat_u8(long long x) { return x < 0 ? 0 : (x > 255 ? 255 : x); }

// Integer results wrap to their width (two's complement), as native arithmetic does.
TP_DEV long long tp_wrap_i32(long long x) { return (long long)(int)(unsigned int)(unsigned long long)x; }
TP_DEV long long tp_wrap_u8(long long x) { return x & 0xff; }

// Half-precision storage: bits in an unsigned short, arithmetic in float.
TP_DEV float tp_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
TP_DEV unsigned short tp_f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
TP_DEV float tp_bf16_to_f32(unsigned short h) { return __int_as_float(((unsigned int)h) << 16); }
TP_DEV unsigned short tp_f32_to_bf16(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
TP_DEV float tp_round_f16(float x) { return tp_f16_to_f32(tp_f32_to_f16(x)); }
TP_DEV float tp_round_bf16(float x) { return tp_bf16_to_f32(tp_f32_to_bf16(x)); }

// The counter-based generator of Op::RandomUniform (src/ir/rng.rs), bit for bit.
TP_DEV unsigned long long tp_mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
TP_DEV unsigned long long tp_step_key(unsigned long long seed, long long counter) {
    return tp_mix64(seed + (unsigned long long)counter * 0x9E3779B97F4A7C15ULL);
}
TP_DEV float tp_uniform(unsigned long long key, unsigned long long index) {
    const unsigned long long bits = tp_mix64(key ^ (index * 0xD1B54A32D192ED03ULL));
    return (float)(unsigned int)(bits >> 40) * (1.0f / 16777216.0f);
}

// Reports a data error (e.g. a label out of range) to the host: the first kernel to fail
// stores its code and detail; the session reads the word after the step.
TP_DEV void tp_report(unsigned int* status, unsigned int code, unsigned int detail) {
    if (atomicCAS(status, 0u, code) == 0u) status[1] = detail;
}
