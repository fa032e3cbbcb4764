/* text/chat.c — the Qwen3.6 chat template (chat_template.jinja, as written by
 * tools/fetch_tokenizer.py) rendered in C, statement by statement.
 *
 * The code follows the template's order exactly, because errors and the
 * image/video counters depend on it: (1) empty messages error; (2) the system
 * header (tools block or the system message); (3) a reverse scan for the last
 * real user query (a user turn whose trimmed content is not wrapped in
 * <tool_response>...</tool_response>); (4) one pass over the messages, where
 * every message's content is rendered (counting images/videos) and trimmed
 * first; (5) the generation prompt. Python semantics that matter for byte
 * parity are reproduced: str.strip() whitespace (py_isspace), split/rstrip/
 * lstrip of '\n', json.dumps(ensure_ascii=False) for tojson, str() of
 * scalars (True/False/None, float repr).
 */
#include "text/chat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/status.h"
#include "text/utf8.h"

/* FNV-1a 64 of the template text (trailing whitespace removed) that this file
 * implements; see chat_template_supported. */
#define QWEN36_TEMPLATE_FNV 0xfc7c1897b7bee9ccull

chat_options chat_options_default(void) {
    chat_options o = {.add_generation_prompt = 1, .enable_thinking = -1, .preserve_thinking = -1,
                      .add_vision_id = 0, .arguments_json = 1};
    return o;
}

int chat_template_supported(const char *text) {
    if (!text) return 0;
    size_t n = strlen(text);
    while (n && (text[n - 1] == ' ' || text[n - 1] == '\n' || text[n - 1] == '\t' || text[n - 1] == '\r')) n--;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
    return h == QWEN36_TEMPLATE_FNV;
}

/* ------------------------------------------------------- Python formatting */

/* float.__repr__: shortest round-trip digits; fixed notation when the decimal
 * exponent is in [-4, 16), else d.ddde+XX. */
static void py_float(buf *b, double v) {
    if (isnan(v)) { buf_puts(b, "NaN"); return; }
    if (isinf(v)) { buf_puts(b, v < 0 ? "-Infinity" : "Infinity"); return; }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v) break;
    }
    /* tmp = [-]d.ddde[+-]XX */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *p = tmp + neg;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) buf_putc(b, '-');
    int decpt = exp10 + 1; /* digits[0..decpt) before the point */
    if (exp10 < -4 || exp10 >= 16) {
        buf_putc(b, digits[0]);
        if (nd > 1) {
            buf_putc(b, '.');
            buf_append(b, digits + 1, (size_t)nd - 1);
        }
        buf_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        buf_puts(b, "0.");
        for (int i = 0; i < -decpt; i++) buf_putc(b, '0');
        buf_append(b, digits, (size_t)nd);
    } else if (decpt >= nd) {
        buf_append(b, digits, (size_t)nd);
        for (int i = nd; i < decpt; i++) buf_putc(b, '0');
        buf_puts(b, ".0");
    } else {
        buf_append(b, digits, (size_t)decpt);
        buf_putc(b, '.');
        buf_append(b, digits + decpt, (size_t)(nd - decpt));
    }
}

/* A JSON number as Python would hold it after json.loads: integral values
 * (within 2^53) as int, the rest as float. */
static void py_number(buf *b, double v) {
    if (v == floor(v) && fabs(v) < 9007199254740992.0) buf_printf(b, "%.0f", v);
    else py_float(b, v);
}

static void json_string(buf *b, const char *s) {
    buf_putc(b, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': buf_puts(b, "\\\""); break;
        case '\\': buf_puts(b, "\\\\"); break;
        case '\n': buf_puts(b, "\\n"); break;
        case '\r': buf_puts(b, "\\r"); break;
        case '\t': buf_puts(b, "\\t"); break;
        case '\b': buf_puts(b, "\\b"); break;
        case '\f': buf_puts(b, "\\f"); break;
        default:
            if (*p < 0x20) buf_printf(b, "\\u%04x", *p);
            else buf_putc(b, (char)*p);
        }
    }
    buf_putc(b, '"');
}

