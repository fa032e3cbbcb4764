/* model/prefix_cache.c — see prefix_cache.h.
 *
 * Entries live in one list; lookups scan it (tens to hundreds of entries, each
 * compared by memcmp over its tokens), which is small next to one prefill chunk.
 * An entry owns: its token list, the recurrent state, and the KV rows of positions
 * [parent->n, n). Restoring walks the parent chain to load every KV segment.
 *
 * State and KV live in host blocks from the engine's host allocator (pinned under
 * CUDA: the device copies run at full speed) or, when it fails, malloc. Pinning is
 * slow (cudaMallocHost ~0.5 ms per MB on the H200 host; cudaFreeHost synchronises the
 * device), and both run on the scheduler thread between decode steps of every stream,
 * so blocks are pooled and reused rather than freed. Two sizes only:
 *   - one state block an entry (engine_state_bytes, ~60 MB for the real model);
 *   - its KV rows in chunks of chunk_rows rows, every chunk chunk_bytes =
 *     chunk_rows * kv_row_bytes (max(16, 2 MiB / kv_row_bytes) rows: 102 rows of
 *     20,480 B for the real model; less in budgets under 128 MiB, see CHUNK_SHARE);
 *     chunk i of an entry holds rows [parent_n + i * chunk_rows, ...), the last one
 *     partly used.
 * A block sized exactly for its entry's rows (the former layout) rarely fitted the
 * next save when lengths varied (512-token prompt checkpoints beside 768-token finish
 * checkpoints whose parents were evicted): saves freed pooled blocks and pinned fresh
 * ones, costing ~10% of the 64-stream throughput on the H200 (3,047 tok/s with the
 * cache off, 2,680–2,785 on). With chunks, any evicted entry's blocks serve any save.
 *
 * An evicted entry's blocks go to the pool (a fixed array) that the next saves take
 * from, by exact size. Pooled blocks count against max_bytes with the entries
 * (entries' bytes + pooled <= max_bytes); every block is charged at its whole size.
 * A save takes what it can from the pool, then makes room: it frees pooled blocks
 * (all of sizes it no longer needs) only when that alone makes room, else evicts the
 * least recently used leaf (whose blocks it then takes), and pins fresh blocks for the
 * rest. Once the mix of state blocks and chunks settles, saves allocate nothing.
 */
#include "model/prefix_cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/status.h"
#include "runtime/timing.h"

#define CHUNK_BYTES ((size_t)2 << 20) /* KV chunk size aimed at (a whole number of rows) */
#define CHUNK_ROWS_MIN 16             /* rows a chunk at least, whatever a row's size */
#define CHUNK_SHARE 64                /* a chunk at most max_bytes / CHUNK_SHARE (then rounded up to CHUNK_ROWS_MIN rows) */
#define POOL_MAX 1024 /* pooled blocks at most: the default 2 GiB budget in 2 MiB chunks (their bytes are bounded by max_bytes) */

/* A host block: from engine_host_alloc (engine = true) or malloc. */
struct hbuf {
    void *p;
    size_t cap;
    bool engine;
};

struct entry {
    int32_t *tokens; /* [n] */
    int n;
    int n_kv;             /* chunks in kv[]: ceil((n - parent_n) / chunk_rows), 0 without KV */
    struct entry *parent; /* longest checkpoint that is a prefix of this one, or NULL */
    struct hbuf state;    /* engine_state_bytes */
    size_t bytes;         /* the entry's charge: this struct, tokens, state and every chunk whole */
    int children;
    uint64_t last_used;
    struct entry *next;
    struct hbuf kv[]; /* [n_kv], chunk_bytes each; rows [parent_n + i * chunk_rows, min(+ chunk_rows, n)) */
};

struct prefix_cache {
    engine *e;
    size_t max_bytes, state_bytes, kv_row_bytes;
    int chunk_rows;     /* fixed once a block exists (prefix_cache_set_chunk_rows) */
    size_t chunk_bytes; /* chunk_rows * kv_row_bytes; 0 when the engine has no KV */
    struct entry *head;
    uint64_t clock;
    struct hbuf pool[POOL_MAX]; /* free blocks kept for reuse */
    int n_pool;
    struct prefix_cache_stats st; /* st.pooled: the pool's bytes */
};

/* ---- host blocks ---- */

static void hbuf_free(prefix_cache *pc, struct hbuf *b) {
    if (!b->p) return;
    const double t0 = now_seconds();
    if (b->engine) engine_host_free(pc->e, b->p);
    else free(b->p);
    pc->st.host_alloc_s += now_seconds() - t0;
    pc->st.host_frees++;
    b->p = NULL;
}

/* A fresh block: the engine's (pinned) memory when it has some, else malloc
 * (`fallback`: prewarm wants pinned memory or nothing). */
