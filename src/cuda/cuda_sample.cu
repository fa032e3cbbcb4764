// cuda/cuda_sample.cu — the device sampler: for each output row that asks for it
// (model/device_sampling.h, temperature > 0), one token drawn from the logits where they
// are, written over the row's argmax id, so a sampled request sends one id across PCIe a
// step instead of its 1 MB logits row and waits for no host sampler.
//
// A row is one cluster of C blocks of 1,024 threads (C = 8 for up to 16 rows on sm_90,
// fewer as rows fill the SMs; C = 1 before sm_90): the row's ids are cut into C·32
// contiguous warp ranges, warp gw = rank·32 + w owning [gw·span, (gw+1)·span), read 128
// ids a step, 4 a lane (float4, coalesced; two steps' loads in flight). "In id order" is
// therefore cluster rank, warp, step, lane, then the lane's 4: warp scans give ranks in id
// order without sorting. Block results meet through distributed shared memory after a
// cluster barrier. The kept-mass pass computes each token's p by the shared header's
// functions — the same fp32 operations as the host reference (device_sampling.c), hence
// the same bits — and stores its key (p's bits, 0 when not kept) over the logit; every
// later pass re-reads those keys (1 MB a row, L2-resident; each warp only its own range,
// which it wrote itself, so plain loads need no fence). All sums are of integer
// weights (p · 2^44), so atomics and reductions give the same result in any order and
// for any C: a row draws the same token alone or in a batch.
//
// Passes: the maximum; count and mass of the kept tokens (min_p); top_k and top_p each a
// radix select over the 31 bits of p (11 + 10 + 10-bit digits; each block a histogram of
// count and mass in shared memory by one atomic a token, summed over the cluster a bin a
// thread) finding the threshold (tau, cut): members are p > tau, or p == tau with id < cut
// (ties by id: one more pass only when a threshold splits its ties); the draw r =
// floor(u·M); the per-warp masses of the finalists, then the one warp holding r walks its
// range with an inclusive scan until the running mass exceeds r.
//
// The fast paths (top_k <= SMP_FAST_K, the common chat setting: Qwen's recommended 20; or
// top_p alone, as OpenAI clients send it): the kept-mass pass also builds the first radix
// histogram (p's top 11 bits: counts, and masses for top_p); the bin where the count from the
// top reaches min(top_k, kept) — or the mass reaches top_p's target — bounds every token the
// prefix can hold, and when at most SMP_CAND_MAX tokens lie at or above it, they are appended
// to rank 0's shared list, sorted there, and top_k, top_p and the walk run in shared memory
// (smp_fast_draw) — three passes over the row instead of six to nine. Measured on the H100
// (session 28, top_k 20 / top_p 0.8 / T 0.7): one row 166 -> 44 µs, 64 rows 402 -> 145 µs;
// the same tokens (test_cuda_sample against the reference, both paths taken).
#include <cooperative_groups.h>
#include <math.h>

#include "cuda/cuda_internal.h"
#include "model/device_sampling.h"

namespace cg = cooperative_groups;

#define SMP_THREADS 1024
#define SMP_WARPS (SMP_THREADS / 32)
#define SMP_BINS 2048
#define SMP_MAX_CLUSTER 8
#define SMP_CAND_MAX SMP_BINS /* the fast paths' candidates (rank 0's hm as the list) */
#define SMP_FAST_K 1024       /* the largest top_k, and top_p's most candidates (the finalists in id order: rank 0's hc as u64) */

/* Rows that took a fast path, and rows they handed to the radix passes (too many
 * candidates); read by the tests (cuda_sample_fast_counts). */
__device__ unsigned long long smp_fast_rows, smp_fast_fallbacks;

struct smp_sel { /* members: key > tau, or key == tau and id < cut (tau 0: every kept token) */
    uint32_t tau;
    int32_t cut;
};

struct smp_shared {
    unsigned int hc[SMP_BINS];       /* radix pass: this block's count a bin */
    unsigned long long hm[SMP_BINS]; /* radix pass: this block's mass a bin */
    unsigned long long wa[SMP_WARPS], wb[SMP_WARPS]; /* per-warp values (read by the cluster) */
    float wf[SMP_WARPS];
    unsigned long long ca, cb; /* this block's totals, read by the cluster */
    float cf;
    unsigned long long bc_above, bm_above; /* decisions every block reaches alike */
    unsigned int bin, bin_count;
    int pick_rank, pick_warp;
    int found; /* the picking block's answer, read by the cluster */
    unsigned int ncand; /* the fast paths: candidates in rank 0's list (smp_fast_draw) */
    int nfin;           /* its finalists */
};

