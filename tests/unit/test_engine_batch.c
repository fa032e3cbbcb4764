/* tests/unit/test_engine_batch.c — the engine's batching contract on a real (tiny,
 * mlx-lm-written) checkpoint: several sequences fed in one engine_forward give
 * bit-identical logits to each fed alone, also when one's decode token shares the batch
 * with another's long prefill (issue 6: a token's result must not depend on the batch);
 * a prompt longer than the backend's chunk size gives bit-identical logits to
 * token-by-token feeding; bad batches are refused without changing any session. Model: $ORCHID_TEST_MODEL or .cache/models/tiny-0 (scripts/run_tests.sh
 * builds it first); the test fails, not skips, without it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/engine.h"
#include "model/sampler.h"

static double rel_err(const float *a, const float *b, int n) {
    double d = 0, r = 0;
    for (int i = 0; i < n; i++) { d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); r += (double)b[i] * b[i]; }
    return sqrt(d / (r + 1e-30));
}

static int32_t hash_id(int i, int vocab) { return (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)vocab); }

int main(void) {
    const char *dir = getenv("ORCHID_TEST_MODEL");
    if (!dir) dir = ".cache/models/tiny-0";
    char err[1024];
    engine *e = NULL;
    struct engine_options opt = {.model_dir = dir, .backend = "cpu", .threads = 2};
    CHECK(engine_open(&e, &opt, err, sizeof err) == 0, "open %s: %s", dir, err);
    if (!e) return check_summary();
    const int V = engine_config(e)->vocab;
    enum { NS = 3, STEPS = 6, LONG = 160, INTRUDE = 40 }; /* LONG spans two CPU chunks of 128 */
    const int plen[NS] = {5, 17, 2};
    int32_t prompts[NS][17];
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < plen[s]; i++) prompts[s][i] = hash_id(1000 * s + i + 1, V);

    /* (a) each sequence alone: prefill, then STEPS greedy steps; keep every logit row */
    float *alone = malloc(sizeof(float) * NS * (STEPS + 1) * V), *batched = malloc(sizeof(float) * NS * (STEPS + 1) * V);
    int32_t toks_alone[NS][STEPS + 1];
    for (int s = 0; s < NS; s++) {
        session *ss;
        CHECK(session_open(e, &ss, 64, err, sizeof err) == 0, "session: %s", err);
        struct batch_seq q = {.s = ss, .tokens = prompts[s], .n_tokens = plen[s], .logits = alone + (size_t)s * (STEPS + 1) * V};
        CHECK(engine_forward(e, &q, 1, err, sizeof err) == 0, "prefill: %s", err);
        for (int k = 0; k < STEPS; k++) {
            int32_t t = toks_alone[s][k] = sampler_argmax(alone + ((size_t)s * (STEPS + 1) + k) * V, V);
            q = (struct batch_seq){.s = ss, .tokens = &t, .n_tokens = 1, .logits = alone + ((size_t)s * (STEPS + 1) + k + 1) * V};
            CHECK(engine_forward(e, &q, 1, err, sizeof err) == 0, "step: %s", err);
        }
        session_close(ss);
    }
    /* (b) all sequences in one batch per step */
    session *ss[NS];
    for (int s = 0; s < NS; s++) CHECK(session_open(e, &ss[s], 64, err, sizeof err) == 0, "session: %s", err);
    struct batch_seq q[NS];
    for (int s = 0; s < NS; s++)
        q[s] = (struct batch_seq){.s = ss[s], .tokens = prompts[s], .n_tokens = plen[s], .logits = batched + (size_t)s * (STEPS + 1) * V};
    CHECK(engine_forward(e, q, NS, err, sizeof err) == 0, "batched prefill: %s", err);
    int32_t t[NS];
    /* at two steps a further sequence prefills INTRUDE tokens in the same batch, so the
     * decode tokens share a large batch (other kernel shapes than 3 tokens) */
    session *intruder;
    CHECK(session_open(e, &intruder, 2 * INTRUDE, err, sizeof err) == 0, "session: %s", err);
    int32_t intr_ids[2 * INTRUDE];
    for (int i = 0; i < 2 * INTRUDE; i++) intr_ids[i] = hash_id(7000 + i, V);
    struct batch_seq qq[NS + 1];
    for (int k = 0; k < STEPS; k++) {
        for (int s = 0; s < NS; s++) {
            t[s] = sampler_argmax(batched + ((size_t)s * (STEPS + 1) + k) * V, V);
            CHECK(t[s] == toks_alone[s][k], "seq %d step %d: batched greedy %d, alone %d", s, k, t[s], toks_alone[s][k]);
            q[s] = (struct batch_seq){.s = ss[s], .tokens = &t[s], .n_tokens = 1, .logits = batched + ((size_t)s * (STEPS + 1) + k + 1) * V};
        }
        int n = NS;
        memcpy(qq, q, sizeof q);
        if (k == 1 || k == 4) qq[n++] = (struct batch_seq){.s = intruder, .tokens = intr_ids + (k == 4) * INTRUDE, .n_tokens = INTRUDE};
        CHECK(engine_forward(e, qq, n, err, sizeof err) == 0, "batched step: %s", err);
    }
    session_close(intruder);
    for (int s = 0; s < NS; s++)
        for (int k = 0; k <= STEPS; k++) {
            const float *bt = batched + ((size_t)s * (STEPS + 1) + k) * V, *al = alone + ((size_t)s * (STEPS + 1) + k) * V;
            CHECK(memcmp(bt, al, sizeof(float) * V) == 0, "seq %d row %d: batched logits differ from alone (relative error %.3g)",
                  s, k, rel_err(bt, al, V));
        }

    /* bad batches change nothing */
    const int len0 = session_length(ss[0]);
    int32_t bad_ids[2] = {1, V};
    struct batch_seq bq = {.s = ss[0], .tokens = bad_ids, .n_tokens = 2};
    CHECK(engine_forward(e, &bq, 1, err, sizeof err) < 0 && strstr(err, "outside the vocabulary"), "out-of-vocab id accepted: %s", err);
    struct batch_seq dup[2] = {{.s = ss[0], .tokens = bad_ids, .n_tokens = 1}, {.s = ss[0], .tokens = bad_ids, .n_tokens = 1}};
    CHECK(engine_forward(e, dup, 2, err, sizeof err) < 0, "a session twice in one batch accepted");
    int32_t many[64] = {0};
    bq = (struct batch_seq){.s = ss[0], .tokens = many, .n_tokens = 64};
    CHECK(engine_forward(e, &bq, 1, err, sizeof err) < 0 && strstr(err, "sequence full"), "overflow accepted: %s", err);
    CHECK(session_length(ss[0]) == len0, "a refused batch changed the session length");
    for (int s = 0; s < NS; s++) session_close(ss[s]);

    /* (c) a prompt longer than the backend chunk: one call vs token by token */
    int32_t *lp = malloc(sizeof(int32_t) * LONG);
    for (int i = 0; i < LONG; i++) lp[i] = hash_id(i + 7, V);
    float *l1 = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V);
    session *a, *b;
    CHECK(session_open(e, &a, LONG, err, sizeof err) == 0 && session_open(e, &b, LONG, err, sizeof err) == 0, "sessions");
    struct batch_seq qa = {.s = a, .tokens = lp, .n_tokens = LONG, .logits = l1};
    CHECK(engine_forward(e, &qa, 1, err, sizeof err) == 0, "long prefill: %s", err);
    for (int i = 0; i < LONG; i++) {
        struct batch_seq qb = {.s = b, .tokens = lp + i, .n_tokens = 1, .logits = l2};
        CHECK(engine_forward(e, &qb, 1, err, sizeof err) == 0, "token %d: %s", i, err);
    }
    CHECK(memcmp(l1, l2, sizeof(float) * V) == 0, "chunked prefill vs token-by-token: logits differ (relative error %.3g)",
          rel_err(l1, l2, V));
    /* reset gives a fresh sequence */
    session_reset(a);
    qa = (struct batch_seq){.s = a, .tokens = lp, .n_tokens = LONG, .logits = l2};
    CHECK(engine_forward(e, &qa, 1, err, sizeof err) == 0, "after reset: %s", err);
    CHECK(memcmp(l1, l2, sizeof(float) * V) == 0, "reset session did not reproduce the logits exactly");
    session_close(a);
    session_close(b);
    free(lp); free(l1); free(l2); free(alone); free(batched);
    engine_close(e);
    return check_summary();
}
