/* model/weights.c — tensor binding and validation for the MLX layout (see weights.h,
 * MODEL.md §2.3). Names: "language_model.model.<...>" for the decoder and
 * "language_model.lm_head" for the head; quantized modules have .weight (U32
 * codes), .scales and .biases (BF16). Bits are inferred from shapes
 * (weight_cols * 32 / in_features), must match the quantization block for that
 * module path, and must be 8 exactly for mlp.gate / mlp.shared_expert_gate and
 * 4 for everything else.
 */
#include "model/weights.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/bf16.h"
#include "runtime/status.h"

#define PFX "language_model.model."

struct binder {
    const struct model_config *cfg;
    safetensors *st;
    struct model_weights *w;
    char *err;
    size_t errlen;
};

static int shape_eq(const struct st_tensor *t, int ndim, const int64_t *want) {
    if (t->ndim != ndim) return 0;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != want[i]) return 0;
    return 1;
}

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++) o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

static int shape_error(struct binder *b, const struct st_tensor *t, int ndim, const int64_t *want) {
    char got[96], exp[96];
    shape_str(got, sizeof got, t->ndim, t->shape);
    shape_str(exp, sizeof exp, ndim, want);
    return errorf(b->err, b->errlen, ST_FORMAT, "%s: tensor %s has shape %s, expected %s",
                  safetensors_shard_path(b->st, t), t->name, got, exp);
}

static struct st_tensor *need(struct binder *b, const char *name, enum st_dtype dt, size_t align, int *rc) {
    struct st_tensor *t = safetensors_find(b->st, name);
    if (!t) {
        *rc = errorf(b->err, b->errlen, ST_FORMAT, "checkpoint is missing tensor %s", name);
        return NULL;
    }
    if (t->dtype != dt) {
        *rc = errorf(b->err, b->errlen, ST_FORMAT, "%s: tensor %s has dtype %s, expected %s", safetensors_shard_path(b->st, t),
                     name, st_dtype_name(t->dtype), st_dtype_name(dt));
        return NULL;
    }
    if (((uintptr_t)t->data) % align != 0) {
        /* MLX does not pad shard headers, so a shard's data region can start at any
         * byte. Misaligned tensors are copied once into aligned memory we own. */
        void *copy = aligned_alloc(64, (t->nbytes + 63) / 64 * 64);
        void **oc = realloc(b->w->copies, (b->w->n_copies + 1) * sizeof *oc);
        if (!copy || !oc) {
            free(copy);
            if (oc) b->w->copies = oc;
            *rc = errorf(b->err, b->errlen, ST_NOMEM, "out of memory copying misaligned tensor %s (%zu bytes)", name, t->nbytes);
            return NULL;
        }
        memcpy(copy, t->data, t->nbytes);
        b->w->copies = oc;
        b->w->copies[b->w->n_copies++] = copy;
        b->w->copied_bytes += t->nbytes;
        t->data = copy;
    }
    t->consumed = true;
    b->w->n_bound++;
    *rc = 0;
    return t;
}

