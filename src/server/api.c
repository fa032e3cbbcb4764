/* server/api.c — OpenAI request parsing and validation (see api.h). Every
 * check names the offending field in both the message and `param`, so a
 * client sees exactly what to fix. The normalised messages handed to the chat
 * renderer keep only what the template reads: role, content (a string; text
 * parts joined), reasoning_content, tool_calls (arguments parsed to an object
 * when they are a JSON object text) and tool_call_id. */
#include "server/api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/status.h"
#include "server/anthropic.h"
#include "server/responses.h"
#include "text/utf8.h"

int api_error_set(struct api_error *e, int status, const char *type, const char *param, const char *code,
                  const char *fmt, ...) {
    e->status = status;
    e->type = type ? type : "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

char *api_error_json(const struct api_error *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

#define BAD(param, ...) api_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

static bool present(const cJSON *v) { return v && !cJSON_IsNull(v); }

/* number field: returns 1 set, 0 absent/null, -1 error. */
static int get_num(const cJSON *o, const char *name, double lo, double hi, bool lo_open, double *out,
                   struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!present(v)) return 0;
    if (!cJSON_IsNumber(v)) {
        BAD(name, "'%s' must be a number", name);
        return -1;
    }
    double d = v->valuedouble;
    if (!isfinite(d) || d > hi || (lo_open ? d <= lo : d < lo)) {
        BAD(name, "'%s' must be in %s%g, %g]; got %g", name, lo_open ? "(" : "[", lo, hi, d);
        return -1;
    }
    *out = d;
    return 1;
}

static int get_int(const cJSON *o, const char *name, double lo, double hi, long long *out, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!present(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || !isfinite(v->valuedouble)) {
        BAD(name, "'%s' must be an integer", name);
        return -1;
    }
    double d = v->valuedouble;
    if (d < lo || d > hi) {
        BAD(name, "'%s' must be in [%.0f, %.0f]; got %.0f", name, lo, hi, d);
        return -1;
    }
    /* past LLONG_MAX (a uint64 seed, hi < 2^64) through unsigned: a direct cast is undefined */
    *out = d < 0x1p63 ? (long long)d : (long long)(unsigned long long)d;
    return 1;
}

int api_model_not_found(struct api_error *e, const char *name, const char *model_id) {
    return api_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                         "The model '%.100s' does not exist; this server serves '%s'", name, model_id);
}

int api_get_bool(const cJSON *o, const char *name, bool *out, struct api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!present(v)) return 0;
    if (!cJSON_IsBool(v)) {
        BAD(name, "'%s' must be a boolean", name);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 1;
}

/* logit_bias: {"<token id>": bias, ...} (OpenAI). Keys are decimal token ids in
 * [0, vocab); values numbers in [-100, 100]; at most SAMPLER_MAX_LOGIT_BIAS entries. A
 * token named twice ("5" and "05") keeps the last value, as a JSON object read into a
 * dict does. */
static int parse_logit_bias(const cJSON *lb, int vocab, struct api_request *r, struct api_error *e) {
    if (!cJSON_IsObject(lb))
        return BAD("logit_bias", "'logit_bias' must be an object mapping token ids to bias values"), -1;
    if (cJSON_GetArraySize(lb) > SAMPLER_MAX_LOGIT_BIAS)
        return BAD("logit_bias", "'logit_bias' may hold at most %d entries; got %d", SAMPLER_MAX_LOGIT_BIAS,
                   cJSON_GetArraySize(lb)),
               -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, lb) {
        const char *k = it->string ? it->string : "";
        size_t n = strlen(k);
        long long id = 0;
        bool ok = n > 0 && n <= 12;
        for (size_t i = 0; ok && i < n; i++) {
            ok = k[i] >= '0' && k[i] <= '9';
            id = id * 10 + (k[i] - '0');
        }
        if (!ok || id >= vocab)
            return BAD("logit_bias", "'logit_bias' keys must be token ids (integers in [0, %d)); got \"%.40s\"", vocab, k),
                   -1;
        if (!cJSON_IsNumber(it))
            return BAD("logit_bias", "'logit_bias' values must be numbers in [-100, 100]; the value for token %lld is not one", id),
                   -1;
        const double v = it->valuedouble;
        if (!isfinite(v) || v < -SAMPLER_MAX_BIAS || v > SAMPLER_MAX_BIAS)
            return BAD("logit_bias", "'logit_bias' values must be numbers in [-100, 100]; got %g for token %lld", v, id), -1;
        int j = 0;
        while (j < r->sp.n_logit_bias && r->sp.logit_bias[j].token != (int32_t)id) j++;
        if (j == r->sp.n_logit_bias) r->sp.n_logit_bias++;
        r->sp.logit_bias[j] = (struct logit_bias){.token = (int32_t)id, .bias = (float)v};
    }
    return 0;
}