/* json.dumps(v, ensure_ascii=False) with default separators. */
static void py_tojson(buf *b, const cJSON *v) {
    if (cJSON_IsObject(v)) {
        buf_putc(b, '{');
        for (const cJSON *c = v->child; c; c = c->next) {
            json_string(b, c->string ? c->string : "");
            buf_puts(b, ": ");
            py_tojson(b, c);
            if (c->next) buf_puts(b, ", ");
        }
        buf_putc(b, '}');
    } else if (cJSON_IsArray(v)) {
        buf_putc(b, '[');
        for (const cJSON *c = v->child; c; c = c->next) {
            py_tojson(b, c);
            if (c->next) buf_puts(b, ", ");
        }
        buf_putc(b, ']');
    } else if (cJSON_IsString(v)) {
        json_string(b, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        py_number(b, v->valuedouble);
    } else if (cJSON_IsTrue(v)) {
        buf_puts(b, "true");
    } else if (cJSON_IsFalse(v)) {
        buf_puts(b, "false");
    } else {
        buf_puts(b, "null");
    }
}

/* Python repr of a str (for str() of containers): quote choice and the
 * common escapes. */
static void py_repr_str(buf *b, const char *s) {
    char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    buf_putc(b, q);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\') buf_puts(b, "\\\\");
        else if (*p == (unsigned char)q) { buf_putc(b, '\\'); buf_putc(b, q); }
        else if (*p == '\n') buf_puts(b, "\\n");
        else if (*p == '\r') buf_puts(b, "\\r");
        else if (*p == '\t') buf_puts(b, "\\t");
        else if (*p < 0x20 || *p == 0x7F) buf_printf(b, "\\x%02x", *p);
        else buf_putc(b, (char)*p);
    }
    buf_putc(b, q);
}

static void py_repr(buf *b, const cJSON *v);

/* str(v) as Jinja's {{ v }} / |string print it. */
static void py_str(buf *b, const cJSON *v) {
    if (cJSON_IsString(v)) buf_puts(b, v->valuestring);
    else if (cJSON_IsNumber(v)) py_number(b, v->valuedouble);
    else if (cJSON_IsTrue(v)) buf_puts(b, "True");
    else if (cJSON_IsFalse(v)) buf_puts(b, "False");
    else if (cJSON_IsNull(v) || !v) buf_puts(b, "None");
    else py_repr(b, v);
}

static void py_repr(buf *b, const cJSON *v) {
    if (cJSON_IsString(v)) {
        py_repr_str(b, v->valuestring);
    } else if (cJSON_IsObject(v)) {
        buf_putc(b, '{');
        for (const cJSON *c = v->child; c; c = c->next) {
            py_repr_str(b, c->string ? c->string : "");
            buf_puts(b, ": ");
            py_repr(b, c);
            if (c->next) buf_puts(b, ", ");
        }
        buf_putc(b, '}');
    } else if (cJSON_IsArray(v)) {
        buf_putc(b, '[');
        for (const cJSON *c = v->child; c; c = c->next) {
            py_repr(b, c);
            if (c->next) buf_puts(b, ", ");
        }
        buf_putc(b, ']');
    } else {
        py_str(b, v);
    }
}

/* str.strip(): [*s, *e) shrinks to exclude Python whitespace at both ends. */
static void py_strip(const char *s, size_t n, size_t *start, size_t *end) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, z = n;
    while (a < z) {
        uint32_t cp;
        int l = utf8_seq_len(u + a, z - a);
        if (!l) break;
        utf8_decode(u + a, &cp);
        if (!py_isspace(cp)) break;
        a += (size_t)l;
    }
    while (z > a) {
        size_t k = z - 1;
        while (k > a && (u[k] & 0xC0) == 0x80) k--;
        uint32_t cp;
        if (!utf8_seq_len(u + k, z - k)) break;
        utf8_decode(u + k, &cp);
        if (!py_isspace(cp)) break;
        z = k;
    }
    *start = a;
    *end = z;
}

/* ------------------------------------------------------------- rendering */

typedef struct rctx {
    const chat_options *o;
    int image_count, video_count;
    char *err;
    size_t errlen;
} rctx;

