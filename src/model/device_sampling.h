/* model/device_sampling.h — the device sampler's contract: what a row asks for, the
 * probability and weight of every token (inline, compiled as C for the host reference and
 * as CUDA for the kernel, the same fp32 operations in the same order, so both compute the
 * same bits), and the host reference of the whole draw (device_sampling.c).
 *
 * Why: a request that samples (temperature > 0, the default of most OpenAI clients) used
 * to copy its whole logits row (248,320 floats, ~1 MB) to the host every step and sample
 * there, serially after the forward. A GPU backend that sets backend.device_sampling
 * draws such a row's token where the logits are and sends back one id, as it does for
 * greedy rows (src/cuda/cuda_sample.cu). Requests with penalties, logit_bias or logprobs
 * still take the host sampler (model/sampler.c), which needs the row.
 *
 * The draw, for a row of logits l[0..V) and parameters (T, top_k, top_p, min_p, u):
 *   1. m = max of the non-NaN l (NaN never counts). If there is none, or m = +inf, the
 *      row's token is its argmax (sampler_argmax's rule), as the host sampler does.
 *   2. p_i = dsmp_prob(l_i, m, k) with k = dsmp_scale(T): 2^((l_i - m)·log2(e)/T),
 *      1 for the maximum, 0 for NaN and below 2^-125. Token i is kept when p_i > 0 and
 *      p_i >= min_p (the host sampler's min_p: relative to the most likely token).
 *   3. Tokens are ranked by p descending, ties by id ascending. top_k (0 = off) keeps the
 *      first top_k kept tokens; then top_p (< 1) keeps the shortest prefix of those whose
 *      mass reaches ceil(top_p · M) (M: their mass), where a token's mass is its weight
 *      w_i = floor(p_i · 2^44), an integer, so every sum is exact and the same in any order.
 *   4. r = floor(u · M_final) (clamped below M_final); the token is the first finalist in
 *      id order whose running weight sum exceeds r. Weights are p to 2^-44 (tokens less
 *      likely than that, relative to the top one, have weight 0 and are never drawn).
 * This is the host sampler's distribution (sampler.h) with ties broken by id and p to
 * ~1e-7 relative (dsmp_exp2's polynomial); it is not the host sampler's exact draw (that
 * one walks a quickselect's order), so the same seed gives a different (equally valid)
 * token than on the CPU backend — as its logits differ anyway.
 */
#ifndef ORCHID_DEVICE_SAMPLING_H
#define ORCHID_DEVICE_SAMPLING_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* One output row's sampling request (temperature > 0 and top_k != 1: otherwise the row is
 * greedy and takes the argmax path). */
struct row_sampling {
    float temperature; /* > 0 */
    float top_p;       /* (0, 1]; 1 = off */
    float min_p;       /* [0, 1]; 0 = off */
    int32_t top_k;     /* 0 = off */
    double u;          /* this token's uniform draw in [0, 1), from the request's RNG */
};

#define DSMP_FIX_BITS 44
#define DSMP_FIX 17592186044416.0f /* 2^44: p -> integer weight */
#define DSMP_LOG2E 1.44269504088896341f

/* DSMP_MUL: an fp32 product that is never fused with a following add or subtract (nvcc
 * contracts a * b - c into one fma by default; the host compiler builds ISO C11, where GCC
 * does not contract and clang contracts only within one expression). */
#ifdef __CUDACC__
#define DSMP_FN static __device__ __forceinline__
#define DSMP_MUL(a, b) __fmul_rn((a), (b))
#else
#define DSMP_FN static inline
#define DSMP_MUL(a, b) ((a) * (b))
#endif

/* q · 2^n for a normal q and a normal result, exactly: n added to the exponent field. */
DSMP_FN float dsmp_scale2(float q, int n) {
#ifdef __CUDACC__
    return __int_as_float(__float_as_int(q) + (int)((unsigned)n << 23));
#else
    uint32_t u;
    memcpy(&u, &q, 4);
    u += (uint32_t)n << 23;
    float r;
    memcpy(&r, &u, 4);
    return r;
#endif
}

/* k = log2(e) / T, computed once a row (two fp32 operations, the same everywhere). */
DSMP_FN float dsmp_scale(float temperature) {
    const float invt = 1.0f / temperature;
    return DSMP_MUL(invt, DSMP_LOG2E);
}