static int parse_sampling(const cJSON *root, int vocab, struct api_request *r, struct api_error *e) {
    double d;
    long long ll;
    int rc;
    if ((rc = get_num(root, "temperature", 0, 2, false, &d, e)) < 0) return -1;
    if (rc) r->sp.temperature = (float)d;
    if ((rc = get_num(root, "top_p", 0, 1, true, &d, e)) < 0) return -1;
    if (rc) r->sp.top_p = (float)d;
    if ((rc = get_int(root, "top_k", -1, 1e9, &ll, e)) < 0) return -1;
    if (rc) r->sp.top_k = ll < 0 ? 0 : (int)ll;
    if ((rc = get_num(root, "min_p", 0, 1, false, &d, e)) < 0) return -1;
    if (rc) r->sp.min_p = (float)d;
    if ((rc = get_num(root, "presence_penalty", -2, 2, false, &d, e)) < 0) return -1;
    if (rc) r->sp.presence_penalty = (float)d;
    if ((rc = get_num(root, "frequency_penalty", -2, 2, false, &d, e)) < 0) return -1;
    if (rc) r->sp.frequency_penalty = (float)d;
    if ((rc = get_num(root, "repetition_penalty", 0, 10, true, &d, e)) < 0) return -1;
    if (rc) r->sp.repetition_penalty = (float)d;
    if ((rc = get_int(root, "seed", -9.2e18, 1.8e19, &ll, e)) < 0) return -1;
    if (rc) {
        r->sp.has_seed = true;
        r->sp.seed = (uint64_t)ll;
    }
    r->n_choices = 1;
    if ((rc = get_int(root, "n", 1, 1e9, &ll, e)) < 0) return -1;
    if (rc && ll > API_MAX_CHOICES)
        return BAD("n", "'n' must be at most %d (each choice is a request of its own in the batch)", API_MAX_CHOICES), -1;
    if (rc) r->n_choices = (int)ll;
    if ((rc = get_int(root, "best_of", 1, 1e9, &ll, e)) < 0) return -1;
    if (rc && ll != 1) return BAD("best_of", "'best_of' must be 1"), -1;

    /* max_tokens / max_completion_tokens */
    /* 0 passes here: /v1/completions takes it with 'echo' (the prompt's logprobs alone);
     * api_parse refuses it everywhere else */
    long long mt = -1;
    if ((rc = get_int(root, "max_tokens", 0, 2147483647.0, &ll, e)) < 0) return -1;
    if (rc) mt = ll, r->max_tokens_key = "max_tokens";
    if ((rc = get_int(root, "max_completion_tokens", 0, 2147483647.0, &ll, e)) < 0) return -1;
    if (rc) mt = ll, r->max_tokens_key = "max_completion_tokens";
    r->max_tokens = (int)mt;

    /* stop */
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (present(stop)) {
        if (cJSON_IsString(stop)) {
            size_t l = strlen(stop->valuestring);
            if (l > API_MAX_STOP_LEN) return BAD("stop", "'stop' strings must be at most %d bytes", API_MAX_STOP_LEN), -1;
            if (l) {
                r->stops[0] = stop->valuestring;
                r->stop_lens[0] = l;
                r->n_stops = 1;
            }
        } else if (cJSON_IsArray(stop)) {
            if (cJSON_GetArraySize(stop) > API_MAX_STOPS)
                return BAD("stop", "'stop' may hold at most %d strings", API_MAX_STOPS), -1;
            const cJSON *s;
            cJSON_ArrayForEach(s, stop) {
                if (!cJSON_IsString(s)) return BAD("stop", "'stop' must be a string or an array of strings"), -1;
                size_t l = strlen(s->valuestring);
                if (l > API_MAX_STOP_LEN)
                    return BAD("stop", "'stop' strings must be at most %d bytes", API_MAX_STOP_LEN), -1;
                if (!l) continue;
                r->stops[r->n_stops] = s->valuestring;
                r->stop_lens[r->n_stops++] = l;
            }
        } else {
            return BAD("stop", "'stop' must be a string or an array of strings"), -1;
        }
    }

    bool b;
    if ((rc = api_get_bool(root, "ignore_eos", &b, e)) < 0) return -1;
    if (rc) r->ignore_eos = b;
    if ((rc = api_get_bool(root, "stream", &b, e)) < 0) return -1;
    if (rc) r->stream = b;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (present(so)) {
        if (!cJSON_IsObject(so)) return BAD("stream_options", "'stream_options' must be an object"), -1;
        if ((rc = api_get_bool(so, "include_usage", &b, e)) < 0)
            return BAD("stream_options.include_usage", "'stream_options.include_usage' must be a boolean"), -1;
        if (rc) r->include_usage = b;
    }
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (present(lb) && parse_logit_bias(lb, vocab, r, e)) return -1;
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (present(user) && !cJSON_IsString(user)) return BAD("user", "'user' must be a string"), -1;
    return 0;
}

