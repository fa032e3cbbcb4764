/* server/gen.c — from an accepted request to its OpenAI response (see gen.h).
 *
 * Data path: the scheduler appends final text to job->tx (stop strings and
 * UTF-8 already handled); gen_pump copies the new bytes out under job->mu,
 * feeds them to the output parser (chat) and turns parser events into either
 * accumulators (non-streaming) or SSE chunks written into an output buffer
 * (streaming). Chunks are formatted by hand into reusable buffers, so the
 * per-token path allocates nothing once the buffers have grown.
 */
#include "server/gen.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/status.h"
#include "runtime/timing.h"
#include "server/anthropic.h"
#include "server/constraint.h"
#include "server/responses.h"
#include "server/jsonout.h"
#include "text/output_parser.h"
#include "text/utf8.h"

struct gen {
    struct gen_config cfg;
    struct api_request ar;
    struct job *job;
    const struct model_port *port;
    output_parser *op;
    int n_prompt;
    bool submitted;

    char id[48];
    long created;
    char model[64];

    size_t cursor;    /* text bytes consumed from the job */
    int rec_cursor;   /* logprob records consumed */
    buf in;    /* copy of new text */
    bool finished;    /* job done and everything processed */
    enum finish_reason fin;
    int n_gen, cached;

    /* non-streaming accumulators */
    buf reasoning, content;
    cJSON *tool_calls;
    buf lp; /* logprob entries, comma-joined JSON (chat) */
    int n_lp;
    /* completions logprobs (legacy shape), comma-joined pieces */
    buf lp_tokens, lp_vals, lp_tops, lp_offs;
    /* completions 'echo': the prompt's text (and records) go out first, once (with logprobs:
     * when the scheduler has scored the whole prompt); the generated tokens' text_offset
     * then counts from the prompt's start */
    bool echoed;
    size_t echo_chars;
    /* text_offset is in characters (code points), as OpenAI's and vLLM's: the generated
     * text's bytes [0, off_bytes) hold off_chars of them (records come in text order) */
    size_t off_bytes, off_chars;

    /* streaming */
    buf out;
    size_t out_off;
    bool stream_done;
    buf pending_lp; /* logprob entries for the next chunk */
    int n_pending_lp;
    bool chunk_emitted;    /* in this pump */
    int n_tool_calls;
    uint64_t call_salt;
    struct am_stream am;   /* API_MESSAGES: the open content block */
    struct rs_stream rs;   /* API_RESPONSES: the open output item, the finished ones */
    const char *stop_seq;  /* the stop string that ended the text (into the job), or NULL */

    /* 'n' > 1 (chat, completions) or a batch of prompts (completions: choice i is prompt i / n's
     * choice i % n, OpenAI's order): this gen is choice 0 and owns the others, each a gen
     * of its own (its own parse, job, parser and output) that shares choice 0's id. The
     * functions of gen.h act on all of them through choice 0: its pump pumps them all, its
     * stream takes their chunks one choice's whole buffer at a time (no chunk is split
     * between two choices), then the closing usage chunk and [DONE] from tail. */
    int index;             /* the choice's index */
    bool multi;            /* one choice of several: its stream leaves usage and [DONE] to tail */
    struct gen **more;     /* choice 0: choices 1..n_more */
    int n_more;
    int take_at;           /* choice 0: the choice whose buffer the stream drains (0..n_more) */
    buf tail;              /* choice 0: the closing chunks, once every choice has finished */
    size_t tail_off;
    bool tail_built;
};

static int on_event(void *user, const output_event *ev);
static void chunk_begin(struct gen *g);
static void chunk_end(struct gen *g, const char *finish);
struct usage_sum {
    int prompt, cached, completion;
};
static void stream_close(const struct gen *g, buf *o, const struct usage_sum *u);

bool gen_streaming(const struct gen *g) { return g->ar.stream; }
static bool is_chat(const struct gen *g) { return api_is_chat(g->ar.kind); }
static bool is_messages(const struct gen *g) { return g->ar.kind == API_MESSAGES; }
static bool is_responses(const struct gen *g) { return g->ar.kind == API_RESPONSES; }

bool gen_finished(const struct gen *g) {
    if (!g || !g->finished) return false;
    for (int i = 0; i < g->n_more; i++)
        if (!g->more[i]->finished) return false;
    return true;
}

/* Choice i of g (0: g itself). */
static struct gen *choice(struct gen *g, int i) { return i == 0 ? g : g->more[i - 1]; }

/* A request's usage over its choices: each prompt once (the count of its first choice: a
 * prompt's choices share it), every choice's tokens. */
static struct usage_sum usage_of(const struct gen *g) {
    struct usage_sum u = {0};
    const int per_prompt = g->ar.n_choices > 0 ? g->ar.n_choices : 1; /* 0: the body did not parse */
    for (int i = 0; i <= g->n_more; i++) {
        const struct gen *c = i == 0 ? g : g->more[i - 1];
        if (i % per_prompt == 0) {
            u.prompt += c->n_prompt;
            u.cached += c->cached;
        }
        u.completion += c->n_gen;
    }
    return u;
}

static struct rs_meta rs_meta_of(const struct gen *g) {
    return (struct rs_meta){.id = g->id, .model = g->model, .created = g->created, .echo = g->ar.echo};
}

static void make_id(char *out, size_t n, const char *prefix, uint64_t a) {
    uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (uint64_t)time(NULL) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    snprintf(out, n, "%s%016llx%08x", prefix, (unsigned long long)x, (unsigned)(a & 0xffffffffu));
}

