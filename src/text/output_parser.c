/* text/output_parser.c — incremental reasoning / content / tool-call splitting
 * of generated text (see output_parser.h for the contract).
 *
 * State machine over a pending byte buffer `pend` (text received, not yet
 * decided):
 *   START   (reasoning split on, prompt did not open <think>): waits for the
 *           first non-whitespace; "<think>" there opens REASON, anything else
 *           goes to CONTENT unchanged.
 *   REASON  emits reasoning up to "</think>", holding back a possible partial
 *           "</think>" and any trailing newlines (dropped when </think> comes).
 *   CONTENT emits content up to "<tool_call>", holding back a possible partial
 *           tag and trailing whitespace (dropped if a tool call follows).
 *   TOOL    collects the block body until "</tool_call>", then parses it into
 *           a tool call; a body that does not parse is emitted as content
 *           verbatim, tags included.
 * Every held byte is released at finish, so text is never lost; the only
 * bytes dropped are newlines around <think>/</think> and whitespace around
 * tool-call blocks.
 */
#include "text/output_parser.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/status.h"
#include "text/utf8.h"

enum { P_START, P_REASON, P_CONTENT, P_TOOL };

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char TOOL_OPEN[] = "<tool_call>", TOOL_CLOSE[] = "</tool_call>";

struct output_parser {
    output_parser_options o;
    int state;
    buf pend;            /* undecided input */
    size_t start_ws;     /* START: leading whitespace of pend already scanned (no rescans) */
    buf tool;            /* TOOL: body collected so far */
    size_t reason_nl;    /* REASON: trailing newlines held back */
    int reason_started;  /* REASON: some reasoning text emitted (leading newlines stripped) */
    int strip_nl;        /* CONTENT: drop newlines right after </think> */
    buf ws;              /* CONTENT: trailing whitespace held back */
    int after_tool;      /* CONTENT: a tool call just ended; drop leading whitespace */
    int ntools;
    buf scratch;
};

output_parser_options output_parser_options_default(void) {
    output_parser_options o = {.parse_reasoning = 1, .start_in_reasoning = 0, .parse_tools = 1, .tools = NULL};
    return o;
}

int output_parser_new(output_parser **out, const output_parser_options *opt, char *err, size_t errlen) {
    output_parser *p = calloc(1, sizeof *p);
    if (!p) return errorf(err, errlen, ST_NOMEM, "out of memory");
    p->o = opt ? *opt : output_parser_options_default();
    if (!p->o.parse_reasoning) p->state = P_CONTENT;
    else p->state = p->o.start_in_reasoning ? P_REASON : P_START;
    *out = p;
    return 0;
}

void output_parser_free(output_parser *p) {
    if (!p) return;
    buf_free(&p->pend);
    buf_free(&p->tool);
    buf_free(&p->ws);
    buf_free(&p->scratch);
    free(p);
}

int output_parser_tool_calls(const output_parser *p) { return p->ntools; }

/* ------------------------------------------------------------------ helpers */

static const char *memfind(const char *s, size_t n, const char *needle, size_t k) {
    if (k == 0 || n < k) return NULL;
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, k) == 0) return s + i;
    return NULL;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_tag(const char *s, size_t n, const char *tag) {
    size_t k = strlen(tag);
    for (size_t l = k - 1 < n ? k - 1 : n; l > 0; l--)
        if (memcmp(s + n - l, tag, l) == 0) return l;
    return 0;
}

