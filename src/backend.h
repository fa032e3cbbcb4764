/* backend.h — the one interface between the backend-neutral engine (model/engine.c)
 * and an implementation: src/cpu/ (the plain reference) or src/cuda/ (fast).
 *
 * A backend receives the bound weights at creation (it may copy them to a
 * device), owns per-sequence state (struct backend_session: KV cache of the
 * attention layers, conv + recurrent state of the GDN layers) and runs the
 * whole model over a batch of tokens. The batch is the general form from day
 * one: tokens of several sequences, each token with its own position; the
 * tokens of one sequence are contiguous and in position order. Prefill chunks
 * and decode steps are the same call.
 */
#ifndef ORCHID_BACKEND_H
#define ORCHID_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/device_sampling.h"
#include "model/weights.h"

struct backend_session;

struct fwd_batch {
    int n_tokens;
    const int32_t *tokens; /* [n_tokens] ids, already range-checked */
    const int32_t *pos;    /* [n_tokens] absolute positions */
    const int32_t *seq;    /* [n_tokens] index into sessions */
    struct backend_session *const *sessions;
    int n_seqs;
    int n_out;               /* tokens whose logits (or argmax) are wanted */
    const int32_t *out_rows; /* [n_out] ascending token indices */
    float *const *out_logits; /* [n_out] destinations of `vocab` float32 each; runs of
                                 adjacent rows (ptr[i+1] == ptr[i] + vocab) may be
                                 computed together. An entry may be NULL: that row's
                                 logits are not wanted (only its argmax) */
    int32_t *out_argmax;      /* NULL = not wanted; else host [n_out]: the argmax of each
                                 output row, as sampler_argmax defines it (first maximal
                                 index, NaN never wins; an all-NaN row gives 0). A row
                                 with out_logits[i] == NULL needs out_argmax */
    const struct row_sampling *out_sampling; /* NULL = none; else [n_out]: a row with
                                 temperature > 0 (and out_logits[i] == NULL) gets a token drawn
                                 by the device sampler (model/device_sampling.h) in
                                 out_argmax[i] instead of its argmax. Only for a backend with
                                 device_sampling set */
    const struct row_score_req *out_score; /* NULL = none; else [n_out]: a row with token >= 0
                                 is scored (model/device_sampling.h: its logprob of that token
                                 and its top alternatives) into out_scores[i] — with or without
                                 its logits or argmax; only for a backend with row_scores set */
    struct sample_result *out_scores; /* host [n_out] when out_score */
};

/* Whether output row i of b is scored. */
static inline int fwd_row_scored(const struct fwd_batch *b, int i) { return b->out_score && b->out_score[i].token >= 0; }

struct backend {
    const char *name;
    int max_batch_tokens; /* the engine never passes more tokens in one call */
    /* Batch invariance: 0 = every token's outputs are the same bits whatever shares its
     * batch (the CPU reference); N > 0 = only one-token sequences batched N at most, a
     * prefill chunk alone, and prefill chunks of more than N tokens each sharing one call,
     * get the bits they get alone (CUDA: the 2..64-token kernels repeat the one-token
     * arithmetic, the prefill GEMMs do not but compute each row the same way at any row
     * count, and the scan and attention work per sequence). */
    int invariant_tokens;
    /* 1: forward honours fwd_batch.out_sampling (the token drawn where the logits are). */
    int device_sampling;
    /* 1: forward honours fwd_batch.out_score (the CPU backend on the host, CUDA on the
     * device); 0: the engine refuses scored rows (the server then scores logits rows). */
    int row_scores;
    int (*session_create)(struct backend *b, int max_seq, struct backend_session **out, char *err, size_t errlen);
    void (*session_destroy)(struct backend *b, struct backend_session *s);
    void (*session_reset)(struct backend *b, struct backend_session *s);
    int (*forward)(struct backend *b, const struct fwd_batch *batch, char *err, size_t errlen);
    /* Optional (NULL = the engine loops forward + argmax on the host): greedy decode of
     * n_steps tokens for one session starting at position pos by feeding `first`;
     * out_ids[i] is the argmax after feeding step i's token; step_end as in engine.h. */
    int (*decode_greedy)(struct backend *b, struct backend_session *s, int pos, int32_t first, int n_steps,
                         int32_t *out_ids, double *step_end, char *err, size_t errlen);
    /* Session state transfer for prefix checkpoints (model/prefix_cache.c). The
     * recurrent part (conv + GDN state of every linear layer) has a fixed size; the
     * KV part is per position. Buffers are host memory; formats are the backend's own
     * and only ever read back by the same backend. */
    size_t (*state_bytes)(struct backend *b);
    int (*state_save)(struct backend *b, struct backend_session *s, void *dst, char *err, size_t errlen);
    int (*state_load)(struct backend *b, struct backend_session *s, const void *src, char *err, size_t errlen);
    size_t (*kv_bytes_per_token)(struct backend *b);
    int (*kv_save)(struct backend *b, struct backend_session *s, int pos0, int n, void *dst, char *err, size_t errlen);
    int (*kv_load)(struct backend *b, struct backend_session *s, int pos0, int n, const void *src, char *err, size_t errlen);
    /* Optional: a device description, and the device's copy bandwidth (see engine.h). */
    const char *(*device_name)(struct backend *b);
    int (*copy_gbs)(struct backend *b, size_t bytes, double *gbs, char *err, size_t errlen);
    /* Optional: device memory in use now (weights, scratch, sessions), bytes. */
    size_t (*device_mem_used)(struct backend *b);
    /* Optional: host memory the device copies to and from fastest (CUDA: pinned), for
     * buffers that receive logits every step. NULL: plain malloc/free. */
    void *(*host_alloc)(struct backend *b, size_t bytes);
    void (*host_free)(struct backend *b, void *p);
    void (*destroy)(struct backend *b);
};

int cpu_backend_create(struct backend **out, const struct model_config *cfg, const struct model_weights *w,
                       int threads, char *err, size_t errlen);
#ifdef ORCHID_CUDA
int cuda_backend_create(struct backend **out, const struct model_config *cfg, const struct model_weights *w,
                        char *err, size_t errlen);
#endif

#endif
