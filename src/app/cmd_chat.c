/* app/cmd_chat.c — `orchid chat`: an interactive conversation in the terminal.
 *
 * Each line typed is a user turn. The whole conversation is re-rendered with the chat
 * template every turn (exactly what the server does), and the engine resumes from a
 * checkpoint instead of re-reading the history: the prompt is checkpointed where the
 * generation prompt starts (model/prefix_cache.h), which is a prefix of the next turn's
 * prompt. Reasoning (<think>…</think>) is shown dimmed on stderr, the answer on stdout.
 * Commands: /reset (forget the conversation), /quit (or end of input).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/cli.h"
#include "app/commands.h"
#include "model/engine.h"
#include "model/prefix_cache.h"
#include "model/sampler.h"
#include "runtime/timing.h"
#include "text/chat.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

static const char *USAGE =
    "usage: orchid chat [--model DIR] [--backend auto|cpu|cuda] [--thinking on|off] [--system TEXT]\n"
    "                   [--max-tokens N] [--temperature T] [--seed N] [--max-seq N]\n"
    "  type a message and press enter; /reset starts over, /quit (or Ctrl-D) leaves";

struct turn_out {
    char *content, *reasoning; /* accumulated text of this turn (malloc'd) */
    size_t nc, nr;
    bool tty;
};

static void append(char **s, size_t *n, const char *t, size_t len) {
    char *p = realloc(*s, *n + len + 1);
    if (!p) return;
    memcpy(p + *n, t, len);
    *n += len;
    p[*n] = 0;
    *s = p;
}

static int on_event(void *user, const output_event *ev) {
    struct turn_out *o = user;
    if (ev->kind == OUT_REASONING) {
        fprintf(stderr, "%s%.*s%s", o->tty ? "\033[2m" : "", (int)ev->len, ev->text, o->tty ? "\033[0m" : "");
        append(&o->reasoning, &o->nr, ev->text, ev->len);
    } else if (ev->kind == OUT_CONTENT) {
        fwrite(ev->text, 1, ev->len, stdout);
        append(&o->content, &o->nc, ev->text, ev->len);
    } else if (ev->kind == OUT_TOOL_CALL) {
        printf("[tool call %s %s]", ev->name, ev->arguments);
    }
    fflush(stdout);
    return 0;
}

/* One assistant turn: prompt ids → streamed reply; appends the reply to `msgs`. */
static int run_turn(engine *e, session *s, prefix_cache *pc, const tokenizer *tok, cJSON *msgs, const chat_options *co,
                    const struct sampler_params *sp, int max_tokens, float *logits) {
    char err[1024], *text = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1, turn_start = tokenizer_token_to_id(tok, "<|im_start|>");
    sampler *smp = NULL;
    detok_stream *ds = NULL;
    output_parser *op = NULL;
    struct turn_out o = {.tty = isatty(STDERR_FILENO) != 0};
    if (chat_render(tok, msgs, NULL, co, &text, err, sizeof err) || tokenizer_encode(tok, text, strlen(text), &ids, &n, err, sizeof err)) {
        fprintf(stderr, "orchid chat: %s\n", err);
        goto out;
    }
    if ((int)n + max_tokens > session_capacity(s)) {
        fprintf(stderr, "orchid chat: the conversation (%zu tokens) + %d new exceeds --max-seq %d; /reset to start over\n", n,
                max_tokens, session_capacity(s));
        goto out;
    }
    int matched = 0;
    if (prefix_cache_restore(pc, s, ids, (int)n, &matched, err, sizeof err)) fprintf(stderr, "orchid chat: cache: %s\n", err);
    int boundary = 0; /* where the generation prompt starts: checkpoint there */
    for (int i = (int)n - 1; i > matched; i--)
        if (ids[i] == turn_start) { boundary = i; break; }
    const double t0 = now_seconds();
    for (int pos = matched; pos < (int)n;) {
        const int end = boundary > pos ? boundary : (int)n;
        struct batch_seq q = {.s = s, .tokens = ids + pos, .n_tokens = end - pos, .logits = end == (int)n ? logits : NULL};
        if (engine_forward(e, &q, 1, err, sizeof err)) { fprintf(stderr, "orchid chat: %s\n", err); goto out; }
        pos = end;
        if (pos == boundary && prefix_cache_save(pc, s, err, sizeof err)) fprintf(stderr, "orchid chat: cache: %s\n", err);
    }
    const double t_prompt = now_seconds() - t0;
    output_parser_options po = output_parser_options_default();
    po.start_in_reasoning = co->enable_thinking != 0; /* the template opened <think> */
    if (sampler_new(&smp, engine_config(e)->vocab, sp, err, sizeof err) || detok_stream_new(&ds, tok, 1, err, sizeof err) ||
        output_parser_new(&op, &po, err, sizeof err)) {
        fprintf(stderr, "orchid chat: %s\n", err);
        goto out;
    }
    sampler_accept(smp, ids, (int)n, true);
    const struct model_config *c = engine_config(e);
    int gen = 0;
    const double t1 = now_seconds();
    for (;;) {
        struct sample_result r;
        int32_t t = sampler_sample(smp, logits, &r);
        gen++;
        bool stop = t == tokenizer_eos_id(tok);
        for (int i = 0; i < c->n_eos; i++) stop |= t == c->eos_ids[i];
        if (stop) break;
        const char *piece;
        size_t len;
        if (detok_push(ds, t, &piece, &len, err, sizeof err) == 0 && len) output_parser_feed(op, piece, len, on_event, &o);
        sampler_accept(smp, &t, 1, false);
        if (gen >= max_tokens) break;
        struct batch_seq q = {.s = s, .tokens = &t, .n_tokens = 1, .logits = logits};
        if (engine_forward(e, &q, 1, err, sizeof err)) { fprintf(stderr, "\norchid chat: %s\n", err); goto out; }
    }
    const char *piece;
    size_t len;
    if (detok_flush(ds, &piece, &len) == 0 && len) output_parser_feed(op, piece, len, on_event, &o);
    output_parser_finish(op, on_event, &o);
    const double t_gen = now_seconds() - t1;
    fprintf(stderr, "\n[%zu prompt tokens, %d reused, %d generated, %.1f tok/s prompt, %.1f tok/s generation]\n", n, matched,
            gen, (double)((int)n - matched) / (t_prompt > 0 ? t_prompt : 1e-9), gen / (t_gen > 0 ? t_gen : 1e-9));
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", o.content ? o.content : "");
    if (o.reasoning) cJSON_AddStringToObject(m, "reasoning_content", o.reasoning);
    cJSON_AddItemToArray(msgs, m);
    rc = 0;
out:
    free(o.content);
    free(o.reasoning);
    output_parser_free(op);
    detok_stream_free(ds);
    sampler_free(smp);
    free(ids);
    free(text);
    return rc;
}

