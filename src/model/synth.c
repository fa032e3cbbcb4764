/* model/synth.c — random-weight Qwen3.6-MoE checkpoints in the exact MLX layout
 * (see synth.h for the layout and how the values are chosen).
 *
 * Owns: the shape table, the tensor plan (names, dtypes, shapes, shard and
 * offset of every tensor), the shard headers, index and config texts, the
 * chunked deterministic generators, and the two sinks — files written with
 * large pwrite()s from several threads, or anonymous memory handed to the
 * safetensors reader. The plan is computed once; both sinks fill it the same
 * way, so `orchid synth` and `orchid bench --synth` see identical bytes.
 */
#include "model/synth.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/bf16.h"
#include "runtime/status.h"
#include "runtime/timing.h"

#define VOCAB 248320
#define CONV_K 4
#define GROUP 64
#define EOS_TEXT 248046
#define BOS 248044
#define CODE_CHUNK (4u << 20)   /* bytes of codes per generator chunk */
#define ELEM_CHUNK (1u << 20)   /* elements (or groups) per chunk for everything else */
#define MAX_ITEM_BYTES (4u << 20)

struct shape {
    const char *name;
    int layers, hidden, heads, kv_heads, head_dim, lk_heads, lv_heads, lk_dim, lv_dim, experts, topk, moe_inter, sh_inter;
};

/* tiny and small equal tools/make_test_model.py CONFIGS; 35b-a3b is MODEL.md §1.1; mini
 * has the full model's widths (so every CUDA kernel form the real checkpoint takes applies:
 * tiny and small are too narrow for the one-token tensor-core kernels) with 4 layers and
 * 16 experts, ~0.75 GB: the GPU tests' decode-invariance model. */
static const struct shape SHAPES[] = {
    {"35b-a3b", 40, 2048, 16, 2, 256, 16, 32, 128, 128, 256, 8, 512, 512},
    {"mini", 4, 2048, 16, 2, 256, 16, 32, 128, 128, 16, 8, 512, 512},
    {"small", 8, 256, 16, 2, 256, 16, 32, 128, 128, 16, 8, 128, 128},
    {"tiny", 4, 128, 4, 2, 64, 4, 8, 32, 32, 8, 2, 64, 64},
};

static const struct shape *shape_find(const char *name) {
    for (size_t i = 0; name && i < sizeof SHAPES / sizeof SHAPES[0]; i++)
        if (strcmp(SHAPES[i].name, name) == 0) return &SHAPES[i];
    return NULL;
}

bool synth_shape_valid(const char *shape) { return shape_find(shape) != NULL; }

/* ------------------------------------------------------------------------- */
/* RNG: splitmix64 for seeding, xoshiro256** for the streams. */

