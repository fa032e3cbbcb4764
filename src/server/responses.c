/* server/responses.c — OpenAI Responses requests translated into the chat
 * shape, and response objects and their event stream (see responses.h).
 *
 * The translation validates what has no chat counterpart (items, parts,
 * tools, tool_choice, reasoning, text.format) and names the field in the
 * Responses API's terms ("input[3].call_id"); what it copies unchanged
 * (temperature, top_p, stream, parallel_tool_calls) api.c validates under the
 * same name, and max_output_tokens goes in as max_tokens. The translated tree
 * owns copies of everything it holds.
 *
 * The stream writer keeps the open item's text (the .done events repeat it
 * whole) and every finished item's JSON (response.completed lists them), so
 * both buffers grow with the reply; they are reused across the events of one
 * request and freed with it.
 */
#include "server/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/jsonout.h"

#define BAD(param, ...) api_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

static bool present(const cJSON *v) { return v && !cJSON_IsNull(v); }

static const char *str_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A string, or an array of parts whose text is joined (as the chat API joins
 * text parts: with nothing between). Part types: input_text / output_text /
 * summary_text / reasoning_text (text), refusal (refusal). Returns 0 or -1. */
static int text_of(const cJSON *c, const char *where, buf *b, struct api_error *e) {
    if (cJSON_IsString(c)) {
        buf_puts(b, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c)) return BAD(where, "'%s' must be a string or an array of text parts", where), -1;
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, c) {
        char w[128];
        snprintf(w, sizeof w, "%s[%d]", where, k++);
        const char *type = str_of(part, "type");
        if (!cJSON_IsObject(part) || !type) return BAD(w, "'%s' must be an object with a string 'type'", w), -1;
        const char *key = !strcmp(type, "refusal") ? "refusal"
                          : (!strcmp(type, "input_text") || !strcmp(type, "output_text") ||
                             !strcmp(type, "summary_text") || !strcmp(type, "reasoning_text"))
                              ? "text"
                              : NULL;
        if (!key) {
            if (!strncmp(type, "input_", 6))
                return BAD(w, "'%s': %s content is not supported (this server runs a text-only model)", w, type),
                       -1;
            return BAD(w, "'%s': content part type '%.40s' is not supported", w, type), -1;
        }
        const char *t = str_of(part, key);
        if (!t) return BAD(w, "'%s.%s' must be a string", w, key), -1;
        buf_puts(b, t);
    }
    return 0;
}

/* The assistant turn that reasoning and function calls attach to: the open
 * one, or a new one (empty content) carrying the pending reasoning. */
static cJSON *assistant_turn(cJSON *msgs, cJSON **open, buf *reasoning, const char *content) {
    if (*open && !content) return *open;
    cJSON *m = api_chat_message(msgs, "assistant", content);
    if (reasoning->len) {
        cJSON_AddStringToObject(m, "reasoning_content", reasoning->data);
        reasoning->len = 0;
        reasoning->data[0] = 0;
    }
    *open = m;
    return m;
}

struct input_state {
    cJSON *msgs;
    cJSON *open_asst; /* the assistant turn function calls join, or NULL */
    buf reasoning;    /* reasoning items not yet given to an assistant turn */
    buf system;       /* instructions + system/developer messages before the first turn */
    bool any_turn;
};

static int message_item(const cJSON *it, const char *w, struct input_state *st, struct api_error *e) {
    const char *role = str_of(it, "role");
    if (!role) return BAD(w, "'%s.role' must be a string", w), -1;
    bool sys = !strcmp(role, "system") || !strcmp(role, "developer");
    if (!sys && strcmp(role, "user") && strcmp(role, "assistant"))
        return BAD(w, "'%s.role' must be user, assistant, system or developer; got '%.40s'", w, role), -1;
    char cw[128];
    snprintf(cw, sizeof cw, "%s.content", w);
    buf text = {0};
    if (text_of(cJSON_GetObjectItemCaseSensitive(it, "content"), cw, &text, e)) {
        free(text.data);
        return -1;
    }
    const char *t = text.data ? text.data : "";
    if (sys && !st->any_turn) {
        if (st->system.len) buf_puts(&st->system, "\n\n");
        buf_puts(&st->system, t);
    } else if (!strcmp(role, "assistant")) {
        assistant_turn(st->msgs, &st->open_asst, &st->reasoning, t);
    } else {
        /* a system / developer message inside the conversation (the template takes a
         * system message only first) goes in as a user turn */
        api_chat_message(st->msgs, "user", t);
        st->open_asst = NULL;
    }
    if (!sys) st->any_turn = true;
    free(text.data);
    return 0;
}

