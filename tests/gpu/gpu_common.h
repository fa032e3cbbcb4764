/* tests/gpu/gpu_common.h — helpers shared by the GPU test and benchmark programs:
 * a seeded RNG, random quantized matrices (host + device copies), loading a model
 * (checkpoint directory or in-memory synthetic shape) into CPU and CUDA backends,
 * and small drivers (prefill a prompt, greedy decode) over struct backend. */
#ifndef ORCHID_GPU_COMMON_H
#define ORCHID_GPU_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "model/config.h"
#include "model/synth.h"
#include "model/weights.h"
#include "runtime/bf16.h"
#include "runtime/safetensors.h"
#include "runtime/status.h"
#include "runtime/timing.h"
#include "tmodel.h"

int cuda_backend_load_stats(const struct backend *b, double *seconds, double *bytes);

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static inline uint64_t rng_u64(void) {
    uint64_t x = rng_state;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}
static inline float rng_uniform(void) { return (float)((rng_u64() >> 40) * (1.0 / 16777216.0)); }
static inline float rng_normal(void) {
    float u1 = rng_uniform(), u2 = rng_uniform();
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* A random quantized matrix with values of standard deviation ~sigma, on host and device. */
struct rq {
    struct qmat h;
    struct cuda_qmat d;
    void *hbuf, *dbuf;
};

static inline int rq_make(struct rq *m, int rows, int cols, int n_mats, int bits, float sigma) {
    char err[256];
    memset(m, 0, sizeof *m);
    const size_t R = (size_t)rows * n_mats, cw = R * cols * bits / 32, g = R * (cols / 64);
    const size_t bytes = cw * 4 + 2 * g * 2;
    m->hbuf = malloc(bytes);
    uint32_t *codes = m->hbuf;
    uint16_t *sc = (uint16_t *)(codes + cw), *bi = sc + g;
    for (size_t i = 0; i < cw; i++) codes[i] = (uint32_t)rng_u64();
    const float half = bits == 4 ? 7.5f : 127.5f, rms = bits == 4 ? 4.61f : 73.9f;
    for (size_t i = 0; i < g; i++) {
        float s = sigma / rms * (0.75f + 0.5f * rng_uniform());
        if (rng_u64() & 1) s = -s;
        sc[i] = f32_to_bf16(s);
        bi[i] = f32_to_bf16(-half * bf16_to_f32(sc[i]) + 0.1f * sigma * rng_normal());
    }
    m->h = (struct qmat){.codes = codes, .scales = sc, .biases = bi, .rows = rows, .cols = cols, .n_mats = n_mats,
                         .bits = bits, .group = 64};
    if (cuda_malloc(&m->dbuf, bytes, "test matrix", err, sizeof err) || cuda_h2d(m->dbuf, m->hbuf, bytes, err, sizeof err)) {
        fprintf(stderr, "rq_make: %s\n", err);
        return -1;
    }
    m->d = (struct cuda_qmat){.codes = m->dbuf, .scales = (uint16_t *)((uint32_t *)m->dbuf + cw),
                              .biases = (uint16_t *)((uint32_t *)m->dbuf + cw) + g, .rows = rows, .cols = cols,
                              .n_mats = n_mats, .bits = bits};
    return 0;
}

static inline void rq_free(struct rq *m) {
    free(m->hbuf);
    cuda_free(m->dbuf);
}

/* ---- models ---- */

/* Feeds tokens[0..n) at positions pos0.. to one session, in chunks the backend accepts;
 * logits of the rows in [want0, n) go to out (rows × vocab) when out != NULL. */
static inline int feed(struct backend *be, struct backend_session *s, const int32_t *tokens, int n, int pos0, int want0,
                float *out, int vocab, char *err, size_t errlen) {
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)be->max_batch_tokens);
    int32_t *seq = calloc((size_t)be->max_batch_tokens, sizeof(int32_t));
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)be->max_batch_tokens);
    float **dst = malloc(sizeof(float *) * (size_t)be->max_batch_tokens);
    int rc = 0;
    for (int i0 = 0; i0 < n && !rc; i0 += be->max_batch_tokens) {
        const int m = n - i0 < be->max_batch_tokens ? n - i0 : be->max_batch_tokens;
        int n_out = 0;
        for (int i = 0; i < m; i++) {
            pos[i] = pos0 + i0 + i;
            if (out && i0 + i >= want0) {
                rows[n_out] = i;
                dst[n_out++] = out + (size_t)(i0 + i - want0) * vocab;
            }
        }
        struct backend_session *ss[1] = {s};
        struct fwd_batch b = {.n_tokens = m, .tokens = tokens + i0, .pos = pos, .seq = seq, .sessions = ss, .n_seqs = 1,
                              .n_out = n_out, .out_rows = rows, .out_logits = dst};
        rc = be->forward(be, &b, err, errlen);
    }
    free(pos); free(seq); free(rows); free(dst);
    return rc;
}

