/* cpu/cpu_ops.c — scalar reference kernels (see cpu_ops.h). */
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
    const float *xp;   /* small-T 4-bit path: x permuted per group, [T, cols] */
    const float *xsum; /* small-T 4-bit path: Σx per group, [T, cols/group] */
};

#define QMM_SMALL_T 4

#ifdef HAVE_AVX2
/* Small-T 4-bit path: y = Σ_g s_g·(Σ_i q_i x_i) + b_g·(Σ_i x_i) without materialising the
 * row. Word j of a group holds elements 8j..8j+7 (nibble k = element 8j+k), so with x
 * permuted to xp[g·G + 8k + j] = x[g·G + 8j + k], nibble plane k of the group's 8 words
 * (one 256-bit load, shifted by 4k and masked) lines up with xp[8k .. 8k+7]. */
static void qmm_item_q4_small(void *ctx, int item) {
    const struct qmm_job *j = ctx;
    const struct qmat *m = j->m;
    const int G = m->group, ng = m->cols / G, wpg = G / 8;
    const int r0 = item * j->rows_per_item;
    const int r1 = r0 + j->rows_per_item < m->rows ? r0 + j->rows_per_item : m->rows;
    const __m256i mask = _mm256_set1_epi32(15);
    for (int r = r0; r < r1; r++) {
        const size_t row = (size_t)j->mat * (size_t)m->rows + (size_t)r;
        const uint32_t *w = m->codes + row * qmat_row_words(m);
        const uint16_t *sc = m->scales + row * (size_t)ng, *bi = m->biases + row * (size_t)ng;
        float acc[QMM_SMALL_T] = {0};
        for (int g = 0; g < ng; g++) {
            const float s = bf16_to_f32(sc[g]), b = bf16_to_f32(bi[g]);
            for (int c = 0; c < wpg; c += 8) { /* 8 words = 64 elements */
                const __m256i words = _mm256_loadu_si256((const __m256i *)(w + (size_t)g * wpg + c));
                for (int t = 0; t < j->T; t++) {
                    const float *xp = j->xp + (size_t)t * m->cols + (size_t)g * G + (size_t)c * 8;
                    __m256 d = _mm256_setzero_ps();
                    for (int k = 0; k < 8; k++) {
                        const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words, 4 * k), mask));
                        d = _mm256_fmadd_ps(q, _mm256_loadu_ps(xp + 8 * k), d);
                    }
                    __m128 h = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
                    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
                    acc[t] += s * _mm_cvtss_f32(h);
                }
            }
            for (int t = 0; t < j->T; t++) acc[t] += b * j->xsum[(size_t)t * ng + g];
        }
        for (int t = 0; t < j->T; t++) j->y[(size_t)t * j->ldy + r] = acc[t];
    }
}
#endif

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

void cpu_qmatmul(threadpool *pool, const struct qmat *m, int mat, const float *x, int T, int ldx, float *y, int ldy) {
    struct qmm_job j = {.m = m, .mat = mat, .x = x, .T = T, .ldx = ldx, .y = y, .ldy = ldy};
    /* Aim for several items per thread so uneven rows balance; at least 4 rows an item. */
    const int threads = pool ? threadpool_size(pool) : 1;
    int rpi = m->rows / (threads * 8);
    if (rpi < 4) rpi = 4;
    j.rows_per_item = rpi;
    const int items = (m->rows + rpi - 1) / rpi;
    threadpool_fn fn = qmm_item;
#ifdef HAVE_AVX2
    /* permuted x and group sums for the fused small-T path (stack: T·cols floats) */
    const int small = m->bits == 4 && T <= QMM_SMALL_T && m->group % 64 == 0 && m->cols <= 16384;
    float xp[small ? T * m->cols : 1], xs[small ? T * (m->cols / m->group) : 1];
    if (small) {
        const int G = m->group;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * ldx;
            for (int g = 0; g < m->cols / G; g++) {
                float sum = 0;
                for (int c = 0; c < G / 64; c++)
                    for (int k = 0; k < 8; k++)
                        for (int jj = 0; jj < 8; jj++) {
                            const float v = xt[g * G + c * 64 + 8 * jj + k];
                            xp[(size_t)t * m->cols + g * G + c * 64 + 8 * k + jj] = v;
                            sum += v;
                        }
                xs[t * (m->cols / G) + g] = sum;
            }
        }
        j.xp = xp;
        j.xsum = xs;
        fn = qmm_item_q4_small;
    }
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