static int function_call_item(const cJSON *it, const char *w, struct input_state *st, struct api_error *e) {
    const char *call_id = str_of(it, "call_id"), *name = str_of(it, "name"), *args = str_of(it, "arguments");
    if (!call_id || !call_id[0]) return BAD(w, "'%s.call_id' must be a non-empty string", w), -1;
    if (!name || !name[0]) return BAD(w, "'%s.name' must be a non-empty string", w), -1;
    if (!args) return BAD(w, "'%s.arguments' must be a string (a JSON object)", w), -1;
    cJSON *parsed = cJSON_Parse(args);
    if (!cJSON_IsObject(parsed)) {
        cJSON_Delete(parsed);
        return BAD(w, "'%s.arguments' must be a JSON object as a string", w), -1;
    }
    api_chat_tool_call(assistant_turn(st->msgs, &st->open_asst, &st->reasoning, NULL), call_id, name, parsed);
    st->any_turn = true;
    return 0;
}

static int input_item(const cJSON *it, const char *w, struct input_state *st, struct api_error *e) {
    if (!cJSON_IsObject(it)) return BAD(w, "'%s' must be an object", w), -1;
    const char *type = str_of(it, "type");
    if (!type && present(cJSON_GetObjectItemCaseSensitive(it, "type")))
        return BAD(w, "'%s.type' must be a string", w), -1;
    if (!type || !strcmp(type, "message")) return message_item(it, w, st, e);
    char pw[128];
    if (!strcmp(type, "reasoning")) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        const cJSON *summary = cJSON_GetObjectItemCaseSensitive(it, "summary");
        bool use_content = present(content) && cJSON_GetArraySize(content) > 0;
        snprintf(pw, sizeof pw, "%s.%s", w, use_content ? "content" : "summary");
        if (st->reasoning.len) buf_puts(&st->reasoning, "\n\n");
        if (use_content || present(summary))
            return text_of(use_content ? content : summary, pw, &st->reasoning, e);
        return 0;
    }
    if (!strcmp(type, "function_call")) return function_call_item(it, w, st, e);
    if (!strcmp(type, "function_call_output")) {
        const char *call_id = str_of(it, "call_id");
        if (!call_id || !call_id[0]) return BAD(w, "'%s.call_id' must be a non-empty string", w), -1;
        snprintf(pw, sizeof pw, "%s.output", w);
        buf out = {0};
        if (text_of(cJSON_GetObjectItemCaseSensitive(it, "output"), pw, &out, e)) {
            free(out.data);
            return -1;
        }
        cJSON *m = api_chat_message(st->msgs, "tool", out.data);
        cJSON_AddStringToObject(m, "tool_call_id", call_id);
        free(out.data);
        st->open_asst = NULL;
        st->any_turn = true;
        return 0;
    }
    if (!strcmp(type, "item_reference"))
        return BAD(w, "'%s': item_reference needs stored responses, and this server stores none; send the items "
                      "themselves", w),
               -1;
    return BAD(w, "'%s': input item type '%.40s' is not supported (messages, reasoning, function_call and "
                  "function_call_output are)", w, type),
           -1;
}

