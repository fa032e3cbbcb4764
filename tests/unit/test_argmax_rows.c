/* tests/unit/test_argmax_rows.c — the argmax-only output rows of backend.h and
 * engine.h on the CPU backend and the tiny mlx-lm model: out_argmax equals
 * sampler_argmax of the row's logits, for rows that keep their logits and for rows
 * whose logits are not wanted (NULL destination, computed into the backend's
 * scratch), mixed in one batch; the engine's batch_seq.argmax carries the same ids
 * (last token and all_logits) and the greedy host loop uses it; sampler_argmax_only
 * holds exactly for the samplers whose choice is that argmax.
 * Model: $ORCHID_TEST_MODEL or .cache/models/tiny-0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "model/config.h"
#include "model/engine.h"
#include "model/sampler.h"
#include "model/weights.h"
#include "runtime/safetensors.h"

enum { NS = 3, NT = 17 };
static const int k_len[NS] = {5, 9, 3}; /* tokens of each sequence, NT in all */

static int32_t hash_id(int i, int vocab) { return (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)vocab); }

/* Feeds the NS sequences as one batch into fresh sessions with every token an output
 * row. Row i's logits go to logits + i * stride (stride > vocab: rows are never
 * adjacent, so each is computed alone) unless null_row(i). */
static int run_batch(struct backend *be, const int32_t *tokens, float *logits, size_t stride,
                     bool (*null_row)(int), int32_t *amax, char *err, size_t errlen) {
    struct backend_session *ss[NS] = {0};
    int32_t pos[NT], seq[NT], rows[NT];
    float *out[NT];
    int rc = 0, t = 0;
    for (int s = 0; s < NS && !rc; s++) {
        rc = be->session_create(be, 32, &ss[s], err, errlen);
        for (int k = 0; k < k_len[s]; k++, t++) {
            pos[t] = k;
            seq[t] = s;
        }
    }
    for (int i = 0; i < NT; i++) {
        rows[i] = i;
        out[i] = null_row && null_row(i) ? NULL : logits + (size_t)i * stride;
    }
    struct fwd_batch b = {.n_tokens = NT, .tokens = tokens, .pos = pos, .seq = seq, .sessions = ss, .n_seqs = NS,
                          .n_out = NT, .out_rows = rows, .out_logits = out, .out_argmax = amax};
    if (!rc) rc = be->forward(be, &b, err, errlen);
    for (int s = 0; s < NS; s++)
        if (ss[s]) be->session_destroy(be, ss[s]);
    return rc;
}

static bool every_other(int i) { return i % 2 == 1; }
static bool runs_of_six(int i) { return i < 6 || i >= 11; } /* NULL runs of 6 and 6: scratch chunks of 4 + 2 */

