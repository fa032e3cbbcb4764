/* server/port.h — the one seam between the server and a model: text functions
 * (render, encode, token bytes; callable from any thread) and model functions
 * (sessions and the batched forward; scheduler thread only).
 *
 * Two implementations exist:
 *   - port_engine.c: the real thing (model/engine.h + text/tokenizer.h +
 *     text/chat.h) for a checkpoint directory;
 *   - port_mock.c: a deterministic scripted model with a byte-level vocabulary
 *     (`orchid serve --mock`), so the HTTP / streaming / parsing / scheduling
 *     layers can be tested exactly (stop strings, tool calls, reasoning) without
 *     weights. It is documented as a test fixture, never a default.
 * The server never calls engine_* or tokenizer_* directly; it calls these.
 */
#ifndef ORCHID_SERVER_PORT_H
#define ORCHID_SERVER_PORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "model/engine.h"
#include "model/sampler.h"

#define PORT_MAX_STOP_IDS 16

struct model_port {
    void *ctx;
    char model_id[64];    /* the id /v1/models reports and requests must name */
    char description[768];/* one line for the start-up banner */
    int vocab;            /* logits width */
    int max_position;     /* model's context limit (0 = unknown) */
    int32_t stop_ids[PORT_MAX_STOP_IDS];
    int n_stop;
    int32_t turn_start_id; /* the token that opens a chat turn (<|im_start|>); -1: none.
                              The scheduler checkpoints prompts at turn starts. */
    int invariant_tokens;  /* engine_invariant_tokens: 0 = any batch is batch-invariant; N =
                              only one-token rows N at most, a prompt chunk alone, and
                              prompt chunks of more than N tokens packed whole */
    int max_batch_tokens;  /* engine_max_batch_tokens: tokens one backend call takes (0: no bound) */
    int device_sampling;   /* engine_device_sampling: forward honours batch_seq.sampling */
    int row_scores;        /* forward honours batch_seq.score (engine_row_scores) */
    struct sampler_params sampling; /* what a request's omitted sampling fields default to: the
                                       checkpoint's generation_config.json (port_engine.c), else greedy */

    /* ---- text side: any thread ---- */
    /* Renders a conversation (OpenAI messages / tools as cJSON) to prompt text.
     * enable_thinking: -1 template default, 0 off, 1 on. *out malloc'd. */
    int (*render_chat)(void *ctx, const cJSON *messages, const cJSON *tools, int enable_thinking,
                       char **out, char *err, size_t errlen);
    /* UTF-8 text -> ids (*ids malloc'd). */
    int (*encode)(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, char *err,
                  size_t errlen);
    /* Raw bytes of a token (NULL if the id is unused). */
    const char *(*token_bytes)(void *ctx, int32_t id, size_t *len);
    /* 1 when the token is a special token whose text is skipped in output. */
    int (*is_special)(void *ctx, int32_t id);

    /* ---- model side: scheduler thread only ---- */
    int (*seq_open)(void *ctx, session **out, int max_seq, char *err, size_t errlen);
    void (*seq_close)(void *ctx, session *s);
    void (*seq_reset)(void *ctx, session *s);
    int (*seq_length)(void *ctx, const session *s);
    const int32_t *(*seq_tokens)(void *ctx, const session *s);
    /* engine_forward's contract, batch_seq.argmax included (NULL logits: the ids only). */
    int (*forward)(void *ctx, struct batch_seq *seqs, int n_seqs, char *err, size_t errlen);
    /* Optional prefix checkpoints (NULL when absent). restore: loads into s the
     * longest saved state that is a strict prefix of tokens[0, n) (*matched = its
     * length; 0 = none and s is reset). save: checkpoints s's current state. */
    int (*cache_restore)(void *ctx, session *s, const int32_t *tokens, int n, int *matched, char *err,
                         size_t errlen);
    int (*cache_save)(void *ctx, session *s, char *err, size_t errlen);
    /* Optional with them: the length restore would match for tokens[0, n) now (no side
     * effects). */
    int (*cache_match)(void *ctx, const int32_t *tokens, int n);
    /* Optional (NULL: malloc/free): host buffers for logits that the model fills fastest. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);

    void (*close)(void *ctx);
};

struct port_options {
    const char *model_dir;
    const char *backend; /* "cpu" | "cuda" | NULL */
    int threads;
    const char *model_id; /* NULL: "Qwen3.6-35B-A3B" */
    size_t cache_bytes;   /* prefix checkpoint memory (0: none) */
    bool no_generation_config; /* --generation-config none: requests default to greedy */
};

/* Loads the checkpoint + tokenizer (slow: call it off the HTTP threads). */
int port_open_engine(struct model_port *p, const struct port_options *opt, char *err, size_t errlen);
/* The scripted byte-level test model (see port_mock.c for the script rules). */
int port_open_mock(struct model_port *p, const struct port_options *opt, char *err, size_t errlen);

/* The prefix cache's stats into server/metrics.h (port_engine.c calls it after every save
 * and restore; tests call it to check the /metrics lines). */
struct prefix_cache;
void port_publish_cache_stats(const struct prefix_cache *pc);

/* True when t is one of the port's end-of-sequence ids. */
static inline bool port_is_stop(const struct model_port *p, int32_t t) {
    for (int i = 0; i < p->n_stop; i++)
        if (p->stop_ids[i] == t) return true;
    return false;
}

#endif
