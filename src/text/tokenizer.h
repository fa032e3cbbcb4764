/* text/tokenizer.h — byte-level BPE tokenizer loaded from a HF tokenizer.json,
 * plus the streaming detokenizer.
 *
 * What it implements (the subset of HF `tokenizers` the Qwen3.5/3.6 family uses,
 * see reference/MODEL.md §4): an NFC normalizer (utf8proc); added tokens matched
 * in the raw text first (longest match, leftmost), never split further; the
 * pre-tokenizer `Split(regex, isolated)` run by PCRE2 (UTF+UCP+JIT) with the
 * regex taken from the file; GPT-2 byte<->unicode mapping; BPE with merge
 * ranks; ByteLevel decoding. Anything else in tokenizer.json (another model
 * type, another normalizer, byte_fallback, ...) is rejected at load as
 * ST_UNSUPPORTED, so a file we cannot reproduce exactly never loads.
 *
 * Threading: a loaded tokenizer is immutable except for an internal
 * pre-token -> ids cache guarded by a mutex; every function here may be called
 * from any number of threads at once (tested under TSan). A detok_stream
 * belongs to one thread.
 *
 * Only byte-level BPE files of the Qwen2/3/3.5 shape load: the pre-tokenizer
 * must be Sequence[Split(Regex, Isolated), ByteLevel(use_regex=false)], the
 * decoder ByteLevel, no byte_fallback/unk/dropout. Added tokens with
 * normalized=true are matched in the raw text too (exact for ASCII contents).
 *
 * Ownership: arrays and strings returned through `**out` parameters are
 * malloc'd and owned by the caller (free()). Pointers returned directly
 * (token strings, the chat template) live as long as the tokenizer.
 */
#ifndef ORCHID_TEXT_TOKENIZER_H
#define ORCHID_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

/* path: a directory holding tokenizer.json (and optionally tokenizer_config.json
 * and chat_template.jinja), or the path of a tokenizer.json file (its
 * directory is then searched for the other two). */
int tokenizer_load(tokenizer **out, const char *path, char *err, size_t errlen);
void tokenizer_free(tokenizer *tok);

/* Encodes `len` bytes of UTF-8 text (no BOS/EOS are ever added; added-token
 * strings such as "<|im_start|>" inside the text become their ids). Invalid
 * UTF-8 is rejected with ST_INVALID and the byte offset in the message.
 * On success *ids is malloc'd (non-NULL even when *n == 0). */
int tokenizer_encode(const tokenizer *tok, const char *text, size_t len,
                     int32_t **ids, size_t *n, char *err, size_t errlen);

/* Decodes ids to UTF-8 text, like HF decode(ids, skip_special_tokens): byte-level
 * tokens are mapped back to bytes, added tokens give their literal content,
 * invalid UTF-8 (e.g. a cut multi-byte char) becomes U+FFFD per maximal invalid
 * subsequence. skip_special drops tokens flagged special. Ids with no token
 * (negative, >= vocab size, or unused such as the padded embedding rows
 * 248077..248319) produce nothing, as in HF. *text is malloc'd and NUL-terminated;
 * *len (may be NULL) excludes the NUL. */
int tokenizer_decode(const tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                     char **text, size_t *len, char *err, size_t errlen);

/* Token string as it appears in tokenizer.json (byte-level form, e.g. "Ġthe",
 * or an added token's content) -> id; -1 when absent. */
int32_t tokenizer_token_to_id(const tokenizer *tok, const char *token);
/* id -> token string as in tokenizer.json; NULL when the id is unused. */
const char *tokenizer_id_to_token(const tokenizer *tok, int32_t id);
/* id -> the raw bytes the token stands for (added tokens: their content);
 * NULL when the id is unused. Not NUL-terminated in general. */
const char *tokenizer_token_bytes(const tokenizer *tok, int32_t id, size_t *len);

int tokenizer_is_special(const tokenizer *tok, int32_t id); /* 1 if an added token flagged special */
int tokenizer_is_added(const tokenizer *tok, int32_t id);   /* 1 if an added token (special or not) */
int32_t tokenizer_vocab_size(const tokenizer *tok);         /* highest used id + 1 (248077 for Qwen3.6) */

/* From tokenizer_config.json when present, else -1 / NULL. */
int32_t tokenizer_eos_id(const tokenizer *tok);  /* <|im_end|> */
int32_t tokenizer_pad_id(const tokenizer *tok);  /* <|endoftext|> */
/* The chat template text: chat_template.jinja if present, else the
 * "chat_template" string of tokenizer_config.json; NULL when neither. */
const char *tokenizer_chat_template(const tokenizer *tok);

/* ---- streaming detokenizer ------------------------------------------------
 * Feed generated ids one at a time; each push returns the bytes that are now
 * safe to emit: never a partial UTF-8 sequence. Bytes of an incomplete
 * multi-byte character are held back until it completes; bytes that can no
 * longer form valid UTF-8 are emitted as U+FFFD exactly as tokenizer_decode
 * would. detok_flush emits whatever is held (an incomplete tail -> U+FFFD).
 * Invariant (tested): concatenating every push and the flush equals
 * tokenizer_decode(all ids, skip_special). The returned pointer is into the
 * stream's own buffer, valid until the next push/flush/free. */
typedef struct detok_stream detok_stream;

int detok_stream_new(detok_stream **out, const tokenizer *tok, int skip_special,
                     char *err, size_t errlen);
void detok_stream_free(detok_stream *s);
int detok_push(detok_stream *s, int32_t id, const char **text, size_t *len,
               char *err, size_t errlen);
int detok_flush(detok_stream *s, const char **text, size_t *len);
/* Forget held bytes and start over (for reusing a stream across requests). */
void detok_reset(detok_stream *s);

#endif