/* ---- cluster helpers: C = 1 is a lone block (any arch); C > 1 needs sm_90 ---- */
template <int C>
__device__ __forceinline__ int smp_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (C > 1) return (int)cg::this_cluster().block_rank();
#else
    if (C > 1) __trap(); /* never launched: cluster_for gives 1 before sm_90 */
#endif
    return 0;
}

/* A barrier of every thread of the cluster (shared-memory writes before it are visible to
 * every block after it). */
template <int C>
__device__ __forceinline__ void smp_csync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (C > 1) {
        cg::this_cluster().sync();
        return;
    }
#endif
    __syncthreads();
}

/* p in block `rank`'s shared memory. */
template <int C, class T>
__device__ __forceinline__ T *smp_at(T *p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (C > 1) return cg::this_cluster().map_shared_rank(p, rank);
#endif
    return p;
}

struct smp_row {
    float *l; /* the logits, overwritten with the keys by the kept-mass pass */
    int lo, hi; /* the warp's ids [lo, hi) */
    float m, k, min_p;
    bool vec; /* rows are 16-byte aligned (V % 4 == 0): float4 loads */
};

/* Logits of ids id0 .. id0 + 3 (NaN past hi: p 0, never kept). */
__device__ __forceinline__ float4 smp_ld4(const smp_row &r, int id0) {
    if (r.vec && id0 + 3 < r.hi) return __ldg(reinterpret_cast<const float4 *>(r.l + id0));
    float4 v;
    v.x = id0 < r.hi ? __ldg(r.l + id0) : NAN;
    v.y = id0 + 1 < r.hi ? __ldg(r.l + id0 + 1) : NAN;
    v.z = id0 + 2 < r.hi ? __ldg(r.l + id0 + 2) : NAN;
    v.w = id0 + 3 < r.hi ? __ldg(r.l + id0 + 3) : NAN;
    return v;
}

/* Every id of the warp's range in order: f(id0, v) with this lane's 4 logits of ids
 * id0 .. id0 + 3, id0 = base + 4·lane, for base in steps of 128 ids (two steps' loads
 * issued together). Warp-uniform: every lane calls f the same number of times. */
template <class F>
__device__ __forceinline__ void smp_each(const smp_row &r, F &&f) {
    const int lane = threadIdx.x & 31;
    for (int base = r.lo; base < r.hi; base += 256) {
        const float4 a = smp_ld4(r, base + 4 * lane), b = smp_ld4(r, base + 128 + 4 * lane);
        f(base + 4 * lane, a);
        f(base + 128 + 4 * lane, b);
    }
}

/* The keys of ids id0 .. id0 + 3, as the kept-mass pass stored them over the logits (0 past
 * hi). Plain loads: written earlier in this kernel by this same thread. */
__device__ __forceinline__ uint4 smp_ldk4(const smp_row &r, int id0) {
    const uint32_t *k = reinterpret_cast<const uint32_t *>(r.l);
    if (r.vec && id0 + 3 < r.hi) return *reinterpret_cast<const uint4 *>(k + id0);
    uint4 v;
    v.x = id0 < r.hi ? k[id0] : 0u;
    v.y = id0 + 1 < r.hi ? k[id0 + 1] : 0u;
    v.z = id0 + 2 < r.hi ? k[id0 + 2] : 0u;
    v.w = id0 + 3 < r.hi ? k[id0 + 3] : 0u;
    return v;
}

