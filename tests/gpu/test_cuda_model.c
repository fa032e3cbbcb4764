/* tests/gpu/test_cuda_model.c — the CUDA backend as a whole, against the CPU backend and
 * against itself (split from test_cuda_ops.c, whose part 1 tests the ops one by one).
 *
 * Part 2, end to end: the tiny checkpoint written by tools/make_test_model.py
 * (ORCHID_GPU_TINY, default .cache/gpu_models/tiny) and the in-memory synthetic
 * "small" shape: prompt logits (tensor-core prefill), teacher-forced decode and 32
 * greedy tokens (CUDA-graph loop) against the CPU backend; chunked prefill and a
 * two-sequence batch against single-sequence runs.
 * The end-to-end criteria are calibrated on the reference itself: the CPU is rerun with
 * every input-norm gain multiplied by (1 + 4e-3·N(0,1)) — about the combined size of a
 * GPU layer's bf16 roundings — and the GPU must stay within what that does to the CPU
 * (prompt mean logits error <= 2x + 5e-3, top-1 agreement >= the perturbed CPU's - 2,
 * no teacher-forced flip where the CPU's top-2 margin exceeds 0.1), and the brief's
 * ">= 31 of 32 greedy tokens identical" holds (the test models are stable under that
 * noise: docs/PERFORMANCE.md "Test models").
 * Part 3 (ORCHID_GPU_FULL=1): the full 35B-A3B shape (synthetic, in memory), 256
 * teacher-forced positions: GPU and CPU top-1 agree on >= 99 % (the brief's bar; the test
 * models are built to be stable under bf16-sized noise, tests/unit/test_model_stability.c)
 * and the mean logits error stays within 2x the perturbed CPU's own + 5e-3.
 * Part 4, state transfer: the prefix-checkpoint hooks (save after a prefix, restore into
 * a fresh session, continue: logits equal to the uninterrupted session) and
 * prefix_cache_save/restore through the engine on the CUDA backend.
 * Ends with "N passed, N failed". */
#include <math.h>

#include "check.h"
#include "gpu_common.h"
#include "model/engine.h"
#include "model/prefix_cache.h"
#include "model/sampler.h"

#define SENS_EPS 4e-3f
#define SENS_REPS 8 /* perturbation draws of the reference sensitivity (cpu_sensitivity) */

/* ---- end to end ---- */

static void prompt_tokens(int32_t *p, int n, int vocab, uint32_t salt) {
    for (int i = 0; i < n; i++) p[i] = (int32_t)((((uint64_t)(i + salt) * 2654435761u) & 0xffffffffu) % (uint64_t)vocab);
}

/* Largest |a - b| / max|b| over n floats; 0 when bitwise equal. */
static double max_rel(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = fabs((double)a[i] - b[i]);
        if (x > d) d = x;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return m > 0 ? d / m : d;
}

