// Deterministic combine of partial results across the blocks of one launch (split-K GEMMs and
// the per-channel reductions of convolution epilogues).
//
// `members` blocks share a slot (an output tile, or a tile of channels). Each stores its
// partial (a vector of P floats, thread t holding elements t*E .. t*E+E-1) to the workspace,
// fences, and counts itself in with an atomic. Members form groups of `group` consecutive
// blocks: the last block of a group to arrive adds the group's partials in member order and,
// when there are several groups, stores the group's sum and counts it in at the slot level;
// the last group's block adds the group sums in group order. The association of the sums is
// fixed by (members, group), never by which block arrives last, so the result is bitwise the
// same on every run. Counters are reset to zero by the block that read them last, so the
// workspace is ready for the next launch.
//
// Workspace of a slot: (members + (groups > 1 ? groups : 0)) * P floats of partials; counters:
// groups + 1 per slot. Partials go through L2 (`__stcg`/`__ldcg`): they are written and read by
// different blocks of the same launch.

template <int E>
TP_DEV void tp_store_part(float* part, unsigned int base, const float* v, unsigned int P) {
    if constexpr (E % 4 == 0) {
#pragma unroll
        for (int e = 0; e < E; e += 4) {
            if (base + e < P)
                __stcg(reinterpret_cast<float4*>(part + base + e), make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]));
        }
    } else {
#pragma unroll
        for (int e = 0; e < E; ++e) {
            if (base + e < P) __stcg(part + base + e, v[e]);
        }
    }
}

// v = the sum, in order, of `count` partials starting at `parts` (stride P). Four partials'
// loads in flight at once; two where a partial is more than 4 scalars (E = 9 of a filter
// gradient's windows: 36 loads in flight spilled at 64 registers).
template <int E>
TP_DEV void tp_sum_parts(const float* parts, unsigned int count, unsigned int P, unsigned int base, float* v) {
#pragma unroll
    for (int e = 0; e < E; ++e) v[e] = 0.0f;
#pragma unroll(E % 4 == 0 || E <= 4 ? 4 : 2)
    for (unsigned int s = 0; s < count; ++s) {
        const float* part = parts + (size_t)s * P + base;
        if constexpr (E % 4 == 0) {
#pragma unroll
            for (int e = 0; e < E; e += 4) {
                if (base + e < P) {
                    const float4 q = __ldcg(reinterpret_cast<const float4*>(part + e));
                    v[e] += q.x;
                    v[e + 1] += q.y;
                    v[e + 2] += q.z;
                    v[e + 3] += q.w;
                }
            }
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e) {
                if (base + e < P) v[e] += __ldcg(part + e);
            }
        }
    }
}

// The arrival protocol both combines share (see the top of this file): this block stores its
// partial as member `member` of `slot`, and exactly one block of the slot returns true, holding
// the fixed-order combination of every member's partial. `Part` is what a partial is and how
// partials combine: its STRIDE elements of type Elem a partial, store(at) writes this block's
// partial at `at`, gather(at, count) replaces it by the ordered combination of the `count`
// partials from `at` (stride STRIDE). Every thread of the block must call it (it synchronises
// the block). A __shared__ flag per instantiation, as the two kinds of partial had each.
template <typename Part>
TP_DEV bool tp_combine_in_order(Part& part, float* ws, unsigned int* counters, unsigned int slot,
                                unsigned int member, unsigned int members, unsigned int group) {
    __shared__ unsigned int tp_last;
    const unsigned int groups = (members + group - 1) / group;
    const unsigned int sums = groups > 1 ? groups : 0;
    typename Part::Elem* parts =
        reinterpret_cast<typename Part::Elem*>(ws) + (size_t)slot * (members + sums) * part.stride();
    unsigned int* count = counters + slot * (groups + 1);
    part.store(parts + (size_t)member * part.stride());
    __threadfence();
    __syncthreads();
    const unsigned int g = member / group, first = g * group;
    const unsigned int size = members - first < group ? members - first : group;
    if (threadIdx.x == 0) {
        __threadfence();
        tp_last = atomicAdd(&count[g], 1u) == size - 1;
    }
    __syncthreads();
    if (!tp_last) return false;
    __threadfence();
    part.gather(parts + (size_t)first * part.stride(), size);
    if (threadIdx.x == 0) count[g] = 0;
    if (groups == 1) return true;
    part.store(parts + (size_t)(members + g) * part.stride());
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        tp_last = atomicAdd(&count[groups], 1u) == groups - 1;
    }
    __syncthreads();
    if (!tp_last) return false;
    __threadfence();
    part.gather(parts + (size_t)members * part.stride(), groups);
    if (threadIdx.x == 0) count[groups] = 0;
    return true;
}

