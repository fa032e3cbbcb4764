/* tests/fuzz/fuzz_tokenizer.c — libFuzzer target: tokenizer_encode on arbitrary bytes
 * with the real Qwen3.6 vocabulary (.cache/tokenizer/tokenizer.json, made by
 * tools/fetch_tokenizer.py; $ORCHID_TOKENIZER overrides), loaded once per process.
 *
 * Invariants:
 *   - invalid UTF-8 is rejected with ST_INVALID and a message, nothing else;
 *   - valid UTF-8 encodes, every id is a used one (< vocab size, has bytes), and
 *     decode(encode(x)) == NFC(x) (utf8proc, as the normalizer). Where x holds an
 *     added token's text the segments around it are normalised separately, so
 *     there only NFC(decode(encode(x))) == NFC(x) is required;
 *   - the streaming detokenizer, fed the ids one at a time, gives exactly decode's text.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "runtime/status.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

static tokenizer *tok;
static char *added[64]; /* contents of the added tokens */
static size_t added_len[64];
static int n_added;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *path = getenv("ORCHID_TOKENIZER");
    if (!path) path = ".cache/tokenizer/tokenizer.json";
    char err[512];
    if (tokenizer_load(&tok, path, err, sizeof err)) {
        fprintf(stderr, "fuzz_tokenizer: %s (run tools/fetch_tokenizer.py)\n", err);
        exit(1);
    }
    for (int32_t id = 0; id < tokenizer_vocab_size(tok) && n_added < 64; id++) {
        if (!tokenizer_is_added(tok, id)) continue;
        size_t n;
        const char *b = tokenizer_token_bytes(tok, id, &n);
        if (!b || !n) continue;
        added[n_added] = malloc(n);
        memcpy(added[n_added], b, n);
        added_len[n_added++] = n;
    }
    return 0;
}

static char *nfc(const char *s, size_t n, size_t *out_n) {
    utf8proc_uint8_t *r = NULL;
    utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &r,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (k < 0) abort();
    *out_n = (size_t)k;
    return (char *)r;
}

static int holds_added(const char *s, size_t n) {
    for (int i = 0; i < n_added; i++)
        if (memmem(s, n, added[i], added_len[i])) return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data;
    int32_t *ids = NULL;
    size_t n = 0;
    char err[512] = "";
    int rc = tokenizer_encode(tok, s, size, &ids, &n, err, sizeof err);
    int valid = utf8_validate(s, size) == size;
    if (!valid) {
        if (rc != ST_INVALID || !err[0]) abort();
        free(ids);
        return 0;
    }
    if (rc != 0 || !ids) abort();
    int32_t vocab = tokenizer_vocab_size(tok);
    for (size_t i = 0; i < n; i++) {
        size_t bl;
        if (ids[i] < 0 || ids[i] >= vocab || !tokenizer_token_bytes(tok, ids[i], &bl)) abort();
    }
    char *text = NULL;
    size_t tn = 0;
    if (tokenizer_decode(tok, ids, n, 0, &text, &tn, err, sizeof err)) abort();
    size_t wn;
    char *want = nfc(s, size, &wn);
    if (tn != wn || memcmp(text, want, wn)) {
        if (!holds_added(s, size)) abort();
        size_t gn;
        char *got = nfc(text, tn, &gn);
        if (gn != wn || memcmp(got, want, wn)) abort();
        free(got);
    }
    free(want);

    /* the streaming detokenizer gives decode's text */
    detok_stream *ds;
    if (detok_stream_new(&ds, tok, 0, err, sizeof err)) abort();
    buf out = {0};
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t k;
        if (detok_push(ds, ids[i], &p, &k, err, sizeof err)) abort();
        buf_append(&out, p, k);
    }
    const char *p;
    size_t k;
    if (detok_flush(ds, &p, &k)) abort();
    buf_append(&out, p, k);
    if (out.len != tn || (tn && memcmp(out.data, text, tn))) abort();
    buf_free(&out);
    detok_stream_free(ds);
    free(text);
    free(ids);
    return 0;
}
