// cuda/cuda_attn.h — attention arithmetic shared by cuda_attn.cu (the prep, scalar
// attention and combine launches) and cuda_flash.cu (the tensor-core kernel and its
// fused decode form, which does prep and combine itself). Both forms must produce the
// same bits (tests compare them), so every operation whose rounding could differ
// between two inlined copies is written with explicit rounding (__fmul_rn, __fmaf_rn,
// __fdiv_rn, __fadd_rn: never contracted), and the sums keep one order:
//  - a head row's Σx² is the order of block_sum over D threads (warp w sums dims
//    32w..32w+31 by the xor butterfly, then the D/32 warp sums by a second butterfly);
//  - the split combine sums splits in index order, one fma per split.
#ifndef ORCHID_CUDA_ATTN_H
#define ORCHID_CUDA_ATTN_H

#include <math.h>

#include "cuda/cuda_internal.h"

/* Row `pos` of K (which = 0) or V (1) of KV head g of attention layer layer_ord in a
 * session's cache: [n_attn][2][kvh][max_seq][D] bf16. */
__device__ __forceinline__ uint16_t *kv_ptr(const cuda_seq &s, int layer_ord, int which, int kvh, int g, int pos, int D) {
    return s.kv + ((((size_t)layer_ord * 2 + which) * kvh + g) * (size_t)s.max_seq + pos) * D;
}

/* NeoX RoPE over the first `rot` dims: dim d < rot turns by pos·θ^(−2(d mod rot/2)/rot). */
__device__ __forceinline__ float rope_inv_freq(int d, int rot, float theta) {
    const int half = rot / 2;
    return d < rot ? powf(theta, -2.0f * (float)(d % half) / (float)rot) : 0.0f;
}
/* y' = y·cos − partner·sin for d < rot/2, y·cos + partner·sin for rot/2 <= d < rot
 * (partner = the value rot/2 dims away). */
__device__ __forceinline__ float rope_apply(float y, float partner, float cs, float sn, bool lo) {
    const float yc = __fmul_rn(y, cs);
    return lo ? __fsub_rn(yc, __fmul_rn(partner, sn)) : __fmaf_rn(partner, sn, yc);
}
/* 1/rms of a row of D values whose squares sum to ss. */
__device__ __forceinline__ float rms_inv(float ss, int D, float eps) { return rsqrtf(__fadd_rn(__fdiv_rn(ss, (float)D), eps)); }

/* One head row of D fp32 values at src RMS-normalised by `gain` and rotated at position
 * p by one warp: lane holds dims lane + 32i; the result goes to row[0..D) (the warp's
 * shared-memory scratch; __syncwarp'd). The same bits as attn_prep_kernel's D threads. */
template <int D>
__device__ __forceinline__ void attn_prep_row_warp(const float *src, const float *gain, const float *inv_freq, int p,
                                                   int rot, float eps, float *row, int lane) {
    constexpr int NI = D / 32;
    float x[NI], s[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) x[i] = src[lane + 32 * i];
#pragma unroll
    for (int i = 0; i < NI; i++) s[i] = warp_sum(__fmul_rn(x[i], x[i]));
    float t = 0.0f; /* lane i < NI holds warp i's sum, as block_sum's second butterfly */
#pragma unroll
    for (int i = 0; i < NI; i++)
        if (lane == i) t = s[i];
    const float inv = rms_inv(warp_sum(t), D, eps);
    float y[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) {
        y[i] = __fmul_rn(__fmul_rn(x[i], inv), gain[lane + 32 * i]);
        row[lane + 32 * i] = y[i];
    }
    __syncwarp();
    const int half = rot / 2;
#pragma unroll
    for (int i = 0; i < NI; i++) {
        const int d = lane + 32 * i;
        if (d < rot) {
            float sn, cs;
            sincosf((float)p * inv_freq[d], &sn, &cs);
            y[i] = rope_apply(y[i], row[d < half ? d + half : d - half], cs, sn, d < half);
        }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < NI; i++) row[lane + 32 * i] = y[i];
    __syncwarp();
}

/* One (token, head) row of the key-split combine by one warp: with e_s = exp(m_s − M)
 * (0 for an empty split), out[d] = bf16(Σ_s e_s·O_s[d] / Σ_s e_s·l_s · sigmoid(gate[d])),
 * both sums in split order. p = the row's partials [n_split][m, l, O[D]] (read through L2:
 * other blocks of the same launch may have written them); lane s holds split s's m, l and
 * e (32 at a time, loaded together), lane d's dims are d + 32j. An empty split's O and l
 * are 0, so adding 0·O leaves the sums' bits as skipping it would. */
template <int D>
__device__ __forceinline__ void attn_combine_row_warp(const float *p, int n_split, const float *gate, uint16_t *out,
                                                      int lane) {
    constexpr int NJ = D / 32;
    float L = 0.0f, o[NJ];
#pragma unroll
    for (int j = 0; j < NJ; j++) o[j] = 0.0f;
    float ms = -INFINITY, ls = 0.0f; /* split s0 + lane's (m, l) */
    if (lane < n_split) {
        ms = __ldcg(p + (size_t)lane * (D + 2));
        ls = __ldcg(p + (size_t)lane * (D + 2) + 1);
    }
    float M = ms;
    for (int s = lane + 32; s < n_split; s += 32) M = fmaxf(M, __ldcg(p + (size_t)s * (D + 2)));
    M = warp_max(M);
    for (int s0 = 0; s0 < n_split; s0 += 32) {
        if (s0 > 0) {
            const bool in = s0 + lane < n_split;
            ms = in ? __ldcg(p + (size_t)(s0 + lane) * (D + 2)) : -INFINITY;
            ls = in ? __ldcg(p + (size_t)(s0 + lane) * (D + 2) + 1) : 0.0f;
        }
        const float e = ms == -INFINITY ? 0.0f : __expf(ms - M), l = ms == -INFINITY ? 0.0f : ls;
        const int n = min(32, n_split - s0);
#pragma unroll 8
        for (int i = 0; i < n; i++) {
            const float ei = __shfl_sync(0xffffffffu, e, i), li = __shfl_sync(0xffffffffu, l, i);
            const float *os = p + (size_t)(s0 + i) * (D + 2) + 2 + lane;
            L = __fmaf_rn(li, ei, L);
#pragma unroll
            for (int j = 0; j < NJ; j++) o[j] = __fmaf_rn(__ldcg(os + 32 * j), ei, o[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int d = lane + 32 * j;
        const float a = L > 0.0f ? __fdiv_rn(o[j], L) : 0.0f;
        out[d] = f2bf(__fmul_rn(a, sigm(gate[d])));
    }
}

#endif