static void test_e2e(const char *where, int n_prompt, int n_greedy) {
    char err[512];
    struct tmodel m;
    const double t0 = now_seconds();
    if (tmodel_open(&m, where, err, sizeof err)) { CHECK(0, "%s: %s", where, err); return; }
    const int V = m.cfg.vocab;
    struct backend *cpu = NULL, *gpu = NULL;
    if (cpu_backend_create(&cpu, &m.cfg, &m.w, 0, err, sizeof err) || cuda_backend_create(&gpu, &m.cfg, &m.w, err, sizeof err)) {
        CHECK(0, "%s: backend: %s", where, err);
        if (cpu) cpu->destroy(cpu);
        tmodel_close(&m);
        return;
    }
    const int cap = n_prompt + n_greedy + 8;
    struct backend_session *sc, *sg, *sg2;
    int rc = cpu->session_create(cpu, cap, &sc, err, sizeof err);
    if (!rc) rc = gpu->session_create(gpu, cap, &sg, err, sizeof err);
    if (!rc) rc = gpu->session_create(gpu, cap, &sg2, err, sizeof err);
    if (rc) { CHECK(0, "%s: session: %s", where, err); goto out; }
    int32_t *prompt = malloc((size_t)n_prompt * 4);
    prompt_tokens(prompt, n_prompt, V, 7);
    float *lc = malloc((size_t)n_prompt * V * 4), *lg = malloc((size_t)n_prompt * V * 4);
    /* teacher-forced logits of every prompt position */
    rc = feed(cpu, sc, prompt, n_prompt, 0, 0, lc, V, err, sizeof err);
    CHECK(rc == 0, "%s cpu prefill: %s", where, err);
    rc = feed(gpu, sg, prompt, n_prompt, 0, 0, lg, V, err, sizeof err);
    CHECK(rc == 0, "%s cuda prefill: %s", where, err);
    int agree = 0;
    double worst = 0, sum = 0;
    for (int i = 0; i < n_prompt; i++) {
        const int a = argmax_row(lc + (size_t)i * V, V), b = argmax_row(lg + (size_t)i * V, V);
        agree += a == b;
        const double e = rel_err(lg + (size_t)i * V, lc + (size_t)i * V, (size_t)V);
        if (a != b)
            printf("    prompt position %d: cpu %d (margin %.4f) vs cuda %d, logits rel err %.3g\n", i, a,
                   top_margin(lc + (size_t)i * V, V), b, e);
        if (e > worst) worst = e;
        sum += e;
    }
    printf("  %s: prompt %d tokens, top-1 agreement %d/%d, logits rel err mean %.3g worst %.3g\n", where, n_prompt, agree,
           n_prompt, sum / n_prompt, worst);
    if (!rc && n_prompt >= 2 && n_prompt <= gpu->max_batch_tokens) { /* the prompt's rows scored on the device */
        const int n_out = n_prompt - 1;
        int32_t *pos = malloc((size_t)n_prompt * 4), *seq = calloc((size_t)n_prompt, 4), *rows = malloc((size_t)n_out * 4);
        float **dst = calloc((size_t)n_out, sizeof *dst);
        struct row_score_req *req = malloc((size_t)n_out * sizeof *req);
        struct sample_result *got = malloc((size_t)n_out * sizeof *got), want;
        for (int i = 0; i < n_prompt; i++) pos[i] = i;
        for (int i = 0; i < n_out; i++) {
            rows[i] = i;
            req[i] = (struct row_score_req){prompt[i + 1], i % 3 ? 5 : 20};
        }
        req[n_out / 2].token = -1; /* a row in the middle not scored: it wants its argmax only */
        int32_t *amax = malloc((size_t)n_out * 4);
        struct backend_session *ss[1] = {sg2};
        const struct fwd_batch b = {.n_tokens = n_prompt, .tokens = prompt, .pos = pos, .seq = seq, .sessions = ss, .n_seqs = 1,
                                    .n_out = n_out, .out_rows = rows, .out_logits = dst, .out_argmax = amax, .out_score = req,
                                    .out_scores = got};
        gpu->session_reset(gpu, sg2);
        rc = gpu->forward(gpu, &b, err, sizeof err);
        CHECK(rc == 0, "%s cuda scored prefill: %s", where, err);
        int bad = 0;
        for (int i = 0; !rc && i < n_out; i++) {
            if (req[i].token < 0) continue;
            sampler_row_logprobs(lg + (size_t)i * V, V, req[i].token, req[i].n_top, &want); /* the backend's own logits */
            int d = got[i].token != want.token || got[i].n_top != want.n_top ||
                    fabsf(got[i].logprob - want.logprob) > 2e-6f * fmaxf(1.0f, fabsf(want.logprob));
            for (int k = 0; !d && k < want.n_top; k++)
                d = got[i].top_ids[k] != want.top_ids[k] ||
                    fabsf(got[i].top_logprobs[k] - want.top_logprobs[k]) > 2e-6f * fmaxf(1.0f, fabsf(want.top_logprobs[k]));
            if (d && bad < 3)
                printf("    scored row %d: token %d logprob %.7g vs %.7g, top id %d vs %d\n", i, got[i].token, got[i].logprob,
                       want.logprob, got[i].n_top ? got[i].top_ids[0] : -1, want.n_top ? want.top_ids[0] : -1);
            bad += d;
        }
        CHECK(bad == 0, "%s: %d of %d prompt rows scored on the device differ from their logits' host scores", where, bad, n_out);
        const int a_mid = argmax_row(lg + (size_t)(n_out / 2) * V, V);
        CHECK(rc || amax[n_out / 2] == a_mid, "%s: the unscored row's argmax %d, its logits' %d", where, amax[n_out / 2], a_mid);
        free(pos); free(seq); free(rows); free(dst); free(req); free(got); free(amax);
        rc = 0;
    }
    const double mean_err = sum / n_prompt;
    /* greedy continuation: CPU host loop vs CUDA graph loop */
    const int32_t first = argmax_row(lc + (size_t)(n_prompt - 1) * V, V);
    int32_t *ic = malloc((size_t)n_greedy * 4), *ig = malloc((size_t)n_greedy * 4);
    float *lcd = malloc((size_t)n_greedy * V * 4);
    rc = greedy_host(cpu, sc, n_prompt, first, n_greedy, ic, V, lcd, err, sizeof err);
    CHECK(rc == 0, "%s cpu greedy: %s", where, err);
    rc = gpu->decode_greedy(gpu, sg, n_prompt, first, n_greedy, ig, NULL, err, sizeof err);
    CHECK(rc == 0, "%s cuda greedy: %s", where, err);
    int same = 0;
    for (int i = 0; i < n_greedy; i++) same += ic[i] == ig[i];
    printf("  %s: greedy %d/%d identical\n", where, same, n_greedy);
    /* What bf16-sized noise does to this model, measured on the reference itself. */
    struct sensitivity sens;
    /* 8 draws: the largest of 3 varied from 0.0095 to 0.030 on the tiny model between runs
     * (fresh seeds), and a low one failed the prompt check below with the GPU's logits
     * unchanged (session 17) */
    rc = cpu_sensitivity(cpu, &m.w, &m.cfg, prompt, n_prompt, lc, first, ic, n_greedy, SENS_EPS, SENS_REPS, &sens, err,
                         sizeof err);
    CHECK(rc == 0, "%s cpu sensitivity: %s", where, err);
    printf("  %s: cpu with gains perturbed by %.0e (%d draws): prompt mean rel err <= %.3g, top-1 >= %d/%d, greedy >= %d/%d\n",
           where, (double)SENS_EPS, SENS_REPS, sens.mean_err_max, sens.agree_min, n_prompt, sens.greedy_min, n_greedy);
    CHECK(mean_err <= 2 * sens.mean_err_max + 5e-3, "%s: prompt logits mean rel err %.3g > 2 x the reference's own %.3g",
          where, mean_err, sens.mean_err_max);
    CHECK(agree >= sens.agree_min - 2, "%s: prompt top-1 agreement %d/%d below the perturbed reference's %d", where, agree,
          n_prompt, sens.agree_min);
    /* the brief's criterion, unconditional: the test models keep >= 31/32 under this noise
     * themselves (tests/unit/test_model_stability.c asserts it on the CPU) */
    CHECK(same >= n_greedy - 1, "%s: greedy tokens %d/%d identical (perturbed cpu keeps %d/%d)", where, same, n_greedy,
          sens.greedy_min, n_greedy);
    /* teacher-forced decode: the CPU's greedy tokens fed to the CUDA backend one at a time */
    {
        gpu->session_reset(gpu, sg2);
        rc = feed(gpu, sg2, prompt, n_prompt, 0, 0, NULL, V, err, sizeof err);
        float *lt = malloc((size_t)V * 4);
        int tf = 0, tf_sure = 0;
        double tw = 0;
        for (int i = 0; i < n_greedy && !rc; i++) {
            const int32_t tok = i ? ic[i - 1] : first;
            rc = feed(gpu, sg2, &tok, 1, n_prompt + i, 0, lt, V, err, sizeof err);
            const int a = argmax_row(lcd + (size_t)i * V, V), b = argmax_row(lt, V);
            const double e = rel_err(lt, lcd + (size_t)i * V, (size_t)V);
            if (e > tw) tw = e;
            tf += a == b;
            if (a != b) {
                const float mg = top_margin(lcd + (size_t)i * V, V);
                printf("    decode step %d: cpu %d (margin %.4f) vs cuda %d, logits rel err %.3g\n", i, a, mg, b, e);
                tf_sure += mg > 0.1f; /* a flip of a clear winner would be an error, a near-tie is noise */
            }
        }
        CHECK(rc == 0, "%s teacher-forced decode: %s", where, err);
        printf("  %s: teacher-forced decode top-1 %d/%d, worst logits rel err %.3g\n", where, tf, n_greedy, tw);
        CHECK(tf_sure == 0, "%s: teacher-forced decode: %d disagreements where the cpu margin exceeds 0.1", where, tf_sure);
        CHECK(tf >= n_greedy * 8 / 10, "%s: teacher-forced decode top-1 %d/%d", where, tf, n_greedy);
        free(lt);
    }
    /* CUDA self-consistency: a second session fed in chunks of 5 + the host loop = the first */
    gpu->session_reset(gpu, sg2);
    float *l2 = malloc((size_t)V * 4);
    rc = 0;
    for (int i0 = 0; i0 < n_prompt && !rc; i0 += 5) {
        const int n = n_prompt - i0 < 5 ? n_prompt - i0 : 5;
        rc = feed(gpu, sg2, prompt + i0, n, i0, n - 1, l2, V, err, sizeof err);
    }
    CHECK(rc == 0, "%s chunked prefill: %s", where, err);
    const double ec = rel_err(l2, lg + (size_t)(n_prompt - 1) * V, (size_t)V);
    printf("  %s: prefill in chunks of 5 (GEMV path) vs one batch (tensor-core path): last logits rel err %.3g\n", where, ec);
    CHECK(ec <= 2 * sens.mean_err_max + 2e-2, "%s: chunked prefill last logits rel err %.3g", where, ec);
    int32_t *ih = malloc((size_t)n_greedy * 4);
    rc = greedy_host(gpu, sg2, n_prompt, first, 8, ih, V, NULL, err, sizeof err);
    CHECK(rc == 0, "%s cuda host greedy: %s", where, err);
    int same2 = 0;
    for (int i = 0; i < 8; i++) same2 += ih[i] == ig[i];
    CHECK(same2 >= 7, "%s: cuda forward loop vs graph loop: %d/8 identical", where, same2);
    /* two sequences in one batch vs alone: reset both, feed prompt A to s1 and B to s2 together */
    {
        gpu->session_reset(gpu, sg);
        gpu->session_reset(gpu, sg2);
        const int na = n_prompt, nb = n_prompt / 2 + 1;
        int32_t *tok = malloc((size_t)(na + nb) * 4), *pos = malloc((size_t)(na + nb) * 4), *seq = malloc((size_t)(na + nb) * 4);
        memcpy(tok, prompt, (size_t)na * 4);
        prompt_tokens(tok + na, nb, V, 99);
        for (int i = 0; i < na; i++) { pos[i] = i; seq[i] = 0; }
        for (int i = 0; i < nb; i++) { pos[na + i] = i; seq[na + i] = 1; }
        float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4), *lb1 = malloc((size_t)V * 4);
        int32_t rows[2] = {na - 1, na + nb - 1};
        float *dst[2] = {la, lb};
        struct backend_session *ss[2] = {sg, sg2};
        struct fwd_batch b = {.n_tokens = na + nb, .tokens = tok, .pos = pos, .seq = seq, .sessions = ss, .n_seqs = 2,
                              .n_out = 2, .out_rows = rows, .out_logits = dst};
        rc = gpu->forward(gpu, &b, err, sizeof err);
        CHECK(rc == 0, "%s two-sequence batch: %s", where, err);
        const double ea = rel_err(la, lg + (size_t)(na - 1) * V, (size_t)V);
        gpu->session_reset(gpu, sg2);
        rc = feed(gpu, sg2, tok + na, nb, 0, nb - 1, lb1, V, err, sizeof err);
        const double eb = rel_err(lb, lb1, (size_t)V);
        printf("  %s: two sequences in one batch vs alone: rel err %.3g / %.3g\n", where, ea, eb);
        CHECK(ea <= 3e-2 && eb <= 3e-2, "%s: batched vs alone rel err %.3g / %.3g", where, ea, eb);
        free(tok); free(pos); free(seq); free(la); free(lb); free(lb1);
    }
    printf("  %s: done in %.1f s\n", where, now_seconds() - t0);
    free(prompt); free(lc); free(lg); free(ic); free(ig); free(l2); free(ih); free(lcd);
    gpu->session_destroy(gpu, sg);
    gpu->session_destroy(gpu, sg2);
    cpu->session_destroy(cpu, sc);
