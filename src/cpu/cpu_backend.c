/* cpu/cpu_backend.c — the reference forward pass of Qwen3.5/3.6 MoE on the CPU.
 *
 * Everything is float32: the residual stream, every activation, the KV cache and
 * the GDN conv/recurrent state. Weights stay quantized in the mmap and are
 * dequantized a row at a time (cpu_ops.c). The pass follows MODEL.md §1.2:
 *
 *   x = embed(ids)
 *   per layer:  x += mixer(rmsnorm(x, in_norm))      mixer = GDN or gated attention
 *               x += moe(rmsnorm(x, post_norm))
 *   logits = lm_head(rmsnorm(x, final_norm))          only for the requested rows
 *
 * Batches hold tokens of several sequences (each contiguous, in position order).
 * Attention writes every token's K/V into its session's cache first and then
 * attends causally by position, so one code path serves prefill and decode.
 * Scratch is sized once at creation for max_batch_tokens; the token loop
 * allocates nothing. Rows that want only their argmax (out_logits[i] == NULL) are
 * computed into a scratch of CPU_ARGMAX_ROWS rows (scored rows too, sampler_row_logprobs on the pool); the
 * argmax is sampler_argmax.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_ops.h"
#include "model/sampler.h"
#include "runtime/status.h"
#include "runtime/threadpool.h"

#define CPU_MAX_BATCH 128
#define CPU_ARGMAX_ROWS 16 /* lm_head rows computed together for outputs without logits (argmax, scores): a scored
                            * prompt chunk reads the lm_head once every 16 rows, as the 16-row logits path did */

/* Per-sequence state. Layer-indexed arrays use the attention/GDN ordinal of the layer. */
struct backend_session {
    int max_seq;
    float *kv;    /* [n_attn][max_seq][2][kv_dim]: K then V of each position */
    float *conv;  /* [n_lin][conv_kernel-1][conv_dim]: last raw qkv rows, oldest first */
    float *state; /* [n_lin][Hv][Dv][Dk] recurrent state */
};

struct cpu_backend {
    struct backend base;
    const struct model_config *cfg;
    const struct model_weights *w;
    threadpool *pool;
    int ordinal[MAX_LAYERS]; /* layer -> index among layers of its kind */
    int n_attn, n_lin;
    size_t kv_stride;        /* floats per position per attention layer (2 * kv_dim) */

    /* scratch, [CPU_MAX_BATCH, ...] each */
    float *x, *xn, *branch;
    float *qg, *k, *v, *att;             /* attention */
    float *qkv, *conv_out, *z, *ga, *gb, *y; /* GDN */
    float *router, *moe_w, *xe, *eg, *eu, *ed, *sg, *su, *sd, *seg;
    float *amax_logits; /* [CPU_ARGMAX_ROWS, vocab]: rows whose logits are not wanted */
    int32_t *moe_ids, *expert_rows, *expert_count, *expert_start;
};

/* ---- attention ---------------------------------------------------------- */

struct attn_job {
    struct cpu_backend *cb;
    const struct attn_weights *aw;
    const struct fwd_batch *b;
    int layer_ord;
    int phase; /* 0: norm+rope q/k and write K/V; 1: attend */
};

static float *kv_row(struct cpu_backend *cb, struct backend_session *s, int ord, int pos) {
    return s->kv + ((size_t)ord * (size_t)s->max_seq + (size_t)pos) * cb->kv_stride;
}