const struct model_port *gen_ready_port(const struct gen_config *cfg, struct api_error *e) {
    enum sched_state st = sched_state(cfg->sched, NULL, 0);
    if (st != SCHED_READY) {
        api_error_set(e, 503, "server_error", NULL, st == SCHED_LOADING ? "model_loading" : "unavailable",
                      st == SCHED_LOADING ? "the model is still loading" : "the server is shutting down");
        return NULL;
    }
    const struct model_port *port = sched_port(cfg->sched);
    if (!port) api_error_set(e, 503, "server_error", NULL, "unavailable", "the server is not ready");
    return port;
}

/* One choice up to its queueing (gen_begin queues them all): parse, prompt, job. head:
 * choice 0 (NULL for choice 0 itself), whose id and time the choice shares; choice i of n
 * a prompt is prompt i / n's (a batch), and a seeded request's draws from seed + i % n (a
 * prompt's choices as a request of that prompt alone would draw them). */
static int begin_one(struct gen **out, const struct gen_config *cfg, const struct model_port *port, enum api_kind kind,
                     const char *body, size_t len, int index, const struct gen *head, struct api_error *e) {
    struct gen *g = calloc(1, sizeof *g);
    if (!g) return api_error_set(e, 500, "server_error", NULL, NULL, "internal server error");
    *out = g;
    g->cfg = *cfg;
    g->port = port;
    g->created = (long)time(NULL);
    g->index = index;
    snprintf(g->model, sizeof g->model, "%s", port->model_id);
    const int per_prompt = head ? head->ar.n_choices : 1; /* choice 0 parses prompt 0 */
    int rc = api_parse_at(kind, body, len, port->model_id, port->vocab, cfg->default_thinking, &port->sampling,
                          index / per_prompt, &g->ar, e);
    if (rc) return rc;
    if (!api_is_chat(kind) && kind != API_COMPLETION) g->ar.n_choices = 1; /* the dialects have no 'n' */
    g->multi = g->ar.n_choices * g->ar.n_prompts > 1;
    if (g->ar.sp.has_seed) g->ar.sp.seed += (uint64_t)(index % g->ar.n_choices);
    int32_t *ids = NULL;
    int n_ids = 0;
    char *forced = NULL;
    bool in_reasoning = false;
    rc = api_prepare_prompt(&g->ar, port, sched_max_seq(cfg->sched), &ids, &n_ids, &forced, &in_reasoning, e);
    if (rc) return rc;
    g->n_prompt = n_ids;
    if (api_is_chat(kind)) {
        output_parser_options po = output_parser_options_default();
        po.parse_reasoning = 1;
        po.start_in_reasoning = in_reasoning;
        po.parse_tools = g->ar.tools != NULL;
        po.tools = g->ar.tools;
        char err[256];
        if (output_parser_new(&g->op, &po, err, sizeof err)) {
            free(ids);
            free(forced);
            return api_error_set(e, 500, "server_error", NULL, NULL, "internal server error");
        }
        g->tool_calls = cJSON_CreateArray();
    }
    struct job *j = job_new(ids, n_ids);
    if (!j) {
        free(ids);
        free(forced);
        return api_error_set(e, 500, "server_error", NULL, NULL, "internal server error");
    }
    g->job = j;
    g->call_salt = j->id;
    int crc = 0;
    const bool constrained = g->ar.grammar != NULL;
    if (g->ar.grammar) { /* the job owns it from here */
        /* beside tools: the document or calls (a forced tool choice: the reply opens inside one) */
        const int tools = !g->ar.tools ? OUT_TOOLS_NONE : forced ? OUT_TOOLS_IN_CALL : OUT_TOOLS_EITHER;
        crc = out_constraint_new(&j->constraint, g->ar.grammar, sched_out_vocab(cfg->sched), tools);
        g->ar.grammar = NULL;
    } else if (g->ar.thinking_budget > 0 && in_reasoning) {
        crc = out_constraint_new_budget(&j->constraint, g->ar.thinking_budget, port);
    }
    if (crc) {
        free(forced);
        if (crc == ST_INVALID && constrained)
            return api_error_set(e, 400, "invalid_request_error", "response_format", NULL,
                                 "this model's vocabulary has no single <tool_call> tokens: constrained output "
                                 "cannot be combined with 'tools' here");
        return api_error_set(e, 500, "server_error", NULL, NULL, "internal server error");
    }
    if (head) {
        snprintf(g->id, sizeof g->id, "%s", head->id);
        g->created = head->created;
    } else {
        make_id(g->id, sizeof g->id,
                kind == API_MESSAGES ? "msg_" : kind == API_RESPONSES ? "resp_" : kind == API_CHAT ? "chatcmpl-" : "cmpl-",
                j->id);
    }
    j->sp = g->ar.sp;
    j->max_tokens = g->ar.max_tokens;
    j->prompt_logprobs = g->ar.echo_prompt && g->ar.logprobs;
    j->prompt_top = g->ar.top_logprobs;
    j->ignore_eos = g->ar.ignore_eos;
    for (int i = 0; i < g->ar.n_stops; i++) job_add_stop(j, g->ar.stops[i], g->ar.stop_lens[i]);
    if (g->ar.one_tool_call && g->ar.tools) { /* (tool_choice none leaves no tools) */
        /* parallel_tool_calls false: the reply ends with its first tool call (once the
         * reasoning is over: a tag written while thinking is not a call) */
        j->end_mark = "</tool_call>";
        j->end_arm = in_reasoning ? "</think>" : NULL;
    }
    if (forced) {
        /* the prompt already holds these bytes: the parser must see them first */
        g->in.len = 0;
        if (g->op) output_parser_feed(g->op, forced, strlen(forced), on_event, g);
        free(forced);
    }
    return 0;
}

