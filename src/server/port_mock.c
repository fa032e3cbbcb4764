/* server/port_mock.c — a scripted, deterministic stand-in model for testing
 * the server without weights (`orchid serve --mock`). It owns its own tiny
 * byte-level vocabulary and ChatML-like renderer, so every server layer above
 * the port (validation, scheduling, sampling, stop strings, UTF-8 hold-back,
 * reasoning / tool-call parsing, SSE) runs exactly as with a real model.
 *
 * Vocabulary: ids 0..255 are bytes; 256 <|im_end|>, 257 <|im_start|>,
 * 258 <|endoftext|> (special: skipped in output, 256 and 258 stop), 259 <think>,
 * 260 </think>, 261 <tool_call>, 262 </tool_call> (ordinary text tokens).
 *
 * Script rule: the generation follows the text after the last "SCRIPT:" in the
 * prompt up to the next <|im_end|> (in chat, that is the user message), as one
 * token per byte / tag, then emits <|im_end|>. Generation starts after the
 * last "<|im_start|>assistant\n" (+ its think prefix) or, for a raw completion
 * prompt, right after that <|im_end|>. The script's tokens get logit 15, all
 * other printable ASCII a pseudo-random logit in [0, 4), so greedy decoding
 * follows the script and sampling mostly does. Without a script, or once the
 * output departs from it, the output is seeded noise (printable ASCII) with
 * no stop token, i.e. it runs until max_tokens. Each forward call sleeps
 * step_ms (default 2 ms, env ORCHID_MOCK_STEP_MS) to behave like a model;
 * ORCHID_MOCK_LOAD_MS delays the load (to test /health while loading). A
 * prompt containing "MOCK_FAIL" makes the forward fail (the 500 path).
 * The forward honours batch_seq.argmax as engine.h defines it (sampler_argmax
 * of the row; with NULL logits only the ids), like a device backend.
 * ORCHID_MOCK_INVARIANT_TOKENS=N (N > 0) makes the mock report the CUDA backend's kind of
 * batch invariance (port.h invariant_tokens) and fail any forward that breaks it: more
 * than N one-token rows, a prompt chunk of 2..N tokens beside anything else, a chunk of
 * more than N beside a one-token row, or packed chunks over ORCHID_MOCK_MAX_BATCH_TOKENS
 * (reported as port.max_batch_tokens; default 0, no bound).
 * ORCHID_MOCK_DEVICE_SAMPLING=1 makes the mock report a device sampler (port.h
 * device_sampling) and honour batch_seq.sampling with the device sampler's host reference
 * (dsmp_reference over its row), so the scheduler's sampled rows are tested without a GPU.
 * ORCHID_MOCK_ROW_SCORES=1 makes it report row scores (port.h row_scores, as the engine
 * does) and score batch_seq.score's rows by sampler_row_logprobs: the scheduler's whole-chunk
 * prompt logprobs; unset, the 16-row logits path stays covered.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/device_sampling.h"
#include "model/sampler.h"
#include "runtime/env.h"
#include "runtime/status.h"
#include "server/port.h"
#include "text/utf8.h"

enum { M_IM_END = 256, M_IM_START, M_EOT, M_THINK, M_ETHINK, M_TOOL, M_ETOOL, M_VOCAB = 264 };

static const char *const k_specials[] = {"<|im_end|>", "<|im_start|>", "<|endoftext|>", "<think>",
                                         "</think>",   "<tool_call>",  "</tool_call>"};
#define N_SPECIALS 7

struct mock_seq {
    int32_t *toks;
    int len, cap;
};

struct mock_ctx {
    char bytes[256];
    int step_ms;
    int invariant_tokens; /* > 0: the forward enforces the contract it reports */
    int max_batch_tokens; /* > 0: packed prompt chunks at most this many tokens in all */
    bool device_sampling; /* honours batch_seq.sampling (ORCHID_MOCK_DEVICE_SAMPLING=1) */
    bool row_scores;      /* honours batch_seq.score (ORCHID_MOCK_ROW_SCORES=1) */
};

