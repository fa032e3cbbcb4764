/* tests/unit/test_cpu_ops.c — the CPU reference kernels against independent
 * formulations: hand-packed MLX affine codes (4- and 8-bit, negative scales), the
 * quantized matmul against dequantize-then-multiply in double, RoPE against
 * complex rotation, routing against brute force, the gated delta step
 * against the closed form S' = α S (I − β k kᵀ) + β v kᵀ, and batch invariance: a
 * token's cpu_qmatmul outputs are bit-identical whatever the batch size and its
 * place in the batch (issue 6). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/cpu_ops.h"
#include "runtime/bf16.h"
#include "runtime/threadpool.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* splitmix64 → [0, 1) */
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}
static float nrand(void) { return (float)(sqrt(-2 * log(urand() + 1e-12)) * cos(6.283185307179586 * urand())); }

/* Packs codes[rows*cols] (each < 2^bits) LSB-first into 32-bit words, MLX style. */
static uint32_t *pack(const int *codes, int rows, int cols, int bits) {
    const int per = 32 / bits, words = cols / per;
    uint32_t *w = calloc((size_t)rows * words, 4);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) w[(size_t)r * words + c / per] |= (uint32_t)codes[r * cols + c] << (bits * (c % per));
    return w;
}

static void test_dequant(int bits, int group) {
    const int rows = 5, cols = 256, n = 1 << bits, ng = cols / group;
    int *codes = malloc(sizeof(int) * rows * cols);
    uint16_t *s = malloc(2 * rows * ng), *b = malloc(2 * rows * ng);
    for (int i = 0; i < rows * cols; i++) codes[i] = (int)(urand() * n) % n;
    for (int i = 0; i < rows * ng; i++) {
        /* negative, tiny and huge scales all occur in real checkpoints */
        float mag = (i % 3 == 0) ? 1e-4f : (i % 3 == 1) ? 0.02f : 300.0f;
        s[i] = f32_to_bf16((urand() < 0.5 ? -1 : 1) * mag * (float)(0.5 + urand()));
        b[i] = f32_to_bf16(nrand() * mag);
    }
    uint32_t *w = pack(codes, rows, cols, bits);
    struct qmat m = {.codes = w, .scales = s, .biases = b, .rows = rows, .cols = cols, .n_mats = 1, .bits = bits, .group = group};
    float out[256];
    for (int r = 0; r < rows; r++) {
        qmat_dequant_row(&m, 0, r, out);
        for (int c = 0; c < cols; c++) {
            float want = bf16_to_f32(s[r * ng + c / group]) * (float)codes[r * cols + c] + bf16_to_f32(b[r * ng + c / group]);
            CHECK(out[c] == want, "bits %d group %d row %d col %d: %g vs %g", bits, group, r, c, out[c], want);
        }
    }
    /* qmatmul vs double-precision dequant-then-multiply, T = 3 tokens, stacked as 2 matrices */
    float x[3 * 256], y[3 * 5];
    for (int i = 0; i < 3 * 256; i++) x[i] = nrand();
    cpu_qmatmul(NULL, &m, 0, x, 3, 256, y, 5);
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < rows; r++) {
            qmat_dequant_row(&m, 0, r, out);
            double acc = 0, mag = 0;
            for (int c = 0; c < cols; c++) { acc += (double)out[c] * x[t * 256 + c]; mag += fabs((double)out[c] * x[t * 256 + c]); }
            CHECK(fabs(y[t * 5 + r] - acc) <= 1e-5 * mag + 1e-30, "qmatmul bits %d t %d r %d: %g vs %g", bits, t, r, y[t * 5 + r], acc);
        }
    free(codes); free(s); free(b); free(w);
}

