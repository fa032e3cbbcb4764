/* server/port_engine.c — the model port for a real checkpoint: engine.h for
 * the model, tokenizer.h for ids and token bytes, chat.h for the Qwen3.6
 * template, model/prefix_cache.h for prefix checkpoints (its stats handed to
 * server/metrics.h after each save and restore). It owns the engine, the
 * tokenizer and the cache for the server's lifetime and adds nothing but
 * plumbing: stop ids are the checkpoint config's
 * eos_token_id values plus the tokenizer's eos (<|im_end|>), without
 * duplicates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/engine.h"
#include "model/prefix_cache.h"
#include "runtime/fileio.h"
#include "runtime/status.h"
#include "runtime/timing.h"
#include "server/metrics.h"
#include "server/port.h"
#include "text/chat.h"
#include "text/tokenizer.h"

struct engine_port {
    engine *e;
    tokenizer *tok;
    prefix_cache *pc;
};

static int ep_render(void *ctx, const cJSON *messages, const cJSON *tools, int enable_thinking, char **out,
                     char *err, size_t errlen) {
    struct engine_port *p = ctx;
    chat_options o = chat_options_default();
    o.enable_thinking = enable_thinking;
    return chat_render(p->tok, messages, tools, &o, out, err, errlen);
}

static int ep_encode(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, char *err,
                     size_t errlen) {
    struct engine_port *p = ctx;
    return tokenizer_encode(p->tok, text, len, ids, n, err, errlen);
}

static const char *ep_token_bytes(void *ctx, int32_t id, size_t *len) {
    struct engine_port *p = ctx;
    return tokenizer_token_bytes(p->tok, id, len);
}

static int ep_is_special(void *ctx, int32_t id) {
    struct engine_port *p = ctx;
    return tokenizer_is_special(p->tok, id);
}

static int ep_seq_open(void *ctx, session **out, int max_seq, char *err, size_t errlen) {
    struct engine_port *p = ctx;
    return session_open(p->e, out, max_seq, err, errlen);
}
static void ep_seq_close(void *ctx, session *s) { (void)ctx; session_close(s); }
static void ep_seq_reset(void *ctx, session *s) { (void)ctx; session_reset(s); }
static int ep_seq_length(void *ctx, const session *s) { (void)ctx; return session_length(s); }
static const int32_t *ep_seq_tokens(void *ctx, const session *s) { (void)ctx; return session_tokens(s); }

static int ep_forward(void *ctx, struct batch_seq *seqs, int n, char *err, size_t errlen) {
    struct engine_port *p = ctx;
    return engine_forward(p->e, seqs, n, err, errlen);
}

/* The cache's stats to /metrics (after each restore and save: the scheduler thread
 * is the cache's only user). */
void port_publish_cache_stats(const prefix_cache *pc) {
    struct prefix_cache_stats st;
    prefix_cache_get_stats(pc, &st);
    const struct metrics_cache_stats ms = {
        .entries = (long)st.entries,
        .bytes = (long)st.bytes,
        .max_bytes = (long)st.max_bytes,
        .pooled = (long)st.pooled,
        .lookups = (long)st.lookups,
        .hits = (long)st.hits,
        .saves = (long)st.saves,
        .evictions = (long)st.evictions,
        .host_allocs = (long)st.host_allocs,
        .host_frees = (long)st.host_frees,
        .save_s = st.save_s,
        .restore_s = st.restore_s,
        .host_alloc_s = st.host_alloc_s,
    };
    metrics_prefix_cache(&ms);
}

static int ep_cache_restore(void *ctx, session *s, const int32_t *tokens, int n, int *matched, char *err,
                            size_t errlen) {
    struct engine_port *p = ctx;
    const int rc = prefix_cache_restore(p->pc, s, tokens, n, matched, err, errlen);
    port_publish_cache_stats(p->pc);
    return rc;
}

static int ep_cache_save(void *ctx, session *s, char *err, size_t errlen) {
    struct engine_port *p = ctx;
    const int rc = prefix_cache_save(p->pc, s, err, errlen);
    port_publish_cache_stats(p->pc);
    return rc;
}

