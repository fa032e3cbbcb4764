/* server/metrics.h — process-wide server counters, gauges and histograms,
 * rendered in the Prometheus text exposition format for GET /metrics.
 * Every function is thread-safe (one mutex; observations are O(buckets), no
 * allocation), so the scheduler may record per-token latencies. */
#ifndef ORCHID_SERVER_METRICS_H
#define ORCHID_SERVER_METRICS_H

#include <stddef.h>

enum metrics_endpoint {
    EP_CHAT = 0,
    EP_COMPLETIONS,
    EP_MODELS,
    EP_HEALTH,
    EP_METRICS,
    EP_MESSAGES,       /* Anthropic /v1/messages */
    EP_COUNT_TOKENS,   /* Anthropic /v1/messages/count_tokens */
    EP_RESPONSES,      /* OpenAI /v1/responses */
    EP_TOKENIZE,       /* /tokenize (vLLM, llama.cpp) */
    EP_DETOKENIZE,     /* /detokenize */
    EP_OTHER,
    EP_COUNT
};

void metrics_init(void);
void metrics_request(enum metrics_endpoint ep, int status);
/* One finished generation (stop or length): its prompt, completion and reused (cached)
 * tokens; counted as a prefix hit when cached > 0. */
void metrics_tokens(long prompt, long completion, long cached);
void metrics_cancelled(void);
/* A request held in the queue for a running request's checkpoint of their shared prefix. */
void metrics_shared_prefix_wait(void);
/* Tokens chosen from the backend's argmax, with no logits row copied to the host. */
void metrics_argmax_tokens(long n);
/* Tokens drawn by the device sampler, with no logits row copied to the host. */
void metrics_device_sampled_tokens(long n);
/* One scheduler step's model forwards and the tokens they carried. */
void metrics_forward(long calls, long tokens);
/* One scheduler step's wall time, split: forward_s inside the model's forward calls (host
 * preparation and the device's work, which the scheduler waits for), host_s the rest of the
 * step on the scheduler thread (admission, batch building, host sampling, handing tokens
 * to their requests, checkpoint saves) — time the device sits idle between forwards. */
void metrics_step(double forward_s, double host_s);
void metrics_queue(int queued, int running);
/* Tokens held by all sessions (running and kept for prefix reuse) and their capacity. */
void metrics_kv(long used, long capacity);
/* The prefix cache's numbers (model/prefix_cache.h's stats, as plain numbers), for
 * metrics_prefix_cache. Counts are since the cache was created; sizes are now. */
struct metrics_cache_stats {
    long entries;        /* checkpoints held (count) */
    long bytes;          /* host bytes those checkpoints hold (bytes) */
    long max_bytes;      /* the cache's budget: checkpoints + pooled blocks (bytes) */
    long pooled;         /* free host blocks kept for reuse (bytes) */
    long lookups;        /* checkpoint lookups: requests whose slot held no usable prefix (count) */
    long hits;           /* ... that restored a checkpoint (count) */
    long saves;          /* checkpoints saved (count) */
    long evictions;      /* checkpoints evicted to make room (count) */
    long host_allocs;    /* host blocks allocated, not taken from the pool, prewarm's too (count) */
    long host_frees;     /* host blocks freed (count) */
    double save_s;       /* wall time inside checkpoint saves (seconds) */
    double restore_s;    /* wall time inside checkpoint restores (seconds) */
    double host_alloc_s; /* wall time in the host allocator, prewarm included (seconds) */
};
/* Records *st (copied) as the prefix cache's current numbers. Rendered only once
 * called (a server without a cache shows none). */
void metrics_prefix_cache(const struct metrics_cache_stats *st);
void metrics_ttft(double seconds);
void metrics_itl(double seconds);
void metrics_e2e(double seconds);
/* Reads a counter (tests): "cancelled", "completion_tokens", "prompt_tokens", "cached_tokens",
 * "generations", "hit_generations", "shared_prefix_waits",
 * "argmax_tokens", "device_sampled_tokens", "forward_calls", "forward_tokens", "steps". */
long metrics_get(const char *name);
/* Renders the exposition text; *out malloc'd. Returns 0 or ST_NOMEM. */
int metrics_render(char **out, size_t *len);

#endif