static uint64_t sm_next(uint64_t *z) {
    uint64_t x = (*z += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

struct rng { uint64_t s[4]; };

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(struct rng *r) {
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

static void rng_seed(struct rng *r, uint64_t seed, uint64_t stream, uint64_t tag, uint64_t chunk) {
    uint64_t z = seed;
    z = sm_next(&z) ^ stream;
    z = sm_next(&z) ^ (tag << 48);
    z = sm_next(&z) ^ chunk;
    for (int i = 0; i < 4; i++) r->s[i] = sm_next(&z);
}

static inline double rng_unit(struct rng *r) { return (double)(rng_next(r) >> 11) * 0x1p-53; } /* [0, 1) */

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* ------------------------------------------------------------------------- */
/* The plan. */

enum gkind { GK_CODES, GK_SCALES, GK_BIASES, GK_NORMAL, GK_ALOG, GK_DTBIAS };

struct stensor {
    char name[160];
    enum st_dtype dtype;
    int ndim;
    int64_t shape[5];
    size_t nbytes;
    enum gkind kind;
    int bits;          /* quantized parts */
    float a, b;        /* NORMAL: mean, std; SCALES/BIASES: base |scale| */
    uint64_t stream;   /* RNG stream (module hash for quantized parts) */
    int tied;          /* lm_head parts: 1 + plan index of the embedding tensor they derive from
                          (its codes; its scales for both scales and biases), 0 = none */
    float mix, ratio;  /* tied: fraction of codes copied from the embedding row, scale multiplier */
    bool vision;
    int shard;
    size_t off;        /* offset in the shard's data region */
};

struct sshard {
    char file[64];
    char *header;      /* JSON, padded with spaces */
    size_t header_len; /* bytes of header (padded) */
    size_t data_len, file_len;
};

struct plan {
    const struct shape *sh;
    uint64_t seed;
    struct stensor *t;
    int n, cap;
    struct sshard *shards;
    int n_shards;
    size_t total_bytes;
    uint64_t total_params;
};

static struct stensor *plan_add(struct plan *p, const char *name, enum st_dtype dt, int ndim, const int64_t *shape) {
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 256;
        struct stensor *nt = realloc(p->t, (size_t)cap * sizeof *nt);
        if (!nt) return NULL;
        p->t = nt;
        p->cap = cap;
    }
    struct stensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    size_t count = 1;
    for (int i = 0; i < ndim; i++) { t->shape[i] = shape[i]; count *= (size_t)shape[i]; }
    t->nbytes = count * st_dtype_size(dt);
    t->stream = fnv1a(name);
    return t;
}

/* A quantized module: `.weight` uint32 codes, `.scales` and `.biases` bf16. */
static int add_quant(struct plan *p, const char *module, int n_mats, int rows, int cols, int bits, float sigma) {
    char name[192];
    int64_t shp[3];
    int nd = 0;
    if (n_mats > 1) shp[nd++] = n_mats;
    shp[nd++] = rows;
    const uint64_t stream = fnv1a(module);
    /* RMS of (q - 2^(b-1)) for uniform q in [0, 2^b), times sqrt(E[u^2]) of u ~ U(0.75, 1.25) */
    const double levels = (double)(1u << bits);
    const double rms_q = sqrt((levels * levels - 1.0) / 12.0 + 0.25) * sqrt(1.0 + 0.25 / 12.0);
    const float base = (float)(sigma / rms_q);
    static const char *suffix[3] = {"weight", "scales", "biases"};
    for (int part = 0; part < 3; part++) {
        snprintf(name, sizeof name, "%s.%s", module, suffix[part]);
        shp[nd] = part == 0 ? (int64_t)cols * bits / 32 : cols / GROUP;
        struct stensor *t = plan_add(p, name, part == 0 ? DT_U32 : DT_BF16, nd + 1, shp);
        if (!t) return -1;
        t->kind = part == 0 ? GK_CODES : part == 1 ? GK_SCALES : GK_BIASES;
        t->bits = bits;
        t->a = base;
        t->stream = stream;
    }
    p->total_params += (uint64_t)n_mats * (uint64_t)rows * (uint64_t)cols;
    return 0;
}

static int add_vec(struct plan *p, const char *name, enum st_dtype dt, int ndim, const int64_t *shape, enum gkind kind,
                   float mean, float std, bool vision) {
    struct stensor *t = plan_add(p, name, dt, ndim, shape);
    if (!t) return -1;
    t->kind = kind;
    t->a = mean;
    t->b = std;
    t->vision = vision;
    /* mlx-lm's get_total_parameters counts leaf modules only: the vision tower is not
     * in the text model, and A_log / dt_bias belong to GatedDeltaNet itself */
    if (!vision && kind != GK_ALOG && kind != GK_DTBIAS) p->total_params += t->nbytes / st_dtype_size(dt);
    return 0;
}

static int add_norm(struct plan *p, const char *name, int n) {
    int64_t s[1] = {n};
    return add_vec(p, name, DT_BF16, 1, s, GK_NORMAL, 1.0f, 0.1f, false);
}

/* The structure on top of "unit gain everywhere" (synth.h; the same constants as
 * tools/make_test_model.py): residual branch outputs scaled by RESID_GAIN / sqrt(2 layers),
 * router logits of std ROUTER_GAIN, and the direct path tying lm_head to the embedding with
 * cos min(1, KAPPA / sqrt(hidden)). */
#define RESID_GAIN 2.0f
#define ROUTER_GAIN 3.0f
#define KAPPA 12.0f

static int plan_tensors(struct plan *p) {
    const struct shape *s = p->sh;
    const int H = s->hidden;
    const float inv = 1.0f / sqrtf((float)H), res = RESID_GAIN / sqrtf(2.0f * (float)s->layers);
    char m[160], n[192];
    int rc = 0;
    rc |= add_quant(p, "language_model.model.embed_tokens", 1, VOCAB, H, 4, 1.0f);
    for (int l = 0; l < s->layers && rc == 0; l++) {
        const bool attn = (l + 1) % 4 == 0;
#define MOD(fmt) (snprintf(m, sizeof m, "language_model.model.layers.%d." fmt, l), m)
#define NAM(fmt) (snprintf(n, sizeof n, "language_model.model.layers.%d." fmt, l), n)
        rc |= add_norm(p, NAM("input_layernorm.weight"), H);
        if (attn) {
            const int qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim;
            rc |= add_quant(p, MOD("self_attn.q_proj"), 1, 2 * qd, H, 4, inv);
            rc |= add_quant(p, MOD("self_attn.k_proj"), 1, kvd, H, 4, inv);
            rc |= add_quant(p, MOD("self_attn.v_proj"), 1, kvd, H, 4, inv);
            rc |= add_quant(p, MOD("self_attn.o_proj"), 1, H, qd, 4, 2.5f * res / sqrtf((float)qd));
            rc |= add_norm(p, NAM("self_attn.q_norm.weight"), s->head_dim);
            rc |= add_norm(p, NAM("self_attn.k_norm.weight"), s->head_dim);
        } else {
            const int kd = s->lk_heads * s->lk_dim, vd = s->lv_heads * s->lv_dim, cd = 2 * kd + vd;
            rc |= add_quant(p, MOD("linear_attn.in_proj_qkv"), 1, cd, H, 4, inv);
            rc |= add_quant(p, MOD("linear_attn.in_proj_z"), 1, vd, H, 4, inv);
            rc |= add_quant(p, MOD("linear_attn.in_proj_b"), 1, s->lv_heads, H, 4, inv);
            rc |= add_quant(p, MOD("linear_attn.in_proj_a"), 1, s->lv_heads, H, 4, inv);
            rc |= add_quant(p, MOD("linear_attn.out_proj"), 1, H, vd, 4, res / sqrtf((float)vd));
            int64_t conv[3] = {cd, CONV_K, 1}, hv[1] = {s->lv_heads};
            rc |= add_vec(p, NAM("linear_attn.conv1d.weight"), DT_BF16, 3, conv, GK_NORMAL, 0.0f, 0.5f, false);
            rc |= add_vec(p, NAM("linear_attn.A_log"), DT_F32, 1, hv, GK_ALOG, 0, 0, false);
            rc |= add_vec(p, NAM("linear_attn.dt_bias"), DT_BF16, 1, hv, GK_DTBIAS, 0, 0, false);
            rc |= add_norm(p, NAM("linear_attn.norm.weight"), s->lv_dim);
        }
        rc |= add_norm(p, NAM("post_attention_layernorm.weight"), H);
        rc |= add_quant(p, MOD("mlp.gate"), 1, s->experts, H, 8, ROUTER_GAIN * inv);
        rc |= add_quant(p, MOD("mlp.switch_mlp.gate_proj"), s->experts, s->moe_inter, H, 4, inv);
        rc |= add_quant(p, MOD("mlp.switch_mlp.up_proj"), s->experts, s->moe_inter, H, 4, inv);
        rc |= add_quant(p, MOD("mlp.switch_mlp.down_proj"), s->experts, H, s->moe_inter, 4, res / sqrtf((float)s->moe_inter));
        rc |= add_quant(p, MOD("mlp.shared_expert.gate_proj"), 1, s->sh_inter, H, 4, inv);
        rc |= add_quant(p, MOD("mlp.shared_expert.up_proj"), 1, s->sh_inter, H, 4, inv);
        rc |= add_quant(p, MOD("mlp.shared_expert.down_proj"), 1, H, s->sh_inter, 4, res / sqrtf((float)s->sh_inter));
        rc |= add_quant(p, MOD("mlp.shared_expert_gate"), 1, 1, H, 8, inv);
#undef MOD
#undef NAM
    }
    rc |= add_norm(p, "language_model.model.norm.weight", H);
    rc |= add_quant(p, "language_model.lm_head", 1, VOCAB, H, 4, 2.0f * inv);
    if (rc == 0) { /* the direct path: see synth.h */
        const float mix = fminf(1.0f, KAPPA * inv);
        for (int part = 0; part < 3; part++) {
            struct stensor *t = &p->t[p->n - 3 + part];
            t->tied = part == 0 ? 1 : 2; /* 1 + plan index: the embedding's codes (0) or scales (1) */
            t->mix = mix;
            t->ratio = 2.0f * inv; /* lm_head sigma / embedding sigma (1) */
        }
    }
    /* the 8 vision tensors make_test_model.py writes (vdim 64) */
    const int64_t vd = 64;
    const struct { const char *name; int nd; int64_t s[5]; } vis[] = {
        {"vision_tower.patch_embed.proj.weight", 5, {vd, 2, 16, 16, 3}},
        {"vision_tower.patch_embed.proj.bias", 1, {vd}},
        {"vision_tower.pos_embed.weight", 2, {16, vd}},
        {"vision_tower.blocks.0.norm1.weight", 1, {vd}},
        {"vision_tower.blocks.0.norm1.bias", 1, {vd}},
        {"vision_tower.blocks.0.attn.qkv.weight", 2, {3 * vd, vd}},
        {"vision_tower.blocks.0.attn.qkv.bias", 1, {3 * vd}},
        {"vision_tower.merger.linear_fc2.weight", 2, {H, 4 * vd}},
    };
    for (size_t i = 0; i < sizeof vis / sizeof vis[0]; i++)
        rc |= add_vec(p, vis[i].name, DT_BF16, vis[i].nd, vis[i].s, GK_NORMAL, 0.0f, 0.02f, true);
    return rc ? -1 : 0;
}

/* Growing string. */
struct sbuf { char *s; size_t len, cap; bool oom; };

static void sb_add(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(struct sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (k < 0) { b->oom = true; return; }
        if (b->s && b->len + (size_t)k < b->cap) { b->len += (size_t)k; return; }
        size_t cap = (b->cap ? b->cap * 2 : 4096);
        while (cap < b->len + (size_t)k + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) { b->oom = true; return; }
        b->s = ns;
        b->cap = cap;
    }
}

static int tptr_name_cmp(const void *a, const void *b) {
    return strcmp((*(const struct stensor *const *)a)->name, (*(const struct stensor *const *)b)->name);
}

/* Shards (mlx-lm make_shards: a new shard when the next tensor would pass the
 * limit), data layout inside each shard, and the padded header text. */
static int plan_shards(struct plan *p) {
    size_t total = 0;
    for (int i = 0; i < p->n; i++) total += p->t[i].nbytes;
    p->total_bytes = total;
    const size_t max_bytes = strcmp(p->sh->name, "35b-a3b") == 0 ? (size_t)5 << 30 : (total / 3 ? total / 3 : 1);
    int ns = 0;
    size_t cur = 0;
    for (int i = 0; i < p->n; i++) {
        if (ns == 0 || cur + p->t[i].nbytes > max_bytes) { ns++; cur = 0; }
        p->t[i].shard = ns - 1;
        cur += p->t[i].nbytes;
    }
    p->shards = calloc((size_t)ns, sizeof *p->shards);
    const struct stensor **idx = malloc((size_t)p->n * sizeof *idx);
    if (!p->shards || !idx) { free(idx); return -1; }
    p->n_shards = ns;
    int rc = 0;
    for (int s = 0; s < ns && rc == 0; s++) {
        struct sshard *sh = &p->shards[s];
        snprintf(sh->file, sizeof sh->file, "model-%05d-of-%05d.safetensors", s + 1, ns);
        /* data order: 64-byte-multiple tensors first (plan order), then the rest */
        size_t off = 0;
        int k = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < p->n; i++) {
                struct stensor *t = &p->t[i];
                if (t->shard != s || ((t->nbytes % 64 == 0) != (pass == 0))) continue;
                t->off = off;
                off += t->nbytes;
                idx[k++] = t;
            }
        sh->data_len = off;
        qsort(idx, (size_t)k, sizeof *idx, tptr_name_cmp);
        struct sbuf b = {0};
        sb_add(&b, "{\"__metadata__\":{\"format\":\"mlx\"}");
        for (int j = 0; j < k; j++) {
            const struct stensor *t = idx[j];
            sb_add(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, st_dtype_name(t->dtype));
            for (int d = 0; d < t->ndim; d++) sb_add(&b, "%s%lld", d ? "," : "", (long long)t->shape[d]);
            sb_add(&b, "],\"data_offsets\":[%zu,%zu]}", t->off, t->off + t->nbytes);
        }
        sb_add(&b, "}");
        while (!b.oom && (8 + b.len) % 64 != 0) sb_add(&b, " ");
        if (b.oom) { free(b.s); rc = -1; break; }
        sh->header = b.s;
        sh->header_len = b.len;
        sh->file_len = 8 + sh->header_len + sh->data_len;
    }
    free(idx);
    return rc;
}

static void plan_free(struct plan *p) {
    if (!p) return;
    for (int s = 0; s < p->n_shards; s++) free(p->shards[s].header);
    free(p->shards);
    free(p->t);
    free(p);
}

static int plan_make(struct plan **out, const char *shape, uint64_t seed, char *err, size_t errlen) {
    *out = NULL;
    const struct shape *sh = shape_find(shape);
    if (!sh) return errorf(err, errlen, ST_INVALID, "unknown shape \"%s\" (%s)", shape ? shape : "(null)", SYNTH_SHAPES);
    struct plan *p = calloc(1, sizeof *p);
    if (!p) return errorf(err, errlen, ST_NOMEM, "out of memory");
    p->sh = sh;
    p->seed = seed;
    /* the tied lm_head permutes rows inside one code chunk of rows, whose scales must lie
     * inside one scale chunk (gen_tied): true for every hidden size that divides 2^16 */
    const size_t row_bytes = (size_t)sh->hidden / 2, groups = (size_t)sh->hidden / GROUP;
    if (CODE_CHUNK % row_bytes || ELEM_CHUNK % groups || (ELEM_CHUNK / groups) % (CODE_CHUNK / row_bytes)) {
        free(p);
        return errorf(err, errlen, ST_INVALID, "shape %s: hidden size %d does not fit the generator's chunks", shape, sh->hidden);
    }
    if (plan_tensors(p) || plan_shards(p)) {
        plan_free(p);
        return errorf(err, errlen, ST_NOMEM, "out of memory planning the %s checkpoint", shape);
    }
    *out = p;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Generators: chunk `k` of tensor t into dst (len bytes). */

static size_t chunk_bytes(const struct stensor *t) {
    return t->kind == GK_CODES ? CODE_CHUNK : (size_t)ELEM_CHUNK * st_dtype_size(t->dtype);
}

static void put_val(const struct stensor *t, uint8_t *dst, size_t i, float v) {
    if (t->dtype == DT_F32) memcpy(dst + 4 * i, &v, 4);
    else { uint16_t h = f32_to_bf16(v); memcpy(dst + 2 * i, &h, 2); }
}

static void gen_chunk(const struct plan *p, const struct stensor *t, size_t k, uint8_t *dst, size_t len, uint8_t *scratch);

static uint64_t gcd_u64(uint64_t a, uint64_t b) {
    while (b) { const uint64_t t = a % b; a = b; b = t; }
    return a;
}

/* The bijection of [0, n) that maps an lm_head row (within its block) to the embedding
 * row it is tied to: i -> (A i + n/3) mod n, A odd and coprime to n. */
static size_t tie_perm(size_t i, size_t n) {
    uint64_t A = (0x9E3779B1ull % n) | 1;
    while (gcd_u64(A, n) != 1) A += 2;
    return (size_t)((A * i + n / 3) % n);
}

/* Rows of the tied lm_head are permuted inside blocks of tie_block_rows(): one code chunk. */
static size_t tie_block_rows(const struct stensor *codes) { return CODE_CHUNK / ((size_t)codes->shape[1] * 4); }

/* Chunk k of a tied lm_head part (see synth.h): codes copy a fraction `mix` of the
 * permuted embedding row's codes (the rest uniform), scales are the embedding row's
 * times `ratio`, biases -2^(b-1) x scale. `src`: MAX_ITEM_BYTES of scratch for the
 * embedding's chunk. */
static void gen_tied(const struct plan *p, const struct stensor *t, size_t k, uint8_t *dst, size_t len, uint8_t *src) {
    const struct stensor *e = &p->t[t->tied - 1];
    const size_t rows = (size_t)t->shape[0], R = tie_block_rows(&p->t[0]); /* plan entry 0: the embedding's codes */
    if (t->kind == GK_CODES) {
        const size_t rb = (size_t)t->shape[1] * 4, n = len / rb;
        gen_chunk(p, e, k, src, len, NULL); /* same shape and chunking as this tensor */
        struct rng r;
        rng_seed(&r, p->seed, t->stream, 4, k);
        const unsigned thr = (unsigned)lrintf(t->mix * 256.0f);
        for (size_t i = 0; i < n; i++) {
            const uint8_t *s = src + tie_perm(i, n) * rb;
            uint8_t *d = dst + i * rb;
            for (size_t b = 0; b < rb; b++) {
                const uint64_t x = rng_next(&r);
                const unsigned m0 = x & 255, m1 = (x >> 8) & 255, c = (x >> 16) & 255;
                const unsigned lo = m0 < thr ? s[b] & 15 : c & 15, hi = m1 < thr ? s[b] >> 4 : c >> 4;
                d[b] = (uint8_t)(lo | hi << 4);
            }
        }
    } else {
        const size_t G = (size_t)t->shape[1], per = chunk_bytes(e) / 2 / G; /* rows per scale chunk */
        const size_t n = len / 2 / G, row0 = k * per;
        size_t have = SIZE_MAX;
        const float mult = t->kind == GK_BIASES ? -(float)(1u << (t->bits - 1)) : 1.0f;
        for (size_t i = 0; i < n; i++) {
            const size_t row = row0 + i, b0 = row / R * R, bn = rows - b0 < R ? rows - b0 : R;
            const size_t from = b0 + tie_perm(row - b0, bn), fk = from / per;
            if (fk != have) {
                const size_t flen = e->nbytes - fk * chunk_bytes(e) < chunk_bytes(e) ? e->nbytes - fk * chunk_bytes(e) : chunk_bytes(e);
                gen_chunk(p, e, fk, src, flen, NULL);
                have = fk;
            }
            for (size_t g = 0; g < G; g++) {
                uint16_t h;
                memcpy(&h, src + 2 * ((from - fk * per) * G + g), 2);
                const uint16_t o = f32_to_bf16(round_bf16(t->ratio * bf16_to_f32(h)) * mult);
                memcpy(dst + 2 * (i * G + g), &o, 2);
            }
        }
    }
}

/* `scratch` (MAX_ITEM_BYTES) is needed only for tied tensors. */
static void gen_chunk(const struct plan *p, const struct stensor *t, size_t k, uint8_t *dst, size_t len, uint8_t *scratch) {
    struct rng r;
    if (t->tied) { gen_tied(p, t, k, dst, len, scratch); return; }
    switch (t->kind) {
    case GK_CODES: {
        rng_seed(&r, p->seed, t->stream, 1, k);
        size_t i = 0;
        for (; i + 8 <= len; i += 8) { uint64_t x = rng_next(&r); memcpy(dst + i, &x, 8); }
        if (i < len) { uint64_t x = rng_next(&r); memcpy(dst + i, &x, len - i); }
        break;
    }
    case GK_SCALES:
    case GK_BIASES: {
        /* scales and biases of a module draw the same stream: bias = -2^(b-1) * scale */
        rng_seed(&r, p->seed, t->stream, 2, k);
        const float mult = t->kind == GK_BIASES ? -(float)(1u << (t->bits - 1)) : 1.0f;
        for (size_t i = 0; i < len / 2; i++) {
            const uint64_t x = rng_next(&r);
            const float u = 0.75f + 0.5f * (float)((x >> 11) * 0x1p-53);
            const float s = round_bf16((x & 1) ? -t->a * u : t->a * u);
            const uint16_t h = f32_to_bf16(s * mult); /* exact: mult is a power of two */
            memcpy(dst + 2 * i, &h, 2);
        }
        break;
    }
    case GK_NORMAL: {
        rng_seed(&r, p->seed, t->stream, 3, k);
        const size_t n = len / st_dtype_size(t->dtype);
        for (size_t i = 0; i < n; i += 2) {
            const double u1 = 1.0 - rng_unit(&r), u2 = rng_unit(&r); /* u1 in (0, 1] */
            const double rad = sqrt(-2.0 * log(u1));
            put_val(t, dst, i, t->a + t->b * (float)(rad * cos(2.0 * M_PI * u2)));
            if (i + 1 < n) put_val(t, dst, i + 1, t->a + t->b * (float)(rad * sin(2.0 * M_PI * u2)));
        }
        break;
    }
    case GK_ALOG:
    case GK_DTBIAS: {
        rng_seed(&r, p->seed, t->stream, 3, k);
        const size_t n = len / st_dtype_size(t->dtype);
        for (size_t i = 0; i < n; i++) {
            const double u = rng_unit(&r);
            put_val(t, dst, i, t->kind == GK_ALOG ? (float)log(1.0 + 15.0 * u) : (float)(-5.0 + 6.0 * u));
        }
        break;
    }
    }
}

/* ------------------------------------------------------------------------- */
/* Filling shards from several threads. */

struct item { int tensor; uint32_t chunk; };

struct fill_job {
    const struct plan *p;
    struct item *items;
    int n_items;
    int *fds;        /* file sink */
    uint8_t **mem;   /* memory sink: whole shard images */
    atomic_int next;
    atomic_int failed;
    atomic_size_t done;
    size_t total;
    bool quiet;
    double t0;
    pthread_mutex_t mu;
    char err[512];
};

static int pwrite_all(int fd, const uint8_t *b, size_t len, off_t off) {
    while (len) {
        ssize_t k = pwrite(fd, b, len, off);
        if (k < 0) { if (errno == EINTR) continue; return -1; }
        b += k; len -= (size_t)k; off += k;
    }
    return 0;
}

static void *fill_worker(void *arg) {
    struct fill_job *j = arg;
    uint8_t *buf = NULL, *scratch = NULL;
    if (j->fds && !(buf = malloc(MAX_ITEM_BYTES))) {
        pthread_mutex_lock(&j->mu);
        if (!atomic_exchange(&j->failed, 1)) snprintf(j->err, sizeof j->err, "out of memory for a write buffer");
        pthread_mutex_unlock(&j->mu);
        return NULL;
    }
    const size_t step = j->total / 10 ? j->total / 10 : 1;
    for (;;) {
        const int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n_items || atomic_load(&j->failed)) break;
        const struct stensor *t = &j->p->t[j->items[i].tensor];
        const size_t cb = chunk_bytes(t), begin = (size_t)j->items[i].chunk * cb;
        const size_t len = t->nbytes - begin < cb ? t->nbytes - begin : cb;
        const struct sshard *sh = &j->p->shards[t->shard];
        const size_t file_off = 8 + sh->header_len + t->off + begin;
        if (t->tied && !scratch && !(scratch = malloc(MAX_ITEM_BYTES))) {
            pthread_mutex_lock(&j->mu);
            if (!atomic_exchange(&j->failed, 1)) snprintf(j->err, sizeof j->err, "out of memory for a scratch buffer");
            pthread_mutex_unlock(&j->mu);
            break;
        }
        if (j->fds) {
            gen_chunk(j->p, t, j->items[i].chunk, buf, len, scratch);
            if (pwrite_all(j->fds[t->shard], buf, len, (off_t)file_off)) {
                const int e = errno;
                pthread_mutex_lock(&j->mu);
                if (!atomic_exchange(&j->failed, 1))
                    snprintf(j->err, sizeof j->err, "%s: write failed: %s", sh->file, strerror(e));
                pthread_mutex_unlock(&j->mu);
                break;
            }
        } else {
            gen_chunk(j->p, t, j->items[i].chunk, j->mem[t->shard] + file_off, len, scratch);
        }
        const size_t before = atomic_fetch_add(&j->done, len);
        if (!j->quiet && j->total >= ((size_t)1 << 30) && (before + len) / step != before / step)
            fprintf(stderr, "orchid synth: %.1f / %.1f GB (%.0f s)\n", (double)(before + len) / 1e9, (double)j->total / 1e9,
                    now_seconds() - j->t0);
    }
    free(buf);
    free(scratch);
    return NULL;
}

static int fill(const struct plan *p, int *fds, uint8_t **mem, int threads, bool quiet, char *err, size_t errlen) {
    /* items in file order: shard by shard, tensor by data offset */
    size_t n_items = 0;
    for (int i = 0; i < p->n; i++) n_items += (p->t[i].nbytes + chunk_bytes(&p->t[i]) - 1) / chunk_bytes(&p->t[i]);
    struct item *items = malloc((n_items ? n_items : 1) * sizeof *items);
    if (!items) return errorf(err, errlen, ST_NOMEM, "out of memory");
    size_t k = 0;
    for (int s = 0; s < p->n_shards; s++) {
        /* tensors of shard s in data order: walk offsets */
        int *ord = malloc((size_t)p->n * sizeof *ord);
        if (!ord) { free(items); return errorf(err, errlen, ST_NOMEM, "out of memory"); }
        int m = 0;
        for (int i = 0; i < p->n; i++) if (p->t[i].shard == s) ord[m++] = i;
        /* insertion into offset order (data order was assigned in two passes) */
        for (int a = 1; a < m; a++) {
            int v = ord[a], b = a - 1;
            while (b >= 0 && p->t[ord[b]].off > p->t[v].off) { ord[b + 1] = ord[b]; b--; }
            ord[b + 1] = v;
        }
        for (int a = 0; a < m; a++) {
            const struct stensor *t = &p->t[ord[a]];
            const size_t nc = (t->nbytes + chunk_bytes(t) - 1) / chunk_bytes(t);
            for (size_t c = 0; c < nc; c++) items[k++] = (struct item){ord[a], (uint32_t)c};
        }
        free(ord);
    }
    struct fill_job j = {.p = p, .items = items, .n_items = (int)k, .fds = fds, .mem = mem,
                         .total = p->total_bytes, .quiet = quiet, .t0 = now_seconds()};
    atomic_init(&j.next, 0);
    atomic_init(&j.failed, 0);
    atomic_init(&j.done, 0);
    pthread_mutex_init(&j.mu, NULL);
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    pthread_t tid[64];
    int started = 0;
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&tid[started], NULL, fill_worker, &j) != 0) break;
        started++;
    }
    fill_worker(&j);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&j.mu);
    free(items);
    if (atomic_load(&j.failed)) return errorf(err, errlen, ST_IO, "%s", j.err);
    return 0;
}