static bool hbuf_alloc(prefix_cache *pc, size_t size, bool fallback, struct hbuf *b) {
    const double t0 = now_seconds();
    b->cap = size;
    b->engine = true;
    if (!(b->p = engine_host_alloc(pc->e, size)) && fallback) {
        b->engine = false;
        b->p = malloc(size);
    }
    pc->st.host_alloc_s += now_seconds() - t0;
    if (b->p) pc->st.host_allocs++;
    return b->p != NULL;
}

/* Takes a pooled block of exactly size bytes (the newest: likelier in cache). */
static bool pool_take(prefix_cache *pc, size_t size, struct hbuf *out) {
    for (int i = pc->n_pool - 1; i >= 0; i--)
        if (pc->pool[i].cap == size) {
            *out = pc->pool[i];
            pc->pool[i] = pc->pool[--pc->n_pool];
            pc->st.pooled -= out->cap;
            return true;
        }
    return false;
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

/* Frees one pooled block towards `excess` bytes: the smallest that covers it alone,
 * else the largest (fewest bytes freed beyond the need). false if the pool is empty. */
static bool pool_drop(prefix_cache *pc, size_t excess) {
    if (!pc->n_pool) return false;
    int pick = -1, big = 0;
    for (int i = 0; i < pc->n_pool; i++) {
        const size_t cap = pc->pool[i].cap;
        if (cap > pc->pool[big].cap) big = i;
        if (cap >= excess && (pick < 0 || cap < pc->pool[pick].cap)) pick = i;
    }
    if (pick < 0) pick = big;
    pc->st.pooled -= pc->pool[pick].cap;
    hbuf_free(pc, &pc->pool[pick]);
    pc->pool[pick] = pc->pool[--pc->n_pool];
    return true;
}

/* Pins up to n blocks of `size` into the pool within max_bytes; how many it got. */
static int prewarm_blocks(prefix_cache *pc, size_t size, int n) {
    int k = 0;
    while (k < n && pc->n_pool < POOL_MAX && pc->st.bytes + pc->st.pooled + size <= pc->max_bytes) {
        struct hbuf b;
        if (!hbuf_alloc(pc, size, false, &b)) break;
        pool_put(pc, &b);
        k++;
    }
    return k;
}

int prefix_cache_prewarm(prefix_cache *pc, int n) {
    if (!engine_host_pinned(pc->e) || !pc->state_bytes) return 0;
    const bool chunks = n < 0;
    if (n < 0) { /* three quarters of the budget in state blocks, the rest in KV chunks */
        const size_t fit = pc->max_bytes / 4 * 3 / pc->state_bytes;
        n = fit < POOL_MAX ? (int)fit : POOL_MAX;
    }
    int k = prewarm_blocks(pc, pc->state_bytes, n);
    if (chunks && pc->chunk_bytes) k += prewarm_blocks(pc, pc->chunk_bytes, POOL_MAX);
    return k;
}

static void set_chunk_rows(prefix_cache *pc, int rows) {
    pc->chunk_rows = rows;
    pc->chunk_bytes = (size_t)rows * pc->kv_row_bytes;
}

void prefix_cache_set_chunk_rows(prefix_cache *pc, int rows) {
    if (rows < 1 || pc->st.host_allocs || pc->head) return; /* blocks of the old size exist */
    set_chunk_rows(pc, rows);
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
    /* a chunk of CHUNK_BYTES, but at most 1/CHUNK_SHARE of a small budget: 2 MiB chunks
     * in a budget of a few MiB (a small model's tests) would leave no room for any entry */
    const size_t bytes = max_bytes / CHUNK_SHARE < CHUNK_BYTES ? max_bytes / CHUNK_SHARE : CHUNK_BYTES;
    const size_t rows = pc->kv_row_bytes ? bytes / pc->kv_row_bytes : 0;
    set_chunk_rows(pc, rows > CHUNK_ROWS_MIN ? (int)rows : CHUNK_ROWS_MIN);
    pc->st.max_bytes = max_bytes;
    *out = pc;
    return 0;
}

/* Frees an entry; its blocks go to the pool when `keep`, else are freed. */
static void entry_free(prefix_cache *pc, struct entry *x, bool keep) {
    if (keep) pool_put(pc, &x->state);
    hbuf_free(pc, &x->state);
    for (int i = 0; i < x->n_kv; i++) {
        if (keep) pool_put(pc, &x->kv[i]);
        hbuf_free(pc, &x->kv[i]);
    }
    free(x->tokens);
    free(x);
}

void prefix_cache_free(prefix_cache *pc) {
    if (!pc) return;
    for (struct entry *x = pc->head, *nx; x; x = nx) {
        nx = x->next;
        entry_free(pc, x, false);
    }
    while (pool_drop(pc, 0)) {}
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

/* Copies x's KV rows between the session and its chunks (save: to the chunks). */
static int copy_kv(prefix_cache *pc, session *s, const struct entry *x, bool save, char *err, size_t errlen) {
    const int p0 = x->parent ? x->parent->n : 0;
    for (int i = 0; i < x->n_kv; i++) {
        const int r0 = p0 + i * pc->chunk_rows;
        const int rows = x->n - r0 < pc->chunk_rows ? x->n - r0 : pc->chunk_rows;
        const int rc = save ? session_save_kv(s, r0, rows, x->kv[i].p, err, errlen)
                            : session_load_kv(s, r0, rows, x->kv[i].p, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

int prefix_cache_match(prefix_cache *pc, const int32_t *tokens, int n) {
    const struct entry *best = n > 1 ? longest_prefix(pc, tokens, n, n - 1) : NULL;
    return best ? best->n : 0;
}

static int restore(prefix_cache *pc, session *s, const int32_t *tokens, int n, int *matched, char *err, size_t errlen) {
    *matched = 0;
    pc->st.lookups++;
    struct entry *best = n > 1 ? longest_prefix(pc, tokens, n, n - 1) : NULL;
    if (!best || best->n > session_capacity(s)) {
        session_reset(s);
        return 0;
    }
    int rc = session_load_state(s, best->state.p, best->tokens, best->n, err, errlen);
    for (struct entry *x = best; x && rc == 0; x = x->parent) {
        rc = copy_kv(pc, s, x, false, err, errlen);
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

int prefix_cache_restore(prefix_cache *pc, session *s, const int32_t *tokens, int n, int *matched, char *err, size_t errlen) {
    const double t0 = now_seconds();
    const int rc = restore(pc, s, tokens, n, matched, err, errlen);
    pc->st.restore_s += now_seconds() - t0;
    return rc;
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

/* Gives x its state block and its n_kv chunks, x->bytes in all: pooled blocks first;
 * then room made within max_bytes — pooled blocks freed (after the takes, none is of
 * a size still needed) when that alone makes room, else an LRU leaf evicted (its
 * blocks pooled, then taken) — then fresh blocks for the rest. false: no room, or out
 * of memory (*oom); the caller puts x's blocks back into the pool (all of them fit
 * the budget: taken from it, or allocated within the room made). */
static bool get_blocks(prefix_cache *pc, struct entry *x, bool *oom) {
    *oom = false;
    int have = 0; /* x->kv[0, have) are filled */
    for (;;) {
        if (!x->state.p) pool_take(pc, pc->state_bytes, &x->state);
        while (have < x->n_kv && pool_take(pc, pc->chunk_bytes, &x->kv[have])) have++;
        const size_t used = pc->st.bytes + pc->st.pooled + x->bytes;
        if (used <= pc->max_bytes) break;
        const size_t excess = used - pc->max_bytes;
        if (pc->st.pooled >= excess) pool_drop(pc, excess);
        else if (!evict_one(pc)) return false; /* nothing evictable: freeing pooled blocks would not help */
    }
    if (!x->state.p && !hbuf_alloc(pc, pc->state_bytes, true, &x->state)) *oom = true;
    for (; have < x->n_kv && !*oom; have++)
        if (!hbuf_alloc(pc, pc->chunk_bytes, true, &x->kv[have])) *oom = true;
    return !*oom;
}

static int save(prefix_cache *pc, session *s, char *err, size_t errlen) {
    const int n = session_length(s);
    const int32_t *tokens = session_tokens(s);
    if (n < 1) return 0;
    struct entry *parent = longest_prefix(pc, tokens, n, n);
    if (parent && parent->n == n) { /* already checkpointed */
        parent->last_used = ++pc->clock;
        return 0;
    }
    const int p0 = parent ? parent->n : 0;
    const int n_kv = pc->chunk_bytes ? (n - p0 + pc->chunk_rows - 1) / pc->chunk_rows : 0;
    const size_t meta = sizeof(struct entry) + (size_t)n_kv * sizeof(struct hbuf);
    const size_t bytes = meta + (size_t)n * sizeof(int32_t) + pc->state_bytes + (size_t)n_kv * pc->chunk_bytes;
    if (bytes > pc->max_bytes) {
        pc->st.skipped++;
        return 0;
    }
    struct entry *x = calloc(1, meta); /* with its kv[] */
    if (!x || !(x->tokens = malloc((size_t)n * sizeof(int32_t)))) {
        free(x);
        return errorf(err, errlen, ST_NOMEM, "out of memory for a %zu-byte checkpoint", bytes);
    }
    x->n_kv = n_kv;
    x->bytes = bytes;
    int rc = 0;
    if (parent) parent->children++; /* protect the parent while making room */
    bool oom;
    if (!get_blocks(pc, x, &oom)) {
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
    if ((rc = copy_kv(pc, s, x, true, err, errlen))) goto fail;
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

int prefix_cache_save(prefix_cache *pc, session *s, char *err, size_t errlen) {
    const double t0 = now_seconds();
    const int rc = save(pc, s, err, errlen);
    pc->st.save_s += now_seconds() - t0;
    return rc;
}

void prefix_cache_get_stats(const prefix_cache *pc, struct prefix_cache_stats *st) { *st = pc->st; }