/* ---- text side ---- */

static int mock_encode(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, char *err,
                       size_t errlen) {
    (void)ctx;
    int32_t *out = malloc((len + 1) * sizeof *out);
    if (!out) return errorf(err, errlen, ST_NOMEM, "encode: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        int sp = -1;
        if (text[i] == '<') {
            for (int s = 0; s < N_SPECIALS; s++) {
                size_t sl = strlen(k_specials[s]);
                if (sl <= len - i && memcmp(text + i, k_specials[s], sl) == 0) {
                    sp = s;
                    break;
                }
            }
        }
        if (sp >= 0) {
            out[k++] = M_IM_END + sp;
            i += strlen(k_specials[sp]);
        } else {
            out[k++] = (unsigned char)text[i++];
        }
    }
    *ids = out;
    *n = k;
    return ST_OK;
}

static const char *mock_token_bytes(void *ctx, int32_t id, size_t *len) {
    struct mock_ctx *m = ctx;
    if (id >= 0 && id < 256) {
        *len = 1;
        return &m->bytes[id];
    }
    if (id >= M_IM_END && id < M_IM_END + N_SPECIALS) {
        *len = strlen(k_specials[id - M_IM_END]);
        return k_specials[id - M_IM_END];
    }
    *len = 0;
    return NULL;
}

static int mock_is_special(void *ctx, int32_t id) {
    (void)ctx;
    return id == M_IM_END || id == M_IM_START || id == M_EOT;
}

static void put_content(buf *b, const cJSON *content) {
    if (cJSON_IsString(content)) {
        buf_puts(b, content->valuestring);
    } else if (cJSON_IsArray(content)) {
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (cJSON_IsString(t)) buf_puts(b, t->valuestring);
        }
    }
}

static int mock_render(void *ctx, const cJSON *messages, const cJSON *tools, int enable_thinking,
                       char **out, char *err, size_t errlen) {
    (void)ctx;
    buf b = {0};
    const cJSON *m;
    int i = 0;
    bool tools_done = false;
    if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) {
        const cJSON *first = cJSON_GetArrayItem(messages, 0);
        const cJSON *r0 = cJSON_GetObjectItemCaseSensitive(first, "role");
        buf_puts(&b, "<|im_start|>system\n# Tools\n<tools>");
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            char *j = cJSON_PrintUnformatted(t);
            if (j) {
                buf_puts(&b, "\n");
                buf_puts(&b, j);
                free(j);
            }
        }
        buf_puts(&b, "\n</tools>");
        if (cJSON_IsString(r0) && strcmp(r0->valuestring, "system") == 0) {
            buf_puts(&b, "\n\n");
            put_content(&b, cJSON_GetObjectItemCaseSensitive(first, "content"));
        }
        buf_puts(&b, "<|im_end|>\n");
        tools_done = true;
    }
    cJSON_ArrayForEach(m, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const char *r = cJSON_IsString(role) ? role->valuestring : "";
        if (strcmp(r, "system") == 0) {
            if (i != 0) {
                free(b.data);
                return errorf(err, errlen, ST_INVALID, "System message must be at the beginning.");
            }
            if (!tools_done) {
                buf_puts(&b, "<|im_start|>system\n");
                put_content(&b, cJSON_GetObjectItemCaseSensitive(m, "content"));
                buf_puts(&b, "<|im_end|>\n");
            }
        } else if (strcmp(r, "user") == 0) {
            buf_puts(&b, "<|im_start|>user\n");
            put_content(&b, cJSON_GetObjectItemCaseSensitive(m, "content"));
            buf_puts(&b, "<|im_end|>\n");
        } else if (strcmp(r, "assistant") == 0) {
            buf_puts(&b, "<|im_start|>assistant\n");
            /* every assistant turn carries a think block (empty when there was no
             * reasoning), so a re-rendered history extends the previous prompt */
            const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
            buf_puts(&b, "<think>\n");
            if (cJSON_IsString(rc) && rc->valuestring[0]) {
                buf_puts(&b, rc->valuestring);
                buf_puts(&b, "\n");
            }
            buf_puts(&b, "\n</think>\n\n");
            put_content(&b, cJSON_GetObjectItemCaseSensitive(m, "content"));
            const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), *tc;
            cJSON_ArrayForEach(tc, tcs) {
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
                const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                buf_puts(&b, "\n<tool_call>\n<function=");
                buf_puts(&b, cJSON_IsString(name) ? name->valuestring : "");
                buf_puts(&b, ">\n");
                if (cJSON_IsString(args)) buf_puts(&b, args->valuestring);
                buf_puts(&b, "\n</function>\n</tool_call>");
            }
            buf_puts(&b, "<|im_end|>\n");
        } else if (strcmp(r, "tool") == 0) {
            buf_puts(&b, "<|im_start|>user\n<tool_response>\n");
            put_content(&b, cJSON_GetObjectItemCaseSensitive(m, "content"));
            buf_puts(&b, "\n</tool_response><|im_end|>\n");
        } else {
            free(b.data);
            return errorf(err, errlen, ST_INVALID, "Unexpected message role.");
        }
        i++;
    }
    buf_puts(&b, "<|im_start|>assistant\n");
    buf_puts(&b, enable_thinking == 0 ? "<think>\n\n</think>\n\n" : "<think>\n");
    if (b.oom) {
        free(b.data);
        return errorf(err, errlen, ST_NOMEM, "render: out of memory");
    }
    *out = b.data;
    return ST_OK;
}