out:
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    tmodel_close(&m);
}


/* The test model `shape` (tmodel_open) and a CUDA backend on it; a failure is a failed
 * check, and nothing is left open. */
static int open_gpu(const char *shape, struct tmodel *m, struct backend **gpu) {
    char err[512];
    *gpu = NULL;
    if (tmodel_open(m, shape, err, sizeof err)) {
        CHECK(0, "%s: %s", shape, err);
        return -1;
    }
    if (cuda_backend_create(gpu, &m->cfg, &m->w, err, sizeof err)) {
        CHECK(0, "%s: backend: %s", shape, err);
        tmodel_close(m);
        return -1;
    }
    return 0;
}

/* ---- decode batch invariance (issue 6): each of n_seq sequences prefilled alone, then
 * greedy decode steps alone (one token a forward: cuda_tcv.cu's path, norms in the launch
 * tails) and all n_seq together (one token each: the 2..64-token path — skinny or wide
 * kernels, the rmsnorm kernel, the grouped MoE): every step's logits must be the same bits.
 * Prompts of different lengths, so the attention's key splits differ per sequence. ---- */
static void test_decode_invariance(const char *shape, int n_seq, int n_steps) {
    char err[512];
    struct tmodel m;
    struct backend *gpu;
    if (open_gpu(shape, &m, &gpu)) return;
    const int V = m.cfg.vocab, cap = 200;
    struct backend_session **ss = calloc((size_t)n_seq, sizeof *ss);
    int *plen = malloc((size_t)n_seq * sizeof(int));
    int32_t *prompts = malloc((size_t)n_seq * 64 * 4), *tok = malloc((size_t)n_seq * 4), *pos = malloc((size_t)n_seq * 4);
    int32_t *seq = malloc((size_t)n_seq * 4), *rows = malloc((size_t)n_seq * 4);
    float *alone = malloc((size_t)n_seq * n_steps * V * 4), *last = malloc((size_t)n_seq * V * 4);
    float **dst = malloc((size_t)n_seq * sizeof(float *));
    int rc = 0, bad_steps = 0, diverged = 0;
    double worst = 0;
    for (int i = 0; i < n_seq && !rc; i++) {
        rc = gpu->session_create(gpu, cap, &ss[i], err, sizeof err);
        plen[i] = 3 + (i * 37) % 61; /* 3..63 tokens: 2..64-token prefill chunks, alone */
        prompt_tokens(prompts + (size_t)i * 64, plen[i], V, 1000u + (uint32_t)i);
    }
    /* alone: prefill, then n_steps greedy steps of one token */
    for (int i = 0; i < n_seq && !rc; i++) {
        rc = feed(gpu, ss[i], prompts + (size_t)i * 64, plen[i], 0, plen[i] - 1, last + (size_t)i * V, V, err, sizeof err);
        for (int k = 0; k < n_steps && !rc; k++) {
            const int32_t t = argmax_row(k ? alone + ((size_t)i * n_steps + k - 1) * V : last + (size_t)i * V, V);
            rc = feed(gpu, ss[i], &t, 1, plen[i] + k, 0, alone + ((size_t)i * n_steps + k) * V, V, err, sizeof err);
        }
    }
    /* together: the same prefills (alone), then the steps as one batch of n_seq tokens */
    for (int i = 0; i < n_seq && !rc; i++) {
        gpu->session_reset(gpu, ss[i]);
        rc = feed(gpu, ss[i], prompts + (size_t)i * 64, plen[i], 0, plen[i] - 1, last + (size_t)i * V, V, err, sizeof err);
        tok[i] = argmax_row(last + (size_t)i * V, V);
    }
    float *got = malloc((size_t)n_seq * V * 4);
    for (int k = 0; k < n_steps && !rc; k++) {
        for (int i = 0; i < n_seq; i++) {
            pos[i] = plen[i] + k;
            seq[i] = i;
            rows[i] = i;
            dst[i] = got + (size_t)i * V;
        }
        struct fwd_batch b = {.n_tokens = n_seq, .tokens = tok, .pos = pos, .seq = seq, .sessions = ss, .n_seqs = n_seq,
                              .n_out = n_seq, .out_rows = rows, .out_logits = dst};
        rc = gpu->forward(gpu, &b, err, sizeof err);
        int differ = 0;
        for (int i = 0; i < n_seq && !rc; i++) {
            const float *a = alone + ((size_t)i * n_steps + k) * V;
            if (memcmp(a, got + (size_t)i * V, (size_t)V * 4)) {
                differ++;
                const double e = max_rel(got + (size_t)i * V, a, (size_t)V);
                if (e > worst) worst = e;
            }
            tok[i] = argmax_row(got + (size_t)i * V, V);
            diverged += tok[i] != argmax_row(a, V);
        }
        bad_steps += differ > 0;
    }
    CHECK(rc == 0, "%s: decode invariance: %s", shape, err);
    printf("  %s: %d sequences decoded together vs alone, %d steps: %d steps with differing logits (worst max rel %.3g), "
           "%d tokens diverged\n", shape, n_seq, n_steps, bad_steps, worst, diverged);
    CHECK(bad_steps == 0 && diverged == 0, "%s: %d sequences: batched decode differs from alone in %d of %d steps", shape,
          n_seq, bad_steps, n_steps);
    for (int i = 0; i < n_seq; i++)
        if (ss[i]) gpu->session_destroy(gpu, ss[i]);
    free(ss); free(plen); free(prompts); free(tok); free(pos); free(seq); free(rows); free(alone); free(last); free(dst);
    free(got);
    gpu->destroy(gpu);
    tmodel_close(&m);
}