static cJSON *new_conversation(const char *system) {
    cJSON *msgs = cJSON_CreateArray();
    if (system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", system);
        cJSON_AddItemToArray(msgs, m);
    }
    return msgs;
}

int cmd_chat(int argc, char **argv) {
    const char *model = "models/tiny", *backend = "auto", *thinking = NULL, *system = NULL;
    long max_tokens = 512, seed = -1, max_seq = 16384;
    double temperature = 0.7;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { puts(USAGE); return 0; }
        if (!(v = cli_value(argc, argv, &i))) return cli_usage_error("chat", "%s needs a value\n%s", a, USAGE);
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--system")) system = v;
        else if (!strcmp(a, "--thinking")) {
            if (strcmp(v, "on") && strcmp(v, "off")) return cli_usage_error("chat", "--thinking must be on or off");
            thinking = v;
        } else if (!strcmp(a, "--max-tokens")) {
            if (!cli_parse_int(v, 1, 1 << 20, &max_tokens)) return cli_usage_error("chat", "--max-tokens must be in 1..1048576");
        } else if (!strcmp(a, "--max-seq")) {
            if (!cli_parse_int(v, 16, 1 << 20, &max_seq)) return cli_usage_error("chat", "--max-seq must be in 16..1048576");
        } else if (!strcmp(a, "--seed")) {
            if (!cli_parse_int(v, 0, 0x7fffffffL, &seed)) return cli_usage_error("chat", "--seed must be a non-negative integer");
        } else if (!strcmp(a, "--temperature")) {
            char *end;
            temperature = strtod(v, &end);
            if (*end || !(temperature >= 0 && temperature <= 10)) return cli_usage_error("chat", "--temperature must be in 0..10");
        } else {
            return cli_usage_error("chat", "unknown flag \"%s\"\n%s", a, USAGE);
        }
    }
    if (!cli_is_dir(model)) return cli_usage_error("chat", "%s: not a directory (make run creates models/tiny)", model);
    char err[1024];
    int rc = 1;
    engine *e = NULL;
    session *s = NULL;
    prefix_cache *pc = NULL;
    tokenizer *tok = NULL;
    float *logits = NULL;
    cJSON *msgs = NULL;
    char *line = NULL;
    size_t cap = 0;
    struct engine_options opt = {.model_dir = model, .backend = backend};
    if (engine_open(&e, &opt, err, sizeof err) || tokenizer_load(&tok, model, err, sizeof err) ||
        session_open(e, &s, (int)max_seq, err, sizeof err) || prefix_cache_create(&pc, e, (size_t)1 << 30, err, sizeof err)) {
        fprintf(stderr, "orchid chat: %s\n", err);
        goto out;
    }
    if (!(logits = malloc((size_t)engine_config(e)->vocab * sizeof(float)))) goto out;
    chat_options co = chat_options_default();
    if (thinking) co.enable_thinking = !strcmp(thinking, "on");
    struct sampler_params sp = sampler_params_default();
    sp.temperature = (float)temperature;
    if (seed >= 0) { sp.seed = (uint64_t)seed; sp.has_seed = true; }
    msgs = new_conversation(system);
    fprintf(stderr, "orchid chat: %s on %s — /reset starts over, /quit leaves\n", model, engine_backend_name(e));
    for (;;) {
        fputs("> ", stderr);
        ssize_t len = getline(&line, &cap, stdin);
        if (len < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            cJSON_Delete(msgs);
            msgs = new_conversation(system);
            continue;
        }
        if (!len) continue;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", line);
        cJSON_AddItemToArray(msgs, m);
        if (run_turn(e, s, pc, tok, msgs, &co, &sp, (int)max_tokens, logits)) {
            cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1); /* drop the failed user turn */
        }
    }
    rc = 0;
out:
    free(line);
    cJSON_Delete(msgs);
    free(logits);
    prefix_cache_free(pc);
    session_close(s);
    tokenizer_free(tok);
    engine_close(e);
    return rc;
}