__device__ __forceinline__ void smp_stk4(const smp_row &r, int id0, const uint32_t (&key)[4]) {
    uint32_t *k = reinterpret_cast<uint32_t *>(r.l);
    if (r.vec && id0 + 3 < r.hi) {
        *reinterpret_cast<uint4 *>(k + id0) = make_uint4(key[0], key[1], key[2], key[3]);
        return;
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (id0 + j < r.hi) k[id0 + j] = key[j];
}

/* Every id of the warp's range in order after the kept-mass pass: f(id0, key, p) with the
 * lane's 4 keys and their p (the same ids and order as smp_each). */
template <class F>
__device__ __forceinline__ void smp_each_key(const smp_row &r, F &&f) {
    const int lane = threadIdx.x & 31;
    for (int base = r.lo; base < r.hi; base += 256) {
        const uint4 a = smp_ldk4(r, base + 4 * lane), b = smp_ldk4(r, base + 128 + 4 * lane);
        const uint32_t ka[4] = {a.x, a.y, a.z, a.w}, kb[4] = {b.x, b.y, b.z, b.w};
        const float pa[4] = {__uint_as_float(a.x), __uint_as_float(a.y), __uint_as_float(a.z), __uint_as_float(a.w)};
        const float pb[4] = {__uint_as_float(b.x), __uint_as_float(b.y), __uint_as_float(b.z), __uint_as_float(b.w)};
        f(base + 4 * lane, ka, pa);
        f(base + 128 + 4 * lane, kb, pb);
    }
}

/* Keys (p's bits when kept, else 0) and p of 4 logits. */
__device__ __forceinline__ void smp_keys(const smp_row &r, float4 v, uint32_t (&key)[4], float (&p)[4]) {
    const float x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        p[j] = dsmp_prob(x[j], r.m, r.k);
        key[j] = dsmp_kept(p[j], r.min_p) ? __float_as_uint(p[j]) : 0u;
    }
}

__device__ __forceinline__ bool smp_member(uint32_t key, int id, smp_sel s) {
    return key != 0u && (key > s.tau || (key == s.tau && id < s.cut));
}