/* Binds module `module` (without ".weight") as a quantized [n_mats?][rows, cols] matrix. */
static int bind_qmat(struct binder *b, struct qmat *m, const char *module, int rows, int cols, int n_mats, int want_bits) {
    char name[256];
    int rc;
    snprintf(name, sizeof name, "%s.weight", module);
    struct st_tensor *tw = need(b, name, DT_U32, 4, &rc);
    if (!tw) return rc;
    snprintf(name, sizeof name, "%s.scales", module);
    struct st_tensor *ts = need(b, name, DT_BF16, 2, &rc);
    if (!ts) return rc;
    snprintf(name, sizeof name, "%s.biases", module);
    struct st_tensor *tb = need(b, name, DT_BF16, 2, &rc);
    if (!tb) return rc;

    const int lead = n_mats > 1 ? 1 : 0;
    const int ndim = 2 + lead;
    if (tw->ndim != ndim || tw->shape[ndim - 2] != rows || (lead && tw->shape[0] != n_mats) || tw->shape[ndim - 1] <= 0) {
        int64_t want[3] = {n_mats, rows, (int64_t)cols * want_bits / 32};
        return shape_error(b, tw, ndim, want + (lead ? 0 : 1));
    }
    /* Bits from shapes: packed words × 32 / in_features. */
    int64_t words = tw->shape[ndim - 1];
    if ((words * 32) % cols != 0)
        return errorf(b->err, b->errlen, ST_FORMAT, "%s: tensor %s.weight: %lld packed words do not divide into %d inputs",
                      safetensors_shard_path(b->st, tw), module, (long long)words, cols);
    int bits = (int)(words * 32 / cols);
    int cfg_bits, cfg_group;
    config_module_quant(b->cfg, module, &cfg_bits, &cfg_group);
    if (bits != 4 && bits != 8)
        return errorf(b->err, b->errlen, ST_UNSUPPORTED, "%s: tensor %s.weight is %d-bit; orchid supports 4- and 8-bit affine only",
                      safetensors_shard_path(b->st, tw), module, bits);
    if (bits != cfg_bits)
        return errorf(b->err, b->errlen, ST_FORMAT, "%s: tensor %s.weight is %d-bit by its shape but the quantization block says %d",
                      safetensors_shard_path(b->st, tw), module, bits, cfg_bits);
    if (bits != want_bits)
        return errorf(b->err, b->errlen, ST_UNSUPPORTED, "%s: tensor %s.weight is %d-bit; this checkpoint layout has %d-bit %s",
                      safetensors_shard_path(b->st, tw), module, bits, want_bits, want_bits == 8 ? "router gates" : "weights here");
    if (cols % cfg_group != 0)
        return errorf(b->err, b->errlen, ST_FORMAT, "%s: in_features %d not a multiple of group size %d", module, cols, cfg_group);
    int64_t want_s[3] = {n_mats, rows, cols / cfg_group};
    if (!shape_eq(ts, ndim, want_s + (lead ? 0 : 1))) return shape_error(b, ts, ndim, want_s + (lead ? 0 : 1));
    if (!shape_eq(tb, ndim, want_s + (lead ? 0 : 1))) return shape_error(b, tb, ndim, want_s + (lead ? 0 : 1));

    m->codes = tw->data;
    m->scales = ts->data;
    m->biases = tb->data;
    m->rows = rows;
    m->cols = cols;
    m->n_mats = n_mats;
    m->bits = bits;
    m->group = cfg_group;
    b->w->quant_bytes += tw->nbytes + ts->nbytes + tb->nbytes;
    return 0;
}

static float *arena_take(struct model_weights *w, size_t n) {
    if (w->arena_used + n > w->arena_len) return NULL;
    float *p = w->arena + w->arena_used;
    w->arena_used += n;
    return p;
}

/* Binds a float vector/matrix of `n` elements stored as BF16 or F32 (or F16 never) and any of
 * the accepted shapes; copies it to float32. `shapes` is a list of acceptable shapes. */
static int bind_floats(struct binder *b, float **out, const char *name, size_t n, int n_shapes, const int *ndims,
                       const int64_t (*shapes)[3]) {
    struct st_tensor *t = safetensors_find(b->st, name);
    if (!t) return errorf(b->err, b->errlen, ST_FORMAT, "checkpoint is missing tensor %s", name);
    if (t->dtype != DT_BF16 && t->dtype != DT_F32)
        return errorf(b->err, b->errlen, ST_FORMAT, "%s: tensor %s has dtype %s, expected BF16 or F32",
                      safetensors_shard_path(b->st, t), name, st_dtype_name(t->dtype));
    bool ok = false;
    for (int i = 0; i < n_shapes && !ok; i++) ok = shape_eq(t, ndims[i], shapes[i]);
    if (!ok) return shape_error(b, t, ndims[0], shapes[0]);
    float *dst = arena_take(b->w, n);
    if (!dst) return errorf(b->err, b->errlen, ST_INTERNAL, "weight arena exhausted at %s", name);
    if (t->dtype == DT_F32) {
        memcpy(dst, t->data, n * 4);
    } else {
        const uint8_t *src = t->data; /* possibly unaligned for 2-byte reads: go through memcpy */
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = bf16_to_f32(h);
        }
    }
    t->consumed = true;
    b->w->n_bound++;
    *out = dst;
    return 0;
}

