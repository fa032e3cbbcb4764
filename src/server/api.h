/* server/api.h — the OpenAI request surface: parsing and validating the JSON
 * bodies of /v1/chat/completions and /v1/completions into one request struct,
 * and the error shape {"error":{"message","type","param","code"}}.
 *
 * Rules: unknown fields are ignored (as OpenAI does); a known field of the
 * wrong type or out of range is a 400 whose message and `param` name it;
 * unsupported values (n > 1, image parts, echo) are 400s saying so.
 * response_format json_object and json_schema are enforced: the output is
 * constrained to a JSON object / a document the schema allows
 * (text/json_grammar.h says which keywords; others are 400s naming them),
 * thinking is off for such requests, and the system message also asks for it
 * (the model writes better JSON when told). Beside tools the reply is either
 * that document or tool calls (the schema binds the content: constraint.h).
 * thinking_budget (Qwen's API name, an integer >= 1) caps the reasoning tokens
 * of a reply that starts inside reasoning (constraint.h). logit_bias keys must be token ids inside the vocabulary and values
 * numbers in [-100, 100], at most SAMPLER_MAX_LOGIT_BIAS entries. tool_choice "required" / a named function is enforced by ending
 * the prompt inside an opened "<tool_call>\n<function=" (thinking off). The parse does no tokenization: the HTTP layer renders and encodes the
 * request afterwards (api_prepare_prompt) and checks the context budget.
 * Anthropic and Responses bodies are translated first (anthropic.h,
 * responses.h) and validated as chat; for Anthropic ones any model name
 * is accepted, and a max_tokens beyond the context left is cut to it (the
 * reply then ends with stop_reason model_context_window_exceeded) instead of
 * being refused.
 */
#ifndef ORCHID_SERVER_API_H
#define ORCHID_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "model/sampler.h"
#include "text/json_grammar.h"
#include "server/port.h"
#include "server/textout.h"

#define API_MAX_STOPS 8
#define API_MAX_CHOICES 16 /* 'n' at most */
#define API_MAX_PROMPTS 64 /* /v1/completions: prompts in one request's batch at most */
#define API_MAX_JOBS 128   /* a request's choices (prompts × n) at most: one job each */
#define API_MAX_STOP_LEN 512

/* API_MESSAGES / API_MESSAGES_COUNT: Anthropic bodies (anthropic.h);
 * API_RESPONSES: OpenAI Responses bodies (responses.h). Both are translated to
 * the chat shape on parse and handled as chat from there on. */
enum api_kind { API_CHAT = 0, API_COMPLETION = 1, API_MESSAGES = 2, API_MESSAGES_COUNT = 3, API_RESPONSES = 4 };

static inline bool api_is_chat(enum api_kind k) { return k != API_COMPLETION; }
enum tool_choice { TC_AUTO = 0, TC_NONE, TC_REQUIRED, TC_NAMED };

struct api_error {
    int status;          /* HTTP status */
    char message[600];
    char param[64];      /* "" -> null */
    const char *type;    /* invalid_request_error, server_error, ... */
    const char *code;    /* NULL -> null */
};

struct api_request {
    enum api_kind kind;
    cJSON *root;        /* owned parse tree */
    cJSON *messages;    /* owned, normalised for the renderer (chat) */
    cJSON *tools;       /* owned, the tools the model sees (NULL: none) */
    enum tool_choice tool_choice;
    char tool_name[128];
    int enable_thinking; /* -1 template default, 0 off, 1 on */
    int thinking_budget; /* > 0: reasoning tokens before the reply is made to close it (constraint.h) */
    bool json_object;
    bool one_tool_call;  /* parallel_tool_calls false (Anthropic: disable_parallel_tool_use): the
                            reply ends after its first tool call */
    struct jg_grammar *grammar; /* owned: constrained output (json_object / json_schema), or NULL */
    const cJSON *json_schema;   /* into root: the schema (json_schema), for the prompt */
    char *prefill;       /* owned: text the reply continues (Anthropic final assistant message) */
    char *echo;          /* owned: the settings a Responses reply echoes (responses.h) */
    bool max_tokens_clamped; /* Anthropic: max_tokens cut to the context left */
    bool stream, include_usage;
    bool ignore_eos;     /* vLLM extension: end-of-sequence ids do not stop generation */
    int max_tokens;      /* -1: not given */
    int n_choices;       /* 'n' (chat, completions; 1..API_MAX_CHOICES): choices generated, one job each */
    struct sampler_params sp;
    const char *stops[API_MAX_STOPS]; /* into root */
    size_t stop_lens[API_MAX_STOPS];
    int n_stops;
    bool logprobs;
    int top_logprobs;
    /* completions */
    const char *prompt_text; /* into root, or NULL when ids were given */
    size_t prompt_len;
    int32_t *prompt_ids;     /* owned, when given as ids */
    int n_prompt_ids;
    int n_prompts;           /* prompts in the request's batch (1 unless 'prompt' is an array of
                                strings or of id arrays); this parse took prompt_index's */
    int prompt_index;
    bool echo_prompt;        /* 'echo': the reply's text (and, with 'logprobs', its logprobs)
                                opens with the prompt's; max_tokens may then be 0 */
    const char *max_tokens_key; /* the field max_tokens came from (for its errors), or NULL */
};

