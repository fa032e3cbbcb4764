/* tests/unit/test_text_tokenizer.c — the tokenizer's unit tests, and the batch
 * driver the Python parity tests call.
 *
 * No arguments: unit tests on the real Qwen3.6 vocabulary in .cache/tokenizer
 * (made by tools/fetch_tokenizer.py; run here if missing; skipped with a note
 * if it cannot be made) and on a tiny hand-written tokenizer.json that
 * exercises the BPE orderings (small scan and large heap paths).
 *
 * Driver modes (used by tests/python/test_tokenizer.py and the benchmark):
 *   --encode-batch DIR IN OUT   IN: one JSON string per line. OUT: per input two
 *                               lines: ids separated by spaces, then the JSON
 *                               string of decode(ids). Also checks that the
 *                               streaming detokenizer reproduces decode(ids)
 *                               (exit 3 on a mismatch).
 *   --decode-batch DIR IN OUT   IN: one JSON [skip_special, [ids...]] per line.
 *                               OUT: JSON string of decode per line (streaming
 *                               checked the same way).
 *   --bench DIR FILE ROUNDS     load time, then encode FILE (whole file as one
 *                               text, and line by line) ROUNDS times; prints JSON.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "runtime/status.h"
#include "text/tokenizer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of this thread: the benchmark's measure, robust to a busy machine. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) {
        p[n] = 0;
        if (len) *len = (size_t)n;
    }
    return p;
}

/* Writes s[0..n) as one JSON string line (NUL and control bytes escaped). */
static void json_line(FILE *o, const char *s, size_t n) {
    fputc('"', o);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(o, "\\%c", c);
        else if (c < 0x20) fprintf(o, "\\u%04x", c);
        else fputc(c, o);
    }
    fputs("\"\n", o);
}

/* Streams ids through a detok_stream and compares with the batch decode. */
static int stream_matches(const tokenizer *tok, const int32_t *ids, size_t n, int skip, const char *want,
                          size_t wlen) {
    detok_stream *ds;
    char err[256];
    if (detok_stream_new(&ds, tok, skip, err, sizeof err)) return 0;
    char *acc = malloc(wlen * 2 + 64);
    size_t al = 0, cap = wlen * 2 + 64;
    int ok = 1;
    for (size_t i = 0; i <= n && ok; i++) {
        const char *p;
        size_t l;
        if (i < n) {
            if (detok_push(ds, ids[i], &p, &l, err, sizeof err)) ok = 0;
        } else {
            detok_flush(ds, &p, &l);
        }
        if (!ok) break;
        /* never a partial UTF-8 sequence at the end of a piece */
        if (l && ((unsigned char)p[l - 1] & 0x80)) {
            size_t k = l - 1;
            while (k > 0 && ((unsigned char)p[k] & 0xC0) == 0x80) k--;
            unsigned char lead = (unsigned char)p[k];
            size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
            if (l - k != need) ok = 0;
        }
        if (al + l > cap) {
            cap = (al + l) * 2;
            acc = realloc(acc, cap);
        }
        memcpy(acc + al, p, l);
        al += l;
    }
    if (ok) ok = al == wlen && memcmp(acc, want, wlen) == 0;
    free(acc);
    detok_stream_free(ds);
    return ok;
}

/* Writes decode(ids) as one JSON line; returns whether the streaming detokenizer
 * produced exactly the same text. */
static int write_decoded(FILE *fo, const tokenizer *tok, const int32_t *ids, size_t n, int skip) {
    char err[512], *text = NULL;
    size_t tl = 0;
    tokenizer_decode(tok, ids, n, skip, &text, &tl, err, sizeof err);
    json_line(fo, text ? text : "", tl);
    const int ok = stream_matches(tok, ids, n, skip, text ? text : "", tl);
    free(text);
    return ok;
}