// A partial that is a vector of P floats, thread t holding elements t*E .. t*E+E-1 in `v`;
// partials combine by sum.
template <int E>
struct tp_sum_part {
    typedef float Elem;
    float* v;
    unsigned int P;
    TP_DEV unsigned int stride() const { return P; }
    TP_DEV void store(float* at) const { tp_store_part<E>(at, threadIdx.x * E, v, P); }
    TP_DEV void gather(const float* at, unsigned int count) const {
        tp_sum_parts<E>(at, count, P, threadIdx.x * E, v);
    }
};

// Stores this block's partial `v` as member `member` of `slot`; returns true in exactly one block
// of the slot, with `v` replaced by the fixed-order sum of every member's partial. Every thread
// of the block must call it (it synchronises the block).
template <int E>
TP_DEV bool tp_split_combine(float* v, float* ws, unsigned int* counters, unsigned int slot,
                             unsigned int member, unsigned int members, unsigned int group,
                             unsigned int P) {
    tp_sum_part<E> part = {v, P};
    return tp_combine_in_order(part, ws, counters, slot, member, members, group);
}

// The variances of epilogue reductions merge in one pass without their mean: a block's partial
// is (n, K, S, Q) for n values, K a value of theirs (the block's shift), S = Σ(x − K) and
// Q = Σ(x − K)². `a` absorbs `b` re-centred on a's K (d = K_b − K_a): Σ_b(x − K_a) = S_b + n_b d,
// Σ_b(x − K_a)² = Q_b + d (2 S_b + n_b d). The shifts are values of the data, so every term is
// of the order of the variance whatever the data's offset; the variance is Q/n − (S/n)².
TP_DEV void tp_var_merge(float4& a, const float4 b) {
    const float d = b.y - a.y;
    a.w += b.w + d * (2.0f * b.z + b.x * d);
    a.z += b.z + b.x * d;
    a.x += b.x;
}

// v = member 0 of `count` partials at `parts` (stride Q) absorbing the others in order (four
// partials' loads in flight, as tp_sum_parts).
TP_DEV void tp_var_parts(const float4* parts, unsigned int count, unsigned int Q, float4& v) {
    v = __ldcg(parts + threadIdx.x);
#pragma unroll 4
    for (unsigned int s = 1; s < count; ++s) tp_var_merge(v, __ldcg(parts + (size_t)s * Q + threadIdx.x));
}

// A variance partial: thread t < Q holds partial t of this block (one (n, K, S, Q) a variance
// and column) in `v`; partials combine by tp_var_merge, in order.
struct tp_var_part {
    typedef float4 Elem;
    float4& v;
    unsigned int Q;
    TP_DEV unsigned int stride() const { return Q; }
    TP_DEV void store(float4* at) const {
        if (threadIdx.x < Q) __stcg(at + threadIdx.x, v);
    }
    TP_DEV void gather(const float4* at, unsigned int count) const {
        if (threadIdx.x < Q) tp_var_parts(at, count, Q, v);
    }
};

// tp_split_combine for variance partials (tp_var_part): returns true in exactly one block of
// the slot, with `v` replaced by the merge of every member's, in member order (then group
// order), so the result is bitwise the same on every run. Same workspace layout with float4
// elements.
TP_DEV bool tp_var_combine(float4& v, float* ws, unsigned int* counters, unsigned int slot,
                           unsigned int member, unsigned int members, unsigned int group,
                           unsigned int Q) {
    tp_var_part part = {v, Q};
    return tp_combine_in_order(part, ws, counters, slot, member, members, group);
}
