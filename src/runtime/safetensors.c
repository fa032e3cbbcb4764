/* runtime/safetensors.c — safetensors shard/index parsing and mmap (see safetensors.h).
 *
 * Format of one shard: u64 little-endian N, then N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {...}}, then the data region; offsets are relative to the
 * start of the data region (byte 8 + N). Everything in a header is untrusted:
 * lengths and offsets are checked with overflow-safe arithmetic before use.
 */
#include "runtime/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "runtime/status.h"

#define MAX_HEADER_BYTES (256u << 20) /* a 2,000-tensor header is ~300 KB; refuse absurd sizes */

static const struct { const char *name; enum st_dtype dt; size_t size; } dtype_table[] = {
    {"F32", DT_F32, 4},   {"F16", DT_F16, 2}, {"BF16", DT_BF16, 2}, {"U32", DT_U32, 4},
    {"I32", DT_I32, 4},   {"U8", DT_U8, 1},   {"I8", DT_I8, 1},     {"F64", DT_F64, 8},
    {"I64", DT_I64, 8},   {"U16", DT_U16, 2}, {"I16", DT_I16, 2},   {"BOOL", DT_BOOL, 1},
    {"U64", DT_U64, 8},
};

const char *st_dtype_name(enum st_dtype dt) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].dt == dt) return dtype_table[i].name;
    return "unknown";
}

size_t st_dtype_size(enum st_dtype dt) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].dt == dt) return dtype_table[i].size;
    return 0;
}

static enum st_dtype dtype_parse(const char *s) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (strcmp(dtype_table[i].name, s) == 0) return dtype_table[i].dt;
    return DT_UNKNOWN;
}

const char *safetensors_shard_path(const safetensors *st, const struct st_tensor *t) {
    return (t->shard >= 0 && t->shard < st->n_shards) ? st->shards[t->shard].path : "?";
}

static int append_tensor(safetensors *st, struct st_tensor *t, char *err, size_t errlen) {
    if ((st->n_tensors & (st->n_tensors - 1)) == 0) { /* grow at powers of two */
        size_t cap = st->n_tensors ? (size_t)st->n_tensors * 2 : 64;
        struct st_tensor *nt = realloc(st->tensors, cap * sizeof *nt);
        if (!nt) return errorf(err, errlen, ST_NOMEM, "out of memory reading tensor headers");
        st->tensors = nt;
    }
    st->tensors[st->n_tensors++] = *t;
    return 0;
}

struct span { uint64_t begin, end; const char *name; };