static inline int argmax_row(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Host greedy loop (forward + argmax) from `first` at pos; all (optional, n × vocab) keeps the logits. */
static inline int greedy_host(struct backend *be, struct backend_session *s, int pos, int32_t first, int n, int32_t *ids,
                              int vocab, float *all, char *err, size_t errlen) {
    float *lg = malloc((size_t)vocab * 4);
    int32_t tok = first;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        float *dst = all ? all + (size_t)i * vocab : lg;
        rc = feed(be, s, &tok, 1, pos + i, 0, dst, vocab, err, errlen);
        tok = ids[i] = argmax_row(dst, vocab);
    }
    free(lg);
    return rc;
}

/* top1 - top2 of a row (how close the argmax is to flipping). */
static inline float top_margin(const float *x, int n) {
    int b = argmax_row(x, n);
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && x[i] > second) second = x[i];
    return x[b] - second;
}

/* The reference's own sensitivity: how far the CPU backend moves when every input-norm
 * gain is multiplied by (1 + eps·N(0,1)) — eps ≈ 4e-3 is about the combined size of
 * the bf16 roundings a GPU layer makes (activations, tensor-core weights, KV, P).
 * Over `reps` perturbations: the largest mean logits rel err of the prompt, the smallest
 * prompt top-1 agreement and the smallest number of greedy tokens identical to the
 * unperturbed run (ref_logits [n × vocab], ref_ids [ng] from `first`). Gains are restored. */
struct sensitivity {
    double mean_err_max;
    int agree_min, greedy_min;
};
static inline double rel_err(const float *a, const float *ref, size_t n);
static inline int cpu_sensitivity(struct backend *cpu, struct model_weights *w, const struct model_config *c,
                                  const int32_t *prompt, int n, const float *ref_logits, int32_t first,
                                  const int32_t *ref_ids, int ng, float eps, int reps, struct sensitivity *out,
                                  char *err, size_t errlen) {
    const int H = c->hidden, V = c->vocab;
    float *saved = malloc(sizeof(float) * (size_t)H * c->n_layers), *lg = malloc((size_t)n * V * 4);
    int32_t *ids = malloc((size_t)(ng > 0 ? ng : 1) * 4);
    struct backend_session *s = NULL;
    int rc = cpu->session_create(cpu, n + ng + 8, &s, err, errlen);
    out->mean_err_max = 0;
    out->agree_min = n;
    out->greedy_min = ng;
    for (int r = 0; r < reps && !rc; r++) {
        for (int l = 0; l < c->n_layers; l++)
            for (int i = 0; i < H; i++) {
                saved[(size_t)l * H + i] = w->layers[l].in_norm[i];
                w->layers[l].in_norm[i] *= 1.0f + eps * rng_normal();
            }
        cpu->session_reset(cpu, s);
        rc = feed(cpu, s, prompt, n, 0, 0, lg, V, err, errlen);
        double mean = 0;
        int agree = 0;
        for (int i = 0; i < n && !rc; i++) {
            mean += rel_err(lg + (size_t)i * V, ref_logits + (size_t)i * V, (size_t)V) / n;
            agree += argmax_row(lg + (size_t)i * V, V) == argmax_row(ref_logits + (size_t)i * V, V);
        }
        int same = ng;
        if (!rc && ng > 0) {
            rc = greedy_host(cpu, s, n, first, ng, ids, V, NULL, err, errlen);
            same = 0;
            for (int i = 0; i < ng; i++) same += ids[i] == ref_ids[i];
        }
        if (mean > out->mean_err_max) out->mean_err_max = mean;
        if (agree < out->agree_min) out->agree_min = agree;
        if (same < out->greedy_min) out->greedy_min = same;
        for (int l = 0; l < c->n_layers; l++)
            for (int i = 0; i < H; i++) w->layers[l].in_norm[i] = saved[(size_t)l * H + i];
    }
    if (s) cpu->session_destroy(cpu, s);
    free(saved); free(lg); free(ids);
    return rc;
}

static inline double rel_err(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        if (isnan(a[i])) return INFINITY;
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

/* The start of a GPU test program: line-buffered stdout; with a CUDA device, prints it,
 * seeds the RNG from the clock (fresh inputs every run, the seed printed to repeat one) and
 * points ctx at the caller's error buffer, returning 0; without one, prints that the tests
 * are skipped and returns -1 (the caller records the failure). */
static inline int gpu_test_start(struct cuda_ctx *ctx, char *errbuf, size_t errlen) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    char name[160];
    if (cuda_device_name(name, sizeof name)) {
        printf("no CUDA device: GPU tests skipped\n");
        return -1;
    }
    printf("device: %s\n", name);
    rng_state ^= (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;
    printf("rng seed state %llu\n", (unsigned long long)rng_state);
    ctx->stream = NULL;
    ctx->err = errbuf;
    ctx->errlen = errlen;
    return 0;
}

#endif
