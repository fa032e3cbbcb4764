/* tests/fuzz/fuzz_safetensors_index.c — libFuzzer target: arbitrary bytes as
 * model.safetensors.index.json through safetensors_open, in a per-process temporary
 * directory (in /dev/shm when there is one) that links the tiny test model's four real
 * shards (.cache/models/tiny-0, made by tests/python/models.py; $ORCHID_FUZZ_MODEL
 * overrides), so an index can name real shards and real tensors — or anything else.
 *
 * Invariants: a failure says why and returns nothing; an opened checkpoint has at
 * least one shard, and every tensor it lists lies inside its shard's mapping. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/safetensors.h"

static char dir[64], index_path[128];

static void cleanup(void) { /* (not <dirent.h>: its DT_UNKNOWN clashes with safetensors.h) */
    char p[256];
    for (int i = 1; i <= 4; i++) {
        snprintf(p, sizeof p, "%s/model-%05d-of-00004.safetensors", dir, i);
        unlink(p);
    }
    unlink(index_path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *model = getenv("ORCHID_FUZZ_MODEL");
    if (!model) model = ".cache/models/tiny-0";
    char *abs = realpath(model, NULL);
    if (!abs) {
        fprintf(stderr, "fuzz_safetensors_index: %s not found (make test builds it)\n", model);
        exit(1);
    }
    snprintf(dir, sizeof dir, "%s/orchid-fuzz-st-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(1);
    }
    atexit(cleanup);
    for (int i = 1; i <= 4; i++) {
        char from[1024], to[256];
        snprintf(from, sizeof from, "%s/model-%05d-of-00004.safetensors", abs, i);
        snprintf(to, sizeof to, "%s/model-%05d-of-00004.safetensors", dir, i);
        if (symlink(from, to)) {
            perror("symlink");
            exit(1);
        }
    }
    free(abs);
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(index_path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f)) abort();
    safetensors *st = NULL;
    char err[1024] = "";
    int rc = safetensors_open(&st, dir, err, sizeof err);
    if (rc) {
        if (!err[0] || st) abort();
        return 0;
    }
    if (!st || st->n_shards < 1) abort();
    for (int i = 0; i < st->n_tensors; i++) {
        const struct st_tensor *t = &st->tensors[i];
        if (t->shard < 0 || t->shard >= st->n_shards) abort();
        const uint8_t *base = st->shards[t->shard].map;
        if ((const uint8_t *)t->data < base || (const uint8_t *)t->data + t->nbytes > base + st->shards[t->shard].size)
            abort();
    }
    safetensors_close(st);
    return 0;
}