/* Inclusive warp scan of a u64 in lane order. */
__device__ __forceinline__ unsigned long long smp_warp_incl(unsigned long long v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

__device__ __forceinline__ unsigned long long smp_warp_sum(unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Cluster sums of two u64 (every thread of every block gets them). Integers: the same in
 * any order. Ends with a cluster barrier, so the slots may be written again. */
template <int C>
__device__ void smp_cluster_sum2(unsigned long long &a, unsigned long long &b, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    a = smp_warp_sum(a);
    b = smp_warp_sum(b);
    if (lane == 0) {
        sh.wa[w] = a;
        sh.wb[w] = b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long x = 0, y = 0;
        for (int i = 0; i < SMP_WARPS; i++) {
            x += sh.wa[i];
            y += sh.wb[i];
        }
        sh.ca = x;
        sh.cb = y;
    }
    smp_csync<C>();
    a = b = 0;
    for (int q = 0; q < C; q++) {
        a += *smp_at<C>(&sh.ca, q);
        b += *smp_at<C>(&sh.cb, q);
    }
    smp_csync<C>();
}

/* Exclusive scan in thread order of two u64 within the block (ea, eb: lower threads' sums). */
__device__ __forceinline__ void smp_block_excl2(unsigned long long a, unsigned long long b, unsigned long long &ea,
                                                unsigned long long &eb, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const unsigned long long ia = smp_warp_incl(a), ib = smp_warp_incl(b);
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

/* Each warp's amount v (lane 0's counts) in cluster id order; every block's thread 0 finds
 * the warp holding unit x (from 0; the last warp if none): sh.pick_rank / pick_warp, and
 * sh.bc_above = x minus the amounts before it. Ends with the block barrier. */
template <int C>
__device__ void smp_pick(unsigned long long v, unsigned long long x, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sh.wa[w] = v;
    smp_csync<C>();
    if (threadIdx.x == 0) {
        unsigned long long before = 0;
        int q = 0, wi = 0;
        for (;;) {
            const unsigned long long a = *smp_at<C>(&sh.wa[wi], q);
            const bool last = q == C - 1 && wi == SMP_WARPS - 1;
            if (last || before + a > x) break;
            before += a;
            if (++wi == SMP_WARPS) {
                wi = 0;
                q++;
            }
        }
        sh.pick_rank = q;
        sh.pick_warp = wi;
        sh.bc_above = x - before;
        sh.found = -1;
    }
    smp_csync<C>(); /* wa is read; the decision is in every block */
}

/* The picking block's `found`, in every block. Ends with a cluster barrier. */
template <int C>
__device__ int smp_found(smp_shared &sh) {
    smp_csync<C>();
    const int f = *smp_at<C>(&sh.found, sh.pick_rank);
    smp_csync<C>();
    return f;
}

/* The bin of a cluster's histogram (hc counts, with WM hm masses; nb bins, key order
 * descending) where the running sum from the top, after above_c / above_m of earlier
 * passes, first reaches `target` — by mass (MASS) or by count: sh.bin, its count
 * sh.bin_count, and the count and mass above it (sh.bc_above / bm_above, earlier passes'
 * included). Thread t sums bins nb - 1 - 2t and nb - 2 - 2t over the cluster. Every block's
 * histogram must be complete (a cluster barrier before); ends with the block barrier. */
template <int C, bool MASS, bool WM>
__device__ void smp_find_bin(int nb, unsigned long long target, unsigned long long above_c, unsigned long long above_m,
                             smp_shared &sh) {
    const int b0 = nb - 1 - 2 * threadIdx.x, b1 = b0 - 1;
    unsigned long long c0 = 0, c1 = 0, m0 = 0, m1 = 0;
    for (int q = 0; q < C; q++) {
        if (b0 >= 0) {
            c0 += *smp_at<C>(&sh.hc[b0], q);
            if (WM) m0 += *smp_at<C>(&sh.hm[b0], q);
        }
        if (b1 >= 0) {
            c1 += *smp_at<C>(&sh.hc[b1], q);
            if (WM) m1 += *smp_at<C>(&sh.hm[b1], q);
        }
    }
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
}

/* One radix select over the members of `in`: the threshold whose prefix (in the order p
 * descending, id ascending) first reaches `target` by count (MASS false) or by mass.
 * Returns the new threshold; *cnt / *mass: the prefix's count and mass. */
template <int C, bool MASS>
__device__ smp_sel smp_select(const smp_row &r, smp_sel in, unsigned long long target, unsigned long long *cnt,
                              unsigned long long *mass, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, rank = smp_rank<C>();
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
        /* one shared atomic a token: a warp's step hits ~128 of the ~200 bins a row's keys
         * spread over, so conflicts are few. (The first form aggregated a warp's tokens of
         * one bin with match.any + redux and read 4 bytes a lane: 1,877 µs a row at top_k
         * 20 / top_p 0.8 on the H200, against 622 µs for this one with float4 reads — the two
         * changes were measured together.) */
        smp_each_key(r, [&](int id0, const uint32_t(&key)[4], const float(&p)[4]) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if (smp_member(key[j], id0 + j, in) && (top >= 31 || (key[j] >> top) == (prefix >> top))) {
                    const unsigned bin = (key[j] >> shift) & (unsigned)(nb - 1);
                    atomicAdd(&sh.hc[bin], 1u);
                    atomicAdd(&sh.hm[bin], (unsigned long long)dsmp_weight(p[j]));
                }
            }
        });
        smp_csync<C>(); /* every block's histogram is complete */
        smp_find_bin<C, MASS, true>(nb, target, above_c, above_m, sh);
        prefix |= sh.bin << shift;
        above_c = sh.bc_above;
        above_m = sh.bm_above;
        ties = sh.bin_count;
        smp_csync<C>(); /* no block clears its histogram while another still reads it */
    }
    const unsigned long long wtau = dsmp_weight(__uint_as_float(prefix));
    unsigned long long need = MASS ? (target - above_m + wtau - 1) / wtau : target - above_c;
    if (need < 1) need = 1;
    if (need > ties) need = ties;
    smp_sel out;
    out.tau = prefix;
    out.cut = prefix == in.tau ? in.cut : 0x7fffffff;
    if (need < ties) { /* the need-th member tie in id order ends the set */
        unsigned n_ties = 0;
        smp_each_key(r, [&](int id0, const uint32_t(&key)[4], const float(&p)[4]) {
#pragma unroll
            for (int j = 0; j < 4; j++) n_ties += key[j] == prefix && smp_member(key[j], id0 + j, in);
        });
        smp_pick<C>(__reduce_add_sync(0xffffffffu, n_ties), need - 1, sh); /* the tie of rank need - 1 from 0 */
        if (rank == sh.pick_rank && w == sh.pick_warp) {
            unsigned long long left = sh.bc_above + 1; /* its rank in the warp's ties, from 1 */
            bool done = false;
            smp_each_key(r, [&](int id0, const uint32_t(&key)[4], const float(&p)[4]) {
                if (done) return;
                bool t[4];
                unsigned c = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) c += t[j] = key[j] == prefix && smp_member(key[j], id0 + j, in);
                const unsigned long long incl = smp_warp_incl(c), total = __shfl_sync(0xffffffffu, incl, 31);
                if (left <= total) {
                    const unsigned hit = __ballot_sync(0xffffffffu, incl >= left);
                    if (lane == __ffs(hit) - 1) {
                        unsigned long long rank_in = left - (incl - c);
#pragma unroll
                        for (int j = 0; j < 4; j++)
                            if (t[j] && --rank_in == 0) sh.found = id0 + j + 1;
                    }
                    done = true;
                } else {
                    left -= total;
                }
            });
        }
        out.cut = smp_found<C>(sh);
    }
    *cnt = above_c + need;
    *mass = above_m + need * wtau;
    return out;
}