static void attn_item(void *ctx, int item) {
    struct attn_job *j = ctx;
    struct cpu_backend *cb = j->cb;
    const struct model_config *c = cb->cfg;
    const int D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads, kvd = cfg_kv_dim(c);
    const struct fwd_batch *b = j->b;
    if (j->phase == 0) {
        /* item = token × (Hq + Hkv): normalise + rotate one q head, or one k head (and store K, V). */
        const int t = item / (Hq + Hkv), h = item % (Hq + Hkv);
        const int pos = b->pos[t];
        if (h < Hq) {
            float *q = cb->qg + (size_t)t * 2 * cfg_q_dim(c) + (size_t)h * 2 * D; /* [query D | gate D] */
            rmsnorm(q, q, j->aw->q_norm, D, c->rms_eps);
            rope_neox(q, c->rotary_dim, pos, c->rope_theta);
        } else {
            const int kh = h - Hq;
            float *k = cb->k + (size_t)t * kvd + (size_t)kh * D;
            rmsnorm(k, k, j->aw->k_norm, D, c->rms_eps);
            rope_neox(k, c->rotary_dim, pos, c->rope_theta);
            float *row = kv_row(cb, b->sessions[b->seq[t]], j->layer_ord, pos);
            memcpy(row + (size_t)kh * D, k, (size_t)D * sizeof(float));
            memcpy(row + kvd + (size_t)kh * D, cb->v + (size_t)t * kvd + (size_t)kh * D, (size_t)D * sizeof(float));
        }
        return;
    }
    /* phase 1: item = token × Hq. Causal softmax attention over positions 0..pos with an
     * online (running max) softmax; query head h reads KV head h / (Hq / Hkv). */
    const int t = item / Hq, h = item % Hq;
    const int pos = b->pos[t];
    struct backend_session *s = b->sessions[b->seq[t]];
    const float *q = cb->qg + (size_t)t * 2 * cfg_q_dim(c) + (size_t)h * 2 * D;
    const int kh = h / (Hq / Hkv);
    const float scale = 1.0f / sqrtf((float)D);
    float acc[D];
    memset(acc, 0, sizeof acc);
    float m = -INFINITY, l = 0;
    for (int p = 0; p <= pos; p++) {
        const float *row = kv_row(cb, s, j->layer_ord, p);
        const float sc = dot_f32(q, row + (size_t)kh * D, D) * scale;
        const float *vv = row + kvd + (size_t)kh * D;
        if (sc > m) {
            const float r = expf(m - sc);
            for (int d = 0; d < D; d++) acc[d] *= r;
            l *= r;
            m = sc;
        }
        const float e = expf(sc - m);
        l += e;
        for (int d = 0; d < D; d++) acc[d] += e * vv[d];
    }
    const float *gate = q + D;
    float *out = cb->att + (size_t)t * cfg_q_dim(c) + (size_t)h * D;
    for (int d = 0; d < D; d++) out[d] = (acc[d] / l) * sigmoid_f32(gate[d]);
}

static void attention_layer(struct cpu_backend *cb, const struct attn_weights *aw, int ord, const struct fwd_batch *b) {
    const struct model_config *c = cb->cfg;
    const int T = b->n_tokens, H = c->hidden;
    cpu_qmatmul(cb->pool, &aw->q, 0, cb->xn, T, H, cb->qg, 2 * cfg_q_dim(c));
    cpu_qmatmul(cb->pool, &aw->k, 0, cb->xn, T, H, cb->k, cfg_kv_dim(c));
    cpu_qmatmul(cb->pool, &aw->v, 0, cb->xn, T, H, cb->v, cfg_kv_dim(c));
    struct attn_job j = {.cb = cb, .aw = aw, .b = b, .layer_ord = ord, .phase = 0};
    threadpool_run(cb->pool, T * (c->n_heads + c->n_kv_heads), attn_item, &j);
    j.phase = 1;
    threadpool_run(cb->pool, T * c->n_heads, attn_item, &j);
    cpu_qmatmul(cb->pool, &aw->o, 0, cb->att, T, cfg_q_dim(c), cb->branch, H);
}

/* ---- Gated DeltaNet ------------------------------------------------------ */

struct gdn_job {
    struct cpu_backend *cb;
    const struct gdn_weights *gw;
    const struct fwd_batch *b;
    int ord;
    int t0, t1; /* the token range of one sequence */
    struct backend_session *s;
};

/* Causal depthwise conv + SiLU for one channel over the sequence's tokens; then the
 * channel's conv state keeps its last K-1 raw inputs. */
static void conv_item(void *ctx, int ch) {
    struct gdn_job *j = ctx;
    struct cpu_backend *cb = j->cb;
    const int K = cb->cfg->conv_kernel, C = cfg_conv_dim(cb->cfg);
    float *st = j->s->conv + (size_t)j->ord * (size_t)(K - 1) * C; /* [K-1][C] */
    const float *w = j->gw->conv + (size_t)ch * K;
    float win[16]; /* the K most recent raw inputs, oldest first; K <= 16 by config validation */
    for (int i = 0; i < K - 1; i++) win[i] = st[(size_t)i * C + ch];
    for (int t = j->t0; t < j->t1; t++) {
        win[K - 1] = cb->qkv[(size_t)t * C + ch];
        float acc = 0;
        for (int i = 0; i < K; i++) acc += w[i] * win[i];
        cb->conv_out[(size_t)t * C + ch] = silu_f32(acc);
        for (int i = 0; i < K - 1; i++) win[i] = win[i + 1];
    }
    for (int i = 0; i < K - 1; i++) st[(size_t)i * C + ch] = win[i];
}

