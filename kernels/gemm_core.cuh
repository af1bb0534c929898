// The tiled SGEMM shared by matmul and the three implicit-GEMM convolutions.
//
// A block of TP_BLOCK = 256 threads computes a TP_BM x TP_BN tile of C = A.B; thread
// (tx, ty) = (tid % TP_TX, tid / TP_TX) holds the TP_TM x TP_TN register block of rows
// ty*TP_TM .. +TP_TM-1 and columns tx*TP_TN .. +TP_TN-1, so its operands are contiguous in shared
// memory and read with 128-bit loads. The tile (render/launch.rs TILES: 256x16 for the tall,
// narrow convolutions of 16 channels up to 128x64) is chosen per launch.
//
// K advances in TP_BK = 16 deep tiles through two shared-memory stages: while the block computes
// on one stage, every thread's global loads of the next tile are in flight into registers, which
// it then stores into the other stage (one barrier per tile). Operands are gathered by loaders,
// so the convolutions read their inputs on the fly:
//   struct Loader {
//     enum { K_FAST = ..., VEC = 1 or 4 };  // K_FAST: element k+1 of a line is next to element k
//     typedef ... Line;                      // a fixed row of A (column of B)
//     TP_DEV Line line(int mn) const;        // once per thread and slot, outside the K loop
//     TP_DEV const float* at(const Line&, int k) const;  // address of element k, or 0 for a zero
//     enum { K_RUN = ..., K_TILE = 0 or 1 }; // shortcuts, see below
//   };
// With VEC = 4 a thread loads 4 consecutive elements at once (a float4 at the element's address)
// along k (K_FAST) or along the lines (otherwise); the renderer only chooses it where the data
// allow it (extents multiples of 4, 16-byte aligned), so a vector is all inside or all padding.
// Each thread loads one line of the tile (see tp_operand), so it keeps one Line in registers.
// K_RUN: the elements k of a K_FAST line with the same k / K_RUN are consecutive in memory and
// all present or all zeros (a tap's channels in the convolutions; 1: nothing promised). When
// K_RUN is a multiple of TP_BK, K is too and every K tile lies inside one run, so a thread
// computes ONE address per tile (at its first element) and issues all its loads from it
// together. K_TILE = 1 (K a multiple of TP_BK): what a K tile's elements of a line share is
// found once per tile, `typename L::Tile tile(const Line&, int k0)`, and each element's
// address from it, `at(const Line&, const Tile&, int j)` for element k0 + j. Otherwise each
// element's address is its own at(). at() must be arithmetic only (it reads no memory): the
// core computes an element's address before it knows whether the element is inside the tile
// (k past k_end, a line past the extent) and then loads it predicated on both (tp_keep_if,
// tp_vec::load_or_zero), so that no branch separates a thread's loads and they go out together.
//
// Prologues (TP_PROLOGUE = 1: a convolution whose input x its prologue computes as it is read,
// batch norm's apply and ReLU; render/fused.rs prologue): a loader of x says PROLOGUE = 1 and
// holds the kernel's parameters (`p`). Its operand then remembers, per slot, the flat index in
// x of the slot's first element (TP_NO_ELEMENT: zeros), and before the loaded registers go
// into a stage (prepare) each element becomes tp_prologue(p, flat, value): after the compute on
// the current stage, so the prologue's arithmetic does not hold up the loads in flight. The
// windows (forward and filter gradient) apply it as they store what they loaded, a thread's
// per-channel operands read once (tp_prologue_hold: it copies the same 4 channels of every
// pixel). Padding stays zero (it pads the prologue's result, not its operand). A vector's 4
// elements are consecutive channels of a pixel (along k or along the lines). The cp.async
// copies of TF32's f32 stages write shared memory directly and cannot compute it: a prologue
// kernel takes the SIMT tiles there (render/fixed.rs prologue_target).
//
// After the loop, tp_gemm_output hands the tile to the epilogue. Split-K (TP_SPLIT_K > 1:
// blockIdx.z = z * TP_SPLIT_K + split, each split covering TP_K_CHUNK of K) first combines the
// splits' partial tiles in a fixed order (kernels/split.cuh) and only the combining block goes
// on. Per-channel epilogue reductions (TP_EPI_RED > 0) sum the reduced epilogue outputs over the
// block's rows (threads, then a warp butterfly, then warps in order), then combine the blocks of
// a column tile in a fixed order and finish them (tp_epi_finish) through their own workspace
// (red_ws, red_ws_count; the split's is ws, ws_count); with a split of K too, the combining
// blocks of the row tiles are the column tile's members.
//
// With TP_TF32 (Precision::Tf32, and Bf16/Fp16 on devices with tensor cores) tp_gemm_tile is
// the tensor-core variant further down: for TF32 the same loaders and f32 stages filled by
// cp.async, TF32 mma.sync m16n8k8 per warp tile; for BF16/FP16 (TP_ROUND) the native 16-bit
// path: the loaders' registers rounded into 16-bit stages, ldmatrix fragments, mma.sync
// m16n8k16 .bf16/.f16; the same output path for all.
//
// Operand rounding (TP_ROUND = 1: bf16, 2: f16; Precision::Bf16/Fp16, the kernel's
// round_operands): both operands are rounded to the 16-bit format, to nearest even, before they
// are multiplied; products accumulate in f32. The SIMT core (no tensor cores, below sm_80)
// rounds each element once, keeping it as a float (tp_round), as it stores a thread's loaded
// registers into the f32 stage. The tensor-core core rounds each element once with cvt.rn
// (tp_to16, tp_pack16: the same values, f16 overflow infinite, subnormals kept) into 16-bit
// stages — half the shared bytes of f32 ones — whose fragments ldmatrix reads and the native
// m16n8k16 mma multiplies (twice TF32's tensor throughput, one mma per 16-deep K tile). A
// product of two 16-bit values is exact in f32 and the emulated mma rounds its sum once, so
// the result differs from the CPU backend's only in f32 summation order.
//
// Generated: TP_BM, TP_BN, TP_TM, TP_TN, TP_N_WHOLE (1: the column tiles cover N exactly;
// optional), TP_VEC_A, TP_VEC_B, TP_MIN_BLOCKS, TP_SPLIT_K,
// TP_K_CHUNK, TP_GROUP, TP_EPI_RED, TP_RED_GROUP (tensor cores: TP_TF32, TP_WARPS_M, TP_WARPS_N;
// BF16/FP16: TP_ROUND); tp_epi_col, tp_epi_column(p, channel) (the epilogue's per-channel
// operands of a column), tp_epilogue(p, flat, col, value[, red]),
// tp_epi_finish(p, r, channel, sum). Kernels declare TP_GEMM_BOUNDS: TP_MIN_BLOCKS resident
// blocks per SM bound the registers (none: ptxas's own choice).

#define TP_BK 16
#define TP_PAD 4
#define TP_TX (TP_BN / TP_TN)
#define TP_TY (TP_BM / TP_TM)
static_assert(TP_K_CHUNK % TP_BK == 0 || TP_SPLIT_K == 1, "split-K chunks start on a K tile");
static_assert(TP_BLOCK == 256, "the GEMM tile assumes 256 threads");
static_assert(TP_TX * TP_TY == TP_BLOCK, "a tile has one thread per register block");
static_assert(TP_TX <= 32 && 32 % TP_TX == 0, "a warp spans whole rows of threads");
#if TP_MIN_BLOCKS == 4 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
// Below sm_90 ptxas 12.9 spills 8-12 bytes of the 16-accumulator convolution bodies at 64
// registers where sm_90's fits them: 3 blocks (80 registers) there.
#define TP_GEMM_BOUNDS __launch_bounds__(TP_BLOCK, 3)
#elif TP_MIN_BLOCKS > 0
#define TP_GEMM_BOUNDS __launch_bounds__(TP_BLOCK, TP_MIN_BLOCKS)
#else
#define TP_GEMM_BOUNDS __launch_bounds__(TP_BLOCK)
#endif

// A GEMM operand's storage in global memory: f32, or — an activation stored in bf16
// (lower::half_storage: a convolution's x under Precision::Bf16) — bf16 bits, widened to the
// f32 they stand for (exactly) as they are loaded, so that everything past the loads is the
// same for both. A loader says which (`typedef ... Elem;`, tp_elem_of: f32 where it does not);
// the convolutions' generated part types x as tp_x_elem.
typedef unsigned short tp_bf16;