static void consume(buf *b, size_t n) {
    if (!b->data) return; /* empty buffer: nothing to drop */
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

static int emit_text(output_parser *p, enum output_event_kind kind, const char *s, size_t n, output_event_fn fn,
                     void *user) {
    if (n == 0) return 0;
    output_event ev = {.kind = kind, .text = s, .len = n};
    return fn(user, &ev);
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Reasoning text: leading newlines of the whole reasoning dropped, trailing
 * newlines held until more text proves they are not the end. */
static int emit_reason(output_parser *p, const char *s, size_t n, output_event_fn fn, void *user) {
    if (!p->reason_started) {
        while (n && *s == '\n') { s++; n--; }
        if (!n) return 0;
    }
    size_t body = n;
    while (body && s[body - 1] == '\n') body--;
    int rc = 0;
    if (body) {
        p->reason_started = 1;
        p->scratch.len = 0;
        for (size_t i = 0; i < p->reason_nl; i++) buf_putc(&p->scratch, '\n');
        buf_append(&p->scratch, s, body);
        rc = emit_text(p, OUT_REASONING, p->scratch.data, p->scratch.len, fn, user);
        p->reason_nl = 0;
    }
    p->reason_nl += n - body;
    return rc;
}

/* Content text: whitespace at the end is held (a tool call may follow);
 * after a tool call, leading whitespace is dropped. */
static int emit_content(output_parser *p, const char *s, size_t n, output_event_fn fn, void *user) {
    if (p->after_tool) {
        while (n && is_ws(*s)) { s++; n--; }
        if (!n) return 0;
        p->after_tool = 0;
        p->ws.len = 0;
    }
    size_t body = n;
    while (body && is_ws(s[body - 1])) body--;
    int rc = 0;
    if (body) {
        p->scratch.len = 0;
        buf_append(&p->scratch, p->ws.data ? p->ws.data : "", p->ws.len);
        buf_append(&p->scratch, s, body);
        p->ws.len = 0;
        rc = emit_text(p, OUT_CONTENT, p->scratch.data, p->scratch.len, fn, user);
    }
    buf_append(&p->ws, s + body, n - body);
    return rc;
}

/* --------------------------------------------------------- tool-call bodies */

static const cJSON *param_schema(const cJSON *tools, const char *fname, const char *pname) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!fn) fn = t;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm) || strcmp(nm->valuestring, fname) != 0) continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
        return cJSON_GetObjectItemCaseSensitive(props, pname);
    }
    return NULL;
}

static int prefix_ci(const char *s, const char *pre) { return strncasecmp(s, pre, strlen(pre)) == 0; }

/* Python float(): optional whitespace around a decimal/exponent literal. */
static int py_float_parse(const char *s, double *v) {
    char *end;
    while (isspace((unsigned char)*s)) s++;
    if (!*s) return 0;
    *v = strtod(s, &end);
    if (end == s) return 0;
    while (isspace((unsigned char)*end)) end++;
    return *end == 0;
}

/* Converts a parameter's text by its JSON-schema type, like mlx-lm's
 * qwen3_coder._convert_param_value; where Python would raise (an integer
 * parameter holding "abc") the text is kept as a string. */
