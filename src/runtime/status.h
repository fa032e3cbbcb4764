/* runtime/status.h — the one error convention of orchid.
 *
 * Every fallible function returns an int: 0 (ST_OK) on success, a negative
 * `enum status` on failure, and writes a human-readable message into a
 * caller-provided buffer `char *err, size_t errlen` (which may be NULL/0).
 * Messages name the thing that failed (file, tensor, field) and never end in
 * a newline. `errorf` formats the message and returns the status so a failure
 * is one line: `return errorf(err, errlen, ST_FORMAT, "%s: ...", path);`.
 */
#ifndef ORCHID_STATUS_H
#define ORCHID_STATUS_H

#include <stddef.h>

enum status {
    ST_OK = 0,
    ST_INVALID = -1,     /* bad argument, request or command line */
    ST_IO = -2,          /* file or socket error */
    ST_NOMEM = -3,       /* allocation failed */
    ST_FORMAT = -4,      /* malformed input file (checkpoint, json, tokenizer) */
    ST_UNSUPPORTED = -5, /* valid but not something orchid runs */
    ST_DEVICE = -6,      /* CUDA / accelerator failure */
    ST_RANGE = -7,       /* a size or count is out of range (context full, ...) */
    ST_CANCELLED = -8,   /* work was cancelled */
    ST_INTERNAL = -9,    /* a broken invariant: a bug */
};

/* Writes the formatted message into err (if non-NULL) and returns `status`. */
int errorf(char *err, size_t errlen, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prepends "prefix: " to an existing message in place (for adding context). */
void error_prefix(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

const char *status_name(int status);

#endif