static void test_rope(void) {
    float x[64], ref[64];
    for (int i = 0; i < 64; i++) x[i] = ref[i] = nrand();
    const int rot = 16, pos = 1234;
    const double theta = 1e7;
    rope_neox(x, rot, pos, (float)theta);
    for (int j = 0; j < rot / 2; j++) { /* (a + ib) · e^{iφ} with pairs (j, j + rot/2) */
        double phi = pos * pow(theta, -2.0 * j / rot);
        double a = ref[j], b = ref[j + rot / 2];
        CHECK_CLOSE(x[j], a * cos(phi) - b * sin(phi), 2e-3, 2e-3, "rope re");
        CHECK_CLOSE(x[j + rot / 2], b * cos(phi) + a * sin(phi), 2e-3, 2e-3, "rope im");
    }
    for (int i = rot; i < 64; i++) CHECK(x[i] == ref[i], "dim %d beyond the rotary part changed", i);
}

static void test_route(void) {
    float logits[16];
    for (int i = 0; i < 16; i++) logits[i] = nrand() * 3;
    logits[5] = logits[9] = 10; /* a tie: the lower id must come first */
    int32_t ids[4];
    float w[4];
    moe_route(logits, 16, 4, 1, ids, w);
    CHECK(ids[0] == 5 && ids[1] == 9, "tie order %d %d", ids[0], ids[1]);
    float sum = 0;
    for (int k = 0; k < 4; k++) sum += w[k];
    CHECK_CLOSE(sum, 1.0, 1e-6, 0, "renormalised weights sum");
    /* weights are the softmax over the selected logits */
    double z = 0;
    for (int k = 0; k < 4; k++) z += exp(logits[ids[k]]);
    for (int k = 0; k < 4; k++) CHECK_CLOSE(w[k], exp(logits[ids[k]]) / z, 1e-6, 1e-5, "route weight");
    for (int i = 0; i < 16; i++) { /* every unselected logit is <= every selected one */
        int sel = 0;
        for (int k = 0; k < 4; k++) sel |= ids[k] == i;
        if (!sel) CHECK(logits[i] <= logits[ids[3]], "unselected %d beats a selected one", i);
    }
}

static void test_gdn_step(void) {
    enum { Dk = 16, Dv = 8 };
    float S[Dv * Dk], S0[Dv * Dk], q[Dk], k[Dk], v[Dv], y[Dv];
    for (int i = 0; i < Dv * Dk; i++) S[i] = S0[i] = nrand();
    double nk = 0;
    for (int i = 0; i < Dk; i++) { k[i] = nrand(); nk += k[i] * k[i]; q[i] = nrand(); }
    for (int i = 0; i < Dk; i++) k[i] /= (float)sqrt(nk);
    for (int i = 0; i < Dv; i++) v[i] = nrand();
    const float alpha = 0.8f, beta = 0.6f;
    gdn_step(S, q, k, v, alpha, beta, Dk, Dv, y);
    for (int i = 0; i < Dv; i++) {
        double out = 0;
        for (int j = 0; j < Dk; j++) {
            double sikk = 0; /* (S0 k)_i k_j */
            for (int l = 0; l < Dk; l++) sikk += S0[i * Dk + l] * k[l];
            double want = alpha * (S0[i * Dk + j] - beta * sikk * k[j]) + beta * v[i] * k[j];
            CHECK_CLOSE(S[i * Dk + j], want, 1e-5, 1e-5, "state");
            out += want * q[j];
        }
        CHECK_CLOSE(y[i], out, 1e-4, 1e-4, "output uses the updated state");
    }
}

static void test_rmsnorm(void) {
    float x[128], g[128], out[128];
    double ss = 0;
    for (int i = 0; i < 128; i++) { x[i] = nrand() * 5; g[i] = 1 + nrand() * 0.1f; ss += (double)x[i] * x[i]; }
    rmsnorm(out, x, g, 128, 1e-6f);
    for (int i = 0; i < 128; i++) CHECK_CLOSE(out[i], x[i] / sqrt(ss / 128 + 1e-6) * g[i], 1e-6, 1e-5, "rmsnorm");
}

