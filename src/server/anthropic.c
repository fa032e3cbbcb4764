/* server/anthropic.c — Anthropic Messages requests translated into the OpenAI
 * chat shape, and Anthropic-shaped responses and events (see anthropic.h).
 *
 * The translation validates everything that has no OpenAI counterpart (block
 * types, tool_result / tool_use structure, system, tool_choice, thinking,
 * stop_sequences) and names the field in Anthropic's terms
 * ("messages[2].content[1].tool_use_id"); what it copies unchanged
 * (max_tokens, top_p, top_k, stream) is validated by api.c under the same
 * name. The translated tree owns copies of everything it holds, so the
 * caller may free the original body afterwards.
 */
#include "server/anthropic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/jsonout.h"

#define BAD(param, ...) api_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

static bool present(const cJSON *v) { return v && !cJSON_IsNull(v); }

/* Appends s to b, separated from what b holds by sep. */
static void join(buf *b, const char *sep, const char *s) {
    if (b->len) buf_puts(b, sep);
    buf_puts(b, s);
}

/* The unsupported block types get one message, whatever the role. */
static int unsupported_block(const char *where, const char *type, struct api_error *e) {
    if (!strcmp(type, "image") || !strcmp(type, "document") || !strcmp(type, "search_result"))
        return BAD(where, "'%s': %s content is not supported (this server runs a text-only model)", where, type);
    return BAD(where, "'%s': content block type '%.40s' is not supported here", where, type);
}

/* Names block k of `where` into w ("messages[2].content[1]") and returns its
 * type, or NULL (e set) when it is not an object with a string 'type'. */
static const char *block_type(const cJSON *blk, const char *where, int k, char *w, size_t wn,
                              struct api_error *e) {
    snprintf(w, wn, "%s[%d]", where, k);
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(blk, "type");
    if (cJSON_IsObject(blk) && cJSON_IsString(ty)) return ty->valuestring;
    BAD(w, "'%s' must be an object with a string 'type'", w);
    return NULL;
}

/* A string or an array of text blocks (system, tool_result content), joined
 * into b by sep. Returns 0 or -1 (e set). */
static int text_or_blocks(const cJSON *c, const char *where, const char *sep, buf *b, struct api_error *e) {
    if (cJSON_IsString(c)) {
        join(b, sep, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c)) return BAD(where, "'%s' must be a string or an array of text blocks", where), -1;
    const cJSON *blk;
    int k = 0;
    char w[96];
    cJSON_ArrayForEach(blk, c) {
        const char *type = block_type(blk, where, k++, w, sizeof w, e);
        if (!type) return -1;
        if (strcmp(type, "text")) return unsupported_block(w, type, e), -1;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(blk, "text");
        if (!cJSON_IsString(t)) return BAD(w, "'%s.text' must be a string", w), -1;
        join(b, sep, t->valuestring);
    }
    return 0;
}

/* One user message: text blocks gather into user messages, each tool_result
 * becomes a tool message where it stands. */