// bf16 bits as the f32 they stand for (exact): one value, or 4 packed low half first.
TP_DEV float tp_widen(unsigned short h) { return __uint_as_float((unsigned int)h << 16); }
TP_DEV float4 tp_widen(uint2 u) {
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

// bf16 storage loaded as the stored bits (1 element: an unsigned short, 4: a uint2, low half
// first), not widened: for 16-bit stages under bf16 rounding with nothing to compute on the way
// (tp_travel), where rounding the value to bf16 again would give the same bits.
template <int VEC>
struct tp_bits {
    typedef unsigned short type;
    static TP_DEV type zero() { return 0; }
    static TP_DEV type load(const tp_bf16* a) { return __ldg(a); }
    static TP_DEV type load_or_zero(const tp_bf16* a) {
        unsigned short h;
        asm("{\n\t.reg .pred p;\n\tsetp.ne.u64 p, %1, 0;\n\tmov.b16 %0, 0;\n\t"
            "@p ld.global.nc.b16 %0, [%1];\n\t}"
            : "=h"(h)
            : "l"(a));
        return h;
    }
};
template <>
struct tp_bits<4> {
    typedef uint2 type;
    static TP_DEV type zero() { return make_uint2(0u, 0u); }
    static TP_DEV type load(const tp_bf16* a) { return __ldg(reinterpret_cast<const uint2*>(a)); }
    static TP_DEV type load_if(bool live, unsigned long long a, const tp_bf16*) {
        uint2 u;
        asm("{\n\t.reg .pred p;\n\tsetp.ne.s32 p, %2, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
            "@p ld.global.nc.v2.b32 {%0, %1}, [%3];\n\t}"
            : "=r"(u.x), "=r"(u.y)
            : "r"((int)live), "l"(a));
        return u;
    }
    static TP_DEV type load_or_zero(const tp_bf16* a) {
        return load_if(a != nullptr, reinterpret_cast<unsigned long long>(a), a);
    }
};

template <int VEC>
struct tp_vec {
    typedef float type;
    static TP_DEV float zero() { return 0.0f; }
    static TP_DEV float load(const float* a) { return __ldg(a); }
    // The same from bf16 storage (tp_bf16), widened as it lands.
    static TP_DEV float load(const tp_bf16* a) { return tp_widen(tp_bits<1>::load(a)); }
    static TP_DEV float load_or_zero(const tp_bf16* a) {
        return tp_widen(tp_bits<1>::load_or_zero(a));
    }
    // The float at `a`, or zero where `a` is null: one load predicated on the address, as
    // tp_vec<4>::load_or_zero.
    static TP_DEV float load_or_zero(const float* a) {
        float v;
        asm("{\n\t.reg .pred p;\n\tsetp.ne.u64 p, %1, 0;\n\tmov.f32 %0, 0f00000000;\n\t"
            "@p ld.global.nc.f32 %0, [%1];\n\t}"
            : "=f"(v)
            : "l"(a));
        return v;
    }
};
template <>
struct tp_vec<4> {
    typedef float4 type;
    static TP_DEV float4 zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    static TP_DEV float4 load(const float* a) { return __ldg(reinterpret_cast<const float4*>(a)); }
    // The 4 floats at `a` where `live`, else zeros: one predicated load, no branch, so that the
    // loads of several slots go out together (`a` is not read, and may be anything, where not
    // live).
    static TP_DEV float4 load_if(bool live, unsigned long long a) {
        float4 v;
        asm("{\n\t.reg .pred p;\n\tsetp.ne.s32 p, %4, 0;\n\tmov.f32 %0, 0f00000000;\n\t"
            "mov.f32 %1, 0f00000000;\n\tmov.f32 %2, 0f00000000;\n\tmov.f32 %3, 0f00000000;\n\t"
            "@p ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%5];\n\t}"
            : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
            : "r"((int)live), "l"(a));
        return v;
    }
    // The 4 floats at `a`, or zeros where `a` is null (load_if on the address itself: one
    // comparison, where the address already says whether there is anything to load).
    static TP_DEV float4 load_or_zero(const float* a) {
        float4 v;
        asm("{\n\t.reg .pred p;\n\tsetp.ne.u64 p, %4, 0;\n\tmov.f32 %0, 0f00000000;\n\t"
            "mov.f32 %1, 0f00000000;\n\tmov.f32 %2, 0f00000000;\n\tmov.f32 %3, 0f00000000;\n\t"
            "@p ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];\n\t}"
            : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
            : "l"(a));
        return v;
    }
    // The same from bf16 storage (tp_bf16): 4 elements are 8 bytes, widened as they land.
    static TP_DEV float4 load(const tp_bf16* a) { return tp_widen(tp_bits<4>::load(a)); }
    static TP_DEV float4 load_or_zero(const tp_bf16* a) {
        return tp_widen(tp_bits<4>::load_or_zero(a));
    }
    static TP_DEV float4 load_if(bool live, unsigned long long a, const tp_bf16* e) {
        return tp_widen(tp_bits<4>::load_if(live, a, e));
    }
    // load_if by the element type of the storage at `a` (the third argument's type).
    static TP_DEV float4 load_if(bool live, unsigned long long a, const float*) {
        return load_if(live, a);
    }
};

#ifndef TP_TF32
#define TP_TF32 0
#endif
#ifndef TP_N_WHOLE
#define TP_N_WHOLE 0
#endif
#ifndef TP_ROUND
#define TP_ROUND 0
#endif
static_assert(TP_ROUND >= 0 && TP_ROUND <= 2, "TP_ROUND is 0 (none), 1 (bf16) or 2 (f16)");
#ifndef TP_PROLOGUE
#define TP_PROLOGUE 0
#endif
static_assert(!(TP_PROLOGUE && TP_TF32 && !TP_ROUND),
              "TF32 stages are filled by cp.async, which cannot compute a prologue");

// A if C, else B.
template <bool C, class A, class B>
struct tp_pick {
    typedef A type;
};
template <class A, class B>
struct tp_pick<false, A, B> {
    typedef B type;
};

// How VEC elements of storage E travel from global memory into a 16-bit stage or window
// (TP_ROUND): as f32 in registers, rounded to 16 bits as they are stored (tp_stage_bits: and
// through a prologue first, COMPUTE) — or, bf16 storage under bf16 rounding with nothing to
// compute, as the stored bits (tp_bits), which rounding to bf16 again would leave as they are.
template <int VEC, class E, bool COMPUTE>
struct tp_travel {
    enum { BITS = TP_ROUND == 1 && sizeof(E) == 2 && !COMPUTE };
    typedef typename tp_pick<BITS, tp_bits<VEC>, tp_vec<VEC> >::type type;
};

// Loader L's storage element (float where it does not say).
template <class L, class = void>
struct tp_elem_of {
    typedef float type;
};
template <class L>
struct tp_elem_of<L, decltype(void(sizeof(typename L::Elem)))> {
    typedef typename L::Elem type;
};

// Loader L's PROLOGUE (0 where it does not say).
template <class L, class = void>
struct tp_has_prologue {
    enum { value = 0 };
};
template <class L>
struct tp_has_prologue<L, decltype(void(L::PROLOGUE))> {
    enum { value = L::PROLOGUE };
};

// The flat index of no element (a zero: padding, past the extent or k_end): tp_idx is unsigned.
#define TP_NO_ELEMENT (~(tp_idx)0)

#if TP_PROLOGUE
// x's element `flat` as the kernel multiplies it: its prologue's result, or zero for
// TP_NO_ELEMENT. Branch-free: the prologue reads its operands at element 0 for a zero.
TP_DEV float tp_prologue_at(const tp_params& p, tp_idx flat, float v) {
    const bool none = flat == TP_NO_ELEMENT;
    const float r = tp_prologue(p, none ? 0 : flat, v);
    return none ? 0.0f : r;
}
// The same for 4 consecutive channels of a pixel from `flat` (the first a multiple of 4):
// tp_prologue4 reads a per-channel operand once for the four.
TP_DEV float4 tp_prologue_at(const tp_params& p, tp_idx flat, float4 v) {
    const bool none = flat == TP_NO_ELEMENT;
    const float4 r = tp_prologue4(p, none ? 0 : flat, v);
    return none ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : r;
}
// x's element at `a` (null: a zero) through the prologue.
template <class V, class E>
TP_DEV V tp_prologue_from(const tp_params& p, const E* a, V v) {
    return tp_prologue_at(p, a ? (tp_idx)(a - p.x) : TP_NO_ELEMENT, v);
}
// 4 consecutive channels at `a` (null: zeros) through the prologue, its per-channel operands
// held for those channels (`h`: tp_prologue_hold at any element of them) — for a thread that
// copies the same 4 channels of many pixels, which then reads them once.
template <class E>
TP_DEV float4 tp_prologue_held_from(const tp_params& p, const tp_pro_held& h, const E* a,
                                    float4 v) {
    const float4 r = tp_prologue4_held(p, h, a ? (tp_idx)(a - p.x) : 0, v);
    return a ? r : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}
#endif

// An operand as the GEMM multiplies it: with TP_ROUND = 1 rounded to bfloat16, with 2 to IEEE
// half (to nearest, ties to even, kept as a float: exactly the CPU backend's HalfFormat::round),
// else unchanged. bf16 is integer arithmetic on the bits (any architecture; NaN stays a quiet
// NaN, a value past bf16's largest finite becomes infinite); f16 is cvt.rn.f16.f32 and back
// (overflow past 65504 is infinite, f16 subnormals are kept).
TP_DEV float tp_round(float x) {
#if TP_ROUND == 1
    const unsigned int b = __float_as_uint(x);
    const unsigned int rounded = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
    return __uint_as_float(nan ? ((b | 0x00400000u) & 0xffff0000u) : rounded);
#elif TP_ROUND == 2
    unsigned short h;
    float r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
    return r;
#else
    return x;
#endif
}

TP_DEV float4 tp_round(float4 v) {
    return make_float4(tp_round(v.x), tp_round(v.y), tp_round(v.z), tp_round(v.w));
}

#if TP_TF32 && TP_ROUND
// The 16-bit stages of the native bf16/f16 tensor-core path hold the operands as their 16-bit
// bit patterns, rounded by cvt.rn (to nearest, ties to even: exactly tp_round per element; past
// the largest finite value: infinite; f16 subnormals kept; NaN the canonical NaN).
TP_DEV unsigned short tp_to16(float x) {
    unsigned short h;
#if TP_ROUND == 1
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
#endif
    return h;
}

// {lo, hi} rounded the same way and packed in one register, lo in the low 16 bits
// (cvt.rn.{bf16x2,f16x2}.f32 puts its first source in the high half).
TP_DEV unsigned int tp_pack16(float lo, float hi) {
    unsigned int r;
#if TP_ROUND == 1
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// What a stage holds for registers that travelled in (tp_travel): f32 values rounded by cvt.rn
// (one element, or 4 as one 8-byte store), or stored bf16 bits as they are.
TP_DEV unsigned short tp_stage_bits(float v) { return tp_to16(v); }
TP_DEV uint2 tp_stage_bits(float4 v) {
    return make_uint2(tp_pack16(v.x, v.y), tp_pack16(v.z, v.w));
}
TP_DEV unsigned short tp_stage_bits(unsigned short bits) { return bits; }
TP_DEV uint2 tp_stage_bits(uint2 bits) { return bits; }

#endif

#if TP_TF32
// BYTES (4 or 16) from global src to shared dst with cp.async (.ca for 4 bytes, .cg — L2 only —
// for 16), or zeros when src is null: the same copy with its ignore-src predicate set, which
// reads nothing and fills dst with zeros, so that padding costs no branch and a thread's copies
// go out together. The zeros land with the copy's group, like the data.
template <int BYTES>
TP_DEV void tp_copy_async(float* dst, const float* src) {
    const unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
    if constexpr (BYTES == 16)
        asm volatile(
            "{\n\t.reg .pred z;\n\tsetp.eq.u64 z, %1, 0;\n\t"
            "cp.async.cg.shared.global [%0], [%1], 16, z;\n\t}" ::"r"(d),
            "l"(src)
            : "memory");
    else
        asm volatile(
            "{\n\t.reg .pred z;\n\tsetp.eq.u64 z, %1, 0;\n\t"
            "cp.async.ca.shared.global [%0], [%1], 4, z;\n\t}" ::"r"(d),
            "l"(src)
            : "memory");
}

TP_DEV void tp_copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
TP_DEV void tp_copy_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
#endif

// `p` where `keep`, else null: a mask, not a select the compiler could make a branch of.
template <class E>
TP_DEV const E* tp_keep_if(bool keep, const E* p) {
    const unsigned long long mask = 0ull - (unsigned long long)keep;
    return reinterpret_cast<const E*>(reinterpret_cast<unsigned long long>(p) & mask);
}

// Lane `src`'s pointer p, as an integer (every lane of the warp calls it together).
template <class E>
TP_DEV unsigned long long tp_shfl_ptr(const E* p, int src) {
    const unsigned long long u = reinterpret_cast<unsigned long long>(p);
    const unsigned int lo = __shfl_sync(0xffffffffu, (unsigned int)u, src);
    const unsigned int hi = __shfl_sync(0xffffffffu, (unsigned int)(u >> 32), src);
    return ((unsigned long long)hi << 32) | lo;
}

// One operand's share of the tile loads: SLOTS elements (or vectors) per thread and the values in
// flight for the next tile. EDGE is the tile's extent along the lines (TP_BM or TP_BN). Threads
// take consecutive line positions first (LINES of them: EDGE lines, or EDGE / VEC vectors of 4
// lines when the lines are the fast direction); LINES divides TP_BLOCK, so each thread keeps ONE
// line for all its slots (one Line in registers) and steps along k from slot to slot. Stores to
// shared memory from consecutive threads hit consecutive banks.
template <class L, int EDGE>
struct tp_operand {
    enum {
        VEC = L::VEC,
        ELEMS = EDGE * TP_BK / VEC,
        SLOTS = (ELEMS + TP_BLOCK - 1) / TP_BLOCK,
        LINES = L::K_FAST ? EDGE : EDGE / VEC,
        K_STEP = TP_BLOCK / LINES,  // k rows (vectors along k when K_FAST) between slots
        RUN = L::K_FAST && L::K_RUN % TP_BK == 0,  // a K tile is one run of the line
        // The tensor-core stages with a run of 4 vectors per line and K tile, each thread
        // finding one line's run (256 lines): the lanes of a warp trade the runs' addresses
        // (tp_shfl_ptr), so that 4 consecutive lanes load one line's 64 contiguous bytes and a
        // warp's load covers 8 lines — 16 sectors of 4 cache lines, where each lane loading its
        // own line's vector touched 32 half-used sectors of 16 lines. The stage holds the same
        // elements either way (the arithmetic, and so every result, is unchanged).
        QUAD = TP_TF32 && RUN && VEC == 4 && TP_BK / VEC == 4 && SLOTS == 4 && K_STEP == 1 &&
               LINES % 32 == 0
    };
    static_assert(TP_BLOCK % LINES == 0, "one line per thread");
#if TP_TF32
    // The tensor-core stages (f32 for TF32, 16-bit with TP_ROUND). An operand whose lines run
    // along k (K_FAST) is staged line-major, [EDGE][TP_BK + pad]: a thread's 4 consecutive k
    // are one 16-byte cp.async (TF32) or one 8-byte store (16-bit), and the 16-bit fragments
    // are plain ldmatrix rows. The others are k-major, [TP_BK][EDGE + pad], a vector of 4 lines
    // one copy or store as before. The pads keep fragment reads free of bank conflicts: TF32
    // reads element (t, g) of a fragment, lane (g, t) = (lane / 4, lane % 4), so a line-major
    // row of 16 + 4 floats puts the 32 lanes in 32 banks (g * 20 + t) and a k-major row of
    // EDGE + 8 floats too (t * 8 + g, EDGE a multiple of 32, or t * 24 + g for 16); a 16-bit
    // ldmatrix reads 8 rows of 16 bytes, line-major 48 bytes apart (banks 12 * r .. + 3) and
    // k-major (EDGE + 8) * 2 bytes apart (banks 4 * r or 12 * r .. + 3 modulo 32, EDGE a
    // multiple of 32 or 16): one wavefront per matrix. Every row stays 16-byte aligned.
    enum {
        LINE_MAJOR = L::K_FAST,
        ROW = LINE_MAJOR ? TP_BK + (TP_ROUND ? 8 : 4) : EDGE + 8,  // elements per stage row
        STAGE = (LINE_MAJOR ? EDGE : TP_BK) * ROW                  // elements per stage
    };
    // Offset of element (k, mn) in a stage.
    static TP_DEV int at(int k, int mn) { return LINE_MAJOR ? mn * ROW + k : k * ROW + mn; }
#endif
    typedef tp_vec<VEC> V;
    typedef typename tp_elem_of<L>::type E;  // the storage element
    enum { PROLOGUE = tp_has_prologue<L>::value };
    // The loads and registers of the tile in flight: f32 (V), or, into the 16-bit stages of the
    // tensor cores, whatever tp_travel says (the stored bits of bf16 storage).
    typedef typename tp_pick<TP_TF32 && TP_ROUND, typename tp_travel<VEC, E, PROLOGUE>::type,
                             V>::type LV;
    typename L::Line line;
    bool live;
    typename LV::type v[SLOTS];
    // PROLOGUE: the flat index in x of each slot's first element, TP_NO_ELEMENT for zeros
    // (load, prepare).
    tp_idx from[PROLOGUE ? SLOTS : 1];

    // Slot s's vector comes from address `a` (null: zeros), for the prologue.
    TP_DEV void note(const L& l, int s, const E* a) {
        if constexpr (PROLOGUE) from[s] = a ? (tp_idx)(a - l.p.x) : TP_NO_ELEMENT;
    }

    static TP_DEV int slot_mn() { return threadIdx.x % LINES * (L::K_FAST ? 1 : VEC); }
    static TP_DEV int slot_k(int s) {
        return (threadIdx.x / LINES + s * K_STEP) * (L::K_FAST ? VEC : 1);
    }
    static TP_DEV bool slot_used(int s) {
        return ELEMS % TP_BLOCK == 0 || threadIdx.x + s * TP_BLOCK < ELEMS;
    }
    // Where slot s's vector goes in the stage: line and k of its first element (QUAD: lane
    // (8s + lane / 4)'s line, vector lane % 4; otherwise the thread's own line).
    static TP_DEV int pos_mn(int s) {
        if constexpr (QUAD) return threadIdx.x / 32 * 32 % LINES + 8 * s + threadIdx.x % 32 / 4;
        else return slot_mn();
    }
    static TP_DEV int pos_k(int s) {
        if constexpr (QUAD) return threadIdx.x % 4 * VEC;
        else return slot_k(s);
    }
    // QUAD: the run holding slot s's vector (0: zeros), from the lane that found it (`r`: this
    // lane's own run, null for zeros). Every lane of the warp calls it, with the same s.
    static TP_DEV unsigned long long quad_run(const E* r, int s) {
        return tp_shfl_ptr(r, 8 * s + threadIdx.x % 32 / 4);
    }
    // ... and the address of the vector in it.
    static TP_DEV unsigned long long quad_vector(unsigned long long run, int s) {
        return run + pos_k(s) * sizeof(E);
    }

    TP_DEV void init(const L& l, int mn0, int extent) {
        live = mn0 + slot_mn() < extent;
        line = l.line(live ? mn0 + slot_mn() : 0);
    }

    // The address of the run holding the tile starting at k0 (RUN), or null when the run is
    // zeros, the line is past the extent or the tile at or past k_end (k0 and k_end are
    // multiples of TP_BK, so the tile is either all before k_end or all past it).
    TP_DEV const E* run(const L& l, int k0, int k_end) const {
#if TP_TF32
        return tp_keep_if(live & (k0 < k_end), l.at(line, k0));
#else
        // The SIMT core branches on the run anyway: the short-circuit is fewer instructions.
        return live && k0 < k_end ? l.at(line, k0) : nullptr;
#endif
    }

    // The address of element k0 + k of the line (k0 a multiple of TP_BK), or null for a zero.
    TP_DEV const E* address(const L& l, int k0, int k_end, int k) const {
        if constexpr (RUN) {
            const E* r = run(l, k0, k_end);
            return tp_keep_if(r != nullptr, r + k);
        } else if constexpr (L::K_TILE) {
            return tp_keep_if(live & (k0 < k_end), l.at(line, l.tile(line, k0), k));
        } else {
            return tp_keep_if(live & (k0 + k < k_end), l.at(line, k0 + k));
        }
    }

    // Global loads of the tile starting at k0 (elements at or past k_end are zero).
    TP_DEV void load(const L& l, int k0, int k_end) {
        if constexpr (QUAD) {
            const E* r = run(l, k0, k_end);
            unsigned long long runs[SLOTS];
#pragma unroll
            for (int s = 0; s < SLOTS; ++s) runs[s] = quad_run(r, s);
#pragma unroll
            for (int s = 0; s < SLOTS; ++s)
                v[s] = LV::load_if(runs[s] != 0, quad_vector(runs[s], s), (const E*)0);
#pragma unroll
            for (int s = 0; s < SLOTS; ++s) {
                const unsigned long long a = runs[s] ? quad_vector(runs[s], s) : 0;
                note(l, s, reinterpret_cast<const E*>(a));
            }
        } else if constexpr (RUN) {
            const E* a = run(l, k0, k_end);
            if (a) {
#pragma unroll
                for (int s = 0; s < SLOTS; ++s)
                    v[s] = slot_used(s) ? LV::load(a + slot_k(s)) : LV::zero();
            } else {
#pragma unroll
                for (int s = 0; s < SLOTS; ++s) v[s] = LV::zero();
            }
#pragma unroll
            for (int s = 0; s < SLOTS; ++s) note(l, s, a ? a + slot_k(s) : nullptr);
        } else if constexpr (L::K_TILE) {
            const typename L::Tile t = l.tile(line, k0);
            const bool inside = live & (k0 < k_end);
#pragma unroll
            for (int s = 0; s < SLOTS; ++s) {
                const E* a = tp_keep_if(inside & slot_used(s), l.at(line, t, slot_k(s)));
                v[s] = LV::load_or_zero(a);
                note(l, s, a);
            }
        } else {
#pragma unroll
            for (int s = 0; s < SLOTS; ++s) {
                const int k = k0 + slot_k(s);
                // The address whatever the guards say (the loader's arithmetic, never read
                // where they fail), so that no branch separates the slots' loads.
                const E* a = tp_keep_if(live & slot_used(s) & (k < k_end), l.at(line, k));
                v[s] = LV::load_or_zero(a);
                note(l, s, a);
            }
        }
    }

    // The loaded registers as the GEMM multiplies them: through the loader's prologue, if it
    // has one (after the loads have landed, just before the registers go into a stage).
    TP_DEV void prepare(const L& l) {
        if constexpr (PROLOGUE) {
#pragma unroll
            for (int s = 0; s < SLOTS; ++s)
                if (slot_used(s)) v[s] = tp_prologue_at(l.p, from[s], v[s]);
        }
    }

    // Into a shared stage laid out [TP_BK][EDGE + TP_PAD] (k-major), rounded as the GEMM
    // multiplies (tp_round: once per element, after the loads have landed, so the rounding does
    // not hold up the loads in flight).
    TP_DEV void store(float (*sh)[EDGE + TP_PAD]) const {
        const int mn = slot_mn();
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
            if (!slot_used(s)) continue;
            const int k = slot_k(s);
            const typename V::type r = tp_round(v[s]);
            if constexpr (VEC == 1) {
                sh[k][mn] = r;
            } else if constexpr (L::K_FAST) {
                sh[k][mn] = r.x;
                sh[k + 1][mn] = r.y;
                sh[k + 2][mn] = r.z;
                sh[k + 3][mn] = r.w;
            } else {
                *reinterpret_cast<float4*>(&sh[k][mn]) = r;
            }
        }
    }

#if TP_TF32 && TP_ROUND
    // Into a 16-bit stage (layout: at()): each element rounded to bf16/f16 by cvt.rn (tp_to16,
    // tp_pack16), once, after the loads have landed — or, loaded as stored bf16 bits
    // (tp_travel), as they are. A vector is 4 consecutive elements of one
    // stage row either way (along k line-major, along the lines k-major): one 8-byte store.
    TP_DEV void store16(unsigned short* sh) const {
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
            if (!slot_used(s)) continue;
            const int mn = pos_mn(s), k = pos_k(s);
            if constexpr (VEC == 1) {
                sh[at(k, mn)] = tp_stage_bits(v[s]);
            } else {
                *reinterpret_cast<uint2*>(sh + at(k, mn)) = tp_stage_bits(v[s]);
            }
        }
    }
#endif

#if TP_TF32
    // The tile starting at k0 straight into an f32 stage (layout: at()) with cp.async (the
    // TF32 core): the same elements store() would write, copied by the thread that would have
    // loaded them, a vector (4 consecutive elements of a stage row either way) as one 16-byte
    // copy; zeros (padding, rows past the extent, k at or past k_end) are stored directly. The
    // caller commits the group.
    TP_DEV void copy_async(const L& l, int k0, int k_end, float* sh) const {
        static_assert(!PROLOGUE, "cp.async cannot compute a prologue");
        static_assert(sizeof(E) == 4, "cp.async copies f32 storage into f32 stages");
        if constexpr (QUAD) {
            const E* r = run(l, k0, k_end);
#pragma unroll
            for (int s = 0; s < SLOTS; ++s) {
                const unsigned long long q = quad_run(r, s);
                tp_copy_async<16>(sh + at(pos_k(s), pos_mn(s)),
                                  q ? reinterpret_cast<const float*>(quad_vector(q, s)) : nullptr);
            }
        } else {
            const int mn = slot_mn();
#pragma unroll
            for (int s = 0; s < SLOTS; ++s) {
                if (!slot_used(s)) continue;
                const int k = slot_k(s);
                tp_copy_async<VEC * 4>(sh + at(k, mn), address(l, k0, k_end, k));
            }
        }
    }
#endif
};

