/* runtime/fileio.h — reading a whole (small) file into memory: config.json,
 * tokenizer.json, index files, chat templates, CLI inputs. */
#ifndef ORCHID_FILEIO_H
#define ORCHID_FILEIO_H

#include <stddef.h>

/* Reads `path` (a regular file, a pipe or /dev/stdin) into a malloc'd, NUL-terminated
 * buffer. max_bytes > 0 refuses larger inputs (ST_FORMAT, "larger than ..."); len may
 * be NULL. Errors name the path. */
int file_read_all(const char *path, size_t max_bytes, char **out, size_t *len, char *err, size_t errlen);

#endif