static int bind_vec(struct binder *b, float **out, const char *name, int n) {
    const int ndims[1] = {1};
    const int64_t shapes[1][3] = {{n}};
    return bind_floats(b, out, name, (size_t)n, 1, ndims, shapes);
}

static int bind_layer(struct binder *b, int i) {
    const struct model_config *c = b->cfg;
    struct layer_weights *L = &b->w->layers[i];
    char p[128], n[192];
    int rc;
    snprintf(p, sizeof p, PFX "layers.%d.", i);
    L->kind = c->layer_kind[i];
#define NAME(suffix) (snprintf(n, sizeof n, "%s%s", p, suffix), n)
    if ((rc = bind_vec(b, &L->in_norm, NAME("input_layernorm.weight"), c->hidden))) return rc;
    if ((rc = bind_vec(b, &L->post_norm, NAME("post_attention_layernorm.weight"), c->hidden))) return rc;
    const int H = c->hidden;
    if (L->kind == LAYER_ATTENTION) {
        struct attn_weights *a = &L->attn;
        const int qd = cfg_q_dim(c), kvd = cfg_kv_dim(c);
        if ((rc = bind_qmat(b, &a->q, NAME("self_attn.q_proj"), 2 * qd, H, 1, 4))) return rc;
        if ((rc = bind_qmat(b, &a->k, NAME("self_attn.k_proj"), kvd, H, 1, 4))) return rc;
        if ((rc = bind_qmat(b, &a->v, NAME("self_attn.v_proj"), kvd, H, 1, 4))) return rc;
        if ((rc = bind_qmat(b, &a->o, NAME("self_attn.o_proj"), H, qd, 1, 4))) return rc;
        if ((rc = bind_vec(b, &a->q_norm, NAME("self_attn.q_norm.weight"), c->head_dim))) return rc;
        if ((rc = bind_vec(b, &a->k_norm, NAME("self_attn.k_norm.weight"), c->head_dim))) return rc;
    } else {
        struct gdn_weights *g = &L->gdn;
        const int cd = cfg_conv_dim(c), vd = cfg_lin_value_dim(c), hv = c->lin_v_heads;
        if ((rc = bind_qmat(b, &g->qkv, NAME("linear_attn.in_proj_qkv"), cd, H, 1, 4))) return rc;
        if ((rc = bind_qmat(b, &g->z, NAME("linear_attn.in_proj_z"), vd, H, 1, 4))) return rc;
        if ((rc = bind_qmat(b, &g->b, NAME("linear_attn.in_proj_b"), hv, H, 1, 4))) return rc;
        if ((rc = bind_qmat(b, &g->a, NAME("linear_attn.in_proj_a"), hv, H, 1, 4))) return rc;
        if ((rc = bind_qmat(b, &g->out, NAME("linear_attn.out_proj"), H, vd, 1, 4))) return rc;
        /* conv1d: MLX [C, K, 1] or HF [C, 1, K]; both are channel-major with taps contiguous. */
        const int ndims[2] = {3, 3};
        const int64_t shapes[2][3] = {{cd, c->conv_kernel, 1}, {cd, 1, c->conv_kernel}};
        if ((rc = bind_floats(b, &g->conv, NAME("linear_attn.conv1d.weight"), (size_t)cd * c->conv_kernel, 2, ndims, shapes))) return rc;
        if ((rc = bind_vec(b, &g->A_log, NAME("linear_attn.A_log"), hv))) return rc;
        if ((rc = bind_vec(b, &g->dt_bias, NAME("linear_attn.dt_bias"), hv))) return rc;
        if ((rc = bind_vec(b, &g->norm, NAME("linear_attn.norm.weight"), c->lin_v_dim))) return rc;
    }
    struct moe_weights *m = &L->moe;
    const int E = c->n_experts, I = c->moe_inter, Is = c->shared_inter;
    if ((rc = bind_qmat(b, &m->router, NAME("mlp.gate"), E, H, 1, 8))) return rc;
    if ((rc = bind_qmat(b, &m->gate, NAME("mlp.switch_mlp.gate_proj"), I, H, E, 4))) return rc;
    if ((rc = bind_qmat(b, &m->up, NAME("mlp.switch_mlp.up_proj"), I, H, E, 4))) return rc;
    if ((rc = bind_qmat(b, &m->down, NAME("mlp.switch_mlp.down_proj"), H, I, E, 4))) return rc;
    if ((rc = bind_qmat(b, &m->sh_gate, NAME("mlp.shared_expert.gate_proj"), Is, H, 1, 4))) return rc;
    if ((rc = bind_qmat(b, &m->sh_up, NAME("mlp.shared_expert.up_proj"), Is, H, 1, 4))) return rc;
    if ((rc = bind_qmat(b, &m->sh_down, NAME("mlp.shared_expert.down_proj"), H, Is, 1, 4))) return rc;
    if ((rc = bind_qmat(b, &m->sh_expert_gate, NAME("mlp.shared_expert_gate"), 1, H, 1, 8))) return rc;
#undef NAME
    return 0;
}