/* ---- chat ---- */

bool api_valid_function_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return false;
    }
    return true;
}

/* content -> joined string; returns NULL (with e set) on error. *is_null for null content. */
static char *join_content(const cJSON *c, int idx, bool *is_null, struct api_error *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", idx);
    *is_null = false;
    if (!present(c)) {
        *is_null = true;
        return strdup("");
    }
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    if (!cJSON_IsArray(c)) {
        BAD(param, "'%s' must be a string, an array of content parts or null", param);
        return NULL;
    }
    size_t total = 1;
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
            BAD(param, "'%s[%d]' must be an object with a string 'type'", param, k);
            return NULL;
        }
        if (strcmp(type->valuestring, "text") != 0) {
            BAD(param, "'%s[%d]': content part type '%.40s' is not supported (text only)", param, k,
                type->valuestring);
            return NULL;
        }
        if (!cJSON_IsString(text)) {
            BAD(param, "'%s[%d].text' must be a string", param, k);
            return NULL;
        }
        total += strlen(text->valuestring);
        k++;
    }
    char *out = malloc(total), *p = out;
    if (!out) return NULL;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t l = strlen(t);
        memcpy(p, t, l);
        p += l;
    }
    *p = 0;
    return out;
}

cJSON *api_chat_message(cJSON *msgs, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content ? content : "");
    return m;
}

void api_chat_tool(cJSON *tools, const char *name, const char *description, const cJSON *parameters) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddItemToArray(tools, f);
    cJSON_AddStringToObject(f, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(f, "function");
    cJSON_AddStringToObject(fn, "name", name);
    if (description) cJSON_AddStringToObject(fn, "description", description);
    if (parameters) cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(parameters, 1));
}

void api_chat_tool_call(cJSON *assistant, const char *id, const char *name, cJSON *arguments) {
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(assistant, "tool_calls");
    if (!calls) calls = cJSON_AddArrayToObject(assistant, "tool_calls");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(calls, c);
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddItemToObject(fn, "arguments", arguments);
}

void api_chat_tool_choice(cJSON *req, const char *name) {
    cJSON *o = cJSON_AddObjectToObject(req, "tool_choice");
    cJSON_AddStringToObject(o, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "function"), "name", name);
}

void api_chat_json_schema(cJSON *req, const char *name, const cJSON *schema, const cJSON *strict) {
    cJSON *rf = cJSON_AddObjectToObject(req, "response_format");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    if (name) cJSON_AddStringToObject(js, "name", name);
    if (schema) cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(schema, 1));
    if (strict) cJSON_AddItemToObject(js, "strict", cJSON_Duplicate(strict, 1));
}

int api_chat_tool_from_flat(cJSON *tools, const cJSON *t, const char *where, const char *schema_key,
                            bool schema_required, struct api_error *e) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
    if (!cJSON_IsString(name) || !api_valid_function_name(name->valuestring))
        return BAD(where, "'%s.name' must be 1-64 characters of a-z, A-Z, 0-9, _ . -", where), -1;
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(t, "description");
    if (present(desc) && !cJSON_IsString(desc)) return BAD(where, "'%s.description' must be a string", where), -1;
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, schema_key);
    if ((schema_required || present(schema)) && !cJSON_IsObject(schema))
        return BAD(where, "'%s.%s' must be a JSON Schema object", where, schema_key), -1;
    api_chat_tool(tools, name->valuestring, cJSON_IsString(desc) ? desc->valuestring : NULL,
                  cJSON_IsObject(schema) ? schema : NULL);
    return 0;
}

