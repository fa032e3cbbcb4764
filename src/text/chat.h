/* text/chat.h — the Qwen3.6 chat template, rendered natively in C.
 *
 * The model ships one fixed Jinja template (chat_template.jinja; reference/
 * MODEL.md §5). chat_render reproduces transformers' Jinja rendering of that
 * template byte for byte (proven by tests/python/test_chat_template.py on
 * generated conversations), without a Jinja interpreter: messages, tools and
 * options in, prompt text out.
 *
 * Inputs are the OpenAI request JSON as cJSON:
 *   messages: array of {role: system|user|assistant|tool, content: string |
 *             [{type:"text",text}|{type:"image"...}|{type:"video"...}] | null,
 *             reasoning_content?: string, tool_calls?: [{function:{name,
 *             arguments: object | JSON string}}]}
 *   tools:    array of tool objects (rendered with Python-json `tojson`
 *             formatting), or NULL / empty array for none.
 * Template errors ("System message must be at the beginning.", "No user query
 * found in messages.", "Unexpected message role.", ...) return ST_INVALID with
 * the template's own message in err.
 *
 * Value formatting follows Python/Jinja: `tojson` is json.dumps(ensure_ascii=
 * False) with ", " / ": " separators, other values print as Python str()
 * (True, None, 1.5). One known gap: cJSON does not keep a number's spelling,
 * so an integral float written as 3.0 prints as 3 (Python would print 3.0). 
 */
#ifndef ORCHID_TEXT_CHAT_H
#define ORCHID_TEXT_CHAT_H

#include <stddef.h>

#include <cjson/cJSON.h>

struct tokenizer;

typedef struct chat_options {
    int add_generation_prompt; /* 1: end with "<|im_start|>assistant\n" + think prefix */
    int enable_thinking;       /* -1: undefined (template default: thinking on), 0: off, 1: on */
    int preserve_thinking;     /* -1/0: drop reasoning of turns before the last user query; 1: keep */
    int add_vision_id;         /* 1: prefix images/videos with "Picture N: " / "Video N: " */
    int arguments_json;        /* 1: an assistant tool call whose `arguments` is a JSON string
                                  (the OpenAI wire form) is rendered as the object it parses to;
                                  0: as the template does, only object arguments are rendered */
} chat_options;

/* Defaults: add_generation_prompt 1, enable_thinking -1, preserve_thinking -1, add_vision_id 0,
 * arguments_json 1. */
chat_options chat_options_default(void);

/* Renders the conversation with the built-in Qwen3.6 template. tok may be
 * NULL and is not consulted for rendering (the template is fixed); callers
 * that load a checkpoint should check chat_template_supported() on
 * tokenizer_chat_template(tok) once at start-up and warn if it differs.
 * *out is malloc'd, NUL-terminated. */
int chat_render(const struct tokenizer *tok, const cJSON *messages, const cJSON *tools,
                const chat_options *opt, char **out, char *err, size_t errlen);

/* 1 if `template_text` is the template chat_render implements (compared
 * ignoring trailing whitespace), 0 otherwise (including NULL). */
int chat_template_supported(const char *template_text);

#endif