static int user_message(const cJSON *content, int i, cJSON *msgs, struct api_error *e) {
    char where[96];
    snprintf(where, sizeof where, "messages[%d].content", i);
    if (cJSON_IsString(content)) {
        api_chat_message(msgs, "user", content->valuestring);
        return 0;
    }
    buf text = {0};
    bool has_text = false;
    int rc = 0, k = 0;
    const cJSON *blk;
    cJSON_ArrayForEach(blk, content) {
        char w[128];
        const char *type = block_type(blk, where, k++, w, sizeof w, e);
        if (!type) {
            rc = -1;
            break;
        }
        if (!strcmp(type, "text")) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(blk, "text");
            if (!cJSON_IsString(t)) {
                rc = BAD(w, "'%s.text' must be a string", w);
                break;
            }
            join(&text, "\n\n", t->valuestring);
            has_text = true;
        } else if (!strcmp(type, "tool_result")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(blk, "tool_use_id");
            if (!cJSON_IsString(id) || !id->valuestring[0]) {
                rc = BAD(w, "'%s.tool_use_id' must be a non-empty string", w);
                break;
            }
            const cJSON *is_err = cJSON_GetObjectItemCaseSensitive(blk, "is_error");
            if (present(is_err) && !cJSON_IsBool(is_err)) {
                rc = BAD(w, "'%s.is_error' must be a boolean", w);
                break;
            }
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(blk, "content");
            char cw[160];
            snprintf(cw, sizeof cw, "%s.content", w);
            buf result = {0};
            if (cJSON_IsTrue(is_err)) buf_puts(&result, "Error: ");
            buf body = {0}; /* the result's blocks, joined by "\n\n" */
            if (present(c) && text_or_blocks(c, cw, "\n\n", &body, e)) {
                free(result.data);
                free(body.data);
                rc = -1;
                break;
            }
            buf_append(&result, body.data ? body.data : "", body.len);
            free(body.data);
            if (has_text) { /* text before the result keeps its place */
                api_chat_message(msgs, "user", text.data);
                text.len = 0;
                if (text.data) text.data[0] = 0;
                has_text = false;
            }
            cJSON *m = api_chat_message(msgs, "tool", result.data);
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            free(result.data);
        } else if (!strcmp(type, "tool_use") || !strcmp(type, "thinking") || !strcmp(type, "redacted_thinking")) {
            rc = BAD(w, "'%s': %s blocks belong in assistant messages", w, type);
            break;
        } else {
            rc = unsupported_block(w, type, e);
            break;
        }
    }
    if (rc == 0 && k == 0) rc = BAD(where, "'%s' must not be empty", where);
    if (rc == 0 && has_text) api_chat_message(msgs, "user", text.data);
    free(text.data);
    return rc ? -1 : 0;
}

/* One assistant message. Text and thinking are joined as they stand (they are
 * what the model wrote, and must render back to the same tokens for the
 * prefix cache); tool_use blocks become tool_calls. */