/* ------------------------------------------------------------------------- */
/* config.json and the index. */

static cJSON *quant_block(const struct shape *s) {
    cJSON *q = cJSON_CreateObject();
    cJSON_AddNumberToObject(q, "group_size", GROUP);
    cJSON_AddNumberToObject(q, "bits", 4);
    cJSON_AddStringToObject(q, "mode", "affine");
    char key[160];
    for (int l = 0; l < s->layers; l++)
        for (int w = 0; w < 2; w++) {
            snprintf(key, sizeof key, "language_model.model.layers.%d.mlp.%s", l, w ? "shared_expert_gate" : "gate");
            cJSON *o = cJSON_AddObjectToObject(q, key);
            cJSON_AddNumberToObject(o, "group_size", GROUP);
            cJSON_AddNumberToObject(o, "bits", 8);
        }
    return q;
}

int synth_config_json(const char *shape, uint64_t seed, char **out, char *err, size_t errlen) {
    *out = NULL;
    const struct shape *s = shape_find(shape);
    if (!s) return errorf(err, errlen, ST_INVALID, "unknown shape \"%s\" (%s)", shape ? shape : "(null)", SYNTH_SHAPES);
    cJSON *root = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("Qwen3_5MoeForConditionalGeneration"));
    const int eos[2] = {EOS_TEXT, BOS};
    cJSON_AddItemToObject(root, "eos_token_id", cJSON_CreateIntArray(eos, 2));
    cJSON_AddNumberToObject(root, "image_token_id", 248056);
    cJSON_AddStringToObject(root, "model_type", "qwen3_5_moe");
    cJSON *mark = cJSON_AddObjectToObject(root, "orchid_synth");
    cJSON_AddStringToObject(mark, "shape", s->name);
    cJSON_AddNumberToObject(mark, "seed", (double)seed);
    cJSON_AddStringToObject(mark, "weights", "uniform random codes, scales from target std, bias = -2^(bits-1)*scale; residual branches / sqrt(2 layers), router std 3, lm_head tied to a permutation of the embedding (src/model/synth.h)");
    cJSON *q = quant_block(s);
    cJSON_AddItemToObject(root, "quantization", q);
    cJSON_AddItemToObject(root, "quantization_config", cJSON_Duplicate(q, 1));
    cJSON *tc = cJSON_AddObjectToObject(root, "text_config");
    cJSON_AddStringToObject(tc, "model_type", "qwen3_5_moe_text");
    cJSON_AddNumberToObject(tc, "vocab_size", VOCAB);
    cJSON_AddNumberToObject(tc, "num_hidden_layers", s->layers);
    cJSON_AddNumberToObject(tc, "hidden_size", s->hidden);
    cJSON_AddNumberToObject(tc, "num_attention_heads", s->heads);
    cJSON_AddNumberToObject(tc, "num_key_value_heads", s->kv_heads);
    cJSON_AddNumberToObject(tc, "head_dim", s->head_dim);
    cJSON_AddNumberToObject(tc, "linear_num_key_heads", s->lk_heads);
    cJSON_AddNumberToObject(tc, "linear_num_value_heads", s->lv_heads);
    cJSON_AddNumberToObject(tc, "linear_key_head_dim", s->lk_dim);
    cJSON_AddNumberToObject(tc, "linear_value_head_dim", s->lv_dim);
    cJSON_AddNumberToObject(tc, "num_experts", s->experts);
    cJSON_AddNumberToObject(tc, "num_experts_per_tok", s->topk);
    cJSON_AddNumberToObject(tc, "moe_intermediate_size", s->moe_inter);
    cJSON_AddNumberToObject(tc, "shared_expert_intermediate_size", s->sh_inter);
    cJSON_AddNumberToObject(tc, "linear_conv_kernel_dim", CONV_K);
    cJSON_AddStringToObject(tc, "hidden_act", "silu");
    cJSON_AddNumberToObject(tc, "rms_norm_eps", 1e-6);
    cJSON_AddNumberToObject(tc, "max_position_embeddings", 262144);
    cJSON_AddNumberToObject(tc, "full_attention_interval", 4);
    cJSON *lt = cJSON_AddArrayToObject(tc, "layer_types");
    for (int l = 0; l < s->layers; l++)
        cJSON_AddItemToArray(lt, cJSON_CreateString((l + 1) % 4 == 0 ? "full_attention" : "linear_attention"));
    cJSON *rp = cJSON_AddObjectToObject(tc, "rope_parameters");
    cJSON_AddStringToObject(rp, "rope_type", "default");
    cJSON_AddNumberToObject(rp, "rope_theta", 10000000);
    cJSON_AddNumberToObject(rp, "partial_rotary_factor", 0.25);
    const int mrope[3] = {11, 11, 10};
    cJSON_AddItemToObject(rp, "mrope_section", cJSON_CreateIntArray(mrope, 3));
    cJSON_AddTrueToObject(rp, "mrope_interleaved");
    cJSON_AddTrueToObject(tc, "attn_output_gate");
    cJSON_AddFalseToObject(tc, "attention_bias");
    cJSON_AddNumberToObject(tc, "attention_dropout", 0.0);
    cJSON_AddFalseToObject(tc, "tie_word_embeddings");
    cJSON_AddStringToObject(tc, "mamba_ssm_dtype", "float32");
    cJSON_AddNumberToObject(tc, "mtp_num_hidden_layers", 1);
    cJSON_AddFalseToObject(tc, "mtp_use_dedicated_embeddings");
    cJSON_AddNumberToObject(tc, "router_aux_loss_coef", 0.001);
    cJSON_AddFalseToObject(tc, "output_router_logits");
    cJSON_AddNumberToObject(tc, "initializer_range", 0.02);
    cJSON_AddTrueToObject(tc, "use_cache");
    cJSON_AddStringToObject(tc, "dtype", "bfloat16");
    cJSON_AddNumberToObject(tc, "bos_token_id", BOS);
    cJSON_AddNumberToObject(tc, "eos_token_id", EOS_TEXT);
    cJSON_AddNullToObject(tc, "pad_token_id");
    cJSON_AddFalseToObject(root, "tie_word_embeddings");
    cJSON_AddStringToObject(root, "transformers_version", "5.2.0");
    cJSON_AddNumberToObject(root, "video_token_id", 248057);
    cJSON_AddNumberToObject(root, "vision_end_token_id", 248054);
    cJSON_AddNumberToObject(root, "vision_start_token_id", 248053);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return errorf(err, errlen, ST_NOMEM, "out of memory building config.json");
    *out = text;
    return 0;
}

