// cuda/cuda_route.h — the MoE router's device pieces shared by cuda_moe.cu (router launch
// and its top-k tail, any batch) and cuda_moe_fused.cu (one token's whole MoE block in one
// launch): one router row against fp32 inputs, and one token's top-k by one warp. Both
// files call these same functions, so a token is routed with the same bits either way.
#ifndef ORCHID_CUDA_ROUTE_H
#define ORCHID_CUDA_ROUTE_H

#include <limits.h>
#include <math.h>

#include "cuda/cuda_internal.h"

#define RT_TOK 8 /* tokens a router warp carries */

/* acc[t] += W_row · x[t0 + t] (t < nt) over the lane's chunks, weights dequantized exactly
 * in fp32; the first round of weight loads is issued before pdl_wait (which this calls). */
template <int BITS>
__device__ __forceinline__ void router_row(const cuda_qmat &m, int row, const float *x, int ldx, int t0, int nt,
                                           float *acc, int lane) {
    constexpr int per = BITS == 4 ? 32 : 16, RU = 4;
    const int nch = m.cols / per;
    const uint4 *cr = reinterpret_cast<const uint4 *>(qrow_codes(m, row));
    const size_t g0 = qrow_group0(m, row);
    uint4 w[RU];
    float sc[RU], bi[RU];
    auto load_round = [&](int base, bool pre) {
#pragma unroll
        for (int u = 0; u < RU; u++) {
            const int ch = base + 32 * u;
            if (ch < nch) {
                w[u] = pre ? ld_stream_pre(cr + ch) : ld_stream(cr + ch);
                sc[u] = bf(m.scales[g0 + ch * per / QGROUP]);
                bi[u] = bf(m.biases[g0 + ch * per / QGROUP]);
            } else {
                w[u] = make_uint4(0, 0, 0, 0);
                sc[u] = bi[u] = 0.0f;
            }
        }
    };
    load_round(lane, true); /* weights only (the whole row for K = 2048): before the wait */
    pdl_wait();
    for (int base = lane; base < nch; base += 32 * RU) {
        if (base != lane) load_round(base, false);
#pragma unroll
        for (int u = 0; u < RU; u++) {
            const int ch = base + 32 * u;
            if (ch >= nch) continue;
            const uint32_t ws[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
            float wf[per];
#pragma unroll
            for (int e = 0; e < per; e++) {
                const uint32_t q = BITS == 4 ? (ws[e / 8] >> (4 * (e % 8))) & 15u : (ws[e / 4] >> (8 * (e % 4))) & 255u;
                wf[e] = fmaf(sc[u], u2f(q), bi[u]);
            }
#pragma unroll
            for (int t = 0; t < RT_TOK; t++) {
                if (t < nt) {
                    const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)(t0 + t) * ldx + ch * per);
                    float a = acc[t];
#pragma unroll
                    for (int v = 0; v < per / 4; v++) {
                        const float4 x4 = xp[v];
                        a = fmaf(wf[4 * v], x4.x, a);
                        a = fmaf(wf[4 * v + 1], x4.y, a);
                        a = fmaf(wf[4 * v + 2], x4.z, a);
                        a = fmaf(wf[4 * v + 3], x4.w, a);
                    }
                    acc[t] = a;
                }
            }
        }
    }
}

/* (v, e) comes before (v2, e2): larger logit first, the lower expert on a tie. */
__device__ __forceinline__ bool rt_before(float v, int e, float v2, int e2) { return v > v2 || (v == v2 && e < e2); }

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
 * warp arg-max of the lanes' heads and a shift in the winning lane; the probabilities are
 * computed after the rounds, one per lane. (An earlier form rescanned all 8 values and
 * divided inside every round: one warp's serial chain, 4.9 µs of the router's tail on the
 * H200 — the same results, bit for bit.) Sum of exponentials: each lane's 8 in order, then
 * the butterfly. */
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
        float bv = v[0];
        int bi = e[0];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (rt_before(v2, i2, bv, bi)) {
                bv = v2;
                bi = i2;
            }
        }
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