static int assistant_message(const cJSON *content, int i, cJSON *msgs, bool *has_tool_use, buf *text,
                             struct api_error *e) {
    char where[96];
    snprintf(where, sizeof where, "messages[%d].content", i);
    *has_tool_use = false;
    text->len = 0; /* the caller's buffer: what an earlier message left must not show */
    if (text->data) text->data[0] = 0;
    if (cJSON_IsString(content)) {
        buf_puts(text, content->valuestring);
        api_chat_message(msgs, "assistant", content->valuestring);
        return 0;
    }
    buf reasoning = {0};
    cJSON *calls = cJSON_CreateObject(); /* holds tool_calls until the message is made */
    int rc = 0, k = 0;
    const cJSON *blk;
    cJSON_ArrayForEach(blk, content) {
        char w[128];
        const char *t = block_type(blk, where, k++, w, sizeof w, e);
        if (!t) {
            rc = -1;
            break;
        }
        const bool is_text = !strcmp(t, "text");
        if (is_text || !strcmp(t, "thinking")) {
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(blk, t); /* the text is under the type's name */
            if (!cJSON_IsString(s)) {
                rc = BAD(w, "'%s.%s' must be a string", w, t);
                break;
            }
            buf_puts(is_text ? text : &reasoning, s->valuestring);
        } else if (!strcmp(t, "redacted_thinking")) {
            continue; /* opaque to this model */
        } else if (!strcmp(t, "tool_use")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(blk, "id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(blk, "name");
            const cJSON *input = cJSON_GetObjectItemCaseSensitive(blk, "input");
            if (!cJSON_IsString(id) || !id->valuestring[0]) {
                rc = BAD(w, "'%s.id' must be a non-empty string", w);
                break;
            }
            if (!cJSON_IsString(name) || !name->valuestring[0]) {
                rc = BAD(w, "'%s.name' must be a non-empty string", w);
                break;
            }
            if (!cJSON_IsObject(input)) {
                rc = BAD(w, "'%s.input' must be an object", w);
                break;
            }
            api_chat_tool_call(calls, id->valuestring, name->valuestring, cJSON_Duplicate(input, 1));
            *has_tool_use = true;
        } else if (!strcmp(t, "tool_result")) {
            rc = BAD(w, "'%s': tool_result blocks belong in user messages", w);
            break;
        } else {
            rc = unsupported_block(w, t, e);
            break;
        }
    }
    if (rc == 0) {
        cJSON *m = api_chat_message(msgs, "assistant", text->data);
        if (reasoning.len) cJSON_AddStringToObject(m, "reasoning_content", reasoning.data);
        cJSON *tc = cJSON_DetachItemFromObjectCaseSensitive(calls, "tool_calls");
        if (tc) cJSON_AddItemToObject(m, "tool_calls", tc);
    }
    cJSON_Delete(calls);
    free(reasoning.data);
    return rc ? -1 : 0;
}

static int translate_messages(const cJSON *in, cJSON *out, char **prefill, struct api_error *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(in, "messages");
    if (!present(msgs)) return BAD("messages", "'messages' is required"), -1;
    if (!cJSON_IsArray(msgs)) return BAD("messages", "'messages' must be an array"), -1;
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) return BAD("messages", "'messages' must not be empty"), -1;
    cJSON *nm = cJSON_AddArrayToObject(out, "messages");
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(in, "system");
    if (present(sys)) {
        buf s = {0};
        if (text_or_blocks(sys, "system", "\n\n", &s, e)) {
            free(s.data);
            return -1;
        }
        api_chat_message(nm, "system", s.data);
        free(s.data);
    }
    buf last_text = {0};
    int rc = 0, i = 0;
    bool last_is_assistant = false, last_tool_use = false;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        char w[64];
        snprintf(w, sizeof w, "messages[%d]", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m)) {
            rc = BAD(w, "'%s' must be an object", w);
            break;
        }
        if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant"))) {
            rc = BAD(w, "'%s.role' must be \"user\" or \"assistant\" (the system prompt goes in the top-level "
                        "'system')", w);
            break;
        }
        if (!cJSON_IsString(content) && !cJSON_IsArray(content)) {
            rc = BAD(w, "'%s.content' must be a string or an array of content blocks", w);
            break;
        }
        last_is_assistant = role->valuestring[0] == 'a';
        rc = last_is_assistant ? assistant_message(content, i, nm, &last_tool_use, &last_text, e)
                               : user_message(content, i, nm, e);
        if (rc) break;
        i++;
    }
    if (rc == 0 && last_is_assistant) {
        /* prefill: the reply continues the final assistant turn, which is not rendered as a turn */
        if (last_tool_use)
            rc = BAD("messages", "the final assistant message has tool_use blocks; send their tool_result blocks "
                                 "in a user message after it");
        else {
            cJSON_DeleteItemFromArray(nm, cJSON_GetArraySize(nm) - 1);
            if (last_text.len) *prefill = strdup(last_text.data);
        }
    }
    free(last_text.data);
    if (rc) return -1;
    if (cJSON_GetArraySize(nm) == (present(sys) ? 1 : 0)) /* only the system message */
        return BAD("messages", "'messages' must hold a user message"), -1;
    return 0;
}