static int ep_cache_match(void *ctx, const int32_t *tokens, int n) {
    return prefix_cache_match(((struct engine_port *)ctx)->pc, tokens, n);
}

static void *ep_host_alloc(void *ctx, size_t bytes) { return engine_host_alloc(((struct engine_port *)ctx)->e, bytes); }
static void ep_host_free(void *ctx, void *ptr) { engine_host_free(((struct engine_port *)ctx)->e, ptr); }

static void ep_close(void *ctx) {
    struct engine_port *p = ctx;
    if (!p) return;
    prefix_cache_free(p->pc);
    engine_close(p->e);
    tokenizer_free(p->tok);
    free(p);
}

static void add_stop(struct model_port *mp, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < mp->n_stop; i++)
        if (mp->stop_ids[i] == id) return;
    if (mp->n_stop < PORT_MAX_STOP_IDS) mp->stop_ids[mp->n_stop++] = id;
}

/* The sampling defaults of a checkpoint's generation_config.json, as vLLM's
 * --generation-config auto takes them: temperature, top_p, top_k, min_p and
 * repetition_penalty where present and valid ("do_sample": false keeps greedy); a missing
 * file leaves greedy, a field out of range is a warning and left out. Qwen3.6's file asks
 * for temperature 1.0, top_k 20, top_p 0.95 (MODEL.md) — Qwen advises against greedy
 * decoding with thinking on (repetition). Returns a one-line summary into note. */
static void load_generation_config(const char *dir, struct sampler_params *sp, char *note, size_t n) {
    char path[4096], ferr[256];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    snprintf(note, n, "greedy (no generation_config.json)");
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(path, 1 << 20, &text, &len, ferr, sizeof ferr)) return;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        fprintf(stderr, "warning: %s is not a JSON object; requests default to greedy\n", path);
        snprintf(note, n, "greedy (generation_config.json unreadable)");
        cJSON_Delete(root);
        return;
    }
    struct sampler_params t = *sp;
    /* each field's range and where it goes (top_k: a whole number, into an int) */
    const struct { const char *name; double lo, hi; bool lo_open; float *f; int *k; } f[] = {
        {"temperature", 0, 100, false, &t.temperature, NULL}, {"top_p", 0, 1, true, &t.top_p, NULL},
        {"top_k", 0, 1e9, false, NULL, &t.top_k}, {"min_p", 0, 1, false, &t.min_p, NULL},
        {"repetition_penalty", 0, 10, true, &t.repetition_penalty, NULL}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, f[i].name);
        if (!v || cJSON_IsNull(v)) continue;
        const double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (!cJSON_IsNumber(v) || !(d >= f[i].lo) || d > f[i].hi || (f[i].lo_open && d == f[i].lo) ||
            (f[i].k && d != (double)(long long)d)) {
            fprintf(stderr, "warning: %s: '%s' is out of range; left out\n", path, f[i].name);
            continue;
        }
        if (f[i].k) *f[i].k = (int)d;
        else *f[i].f = (float)d;
    }
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(root, "do_sample");
    if (cJSON_IsFalse(ds)) t.temperature = 0.0f;
    cJSON_Delete(root);
    *sp = t;
    if (t.temperature > 0.0f)
        snprintf(note, n, "temperature %g, top_p %g, top_k %d, min_p %g, repetition_penalty %g (generation_config.json)",
                 (double)t.temperature, (double)t.top_p, t.top_k, (double)t.min_p, (double)t.repetition_penalty);
    else
        snprintf(note, n, "greedy (generation_config.json)");
}

