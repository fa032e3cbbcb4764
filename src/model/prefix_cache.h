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
 * is kept while they live). The host buffers are the engine's (pinned under CUDA);
 * an evicted checkpoint's buffers are kept for reuse by later saves, inside the same
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
    uint64_t host_allocs; /* host buffers allocated (not taken from the pool) */
    size_t entries, bytes, max_bytes;
    size_t pooled;        /* bytes of free buffers kept for reuse; bytes + pooled <= max_bytes */
};

int prefix_cache_create(prefix_cache **out, engine *e, size_t max_bytes, char *err, size_t errlen);
void prefix_cache_free(prefix_cache *pc);

/* Restores into s the longest checkpoint whose tokens are a prefix of tokens[0, n) and
 * strictly shorter than n (one token at least is left to feed, for logits). *matched
 * receives its length; 0 means none, and s is reset. On error s is reset too. */
int prefix_cache_restore(prefix_cache *pc, session *s, const int32_t *tokens, int n, int *matched, char *err, size_t errlen);

/* Saves s's current state unless a checkpoint of exactly these tokens exists (then it
 * is only marked as recently used). Not saving for lack of memory is not an error. */
int prefix_cache_save(prefix_cache *pc, session *s, char *err, size_t errlen);

/* Allocates up to n state-sized blocks of the engine's pinned memory into the pool now
 * (within max_bytes and the pool's room; none when the engine's host memory is plain
 * malloc, which costs nothing to get later), so the first saves take them instead of
 * pinning fresh memory while a request waits. n < 0: the default, as many as fill three
 * quarters of max_bytes (at most the pool's 32). Returns how many it allocated. */
int prefix_cache_prewarm(prefix_cache *pc, int n);

void prefix_cache_get_stats(const prefix_cache *pc, struct prefix_cache_stats *st);

#endif