static cJSON *convert_value(const char *v, const cJSON *schema) {
    if (strcasecmp(v, "null") == 0) return cJSON_CreateNull();
    if (!cJSON_IsObject(schema) || !schema->child) return cJSON_CreateString(v); /* {} is falsy in mlx-lm too */
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(schema, "type");
    if (!ty) { /* no type: JSON objects/arrays are parsed, the rest stays text */
        cJSON *j = cJSON_Parse(v);
        if (cJSON_IsObject(j) || cJSON_IsArray(j)) return j;
        cJSON_Delete(j);
        return cJSON_CreateString(v);
    }
    /* a type list such as ["integer", "null"]: the first non-null type */
    if (cJSON_IsArray(ty)) {
        const cJSON *it, *pick = NULL;
        cJSON_ArrayForEach(it, ty) if (cJSON_IsString(it) && strcasecmp(it->valuestring, "null") != 0 && !pick) pick = it;
        ty = pick;
    }
    char t[64] = "";
    if (cJSON_IsString(ty)) {
        const char *s = ty->valuestring;
        while (isspace((unsigned char)*s)) s++;
        snprintf(t, sizeof t, "%s", s);
        size_t n = strlen(t);
        while (n && isspace((unsigned char)t[n - 1])) t[--n] = 0;
        for (size_t i = 0; i < n; i++) t[i] = (char)tolower((unsigned char)t[i]);
    }
    static const char *strings[] = {"string", "str", "text", "varchar", "char", "enum"};
    for (size_t i = 0; i < sizeof strings / sizeof *strings; i++)
        if (strcmp(t, strings[i]) == 0) return cJSON_CreateString(v);
    double d;
    if (prefix_ci(t, "int") || prefix_ci(t, "uint") || prefix_ci(t, "long") || prefix_ci(t, "short") ||
        prefix_ci(t, "unsigned")) {
        if (py_float_parse(v, &d) && isfinite(d) && d == trunc(d)) return cJSON_CreateNumber(d);
        return cJSON_CreateString(v);
    }
    if (prefix_ci(t, "num") || prefix_ci(t, "float")) {
        if (py_float_parse(v, &d) && isfinite(d)) return cJSON_CreateNumber(d);
        return cJSON_CreateString(v);
    }
    if (!strcmp(t, "boolean") || !strcmp(t, "bool") || !strcmp(t, "binary"))
        return cJSON_CreateBool(strcasecmp(v, "true") == 0);
    /* object/array/dict/list and unknown types: JSON, then Python literals */
    cJSON *j = cJSON_Parse(v);
    if (j) return j;
    if (!strcmp(v, "True")) return cJSON_CreateTrue();
    if (!strcmp(v, "False")) return cJSON_CreateFalse();
    if (!strcmp(v, "None")) return cJSON_CreateNull();
    return cJSON_CreateString(v);
}

/* `\s*([^\s<>]+)>?` at s: returns the name length and sets *after. A NUL ends the
 * name too (names and keys are C strings: "f\0g" would become an empty or cut name). */
static size_t scan_name(const char *s, size_t n, size_t *start, size_t *after) {
    size_t i = 0;
    while (i < n && isspace((unsigned char)s[i])) i++;
    size_t a = i;
    while (i < n && s[i] && !isspace((unsigned char)s[i]) && s[i] != '<' && s[i] != '>') i++;
    *start = a;
    size_t len = i - a;
    if (i < n && s[i] == '>') i++;
    *after = i;
    return len;
}

/* Parses "<function=NAME>...<parameter=K>\nV\n</parameter>...</function>" into
 * *name (malloc'd) and *args (cJSON object). Returns 0 or -1 if not a call. */
static int parse_block(const output_parser *p, const char *s, size_t n, char **name, cJSON **args) {
    const char *f = memfind(s, n, "<function=", 10);
    if (!f) return -1;
    const char *body = f + 10;
    size_t bn = n - (size_t)(body - s);
    /* the function body ends at the last </function> (lenient: or at the end) */
    const char *end = NULL;
    for (const char *q = body; (q = memfind(q, bn - (size_t)(q - body), "</function>", 11)); q++) end = q;
    if (end) bn = (size_t)(end - body);
    size_t ns, after;
    size_t nl = scan_name(body, bn, &ns, &after);
    if (!nl) return -1;
    *name = strndup(body + ns, nl);
    *args = cJSON_CreateObject();
    if (!*name || !*args) {
        free(*name);
        cJSON_Delete(*args);
        return -1;
    }
    const char *q = body + after, *lim = body + bn;
    for (;;) {
        const char *ps = memfind(q, (size_t)(lim - q), "<parameter=", 11);
        if (!ps) break;
        const char *vs = ps + 11;
        const char *pe = memfind(vs, (size_t)(lim - vs), "</parameter>", 12);
        if (!pe) break;
        size_t ks, kafter;
        size_t kl = scan_name(vs, (size_t)(pe - vs), &ks, &kafter);
        if (kl) {
            const char *v = vs + kafter;
            size_t vl = (size_t)(pe - v);
            if (vl && v[0] == '\n') { v++; vl--; }
            if (vl && v[vl - 1] == '\n') vl--;
            char *key = strndup(vs + ks, kl), *val = strndup(v, vl);
            if (key && val) {
                cJSON *cv = convert_value(val, param_schema(p->o.tools, *name, key));
                cJSON_DeleteItemFromObjectCaseSensitive(*args, key); /* a repeated key: the last wins */
                if (cv) cJSON_AddItemToObject(*args, key, cv);
            }
            free(key);
            free(val);
        }
        q = pe + 12;
    }
    return 0;
}

