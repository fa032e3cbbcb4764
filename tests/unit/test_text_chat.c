/* tests/unit/test_text_chat.c — chat template unit tests, and the batch driver for
 * tests/python/test_chat_template.py.
 *
 * No arguments: fixed expectations (single turn, thinking on/off, template
 * errors, history reasoning dropped/preserved, tool calls, tool results).
 * --render-batch IN OUT: IN has one JSON object per line {"messages": [...],
 * "tools": [...]|null, "opts": {"add_generation_prompt": 0|1, "enable_thinking":
 * -1|0|1, "preserve_thinking": -1|0|1, "add_vision_id": 0|1, "arguments_json": 0|1}};
 * OUT gets one JSON object per line: {"text": "..."} or {"error": "..."}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "runtime/status.h"
#include "text/chat.h"

static int opt_int(const cJSON *o, const char *k, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valueint : def;
}

static int render_batch(const char *in, const char *out) {
    FILE *fi = fopen(in, "rb"), *fo = fopen(out, "wb");
    if (!fi || !fo) return 2;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, fi)) > 0) {
        cJSON *js = cJSON_ParseWithLength(line, (size_t)n);
        if (!js) return 2;
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(js, "opts");
        chat_options opt = chat_options_default();
        opt.add_generation_prompt = opt_int(o, "add_generation_prompt", 1);
        opt.enable_thinking = opt_int(o, "enable_thinking", -1);
        opt.preserve_thinking = opt_int(o, "preserve_thinking", -1);
        opt.add_vision_id = opt_int(o, "add_vision_id", 0);
        opt.arguments_json = opt_int(o, "arguments_json", 0);
        char err[512] = "", *text = NULL;
        int rc = chat_render(NULL, cJSON_GetObjectItemCaseSensitive(js, "messages"),
                             cJSON_GetObjectItemCaseSensitive(js, "tools"), &opt, &text, err, sizeof err);
        cJSON *res = cJSON_CreateObject();
        if (rc) cJSON_AddStringToObject(res, "error", err);
        else cJSON_AddStringToObject(res, "text", text);
        char *p = cJSON_PrintUnformatted(res);
        fprintf(fo, "%s\n", p);
        free(p);
        free(text);
        cJSON_Delete(res);
        cJSON_Delete(js);
    }
    free(line);
    fclose(fi);
    fclose(fo);
    return 0;
}

/* Renders JSON messages (and tools) and compares with want (or with an error message). */
static void expect(const char *messages, const char *tools, int thinking, int preserve, const char *want,
                   const char *want_err) {
    cJSON *m = cJSON_Parse(messages), *t = tools ? cJSON_Parse(tools) : NULL;
    chat_options o = chat_options_default();
    o.enable_thinking = thinking;
    o.preserve_thinking = preserve;
    char err[256] = "", *out = NULL;
    int rc = chat_render(NULL, m, t, &o, &out, err, sizeof err);
    if (want_err) {
        CHECK(rc == ST_INVALID && strcmp(err, want_err) == 0, "want error %s, got rc %d %s", want_err, rc, err);
    } else {
        CHECK(rc == 0 && strcmp(out, want) == 0, "render %s\n got: [%s]\nwant: [%s] %s", messages,
              out ? out : "", want, err);
    }
    free(out);
    cJSON_Delete(m);
    cJSON_Delete(t);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--render-batch") == 0) return render_batch(argv[2], argv[3]);

    expect("[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, -1, -1,
           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n", NULL);
    expect("[{\"role\":\"user\",\"content\":\"  Hi \\n\"}]", NULL, 0, -1,
           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", NULL);
    expect("[{\"role\":\"system\",\"content\":\"\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
           "{\"type\":\"image\"},{\"type\":\"text\",\"text\":\"b\"}]}]",
           NULL, 1, -1,
           "<|im_start|>system\n<|im_end|>\n<|im_start|>user\na<|vision_start|><|image_pad|><|vision_end|>b<|im_end|>\n"
           "<|im_start|>assistant\n<think>\n",
           NULL);
    /* history reasoning: dropped before the last user query unless preserve_thinking */
    const char *hist = "[{\"role\":\"user\",\"content\":\"q1\"},{\"role\":\"assistant\",\"content\":\"a1\","
                       "\"reasoning_content\":\"r1\"},{\"role\":\"user\",\"content\":\"q2\"},"
                       "{\"role\":\"assistant\",\"content\":\"<think>\\nr2\\n</think>\\n\\na2\"}]";
    expect(hist, NULL, -1, -1,
           "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
           "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n<|im_start|>assistant\n<think>\n",
           NULL);
    expect(hist, NULL, -1, 1,
           "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>\n"
           "<|im_start|>user\nq2<|im_end|>\n"
           "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n<|im_start|>assistant\n<think>\n",
           NULL);
    /* tool call (arguments as a JSON string, the OpenAI wire form) and tool results */
    expect("[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
           "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\","
           "\\\"n\\\":2,\\\"x\\\":[1,true],\\\"ok\\\":false,\\\"f\\\":0.5}\"}}]},"
           "{\"role\":\"tool\",\"content\":\"sunny\"},{\"role\":\"tool\",\"content\":\"warm\"}]",
           NULL, -1, -1,
           "<|im_start|>user\nw?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=get>\n"
           "<parameter=city>\nParis\n</parameter>\n<parameter=n>\n2\n</parameter>\n<parameter=x>\n[1, true]\n"
           "</parameter>\n<parameter=ok>\nFalse\n</parameter>\n<parameter=f>\n0.5\n</parameter>\n</function>\n"
           "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n"
           "warm\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n",
           NULL);
    expect("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"s\"}]", NULL, -1, -1, NULL,
           "System message must be at the beginning.");
    expect("[{\"role\":\"system\",\"content\":\"s\"}]", NULL, -1, -1, NULL, "No user query found in messages.");
    expect("[]", NULL, -1, -1, NULL, "No messages provided.");
    expect("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"bot\",\"content\":\"s\"}]", NULL, -1, -1, NULL,
           "Unexpected message role.");
    expect("[{\"role\":\"user\",\"content\":5}]", NULL, -1, -1, NULL, "Unexpected content type.");
    expect("[{\"role\":\"system\",\"content\":[{\"type\":\"image\"}]},{\"role\":\"user\",\"content\":\"a\"}]", NULL,
           -1, -1, NULL, "System message cannot contain images.");
    /* tools block */
    {
        cJSON *m = cJSON_Parse("[{\"role\":\"user\",\"content\":\"x\"}]");
        cJSON *t = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d é\\n\","
                               "\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]");
        chat_options o = chat_options_default();
        char err[256], *out = NULL;
        int rc = chat_render(NULL, m, t, &o, &out, err, sizeof err);
        CHECK(rc == 0, "tools render: %s", err);
        CHECK(out && strstr(out, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": "
                                 "\"d é\\n\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>"),
              "tojson form: %s", out ? out : "");
        CHECK(out && strstr(out, "</IMPORTANT><|im_end|>\n<|im_start|>user\nx<|im_end|>\n"), "tools tail");
        free(out);
        cJSON_Delete(m);
        cJSON_Delete(t);
    }
    CHECK(!chat_template_supported(NULL) && !chat_template_supported("{{ messages }}"), "template check");
    /* 50,000 tool results after the query: linear (finding the last user query walked the
     * list per message: quadratic, seconds; fuzz timeout) */
    {
        cJSON *m = cJSON_CreateArray();
        cJSON *u = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddStringToObject(u, "content", "q");
        cJSON_AddItemToArray(m, u);
        for (int i = 0; i < 50000; i++) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddStringToObject(t, "role", "tool");
            cJSON_AddStringToObject(t, "content", "r");
            cJSON_AddItemToArray(m, t);
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        char *out = NULL, err[256];
        int rc = chat_render(NULL, m, NULL, NULL, &out, err, sizeof err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        CHECK(rc == 0 && out && !strncmp(out, "<|im_start|>user\nq<|im_end|>\n<|im_start|>user\n<tool_response>", 60),
              "many tool results: %s", rc ? err : "wrong start");
        CHECK(secs < 1.0, "many tool results took %.2f s", secs);
        free(out);
        cJSON_Delete(m);
    }
    return check_summary();
}
