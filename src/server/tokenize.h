/* server/tokenize.h — POST /tokenize and POST /detokenize: the token ids a prompt or a chat
 * request becomes, exactly as the generation endpoints would feed them to the model, and
 * ids back to text. vLLM's request and response shapes, with llama.cpp's field names
 * accepted as well, so either family of clients can count and inspect tokens (context
 * budgeting, prompt caching). Runs on the connection thread; the scheduler is not involved.
 *
 * /tokenize body: "prompt" (llama.cpp: "content"), a string encoded as is (the Qwen
 * tokenizer adds no BOS, so add_special_tokens / add_special change nothing), or
 * "messages" (+ "tools", "chat_template_kwargs", "reasoning_effort", "tool_choice" ...: any
 * chat-completions field that shapes the prompt), rendered with the generation prompt as
 * /v1/chat/completions renders it ("add_generation_prompt": false is refused). "model" is
 * optional; when given it must name the served model. "return_token_strs": true adds each
 * token's text (its bytes, invalid UTF-8 replaced by U+FFFD). Answer:
 * {"count", "max_model_len", "tokens", "token_strs"} (token_strs null unless asked).
 *
 * /detokenize body: "tokens", an array of ids inside the vocabulary. Answer: {"prompt":
 * text, "content": text} (vLLM's and llama.cpp's key), the tokens' bytes concatenated,
 * special tokens included, invalid UTF-8 replaced by U+FFFD.
 *
 * Both return 0 with *json (malloc'd), or an HTTP status with e filled. */
#ifndef ORCHID_SERVER_TOKENIZE_H
#define ORCHID_SERVER_TOKENIZE_H

#include <stddef.h>

#include "server/gen.h"

int tokenize_json(const struct gen_config *cfg, const char *body, size_t len, char **json, struct api_error *e);
int detokenize_json(const struct gen_config *cfg, const char *body, size_t len, char **json, struct api_error *e);

#endif
