/* cpu/cpu_ops.c — the CPU kernels (see cpu_ops.h): scalar reference math, and the
 * quantized matmul in two forms, generic C and AVX2+FMA, each batch-invariant (a
 * token's outputs never depend on how many tokens share the call). */
#include "cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

#include "runtime/bf16.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

void qmat_dequant_row(const struct qmat *m, int mat, int row, float *out) {
    const size_t r = (size_t)mat * (size_t)m->rows + (size_t)row;
    const uint32_t *w = m->codes + r * qmat_row_words(m);
    const uint16_t *s = m->scales + r * qmat_row_groups(m);
    const uint16_t *b = m->biases + r * qmat_row_groups(m);
    const int per_word = 32 / m->bits;
    const uint32_t mask = (1u << m->bits) - 1u;
    const int words_per_group = m->group / per_word;
    const int n_groups = m->cols / m->group;
    for (int g = 0; g < n_groups; g++) {
        const float scale = bf16_to_f32(s[g]), bias = bf16_to_f32(b[g]);
        float *o = out + (size_t)g * m->group;
        const uint32_t *wg = w + (size_t)g * words_per_group;
        for (int j = 0; j < words_per_group; j++) {
            uint32_t word = wg[j];
            for (int k = 0; k < per_word; k++) {
                o[j * per_word + k] = scale * (float)(word & mask) + bias;
                word >>= m->bits;
            }
        }
    }
}

float dot_f32(const float *a, const float *b, int n) {
    /* 16 independent partial sums so the compiler can vectorise without -ffast-math. */
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (int j = 0; j < 16; j++) s += acc[j];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

struct qmm_job {
    const struct qmat *m;
    int mat;
    const float *x;
    int T, ldx;
    float *y;
    int ldy;
    int rows_per_item;
};

/* Generic path (any bits/group; the only path without AVX2): dequantize the row, then
 * dot it with each token. Token t's value never depends on T. */
static void qmm_item(void *ctx, int item) {
    const struct qmm_job *j = ctx;
    const struct qmat *m = j->m;
    float row[m->cols]; /* one dequantized weight row, reused for every token */
    const int r0 = item * j->rows_per_item;
    const int r1 = r0 + j->rows_per_item < m->rows ? r0 + j->rows_per_item : m->rows;
    for (int r = r0; r < r1; r++) {
        qmat_dequant_row(m, j->mat, r, row);
        for (int t = 0; t < j->T; t++) j->y[(size_t)t * j->ldy + r] = dot_f32(row, j->x + (size_t)t * j->ldx, m->cols);
    }
}

#ifdef HAVE_AVX2
/* AVX2 path for 4- and 8-bit rows. Batch invariance (issue 6): y[t, r] comes from one
 * fixed sequence of float operations whatever T is and wherever t sits in the batch,
 * so a token's result is bit-identical alone or in any batch:
 *   w[c]  = fma(q[c], s_g, b_g)                      8 lanes at a time, natural order
 *   acc_a = fma(w[c..c+8), x[c..c+8), acc_a)         a = (c / 8) mod QMM_NA, c ascending
 *   y     = hsum8(acc_0 + acc_1)                     fixed lane order
 * Tokens go in blocks of QMM_TB (the last one shorter) only to share each weight vector;
 * every token keeps its own accumulators, so blocking changes no rounding. The first
 * block dequantizes the row in registers; when more tokens follow it also stores w, and
 * the other blocks read it back (the same values). Needs group % 16 == 0 (chunk parity
 * is then the same counted per group or per row). */
#define QMM_NA 2 /* accumulators per output element */
#define QMM_TB 4 /* tokens per register block */

static inline float hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* The codes of chunk k (elements 8k..8k+7) of a group as floats; wg: the group's words. */
static inline __attribute__((always_inline)) __m256 codes8(const uint32_t *wg, size_t k, const int bits) {
    if (bits == 4) { /* word k, nibble i = element 8k+i */
        const __m256i v = _mm256_set1_epi32((int)wg[k]);
        const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(v, sh), _mm256_set1_epi32(15)));
    }
    /* 8 bits: LSB-first words, little-endian: byte 8k+i is element 8k+i */
    const __m128i b = _mm_loadl_epi64((const __m128i *)((const uint8_t *)wg + 8 * k));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
}