/* One-token forwards replayed from a CUDA graph (the default) against the same
 * forwards launched kernel by kernel, bitwise: a 100-token prompt, then n_steps greedy steps
 * with logits rows (crossing 128 and 256 tokens: the graph's split count moves, a recapture),
 * then argmax-only steps and a step without outputs (other keys), each way from a fresh
 * session. */
static int fg_run(struct backend *gpu, struct backend_session *s, const int32_t *prompt, int n_prompt, int n_steps, int V,
                  float *logits, int32_t *ids, char *err, size_t errlen) {
    float *last = malloc((size_t)V * 4);
    int rc = feed(gpu, s, prompt, n_prompt, 0, n_prompt - 1, last, V, err, errlen);
    if (!rc) rc = greedy_host(gpu, s, n_prompt, argmax_row(last, V), n_steps, ids, V, logits, err, errlen);
    int pos = n_prompt + n_steps;
    int32_t tok = ids[n_steps - 1], row = 0, seq = 0;
    for (int k = 0; k < 8 && !rc; k++, pos++) { /* argmax only (no logits row), then one step with no outputs */
        struct backend_session *ss[1] = {s};
        float *dst[1] = {NULL};
        struct fwd_batch b = {.n_tokens = 1, .tokens = &tok, .pos = &pos, .seq = &seq, .sessions = ss, .n_seqs = 1,
                              .n_out = k < 7, .out_rows = &row, .out_logits = dst, .out_argmax = ids + n_steps + k};
        rc = gpu->forward(gpu, &b, err, errlen);
        if (k < 7) tok = ids[n_steps + k];
    }
    free(last);
    return rc;
}
static void test_forward_graph(const char *shape, int n_steps) {
    char err[512];
    struct tmodel m;
    struct backend *gpu;
    if (open_gpu(shape, &m, &gpu)) return;
    const int V = m.cfg.vocab, n_prompt = 100;
    int32_t *prompt = malloc((size_t)n_prompt * 4), *ids[2];
    float *lg[2];
    prompt_tokens(prompt, n_prompt, V, 4242u);
    int rc = 0;
    for (int g = 0; g < 2 && !rc; g++) {
        struct backend_session *s = NULL;
        ids[g] = calloc((size_t)n_steps + 8, 4);
        lg[g] = malloc((size_t)n_steps * V * 4);
        cuda_backend_force_forward_graph(g);
        rc = gpu->session_create(gpu, n_prompt + n_steps + 16, &s, err, sizeof err);
        if (!rc) rc = fg_run(gpu, s, prompt, n_prompt, n_steps, V, lg[g], ids[g], err, sizeof err);
        if (s) gpu->session_destroy(gpu, s);
    }
    cuda_backend_force_forward_graph(-1);
    CHECK(rc == 0, "%s: forward graph: %s", shape, err);
    if (!rc) {
        int steps = 0, idd = 0;
        for (int k = 0; k < n_steps; k++) steps += memcmp(lg[0] + (size_t)k * V, lg[1] + (size_t)k * V, (size_t)V * 4) != 0;
        for (int k = 0; k < n_steps + 7; k++) idd += ids[0][k] != ids[1][k];
        CHECK(steps == 0 && idd == 0, "%s: the graph's one-token forwards differ from the launches in %d of %d logits rows, %d ids",
              shape, steps, n_steps, idd);
    }
    for (int g = 0; g < 2; g++) { free(ids[g]); free(lg[g]); }
    free(prompt);
    gpu->destroy(gpu);
    tmodel_close(&m);
}