static void test_backend(const char *dir) {
    char err[1024], path[4096];
    struct model_config cfg;
    safetensors *st = NULL;
    struct model_weights w;
    memset(&w, 0, sizeof w);
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = config_load(&cfg, path, err, sizeof err);
    if (!rc) rc = safetensors_open(&st, dir, err, sizeof err);
    if (!rc) rc = weights_bind(&w, &cfg, st, err, sizeof err);
    struct backend *be = NULL;
    if (!rc) rc = cpu_backend_create(&be, &cfg, &w, 2, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", dir, err);
    if (rc) goto out;
    const int V = cfg.vocab;
    const size_t stride = (size_t)V + 16;
    int32_t tokens[NT];
    for (int i = 0; i < NT; i++) tokens[i] = hash_id(i + 3, V);
    float *ref = malloc(NT * stride * sizeof(float)), *got = malloc(NT * stride * sizeof(float));
    int32_t ref_ids[NT], ids[NT];

    /* the reference: every row's logits, no argmax wanted */
    CHECK(run_batch(be, tokens, ref, stride, NULL, NULL, err, sizeof err) == 0, "reference: %s", err);
    for (int i = 0; i < NT; i++) {
        const int32_t a = sampler_argmax(ref + (size_t)i * stride, V);
        ref_ids[i] = a < 0 ? 0 : a;
    }
    /* every row: logits and argmax */
    memset(ids, 0xff, sizeof ids);
    CHECK(run_batch(be, tokens, got, stride, NULL, ids, err, sizeof err) == 0, "all rows: %s", err);
    for (int i = 0; i < NT; i++) {
        CHECK(ids[i] == sampler_argmax(got + (size_t)i * stride, V), "row %d: argmax %d vs its logits' %d", i, ids[i],
              sampler_argmax(got + (size_t)i * stride, V));
        CHECK(ids[i] == ref_ids[i], "row %d: argmax %d vs reference %d", i, ids[i], ref_ids[i]);
    }
    /* NULL rows mixed in: every other row, then runs longer than the scratch */
    bool (*const patterns[2])(int) = {every_other, runs_of_six};
    for (int p = 0; p < 2; p++) {
        memset(ids, 0xff, sizeof ids);
        for (size_t i = 0; i < NT * stride; i++) got[i] = -1.0f;
        CHECK(run_batch(be, tokens, got, stride, patterns[p], ids, err, sizeof err) == 0, "pattern %d: %s", p, err);
        for (int i = 0; i < NT; i++) {
            CHECK(ids[i] == ref_ids[i], "pattern %d row %d (%s): argmax %d vs reference %d", p, i,
                  patterns[p](i) ? "argmax only" : "with logits", ids[i], ref_ids[i]);
            if (!patterns[p](i)) {
                const float *row = got + (size_t)i * stride;
                CHECK(ids[i] == sampler_argmax(row, V), "pattern %d row %d: argmax vs its logits", p, i);
                CHECK(memcmp(row, ref + (size_t)i * stride, (size_t)V * sizeof(float)) == 0,
                      "pattern %d row %d: logits differ from the reference", p, i);
            } else {
                CHECK(got[(size_t)i * stride] == -1.0f, "pattern %d row %d: a NULL row's slot was written", p, i);
            }
        }
    }
    free(ref);
    free(got);
out:
    if (be) be->destroy(be);
    weights_free(&w);
    safetensors_close(st);
}

/* engine.h: batch_seq.argmax with and without logits, last token and all_logits;
 * engine_decode_greedy's host loop against forward + sampler_argmax. */
static void test_engine(const char *dir) {
    char err[1024];
    engine *e = NULL;
    struct engine_options opt = {.model_dir = dir, .backend = "cpu", .threads = 2, .quiet = true};
    CHECK(engine_open(&e, &opt, err, sizeof err) == 0, "open %s: %s", dir, err);
    if (!e) return;
    const int V = engine_config(e)->vocab;
    int32_t p0[6], p1[4];
    for (int i = 0; i < 6; i++) p0[i] = hash_id(100 + i, V);
    for (int i = 0; i < 4; i++) p1[i] = hash_id(200 + i, V);
    float *l0 = malloc(sizeof(float) * V), *l1 = malloc(sizeof(float) * 4 * V);
    int32_t a0 = -1, a1[4] = {-1, -1, -1, -1}, r0 = -1, r1[4];
    for (int pass = 0; pass < 2; pass++) { /* 0: logits (reference), 1: argmax only */
        session *s0, *s1;
        CHECK(session_open(e, &s0, 32, err, sizeof err) == 0, "%s", err);
        CHECK(session_open(e, &s1, 32, err, sizeof err) == 0, "%s", err);
        struct batch_seq q[2] = {
            {.s = s0, .tokens = p0, .n_tokens = 6, .logits = pass ? NULL : l0, .argmax = pass ? &a0 : NULL},
            {.s = s1, .tokens = p1, .n_tokens = 4, .logits = pass ? NULL : l1, .all_logits = true, .argmax = pass ? a1 : NULL},
        };
        CHECK(engine_forward(e, q, 2, err, sizeof err) == 0, "pass %d: %s", pass, err);
        CHECK(session_length(s0) == 6 && session_length(s1) == 4, "pass %d: session lengths", pass);
        if (!pass) {
            r0 = sampler_argmax(l0, V);
            for (int k = 0; k < 4; k++) r1[k] = sampler_argmax(l1 + (size_t)k * V, V);
        }
        session_close(s0);
        session_close(s1);
    }
    CHECK(a0 == r0, "last-token argmax %d vs %d", a0, r0);
    for (int k = 0; k < 4; k++) CHECK(a1[k] == r1[k], "all_logits row %d: argmax %d vs %d", k, a1[k], r1[k]);

    /* greedy host loop (CPU has no decode_greedy) vs forward + sampler_argmax */
    enum { STEPS = 5 };
    int32_t ids[STEPS], want[STEPS];
    session *s;
    CHECK(session_open(e, &s, 32, err, sizeof err) == 0, "%s", err);
    struct batch_seq q = {.s = s, .tokens = p0, .n_tokens = 6, .logits = l0};
    CHECK(engine_forward(e, &q, 1, err, sizeof err) == 0, "%s", err);
    int32_t tok = sampler_argmax(l0, V);
    const int32_t first = tok;
    for (int i = 0; i < STEPS; i++) {
        q = (struct batch_seq){.s = s, .tokens = &tok, .n_tokens = 1, .logits = l0};
        CHECK(engine_forward(e, &q, 1, err, sizeof err) == 0, "%s", err);
        tok = want[i] = sampler_argmax(l0, V);
    }
    session_reset(s);
    q = (struct batch_seq){.s = s, .tokens = p0, .n_tokens = 6};
    CHECK(engine_forward(e, &q, 1, err, sizeof err) == 0, "%s", err);
    CHECK(engine_decode_greedy(e, s, first, STEPS, ids, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(ids, want, sizeof ids) == 0, "greedy loop ids differ from forward + sampler_argmax");
    session_close(s);
    free(l0);
    free(l1);
    engine_close(e);
}

/* sampler_argmax_only: exactly the samplers whose sampler_sample is the argmax of the
 * raw row (ties to the lowest id, NaN never wins, all-NaN 0) with nothing reported. */
static void test_sampler_predicate(void) {
    enum { V = 64 };
    enum { NC = 9 };
    struct { const char *what; struct sampler_params p; bool only; } cases[NC];
    for (int i = 0; i < NC; i++) cases[i].p = sampler_params_default();
    cases[0].what = "defaults (greedy)", cases[0].only = true;
    cases[1].what = "top_k 1 at temperature 0.7", cases[1].p.temperature = 0.7f, cases[1].p.top_k = 1, cases[1].only = true;
    cases[2].what = "logprobs", cases[2].p.logprobs = true, cases[2].only = false;
    cases[3].what = "top_logprobs", cases[3].p.top_logprobs = 2, cases[3].only = false;
    cases[4].what = "presence penalty", cases[4].p.presence_penalty = 0.5f, cases[4].only = false;
    cases[5].what = "repetition penalty", cases[5].p.repetition_penalty = 1.1f, cases[5].only = false;
    cases[6].what = "temperature 0.7", cases[6].p.temperature = 0.7f, cases[6].only = false;
    cases[7].what = "frequency penalty", cases[7].p.frequency_penalty = -0.5f, cases[7].only = false;
    cases[8].what = "logit_bias", cases[8].p.n_logit_bias = 1, cases[8].only = false;
    cases[8].p.logit_bias[0] = (struct logit_bias){.token = 3, .bias = 0.5f};
    char err[256];
    float row[V], copy[V];
    for (int c = 0; c < NC; c++) {
        sampler *s = NULL;
        CHECK(sampler_new(&s, V, &cases[c].p, err, sizeof err) == 0, "%s: %s", cases[c].what, err);
        if (!s) continue;
        CHECK(sampler_argmax_only(s) == cases[c].only, "%s: argmax_only %d", cases[c].what, sampler_argmax_only(s));
        for (int r = 0; r < 4 && cases[c].only; r++) { /* ties, NaN first, all NaN */
            for (int i = 0; i < V; i++) row[i] = (float)(hash_id(i + 31 * r, 7));
            if (r == 1) row[0] = row[1] = 0.0f / 0.0f;
            if (r == 3)
                for (int i = 0; i < V; i++) row[i] = 0.0f / 0.0f;
            const int32_t a = sampler_argmax(row, V), want = a < 0 ? 0 : a;
            memcpy(copy, row, sizeof row);
            CHECK(sampler_sample(s, copy, NULL) == want, "%s row %d: sample vs argmax %d", cases[c].what, r, want);
        }
        sampler_free(s);
    }
}

int main(void) {
    const char *dir = getenv("ORCHID_TEST_MODEL");
    if (!dir) dir = ".cache/models/tiny-0";
    test_sampler_predicate();
    test_backend(dir);
    test_engine(dir);
    return check_summary();
}
