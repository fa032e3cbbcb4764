/* tests/fuzz/fuzz_output_parser.c — libFuzzer target: arbitrary generated text through
 * the incremental reasoning / tool-call parser (text/output_parser.h).
 *
 * Input: byte 0 picks the options (parse_reasoning, start_in_reasoning, parse_tools,
 * tools given or not), byte 1 seeds the chunking, the rest is the text. The text is
 * parsed three ways: output_parse_all (one piece), fed in pseudo-random chunks of
 * 1..64 bytes (splitting UTF-8 and tags anywhere), and one byte at a time.
 * Invariants:
 *   - the three runs give the same reasoning, content and tool calls;
 *   - nothing is lost: apart from whitespace, the input equals reasoning + content
 *     in event order, where the documented drops are allowed — the opening "<think>"
 *     (at the start), the first "</think>" where reasoning ends, and each parsed tool
 *     call stands for one whole "<tool_call>...</tool_call>" block that names it;
 *   - tool calls are numbered 0, 1, ... and their arguments are JSON objects;
 *     output_parser_tool_calls counts them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/output_parser.h"
#include "text/utf8.h"

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"temp\":{\"type\":\"number\"},"
    "\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},\"list\":{\"type\":\"array\"},"
    "\"maybe\":{\"type\":[\"integer\",\"null\"]},\"any\":{}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{\"x\":{\"description\":\"no type\"}}}}}]";

/* One run's result. `acc` is the accounting stream: reasoning and content bytes in event
 * order without whitespace; call_at[k] its length when tool call k came, call_name[k]
 * its name; `reason_end` its length when the first non-reasoning event came (or at
 * finish). */
#define MAX_CALLS 4096
struct run {
    buf reasoning, content, calls, acc;
    size_t reason_end;
    int saw_other, ncalls, bad;
    size_t call_at[MAX_CALLS];
    char *call_name[MAX_CALLS];
};

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static void acc_text(struct run *r, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_ws(s[i])) buf_putc(&r->acc, s[i]);
}

static int on_event(void *user, const output_event *ev) {
    struct run *r = user;
    if (ev->kind != OUT_REASONING && !r->saw_other) {
        r->saw_other = 1;
        r->reason_end = r->acc.len;
    }
    if (ev->kind == OUT_REASONING) {
        if (r->saw_other) r->bad = 1; /* reasoning after content: out of contract */
        buf_append(&r->reasoning, ev->text, ev->len);
        acc_text(r, ev->text, ev->len);
    } else if (ev->kind == OUT_CONTENT) {
        buf_append(&r->content, ev->text, ev->len);
        acc_text(r, ev->text, ev->len);
    } else if (ev->kind == OUT_TOOL_CALL) {
        if (ev->index != r->ncalls || !ev->name || !ev->name[0] || !ev->arguments) r->bad = 1;
        cJSON *a = ev->arguments ? cJSON_Parse(ev->arguments) : NULL;
        if (!cJSON_IsObject(a)) r->bad = 1;
        cJSON_Delete(a);
        if (r->ncalls < MAX_CALLS) {
            r->call_at[r->ncalls] = r->acc.len;
            r->call_name[r->ncalls] = strdup(ev->name ? ev->name : "");
        }
        r->ncalls++;
        buf_printf(&r->calls, "%d\x02%s\x02%s\x03", ev->index, ev->name ? ev->name : "", ev->arguments ? ev->arguments : "");
    } else {
        r->bad = 1;
    }
    return 0;
}

static void run_free(struct run *r) {
    buf_free(&r->reasoning);
    buf_free(&r->content);
    buf_free(&r->calls);
    buf_free(&r->acc);
    for (int k = 0; k < r->ncalls && k < MAX_CALLS; k++) free(r->call_name[k]);
}

static int same(const buf *a, const buf *b) {
    return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

/* Feeds text in chunks: chunk == 0 pseudo-random 1..64 bytes from seed, else fixed size. */
static void run_chunked(const output_parser_options *o, const char *s, size_t n, unsigned seed, size_t chunk,
                        struct run *r) {
    output_parser *p;
    char err[256];
    if (output_parser_new(&p, o, err, sizeof err)) abort();
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n;) {
        size_t k = chunk;
        if (!k) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            k = 1 + x % 64;
        }
        if (k > n - i) k = n - i;
        if (output_parser_feed(p, s + i, k, on_event, r)) abort();
        i += k;
    }
    if (output_parser_finish(p, on_event, r)) abort();
    if (!r->saw_other) r->reason_end = r->acc.len;
    if (output_parser_tool_calls(p) != r->ncalls) abort();
    output_parser_free(p);
}