/* The recurrence of one value head over the sequence's tokens, then the gated RMSNorm. */
static void gdn_head_item(void *ctx, int h) {
    struct gdn_job *j = ctx;
    struct cpu_backend *cb = j->cb;
    const struct model_config *c = cb->cfg;
    const int Dk = c->lin_k_dim, Dv = c->lin_v_dim, Hv = c->lin_v_heads, C = cfg_conv_dim(c);
    const int kh = h / (Hv / c->lin_k_heads);
    const int key_dim = cfg_lin_key_dim(c), vdim = cfg_lin_value_dim(c);
    float *S = j->s->state + ((size_t)j->ord * Hv + (size_t)h) * (size_t)Dv * Dk;
    float q[Dk], k[Dk];
    const float A = expf(j->gw->A_log[h]);
    for (int t = j->t0; t < j->t1; t++) {
        const float *row = cb->conv_out + (size_t)t * C;
        /* l2-normalise q and k (eps 1e-6 on Σx², as mlx-lm's normalize_qk), fold Dk^-1/2 into q. */
        const float *qs = row + (size_t)kh * Dk, *ks = row + key_dim + (size_t)kh * Dk;
        float sq = 0, sk = 0;
        for (int d = 0; d < Dk; d++) { sq += qs[d] * qs[d]; sk += ks[d] * ks[d]; }
        const float iq = 1.0f / sqrtf(sq + 1e-6f) / sqrtf((float)Dk), ik = 1.0f / sqrtf(sk + 1e-6f);
        for (int d = 0; d < Dk; d++) { q[d] = qs[d] * iq; k[d] = ks[d] * ik; }
        const float *v = row + 2 * key_dim + (size_t)h * Dv;
        const float beta = sigmoid_f32(cb->gb[(size_t)t * Hv + h]);
        const float decay = expf(-A * softplus_f32(cb->ga[(size_t)t * Hv + h] + j->gw->dt_bias[h]));
        float *y = cb->y + (size_t)t * vdim + (size_t)h * Dv;
        gdn_step(S, q, k, v, decay, beta, Dk, Dv, y);
        /* gated RMSNorm: w ⊙ y / rms(y) ⊙ silu(z) */
        const float *z = cb->z + (size_t)t * vdim + (size_t)h * Dv;
        rmsnorm(y, y, j->gw->norm, Dv, c->rms_eps);
        for (int d = 0; d < Dv; d++) y[d] *= silu_f32(z[d]);
    }
}

static void gdn_layer(struct cpu_backend *cb, const struct gdn_weights *gw, int ord, const struct fwd_batch *b) {
    const struct model_config *c = cb->cfg;
    const int T = b->n_tokens, H = c->hidden;
    cpu_qmatmul(cb->pool, &gw->qkv, 0, cb->xn, T, H, cb->qkv, cfg_conv_dim(c));
    cpu_qmatmul(cb->pool, &gw->z, 0, cb->xn, T, H, cb->z, cfg_lin_value_dim(c));
    cpu_qmatmul(cb->pool, &gw->b, 0, cb->xn, T, H, cb->gb, c->lin_v_heads);
    cpu_qmatmul(cb->pool, &gw->a, 0, cb->xn, T, H, cb->ga, c->lin_v_heads);
    for (int t0 = 0; t0 < T;) { /* one sequence at a time: its tokens are contiguous */
        int t1 = t0 + 1;
        while (t1 < T && b->seq[t1] == b->seq[t0]) t1++;
        struct gdn_job j = {.cb = cb, .gw = gw, .b = b, .ord = ord, .t0 = t0, .t1 = t1, .s = b->sessions[b->seq[t0]]};
        threadpool_run(cb->pool, cfg_conv_dim(c), conv_item, &j);
        threadpool_run(cb->pool, c->lin_v_heads, gdn_head_item, &j);
        t0 = t1;
    }
    cpu_qmatmul(cb->pool, &gw->out, 0, cb->y, T, cfg_lin_value_dim(c), cb->branch, H);
}

/* ---- MoE ------------------------------------------------------------------ */