// N consecutive floats of shared memory (16-byte aligned when N % 4 == 0).
template <int N>
TP_DEV void tp_read_shared(const float* s, float* out) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const float4 q = *reinterpret_cast<const float4*>(s + i);
            out[i] = q.x;
            out[i + 1] = q.y;
            out[i + 2] = q.z;
            out[i + 3] = q.w;
        }
    } else if constexpr (N == 2) {
        const float2 q = *reinterpret_cast<const float2*>(s);
        out[0] = q.x;
        out[1] = q.y;
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = s[i];
    }
}

#if !TP_TF32
// acc = A[m0.., k0..k1) . B[k0..k1), n0..] for the block's tile (rows >= M, columns >= N and
// k >= k1 read as zeros).
template <class LA, class LB>
TP_DEV void tp_gemm_tile(const LA& la, const LB& lb, int M, int N, int k0, int k1, int m0, int n0,
                         float acc[TP_TM][TP_TN]) {
    __shared__ __align__(16) float as[2][TP_BK][TP_BM + TP_PAD];
    __shared__ __align__(16) float bs[2][TP_BK][TP_BN + TP_PAD];
    const int tx = threadIdx.x % TP_TX, ty = threadIdx.x / TP_TX;
    tp_operand<LA, TP_BM> a;
    tp_operand<LB, TP_BN> b;
    a.init(la, m0, M);
    b.init(lb, n0, N);
#pragma unroll
    for (int i = 0; i < TP_TM; ++i)
#pragma unroll
        for (int j = 0; j < TP_TN; ++j) acc[i][j] = 0.0f;
    a.load(la, k0, k1);
    b.load(lb, k0, k1);
    a.prepare(la);
    b.prepare(lb);
    a.store(as[0]);
    b.store(bs[0]);
    __syncthreads();
    int cur = 0;
    for (int kt = k0; kt < k1; kt += TP_BK) {
        const bool more = kt + TP_BK < k1;
        if (more) {
            a.load(la, kt + TP_BK, k1);
            b.load(lb, kt + TP_BK, k1);
        }
#pragma unroll
        for (int kk = 0; kk < TP_BK; ++kk) {
            float av[TP_TM], bv[TP_TN];
            tp_read_shared<TP_TM>(&as[cur][kk][ty * TP_TM], av);
            tp_read_shared<TP_TN>(&bs[cur][kk][tx * TP_TN], bv);
#pragma unroll
            for (int i = 0; i < TP_TM; ++i)
#pragma unroll
                for (int j = 0; j < TP_TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if (more) {
            a.prepare(la);
            b.prepare(lb);
            a.store(as[cur ^ 1]);
            b.store(bs[cur ^ 1]);
        }
        __syncthreads();
        cur ^= 1;
    }
}
#else
// The tensor-core variant (TP_TF32 = 1: Precision::Tf32; Bf16/Fp16 with TP_ROUND, below). The
// same loaders, two shared stages per operand laid out for the tensor cores (tp_operand::at:
// line-major when the operand's lines run along k, k-major otherwise, so that a thread's vector
// of 4 is one 16-byte copy and fragment reads hit 32 banks), filled with cp.async
// (tp_operand::copy_async: the next tile's copies are in flight while the block computes on the
// current stage; one cp.async.wait_group 0 and one barrier per 16-deep K tile), no registers in
// between. The block's 8 warps are laid out TP_WARPS_M x TP_WARPS_N over the tile, each
// computing a TP_WM x TP_WN warp tile as TP_MI x TP_NI fragments of
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (f32 accumulation). Fragments are read
// with 32-bit shared loads and rounded with cvt.rna.tf32.f32 (PTX ISA fragment layout for
// m16n8k8 .tf32: groupID g = lane / 4, t = lane % 4; a0..a3 = A[g][t], A[g+8][t], A[g][t+4],
// A[g+8][t+4]; b0, b1 = B[t][g], B[t+4][g]; c0..c3 = C[g][2t], C[g][2t+1], C[g+8][2t],
// C[g+8][2t+1]). Each mma adds its 8 products to the accumulator, so an element of the result
// is c + sum over K in steps of 8, k ascending: a fixed order, the same bits every run.
// (Measured on an H100, 2026-11-27: with every stage k-major, a convolution's channels-fast
// operand took four 4-byte cp.async per vector and the fragment reads conflicted 2-way; the
// L1 was 92% busy, warps stalled on the MIO queue, and TF32 steps were 1.4x slower than f32.)
//
// At the end the accumulators go through shared memory into the SIMT core's register layout
// (thread (tx, ty) holds rows ty*TP_TM.., columns tx*TP_TN..), so tp_gemm_output — split-K
// combine, epilogue, per-channel epilogue reductions — is the same code for both precisions.
// Generated: TP_WARPS_M, TP_WARPS_N (render/launch.rs Tile::tensor_warps).
//
// With TP_ROUND (BF16/FP16) the same warp tiles multiply natively: the stages hold 16-bit
// values in the same layouts (tp_operand::store16 rounds the loaders' registers with
// cvt.rn.{bf16,f16}.f32 / cvt.rn.{bf16x2,f16x2}.f32, a vector of 4 as one 8-byte store;
// cp.async cannot convert, so the next tile's global loads are in flight in registers while
// the block computes, as on the SIMT core), and each K tile is one
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 per fragment pair, whose A
// fragment is one ldmatrix.x4 and B fragment one ldmatrix.x2 (.trans from a k-major stage;
// PTX ISA m16n8k16 layout: a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9],
// a3 = A[g+8][2t+8, 2t+9]; b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; the lower k in the low
// half; c as above). Each element of the result is c + sum over K in steps of 16, k
// ascending: as fixed an order as TF32's.
#define TP_CPAD 8
// TP_FWIN = 1: a filter gradient through windows (kernels/conv2d_backprop_filter.cu), which lays
// out its own warps and takes only the fragment helpers below and the output path from here.
#ifndef TP_FWIN
#define TP_FWIN 0
#endif
#if !TP_FWIN
#define TP_WM (TP_BM / TP_WARPS_M)
#define TP_WN (TP_BN / TP_WARPS_N)
#define TP_MI (TP_WM / 16)
#define TP_NI (TP_WN / 8)
static_assert(TP_WARPS_M * TP_WARPS_N * 32 == TP_BLOCK, "one warp tile per warp");
static_assert(TP_WM % 16 == 0 && TP_WN % 8 == 0, "warp tiles of whole m16n8 fragments");
#endif

#if TP_ROUND
// The native 16-bit tensor-core path (TP_ROUND = 1: bf16, 2: f16). One 16-deep K tile is ONE
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 per fragment pair (twice
// TF32's tensor throughput), with two operands packed per b32 register.

// ldmatrix .trans of 16-bit 8x8 matrices from shared memory: matrix j's 8 rows (16 bytes each)
// at the addresses of lanes 8j..8j+7; lane (g, t) receives elements [2t][g] (low half) and
// [2t+1][g] (high half) of each — from a k-major stage, exactly the m16n8k16 A and B fragments.
// Without .trans: lane (g, t) receives elements [g][2t] (low half) and [g][2t+1] of each — from
// a line-major stage (rows along the lines, k contiguous), again the m16n8k16 fragments.
TP_DEV void tp_ldmatrix_x4(unsigned int r[4], const unsigned short* row) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
TP_DEV void tp_ldmatrix_x2(unsigned int r[2], const unsigned short* row) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(a)
                 : "memory");
}
TP_DEV void tp_ldmatrix_x4_trans(unsigned int r[4], const unsigned short* row) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
TP_DEV void tp_ldmatrix_x2_trans(unsigned int r[2], const unsigned short* row) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(a)
                 : "memory");
}