/* a[0 .. P) (P a power of two, at most 2 · SMP_THREADS) sorted by the block, descending
 * (DESC) or ascending: a bitonic network, a block barrier a stage. */
template <bool DESC>
__device__ void smp_bitonic(unsigned long long *a, int P) {
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += SMP_THREADS) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const unsigned long long x = a[i], y = a[ixj];
                    const bool asc = ((i & k) == 0) != DESC;
                    if (asc ? x > y : x < y) {
                        a[i] = y;
                        a[ixj] = x;
                    }
                }
            }
            __syncthreads();
        }
}

/* Items 2t, 2t + 1 of a block-wide list of n weights (wt(i)): this thread's two, the
 * exclusive prefix before them (*ex) and the list's total (every thread). */
template <class W>
__device__ void smp_pair_scan(int n, W &&wt, unsigned long long &w0, unsigned long long &w1, unsigned long long &ex,
                              unsigned long long &total, smp_shared &sh) {
    const int i0 = 2 * (int)threadIdx.x;
    w0 = i0 < n ? wt(i0) : 0ull;
    w1 = i0 + 1 < n ? wt(i0 + 1) : 0ull;
    unsigned long long ex2;
    smp_block_excl2(w0 + w1, 0ull, ex, ex2, sh);
    if (threadIdx.x == SMP_THREADS - 1) sh.ca = ex + w0 + w1;
    __syncthreads();
    total = sh.ca;
    __syncthreads(); /* sh.ca and sh.wa may be written again */
}

/* The fast paths. top_k <= SMP_FAST_K: the kept tokens whose key is in the histogram bin
 * `bin` (the bin where the count from the top reaches min(top_k, kept)) or above — at least
 * that many, at most SMP_CAND_MAX (the caller checked) — are every token the top_k prefix
 * can hold. top_p alone (no top_k cut; p_mass: all the kept mass, which top_p's target is
 * taken of): `bin` is the one where the mass from the top reaches that target, and the
 * candidates hold the whole top_p prefix. Every block appends its candidates, (key, ~id) as one u64 (descending
 * order = p descending, id ascending: the contract's ranking), to rank 0's list (a warp's
 * one shared atomic a step); rank 0 then sorts them, takes the top_k prefix, the top_p
 * prefix of that by the same integer masses, draws r and walks the finalists in id order —
 * dsmp_reference's steps on the same weights, so the same token, in one pass over the keys
 * instead of the radix selects' six or more. Rank 0 writes *out unless the draw has no
 * finalist (top_p's target 0: the argmax stays, as the reference returns it). */
