/* server/anthropic.h — the Anthropic Messages surface: POST /v1/messages and
 * POST /v1/messages/count_tokens, for clients that speak Anthropic's API
 * (Claude Code with ANTHROPIC_BASE_URL, the official `anthropic` SDKs).
 *
 * Requests are translated into the OpenAI chat shape that api.c validates and
 * the chat template renders, so both dialects share one path from the
 * normalised messages to the scheduler; only the edges differ:
 *   system (string or text blocks)      -> a leading system message
 *   user text blocks                    -> user content (blocks joined by "\n\n")
 *   user tool_result blocks             -> tool messages, in place (is_error: the
 *                                          content is prefixed "Error: ")
 *   assistant text / thinking blocks    -> content / reasoning_content (joined as is)
 *   assistant tool_use blocks           -> tool_calls (input = the arguments object)
 *   a final assistant message           -> prefill: the prompt ends with its text
 *                                          (thinking off) and the reply continues it
 *   tools [{name, description, input_schema}] -> function tools
 *   tool_choice auto / any / tool / none -> auto / required / named / none
 *   thinking enabled / adaptive / between_tools / disabled -> enable_thinking
 *   stop_sequences, temperature ([0, 1]), top_p, top_k, max_tokens (required),
 *   stream                               -> the same-named OpenAI fields
 *   output_config.format json_schema     -> response_format json_schema (enforced)
 * Images, documents and server tools are 400s naming the block.
 * Unknown top-level fields (metadata, cache_control, service_tier ...) are
 * ignored, as they are by Anthropic's own API for fields it does not use.
 * Any `model` string is accepted (one model is served; Claude Code names its
 * own models), and responses carry the served model's id. thinking's
 * budget_tokens is enforced (the reasoning is closed once it has taken that
 * many tokens: constraint.h); tool_choice.disable_parallel_tool_use true
 * maps to parallel_tool_calls false (the reply ends after its first tool_use).
 *
 * Responses: a message object {id "msg_...", type, role, model, content
 * [thinking?, text?, tool_use*], stop_reason end_turn | max_tokens |
 * stop_sequence | tool_use | model_context_window_exceeded, stop_sequence,
 * usage}, or the event stream message_start, ping, (content_block_start,
 * content_block_delta*, content_block_stop)*, message_delta, message_stop.
 * usage.input_tokens counts the prompt tokens not read from the prefix cache
 * and cache_read_input_tokens those that were (Anthropic's split); the stream's
 * message_start cannot know the split yet (the cache is consulted when the
 * request is scheduled), so it carries the whole prompt as input_tokens and
 * message_delta carries the final cumulative counts, which the SDKs overwrite
 * the start's with. Errors are {"type":"error","error":{"type","message"}},
 * the error type following the HTTP status.
 */
#ifndef ORCHID_SERVER_ANTHROPIC_H
#define ORCHID_SERVER_ANTHROPIC_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "server/api.h"
#include "text/output_parser.h"
#include "text/utf8.h"

/* Builds the OpenAI-shaped chat request (*out, caller frees) from the
 * Anthropic body `in`. count_only: a count_tokens body (max_tokens not
 * required). *prefill (malloc'd or NULL) is the final assistant message's
 * text. Returns 0, or an HTTP status with e filled. */
int anthropic_translate(const cJSON *in, bool count_only, cJSON **out, char **prefill, struct api_error *e);

/* {"type":"error","error":{"type","message"}} as a malloc'd string. */
char *anthropic_error_json(const struct api_error *e);

struct am_usage {
    int prompt; /* all prompt tokens */
    int cached; /* of which read from the prefix cache */
    int output;
};

/* The open content block of a stream. */
enum am_block { AM_NONE = 0, AM_THINKING, AM_TEXT };

struct am_stream {
    int next_index;    /* index the next content block gets */
    enum am_block open;
};

/* message_start + ping. */
void am_stream_start(struct am_stream *s, buf *out, const char *id, const char *model, int prompt_tokens);
/* One parser event as content-block events; tool_id names a tool call. */
void am_stream_event(struct am_stream *s, buf *out, const output_event *ev, const char *tool_id);
/* Closes the open block, then message_delta and message_stop. */
void am_stream_finish(struct am_stream *s, buf *out, const char *stop_reason, const char *stop_sequence,
                      const struct am_usage *u);
/* An error event (the stream ends after it). */
void am_stream_error(buf *out, int status, const char *message);

/* The whole message object (malloc'd; NULL when out of memory). tool_calls:
 * the OpenAI-shaped calls the chat path accumulated ({id, function: {name,
 * arguments}}); their arguments become tool_use inputs. */
char *am_message_json(const char *id, const char *model, const char *reasoning, const char *content,
                      const cJSON *tool_calls, const char *stop_reason, const char *stop_sequence,
                      const struct am_usage *u);

#endif