/* After the choices' jobs are queued: their streams' opening events. */
static void submitted(struct gen *g) {
    g->submitted = true;
    if (g->ar.stream && g->ar.kind == API_MESSAGES) {
        am_stream_start(&g->am, &g->out, g->id, g->model, g->n_prompt);
    } else if (g->ar.stream && g->ar.kind == API_RESPONSES) {
        struct rs_meta m = rs_meta_of(g);
        rs_stream_start(&g->rs, &g->out, &m);
    } else if (g->ar.stream && g->ar.kind == API_CHAT) {
        chunk_begin(g);
        buf_puts(&g->out, "{\"role\":\"assistant\",\"content\":\"\"}");
        chunk_end(g, NULL);
    }
}

int gen_begin(struct gen **out, const struct gen_config *cfg, enum api_kind kind, const char *body, size_t len,
              struct api_error *e) {
    *out = NULL;
    memset(e, 0, sizeof *e);
    const struct model_port *port = gen_ready_port(cfg, e);
    if (!port) return e->status;
    int rc = begin_one(out, cfg, port, kind, body, len, 0, NULL, e);
    struct gen *g = *out;
    const int total = rc ? 1 : g->ar.n_choices * g->ar.n_prompts;
    if (total > API_MAX_JOBS)
        return api_error_set(e, 400, "invalid_request_error", "n", NULL,
                             "%d prompts × 'n' %d is %d choices; a request takes at most %d", g->ar.n_prompts,
                             g->ar.n_choices, total, API_MAX_JOBS);
    if (total > 1) {
        /* the other choices, queued right behind choice 0 and all at once (or none): a
         * prompt's choices share it, so where that is a long enough prefix the scheduler
         * holds them for the first one's checkpoint of it (sched.c, wait_for_shared_prefix) */
        g->more = calloc((size_t)total - 1, sizeof *g->more);
        if (!g->more) return api_error_set(e, 500, "server_error", NULL, NULL, "internal server error");
        for (int i = 1; i < total && !rc; i++) {
            rc = begin_one(&g->more[g->n_more], cfg, port, kind, body, len, i, g, e);
            if (g->more[g->n_more]) g->n_more++;
        }
    }
    if (rc) return rc;
    struct job *jobs[API_MAX_JOBS];
    for (int i = 0; i <= g->n_more; i++) jobs[i] = choice(g, i)->job;
    rc = sched_submit_many(cfg->sched, jobs, g->n_more + 1);
    if (rc == ST_INVALID)
        return api_error_set(e, 400, "invalid_request_error", g->ar.n_prompts > 1 ? "prompt" : "n", NULL,
                             "the request's %d choices are more than this server's queue holds (--max-queue)",
                             g->n_more + 1);
    if (rc == ST_RANGE && g->n_more)
        return api_error_set(e, 429, "rate_limit_error", NULL, "queue_full",
                             "the server's request queue cannot take this request's %d choices now; retry later",
                             g->n_more + 1);
    if (rc == ST_RANGE)
        return api_error_set(e, 429, "rate_limit_error", NULL, "queue_full",
                             "the server's request queue is full; retry later");
    if (rc) return api_error_set(e, 503, "server_error", NULL, "unavailable", "the server is shutting down");
    for (int i = 0; i <= g->n_more; i++) submitted(choice(g, i));
    return 0;
}

/* ---- output events ---- */

/* The fields every SSE chunk opens with, up to and including "choices": */
static void chunk_head(const struct gen *g, buf *o) {
    buf_printf(o, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":\"%s\","
                        "\"system_fingerprint\":\"orchid\",\"choices\":",
               g->id, g->ar.kind == API_CHAT ? "chat.completion.chunk" : "text_completion", g->created, g->model);
}

static void chunk_begin(struct gen *g) {
    chunk_head(g, &g->out);
    buf_printf(&g->out, g->ar.kind == API_CHAT ? "[{\"index\":%d,\"delta\":" : "[{\"index\":%d,", g->index);
}

static void chunk_end(struct gen *g, const char *finish) {
    if (g->ar.kind == API_CHAT) {
        buf_puts(&g->out, ",\"logprobs\":");
        if (g->n_pending_lp) {
            buf_puts(&g->out, "{\"content\":[");
            buf_append(&g->out, g->pending_lp.data, g->pending_lp.len);
            buf_puts(&g->out, "]}");
        } else {
            buf_puts(&g->out, "null");
        }
    } else {
        buf_puts(&g->out, ",\"logprobs\":");
        if (g->n_pending_lp) {
            buf_puts(&g->out, "{\"tokens\":[");
            buf_append(&g->out, g->lp_tokens.data, g->lp_tokens.len);
            buf_puts(&g->out, "],\"token_logprobs\":[");
            buf_append(&g->out, g->lp_vals.data, g->lp_vals.len);
            buf_puts(&g->out, "],\"top_logprobs\":[");
            buf_append(&g->out, g->lp_tops.data, g->lp_tops.len);
            buf_puts(&g->out, "],\"text_offset\":[");
            buf_append(&g->out, g->lp_offs.data, g->lp_offs.len);
            buf_puts(&g->out, "]}");
            g->lp_tokens.len = g->lp_vals.len = g->lp_tops.len = g->lp_offs.len = 0;
        } else {
            buf_puts(&g->out, "null");
        }
    }
    g->pending_lp.len = 0;
    g->n_pending_lp = 0;
    if (finish) buf_printf(&g->out, ",\"finish_reason\":\"%s\"}]", finish);
    else buf_puts(&g->out, ",\"finish_reason\":null}]");
    if (g->ar.include_usage) buf_puts(&g->out, ",\"usage\":null");
    buf_puts(&g->out, "}\n\n");
    g->chunk_emitted = true;
}