/* Packed prompt chunks (the scheduler's batch-invariant packing, sched_plan_invariant):
 * n_seq prompts of 165..200 tokens fed in two chunks each (100, then the rest: both
 * over 64 tokens, so the prefill kernels), first each sequence alone, then the chunks
 * of all sequences in one forward per round, each chunk's last row asked for. Every
 * sequence's logits must be the same bits both ways (the GEMMs compute a row the same
 * at any row count; the scan and attention work per sequence; the lm_head's 1-row and
 * n-row forms are the decode-invariance test's); then one decode step together. */
static void test_prefill_pack_invariance(const char *shape, int n_seq) {
    char err[512];
    struct tmodel m;
    struct backend *gpu;
    if (open_gpu(shape, &m, &gpu)) return;
    enum { C1 = 100, PMAX = 200 };
    const int V = m.cfg.vocab;
    struct backend_session **ss = calloc((size_t)n_seq, sizeof *ss);
    int *plen = malloc((size_t)n_seq * sizeof(int));
    int32_t *prompts = malloc((size_t)n_seq * PMAX * 4);
    const int tmax = n_seq * PMAX;
    int32_t *tok = malloc((size_t)tmax * 4), *pos = malloc((size_t)tmax * 4), *seq = malloc((size_t)tmax * 4);
    int32_t *rows = malloc((size_t)n_seq * 4);
    float *alone = malloc((size_t)n_seq * 3 * V * 4), *got = malloc((size_t)n_seq * V * 4);
    float **dst = malloc((size_t)n_seq * sizeof(float *));
    int rc = 0, differ[3] = {0, 0, 0};
    double worst = 0;
    for (int i = 0; i < n_seq && !rc; i++) {
        rc = gpu->session_create(gpu, PMAX + 8, &ss[i], err, sizeof err);
        plen[i] = 165 + (i * 29) % 36;
        prompt_tokens(prompts + (size_t)i * PMAX, plen[i], V, 7000u + (uint32_t)i);
    }
    /* alone: chunk 1, chunk 2, then one greedy step; the last row of each */
    for (int i = 0; i < n_seq && !rc; i++) {
        const int32_t *p = prompts + (size_t)i * PMAX;
        float *a = alone + (size_t)i * 3 * V;
        rc = feed(gpu, ss[i], p, C1, 0, C1 - 1, a, V, err, sizeof err);
        if (!rc) rc = feed(gpu, ss[i], p + C1, plen[i] - C1, C1, plen[i] - C1 - 1, a + V, V, err, sizeof err);
        const int32_t t = argmax_row(a + V, V);
        if (!rc) rc = feed(gpu, ss[i], &t, 1, plen[i], 0, a + 2 * V, V, err, sizeof err);
    }
    for (int i = 0; i < n_seq; i++) gpu->session_reset(gpu, ss[i]);
    /* packed: round 0 = every first chunk in one forward, round 1 = every second chunk,
     * round 2 = one token each */
    for (int r = 0; r < 3 && !rc; r++) {
        int T = 0;
        for (int i = 0; i < n_seq; i++) {
            const int p0 = r == 0 ? 0 : r == 1 ? C1 : plen[i], n = r == 0 ? C1 : r == 1 ? plen[i] - C1 : 1;
            for (int k = 0; k < n; k++, T++) {
                tok[T] = r == 2 ? argmax_row(alone + ((size_t)i * 3 + 1) * V, V) : prompts[(size_t)i * PMAX + p0 + k];
                pos[T] = p0 + k;
                seq[T] = i;
            }
            rows[i] = T - 1;
            dst[i] = got + (size_t)i * V;
        }
        struct fwd_batch b = {.n_tokens = T, .tokens = tok, .pos = pos, .seq = seq, .sessions = ss, .n_seqs = n_seq,
                              .n_out = n_seq, .out_rows = rows, .out_logits = dst};
        rc = gpu->forward(gpu, &b, err, sizeof err);
        for (int i = 0; i < n_seq && !rc; i++) {
            const float *a = alone + ((size_t)i * 3 + r) * V;
            if (memcmp(a, got + (size_t)i * V, (size_t)V * 4)) {
                differ[r]++;
                const double e = max_rel(got + (size_t)i * V, a, (size_t)V);
                if (e > worst) worst = e;
            }
        }
    }
    CHECK(rc == 0, "%s: prefill packing: %s", shape, err);
    printf("  %s: %d prompts packed vs alone: sequences with differing logits after chunk 1 / chunk 2 / a step: "
           "%d / %d / %d (worst max rel %.3g)\n", shape, n_seq, differ[0], differ[1], differ[2], worst);
    CHECK(!differ[0] && !differ[1] && !differ[2], "%s: %d packed prompts differ from alone", shape, n_seq);
    for (int i = 0; i < n_seq; i++)
        if (ss[i]) gpu->session_destroy(gpu, ss[i]);
    free(ss); free(plen); free(prompts); free(tok); free(pos); free(seq); free(rows); free(alone); free(got); free(dst);
    gpu->destroy(gpu);
    tmodel_close(&m);
}