static void moe_layer(struct cpu_backend *cb, const struct moe_weights *mw, const struct fwd_batch *b) {
    const struct model_config *c = cb->cfg;
    const int T = b->n_tokens, H = c->hidden, E = c->n_experts, K = c->n_experts_per_tok, I = c->moe_inter, Is = c->shared_inter;
    cpu_qmatmul(cb->pool, &mw->router, 0, cb->xn, T, H, cb->router, E);
    for (int t = 0; t < T; t++)
        moe_route(cb->router + (size_t)t * E, E, K, c->norm_topk_prob, cb->moe_ids + (size_t)t * K, cb->moe_w + (size_t)t * K);

    /* Counting sort of (token, slot) pairs by expert, so each expert's rows are dequantized once. */
    memset(cb->expert_count, 0, (size_t)E * sizeof(int32_t));
    for (int i = 0; i < T * K; i++) cb->expert_count[cb->moe_ids[i]]++;
    int acc = 0;
    for (int e = 0; e < E; e++) { cb->expert_start[e] = acc; acc += cb->expert_count[e]; cb->expert_count[e] = 0; }
    for (int i = 0; i < T * K; i++) {
        const int e = cb->moe_ids[i];
        cb->expert_rows[cb->expert_start[e] + cb->expert_count[e]++] = i; /* pair index t*K + slot */
    }

    memset(cb->branch, 0, (size_t)T * H * sizeof(float));
    for (int e = 0; e < E; e++) {
        const int n = cb->expert_count[e];
        if (!n) continue;
        const int32_t *pairs = cb->expert_rows + cb->expert_start[e];
        for (int r = 0; r < n; r++) memcpy(cb->xe + (size_t)r * H, cb->xn + (size_t)(pairs[r] / K) * H, (size_t)H * sizeof(float));
        cpu_qmatmul(cb->pool, &mw->gate, e, cb->xe, n, H, cb->eg, I);
        cpu_qmatmul(cb->pool, &mw->up, e, cb->xe, n, H, cb->eu, I);
        for (size_t i = 0; i < (size_t)n * I; i++) cb->eg[i] = silu_f32(cb->eg[i]) * cb->eu[i];
        cpu_qmatmul(cb->pool, &mw->down, e, cb->eg, n, I, cb->ed, H);
        for (int r = 0; r < n; r++) {
            const float wgt = cb->moe_w[pairs[r]];
            float *dst = cb->branch + (size_t)(pairs[r] / K) * H;
            const float *src = cb->ed + (size_t)r * H;
            for (int d = 0; d < H; d++) dst[d] += wgt * src[d];
        }
    }
    /* shared expert, gated by sigmoid(shared_expert_gate · x) per token */
    cpu_qmatmul(cb->pool, &mw->sh_gate, 0, cb->xn, T, H, cb->sg, Is);
    cpu_qmatmul(cb->pool, &mw->sh_up, 0, cb->xn, T, H, cb->su, Is);
    for (size_t i = 0; i < (size_t)T * Is; i++) cb->sg[i] = silu_f32(cb->sg[i]) * cb->su[i];
    cpu_qmatmul(cb->pool, &mw->sh_down, 0, cb->sg, T, Is, cb->sd, H);
    cpu_qmatmul(cb->pool, &mw->sh_expert_gate, 0, cb->xn, T, H, cb->seg, 1);
    for (int t = 0; t < T; t++) {
        const float g = sigmoid_f32(cb->seg[t]);
        for (int d = 0; d < H; d++) cb->branch[(size_t)t * H + d] += g * cb->sd[(size_t)t * H + d];
    }
}

/* ---- the whole pass -------------------------------------------------------- */

