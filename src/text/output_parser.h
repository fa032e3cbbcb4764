/* text/output_parser.h — incremental parsing of the model's generated text into
 * OpenAI response parts: reasoning, content and tool calls.
 *
 * The model writes   [<think>] reasoning </think> content
 * and, for tools,    <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n
 *                    ...</function>\n</tool_call>
 * Text arrives piece by piece (each piece is what the streaming detokenizer
 * emitted, i.e. whole UTF-8 characters). The parser holds back only the bytes
 * that could still be the start of a tag ("<", "</thi", "<tool_c" ...) and
 * releases them as ordinary text as soon as they cannot be; nothing is ever
 * lost: a tag-like string that turns out not to be a tag is emitted as text,
 * and a tool call that never closes (or cannot be parsed) is emitted at
 * finish as content, verbatim.
 *
 * Reasoning split: when start_in_reasoning is set (the prompt ended with an
 * open "<think>\n", i.e. thinking on), everything up to "</think>" is
 * reasoning. Otherwise a "<think>" at the very start of the output (after
 * optional whitespace) opens reasoning. Text after "</think>" is content. The
 * newlines the template puts around reasoning are not part of it: leading
 * newlines of the reasoning, newlines right before "</think>" and newlines
 * right after it are dropped. With parse_reasoning == 0 everything is content.
 * If "</think>" never comes, all of it stays reasoning (nothing dropped).
 *
 * Tool calls: "<tool_call>" ... "</tool_call>" blocks in the content are parsed
 * like mlx-lm's tool_parsers/qwen3_coder.py: parameter values are converted by
 * the JSON-schema type of the matching tool parameter (string/int/number/
 * boolean/object/array; "null" -> null; unknown parameters stay strings), and
 * arguments become a compact JSON object string. With parse_tools == 0 the
 * blocks stay content. Whitespace between content and a parsed tool call (and
 * between calls) is formatting and dropped; a block that does not parse
 * ("<tool_call>" without "<function=NAME>") or never closes goes out as
 * content verbatim, with the whitespace before it.
 *
 * Events are delivered through a callback, in output order. Event text
 * pointers are valid only during the callback.
 */
#ifndef ORCHID_TEXT_OUTPUT_PARSER_H
#define ORCHID_TEXT_OUTPUT_PARSER_H

#include <stddef.h>

#include <cjson/cJSON.h>

enum output_event_kind {
    OUT_REASONING = 1, /* text: a reasoning delta */
    OUT_CONTENT = 2,   /* text: a content delta */
    OUT_TOOL_CALL = 3, /* a complete tool call: index, name, arguments (JSON object text) */
};

typedef struct output_event {
    enum output_event_kind kind;
    const char *text; /* OUT_REASONING / OUT_CONTENT: the delta (not NUL-terminated) */
    size_t len;
    int index;             /* OUT_TOOL_CALL: 0, 1, ... in order of appearance */
    const char *name;      /* OUT_TOOL_CALL: function name (NUL-terminated) */
    const char *arguments; /* OUT_TOOL_CALL: JSON object text, e.g. {"city":"Paris","days":3} */
} output_event;

/* Return non-zero to stop: output_parser_feed/finish then return that value. */
typedef int (*output_event_fn)(void *user, const output_event *ev);

typedef struct output_parser_options {
    int parse_reasoning;    /* split <think>...</think> (default 1) */
    int start_in_reasoning; /* the prompt already opened <think> (default 0) */
    int parse_tools;        /* parse <tool_call> blocks (default 1) */
    const cJSON *tools;     /* the request's tools (for parameter types); may be NULL.
                               Borrowed: must outlive the parser. */
} output_parser_options;

output_parser_options output_parser_options_default(void);

typedef struct output_parser output_parser;

int output_parser_new(output_parser **out, const output_parser_options *opt,
                      char *err, size_t errlen);
void output_parser_free(output_parser *p);

/* Feed the next piece of generated text; events for everything that is now
 * certain are delivered before it returns. Returns 0, or the callback's
 * non-zero value. */
int output_parser_feed(output_parser *p, const char *text, size_t len,
                       output_event_fn fn, void *user);
/* End of generation: releases everything held back (a partial tag becomes
 * text; an unterminated <tool_call> block is emitted verbatim as content). */
int output_parser_finish(output_parser *p, output_event_fn fn, void *user);

/* Counts so far (for finish_reason "tool_calls"). */
int output_parser_tool_calls(const output_parser *p);

/* Non-streaming convenience: parses a whole output at once. *reasoning and
 * *content are malloc'd strings (possibly ""), *tool_calls a malloc'd cJSON
 * array in OpenAI form [{"id","type":"function","function":{"name","arguments"}}]
 * (empty array when none); ids are "call_<index>" (the caller may rewrite). */
int output_parse_all(const output_parser_options *opt, const char *text, size_t len,
                     char **reasoning, char **content, cJSON **tool_calls,
                     char *err, size_t errlen);

#endif
