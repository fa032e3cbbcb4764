/* tests/unit/test_text_parser.c — output parser unit tests, and the batch driver
 * for tests/python/test_parsers.py.
 *
 * No arguments: fixed cases, each fed whole and also one byte at a time (the
 * results must be identical), well-formed and malformed.
 * --parse-batch IN OUT: IN has one JSON object per line {"text": "...", "tools":
 * [...]|null, "opts": {"parse_reasoning", "start_in_reasoning", "parse_tools"},
 * "chunks": [n1, n2, ...] (piece sizes in bytes; the rest in one piece)}.
 * OUT gets {"reasoning": "...", "content": "...", "calls": [{"name", "arguments"}],
 * "events": N} per line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "runtime/status.h"
#include "text/output_parser.h"
#include "text/utf8.h"

typedef struct result {
    buf reasoning, content;
    cJSON *calls;
    int events;
    int last_kind, interleave_ok; /* reasoning never follows content */
} result;

static int on_event(void *user, const output_event *ev) {
    result *r = user;
    r->events++;
    if (ev->kind == OUT_REASONING) {
        if (r->content.len || cJSON_GetArraySize(r->calls)) r->interleave_ok = 0;
        buf_append(&r->reasoning, ev->text, ev->len);
    } else if (ev->kind == OUT_CONTENT) {
        buf_append(&r->content, ev->text, ev->len);
    } else {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "name", ev->name);
        cJSON_AddItemToObject(c, "arguments", cJSON_Parse(ev->arguments));
        cJSON_AddItemToArray(r->calls, c);
        if (ev->index != cJSON_GetArraySize(r->calls) - 1) r->interleave_ok = 0;
    }
    return 0;
}

/* Feeds text in pieces of the given sizes (then the rest), into r. */
static void run(const output_parser_options *o, const char *text, size_t n, const size_t *chunks, size_t nchunks,
                result *r) {
    memset(r, 0, sizeof *r);
    r->calls = cJSON_CreateArray();
    r->interleave_ok = 1;
    output_parser *p;
    char err[128];
    if (output_parser_new(&p, o, err, sizeof err)) return;
    size_t pos = 0;
    for (size_t i = 0; i < nchunks && pos < n; i++) {
        size_t k = chunks[i] < n - pos ? chunks[i] : n - pos;
        output_parser_feed(p, text + pos, k, on_event, r);
        pos += k;
    }
    if (pos < n) output_parser_feed(p, text + pos, n - pos, on_event, r);
    output_parser_finish(p, on_event, r);
    output_parser_free(p);
    buf_append(&r->reasoning, "", 0);
    buf_append(&r->content, "", 0);
}

static void result_free(result *r) {
    buf_free(&r->reasoning);
    buf_free(&r->content);
    cJSON_Delete(r->calls);
}

static int parse_batch(const char *in, const char *out) {
    FILE *fi = fopen(in, "rb"), *fo = fopen(out, "wb");
    if (!fi || !fo) return 2;
    char *line = NULL;
    size_t cap = 0;
    ssize_t ln;
    while ((ln = getline(&line, &cap, fi)) > 0) {
        cJSON *js = cJSON_ParseWithLength(line, (size_t)ln);
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(js, "opts");
        output_parser_options opt = output_parser_options_default();
        const cJSON *v;
        if ((v = cJSON_GetObjectItemCaseSensitive(o, "parse_reasoning"))) opt.parse_reasoning = cJSON_IsTrue(v);
        if ((v = cJSON_GetObjectItemCaseSensitive(o, "start_in_reasoning"))) opt.start_in_reasoning = cJSON_IsTrue(v);
        if ((v = cJSON_GetObjectItemCaseSensitive(o, "parse_tools"))) opt.parse_tools = cJSON_IsTrue(v);
        opt.tools = cJSON_GetObjectItemCaseSensitive(js, "tools");
        const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(js, "chunks");
        size_t nc = (size_t)cJSON_GetArraySize(chunks), k = 0;
        size_t *cs = calloc(nc + 1, sizeof *cs);
        cJSON_ArrayForEach(v, chunks) cs[k++] = (size_t)v->valueint;
        const char *text = cJSON_GetObjectItemCaseSensitive(js, "text")->valuestring;
        result r;
        run(&opt, text, strlen(text), cs, nc, &r);
        cJSON *res = cJSON_CreateObject();
        cJSON_AddStringToObject(res, "reasoning", r.reasoning.data);
        cJSON_AddStringToObject(res, "content", r.content.data);
        cJSON_AddItemToObject(res, "calls", r.calls);
        r.calls = NULL;
        cJSON_AddNumberToObject(res, "events", r.events);
        cJSON_AddBoolToObject(res, "order_ok", r.interleave_ok);
        char *p = cJSON_PrintUnformatted(res);
        fprintf(fo, "%s\n", p);
        free(p);
        cJSON_Delete(res);
        result_free(&r);
        free(cs);
        cJSON_Delete(js);
    }
    free(line);
    fclose(fi);
    fclose(fo);
    return 0;
}

