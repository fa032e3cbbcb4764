/* model/weights.h — every checkpoint tensor bound to a named field, validated.
 *
 * Quantized matrices (struct qmat) point straight into the mmap'd shards: codes
 * are MLX affine codes packed LSB-first into uint32 words, scales and biases are
 * bf16, one pair per `group` consecutive input elements; dequantized weight
 * w[r][c] = scale[r][c/group] * q + bias[r][c/group] (scales may be negative).
 * Stacked expert matrices hold n_mats matrices back to back ([E, rows, ...]).
 * Tensors whose data in the shard is not aligned for their element type (MLX does
 * not pad shard headers) are copied once into aligned memory owned here.
 * Small vectors (norm gains, conv taps, A_log, dt_bias) are copied to float32
 * arrays owned by struct model_weights, so backends never parse dtypes.
 * Norm gains are used as stored: MLX checkpoints already hold 1 + w for the
 * decoder/q/k norms, and the GDN output norm is a plain gain (MODEL.md §1.3).
 */
#ifndef ORCHID_WEIGHTS_H
#define ORCHID_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "runtime/safetensors.h"

struct qmat {
    const uint32_t *codes;  /* [n_mats * rows, cols * bits / 32] */
    const uint16_t *scales; /* bf16 [n_mats * rows, cols / group] */
    const uint16_t *biases; /* bf16 [n_mats * rows, cols / group] */
    int rows, cols;         /* logical [out, in] of one matrix */
    int n_mats;             /* 1, or the number of stacked experts */
    int bits, group;
};

static inline size_t qmat_row_words(const struct qmat *m) { return (size_t)m->cols * (size_t)m->bits / 32; }
static inline size_t qmat_row_groups(const struct qmat *m) { return (size_t)(m->cols / m->group); }
static inline size_t qmat_bytes(const struct qmat *m) {
    size_t rows = (size_t)m->rows * (size_t)m->n_mats;
    return rows * (qmat_row_words(m) * 4 + qmat_row_groups(m) * 4);
}

struct attn_weights {
    struct qmat q;   /* [2 * n_heads * head_dim, H]: per head [query head_dim | gate head_dim] */
    struct qmat k;   /* [n_kv_heads * head_dim, H] */
    struct qmat v;   /* [n_kv_heads * head_dim, H] */
    struct qmat o;   /* [H, n_heads * head_dim] */
    float *q_norm;   /* [head_dim] gain (1 + w as stored) */
    float *k_norm;   /* [head_dim] */
};

struct gdn_weights {
    struct qmat qkv; /* [conv_dim, H]: channels [q (Hk*Dk) | k (Hk*Dk) | v (Hv*Dv)] */
    struct qmat z;   /* [Hv * Dv, H] */
    struct qmat b;   /* [Hv, H] */
    struct qmat a;   /* [Hv, H] */
    struct qmat out; /* [H, Hv * Dv] */
    float *conv;     /* [conv_dim, conv_kernel]; tap conv_kernel-1 multiplies the current token */
    float *A_log;    /* [Hv] */
    float *dt_bias;  /* [Hv] */
    float *norm;     /* [Dv] plain gain of the gated RMSNorm, shared by all value heads */
};

struct moe_weights {
    struct qmat router;       /* [E, H], 8-bit in MLX checkpoints */
    struct qmat gate, up;     /* stacked [E][I, H] */
    struct qmat down;         /* stacked [E][H, I] */
    struct qmat sh_gate, sh_up; /* [Is, H] */
    struct qmat sh_down;      /* [H, Is] */
    struct qmat sh_expert_gate; /* [1, H], 8-bit */
};

struct layer_weights {
    enum layer_kind kind;
    float *in_norm;   /* [H] input_layernorm gain */
    float *post_norm; /* [H] post_attention_layernorm gain */
    struct attn_weights attn; /* valid when kind == LAYER_ATTENTION */
    struct gdn_weights gdn;   /* valid when kind == LAYER_LINEAR */
    struct moe_weights moe;
};

struct model_weights {
    struct qmat embed;   /* [V, H] */
    struct qmat lm_head; /* [V, H] */
    float *final_norm;   /* [H] */
    struct layer_weights layers[MAX_LAYERS];
    size_t n_bound;      /* tensors consumed */
    size_t quant_bytes;  /* bytes of all quantized matrices (codes + scales + biases) */
    float *arena;        /* owns every float vector above */
    size_t arena_len, arena_used;
    void **copies;       /* aligned copies of tensors whose shard data was misaligned */
    size_t n_copies, copied_bytes;
};

/* Binds every tensor of `st` for `cfg`; fails (naming the file and tensor) on a
 * missing tensor, wrong dtype, wrong shape, unsupported bits, or any tensor left
 * unconsumed other than vision_tower.* and mtp.*. */
int weights_bind(struct model_weights *w, const struct model_config *cfg, safetensors *st, char *err, size_t errlen);
void weights_free(struct model_weights *w);

#endif