/* 2^t for t <= 0: t = n + f with n = rint(t), f in [-0.5, 0.5]; 2^f by its degree-7
 * Taylor polynomial in f·ln 2 (relative error < 1e-8 before fp32 rounding), evaluated by
 * fmaf in one fixed order; scaled by 2^n exactly by adding n to the exponent field (q is
 * in [0.70, 1.42] and n >= -125, so the result is normal: never subnormal, never a
 * library call). 0 below 2^-125 (and for NaN). Each operation is its own statement: no
 * compiler may contract them differently on the host and the device. */
DSMP_FN float dsmp_exp2(float t) {
    if (!(t > -125.0f)) return 0.0f;
    const float n = rintf(t);
    const float f = t - n;
    float q = 1.5252733804059840e-5f; /* ln2^7 / 7! */
    q = fmaf(q, f, 1.5403530393381610e-4f);
    q = fmaf(q, f, 1.3333558146428443e-3f);
    q = fmaf(q, f, 9.6181291076284772e-3f);
    q = fmaf(q, f, 5.5504108664821580e-2f);
    q = fmaf(q, f, 2.4022650695910071e-1f);
    q = fmaf(q, f, 6.9314718055994531e-1f);
    q = fmaf(q, f, 1.0f);
    return dsmp_scale2(q, (int)n);
}

/* p of logit v given the row's maximum m and k = dsmp_scale(T). */
DSMP_FN float dsmp_prob(float v, float m, float k) {
    const float d = v - m;
    const float t = DSMP_MUL(d, k);
    return dsmp_exp2(t);
}

/* The integer weight of probability p (exact: p · 2^44 is exact in fp32). */
DSMP_FN uint64_t dsmp_weight(float p) {
    const float s = DSMP_MUL(p, DSMP_FIX);
    return (uint64_t)s;
}

/* Whether a token of probability p survives min_p (and is possible at all). */
DSMP_FN int dsmp_kept(float p, float min_p) { return p > 0.0f && p >= min_p; }

/* The top_p target: the smallest mass the kept prefix must reach, ceil(top_p · M). */
DSMP_FN uint64_t dsmp_mass_target(float top_p, uint64_t mass) {
    const double t = (double)top_p * (double)mass;
    const double c = ceil(t);
    return (uint64_t)c;
}

/* r = floor(u · M), clamped to M - 1 (u just below 1 may round up). */
DSMP_FN uint64_t dsmp_draw(double u, uint64_t mass) {
    const double x = u * (double)mass;
    uint64_t r = (uint64_t)x;
    if (r >= mass) r = mass - 1;
    return r;
}

/* ---- row scores: a prompt token's logprob where the logits are ----
 * /v1/completions echo with logprobs scores every prompt token: the logprob of token p
 * under the row before it, and that row's most likely alternatives. A backend computes them
 * from each scored row's logits itself (CUDA: cuda_row_scores, cuda_score.cu) and hands
 * back one struct sample_result a row (~170 bytes) instead of the 1 MB row: the whole
 * prompt chunk goes through one forward, not 16 rows at a time. The numbers are
 * sampler_row_logprobs's: lse = m + log Σ exp(l_i − m) over the non-NaN l in double (m
 * their maximum; −inf / +inf rows: lse = m), logprob = (float)(l_token − lse) (NaN: −inf),
 * the n_top largest l (value descending, ties to the lower id, NaN never) with (float)(l −
 * lse). sampler_row_logprobs is the CPU backend's scorer and the oracle of the GPU test; the
 * device sums in another order, so its double lse may differ in the last bits and a logprob
 * by an fp32 rounding. */
#define SAMPLER_MAX_TOP_LOGPROBS 20
struct row_score_req {
    int32_t token; /* the token to score (in the vocabulary); < 0: the row is not scored */
    int32_t n_top; /* alternatives wanted, 0..SAMPLER_MAX_TOP_LOGPROBS */
};
/* A token with its logprob and its row's alternatives: the host sampler's result and a
 * scored row's alike. */
struct sample_result {
    int32_t token;
    float logprob;                                /* when params.logprobs; always for a scored row */
    int n_top;                                    /* number of alternatives filled */
    int32_t top_ids[SAMPLER_MAX_TOP_LOGPROBS];    /* most likely first */
    float top_logprobs[SAMPLER_MAX_TOP_LOGPROBS];
};

#ifndef __CUDACC__
#include <stddef.h>
/* Bytes of scratch dsmp_reference needs for a row of V logits. */
size_t dsmp_reference_scratch(int V);
/* The draw above, computed plainly on the host (sorting): the oracle the device kernel is
 * tested against bit for bit, and the semantics the unit tests check. */
int32_t dsmp_reference(const float *logits, int V, const struct row_sampling *rs, void *scratch);
#endif

#endif
