/* model/config.c — config.json parsing and validation (see config.h).
 *
 * Fail-closed: every field orchid's math depends on must be present (or have
 * the documented HF default), be in range, and be consistent with the others;
 * a rope type other than "default" is refused rather than silently ignored.
 */
#include "model/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/fileio.h"
#include "runtime/status.h"

static int get_int(const cJSON *obj, const char *key, int *out, int def, bool required, const char *what,
                   char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return errorf(err, errlen, ST_FORMAT, "%s: missing field \"%s\"", what, key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > 1e9)
        return errorf(err, errlen, ST_FORMAT, "%s: field \"%s\" must be a non-negative integer", what, key);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_float(const cJSON *obj, const char *key, float *out, float def, const char *what, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) { *out = def; return 0; }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return errorf(err, errlen, ST_FORMAT, "%s: field \"%s\" must be a number", what, key);
    *out = (float)v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *obj, const char *key, bool *out, bool def, const char *what, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) { *out = def; return 0; }
    if (!cJSON_IsBool(v)) return errorf(err, errlen, ST_FORMAT, "%s: field \"%s\" must be true or false", what, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* One eos id: an integer inside the vocabulary (checked before any cast). */
static int eos_one(struct model_config *c, const cJSON *x, const char *what, char *err, size_t errlen) {
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble))
        return errorf(err, errlen, ST_FORMAT, "%s: eos_token_id entries must be integers", what);
    if (!(x->valuedouble >= 0 && x->valuedouble < (double)c->vocab))
        return errorf(err, errlen, ST_FORMAT, "%s: eos_token_id %.0f is outside the vocabulary (%d)", what, x->valuedouble, c->vocab);
    if (c->n_eos == MAX_EOS_IDS) return errorf(err, errlen, ST_FORMAT, "%s: more than %d eos_token_id entries", what, MAX_EOS_IDS);
    c->eos_ids[c->n_eos++] = (int)x->valuedouble;
    return 0;
}