static int parse_messages(const cJSON *msgs, struct api_request *r, struct api_error *e) {
    if (!present(msgs)) return BAD("messages", "'messages' is required"), -1;
    if (!cJSON_IsArray(msgs)) return BAD("messages", "'messages' must be an array"), -1;
    if (cJSON_GetArraySize(msgs) == 0) return BAD("messages", "'messages' must not be empty"), -1;
    r->messages = cJSON_CreateArray();
    const cJSON *m;
    int i = 0;
    char param[80];
    cJSON_ArrayForEach(m, msgs) {
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return BAD(param, "'%s' must be an object", param), -1;
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!present(role)) return BAD(param, "'%s' is required", param), -1;
        if (!cJSON_IsString(role)) return BAD(param, "'%s' must be a string", param), -1;
        const char *rs = role->valuestring;
        bool is_asst = !strcmp(rs, "assistant"), is_tool = !strcmp(rs, "tool");
        if (!strcmp(rs, "developer")) rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && !is_asst && !is_tool)
            return BAD(param, "'%s' must be one of system, developer, user, assistant, tool; got '%.40s'", param,
                       rs),
                   -1;
        cJSON *nm = cJSON_CreateObject();
        cJSON_AddItemToArray(r->messages, nm);
        cJSON_AddStringToObject(nm, "role", rs);
        bool is_null;
        char *content = join_content(cJSON_GetObjectItemCaseSensitive(m, "content"), i, &is_null, e);
        if (!content) {
            if (e->status == 0) BAD("messages", "out of memory");
            return -1;
        }
        const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (is_null && !(is_asst)) {
            free(content);
            snprintf(param, sizeof param, "messages[%d].content", i);
            return BAD(param, "'%s' is required for role '%s'", param, rs), -1;
        }
        cJSON_AddStringToObject(nm, "content", content);
        free(content);
        const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
        if (present(rc)) {
            snprintf(param, sizeof param, "messages[%d].reasoning_content", i);
            if (!cJSON_IsString(rc)) return BAD(param, "'%s' must be a string", param), -1;
            cJSON_AddStringToObject(nm, "reasoning_content", rc->valuestring);
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
        if (present(name) && !cJSON_IsString(name)) {
            snprintf(param, sizeof param, "messages[%d].name", i);
            return BAD(param, "'%s' must be a string", param), -1;
        }
        if (present(tcs)) {
            snprintf(param, sizeof param, "messages[%d].tool_calls", i);
            if (!is_asst) return BAD(param, "'%s' is only allowed on assistant messages", param), -1;
            if (!cJSON_IsArray(tcs)) return BAD(param, "'%s' must be an array", param), -1;
            cJSON *ntcs = cJSON_AddArrayToObject(nm, "tool_calls");
            const cJSON *tc;
            int k = 0;
            cJSON_ArrayForEach(tc, tcs) {
                snprintf(param, sizeof param, "messages[%d].tool_calls[%d]", i, k);
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "id");
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
                if (!cJSON_IsObject(tc) || !cJSON_IsObject(fn))
                    return BAD(param, "'%s' must be an object with a 'function' object", param), -1;
                if (present(type) && !(cJSON_IsString(type) && !strcmp(type->valuestring, "function")))
                    return BAD(param, "'%s.type' must be \"function\"", param), -1;
                if (present(id) && !cJSON_IsString(id)) return BAD(param, "'%s.id' must be a string", param), -1;
                const cJSON *fname = cJSON_GetObjectItemCaseSensitive(fn, "name");
                const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                if (!cJSON_IsString(fname) || !fname->valuestring[0])
                    return BAD(param, "'%s.function.name' must be a non-empty string", param), -1;
                if (!cJSON_IsString(args) && !cJSON_IsObject(args))
                    return BAD(param, "'%s.function.arguments' must be a JSON string", param), -1;
                cJSON *ntc = cJSON_CreateObject();
                cJSON_AddItemToArray(ntcs, ntc);
                if (cJSON_IsString(id)) cJSON_AddStringToObject(ntc, "id", id->valuestring);
                cJSON_AddStringToObject(ntc, "type", "function");
                cJSON *nfn = cJSON_AddObjectToObject(ntc, "function");
                cJSON_AddStringToObject(nfn, "name", fname->valuestring);
                cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : cJSON_Duplicate(args, 1);
                if (cJSON_IsObject(parsed)) {
                    cJSON_AddItemToObject(nfn, "arguments", parsed);
                } else {
                    cJSON_Delete(parsed);
                    return BAD(param, "'%s.function.arguments' must be a JSON object (as a string)", param), -1;
                }
                k++;
            }
        }
        const cJSON *tcid = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
        if (present(tcid)) {
            snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
            if (!cJSON_IsString(tcid)) return BAD(param, "'%s' must be a string", param), -1;
            cJSON_AddStringToObject(nm, "tool_call_id", tcid->valuestring);
        }
        i++;
    }
    return 0;
}

