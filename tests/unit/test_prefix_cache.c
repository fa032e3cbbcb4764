/* tests/unit/test_prefix_cache.c — prefix checkpoints on the tiny mlx-lm model:
 * a resumed sequence gives the same logits as one fed from scratch, its KV crossing
 * chunk boundaries (small chunks through prefix_cache_set_chunk_rows, a parent ending
 * mid-chunk); two branches off one prompt both reuse it and share its KV; eviction
 * under a tiny budget stays correct (a miss, never a wrong hit), and an evicted
 * checkpoint's host blocks are reused by the next saves inside the budget; saves of
 * alternating lengths stop allocating once warm (every block from the pool); the
 * default chunk is 2 MiB of rows (less in a small budget); the stats' times; the
 * cache's /metrics lines. Model: $ORCHID_TEST_MODEL or .cache/models/tiny-0. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/engine.h"
#include "model/sampler.h"
#include "model/prefix_cache.h"
#include "server/metrics.h"
#include "server/port.h"

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

/* s holds exactly tokens[0, n) (fed from scratch) */
static void feed(session *s, const int32_t *tokens, int n) {
    char err[512];
    session_reset(s);
    struct batch_seq q = {.s = s, .tokens = tokens, .n_tokens = n};
    CHECK(engine_forward(e, &q, 1, err, sizeof err) == 0, "%s", err);
}

/* Saves of alternating lengths (20 and 30 tokens: 5 and 8 chunks of 4 rows, the last
 * of 30 half used), distinct prompts, in a budget of three checkpoints: each save
 * evicts the oldest, whose length differs from the new one's (a block sized for its
 * rows would not fit), yet after the first four saves every block comes from the
 * pool and none is freed. */