/* ---- session state transfer (prefix checkpoints) ---- */


/* Backend hooks: save after a prefix (KV in two segments, as the prefix cache stores a
 * child's rows past its parent), restore into a fresh session, continue with the same
 * batch shapes as the uninterrupted session: logits and greedy tokens must match
 * (bitwise expected; <= 1e-6 relative accepted). Then prefix_cache_save/restore
 * through the engine on the CUDA backend: resumed vs fed-from-scratch with the same
 * chunks, a branch off the shared prefix, and a miss. */
static void test_state_transfer(const char *shape, int async_save) {
    char err[512];
    cuda_backend_force_async_save(async_save); /* the saves queued beside the stream, or not: the same restores */
    struct tmodel m;
    struct backend *gpu;
    if (open_gpu(shape, &m, &gpu)) return;
    const int V = m.cfg.vocab, cap = 128, n1 = 37, n2 = 9, n_greedy = 8;
    CHECK(gpu->state_bytes && gpu->state_save && gpu->state_load && gpu->kv_bytes_per_token && gpu->kv_save && gpu->kv_load,
          "%s: cuda backend lacks state-transfer hooks", shape);
    struct backend_session *sa = NULL, *sb = NULL;
    int rc = gpu->session_create(gpu, cap, &sa, err, sizeof err);
    if (!rc) rc = gpu->session_create(gpu, cap, &sb, err, sizeof err);
    if (rc) { CHECK(0, "%s: session: %s", shape, err); goto out; }
    {
        int32_t p[64];
        prompt_tokens(p, n1 + n2, V, 3);
        const size_t sbytes = gpu->state_bytes(gpu), row = gpu->kv_bytes_per_token(gpu);
        char *st = malloc(sbytes), *kv = malloc((size_t)n1 * row);
        float *la = malloc((size_t)n2 * V * 4), *lb = malloc((size_t)n2 * V * 4);
        int32_t ia[8], ib[8];
        rc = feed(gpu, sa, p, n1, 0, n1, NULL, V, err, sizeof err);
        const int cut = 20; /* segments [0, 20) and [20, n1) */
        if (!rc) rc = gpu->state_save(gpu, sa, st, err, sizeof err);
        if (!rc) rc = gpu->kv_save(gpu, sa, 0, cut, kv, err, sizeof err);
        if (!rc) rc = gpu->kv_save(gpu, sa, cut, n1 - cut, kv + (size_t)cut * row, err, sizeof err);
        CHECK(rc == 0, "%s: save: %s", shape, err);
        rc = feed(gpu, sa, p + n1, n2, n1, 0, la, V, err, sizeof err);
        if (!rc) rc = gpu->decode_greedy(gpu, sa, n1 + n2, argmax_row(la + (size_t)(n2 - 1) * V, V), n_greedy, ia, NULL, err, sizeof err);
        CHECK(rc == 0, "%s: uninterrupted: %s", shape, err);
        /* sb: dirty it first with another sequence, so the restore must overwrite real state */
        int32_t q[30];
        prompt_tokens(q, 30, V, 77);
        rc = feed(gpu, sb, q, 30, 0, 30, NULL, V, err, sizeof err);
        gpu->session_reset(gpu, sb);
        if (!rc) rc = gpu->state_load(gpu, sb, st, err, sizeof err);
        if (!rc) rc = gpu->kv_load(gpu, sb, 0, cut, kv, err, sizeof err);
        if (!rc) rc = gpu->kv_load(gpu, sb, cut, n1 - cut, kv + (size_t)cut * row, err, sizeof err);
        if (!rc) rc = feed(gpu, sb, p + n1, n2, n1, 0, lb, V, err, sizeof err);
        if (!rc) rc = gpu->decode_greedy(gpu, sb, n1 + n2, argmax_row(lb + (size_t)(n2 - 1) * V, V), n_greedy, ib, NULL, err, sizeof err);
        CHECK(rc == 0, "%s: restored: %s", shape, err);
        const double e = max_rel(lb, la, (size_t)n2 * V);
        const bool bitwise = memcmp(la, lb, (size_t)n2 * V * 4) == 0;
        int same = 0;
        for (int i = 0; i < n_greedy; i++) same += ia[i] == ib[i];
        printf("  %s: state %zu B + KV %zu B/token; restored vs uninterrupted: %d continuation logits rows %s (max rel %.3g), "
               "greedy %d/%d\n", shape, sbytes, row, n2, bitwise ? "bitwise equal" : "differ", e, same, n_greedy);
        CHECK(e <= 1e-6, "%s: restored session logits max rel err %.3g", shape, e);
        CHECK(same == n_greedy, "%s: restored session greedy %d/%d", shape, same, n_greedy);
        free(st); free(kv); free(la); free(lb);
    }
out:
    if (sa) gpu->session_destroy(gpu, sa);
    if (sb) gpu->session_destroy(gpu, sb);
    gpu->destroy(gpu);
    tmodel_close(&m);

    /* the engine + prefix cache on the CUDA backend */
    struct synth_options so = {.shape = shape + 6, .seed = 1, .threads = 0, .quiet = true};
    struct synth_result res;
    safetensors *sts = NULL;
    char *cj = NULL;
    engine *e = NULL;
    if (synth_build_memory(&so, &sts, &cj, &res, err, sizeof err)) { CHECK(0, "%s: synth: %s", shape, err); return; }
    struct engine_options eo = {.model_dir = shape, .backend = "cuda", .quiet = true};
    rc = engine_open_checkpoint(&e, &eo, cj, strlen(cj), sts, err, sizeof err);
    free(cj);
    if (rc) { CHECK(0, "%s: engine: %s", shape, err); return; }
    prefix_cache *pc = NULL;
    session *s = NULL, *r = NULL;
    rc = prefix_cache_create(&pc, e, (size_t)1 << 30, err, sizeof err);
    if (!rc) rc = session_open(e, &s, cap, err, sizeof err);
    if (!rc) rc = session_open(e, &r, cap, err, sizeof err);
    if (rc) { CHECK(0, "%s: prefix cache: %s", shape, err); goto done; }
    {
        /* pinned state blocks ahead of time: the two saves below take them, no fresh allocation */
        const int warm = prefix_cache_prewarm(pc, 2);
        struct prefix_cache_stats w0;
        prefix_cache_get_stats(pc, &w0);
        CHECK(warm == 2 && w0.host_allocs == 2 && w0.pooled > 0, "%s: prewarm: %d blocks, %llu allocations, %zu B pooled",
              shape, warm, (unsigned long long)w0.host_allocs, w0.pooled);
        int32_t t[60], br[60];
        prompt_tokens(t, 60, V, 11);
        memcpy(br, t, 40 * 4);
        for (int i = 40; i < 60; i++) br[i] = (t[i] + 17) % V;
        float *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
        /* chunks: 40 (checkpoint), 8 (checkpoint), then the rest */
        struct batch_seq q = {.s = s, .tokens = t, .n_tokens = 40};
        rc = engine_forward(e, &q, 1, err, sizeof err);
        if (!rc) rc = prefix_cache_save(pc, s, err, sizeof err);
        q.tokens = t + 40; q.n_tokens = 8;
        if (!rc) rc = engine_forward(e, &q, 1, err, sizeof err);
        if (!rc) rc = prefix_cache_save(pc, s, err, sizeof err);
        CHECK(rc == 0, "%s: engine save: %s", shape, err);
        const int32_t *seqs[2] = {t, br};
        const int want[2] = {48, 40};
        for (int k = 0; k < 2; k++) {
            int matched = -1;
            rc = prefix_cache_restore(pc, s, seqs[k], 60, &matched, err, sizeof err);
            CHECK(rc == 0 && matched == want[k], "%s: restore %d: matched %d (want %d): %s", shape, k, matched, want[k], rc ? err : "");
            struct batch_seq qa = {.s = s, .tokens = seqs[k] + matched, .n_tokens = 60 - matched, .logits = a};
            if (!rc) rc = engine_forward(e, &qa, 1, err, sizeof err);
            /* reference: a fresh session fed with the same chunk boundaries */
            session_reset(r);
            const int cuts[3] = {40, want[k], 60};
            int at = 0;
            for (int c = 0; c < 3 && !rc; c++) {
                if (cuts[c] == at) continue;
                struct batch_seq qr = {.s = r, .tokens = seqs[k] + at, .n_tokens = cuts[c] - at, .logits = c == 2 ? b : NULL};
                rc = engine_forward(e, &qr, 1, err, sizeof err);
                at = cuts[c];
            }
            CHECK(rc == 0, "%s: engine forward: %s", shape, err);
            const double er = max_rel(a, b, (size_t)V);
            printf("  %s: engine prefix cache %s: resumed at %d, logits vs uninterrupted max rel %.3g%s\n", shape,
                   k ? "branch" : "extension", matched, er, memcmp(a, b, (size_t)V * 4) ? "" : " (bitwise)");
            CHECK(er <= 1e-6, "%s: engine prefix cache %d: max rel %.3g", shape, k, er);
        }
        int32_t other[10];
        prompt_tokens(other, 10, V, 500);
        int matched = -1;
        rc = prefix_cache_restore(pc, s, other, 10, &matched, err, sizeof err);
        CHECK(rc == 0 && matched == 0 && session_length(s) == 0, "%s: miss: matched %d length %d", shape, matched, session_length(s));
        struct prefix_cache_stats pst;
        prefix_cache_get_stats(pc, &pst);
        CHECK(pst.hits == 2 && pst.hit_tokens == 88 && pst.entries == 2, "%s: stats hits %llu tokens %llu entries %zu", shape,
              (unsigned long long)pst.hits, (unsigned long long)pst.hit_tokens, pst.entries);
        /* the state blocks came from the pool: only the two KV segments were allocated */
        CHECK(pst.host_allocs == w0.host_allocs + 2 && pst.pooled == 0, "%s: after prewarm: %llu allocations, %zu B pooled",
              shape, (unsigned long long)pst.host_allocs, pst.pooled);
        free(a); free(b);
    }
done:
    if (s) session_close(s);
    if (r) session_close(r);
    prefix_cache_free(pc);
    engine_close(e);
}