static int finish_tool(output_parser *p, const char *body, size_t n, output_event_fn fn, void *user) {
    char *name = NULL;
    cJSON *args = NULL;
    int rc;
    if (parse_block(p, body, n, &name, &args) == 0) {
        char *js = cJSON_PrintUnformatted(args);
        output_event ev = {.kind = OUT_TOOL_CALL, .index = p->ntools, .name = name, .arguments = js ? js : "{}"};
        p->ntools++;
        p->ws.len = 0; /* whitespace before the call is formatting */
        p->after_tool = 1;
        rc = fn(user, &ev);
        free(js);
        free(name);
        cJSON_Delete(args);
        return rc;
    }
    /* not a tool call: the block goes out as content, verbatim */
    buf b = {0};
    buf_puts(&b, TOOL_OPEN);
    buf_append(&b, body, n);
    buf_puts(&b, TOOL_CLOSE);
    rc = emit_content(p, b.data, b.len, fn, user);
    buf_free(&b);
    return rc;
}

/* ------------------------------------------------------------------ driver */

static int step(output_parser *p, int final, output_event_fn fn, void *user) {
    int rc = 0;
    for (;;) {
        buf *b = &p->pend;
        const char *s = b->data ? b->data : "";
        size_t n = b->len;
        switch (p->state) {
        case P_START: {
            size_t k = p->start_ws;
            while (k < n && is_ws(s[k])) k++;
            p->start_ws = k;
            size_t rest = n - k;
            if (rest >= 7 && memcmp(s + k, THINK_OPEN, 7) == 0) {
                consume(b, k + 7);
                p->state = P_REASON;
                continue;
            }
            if (!final && rest < 7 && memcmp(s + k, THINK_OPEN, rest) == 0) return 0; /* still undecided */
            p->state = P_CONTENT;
            continue;
        }
        case P_REASON: {
            const char *hit = memfind(s, n, THINK_CLOSE, 8);
            if (hit) {
                size_t i = (size_t)(hit - s);
                if ((rc = emit_reason(p, s, i, fn, user))) return rc;
                p->reason_nl = 0; /* newlines before </think> are dropped */
                consume(b, i + 8);
                p->state = P_CONTENT;
                p->strip_nl = 1;
                continue;
            }
            size_t keep = final ? 0 : partial_tag(s, n, THINK_CLOSE);
            rc = emit_reason(p, s, n - keep, fn, user);
            consume(b, n - keep);
            if (final && p->reason_nl && !rc) { /* no </think>: nothing is dropped */
                buf nl = {0};
                for (size_t i = 0; i < p->reason_nl; i++) buf_putc(&nl, '\n');
                rc = emit_text(p, OUT_REASONING, nl.data, nl.len, fn, user);
                buf_free(&nl);
                p->reason_nl = 0;
            }
            return rc;
        }
        case P_CONTENT: {
            if (p->strip_nl) {
                size_t k = 0;
                while (k < n && s[k] == '\n') k++;
                consume(b, k);
                s = b->data ? b->data : "";
                n = b->len;
                if (n) p->strip_nl = 0;
                else if (!final) return 0;
            }
            if (p->o.parse_tools) {
                const char *hit = memfind(s, n, TOOL_OPEN, 11);
                if (hit) {
                    size_t i = (size_t)(hit - s);
                    if ((rc = emit_content(p, s, i, fn, user))) return rc;
                    /* p->ws stays held: dropped if the block parses, emitted before it if not */
                    consume(b, i + 11);
                    p->tool.len = 0;
                    p->state = P_TOOL;
                    continue;
                }
            }
            size_t keep = (final || !p->o.parse_tools) ? 0 : partial_tag(s, n, TOOL_OPEN);
            rc = emit_content(p, s, n - keep, fn, user);
            consume(b, n - keep);
            if (final && !rc && p->ws.len && !p->after_tool) {
                rc = emit_text(p, OUT_CONTENT, p->ws.data, p->ws.len, fn, user);
                p->ws.len = 0;
            }
            return rc;
        }
        case P_TOOL: {
            size_t from = p->tool.len > 11 ? p->tool.len - 11 : 0;
            buf_append(&p->tool, s, n);
            b->len = 0;
            if (b->data) b->data[0] = 0;
            const char *t = p->tool.data ? p->tool.data : "";
            const char *hit = memfind(t + from, p->tool.len - from, TOOL_CLOSE, 12);
            if (hit) {
                size_t i = (size_t)(hit - t);
                buf_append(b, t + i + 12, p->tool.len - i - 12); /* the rest goes back to pend */
                p->tool.len = i;
                p->state = P_CONTENT;
                if ((rc = finish_tool(p, p->tool.data, i, fn, user))) return rc;
                p->tool.len = 0;
                continue;
            }
            if (final) { /* unterminated: verbatim as content */
                buf v = {0};
                buf_puts(&v, TOOL_OPEN);
                buf_append(&v, t, p->tool.len);
                p->tool.len = 0;
                p->state = P_CONTENT;
                p->after_tool = 0;
                rc = emit_content(p, v.data, v.len, fn, user);
                if (!rc && p->ws.len) rc = emit_text(p, OUT_CONTENT, p->ws.data, p->ws.len, fn, user);
                p->ws.len = 0;
                buf_free(&v);
            }
            return rc;
        }
        }
        return 0;
    }
}