static int parse_tools(const cJSON *root, struct api_request *r, struct api_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    int n = 0;
    char param[64];
    if (present(tools)) {
        if (!cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array"), -1;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            snprintf(param, sizeof param, "tools[%d]", n);
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            if (!cJSON_IsObject(t)) return BAD(param, "'%s' must be an object", param), -1;
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
                return BAD(param, "'%s.type' must be \"function\"", param), -1;
            if (!cJSON_IsObject(fn)) return BAD(param, "'%s.function' must be an object", param), -1;
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsString(name) || !api_valid_function_name(name->valuestring))
                return BAD(param, "'%s.function.name' must be 1-64 characters of a-z, A-Z, 0-9, _ . -", param), -1;
            const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
            if (present(desc) && !cJSON_IsString(desc))
                return BAD(param, "'%s.function.description' must be a string", param), -1;
            const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            if (present(params) && !cJSON_IsObject(params))
                return BAD(param, "'%s.function.parameters' must be a JSON Schema object", param), -1;
            const cJSON *strict = cJSON_GetObjectItemCaseSensitive(fn, "strict");
            if (present(strict) && !cJSON_IsBool(strict))
                return BAD(param, "'%s.function.strict' must be a boolean", param), -1;
            n++;
        }
    }
    r->tool_choice = TC_AUTO;
    if (present(tc)) {
        if (cJSON_IsString(tc)) {
            if (!strcmp(tc->valuestring, "none")) r->tool_choice = TC_NONE;
            else if (!strcmp(tc->valuestring, "auto")) r->tool_choice = TC_AUTO;
            else if (!strcmp(tc->valuestring, "required")) r->tool_choice = TC_REQUIRED;
            else return BAD("tool_choice", "'tool_choice' must be none, auto, required or a function object"), -1;
        } else if (cJSON_IsObject(tc)) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsString(name))
                return BAD("tool_choice", "'tool_choice.function.name' must be a string"), -1;
            snprintf(r->tool_name, sizeof r->tool_name, "%s", name->valuestring);
            r->tool_choice = TC_NAMED;
        } else {
            return BAD("tool_choice", "'tool_choice' must be a string or an object"), -1;
        }
    }
    if ((r->tool_choice == TC_REQUIRED || r->tool_choice == TC_NAMED) && n == 0)
        return BAD("tool_choice", "'tool_choice' requires 'tools'"), -1;
    if (n == 0 || r->tool_choice == TC_NONE) return 0;
    r->tools = cJSON_CreateArray();
    const cJSON *t;
    bool found = false;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (r->tool_choice == TC_NAMED && strcmp(name->valuestring, r->tool_name)) continue;
        found = true;
        cJSON_AddItemToArray(r->tools, cJSON_Duplicate(t, 1));
    }
    if (!found) return BAD("tool_choice", "'tool_choice' names function '%.64s', which is not in 'tools'", r->tool_name), -1;
    return 0;
}

static int parse_thinking(const cJSON *root, int default_thinking, struct api_request *r, struct api_error *e) {
    r->enable_thinking = default_thinking;
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort");
    if (present(re)) {
        if (!cJSON_IsString(re)) return BAD("reasoning_effort", "'reasoning_effort' must be a string"), -1;
        const char *s = re->valuestring;
        if (!strcmp(s, "none")) r->enable_thinking = 0;
        else if (!strcmp(s, "minimal") || !strcmp(s, "low") || !strcmp(s, "medium") || !strcmp(s, "high"))
            r->enable_thinking = 1;
        else
            return BAD("reasoning_effort", "'reasoning_effort' must be none, minimal, low, medium or high"), -1;
    }
    long long budget = 0;
    int brc = get_int(root, "thinking_budget", 1, 1e9, &budget, e);
    if (brc < 0) return -1;
    r->thinking_budget = brc ? (int)budget : 0;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (present(kw)) {
        if (!cJSON_IsObject(kw)) return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object"), -1;
        bool b;
        int rc = api_get_bool(kw, "enable_thinking", &b, e);
        if (rc < 0)
            return BAD("chat_template_kwargs.enable_thinking",
                       "'chat_template_kwargs.enable_thinking' must be a boolean"),
                   -1;
        if (rc) r->enable_thinking = b;
    }
    return 0;
}

