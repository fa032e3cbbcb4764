/* model/prefix_cache.c — see prefix_cache.h.
 *
 * Entries live in one list; lookups scan it (tens to hundreds of entries, each
 * compared by memcmp over its tokens), which is small next to one prefill chunk.
 * An entry owns: its token list, the recurrent state, and the KV rows of positions
 * [parent->n, n). Restoring walks the parent chain to load every KV segment.
 *
 * State and KV live in host blocks from the engine's host allocator (pinned under
 * CUDA: the device copies run at full speed) or, when it fails, malloc. Pinning is
 * slow per call, so an evicted entry's blocks go to a small pool that the next saves
 * take from (the state block always fits: one size; a KV block when it is at most
 * 1/8 larger than needed). Pooled blocks count against max_bytes with the entries
 * (entries' bytes + pooled <= max_bytes); a save that needs room frees pooled blocks
 * before it evicts an entry. Every block is charged at its whole size.
 */
#include "model/prefix_cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/status.h"

#define POOL_MAX 32 /* pooled blocks at most (their bytes are bounded by max_bytes) */

/* A host block: from engine_host_alloc (engine = true) or malloc. */
struct hbuf {
    void *p;
    size_t cap;
    bool engine;
};

struct entry {
    int32_t *tokens;
    int n;
    struct entry *parent; /* longest checkpoint that is a prefix of this one, or NULL */
    struct hbuf state;    /* engine_state_bytes */
    struct hbuf kv;       /* rows [parent_n, n); p NULL when there are none */
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
    struct hbuf pool[POOL_MAX]; /* free blocks kept for reuse */
    int n_pool;
    struct prefix_cache_stats st; /* st.pooled: the pool's bytes */
};

/* ---- host blocks ---- */

static void hbuf_free(prefix_cache *pc, struct hbuf *b) {
    if (!b->p) return;
    if (b->engine) engine_host_free(pc->e, b->p);
    else free(b->p);
    b->p = NULL;
}

/* A fresh block: the engine's (pinned) memory when it has some, else malloc. */
static bool hbuf_alloc(prefix_cache *pc, size_t size, struct hbuf *b) {
    b->cap = size;
    b->engine = true;
    if (!(b->p = engine_host_alloc(pc->e, size))) {
        b->engine = false;
        b->p = malloc(size);
    }
    if (b->p) pc->st.host_allocs++;
    return b->p != NULL;
}

/* Takes the smallest pooled block of at least size and at most size + slack bytes. */
static bool pool_take(prefix_cache *pc, size_t size, size_t slack, struct hbuf *out) {
    int best = -1;
    for (int i = 0; i < pc->n_pool; i++) {
        const size_t cap = pc->pool[i].cap;
        if (cap >= size && cap - size <= slack && (best < 0 || cap < pc->pool[best].cap)) best = i;
    }
    if (best < 0) return false;
    *out = pc->pool[best];
    pc->pool[best] = pc->pool[--pc->n_pool];
    pc->st.pooled -= out->cap;
    return true;
}

/* Keeps a block for reuse (frees it when the pool is full); b no longer owns it. */
static void pool_put(prefix_cache *pc, struct hbuf *b) {
    if (!b->p) return;
    if (pc->n_pool == POOL_MAX) {
        hbuf_free(pc, b);
        return;
    }
    pc->pool[pc->n_pool++] = *b;
    pc->st.pooled += b->cap;
    b->p = NULL;
}

int prefix_cache_prewarm(prefix_cache *pc, int n) {
    if (!engine_host_pinned(pc->e) || !pc->state_bytes) return 0;
    if (n < 0) { /* three quarters of the budget: the rest stays for KV blocks before pooled ones are freed */
        const size_t fit = pc->max_bytes / 4 * 3 / pc->state_bytes;
        n = fit < POOL_MAX ? (int)fit : POOL_MAX;
    }
    int k = 0;
    while (k < n && pc->n_pool < POOL_MAX && pc->st.bytes + pc->st.pooled + pc->state_bytes <= pc->max_bytes) {
        struct hbuf b = {.cap = pc->state_bytes, .engine = true};
        if (!(b.p = engine_host_alloc(pc->e, pc->state_bytes))) break;
        pc->st.host_allocs++;
        pool_put(pc, &b);
        k++;
    }
    return k;
}

