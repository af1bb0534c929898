// Tensor-core instructions: mma.sync (bf16/f16 m16n8k16 and m16n8k8, tf32 m16n8k8, f32
// accumulators),
// ldmatrix (x1/x2/x4, .trans), cp.async (ca/cg, 4/8/16 bytes, src-size, ignore-src,
// commit_group/wait_group/wait_all) and the conversions to tf32/bf16/f16 with their rounding
// and saturation modifiers. Fragments are loaded from global memory by the PTX ISA's
// fragment tables ("Matrix Fragments for mma.m16n8k16 with floating point type",
// "... for mma.m16n8k8"), so a test checks the emulator's register layout independently of
// ldmatrix; `gemm_pipeline` chains cp.async → ldmatrix → mma as a real kernel does.

typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ u32 smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// D = A·B + C on one warp. A: 16×16 row-major bits, B: 16×8 (K×N) row-major bits,
// C and D: 16×8 row-major f32.
#define MMA_16816(NAME, TY)                                                                        \
    extern "C" __global__ void NAME(const u16* a, const u16* b, const float* c, float* d) {        \
        int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;                                 \
        u32 ra[4], rb[2];                                                                          \
        float rc[4], rd[4];                                                                        \
        for (int r = 0; r < 4; r++) {                                                              \
            int row = g + ((r & 1) ? 8 : 0), col = 2 * t + ((r & 2) ? 8 : 0);                     \
            ra[r] = (u32)a[row * 16 + col] | ((u32)a[row * 16 + col + 1] << 16);                   \
        }                                                                                          \
        for (int r = 0; r < 2; r++) {                                                              \
            int k = 2 * t + 8 * r;                                                                 \
            rb[r] = (u32)b[k * 8 + g] | ((u32)b[(k + 1) * 8 + g] << 16);                           \
        }                                                                                          \
        for (int i = 0; i < 4; i++) rc[i] = c[(g + ((i & 2) ? 8 : 0)) * 8 + 2 * t + (i & 1)];      \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 "                    \
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"                  \
                     : "=f"(rd[0]), "=f"(rd[1]), "=f"(rd[2]), "=f"(rd[3])                          \
                     : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]),     \
                       "f"(rc[0]), "f"(rc[1]), "f"(rc[2]), "f"(rc[3]));                            \
        for (int i = 0; i < 4; i++) d[(g + ((i & 2) ? 8 : 0)) * 8 + 2 * t + (i & 1)] = rd[i];      \
    }

MMA_16816(mma_bf16, "bf16")
MMA_16816(mma_f16, "f16")

// m16n8k8 with 16-bit multiplicands: A 16×8 row-major bits, B 8×8 (K×N) row-major bits, C and
// D 16×8 row-major f32. A: two registers (rows g and g+8, columns 2t, 2t+1); B: one register
// (rows 2t, 2t+1 of column g).
#define MMA_1688(NAME, TY)                                                                         \
    extern "C" __global__ void NAME(const u16* a, const u16* b, const float* c, float* d) {        \
        int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;                                 \
        u32 ra[2], rb;                                                                             \
        float rc[4], rd[4];                                                                        \
        for (int r = 0; r < 2; r++) {                                                              \
            int row = g + 8 * r;                                                                   \
            ra[r] = (u32)a[row * 8 + 2 * t] | ((u32)a[row * 8 + 2 * t + 1] << 16);                 \
        }                                                                                          \
        rb = (u32)b[(2 * t) * 8 + g] | ((u32)b[(2 * t + 1) * 8 + g] << 16);                        \
        for (int i = 0; i < 4; i++) rc[i] = c[(g + ((i & 2) ? 8 : 0)) * 8 + 2 * t + (i & 1)];      \
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32." TY "." TY ".f32 "                     \
                     "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"                              \
                     : "=f"(rd[0]), "=f"(rd[1]), "=f"(rd[2]), "=f"(rd[3])                          \
                     : "r"(ra[0]), "r"(ra[1]), "r"(rb), "f"(rc[0]), "f"(rc[1]), "f"(rc[2]),        \
                       "f"(rc[3]));                                                                \
        for (int i = 0; i < 4; i++) d[(g + ((i & 2) ? 8 : 0)) * 8 + 2 * t + (i & 1)] = rd[i];      \
    }

MMA_1688(mma_k8_bf16, "bf16")
MMA_1688(mma_k8_f16, "f16")

// tf32 m16n8k8: A 16×8 f32 row-major, B 8×8 (K×N) f32 row-major, rounded to tf32 with
// cvt.rna.tf32.f32 when `round` is set (else the raw f32 bits go in).
extern "C" __global__ void mma_tf32(const float* a, const float* b, const float* c, float* d,
                                    int round) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float fa[4], fb[2];
    u32 ra[4], rb[2];
    float rc[4], rd[4];
    for (int r = 0; r < 4; r++) fa[r] = a[(g + ((r & 1) ? 8 : 0)) * 8 + t + ((r & 2) ? 4 : 0)];
    for (int r = 0; r < 2; r++) fb[r] = b[(t + 4 * r) * 8 + g];
    for (int r = 0; r < 4; r++) {
        if (round) asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(ra[r]) : "f"(fa[r]));
        else ra[r] = __float_as_uint(fa[r]);
    }
    for (int r = 0; r < 2; r++) {
        if (round) asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(rb[r]) : "f"(fb[r]));
        else rb[r] = __float_as_uint(fb[r]);
    }
    for (int i = 0; i < 4; i++) rc[i] = c[(g + ((i & 2) ? 8 : 0)) * 8 + 2 * t + (i & 1)];
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
                 : "=f"(rd[0]), "=f"(rd[1]), "=f"(rd[2]), "=f"(rd[3])
                 : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]),
                   "f"(rc[0]), "f"(rc[1]), "f"(rc[2]), "f"(rc[3]));
    for (int i = 0; i < 4; i++) d[(g + ((i & 2) ? 8 : 0)) * 8 + 2 * t + (i & 1)] = rd[i];
}