static int span_cmp(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

int safetensors_parse_header(safetensors *st, int shard, const uint8_t *bytes, size_t file_size,
                             char *err, size_t errlen) {
    const char *path = (shard >= 0 && shard < st->n_shards) ? st->shards[shard].path : "<memory>";
    if (file_size < 8) return errorf(err, errlen, ST_FORMAT, "%s: file is %zu bytes, too short for a safetensors header", path, file_size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | bytes[i];
    if (hlen > file_size - 8)
        return errorf(err, errlen, ST_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)",
                      path, (unsigned long long)hlen, file_size);
    if (hlen > MAX_HEADER_BYTES)
        return errorf(err, errlen, ST_FORMAT, "%s: header length %llu is implausibly large", path, (unsigned long long)hlen);
    const uint64_t data_size = file_size - 8 - hlen;
    const uint8_t *data = bytes + 8 + hlen;

    cJSON *root = cJSON_ParseWithLength((const char *)bytes + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return errorf(err, errlen, ST_FORMAT, "%s: header is not a valid JSON object", path);
    }
    int rc = 0, n_here = 0, first = st->n_tensors;
    for (cJSON *e = root->child; e; e = e->next) {
        if (!e->string) continue;
        if (strcmp(e->string, "__metadata__") == 0) continue;
        const char *name = e->string;
        cJSON *jdt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        cJSON *jshape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cJSON *joff = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsObject(e) || !cJSON_IsString(jdt) || !cJSON_IsArray(jshape) || !cJSON_IsArray(joff) ||
            cJSON_GetArraySize(joff) != 2) {
            rc = errorf(err, errlen, ST_FORMAT, "%s: tensor %s: header entry needs dtype, shape and two data_offsets", path, name);
            break;
        }
        struct st_tensor t = {0};
        t.dtype = dtype_parse(jdt->valuestring);
        if (t.dtype == DT_UNKNOWN) {
            rc = errorf(err, errlen, ST_FORMAT, "%s: tensor %s: unknown dtype \"%s\"", path, name, jdt->valuestring);
            break;
        }
        t.ndim = cJSON_GetArraySize(jshape);
        if (t.ndim > ST_MAX_DIMS) {
            rc = errorf(err, errlen, ST_FORMAT, "%s: tensor %s: %d dimensions (at most %d)", path, name, t.ndim, ST_MAX_DIMS);
            break;
        }
        uint64_t count = 1;
        bool bad = false;
        int d = 0;
        for (cJSON *x = jshape->child; x; x = x->next, d++) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15 ||
                x->valuedouble != (double)(int64_t)x->valuedouble) { bad = true; break; }
            t.shape[d] = (int64_t)x->valuedouble;
            if (t.shape[d] != 0 && count > UINT64_MAX / (uint64_t)t.shape[d] / 8) { bad = true; break; }
            count *= (uint64_t)t.shape[d];
        }
        if (bad) {
            rc = errorf(err, errlen, ST_FORMAT, "%s: tensor %s: invalid shape", path, name);
            break;
        }
        cJSON *jb = cJSON_GetArrayItem(joff, 0), *je = cJSON_GetArrayItem(joff, 1);
        if (!cJSON_IsNumber(jb) || !cJSON_IsNumber(je) || jb->valuedouble < 0 || je->valuedouble < jb->valuedouble ||
            je->valuedouble > 1.8e19) {
            rc = errorf(err, errlen, ST_FORMAT, "%s: tensor %s: invalid data_offsets", path, name);
            break;
        }
        uint64_t begin = (uint64_t)jb->valuedouble, end = (uint64_t)je->valuedouble;
        if (end > data_size) {
            rc = errorf(err, errlen, ST_FORMAT, "%s: tensor %s: data [%llu, %llu) runs past the end of the file (data region %llu bytes)",
                        path, name, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_size);
            break;
        }
        if (end - begin != count * st_dtype_size(t.dtype)) {
            rc = errorf(err, errlen, ST_FORMAT, "%s: tensor %s: %llu data bytes but shape × %s needs %llu",
                        path, name, (unsigned long long)(end - begin), jdt->valuestring,
                        (unsigned long long)(count * st_dtype_size(t.dtype)));
            break;
        }
        t.name = strdup(name);
        if (!t.name) { rc = errorf(err, errlen, ST_NOMEM, "out of memory"); break; }
        t.data = data + begin;
        t.nbytes = (size_t)(end - begin);
        t.shard = shard;
        if ((rc = append_tensor(st, &t, err, errlen)) != 0) { free(t.name); break; }
        n_here++;
    }
    cJSON_Delete(root);
    if (rc) return rc;

    /* Overlap check within this shard: sort spans by begin, compare neighbours. */
    if (n_here > 1) {
        struct span *sp = malloc((size_t)n_here * sizeof *sp);
        if (!sp) return errorf(err, errlen, ST_NOMEM, "out of memory");
        for (int i = 0; i < n_here; i++) {
            struct st_tensor *t = &st->tensors[first + i];
            sp[i].begin = (uint64_t)((const uint8_t *)t->data - data);
            sp[i].end = sp[i].begin + t->nbytes;
            sp[i].name = t->name;
        }
        qsort(sp, (size_t)n_here, sizeof *sp, span_cmp);
        for (int i = 1; i < n_here; i++) {
            if (sp[i].begin < sp[i - 1].end && sp[i].end > sp[i].begin) {
                rc = errorf(err, errlen, ST_FORMAT, "%s: tensors %s and %s overlap in the data region", path, sp[i - 1].name, sp[i].name);
                break;
            }
        }
        free(sp);
    }
    return rc;
}

static int tensor_cmp(const void *a, const void *b) {
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

struct st_tensor *safetensors_find(const safetensors *st, const char *name) {
    struct st_tensor key = {.name = (char *)name};
    return bsearch(&key, st->tensors, (size_t)st->n_tensors, sizeof key, tensor_cmp);
}

int safetensors_finish(safetensors *st, char *err, size_t errlen) {
    qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, tensor_cmp);
    for (int i = 1; i < st->n_tensors; i++) {
        if (strcmp(st->tensors[i].name, st->tensors[i - 1].name) == 0)
            return errorf(err, errlen, ST_FORMAT, "tensor %s appears twice (%s and %s)", st->tensors[i].name,
                          safetensors_shard_path(st, &st->tensors[i - 1]), safetensors_shard_path(st, &st->tensors[i]));
    }
    st->total_bytes = 0;
    for (int i = 0; i < st->n_tensors; i++) st->total_bytes += st->tensors[i].nbytes;
    return 0;
}

static char *path_join(const char *dir, const char *file) {
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, file);
    return p;
}