/* The checkpoint directory, from the first shard's path (for messages). */
static const char *checkpoint_dir(const safetensors *st, char *dir, size_t len) {
    snprintf(dir, len, "%s", st->n_shards ? st->shards[0].path : ".");
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    return dir;
}

/* Names orchid deliberately ignores: the vision tower and the MTP draft head. */
static bool ignorable(const char *name) {
    if (strncmp(name, "vision_tower.", 13) == 0) return true;
    if (strncmp(name, "mtp.", 4) == 0 || strstr(name, ".mtp.") != NULL) return true;
    return false;
}

int weights_bind(struct model_weights *w, const struct model_config *c, safetensors *st, char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    struct binder b = {.cfg = c, .st = st, .w = w, .err = err, .errlen = errlen};
    /* Arena for the float copies: norms, q/k norms, conv taps, GDN vectors. */
    size_t n = (size_t)c->hidden;
    for (int i = 0; i < c->n_layers; i++) {
        n += 2 * (size_t)c->hidden;
        if (c->layer_kind[i] == LAYER_ATTENTION) n += 2 * (size_t)c->head_dim;
        else n += (size_t)cfg_conv_dim(c) * c->conv_kernel + 2 * (size_t)c->lin_v_heads + (size_t)c->lin_v_dim;
    }
    w->arena = malloc(n * sizeof(float));
    if (!w->arena) return errorf(err, errlen, ST_NOMEM, "out of memory for %zu norm/conv values", n);
    w->arena_len = n;

    int rc;
    if ((rc = bind_qmat(&b, &w->embed, PFX "embed_tokens", c->vocab, c->hidden, 1, 4))) goto fail;
    if ((rc = bind_qmat(&b, &w->lm_head, "language_model.lm_head", c->vocab, c->hidden, 1, 4))) goto fail;
    if ((rc = bind_vec(&b, &w->final_norm, PFX "norm.weight", c->hidden))) goto fail;
    for (int i = 0; i < c->n_layers; i++)
        if ((rc = bind_layer(&b, i))) goto fail;

    /* Fail closed on anything left over. */
    int n_left = 0;
    char list[1024] = "", dir[512];
    size_t o = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const struct st_tensor *t = &st->tensors[i];
        if (t->consumed || ignorable(t->name)) continue;
        if (n_left < 8 && o < sizeof list) {
            const char *file = strrchr(safetensors_shard_path(st, t), '/');
            file = file ? file + 1 : safetensors_shard_path(st, t);
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s (in %s)", n_left ? ", " : "", t->name, file);
        }
        n_left++;
    }
    if (n_left) {
        rc = errorf(err, errlen, ST_FORMAT, "%s: %d checkpoint tensor%s not recognised (unknown tensor%s or name-scheme drift): %s%s",
                    checkpoint_dir(st, dir, sizeof dir), n_left, n_left == 1 ? " is" : "s are", n_left == 1 ? "" : "s", list, n_left > 8 ? ", ..." : "");
        goto fail;
    }
    return 0;
fail:
    weights_free(w);
    return rc;
}

void weights_free(struct model_weights *w) {
    for (size_t i = 0; i < w->n_copies; i++) free(w->copies[i]);
    free(w->copies);
    w->copies = NULL;
    w->n_copies = 0;
    free(w->arena);
    w->arena = NULL;
}
