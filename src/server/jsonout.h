/* server/jsonout.h — JSON text written by hand into a growable buffer, for the
 * response paths that run once per token (SSE chunks, logprob entries): no
 * cJSON tree, no allocation once the buffer has grown. Shared by the OpenAI
 * (gen.c) and Anthropic (anthropic.c) response writers. */
#ifndef ORCHID_SERVER_JSONOUT_H
#define ORCHID_SERVER_JSONOUT_H

#include <stddef.h>

#include "text/utf8.h"

/* A JSON string literal of UTF-8 text s[0, n): quotes, backslashes and control
 * characters escaped, invalid UTF-8 replaced by U+FFFD. */
void json_put_str(buf *b, const char *s, size_t n);
/* A number with 6 significant digits; a non-finite value (a -inf logprob)
 * becomes -9999 (negative) or 0, since JSON has no infinities. */
void json_put_float(buf *b, double v);

#endif