static void test_churn(session *s, const int32_t *toks) {
    char err[512];
    const size_t state = engine_state_bytes(e), row = engine_kv_bytes_per_token(e), chunk = 4 * row;
    /* three entries of 30, 20 and 30 tokens (the larger window), plus 1 KiB each for the
     * entry structs and tokens; a fourth (at least state + 5 chunks) never fits */
    const size_t budget = 3 * state + 21 * chunk + 3 * 1024;
    CHECK(state + 5 * chunk > 3 * 1024, "the test's margin must stay below a fourth checkpoint");
    prefix_cache *pc;
    CHECK(prefix_cache_create(&pc, e, budget, err, sizeof err) == 0, "%s", err);
    prefix_cache_set_chunk_rows(pc, 4);
    struct prefix_cache_stats st;
    uint64_t warm_allocs = 0;
    int32_t t[34];
    const int rounds = 24;
    for (int k = 0; k < rounds; k++) {
        const int n = k % 2 ? 30 : 20;
        for (int i = 0; i < n; i++) t[i] = (toks[i] + 31 * (k + 1)) % V;
        feed(s, t, n);
        CHECK(prefix_cache_save(pc, s, err, sizeof err) == 0, "churn save %d: %s", k, err);
        prefix_cache_get_stats(pc, &st);
        CHECK(st.saves == (uint64_t)k + 1 && st.entries == (size_t)(k < 3 ? k + 1 : 3),
              "churn save %d: saves %llu entries %zu", k, (unsigned long long)st.saves, st.entries);
        CHECK(st.bytes + st.pooled <= st.max_bytes, "churn save %d: %zu + %zu pooled bytes over %zu", k, st.bytes,
              st.pooled, st.max_bytes);
        if (k == 3) warm_allocs = st.host_allocs;
    }
    /* the first four saves: 6 + 9 + 6 blocks, then 3 chunks more than the evicted 20-token entry had */
    CHECK(warm_allocs == 24, "warm-up allocated %llu blocks (want 24)", (unsigned long long)warm_allocs);
    CHECK(st.host_allocs == warm_allocs && st.host_frees == 0 && st.evictions == (uint64_t)rounds - 3,
          "after warm-up: %llu allocations (want %llu), %llu frees, %llu evictions", (unsigned long long)st.host_allocs,
          (unsigned long long)warm_allocs, (unsigned long long)st.host_frees, (unsigned long long)st.evictions);
    CHECK(st.save_s > 0 && st.restore_s == 0 && st.host_alloc_s >= 0, "times: save %g restore %g alloc %g", st.save_s,
          st.restore_s, st.host_alloc_s);
    /* the three newest hit and resume to the logits of a fresh feed; the one before misses */
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    for (int k = rounds - 4; k < rounds; k++) {
        const int n = k % 2 ? 30 : 20;
        for (int i = 0; i < n; i++) t[i] = (toks[i] + 31 * (k + 1)) % V;
        for (int i = n; i < n + 4; i++) t[i] = toks[i];
        const int m = resumed_logits(pc, s, t, n + 4, a);
        CHECK(m == (k >= rounds - 3 ? n : 0), "churned sequence %d matched %d", k, m);
        fresh_logits(t, n + 4, b);
        CHECK(rel_err(a, b, V) < 1e-5, "churned sequence %d: %.3g", k, rel_err(a, b, V));
    }
    prefix_cache_get_stats(pc, &st);
    CHECK(st.restore_s > 0 && st.hits == 3, "restores: %g s, %llu hits", st.restore_s, (unsigned long long)st.hits);

    /* /metrics: nothing about the cache until it reports, then its numbers */
    char *text;
    size_t len;
    metrics_init();
    CHECK(metrics_render(&text, &len) == 0 && !strstr(text, "orchid_prefix_cache_entries"),
          "no cache lines before the cache reports");
    free(text);
    port_publish_cache_stats(pc); /* what the server does after each save and restore */
    CHECK(metrics_render(&text, &len) == 0, "render");
    char want[256];
    const char *lines[][2] = {
        {"entries", "gauge"}, {"bytes", "gauge"}, {"max_bytes", "gauge"}, {"pooled_bytes", "gauge"},
        {"saves_total", "counter"}, {"evictions_total", "counter"}, {"host_allocs_total", "counter"},
        {"host_frees_total", "counter"}, {"save_seconds_total", "counter"}, {"restore_seconds_total", "counter"},
        {"host_alloc_seconds_total", "counter"}};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        snprintf(want, sizeof want, "# TYPE orchid_prefix_cache_%s %s\norchid_prefix_cache_%s ", lines[i][0], lines[i][1],
                 lines[i][0]);
        CHECK(strstr(text, want) != NULL, "metrics lack %s", want);
    }
    snprintf(want, sizeof want, "\norchid_prefix_cache_entries 3\n");
    CHECK(strstr(text, want) != NULL, "entries line");
    snprintf(want, sizeof want, "\norchid_prefix_cache_host_allocs_total %llu\n", (unsigned long long)st.host_allocs);
    CHECK(strstr(text, want) != NULL, "allocs line: %s", want);
    snprintf(want, sizeof want, "\norchid_prefix_cache_max_bytes %zu\n", budget);
    CHECK(strstr(text, want) != NULL, "budget line: %s", want);
    free(text);
    prefix_cache_free(pc);
    free(a);
    free(b);
}

/* Without the hook a chunk is 2 MiB of rows (max(16, 2 MiB / row) rows), charged
 * whole, or 1/64 of a small budget; the hook is ignored once a block exists. */
