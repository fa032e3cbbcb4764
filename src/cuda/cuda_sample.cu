// cuda/cuda_sample.cu — the device sampler: for each output row that asks for it
// (model/device_sampling.h, temperature > 0), one token drawn from the logits where they
// are, written over the row's argmax id, so a sampled request sends one id across PCIe a
// step instead of its 1 MB logits row and waits for no host sampler.
//
// One block of 1,024 threads a row. Warp w owns the contiguous ids [w·span, (w+1)·span)
// and reads them 32 at a time (coalesced), so "in id order" is warp order, then iteration
// order, then lane order: ballots and warp scans give ranks in id order without sorting.
// Every pass re-reads the row (L2-resident for a few rows; 1 MB each) and recomputes each
// token's p and weight by the shared header's functions — the same fp32 operations as
// the host reference (device_sampling.c), hence the same bits. All sums are of integer
// weights (p · 2^44), so atomics and reductions give the same result in any order and the
// draw is deterministic.
//
// Passes: the maximum; count and mass of the kept tokens (min_p); top_k and top_p each a
// radix select over the 31 bits of p (11 + 10 + 10-bit digits, histograms of count and
// mass in shared memory, warp-aggregated atomics: the first digit puts most of a row in
// a few dozen bins) finding the threshold (tau, cut): members are p > tau, or p == tau
// with id < cut (ties by id: one more pass only when a threshold splits its ties); the
// draw r = floor(u·M); the per-warp masses of the finalists, then one warp walks its
// chunk with an inclusive scan until the running mass exceeds r.
#include <math.h>

#include "cuda/cuda_internal.h"
#include "model/device_sampling.h"

#define SMP_THREADS 1024
#define SMP_WARPS (SMP_THREADS / 32)
#define SMP_BINS 2048

struct smp_sel { /* members: key > tau, or key == tau and id < cut (tau 0: every kept token) */
    uint32_t tau;
    int32_t cut;
};

struct smp_shared {
    unsigned int hc[SMP_BINS];       /* radix pass: count a bin */
    unsigned long long hm[SMP_BINS]; /* radix pass: mass a bin */
    unsigned long long wa[SMP_WARPS], wb[SMP_WARPS];
    float wf[SMP_WARPS];
    unsigned long long bc_above, bm_above; /* the chosen bin's count / mass above it */
    unsigned int bin, bin_count;
    int found;
};

struct smp_row {
    const float *l;
    int V, lo, hi; /* the warp's ids [lo, hi) */
    float m, k, min_p;
};

/* A token's key: p's bits when kept (> 0), else 0. */
__device__ __forceinline__ uint32_t smp_key(const smp_row &r, int id, float &p) {
    p = id < r.hi ? dsmp_prob(__ldg(r.l + id), r.m, r.k) : 0.0f;
    return dsmp_kept(p, r.min_p) ? __float_as_uint(p) : 0u;
}

__device__ __forceinline__ bool smp_member(uint32_t key, int id, smp_sel s) {
    return key != 0u && (key > s.tau || (key == s.tau && id < s.cut));
}

/* Block sums of two u64 (every thread gets them). */
__device__ __forceinline__ void smp_block_sum2(unsigned long long &a, unsigned long long &b, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    __syncthreads();
    if (lane == 0) {
        sh.wa[w] = a;
        sh.wb[w] = b;
    }
    __syncthreads();
    a = b = 0;
    for (int i = 0; i < SMP_WARPS; i++) { /* fixed order (integers: any order is the same) */
        a += sh.wa[i];
        b += sh.wb[i];
    }
}

/* Exclusive scan in thread order of two u64 (ea, eb: the sums of lower threads). */
__device__ __forceinline__ void smp_block_excl2(unsigned long long a, unsigned long long b, unsigned long long &ea,
                                                unsigned long long &eb, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    unsigned long long ia = a, ib = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long ua = __shfl_up_sync(0xffffffffu, ia, o), ub = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) {
            ia += ua;
            ib += ub;
        }
    }
    __syncthreads();
    if (lane == 31) {
        sh.wa[w] = ia;
        sh.wb[w] = ib;
    }
    __syncthreads();
    unsigned long long pa = 0, pb = 0;
    for (int i = 0; i < w; i++) {
        pa += sh.wa[i];
        pb += sh.wb[i];
    }
    ea = pa + ia - a;
    eb = pb + ib - b;
}

/* One radix select over the members of `in`: the threshold whose prefix (in the order p
 * descending, id ascending) first reaches `target` by count (MASS false) or by mass.
 * Returns the new threshold; *cnt / *mass: the prefix's count and mass. */
