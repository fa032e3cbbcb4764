/* tests/unit/test_model_stability.c — is a random test model stable enough to judge a
 * bf16 engine by, and do its layers still matter? Measured on the CPU reference.
 *
 * The accuracy criteria of issue #5 (GPU vs reference: >= 31/32 greedy tokens, >= 99 %
 * teacher-forced top-1) only make sense on a model whose own outputs survive noise of
 * the size of a bf16 engine's roundings. This program measures, for one model:
 *   (a) greedy: 32 tokens after a 40-token prompt, unperturbed vs every norm gain
 *       (input/post-attention, q/k, GDN output, final) multiplied by (1 + eps·N(0,1)),
 *       eps = 4e-3, several draws: tokens identical (position by position);
 *   (b) teacher-forced: top-1 agreement over the positions of a pseudo-random prompt
 *       (default 256) under the same perturbation, and the mean logits rel. error;
 *   (c) layer ablation: for each layer, the relative change ‖Δlogits‖/‖logits‖ (mean over
 *       the prompt positions) and the top-1 agreement when that layer's residual branches
 *       (mixer output projection, routed experts' and shared expert's down_proj) are
 *       zeroed. A layer that matters changes the logits substantially.
 * Plus the top-1 margins (top1 - top2 logit) of the unperturbed prompt positions.
 *
 * Without arguments (make test): synth:tiny and synth:small (seed 1), with the criteria
 * asserted: greedy >= 31/32 on every draw, top-1 >= 99 %, every ablated layer changing
 * the logits by > 10 % (small: 3 of its layers, whole-layer ablation only; ASan build:
 * only a few tokens of tiny, nothing asserted). With arguments, a measurement tool
 * (--ablate-layers N: N layers evenly spaced from the first to the last; --ablate-modes 1:
 * whole layers only):
 *   test_model_stability [--positions N] [--draws N] [--eps E] [--ablate-layers N]
 *                        [--ablate-modes 1|3] [--perturb MASK] [--no-assert] MODEL...
 * (MASK: which gains are perturbed, 1 input, 2 post-attention, 4 q/k, 8 GDN output,
 * 16 final norm; default 31 = all).
 * MODEL is a checkpoint directory or synth:SHAPE[:SEED] (built in memory). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "model/config.h"
#include "model/synth.h"
#include "model/weights.h"
#include "runtime/safetensors.h"
#include "runtime/timing.h"
#include "tmodel.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

struct opts {
    int positions, draws, n_greedy, n_prompt_greedy, ablate_layers, ablate_modes;
    float eps;
    bool assert_criteria;
    unsigned perturb; /* bit mask of gain kinds perturbed: 1 input, 2 post-attention, 4 q/k, 8 GDN, 16 final */
};

/* ---- drivers ---- */

static uint64_t rng_state;
static double rng_normal(void) {
    uint64_t x[2];
    for (int k = 0; k < 2; k++) {
        rng_state += 0x9e3779b97f4a7c15ull;
        uint64_t z = rng_state;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        x[k] = z ^ (z >> 31);
    }
    const double u1 = 1.0 - (double)(x[0] >> 11) * 0x1p-53, u2 = (double)(x[1] >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void prompt_tokens(int32_t *p, int n, int vocab, uint32_t salt) {
    for (int i = 0; i < n; i++) p[i] = (int32_t)((((uint64_t)(i + salt) * 2654435761u) & 0xffffffffu) % (uint64_t)vocab);
}

/* Feeds tokens[0..n) from position pos0; logits of every token to out (n × vocab) if out. */
static int feed(struct backend *be, struct backend_session *s, const int32_t *tokens, int n, int pos0, float *out,
                int vocab, char *err, size_t errlen) {
    const int B = be->max_batch_tokens;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)B), *seq = calloc((size_t)B, sizeof(int32_t)),
            *rows = malloc(sizeof(int32_t) * (size_t)B);
    float **dst = malloc(sizeof(float *) * (size_t)B);
    int rc = 0;
    for (int i0 = 0; i0 < n && !rc; i0 += B) {
        const int m = n - i0 < B ? n - i0 : B;
        for (int i = 0; i < m; i++) {
            pos[i] = pos0 + i0 + i;
            rows[i] = i;
            dst[i] = out ? out + (size_t)(i0 + i) * vocab : NULL;
        }
        int32_t *am = out ? NULL : malloc(sizeof(int32_t) * (size_t)m);
        struct backend_session *ss[1] = {s};
        struct fwd_batch b = {.n_tokens = m, .tokens = tokens + i0, .pos = pos, .seq = seq, .sessions = ss, .n_seqs = 1,
                              .n_out = out ? m : 1, .out_rows = out ? rows : rows + m - 1, .out_logits = dst,
                              .out_argmax = am};
        if (!out) dst[m - 1] = NULL;
        rc = be->forward(be, &b, err, errlen);
        free(am);
    }
    free(pos); free(seq); free(rows); free(dst);
    return rc;
}

