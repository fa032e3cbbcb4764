// cuda/cuda_topk.h — one token's top-k of the router logits by a whole block (device code
// only, included by the .cu files whose kernels take it): the router's tail
// (cuda_moe.cu) and the one-token expert pairs that take the top-k from the logits
// themselves (cuda_tcv.cu). One definition, so every form gives the same ids and weights,
// bit for bit: the order of experts (rt_key, lower expert on a tie) and the softmax
// statistics (topk_max_sum) are the warp form's (cuda_moe.cu topk_token_t).
#pragma once
#include <limits.h>
#include <math.h>

#include "cuda/cuda_internal.h"

/* (v, e) comes before (v2, e2): larger logit first, the lower expert on a tie. */
__device__ __forceinline__ bool rt_before(float v, int e, float v2, int e2) { return v > v2 || (v == v2 && e < e2); }

/* An unsigned key in the order of the floats (−0 taken as +0, so equal logits have equal
 * keys): larger logit, larger key. */
__device__ __forceinline__ unsigned rt_key(float v) {
    const unsigned b = __float_as_uint(v + 0.0f);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

/* The maximum and the sum of exponentials of one token's E ≤ 256 logits, lane l holding
 * v[i] = logit l + 32i (−inf past E): each lane's 8 in order, then the butterfly. Both top-k
 * forms take them from here, so their weights agree bit for bit. */
__device__ __forceinline__ void topk_max_sum(const float (&v)[8], int E, int lane, float &mx, float &sum) {
    mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; i++) mx = fmaxf(mx, v[i]);
    mx = warp_max(mx);
    sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (lane + 32 * i < E) sum += expf(v[i] - mx);
    sum = warp_sum(sum);
}

/* Lane s < K holds the s-th pick (expert id, logit v): ids[s] and its weight p = e^(v − mx) /
 * sum (renorm: divided by the K weights' sum in rank order), written by lanes < K. */
__device__ __forceinline__ void topk_write(int id, float v, float mx, float sum, int K, int renorm, int32_t *ids, float *w,
                                           int lane) {
    const float p = lane < K ? expf(v - mx) / sum : 0.0f;
    float tot = 0.0f;
    for (int q = 0; q < K; q++) tot += __shfl_sync(0xffffffffu, p, q);
    if (lane < K) {
        ids[lane] = id;
        w[lane] = renorm ? p / tot : p;
    }
}

/* A candidate's 64-bit sort word: the key above the complemented expert, so a larger word
 * comes first in the warp form's order (larger key; on a tie, the lower expert); 0 (no
 * candidate) is below every real word (a real key is never 0 with an expert < 2^32 - 1). */
__device__ __forceinline__ unsigned long long topk_word(unsigned key, int e) {
    return (unsigned long long)key << 32 | (0xFFFFFFFFu - (unsigned)e);
}

/* The same top-k (ids and weights, bit for bit) by a whole block of ≥ 256 threads, for one
 * token of E ≤ 256 logits: the one-warp form (cuda_moe.cu topk_token_t) is a serial chain (~3.2 µs of the
 * router's tail on the H200, session 13), this one ~4 short steps. (1) Warp w's lanes hold
 * experts 32w + lane; each lane counts the lanes of its warp that come before it (rt_key,
 * then the lower expert: the warp form's order) and the first K of each warp become the
 * candidates. Every expert of the global top K is among them (fewer than K experts come
 * before it at all), and its rank among the candidates is its global rank. (2) Each
 * candidate counts the candidates before it (topk_word: one 64-bit compare a candidate),
 * split over TP threads that each scan 1/TP of them, unrolled, and meet by shuffles (one
 * thread scanning all 64 of E = 256, K = 8 in a rolled loop of two dependent shared loads
 * a candidate sat on the gate/up launch's chain: docs/PERFORMANCE.md, session 24). Meanwhile one
 * warp takes the maximum and the sum of exponentials (topk_max_sum, as topk_token_t does).
 * (3) Warp 0 forms the weights (topk_write, as there). */
struct topk_scratch {
    float v[256];                /* the logits */
    unsigned long long c[256];   /* candidates [warp][K]: topk_word (0: none) */
    int sel[32];                 /* the picks in rank order */
    float mx, sum;
};
/* W = false: the picks only (s.sel[0..K), rank order, after the block's last barrier here);
 * no softmax statistics, no weights, ids and w untouched. CG: the logits were written by
 * other blocks of this launch (the router's tail: through L2); false: by an earlier launch,
 * read after pdl_wait (the gate/up pairs: a plain load). */
template <bool CG, bool W = true>
__device__ __forceinline__ void topk_block(const float *l, int E, int K, int renorm, int32_t *ids, float *w,
                                           topk_scratch &s) {
    const int t = threadIdx.x, lane = t & 31, wp = t >> 5, nw = (E + 31) / 32, nc = nw * K;
    if (wp < nw) {
        const bool ok = t < E;
        const float v = ok ? (CG ? __ldcg(l + t) : l[t]) : 0.0f;
        if (ok) s.v[t] = v;
        const unsigned k = ok ? rt_key(v) : 0u;
        int rank = 0;
#pragma unroll 8
        for (int m = 0; m < 32; m++) {
            const unsigned km = __shfl_sync(0xffffffffu, k, m);
            rank += (wp * 32 + m < E) & ((km > k) | ((km == k) & (m < lane)));
        }
        if (lane < K) s.c[wp * K + lane] = 0ull;
        __syncwarp();
        if (ok && rank < K) s.c[wp * K + rank] = topk_word(k, t);
    }
    __syncthreads();
    trace_mark(TRACE_MARK4); /* the candidates known */
    /* TP threads a candidate (adjacent lanes), a warp left over for the softmax statistics */
    const int TP = nc * 4 + 32 <= (int)blockDim.x ? 4 : nc * 2 + 32 <= (int)blockDim.x ? 2 : 1;
    const int rank_warps = (nc * TP + 31) / 32;
    if (wp < rank_warps) { /* whole warps: the shuffles below take every lane */
        const int i = t / TP, q = t % TP, per = (nc + TP - 1) / TP, j0 = q * per, j1 = min(nc, j0 + per);
        const unsigned long long ci = i < nc ? s.c[i] : 0ull;
        int rank = 0;
        if (ci) {
#pragma unroll 16
            for (int j = j0; j < j1; j++) rank += s.c[j] > ci;
        }
        for (int o = 1; o < TP; o <<= 1) rank += __shfl_xor_sync(0xffffffffu, rank, o);
        if (q == 0 && ci && rank < K) s.sel[rank] = (int)(0xFFFFFFFFu - (unsigned)(ci & 0xFFFFFFFFu));
    }
    const int sw = rank_warps < (int)(blockDim.x >> 5) ? rank_warps : 0; /* a warp free of the ranks */
    if (W && wp == sw) {
        float vv[8], mx, sum;
#pragma unroll
        for (int i = 0; i < 8; i++) vv[i] = lane + 32 * i < E ? s.v[lane + 32 * i] : -INFINITY;
        topk_max_sum(vv, E, lane, mx, sum);
        if (lane == 0) {
            s.mx = mx;
            s.sum = sum;
        }
    }
    __syncthreads();
    trace_mark(TRACE_MARK5); /* the picks and the softmax sum known */
    if (W && wp == 0) {
        const int id = lane < K ? s.sel[lane] : 0;
        topk_write(id, s.v[id], s.mx, s.sum, K, renorm, ids, w, lane);
    }
    trace_mark(TRACE_MARK7); /* weights written */
}