static const cJSON *get(const cJSON *o, const char *key) {
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

static const char *role_of(const cJSON *m) {
    const cJSON *r = get(m, "role");
    return cJSON_IsString(r) ? r->valuestring : NULL;
}

static int role_is(const cJSON *m, const char *role) {
    const char *r = role_of(m);
    return r && strcmp(r, role) == 0;
}

/* Jinja `'key' in item`: a mapping has the key, or a string contains it. */
static int has(const cJSON *item, const char *key) {
    if (cJSON_IsObject(item)) return cJSON_GetObjectItemCaseSensitive(item, key) != NULL;
    if (cJSON_IsString(item)) return strstr(item->valuestring, key) != NULL;
    return 0;
}

static int type_is(const cJSON *item, const char *type) {
    const cJSON *t = get(item, "type");
    return cJSON_IsString(t) && strcmp(t->valuestring, type) == 0;
}

/* The render_content macro; output appended to dst. */
static int render_content(rctx *c, const cJSON *content, int do_vision_count, int is_system, buf *dst) {
    if (!content || cJSON_IsNull(content)) return 0;
    if (cJSON_IsString(content)) {
        buf_puts(dst, content->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(content))
        return errorf(c->err, c->errlen, ST_INVALID, "Unexpected content type.");
    for (const cJSON *item = content->child; item; item = item->next) {
        if (!cJSON_IsObject(item) && !cJSON_IsString(item))
            return errorf(c->err, c->errlen, ST_INVALID, "Unexpected item type in content.");
        if (has(item, "image") || has(item, "image_url") || type_is(item, "image")) {
            if (is_system) return errorf(c->err, c->errlen, ST_INVALID, "System message cannot contain images.");
            if (do_vision_count) c->image_count++;
            if (c->o->add_vision_id) buf_printf(dst, "Picture %d: ", c->image_count);
            buf_puts(dst, "<|vision_start|><|image_pad|><|vision_end|>");
        } else if (has(item, "video") || type_is(item, "video")) {
            if (is_system) return errorf(c->err, c->errlen, ST_INVALID, "System message cannot contain videos.");
            if (do_vision_count) c->video_count++;
            if (c->o->add_vision_id) buf_printf(dst, "Video %d: ", c->video_count);
            buf_puts(dst, "<|vision_start|><|video_pad|><|vision_end|>");
        } else if (has(item, "text")) {
            if (cJSON_IsObject(item)) py_str(dst, cJSON_GetObjectItemCaseSensitive(item, "text"));
            /* a string item: item.text is undefined and prints nothing */
        } else {
            return errorf(c->err, c->errlen, ST_INVALID, "Unexpected item type in content.");
        }
    }
    return 0;
}

/* render_content(...)|trim into a fresh buffer: *out gets [start, end). */
static int content_trimmed(rctx *c, const cJSON *content, int do_vision_count, int is_system, buf *tmp,
                           const char **s, size_t *n) {
    tmp->len = 0;
    int rc = render_content(c, content, do_vision_count, is_system, tmp);
    if (rc) return rc;
    buf_append(tmp, "", 0); /* ensure data != NULL */
    size_t a, z;
    py_strip(tmp->data, tmp->len, &a, &z);
    *s = tmp->data + a;
    *n = z - a;
    return 0;
}

static const char TOOLS_HEAD[] = "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
static const char TOOLS_TAIL[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls\n</IMPORTANT>";

/* Finds `needle` in s[0..n): first (last=0) or last (last=1) occurrence, or NULL. */
static const char *find(const char *s, size_t n, const char *needle, int last) {
    size_t k = strlen(needle);
    const char *hit = NULL;
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(s + i, needle, k) == 0) {
            hit = s + i;
            if (!last) return hit;
        }
    return hit;
}

static int render_tool_calls(rctx *c, const cJSON *calls, int content_nonblank, buf *out) {
    int first = 1;
    for (const cJSON *tc = calls->child; tc; tc = tc->next, first = 0) {
        const cJSON *fn = tc;
        if (get(tc, "function")) fn = get(tc, "function");
        const cJSON *name = get(fn, "name");
        if (!cJSON_IsString(name))
            return errorf(c->err, c->errlen, ST_INVALID, "tool call has no function name");
        if (first) buf_puts(out, content_nonblank ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=");
        else buf_puts(out, "\n<tool_call>\n<function=");
        buf_puts(out, name->valuestring);
        buf_puts(out, ">\n");
        const cJSON *args = get(fn, "arguments");
        cJSON *parsed = NULL;
        if (cJSON_IsString(args) && c->o->arguments_json) {
            parsed = cJSON_Parse(args->valuestring);
            args = parsed;
        }
        if (cJSON_IsObject(args)) {
            for (const cJSON *a = args->child; a; a = a->next) {
                buf_puts(out, "<parameter=");
                buf_puts(out, a->string ? a->string : "");
                buf_puts(out, ">\n");
                if (cJSON_IsObject(a) || cJSON_IsArray(a)) py_tojson(out, a);
                else py_str(out, a);
                buf_puts(out, "\n</parameter>\n");
            }
        }
        cJSON_Delete(parsed);
        buf_puts(out, "</function>\n</tool_call>");
    }
    return 0;
}

static int render(rctx *c, const cJSON *messages, const cJSON *tools, buf *out) {
    int rc;
    if (!cJSON_IsArray(messages) || !messages->child)
        return errorf(c->err, c->errlen, ST_INVALID, "No messages provided.");
    const cJSON *first = messages->child;
    int nmsg = cJSON_GetArraySize(messages);
    buf tmp = {0}, tmp2 = {0};
    const cJSON **msg = NULL;
    const char *s;
    size_t n;

    /* (2) header */
    if (cJSON_IsArray(tools) && tools->child) {
        buf_puts(out, TOOLS_HEAD);
        for (const cJSON *t = tools->child; t; t = t->next) {
            buf_putc(out, '\n');
            py_tojson(out, t);
        }
        buf_puts(out, TOOLS_TAIL);
        if (role_is(first, "system")) {
            if ((rc = content_trimmed(c, get(first, "content"), 0, 1, &tmp, &s, &n))) goto done;
            if (n) {
                buf_puts(out, "\n\n");
                buf_append(out, s, n);
            }
        }
        buf_puts(out, "<|im_end|>\n");
    } else if (role_is(first, "system")) {
        if ((rc = content_trimmed(c, get(first, "content"), 0, 1, &tmp, &s, &n))) goto done;
        buf_puts(out, "<|im_start|>system\n");
        buf_append(out, s, n);
        buf_puts(out, "<|im_end|>\n");
    }

    /* (3) last real user query, scanning backwards (through an index of the messages:
     * cJSON_GetArrayItem walks the list, which made this quadratic) */
    msg = malloc((size_t)nmsg * sizeof *msg);
    if (!msg) {
        rc = errorf(c->err, c->errlen, ST_NOMEM, "out of memory");
        goto done;
    }
    int k = 0;
    for (const cJSON *m = messages->child; m && k < nmsg; m = m->next) msg[k++] = m;
    int last_query = nmsg - 1, multi_step = 1;
    for (int i = nmsg - 1; i >= 0 && multi_step; i--) {
        const cJSON *m = msg[i];
        if (!role_is(m, "user")) continue;
        if ((rc = content_trimmed(c, get(m, "content"), 0, 0, &tmp, &s, &n))) goto done;
        static const char open[] = "<tool_response>", close[] = "</tool_response>";
        int wrapped = n >= sizeof open - 1 && memcmp(s, open, sizeof open - 1) == 0 && n >= sizeof close - 1 &&
                      memcmp(s + n - (sizeof close - 1), close, sizeof close - 1) == 0;
        if (!wrapped) {
            multi_step = 0;
            last_query = i;
        }
    }
    if (multi_step) {
        rc = errorf(c->err, c->errlen, ST_INVALID, "No user query found in messages.");
        goto done;
    }

    /* (4) the messages */
    int idx = 0;
    const cJSON *prev = NULL;
    for (const cJSON *m = messages->child; m; prev = m, m = m->next, idx++) {
        if ((rc = content_trimmed(c, get(m, "content"), 1, 0, &tmp, &s, &n))) goto done;
        const char *role = role_of(m);
        if (role && strcmp(role, "system") == 0) {
            if (idx != 0) {
                rc = errorf(c->err, c->errlen, ST_INVALID, "System message must be at the beginning.");
                goto done;
            }
        } else if (role && strcmp(role, "user") == 0) {
            buf_puts(out, "<|im_start|>user\n");
            buf_append(out, s, n);
            buf_puts(out, "<|im_end|>\n");
        } else if (role && strcmp(role, "assistant") == 0) {
            const char *rs = "";
            size_t rn = 0;
            const cJSON *rcj = get(m, "reasoning_content");
            if (cJSON_IsString(rcj)) {
                rs = rcj->valuestring;
                rn = strlen(rs);
            } else if (find(s, n, "</think>", 0)) {
                /* reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                const char *end = find(s, n, "</think>", 0);
                size_t len0 = (size_t)(end - s);
                while (len0 && s[len0 - 1] == '\n') len0--;
                const char *open = find(s, len0, "<think>", 1);
                rs = open ? open + 7 : s;
                rn = len0 - (size_t)(rs - s);
                while (rn && *rs == '\n') { rs++; rn--; }
                /* content = content.split('</think>')[-1].lstrip('\n') */
                const char *lastc = find(s, n, "</think>", 1) + 8;
                n -= (size_t)(lastc - s);
                s = lastc;
                while (n && *s == '\n') { s++; n--; }
            }
            size_t ra, rz;
            py_strip(rs, rn, &ra, &rz);
            buf_puts(out, "<|im_start|>assistant\n");
            if (c->o->preserve_thinking == 1 || idx > last_query) {
                buf_puts(out, "<think>\n");
                buf_append(out, rs + ra, rz - ra);
                buf_puts(out, "\n</think>\n\n");
            }
            buf_append(out, s, n);
            const cJSON *calls = get(m, "tool_calls");
            if (cJSON_IsArray(calls) && calls->child) {
                size_t a, z;
                py_strip(s, n, &a, &z);
                if ((rc = render_tool_calls(c, calls, z > a, out))) goto done;
            }
            buf_puts(out, "<|im_end|>\n");
        } else if (role && strcmp(role, "tool") == 0) {
            /* loop.previtem is truthy when it exists and is a non-empty mapping */
            if (prev && !(cJSON_IsObject(prev) && !prev->child) && !role_is(prev, "tool"))
                buf_puts(out, "<|im_start|>user");
            buf_puts(out, "\n<tool_response>\n");
            buf_append(out, s, n);
            buf_puts(out, "\n</tool_response>");
            if (!m->next || !role_is(m->next, "tool")) buf_puts(out, "<|im_end|>\n");
        } else {
            rc = errorf(c->err, c->errlen, ST_INVALID, "Unexpected message role.");
            goto done;
        }
    }

    /* (5) generation prompt */
    if (c->o->add_generation_prompt) {
        buf_puts(out, "<|im_start|>assistant\n");
        buf_puts(out, c->o->enable_thinking == 0 ? "<think>\n\n</think>\n\n" : "<think>\n");
    }
    rc = 0;
done:
    free(msg);
    buf_free(&tmp);
    buf_free(&tmp2);
    return rc;
}

int chat_render(const struct tokenizer *tok, const cJSON *messages, const cJSON *tools, const chat_options *opt,
                char **out, char *err, size_t errlen) {
    (void)tok;
    *out = NULL;
    chat_options def = chat_options_default();
    rctx c = {.o = opt ? opt : &def, .err = err, .errlen = errlen};
    buf b = {0};
    int rc = render(&c, messages, tools, &b);
    if (!rc && b.oom) rc = errorf(err, errlen, ST_NOMEM, "out of memory");
    if (rc) {
        buf_free(&b);
        return rc;
    }
    buf_append(&b, "", 0);
    if (b.oom) {
        buf_free(&b);
        return errorf(err, errlen, ST_NOMEM, "out of memory");
    }
    *out = b.data;
    return 0;
}
