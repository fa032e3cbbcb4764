/* cpu/cpu_ops.c — scalar reference kernels (see cpu_ops.h). */
#include "cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

#include "runtime/bf16.h"

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
    if (pool) threadpool_run(pool, items, qmm_item, &j);
    else
        for (int i = 0; i < items; i++) qmm_item(&j, i);
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
