/* runtime/status.c — message formatting for the error convention in status.h. */
#include "runtime/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int errorf(char *err, size_t errlen, int status, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return status;
}

void error_prefix(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t pl = strlen(prefix), ml = strlen(err);
    if (pl + 2 >= errlen) return;
    if (pl + 2 + ml >= errlen) ml = errlen - pl - 3;
    memmove(err + pl + 2, err, ml);
    err[pl + 2 + ml] = 0;
    memcpy(err, prefix, pl);
    err[pl] = ':';
    err[pl + 1] = ' ';
}

const char *status_name(int status) {
    switch (status) {
    case ST_OK: return "ok";
    case ST_INVALID: return "invalid";
    case ST_IO: return "io";
    case ST_NOMEM: return "nomem";
    case ST_FORMAT: return "format";
    case ST_UNSUPPORTED: return "unsupported";
    case ST_DEVICE: return "device";
    case ST_RANGE: return "range";
    case ST_CANCELLED: return "cancelled";
    case ST_INTERNAL: return "internal";
    }
    return "unknown";
}