/* y[t * ldy] = w_row · x_t for the TB tokens at x; w_row dequantized from the codes
 * (and stored to wout when STORE). TB, BITS, STORE are constants after inlining. */
static inline __attribute__((always_inline)) void dot_codes(const struct qmat *m, size_t row, const float *x, size_t ldx,
                                                            float *y, size_t ldy, float *wout, const int TB,
                                                            const int BITS, const int STORE) {
    const int G = m->group, ng = m->cols / G;
    const uint16_t *sc = m->scales + row * (size_t)ng, *bi = m->biases + row * (size_t)ng;
    const uint32_t *wd = m->codes + row * qmat_row_words(m);
    __m256 acc[QMM_TB][QMM_NA];
#pragma GCC unroll 4
    for (int t = 0; t < TB; t++)
        for (int a = 0; a < QMM_NA; a++) acc[t][a] = _mm256_setzero_ps();
    const size_t chunks = (size_t)G / 8, gwords = (size_t)G * BITS / 32;
    for (int g = 0; g < ng; g++) {
        const __m256 s = _mm256_set1_ps(bf16_to_f32(sc[g])), b = _mm256_set1_ps(bf16_to_f32(bi[g]));
        const uint32_t *wg = wd + (size_t)g * gwords;
        const float *xg = x + (size_t)g * G;
        for (size_t k = 0; k < chunks; k += QMM_NA) {
#pragma GCC unroll 2
            for (int a = 0; a < QMM_NA; a++) {
                const __m256 wv = _mm256_fmadd_ps(codes8(wg, k + a, BITS), s, b);
                if (STORE) _mm256_storeu_ps(wout + (size_t)g * G + 8 * (k + a), wv);
#pragma GCC unroll 4
                for (int t = 0; t < TB; t++)
                    acc[t][a] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xg + (size_t)t * ldx + 8 * (k + a)), acc[t][a]);
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < TB; t++) y[(size_t)t * ldy] = hsum8(_mm256_add_ps(acc[t][0], acc[t][1]));
}

/* The same for a row already in w (floats). */
static inline __attribute__((always_inline)) void dot_floats(const float *w, int C, const float *x, size_t ldx, float *y,
                                                             size_t ldy, const int TB) {
    __m256 acc[QMM_TB][QMM_NA];
#pragma GCC unroll 4
    for (int t = 0; t < TB; t++)
        for (int a = 0; a < QMM_NA; a++) acc[t][a] = _mm256_setzero_ps();
    for (int c = 0; c < C; c += 8 * QMM_NA) {
#pragma GCC unroll 2
        for (int a = 0; a < QMM_NA; a++) {
            const __m256 wv = _mm256_loadu_ps(w + c + 8 * a);
#pragma GCC unroll 4
            for (int t = 0; t < TB; t++)
                acc[t][a] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (size_t)t * ldx + c + 8 * a), acc[t][a]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < TB; t++) y[(size_t)t * ldy] = hsum8(_mm256_add_ps(acc[t][0], acc[t][1]));
}

/* One row for every token: the first block from the codes, the rest from w. */
static inline __attribute__((always_inline)) void qmm_row_avx2(const struct qmm_job *j, size_t row, int r, float *w,
                                                               const int BITS) {
    const struct qmat *m = j->m;
    const size_t ldx = (size_t)j->ldx, ldy = (size_t)j->ldy;
    const int T = j->T;
    float *y = j->y + r;
    switch (T) {
    case 1: dot_codes(m, row, j->x, ldx, y, ldy, NULL, 1, BITS, 0); return;
    case 2: dot_codes(m, row, j->x, ldx, y, ldy, NULL, 2, BITS, 0); return;
    case 3: dot_codes(m, row, j->x, ldx, y, ldy, NULL, 3, BITS, 0); return;
    case 4: dot_codes(m, row, j->x, ldx, y, ldy, NULL, 4, BITS, 0); return;
    default: dot_codes(m, row, j->x, ldx, y, ldy, w, QMM_TB, BITS, 1); break;
    }
    int t = QMM_TB;
    for (; t + QMM_TB <= T; t += QMM_TB) dot_floats(w, m->cols, j->x + t * ldx, ldx, y + t * ldy, ldy, QMM_TB);
    switch (T - t) {
    case 3: dot_floats(w, m->cols, j->x + t * ldx, ldx, y + t * ldy, ldy, 3); break;
    case 2: dot_floats(w, m->cols, j->x + t * ldx, ldx, y + t * ldy, ldy, 2); break;
    case 1: dot_floats(w, m->cols, j->x + t * ldx, ldx, y + t * ldy, ldy, 1); break;
    default: break;
    }
}

