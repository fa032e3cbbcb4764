/* text/utf8.h — the UTF-8 primitives the text/ code shares: strict validation
 * (what Python and Rust accept: no overlongs, no surrogates, <= U+10FFFF),
 * lossy decoding that matches Rust's String::from_utf8_lossy (one U+FFFD per
 * maximal invalid subpart, the Unicode-recommended practice that HF tokenizers'
 * decoders inherit), Python's str.isspace set (for Jinja's |trim), and a
 * growable byte buffer. */
#ifndef ORCHID_TEXT_UTF8_H
#define ORCHID_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 sequence starting at s[0] (1..4), or 0 if the
 * bytes at s (n available) do not start a complete valid sequence. */
int utf8_seq_len(const unsigned char *s, size_t n);

/* Returns the byte offset of the first invalid byte, or n if s is valid. */
size_t utf8_validate(const char *s, size_t n);

/* Decodes one valid sequence (caller checked validity); *cp gets the code point. */
int utf8_decode(const unsigned char *s, uint32_t *cp);
int utf8_encode(uint32_t cp, char out[4]);

/* Length of the longest suffix of s[0..n) that is an incomplete but so far
 * valid UTF-8 sequence (0..3): the bytes a streaming decoder must hold back. */
size_t utf8_incomplete_tail(const unsigned char *s, size_t n);

/* Python str.isspace() for one code point. */
int py_isspace(uint32_t cp);

/* Growable byte buffer; data is always NUL-terminated when non-NULL. */
typedef struct buf {
    char *data;
    size_t len, cap;
    int oom; /* sticky: set when a grow failed; later appends are no-ops */
} buf;

void buf_reserve(buf *b, size_t extra);
void buf_append(buf *b, const void *p, size_t n);
void buf_puts(buf *b, const char *s);
void buf_putc(buf *b, char c);
void buf_printf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_free(buf *b);
/* Appends bytes as valid UTF-8, replacing invalid subparts by U+FFFD (EF BF BD). */
void buf_append_lossy(buf *b, const unsigned char *s, size_t n);

#endif
