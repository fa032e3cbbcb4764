// cuda/cuda_topk.h — the router's top-k of one token by one warp, shared by the router's
// tail (cuda_moe.cu) and the one-token MoE pair kernels that route themselves from the
// logits (cuda_tcv.cu): one function, so every launch that picks a token's experts picks
// the same ids and weights, bit for bit.
#ifndef ORCHID_CUDA_TOPK_H
#define ORCHID_CUDA_TOPK_H

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

__device__ __forceinline__ void rt_cas(float (&v)[8], int (&e)[8], int a, int b) {
    if (rt_before(v[b], e[b], v[a], e[a])) {
        const float tv = v[a];
        const int te = e[a];
        v[a] = v[b];
        e[a] = e[b];
        v[b] = tv;
        e[b] = te;
    }
}

/* Top-k of one token's E ≤ 256 logits by one warp (CG: read through L2, for data other
 * blocks wrote): ids in descending logit order (ties: lower expert), w = softmax over all
 * E (renorm: divided by the sum of the chosen K, summed in rank order). Lane l holds
 * experts l + 32i sorted once (19-comparator network), so each of the K rounds is one
 * warp arg-max of the lanes' heads (two redux instructions on order-preserving keys) and
 * a shift in the winning lane; the probabilities are computed after the rounds, one per
 * lane. (An earlier form rescanned all 8 values, ran a 5-step shuffle arg-max and divided
 * inside every round: one warp's serial chain, 4.9 µs of the router's tail on the H200 —
 * the same results, bit for bit.) Sum of exponentials: each lane's 8 in order, then the
 * butterfly. */
template <bool CG>
__device__ __forceinline__ void topk_token_t(const float *l, int E, int K, int renorm, int32_t *ids, float *w, int lane) {
    float v[8];
    int e[8];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int ex = lane + 32 * i;
        v[i] = ex < E ? (CG ? __ldcg(l + ex) : l[ex]) : -INFINITY;
        e[i] = ex < E ? ex : INT_MAX;
        mx = fmaxf(mx, v[i]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (lane + 32 * i < E) sum += expf(v[i] - mx);
    sum = warp_sum(sum);
    /* Batcher's odd-even merge sort of the lane's 8 (descending) */
    rt_cas(v, e, 0, 1); rt_cas(v, e, 2, 3); rt_cas(v, e, 4, 5); rt_cas(v, e, 6, 7);
    rt_cas(v, e, 0, 2); rt_cas(v, e, 1, 3); rt_cas(v, e, 4, 6); rt_cas(v, e, 5, 7);
    rt_cas(v, e, 1, 2); rt_cas(v, e, 5, 6);
    rt_cas(v, e, 0, 4); rt_cas(v, e, 1, 5); rt_cas(v, e, 2, 6); rt_cas(v, e, 3, 7);
    rt_cas(v, e, 2, 4); rt_cas(v, e, 3, 5);
    rt_cas(v, e, 1, 2); rt_cas(v, e, 3, 4); rt_cas(v, e, 5, 6);
    float mine = -INFINITY;
    int my_id = 0;
    for (int s = 0; s < K; s++) {
        /* arg-max of the heads in two warp reductions: the largest key, then the lowest
         * expert holding it — rt_before's order (for non-NaN logits) */
        const unsigned key = rt_key(v[0]), kmax = __reduce_max_sync(0xffffffffu, key);
        const int bi = (int)__reduce_min_sync(0xffffffffu, key == kmax ? (unsigned)e[0] : 0xffffffffu);
        const float bv = __shfl_sync(0xffffffffu, v[0], bi & 31);
        if ((bi & 31) == lane) { /* the winner is this lane's head: take it */
#pragma unroll
            for (int i = 0; i < 7; i++) {
                v[i] = v[i + 1];
                e[i] = e[i + 1];
            }
            v[7] = -INFINITY;
            e[7] = INT_MAX;
        }
        if (lane == s) {
            mine = bv;
            my_id = bi;
        }
    }
    const float p = expf(mine - mx) / sum;
    float tot = 0.0f;
    for (int s = 0; s < K; s++) tot += __shfl_sync(0xffffffffu, p, s);
    if (lane < K) {
        ids[lane] = my_id;
        w[lane] = renorm ? p / tot : p;
    }
}

__device__ __forceinline__ void topk_token(const float *l, int E, int K, int renorm, int32_t *ids, float *w, int lane) {
    topk_token_t<false>(l, E, K, renorm, ids, w, lane);
}
__device__ __forceinline__ void topk_token_cg(const float *l, int E, int K, int renorm, int32_t *ids, float *w, int lane) {
    topk_token_t<true>(l, E, K, renorm, ids, w, lane);
}

#endif
