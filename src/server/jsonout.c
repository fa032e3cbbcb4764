/* server/jsonout.c — JSON literals written into a buf (see jsonout.h). */
#include "server/jsonout.h"

#include <math.h>

#include "server/textout.h"

/* JSON string literal of UTF-8 text; invalid bytes become U+FFFD. */
void json_put_str(buf *b, const char *s, size_t n) {
    buf_reserve(b, n + 2);
    buf_append(b, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (run < n && u[run] >= 0x20 && u[run] < 0x80 && u[run] != '"' && u[run] != '\\') run++;
        if (run > i) {
            buf_append(b, s + i, run - i);
            i = run;
            continue;
        }
        unsigned char c = u[i];
        if (c == '"') buf_append(b, "\\\"", 2);
        else if (c == '\\') buf_append(b, "\\\\", 2);
        else if (c == '\n') buf_append(b, "\\n", 2);
        else if (c == '\r') buf_append(b, "\\r", 2);
        else if (c == '\t') buf_append(b, "\\t", 2);
        else if (c < 0x20) buf_printf(b, "\\u%04x", c);
        else {
            size_t l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            if (l == 1 || l > n - i || utf8_invalid_at(s + i, l) != (size_t)-1) {
                buf_append(b, "\xEF\xBF\xBD", 3);
            } else {
                buf_append(b, s + i, l);
                i += l;
                continue;
            }
        }
        i++;
    }
    buf_append(b, "\"", 1);
}

void json_put_float(buf *b, double v) {
    if (!isfinite(v)) v = v < 0 ? -9999.0 : 0.0;
    buf_printf(b, "%.6g", v);
}
