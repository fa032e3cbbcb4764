/* runtime/safetensors.h — read-only, mmap-backed access to a safetensors checkpoint:
 * either `model.safetensors.index.json` + its shards, or a single `model.safetensors`.
 *
 * Every shard header is parsed and checked up front (8-byte little-endian header
 * length, JSON header, dtype names, shapes, data offsets inside the file, byte
 * counts equal to shape × dtype size, no overlapping tensors, no name in two
 * shards, every index entry present in its shard). Tensors then point straight
 * into the mapping; nothing is copied. Each tensor carries a `consumed` flag so
 * the weight binder can report whatever it did not use.
 * Lifetime: tensor data pointers live until safetensors_close.
 */
#ifndef ORCHID_SAFETENSORS_H
#define ORCHID_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum st_dtype { DT_UNKNOWN = 0, DT_F32, DT_F16, DT_BF16, DT_U32, DT_I32, DT_U8, DT_I8, DT_F64, DT_I64, DT_U16, DT_I16, DT_BOOL, DT_U64 };

#define ST_MAX_DIMS 8

struct st_tensor {
    char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* into the shard mapping */
    size_t nbytes;
    int shard;        /* index into the shard list */
    bool consumed;
};

struct st_shard {
    char *path;
    int fd;
    void *map;
    size_t size;
};

typedef struct safetensors {
    struct st_shard *shards;
    int n_shards;
    struct st_tensor *tensors; /* sorted by name */
    int n_tensors;
    size_t total_bytes;        /* sum of tensor nbytes */
} safetensors;

/* Opens the checkpoint in directory `dir`. */
int safetensors_open(safetensors **out, const char *dir, char *err, size_t errlen);
/* Parses one shard header from memory (used by the fuzzer and tests): validates
 * it against a file of `file_size` bytes and appends its tensors. */
int safetensors_parse_header(safetensors *st, int shard, const uint8_t *bytes, size_t file_size,
                             char *err, size_t errlen);
/* After the last safetensors_parse_header of a checkpoint assembled by hand (e.g. the
 * in-memory shards of model/synth.c): sorts the tensor table, rejects a name that
 * appears twice, sums total_bytes. safetensors_open calls it itself. Shards whose fd
 * is -1 and map non-NULL are anonymous mappings that safetensors_close unmaps. */
int safetensors_finish(safetensors *st, char *err, size_t errlen);
void safetensors_close(safetensors *st);

struct st_tensor *safetensors_find(const safetensors *st, const char *name);
const char *st_dtype_name(enum st_dtype dt);
size_t st_dtype_size(enum st_dtype dt);
const char *safetensors_shard_path(const safetensors *st, const struct st_tensor *t);

#endif