template <int C>
__device__ void smp_fast_draw(const smp_row &r, const row_sampling &rs, unsigned bin, unsigned long long p_mass, smp_shared &sh,
                              int32_t *out) {
    const int lane = threadIdx.x & 31;
    unsigned *ctr = smp_at<C>(&sh.ncand, 0);
    unsigned long long *list = smp_at<C>(sh.hm, 0);
    const uint32_t lo_key = bin << 20;
    smp_each_key(r, [&](int id0, const uint32_t(&key)[4], const float(&)[4]) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const bool in = key[j] != 0u && key[j] >= lo_key;
            const unsigned mask = __ballot_sync(0xffffffffu, in);
            if (!mask) continue;
            const int leader = __ffs(mask) - 1;
            unsigned base = 0;
            if (lane == leader) base = atomicAdd(ctr, (unsigned)__popc(mask));
            base = __shfl_sync(0xffffffffu, base, leader);
            if (in)
                list[base + __popc(mask & ((1u << lane) - 1u))] =
                    (unsigned long long)key[j] << 32 | (0xffffffffu - (uint32_t)(id0 + j));
        }
    });
    smp_csync<C>(); /* every candidate is in rank 0's list */
    if (smp_rank<C>() != 0) return;
    const int tid = threadIdx.x, n = (int)sh.ncand;
    unsigned long long *a = sh.hm;
    int P = 1;
    while (P < n) P <<= 1;
    for (int i = n + tid; i < P; i += SMP_THREADS) a[i] = 0ull; /* below every candidate */
    __syncthreads();
    smp_bitonic<true>(a, P);
    const int kk = rs.top_k > 0 && rs.top_k < n ? rs.top_k : n; /* top_p alone (p_mass): every candidate */
    auto wrank = [&](int i) { return dsmp_weight(__uint_as_float((uint32_t)(a[i] >> 32))); };
    unsigned long long w0, w1, ex, mass;
    smp_pair_scan(kk, wrank, w0, w1, ex, mass, sh);
    int nf = kk;
    if (rs.top_p < 1.0f && (p_mass || kk > 1)) { /* the shortest prefix whose mass reaches the target */
        const unsigned long long target = dsmp_mass_target(rs.top_p, p_mass ? p_mass : mass);
        if (tid == 0) {
            sh.nfin = 0;
            sh.cb = 0;
        }
        __syncthreads();
        const int i0 = 2 * tid;
        if (i0 < kk && ex < target && ex + w0 >= target) {
            sh.nfin = i0 + 1;
            sh.cb = ex + w0;
        } else if (i0 + 1 < kk && ex + w0 < target && ex + w0 + w1 >= target) {
            sh.nfin = i0 + 2;
            sh.cb = ex + w0 + w1;
        }
        __syncthreads();
        nf = sh.nfin;
        mass = sh.cb;
    }
    if (nf == 0) return;
    /* the finalists in id order: (id, key) ascending in hc's room (nf <= SMP_FAST_K) */
    unsigned long long *b = reinterpret_cast<unsigned long long *>(sh.hc);
    int P2 = 1;
    while (P2 < nf) P2 <<= 1;
    for (int i = tid; i < P2; i += SMP_THREADS)
        b[i] = i < nf ? (unsigned long long)(0xffffffffu - (uint32_t)a[i]) << 32 | (a[i] >> 32) : ~0ull;
    __syncthreads();
    smp_bitonic<false>(b, P2);
    const unsigned long long rr = dsmp_draw(rs.u, mass);
    auto wid = [&](int i) { return dsmp_weight(__uint_as_float((uint32_t)b[i])); };
    unsigned long long total;
    smp_pair_scan(nf, wid, w0, w1, ex, total, sh);
    const int i0 = 2 * tid;
    int tok = -1;
    if (i0 < nf && ex <= rr && ex + w0 > rr) tok = (int)(b[i0] >> 32);
    else if (i0 + 1 < nf && ex + w0 <= rr && ex + w0 + w1 > rr) tok = (int)(b[i0 + 1] >> 32);
    if (tok >= 0) {
        *out = tok;
        atomicAdd(&smp_fast_rows, 1ull);
    }
}