/* Frees the largest pooled block; false if the pool is empty. */
static bool pool_drop(prefix_cache *pc) {
    if (!pc->n_pool) return false;
    int big = 0;
    for (int i = 1; i < pc->n_pool; i++)
        if (pc->pool[i].cap > pc->pool[big].cap) big = i;
    pc->st.pooled -= pc->pool[big].cap;
    hbuf_free(pc, &pc->pool[big]);
    pc->pool[big] = pc->pool[--pc->n_pool];
    return true;
}

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

/* Frees an entry; its blocks go to the pool when `keep`, else are freed. */
static void entry_free(prefix_cache *pc, struct entry *x, bool keep) {
    if (keep) {
        pool_put(pc, &x->state);
        pool_put(pc, &x->kv);
    }
    hbuf_free(pc, &x->state);
    hbuf_free(pc, &x->kv);
    free(x->tokens);
    free(x);
}

void prefix_cache_free(prefix_cache *pc) {
    if (!pc) return;
    for (struct entry *x = pc->head, *nx; x; x = nx) {
        nx = x->next;
        entry_free(pc, x, false);
    }
    while (pool_drop(pc)) {}
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
    int rc = session_load_state(s, best->state.p, best->tokens, best->n, err, errlen);
    for (struct entry *x = best; x && rc == 0; x = x->parent) {
        const int p0 = x->parent ? x->parent->n : 0;
        if (x->n > p0) rc = session_load_kv(s, p0, x->n - p0, x->kv.p, err, errlen);
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

/* Unlinks the least recently used entry without children and frees it, its blocks
 * into the pool; false if none. */
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
    entry_free(pc, x, true);
    return true;
}

/* The blocks of a new checkpoint of `state` + `kv` bytes (kv may be 0): pooled ones
 * where they fit, then room made within max_bytes — pooled blocks freed first, then
 * LRU leaves evicted (their blocks pooled, and taken when they fit) — then fresh
 * blocks for the rest. *bytes: the entry's charge (fixed + the blocks' sizes).
 * false: no room (nothing changed but evictions) or out of memory (*oom). */
static bool get_blocks(prefix_cache *pc, size_t fixed, size_t kv, struct entry *x, size_t *bytes, bool *oom) {
    *oom = false;
    for (;;) {
        if (!x->state.p) pool_take(pc, pc->state_bytes, 0, &x->state);
        if (kv && !x->kv.p) pool_take(pc, kv, kv / 8, &x->kv);
        *bytes = fixed + (x->state.p ? x->state.cap : pc->state_bytes) + (x->kv.p ? x->kv.cap : kv);
        if (pc->st.bytes + pc->st.pooled + *bytes <= pc->max_bytes) break;
        if (!pool_drop(pc) && !evict_one(pc)) {
            pool_put(pc, &x->state);
            pool_put(pc, &x->kv);
            return false;
        }
    }
    if ((!x->state.p && !hbuf_alloc(pc, pc->state_bytes, &x->state)) || (kv && !x->kv.p && !hbuf_alloc(pc, kv, &x->kv))) {
        *oom = true;
        return false;
    }
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
    struct entry *x = calloc(1, sizeof *x);
    int rc = 0;
    if (!x || !(x->tokens = malloc((size_t)n * sizeof(int32_t)))) {
        if (x) free(x);
        return errorf(err, errlen, ST_NOMEM, "out of memory for a %zu-byte checkpoint", bytes);
    }
    if (parent) parent->children++; /* protect the parent while making room */
    const size_t fixed = sizeof(struct entry) + (size_t)n * sizeof(int32_t);
    bool oom;
    if (!get_blocks(pc, fixed, (size_t)(n - p0) * pc->kv_row_bytes, x, &x->bytes, &oom)) {
        if (oom) {
            rc = errorf(err, errlen, ST_NOMEM, "out of memory for a %zu-byte checkpoint", bytes);
            goto fail;
        }
        if (parent) parent->children--;
        pc->st.skipped++;
        entry_free(pc, x, true);
        return 0;
    }
    memcpy(x->tokens, tokens, (size_t)n * sizeof(int32_t));
    x->n = n;
    x->parent = parent;
    if ((rc = session_save_state(s, x->state.p, err, errlen))) goto fail;
    if (n > p0 && (rc = session_save_kv(s, p0, n - p0, x->kv.p, err, errlen))) goto fail;
    x->last_used = ++pc->clock;
    x->next = pc->head;
    pc->head = x;
    pc->st.bytes += x->bytes;
    pc->st.entries++;
    pc->st.saves++;
    return 0;
fail:
    if (parent) parent->children--;
    entry_free(pc, x, true);
    return rc;
}

void prefix_cache_get_stats(const prefix_cache *pc, struct prefix_cache_stats *st) { *st = pc->st; }