static char *index_json(const struct plan *p) {
    const struct stensor **idx = malloc((size_t)p->n * sizeof *idx);
    if (!idx) return NULL;
    for (int i = 0; i < p->n; i++) idx[i] = &p->t[i];
    qsort(idx, (size_t)p->n, sizeof *idx, tptr_name_cmp);
    struct sbuf b = {0};
    sb_add(&b, "{\n    \"metadata\": {\n        \"total_size\": %zu,\n        \"total_parameters\": %llu\n    },\n"
               "    \"weight_map\": {\n", p->total_bytes, (unsigned long long)p->total_params);
    for (int i = 0; i < p->n; i++)
        sb_add(&b, "        \"%s\": \"%s\"%s\n", idx[i]->name, p->shards[idx[i]->shard].file, i + 1 < p->n ? "," : "");
    sb_add(&b, "    }\n}");
    free(idx);
    if (b.oom) { free(b.s); return NULL; }
    return b.s;
}

/* ------------------------------------------------------------------------- */
/* Files. */

static int mkdir_p(const char *dir, char *err, size_t errlen) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) return errorf(err, errlen, ST_INVALID, "%s: path too long", dir);
    for (char *q = tmp + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return errorf(err, errlen, ST_IO, "%s: %s", tmp, strerror(errno));
        *q = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return errorf(err, errlen, ST_IO, "%s: %s", tmp, strerror(errno));
    struct stat sb;
    if (stat(tmp, &sb) != 0 || !S_ISDIR(sb.st_mode)) return errorf(err, errlen, ST_IO, "%s: not a directory", dir);
    return 0;
}