template <int C>
static __global__ void __launch_bounds__(SMP_THREADS) sample_kernel(float *logits, int V, const row_sampling *rows,
                                                                    int32_t *ids, int fast_ok) {
    TRACE_KERNEL();
    __shared__ smp_shared sh;
    pdl_trigger();
    pdl_wait();
    const int row = blockIdx.y;
    const row_sampling rs = rows[row];
    if (!(rs.temperature > 0.0f)) return; /* a greedy row: its argmax stays (the whole cluster returns) */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, rank = smp_rank<C>();
    /* the fast paths: the kept-mass pass also builds the radix select's first histogram —
     * counts for top_k (fast_k), counts and masses for top_p alone (fast_p: top_k 0 or
     * beyond SMP_FAST_K, which the path takes only when it cuts nothing) */
    const bool fast_k = fast_ok && rs.top_k > 0 && rs.top_k <= SMP_FAST_K;
    const bool fast_p = fast_ok && !fast_k && rs.top_p < 1.0f;
    if (threadIdx.x == 0) sh.ncand = 0; /* before the cluster barriers below, so before any append */
    if (fast_k || fast_p)
        for (int i = threadIdx.x; i < SMP_BINS; i += SMP_THREADS) {
            sh.hc[i] = 0;
            sh.hm[i] = 0;
        }
    const int span = ((V + C * SMP_WARPS - 1) / (C * SMP_WARPS) + 127) & ~127;
    smp_row r;
    r.l = logits + (size_t)row * V;
    r.lo = min(V, (rank * SMP_WARPS + w) * span);
    r.hi = min(V, r.lo + span);
    r.min_p = rs.min_p;
    r.k = dsmp_scale(rs.temperature);
    r.vec = (V & 3) == 0;

    float mx = -INFINITY; /* fmaxf ignores NaN */
    smp_each(r, [&](int, float4 v) { mx = fmaxf(mx, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w))); });
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) sh.wf[w] = mx;
    __syncthreads();
    if (threadIdx.x == 0) {
        float b = -INFINITY;
        for (int i = 0; i < SMP_WARPS; i++) b = fmaxf(b, sh.wf[i]);
        sh.cf = b;
    }
    smp_csync<C>();
    mx = -INFINITY;
    for (int q = 0; q < C; q++) mx = fmaxf(mx, *smp_at<C>(&sh.cf, q));
    smp_csync<C>();
    if (!(mx > -INFINITY) || mx == INFINITY) return; /* all NaN / -inf, or an inf: the argmax */
    r.m = mx;

    /* kept tokens: count and mass; each token's key stored over its logit for the passes
     * after (each warp reads back only its own range) */
    unsigned long long cnt = 0, mass = 0;
    smp_each(r, [&](int id0, float4 v) {
        uint32_t key[4];
        float p[4];
        smp_keys(r, v, key, p);
        smp_stk4(r, id0, key);
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (key[j]) {
                cnt++;
                mass += dsmp_weight(p[j]);
                if (fast_k || fast_p) atomicAdd(&sh.hc[key[j] >> 20], 1u);
                if (fast_p) atomicAdd(&sh.hm[key[j] >> 20], (unsigned long long)dsmp_weight(p[j]));
            }
    });
    smp_cluster_sum2<C>(cnt, mass, sh);
    if (cnt == 0) return; /* nothing has p > 0 (1/T overflowed): the argmax */
    bool tried = false; /* a fast path's bin search ran (and found too many candidates) */
    if (fast_k) { /* the bin where the count reaches min(top_k, kept) */
        const unsigned long long target = cnt < (unsigned long long)rs.top_k ? cnt : (unsigned long long)rs.top_k;
        smp_find_bin<C, false, false>(SMP_BINS, target, 0, 0, sh);
        if (sh.bc_above + sh.bin_count <= SMP_CAND_MAX) { /* the same decision in every block */
            smp_fast_draw<C>(r, rs, sh.bin, 0ull, sh, ids + row);
            return;
        }
        tried = true;
    } else if (fast_p && (rs.top_k == 0 || (unsigned long long)rs.top_k >= cnt) && cnt > 1) {
        /* the bin where the mass reaches top_p's target of all the kept mass */
        smp_find_bin<C, true, true>(SMP_BINS, dsmp_mass_target(rs.top_p, mass), 0, 0, sh);
        if (sh.bc_above + sh.bin_count <= SMP_FAST_K) { /* every candidate may be a finalist: hc's room */
            smp_csync<C>(); /* every block has read rank 0's masses: its hm becomes the list */
            smp_fast_draw<C>(r, rs, sh.bin, mass, sh, ids + row);
            return;
        }
        tried = true;
    }
    if (tried && rank == 0 && threadIdx.x == 0) atomicAdd(&smp_fast_fallbacks, 1ull);
    if (fast_k || fast_p) smp_csync<C>(); /* no block clears its histogram while another still reads it */
    smp_sel sel = {0u, 0};
    if (rs.top_k > 0 && cnt > (unsigned long long)rs.top_k)
        sel = smp_select<C, false>(r, sel, (unsigned long long)rs.top_k, &cnt, &mass, sh);
    if (rs.top_p < 1.0f && cnt > 1)
        sel = smp_select<C, true>(r, sel, dsmp_mass_target(rs.top_p, mass), &cnt, &mass, sh);

    /* the draw: finalists' mass a warp, then the warp holding r walks its ids */
    const unsigned long long rr = dsmp_draw(rs.u, mass);
    unsigned long long wm = 0;
    smp_each_key(r, [&](int id0, const uint32_t(&key)[4], const float(&p)[4]) {
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (smp_member(key[j], id0 + j, sel)) wm += dsmp_weight(p[j]);
    });
    smp_pick<C>(smp_warp_sum(wm), rr, sh);
    if (rank == sh.pick_rank && w == sh.pick_warp) {
        const unsigned long long rl = sh.bc_above;
        unsigned long long run = 0;
        bool done = false;
        smp_each_key(r, [&](int id0, const uint32_t(&key)[4], const float(&p)[4]) {
            if (done) return;
            unsigned long long wt[4], s = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) s += wt[j] = smp_member(key[j], id0 + j, sel) ? dsmp_weight(p[j]) : 0ull;
            const unsigned long long incl = smp_warp_incl(s);
            const unsigned hit = __ballot_sync(0xffffffffu, run + incl > rl);
            if (hit) {
                if (lane == __ffs(hit) - 1) {
                    unsigned long long acc = run + incl - s;
                    int id = -1;
                    for (int j = 0; j < 4 && id < 0; j++) { /* the first whose running sum passes r */
                        acc += wt[j];
                        if (acc > rl) id = id0 + j;
                    }
                    sh.found = id;
                }
                done = true;
            } else {
                run += __shfl_sync(0xffffffffu, incl, 31);
            }
        });
    }
    const int tok = smp_found<C>(sh);
    if (rank == 0 && threadIdx.x == 0 && tok >= 0) ids[row] = tok;
}