static int encode_batch(const char *dir, const char *in, const char *out) {
    char err[512];
    tokenizer *tok;
    if (tokenizer_load(&tok, dir, err, sizeof err)) {
        fprintf(stderr, "load: %s\n", err);
        return 2;
    }
    FILE *fi = fopen(in, "rb"), *fo = fopen(out, "wb");
    if (!fi || !fo) {
        fprintf(stderr, "cannot open %s / %s\n", in, out);
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t ln;
    int bad = 0;
    while ((ln = getline(&line, &cap, fi)) > 0) {
        cJSON *js = cJSON_ParseWithLength(line, (size_t)ln);
        if (!cJSON_IsString(js)) {
            fprintf(stderr, "bad input line\n");
            return 2;
        }
        const char *s = js->valuestring;
        int32_t *ids;
        size_t n;
        if (tokenizer_encode(tok, s, strlen(s), &ids, &n, err, sizeof err)) {
            fprintf(fo, "ERROR %s\n\"\"\n", err);
            cJSON_Delete(js);
            continue;
        }
        for (size_t i = 0; i < n; i++) fprintf(fo, i ? " %d" : "%d", ids[i]);
        fputc('\n', fo);
        if (!write_decoded(fo, tok, ids, n, 0)) {
            fprintf(stderr, "streaming detokenizer differs from decode on: %.60s\n", s);
            bad = 1;
        }
        free(ids);
        cJSON_Delete(js);
    }
    free(line);
    fclose(fi);
    fclose(fo);
    tokenizer_free(tok);
    return bad ? 3 : 0;
}

static int decode_batch(const char *dir, const char *in, const char *out) {
    char err[512];
    tokenizer *tok;
    if (tokenizer_load(&tok, dir, err, sizeof err)) {
        fprintf(stderr, "load: %s\n", err);
        return 2;
    }
    FILE *fi = fopen(in, "rb"), *fo = fopen(out, "wb");
    if (!fi || !fo) return 2;
    char *line = NULL;
    size_t cap = 0;
    ssize_t ln;
    int bad = 0;
    while ((ln = getline(&line, &cap, fi)) > 0) {
        cJSON *js = cJSON_ParseWithLength(line, (size_t)ln);
        int skip = cJSON_IsTrue(cJSON_GetArrayItem(js, 0));
        cJSON *arr = cJSON_GetArrayItem(js, 1);
        size_t n = (size_t)cJSON_GetArraySize(arr), k = 0;
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) ids[k++] = it->valueint;
        if (!write_decoded(fo, tok, ids, n, skip)) {
            fprintf(stderr, "streaming detokenizer differs from decode\n");
            bad = 1;
        }
        free(ids);
        cJSON_Delete(js);
    }
    free(line);
    fclose(fi);
    fclose(fo);
    tokenizer_free(tok);
    return bad ? 3 : 0;
}

static int bench(const char *dir, const char *file, int rounds) {
    char err[512];
    tokenizer *tok;
    double load_wall = 1e9, load_cpu = 1e9;
    for (int r = 0; r < rounds; r++) { /* best of rounds; the last load is kept */
        double w0 = now_s(), c0 = cpu_s();
        if (tokenizer_load(&tok, dir, err, sizeof err)) {
            fprintf(stderr, "load: %s\n", err);
            return 2;
        }
        double w = now_s() - w0, c = cpu_s() - c0;
        if (w < load_wall) load_wall = w;
        if (c < load_cpu) load_cpu = c;
        if (r + 1 < rounds) tokenizer_free(tok);
    }
    size_t len;
    char *text = slurp(file, &len);
    if (!text) return 2;
    double best_whole = 1e9, best_lines = 1e9, cpu_whole = 1e9, cpu_lines = 1e9;
    size_t ntok = 0;
    for (int r = 0; r < rounds; r++) {
        int32_t *ids;
        size_t n;
        /* a fresh tokenizer per round, so the pre-token cache starts cold each time */
        tokenizer_free(tok);
        if (tokenizer_load(&tok, dir, err, sizeof err)) return 2;
        double t0 = now_s(), c0 = cpu_s();
        if (tokenizer_encode(tok, text, len, &ids, &n, err, sizeof err)) {
            fprintf(stderr, "encode: %s\n", err);
            return 2;
        }
        double dt = now_s() - t0, dc = cpu_s() - c0;
        if (dt < best_whole) best_whole = dt;
        if (dc < cpu_whole) cpu_whole = dc;
        ntok = n;
        free(ids);
        /* line by line (many small encode calls, like a batch of documents) */
        tokenizer_free(tok);
        if (tokenizer_load(&tok, dir, err, sizeof err)) return 2;
        t0 = now_s();
        c0 = cpu_s();
        size_t s = 0;
        for (size_t i = 0; i <= len; i++) {
            if (i == len || text[i] == '\n') {
                if (tokenizer_encode(tok, text + s, i - s, &ids, &n, err, sizeof err) == 0) free(ids);
                s = i + 1;
            }
        }
        dt = now_s() - t0;
        dc = cpu_s() - c0;
        if (dt < best_lines) best_lines = dt;
        if (dc < cpu_lines) cpu_lines = dc;
    }
    printf("{\"load_ms\": %.1f, \"load_cpu_ms\": %.1f, \"bytes\": %zu, \"tokens\": %zu, "
           "\"whole_s\": %.4f, \"whole_cpu_s\": %.4f, \"lines_s\": %.4f, \"lines_cpu_s\": %.4f}\n",
           load_wall * 1e3, load_cpu * 1e3, len, ntok, best_whole, cpu_whole, best_lines, cpu_lines);
    free(text);
    tokenizer_free(tok);
    return 0;
}

