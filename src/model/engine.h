/* model/engine.h — the public engine/session API every front end uses
 * (CLI, server, benchmarks, tests).
 *
 * An engine is immutable once open: the mmap'd checkpoint, its validated
 * config, the bound weights and the chosen backend's device copies. A session
 * is the mutable state of one sequence: its token list, the KV cache of the
 * full-attention layers, and the conv + recurrent state of the Gated DeltaNet
 * layers, all sized once at session_open (no allocation in the token loop).
 *
 * engine_forward feeds a batch: several sequences, each with one or more new
 * tokens (a prefill chunk or one decode token). Positions are implicit: the
 * i-th new token of a sequence sits at session_length(s) + i. Every token of
 * the batch goes through the same code path (prefill and decode are not
 * separate). Only the scheduler thread may call engine_forward; engines and
 * sessions are not internally locked.
 */
#ifndef ORCHID_ENGINE_H
#define ORCHID_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "runtime/safetensors.h"

struct row_sampling; /* model/device_sampling.h */

typedef struct engine engine;
typedef struct session session;

struct engine_options {
    const char *model_dir; /* checkpoint directory (config.json + safetensors) */
    const char *backend;   /* "auto" (default: cuda when built with it and a GPU is present, else cpu), "cpu", "cuda" */
    int threads;           /* CPU worker threads; 0 = number of online cores */
    bool quiet;            /* no load-progress lines on stderr */
};

int engine_open(engine **out, const struct engine_options *opt, char *err, size_t errlen);
/* Like engine_open, from a config.json text and an already open checkpoint (e.g. the
 * in-memory shards of synth_build_memory). Takes ownership of st: engine_close closes
 * it, and so does a failure here. opt->model_dir only names the model (may be NULL). */
int engine_open_checkpoint(engine **out, const struct engine_options *opt, const char *config_json, size_t config_len,
                           safetensors *st, char *err, size_t errlen);
void engine_close(engine *e);

const struct model_config *engine_config(const engine *e);
const char *engine_backend_name(const engine *e);
/* The backend's batch invariance (backend.h invariant_tokens): 0 = any batch gives every
 * token its alone bits; N = only batches of at most N one-token sequences, a prompt chunk
 * fed alone, and prompt chunks of more than N tokens each fed together within one backend
 * call (at most engine_max_batch_tokens in all), do. */
int engine_invariant_tokens(const engine *e);
/* Tokens one backend call takes; engine_forward splits larger batches into such calls. */
int engine_max_batch_tokens(const engine *e);
/* Whether batch_seq.sampling is honoured (the backend samples where the logits are). */
bool engine_device_sampling(const engine *e);
/* Whether engine_forward honours batch_seq.score (the backend scores rows itself). */
bool engine_row_scores(const engine *e);
const char *engine_model_dir(const engine *e);
double engine_load_seconds(const engine *e);
size_t engine_tensor_count(const engine *e);  /* tensors in the checkpoint, skipped ones included */
size_t engine_tensor_bytes(const engine *e);  /* their bytes */
size_t engine_bound_tensors(const engine *e); /* tensors bound to model fields */
size_t engine_quant_bytes(const engine *e);   /* bytes of the quantized matrices */

/* A session holds up to max_seq tokens (prompt + generated). */
int session_open(engine *e, session **out, int max_seq, char *err, size_t errlen);
void session_close(session *s);
/* Forget every token: zero the recurrent/conv state, length 0. Keeps buffers. */
void session_reset(session *s);
int session_length(const session *s);
int session_capacity(const session *s);
/* The tokens fed so far (session_length of them). */
const int32_t *session_tokens(const session *s);

/* One sequence's part of a batch. `logits`, when non-NULL, receives float32
 * logits: [vocab] for the last new token, or [n_tokens, vocab] when
 * `all_logits` is set (teacher forcing, dumps). `argmax`, when non-NULL, receives
 * the argmax of the same rows ([1], or [n_tokens] with all_logits) exactly as
 * sampler_argmax picks it (first maximal id, NaN never wins; 0 for an all-NaN row);
 * with `logits` NULL only the ids are produced (a device backend then computes them
 * on the device and copies no logits row). `sampling`, when non-NULL (with `argmax`, no
 * `logits`, not `all_logits`; only where engine_device_sampling), makes *argmax the token
 * the device sampler draws (model/device_sampling.h) instead of the argmax. `score`, when
 * non-NULL ([n_tokens], not with `all_logits`), scores row k — the row after token k —
 * where score[k].token >= 0 into scores[k] (model/device_sampling.h: the prompt's own
 * logprobs, computed by the backend where the logits are), beside whatever the last row
 * asks for through `logits` / `argmax` / `sampling`. */
struct batch_seq {
    session *s;
    const int32_t *tokens;
    int n_tokens;
    float *logits;
    bool all_logits;
    int32_t *argmax;
    const struct row_sampling *sampling;
    const struct row_score_req *score;
    struct sample_result *scores;
};

/* Runs the model over every new token of every sequence and appends them to
 * their sessions. Fails without changing any session when a token id is out of
 * range or a session would overflow its capacity. */
int engine_forward(engine *e, struct batch_seq *seqs, int n_seqs, char *err, size_t errlen);

/* Greedy decoding: feeds `first` (the token chosen from the previous logits), then
 * each new argmax, n_steps times in all, and writes the n_steps chosen ids (ties go
 * to the lowest id). A backend with a device-resident loop (CUDA graphs, next token
 * written on the device) runs it there; otherwise engine_forward + a host argmax.
 * step_end (optional, [n_steps]) receives the wall time, from the call's start, at
 * which each id was known on the host. */
int engine_decode_greedy(engine *e, session *s, int32_t first, int n_steps, int32_t *out_ids, double *step_end,
                         char *err, size_t errlen);

/* State transfer for prefix checkpoints (model/prefix_cache.c). The recurrent part
 * (conv + GDN state of every linear layer) is engine_state_bytes; KV is
 * engine_kv_bytes_per_token per position. Host buffers, backend-private formats.
 * session_load_state also sets the session's token list to tokens[0, n) — the
 * caller guarantees the KV rows of those positions are (or will be) loaded. */
size_t engine_state_bytes(const engine *e);
size_t engine_kv_bytes_per_token(const engine *e);
int session_save_state(session *s, void *dst, char *err, size_t errlen);
int session_load_state(session *s, const void *src, const int32_t *tokens, int n, char *err, size_t errlen);
int session_save_kv(session *s, int pos0, int n, void *dst, char *err, size_t errlen);
int session_load_kv(session *s, int pos0, int n, const void *src, char *err, size_t errlen);

/* The backend's device, e.g. "NVIDIA H200 (sm_90, 139 GiB)"; "cpu" for the CPU backend. */
const char *engine_device_name(const engine *e);
/* The backend's own copy bandwidth: (read + write bytes) / s of a device-to-device copy
 * of `bytes`, best of a few. ST_UNSUPPORTED when the backend has no such measurement. */
int engine_copy_gbs(engine *e, size_t bytes, double *gbs, char *err, size_t errlen);
/* Device memory in use now (0 when the backend has no device or does not say). */
size_t engine_device_mem_used(engine *e);
/* Host buffers the backend fills fastest (pinned on CUDA; malloc otherwise), e.g. the
 * logits rows of batch_seq. Free with engine_host_free before engine_close. */
void *engine_host_alloc(engine *e, size_t bytes);
void engine_host_free(engine *e, void *p);
/* Whether engine_host_alloc gives the backend's own (pinned) memory rather than malloc's. */
bool engine_host_pinned(const engine *e);


#endif