static void tool_call_id(const struct gen *g, int index, char *out, size_t n) {
    char tmp[48];
    make_id(tmp, sizeof tmp, is_messages(g) ? "toolu_" : "call_", g->call_salt * 131 + (uint64_t)index);
    snprintf(out, n, "%s", tmp);
}

static int on_event(void *user, const output_event *ev) {
    struct gen *g = user;
    if (g->ar.stream && is_responses(g) && ev->kind == OUT_REASONING)
        buf_append(&g->reasoning, ev->text, ev->len); /* counted at the end (reasoning_tokens) */
    if (!g->ar.stream) {
        if (ev->kind == OUT_REASONING) buf_append(&g->reasoning, ev->text, ev->len);
        else if (ev->kind == OUT_CONTENT) buf_append(&g->content, ev->text, ev->len);
        else if (ev->kind == OUT_TOOL_CALL) {
            char id[48];
            tool_call_id(g, ev->index, id, sizeof id);
            cJSON *tc = cJSON_CreateObject();
            cJSON_AddStringToObject(tc, "id", id);
            cJSON_AddStringToObject(tc, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(fn, "name", ev->name);
            cJSON_AddStringToObject(fn, "arguments", ev->arguments);
            cJSON_AddItemToArray(g->tool_calls, tc);
            g->n_tool_calls++;
        }
        return 0;
    }
    if ((ev->kind == OUT_REASONING || ev->kind == OUT_CONTENT) && ev->len == 0) return 0;
    if (is_messages(g) || is_responses(g)) {
        char id[48] = "";
        if (ev->kind == OUT_TOOL_CALL) {
            tool_call_id(g, ev->index, id, sizeof id);
            g->n_tool_calls++;
        }
        if (is_messages(g)) {
            am_stream_event(&g->am, &g->out, ev, id);
        } else {
            struct rs_meta m = rs_meta_of(g);
            rs_stream_event(&g->rs, &g->out, &m, ev, id);
        }
        g->chunk_emitted = true;
        return 0;
    }
    chunk_begin(g);
    if (ev->kind == OUT_REASONING) {
        buf_puts(&g->out, "{\"reasoning_content\":");
        json_put_str(&g->out, ev->text, ev->len);
        buf_puts(&g->out, "}");
    } else if (ev->kind == OUT_CONTENT) {
        buf_puts(&g->out, "{\"content\":");
        json_put_str(&g->out, ev->text, ev->len);
        buf_puts(&g->out, "}");
    } else {
        char id[48];
        tool_call_id(g, ev->index, id, sizeof id);
        buf_printf(&g->out, "{\"tool_calls\":[{\"index\":%d,\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":",
                 ev->index, id);
        json_put_str(&g->out, ev->name, strlen(ev->name));
        buf_puts(&g->out, ",\"arguments\":");
        json_put_str(&g->out, ev->arguments, strlen(ev->arguments));
        buf_puts(&g->out, "}}]}");
        g->n_tool_calls++;
    }
    chunk_end(g, NULL);
    return 0;
}

/* Token text for logprob entries (raw bytes; invalid UTF-8 replaced by the escaper). */
static void lp_token(struct gen *g, buf *b, int32_t id, bool with_bytes, const char *key) {
    size_t n = 0;
    const char *s = g->port->token_bytes(g->port->ctx, id, &n);
    if (!s) n = 0;
    buf_printf(b, "\"%s\":", key);
    json_put_str(b, s ? s : "", n);
    if (with_bytes) {
        buf_puts(b, ",\"bytes\":[");
        for (size_t i = 0; i < n; i++) buf_printf(b, i ? ",%u" : "%u", (unsigned char)s[i]);
        buf_puts(b, "]");
    }
}

/* One token's entry of the completions (legacy) logprobs: its text, logprob, alternatives
 * ({text: logprob}) and character offset in the choice's text; first_of_prompt: the echoed
 * prompt's first token, which has no logprob (null, as OpenAI reports it). */
static void add_legacy_logprob(struct gen *g, const struct tok_rec *r, bool first_of_prompt, size_t offset) {
    int *n = g->ar.stream ? &g->n_pending_lp : &g->n_lp;
    const char *sep = *n ? "," : "";
    size_t tn = 0;
    const char *ts = g->port->token_bytes(g->port->ctx, r->id, &tn);
    buf_puts(&g->lp_tokens, sep);
    json_put_str(&g->lp_tokens, ts ? ts : "", ts ? tn : 0);
    buf_puts(&g->lp_vals, sep);
    buf_puts(&g->lp_tops, sep);
    if (first_of_prompt) {
        buf_puts(&g->lp_vals, "null");
        buf_puts(&g->lp_tops, "null");
    } else {
        json_put_float(&g->lp_vals, r->logprob);
        buf_puts(&g->lp_tops, "{");
        for (int k = 0; k < r->n_top; k++) {
            if (k) buf_puts(&g->lp_tops, ",");
            size_t an = 0;
            const char *as = g->port->token_bytes(g->port->ctx, r->top_ids[k], &an);
            json_put_str(&g->lp_tops, as ? as : "", as ? an : 0);
            buf_puts(&g->lp_tops, ":");
            json_put_float(&g->lp_tops, r->top_lps[k]);
        }
        buf_puts(&g->lp_tops, "}");
    }
    buf_puts(&g->lp_offs, sep);
    buf_printf(&g->lp_offs, "%zu", offset);
    (*n)++;
}

/* Characters (code points: bytes that do not continue one) in s[0, n). */
static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Under the job's mutex: a generated record's text_offset, characters from the choice's
 * text start (the echoed prompt's included). */
static size_t char_offset(struct gen *g, size_t byte_off) {
    const struct textout *tx = &g->job->tx;
    if (byte_off > g->off_bytes && byte_off <= tx->len) {
        g->off_chars += utf8_chars(tx->buf + g->off_bytes, byte_off - g->off_bytes);
        g->off_bytes = byte_off;
    }
    return g->echo_chars + g->off_chars;
}

static void add_logprob(struct gen *g, const struct tok_rec *r) {
    if (g->ar.kind == API_CHAT) {
        buf *b = g->ar.stream ? &g->pending_lp : &g->lp;
        int *n = g->ar.stream ? &g->n_pending_lp : &g->n_lp;
        if (*n) buf_puts(b, ",");
        buf_puts(b, "{");
        lp_token(g, b, r->id, true, "token");
        buf_puts(b, ",\"logprob\":");
        json_put_float(b, r->logprob);
        buf_puts(b, ",\"top_logprobs\":[");
        for (int k = 0; k < r->n_top; k++) {
            buf_puts(b, k ? ",{" : "{");
            lp_token(g, b, r->top_ids[k], true, "token");
            buf_puts(b, ",\"logprob\":");
            json_put_float(b, r->top_lps[k]);
            buf_puts(b, "}");
        }
        buf_puts(b, "]}");
        (*n)++;
    } else {
        add_legacy_logprob(g, r, false, char_offset(g, r->text_start));
    }
}

static void emit_content(struct gen *g, const char *s, size_t n) {
    if (is_chat(g)) {
        output_parser_feed(g->op, s, n, on_event, g);
        return;
    }
    if (!g->ar.stream) {
        buf_append(&g->content, s, n);
        return;
    }
    if (!n) return;
    chunk_begin(g);
    buf_puts(&g->out, "\"text\":");
    json_put_str(&g->out, s, n);
    chunk_end(g, NULL);
}

/* 'echo': the prompt's text — as the request wrote it, or its token ids' bytes — and, with
 * logprobs, an entry for each of its tokens (the scheduler's records, complete once
 * prompt_done), ahead of anything generated. */
static void emit_echo(struct gen *g) {
    const struct job *j = g->job;
    g->echoed = true;
    /* as valid UTF-8 (U+FFFD for invalid bytes: a token-id prompt may cut a character), the
     * form every text the server sends has */
    buf text = {0};
    if (g->ar.prompt_text) {
        buf_append_lossy(&text, (const unsigned char *)g->ar.prompt_text, g->ar.prompt_len);
    } else {
        buf raw = {0};
        for (int p = 0; p < j->n_prompt; p++) {
            size_t n = 0;
            const char *t = g->port->token_bytes(g->port->ctx, j->prompt[p], &n);
            if (t) buf_append(&raw, t, n);
        }
        buf_append_lossy(&text, (const unsigned char *)(raw.data ? raw.data : ""), raw.len);
        buf_free(&raw);
    }
    g->echo_chars = utf8_chars(text.data ? text.data : "", text.len);
    if (j->prompt_logprobs) { /* offsets: the tokens' characters (exact wherever the text was valid) */
        size_t off = 0;
        for (int p = 0; p < j->n_prompt; p++) {
            struct tok_rec r = p ? j->prompt_recs[p] : (struct tok_rec){.id = j->prompt[0]};
            add_legacy_logprob(g, &r, p == 0, off);
            size_t n = 0;
            const char *t = g->port->token_bytes(g->port->ctx, j->prompt[p], &n);
            if (t) off += utf8_chars(t, n);
        }
    }
    if (!g->ar.stream) {
        buf_append(&g->content, text.data ? text.data : "", text.len);
    } else {
        chunk_begin(g);
        buf_puts(&g->out, "\"text\":");
        json_put_str(&g->out, text.data ? text.data : "", text.len);
        chunk_end(g, NULL);
    }
    buf_free(&text);
}

static const char *finish_name(const struct gen *g) {
    if (is_messages(g)) {
        if (g->fin == FIN_LENGTH) return g->ar.max_tokens_clamped ? "model_context_window_exceeded" : "max_tokens";
        if (g->n_tool_calls > 0) return "tool_use";
        return g->stop_seq ? "stop_sequence" : "end_turn";
    }
    if (g->fin == FIN_LENGTH) return "length";
    if (g->n_tool_calls > 0) return "tool_calls";
    return "stop";
}

/* The error a job's FIN_ERROR / FIN_CANCELLED stands for. */
static void fin_error(const struct gen *g, struct api_error *e) {
    if (g->fin == FIN_ERROR) api_error_set(e, 500, "server_error", NULL, NULL, "internal server error");
    else api_error_set(e, 503, "server_error", NULL, "cancelled", "the request was cancelled (server shutting down)");
}

/* An error body in the request's dialect; *status its HTTP status. */
static char *error_body(const struct gen *g, const struct api_error *e, int *status) {
    *status = e->status;
    return is_messages(g) ? anthropic_error_json(e) : api_error_json(e);
}

static char *internal_error(const struct gen *g, int *status) {
    struct api_error e;
    api_error_set(&e, 500, "server_error", NULL, NULL, "internal server error");
    return error_body(g, &e, status);
}

static struct am_usage am_usage_of(const struct gen *g) {
    return (struct am_usage){.prompt = g->n_prompt, .cached = g->cached, .output = g->n_gen};
}

/* Responses usage: reasoning_tokens is the reasoning text encoded again. */
static struct rs_usage rs_usage_of(const struct gen *g) {
    struct rs_usage u = {.prompt = g->n_prompt, .cached = g->cached, .output = g->n_gen};
    int32_t *ids = NULL;
    size_t n = 0;
    char err[128];
    if (g->reasoning.len && !g->port->encode(g->port->ctx, g->reasoning.data, g->reasoning.len, &ids, &n, err, sizeof err))
        u.reasoning = (int)n < g->n_gen ? (int)n : g->n_gen;
    free(ids);
    return u;
}

/* Adds obj[key] = the JSON text assembled in t (null if it does not parse); frees t. */
static void add_parsed(cJSON *obj, const char *key, buf *t) {
    cJSON *v = t->data ? cJSON_Parse(t->data) : NULL;
    buf_free(t);
    if (v) cJSON_AddItemToObject(obj, key, v);
    else cJSON_AddNullToObject(obj, key);
}

static void stream_finish(struct gen *g) {
    const bool failed = g->fin == FIN_ERROR || g->fin == FIN_CANCELLED;
    struct api_error e;
    if (failed) fin_error(g, &e);
    if (is_responses(g)) {
        struct rs_meta m = rs_meta_of(g);
        if (failed) {
            rs_stream_fail(&g->rs, &g->out, &m, e.code ? e.code : e.type, e.message);
        } else {
            struct rs_usage u = rs_usage_of(g);
            rs_stream_finish(&g->rs, &g->out, &m, g->fin == FIN_LENGTH ? "max_output_tokens" : NULL, &u);
        }
        return;
    }
    if (is_messages(g)) {
        if (failed) {
            am_stream_error(&g->out, e.status, e.message);
        } else {
            struct am_usage u = am_usage_of(g);
            am_stream_finish(&g->am, &g->out, finish_name(g), g->stop_seq, &u);
        }
        return;
    }
    if (failed) {
        char *body = api_error_json(&e);
        buf_printf(&g->out, "data: %s\n\n", body ? body : "{}");
        free(body);
        if (!g->multi) buf_puts(&g->out, "data: [DONE]\n\n");
        return;
    }
    chunk_begin(g);
    if (g->ar.kind == API_CHAT) buf_puts(&g->out, "{}");
    else buf_puts(&g->out, "\"text\":\"\"");
    chunk_end(g, finish_name(g));
    if (!g->multi) {
        const struct usage_sum u = usage_of(g);
        stream_close(g, &g->out, &u);
    }
}

/* The stream's last chunks into o: the usage (when asked) and [DONE]. */
static void stream_close(const struct gen *g, buf *o, const struct usage_sum *u) {
    if (g->ar.include_usage) {
        chunk_head(g, o);
        buf_printf(o,
                   "[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
                   u->prompt, u->completion, u->prompt + u->completion, u->cached);
    }
    buf_puts(o, "data: [DONE]\n\n");
}

/* One choice's new output (waiting up to timeout_ms for some); true once it has finished. */
static bool pump_one(struct gen *g, int timeout_ms) {
    if (g->finished) return true;
    struct job *j = g->job;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    bool want_lp = j->recs != NULL || g->ar.logprobs;
    if (g->ar.echo_prompt && !g->echoed) {
        /* the echo goes out alone, before anything generated (which waits for the next
         * pump: its text cannot exist before prompt_done); a job that ended without
         * scoring its prompt (failed, cancelled) is reported below without it */
        pthread_mutex_lock(&j->mu);
        while (j->prompt_logprobs && !j->prompt_done && !j->done)
            if (pthread_cond_timedwait(&j->cv, &j->mu, &dl) == ETIMEDOUT) break;
        const bool ready = !j->prompt_logprobs || j->prompt_done;
        pthread_mutex_unlock(&j->mu);
        if (ready) {
            emit_echo(g);
            return false;
        }
        if (!j->done) return false;
    }
    pthread_mutex_lock(&j->mu);
    while (!j->done && j->tx.released == g->cursor) {
        if (pthread_cond_timedwait(&j->cv, &j->mu, &dl) == ETIMEDOUT) break;
    }
    size_t rel = j->tx.released;
    bool done = j->done;
    g->in.len = 0;
    if (rel > g->cursor) buf_append(&g->in, j->tx.buf + g->cursor, rel - g->cursor);
    /* logprob records whose text is released (all remaining ones at the end) */
    int n_recs = j->n_recs;
    int upto = g->rec_cursor;
    if (want_lp && j->recs) {
        while (upto < n_recs && (done ? j->recs[upto].text_start <= rel : j->recs[upto].text_end <= rel)) {
            if (!(done && j->tx.stopped && j->recs[upto].text_start >= rel && j->recs[upto].text_end > rel))
                add_logprob(g, &j->recs[upto]);
            upto++;
        }
        if (done) upto = n_recs;
    }
    g->rec_cursor = upto;
    g->n_gen = j->n_gen;
    g->cached = j->cached;
    g->fin = j->finish;
    if (done && j->tx.stopped && j->tx.stop_index >= 0) g->stop_seq = j->tx.stops[j->tx.stop_index];
    pthread_mutex_unlock(&j->mu);
    g->cursor = rel;
    g->chunk_emitted = false;
    if (g->in.len) emit_content(g, g->in.data, g->in.len);
    if (g->ar.stream && g->n_pending_lp && !g->chunk_emitted) {
        /* logprobs whose tokens produced no visible text (held by the parser) */
        chunk_begin(g);
        if (g->ar.kind == API_CHAT) buf_puts(&g->out, "{}");
        else buf_puts(&g->out, "\"text\":\"\"");
        chunk_end(g, NULL);
    }
    if (done) {
        if (g->op && g->fin != FIN_ERROR && g->fin != FIN_CANCELLED) output_parser_finish(g->op, on_event, g);
        if (g->ar.stream) stream_finish(g);
        g->finished = true;
    }
    return g->finished;
}

bool gen_pump(struct gen *g, int timeout_ms) {
    if (!g->n_more) return pump_one(g, timeout_ms);
    /* the choices run in the same batches: wait on the first unfinished one, then take
     * whatever the others have */
    bool waited = false, all = true;
    for (int i = 0; i <= g->n_more; i++) {
        struct gen *c = choice(g, i);
        if (!c->finished) {
            pump_one(c, waited ? 0 : timeout_ms);
            waited = true;
        }
        all = all && c->finished;
    }
    if (all && g->ar.stream && !g->tail_built) {
        const struct usage_sum u = usage_of(g);
        stream_close(g, &g->tail, &u);
        g->tail_built = true;
    }
    return all;
}

/* A chat / completions choice's entry of "choices" (takes its tool calls). */
static cJSON *choice_entry(struct gen *g) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", g->index);
    const char *lp_key = "logprobs";
    if (g->ar.kind == API_CHAT) {
        cJSON *msg = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        if (g->content.len == 0 && g->n_tool_calls > 0) cJSON_AddNullToObject(msg, "content");
        else cJSON_AddStringToObject(msg, "content", g->content.data ? g->content.data : "");
        if (g->reasoning.len) cJSON_AddStringToObject(msg, "reasoning_content", g->reasoning.data);
        else cJSON_AddNullToObject(msg, "reasoning_content");
        if (g->n_tool_calls > 0) {
            cJSON_AddItemToObject(msg, "tool_calls", g->tool_calls);
            g->tool_calls = NULL;
        }
        if (g->ar.logprobs) {
            buf t = {0};
            buf_puts(&t, "{\"content\":[");
            buf_append(&t, g->lp.data ? g->lp.data : "", g->lp.len);
            buf_puts(&t, "]}");
            add_parsed(ch, lp_key, &t);
        } else {
            cJSON_AddNullToObject(ch, lp_key);
        }
    } else {
        cJSON_AddStringToObject(ch, "text", g->content.data ? g->content.data : "");
        if (g->ar.logprobs) {
            buf t = {0};
            buf_puts(&t, "{\"tokens\":[");
            buf_append(&t, g->lp_tokens.data ? g->lp_tokens.data : "", g->lp_tokens.len);
            buf_puts(&t, "],\"token_logprobs\":[");
            buf_append(&t, g->lp_vals.data ? g->lp_vals.data : "", g->lp_vals.len);
            buf_puts(&t, "],\"top_logprobs\":[");
            buf_append(&t, g->lp_tops.data ? g->lp_tops.data : "", g->lp_tops.len);
            buf_puts(&t, "],\"text_offset\":[");
            buf_append(&t, g->lp_offs.data ? g->lp_offs.data : "", g->lp_offs.len);
            buf_puts(&t, "]}");
            add_parsed(ch, lp_key, &t);
        } else {
            cJSON_AddNullToObject(ch, lp_key);
        }
    }
    cJSON_AddStringToObject(ch, "finish_reason", finish_name(g));
    return ch;
}

char *gen_final_json(struct gen *g, int *status) {
    *status = 200;
    for (int i = 0; i <= g->n_more; i++) { /* a failed choice (choice 0 first) fails the request */
        struct gen *c = choice(g, i);
        if (c->fin == FIN_ERROR || c->fin == FIN_CANCELLED) {
            struct api_error e;
            fin_error(c, &e);
            return error_body(c, &e, status);
        }
    }
    if (is_responses(g)) {
        struct rs_meta m = rs_meta_of(g);
        struct rs_usage u = rs_usage_of(g);
        char *s = rs_response_json(&m, g->reasoning.data, g->content.data, g->tool_calls,
                                   g->fin == FIN_LENGTH ? "max_output_tokens" : NULL, &u);
        return s ? s : internal_error(g, status);
    }
    if (is_messages(g)) {
        struct am_usage u = am_usage_of(g);
        char *s = am_message_json(g->id, g->model, g->reasoning.data, g->content.data, g->tool_calls, finish_name(g),
                                  g->stop_seq, &u);
        return s ? s : internal_error(g, status);
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", g->id);
    cJSON_AddStringToObject(root, "object", g->ar.kind == API_CHAT ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)g->created);
    cJSON_AddStringToObject(root, "model", g->model);
    cJSON_AddStringToObject(root, "system_fingerprint", "orchid");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; i <= g->n_more; i++) cJSON_AddItemToArray(choices, choice_entry(choice(g, i)));
    const struct usage_sum us = usage_of(g);
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", us.prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", us.completion);
    cJSON_AddNumberToObject(u, "total_tokens", us.prompt + us.completion);
    cJSON *pd = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(pd, "cached_tokens", us.cached);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s ? s : internal_error(g, status);
}

