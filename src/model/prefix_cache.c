/* model/prefix_cache.c — see prefix_cache.h.
 *
 * Entries live in one list; lookups scan it (tens to hundreds of entries, each
 * compared by memcmp over its tokens), which is small next to one prefill chunk.
 * An entry owns: its token list, the recurrent state, and the KV rows of positions
 * [parent->n, n). Restoring walks the parent chain to load every KV segment.
 */
#include "model/prefix_cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/status.h"

struct entry {
    int32_t *tokens;
    int n;
    struct entry *parent; /* longest checkpoint that is a prefix of this one, or NULL */
    void *state;          /* engine_state_bytes */
    void *kv;             /* rows [parent_n, n) */
    size_t bytes;
    int children;
    uint64_t last_used;
    struct entry *next;
};

struct prefix_cache {
    engine *e;
    size_t max_bytes, state_bytes, kv_row_bytes;
    struct entry *head;
    uint64_t clock;
    struct prefix_cache_stats st;
};

int prefix_cache_create(prefix_cache **out, engine *e, size_t max_bytes, char *err, size_t errlen) {
    *out = NULL;
    if (!engine_state_bytes(e))
        return errorf(err, errlen, ST_UNSUPPORTED, "the %s backend cannot checkpoint sessions", engine_backend_name(e));
    prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return errorf(err, errlen, ST_NOMEM, "out of memory");
    pc->e = e;
    pc->max_bytes = max_bytes;
    pc->state_bytes = engine_state_bytes(e);
    pc->kv_row_bytes = engine_kv_bytes_per_token(e);
    pc->st.max_bytes = max_bytes;
    *out = pc;
    return 0;
}

static void entry_free(struct entry *x) {
    free(x->tokens);
    free(x->state);
    free(x->kv);
    free(x);
}

void prefix_cache_free(prefix_cache *pc) {
    if (!pc) return;
    for (struct entry *x = pc->head, *nx; x; x = nx) {
        nx = x->next;
        entry_free(x);
    }
    free(pc);
}

static bool is_prefix(const struct entry *x, const int32_t *tokens, int n) {
    return x->n <= n && memcmp(x->tokens, tokens, (size_t)x->n * sizeof(int32_t)) == 0;
}

/* Longest entry that is a prefix of tokens[0, n) with length <= limit. */
static struct entry *longest_prefix(prefix_cache *pc, const int32_t *tokens, int n, int limit) {
    struct entry *best = NULL;
    for (struct entry *x = pc->head; x; x = x->next)
        if (x->n <= limit && (!best || x->n > best->n) && is_prefix(x, tokens, n)) best = x;
    return best;
}

int prefix_cache_restore(prefix_cache *pc, session *s, const int32_t *tokens, int n, int *matched, char *err, size_t errlen) {
    *matched = 0;
    pc->st.lookups++;
    struct entry *best = n > 1 ? longest_prefix(pc, tokens, n, n - 1) : NULL;
    if (!best || best->n > session_capacity(s)) {
        session_reset(s);
        return 0;
    }
    int rc = session_load_state(s, best->state, best->tokens, best->n, err, errlen);
    for (struct entry *x = best; x && rc == 0; x = x->parent) {
        const int p0 = x->parent ? x->parent->n : 0;
        if (x->n > p0) rc = session_load_kv(s, p0, x->n - p0, x->kv, err, errlen);
        x->last_used = ++pc->clock;
    }
    if (rc) {
        session_reset(s);
        return rc;
    }
    pc->st.hits++;
    pc->st.hit_tokens += (uint64_t)best->n;
    *matched = best->n;
    return 0;
}

/* Unlinks and frees the least recently used entry without children; false if none. */
static bool evict_one(prefix_cache *pc) {
    struct entry **victim = NULL;
    for (struct entry **p = &pc->head; *p; p = &(*p)->next)
        if ((*p)->children == 0 && (!victim || (*p)->last_used < (*victim)->last_used)) victim = p;
    if (!victim) return false;
    struct entry *x = *victim;
    *victim = x->next;
    if (x->parent) x->parent->children--;
    pc->st.bytes -= x->bytes;
    pc->st.entries--;
    pc->st.evictions++;
    entry_free(x);
    return true;
}

int prefix_cache_save(prefix_cache *pc, session *s, char *err, size_t errlen) {
    const int n = session_length(s);
    const int32_t *tokens = session_tokens(s);
    if (n < 1) return 0;
    struct entry *parent = longest_prefix(pc, tokens, n, n);
    if (parent && parent->n == n) { /* already checkpointed */
        parent->last_used = ++pc->clock;
        return 0;
    }
    const int p0 = parent ? parent->n : 0;
    const size_t bytes = sizeof(struct entry) + (size_t)n * sizeof(int32_t) + pc->state_bytes + (size_t)(n - p0) * pc->kv_row_bytes;
    if (bytes > pc->max_bytes) {
        pc->st.skipped++;
        return 0;
    }
    if (parent) parent->children++; /* protect the parent while making room */
    while (pc->st.bytes + bytes > pc->max_bytes && evict_one(pc)) {}
    if (pc->st.bytes + bytes > pc->max_bytes) {
        if (parent) parent->children--;
        pc->st.skipped++;
        return 0;
    }
    struct entry *x = calloc(1, sizeof *x);
    int rc = 0;
    if (!x || !(x->tokens = malloc((size_t)n * sizeof(int32_t))) || !(x->state = malloc(pc->state_bytes)) ||
        (n > p0 && !(x->kv = malloc((size_t)(n - p0) * pc->kv_row_bytes)))) {
        rc = errorf(err, errlen, ST_NOMEM, "out of memory for a %zu-byte checkpoint", bytes);
        goto fail;
    }
    memcpy(x->tokens, tokens, (size_t)n * sizeof(int32_t));
    x->n = n;
    x->parent = parent;
    x->bytes = bytes;
    if ((rc = session_save_state(s, x->state, err, errlen))) goto fail;
    if (n > p0 && (rc = session_save_kv(s, p0, n - p0, x->kv, err, errlen))) goto fail;
    x->last_used = ++pc->clock;
    x->next = pc->head;
    pc->head = x;
    pc->st.bytes += bytes;
    pc->st.entries++;
    pc->st.saves++;
    return 0;
fail:
    if (parent) parent->children--;
    if (x) entry_free(x);
    return rc;
}

void prefix_cache_get_stats(const prefix_cache *pc, struct prefix_cache_stats *st) { *st = pc->st; }
