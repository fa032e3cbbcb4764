/* runtime/fileio.c — see fileio.h. Reads in growing chunks rather than trusting a
 * size from stat, so pipes work and a file that changes while read is still safe. */
#include "runtime/fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/status.h"

int file_read_all(const char *path, size_t max_bytes, char **out, size_t *len, char *err, size_t errlen) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return errorf(err, errlen, ST_IO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    int rc = 0;
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (max_bytes && n > max_bytes) {
            rc = errorf(err, errlen, ST_FORMAT, "%s: larger than %zu bytes", path, max_bytes);
            break;
        }
        if (k == 0) {
            if (ferror(f)) rc = errorf(err, errlen, ST_IO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (!buf) return errorf(err, errlen, ST_NOMEM, "%s: out of memory", path);
    if (rc) { free(buf); return rc; }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}