static int translate_tools(const cJSON *in, cJSON *out, bool has_prefill, struct api_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(in, "tools");
    if (present(tools)) {
        if (!cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array"), -1;
        cJSON *nt = cJSON_AddArrayToObject(out, "tools");
        const cJSON *t;
        int k = 0;
        cJSON_ArrayForEach(t, tools) {
            char w[48];
            snprintf(w, sizeof w, "tools[%d]", k++);
            if (!cJSON_IsObject(t)) return BAD(w, "'%s' must be an object", w), -1;
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
            if (present(ty) && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "custom")))
                return BAD(w, "'%s.type' %s%.60s%s is not supported: only custom tools (name, description, "
                              "input_schema) are",
                           w, cJSON_IsString(ty) ? "'" : "", cJSON_IsString(ty) ? ty->valuestring : "(not a string)",
                           cJSON_IsString(ty) ? "'" : ""),
                       -1;
            if (api_chat_tool_from_flat(nt, t, w, "input_schema", true, e)) return -1;
        }
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(in, "tool_choice");
    if (!present(tc)) return 0;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(ty))
        return BAD("tool_choice", "'tool_choice' must be an object with a string 'type'"), -1;
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(tc, "disable_parallel_tool_use");
    if (present(dp) && !cJSON_IsBool(dp))
        return BAD("tool_choice", "'tool_choice.disable_parallel_tool_use' must be a boolean"), -1;
    if (cJSON_IsTrue(dp)) cJSON_AddFalseToObject(out, "parallel_tool_calls"); /* at most one tool call */
    const char *t = ty->valuestring;
    bool forced = false;
    if (!strcmp(t, "auto") || !strcmp(t, "none")) {
        cJSON_AddStringToObject(out, "tool_choice", t);
    } else if (!strcmp(t, "any")) {
        cJSON_AddStringToObject(out, "tool_choice", "required");
        forced = true;
    } else if (!strcmp(t, "tool")) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(tc, "name");
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return BAD("tool_choice", "'tool_choice.name' must be a non-empty string"), -1;
        api_chat_tool_choice(out, name->valuestring);
        forced = true;
    } else {
        return BAD("tool_choice", "'tool_choice.type' must be auto, any, tool or none; got '%.40s'", t), -1;
    }
    if (forced && has_prefill)
        return BAD("tool_choice", "'tool_choice' %s cannot be combined with a final assistant message (prefill)", t),
               -1;
    return 0;
}

static int translate_thinking(const cJSON *in, cJSON *out, struct api_error *e) {
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(in, "thinking");
    if (!present(th)) return 0;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(th, "type");
    if (!cJSON_IsObject(th) || !cJSON_IsString(ty))
        return BAD("thinking", "'thinking' must be an object with a string 'type'"), -1;
    const char *t = ty->valuestring;
    bool on;
    if (!strcmp(t, "disabled")) {
        on = false;
    } else if (!strcmp(t, "enabled")) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(th, "budget_tokens");
        if (!cJSON_IsNumber(b) || b->valuedouble < 1 || b->valuedouble != (double)(long long)b->valuedouble)
            return BAD("thinking.budget_tokens", "'thinking.budget_tokens' must be a positive integer"), -1;
        cJSON_AddNumberToObject(out, "thinking_budget", b->valuedouble); /* enforced (constraint.h) */
        on = true;
    } else if (!strcmp(t, "adaptive") || !strcmp(t, "between_tools")) {
        on = true;
    } else {
        return BAD("thinking", "'thinking.type' must be enabled, adaptive, between_tools or disabled; got '%.40s'",
                   t),
               -1;
    }
    cJSON_AddBoolToObject(cJSON_AddObjectToObject(out, "chat_template_kwargs"), "enable_thinking", on);
    return 0;
}

static int translate_sampling(const cJSON *in, bool count_only, cJSON *out, struct api_error *e) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(in, "max_tokens");
    if (!count_only) {
        if (!present(mt)) return BAD("max_tokens", "'max_tokens' is required"), -1;
        cJSON_AddItemToObject(out, "max_tokens", cJSON_Duplicate(mt, 0));
    }
    const cJSON *temp = cJSON_GetObjectItemCaseSensitive(in, "temperature");
    if (present(temp)) {
        if (!cJSON_IsNumber(temp) || !(temp->valuedouble >= 0 && temp->valuedouble <= 1))
            return BAD("temperature", "'temperature' must be a number in [0, 1]"), -1;
        cJSON_AddNumberToObject(out, "temperature", temp->valuedouble);
    }
    static const char *const same[] = {"top_p", "top_k", "stream"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, same[k]);
        if (present(v)) cJSON_AddItemToObject(out, same[k], cJSON_Duplicate(v, 0));
    }
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(in, "stop_sequences");
    if (present(ss)) {
        if (!cJSON_IsArray(ss)) return BAD("stop_sequences", "'stop_sequences' must be an array of strings"), -1;
        if (cJSON_GetArraySize(ss) > API_MAX_STOPS)
            return BAD("stop_sequences", "'stop_sequences' may hold at most %d strings", API_MAX_STOPS), -1;
        cJSON *stop = cJSON_AddArrayToObject(out, "stop");
        const cJSON *s;
        cJSON_ArrayForEach(s, ss) {
            if (!cJSON_IsString(s)) return BAD("stop_sequences", "'stop_sequences' must be an array of strings"), -1;
            if (strlen(s->valuestring) > API_MAX_STOP_LEN)
                return BAD("stop_sequences", "'stop_sequences' strings must be at most %d bytes", API_MAX_STOP_LEN),
                       -1;
            cJSON_AddItemToArray(stop, cJSON_CreateString(s->valuestring));
        }
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(in, "output_config"), "format");
    if (present(fmt)) { /* structured output: chat's response_format json_schema */
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(fmt, "type");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "json_schema"))
            return BAD("output_config.format", "'output_config.format.type' must be \"json_schema\""), -1;
        api_chat_json_schema(out, "output", cJSON_GetObjectItemCaseSensitive(fmt, "schema"), NULL);
    }
    return 0;
}