/* ---- model side ---- */

static int mock_seq_open(void *ctx, session **out, int max_seq, char *err, size_t errlen) {
    (void)ctx;
    struct mock_seq *s = calloc(1, sizeof *s);
    if (!s || !(s->toks = malloc((size_t)max_seq * sizeof *s->toks))) {
        free(s);
        return errorf(err, errlen, ST_NOMEM, "mock session: out of memory");
    }
    s->cap = max_seq;
    *out = (session *)s;
    return ST_OK;
}

static void mock_seq_close(void *ctx, session *ss) {
    (void)ctx;
    struct mock_seq *s = (struct mock_seq *)ss;
    if (!s) return;
    free(s->toks);
    free(s);
}

static void mock_seq_reset(void *ctx, session *ss) { (void)ctx; ((struct mock_seq *)ss)->len = 0; }
static int mock_seq_length(void *ctx, const session *ss) { (void)ctx; return ((const struct mock_seq *)ss)->len; }
static const int32_t *mock_seq_tokens(void *ctx, const session *ss) {
    (void)ctx;
    return ((const struct mock_seq *)ss)->toks;
}

static uint32_t mix(uint32_t h) {
    h ^= h >> 16;
    h *= 0x7feb352dU;
    h ^= h >> 15;
    h *= 0x846ca68bU;
    h ^= h >> 16;
    return h;
}

static bool match_bytes(const int32_t *t, int n, int at, const char *s) {
    int k = (int)strlen(s);
    if (at < 0 || at + k > n) return false;
    for (int i = 0; i < k; i++)
        if (t[at + i] != (unsigned char)s[i]) return false;
    return true;
}