/* Full shape: 256 teacher-forced positions, top-1 agreement >= 99 %. */
static void test_full(int n) {
    char err[512];
    struct tmodel m;
    const double t0 = now_seconds();
    if (tmodel_open(&m, "synth:35b-a3b", err, sizeof err)) { CHECK(0, "full: %s", err); return; }
    printf("  full shape: synthetic weights built in %.1f s\n", now_seconds() - t0);
    const int V = m.cfg.vocab;
    struct backend *cpu = NULL, *gpu = NULL;
    if (cpu_backend_create(&cpu, &m.cfg, &m.w, 0, err, sizeof err) || cuda_backend_create(&gpu, &m.cfg, &m.w, err, sizeof err)) {
        CHECK(0, "full: backend: %s", err);
        if (cpu) cpu->destroy(cpu);
        tmodel_close(&m);
        return;
    }
    struct backend_session *sc, *sg;
    int rc = cpu->session_create(cpu, n + 8, &sc, err, sizeof err);
    if (!rc) rc = gpu->session_create(gpu, n + 8, &sg, err, sizeof err);
    CHECK(rc == 0, "full: session: %s", err);
    if (!rc) {
        int32_t *p = malloc((size_t)n * 4);
        prompt_tokens(p, n, V, 0);
        float *lc = malloc((size_t)n * V * 4), *lg = malloc((size_t)n * V * 4);
        double t1 = now_seconds();
        rc = feed(gpu, sg, p, n, 0, 0, lg, V, err, sizeof err);
        CHECK(rc == 0, "full cuda: %s", err);
        printf("  full shape: cuda %d tokens in %.2f s\n", n, now_seconds() - t1);
        t1 = now_seconds();
        rc = feed(cpu, sc, p, n, 0, 0, lc, V, err, sizeof err);
        CHECK(rc == 0, "full cpu: %s", err);
        printf("  full shape: cpu %d tokens in %.1f s\n", n, now_seconds() - t1);
        int agree = 0;
        double worst = 0, mean = 0;
        for (int i = 0; i < n; i++) {
            agree += argmax_row(lc + (size_t)i * V, V) == argmax_row(lg + (size_t)i * V, V);
            const double e = rel_err(lg + (size_t)i * V, lc + (size_t)i * V, (size_t)V);
            if (e > worst) worst = e;
            mean += e / n;
        }
        printf("  full shape: top-1 agreement %d/%d, logits rel err mean %.3g worst %.3g\n", agree, n, mean, worst);
        /* How sensitive is this random 40-layer model? (a) CUDA against itself through the
         * GEMV path (prefill in chunks of 16: exact fp32 weights instead of bf16 tensor-core
         * tiles); (b) the CPU against itself with every input-norm gain perturbed by a
         * relative 1e-3 (about one bf16 rounding). */
        float *l2 = malloc((size_t)n * V * 4);
        gpu->session_reset(gpu, sg);
        rc = 0;
        for (int i0 = 0; i0 < n && !rc; i0 += 16) rc = feed(gpu, sg, p + i0, 16, i0, 0, l2 + (size_t)i0 * V, V, err, sizeof err);
        int a2 = 0;
        for (int i = 0; i < n; i++) a2 += argmax_row(l2 + (size_t)i * V, V) == argmax_row(lg + (size_t)i * V, V);
        int a3 = 0;
        for (int i = 0; i < n; i++) a3 += argmax_row(l2 + (size_t)i * V, V) == argmax_row(lc + (size_t)i * V, V);
        printf("  full shape: cuda tensor-core prefill vs cuda GEMV-path prefill: top-1 %d/%d; GEMV path vs cpu %d/%d\n", a2, n, a3, n);
        struct sensitivity sens;
        rc = cpu_sensitivity(cpu, &m.w, &m.cfg, p, n, lc, 0, NULL, 0, SENS_EPS, 1, &sens, err, sizeof err);
        CHECK(rc == 0, "full: cpu sensitivity: %s", err);
        printf("  full shape: cpu vs cpu with norm gains perturbed by %.0e: top-1 %d/%d, mean rel err %.3g (the model's own sensitivity)\n",
               (double)SENS_EPS, sens.agree_min, n, sens.mean_err_max);
        CHECK(agree * 100 >= 99 * n, "full shape: top-1 agreement %d/%d below 99 %% (perturbed cpu: %d/%d)", agree, n,
              sens.agree_min, n);
        CHECK(mean <= 2 * sens.mean_err_max + 5e-3, "full shape: mean logits rel err %.3g above 2 x %.3g + 5e-3", mean,
              sens.mean_err_max);
        free(l2);
        free(p); free(lc); free(lg);
        gpu->session_destroy(gpu, sg);
        cpu->session_destroy(cpu, sc);
    }
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    tmodel_close(&m);
}