int gen_prompt_ids(const struct gen_config *cfg, const struct model_port *port, enum api_kind kind, const char *body,
                   size_t len, int32_t **ids, int *n, struct api_error *e) {
    struct api_request ar;
    char *forced = NULL;
    bool in_reasoning = false;
    *ids = NULL;
    *n = 0;
    /* no context limit here: a count is wanted most when it is over */
    int rc = api_parse(kind, body, len, port->model_id, port->vocab, cfg->default_thinking, &port->sampling, &ar, e);
    if (!rc) rc = api_prepare_prompt(&ar, port, INT_MAX, ids, n, &forced, &in_reasoning, e);
    api_request_free(&ar);
    free(forced);
    return rc;
}

int gen_count_tokens(const struct gen_config *cfg, const char *body, size_t len, char **json, struct api_error *e) {
    *json = NULL;
    memset(e, 0, sizeof *e);
    const struct model_port *port = gen_ready_port(cfg, e);
    if (!port) return e->status;
    int32_t *ids = NULL;
    int n_ids = 0;
    int rc = gen_prompt_ids(cfg, port, API_MESSAGES_COUNT, body, len, &ids, &n_ids, e);
    free(ids);
    if (rc) return rc;
    *json = malloc(48);
    if (!*json) return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    snprintf(*json, 48, "{\"input_tokens\":%d}", n_ids);
    return 0;
}

