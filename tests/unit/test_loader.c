/* tests/unit/test_loader.c — safetensors header parsing, config.json validation and
 * the thread pool: every malformed input must give a clear error, never a crash. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/config.h"
#include "runtime/safetensors.h"
#include "runtime/status.h"
#include "runtime/threadpool.h"

/* Builds a shard image: 8-byte length, header JSON, then data_len bytes of data. */
static uint8_t *shard(const char *header, size_t data_len, size_t *size) {
    size_t h = strlen(header);
    *size = 8 + h + data_len;
    uint8_t *b = calloc(1, *size);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    return b;
}

static int parse(const char *header, size_t data_len, char *err, size_t errlen) {
    size_t size;
    uint8_t *b = shard(header, data_len, &size);
    safetensors *st = calloc(1, sizeof *st);
    int rc = safetensors_parse_header(st, -1, b, size, err, errlen);
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    free(st);
    free(b);
    return rc;
}

static void test_safetensors(void) {
    char err[512];
    /* a good header: two tensors back to back */
    const char *good = "{\"__metadata__\":{\"format\":\"mlx\"},\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                       "\"b\":{\"dtype\":\"U32\",\"shape\":[4],\"data_offsets\":[12,28]}}";
    CHECK(parse(good, 28, err, sizeof err) == 0, "good header rejected: %s", err);

    struct { const char *header; size_t data; const char *needle; } bad[] = {
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", 8, "past the end"},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,10]}}", 12, "needs 12"},
        {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "unknown dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "invalid shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "invalid data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap"},
        {"{\"a\":", 0, "not a valid JSON"},
        {"[1,2,3]", 0, "not a valid JSON object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "dimensions"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, "invalid shape"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        int rc = parse(bad[i].header, bad[i].data, err, sizeof err);
        CHECK(rc < 0, "bad header %zu accepted", i);
        CHECK(strstr(err, bad[i].needle) != NULL, "bad header %zu: message \"%s\" lacks \"%s\"", i, err, bad[i].needle);
    }
    /* header length larger than the file */
    uint8_t tiny[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
    safetensors st0 = {0};
    CHECK(safetensors_parse_header(&st0, -1, tiny, sizeof tiny, err, sizeof err) == ST_FORMAT, "header length past EOF accepted");
    CHECK(strstr(err, "runs past the end") != NULL, "message: %s", err);
    CHECK(safetensors_parse_header(&st0, -1, tiny, 4, err, sizeof err) == ST_FORMAT, "4-byte file accepted");

    /* opening a directory without a checkpoint */
    safetensors *st = NULL;
    CHECK(safetensors_open(&st, "/nonexistent-orchid-dir", err, sizeof err) < 0 && st == NULL, "missing dir accepted");
    CHECK(strstr(err, "model.safetensors") != NULL, "message: %s", err);
}

static const char *CONFIG_TEMPLATE =
    "{\"model_type\":\"qwen3_5_moe\",%s\"text_config\":{%s\"hidden_size\":128,\"num_hidden_layers\":4,\"vocab_size\":1000,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":64,\"linear_num_key_heads\":4,"
    "\"linear_num_value_heads\":8,\"linear_key_head_dim\":32,\"linear_value_head_dim\":32,\"linear_conv_kernel_dim\":4,"
    "\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":64,\"shared_expert_intermediate_size\":64,"
    "\"rms_norm_eps\":1e-6,\"eos_token_id\":7,"
    "\"rope_parameters\":{\"rope_type\":\"%s\",\"rope_theta\":10000000,\"partial_rotary_factor\":0.25}}%s}";

static int cfg(struct model_config *c, const char *top, const char *text_extra, const char *rope, const char *quant, char *err) {
    char buf[4096];
    snprintf(buf, sizeof buf, CONFIG_TEMPLATE, top, text_extra, rope, quant);
    return config_parse(c, buf, strlen(buf), "config.json", err, 512);
}

static void test_config(void) {
    static struct model_config c;
    char err[512];
    const char *q = ",\"quantization\":{\"group_size\":64,\"bits\":4,\"mode\":\"affine\","
                    "\"language_model.model.layers.0.mlp.gate\":{\"group_size\":64,\"bits\":8}}";
    CHECK(cfg(&c, "", "", "default", q, err) == 0, "good config rejected: %s", err);
    CHECK(c.hidden == 128 && c.n_layers == 4 && c.rotary_dim == 16 && c.rope_theta == 1e7f, "fields");
    CHECK(c.layer_kind[3] == LAYER_ATTENTION && c.layer_kind[0] == LAYER_LINEAR, "layer schedule");
    CHECK(c.n_eos == 1 && c.eos_ids[0] == 7, "text_config eos");
    CHECK(!c.is_production_shape, "test shape flagged production");
    int bits, group;
    config_module_quant(&c, "language_model.model.layers.0.mlp.gate", &bits, &group);
    CHECK(bits == 8 && group == 64, "override bits %d", bits);
    config_module_quant(&c, "language_model.model.layers.1.mlp.gate", &bits, &group);
    CHECK(bits == 4, "default bits %d", bits);

    CHECK(cfg(&c, "\"eos_token_id\":[5,6],", "", "default", q, err) == 0 && c.n_eos == 2 && c.eos_ids[0] == 5,
          "top-level eos must override text_config's");

    struct { const char *top, *extra, *rope, *quant, *needle; } bad[] = {
        {"", "", "default", "", "quantization block missing"},
        {"", "", "yarn", q, "rope type"},
        {"", "", "default", ",\"quantization\":{\"group_size\":64,\"bits\":3}", "bits 3"},
        {"", "", "default", ",\"quantization\":{\"group_size\":64,\"bits\":4,\"mode\":\"mxfp4\"}", "mode"},
        {"", "\"layer_types\":[\"linear_attention\",\"full_attention\",\"linear_attention\",\"full_attention\"],", "default", q, "disagrees"},
        {"", "\"layer_types\":[\"linear_attention\"],", "default", q, "layer_types"},
        {"", "\"num_experts_per_tok\":99,", "default", q, "num_experts_per_tok"},
        {"", "\"hidden_size\":100,", "default", q, "multiple of the quantization group"},
        {"", "\"hidden_size\":\"big\",", "default", q, "hidden_size"},
        {"\"eos_token_id\":5000,", "", "default", q, "outside the vocabulary"},
        {"\"eos_token_id\":1e300,", "", "default", q, "outside the vocabulary"}, /* found by fuzz_config: UB cast */
        {"\"eos_token_id\":[1,-3e20],", "", "default", q, "outside the vocabulary"},
        {"\"eos_token_id\":[2e90],", "", "default", q, "outside the vocabulary"}, /* was a UB cast (fuzz) */
        {"\"eos_token_id\":1.5,", "", "default", q, "must be integers"},
        {"", "\"tie_word_embeddings\":true,", "default", q, "tie_word_embeddings"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        int rc = cfg(&c, bad[i].top, bad[i].extra, bad[i].rope, bad[i].quant, err);
        CHECK(rc < 0, "bad config %zu accepted", i);
        CHECK(strstr(err, bad[i].needle) != NULL, "bad config %zu: \"%s\" lacks \"%s\"", i, err, bad[i].needle);
    }
    CHECK(config_parse(&c, "{\"model_type\":\"llama\"}", 22, "config.json", err, sizeof err) == ST_UNSUPPORTED, "llama accepted");
    CHECK(strstr(err, "qwen3_5_moe") != NULL, "message: %s", err);
    CHECK(config_parse(&c, "{not json", 9, "config.json", err, sizeof err) == ST_FORMAT, "junk accepted");
    CHECK(config_load(&c, "/nonexistent/config.json", err, sizeof err) == ST_IO, "missing file");
}

static void add_item(void *ctx, int i) { __atomic_fetch_add((long *)ctx, (long)i + 1, __ATOMIC_RELAXED); }

static void test_threadpool(void) {
    char err[256];
    for (int threads = 1; threads <= 4; threads++) {
        threadpool *p;
        CHECK(threadpool_create(&p, threads, err, sizeof err) == 0, "create %d: %s", threads, err);
        for (int n = 0; n < 2000; n += 197) {
            long sum = 0;
            threadpool_run(p, n, add_item, &sum);
            CHECK(sum == (long)n * (n + 1) / 2, "threads %d n %d sum %ld", threads, n, sum);
        }
        threadpool_destroy(p);
    }
}

int main(void) {
    test_safetensors();
    test_config();
    test_threadpool();
    return check_summary();
}