static int write_text(const char *dir, const char *file, const char *text, bool sync, char *err, size_t errlen) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return errorf(err, errlen, ST_IO, "%s: %s", path, strerror(errno));
    int rc = pwrite_all(fd, (const uint8_t *)text, strlen(text), 0);
    if (rc == 0 && sync) rc = fsync(fd);
    if (close(fd) != 0) rc = -1;
    return rc ? errorf(err, errlen, ST_IO, "%s: write failed: %s", path, strerror(errno)) : 0;
}

static bool has_tokenizer(const char *dir) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%.*s/tokenizer.json", PATH_MAX, dir);
    return access(path, R_OK) == 0;
}

static void set_str(char *out, size_t len, const char *s) {
    const size_t n = strlen(s) < len ? strlen(s) : len - 1;
    memcpy(out, s, n);
    out[n] = 0;
}

/* Where tokenizer files come from (see synth.h); "" when nowhere. */
static void find_tokenizer(const char *given, char *out, size_t len) {
    out[0] = 0;
    if (given) { if (has_tokenizer(given)) set_str(out, len, given); return; }
    const char *env = getenv("ORCHID_TOKENIZER_DIR");
    if (env && *env && has_tokenizer(env)) { set_str(out, len, env); return; }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            char cand[PATH_MAX + 64];
            for (const char *up = "/.."; ; up = "/../..") {
                snprintf(cand, sizeof cand, "%s%s/.cache/tokenizer", exe, up);
                if (has_tokenizer(cand)) { set_str(out, len, cand); return; }
                if (strcmp(up, "/../..") == 0) break;
            }
        }
    }
    if (has_tokenizer(".cache/tokenizer")) set_str(out, len, ".cache/tokenizer");
}

