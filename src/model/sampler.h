/* model/sampler.h — next-token choice from float32 logits, one sampler per
 * request: greedy, temperature, top_k, top_p, min_p, presence / frequency /
 * repetition penalties, a seeded RNG, and (optionally) logprobs of the chosen
 * token plus the top-N alternatives.
 *
 * Semantics (the usual OpenAI / vLLM meaning):
 *   - logit_bias (OpenAI): l[id] += bias for each listed id, first, on the raw model
 *     logits, before logprobs, penalties, temperature and every filter. The math is
 *     purely additive, as OpenAI documents it: -100 makes a token practically never
 *     chosen and +100 practically always (not a hard -inf / +inf). Greedy picks the
 *     argmax of the biased logits.
 *   - repetition_penalty (HF style, 1 = off) applies to every token seen so far,
 *     prompt included: l > 0 ? l / r : l * r.
 *   - presence_penalty / frequency_penalty (OpenAI style, 0 = off) apply to the
 *     generated tokens only: l -= presence * [count > 0] + frequency * count.
 *   - temperature 0 (or top_k == 1) is greedy: the first maximal logit wins and
 *     NaN never wins. Otherwise logits / T, then top_k, min_p (relative to the
 *     most likely token) and top_p (smallest set whose mass >= top_p) filters,
 *     then one draw from the renormalised rest.
 *   - logprobs are log-softmax of the model logits plus logit_bias (before penalties
 *     and temperature): the distribution the token was actually drawn from, minus
 *     the request's shaping knobs. With a bias this matches what OpenAI's API
 *     reported when logit_bias was introduced (a +100 token gets logprob ~0) and
 *     vLLM's V0 engine; vLLM V1's default (raw_logprobs) and llama.cpp report the
 *     unbiased ones instead. Without a bias both readings are the same.
 * All buffers are sized at sampler_init; sampler_sample/accept never allocate.
 * A sampler belongs to one thread at a time.
 */
#ifndef ORCHID_SAMPLER_H
#define ORCHID_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/device_sampling.h"

#define SAMPLER_MAX_LOGIT_BIAS 300 /* entries of logit_bias (OpenAI documents no limit) */
#define SAMPLER_MAX_BIAS 100.0f    /* |bias| bound, OpenAI's [-100, 100] */

struct logit_bias {
    int32_t token;
    float bias;
};

struct sampler_params {
    float temperature;        /* 0 = greedy */
    float top_p;              /* (0, 1]; 1 = off */
    int top_k;                /* 0 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    float repetition_penalty; /* 1 = off; > 0 */
    uint64_t seed;
    bool has_seed;            /* false: seeded from a process-wide counter + clock */
    int top_logprobs;         /* 0..SAMPLER_MAX_TOP_LOGPROBS alternatives to report */
    bool logprobs;            /* report the chosen token's logprob */
    int n_logit_bias;         /* 0..SAMPLER_MAX_LOGIT_BIAS entries below, distinct tokens */
    struct logit_bias logit_bias[SAMPLER_MAX_LOGIT_BIAS]; /* held inline: a job owns its copy */
};

/* Defaults: greedy, no filters, no penalties, no logprobs, no logit_bias. */
struct sampler_params sampler_params_default(void);

/* struct sample_result and SAMPLER_MAX_TOP_LOGPROBS: model/device_sampling.h (a backend
 * fills the same struct when it scores a row). */

typedef struct sampler sampler;

/* Validates params (ST_INVALID naming the field) and allocates every buffer. */
int sampler_new(sampler **out, int vocab, const struct sampler_params *p, char *err, size_t errlen);
void sampler_free(sampler *s);

/* Records tokens for penalties: prompt tokens (is_prompt: repetition only) and
 * generated tokens (all penalties). */
void sampler_accept(sampler *s, const int32_t *tokens, int n, bool is_prompt);

/* Chooses the next token. `logits` ([vocab]) is used as scratch and modified.
 * Returns the token id (also in res->token when res is non-NULL). */
int32_t sampler_sample(sampler *s, float *logits, struct sample_result *res);

/* Constrained output: only tokens allow() accepts are chosen (the filters and
 * the draw act as if every other token's logit were -inf; greedy takes the
 * best allowed token); advance() is told each generated token in order
 * (sampler_accept). allow is asked at most once per token per step: greedy asks
 * only about tokens that would beat the best allowed one so far; sampling asks
 * about the filtered candidates, and about every token only when one of them
 * is not allowed. logprobs stay those of the model's
 * distribution. A constrained sampler is never argmax-only or device-sampled:
 * it needs the logits row. Allocates a [vocab] byte map (ST_NOMEM). */
struct sampler_constraint {
    bool (*allow)(void *ctx, int32_t token);
    void (*advance)(void *ctx, int32_t token);
    void *ctx;
};
int sampler_set_constraint(sampler *s, const struct sampler_constraint *c);

/* A prompt token's logprob (echo with logprobs on /v1/completions): log-softmax of one
 * row of raw model logits (no logit_bias, no penalties: the prompt was not drawn from the
 * request's shaping) at `token` into res->logprob (-inf where the row gives it no mass,
 * NaN logits ignored), and the n_top (<= SAMPLER_MAX_TOP_LOGPROBS) most likely ids, most
 * likely first, into res->top_*; res->token = token. Reads the row only. */
void sampler_row_logprobs(const float *logits, int vocab, int32_t token, int n_top, struct sample_result *res);

/* Greedy argmax helper: first maximal index, NaN never wins (-1 if all NaN). */
int32_t sampler_argmax(const float *logits, int n);

/* True when sampler_sample would return sampler_argmax of the raw logits (0 for an
 * all-NaN row) and report nothing else: greedy (temperature 0 or top_k 1), no
 * penalties, no logit_bias, no logprobs, and no RNG draw. The logits row is then not needed, only
 * its argmax (which a device backend computes without copying the row out). */
bool sampler_argmax_only(const sampler *s);

/* When the device sampler (model/device_sampling.h) can choose this sampler's next token
 * — temperature > 0 and top_k != 1, no penalties, no logit_bias, no logprobs — fills *rs
 * with its parameters and this token's uniform draw (one draw of the request's RNG, so a
 * seeded request repeats) and returns true; else false and the RNG is untouched. */
bool sampler_device_row(sampler *s, struct row_sampling *rs);

#endif