// An mma that only half the warp executes: undefined on hardware, a fault on the emulator.
extern "C" __global__ void mma_divergent(float* d, int limit) {
    int lane = threadIdx.x & 31;
    float r0 = 0.f, r1 = 0.f, r2 = 0.f, r3 = 0.f;
    u32 z = 0;
    if (lane < limit) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%4,%4,%4}, {%4,%4}, {%0,%1,%2,%3};"
                     : "+f"(r0), "+f"(r1), "+f"(r2), "+f"(r3)
                     : "r"(z));
    }
    d[lane] = r0 + r1 + r2 + r3;
}

// An mma whose guard predicate is false on the lanes from `limit` up: also a fault.
extern "C" __global__ void mma_guarded(float* d, int limit) {
    int lane = threadIdx.x & 31;
    float r0 = 0.f, r1 = 0.f, r2 = 0.f, r3 = 0.f;
    u32 z = 0;
    asm volatile("{\n .reg .pred p;\n setp.lt.s32 p, %5, %6;\n"
                 " @p mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%4,%4,%4}, {%4,%4}, {%0,%1,%2,%3};\n}"
                 : "+f"(r0), "+f"(r1), "+f"(r2), "+f"(r3)
                 : "r"(z), "r"(lane), "r"(limit));
    d[lane] = r0 + r1 + r2 + r3;
}

// ldmatrix: 32 rows of 8 b16 elements go to shared memory; lane l supplies the address of row
// `rows[l]` (plus `skew` bytes); each lane stores its destination registers.
#define LDMATRIX(NAME, NUM, TRANS, N)                                                               \
    extern "C" __global__ void NAME(const u16* src, const int* rows, u32* out, int skew) {         \
        __shared__ __align__(16) u16 s[32 * 8 + 8];                                                \
        int lane = threadIdx.x & 31;                                                               \
        for (int i = lane; i < 32 * 8; i += 32) s[i] = src[i];                                     \
        __syncwarp();                                                                              \
        u32 addr = smem(s) + rows[lane] * 16 + skew;                                               \
        u32 r[4] = {0, 0, 0, 0};                                                                   \
        if (N == 1)                                                                                \
            asm volatile("ldmatrix.sync.aligned.m8n8." NUM TRANS ".shared.b16 {%0}, [%1];"         \
                         : "=r"(r[0]) : "r"(addr));                                                \
        if (N == 2)                                                                                \
            asm volatile("ldmatrix.sync.aligned.m8n8." NUM TRANS ".shared.b16 {%0,%1}, [%2];"      \
                         : "=r"(r[0]), "=r"(r[1]) : "r"(addr));                                    \
        if (N == 4)                                                                                \
            asm volatile("ldmatrix.sync.aligned.m8n8." NUM TRANS                                   \
                         ".shared.b16 {%0,%1,%2,%3}, [%4];"                                        \
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));            \
        for (int i = 0; i < 4; i++) out[lane * 4 + i] = r[i];                                      \
    }

LDMATRIX(ldmatrix_x1, "x1", "", 1)
LDMATRIX(ldmatrix_x2, "x2", "", 2)
LDMATRIX(ldmatrix_x4, "x4", "", 4)
LDMATRIX(ldmatrix_x1_trans, "x1", ".trans", 1)
LDMATRIX(ldmatrix_x2_trans, "x2", ".trans", 2)
LDMATRIX(ldmatrix_x4_trans, "x4", ".trans", 4)

// An ldmatrix that only the lanes below `limit` execute: a fault on the emulator.
extern "C" __global__ void ldmatrix_divergent(u32* out, int limit) {
    __shared__ __align__(16) u16 s[8 * 8];
    int lane = threadIdx.x & 31;
    for (int i = lane; i < 8 * 8; i += 32) s[i] = (u16)i;
    __syncwarp();
    u32 r = 0;
    if (lane < limit)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                     : "=r"(r) : "r"(smem(s) + (lane & 7) * 16));
    out[lane] = r;
}