template <bool MASS>
__device__ smp_sel smp_select(const smp_row &r, smp_sel in, unsigned long long target, unsigned long long *cnt,
                              unsigned long long *mass, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint32_t prefix = 0;
    unsigned long long above_c = 0, above_m = 0;
    unsigned int ties = 0;
    for (int pass = 0; pass < 3; pass++) {
        const int shift = pass == 0 ? 20 : pass == 1 ? 10 : 0, nbits = pass == 0 ? 11 : 10, top = shift + nbits;
        const int nb = 1 << nbits;
        for (int i = threadIdx.x; i < SMP_BINS; i += SMP_THREADS) {
            sh.hc[i] = 0;
            sh.hm[i] = 0;
        }
        __syncthreads();
        for (int base = r.lo; base < r.hi; base += 32) {
            const int id = base + lane;
            float p;
            const uint32_t key = smp_key(r, id, p);
            const bool in_bin = id < r.hi && smp_member(key, id, in) && (top >= 31 || (key >> top) == (prefix >> top));
            const unsigned act = __ballot_sync(0xffffffffu, in_bin);
            if (in_bin) {
                const unsigned bin = (key >> shift) & (unsigned)(nb - 1);
                const unsigned peers = __match_any_sync(act, bin);
                const unsigned long long wt = dsmp_weight(p);
                /* weights < 2^44 + 1: two 22-bit halves, each summed over ≤ 32 lanes in 32 bits */
                const unsigned lo22 = __reduce_add_sync(peers, (unsigned)(wt & 0x3FFFFFu));
                const unsigned hi22 = __reduce_add_sync(peers, (unsigned)(wt >> 22));
                if (lane == __ffs(peers) - 1) {
                    atomicAdd(&sh.hc[bin], (unsigned)__popc(peers));
                    atomicAdd(&sh.hm[bin], ((unsigned long long)hi22 << 22) + lo22);
                }
            }
        }
        __syncthreads();
        /* thread t: bins nb-1-2t and nb-2-2t (descending); scan counts and masses */
        const int b0 = nb - 1 - 2 * threadIdx.x, b1 = b0 - 1;
        const unsigned long long c0 = b0 >= 0 ? sh.hc[b0] : 0, c1 = b1 >= 0 ? sh.hc[b1] : 0;
        const unsigned long long m0 = b0 >= 0 ? sh.hm[b0] : 0, m1 = b1 >= 0 ? sh.hm[b1] : 0;
        unsigned long long ec, em;
        smp_block_excl2(c0 + c1, m0 + m1, ec, em, sh);
        const unsigned long long s_ex = MASS ? em : ec, s0 = MASS ? m0 : c0, s1 = MASS ? m1 : c1;
        const unsigned long long base_s = (MASS ? above_m : above_c) + s_ex;
        if (b0 >= 0 && base_s < target && target <= base_s + s0) {
            sh.bin = b0;
            sh.bin_count = (unsigned)c0;
            sh.bc_above = above_c + ec;
            sh.bm_above = above_m + em;
        } else if (b1 >= 0 && base_s + s0 < target && target <= base_s + s0 + s1) {
            sh.bin = b1;
            sh.bin_count = (unsigned)c1;
            sh.bc_above = above_c + ec + c0;
            sh.bm_above = above_m + em + m0;
        }
        __syncthreads();
        prefix |= sh.bin << shift;
        above_c = sh.bc_above;
        above_m = sh.bm_above;
        ties = sh.bin_count;
        __syncthreads();
    }
    const unsigned long long wtau = dsmp_weight(__uint_as_float(prefix));
    unsigned long long need = MASS ? (target - above_m + wtau - 1) / wtau : target - above_c;
    if (need < 1) need = 1;
    if (need > ties) need = ties;
    smp_sel out;
    out.tau = prefix;
    out.cut = prefix == in.tau ? in.cut : 0x7fffffff;
    if (need < ties) { /* the need-th member tie in id order ends the set */
        unsigned long long wt = 0;
        for (int base = r.lo; base < r.hi; base += 32) {
            const int id = base + lane;
            float p;
            const uint32_t key = smp_key(r, id, p);
            wt += __popc(__ballot_sync(0xffffffffu, id < r.hi && key == prefix && smp_member(key, id, in)));
        }
        if (lane == 0) sh.wa[w] = wt; /* every lane holds the warp's count */
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long before = 0;
            int wi = 0;
            while (before + sh.wa[wi] < need) before += sh.wa[wi++];
            sh.bin = (unsigned)wi;
            sh.bc_above = need - before; /* the rank inside warp wi's ties, from 1 */
        }
        __syncthreads();
        if (w == (int)sh.bin) {
            unsigned long long left = sh.bc_above;
            for (int base = r.lo; base < r.hi; base += 32) {
                const int id = base + lane;
                float p;
                const uint32_t key = smp_key(r, id, p);
                const unsigned tie = __ballot_sync(0xffffffffu, id < r.hi && key == prefix && smp_member(key, id, in));
                const unsigned n = __popc(tie);
                if (n >= left) {
                    unsigned t = tie;
                    for (unsigned long long k = 1; k < left; k++) t &= t - 1; /* drop the first left-1 */
                    if (lane == 0) sh.found = base + __ffs(t) - 1 + 1;
                    break;
                }
                left -= n;
            }
        }
        __syncthreads();
        out.cut = sh.found;
        __syncthreads();
    }
    *cnt = above_c + need;
    *mass = above_m + need * wtau;
    return out;
}