/* Up to max bytes of b's pending output from *off (b emptied once all is taken, so a
 * choice's buffer is reused); 0 when there is none. */
static long take_from(buf *b, size_t *off, char *dst, size_t max) {
    size_t avail = b->len - *off;
    if (avail == 0) {
        b->len = *off = 0;
        return 0;
    }
    size_t n = avail < max ? avail : max;
    memcpy(dst, b->data + *off, n);
    *off += n;
    if (*off == b->len) b->len = *off = 0;
    return (long)n;
}

long gen_stream_take(struct gen *g, char *buf, size_t max) {
    if (!g->n_more) {
        const long n = take_from(&g->out, &g->out_off, buf, max);
        return n == 0 && g->finished ? -1 : n;
    }
    /* a choice's buffer is drained before the next one's is touched (take_at stays on a
     * choice while its buffer holds a partly taken chunk) */
    for (int k = 0; k <= g->n_more; k++) {
        const int i = (g->take_at + k) % (g->n_more + 1);
        struct gen *c = choice(g, i);
        const long n = take_from(&c->out, &c->out_off, buf, max);
        if (n > 0) {
            g->take_at = c->out.len ? i : (i + 1) % (g->n_more + 1);
            return n;
        }
    }
    if (!g->tail_built) return 0;
    const long n = take_from(&g->tail, &g->tail_off, buf, max);
    return n == 0 ? -1 : n;
}