/* Logits for the token after t[0..L). */
static void mock_logits(const int32_t *t, int L, float *out) {
    uint32_t h = mix((uint32_t)L * 2654435761U ^ (uint32_t)(L > 0 ? t[L - 1] : 7) * 40503U ^
                     (uint32_t)(L > 1 ? t[L - 2] : 3));
    for (int i = 0; i < M_VOCAB; i++) {
        if (i >= 32 && i < 127) out[i] = (float)(mix(h ^ (uint32_t)i * 0x9e3779b9U) % 1000) / 250.0f;
        else out[i] = -20.0f;
    }
    /* find the script */
    int sc = -1;
    for (int i = L - 7; i >= 0; i--)
        if (match_bytes(t, L, i, "SCRIPT:")) {
            sc = i + 7;
            break;
        }
    if (sc < 0) return;
    int e = sc;
    while (e < L && t[e] != M_IM_END) e++;
    if (e >= L) return;
    int g = e + 1;
    for (int i = L - 1; i > e; i--)
        if (t[i] == M_IM_START) {
            if (match_bytes(t, L, i + 1, "assistant\n")) {
                g = i + 11;
                if (g + 6 <= L && t[g] == M_THINK && t[g + 1] == '\n' && t[g + 2] == '\n' &&
                    t[g + 3] == M_ETHINK && t[g + 4] == '\n' && t[g + 5] == '\n')
                    g += 6;
                else if (g + 2 <= L && t[g] == M_THINK && t[g + 1] == '\n')
                    g += 2;
            }
            break;
        }
    if (L < g) return;
    int glen = L - g, slen = e - sc;
    if (glen > slen) return;
    for (int i = 0; i < glen; i++)
        if (t[g + i] != t[sc + i]) return;
    out[glen < slen ? t[sc + glen] : M_IM_END] = 15.0f;
}