static bool tokenizer_file(const char *name) {
    static const char *exact[] = {"chat_template.jinja", "special_tokens_map.json", "vocab.json", "merges.txt",
                                  "generation_config.json"};
    if (strncmp(name, "tokenizer", 9) == 0) return true;
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (strcmp(name, exact[i]) == 0) return true;
    return false;
}

static int copy_file(const char *from, const char *to, char *err, size_t errlen) {
    int in = open(from, O_RDONLY);
    if (in < 0) return errorf(err, errlen, ST_IO, "%s: %s", from, strerror(errno));
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0) { close(in); return errorf(err, errlen, ST_IO, "%s: %s", to, strerror(errno)); }
    static __thread uint8_t buf[1 << 16];
    int rc = 0;
    off_t off = 0;
    for (;;) {
        ssize_t k = read(in, buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) { rc = errorf(err, errlen, ST_IO, "%s: read failed: %s", from, strerror(errno)); break; }
        if (k == 0) break;
        if (pwrite_all(out, buf, (size_t)k, off)) { rc = errorf(err, errlen, ST_IO, "%s: write failed: %s", to, strerror(errno)); break; }
        off += k;
    }
    close(in);
    if (close(out) != 0 && rc == 0) rc = errorf(err, errlen, ST_IO, "%s: close failed", to);
    return rc;
}