static int parse_response_format(const cJSON *root, struct api_request *r, struct api_error *e) {
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (!present(rf)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
        return BAD("response_format", "'response_format' must be an object with a string 'type'"), -1;
    if (!strcmp(type->valuestring, "text")) return 0;
    char err[320];
    if (!strcmp(type->valuestring, "json_object")) {
        r->json_object = true;
        if (jg_compile(NULL, &r->grammar, err, sizeof err))
            return api_error_set(e, 500, "server_error", NULL, NULL, "internal server error"), -1;
        return 0;
    }
    if (strcmp(type->valuestring, "json_schema"))
        return BAD("response_format", "'response_format.type' must be text, json_object or json_schema; '%.40s' is "
                                      "not supported", type->valuestring),
               -1;
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return BAD("response_format.json_schema", "'response_format.json_schema' must be an object"), -1;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > 64)
        return BAD("response_format.json_schema.name", "'response_format.json_schema.name' must be a string of 1 to 64 "
                                                       "characters"),
               -1;
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (present(strict) && !cJSON_IsBool(strict))
        return BAD("response_format.json_schema.strict", "'response_format.json_schema.strict' must be a boolean"), -1;
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (present(schema) && !cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return BAD("response_format.json_schema.schema", "'response_format.json_schema.schema' must be a JSON Schema "
                                                         "object"),
               -1;
    cJSON *any = present(schema) ? NULL : cJSON_CreateTrue();
    int rc = jg_compile(any ? any : schema, &r->grammar, err, sizeof err);
    cJSON_Delete(any);
    if (rc)
        return BAD("response_format.json_schema.schema", "'response_format.json_schema.schema' cannot be enforced: %s",
                   err),
               -1;
    r->json_schema = present(schema) ? schema : NULL;
    return 0;
}

/* Adds the JSON instruction to the system message: the model writes better
 * JSON when told, and the constraint keeps it to what is allowed. */
static void nudge_json(struct api_request *r) {
    cJSON *first = cJSON_GetArrayItem(r->messages, 0);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(first, "role");
    const bool has_system = cJSON_IsString(role) && !strcmp(role->valuestring, "system");
    buf b = {0};
    if (has_system) {
        const char *c = cJSON_GetObjectItemCaseSensitive(first, "content")->valuestring;
        buf_puts(&b, c);
        if (c[0]) buf_puts(&b, "\n\n");
    }
    char *schema = r->json_schema ? cJSON_PrintUnformatted(r->json_schema) : NULL;
    if (schema) {
        buf_puts(&b, "Respond only with JSON that matches this JSON Schema: ");
        buf_puts(&b, schema);
        free(schema);
    } else {
        buf_puts(&b, "Respond only with a single valid JSON object.");
    }
    if (!b.oom) {
        if (has_system) {
            cJSON_ReplaceItemInObjectCaseSensitive(first, "content", cJSON_CreateString(b.data));
        } else {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "system");
            cJSON_AddStringToObject(m, "content", b.data);
            cJSON_InsertItemInArray(r->messages, 0, m);
        }
    }
    free(b.data);
}

/* ---- completions prompt ---- */

/* One prompt of the batch: a non-empty string, or a non-empty array of ids in the
 * vocabulary; taken into r when take (ids copied), else only validated. */
static int parse_one_prompt(const cJSON *p, int vocab, bool take, struct api_request *r, struct api_error *e) {
    if (cJSON_IsString(p)) {
        if (!p->valuestring[0]) return BAD("prompt", "'prompt' must not be empty"), -1;
        if (take) {
            r->prompt_text = p->valuestring;
            r->prompt_len = strlen(p->valuestring);
        }
        return 0;
    }
    if (!cJSON_IsArray(p))
        return BAD("prompt", "'prompt' must be a string, an array of token ids, or an array of either"), -1;
    int n = cJSON_GetArraySize(p);
    if (n == 0) return BAD("prompt", "'prompt' must not be empty"), -1;
    if (take) {
        r->prompt_ids = malloc((size_t)n * sizeof *r->prompt_ids);
        if (!r->prompt_ids) return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, p) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble))
            return BAD("prompt", "'prompt' arrays must hold integer token ids, or be a batch of strings or of id arrays"), -1;
        if (t->valuedouble < 0 || t->valuedouble >= vocab)
            return BAD("prompt", "token id %.0f in 'prompt' is outside the vocabulary [0, %d)", t->valuedouble, vocab), -1;
        if (take) r->prompt_ids[r->n_prompt_ids++] = (int32_t)t->valuedouble;
    }
    return 0;
}

/* 'prompt': one prompt (a string or an array of ids) or a batch of them (an array of
 * strings or of id arrays, not mixed), OpenAI's forms; r takes prompt r->prompt_index's. */
static int parse_prompt(const cJSON *root, int vocab, struct api_request *r, struct api_error *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!present(p)) return BAD("prompt", "'prompt' is required"), -1;
    const bool batch = cJSON_IsArray(p) && (cJSON_IsString(p->child) || cJSON_IsArray(p->child));
    if (!batch) {
        r->n_prompts = 1;
        if (r->prompt_index != 0) return BAD("prompt", "'prompt' holds one prompt"), -1;
        return parse_one_prompt(p, vocab, true, r, e);
    }
    r->n_prompts = cJSON_GetArraySize(p);
    if (r->n_prompts > API_MAX_PROMPTS)
        return BAD("prompt", "'prompt' holds %d prompts; a request's batch takes at most %d", r->n_prompts,
                   API_MAX_PROMPTS), -1;
    if (r->prompt_index >= r->n_prompts)
        return BAD("prompt", "'prompt' holds %d prompts", r->n_prompts), -1;
    const bool strings = cJSON_IsString(p->child);
    int i = 0;
    const cJSON *one;
    cJSON_ArrayForEach(one, p) {
        if (strings ? !cJSON_IsString(one) : !cJSON_IsArray(one))
            return BAD("prompt", "a batch in 'prompt' must be all strings or all arrays of token ids (element %d is not)",
                       i), -1;
        if (parse_one_prompt(one, vocab, i == r->prompt_index, r, e)) return -1;
        i++;
    }
    return 0;
}