static int argmax_row(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static float top_margin(const float *x, int n) {
    const int b = argmax_row(x, n);
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && x[i] > second) second = x[i];
    return x[b] - second;
}

static double rel_err(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        const double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

/* prompt logits (n × V) and the greedy continuation of a short prompt */
struct run_out {
    float *logits;
    int32_t *greedy;
};

static int run_model(struct backend *be, struct backend_session *s, const struct model_config *c, const int32_t *prompt,
                     int n, int n_pg, int ng, struct run_out *o, char *err, size_t errlen) {
    const int V = c->vocab;
    be->session_reset(be, s);
    int rc = feed(be, s, prompt, n, 0, o->logits, V, err, errlen);
    if (rc || ng <= 0) return rc;
    /* greedy after the first n_pg prompt tokens (a fresh pass: the prompt prefix) */
    be->session_reset(be, s);
    float *row = malloc((size_t)V * 4);
    rc = feed(be, s, prompt, n_pg, 0, NULL, V, err, errlen);
    int32_t tok = argmax_row(o->logits + (size_t)(n_pg - 1) * V, V);
    for (int i = 0; i < ng && !rc; i++) {
        o->greedy[i] = tok;
        rc = feed(be, s, &tok, 1, n_pg + i, row, V, err, errlen);
        tok = argmax_row(row, V);
    }
    free(row);
    return rc;
}

/* every norm gain of the model, as (pointer, length) */
struct gain { float *p; int n; unsigned kind; };

static int collect_gains(struct model_weights *w, const struct model_config *c, struct gain *g) {
    int k = 0;
    for (int l = 0; l < c->n_layers; l++) {
        struct layer_weights *L = &w->layers[l];
        g[k++] = (struct gain){L->in_norm, c->hidden, 1};
        g[k++] = (struct gain){L->post_norm, c->hidden, 2};
        if (L->kind == LAYER_ATTENTION) {
            g[k++] = (struct gain){L->attn.q_norm, c->head_dim, 4};
            g[k++] = (struct gain){L->attn.k_norm, c->head_dim, 4};
        } else {
            g[k++] = (struct gain){L->gdn.norm, c->lin_v_dim, 8};
        }
    }
    g[k++] = (struct gain){w->final_norm, c->hidden, 16};
    return k;
}

/* zero scales and biases for a qmat: its dequantized weights are all 0 */
static struct qmat zeroed(const struct qmat *m, uint16_t *zeros) {
    struct qmat z = *m;
    z.scales = zeros;
    z.biases = zeros;
    return z;
}

static bool measure(const char *where, const struct opts *o) {
    char err[512];
    struct tmodel m;
    const double t0 = now_seconds();
    if (tmodel_open(&m, where, err, sizeof err)) {
        CHECK(0, "%s: %s", where, err);
        return false;
    }
    const struct model_config *c = &m.cfg;
    const int V = c->vocab, n = o->positions, ng = o->n_greedy, npg = o->n_prompt_greedy;
    struct backend *cpu = NULL;
    struct backend_session *s = NULL;
    if (cpu_backend_create(&cpu, c, &m.w, 0, err, sizeof err) || cpu->session_create(cpu, n + ng + 8, &s, err, sizeof err)) {
        CHECK(0, "%s: backend: %s", where, err);
        if (cpu) cpu->destroy(cpu);
        tmodel_close(&m);
        return false;
    }
    int32_t *prompt = malloc((size_t)n * 4);
    prompt_tokens(prompt, n, V, 7);
    struct run_out ref = {malloc((size_t)n * V * 4), malloc((size_t)ng * 4)};
    struct run_out got = {malloc((size_t)n * V * 4), malloc((size_t)ng * 4)};
    int rc = run_model(cpu, s, c, prompt, n, npg, ng, &ref, err, sizeof err);
    CHECK(rc == 0, "%s: %s", where, err);
    const double t_run = now_seconds() - t0;

    /* margins and finiteness of the reference */
    bool finite = true;
    for (size_t i = 0; i < (size_t)n * V; i++) finite &= isfinite(ref.logits[i]) != 0;
    CHECK(finite, "%s: non-finite logits", where);
    float *mg = malloc((size_t)n * 4);
    double lstd = 0;
    float *zs = malloc((size_t)n * 4);
    int small_margin = 0;
    for (int i = 0; i < n; i++) {
        mg[i] = top_margin(ref.logits + (size_t)i * V, V);
        small_margin += mg[i] < 0.1f;
        double s2 = 0, s1 = 0;
        for (int v = 0; v < V; v++) { s1 += ref.logits[(size_t)i * V + v]; s2 += (double)ref.logits[(size_t)i * V + v] * ref.logits[(size_t)i * V + v]; }
        const double sd = sqrt(s2 / V - (s1 / V) * (s1 / V));
        lstd += sd / n;
        zs[i] = (float)((ref.logits[(size_t)i * V + argmax_row(ref.logits + (size_t)i * V, V)] - s1 / V) / sd);
        mg[i] /= (float)sd;
    }
    for (int i = 1; i < n; i++) /* insertion sort for the median */
        for (int j = i; j > 0 && mg[j] < mg[j - 1]; j--) { float t = mg[j]; mg[j] = mg[j - 1]; mg[j - 1] = t; }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && zs[j] < zs[j - 1]; j--) { float t = zs[j]; zs[j] = zs[j - 1]; zs[j - 1] = t; }
    int distinct = 0;
    for (int i = 0; i < ng; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= ref.greedy[j] == ref.greedy[i];
        distinct += !seen;
    }
    printf("%s: %d layers, hidden %d, %d experts top-%d; logits std %.2f; top-1 z-score median %.2f (10%% %.2f); "
           "top-1 margin / std median %.3f (10%% %.3f), %d/%d positions < 0.1 absolute; greedy %d distinct of %d (%.1f s per pass)\n",
           where, c->n_layers, c->hidden, c->n_experts, c->n_experts_per_tok, lstd, zs[n / 2], zs[n / 10], mg[n / 2], mg[n / 10],
           small_margin, n, distinct, ng, t_run);
    free(mg);
    free(zs);

    /* (a), (b): perturbed norm gains */
    struct gain g[4 * MAX_LAYERS + 2];
    const int n_gain = collect_gains(&m.w, c, g);
    size_t total = 0;
    for (int k = 0; k < n_gain; k++) total += (size_t)g[k].n;
    float *saved = malloc(total * 4);
    int greedy_min = ng, agree_min = n;
    double err_max = 0;
    printf("  perturbed gains (eps %.0e):", (double)o->eps);
    for (int d = 0; d < o->draws && !rc; d++) {
        rng_state = 0x1234567ull + 977ull * (uint64_t)d;
        size_t off = 0;
        for (int k = 0; k < n_gain; k++)
            for (int i = 0; i < g[k].n; i++) {
                saved[off++] = g[k].p[i];
                const double r = rng_normal();
                if (o->perturb & g[k].kind) g[k].p[i] *= (float)(1.0 + o->eps * r);
            }
        rc = run_model(cpu, s, c, prompt, n, npg, ng, &got, err, sizeof err);
        off = 0;
        for (int k = 0; k < n_gain; k++)
            for (int i = 0; i < g[k].n; i++) g[k].p[i] = saved[off++];
        CHECK(rc == 0, "%s: %s", where, err);
        int same = 0, agree = 0, first_diff = -1;
        double e = 0;
        for (int i = 0; i < ng; i++) {
            same += got.greedy[i] == ref.greedy[i];
            if (first_diff < 0 && got.greedy[i] != ref.greedy[i]) first_diff = i;
        }
        for (int i = 0; i < n; i++) {
            agree += argmax_row(got.logits + (size_t)i * V, V) == argmax_row(ref.logits + (size_t)i * V, V);
            e += rel_err(got.logits + (size_t)i * V, ref.logits + (size_t)i * V, (size_t)V) / n;
        }
        printf(" [greedy %d/%d (first diff %d), top-1 %d/%d, rel err %.4f]", same, ng, first_diff, agree, n, e);
        if (same < greedy_min) greedy_min = same;
        if (agree < agree_min) agree_min = agree;
        if (e > err_max) err_max = e;
    }
    printf("\n  (a) greedy min %d/%d   (b) top-1 min %d/%d = %.1f %%, rel err max %.4f\n", greedy_min, ng, agree_min, n,
           100.0 * agree_min / n, err_max);
    free(saved);

    /* (c): ablate one layer's residual branches */
    size_t zlen = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *L = &m.w.layers[l];
        const struct qmat *q[4] = {L->kind == LAYER_ATTENTION ? &L->attn.o : &L->gdn.out, &L->moe.down, &L->moe.sh_down, NULL};
        for (int k = 0; k < 3; k++) {
            const size_t sz = (size_t)q[k]->rows * q[k]->n_mats * qmat_row_groups(q[k]);
            if (sz > zlen) zlen = sz;
        }
    }
    uint16_t *zeros = calloc(zlen, 2);
    double abl_min = INFINITY;
    const int n_abl = o->ablate_layers < c->n_layers ? o->ablate_layers : c->n_layers;
    printf("  (c) layer ablated: rel change of logits (%s), top-1 kept\n", o->ablate_modes >= 3 ? "mixer+moe / mixer / moe" : "mixer+moe");
    for (int a = 0; a < n_abl && !rc; a++) {
        const int l = n_abl == c->n_layers ? a : (int)((long)a * (c->n_layers - 1) / (n_abl - 1 > 0 ? n_abl - 1 : 1));
        struct layer_weights *L = &m.w.layers[l];
        struct qmat *mix = L->kind == LAYER_ATTENTION ? &L->attn.o : &L->gdn.out;
        const struct qmat smix = *mix, sdown = L->moe.down, ssh = L->moe.sh_down;
        double ch[3] = {0};
        int kept = 0;
        for (int mode = 0; mode < o->ablate_modes && !rc; mode++) {
            if (mode != 2) *mix = zeroed(&smix, zeros);
            if (mode != 1) { L->moe.down = zeroed(&sdown, zeros); L->moe.sh_down = zeroed(&ssh, zeros); }
            rc = run_model(cpu, s, c, prompt, n, npg, 0, &got, err, sizeof err);
            *mix = smix;
            L->moe.down = sdown;
            L->moe.sh_down = ssh;
            for (int i = 0; i < n; i++) {
                ch[mode] += rel_err(got.logits + (size_t)i * V, ref.logits + (size_t)i * V, (size_t)V) / n;
                if (mode == 0) kept += argmax_row(got.logits + (size_t)i * V, V) == argmax_row(ref.logits + (size_t)i * V, V);
            }
        }
        CHECK(rc == 0, "%s: %s", where, err);
        if (o->ablate_modes >= 3)
            printf("    layer %2d (%s): %.3f / %.3f / %.3f, top-1 kept %d/%d\n", l, L->kind == LAYER_ATTENTION ? "attn" : "gdn ",
                   ch[0], ch[1], ch[2], kept, n);
        else
            printf("    layer %2d (%s): %.3f, top-1 kept %d/%d\n", l, L->kind == LAYER_ATTENTION ? "attn" : "gdn ", ch[0], kept, n);
        if (ch[0] < abl_min) abl_min = ch[0];
    }
    printf("  (c) smallest change when a layer is zeroed: %.3f\n", abl_min);
    free(zeros);
    printf("  %s: %.1f s in all\n", where, now_seconds() - t0);

    bool ok = greedy_min >= ng - 1 && agree_min * 100 >= 99 * n && abl_min > 0.10;
    if (o->assert_criteria) {
        CHECK(greedy_min >= ng - 1, "%s: greedy %d/%d under eps %.0e", where, greedy_min, ng, (double)o->eps);
        CHECK(agree_min * 100 >= 99 * n, "%s: top-1 %d/%d under eps %.0e", where, agree_min, n, (double)o->eps);
        CHECK(abl_min > 0.10, "%s: a layer changes the logits by only %.3f", where, abl_min);
    }
    free(prompt);
    free(ref.logits); free(ref.greedy); free(got.logits); free(got.greedy);
    cpu->session_destroy(cpu, s);
    cpu->destroy(cpu);
    tmodel_close(&m);
    return ok;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct opts o = {.positions = 256, .draws = 3, .n_greedy = 32, .n_prompt_greedy = 40, .ablate_layers = 1000, .ablate_modes = 3,
                     .eps = 4e-3f, .assert_criteria = true, .perturb = 31};
    int first = 1;
    for (; first < argc && strncmp(argv[first], "--", 2) == 0; first++) {
        const char *a = argv[first];
        if (!strcmp(a, "--no-assert")) { o.assert_criteria = false; continue; }
        if (first + 1 >= argc) { fprintf(stderr, "%s needs a value\n", a); return 2; }
        const char *v = argv[++first];
        if (!strcmp(a, "--positions")) o.positions = atoi(v);
        else if (!strcmp(a, "--draws")) o.draws = atoi(v);
        else if (!strcmp(a, "--eps")) o.eps = strtof(v, NULL);
        else if (!strcmp(a, "--ablate-layers")) o.ablate_layers = atoi(v);
        else if (!strcmp(a, "--ablate-modes")) o.ablate_modes = atoi(v);
        else if (!strcmp(a, "--perturb")) o.perturb = (unsigned)strtoul(v, NULL, 0);
        else { fprintf(stderr, "unknown option %s\n", a); return 2; }
    }
    if (o.positions < o.n_prompt_greedy) o.n_prompt_greedy = o.positions;
    if (first < argc) {
        for (int i = first; i < argc; i++) measure(argv[i], &o);
        return check_summary();
    }
    /* make test: tiny in full, small with whole-layer ablations of its first, a middle and
     * its last layer. Under ASan (scalar code ~10x slower) only the code paths run, on
     * a few tokens, without the criteria. */
    if (UNDER_ASAN) {
        struct opts a = {.positions = 8, .draws = 1, .n_greedy = 4, .n_prompt_greedy = 8, .ablate_layers = 2,
                         .ablate_modes = 1, .eps = o.eps, .assert_criteria = false, .perturb = o.perturb};
        measure("synth:tiny", &a);
        return check_summary();
    }
    measure("synth:tiny", &o);
    o.ablate_layers = 3;
    o.ablate_modes = 1;
    measure("synth:small", &o);
    return check_summary();
}