static int copy_tokenizer(const char *from, const char *dir, int *n_copied, char *err, size_t errlen) {
    *n_copied = 0;
    char pat[PATH_MAX + 8];
    snprintf(pat, sizeof pat, "%.*s/*", PATH_MAX, from);
    glob_t g;
    if (glob(pat, 0, NULL, &g) != 0) return errorf(err, errlen, ST_IO, "%s: cannot list", from);
    int rc = 0;
    for (size_t i = 0; i < g.gl_pathc && rc == 0; i++) {
        const char *src = g.gl_pathv[i], *base = strrchr(src, '/');
        base = base ? base + 1 : src;
        struct stat sb;
        if (!tokenizer_file(base) || stat(src, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        char dst[PATH_MAX + 256];
        snprintf(dst, sizeof dst, "%s/%s", dir, base);
        if ((rc = copy_file(src, dst, err, errlen)) == 0) (*n_copied)++;
    }
    globfree(&g);
    return rc;
}

static void fill_result(const struct plan *p, struct synth_result *res, double t0) {
    if (!res) return;
    res->n_tensors = p->n;
    res->n_shards = p->n_shards;
    res->total_bytes = p->total_bytes;
    res->total_parameters = p->total_params;
    res->seconds = now_seconds() - t0;
}

int synth_write(const char *dir, const struct synth_options *opt, struct synth_result *res, char *err, size_t errlen) {
    const double t0 = now_seconds();
    if (res) memset(res, 0, sizeof *res);
    if (!dir || !opt) return errorf(err, errlen, ST_INVALID, "synth_write: no directory or options");
    struct plan *p;
    int rc = plan_make(&p, opt->shape, opt->seed, err, errlen);
    if (rc) return rc;
    char *config = NULL, *index = NULL;
    int *fds = NULL;
    char tok[PATH_MAX];
    find_tokenizer(opt->tokenizer_dir, tok, sizeof tok);
    if (opt->tokenizer_dir && !tok[0]) {
        rc = errorf(err, errlen, ST_IO, "%s: no tokenizer.json there", opt->tokenizer_dir);
        goto out;
    }
    if ((rc = mkdir_p(dir, err, errlen))) goto out;
    fds = malloc((size_t)p->n_shards * sizeof *fds);
    if (!fds) { rc = errorf(err, errlen, ST_NOMEM, "out of memory"); goto out; }
    for (int s = 0; s < p->n_shards; s++) fds[s] = -1;
    for (int s = 0; s < p->n_shards && rc == 0; s++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, p->shards[s].file);
        fds[s] = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fds[s] < 0) { rc = errorf(err, errlen, ST_IO, "%s: %s", path, strerror(errno)); break; }
        uint8_t len8[8];
        for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)p->shards[s].header_len >> (8 * i));
        if (pwrite_all(fds[s], len8, 8, 0) || pwrite_all(fds[s], (const uint8_t *)p->shards[s].header, p->shards[s].header_len, 8) ||
            ftruncate(fds[s], (off_t)p->shards[s].file_len) != 0)
            rc = errorf(err, errlen, ST_IO, "%s: write failed: %s", path, strerror(errno));
    }
    if (rc) goto out;
    if ((rc = fill(p, fds, NULL, opt->threads, opt->quiet, err, errlen))) goto out;
    for (int s = 0; s < p->n_shards; s++) {
        int e = (opt->sync && fsync(fds[s]) != 0) ? errno : 0;
        if (close(fds[s]) != 0 && !e) e = errno;
        fds[s] = -1;
        if (e && rc == 0) rc = errorf(err, errlen, ST_IO, "%s/%s: %s", dir, p->shards[s].file, strerror(e));
    }
    if (rc) goto out;
    if (!(index = index_json(p))) { rc = errorf(err, errlen, ST_NOMEM, "out of memory building the index"); goto out; }
    if ((rc = write_text(dir, "model.safetensors.index.json", index, opt->sync, err, errlen))) goto out;
    if ((rc = synth_config_json(opt->shape, opt->seed, &config, err, errlen))) goto out;
    if ((rc = write_text(dir, "config.json", config, opt->sync, err, errlen))) goto out;
    if (tok[0]) {
        int n = 0;
        if ((rc = copy_tokenizer(tok, dir, &n, err, errlen))) goto out;
        if (res) { res->tokenizer_files = n; set_str(res->tokenizer_from, sizeof res->tokenizer_from, tok); }
    }
    fill_result(p, res, t0);