int api_parse(enum api_kind kind, const char *body, size_t len, const char *model_id, int vocab,
              int default_thinking, const struct sampler_params *sp_base, struct api_request *r, struct api_error *e) {
    return api_parse_at(kind, body, len, model_id, vocab, default_thinking, sp_base, 0, r, e);
}

int api_parse_at(enum api_kind kind, const char *body, size_t len, const char *model_id, int vocab,
                 int default_thinking, const struct sampler_params *sp_base, int prompt_index,
                 struct api_request *r, struct api_error *e) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->kind = kind;
    r->n_prompts = 1;
    r->prompt_index = prompt_index;
    r->sp = sp_base ? *sp_base : sampler_params_default();
    r->max_tokens = -1;
    r->enable_thinking = default_thinking;
    const char *end = NULL;
    r->root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!r->root) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        return BAD(NULL, "request body is not valid JSON (error near byte %zu)", off);
    }
    if (end) {
        while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
        if (end < body + len)
            return BAD(NULL, "request body is not valid JSON (unexpected data after the value at byte %zu)",
                       (size_t)(end - body));
    }
    if (!cJSON_IsObject(r->root)) return BAD(NULL, "request body must be a JSON object");
    if (kind != API_CHAT && kind != API_COMPLETION) { /* another dialect: into the chat shape */
        cJSON *chat = NULL;
        int rc = kind == API_RESPONSES ? responses_translate(r->root, &chat, &r->echo, e)
                                       : anthropic_translate(r->root, kind == API_MESSAGES_COUNT, &chat, &r->prefill, e);
        if (rc) return rc;
        cJSON_Delete(r->root);
        r->root = chat;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(r->root, "model");
    if (!present(model)) return BAD("model", "'model' is required");
    if (!cJSON_IsString(model)) return BAD("model", "'model' must be a string");
    if ((kind == API_CHAT || kind == API_RESPONSES) && strcmp(model->valuestring, model_id) != 0)
        return api_model_not_found(e, model->valuestring, model_id);
    if (parse_sampling(r->root, vocab, r, e)) return e->status;
    if (api_is_chat(kind)) {
        if (r->max_tokens == 0) return BAD(r->max_tokens_key, "'%s' must be at least 1", r->max_tokens_key);
        bool b = false;
        int rc = api_get_bool(r->root, "logprobs", &b, e);
        if (rc < 0) return e->status;
        r->logprobs = b;
        long long ll = 0;
        if ((rc = get_int(r->root, "top_logprobs", 0, SAMPLER_MAX_TOP_LOGPROBS, &ll, e)) < 0) return e->status;
        if (rc) {
            if (!r->logprobs && ll > 0) return BAD("top_logprobs", "'top_logprobs' requires 'logprobs': true");
            r->top_logprobs = (int)ll;
        }
        if (parse_messages(cJSON_GetObjectItemCaseSensitive(r->root, "messages"), r, e)) return e->status;
        if (parse_tools(r->root, r, e)) return e->status;
        if (parse_thinking(r->root, default_thinking, r, e)) return e->status;
        if (parse_response_format(r->root, r, e)) return e->status;
        if (r->grammar) nudge_json(r);
        b = true;
        if ((rc = api_get_bool(r->root, "parallel_tool_calls", &b, e)) < 0) return e->status;
        r->one_tool_call = rc && !b;
    } else {
        long long ll = 0;
        int rc = get_int(r->root, "logprobs", 0, 5, &ll, e);
        if (rc < 0) return e->status;
        if (rc) {
            r->logprobs = true;
            r->top_logprobs = (int)ll;
        }
        if ((rc = api_get_bool(r->root, "echo", &r->echo_prompt, e)) < 0) return e->status;
        if (r->max_tokens == 0 && !r->echo_prompt)
            return BAD(r->max_tokens_key, "'%s' must be at least 1 (0 only with 'echo': true, for the prompt's "
                       "logprobs alone)", r->max_tokens_key);
        const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(r->root, "suffix");
        if (present(suffix)) return BAD("suffix", "'suffix' is not supported");
        if (parse_prompt(r->root, vocab, r, e)) return e->status;
        if (r->max_tokens < 0) r->max_tokens = 16; /* the completions API default */
    }
    r->sp.logprobs = r->logprobs;
    r->sp.top_logprobs = r->top_logprobs;
    return 0;
}

void api_request_free(struct api_request *r) {
    cJSON_Delete(r->root);
    cJSON_Delete(r->messages);
    cJSON_Delete(r->tools);
    free(r->prompt_ids);
    free(r->prefill);
    free(r->echo);
    jg_free(r->grammar);
    memset(r, 0, sizeof *r);
}