static int translate_input(const cJSON *in, cJSON *out, struct api_error *e) {
    struct input_state st = {.msgs = cJSON_CreateArray()};
    int rc = 0;
    const cJSON *instr = cJSON_GetObjectItemCaseSensitive(in, "instructions");
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(in, "input");
    if (present(instr) && !cJSON_IsString(instr)) rc = BAD("instructions", "'instructions' must be a string");
    else if (cJSON_IsString(instr)) buf_puts(&st.system, instr->valuestring);
    if (rc) {
    } else if (!present(input)) {
        rc = BAD("input", "'input' is required");
    } else if (cJSON_IsString(input)) {
        api_chat_message(st.msgs, "user", input->valuestring);
        st.any_turn = true;
    } else if (!cJSON_IsArray(input)) {
        rc = BAD("input", "'input' must be a string or an array of input items");
    } else {
        const cJSON *it;
        int i = 0;
        cJSON_ArrayForEach(it, input) {
            char w[48];
            snprintf(w, sizeof w, "input[%d]", i++);
            if (input_item(it, w, &st, e)) {
                rc = -1;
                break;
            }
        }
        if (!rc && !st.any_turn) rc = BAD("input", "'input' must hold at least one user, assistant or tool item");
    }
    if (!rc && st.system.len) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", st.system.data);
        cJSON_InsertItemInArray(st.msgs, 0, m);
    }
    free(st.reasoning.data);
    free(st.system.data);
    if (rc) {
        cJSON_Delete(st.msgs);
        return -1;
    }
    cJSON_AddItemToObject(out, "messages", st.msgs);
    return 0;
}

static int translate_tools(const cJSON *in, cJSON *out, struct api_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(in, "tools");
    if (present(tools)) {
        if (!cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array"), -1;
        cJSON *nt = cJSON_AddArrayToObject(out, "tools");
        const cJSON *t;
        int k = 0;
        cJSON_ArrayForEach(t, tools) {
            char w[48];
            snprintf(w, sizeof w, "tools[%d]", k++);
            const char *type = str_of(t, "type");
            if (!cJSON_IsObject(t) || !type) return BAD(w, "'%s' must be an object with a string 'type'", w), -1;
            if (strcmp(type, "function"))
                return BAD(w, "'%s.type' '%.40s' is not supported: only function tools are", w, type), -1;
            if (api_chat_tool_from_flat(nt, t, w, "parameters", false, e)) return -1;
        }
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(in, "tool_choice");
    if (!present(tc)) return 0;
    if (cJSON_IsString(tc)) {
        cJSON_AddItemToObject(out, "tool_choice", cJSON_Duplicate(tc, 0)); /* api.c checks the value */
        return 0;
    }
    const char *type = str_of(tc, "type"), *name = str_of(tc, "name");
    if (!cJSON_IsObject(tc) || !type || strcmp(type, "function"))
        return BAD("tool_choice", "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"name\": ...}"),
               -1;
    if (!name || !name[0]) return BAD("tool_choice", "'tool_choice.name' must be a non-empty string"), -1;
    api_chat_tool_choice(out, name);
    return 0;
}

static int translate_settings(const cJSON *in, cJSON *out, struct api_error *e) {
    static const char *const stored[] = {"previous_response_id", "conversation", "prompt"};
    for (size_t k = 0; k < sizeof stored / sizeof stored[0]; k++)
        if (present(cJSON_GetObjectItemCaseSensitive(in, stored[k])))
            return BAD(stored[k], "'%s' is not supported: this server stores no responses, conversations or prompts; "
                                  "send the whole conversation in 'input'", stored[k]),
                   -1;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(in, "background")))
        return BAD("background", "'background' responses are not supported"), -1;
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(in, "top_logprobs");
    if (present(tl) && !(cJSON_IsNumber(tl) && tl->valuedouble == 0))
        return BAD("top_logprobs", "'top_logprobs' is not supported on /v1/responses (use /v1/chat/completions)"), -1;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(in, "max_output_tokens");
    if (present(mt)) {
        if (!cJSON_IsNumber(mt) || mt->valuedouble < 1 || mt->valuedouble > 2147483647.0 ||
            mt->valuedouble != (double)(long long)mt->valuedouble)
            return BAD("max_output_tokens", "'max_output_tokens' must be a positive integer"), -1;
        cJSON_AddNumberToObject(out, "max_tokens", mt->valuedouble);
    }
    static const char *const same[] = {"temperature", "top_p", "stream", "parallel_tool_calls"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, same[k]);
        if (present(v)) cJSON_AddItemToObject(out, same[k], cJSON_Duplicate(v, 0));
    }
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(in, "reasoning");
    if (present(rs)) {
        if (!cJSON_IsObject(rs)) return BAD("reasoning", "'reasoning' must be an object"), -1;
        const cJSON *effort = cJSON_GetObjectItemCaseSensitive(rs, "effort");
        if (present(effort)) {
            const char *v = cJSON_IsString(effort) ? effort->valuestring : "";
            bool on = !strcmp(v, "minimal") || !strcmp(v, "low") || !strcmp(v, "medium") || !strcmp(v, "high") ||
                      !strcmp(v, "xhigh");
            if (!on && strcmp(v, "none"))
                return BAD("reasoning.effort", "'reasoning.effort' must be none, minimal, low, medium, high or xhigh"),
                       -1;
            cJSON_AddBoolToObject(cJSON_AddObjectToObject(out, "chat_template_kwargs"), "enable_thinking", on);
        }
    }
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(in, "text");
    if (present(text)) {
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(text, "format");
        if (!cJSON_IsObject(text)) return BAD("text", "'text' must be an object"), -1;
        if (present(fmt)) {
            const char *type = str_of(fmt, "type");
            if (!type) return BAD("text.format", "'text.format' must be an object with a string 'type'"), -1;
            if (!strcmp(type, "json_object")) {
                cJSON_AddStringToObject(cJSON_AddObjectToObject(out, "response_format"), "type", "json_object");
            } else if (!strcmp(type, "json_schema")) { /* flat here, nested in chat's response_format */
                api_chat_json_schema(out, str_of(fmt, "name"), cJSON_GetObjectItemCaseSensitive(fmt, "schema"),
                                     cJSON_GetObjectItemCaseSensitive(fmt, "strict"));
            } else if (strcmp(type, "text")) {
                return BAD("text.format", "'text.format.type' must be text, json_object or json_schema; '%.40s' is not "
                                          "supported", type),
                       -1;
            }
        }
    }
    return 0;
}

