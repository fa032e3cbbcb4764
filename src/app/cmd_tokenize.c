/* app/cmd_tokenize.c — `orchid tokenize` and `orchid detokenize`: the tokenizer
 * and chat template from the command line, for checking prompts by hand and for
 * scripts.
 *
 *   orchid tokenize --model DIR (--text STR | --messages JSON [--thinking on|off]) [--tokenizer FILE]
 *       prints the ids, space-separated, on one line. --messages takes a JSON
 *       array of chat messages, or {"messages": [...], "tools": [...]}, inline or
 *       as @FILE; it is rendered with the chat template (generation prompt
 *       added) and then encoded.
 *   orchid detokenize --model DIR --ids 1,2,3 [--skip-special] [--tokenizer FILE]
 *       prints the decoded text followed by a newline.
 * --tokenizer names a tokenizer.json (or a directory holding one) that overrides
 * the one in --model DIR.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "app/cli.h"
#include "app/commands.h"
#include "runtime/fileio.h"
#include "text/chat.h"
#include "text/tokenizer.h"

/* Loads the tokenizer from --tokenizer, else --model. Prints the error. */
static tokenizer *open_tokenizer(const char *cmd, const char *model, const char *tok_path) {
    char err[1024];
    tokenizer *tok;
    if (tokenizer_load(&tok, tok_path ? tok_path : model, err, sizeof err) != 0) {
        fprintf(stderr, "orchid %s: %s\n", cmd, err);
        return NULL;
    }
    return tok;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *tok_path = NULL, *text = NULL, *messages = NULL, *thinking = NULL;
    static const char usage[] =
        "usage: orchid tokenize --model DIR (--text STR | --messages JSON|@FILE [--thinking on|off]) [--tokenizer FILE]";
    for (int i = 1; i < argc; i++) {
        const char **dst = NULL;
        if (!strcmp(argv[i], "--model")) dst = &model;
        else if (!strcmp(argv[i], "--tokenizer")) dst = &tok_path;
        else if (!strcmp(argv[i], "--text")) dst = &text;
        else if (!strcmp(argv[i], "--messages")) dst = &messages;
        else if (!strcmp(argv[i], "--thinking")) dst = &thinking;
        else if (!strcmp(argv[i], "--help")) {
            printf("%s\n", usage);
            return 0;
        } else {
            return cli_usage_error("tokenize", "unknown flag \"%s\" (%s)", argv[i], usage);
        }
        const char *flag = argv[i];
        if (!(*dst = cli_value(argc, argv, &i))) return cli_usage_error("tokenize", "%s needs a value", flag);
    }
    if (!model && !tok_path) return cli_usage_error("tokenize", "--model DIR (or --tokenizer FILE) is required");
    if (model && !tok_path && !cli_is_dir(model)) return cli_usage_error("tokenize", "%s: not a directory", model);
    if (!text == !messages) return cli_usage_error("tokenize", "give exactly one of --text and --messages");
    if (thinking && strcmp(thinking, "on") && strcmp(thinking, "off"))
        return cli_usage_error("tokenize", "--thinking must be on or off");
    if (thinking && !messages) return cli_usage_error("tokenize", "--thinking only applies to --messages");

    char *owned_json = NULL, *prompt = NULL;
    cJSON *js = NULL;
    if (messages) {
        if (messages[0] == '@') {
            char rerr[512];
            if (file_read_all(messages + 1, 64u << 20, &owned_json, NULL, rerr, sizeof rerr) != 0)
                return cli_usage_error("tokenize", "%s", rerr);
            messages = owned_json;
        }
        js = cJSON_Parse(messages);
        if (!js || !(cJSON_IsArray(js) || cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(js, "messages")))) {
            free(owned_json);
            cJSON_Delete(js);
            return cli_usage_error("tokenize", "--messages must be a JSON array of messages or {\"messages\": [...]}");
        }
    }
    tokenizer *tok = open_tokenizer("tokenize", model, tok_path);
    if (!tok) {
        free(owned_json);
        cJSON_Delete(js);
        return 1;
    }
    char err[1024];
    int rc = 0;
    if (js) {
        const cJSON *msgs = cJSON_IsArray(js) ? js : cJSON_GetObjectItemCaseSensitive(js, "messages");
        const cJSON *tools = cJSON_IsArray(js) ? NULL : cJSON_GetObjectItemCaseSensitive(js, "tools");
        chat_options o = chat_options_default();
        if (thinking) o.enable_thinking = !strcmp(thinking, "on");
        if ((rc = chat_render(tok, msgs, tools, &o, &prompt, err, sizeof err)) != 0)
            fprintf(stderr, "orchid tokenize: chat template: %s\n", err);
        text = prompt;
    }
    if (!rc) {
        int32_t *ids;
        size_t n;
        if ((rc = tokenizer_encode(tok, text, strlen(text), &ids, &n, err, sizeof err)) != 0) {
            fprintf(stderr, "orchid tokenize: %s\n", err);
        } else {
            for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
            free(ids);
        }
    }
    free(prompt);
    free(owned_json);
    cJSON_Delete(js);
    tokenizer_free(tok);
    return rc ? 1 : 0;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *tok_path = NULL, *ids_s = NULL;
    int skip = 0;
    static const char usage[] = "usage: orchid detokenize --model DIR --ids 1,2,3 [--skip-special] [--tokenizer FILE]";
    for (int i = 1; i < argc; i++) {
        const char **dst = NULL;
        if (!strcmp(argv[i], "--model")) dst = &model;
        else if (!strcmp(argv[i], "--tokenizer")) dst = &tok_path;
        else if (!strcmp(argv[i], "--ids")) dst = &ids_s;
        else if (!strcmp(argv[i], "--skip-special")) {
            skip = 1;
            continue;
        } else if (!strcmp(argv[i], "--help")) {
            printf("%s\n", usage);
            return 0;
        } else {
            return cli_usage_error("detokenize", "unknown flag \"%s\" (%s)", argv[i], usage);
        }
        const char *flag = argv[i];
        if (!(*dst = cli_value(argc, argv, &i))) return cli_usage_error("detokenize", "%s needs a value", flag);
    }
    if (!model && !tok_path) return cli_usage_error("detokenize", "--model DIR (or --tokenizer FILE) is required");
    if (model && !tok_path && !cli_is_dir(model)) return cli_usage_error("detokenize", "%s: not a directory", model);
    if (!ids_s) return cli_usage_error("detokenize", "--ids 1,2,3 is required");
    int32_t *ids;
    size_t n;
    if (!cli_parse_ids(ids_s, &ids, &n)) return cli_usage_error("detokenize", "--ids: expected comma-separated ids");
    tokenizer *tok = open_tokenizer("detokenize", model, tok_path);
    if (!tok) {
        free(ids);
        return 1;
    }
    char err[512], *text;
    size_t len;
    int rc = tokenizer_decode(tok, ids, n, skip, &text, &len, err, sizeof err);
    if (rc) {
        fprintf(stderr, "orchid detokenize: %s\n", err);
    } else {
        fwrite(text, 1, len, stdout);
        fputc('\n', stdout);
        free(text);
    }
    free(ids);
    tokenizer_free(tok);
    return rc ? 1 : 0;
}