static int mock_forward(void *ctx, struct batch_seq *seqs, int n_seqs, char *err, size_t errlen) {
    struct mock_ctx *m = ctx;
    if (m->invariant_tokens > 0 && n_seqs > 1) {
        const int inv = m->invariant_tokens;
        int one = 0, lng = 0, shrt = 0;
        long total = 0;
        for (int i = 0; i < n_seqs; i++) {
            const int n = seqs[i].n_tokens;
            one += n == 1;
            lng += n > inv;
            shrt += n > 1 && n <= inv;
            total += n;
        }
        const bool ok = !shrt && (lng ? !one && (m->max_batch_tokens <= 0 || total <= m->max_batch_tokens) : one <= inv);
        if (!ok)
            return errorf(err, errlen, ST_INTERNAL,
                          "mock: a batch of %d sequences (%d one-token, %d long and %d short prompt chunks, %ld tokens) "
                          "breaks batch invariance", n_seqs, one, lng, shrt, total);
    }
    for (int i = 0; i < n_seqs; i++) {
        struct mock_seq *s = (struct mock_seq *)seqs[i].s;
        if (seqs[i].n_tokens < 0 || s->len + seqs[i].n_tokens > s->cap)
            return errorf(err, errlen, ST_RANGE, "mock: session full (%d + %d > %d)", s->len,
                          seqs[i].n_tokens, s->cap);
        for (int k = 0; k < seqs[i].n_tokens; k++)
            if (seqs[i].tokens[k] < 0 || seqs[i].tokens[k] >= M_VOCAB)
                return errorf(err, errlen, ST_INVALID, "mock: token id %d out of range", seqs[i].tokens[k]);
    }
    for (int i = 0; i < n_seqs; i++) {
        /* "MOCK_FAIL" in a prompt makes the forward fail (tests of the 500 path) */
        for (int k = 0; k + 9 <= seqs[i].n_tokens; k++)
            if (match_bytes(seqs[i].tokens, seqs[i].n_tokens, k, "MOCK_FAIL"))
                return errorf(err, errlen, ST_INTERNAL, "mock: injected failure (secret detail 0xdeadbeef)");
    }
    for (int i = 0; i < n_seqs; i++) {
        struct mock_seq *s = (struct mock_seq *)seqs[i].s;
        memcpy(s->toks + s->len, seqs[i].tokens, (size_t)seqs[i].n_tokens * sizeof(int32_t));
        s->len += seqs[i].n_tokens;
        for (int k = 0; seqs[i].score && k < seqs[i].n_tokens; k++) /* batch_seq.score: row k after token k */
            if (seqs[i].score[k].token >= 0) {
                if (!m->row_scores) return errorf(err, errlen, ST_UNSUPPORTED, "mock: no row scores");
                float row[M_VOCAB];
                mock_logits(s->toks, s->len - seqs[i].n_tokens + k + 1, row);
                sampler_row_logprobs(row, M_VOCAB, seqs[i].score[k].token, seqs[i].score[k].n_top, &seqs[i].scores[k]);
            }
        if (!seqs[i].logits && !seqs[i].argmax) continue;
        /* output rows: the last token, or every new token with all_logits */
        const int n_rows = seqs[i].all_logits ? seqs[i].n_tokens : 1;
        for (int k = 0; k < n_rows; k++) {
            float row[M_VOCAB];
            float *dst = seqs[i].logits ? seqs[i].logits + (size_t)k * M_VOCAB : row;
            mock_logits(s->toks, s->len - n_rows + k + 1, dst);
            if (seqs[i].sampling) { /* engine_forward's contract: one row, no logits */
                uint32_t scratch[(M_VOCAB * 9 + 3) / 4];
                if (!m->device_sampling || sizeof scratch < dsmp_reference_scratch(M_VOCAB))
                    return errorf(err, errlen, ST_UNSUPPORTED, "mock: no device sampler");
                seqs[i].argmax[k] = dsmp_reference(dst, M_VOCAB, seqs[i].sampling, scratch);
            } else if (seqs[i].argmax) {
                const int32_t id = sampler_argmax(dst, M_VOCAB);
                seqs[i].argmax[k] = id < 0 ? 0 : id;
            }
        }
    }
    if (m->step_ms > 0) {
        struct timespec ts = {m->step_ms / 1000, (long)(m->step_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return ST_OK;
}

static void mock_close(void *ctx) { free(ctx); }

int port_open_mock(struct model_port *p, const struct port_options *opt, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    struct mock_ctx *m = calloc(1, sizeof *m);
    if (!m) return errorf(err, errlen, ST_NOMEM, "mock: out of memory");
    for (int i = 0; i < 256; i++) m->bytes[i] = (char)i;
    m->step_ms = 2;
    const char *e = getenv("ORCHID_MOCK_STEP_MS");
    if (e && *e) m->step_ms = atoi(e);
    e = getenv("ORCHID_MOCK_INVARIANT_TOKENS");
    if (e && *e) m->invariant_tokens = atoi(e);
    e = getenv("ORCHID_MOCK_MAX_BATCH_TOKENS");
    if (e && *e) m->max_batch_tokens = atoi(e);
    m->device_sampling = env_on("ORCHID_MOCK_DEVICE_SAMPLING");
    m->row_scores = env_on("ORCHID_MOCK_ROW_SCORES"); /* prompt logprobs scored by the "model" (the engine's way) */
    e = getenv("ORCHID_MOCK_LOAD_MS"); /* simulates a slow model load (tests of /health) */
    if (e && *e && atoi(e) > 0) {
        struct timespec ts = {atoi(e) / 1000, (long)(atoi(e) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    p->ctx = m;
    snprintf(p->model_id, sizeof p->model_id, "%s", opt && opt->model_id ? opt->model_id : "Qwen3.6-35B-A3B");
    snprintf(p->description, sizeof p->description, "mock scripted model (byte vocabulary, %d ms/step)",
             m->step_ms);
    p->vocab = M_VOCAB;
    p->device_sampling = m->device_sampling;
    p->row_scores = m->row_scores;
    p->max_position = 0;
    p->stop_ids[0] = M_IM_END;
    p->stop_ids[1] = M_EOT;
    p->turn_start_id = M_IM_START;
    p->invariant_tokens = m->invariant_tokens;
    p->max_batch_tokens = m->max_batch_tokens;
    p->n_stop = 2;
    p->render_chat = mock_render;
    p->sampling = sampler_params_default(); /* greedy: the scripts are followed */
    p->encode = mock_encode;
    p->token_bytes = mock_token_bytes;
    p->is_special = mock_is_special;
    p->seq_open = mock_seq_open;
    p->seq_close = mock_seq_close;
    p->seq_reset = mock_seq_reset;
    p->seq_length = mock_seq_length;
    p->seq_tokens = mock_seq_tokens;
    p->forward = mock_forward;
    p->close = mock_close;
    return ST_OK;
}