int output_parser_feed(output_parser *p, const char *text, size_t len, output_event_fn fn, void *user) {
    buf_append(&p->pend, text, len);
    if (p->pend.oom) return ST_NOMEM;
    return step(p, 0, fn, user);
}

int output_parser_finish(output_parser *p, output_event_fn fn, void *user) { return step(p, 1, fn, user); }

/* --------------------------------------------------------- non-streaming */

typedef struct collect {
    buf reasoning, content;
    cJSON *calls;
} collect;

static int collect_fn(void *user, const output_event *ev) {
    collect *c = user;
    if (ev->kind == OUT_REASONING) buf_append(&c->reasoning, ev->text, ev->len);
    else if (ev->kind == OUT_CONTENT) buf_append(&c->content, ev->text, ev->len);
    else {
        cJSON *call = cJSON_CreateObject(), *fnj = cJSON_CreateObject();
        char id[32];
        snprintf(id, sizeof id, "call_%d", ev->index);
        cJSON_AddStringToObject(call, "id", id);
        cJSON_AddStringToObject(call, "type", "function");
        cJSON_AddStringToObject(fnj, "name", ev->name);
        cJSON_AddStringToObject(fnj, "arguments", ev->arguments);
        cJSON_AddItemToObject(call, "function", fnj);
        cJSON_AddItemToArray(c->calls, call);
    }
    return 0;
}

int output_parse_all(const output_parser_options *opt, const char *text, size_t len, char **reasoning,
                     char **content, cJSON **tool_calls, char *err, size_t errlen) {
    output_parser *p;
    int rc = output_parser_new(&p, opt, err, errlen);
    if (rc) return rc;
    collect c = {.calls = cJSON_CreateArray()};
    rc = output_parser_feed(p, text, len, collect_fn, &c);
    if (!rc) rc = output_parser_finish(p, collect_fn, &c);
    output_parser_free(p);
    buf_append(&c.reasoning, "", 0);
    buf_append(&c.content, "", 0);
    if (rc || !c.calls || c.reasoning.oom || c.content.oom) {
        buf_free(&c.reasoning);
        buf_free(&c.content);
        cJSON_Delete(c.calls);
        return errorf(err, errlen, ST_NOMEM, "out of memory");
    }
    *reasoning = c.reasoning.data;
    *content = c.content.data;
    *tool_calls = c.calls;
    return 0;
}
