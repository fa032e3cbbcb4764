/* tests/unit/test_synth.c — model/synth: the in-memory checkpoint equals the files
 * synth_write produces byte for byte, does not depend on the thread count, binds
 * with config_parse + weights_bind, and its quantized groups are what MLX's
 * affine quantizer would give (bias = -2^(bits-1) * scale exactly, both signs of
 * scale, codes spread over the whole range), and lm_head is tied to the permuted
 * embedding rows as synth.h documents. */
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "model/config.h"
#include "model/synth.h"
#include "model/weights.h"
#include "runtime/bf16.h"
#include "runtime/safetensors.h"

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    uint8_t *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void rm_dir(const char *dir) {
    char pat[512];
    snprintf(pat, sizeof pat, "%s/*", dir);
    glob_t g;
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) unlink(g.gl_pathv[i]);
        globfree(&g);
    }
    rmdir(dir);
}

static void check_quant(const safetensors *st, const char *module, int bits) {
    char n[256];
    snprintf(n, sizeof n, "%s.scales", module);
    const struct st_tensor *s = safetensors_find(st, n);
    snprintf(n, sizeof n, "%s.biases", module);
    const struct st_tensor *b = safetensors_find(st, n);
    snprintf(n, sizeof n, "%s.weight", module);
    const struct st_tensor *w = safetensors_find(st, n);
    CHECK(s && b && w, "%s: missing parts", module);
    if (!s || !b || !w) return;
    const uint16_t *sv = s->data, *bv = b->data;
    const size_t groups = s->nbytes / 2;
    size_t neg = 0, exact = 0;
    for (size_t i = 0; i < groups; i++) {
        const float sc = bf16_to_f32(sv[i]), bi = bf16_to_f32(bv[i]);
        neg += sc < 0;
        exact += bi == -(float)(1 << (bits - 1)) * sc && sc != 0.0f;
    }
    CHECK(exact == groups, "%s: %zu of %zu groups have bias = -2^(b-1) scale", module, exact, groups);
    CHECK(neg > groups / 4 && neg < groups * 3 / 4, "%s: %zu of %zu scales negative", module, neg, groups);
    /* codes: every value occurs */
    const uint8_t *c = w->data;
    int seen[256] = {0};
    for (size_t i = 0; i < w->nbytes; i++) {
        if (bits == 8) seen[c[i]] = 1;
        else { seen[c[i] & 15] = 1; seen[c[i] >> 4] = 1; }
    }
    int k = 0;
    for (int i = 0; i < (1 << bits); i++) k += seen[i];
    CHECK(k >= (1 << bits) * 9 / 10, "%s: only %d of %d codes occur", module, k, 1 << bits);
}

/* The direct path (synth.h): lm_head row j is tied to embedding row pi(j), pi a bijection
 * inside blocks of rows of one 4 MiB code chunk, i -> (A i + n/3) mod n. Its scales are
 * the embedding row's times 2/sqrt(H) (bf16), its biases -8 x scale, and a fraction
 * a = min(1, 12/sqrt(H)) of its codes are the embedding row's (the rest uniform: the
 * same code with probability 1/16). */
static size_t perm(size_t i, size_t n) {
    uint64_t A = (0x9E3779B1ull % n) | 1;
    for (;;) {
        uint64_t x = A, y = n;
        while (y) { const uint64_t t = x % y; x = y; y = t; }
        if (x == 1) break;
        A += 2;
    }
    return (size_t)((A * i + n / 3) % n);
}

static void check_tied_lm_head(const safetensors *st, int H) {
    const struct st_tensor *ec = safetensors_find(st, "language_model.model.embed_tokens.weight"),
                           *es = safetensors_find(st, "language_model.model.embed_tokens.scales"),
                           *lc = safetensors_find(st, "language_model.lm_head.weight"),
                           *ls = safetensors_find(st, "language_model.lm_head.scales"),
                           *lb = safetensors_find(st, "language_model.lm_head.biases");
    CHECK(ec && es && lc && ls && lb, "lm_head / embedding parts missing");
    if (!ec || !es || !lc || !ls || !lb) return;
    const size_t rb = (size_t)H / 2, G = (size_t)H / 64, V = lc->nbytes / rb, R = ((size_t)4 << 20) / rb;
    const uint8_t *e = ec->data, *l = lc->data;
    const uint16_t *esv = es->data, *lsv = ls->data, *lbv = lb->data;
    const float ratio = 2.0f / sqrtf((float)H), a = fminf(1.0f, 12.0f / sqrtf((float)H));
    size_t bad_scale = 0, same = 0, total = 0;
    for (size_t j = 0; j < V; j++) {
        const size_t b0 = j / R * R, n = V - b0 < R ? V - b0 : R, src = b0 + perm(j - b0, n);
        for (size_t g = 0; g < G; g++) {
            const float want = round_bf16(ratio * bf16_to_f32(esv[src * G + g]));
            bad_scale += bf16_to_f32(lsv[j * G + g]) != want || bf16_to_f32(lbv[j * G + g]) != -8.0f * want;
        }
        if (j % 16 == 0)
            for (size_t b = 0; b < rb; b++) {
                same += (l[j * rb + b] & 15) == (e[src * rb + b] & 15);
                same += (l[j * rb + b] >> 4) == (e[src * rb + b] >> 4);
                total += 2;
            }
    }
    CHECK(bad_scale == 0, "lm_head: %zu groups whose scale/bias is not the tied embedding row's", bad_scale);
    const double frac = (double)same / (double)total, expect = a + (1.0 - a) / 16.0;
    CHECK(fabs(frac - expect) < 0.01, "lm_head: %.4f of codes equal the tied embedding row's, expected %.4f", frac, expect);
}