/* The settings a response echoes, each defaulted as OpenAI reports it. */
static char *make_echo(const cJSON *in) {
    cJSON *o = cJSON_CreateObject();
    static const char *const keys[] = {"instructions", "max_output_tokens", "temperature", "top_p", "tool_choice",
                                       "tools", "parallel_tool_calls", "reasoning", "text", "metadata"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, keys[k]);
        if (present(v)) {
            cJSON_AddItemToObject(o, keys[k], cJSON_Duplicate(v, 1));
            continue;
        }
        switch (k) {
        case 2: case 3: cJSON_AddNumberToObject(o, keys[k], 1.0); break;
        case 4: cJSON_AddStringToObject(o, keys[k], "auto"); break;
        case 5: cJSON_AddArrayToObject(o, keys[k]); break;
        case 6: cJSON_AddBoolToObject(o, keys[k], 1); break;
        case 7: cJSON_AddNullToObject(cJSON_AddObjectToObject(o, keys[k]), "effort"); break;
        case 8: cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, keys[k]), "format"), "type", "text"); break;
        case 9: cJSON_AddObjectToObject(o, keys[k]); break;
        default: cJSON_AddNullToObject(o, keys[k]);
        }
    }
    cJSON_AddNullToObject(o, "previous_response_id");
    cJSON_AddBoolToObject(o, "store", 0);
    cJSON_AddStringToObject(o, "truncation", "disabled");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return NULL;
    size_t n = strlen(s); /* "{...}" -> "..." */
    memmove(s, s + 1, n - 2);
    s[n - 2] = 0;
    return s;
}

