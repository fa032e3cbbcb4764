/* server/gen.h — one generation request seen from its connection thread:
 * parse + validate + render + tokenize (api.h), submit a job to the
 * scheduler, then turn the job's text into OpenAI responses (or Anthropic
 * ones, anthropic.h) — a whole JSON body, or SSE chunks / events — through
 * the reasoning / tool-call output parser.
 * Everything here runs on the connection thread; the scheduler is only
 * touched through the job (sched.h). */
#ifndef ORCHID_SERVER_GEN_H
#define ORCHID_SERVER_GEN_H

#include <stdbool.h>
#include <stddef.h>

#include "server/api.h"
#include "server/sched.h"

struct gen;

struct gen_config {
    struct sched *sched;
    int default_thinking; /* -1 template default, 0 off, 1 on */
};

/* The model port when the scheduler takes requests; else NULL with e the 503 (loading or
 * stopping). */
const struct model_port *gen_ready_port(const struct gen_config *cfg, struct api_error *e);
/* The ids a body of kind would feed the model (the generation endpoints' own parse and
 * render, no context limit): 0 with *ids malloc'd, or an HTTP status with e filled and *ids
 * NULL. */
int gen_prompt_ids(const struct gen_config *cfg, const struct model_port *port, enum api_kind kind, const char *body,
                   size_t len, int32_t **ids, int *n, struct api_error *e);
/* Parses the body and submits the job. Returns 0, or an HTTP status with e
 * filled (4xx for the client, 429 queue full, 503 loading / stopping). *out
 * is set even on failure when the request got far enough to have stats. */
int gen_begin(struct gen **out, const struct gen_config *cfg, enum api_kind kind, const char *body, size_t len,
              struct api_error *e);
bool gen_streaming(const struct gen *g);
/* True once the job is done and its output fully processed. */
bool gen_finished(const struct gen *g);
/* Waits up to timeout_ms for output and processes it. Returns true when the
 * job is finished and fully processed. */
bool gen_pump(struct gen *g, int timeout_ms);
/* Non-streaming: the final body (malloc'd) and HTTP status once finished. */
char *gen_final_json(struct gen *g, int *status);
/* Streaming: copies up to max bytes of SSE output into buf. Returns the
 * number of bytes (0 = nothing yet), or -1 when the stream is complete. */
long gen_stream_take(struct gen *g, char *buf, size_t max);
void gen_cancel(struct gen *g);
/* POST /v1/messages/count_tokens: *json = {"input_tokens":N} (malloc'd), the
 * prompt's token count. Returns 0, or an HTTP status with e filled. Runs on
 * the connection thread (render + encode); the scheduler is not involved. */
int gen_count_tokens(const struct gen_config *cfg, const char *body, size_t len, char **json, struct api_error *e);
void gen_stats(const struct gen *g, int *prompt, int *cached, int *completion, char *err, size_t errlen);
void gen_free(struct gen *g);

#endif