/* Blocks a row: ORCHID_SAMPLE_CLUSTER (1, 2, 4, 8) or cuda_sample_force_cluster (tests), else
 * on sm_90 the most (up to 8) that keep all rows in one wave of the SMs; 1 before sm_90. */
static int g_force_cluster;
extern "C" void cuda_sample_force_cluster(int c) { g_force_cluster = c; }

static int cluster_for(int n_rows) {
    static int env = -1, sms = 0, sm90 = 0;
    if (env < 0) {
        const char *e = getenv("ORCHID_SAMPLE_CLUSTER");
        env = e && *e ? atoi(e) : 0;
        cuda_caps caps;
        if (device_caps(&caps) == cudaSuccess) {
            sms = caps.sms;
            sm90 = caps.major >= 9;
        }
    }
    if (!sm90) return 1;
    const int want = g_force_cluster ? g_force_cluster : env;
    if (want == 1 || want == 2 || want == 4 || want == 8) return want;
    int c = SMP_MAX_CLUSTER;
    while (c > 1 && (long)c * n_rows > sms) c >>= 1;
    return c;
}

/* The fast paths: on unless ORCHID_SAMPLE_NOFAST=1 or cuda_sample_force_slow (A/B, tests). */
static int g_force_slow;
extern "C" void cuda_sample_force_slow(int on) { g_force_slow = on; }
static int sample_fast_ok(void) {
    static const bool off = env_flag("ORCHID_SAMPLE_NOFAST");
    return !off && !g_force_slow;
}

extern "C" int cuda_sample_fast_counts(unsigned long long *fast, unsigned long long *fallbacks) {
    cudaError_t e = cudaMemcpyFromSymbol(fast, smp_fast_rows, sizeof *fast);
    if (e == cudaSuccess) e = cudaMemcpyFromSymbol(fallbacks, smp_fast_fallbacks, sizeof *fallbacks);
    return e == cudaSuccess ? 0 : -1;
}

template <int C>
static cudaError_t launch_sample(const struct cuda_ctx *c, float *logits, int n_rows, int V, const row_sampling *rows,
                                 int32_t *ids) {
    launch_cfg lc(dim3(C, n_rows), dim3(SMP_THREADS), 0, cstream(c), true, C > 1 ? C : 0);
    return lc.launch(sample_kernel<C>, logits, V, rows, ids, sample_fast_ok());
}

/* rows: device [n_rows] sampling requests (temperature <= 0: leave ids[i], the argmax). A
 * sampled row's logits are overwritten (with its tokens' keys). */
extern "C" int cuda_sample(const struct cuda_ctx *c, float *logits, int n_rows, int V, const struct row_sampling *rows,
                           int32_t *ids) {
    if (n_rows <= 0) return 0;
    const int cl = cluster_for(n_rows);
    LAUNCH_CHECK_RC(c,
                    cl == 8   ? launch_sample<8>(c, logits, n_rows, V, rows, ids)
                    : cl == 4 ? launch_sample<4>(c, logits, n_rows, V, rows, ids)
                    : cl == 2 ? launch_sample<2>(c, logits, n_rows, V, rows, ids)
                              : launch_sample<1>(c, logits, n_rows, V, rows, ids),
                    "sample");
}

CUDA_TRACE_TU(sample)