static void add_inplace(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* Scoring rows [i0, i0 + n) of a pass on the pool, a row an item. */
struct score_pass {
    const struct fwd_batch *b;
    const float *dst;
    int i0, vocab;
};
static void score_item(void *ctx, int k) {
    const struct score_pass *p = ctx;
    const int i = p->i0 + k;
    if (fwd_row_scored(p->b, i))
        sampler_row_logprobs(p->dst + (size_t)k * p->vocab, p->vocab, p->b->out_score[i].token, p->b->out_score[i].n_top,
                             &p->b->out_scores[i]);
}

/* lm_head for output rows [i0, i1) into dst (i1 - i0 rows of vocab), then their scores and
 * argmax when wanted. */
static void lm_head_rows(struct cpu_backend *cb, const struct fwd_batch *b, int i0, int i1, float *dst) {
    const struct model_config *c = cb->cfg;
    cpu_qmatmul(cb->pool, &cb->w->lm_head, 0, cb->xn + (size_t)i0 * c->hidden, i1 - i0, c->hidden, dst, c->vocab);
    if (b->out_score) {
        struct score_pass sp = {b, dst, i0, c->vocab};
        threadpool_run(cb->pool, i1 - i0, score_item, &sp);
    }
    if (!b->out_argmax) return;
    for (int i = i0; i < i1; i++) {
        const int32_t id = sampler_argmax(dst + (size_t)(i - i0) * c->vocab, c->vocab);
        b->out_argmax[i] = id < 0 ? 0 : id; /* all NaN: 0, as the CUDA argmax */
    }
}

static int cpu_forward(struct backend *base, const struct fwd_batch *b, char *err, size_t errlen) {
    struct cpu_backend *cb = (struct cpu_backend *)base;
    const struct model_config *c = cb->cfg;
    const struct model_weights *w = cb->w;
    const int T = b->n_tokens, H = c->hidden;
    if (T <= 0 || T > CPU_MAX_BATCH) return errorf(err, errlen, ST_INTERNAL, "cpu forward: batch of %d tokens (1..%d)", T, CPU_MAX_BATCH);
    for (int t = 0; t < T; t++)
        if (b->pos[t] < 0 || b->pos[t] >= b->sessions[b->seq[t]]->max_seq)
            return errorf(err, errlen, ST_RANGE, "cpu forward: position %d outside the session (capacity %d)", b->pos[t],
                          b->sessions[b->seq[t]]->max_seq);

    for (int t = 0; t < T; t++) qmat_dequant_row(&w->embed, 0, b->tokens[t], cb->x + (size_t)t * H);
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *L = &w->layers[l];
        for (int t = 0; t < T; t++) rmsnorm(cb->xn + (size_t)t * H, cb->x + (size_t)t * H, L->in_norm, H, c->rms_eps);
        if (L->kind == LAYER_ATTENTION) attention_layer(cb, &L->attn, cb->ordinal[l], b);
        else gdn_layer(cb, &L->gdn, cb->ordinal[l], b);
        add_inplace(cb->x, cb->branch, (size_t)T * H);
        for (int t = 0; t < T; t++) rmsnorm(cb->xn + (size_t)t * H, cb->x + (size_t)t * H, L->post_norm, H, c->rms_eps);
        moe_layer(cb, &L->moe, b);
        add_inplace(cb->x, cb->branch, (size_t)T * H);
    }
    for (int i = 0; i < b->n_out; i++) {
        const int t = b->out_rows[i];
        rmsnorm(cb->xn + (size_t)i * H, cb->x + (size_t)t * H, w->final_norm, H, c->rms_eps);
    }
    /* lm_head over runs of rows whose destinations are adjacent (one dequant per run);
     * runs of argmax-only rows go through the scratch */
    for (int i0 = 0; i0 < b->n_out;) {
        int i1 = i0 + 1;
        if (!b->out_logits[i0]) {
            if (!b->out_argmax && !fwd_row_scored(b, i0))
                return errorf(err, errlen, ST_INTERNAL, "cpu forward: output row %d wants nothing", i0);
            while (i1 < b->n_out && i1 - i0 < CPU_ARGMAX_ROWS && !b->out_logits[i1]) i1++;
            lm_head_rows(cb, b, i0, i1, cb->amax_logits);
        } else {
            while (i1 < b->n_out && b->out_logits[i1] && b->out_logits[i1] == b->out_logits[i1 - 1] + c->vocab) i1++;
            lm_head_rows(cb, b, i0, i1, b->out_logits[i0]);
        }
        i0 = i1;
    }
    return 0;
}

/* ---- sessions and lifetime ------------------------------------------------------- */

