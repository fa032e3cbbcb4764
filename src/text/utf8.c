/* text/utf8.c — UTF-8 validation, lossy decoding and the byte buffer (see utf8.h).
 * Validity follows Unicode Table 3-7 (well-formed byte sequences): the second
 * byte's allowed range depends on the lead byte (E0: A0..BF, ED: 80..9F,
 * F0: 90..BF, F4: 80..8F), which is what rules out overlongs and surrogates. */
#include "text/utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sequence length implied by a lead byte (0: not a lead byte) and the allowed
 * range of the second byte. */
static int lead_info(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c < 0xF0) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c < 0xF5) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

int utf8_seq_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned char lo, hi;
    int len = lead_info(s[0], &lo, &hi);
    if (len <= 1) return len;
    if ((size_t)len > n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return len;
}

size_t utf8_validate(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int l = utf8_seq_len(u + i, n - i);
        if (!l) return i;
        i += (size_t)l;
    }
    return n;
}

int utf8_decode(const unsigned char *s, uint32_t *cp) {
    if (s[0] < 0x80) { *cp = s[0]; return 1; }
    if (s[0] < 0xE0) { *cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); return 2; }
    if (s[0] < 0xF0) {
        *cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

int utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Number of bytes from s[0] that are a valid prefix of some well-formed
 * sequence (1 for a lone lead byte that is valid, 0 for an invalid lead). */
static size_t valid_prefix(const unsigned char *s, size_t n, int *need) {
    unsigned char lo, hi;
    int len = lead_info(s[0], &lo, &hi);
    *need = len;
    if (len == 0) return 0;
    size_t k = 1;
    while (k < (size_t)len && k < n) {
        unsigned char c = s[k];
        if (k == 1 ? (c < lo || c > hi) : ((c & 0xC0) != 0x80)) break;
        k++;
    }
    return k;
}

size_t utf8_incomplete_tail(const unsigned char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const unsigned char *p = s + n - back;
        if ((*p & 0xC0) == 0x80) continue; /* continuation: keep looking for the lead */
        int need;
        size_t k = valid_prefix(p, back, &need);
        if (need > 1 && k == back && back < (size_t)need) return back;
        return 0;
    }
    return 0;
}

void buf_append_lossy(buf *b, const unsigned char *s, size_t n) {
    if (!s) s = (const unsigned char *)""; /* n == 0: NULL + 0 is undefined */
    size_t i = 0, run = 0; /* run: start of the pending valid stretch */
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        int l = utf8_seq_len(s + i, n - i);
        if (l) { i += (size_t)l; continue; }
        buf_append(b, s + run, i - run);
        int need;
        size_t k = valid_prefix(s + i, n - i, &need);
        if (k == 0) k = 1;
        buf_append(b, "\xEF\xBF\xBD", 3);
        i += k;
        run = i;
    }
    buf_append(b, s + run, n - run);
}

int py_isspace(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
    if (cp < 0x85) return 0;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

void buf_reserve(buf *b, size_t extra) {
    if (b->oom) return;
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) { b->oom = 1; return; }
    b->data = p;
    b->cap = cap;
}

void buf_append(buf *b, const void *p, size_t n) {
    buf_reserve(b, n);
    if (b->oom) return;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

void buf_puts(buf *b, const char *s) { buf_append(b, s, strlen(s)); }
void buf_putc(buf *b, char c) { buf_append(b, &c, 1); }

void buf_printf(buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { buf_append(b, tmp, (size_t)n); return; }
    buf_reserve(b, (size_t)n);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void buf_free(buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}