/* Appends s to the malloc'd *text (reallocated). Returns 0 or -1 (out of memory:
 * *text freed and NULL). */
static int append_text(char **text, const char *s) {
    size_t a = strlen(*text), b = strlen(s);
    char *t2 = realloc(*text, a + b + 1);
    if (!t2) {
        free(*text);
        *text = NULL;
        return -1;
    }
    memcpy(t2 + a, s, b + 1);
    *text = t2;
    return 0;
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && memcmp(s + a - b, suf, b) == 0;
}

int api_prepare_prompt(struct api_request *r, const struct model_port *port, int max_seq, int32_t **ids,
                       int *n_ids, char **forced_prefix, bool *start_in_reasoning, struct api_error *e) {
    char err[512] = "";
    *ids = NULL;
    *n_ids = 0;
    *forced_prefix = NULL;
    *start_in_reasoning = false;
    const char *what = api_is_chat(r->kind) ? "messages" : "prompt";
    if (r->kind == API_COMPLETION && r->prompt_ids) {
        *ids = r->prompt_ids;
        *n_ids = r->n_prompt_ids;
        r->prompt_ids = NULL;
        r->n_prompt_ids = 0;
    } else {
        char *text = NULL;
        const char *src;
        size_t src_len;
        if (api_is_chat(r->kind)) {
            int thinking = r->enable_thinking;
            if (r->tool_choice == TC_REQUIRED || r->tool_choice == TC_NAMED || r->prefill || r->grammar) thinking = 0;
            int rc = port->render_chat(port->ctx, r->messages, r->tools, thinking, &text, err, sizeof err);
            if (rc == ST_INVALID) return BAD("messages", "'messages' cannot be rendered by the chat template: %s", err);
            if (rc) return api_error_set(e, 500, "server_error", NULL, NULL, "internal server error");
            *start_in_reasoning = ends_with(text, "<think>\n");
            const char *prefix = NULL;
            char named[200];
            if (r->tool_choice == TC_NAMED) {
                snprintf(named, sizeof named, "<tool_call>\n<function=%s>\n", r->tool_name);
                prefix = named;
            } else if (r->tool_choice == TC_REQUIRED) {
                prefix = "<tool_call>\n<function=";
            }
            /* the prefill: the reply continues it, and the client has it, so the parser does not see it;
             * the forced prefix: the parser must see it first */
            if ((r->prefill && append_text(&text, r->prefill)) || (prefix && append_text(&text, prefix)))
                return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            if (prefix) *forced_prefix = strdup(prefix);
            if (r->prefill || prefix) *start_in_reasoning = false;
            src = text;
            src_len = strlen(text);
        } else {
            src = r->prompt_text;
            src_len = r->prompt_len;
        }
        size_t n = 0;
        int rc = port->encode(port->ctx, src, src_len, ids, &n, err, sizeof err);
        free(text);
        if (rc) { /* on failure nothing is returned: the forced prefix neither */
            free(*forced_prefix);
            *forced_prefix = NULL;
        }
        if (rc == ST_INVALID) return BAD(what, "%s: %s", what, err);
        if (rc) return api_error_set(e, 500, "server_error", NULL, NULL, "internal server error");
        *n_ids = (int)n;
    }
    long long need = (long long)*n_ids + (r->max_tokens >= 0 ? r->max_tokens : 1);
    if (r->kind == API_MESSAGES && *n_ids > 0 && *n_ids < max_seq && need > max_seq) {
        r->max_tokens = max_seq - *n_ids;
        r->max_tokens_clamped = true;
        need = max_seq;
    }
    if (*n_ids == 0 || need > max_seq) {
        int n = *n_ids;
        free(*ids);
        *ids = NULL;
        *n_ids = 0;
        free(*forced_prefix);
        *forced_prefix = NULL;
        if (n == 0) return BAD(what, "'%s' produced an empty prompt", what);
        if (r->max_tokens > 0)
            return api_error_set(e, 400, "invalid_request_error", what, "context_length_exceeded",
                                 "This model's maximum context length is %d tokens. However, you requested %lld "
                                 "tokens (%d in the %s, %d in the completion). Please reduce the length of the %s "
                                 "or completion.",
                                 max_seq, need, n, what, r->max_tokens, what);
        return api_error_set(e, 400, "invalid_request_error", what, "context_length_exceeded",
                             "This model's maximum context length is %d tokens. However, your %s resulted in %d "
                             "tokens, leaving no room for the completion.",
                             max_seq, what, n);
    }
    if (r->max_tokens < 0) r->max_tokens = max_seq - *n_ids;
    return 0;
}