static int cpu_session_create(struct backend *base, int max_seq, struct backend_session **out, char *err, size_t errlen) {
    struct cpu_backend *cb = (struct cpu_backend *)base;
    const struct model_config *c = cb->cfg;
    struct backend_session *s = calloc(1, sizeof *s);
    if (!s) return errorf(err, errlen, ST_NOMEM, "out of memory for a session");
    s->max_seq = max_seq;
    const size_t kv = (size_t)cb->n_attn * (size_t)max_seq * cb->kv_stride;
    const size_t conv = (size_t)cb->n_lin * (size_t)(c->conv_kernel - 1) * cfg_conv_dim(c);
    const size_t st = (size_t)cb->n_lin * c->lin_v_heads * (size_t)c->lin_v_dim * c->lin_k_dim;
    s->kv = calloc(kv ? kv : 1, sizeof(float));
    s->conv = calloc(conv ? conv : 1, sizeof(float));
    s->state = calloc(st ? st : 1, sizeof(float));
    if (!s->kv || !s->conv || !s->state) {
        free(s->kv); free(s->conv); free(s->state); free(s);
        return errorf(err, errlen, ST_NOMEM, "out of memory for a session of %d tokens (%.1f MiB of KV cache)", max_seq,
                      (double)kv * 4 / (1 << 20));
    }
    *out = s;
    return 0;
}

static void cpu_session_destroy(struct backend *base, struct backend_session *s) {
    (void)base;
    if (!s) return;
    free(s->kv); free(s->conv); free(s->state); free(s);
}

static void cpu_session_reset(struct backend *base, struct backend_session *s) {
    struct cpu_backend *cb = (struct cpu_backend *)base;
    const struct model_config *c = cb->cfg;
    /* KV rows past the length are never read; only the recurrent state must be cleared. */
    memset(s->conv, 0, (size_t)cb->n_lin * (size_t)(c->conv_kernel - 1) * cfg_conv_dim(c) * sizeof(float));
    memset(s->state, 0, (size_t)cb->n_lin * c->lin_v_heads * (size_t)c->lin_v_dim * c->lin_k_dim * sizeof(float));
}

static size_t conv_floats(const struct cpu_backend *cb) {
    return (size_t)cb->n_lin * (size_t)(cb->cfg->conv_kernel - 1) * cfg_conv_dim(cb->cfg);
}
static size_t rec_floats(const struct cpu_backend *cb) {
    const struct model_config *c = cb->cfg;
    return (size_t)cb->n_lin * c->lin_v_heads * (size_t)c->lin_v_dim * c->lin_k_dim;
}

static size_t cpu_state_bytes(struct backend *base) {
    struct cpu_backend *cb = (struct cpu_backend *)base;
    return (conv_floats(cb) + rec_floats(cb)) * sizeof(float);
}

static int cpu_state_save(struct backend *base, struct backend_session *s, void *dst, char *err, size_t errlen) {
    struct cpu_backend *cb = (struct cpu_backend *)base;
    (void)err; (void)errlen;
    memcpy(dst, s->conv, conv_floats(cb) * sizeof(float));
    memcpy((float *)dst + conv_floats(cb), s->state, rec_floats(cb) * sizeof(float));
    return 0;
}

static int cpu_state_load(struct backend *base, struct backend_session *s, const void *src, char *err, size_t errlen) {
    struct cpu_backend *cb = (struct cpu_backend *)base;
    (void)err; (void)errlen;
    memcpy(s->conv, src, conv_floats(cb) * sizeof(float));
    memcpy(s->state, (const float *)src + conv_floats(cb), rec_floats(cb) * sizeof(float));
    return 0;
}

static size_t cpu_kv_bytes_per_token(struct backend *base) {
    struct cpu_backend *cb = (struct cpu_backend *)base;
    return (size_t)cb->n_attn * cb->kv_stride * sizeof(float);
}

/* KV rows of positions [pos0, pos0+n) of every attention layer, layer-major in dst. */
static int cpu_kv_copy(struct cpu_backend *cb, struct backend_session *s, int pos0, int n, float *host, bool save,
                       char *err, size_t errlen) {
    if (pos0 < 0 || n < 0 || pos0 + n > s->max_seq)
        return errorf(err, errlen, ST_RANGE, "KV range [%d, %d) outside the session capacity %d", pos0, pos0 + n, s->max_seq);
    const size_t row = cb->kv_stride * sizeof(float);
    for (int l = 0; l < cb->n_attn; l++) {
        float *dev = kv_row(cb, s, l, pos0);
        float *h = host + (size_t)l * n * cb->kv_stride;
        if (save) memcpy(h, dev, (size_t)n * row);
        else memcpy(dev, h, (size_t)n * row);
    }
    return 0;
}

static int cpu_kv_save(struct backend *base, struct backend_session *s, int pos0, int n, void *dst, char *err, size_t errlen) {
    return cpu_kv_copy((struct cpu_backend *)base, s, pos0, n, dst, true, err, errlen);
}