int responses_translate(const cJSON *in, cJSON **out, char **echo, struct api_error *e) {
    *out = NULL;
    *echo = NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o) return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(in, "model");
    if (model) cJSON_AddItemToObject(o, "model", cJSON_Duplicate(model, 0)); /* api.c checks it */
    if (translate_settings(in, o, e) || translate_input(in, o, e) || translate_tools(in, o, e)) {
        cJSON_Delete(o);
        return e->status;
    }
    *echo = make_echo(in);
    if (!*echo) {
        cJSON_Delete(o);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    *out = o;
    return 0;
}

/* ---- responses ---- */

static void put_usage(buf *b, const struct rs_usage *u) {
    buf_printf(b,
               "{\"input_tokens\":%d,\"input_tokens_details\":{\"cached_tokens\":%d},\"output_tokens\":%d,"
               "\"output_tokens_details\":{\"reasoning_tokens\":%d},\"total_tokens\":%d}",
               u->prompt, u->cached, u->output, u->reasoning, u->prompt + u->output);
}

/* The response object. status: in_progress / completed / incomplete / failed. */
static void put_response(buf *b, const struct rs_meta *m, const char *status, const buf *items,
                         const char *incomplete_reason, const char *error_code, const char *error_message,
                         const struct rs_usage *u) {
    buf_printf(b, "{\"id\":\"%s\",\"object\":\"response\",\"created_at\":%ld,\"status\":\"%s\",\"error\":", m->id,
               m->created, status);
    if (error_code) {
        buf_printf(b, "{\"code\":\"%s\",\"message\":", error_code);
        json_put_str(b, error_message, strlen(error_message));
        buf_puts(b, "}");
    } else {
        buf_puts(b, "null");
    }
    if (incomplete_reason) buf_printf(b, ",\"incomplete_details\":{\"reason\":\"%s\"}", incomplete_reason);
    else buf_puts(b, ",\"incomplete_details\":null");
    buf_printf(b, ",\"model\":\"%s\",\"output\":[", m->model);
    if (items && items->len) buf_append(b, items->data, items->len);
    buf_printf(b, "],%s,\"usage\":", m->echo);
    if (u) put_usage(b, u);
    else buf_puts(b, "null");
    buf_puts(b, "}");
}

static void put_reasoning_item(buf *b, const char *id, const char *text, size_t n, const char *status) {
    buf_printf(b, "{\"type\":\"reasoning\",\"id\":\"%s\",\"summary\":[],\"content\":[", id);
    if (text) {
        buf_puts(b, "{\"type\":\"reasoning_text\",\"text\":");
        json_put_str(b, text, n);
        buf_puts(b, "}");
    }
    buf_printf(b, "],\"status\":\"%s\"}", status);
}

static void put_output_text(buf *b, const char *text, size_t n) {
    buf_puts(b, "{\"type\":\"output_text\",\"text\":");
    json_put_str(b, text, n);
    buf_puts(b, ",\"annotations\":[],\"logprobs\":[]}");
}

static void put_message_item(buf *b, const char *id, const char *text, size_t n, const char *status) {
    buf_printf(b, "{\"type\":\"message\",\"id\":\"%s\",\"status\":\"%s\",\"role\":\"assistant\",\"content\":[", id,
               status);
    if (text) put_output_text(b, text, n);
    buf_puts(b, "]}");
}

static void put_call_item(buf *b, const char *id, const char *call_id, const char *name, const char *args,
                          const char *status) {
    buf_printf(b, "{\"type\":\"function_call\",\"id\":\"%s\",\"call_id\":\"%s\",\"name\":", id, call_id);
    json_put_str(b, name, strlen(name));
    buf_puts(b, ",\"arguments\":");
    json_put_str(b, args, strlen(args));
    buf_printf(b, ",\"status\":\"%s\"}", status);
}

/* An output item's id: its kind's prefix, the response id's suffix and its index. */
static void item_id(char *out, size_t n, const char *prefix, const struct rs_meta *m, int index) {
    const char *suffix = strncmp(m->id, "resp_", 5) ? m->id : m->id + 5;
    snprintf(out, n, "%s_%s%02d", prefix, suffix, index);
}