/* Adds shard `file` (relative to dir) unless already listed; returns its index. */
static int add_shard(safetensors *st, const char *dir, const char *file, char *err, size_t errlen) {
    if (strchr(file, '/') || strcmp(file, "..") == 0 || file[0] == 0)
        return errorf(err, errlen, ST_FORMAT, "shard name \"%s\" must be a plain file name", file);
    char *path = path_join(dir, file);
    if (!path) return errorf(err, errlen, ST_NOMEM, "out of memory");
    for (int i = 0; i < st->n_shards; i++)
        if (strcmp(st->shards[i].path, path) == 0) { free(path); return i; }
    struct st_shard *ns = realloc(st->shards, (size_t)(st->n_shards + 1) * sizeof *ns);
    if (!ns) { free(path); return errorf(err, errlen, ST_NOMEM, "out of memory"); }
    st->shards = ns;
    struct st_shard *sh = &st->shards[st->n_shards];
    memset(sh, 0, sizeof *sh);
    sh->fd = -1;
    sh->path = path;
    st->n_shards++;
    sh->fd = open(path, O_RDONLY);
    if (sh->fd < 0) return errorf(err, errlen, ST_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(sh->fd, &sb) != 0) return errorf(err, errlen, ST_IO, "%s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return errorf(err, errlen, ST_IO, "%s: not a regular file", path);
    sh->size = (size_t)sb.st_size;
    if (sh->size < 8) return errorf(err, errlen, ST_FORMAT, "%s: file is %zu bytes, too short for a safetensors header", path, sh->size);
    sh->map = mmap(NULL, sh->size, PROT_READ, MAP_PRIVATE, sh->fd, 0);
    if (sh->map == MAP_FAILED) {
        sh->map = NULL;
        return errorf(err, errlen, ST_IO, "%s: mmap failed: %s", path, strerror(errno));
    }
    int rc = safetensors_parse_header(st, st->n_shards - 1, sh->map, sh->size, err, errlen);
    return rc ? rc : st->n_shards - 1;
}

int safetensors_open(safetensors **out, const char *dir, char *err, size_t errlen) {
    *out = NULL;
    safetensors *st = calloc(1, sizeof *st);
    if (!st) return errorf(err, errlen, ST_NOMEM, "out of memory");
    int rc = 0;
    char *index_path = path_join(dir, "model.safetensors.index.json");
    char *text = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    if (!index_path) { rc = errorf(err, errlen, ST_NOMEM, "out of memory"); goto done; }

    if (access(index_path, F_OK) == 0) {
        if ((rc = file_read_all(index_path, 64u << 20, &text, &len, err, errlen)) != 0) goto done;
        root = cJSON_ParseWithLength(text, len);
        cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
        if (!cJSON_IsObject(map)) {
            rc = errorf(err, errlen, ST_FORMAT, "%s: not valid JSON with a \"weight_map\" object", index_path);
            goto done;
        }
        for (cJSON *e = map->child; e; e = e->next) {
            if (!cJSON_IsString(e)) {
                rc = errorf(err, errlen, ST_FORMAT, "%s: weight_map[\"%s\"] is not a file name", index_path, e->string ? e->string : "?");
                goto done;
            }
            int sidx = add_shard(st, dir, e->valuestring, err, errlen);
            if (sidx < 0) { rc = sidx; goto done; }
        }
        if (st->n_shards == 0) { rc = errorf(err, errlen, ST_FORMAT, "%s: weight_map is empty", index_path); goto done; }
        if ((rc = safetensors_finish(st, err, errlen)) != 0) goto done;
        /* Every index entry must exist in the shard the index names. */
        for (cJSON *e = map->child; e; e = e->next) {
            struct st_tensor *t = safetensors_find(st, e->string);
            char *want = path_join(dir, e->valuestring);
            bool ok = t && want && strcmp(st->shards[t->shard].path, want) == 0;
            free(want);
            if (!ok) {
                rc = errorf(err, errlen, ST_FORMAT, "%s: tensor %s is listed for shard %s but not found there",
                            index_path, e->string, e->valuestring);
                goto done;
            }
        }
    } else {
        char *single = path_join(dir, "model.safetensors");
        if (!single) { rc = errorf(err, errlen, ST_NOMEM, "out of memory"); goto done; }
        bool exists = access(single, F_OK) == 0;
        free(single);
        if (!exists) {
            rc = errorf(err, errlen, ST_IO, "%s: neither model.safetensors.index.json nor model.safetensors found", dir);
            goto done;
        }
        int sidx = add_shard(st, dir, "model.safetensors", err, errlen);
        if (sidx < 0) { rc = sidx; goto done; }
        if ((rc = safetensors_finish(st, err, errlen)) != 0) goto done;
    }
done:
    cJSON_Delete(root);
    free(text);
    free(index_path);
    if (rc) {
        safetensors_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

void safetensors_close(safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->n_shards; i++) {
        if (st->shards[i].map) munmap(st->shards[i].map, st->shards[i].size);
        if (st->shards[i].fd >= 0) close(st->shards[i].fd);
        free(st->shards[i].path);
    }
    free(st->shards);
    free(st);
}
