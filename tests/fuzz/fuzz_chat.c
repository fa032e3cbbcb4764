/* tests/fuzz/fuzz_chat.c — libFuzzer target: arbitrary bytes as a request body through
 * the OpenAI request parser/validator (server/api.h, as /v1/chat/completions and as
 * /v1/completions), then the prompt preparation (render with the native Qwen3.6 chat
 * template, encode, context budget) through a text-only port; and the same JSON
 * straight into the chat template renderer (text/chat.h), unvalidated, with options
 * taken from the input.
 *
 * Invariants: a rejected request has a 4xx status and a message, and its error JSON
 * parses; an accepted one renders or is refused with a message; whenever the input is
 * valid UTF-8 a rendered prompt is valid UTF-8 and NUL-free; nothing leaks. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "runtime/status.h"
#include "server/api.h"
#include "text/chat.h"
#include "text/utf8.h"

#define MODEL_ID "Qwen3.6-35B-A3B"
#define VOCAB 248077

/* ---- a text-only port: the real renderer, a byte-level "tokenizer" ---- */

static int render(void *ctx, const cJSON *messages, const cJSON *tools, int enable_thinking, char **out, char *err,
                  size_t errlen) {
    (void)ctx;
    chat_options o = chat_options_default();
    o.enable_thinking = enable_thinking;
    return chat_render(NULL, messages, tools, &o, out, err, errlen);
}

static int encode(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, char *err, size_t errlen) {
    (void)ctx;
    size_t bad = utf8_validate(text, len);
    if (bad != len) return errorf(err, errlen, ST_INVALID, "invalid UTF-8 at byte offset %zu", bad);
    *ids = malloc((len + 1) * sizeof **ids);
    if (!*ids) return errorf(err, errlen, ST_NOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
    *n = len;
    return 0;
}

static void check_error(const struct api_error *e) {
    if (e->status < 400 || e->status > 499 || !e->message[0]) abort();
    char *js = api_error_json(e);
    cJSON *j = js ? cJSON_Parse(js) : NULL;
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "error"))) abort();
    cJSON_Delete(j);
    free(js);
}

static void check_text(const char *s, int input_valid) {
    size_t n = strlen(s);
    if (input_valid && utf8_validate(s, n) != n) abort();
}

static void through_api(enum api_kind kind, const char *body, size_t len, int thinking, int input_valid) {
    static struct model_port port = {.model_id = MODEL_ID, .vocab = VOCAB, .render_chat = render, .encode = encode};
    struct api_request r;
    struct api_error e;
    int rc = api_parse(kind, body, len, MODEL_ID, VOCAB, thinking, NULL, &r, &e);
    if (rc) {
        if (rc != e.status) abort();
        check_error(&e);
        api_request_free(&r);
        return;
    }
    int32_t *ids = NULL;
    int n = 0;
    char *prefix = NULL;
    bool in_reasoning;
    rc = api_prepare_prompt(&r, &port, 1 << 16, &ids, &n, &prefix, &in_reasoning, &e);
    if (rc) {
        if (rc != e.status || ids || prefix) abort(); /* nothing is returned on failure */
        if (rc != 500) check_error(&e); /* 500: out of memory, never from input */
    } else {
        /* max_tokens 0 only with echo (the prompt's logprobs alone) */
        if (n <= 0 || !ids || r.max_tokens < 0 || (r.max_tokens == 0 && !r.echo_prompt) || n + r.max_tokens > 1 << 16)
            abort();
        if (prefix) check_text(prefix, input_valid);
    }
    free(ids);
    free(prefix);
    /* a batch of prompts: every one was validated with the first, so the last parses too */
    const int last = rc == 0 ? r.n_prompts - 1 : 0;
    api_request_free(&r);
    if (last > 0) {
        rc = api_parse_at(kind, body, len, MODEL_ID, VOCAB, thinking, NULL, last, &r, &e);
        if (rc || r.prompt_index != last || r.n_prompts != last + 1) abort();
        api_request_free(&r);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *body = (const char *)data;
    int valid = utf8_validate(body, size) == size && !memchr(body, 0, size);
    /* options from a cheap hash of the input, so every input tries one combination */
    unsigned h = 2166136261u;
    for (size_t i = 0; i < size && i < 64; i++) h = (h ^ data[i]) * 16777619u;
    int thinking = (int)(h % 3) - 1;

    through_api(API_CHAT, body, size, thinking, valid);
    through_api(API_COMPLETION, body, size, thinking, valid);

    /* the renderer alone, on whatever JSON this is */
    cJSON *root = cJSON_ParseWithLength(body, size);
    if (root) {
        const cJSON *messages = cJSON_IsArray(root) ? root : cJSON_GetObjectItemCaseSensitive(root, "messages");
        const cJSON *tools = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "tools") : NULL;
        chat_options o = chat_options_default();
        o.add_generation_prompt = (h >> 4) & 1;
        o.enable_thinking = (int)((h >> 5) % 3) - 1;
        o.preserve_thinking = (int)((h >> 7) % 3) - 1;
        o.add_vision_id = (h >> 9) & 1;
        o.arguments_json = (h >> 10) & 1;
        char *out = NULL, err[512] = "";
        int rc = chat_render(NULL, messages, tools, &o, &out, err, sizeof err);
        if (rc) {
            if (!err[0] || out) abort();
        } else {
            if (!out) abort();
            check_text(out, valid);
            free(out);
        }
        cJSON_Delete(root);
    }
    return 0;
}
