/* tests/fuzz/fuzz_safetensors.c — libFuzzer target: one shard image (8-byte header
 * length, JSON header, data) through safetensors_parse_header. Every input must be
 * accepted with tensors inside the data region, or rejected with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    safetensors st = {0};
    char err[512] = "";
    int rc = safetensors_parse_header(&st, -1, data, size, err, sizeof err);
    if (rc != 0 && err[0] == 0) abort(); /* a failure must say why */
    for (int i = 0; i < st.n_tensors; i++) {
        const struct st_tensor *t = &st.tensors[i];
        if (rc == 0 && ((const uint8_t *)t->data < data || (const uint8_t *)t->data + t->nbytes > data + size)) abort();
        free(t->name);
    }
    free(st.tensors);
    return 0;
}