int port_open_engine(struct model_port *mp, const struct port_options *opt, char *err, size_t errlen) {
    memset(mp, 0, sizeof *mp);
    struct engine_port *p = calloc(1, sizeof *p);
    if (!p) return errorf(err, errlen, ST_NOMEM, "out of memory");
    int rc = tokenizer_load(&p->tok, opt->model_dir, err, errlen);
    if (rc) {
        error_prefix(err, errlen, "loading tokenizer from %s", opt->model_dir);
        free(p);
        return rc;
    }
    struct engine_options eo = {0};
    eo.model_dir = opt->model_dir;
    eo.backend = opt->backend;
    eo.threads = opt->threads;
    eo.quiet = false;
    rc = engine_open(&p->e, &eo, err, errlen);
    if (rc) {
        tokenizer_free(p->tok);
        free(p);
        return rc;
    }
    if (opt->cache_bytes > 0) {
        rc = prefix_cache_create(&p->pc, p->e, opt->cache_bytes, err, errlen);
        if (rc) {
            error_prefix(err, errlen, "prefix cache");
            engine_close(p->e);
            tokenizer_free(p->tok);
            free(p);
            return rc;
        }
        /* pinned blocks ahead of the first saves (H200, 60 MB state blocks: 16 in 0.44-0.55 s
         * at start; a multi-turn replay's cache-on TTFT 0.072 -> 0.038 s for each turn that
         * would otherwise have pinned its blocks): state blocks for three quarters of the
         * budget, KV chunks for the rest. ORCHID_CACHE_PREWARM=N: N state blocks only (0: none). */
        const char *pw = getenv("ORCHID_CACHE_PREWARM");
        const double t0 = now_seconds();
        const int got = prefix_cache_prewarm(p->pc, pw && *pw ? atoi(pw) : -1);
        struct prefix_cache_stats st;
        prefix_cache_get_stats(p->pc, &st);
        if (got)
            fprintf(stderr, "prefix cache: %d blocks (%zu MB) pinned ahead in %.2f s\n", got, st.pooled >> 20,
                    now_seconds() - t0);
        port_publish_cache_stats(p->pc);
    }
    const struct model_config *c = engine_config(p->e);
    if (!chat_template_supported(tokenizer_chat_template(p->tok)))
        fprintf(stderr, "warning: %s: the checkpoint's chat template differs from the built-in Qwen3.6 "
                        "template; rendering with the built-in one\n", opt->model_dir);
    mp->ctx = p;
    snprintf(mp->model_id, sizeof mp->model_id, "%s", opt->model_id ? opt->model_id : "Qwen3.6-35B-A3B");
    char desc[640];
    config_describe(c, desc, sizeof desc);
    snprintf(mp->description, sizeof mp->description, "%s on %s", desc, engine_backend_name(p->e));
    mp->vocab = c->vocab;
    mp->max_position = c->max_position;
    mp->turn_start_id = tokenizer_token_to_id(p->tok, "<|im_start|>");
    mp->invariant_tokens = engine_invariant_tokens(p->e);
    mp->max_batch_tokens = engine_max_batch_tokens(p->e);
    mp->device_sampling = engine_device_sampling(p->e);
    mp->row_scores = engine_row_scores(p->e);
    mp->sampling = sampler_params_default();
    char note[256] = "greedy (--generation-config none)";
    if (!opt->no_generation_config) load_generation_config(opt->model_dir, &mp->sampling, note, sizeof note);
    fprintf(stderr, "request sampling defaults: %s\n", note);
    add_stop(mp, tokenizer_eos_id(p->tok));
    for (int i = 0; i < c->n_eos; i++) add_stop(mp, c->eos_ids[i]);
    mp->render_chat = ep_render;
    mp->encode = ep_encode;
    mp->token_bytes = ep_token_bytes;
    mp->is_special = ep_is_special;
    mp->seq_open = ep_seq_open;
    mp->seq_close = ep_seq_close;
    mp->seq_reset = ep_seq_reset;
    mp->seq_length = ep_seq_length;
    mp->seq_tokens = ep_seq_tokens;
    mp->forward = ep_forward;
    mp->host_alloc = ep_host_alloc;
    mp->host_free = ep_host_free;
    mp->close = ep_close;
    if (p->pc) {
        mp->cache_restore = ep_cache_restore;
        mp->cache_save = ep_cache_save;
        mp->cache_match = ep_cache_match;
    }
    return ST_OK;
}
