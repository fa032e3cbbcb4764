/* server/tokenize.c — POST /tokenize and /detokenize (see tokenize.h).
 *
 * A chat body goes through the generation endpoints' own parse and render (api_parse as
 * /v1/chat/completions, gen_prompt_ids: no context limit, a count is wanted most
 * when it is over), so the ids are the ones a generation would be fed. Answers are written
 * by hand into a buffer (a prompt may have hundreds of thousands of ids).
 */
#include "server/tokenize.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/jsonout.h"

#define BAD(param, ...) api_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* The parsed body (an object) and the ready port, with "model" checked when present. */
static int open_body(const struct gen_config *cfg, const char *body, size_t len, cJSON **root,
                     const struct model_port **port, struct api_error *e) {
    *root = NULL;
    memset(e, 0, sizeof *e);
    if (!(*port = gen_ready_port(cfg, e))) return e->status;
    *root = cJSON_ParseWithLength(body, len);
    if (!*root) return BAD(NULL, "request body is not valid JSON");
    if (!cJSON_IsObject(*root)) return BAD(NULL, "request body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(*root, "model");
    if (model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) return BAD("model", "'model' must be a string");
        if (strcmp(model->valuestring, (*port)->model_id) != 0)
            return api_model_not_found(e, model->valuestring, (*port)->model_id);
    }
    return 0;
}

/* A chat body's ids: its copy with "model" named (optional here, required by api_parse). */
static int chat_ids(const struct gen_config *cfg, const struct model_port *port, const cJSON *root, int32_t **ids,
                    int *n, struct api_error *e) {
    cJSON *req = cJSON_Duplicate(root, 1);
    if (!req) return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(req, "model");
    cJSON_AddStringToObject(req, "model", port->model_id);
    char *text = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    if (!text) return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    const int rc = gen_prompt_ids(cfg, port, API_CHAT, text, strlen(text), ids, n, e);
    free(text);
    return rc;
}

/* The answer built in o, handed over as *json (0), or the 500 for a buffer that ran out of
 * memory. */
static int answer(buf *o, char **json, struct api_error *e) {
    if (o->oom) {
        buf_free(o);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    *json = o->data;
    return 0;
}

int tokenize_json(const struct gen_config *cfg, const char *body, size_t len, char **json, struct api_error *e) {
    *json = NULL;
    cJSON *root;
    const struct model_port *port;
    int rc = open_body(cfg, body, len, &root, &port, e);
    int32_t *ids = NULL;
    int n = 0;
    bool strs = false, gen_prompt = true, special = true;
    const cJSON *msgs = root ? cJSON_GetObjectItemCaseSensitive(root, "messages") : NULL;
    const cJSON *prompt = root ? cJSON_GetObjectItemCaseSensitive(root, "prompt") : NULL;
    if (!prompt && root) prompt = cJSON_GetObjectItemCaseSensitive(root, "content"); /* llama.cpp's name */
    if (!rc && (api_get_bool(root, "return_token_strs", &strs, e) < 0 ||
                api_get_bool(root, "add_generation_prompt", &gen_prompt, e) < 0 ||
                api_get_bool(root, "add_special_tokens", &special, e) < 0 ||
                api_get_bool(root, "add_special", &special, e) < 0))
        rc = e->status;
    if (!rc && !gen_prompt)
        rc = BAD("add_generation_prompt", "'add_generation_prompt': false is not supported (the chat is rendered as "
                                          "/v1/chat/completions renders it)");
    if (!rc && msgs && prompt) rc = BAD("messages", "give either 'prompt' or 'messages', not both");
    if (!rc && !msgs && !prompt) rc = BAD("prompt", "'prompt' (a string) or 'messages' is required");
    if (!rc && msgs) {
        rc = chat_ids(cfg, port, root, &ids, &n, e);
    } else if (!rc) {
        if (!cJSON_IsString(prompt)) {
            rc = BAD("prompt", "'prompt' must be a string");
        } else {
            size_t nn = 0;
            char err[256];
            if (port->encode(port->ctx, prompt->valuestring, strlen(prompt->valuestring), &ids, &nn, err, sizeof err))
                rc = api_error_set(e, 500, "server_error", NULL, NULL, "tokenizer: %s", err);
            n = (int)nn;
        }
    }
    cJSON_Delete(root);
    if (rc) {
        free(ids);
        return rc;
    }
    buf o = {0};
    buf_printf(&o, "{\"count\":%d,\"max_model_len\":%d,\"tokens\":[", n, sched_max_seq(cfg->sched));
    for (int i = 0; i < n; i++) buf_printf(&o, i ? ",%d" : "%d", ids[i]);
    buf_puts(&o, "],\"token_strs\":");
    if (strs) {
        buf_putc(&o, '[');
        for (int i = 0; i < n; i++) {
            size_t bl = 0;
            const char *b = port->token_bytes(port->ctx, ids[i], &bl);
            if (i) buf_putc(&o, ',');
            json_put_str(&o, b ? b : "", b ? bl : 0);
        }
        buf_putc(&o, ']');
    } else {
        buf_puts(&o, "null");
    }
    buf_putc(&o, '}');
    free(ids);
    return answer(&o, json, e);
}

int detokenize_json(const struct gen_config *cfg, const char *body, size_t len, char **json, struct api_error *e) {
    *json = NULL;
    cJSON *root;
    const struct model_port *port;
    int rc = open_body(cfg, body, len, &root, &port, e);
    const cJSON *toks = root ? cJSON_GetObjectItemCaseSensitive(root, "tokens") : NULL;
    if (!rc && !cJSON_IsArray(toks)) rc = BAD("tokens", "'tokens' (an array of token ids) is required");
    buf text = {0};
    int i = 0;
    const cJSON *t, *list = rc ? NULL : toks;
    cJSON_ArrayForEach(t, list) {
        const double v = cJSON_IsNumber(t) ? t->valuedouble : -1.0;
        size_t bl = 0;
        const char *b = v >= 0 && v < port->vocab && v == floor(v) ? port->token_bytes(port->ctx, (int32_t)v, &bl) : NULL;
        if (!b) {
            char param[32];
            snprintf(param, sizeof param, "tokens[%d]", i);
            rc = api_error_set(e, 400, "invalid_request_error", param, NULL,
                               "'tokens[%d]' is not a token id of this model's vocabulary (0..%d)", i, port->vocab - 1);
            break;
        }
        buf_append(&text, b, bl);
        i++;
    }
    cJSON_Delete(root);
    if (rc) {
        buf_free(&text);
        return rc;
    }
    buf o = {0};
    buf_puts(&o, "{\"prompt\":");
    json_put_str(&o, text.data ? text.data : "", text.len);
    buf_puts(&o, ",\"content\":");
    json_put_str(&o, text.data ? text.data : "", text.len);
    buf_putc(&o, '}');
    buf_free(&text);
    return answer(&o, json, e);
}
