/* app/cli.c — see cli.h. */
#include "app/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "orchid %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

bool cli_parse_int(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_ids(const char *s, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!s || !*s) return false;
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return false;
    size_t k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end != ',' && *end != 0)) { free(v); return false; }
        v[k++] = (int32_t)x;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && !*p) { free(v); return false; }
    }
    *ids = v;
    *n = k;
    return k > 0;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) return NULL;
    return argv[++*i];
}

bool cli_is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}
