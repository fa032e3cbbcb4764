/* model/prefix_cache.h — checkpoints of whole session states, so a request whose
 * tokens start with an earlier sequence resumes from there and prefills only the rest.
 *
 * Hybrid models make this harder than KV reuse: attention KV can be cut at any token,
 * but the Gated DeltaNet conv and recurrent state exist only at the positions where
 * they were saved. A checkpoint therefore holds, for one exact token list: the
 * recurrent state of every linear layer (fixed size) and the KV rows of the attention
 * layers. KV is shared along a tree: a checkpoint stores only the rows past its
 * parent (the longest checkpoint that is a prefix of it), so two conversations that
 * branch from one system prompt share that prompt's KV instead of copying it.
 *
 * Token equality alone decides a hit. Memory is bounded (max_bytes); when a save
 * would exceed it, least-recently-used leaves are evicted (a checkpoint with children
 * is kept while they live). The host buffers are the engine's (pinned under CUDA):
 * one state block a checkpoint and its KV rows in fixed-size chunks (2 MiB each, less
 * in a small budget), so that every buffer is one of two sizes and an evicted
 * checkpoint's buffers are reused by later saves of any length, inside the same
 * max_bytes. Only the scheduler thread may use a cache.
 */
#ifndef ORCHID_PREFIX_CACHE_H
#define ORCHID_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "model/engine.h"

typedef struct prefix_cache prefix_cache;

struct prefix_cache_stats {
    uint64_t lookups, hits, hit_tokens, saves, evictions, skipped;
    uint64_t host_allocs; /* host buffers allocated (not taken from the pool), prewarm's too */
    uint64_t host_frees;  /* host buffers freed (pooled ones dropped to make room, the pool's overflow) */
    size_t entries, bytes, max_bytes;
    size_t pooled;        /* bytes of free buffers kept for reuse; bytes + pooled <= max_bytes */
    /* wall seconds inside prefix_cache_save, prefix_cache_restore, and the host
     * allocator (engine_host_alloc / engine_host_free, or malloc / free) called by
     * the cache, prewarm included; the last is part of the first when a save allocates */
    double save_s, restore_s, host_alloc_s;
};

int prefix_cache_create(prefix_cache **out, engine *e, size_t max_bytes, char *err, size_t errlen);
void prefix_cache_free(prefix_cache *pc);

/* Restores into s the longest checkpoint whose tokens are a prefix of tokens[0, n) and
 * strictly shorter than n (one token at least is left to feed, for logits). *matched
 * receives its length; 0 means none, and s is reset. On error s is reset too. */
int prefix_cache_restore(prefix_cache *pc, session *s, const int32_t *tokens, int n, int *matched, char *err, size_t errlen);

/* The length of the checkpoint prefix_cache_restore would restore for tokens[0, n) now
 * (0: none), without restoring it or counting a lookup. */
int prefix_cache_match(prefix_cache *pc, const int32_t *tokens, int n);

/* Saves s's current state unless a checkpoint of exactly these tokens exists (then it
 * is only marked as recently used). Not saving for lack of memory is not an error. */
int prefix_cache_save(prefix_cache *pc, session *s, char *err, size_t errlen);

/* Allocates blocks of the engine's pinned memory into the pool now (within max_bytes
 * and the pool's room of 1024 blocks; none when the engine's host memory is plain
 * malloc, which costs nothing to get later), so the first saves take them instead of
 * pinning fresh memory while a request waits. n >= 0: n state blocks. n < 0: the
 * default, state blocks filling three quarters of max_bytes, then KV chunks filling
 * the rest. Returns how many blocks it allocated (state blocks and chunks). */
int prefix_cache_prewarm(prefix_cache *pc, int n);

void prefix_cache_get_stats(const prefix_cache *pc, struct prefix_cache_stats *st);

/* Test hook: KV chunks of `rows` rows instead of the default (max(16, min(2 MiB,
 * max_bytes / 64) / the engine's KV bytes per token)), so unit tests can cross chunk
 * boundaries with short sequences. Only before the cache's first host block (first save
 * or prewarm); ignored then, and for rows < 1. */
void prefix_cache_set_chunk_rows(prefix_cache *pc, int rows);

#endif