/* Every token's outputs bit-identical alone (T = 1) and in batches of 3, 4, 5, 17 and
 * 64 at every place in the batch; strided x and y; the second of two stacked matrices;
 * with and without a thread pool. */
static void test_batch_invariance(int bits, int group, threadpool *pool) {
    enum { ROWS = 37, COLS = 512, NT = 64, LDX = COLS + 8, LDY = ROWS + 3, MATS = 2 };
    const int n = 1 << bits, ng = COLS / group;
    int *codes = malloc(sizeof(int) * MATS * ROWS * COLS);
    uint16_t *s = malloc(2 * MATS * ROWS * ng), *b = malloc(2 * MATS * ROWS * ng);
    for (int i = 0; i < MATS * ROWS * COLS; i++) codes[i] = (int)(urand() * n) % n;
    for (int i = 0; i < MATS * ROWS * ng; i++) {
        s[i] = f32_to_bf16(nrand() * 0.05f);
        b[i] = f32_to_bf16(nrand() * 0.05f);
    }
    uint32_t *w = pack(codes, MATS * ROWS, COLS, bits);
    struct qmat m = {.codes = w, .scales = s, .biases = b, .rows = ROWS, .cols = COLS, .n_mats = MATS, .bits = bits, .group = group};
    float *x = malloc(sizeof(float) * NT * LDX), *alone = malloc(sizeof(float) * NT * LDY), *y = malloc(sizeof(float) * NT * LDY);
    for (int i = 0; i < NT * LDX; i++) x[i] = nrand();
    for (int t = 0; t < NT; t++) cpu_qmatmul(pool, &m, 1, x + (size_t)t * LDX, 1, LDX, alone + (size_t)t * LDY, LDY);
    const int sizes[] = {1, 3, 4, 5, 17, 64};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int T = sizes[si];
        /* batches starting at several offsets, so each token sits at different places */
        for (int off = 0; off + T <= NT; off += T > 1 ? (T + 1) / 2 : 7) {
            memset(y, 0xff, sizeof(float) * NT * LDY);
            cpu_qmatmul(pool, &m, 1, x + (size_t)off * LDX, T, LDX, y, LDY);
            int bad = 0;
            for (int t = 0; t < T; t++)
                bad += memcmp(y + (size_t)t * LDY, alone + (size_t)(off + t) * LDY, sizeof(float) * ROWS) != 0;
            CHECK(bad == 0, "bits %d group %d pool %d: T %d offset %d: %d tokens differ from alone", bits, group,
                  pool != NULL, T, off, bad);
        }
    }
    /* and alone is the right product (double reference) */
    float row[COLS];
    for (int r = 0; r < ROWS; r++) {
        qmat_dequant_row(&m, 1, r, row);
        double acc = 0, mag = 0;
        for (int c = 0; c < COLS; c++) { acc += (double)row[c] * x[5 * LDX + c]; mag += fabs((double)row[c] * x[5 * LDX + c]); }
        CHECK(fabs(alone[5 * LDY + r] - acc) <= 1e-5 * mag + 1e-30, "bits %d r %d: %g vs %g", bits, r, alone[5 * LDY + r], acc);
    }
    free(codes); free(s); free(b); free(w); free(x); free(alone); free(y);
}

int main(void) {
    test_dequant(4, 64);
    test_dequant(8, 64);
    test_dequant(4, 32);
    test_dequant(8, 128);
    test_rope();
    test_route();
    test_gdn_step();
    test_rmsnorm();
    threadpool *pool = NULL;
    char err[256];
    CHECK(threadpool_create(&pool, 3, err, sizeof err) == 0, "threadpool: %s", err);
    const int shapes[][2] = {{4, 64}, {8, 64}, {4, 32}, {8, 128}};
    for (int i = 0; i < 4; i++) {
        test_batch_invariance(shapes[i][0], shapes[i][1], NULL);
        test_batch_invariance(shapes[i][0], shapes[i][1], pool);
    }
    threadpool_destroy(pool);
    return check_summary();
}