/* eos_token_id: an integer or a list of integers. */
static int read_eos(struct model_config *c, const cJSON *v, const char *what, char *err, size_t errlen) {
    c->n_eos = 0;
    if (cJSON_IsNumber(v)) return eos_one(c, v, what, err, errlen);
    if (!cJSON_IsArray(v)) return errorf(err, errlen, ST_FORMAT, "%s: eos_token_id must be an integer or a list", what);
    for (const cJSON *x = v->child; x; x = x->next) {
        int rc = eos_one(c, x, what, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

static int read_quantization(struct model_config *c, const cJSON *root, const char *what, char *err, size_t errlen) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization");
    if (!q) q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (!cJSON_IsObject(q))
        return errorf(err, errlen, ST_UNSUPPORTED,
                      "%s: quantization block missing (orchid loads MLX affine-quantized checkpoints such as "
                      "mlx-community/Qwen3.6-35B-A3B-4bit)", what);
    int rc;
    if ((rc = get_int(q, "group_size", &c->q_group_size, 0, true, what, err, errlen))) return rc;
    if ((rc = get_int(q, "bits", &c->q_bits, 0, true, what, err, errlen))) return rc;
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(q, "mode");
    snprintf(c->q_mode, sizeof c->q_mode, "%s", cJSON_IsString(mode) ? mode->valuestring : "affine");
    if (mode && !cJSON_IsString(mode)) return errorf(err, errlen, ST_FORMAT, "%s: quantization.mode must be a string", what);
    if (strcmp(c->q_mode, "affine") != 0)
        return errorf(err, errlen, ST_UNSUPPORTED, "%s: quantization mode \"%s\" is not supported (only affine)", what, c->q_mode);
    if (c->q_bits != 4 && c->q_bits != 8)
        return errorf(err, errlen, ST_UNSUPPORTED, "%s: quantization bits %d not supported (4 or 8)", what, c->q_bits);
    if (c->q_group_size != 32 && c->q_group_size != 64 && c->q_group_size != 128)
        return errorf(err, errlen, ST_UNSUPPORTED, "%s: quantization group_size %d not supported (32, 64 or 128)", what, c->q_group_size);
    c->n_overrides = 0;
    for (const cJSON *e = q->child; e; e = e->next) {
        if (!cJSON_IsObject(e)) continue; /* group_size, bits, mode */
        if (c->n_overrides == MAX_QUANT_OVERRIDES)
            return errorf(err, errlen, ST_FORMAT, "%s: more than %d quantization overrides", what, MAX_QUANT_OVERRIDES);
        struct quant_override *o = &c->overrides[c->n_overrides];
        if (strlen(e->string) >= sizeof o->module)
            return errorf(err, errlen, ST_FORMAT, "%s: quantization override key too long", what);
        snprintf(o->module, sizeof o->module, "%s", e->string);
        if ((rc = get_int(e, "bits", &o->bits, c->q_bits, false, what, err, errlen))) return rc;
        if ((rc = get_int(e, "group_size", &o->group_size, c->q_group_size, false, what, err, errlen))) return rc;
        const cJSON *om = cJSON_GetObjectItemCaseSensitive(e, "mode");
        if (om && (!cJSON_IsString(om) || strcmp(om->valuestring, "affine") != 0))
            return errorf(err, errlen, ST_UNSUPPORTED, "%s: quantization override %s: only affine mode is supported", what, o->module);
        c->n_overrides++;
    }
    return 0;
}

void config_module_quant(const struct model_config *cfg, const char *module, int *bits, int *group_size) {
    for (int i = 0; i < cfg->n_overrides; i++) {
        if (strcmp(cfg->overrides[i].module, module) == 0) {
            *bits = cfg->overrides[i].bits;
            *group_size = cfg->overrides[i].group_size;
            return;
        }
    }
    *bits = cfg->q_bits;
    *group_size = cfg->q_group_size;
}

static bool is_production(const struct model_config *c) {
    if (!(c->hidden == 2048 && c->n_layers == 40 && c->vocab == 248320 && c->n_heads == 16 && c->n_kv_heads == 2 &&
          c->head_dim == 256 && c->rotary_dim == 64 && c->lin_k_heads == 16 && c->lin_v_heads == 32 &&
          c->lin_k_dim == 128 && c->lin_v_dim == 128 && c->conv_kernel == 4 && c->n_experts == 256 &&
          c->n_experts_per_tok == 8 && c->moe_inter == 512 && c->shared_inter == 512))
        return false;
    for (int i = 0; i < c->n_layers; i++)
        if ((c->layer_kind[i] == LAYER_ATTENTION) != (i % 4 == 3)) return false;
    return true;
}

static int validate(struct model_config *c, const char *what, char *err, size_t errlen) {
#define REQUIRE(cond, ...) \
    do { if (!(cond)) return errorf(err, errlen, ST_FORMAT, __VA_ARGS__); } while (0)
    REQUIRE(c->hidden > 0 && c->n_layers > 0 && c->vocab > 0, "%s: hidden_size, num_hidden_layers and vocab_size must be positive", what);
    REQUIRE(c->n_layers <= MAX_LAYERS, "%s: num_hidden_layers %d exceeds %d", what, c->n_layers, MAX_LAYERS);
    REQUIRE(c->n_heads > 0 && c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0,
            "%s: num_attention_heads (%d) must be a positive multiple of num_key_value_heads (%d)", what, c->n_heads, c->n_kv_heads);
    REQUIRE(c->head_dim > 0 && c->head_dim % 2 == 0 && c->head_dim <= 1024, "%s: head_dim %d must be even and at most 1024", what, c->head_dim);
    REQUIRE(c->rotary_dim >= 2 && c->rotary_dim % 2 == 0 && c->rotary_dim <= c->head_dim,
            "%s: rotary dim %d (head_dim × partial_rotary_factor) must be even and within head_dim", what, c->rotary_dim);
    REQUIRE(c->rope_theta > 0, "%s: rope_theta must be positive", what);
    REQUIRE(c->lin_k_heads > 0 && c->lin_v_heads > 0 && c->lin_v_heads % c->lin_k_heads == 0,
            "%s: linear_num_value_heads (%d) must be a multiple of linear_num_key_heads (%d)", what, c->lin_v_heads, c->lin_k_heads);
    REQUIRE(c->lin_k_dim > 0 && c->lin_v_dim > 0 && c->lin_k_dim <= 1024 && c->lin_v_dim <= 1024, "%s: linear head dims must be in 1..1024", what);
    REQUIRE(c->conv_kernel >= 1 && c->conv_kernel <= 16, "%s: linear_conv_kernel_dim %d must be in 1..16", what, c->conv_kernel);
    REQUIRE(c->n_experts > 0 && c->n_experts <= 4096, "%s: num_experts %d must be in 1..4096 (orchid runs the MoE model only)", what, c->n_experts);
    REQUIRE(c->n_experts_per_tok > 0 && c->n_experts_per_tok <= c->n_experts && c->n_experts_per_tok <= 64,
            "%s: num_experts_per_tok %d must be in 1..min(num_experts, 64)", what, c->n_experts_per_tok);
    REQUIRE(c->moe_inter > 0 && c->shared_inter > 0, "%s: moe_intermediate_size and shared_expert_intermediate_size must be positive", what);
    REQUIRE(c->rms_eps > 0 && c->rms_eps < 1, "%s: rms_norm_eps must be in (0, 1)", what);
    if (!c->attn_output_gate) return errorf(err, errlen, ST_UNSUPPORTED, "%s: attn_output_gate=false is not supported", what);
    if (c->tie_word_embeddings) return errorf(err, errlen, ST_UNSUPPORTED, "%s: tie_word_embeddings=true is not supported (Qwen3.6 has an untied lm_head)", what);
    const int g = c->q_group_size;
    const int ins[] = {c->hidden, c->n_heads * c->head_dim, c->lin_v_heads * c->lin_v_dim, c->moe_inter, c->shared_inter};
    const char *in_names[] = {"hidden_size", "num_attention_heads × head_dim", "linear value dim", "moe_intermediate_size", "shared_expert_intermediate_size"};
    for (int i = 0; i < 5; i++)
        REQUIRE(ins[i] % g == 0, "%s: %s (%d) is not a multiple of the quantization group size %d", what, in_names[i], ins[i], g);
    return 0;
#undef REQUIRE
}

int config_parse(struct model_config *c, const char *json, size_t len, const char *what, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return errorf(err, errlen, ST_FORMAT, "%s: not a valid JSON object", what);
    }
    int rc = 0;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (tc && !cJSON_IsObject(tc)) { rc = errorf(err, errlen, ST_FORMAT, "%s: text_config must be an object", what); goto done; }
    const cJSON *t = tc ? tc : root;

    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(t, "model_type");
    bool type_ok = (cJSON_IsString(mt) && strcmp(mt->valuestring, "qwen3_5_moe") == 0) ||
                   (cJSON_IsString(tmt) && (strcmp(tmt->valuestring, "qwen3_5_moe") == 0 || strcmp(tmt->valuestring, "qwen3_5_moe_text") == 0));
    if (!type_ok) {
        rc = errorf(err, errlen, ST_UNSUPPORTED, "%s: model_type is \"%s\", orchid runs only qwen3_5_moe (Qwen3.5/3.6 MoE)", what,
                    cJSON_IsString(mt) ? mt->valuestring : cJSON_IsString(tmt) ? tmt->valuestring : "(missing)");
        goto done;
    }
    snprintf(c->model_type, sizeof c->model_type, "qwen3_5_moe");

#define INT(key, field, def, req) if ((rc = get_int(t, key, &c->field, def, req, what, err, errlen))) goto done
    INT("hidden_size", hidden, 0, true);
    INT("num_hidden_layers", n_layers, 0, true);
    INT("vocab_size", vocab, 0, true);
    INT("num_attention_heads", n_heads, 0, true);
    INT("num_key_value_heads", n_kv_heads, 0, true);
    INT("head_dim", head_dim, 0, true);
    INT("linear_num_key_heads", lin_k_heads, 0, true);
    INT("linear_num_value_heads", lin_v_heads, 0, true);
    INT("linear_key_head_dim", lin_k_dim, 0, true);
    INT("linear_value_head_dim", lin_v_dim, 0, true);
    INT("linear_conv_kernel_dim", conv_kernel, 4, false);
    INT("num_experts", n_experts, 0, true);
    INT("num_experts_per_tok", n_experts_per_tok, 0, true);
    INT("moe_intermediate_size", moe_inter, 0, true);
    INT("shared_expert_intermediate_size", shared_inter, 0, true);
    INT("max_position_embeddings", max_position, 0, false);
#undef INT
    if ((rc = get_float(t, "rms_norm_eps", &c->rms_eps, 1e-6f, what, err, errlen))) goto done;
    if ((rc = get_bool(t, "norm_topk_prob", &c->norm_topk_prob, true, what, err, errlen))) goto done;
    if ((rc = get_bool(t, "attn_output_gate", &c->attn_output_gate, true, what, err, errlen))) goto done;
    bool tie_top = false;
    if ((rc = get_bool(t, "tie_word_embeddings", &c->tie_word_embeddings, false, what, err, errlen))) goto done;
    if ((rc = get_bool(root, "tie_word_embeddings", &tie_top, false, what, err, errlen))) goto done;
    if (t != root && cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings")) c->tie_word_embeddings = tie_top;

    /* RoPE: rope_parameters {rope_type|type, rope_theta, partial_rotary_factor}, or legacy flat keys. */
    {
        float theta = 10000.0f, partial = 1.0f;
        const cJSON *rp = cJSON_GetObjectItemCaseSensitive(t, "rope_parameters");
        if (!rp) rp = cJSON_GetObjectItemCaseSensitive(t, "rope_scaling");
        if (rp && !cJSON_IsNull(rp)) {
            if (!cJSON_IsObject(rp)) { rc = errorf(err, errlen, ST_FORMAT, "%s: rope_parameters must be an object", what); goto done; }
            const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
            if (!rt) rt = cJSON_GetObjectItemCaseSensitive(rp, "type");
            if (rt && (!cJSON_IsString(rt) || strcmp(rt->valuestring, "default") != 0)) {
                rc = errorf(err, errlen, ST_UNSUPPORTED, "%s: rope type \"%s\" is not supported (only \"default\")", what,
                            cJSON_IsString(rt) ? rt->valuestring : "?");
                goto done;
            }
            if ((rc = get_float(rp, "rope_theta", &theta, 10000.0f, what, err, errlen))) goto done;
            if ((rc = get_float(rp, "partial_rotary_factor", &partial, 1.0f, what, err, errlen))) goto done;
        }
        if (cJSON_GetObjectItemCaseSensitive(t, "rope_theta") && (rc = get_float(t, "rope_theta", &theta, theta, what, err, errlen))) goto done;
        if (cJSON_GetObjectItemCaseSensitive(t, "partial_rotary_factor") &&
            (rc = get_float(t, "partial_rotary_factor", &partial, partial, what, err, errlen))) goto done;
        if (!(partial > 0 && partial <= 1)) { rc = errorf(err, errlen, ST_FORMAT, "%s: partial_rotary_factor must be in (0, 1]", what); goto done; }
        c->rope_theta = theta;
        c->rotary_dim = (int)((float)c->head_dim * partial);
    }

    /* Layer schedule: layer_types when given, else full_attention_interval (mlx-lm uses the interval). */
    if (c->n_layers > MAX_LAYERS) { rc = errorf(err, errlen, ST_FORMAT, "%s: num_hidden_layers %d exceeds %d", what, c->n_layers, MAX_LAYERS); goto done; }
    {
        int interval = 4;
        if ((rc = get_int(t, "full_attention_interval", &interval, 4, false, what, err, errlen))) goto done;
        if (interval < 1) { rc = errorf(err, errlen, ST_FORMAT, "%s: full_attention_interval must be positive", what); goto done; }
        for (int i = 0; i < c->n_layers; i++) c->layer_kind[i] = ((i + 1) % interval == 0) ? LAYER_ATTENTION : LAYER_LINEAR;
        const cJSON *lt = cJSON_GetObjectItemCaseSensitive(t, "layer_types");
        if (lt && !cJSON_IsNull(lt)) {
            if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers) {
                rc = errorf(err, errlen, ST_FORMAT, "%s: layer_types must list num_hidden_layers (%d) entries", what, c->n_layers);
                goto done;
            }
            int i = 0;
            for (const cJSON *x = lt->child; x; x = x->next, i++) {
                enum layer_kind k;
                if (cJSON_IsString(x) && strcmp(x->valuestring, "full_attention") == 0) k = LAYER_ATTENTION;
                else if (cJSON_IsString(x) && strcmp(x->valuestring, "linear_attention") == 0) k = LAYER_LINEAR;
                else { rc = errorf(err, errlen, ST_FORMAT, "%s: layer_types[%d] must be \"full_attention\" or \"linear_attention\"", what, i); goto done; }
                if (k != c->layer_kind[i]) {
                    rc = errorf(err, errlen, ST_FORMAT, "%s: layer_types[%d] disagrees with full_attention_interval %d", what, i, interval);
                    goto done;
                }
            }
        }
    }

    if ((rc = read_quantization(c, root, what, err, errlen))) goto done;
    if ((rc = validate(c, what, err, errlen))) goto done;

    /* eos: top-level eos_token_id overrides text_config's. */
    {
        const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
        if (!eos || cJSON_IsNull(eos)) eos = cJSON_GetObjectItemCaseSensitive(t, "eos_token_id");
        if (eos && !cJSON_IsNull(eos) && (rc = read_eos(c, eos, what, err, errlen))) goto done;
    }
    c->is_production_shape = is_production(c);
done:
    cJSON_Delete(root);
    return rc;
}

int config_load(struct model_config *cfg, const char *path, char *err, size_t errlen) {
    char *buf;
    size_t n;
    int rc = file_read_all(path, 1u << 20, &buf, &n, err, errlen);
    if (rc) return rc;
    rc = config_parse(cfg, buf, n, path, err, errlen);
    free(buf);
    return rc;
}

void config_describe(const struct model_config *c, char *buf, size_t len) {
    int n_attn = 0;
    for (int i = 0; i < c->n_layers; i++) n_attn += c->layer_kind[i] == LAYER_ATTENTION;
    snprintf(buf, len,
             "%s: %d layers (%d full attention, %d Gated DeltaNet), hidden %d, vocab %d, attention %d/%d heads × %d "
             "(rope %d dims, theta %g), GDN %d/%d heads × %d/%d, conv %d, MoE %d experts top-%d × %d + shared %d, "
             "affine %d-bit group %d%s",
             c->model_type, c->n_layers, n_attn, c->n_layers - n_attn, c->hidden, c->vocab, c->n_heads, c->n_kv_heads,
             c->head_dim, c->rotary_dim, (double)c->rope_theta, c->lin_k_heads, c->lin_v_heads, c->lin_k_dim, c->lin_v_dim,
             c->conv_kernel, c->n_experts, c->n_experts_per_tok, c->moe_inter, c->shared_inter, c->q_bits, c->q_group_size,
             c->is_production_shape ? " — the Qwen3.6-35B-A3B production shape" : " — a reduced test shape");
}