// c += a . b for one m16n8k16 fragment (bf16 or f16 operands, two per register; f32
// accumulators).
TP_DEV void tp_mma16(float c[4], const unsigned int a[4], const unsigned int b[2]) {
#if TP_ROUND == 1
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
#else
// x as the b32 an mma operand takes: rounded to tf32 (to nearest, ties away from zero).
TP_DEV unsigned int tp_tf32(float x) {
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// c += a . b for one m16n8k8 fragment (tf32 operands, f32 accumulators).
TP_DEV void tp_mma_tf32(float c[4], const unsigned int a[4], const unsigned int b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

#if !TP_FWIN
#ifndef TP_WINDOW
#define TP_WINDOW 0
#endif
#if TP_WINDOW
// The window variant (TP_WINDOW = 1; render/fixed.rs chooses it for convolutions of stride 1
// whose row tiles are whole rows of one image and whose K tiles are 16 channels of one tap).
// Every tap of such a tile reads pixels of one window of the input:
// LA::WIN_H rows of LA::WIN_W pixels (the tile's rows and the filter's reach around them). The
// pipelined core loaded the tile's 256 pixels once per tap (nine times over for 3x3) with a wait
// and a barrier per K tile; here the block loads the window once (LA::win_source: a pixel's
// channels, or zeros past the image's edge), and B — all of K by TP_BN, as K / TP_BK consecutive
// stages of tp_operand's layout — with it, then waits once, and the K loop only reads shared
// memory and multiplies: K tile k's A fragment rows are the window pixels
// LA::win_row(m) + LA::win_tap(k), channel LA::win_channel(k) on. Where K is split, a block
// still loads the whole window (every tap's pixels, every channel) but only its chunk's K tiles
// of B, and multiplies those: the window is what its taps share, the chunk's taps a part of
// them. The window is pixel-major with
// a pixel's channels contiguous, padded by 4 floats (TF32) or 8 halves (bf16/f16) so that the 8
// rows of a fragment read hit distinct banks; the 16-bit window holds the operands rounded as
// the stages do (cvt.rn, once; bf16 storage's bits as they are, tp_travel), TF32's the f32
// values (rounded on the fragment reads). The
// products and their order are the pipelined core's: the same bits.
template <class LA, class LB>
struct tp_window {
    typedef tp_operand<LB, TP_BN> OB;
    typedef typename tp_elem_of<LA>::type XE;  // A's storage element
#if TP_ROUND
    typedef unsigned short Elem;
#else
    typedef float Elem;
#endif
    enum {
        C = LA::WIN_C,
        ROW = C + (TP_ROUND ? 8 : 4),  // elements per window pixel
        PIXELS = LA::WIN_H * LA::WIN_W,
        VECS = PIXELS * (C / 4),  // source vectors of the window (4 elements: 16 or 8 bytes)
        // K tiles of the block's chunk at most (all of K when it is not split).
        TILES = (TP_SPLIT_K > 1 ? TP_K_CHUNK : LA::WIN_K) / TP_BK,
        // Floats of the window, then of B's stages (each a whole number of 16-byte pieces).
        WIN_FLOATS = (PIXELS * ROW * (int)sizeof(Elem) / 4 + 3) / 4 * 4,
        B_FLOATS = TILES * OB::STAGE * (int)sizeof(Elem) / 4,
        FLOATS = WIN_FLOATS + B_FLOATS
    };
    static_assert(C % TP_BK == 0 && LA::WIN_K % TP_BK == 0, "a K tile is 16 channels of one tap");
    static_assert(OB::STAGE * (int)sizeof(Elem) % 16 == 0, "B's stages stay 16-byte aligned");

    // Loads the window and B's K tiles k0 .. k1 into shared memory (`smem`: FLOATS floats) and
    // waits for them.
    static TP_DEV void fill(const LA& la, const LB& lb, int N, int m0, int n0, int k0, int k1,
                            float* smem) {
        Elem* win = reinterpret_cast<Elem*>(smem);
        Elem* bs = reinterpret_cast<Elem*>(smem + WIN_FLOATS);
        OB b;
        b.init(lb, n0, N);
        const int tiles = (k1 - k0) / TP_BK;
#if TP_ROUND
        // Through registers (cp.async cannot convert): the window's vectors in passes of up to
        // PASS per thread in flight at once (more would not fit 64 registers: 32 channels over
        // 18 x 18 pixels are 11 a thread), each rounded into it; B in groups of 3 K tiles.
        constexpr int PER = (VECS + TP_BLOCK - 1) / TP_BLOCK, PASS = 6;
        // The registers a vector travels in: f32, or stored bf16 bits (tp_travel).
        typedef typename tp_travel<4, XE, TP_PROLOGUE>::type T;
#if TP_PROLOGUE
        // A thread copies channels 4q.. of its pixels, q the same for all of them (C / 4
        // divides the block): the prologue's per-channel operands for them, read once.
        static_assert(TP_BLOCK % (C / 4) == 0, "a thread's vectors are the same 4 channels");
        const tp_pro_held held = tp_prologue_hold(la.p, 4 * (threadIdx.x % (C / 4)));
#endif
#pragma unroll
        for (int j0 = 0; j0 < PER; j0 += PASS) {
            typename T::type v[PASS];
#pragma unroll
            for (int j = 0; j < PASS; ++j) {
                const int e = threadIdx.x + (j0 + j) * TP_BLOCK, px = e / (C / 4), q = e % (C / 4);
                const XE* src = j0 + j < PER && e < VECS ? la.win_source(m0, px) : nullptr;
                v[j] = T::load_if(
                    src != nullptr, reinterpret_cast<unsigned long long>(src) + 4 * sizeof(XE) * q,
                    src);
            }
#pragma unroll
            for (int j = 0; j < PASS; ++j) {
                const int e = threadIdx.x + (j0 + j) * TP_BLOCK, px = e / (C / 4), q = e % (C / 4);
                if (j0 + j < PER && e < VECS) {
#if TP_PROLOGUE
                    // The source again (arithmetic), now that the loads have landed.
                    const XE* src = la.win_source(m0, px);
                    v[j] = tp_prologue_held_from(la.p, held, src ? src + 4 * q : nullptr, v[j]);
#endif
                    *reinterpret_cast<uint2*>(win + px * ROW + 4 * q) = tp_stage_bits(v[j]);
                }
            }
        }
        constexpr int GROUP = 3;
#pragma unroll
        for (int t0 = 0; t0 < TILES; t0 += GROUP) {
            OB part[GROUP];
#pragma unroll
            for (int d = 0; d < GROUP; ++d) {
                if (t0 + d < tiles) {
                    part[d] = b;
                    part[d].load(lb, k0 + (t0 + d) * TP_BK, k1);
                }
            }
#pragma unroll
            for (int d = 0; d < GROUP; ++d)
                if (t0 + d < tiles) part[d].store16(bs + (t0 + d) * OB::STAGE);
        }
#else
        static_assert(!tp_has_prologue<LA>::value, "cp.async cannot compute a prologue");
        static_assert(sizeof(XE) == 4, "cp.async copies f32 storage into an f32 window");
        for (int e = threadIdx.x; e < VECS; e += TP_BLOCK) {
            const int px = e / (C / 4), q = e % (C / 4);
            const float* src = la.win_source(m0, px);
            tp_copy_async<16>(win + px * ROW + 4 * q, src ? src + 4 * q : nullptr);
        }
#pragma unroll 1
        for (int kt = 0; kt < tiles; ++kt) b.copy_async(lb, k0 + kt * TP_BK, k1, bs + kt * OB::STAGE);
        tp_copy_commit();
        tp_copy_wait_all();
#endif
        __syncthreads();
    }

    // c += the tile's products over K tiles k0 .. k1, from the window and B's stages (after
    // fill).
    static TP_DEV void multiply(const float* smem, float c[TP_MI][TP_NI][4], int wm0, int wn0,
                                int k0, int k1) {
        const int tiles = (k1 - k0) / TP_BK;
        const Elem* win = reinterpret_cast<const Elem*>(smem);
        const Elem* bs = reinterpret_cast<const Elem*>(smem + WIN_FLOATS);
        const int lane = threadIdx.x % 32;
#if TP_ROUND
        // This lane's ldmatrix rows, as in the pipelined core: A's rows are window pixels.
        int a_row[TP_MI];
#pragma unroll
        for (int i = 0; i < TP_MI; ++i)
            a_row[i] = LA::win_row(wm0 + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ROW +
                       (lane >> 4) * 8;
        const int b_at = OB::LINE_MAJOR ? OB::at(((lane >> 3) & 1) * 8, wn0 + (lane & 7))
                                        : OB::at((lane & 7) + ((lane >> 3) & 1) * 8, wn0);
#pragma unroll 1
        for (int kt = 0; kt < tiles; ++kt) {
            const int k = k0 + kt * TP_BK, off = LA::win_tap(k) * ROW + LA::win_channel(k);
            unsigned int af[TP_MI][4], bf[TP_NI][2];
#pragma unroll
            for (int i = 0; i < TP_MI; ++i) tp_ldmatrix_x4(af[i], win + a_row[i] + off);
#pragma unroll
            for (int j = 0; j < TP_NI; ++j) {
                const Elem* row = bs + kt * OB::STAGE + b_at + OB::at(0, j * 8);
                if constexpr (OB::LINE_MAJOR) tp_ldmatrix_x2(bf[j], row);
                else tp_ldmatrix_x2_trans(bf[j], row);
            }
#pragma unroll
            for (int i = 0; i < TP_MI; ++i)
#pragma unroll
                for (int j = 0; j < TP_NI; ++j) tp_mma16(c[i][j], af[i], bf[j]);
        }
#else
        const int g = lane / 4, t = lane % 4;
        // This lane's fragment rows g and g + 8 of each of its TP_MI fragments, at its k = t.
        int a_lo[TP_MI], a_hi[TP_MI];
#pragma unroll
        for (int i = 0; i < TP_MI; ++i) {
            a_lo[i] = LA::win_row(wm0 + i * 16 + g) * ROW + t;
            a_hi[i] = LA::win_row(wm0 + i * 16 + g + 8) * ROW + t;
        }
        const int b_frag = OB::at(t, wn0 + g);
#pragma unroll 1
        for (int kt = 0; kt < tiles; ++kt) {
            const int k = k0 + kt * TP_BK, off = LA::win_tap(k) * ROW + LA::win_channel(k);
            const float* sb = bs + kt * OB::STAGE + b_frag;
#pragma unroll
            for (int ks = 0; ks < TP_BK; ks += 8) {
                unsigned int af[TP_MI][4], bf[TP_NI][2];
#pragma unroll
                for (int i = 0; i < TP_MI; ++i) {
                    af[i][0] = tp_tf32(win[a_lo[i] + off + ks]);
                    af[i][1] = tp_tf32(win[a_hi[i] + off + ks]);
                    af[i][2] = tp_tf32(win[a_lo[i] + off + ks + 4]);
                    af[i][3] = tp_tf32(win[a_hi[i] + off + ks + 4]);
                }
#pragma unroll
                for (int j = 0; j < TP_NI; ++j) {
                    bf[j][0] = tp_tf32(sb[OB::at(ks, j * 8)]);
                    bf[j][1] = tp_tf32(sb[OB::at(ks + 4, j * 8)]);
                }
#pragma unroll
                for (int i = 0; i < TP_MI; ++i)
#pragma unroll
                    for (int j = 0; j < TP_NI; ++j) tp_mma_tf32(c[i][j], af[i], bf[j]);
            }
        }
#endif
        // Every warp is past its last read before the window becomes the accumulator tile.
        __syncthreads();
    }
};
#endif

// acc = A[m0.., k0..k1) . B[k0..k1), n0..] for the block's tile (rows >= M, columns >= N and
// k >= k1 read as zeros), products of tf32-rounded operands on the tensor cores (with TP_ROUND:
// of bf16/f16 operands, natively).
template <class LA, class LB>
TP_DEV void tp_gemm_tile(const LA& la, const LB& lb, int M, int N, int k0, int k1, int m0, int n0,
                         float acc[TP_TM][TP_TN]) {
    typedef float CTile[TP_BN + TP_CPAD];
    typedef tp_operand<LA, TP_BM> OA;
    typedef tp_operand<LB, TP_BN> OB;
    constexpr int C_FLOATS = TP_BM * (TP_BN + TP_CPAD);
#if TP_ROUND
    typedef unsigned short Elem;  // two 16-bit stages per operand: half the bytes of f32 ones
#else
    typedef float Elem;
#endif
    // Floats of the two stages of each operand (each stage a whole number of 16-byte pieces).
    constexpr int STAGE_A = OA::STAGE * (int)sizeof(Elem) / 4, STAGE_B = OB::STAGE * (int)sizeof(Elem) / 4;
    static_assert(STAGE_A % 4 == 0 && STAGE_B % 4 == 0, "stages stay 16-byte aligned");
#if TP_WINDOW
    constexpr int STAGES = tp_window<LA, LB>::FLOATS;  // the window and all of B
#else
    constexpr int STAGES = 2 * (STAGE_A + STAGE_B);
#endif
    // The stages while K runs, then the accumulator tile.
    __shared__ __align__(16) float smem[STAGES > C_FLOATS ? STAGES : C_FLOATS];
    // Stage `i` of A and of B (no array of pointers: indexed by the loop's stage it would live
    // in local memory).
    auto as = [&](int i) { return reinterpret_cast<Elem*>(smem + i * STAGE_A); };
    auto bs = [&](int i) { return reinterpret_cast<Elem*>(smem + 2 * STAGE_A + i * STAGE_B); };
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, t = lane % 4;
    const int wm0 = warp / TP_WARPS_N * TP_WM, wn0 = warp % TP_WARPS_N * TP_WN;
#if !TP_WINDOW
    OA a;
    OB b;
    a.init(la, m0, M);
    b.init(lb, n0, N);
#endif
    float c[TP_MI][TP_NI][4];
#pragma unroll
    for (int i = 0; i < TP_MI; ++i)
#pragma unroll
        for (int j = 0; j < TP_NI; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) c[i][j][r] = 0.0f;
#if TP_WINDOW
    tp_window<LA, LB>::fill(la, lb, N, m0, n0, k0, k1, smem);
    tp_window<LA, LB>::multiply(smem, c, wm0, wn0, k0, k1);
#elif TP_ROUND
    static_assert(TP_BK == 16, "one m16n8k16 per K tile");
    // The SIMT core's pipeline (cp.async cannot convert): the next tile's global loads are in
    // flight in registers while the block computes on the current stage, then they are rounded
    // into the other stage (store16); one barrier per K tile.
    a.load(la, k0, k1);
    b.load(lb, k0, k1);
    a.prepare(la);
    b.prepare(lb);
    a.store16(as(0));
    b.store16(bs(0));
    __syncthreads();
    // This lane's ldmatrix row (lanes 8j..8j+7 address the rows of matrix j). A's four 8x8
    // matrices are (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15) of a
    // fragment: a0..a3 of the PTX ISA's m16n8k16 layout (a0 = A[g][2t, 2t+1], a1 = A[g+8][..],
    // a2 = A[g][2t+8, 2t+9], a3 = A[g+8][..]), read as rows of a line-major stage or, .trans,
    // from a k-major one. B's two are k 0-7 and 8-15 of its 8 columns (b0 = B[2t, 2t+1][g],
    // b1 = B[2t+8, 2t+9][g]).
    const int a_at = OA::LINE_MAJOR
                         ? OA::at((lane >> 4) * 8, wm0 + (lane & 7) + ((lane >> 3) & 1) * 8)
                         : OA::at((lane & 7) + (lane >> 4) * 8, wm0 + ((lane >> 3) & 1) * 8);
    const int b_at = OB::LINE_MAJOR ? OB::at(((lane >> 3) & 1) * 8, wn0 + (lane & 7))
                                    : OB::at((lane & 7) + ((lane >> 3) & 1) * 8, wn0);
    int cur = 0;
    for (int kt = k0; kt < k1; kt += TP_BK) {
        const bool more = kt + TP_BK < k1;
        if (more) {
            a.load(la, kt + TP_BK, k1);
            b.load(lb, kt + TP_BK, k1);
        }
        unsigned int af[TP_MI][4], bf[TP_NI][2];
#pragma unroll
        for (int i = 0; i < TP_MI; ++i) {
            const unsigned short* row = as(cur) + a_at + OA::at(0, i * 16);
            if constexpr (OA::LINE_MAJOR) tp_ldmatrix_x4(af[i], row);
            else tp_ldmatrix_x4_trans(af[i], row);
        }
#pragma unroll
        for (int j = 0; j < TP_NI; ++j) {
            const unsigned short* row = bs(cur) + b_at + OB::at(0, j * 8);
            if constexpr (OB::LINE_MAJOR) tp_ldmatrix_x2(bf[j], row);
            else tp_ldmatrix_x2_trans(bf[j], row);
        }
#pragma unroll
        for (int i = 0; i < TP_MI; ++i)
#pragma unroll
            for (int j = 0; j < TP_NI; ++j) tp_mma16(c[i][j], af[i], bf[j]);
        // The other stage was last read before the barrier ending the previous tile.
        if (more) {
            a.prepare(la);
            b.prepare(lb);
            a.store16(as(cur ^ 1));
            b.store16(bs(cur ^ 1));
        }
        __syncthreads();
        cur ^= 1;
    }
#else
    const int a_frag = OA::at(t, wm0 + g), b_frag = OB::at(t, wn0 + g);
    a.copy_async(la, k0, k1, as(0));
    b.copy_async(lb, k0, k1, bs(0));
    tp_copy_commit();
    tp_copy_wait_all();
    __syncthreads();
    int cur = 0;
    for (int kt = k0; kt < k1; kt += TP_BK) {
        // The other stage was last read before the barrier ending the previous tile: the next
        // tile's copies go straight into it while this one computes.
        const bool more = kt + TP_BK < k1;
        if (more) {
            a.copy_async(la, kt + TP_BK, k1, as(cur ^ 1));
            b.copy_async(lb, kt + TP_BK, k1, bs(cur ^ 1));
            tp_copy_commit();
        }
        // This lane's fragment elements: (t, g) of each, at constant offsets from here.
        const float* sa = as(cur) + a_frag;
        const float* sb = bs(cur) + b_frag;
#pragma unroll
        for (int ks = 0; ks < TP_BK; ks += 8) {
            unsigned int af[TP_MI][4], bf[TP_NI][2];
#pragma unroll
            for (int i = 0; i < TP_MI; ++i) {
                af[i][0] = tp_tf32(sa[OA::at(ks, i * 16)]);
                af[i][1] = tp_tf32(sa[OA::at(ks, i * 16 + 8)]);
                af[i][2] = tp_tf32(sa[OA::at(ks + 4, i * 16)]);
                af[i][3] = tp_tf32(sa[OA::at(ks + 4, i * 16 + 8)]);
            }
#pragma unroll
            for (int j = 0; j < TP_NI; ++j) {
                bf[j][0] = tp_tf32(sb[OB::at(ks, j * 8)]);
                bf[j][1] = tp_tf32(sb[OB::at(ks + 4, j * 8)]);
            }
#pragma unroll
            for (int i = 0; i < TP_MI; ++i)
#pragma unroll
                for (int j = 0; j < TP_NI; ++j) tp_mma_tf32(c[i][j], af[i], bf[j]);
        }
        // This thread's copies have landed; after the barrier, everyone's have, and nobody
        // reads the current stage any more.
        tp_copy_wait_all();
        __syncthreads();
        cur ^= 1;
    }
#endif
    // Every warp is past its last fragment read (the barrier above): the stages become the tile.
    CTile* cs = reinterpret_cast<CTile*>(smem);
#pragma unroll
    for (int i = 0; i < TP_MI; ++i)
#pragma unroll
        for (int j = 0; j < TP_NI; ++j) {
            const int r = wm0 + i * 16 + g, n = wn0 + j * 8 + 2 * t;
            *reinterpret_cast<float2*>(&cs[r][n]) = make_float2(c[i][j][0], c[i][j][1]);
            *reinterpret_cast<float2*>(&cs[r + 8][n]) = make_float2(c[i][j][2], c[i][j][3]);
        }
    __syncthreads();
    const int tx = threadIdx.x % TP_TX, ty = threadIdx.x / TP_TX;
#pragma unroll
    for (int i = 0; i < TP_TM; ++i) tp_read_shared<TP_TN>(&cs[ty * TP_TM + i][tx * TP_TN], acc[i]);
}
#endif  // !TP_FWIN
#endif

#if TP_EPI_RED > 0
// The warps' per-column sums of every reduction slot (TP_EPI_RED × TP_BN each). With variances,
// their first TP_EPI_VAR × TP_BN floats hold the block's shifts until the sums are written.
__shared__ float tp_warp_sums[TP_BLOCK / 32][TP_EPI_RED * TP_BN];

// The block's sums of the reduced epilogue outputs per column (`red[j][r]`: this thread's rows
// of column j), combined over the blocks of the column tile; the combining block finishes them.
// Slots 0 .. TP_EPI_PLAIN - 1 are sums and means, combined by sum (tp_split_combine); then two
// a variance: the block's `x − K` and `(x − K)²` about its shift K (`shift`, the tile's first
// row), which with the tile's `rows` make the block's (n, K, S, Q), merged over the blocks by
// tp_var_combine into the variance (kernels/split.cuh).
template <class O>
TP_DEV void tp_gemm_reduce_columns(const tp_params& p, const O& out, int N, int n0,
                                   float red[TP_TN][TP_EPI_RED], unsigned int slot, float rows) {
    constexpr int P = TP_EPI_PLAIN * TP_BN, E = (P + TP_BLOCK - 1) / TP_BLOCK;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, tx = threadIdx.x % TP_TX;
#if TP_EPI_VAR > 0
    constexpr int Q = TP_EPI_VAR * TP_BN;
    static_assert(Q <= TP_BLOCK, "a thread a variance and column");
    // The shifts out of the warps' sums before the sums overwrite them.
    const float shift = (int)threadIdx.x < Q ? tp_warp_sums[0][threadIdx.x] : 0.0f;
    __syncthreads();
#endif
#pragma unroll
    for (int j = 0; j < TP_TN; ++j)
#pragma unroll
        for (int r = 0; r < TP_EPI_RED; ++r) {
            float v = red[j][r];
            // Lanes of one column: a butterfly gives every one of them the same sum.
#pragma unroll
            for (int off = TP_TX; off < 32; off <<= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane < TP_TX) tp_warp_sums[warp][r * TP_BN + tx * TP_TN + j] = v;
        }
    __syncthreads();
#if TP_EPI_VAR > 0
    {
        // Thread t: variance t / TP_BN of column t % TP_BN.
        const int t = threadIdx.x, c = t % TP_BN, s = TP_EPI_PLAIN + 2 * (t / TP_BN);
        float4 q = make_float4(rows, shift, 0.0f, 0.0f);
        if (t < Q) {
#pragma unroll
            for (int w = 0; w < TP_BLOCK / 32; ++w) {
                q.z += tp_warp_sums[w][s * TP_BN + c];
                q.w += tp_warp_sums[w][(s + 1) * TP_BN + c];
            }
        }
        if (tp_var_combine(q, p.var_ws, p.var_ws_count, slot / gridDim.x, slot % gridDim.x, gridDim.x,
                           TP_RED_GROUP, Q) &&
            t < Q && n0 + c < N) {
            const float off = q.z / q.x;
            tp_epi_var_finish(p, t / TP_BN, out.channel(n0 + c), fmaxf(q.w / q.x - off * off, 0.0f));
        }
    }
#endif
#if TP_EPI_PLAIN > 0
    float part[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int idx = threadIdx.x * E + e;
        part[e] = 0.0f;
        if (idx < P) {
#pragma unroll
            for (int w = 0; w < TP_BLOCK / 32; ++w) part[e] += tp_warp_sums[w][idx];
        }
    }
    // One block per row tile arrives here: the one that combined its splits of K, whichever
    // split it computed. The column tile (z, blockIdx.y) and the row tile come from the output
    // tile's `slot`, not from blockIdx: ptxas keeps blockIdx's values in registers across the
    // K loop otherwise, and spills at 64 registers with a split of K.
    if (!tp_split_combine<E>(part, p.red_ws, p.red_ws_count, slot / gridDim.x, slot % gridDim.x,
                             gridDim.x, TP_RED_GROUP, P))
        return;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int idx = threadIdx.x * E + e;
        if (idx < P && n0 + idx % TP_BN < N) tp_epi_finish(p, idx / TP_BN, out.channel(n0 + idx % TP_BN), part[e]);
    }
#endif
}
#endif

// Hands every in-range element of the tile to the epilogue (after combining the splits of K).
// `out` maps (m, n) to the flat output index and n to its channel, and says which rows below M
// are outputs at all (`valid`: every one but for the phases of a strided input gradient);
// `slot` numbers the output tile among the launch's tiles, (z · gridDim.y + blockIdx.y) ·
// gridDim.x + blockIdx.x (the split's workspace; the epilogue reductions' column tile and
// member), `split` is this block's part of K.
//
// The epilogue's column operands (per-channel scale, mean, bias: tp_epi_col) are read once per
// column of the thread's register block, before the rows; a row is tested once (m < M, valid),
// and its columns not at all where the column tiles cover N exactly (TP_N_WHOLE), so a row's
// elements are one straight run of code and ptxas issues their loads together. Before, every
// element was a guarded branch of its own that loaded every operand and waited for it: sm_90
// SASS of ResNet-20's 16-channel input gradients at batch 128, 134 -> 83 global loads and
// 1,576 -> 1,272 instructions. (Testing rows not at all either, where the row tiles cover M,
// lets ptxas hoist all 16 elements' loads: 8-20 bytes of register spills at 64 registers.)
template <class O>
TP_DEV void tp_gemm_output(const tp_params& p, const O& out, int M, int N, int m0, int n0,
                           unsigned int slot, unsigned int split, float acc[TP_TM][TP_TN]) {
#if TP_SPLIT_K > 1
    if (!tp_split_combine<TP_TM * TP_TN>(&acc[0][0], p.ws, p.ws_count, slot, split, TP_SPLIT_K,
                                         TP_GROUP, TP_BM * TP_BN))
        return;
#endif
    const int tx = threadIdx.x % TP_TX, ty = threadIdx.x / TP_TX;
#if TP_EPI_RED > 0
    float red[TP_TN][TP_EPI_RED];
#pragma unroll
    for (int j = 0; j < TP_TN; ++j)
#pragma unroll
        for (int r = 0; r < TP_EPI_RED; ++r) red[j][r] = 0.0f;
#endif
    // The column operands of this thread's columns, read once (a column past N reads column
    // n0's, which exists, and is never used).
    tp_epi_col cols[TP_TN];
#pragma unroll
    for (int j = 0; j < TP_TN; ++j) {
        const int n = n0 + tx * TP_TN + j;
        cols[j] = tp_epi_column(p, out.channel(TP_N_WHOLE || n < N ? n : n0));
    }
#if TP_EPI_VAR > 0
    // The block's shift per variance and column: its value at the tile's first row m0 (every
    // tile has it; a forward convolution's rows are all valid), held in the warps' sums.
    float* const shift = &tp_warp_sums[0][0];
    if (ty == 0) {
#pragma unroll
        for (int j = 0; j < TP_TN; ++j) {
            const int n = n0 + tx * TP_TN + j;
            if (TP_N_WHOLE || n < N) tp_epi_shift(p, out.flat(m0, n), cols[j], acc[0][j], shift + tx * TP_TN + j);
        }
    }
    __syncthreads();
#endif
#pragma unroll
    for (int i = 0; i < TP_TM; ++i) {
        const int m = m0 + ty * TP_TM + i;
        if (m >= M || !out.valid(m)) continue;
#pragma unroll
        for (int j = 0; j < TP_TN; ++j) {
            const int n = n0 + tx * TP_TN + j;
            if (TP_N_WHOLE || n < N) {
#if TP_EPI_VAR > 0
                tp_epilogue(p, out.flat(m, n), cols[j], acc[i][j], red[j], shift + tx * TP_TN + j);
#elif TP_EPI_RED > 0
                tp_epilogue(p, out.flat(m, n), cols[j], acc[i][j], red[j]);
#else
                tp_epilogue(p, out.flat(m, n), cols[j], acc[i][j]);
#endif
            }
        }
    }
#if TP_EPI_RED > 0
    tp_gemm_reduce_columns(p, out, N, n0, red, slot, (float)(M - m0 < TP_BM ? M - m0 : TP_BM));
#endif
}