static int cpu_kv_load(struct backend *base, struct backend_session *s, int pos0, int n, const void *src, char *err, size_t errlen) {
    return cpu_kv_copy((struct cpu_backend *)base, s, pos0, n, (float *)src, false, err, errlen);
}

static void cpu_destroy(struct backend *base) {
    struct cpu_backend *cb = (struct cpu_backend *)base;
    if (!cb) return;
    threadpool_destroy(cb->pool);
    float **bufs[] = {&cb->x, &cb->xn, &cb->branch, &cb->qg, &cb->k, &cb->v, &cb->att, &cb->qkv, &cb->conv_out, &cb->z,
                      &cb->ga, &cb->gb, &cb->y, &cb->router, &cb->moe_w, &cb->xe, &cb->eg, &cb->eu, &cb->ed, &cb->sg,
                      &cb->su, &cb->sd, &cb->seg, &cb->amax_logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(*bufs[i]);
    free(cb->moe_ids); free(cb->expert_rows); free(cb->expert_count); free(cb->expert_start);
    free(cb);
}

int cpu_backend_create(struct backend **out, const struct model_config *c, const struct model_weights *w, int threads,
                       char *err, size_t errlen) {
    *out = NULL;
    struct cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return errorf(err, errlen, ST_NOMEM, "out of memory");
    cb->base = (struct backend){.name = "cpu", .max_batch_tokens = CPU_MAX_BATCH, .row_scores = 1, .session_create = cpu_session_create,
                                .session_destroy = cpu_session_destroy, .session_reset = cpu_session_reset,
                                .forward = cpu_forward, .state_bytes = cpu_state_bytes, .state_save = cpu_state_save,
                                .state_load = cpu_state_load, .kv_bytes_per_token = cpu_kv_bytes_per_token,
                                .kv_save = cpu_kv_save, .kv_load = cpu_kv_load, .destroy = cpu_destroy};
    cb->cfg = c;
    cb->w = w;
    for (int l = 0; l < c->n_layers; l++) cb->ordinal[l] = c->layer_kind[l] == LAYER_ATTENTION ? cb->n_attn++ : cb->n_lin++;
    cb->kv_stride = 2 * (size_t)cfg_kv_dim(c);
    int rc = threadpool_create(&cb->pool, threads, err, errlen);
    if (rc) { free(cb); return rc; }

    const size_t T = CPU_MAX_BATCH, H = (size_t)c->hidden, K = (size_t)c->n_experts_per_tok;
    struct { float **p; size_t n; } f[] = {
        {&cb->x, T * H}, {&cb->xn, T * H}, {&cb->branch, T * H},
        {&cb->qg, T * 2 * cfg_q_dim(c)}, {&cb->k, T * cfg_kv_dim(c)}, {&cb->v, T * cfg_kv_dim(c)}, {&cb->att, T * cfg_q_dim(c)},
        {&cb->qkv, T * cfg_conv_dim(c)}, {&cb->conv_out, T * cfg_conv_dim(c)}, {&cb->z, T * cfg_lin_value_dim(c)},
        {&cb->ga, T * c->lin_v_heads}, {&cb->gb, T * c->lin_v_heads}, {&cb->y, T * cfg_lin_value_dim(c)},
        {&cb->router, T * c->n_experts}, {&cb->moe_w, T * K}, {&cb->xe, T * K * H}, {&cb->eg, T * K * c->moe_inter},
        {&cb->eu, T * K * c->moe_inter}, {&cb->ed, T * K * H}, {&cb->sg, T * c->shared_inter}, {&cb->su, T * c->shared_inter},
        {&cb->sd, T * H}, {&cb->seg, T}, {&cb->amax_logits, (size_t)CPU_ARGMAX_ROWS * c->vocab},
    };
    bool ok = true;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) ok &= (*f[i].p = malloc(f[i].n * sizeof(float))) != NULL;
    ok &= (cb->moe_ids = malloc(T * K * sizeof(int32_t))) != NULL;
    ok &= (cb->expert_rows = malloc(T * K * sizeof(int32_t))) != NULL;
    ok &= (cb->expert_count = malloc((size_t)c->n_experts * sizeof(int32_t))) != NULL;
    ok &= (cb->expert_start = malloc((size_t)c->n_experts * sizeof(int32_t))) != NULL;
    if (!ok) {
        cpu_destroy(&cb->base);
        return errorf(err, errlen, ST_NOMEM, "out of memory for CPU scratch");
    }
    *out = &cb->base;
    return 0;
}