static __global__ void __launch_bounds__(SMP_THREADS) sample_kernel(const float *logits, int V, const row_sampling *rows,
                                                                    int32_t *ids) {
    TRACE_KERNEL();
    __shared__ smp_shared sh;
    pdl_trigger();
    pdl_wait();
    const row_sampling rs = rows[blockIdx.x];
    if (!(rs.temperature > 0.0f)) return; /* a greedy row: its argmax stays */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int span = ((V + SMP_WARPS - 1) / SMP_WARPS + 31) & ~31;
    smp_row r;
    r.l = logits + (size_t)blockIdx.x * V;
    r.V = V;
    r.lo = min(V, w * span);
    r.hi = min(V, r.lo + span);
    r.min_p = rs.min_p;
    r.k = dsmp_scale(rs.temperature);

    float mx = -INFINITY; /* fmaxf ignores NaN */
    for (int id = r.lo + lane; id < r.hi; id += 32) mx = fmaxf(mx, __ldg(r.l + id));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) sh.wf[w] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int i = 0; i < SMP_WARPS; i++) mx = fmaxf(mx, sh.wf[i]);
    if (!(mx > -INFINITY) || mx == INFINITY) return; /* all NaN / -inf, or an inf: the argmax */
    r.m = mx;

    /* kept tokens: count and mass */
    const smp_sel all = {0u, 0};
    unsigned long long cnt = 0, mass = 0;
    for (int base = r.lo; base < r.hi; base += 32) {
        float p;
        const uint32_t key = smp_key(r, base + lane, p);
        if (key) {
            cnt++;
            mass += dsmp_weight(p);
        }
    }
    smp_block_sum2(cnt, mass, sh);
    if (cnt == 0) return; /* nothing has p > 0 (1/T overflowed): the argmax */
    smp_sel sel = all;
    if (rs.top_k > 0 && cnt > (unsigned long long)rs.top_k)
        sel = smp_select<false>(r, sel, (unsigned long long)rs.top_k, &cnt, &mass, sh);
    if (rs.top_p < 1.0f && cnt > 1)
        sel = smp_select<true>(r, sel, dsmp_mass_target(rs.top_p, mass), &cnt, &mass, sh);

    /* the draw: finalists' mass a warp, then the warp holding r walks its chunk */
    const unsigned long long rr = dsmp_draw(rs.u, mass);
    unsigned long long wm = 0;
    for (int base = r.lo; base < r.hi; base += 32) {
        float p;
        const int id = base + lane;
        const uint32_t key = smp_key(r, id, p);
        if (id < r.hi && smp_member(key, id, sel)) wm += dsmp_weight(p);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) wm += __shfl_xor_sync(0xffffffffu, wm, o);
    __syncthreads();
    if (lane == 0) sh.wa[w] = wm;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long before = 0;
        int wi = 0;
        while (wi < SMP_WARPS - 1 && before + sh.wa[wi] <= rr) before += sh.wa[wi++];
        sh.bin = (unsigned)wi;
        sh.bc_above = rr - before; /* r inside warp wi's mass */
        sh.found = -1;
    }
    __syncthreads();
    if (w == (int)sh.bin) {
        const unsigned long long rl = sh.bc_above;
        unsigned long long run = 0;
        for (int base = r.lo; base < r.hi; base += 32) {
            const int id = base + lane;
            float p;
            const uint32_t key = smp_key(r, id, p);
            const unsigned long long wt = id < r.hi && smp_member(key, id, sel) ? dsmp_weight(p) : 0ull;
            unsigned long long inc = wt;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned long long u = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += u;
            }
            const unsigned hit = __ballot_sync(0xffffffffu, run + inc > rl);
            if (hit) {
                if (lane == 0) sh.found = base + __ffs(hit) - 1;
                break;
            }
            run += __shfl_sync(0xffffffffu, inc, 31);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0 && sh.found >= 0) ids[blockIdx.x] = sh.found;
}

/* rows: device [n_rows] sampling requests (temperature <= 0: leave ids[i], the argmax). */
extern "C" int cuda_sample(const struct cuda_ctx *c, const float *logits, int n_rows, int V, const struct row_sampling *rows,
                           int32_t *ids) {
    if (n_rows <= 0) return 0;
    LAUNCH_CHECK_RC(c, launch_k(sample_kernel, dim3(n_rows), dim3(SMP_THREADS), 0, cstream(c), logits, V, rows, ids),
                    "sample");
}

CUDA_TRACE_TU(sample)
