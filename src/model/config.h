/* model/config.h — the validated shape of a Qwen3.5/3.6 MoE (`qwen3_5_moe`)
 * checkpoint, parsed from config.json.
 *
 * config.json may be the multimodal wrapper (fields under "text_config") or a
 * flat text config; top-level keys win over text_config for eos_token_id. The
 * quantization block ("quantization", or "quantization_config") gives the
 * default group size / bits and per-module overrides keyed by module path
 * (e.g. "language_model.model.layers.0.mlp.gate": {"bits": 8, ...}).
 * Any size is accepted as long as the topology matches (tests use small
 * shapes); `is_production_shape` says whether it is exactly Qwen3.6-35B-A3B.
 */
#ifndef ORCHID_CONFIG_H
#define ORCHID_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#define MAX_LAYERS 128
#define MAX_EOS_IDS 8
#define MAX_QUANT_OVERRIDES 512

enum layer_kind { LAYER_LINEAR = 0, LAYER_ATTENTION = 1 };

struct quant_override {
    char module[160]; /* module path as written in the checkpoint, without .weight */
    int bits, group_size;
};

struct model_config {
    char model_type[32];
    int hidden;       /* H: residual width */
    int n_layers;
    int vocab;        /* rows of embed_tokens / lm_head */
    float rms_eps;

    /* full attention */
    int n_heads, n_kv_heads, head_dim;
    int rotary_dim;   /* (int)(head_dim * partial_rotary_factor) */
    float rope_theta;
    bool attn_output_gate;

    /* Gated DeltaNet */
    int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, conv_kernel;

    /* MoE */
    int n_experts, n_experts_per_tok, moe_inter, shared_inter;
    bool norm_topk_prob;

    int max_position; /* max_position_embeddings (0 = unspecified) */
    bool tie_word_embeddings;
    enum layer_kind layer_kind[MAX_LAYERS];

    int eos_ids[MAX_EOS_IDS];
    int n_eos;

    /* quantization block */
    int q_group_size, q_bits;
    char q_mode[16];
    struct quant_override overrides[MAX_QUANT_OVERRIDES];
    int n_overrides;

    bool is_production_shape; /* exactly Qwen3.6-35B-A3B */
};

/* Derived sizes (see MODEL.md §1.1). */
static inline int cfg_lin_key_dim(const struct model_config *c) { return c->lin_k_heads * c->lin_k_dim; }
static inline int cfg_lin_value_dim(const struct model_config *c) { return c->lin_v_heads * c->lin_v_dim; }
static inline int cfg_conv_dim(const struct model_config *c) { return 2 * cfg_lin_key_dim(c) + cfg_lin_value_dim(c); }
static inline int cfg_q_dim(const struct model_config *c) { return c->n_heads * c->head_dim; }
static inline int cfg_kv_dim(const struct model_config *c) { return c->n_kv_heads * c->head_dim; }

/* Parses and validates `path` (a config.json). Errors name the file and field. */
int config_load(struct model_config *cfg, const char *path, char *err, size_t errlen);
/* Same, from a JSON text already in memory (`what` names it in messages). */
int config_parse(struct model_config *cfg, const char *json, size_t len, const char *what,
                 char *err, size_t errlen);

/* Bits / group size the quantization block gives a module path (override or default). */
void config_module_quant(const struct model_config *cfg, const char *module, int *bits, int *group_size);

/* One line such as "qwen3_5_moe 40 layers, hidden 2048, ... (Qwen3.6-35B-A3B production shape)". */
void config_describe(const struct model_config *cfg, char *buf, size_t len);

#endif