out:
    if (fds)
        for (int s = 0; s < p->n_shards; s++)
            if (fds[s] >= 0) close(fds[s]);
    free(fds);
    free(index);
    cJSON_free(config);
    plan_free(p);
    return rc;
}

int synth_build_memory(const struct synth_options *opt, safetensors **st_out, char **config_json,
                       struct synth_result *res, char *err, size_t errlen) {
    const double t0 = now_seconds();
    *st_out = NULL;
    *config_json = NULL;
    if (res) memset(res, 0, sizeof *res);
    if (!opt) return errorf(err, errlen, ST_INVALID, "synth_build_memory: no options");
    struct plan *p;
    int rc = plan_make(&p, opt->shape, opt->seed, err, errlen);
    if (rc) return rc;
    uint8_t **mem = NULL;
    safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->shards = calloc((size_t)p->n_shards, sizeof *st->shards)) ||
        !(mem = calloc((size_t)p->n_shards, sizeof *mem))) {
        rc = errorf(err, errlen, ST_NOMEM, "out of memory");
        goto out;
    }
    /* Shards are registered in st as they are mapped, so safetensors_close unmaps them on any failure. */
    for (int s = 0; s < p->n_shards; s++) {
        struct st_shard *sh = &st->shards[s];
        sh->fd = -1;
        size_t n = strlen(p->sh->name) + strlen(p->shards[s].file) + 8;
        if (!(sh->path = malloc(n))) { rc = errorf(err, errlen, ST_NOMEM, "out of memory"); goto out; }
        snprintf(sh->path, n, "synth:%s/%s", p->sh->name, p->shards[s].file);
        st->n_shards = s + 1;
        void *m = mmap(NULL, p->shards[s].file_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            rc = errorf(err, errlen, ST_NOMEM, "%s: cannot map %zu bytes: %s", sh->path, p->shards[s].file_len, strerror(errno));
            goto out;
        }
        sh->map = m;
        sh->size = p->shards[s].file_len;
        mem[s] = m;
        for (int i = 0; i < 8; i++) mem[s][i] = (uint8_t)((uint64_t)p->shards[s].header_len >> (8 * i));
        memcpy(mem[s] + 8, p->shards[s].header, p->shards[s].header_len);
    }
    if ((rc = fill(p, NULL, mem, opt->threads, opt->quiet, err, errlen))) goto out;
    for (int s = 0; s < p->n_shards; s++) {
        mprotect(mem[s], p->shards[s].file_len, PROT_READ); /* best effort: the checkpoint is read-only from here */
        if ((rc = safetensors_parse_header(st, s, mem[s], p->shards[s].file_len, err, errlen))) goto out;
    }
    if ((rc = safetensors_finish(st, err, errlen))) goto out;
    if ((rc = synth_config_json(opt->shape, opt->seed, config_json, err, errlen))) goto out;
    fill_result(p, res, t0);
out:
    free(mem);
    if (rc) safetensors_close(st);
    else *st_out = st;
    plan_free(p);
    return rc;
}