/* ---------------------------------------------------------------- unit tests */

static const char *real_dir(void) {
    const char *env = getenv("ORCHID_TOKENIZER_DIR");
    if (env) return env;
    if (access(".cache/tokenizer/tokenizer.json", R_OK) != 0 && access(".venv/bin/python", X_OK) == 0) {
        if (system(".venv/bin/python tools/fetch_tokenizer.py >/dev/null") != 0) return NULL;
    }
    return access(".cache/tokenizer/tokenizer.json", R_OK) == 0 ? ".cache/tokenizer" : NULL;
}

static int ids_equal(const tokenizer *tok, const char *text, const int32_t *want, size_t nw) {
    int32_t *ids;
    size_t n;
    char err[256];
    if (tokenizer_encode(tok, text, strlen(text), &ids, &n, err, sizeof err)) return 0;
    int ok = n == nw && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!ok) {
        fprintf(stderr, "  encode(%s) =", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    return ok;
}

/* Several threads encoding at once (the pre-token cache is shared) must get
 * exactly the single-threaded ids. */
typedef struct thr_arg {
    const tokenizer *tok;
    const char *text;
    const int32_t *want;
    size_t nwant;
    int bad;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    char err[128];
    for (int r = 0; r < 40; r++) {
        int32_t *ids;
        size_t n;
        if (tokenizer_encode(a->tok, a->text, strlen(a->text), &ids, &n, err, sizeof err)) {
            a->bad++;
            continue;
        }
        if (n != a->nwant || memcmp(ids, a->want, n * sizeof *ids)) a->bad++;
        free(ids);
    }
    return NULL;
}

static void test_threads(const tokenizer *tok) {
    const char *text = "The quick brown fox can't jump 1234 times; 日本語 👍🏽 it'S <think>x</think>\n\n  end";
    int32_t *want;
    size_t n;
    char err[128];
    if (tokenizer_encode(tok, text, strlen(text), &want, &n, err, sizeof err)) return;
    pthread_t th[4];
    thr_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (thr_arg){tok, text, want, n, 0};
        pthread_create(&th[i], NULL, thr_main, &a[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += a[i].bad;
    }
    CHECK(bad == 0, "%d threaded encodes differ", bad);
    free(want);
}

static void test_real(const char *dir) {
    char err[512];
    tokenizer *tok = NULL;
    double t0 = now_s();
    int rc = tokenizer_load(&tok, dir, err, sizeof err);
    double ms = (now_s() - t0) * 1e3;
    CHECK(rc == 0, "load %s: %s", dir, err);
    if (rc) return;
    printf("tokenizer load: %.1f ms\n", ms);
    CHECK(tokenizer_vocab_size(tok) == 248077, "vocab size %d", tokenizer_vocab_size(tok));
    CHECK(tokenizer_eos_id(tok) == 248046, "eos %d", tokenizer_eos_id(tok));
    CHECK(tokenizer_pad_id(tok) == 248044, "pad %d", tokenizer_pad_id(tok));
    CHECK(tokenizer_chat_template(tok) != NULL, "chat template loaded");
    CHECK(tokenizer_token_to_id(tok, "<think>") == 248068, "<think>");
    CHECK(tokenizer_token_to_id(tok, "</think>") == 248069, "</think>");
    CHECK(tokenizer_token_to_id(tok, "Ċ") == 198, "newline token");
    CHECK(tokenizer_token_to_id(tok, "no such token!!") == -1, "absent token");
    CHECK(strcmp(tokenizer_id_to_token(tok, 248045), "<|im_start|>") == 0, "id_to_token added");
    CHECK(strcmp(tokenizer_id_to_token(tok, 271), "ĊĊ") == 0, "id_to_token 271");
    CHECK(tokenizer_id_to_token(tok, 248100) == NULL, "unused id");
    CHECK(tokenizer_is_special(tok, 248046) && !tokenizer_is_special(tok, 248068), "special flags");
    CHECK(tokenizer_is_added(tok, 248068) && !tokenizer_is_added(tok, 198), "added flags");

    static const int32_t a[] = {248045, 846, 198};
    CHECK(ids_equal(tok, "<|im_start|>user\n", a, 3), "im_start user");
    static const int32_t b[] = {248045, 74455, 198, 248068, 271, 248069, 271};
    CHECK(ids_equal(tok, "<|im_start|>assistant\n<think>\n\n</think>\n\n", b, 7), "assistant think");
    static const int32_t c[] = {16, 15};
    CHECK(ids_equal(tok, "10", c, 2), "digits split");
    static const int32_t d[] = {220, 16};
    CHECK(ids_equal(tok, " 1", d, 2), "space before digit");
    CHECK(ids_equal(tok, "", NULL, 0), "empty text");

    int32_t *ids;
    size_t n;
    rc = tokenizer_encode(tok, "ab\xC3(", 4, &ids, &n, err, sizeof err);
    CHECK(rc == ST_INVALID && strstr(err, "offset 2"), "invalid UTF-8 rejected: %s", err);
    rc = tokenizer_encode(tok, "\xED\xA0\x80", 3, &ids, &n, err, sizeof err);
    CHECK(rc == ST_INVALID, "surrogate rejected");
    rc = tokenizer_encode(tok, "\xC0\xAF", 2, &ids, &n, err, sizeof err);
    CHECK(rc == ST_INVALID, "overlong rejected");

    /* decode, skip_special, streaming over a split emoji */
    const char *txt = "<|im_start|>hé 👍🏽 日本語<|im_end|>";
    rc = tokenizer_encode(tok, txt, strlen(txt), &ids, &n, err, sizeof err);
    CHECK(rc == 0, "encode: %s", err);
    char *out;
    size_t ol;
    tokenizer_decode(tok, ids, n, 0, &out, &ol, err, sizeof err);
    CHECK(strcmp(out, txt) == 0, "decode round trip: %s", out);
    CHECK(stream_matches(tok, ids, n, 0, out, ol), "stream == decode");
    free(out);
    tokenizer_decode(tok, ids, n, 1, &out, &ol, err, sizeof err);
    CHECK(strcmp(out, "hé 👍🏽 日本語") == 0, "skip special: %s", out);
    CHECK(stream_matches(tok, ids, n, 1, out, ol), "stream == decode (skip)");
    free(out);
    free(ids);

    /* a cut multi-byte char: the stream holds it, flush gives U+FFFD as decode does */
    int32_t e1 = tokenizer_token_to_id(tok, "ð");   /* byte F0 */
    int32_t e2 = tokenizer_token_to_id(tok, "Ł");   /* byte 9F (U+0141 maps to 0x9F) */
    CHECK(e1 >= 0 && e2 >= 0, "byte tokens");
    detok_stream *ds;
    detok_stream_new(&ds, tok, 1, err, sizeof err);
    const char *p;
    size_t l;
    detok_push(ds, e1, &p, &l, err, sizeof err);
    CHECK(l == 0, "lead byte held (%zu)", l);
    detok_push(ds, e2, &p, &l, err, sizeof err);
    CHECK(l == 0, "two bytes held");
    detok_flush(ds, &p, &l);
    CHECK(l == 3 && memcmp(p, "\xEF\xBF\xBD", 3) == 0, "flush -> U+FFFD");
    int32_t two[2] = {e1, e2};
    tokenizer_decode(tok, two, 2, 0, &out, &ol, err, sizeof err);
    CHECK(strcmp(out, "\xEF\xBF\xBD") == 0, "decode cut char -> one U+FFFD");
    free(out);
    detok_reset(ds);
    detok_push(ds, tokenizer_token_to_id(tok, "a"), &p, &l, err, sizeof err);
    CHECK(l == 1 && p[0] == 'a', "ascii passes through");
    detok_stream_free(ds);

    /* 100 kB texts: long runs go through the heap BPE path */
    size_t big = 100000;
    char *s = malloc(big + 1);
    for (size_t i = 0; i < big; i++) s[i] = (char)('a' + (i * 7 % 26) * (i % 3 == 0));
    s[big] = 0;
    for (size_t i = 0; i < big; i++)
        if (s[i] == 0) s[i] = 'x';
    t0 = now_s();
    rc = tokenizer_encode(tok, s, big, &ids, &n, err, sizeof err);
    CHECK(rc == 0 && n > 0, "100 kB single word: %s", err);
    tokenizer_decode(tok, ids, n, 0, &out, &ol, err, sizeof err);
    CHECK(ol == big && memcmp(out, s, big) == 0, "100 kB round trip");
    free(out);
    free(ids);
    memset(s, ' ', big);
    rc = tokenizer_encode(tok, s, big, &ids, &n, err, sizeof err);
    CHECK(rc == 0 && n > 0, "100 kB spaces: %s", err);
    free(ids);
    free(s);
    printf("100 kB cases: %.1f ms\n", (now_s() - t0) * 1e3);
    test_threads(tok);
    tokenizer_free(tok);
}

/* A tiny byte-level BPE: checks rank order, leftmost tie-breaking and that the
 * small (scan) and large (heap) paths agree. */
static void test_tiny(void) {
    char dir[] = "/tmp/orchid_tok_XXXXXX";
    if (!mkdtemp(dir)) return;
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    /* vocab: all 256 byte chars, then "aa", "aaa", "ab", "ba" */
    fputs("{\"added_tokens\":[{\"id\":300,\"content\":\"<x>\",\"special\":true}],"
          "\"normalizer\":{\"type\":\"NFC\"},"
          "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
          "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+|[^\\\\s]+\"},\"behavior\":\"Isolated\",\"invert\":false},"
          "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
          "\"decoder\":{\"type\":\"ByteLevel\"},"
          "\"model\":{\"type\":\"BPE\",\"vocab\":{",
          f);
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        unsigned cp = keep ? (unsigned)b : 0x100u + (unsigned)extra++;
        char u[8];
        if (cp == '"' || cp == '\\') snprintf(u, sizeof u, "\\%c", (char)cp);
        else if (cp < 0x80) snprintf(u, sizeof u, "%c", (char)cp);
        else snprintf(u, sizeof u, "%c%c", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)));
        fprintf(f, "\"%s\":%d,", u, b);
    }
    fputs("\"aa\":256,\"aaa\":257,\"ab\":258,\"ba\":259},"
          "\"merges\":[[\"a\",\"a\"],[\"aa\",\"a\"],[\"b\",\"a\"],\"a b\"]}}",
          f);
    fclose(f);
    char err[256];
    tokenizer *tok;
    int rc = tokenizer_load(&tok, dir, err, sizeof err);
    CHECK(rc == 0, "tiny load: %s", err);
    if (rc) return;
    static const int32_t w1[] = {256, 256}; /* aaaa: (a,a) rank 0 wins twice -> aa aa */
    CHECK(ids_equal(tok, "aaaa", w1, 2), "aaaa");
    static const int32_t w0[] = {257}; /* aaa: aa a -> aaa */
    CHECK(ids_equal(tok, "aaa", w0, 1), "aaa");
    static const int32_t w2[] = {97, 259}; /* aba: (b,a) rank 2 beats (a,b) rank 3 */
    CHECK(ids_equal(tok, "aba", w2, 2), "aba");
    static const int32_t w3[] = {300, 258, 32, 300}; /* added tokens matched before the split */
    CHECK(ids_equal(tok, "<x>ab <x>", w3, 4), "added");
    /* heap path (> 48 bytes) must equal the scan path on the same pattern */
    char big[200], small[20];
    for (int i = 0; i < 199; i++) big[i] = "aab"[i % 3];
    big[199] = 0;
    memcpy(small, big, 18);
    small[18] = 0;
    int32_t *i1, *i2;
    size_t n1, n2;
    tokenizer_encode(tok, big, strlen(big), &i1, &n1, err, sizeof err);
    tokenizer_encode(tok, small, strlen(small), &i2, &n2, err, sizeof err);
    int ok = n2 <= n1;
    for (size_t i = 0; ok && i < n2 - 1; i++) ok = i1[i] == i2[i]; /* same prefix (last symbol may differ) */
    CHECK(ok, "heap path agrees with scan path");
    free(i1);
    free(i2);
    /* no ids: "" (was NULL + 0 in the lossy append, UBSan; fuzz_tokenizer) */
    char *empty = NULL;
    size_t el = 1;
    rc = tokenizer_decode(tok, NULL, 0, 0, &empty, &el, err, sizeof err);
    CHECK(rc == 0 && empty && el == 0 && empty[0] == 0, "decode of no ids");
    free(empty);
    tokenizer_free(tok);
    unlink(path);
    rmdir(dir);

    rc = tokenizer_load(&tok, "/nonexistent/dir", err, sizeof err);
    CHECK(rc == ST_IO && tok == NULL, "missing path -> ST_IO");
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--encode-batch") == 0) return encode_batch(argv[2], argv[3], argv[4]);
    if (argc == 5 && strcmp(argv[1], "--decode-batch") == 0) return decode_batch(argv[2], argv[3], argv[4]);
    if (argc == 5 && strcmp(argv[1], "--bench") == 0) return bench(argv[2], argv[3], atoi(argv[4]));
    test_tiny();
    const char *dir = real_dir();
    if (dir) test_real(dir);
    else printf("note: no .cache/tokenizer (run tools/fetch_tokenizer.py); real-vocabulary tests skipped\n");
    return check_summary();
}