static void ev_begin(struct rs_stream *s, buf *out, const char *name) {
    buf_printf(out, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%ld,", name, name, s->seq++);
}

static void ev_item(struct rs_stream *s, buf *out, const char *name, int index) {
    ev_begin(s, out, name);
    buf_printf(out, "\"item_id\":\"%s\",\"output_index\":%d,", s->item_id, index);
}

static void add_item(struct rs_stream *s, const char *json, size_t n) {
    if (s->items.len) buf_putc(&s->items, ',');
    buf_append(&s->items, json, n);
}

void rs_stream_start(struct rs_stream *s, buf *out, const struct rs_meta *m) {
    s->seq = 0;
    s->next_output = 0;
    s->open = RS_NONE;
    static const char *const names[] = {"response.created", "response.in_progress"};
    for (int k = 0; k < 2; k++) {
        ev_begin(s, out, names[k]);
        buf_puts(out, "\"response\":");
        put_response(out, m, "in_progress", NULL, NULL, NULL, NULL, NULL);
        buf_puts(out, "}\n\n");
    }
}

static void close_item(struct rs_stream *s, buf *out, const char *status) {
    if (s->open == RS_NONE) return;
    const int idx = s->next_output - 1;
    const bool reasoning = s->open == RS_REASONING;
    const char *t = s->text.data ? s->text.data : "";
    ev_item(s, out, reasoning ? "response.reasoning_text.done" : "response.output_text.done", idx);
    buf_puts(out, "\"content_index\":0,\"text\":");
    json_put_str(out, t, s->text.len);
    buf_puts(out, reasoning ? "}\n\n" : ",\"logprobs\":[]}\n\n");
    ev_item(s, out, "response.content_part.done", idx);
    buf_puts(out, "\"content_index\":0,\"part\":");
    if (reasoning) {
        buf_puts(out, "{\"type\":\"reasoning_text\",\"text\":");
        json_put_str(out, t, s->text.len);
        buf_puts(out, "}");
    } else {
        put_output_text(out, t, s->text.len);
    }
    buf_puts(out, "}\n\n");
    ev_begin(s, out, "response.output_item.done");
    buf_printf(out, "\"output_index\":%d,\"item\":", idx);
    size_t at = out->len;
    if (reasoning) put_reasoning_item(out, s->item_id, t, s->text.len, status);
    else put_message_item(out, s->item_id, t, s->text.len, status);
    add_item(s, out->data + at, out->len - at);
    buf_puts(out, "}\n\n");
    s->open = RS_NONE;
}

void rs_stream_event(struct rs_stream *s, buf *out, const struct rs_meta *m, const output_event *ev,
                     const char *call_id) {
    if (ev->kind == OUT_TOOL_CALL) {
        close_item(s, out, "completed");
        const int idx = s->next_output++;
        item_id(s->item_id, sizeof s->item_id, "fc", m, idx);
        ev_begin(s, out, "response.output_item.added");
        buf_printf(out, "\"output_index\":%d,\"item\":", idx);
        put_call_item(out, s->item_id, call_id, ev->name, "", "in_progress");
        buf_puts(out, "}\n\n");
        ev_item(s, out, "response.function_call_arguments.delta", idx);
        buf_puts(out, "\"delta\":");
        json_put_str(out, ev->arguments, strlen(ev->arguments));
        buf_puts(out, "}\n\n");
        ev_item(s, out, "response.function_call_arguments.done", idx);
        buf_puts(out, "\"name\":");
        json_put_str(out, ev->name, strlen(ev->name));
        buf_puts(out, ",\"arguments\":");
        json_put_str(out, ev->arguments, strlen(ev->arguments));
        buf_puts(out, "}\n\n");
        ev_begin(s, out, "response.output_item.done");
        buf_printf(out, "\"output_index\":%d,\"item\":", idx);
        size_t at = out->len;
        put_call_item(out, s->item_id, call_id, ev->name, ev->arguments, "completed");
        add_item(s, out->data + at, out->len - at);
        buf_puts(out, "}\n\n");
        return;
    }
    if (ev->len == 0) return;
    const bool reasoning = ev->kind == OUT_REASONING;
    const enum rs_item want = reasoning ? RS_REASONING : RS_MESSAGE;
    if (s->open != want) {
        close_item(s, out, "completed");
        const int idx = s->next_output++;
        item_id(s->item_id, sizeof s->item_id, reasoning ? "rs" : "msg", m, idx);
        s->text.len = 0;
        if (s->text.data) s->text.data[0] = 0;
        ev_begin(s, out, "response.output_item.added");
        buf_printf(out, "\"output_index\":%d,\"item\":", idx);
        if (reasoning) put_reasoning_item(out, s->item_id, NULL, 0, "in_progress");
        else put_message_item(out, s->item_id, NULL, 0, "in_progress");
        buf_puts(out, "}\n\n");
        ev_item(s, out, "response.content_part.added", idx);
        buf_puts(out, "\"content_index\":0,\"part\":");
        if (reasoning) buf_puts(out, "{\"type\":\"reasoning_text\",\"text\":\"\"}");
        else put_output_text(out, "", 0);
        buf_puts(out, "}\n\n");
        s->open = want;
    }
    buf_append(&s->text, ev->text, ev->len);
    ev_item(s, out, reasoning ? "response.reasoning_text.delta" : "response.output_text.delta", s->next_output - 1);
    buf_puts(out, "\"content_index\":0,\"delta\":");
    json_put_str(out, ev->text, ev->len);
    buf_puts(out, reasoning ? "}\n\n" : ",\"logprobs\":[]}\n\n");
}

void rs_stream_finish(struct rs_stream *s, buf *out, const struct rs_meta *m, const char *incomplete_reason,
                      const struct rs_usage *u) {
    close_item(s, out, incomplete_reason ? "incomplete" : "completed");
    const char *name = incomplete_reason ? "response.incomplete" : "response.completed";
    ev_begin(s, out, name);
    buf_puts(out, "\"response\":");
    put_response(out, m, incomplete_reason ? "incomplete" : "completed", &s->items, incomplete_reason, NULL, NULL, u);
    buf_puts(out, "}\n\n");
}

void rs_stream_fail(struct rs_stream *s, buf *out, const struct rs_meta *m, const char *code, const char *message) {
    close_item(s, out, "incomplete");
    ev_begin(s, out, "response.failed");
    buf_puts(out, "\"response\":");
    put_response(out, m, "failed", &s->items, NULL, code, message, NULL);
    buf_puts(out, "}\n\n");
}

void rs_stream_free(struct rs_stream *s) {
    free(s->text.data);
    free(s->items.data);
    memset(s, 0, sizeof *s);
}

char *rs_response_json(const struct rs_meta *m, const char *reasoning, const char *content, const cJSON *tool_calls,
                       const char *incomplete_reason, const struct rs_usage *u) {
    buf items = {0}, b = {0};
    char id[64];
    int idx = 0;
    const char *status = incomplete_reason ? "incomplete" : "completed";
    if (reasoning && reasoning[0]) {
        item_id(id, sizeof id, "rs", m, idx++);
        put_reasoning_item(&items, id, reasoning, strlen(reasoning), status);
    }
    if (content && content[0]) {
        if (items.len) buf_putc(&items, ',');
        item_id(id, sizeof id, "msg", m, idx++);
        put_message_item(&items, id, content, strlen(content), status);
    }
    const cJSON *call;
    cJSON_ArrayForEach(call, tool_calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        if (items.len) buf_putc(&items, ',');
        item_id(id, sizeof id, "fc", m, idx++);
        put_call_item(&items, id, str_of(call, "id"), str_of(fn, "name"), str_of(fn, "arguments"), "completed");
    }
    put_response(&b, m, status, &items, incomplete_reason, NULL, NULL, u);
    free(items.data);
    if (b.oom || items.oom) {
        free(b.data);
        return NULL;
    }
    return b.data;
}