/* Runs one case whole and byte by byte; both must give want_*. calls_json is the
 * expected [{"name","arguments"}] array (NULL: none). */
static void expect(int start_in_reasoning, const char *tools_json, const char *text, const char *want_reasoning,
                   const char *want_content, const char *calls_json) {
    output_parser_options o = output_parser_options_default();
    o.start_in_reasoning = start_in_reasoning;
    cJSON *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    o.tools = tools;
    cJSON *want_calls = cJSON_Parse(calls_json ? calls_json : "[]");
    size_t n = strlen(text);
    size_t *ones = malloc((n + 1) * sizeof *ones);
    for (size_t i = 0; i <= n; i++) ones[i] = 1;
    for (int mode = 0; mode < 2; mode++) {
        result r;
        run(&o, text, n, mode ? ones : NULL, mode ? n : 0, &r);
        const char *how = mode ? "byte by byte" : "whole";
        CHECK(strcmp(r.reasoning.data, want_reasoning) == 0, "%s: reasoning [%s] want [%s] for [%s]", how,
              r.reasoning.data, want_reasoning, text);
        CHECK(strcmp(r.content.data, want_content) == 0, "%s: content [%s] want [%s] for [%s]", how, r.content.data,
              want_content, text);
        char *got = cJSON_PrintUnformatted(r.calls);
        CHECK(cJSON_Compare(r.calls, want_calls, 1), "%s: calls %s want %s", how, got, calls_json ? calls_json : "[]");
        free(got);
        result_free(&r);
    }
    free(ones);
    cJSON_Delete(want_calls);
    cJSON_Delete(tools);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--parse-batch") == 0) return parse_batch(argv[2], argv[3]);

    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
                        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
                        "\"temp\":{\"type\":\"number\"},\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":"
                        "\"object\"},\"tags\":{\"type\":\"array\"},\"any\":{\"description\":\"x\"}}}}}]";
    /* thinking on: the prompt opened <think> */
    expect(1, NULL, "\nLet me think.\n\n</think>\n\nThe answer is 4.", "Let me think.", "The answer is 4.", NULL);
    expect(1, NULL, "no close tag, all reasoning\n", "no close tag, all reasoning\n", "", NULL);
    /* thinking off / unknown: a leading <think> opens reasoning */
    expect(0, NULL, "<think>\nr\n</think>\n\nc", "r", "c", NULL);
    expect(0, NULL, "  plain answer  ", "", "  plain answer  ", NULL);
    expect(0, NULL, "a <think> in the middle stays </think> content", "", "a <think> in the middle stays </think> content",
           NULL);
    /* tag look-alikes are never lost */
    expect(0, NULL, "x < y and <tool and <tool_cal>> and </tool_call> <", "", "x < y and <tool and <tool_cal>> and </tool_call> <",
           NULL);
    expect(1, NULL, "a </thin b </think>", "a </thin b ", "", NULL);
    expect(0, NULL, "<thin", "", "<thin", NULL);
    /* a well-formed call, typed by the schema */
    expect(1, tools,
           "plan\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
           "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=temp>\n21.5\n</parameter>\n<parameter=metric>\n"
           "True\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"x\"]\n</parameter>\n"
           "<parameter=any>\n{\"k\": 1}\n</parameter>\n<parameter=extra>\n42\n</parameter>\n</function>\n</tool_call>",
           "plan", "Let me check.",
           "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":3,\"temp\":21.5,\"metric\":true,"
           "\"opts\":{\"a\":[1,2]},\"tags\":[\"x\"],\"any\":{\"k\":1},\"extra\":\"42\"}}]");
    /* two calls; null; multi-line string value; integer that is not one stays text */
    expect(0, tools,
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n<parameter=days>\nnull\n"
           "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=days>\n2.5\n"
           "</parameter>\n</function>\n</tool_call>",
           "", "",
           "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"New\\nYork\",\"days\":null}},"
           "{\"name\":\"get_weather\",\"arguments\":{\"days\":\"2.5\"}}]");
    /* malformed: no function -> verbatim content; unterminated -> verbatim at finish */
    expect(0, tools, "see <tool_call>oops</tool_call> end", "", "see <tool_call>oops</tool_call> end", NULL);
    expect(0, tools, "before\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
           "", "before\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", NULL);
    /* unknown tool: values stay strings; missing </function> tolerated */
    expect(0, NULL, "<tool_call><function=f><parameter=a>1</parameter></tool_call>", "", "",
           "[{\"name\":\"f\",\"arguments\":{\"a\":\"1\"}}]");
    /* parse_tools off: everything is content */
    {
        output_parser_options o = output_parser_options_default();
        o.parse_tools = 0;
        o.parse_reasoning = 0;
        result r;
        const char *t = "<think>x</think><tool_call><function=f></function></tool_call>";
        run(&o, t, strlen(t), NULL, 0, &r);
        CHECK(strcmp(r.content.data, t) == 0 && r.reasoning.len == 0, "all content: %s", r.content.data);
        result_free(&r);
    }
    /* a NUL where the function name should be: not a call (was one with an empty name; fuzz) */
    {
        output_parser_options o = output_parser_options_default();
        result r;
        const char t[] = "<tool_call>\n<function=\0f>\n</function>\n</tool_call>";
        run(&o, t, sizeof t - 1, NULL, 0, &r);
        CHECK(cJSON_GetArraySize(r.calls) == 0 && r.content.len == sizeof t - 1 && !memcmp(r.content.data, t, sizeof t - 1),
              "NUL name: %d calls", cJSON_GetArraySize(r.calls));
        result_free(&r);
    }
    /* 256 KiB of leading whitespace fed in small pieces: linear, not rescanned per piece
     * (was quadratic: minutes; fuzz timeout) */
    {
        output_parser_options o = output_parser_options_default();
        size_t n = 256 << 10;
        char *t = malloc(n + 1);
        for (size_t i = 0; i < n; i++) t[i] = i % 2 ? ' ' : '\n';
        t[n] = 'x';
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        output_parser *p;
        char err[64];
        result r;
        memset(&r, 0, sizeof r);
        r.calls = cJSON_CreateArray();
        output_parser_new(&p, &o, err, sizeof err);
        for (size_t i = 0; i <= n; i += 3) output_parser_feed(p, t + i, i + 3 <= n + 1 ? 3 : n + 1 - i, on_event, &r);
        output_parser_finish(p, on_event, &r);
        output_parser_free(p);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        CHECK(r.content.len == n + 1 && r.reasoning.len == 0, "leading whitespace kept as content (%zu)", r.content.len);
        CHECK(s < 1.0, "leading whitespace took %.2f s", s);
        result_free(&r);
        free(t);
    }
    /* non-streaming helper */
    {
        output_parser_options o = output_parser_options_default();
        o.start_in_reasoning = 1;
        char *rs, *cs, err[64];
        cJSON *calls;
        const char *t = "r</think>\n\nhi<tool_call>\n<function=f>\n</function>\n</tool_call>";
        int rc = output_parse_all(&o, t, strlen(t), &rs, &cs, &calls, err, sizeof err);
        CHECK(rc == 0 && !strcmp(rs, "r") && !strcmp(cs, "hi") && cJSON_GetArraySize(calls) == 1, "parse_all");
        const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
        CHECK(!strcmp(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{}") &&
                  !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "id")->valuestring, "call_0"),
              "parse_all call form");
        free(rs);
        free(cs);
        cJSON_Delete(calls);
    }
    return check_summary();
}