static void qmm_item_avx2(void *ctx, int item) {
    const struct qmm_job *j = ctx;
    const struct qmat *m = j->m;
    float w[m->cols]; /* the dequantized row, when more than one token block reads it */
    const int r0 = item * j->rows_per_item;
    const int r1 = r0 + j->rows_per_item < m->rows ? r0 + j->rows_per_item : m->rows;
    for (int r = r0; r < r1; r++) {
        const size_t row = (size_t)j->mat * (size_t)m->rows + (size_t)r;
        if (m->bits == 4) qmm_row_avx2(j, row, r, w, 4);
        else qmm_row_avx2(j, row, r, w, 8);
    }
}
#endif

void cpu_qmatmul(threadpool *pool, const struct qmat *m, int mat, const float *x, int T, int ldx, float *y, int ldy) {
    if (T <= 0) return;
    struct qmm_job j = {.m = m, .mat = mat, .x = x, .T = T, .ldx = ldx, .y = y, .ldy = ldy};
    /* Aim for several items per thread so uneven rows balance; at least 4 rows an item. */
    const int threads = pool ? threadpool_size(pool) : 1;
    int rpi = m->rows / (threads * 8);
    if (rpi < 4) rpi = 4;
    j.rows_per_item = rpi;
    const int items = (m->rows + rpi - 1) / rpi;
    threadpool_fn fn = qmm_item;
#ifdef HAVE_AVX2
    if ((m->bits == 4 || m->bits == 8) && m->group % (8 * QMM_NA) == 0) fn = qmm_item_avx2;
#endif
    if (pool) threadpool_run(pool, items, fn, &j);
    else
        for (int i = 0; i < items; i++) fn(&j, i);
}

void rmsnorm(float *out, const float *x, const float *gain, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * (gain ? gain[i] : 1.0f);
}

void rope_neox(float *x, int rot, int pos, float theta) {
    const int half = rot / 2;
    for (int j = 0; j < half; j++) {
        const float inv_freq = powf(theta, -2.0f * (float)j / (float)rot);
        const float ang = (float)pos * inv_freq;
        const float c = cosf(ang), s = sinf(ang);
        const float a = x[j], b = x[j + half];
        x[j] = a * c - b * s;
        x[j + half] = b * c + a * s;
    }
}

void moe_route(const float *logits, int n, int k, int renorm, int32_t *ids, float *weights) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    float sum = 0;
    for (int i = 0; i < n; i++) sum += expf(logits[i] - mx);
    /* top-k by selection: k passes, each taking the largest unchosen (lowest index on ties). */
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            int taken = 0;
            for (int q = 0; q < s; q++) taken |= ids[q] == i;
            if (taken) continue;
            if (best < 0 || logits[i] > logits[best]) best = i;
        }
        ids[s] = best;
        weights[s] = expf(logits[best] - mx) / sum;
    }
    if (renorm) {
        float t = 0;
        for (int s = 0; s < k; s++) t += weights[s];
        for (int s = 0; s < k; s++) weights[s] /= t;
    }
}

void gdn_step(float *S, const float *q, const float *k, const float *v, float decay, float beta, int Dk, int Dv, float *y) {
    for (int i = 0; i < Dv; i++) {
        float *row = S + (size_t)i * Dk;
        for (int j = 0; j < Dk; j++) row[j] *= decay;
        const float mem = dot_f32(row, k, Dk);      /* (S k)_i */
        const float delta = (v[i] - mem) * beta;    /* β (v - S k)_i */
        for (int j = 0; j < Dk; j++) row[j] += k[j] * delta;
        y[i] = dot_f32(row, q, Dk);                 /* output reads the updated state */
    }
}