static void test_default_chunk(session *s, const int32_t *toks) {
    char err[512];
    const size_t state = engine_state_bytes(e), row = engine_kv_bytes_per_token(e);
    size_t rows = ((size_t)2 << 20) / row;
    if (rows < 16) rows = 16;
    prefix_cache *pc;
    CHECK(prefix_cache_create(&pc, e, (size_t)1 << 30, err, sizeof err) == 0, "%s", err);
    feed(s, toks, 20);
    CHECK(prefix_cache_save(pc, s, err, sizeof err) == 0, "%s", err);
    prefix_cache_set_chunk_rows(pc, 4); /* too late: ignored */
    feed(s, toks, 30);
    CHECK(prefix_cache_save(pc, s, err, sizeof err) == 0, "%s", err);
    struct prefix_cache_stats st;
    prefix_cache_get_stats(pc, &st);
    const size_t blocks = 2 * state + 2 * rows * row; /* 20 rows and 10 more: one chunk each */
    CHECK(st.entries == 2 && st.host_allocs == 4 && st.bytes >= blocks && st.bytes < blocks + 4096,
          "default chunks: %zu entries, %llu allocations, %zu bytes (blocks %zu)", st.entries,
          (unsigned long long)st.host_allocs, st.bytes, blocks);
    prefix_cache_free(pc);
    /* a 4 MiB budget: chunks of 64 KiB (at least 16 rows) */
    rows = ((size_t)64 << 10) / row;
    if (rows < 16) rows = 16;
    CHECK(prefix_cache_create(&pc, e, (size_t)4 << 20, err, sizeof err) == 0, "%s", err);
    feed(s, toks, 20);
    CHECK(prefix_cache_save(pc, s, err, sizeof err) == 0, "%s", err);
    prefix_cache_get_stats(pc, &st);
    const size_t n_chunks = (20 + rows - 1) / rows;
    CHECK(st.entries == 1 && st.host_allocs == 1 + n_chunks && st.bytes >= state + n_chunks * rows * row &&
              st.bytes < state + n_chunks * rows * row + 4096,
          "small budget: %zu entries, %llu allocations, %zu bytes (%zu chunks of %zu rows)", st.entries,
          (unsigned long long)st.host_allocs, st.bytes, n_chunks, rows);
    prefix_cache_free(pc);
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
    /* chunks of 6 rows: the 40-token checkpoint spans 7 (the last with 4 rows), its
     * 48-token child starts mid-chunk of the parent's rows and spans 2 (6 + 2 rows) */
    prefix_cache_set_chunk_rows(pc, 6);
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
    /* 9 chunks of 6 rows, each charged whole; unshared KV would be 7 + 8 chunks */
    CHECK(st.bytes >= 2 * state + 54 * row && st.bytes < 2 * state + 54 * row + 4096,
          "the second checkpoint must share the first one's KV, in whole chunks (bytes %zu)", st.bytes);
    CHECK(st.host_allocs == 2 + 9 && st.save_s > 0 && st.restore_s >= 0 && st.host_alloc_s >= 0,
          "allocations %llu (want 11), save %g s", (unsigned long long)st.host_allocs, st.save_s);

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

    /* prefix_cache_match: what restore would give, without restoring or counting */
    prefix_cache_get_stats(pc, &st);
    const uint64_t lookups0 = st.lookups;
    CHECK(prefix_cache_match(pc, branch, 60) == 40 && prefix_cache_match(pc, toks, 48) == 40 &&
              prefix_cache_match(pc, toks, 49) == 48 && prefix_cache_match(pc, toks, 1) == 0,
          "match: branch %d, exact 48 %d, 49 %d", prefix_cache_match(pc, branch, 60), prefix_cache_match(pc, toks, 48),
          prefix_cache_match(pc, toks, 49));
    prefix_cache_get_stats(pc, &st);
    CHECK(st.lookups == lookups0, "match counted as a lookup");
    /* an exact match is never returned whole: one token must be left to feed */
    int matched;
    CHECK(prefix_cache_restore(pc, s, toks, 48, &matched, err, sizeof err) == 0 && matched == 40, "exact 48 → %d", matched);
    /* a different first token: miss, session reset */
    int32_t other[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    CHECK(prefix_cache_restore(pc, s, other, 10, &matched, err, sizeof err) == 0 && matched == 0 && session_length(s) == 0, "miss");
    prefix_cache_get_stats(pc, &st);
    CHECK(st.hits == 3 && st.hit_tokens == 48 + 40 + 40, "hits %llu tokens %llu", (unsigned long long)st.hits, (unsigned long long)st.hit_tokens);
    prefix_cache_free(pc);

    /* eviction: a budget for about two checkpoints of 20 tokens (5 chunks of 4 rows) */
    const size_t one = state + 20 * row + 20 * 4 + 512;
    CHECK(prefix_cache_create(&pc, e, 2 * one + one / 2, err, sizeof err) == 0, "%s", err);
    prefix_cache_set_chunk_rows(pc, 4);
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
    /* saves 3 and 4 took the evicted checkpoints' state blocks and KV chunks */
    CHECK(st.host_allocs == 12 && st.host_frees == 0 && st.pooled == 0,
          "host blocks allocated %llu (want 12), freed %llu, pooled %zu", (unsigned long long)st.host_allocs,
          (unsigned long long)st.host_frees, st.pooled);
    for (int k = 0; k < 4; k++) { /* the two newest hit, the two oldest miss; all give exact-feed logits */
        int32_t t[24];
        for (int i = 0; i < 20; i++) t[i] = (toks[i] + 1000 * (k + 1)) % V;
        for (int i = 20; i < 24; i++) t[i] = toks[i];
        const int m = resumed_logits(pc, s, t, 24, a);
        CHECK(m == (k >= 2 ? 20 : 0), "sequence %d matched %d", k, m);
        fresh_logits(t, 24, b);
        CHECK(rel_err(a, b, V) < 1e-5, "after eviction, sequence %d: %.3g", k, rel_err(a, b, V));
    }
    /* a shorter checkpoint: takes the evicted entry's state block and 3 of its 5 chunks
     * (10 rows, the last chunk half used); the other two stay pooled, inside the budget
     * (freed with the cache) */
    int32_t t10[14];
    for (int i = 0; i < 14; i++) t10[i] = (toks[i] + 7000) % V;
    CHECK(resumed_logits(pc, s, t10, 10, a) == 0, "10-token sequence must miss");
    CHECK(prefix_cache_save(pc, s, err, sizeof err) == 0, "%s", err);
    prefix_cache_get_stats(pc, &st);
    CHECK(st.evictions == 3 && st.host_allocs == 12 && st.pooled == 2 * 4 * row && st.bytes + st.pooled <= st.max_bytes,
          "evictions %llu, allocs %llu, pooled %zu, bytes %zu", (unsigned long long)st.evictions,
          (unsigned long long)st.host_allocs, st.pooled, st.bytes);
    CHECK(resumed_logits(pc, s, t10, 14, a) == 10, "the 10-token checkpoint must hit");
    fresh_logits(t10, 14, b);
    CHECK(rel_err(a, b, V) < 1e-5, "10-token checkpoint: %.3g", rel_err(a, b, V));
    /* a checkpoint larger than the whole budget (240 rows: 60 chunks) is skipped, nothing evicted for it */
    CHECK(state + 240 * row > 2 * one + one / 2, "the 240-token checkpoint must exceed the budget");
    int32_t big[240];
    for (int i = 0; i < 240; i++) big[i] = (toks[i % 80] + 5 * i + 9) % V;
    feed(s, big, 240);
    struct prefix_cache_stats before = st;
    CHECK(prefix_cache_save(pc, s, err, sizeof err) == 0, "%s", err);
    prefix_cache_get_stats(pc, &st);
    CHECK(st.skipped == before.skipped + 1 && st.entries == before.entries && st.evictions == before.evictions &&
              st.host_allocs == before.host_allocs && st.pooled == before.pooled,
          "oversized: skipped %llu entries %zu", (unsigned long long)st.skipped, st.entries);
    prefix_cache_free(pc);

    test_churn(s, toks);
    test_default_chunk(s, toks);
    session_close(s);
    free(a);
    free(b);
    engine_close(e);
    return check_summary();
}
