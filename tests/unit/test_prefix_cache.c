/* tests/unit/test_prefix_cache.c — prefix checkpoints on the tiny mlx-lm model:
 * a resumed sequence gives the same logits as one fed from scratch; two branches off
 * one prompt both reuse it and share its KV; eviction under a tiny budget stays
 * correct (a miss, never a wrong hit), and an evicted checkpoint's host buffers are
 * reused by the next saves inside the budget. Model: $ORCHID_TEST_MODEL or
 * .cache/models/tiny-0. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/engine.h"
#include "model/sampler.h"
#include "model/prefix_cache.h"

static engine *e;
static int V;

static double rel_err(const float *a, const float *b, int n) {
    double d = 0, r = 0;
    for (int i = 0; i < n; i++) { d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); r += (double)b[i] * b[i]; }
    return sqrt(d / (r + 1e-30));
}

/* logits after feeding tokens[0, n) to a fresh session */
static void fresh_logits(const int32_t *tokens, int n, float *out) {
    char err[512];
    session *s;
    CHECK(session_open(e, &s, 256, err, sizeof err) == 0, "%s", err);
    struct batch_seq q = {.s = s, .tokens = tokens, .n_tokens = n, .logits = out};
    CHECK(engine_forward(e, &q, 1, err, sizeof err) == 0, "%s", err);
    session_close(s);
}

/* restore the longest checkpoint for tokens, feed the rest, return the matched length */
static int resumed_logits(prefix_cache *pc, session *s, const int32_t *tokens, int n, float *out) {
    char err[512];
    int matched = -1;
    CHECK(prefix_cache_restore(pc, s, tokens, n, &matched, err, sizeof err) == 0, "restore: %s", err);
    CHECK(session_length(s) == matched, "session length %d after restoring %d", session_length(s), matched);
    struct batch_seq q = {.s = s, .tokens = tokens + matched, .n_tokens = n - matched, .logits = out};
    CHECK(engine_forward(e, &q, 1, err, sizeof err) == 0, "%s", err);
    return matched;
}