/* An optional boolean field: 0 absent (*out kept), 1 read, -1 not a boolean (e: a 400
 * naming it). */
int api_get_bool(const cJSON *o, const char *name, bool *out, struct api_error *e);
/* The 404 for a request that names another model than model_id; returns e->status. */
int api_model_not_found(struct api_error *e, const char *name, const char *model_id);
/* Fills e and returns e->status. */
int api_error_set(struct api_error *e, int status, const char *type, const char *param, const char *code,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error":{...}} as a malloc'd string. */
char *api_error_json(const struct api_error *e);

/* Parses and validates a body. model_id: the only model served; vocab: for
 * token-id prompts and logit_bias keys; sp_base: what the sampling fields the body leaves
 * out are (the port's defaults; NULL: greedy, sampler_params_default). Returns 0 or an
 * HTTP status (e filled). */
int api_parse(enum api_kind kind, const char *body, size_t len, const char *model_id, int vocab,
              int default_thinking, const struct sampler_params *sp_base, struct api_request *r, struct api_error *e);
/* The same, taking prompt prompt_index of a /v1/completions batch (every prompt of the
 * batch is validated whichever is taken; an index past the batch is a 400). */
int api_parse_at(enum api_kind kind, const char *body, size_t len, const char *model_id, int vocab,
                 int default_thinking, const struct sampler_params *sp_base, int prompt_index,
                 struct api_request *r, struct api_error *e);
void api_request_free(struct api_request *r);
/* A function (tool) name: 1-64 characters of a-z, A-Z, 0-9, _ . - */
bool api_valid_function_name(const char *s);

/* Builders of the chat shape api_parse reads, for the dialect translators
 * (anthropic.c, responses.c). A message {role, content} appended to msgs
 * (content NULL: ""); a function tool {type, function: {name, description?,
 * parameters?}} appended to tools (parameters copied); a call {id, type,
 * function: {name, arguments}} appended to an assistant message's tool_calls
 * (arguments: an object, owned by the message after); a named tool_choice set
 * on the request. */
cJSON *api_chat_message(cJSON *msgs, const char *role, const char *content);
void api_chat_tool(cJSON *tools, const char *name, const char *description, const cJSON *parameters);
void api_chat_tool_call(cJSON *assistant, const char *id, const char *name, cJSON *arguments);
void api_chat_tool_choice(cJSON *req, const char *name);
/* response_format {type json_schema, json_schema: {name?, schema?, strict?}}
 * set on the request (each copied when given; api_parse checks them). */
void api_chat_json_schema(cJSON *req, const char *name, const cJSON *schema, const cJSON *strict);
/* A flat tool definition {name, description?, <schema_key>} (Anthropic's and
 * the Responses API's shape), validated with errors naming `where`, appended
 * to tools as a function tool. Returns 0 or -1 (e set). */
int api_chat_tool_from_flat(cJSON *tools, const cJSON *t, const char *where, const char *schema_key,
                            bool schema_required, struct api_error *e);

/* Renders (chat) and encodes the prompt, checks it against max_seq and fixes
 * max_tokens. Also returns the forced output prefix (tool_choice required or
 * named: the prompt ends inside an opened <tool_call>) that the output parser
 * must see first, and whether the prompt opened reasoning. *ids and
 * *forced_prefix are malloc'd; on failure both are NULL. */
int api_prepare_prompt(struct api_request *r, const struct model_port *port, int max_seq, int32_t **ids,
                       int *n_ids, char **forced_prefix, bool *start_in_reasoning, struct api_error *e);

#endif