int main(void) {
    char err[1024];
    const char *shapes[] = {"tiny", "small"};
    for (size_t si = 0; si < 2; si++) {
        struct synth_options o = {.shape = shapes[si], .seed = 7, .threads = 2, .quiet = true};
        safetensors *st = NULL;
        char *cfg_json = NULL;
        struct synth_result res;
        int rc = synth_build_memory(&o, &st, &cfg_json, &res, err, sizeof err);
        CHECK(rc == 0, "%s: synth_build_memory: %s", shapes[si], err);
        if (rc) continue;
        CHECK(res.n_shards >= 2, "%s: %d shards", shapes[si], res.n_shards);
        CHECK(st->n_tensors == res.n_tensors, "%s: %d tensors parsed, %d planned", shapes[si], st->n_tensors, res.n_tensors);

        /* binds like a checkpoint from disk */
        struct model_config cfg;
        rc = config_parse(&cfg, cfg_json, strlen(cfg_json), "synth config", err, sizeof err);
        CHECK(rc == 0, "%s: config_parse: %s", shapes[si], err);
        if (rc == 0) {
            struct model_weights w;
            memset(&w, 0, sizeof w);
            rc = weights_bind(&w, &cfg, st, err, sizeof err);
            CHECK(rc == 0, "%s: weights_bind: %s", shapes[si], err);
            CHECK(w.n_copies == 0, "%s: %zu tensors needed an aligned copy", shapes[si], w.n_copies);
            if (rc == 0) weights_free(&w);
        }
        check_quant(st, "language_model.model.embed_tokens", 4);
        check_quant(st, "language_model.model.layers.0.mlp.gate", 8);
        check_quant(st, "language_model.model.layers.3.self_attn.q_proj", 4);
        check_quant(st, "language_model.model.layers.1.mlp.switch_mlp.down_proj", 4);
        check_tied_lm_head(st, si == 0 ? 128 : 256);

        /* files == memory, and a different thread count gives the same bytes */
        char dir[] = "/tmp/orchid-test-synth-XXXXXX";
        CHECK(mkdtemp(dir) != NULL, "mkdtemp failed");
        struct synth_options o1 = o;
        o1.threads = 1;
        o1.tokenizer_dir = NULL;
        rc = synth_write(dir, &o1, &res, err, sizeof err);
        CHECK(rc == 0, "%s: synth_write: %s", shapes[si], err);
        for (int i = 0; rc == 0 && i < st->n_shards; i++) {
            const char *base = strrchr(st->shards[i].path, '/') + 1;
            char path[600];
            snprintf(path, sizeof path, "%s/%s", dir, base);
            size_t len = 0;
            uint8_t *f = slurp(path, &len);
            CHECK(f && len == st->shards[i].size && memcmp(f, st->shards[i].map, len) == 0, "%s: %s differs from memory",
                  shapes[si], base);
            free(f);
        }
        size_t clen = 0;
        char cpath[600];
        snprintf(cpath, sizeof cpath, "%s/config.json", dir);
        uint8_t *c = slurp(cpath, &clen);
        CHECK(c && clen == strlen(cfg_json) && memcmp(c, cfg_json, clen) == 0, "%s: config.json differs", shapes[si]);
        free(c);
        /* another seed gives other bytes */
        struct synth_options o2 = o;
        o2.seed = 8;
        safetensors *st2 = NULL;
        char *cfg2 = NULL;
        if (synth_build_memory(&o2, &st2, &cfg2, NULL, err, sizeof err) == 0) {
            CHECK(memcmp(st2->shards[0].map, st->shards[0].map, st->shards[0].size) != 0, "%s: seed ignored", shapes[si]);
            safetensors_close(st2);
            free(cfg2);
        }
        rm_dir(dir);
        safetensors_close(st);
        free(cfg_json);
    }
    /* bad shape */
    struct synth_options bad = {.shape = "huge"};
    safetensors *st = NULL;
    char *cj = NULL;
    CHECK(synth_build_memory(&bad, &st, &cj, NULL, err, sizeof err) != 0 && strstr(err, "unknown shape"), "bad shape accepted");
    CHECK(!synth_shape_valid("huge") && synth_shape_valid("35b-a3b"), "synth_shape_valid");
    return check_summary();
}