static const char *find(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(s + i, needle, k) == 0) return s + i;
    return NULL;
}

/* The nothing-lost check of one run: walks the input skipping whitespace; tags and
 * tool-call blocks must be contiguous in the input itself. */
static void check_accounting(const output_parser_options *o, const char *in, size_t n, const struct run *r) {
    const char *a = r->acc.data ? r->acc.data : "";
    size_t an = r->acc.len, i = 0, j = 0;
    int k = 0, reasoning = o->parse_reasoning && o->start_in_reasoning, closed = 0;
    while (i < n && is_ws(in[i])) i++;
    if (o->parse_reasoning && !o->start_in_reasoning && n - i >= 7 && !memcmp(in + i, "<think>", 7)) {
        i += 7;
        reasoning = 1;
    }
    for (;;) {
        while (i < n && is_ws(in[i])) i++;
        if (reasoning && !closed && j == r->reason_end && n - i >= 8 && !memcmp(in + i, "</think>", 8)) {
            i += 8;
            closed = 1;
            continue;
        }
        if (k < r->ncalls && k < MAX_CALLS && r->call_at[k] == j) { /* one whole block naming it */
            const char *name = r->call_name[k];
            size_t nl = strlen(name);
            if (n - i < 11 || memcmp(in + i, "<tool_call>", 11)) abort();
            const char *close = find(in + i + 11, n - i - 11, "</tool_call>");
            if (!close) abort();
            const char *f = find(in + i, (size_t)(close - (in + i)), "<function=");
            if (!f) abort();
            f += 10;
            while (f < close && strchr(" \t\n\r\v\f", *f) && *f) f++;
            if ((size_t)(close - f) < nl || memcmp(f, name, nl)) abort();
            i = (size_t)(close - in) + 12;
            k++;
            continue;
        }
        if (j == an) break;
        if (i >= n || in[i] != a[j]) abort();
        i++, j++;
    }
    if (i != n || k != (r->ncalls < MAX_CALLS ? r->ncalls : MAX_CALLS)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    static cJSON *tools;
    if (!tools && !(tools = cJSON_Parse(TOOLS))) abort();
    output_parser_options o = output_parser_options_default();
    o.parse_reasoning = data[0] & 1;
    o.start_in_reasoning = (data[0] >> 1) & 1;
    o.parse_tools = !((data[0] >> 2) & 1);
    o.tools = (data[0] >> 3) & 1 ? NULL : tools;
    unsigned seed = data[1];
    const char *s = (const char *)data + 2;
    size_t n = size - 2;

    static struct run whole, chunked, bytes; /* big: call tables */
    memset(&whole, 0, sizeof whole), memset(&chunked, 0, sizeof chunked), memset(&bytes, 0, sizeof bytes);
    run_chunked(&o, s, n, seed, n ? n : 1, &whole);
    run_chunked(&o, s, n, seed, 0, &chunked);
    if (n <= 4096) run_chunked(&o, s, n, seed, 1, &bytes);

    char *reasoning, *content, err[256];
    cJSON *calls;
    if (output_parse_all(&o, s, n, &reasoning, &content, &calls, err, sizeof err)) abort();
    /* (its strings are NUL-terminated: compared only for NUL-free text) */
    if (!memchr(s, 0, n) && (strlen(reasoning) != whole.reasoning.len || memcmp(reasoning, whole.reasoning.data ? whole.reasoning.data : "", whole.reasoning.len) ||
        strlen(content) != whole.content.len || memcmp(content, whole.content.data ? whole.content.data : "", whole.content.len) ||
        cJSON_GetArraySize(calls) != whole.ncalls))
        abort();
    free(reasoning);
    free(content);
    cJSON_Delete(calls);

    if (whole.bad || chunked.bad || bytes.bad) abort();
    if (!same(&whole.reasoning, &chunked.reasoning) || !same(&whole.content, &chunked.content) ||
        !same(&whole.calls, &chunked.calls))
        abort();
    if (n <= 4096 && (!same(&whole.reasoning, &bytes.reasoning) || !same(&whole.content, &bytes.content) ||
                      !same(&whole.calls, &bytes.calls)))
        abort();

    check_accounting(&o, s, n, &whole);

    run_free(&whole);
    run_free(&chunked);
    run_free(&bytes);
    return 0;
}