// cp.async groups, 64 threads. Per thread: group 0 copies 4 bytes (.ca), group 1 copies 16
// bytes (.cg) of which only `src_bytes` come from global memory (the rest are zero-filled),
// and an uncommitted copy of 8 bytes (.ca) ignores its source on odd threads. What each thread
// sees after `wait_group 1` (group 0 done; group 1 may still be in flight) and after
// `wait_all` + a barrier (everything, any thread's) goes to `out`.
extern "C" __global__ void cp_async_groups(const float* src, float* out, int src_bytes) {
    __shared__ __align__(16) float s0[64], s1[64 * 4], s2[64 * 2];
    int tid = threadIdx.x;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem(&s0[tid])), "l"(&src[tid]));
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem(&s1[4 * tid])),
                 "l"(&src[64 + 4 * tid]), "r"(src_bytes));
    asm volatile("cp.async.commit_group;");
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n"
                 " cp.async.ca.shared.global [%0], [%1], 8, p;\n}" ::"r"(smem(&s2[2 * tid])),
                 "l"(&src[320 + 2 * tid]), "r"(tid & 1));
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    out[tid * 8 + 0] = s0[tid];
    out[tid * 8 + 1] = s1[4 * tid];
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    int o = 63 - tid;
    out[tid * 8 + 2] = s0[o];
    for (int i = 0; i < 4; i++) out[tid * 8 + 3 + i] = s1[4 * o + i];
    out[tid * 8 + 7] = s2[2 * o] + s2[2 * o + 1];
}

// A cp.async whose shared destination (`skew`) or global source (`src_skew`) may be
// misaligned for its size.
extern "C" __global__ void cp_async_misaligned(const float* src, int skew, int src_skew) {
    __shared__ __align__(16) float s[64];
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem(&s[0]) + skew),
                 "l"((const char*)src + src_skew));
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// A warp's GEMM as a tensor-core kernel runs it: C (16×8, f32) = A (16×K bf16, row-major)
// · B (K×8 bf16, row-major), K a multiple of 16. Each 16-deep slice of A and B is fetched with
// cp.async into one of two shared stages (the next slice's copy in flight while the current one
// is multiplied), read with ldmatrix (.x4 for A, .x2.trans for B) and multiplied with mma.
extern "C" __global__ void gemm_pipeline(const u16* a, const u16* b, float* c, int k) {
    __shared__ __align__(16) u16 sa[2][16 * 16], sb[2][16 * 8];
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int slices = k / 16;
    // Lane l copies 16 bytes of A (row l/2, half l%2) and, for l < 16, one row of B.
    auto load = [&](int slice, int stage) {
        int row = lane >> 1, half = lane & 1;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                         smem(&sa[stage][row * 16 + half * 8])),
                     "l"(&a[row * k + slice * 16 + half * 8]));
        if (lane < 16)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(
                             smem(&sb[stage][lane * 8])),
                         "l"(&b[(slice * 16 + lane) * 8]));
        asm volatile("cp.async.commit_group;");
    };
    load(0, 0);
    for (int s = 0; s < slices; s++) {
        int stage = s & 1;
        if (s + 1 < slices) {
            load(s + 1, stage ^ 1);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncwarp();
        u32 ra[4], rb[2];
        int m = lane >> 3, r = lane & 7;
        u32 pa = smem(&sa[stage][(r + (m & 1) * 8) * 16 + (m >> 1) * 8]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(ra[0]), "=r"(ra[1]), "=r"(ra[2]), "=r"(ra[3]) : "r"(pa));
        u32 pb = smem(&sb[stage][((m & 1) * 8 + r) * 8]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                     : "=r"(rb[0]), "=r"(rb[1]) : "r"(pb));
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                     : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
        __syncwarp();
    }
    for (int i = 0; i < 4; i++) c[(g + ((i & 2) ? 8 : 0)) * 8 + 2 * t + (i & 1)] = acc[i];
}

// Conversions with their rounding and saturation modifiers, eight results per input.
extern "C" __global__ void convert_narrow(const float* x, u32* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    u32 r[8];
    u16 h;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r[0]) : "f"(v));
    asm("cvt.rna.satfinite.tf32.f32 %0, %1;" : "=r"(r[1]) : "f"(v));
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    r[2] = h;
    asm("cvt.rz.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    r[3] = h;
    asm("cvt.rn.satfinite.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    r[4] = h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    r[5] = h;
    asm("cvt.rn.satfinite.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    r[6] = h;
    asm("cvt.rn.relu.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r[7]) : "f"(v), "f"(-v));
    for (int j = 0; j < 8; j++) out[8 * i + j] = r[j];
}