int anthropic_translate(const cJSON *in, bool count_only, cJSON **out, char **prefill, struct api_error *e) {
    *out = NULL;
    *prefill = NULL;
    if (!cJSON_IsObject(in)) return BAD(NULL, "request body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(in, "model");
    if (!present(model)) return BAD("model", "'model' is required");
    if (!cJSON_IsString(model)) return BAD("model", "'model' must be a string");
    cJSON *o = cJSON_CreateObject();
    if (!o) return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    cJSON_AddStringToObject(o, "model", model->valuestring);
    if (translate_sampling(in, count_only, o, e) || translate_messages(in, o, prefill, e) ||
        translate_tools(in, o, *prefill != NULL, e) || translate_thinking(in, o, e)) {
        cJSON_Delete(o);
        free(*prefill);
        *prefill = NULL;
        return e->status;
    }
    *out = o;
    return 0;
}

/* ---- errors ---- */

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *anthropic_error_json(const struct api_error *e) {
    buf b = {0};
    buf_printf(&b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", error_type(e->status));
    json_put_str(&b, e->message, strlen(e->message));
    buf_puts(&b, "}}");
    if (b.oom) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

/* ---- responses ---- */

static void put_usage(buf *b, const struct am_usage *u) {
    buf_printf(b,
               "{\"input_tokens\":%d,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":%d,"
               "\"output_tokens\":%d}",
               u->prompt - u->cached, u->cached, u->output);
}

static void put_event(buf *out, const char *name) { buf_printf(out, "event: %s\ndata: ", name); }

void am_stream_start(struct am_stream *s, buf *out, const char *id, const char *model, int prompt_tokens) {
    s->next_index = 0;
    s->open = AM_NONE;
    put_event(out, "message_start");
    buf_printf(out,
               "{\"type\":\"message_start\",\"message\":{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\","
               "\"model\":\"%s\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":",
               id, model);
    put_usage(out, &(struct am_usage){.prompt = prompt_tokens});
    buf_puts(out, "}}\n\n");
    put_event(out, "ping");
    buf_puts(out, "{\"type\":\"ping\"}\n\n");
}

static void close_block(struct am_stream *s, buf *out) {
    if (s->open == AM_NONE) return;
    if (s->open == AM_THINKING) { /* the SDKs expect a signature; this model has none */
        put_event(out, "content_block_delta");
        buf_printf(out,
                   "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"signature_delta\","
                   "\"signature\":\"\"}}\n\n",
                   s->next_index - 1);
    }
    put_event(out, "content_block_stop");
    buf_printf(out, "{\"type\":\"content_block_stop\",\"index\":%d}\n\n", s->next_index - 1);
    s->open = AM_NONE;
}

void am_stream_event(struct am_stream *s, buf *out, const output_event *ev, const char *tool_id) {
    if (ev->kind == OUT_TOOL_CALL) {
        close_block(s, out);
        int idx = s->next_index++;
        put_event(out, "content_block_start");
        buf_printf(out, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":{\"type\":\"tool_use\","
                        "\"id\":\"%s\",\"name\":",
                   idx, tool_id);
        json_put_str(out, ev->name, strlen(ev->name));
        buf_puts(out, ",\"input\":{}}}\n\n");
        put_event(out, "content_block_delta");
        buf_printf(out, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"input_json_delta\","
                        "\"partial_json\":",
                   idx);
        json_put_str(out, ev->arguments, strlen(ev->arguments));
        buf_puts(out, "}}\n\n");
        put_event(out, "content_block_stop");
        buf_printf(out, "{\"type\":\"content_block_stop\",\"index\":%d}\n\n", idx);
        return;
    }
    if (ev->len == 0) return;
    bool thinking = ev->kind == OUT_REASONING;
    enum am_block want = thinking ? AM_THINKING : AM_TEXT;
    if (s->open != want) {
        close_block(s, out);
        put_event(out, "content_block_start");
        buf_printf(out, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":%s}\n\n", s->next_index,
                   thinking ? "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}"
                            : "{\"type\":\"text\",\"text\":\"\"}");
        s->next_index++;
        s->open = want;
    }
    put_event(out, "content_block_delta");
    buf_printf(out, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":",
               s->next_index - 1, thinking ? "thinking_delta" : "text_delta", thinking ? "thinking" : "text");
    json_put_str(out, ev->text, ev->len);
    buf_puts(out, "}}\n\n");
}

void am_stream_finish(struct am_stream *s, buf *out, const char *stop_reason, const char *stop_sequence,
                      const struct am_usage *u) {
    close_block(s, out);
    put_event(out, "message_delta");
    buf_printf(out, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"%s\",\"stop_sequence\":", stop_reason);
    if (stop_sequence) json_put_str(out, stop_sequence, strlen(stop_sequence));
    else buf_puts(out, "null");
    buf_puts(out, "},\"usage\":");
    put_usage(out, u);
    buf_puts(out, "}\n\n");
    put_event(out, "message_stop");
    buf_puts(out, "{\"type\":\"message_stop\"}\n\n");
}

void am_stream_error(buf *out, int status, const char *message) {
    put_event(out, "error");
    buf_printf(out, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", error_type(status));
    json_put_str(out, message, strlen(message));
    buf_puts(out, "}}\n\n");
}

char *am_message_json(const char *id, const char *model, const char *reasoning, const char *content,
                      const cJSON *tool_calls, const char *stop_reason, const char *stop_sequence,
                      const struct am_usage *u) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "id", id);
    cJSON_AddStringToObject(root, "type", "message");
    cJSON_AddStringToObject(root, "role", "assistant");
    cJSON_AddStringToObject(root, "model", model);
    cJSON *blocks = cJSON_AddArrayToObject(root, "content");
    if (reasoning && reasoning[0]) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddItemToArray(blocks, b);
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", reasoning);
        cJSON_AddStringToObject(b, "signature", "");
    }
    int n_calls = cJSON_GetArraySize(tool_calls);
    /* a text block unless the reply is only thinking and tool calls */
    if ((content && content[0]) || (n_calls == 0 && cJSON_GetArraySize(blocks) == 0)) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddItemToArray(blocks, b);
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", content ? content : "");
    }
    const cJSON *call;
    cJSON_ArrayForEach(call, tool_calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        cJSON *b = cJSON_CreateObject();
        cJSON_AddItemToArray(blocks, b);
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddStringToObject(b, "id", cJSON_GetObjectItemCaseSensitive(call, "id")->valuestring);
        cJSON_AddStringToObject(b, "name", cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
        cJSON *input = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (!cJSON_IsObject(input)) { /* the parser always writes an object; never leave input out */
            cJSON_Delete(input);
            input = cJSON_CreateObject();
        }
        cJSON_AddItemToObject(b, "input", input);
    }
    cJSON_AddStringToObject(root, "stop_reason", stop_reason);
    if (stop_sequence) cJSON_AddStringToObject(root, "stop_sequence", stop_sequence);
    else cJSON_AddNullToObject(root, "stop_sequence");
    cJSON *usage = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(usage, "input_tokens", u->prompt - u->cached);
    cJSON_AddNumberToObject(usage, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(usage, "cache_read_input_tokens", u->cached);
    cJSON_AddNumberToObject(usage, "output_tokens", u->output);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}