int main(void) {
    const char *dir = getenv("ORCHID_TEST_MODEL");
    if (!dir) dir = ".cache/models/tiny-0";
    char err[1024];
    struct engine_options opt = {.model_dir = dir, .backend = "cpu", .threads = 2};
    CHECK(engine_open(&e, &opt, err, sizeof err) == 0, "open %s: %s", dir, err);
    if (!e) return check_summary();
    V = engine_config(e)->vocab;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    int32_t toks[80];
    for (int i = 0; i < 80; i++) toks[i] = (int32_t)(((uint32_t)(i + 11) * 2654435761u) % (uint32_t)V);

    prefix_cache *pc;
    CHECK(prefix_cache_create(&pc, e, (size_t)1 << 30, err, sizeof err) == 0, "%s", err);
    /* the CPU engine's host memory is plain malloc: nothing worth allocating ahead */
    CHECK(prefix_cache_prewarm(pc, -1) == 0 && prefix_cache_prewarm(pc, 4) == 0, "prewarm must do nothing without pinned memory");
    session *s;
    CHECK(session_open(e, &s, 256, err, sizeof err) == 0, "%s", err);

    /* turn 1: the 40-token "system prompt", checkpointed; then 8 more tokens, checkpointed */
    CHECK(resumed_logits(pc, s, toks, 40, a) == 0, "empty cache must miss");
    CHECK(prefix_cache_save(pc, s, err, sizeof err) == 0, "%s", err);
    struct batch_seq q = {.s = s, .tokens = toks + 40, .n_tokens = 8};
    CHECK(engine_forward(e, &q, 1, err, sizeof err) == 0, "%s", err);
    CHECK(prefix_cache_save(pc, s, err, sizeof err) == 0, "%s", err);
    struct prefix_cache_stats st;
    prefix_cache_get_stats(pc, &st);
    CHECK(st.entries == 2, "entries %zu", st.entries);
    const size_t state = engine_state_bytes(e), row = engine_kv_bytes_per_token(e);
    CHECK(st.bytes < 2 * state + 48 * row + 4096 + 48 * 4 * 2, "the second checkpoint must share the first one's KV (bytes %zu)", st.bytes);

    /* turn 2: extends turn 1 → resumes at 48 */
    CHECK(resumed_logits(pc, s, toks, 60, a) == 48, "turn 2 should resume from the 48-token checkpoint");
    fresh_logits(toks, 60, b);
    CHECK(rel_err(a, b, V) < 1e-5 && sampler_argmax(a, V) == sampler_argmax(b, V), "resumed vs fresh: %.3g", rel_err(a, b, V));

    /* a branch off the system prompt → resumes at 40 (not 48) */
    int32_t branch[60];
    memcpy(branch, toks, 40 * sizeof(int32_t));
    for (int i = 40; i < 60; i++) branch[i] = (toks[i] + 17) % V;
    CHECK(resumed_logits(pc, s, branch, 60, a) == 40, "branch should resume from the 40-token checkpoint");
    fresh_logits(branch, 60, b);
    CHECK(rel_err(a, b, V) < 1e-5, "branch resumed vs fresh: %.3g", rel_err(a, b, V));

    /* an exact match is never returned whole: one token must be left to feed */
    int matched;
    CHECK(prefix_cache_restore(pc, s, toks, 48, &matched, err, sizeof err) == 0 && matched == 40, "exact 48 → %d", matched);
    /* a different first token: miss, session reset */
    int32_t other[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    CHECK(prefix_cache_restore(pc, s, other, 10, &matched, err, sizeof err) == 0 && matched == 0 && session_length(s) == 0, "miss");
    prefix_cache_get_stats(pc, &st);
    CHECK(st.hits == 3 && st.hit_tokens == 48 + 40 + 40, "hits %llu tokens %llu", (unsigned long long)st.hits, (unsigned long long)st.hit_tokens);
    prefix_cache_free(pc);

    /* eviction: a budget for about two checkpoints of 20 tokens */
    const size_t one = state + 20 * row + 20 * 4 + 256;
    CHECK(prefix_cache_create(&pc, e, 2 * one + one / 2, err, sizeof err) == 0, "%s", err);
    for (int k = 0; k < 4; k++) { /* four unrelated 20-token sequences */
        int32_t t[20];
        for (int i = 0; i < 20; i++) t[i] = (toks[i] + 1000 * (k + 1)) % V;
        CHECK(resumed_logits(pc, s, t, 20, a) == 0, "unrelated sequences must miss");
        CHECK(prefix_cache_save(pc, s, err, sizeof err) == 0, "%s", err);
        prefix_cache_get_stats(pc, &st);
        CHECK(st.bytes + st.pooled <= st.max_bytes && st.entries <= 2, "budget: %zu + %zu pooled bytes, %zu entries",
              st.bytes, st.pooled, st.entries);
    }
    prefix_cache_get_stats(pc, &st);
    CHECK(st.evictions == 2, "evictions %llu", (unsigned long long)st.evictions);
    /* saves 3 and 4 took the evicted checkpoints' state and KV buffers */
    CHECK(st.host_allocs == 4 && st.pooled == 0, "host buffers allocated %llu (want 4), pooled %zu",
          (unsigned long long)st.host_allocs, st.pooled);
    for (int k = 0; k < 4; k++) { /* the two newest hit, the two oldest miss; all give exact-feed logits */
        int32_t t[24];
        for (int i = 0; i < 20; i++) t[i] = (toks[i] + 1000 * (k + 1)) % V;
        for (int i = 20; i < 24; i++) t[i] = toks[i];
        const int m = resumed_logits(pc, s, t, 24, a);
        CHECK(m == (k >= 2 ? 20 : 0), "sequence %d matched %d", k, m);
        fresh_logits(t, 24, b);
        CHECK(rel_err(a, b, V) < 1e-5, "after eviction, sequence %d: %.3g", k, rel_err(a, b, V));
    }
    /* a shorter checkpoint: reuses the evicted state buffer; the evicted 20-row KV buffer
     * does not fit 10 rows and stays pooled, inside the budget (freed with the cache) */
    int32_t t10[14];
    for (int i = 0; i < 14; i++) t10[i] = (toks[i] + 7000) % V;
    CHECK(resumed_logits(pc, s, t10, 10, a) == 0, "10-token sequence must miss");
    CHECK(prefix_cache_save(pc, s, err, sizeof err) == 0, "%s", err);
    prefix_cache_get_stats(pc, &st);
    CHECK(st.evictions == 3 && st.host_allocs == 5 && st.pooled == 20 * row && st.bytes + st.pooled <= st.max_bytes,
          "evictions %llu, allocs %llu, pooled %zu, bytes %zu", (unsigned long long)st.evictions,
          (unsigned long long)st.host_allocs, st.pooled, st.bytes);
    CHECK(resumed_logits(pc, s, t10, 14, a) == 10, "the 10-token checkpoint must hit");
    fresh_logits(t10, 14, b);
    CHECK(rel_err(a, b, V) < 1e-5, "10-token checkpoint: %.3g", rel_err(a, b, V));
    prefix_cache_free(pc);
    session_close(s);
    free(a);
    free(b);
    engine_close(e);
    return check_summary();
}
