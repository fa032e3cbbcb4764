/* server/responses.h — the OpenAI Responses surface: POST /v1/responses, for
 * clients built on it (Codex, the openai SDKs' client.responses).
 *
 * Like the Anthropic surface (anthropic.h), a request is translated into the
 * chat shape that api.c validates and the chat template renders:
 *   instructions (string)                    -> a leading system message
 *   input: a string                          -> one user message
 *   input items:
 *     message {role user/assistant/system/developer, content: string or
 *       input_text / output_text parts}      -> that message (developer = system;
 *                                               system messages before the first
 *                                               turn join the instructions)
 *     reasoning {content: reasoning_text | summary: summary_text}
 *                                            -> reasoning_content of the assistant
 *                                               turn that follows it
 *     function_call {call_id, name, arguments} -> tool_calls of that assistant turn
 *     function_call_output {call_id, output}  -> a tool message
 *   tools [{type function, name, description, parameters}] -> function tools
 *   tool_choice auto / none / required / {type function, name} -> the same
 *   reasoning.effort none -> thinking off; minimal..xhigh -> on
 *   max_output_tokens, temperature, top_p, stream -> max_tokens and the same
 *   text.format text / json_object / json_schema -> response_format (enforced)
 * What needs server-side storage (previous_response_id, conversation,
 * item_reference, background) is a 400 saying so: nothing is stored and every
 * request carries its whole conversation (store is accepted and ignored), as
 * Codex sends it. Images, files and built-in tools (web search,
 * file search, computer use, shell, custom grammar tools) are 400s naming the
 * item or field.
 *
 * Responses: a response object {id "resp_...", object, created_at, status
 * completed | incomplete (incomplete_details.reason max_output_tokens), model,
 * output [reasoning?, message?, function_call*], usage {input_tokens,
 * input_tokens_details.cached_tokens, output_tokens,
 * output_tokens_details.reasoning_tokens, total_tokens}} plus the request's
 * settings echoed (instructions, tools, tool_choice, temperature ...). The
 * stream is response.created, response.in_progress, then per output item
 * output_item.added, (content_part.added, *_text.delta*, *_text.done,
 * content_part.done | function_call_arguments.delta, .done), output_item.done,
 * and last response.completed (or response.incomplete / response.failed);
 * every event has a sequence_number. reasoning_tokens is the reasoning text
 * encoded again (the tokens the model spent before </think>, give or take the
 * segmentation).
 */
#ifndef ORCHID_SERVER_RESPONSES_H
#define ORCHID_SERVER_RESPONSES_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "server/api.h"
#include "text/output_parser.h"
#include "text/utf8.h"

/* Builds the chat-shaped request (*out) and the settings a response echoes
 * (*echo: a JSON object's members, without braces, malloc'd) from the
 * Responses body `in`. Returns 0, or an HTTP status with e filled. */
int responses_translate(const cJSON *in, cJSON **out, char **echo, struct api_error *e);

struct rs_usage {
    int prompt, cached, output, reasoning;
};

/* What every response object carries. */
struct rs_meta {
    const char *id;    /* resp_... */
    const char *model;
    long created;
    const char *echo;  /* responses_translate's *echo */
};

enum rs_item { RS_NONE = 0, RS_REASONING, RS_MESSAGE };

struct rs_stream {
    long seq;          /* the next event's sequence_number */
    int next_output;   /* the next item's output_index */
    enum rs_item open; /* the item whose text is streaming */
    char item_id[64];
    buf text;          /* the open item's text so far */
    buf items;         /* finished items as JSON, comma-joined */
};

/* response.created + response.in_progress. */
void rs_stream_start(struct rs_stream *s, buf *out, const struct rs_meta *m);
/* One parser event as output-item events; call_id names a tool call. */
void rs_stream_event(struct rs_stream *s, buf *out, const struct rs_meta *m, const output_event *ev,
                     const char *call_id);
/* Closes the open item, then response.completed (or .incomplete when
 * incomplete_reason is not NULL). */
void rs_stream_finish(struct rs_stream *s, buf *out, const struct rs_meta *m, const char *incomplete_reason,
                      const struct rs_usage *u);
/* response.failed (the stream ends after it). */
void rs_stream_fail(struct rs_stream *s, buf *out, const struct rs_meta *m, const char *code, const char *message);
void rs_stream_free(struct rs_stream *s);

/* The whole response object (malloc'd; NULL when out of memory). tool_calls:
 * the OpenAI chat-shaped calls ({id, function: {name, arguments}}). */
char *rs_response_json(const struct rs_meta *m, const char *reasoning, const char *content, const cJSON *tool_calls,
                       const char *incomplete_reason, const struct rs_usage *u);

#endif
