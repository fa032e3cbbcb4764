/* tests/fuzz/fuzz_tokenizer_load.c — libFuzzer target: arbitrary bytes as tokenizer.json
 * through tokenizer_load (written to a per-process temporary directory, in /dev/shm
 * when there is one: the loader reads files, and a file write is cheap).
 *
 * Invariants: a failure says why; a loaded tokenizer encodes a few fixed texts
 * (ASCII, non-ASCII, an added-token-like tag) into ids below its vocabulary size, or
 * rejects them with a message, decodes what it encoded, and frees cleanly. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "text/tokenizer.h"

static char dir[64], file[96];

static void cleanup(void) {
    unlink(file);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(dir, sizeof dir, "%s/orchid-fuzz-tok-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(file, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f)) abort();
    tokenizer *tok = NULL;
    char err[512] = "";
    int rc = tokenizer_load(&tok, file, err, sizeof err);
    if (rc) {
        if (!err[0] || tok) abort();
        return 0;
    }
    static const char *texts[] = {"Hello, world! 123", "naïve café — 東京 🙂", "<|im_start|>user\nhi<|im_end|>", " \n\t "};
    int32_t vocab = tokenizer_vocab_size(tok);
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        err[0] = 0;
        if (tokenizer_encode(tok, texts[i], strlen(texts[i]), &ids, &n, err, sizeof err)) {
            if (!err[0]) abort();
            free(ids);
            continue;
        }
        for (size_t k = 0; k < n; k++)
            if (ids[k] < 0 || ids[k] >= vocab) abort();
        char *text = NULL;
        if (tokenizer_decode(tok, ids, n, 0, &text, NULL, err, sizeof err) == 0) free(text);
        free(ids);
    }
    tokenizer_free(tok);
    return 0;
}