int main(void) {
    struct cuda_ctx ctx;
    char errbuf[512];
    if (gpu_test_start(&ctx, errbuf, sizeof errbuf)) {
        CHECK(0, "no CUDA device");
        return check_summary();
    }
    printf("end to end:\n");
    const char *tiny = getenv("ORCHID_GPU_TINY");
    if (!tiny) tiny = ".cache/gpu_models/tiny";
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/config.json", tiny);
    FILE *f = fopen(probe, "r");
    if (f) {
        fclose(f);
        test_e2e(tiny, 40, 32);
    } else {
        printf("  %s missing: using synth:tiny instead (make it with tools/make_test_model.py --config tiny)\n", tiny);
        test_e2e("synth:tiny", 40, 32);
    }
    test_e2e("synth:small", 40, 32);
    printf("decode batch invariance:\n");
    test_decode_invariance("synth:mini", 5, 6);  /* the skinny kernels */
    test_decode_invariance("synth:mini", 12, 4); /* more than 8 tokens: the wide kernels */
    test_forward_graph("synth:mini", 170);
    test_prefill_pack_invariance("synth:mini", 5);
    test_prefill_pack_invariance("synth:mini", 12);
    printf("state transfer:\n");
    test_state_transfer("synth:tiny", 0);
    test_state_transfer("synth:small", 0);
    test_state_transfer("synth:small", 1);
    cuda_backend_force_async_save(-1);
    const char *full = getenv("ORCHID_GPU_FULL");
    if (full && atoi(full)) test_full(256);
    return check_summary();
}
