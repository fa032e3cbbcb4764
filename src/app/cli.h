/* app/cli.h — flag parsing shared by the subcommands: `--name value` pairs,
 * strict integer parsing, and the one-line usage error (exit code 2). */
#ifndef ORCHID_CLI_H
#define ORCHID_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

/* Prints "orchid <cmd>: <message>" on stderr and returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses a whole decimal integer in [lo, hi]; false on junk or out of range. */
bool cli_parse_int(const char *s, long lo, long hi, long *out);
/* Parses "1,2,3" into a malloc'd array (ids in [0, INT32_MAX]); false on junk. */
bool cli_parse_ids(const char *s, int32_t **ids, size_t *n);
/* The value after flag argv[*i] (advancing *i), or NULL when missing. */
const char *cli_value(int argc, char **argv, int *i);
/* A directory that exists? */
bool cli_is_dir(const char *path);

#endif