void gen_cancel(struct gen *g) {
    if (!g) return;
    for (int i = 0; i <= g->n_more; i++) {
        struct gen *c = choice(g, i);
        if (c->job && c->submitted) atomic_store(&c->job->cancel, 1);
    }
}

void gen_stats(const struct gen *g, int *prompt, int *cached, int *completion, char *err, size_t errlen) {
    const struct usage_sum u = g ? usage_of(g) : (struct usage_sum){0};
    *prompt = u.prompt;
    *cached = u.cached;
    *completion = u.completion;
    if (err && errlen) {
        err[0] = 0;
        if (g && g->job && g->fin == FIN_ERROR) {
            pthread_mutex_lock(&g->job->mu);
            snprintf(err, errlen, "%s", g->job->errmsg);
            pthread_mutex_unlock(&g->job->mu);
        } else if (g && g->fin == FIN_CANCELLED) {
            snprintf(err, errlen, "cancelled");
        }
        for (int i = 0; g && !err[0] && i < g->n_more; i++) /* else the first failed choice's */
            gen_stats(g->more[i], &(int){0}, &(int){0}, &(int){0}, err, errlen);
    }
}

void gen_free(struct gen *g) {
    if (!g) return;
    for (int i = 0; i < g->n_more; i++) gen_free(g->more[i]);
    free(g->more);
    free(g->tail.data);
    if (g->job) {
        if (g->submitted) {
            pthread_mutex_lock(&g->job->mu);
            bool done = g->job->done;
            pthread_mutex_unlock(&g->job->mu);
            if (!done) atomic_store(&g->job->cancel, 1);
        }
        job_release(g->job);
    }
    output_parser_free(g->op);
    rs_stream_free(&g->rs);
    api_request_free(&g->ar);
    cJSON_Delete(g->tool_calls);
    free(g->in.data);
    free(g->reasoning.data);
    free(g->content.data);
    free(g->lp.data);
    free(g->lp_tokens.data);
    free(g->lp_vals.data);
    free(g->lp_tops.data);
    free(g->lp_offs.data);
    free(g->out.data);
    free(g->pending_lp.data);
    free(g);
}
