// cuda/cuda_backend.cu — the CUDA implementation of struct backend (backend.h):
// weight upload (once, one device arena, load time and GB/s reported), sessions
// (bf16 KV cache, fp32 GDN state, fp32 conv state on the GPU), the forward pass over
// any batch (small batches take the GEMV/pair kernels, larger ones the tensor-core
// GEMMs and the grouped MoE), and decode_greedy: one decode step captured as a CUDA
// graph per session that reads its token and position from device memory, writes
// the argmax into the next step's input slot and advances the position, replayed
// with two steps in flight and no host synchronisation inside a step; and the
// session state transfer of prefix checkpoints (conv + GDN state, KV rows).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_gemm.h"

extern "C" {
#include "backend.h"
}

#define CUDA_MAX_BATCH 4096
#define SMALL_T 16     /* batches up to this many tokens may use the GEMV / pair kernels */
#define MID_T 64       /* 2..MID_T tokens: the skinny tensor-core kernels (cuda_skinny.cu) */
static_assert(MID_T + 1 == CUDA_ATTN_WIDE_MIN_T, "prompt chunks' attention kernel: the forwards past the 2..MID_T path");
#define LOGIT_ROWS 64  /* lm_head rows per pass */
#define CNT_ATTN 16 /* cb->counters: the first of the attention tails' */
#define CNT_N 64
#define MAX_SPLIT 128 /* attention key splits of a decode step (32k context: 256 keys a block) */
#define PROF_MAX 2048

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct dlayer {
    int kind, ord;
    float *in_norm, *post_norm;
    cuda_qmat q, k, v, o;
    float *q_norm, *k_norm;
    cuda_qmat qkv, z, b, a, out;
    float *conv, *A_log, *dt_bias, *norm;
    cuda_qmat router, gate, up, down, sh_gate, sh_up, sh_down, sh_eg;
    bool skinny; /* every matrix the 2..MID_T path multiplies is 4-bit (cuda_skinny_supported) */
    bool tcv;    /* ... and one token's projections and expert pairs can take cuda_tcv.cu */
};

/* Device pointers of one batch's metadata. */
struct dmeta {
    int T, n_seqs, n_tiles, n_split;
    int n_long; /* sequences of at least CUDA_GDN_CHUNK_MIN tokens (the prefill scan's dispatch) */
    const int32_t *tok, *pos, *tok_seq;
    const cuda_seq *seqs;
    const cuda_attn_tile *tiles;
};

struct cuda_backend;

struct backend_session {
    struct cuda_backend *cb;
    int max_seq;
    uint16_t *kv;
    float *conv, *state;
    /* decode loop */
    int32_t *d_dec;      /* tok, pos, step, tok_seq(=0) */
    cuda_seq *d_dec_seq; /* [1] */
    cuda_attn_tile *d_dec_tile;
    int32_t *d_out_ids;  /* [max_seq] */
    int32_t *h_ids;      /* pinned [max_seq] */
    cudaGraphExec_t graph;
    int n_split;
    int graph_prof_n; /* event marks captured in the graph (profiling) */
};

struct cuda_backend {
    struct backend base;
    const struct model_config *cfg;
    int H, V, E, K, I, Is, C, vd, kd, qd, kvd, Hv, Hk, Dk, Dv, D, nh, kvh;
    int n_attn, n_lin;
    int n_sm; /* multiprocessors: the decode attention splits to fill them */
    char *warena;
    size_t wbytes, wused;
    double load_s;
    char device[160]; /* cuda_device_name of the device the weights live on */
    dlayer L[MAX_LAYERS];
    cuda_qmat embed, lm_head;
    float *final_norm;
    cudaStream_t stream;
    cudaEvent_t ev[2];
    /* 2..64 tokens: the shared expert runs on `side` while the router, the route and the
     * routed experts run on `stream` (fork after the post-norm, join before the combine);
     * NULL side (ORCHID_NO_SIDE_STREAM=1), or profiling or tracing: one stream */
    cudaStream_t side;
    cudaEvent_t fork_ev, join_ev;
    /* metadata */
    char *h_meta, *d_meta;
    size_t meta_cap;
    /* scratch */
    float *x, *xn32, *proj, *zb, *kb, *vb, *gab, *conv_out, *y, *rlog, *seg, *mw, *ed, *sd, *part, *logits;
    float *gdn_qk, *gdn_gates; /* prefill-form GDN preparation (NULL: shape not supported, one-launch scan) */
    uint16_t *xn, *xlo, *ybf, *act, *sact, *xo;
    struct cuda_xstage xn_stage; /* xn's rows staged by the 2..MID_T combine + norm (mid_xstage) */
    int32_t *ids, *out_rows, *amax_scratch, *amax_ids;
    int32_t *h_amax_ids; /* pinned [CUDA_MAX_BATCH]: forward's argmax ids (amax_ids: the device side) */
    struct sample_result *d_scores, *h_scores; /* [CUDA_MAX_BATCH] scored output rows (cuda_row_scores), device / pinned */
    struct cuda_saver *saver; /* checkpoint saves beside the decode stream (async_save_on; NULL: none yet) */
    bool saver_failed;        /* its staging could not be had: saves stay synchronous */
    cudaGraphExec_t fg; /* the one-token forward's graph (fwd_graph; NULL: none captured) */
    int fg_key[4];      /* what it was captured for: n_split, n_out, argmax, sampling */
    int *counters; /* [CNT_N] zeroed: last-block counters of the fused decode launches: [0] post-norm
                    * tail, [2] next-layer norm tail, [4..11] the router's top-k (8 tokens each),
                    * [CNT_ATTN..] the attention's combine barriers (arrivals, generation: a
                    * query tile × KV head each) */
    cuda_moe_route route;
    /* optional per-op GPU timing of forward (ORCHID_CUDA_PROFILE=1; never inside a capture) */
    int prof_on, prof_n;
    const char *prof_name[PROF_MAX];
    cudaEvent_t prof_ev[PROF_MAX + 1];
    const char *prof_keys[64];
    double prof_ms[64];
    long prof_calls[64];
    int prof_nkeys;
    const char *trace_path; /* != NULL: the next forward records its in-kernel timeline here */
    int trace_n;
    const char *trace_name[PROF_MAX]; /* the forward's op names, in launch order */
    unsigned trace_launches[PROF_MAX]; /* kernels each op launched */
    unsigned trace_launch0;            /* cuda_trace_launch_count() at the previous op's end */
};

/* ---- weights ---- */

static int up_qmat(struct cuda_backend *cb, const struct qmat *m, cuda_qmat *d, const char *name, char *err, size_t errlen) {
    if (m->group != QGROUP || (m->bits != 4 && m->bits != 8) || m->cols % QGROUP)
        return errorf(err, errlen, ST_UNSUPPORTED, "cuda: %s has %d-bit codes in groups of %d (needs 4 or 8 bits, group 64)",
                      name, m->bits, m->group);
    const size_t rows = (size_t)m->rows * m->n_mats;
    const size_t cb_ = rows * m->cols * m->bits / 8, sb = rows * (m->cols / QGROUP) * 2;
    char *p = cb->warena + cb->wused;
    CUDA_TRY(cudaMemcpy(p, m->codes, cb_, cudaMemcpyHostToDevice), err, errlen, name);
    CUDA_TRY(cudaMemcpy(p + cb_, m->scales, sb, cudaMemcpyHostToDevice), err, errlen, name);
    CUDA_TRY(cudaMemcpy(p + cb_ + sb, m->biases, sb, cudaMemcpyHostToDevice), err, errlen, name);
    d->codes = (const uint32_t *)p;
    d->scales = (const uint16_t *)(p + cb_);
    d->biases = (const uint16_t *)(p + cb_ + sb);
    d->rows = m->rows;
    d->cols = m->cols;
    d->n_mats = m->n_mats;
    d->bits = m->bits;
    cb->wused += (cb_ + 2 * sb + 255) & ~(size_t)255;
    return 0;
}

static size_t qmat_dev_bytes(const struct qmat *m) {
    const size_t rows = (size_t)m->rows * m->n_mats;
    return (rows * m->cols * m->bits / 8 + 2 * rows * (m->cols / 64) * 2 + 255) & ~(size_t)255;
}

static int up_f32(struct cuda_backend *cb, const float *h, size_t n, float **d, const char *name, char *err, size_t errlen) {
    char *p = cb->warena + cb->wused;
    CUDA_TRY(cudaMemcpy(p, h, n * 4, cudaMemcpyHostToDevice), err, errlen, name);
    *d = (float *)p;
    cb->wused += (n * 4 + 255) & ~(size_t)255;
    return 0;
}

#define VEC_BYTES(n) ((((size_t)(n)) * 4 + 255) & ~(size_t)255)

static size_t weights_dev_bytes(const struct model_config *c, const struct model_weights *w) {
    size_t b = qmat_dev_bytes(&w->embed) + qmat_dev_bytes(&w->lm_head) + VEC_BYTES(c->hidden);
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *L = &w->layers[l];
        b += 2 * VEC_BYTES(c->hidden);
        if (L->kind == LAYER_ATTENTION) {
            b += qmat_dev_bytes(&L->attn.q) + qmat_dev_bytes(&L->attn.k) + qmat_dev_bytes(&L->attn.v) + qmat_dev_bytes(&L->attn.o);
            b += 2 * VEC_BYTES(c->head_dim);
        } else {
            b += qmat_dev_bytes(&L->gdn.qkv) + qmat_dev_bytes(&L->gdn.z) + qmat_dev_bytes(&L->gdn.b) + qmat_dev_bytes(&L->gdn.a) +
                 qmat_dev_bytes(&L->gdn.out);
            b += VEC_BYTES((size_t)cfg_conv_dim(c) * c->conv_kernel) + 2 * VEC_BYTES(c->lin_v_heads) + VEC_BYTES(c->lin_v_dim);
        }
        const struct moe_weights *m = &L->moe;
        b += qmat_dev_bytes(&m->router) + qmat_dev_bytes(&m->gate) + qmat_dev_bytes(&m->up) + qmat_dev_bytes(&m->down) +
             qmat_dev_bytes(&m->sh_gate) + qmat_dev_bytes(&m->sh_up) + qmat_dev_bytes(&m->sh_down) +
             qmat_dev_bytes(&m->sh_expert_gate);
    }
    return b;
}

static int upload_weights(struct cuda_backend *cb, const struct model_weights *w, char *err, size_t errlen) {
    const struct model_config *c = cb->cfg;
    int rc;
    char name[96];
#define UQ(m, d, nm) do { if ((rc = up_qmat(cb, (m), (d), (nm), err, errlen))) return rc; } while (0)
#define UF(h, n, d, nm) do { if ((rc = up_f32(cb, (h), (n), (d), (nm), err, errlen))) return rc; } while (0)
    UQ(&w->embed, &cb->embed, "embed_tokens");
    UQ(&w->lm_head, &cb->lm_head, "lm_head");
    UF(w->final_norm, c->hidden, &cb->final_norm, "norm");
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *L = &w->layers[l];
        dlayer *d = &cb->L[l];
        snprintf(name, sizeof name, "layer %d", l);
        d->kind = L->kind;
        UF(L->in_norm, c->hidden, &d->in_norm, name);
        UF(L->post_norm, c->hidden, &d->post_norm, name);
        if (L->kind == LAYER_ATTENTION) {
            UQ(&L->attn.q, &d->q, name); UQ(&L->attn.k, &d->k, name); UQ(&L->attn.v, &d->v, name); UQ(&L->attn.o, &d->o, name);
            UF(L->attn.q_norm, c->head_dim, &d->q_norm, name);
            UF(L->attn.k_norm, c->head_dim, &d->k_norm, name);
        } else {
            UQ(&L->gdn.qkv, &d->qkv, name); UQ(&L->gdn.z, &d->z, name); UQ(&L->gdn.b, &d->b, name);
            UQ(&L->gdn.a, &d->a, name); UQ(&L->gdn.out, &d->out, name);
            UF(L->gdn.conv, (size_t)cfg_conv_dim(c) * c->conv_kernel, &d->conv, name);
            UF(L->gdn.A_log, c->lin_v_heads, &d->A_log, name);
            UF(L->gdn.dt_bias, c->lin_v_heads, &d->dt_bias, name);
            UF(L->gdn.norm, c->lin_v_dim, &d->norm, name);
        }
        const struct moe_weights *m = &L->moe;
        UQ(&m->router, &d->router, name); UQ(&m->gate, &d->gate, name); UQ(&m->up, &d->up, name);
        UQ(&m->down, &d->down, name); UQ(&m->sh_gate, &d->sh_gate, name); UQ(&m->sh_up, &d->sh_up, name);
        UQ(&m->sh_down, &d->sh_down, name); UQ(&m->sh_expert_gate, &d->sh_eg, name);
        const cuda_qmat *sk[] = {&d->gate, &d->up, &d->down, &d->sh_gate, &d->sh_up, &d->sh_down,
                                 d->kind == LAYER_ATTENTION ? &d->q : &d->qkv, d->kind == LAYER_ATTENTION ? &d->k : &d->z,
                                 d->kind == LAYER_ATTENTION ? &d->v : &d->a, d->kind == LAYER_ATTENTION ? &d->o : &d->b,
                                 d->kind == LAYER_ATTENTION ? &d->o : &d->out};
        d->skinny = true;
        for (size_t i = 0; i < sizeof sk / sizeof sk[0]; i++) d->skinny = d->skinny && cuda_skinny_supported(sk[i]);
        d->tcv = d->skinny && cuda_tcv_moe_supported(&d->gate, &d->up, &d->down, &d->sh_gate, &d->sh_up, &d->sh_down,
                                                     cb->cfg->n_experts_per_tok);
        for (size_t i = 0; i < sizeof sk / sizeof sk[0]; i++) d->tcv = d->tcv && cuda_tcv_supported(sk[i]);
    }
#undef UQ
#undef UF
    return 0;
}

/* ---- the side stream (the shared expert beside the routed experts) ----
 * side_fork: when the forward may use it (not while profiling or tracing, which name ops in
 * one stream; not with ORCHID_NO_SIDE_STREAM=1), makes `side` wait for everything queued on
 * the main stream so far and gives its context; side_record_join marks the end of the side
 * work, side_join makes the main stream wait for it. Only the shared expert and its gate run
 * there: their kernels keep no global partials or counters, so nothing is shared with the
 * launches beside them, and their sums have a fixed order (same bits either way). */
static bool side_fork(struct cuda_backend *cb, const cuda_ctx *c, cuda_ctx *cs) {
    if (!cb->side || cb->prof_on || cb->trace_path) return false;
    *cs = {(cuda_stream_t)cb->side, c->err, c->errlen};
    if (cudaEventRecord(cb->fork_ev, cb->stream) != cudaSuccess || cudaStreamWaitEvent(cb->side, cb->fork_ev, 0) != cudaSuccess) {
        cudaGetLastError();
        return false; /* the work then runs on the main stream */
    }
    return true;
}
static int side_record_join(struct cuda_backend *cb, const cuda_ctx *c) {
    CUDA_TRY(cudaEventRecord(cb->join_ev, cb->side), c->err, c->errlen, "cuda forward: end of the side stream's work");
    return 0;
}
static int side_join(struct cuda_backend *cb, const cuda_ctx *c) {
    CUDA_TRY(cudaStreamWaitEvent(cb->stream, cb->join_ev, 0), c->err, c->errlen, "cuda forward: join the side stream");
    return 0;
}

/* ---- per-op profile ---- */

static void prof_mark(struct cuda_backend *cb, const char *name) {
    if (cb->trace_path) { /* tracing: names only (events would add gaps between the kernels) */
        if (cb->trace_n < PROF_MAX) {
            const unsigned now = cuda_trace_launch_count();
            cb->trace_launches[cb->trace_n] = now - cb->trace_launch0;
            cb->trace_launch0 = now;
            cb->trace_name[cb->trace_n++] = name;
        }
        return;
    }
    if (!cb->prof_on || cb->prof_n >= PROF_MAX) return;
    if (cb->prof_n == 0) {
        /* 30 ms of GPU idling first: the host queues the forward meanwhile, so the deltas
         * are GPU time (outside graphs the host's launch rate would otherwise set them) */
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(cb->stream, &cap);
        char e[64];
        cuda_ctx c = {(cuda_stream_t)cb->stream, e, sizeof e};
        if (cap == cudaStreamCaptureStatusNone) cuda_spin(&c, 30000);
        cudaEventRecord(cb->prof_ev[PROF_MAX], cb->stream);
    }
    cb->prof_name[cb->prof_n] = name;
    cudaEventRecord(cb->prof_ev[cb->prof_n++], cb->stream);
}

/* After a synchronised forward: op i ran between event i-1 (or the start) and event i. */
static void prof_collect(struct cuda_backend *cb) {
    for (int i = 0; i < cb->prof_n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, i ? cb->prof_ev[i - 1] : cb->prof_ev[PROF_MAX], cb->prof_ev[i]);
        int k = 0;
        while (k < cb->prof_nkeys && strcmp(cb->prof_keys[k], cb->prof_name[i])) k++;
        if (k == cb->prof_nkeys) {
            if (k == 64) continue;
            cb->prof_keys[cb->prof_nkeys++] = cb->prof_name[i];
            cb->prof_ms[k] = 0;
            cb->prof_calls[k] = 0;
        }
        cb->prof_ms[k] += ms;
        cb->prof_calls[k]++;
    }
    cb->prof_n = 0;
}

/* Prints and clears the accumulated per-op times (ORCHID_CUDA_PROFILE=1). */
extern "C" void cuda_backend_profile_dump(struct backend *b, FILE *f) {
    struct cuda_backend *cb = (struct cuda_backend *)b;
    double tot = 0;
    for (int k = 0; k < cb->prof_nkeys; k++) tot += cb->prof_ms[k];
    for (int k = 0; k < cb->prof_nkeys; k++)
        fprintf(f, "  %-22s %8ld calls %10.3f ms %5.1f%% %8.2f us/call\n", cb->prof_keys[k], cb->prof_calls[k], cb->prof_ms[k],
                tot > 0 ? 100.0 * cb->prof_ms[k] / tot : 0.0, cb->prof_calls[k] ? 1e3 * cb->prof_ms[k] / cb->prof_calls[k] : 0.0);
    fprintf(f, "  %-22s %25.3f ms\n", "total", tot);
    cb->prof_nkeys = 0;
}

/* Turns per-op timing on or off (creates the events on first use). */
extern "C" int cuda_backend_set_profile(struct backend *b, int on, char *err, size_t errlen) {
    struct cuda_backend *cb = (struct cuda_backend *)b;
    if (on && !cb->prof_ev[0])
        for (int i = 0; i <= PROF_MAX; i++)
            CUDA_TRY(cudaEventCreate(&cb->prof_ev[i]), err, errlen, "cuda profile");
    cb->prof_on = on;
    cb->prof_n = 0;
    return 0;
}

/* The next forward (not captured) records every block's start, pdl_wait and end on the
 * GPU clock (cuda_trace_begin) behind a 30 ms spin, and writes them to path as CSV:
 * "# op <i> <name> <kernels it launched>" lines (the forward's ops in launch order; the
 * count is 0 in non-trace builds, which never get here), then one line per block:
 * grid,block,sm and its start, pre-wait, waited, tail, marks 4..7 and end times (ns, 0 = none). */
extern "C" int cuda_backend_trace_next(struct backend *b, const char *path) {
    struct cuda_backend *cb = (struct cuda_backend *)b;
    cb->trace_path = path;
    cb->trace_n = 0;
    cb->trace_launch0 = cuda_trace_launch_count();
    return 0;
}

static int trace_write(struct cuda_backend *cb, char *err, size_t errlen) {
    cuda_trace_rec *r;
    size_t n;
    const char *path = cb->trace_path;
    cb->trace_path = NULL;
    int rc = cuda_trace_end(&r, &n, err, errlen);
    if (rc) return rc;
    FILE *f = fopen(path, "w");
    if (!f) {
        free(r);
        return errorf(err, errlen, ST_IO, "trace: cannot write %s", path);
    }
    for (int i = 0; i < cb->trace_n; i++) fprintf(f, "# op %d %s %u\n", i, cb->trace_name[i], cb->trace_launches[i]);
    fprintf(f, "grid,block,sm,start,prewait,waited,tail,mark4,mark5,mark6,mark7,end\n");
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%llu,%u,%u", r[i].grid, r[i].block, r[i].sm);
        for (size_t k = 0; k < sizeof r[i].t / sizeof r[i].t[0]; k++) fprintf(f, ",%llu", r[i].t[k]);
        fputc('\n', f);
    }
    free(r);
    return fclose(f) ? errorf(err, errlen, ST_IO, "trace: writing %s failed", path) : 0;
}

#define P(name, call) do { if ((rc = (call))) return rc; prof_mark(cb, name); } while (0)

/* ---- one layer over a batch ---- */

/* One query tile (a decode step of one sequence): the flash launch combines the splits
 * itself (cuda_attention's tail: its blocks meet at a barrier), so the step has no combine
 * launch (H200, context 512: flash + combine + o-projection 20.1 → 16.7 µs a layer).
 * ORCHID_NO_ATTN_TAIL=1: the combine launch (A/B; the same bits either way). */
static bool attn_tail_on(const struct cuda_backend *cb, const dmeta &m) {
    static const bool off = env_flag("ORCHID_NO_ATTN_TAIL");
    return !off && m.T == 1 && 2 * m.n_tiles * cb->kvh <= CNT_N - CNT_ATTN;
}

/* A full-attention layer's attention from the q/k/v projections (cb->proj, kb, vb) to
 * o_proj's bf16 input (cb->ybf): the q/k preparation with the cache write, the split
 * attention and its combine. */
static int attention(struct cuda_backend *cb, const dlayer *d, const dmeta &m, const cuda_ctx *c) {
    const struct model_config *cf = cb->cfg;
    const int T = m.T;
    int rc;
    P("attn_prep", cuda_attn_prep(c, cb->proj, cb->kb, cb->vb, d->q_norm, d->k_norm, m.pos, m.tok_seq, m.seqs, d->ord, T,
                                  cb->nh, cb->kvh, cb->D, cf->rotary_dim, cf->rope_theta, cf->rms_eps));
    P("attention", cuda_attention(c, cb->proj, m.pos, m.seqs, m.tiles, m.n_tiles, m.n_split, d->ord, T, cb->nh, cb->kvh,
                                  cb->D, cb->part, attn_tail_on(cb, m) ? cb->counters + CNT_ATTN : NULL, cb->ybf));
    return 0;
}

/* Small batches (decode) fuse the norms into the launches around them. One token through
 * cuda_tcv.cu: each block of the launch that reads a norm computes it (the first projection
 * the layer's input norm, the router the post-mixer norm: in_norm_src / norm_src_on); the
 * GEMV path and ORCHID_NO_NORM_SRC=1: the residual-adding projection's last block computes
 * the post-mixer norm and the MoE down projection's last block the next layer's input norm.
 * The gate/up pairs take the top-k from the router's logits (topk_pairs_on; otherwise the
 * router's last block runs it). */
static int run_layer_mid(struct cuda_backend *cb, int l, const dmeta &m, const cuda_ctx *c);

/* Layer l takes one token through cuda_tcv.cu's forms (projections and expert pairs). */
static bool tcv_layer(const struct cuda_backend *cb, int l, int T) {
    return T == 1 && cb->L[l].tcv && cuda_tcv_enabled();
}
/* One token's norms computed by the launches that read them (cuda_norm_src: no one-block
 * tail on the step's chain) rather than by their producers' last blocks. ORCHID_NO_NORM_SRC=1
 * keeps the tails (A/B; the same bits either way). */
static bool norm_src_on(const struct cuda_backend *cb) {
    static const bool off = env_flag("ORCHID_NO_NORM_SRC");
    return !off && cb->H % 32 == 0;
}
/* One token: the GDN in-projection triggers its dependents only after its products and the
 * scan after it is launched with PDL (cuda_gdn_scan's pdl). ORCHID_SCAN_NOPDL=1: the early
 * trigger and a plain launch (A/B; the same bits either way). */
static int scan_pdl(void) {
    static const bool off = env_flag("ORCHID_SCAN_NOPDL");
    return !off;
}
/* Layer l's input norm is computed by its first projection: layer l - 1's down pairs (tcv)
 * then leave out their tail. */
static bool in_norm_src(const struct cuda_backend *cb, int l, int T) {
    if (l <= 0 || l >= cb->cfg->n_layers || !norm_src_on(cb) || !tcv_layer(cb, l - 1, T) || !tcv_layer(cb, l, T)) return false;
    return cb->L[l].kind != LAYER_LINEAR || cb->cfg->conv_kernel - 1 <= CUDA_TCV_CONV_MAX;
}

/* One token: the gate/up pair launch takes the top-k from the router's logits (cuda_topk_src),
 * so the router has no one-block tail (H200, contract at 512: 552–556 → 565–569 tok/s).
 * ORCHID_NO_TOPK_PAIRS=1: the router's tail (A/B; the same bits either way). */
static bool topk_pairs_on(const struct cuda_backend *cb, const dlayer *d) {
    static const bool off = env_flag("ORCHID_NO_TOPK_PAIRS");
    return !off && cuda_tcv_topk_supported(&d->gate, cb->K, cb->E);
}

/* 2..64 tokens: layer l's input norm is computed by layer l - 1's MoE combine
 * (cuda_moe_combine_norm) when both take the skinny path. ORCHID_NO_COMBINE_NORM=1: its own
 * launch (A/B; the same bits either way). */
static bool mid_norm_fused(const struct cuda_backend *cb, int l) {
    static const bool off = env_flag("ORCHID_NO_COMBINE_NORM");
    return !off && l > 0 && l < cb->cfg->n_layers && cb->L[l - 1].skinny && cb->L[l].skinny &&
           cuda_moe_combine_norm_ok(cb->H);
}

/* Layer l's input projections as the segments of one launch over xn: a GDN layer's q/k/v,
 * z, a and b; an attention layer's q (with its gate), k and v. Returns their count. */
static int in_proj_segs(const struct cuda_backend *cb, int l, cuda_gemv_seg (&s)[4]) {
    const dlayer *d = &cb->L[l];
    if (d->kind == LAYER_LINEAR) {
        const int Hv = cb->Hv;
        s[0] = {d->qkv, cb->proj, cb->C, 0};
        s[1] = {d->z, cb->zb, cb->vd, 0};
        s[2] = {d->a, cb->gab, 2 * Hv, 0};
        s[3] = {d->b, cb->gab + Hv, 2 * Hv, 0};
        return 4;
    }
    s[0] = {d->q, cb->proj, 2 * cb->qd, 0};
    s[1] = {d->k, cb->kb, cb->kvd, 0};
    s[2] = {d->v, cb->vb, cb->kvd, 0};
    return 3;
}

/* 2..64 tokens: layer l - 1's combine + norm also stages xn's rows for layer l's input
 * projections (struct cuda_xstage: the looped wide form's blocks copy them instead of each
 * summing and reordering the same tokens; the same sums), where that launch will read them
 * (cuda_skinny_multi_reads_stage). NULL where the norm is not fused (layer 0), the launch
 * takes another form (T ≤ 8, few tiles) or the shape does not stage. The producer and the
 * consumer ask the same question. ORCHID_NO_XSTAGE=1: never (A/B). */
static const cuda_xstage *mid_xstage(const struct cuda_backend *cb, int l, int T) {
    static const bool off = env_flag("ORCHID_NO_XSTAGE");
    if (off || !cb->xn_stage.perm || !mid_norm_fused(cb, l)) return NULL;
    cuda_gemv_seg s[4];
    const int n = in_proj_segs(cb, l, s);
    return cuda_skinny_multi_reads_stage(s, n, T) ? &cb->xn_stage : NULL;
}

static int run_layer(struct cuda_backend *cb, int l, const dmeta &m, const cuda_ctx *c) {
    const struct model_config *cf = cb->cfg;
    const dlayer *d = &cb->L[l];
    const int T = m.T, H = cb->H;
    if (T >= 2 && T <= MID_T && d->skinny) return run_layer_mid(cb, l, m, c);
    const bool small = T <= SMALL_T;
    const bool tcv = tcv_layer(cb, l, T); /* one token: cuda_tcv.cu's tensor-core forms */
    const bool tcv_conv = tcv && cf->conv_kernel - 1 <= CUDA_TCV_CONV_MAX;
    int rc;
    if (!small || l == 0) P("in_rmsnorm", cuda_rmsnorm(c, cb->x, d->in_norm, T, H, cf->rms_eps, NULL, cb->xn));
    /* one token through tcv: the input norm by the first projection's blocks (in_ns), the
     * post-mixer norm by the router's (post_ns: its block 0 leaves xn for the expert pairs) */
    const cuda_norm_src in_ns = {cb->x, d->in_norm, cf->rms_eps, NULL};
    const bool in_src = in_norm_src(cb, l, T);
    const cuda_norm_src post_ns = {cb->x, d->post_norm, cf->rms_eps, cb->xn};
    const bool post_src = tcv && norm_src_on(cb);
    const cuda_tail_norm post_tail = {cb->counters, d->post_norm, cf->rms_eps, cb->xn, cb->xn32};
    const cuda_tail_norm *post = post_src ? NULL : &post_tail;
    if (d->kind == LAYER_LINEAR) {
        const int Hv = cb->Hv;
        if (small) {
            cuda_gemv_seg s[4];
            const int n_seg = in_proj_segs(cb, l, s);
            if (tcv_conv) { /* one token: the conv step runs in the projection's epilogue */
                const cuda_tcv_conv cv = {d->conv, m.seqs, d->ord, cf->conv_kernel, cb->C, cb->conv_out, scan_pdl()};
                P("gdn_in+conv", in_src ? cuda_tcv_multi_norm(c, s, n_seg, &in_ns, &cv)
                                        : cuda_tcv_multi_conv(c, s, n_seg, cb->xn, &cv));
            } else {
                P("gdn_in_gemv", cuda_gemv_multi(c, s, n_seg, cb->xn, T, H));
            }
        } else {
            P("gdn_in_gemm", cuda_gemm_dense(c, &d->qkv, 0, cb->xn, T, H, cb->proj, cb->C, 0));
            P("gdn_in_gemm", cuda_gemm_dense(c, &d->z, 0, cb->xn, T, H, cb->zb, cb->vd, 0));
            P("gdn_in_gemm", cuda_gemm_dense(c, &d->a, 0, cb->xn, T, H, cb->gab, 2 * Hv, 0));
            P("gdn_in_gemm", cuda_gemm_dense(c, &d->b, 0, cb->xn, T, H, cb->gab + Hv, 2 * Hv, 0));
        }
        if (!tcv_conv)
            P("conv1d", cuda_conv1d(c, cb->proj, d->conv, m.tok_seq, m.seqs, m.n_seqs, d->ord, T, cb->C, cf->conv_kernel,
                                    cb->conv_out));
        if (!small && cb->gdn_qk)
            P("gdn_scan", cuda_gdn_scan_prefill(c, cb->conv_out, cb->gab, cb->gab + Hv, 2 * Hv, d->A_log, d->dt_bias, m.seqs,
                                                m.n_seqs, m.n_long, d->ord, T, cb->Hk, Hv, cb->Dk, cb->Dv, cb->gdn_qk, cb->gdn_gates, cb->y));
        else
            P("gdn_scan", cuda_gdn_scan(c, cb->conv_out, cb->gab, cb->gab + Hv, 2 * Hv, d->A_log, d->dt_bias, m.seqs, m.n_seqs,
                                        d->ord, cb->Hk, Hv, cb->Dk, cb->Dv, T == m.n_seqs, tcv_conv && scan_pdl(), cb->y));
        if (tcv) { /* one token: the gated norm is staged by the out projection itself */
            const cuda_tcv_gnorm gn = {cb->y, cb->zb, d->norm, Hv, cb->Dv, cf->rms_eps};
            P("gnorm+gdn_out+norm", cuda_tcv_gnorm_acc_norm(c, &d->out, &gn, cb->x, post));
        } else {
            P("gated_norm", cuda_gated_norm(c, cb->y, cb->zb, cb->vd, d->norm, T, Hv, cb->Dv, cf->rms_eps, cb->ybf));
            if (small) P("gdn_out_proj+norm", cuda_gemv_acc_norm(c, &d->out, cb->ybf, T, cb->vd, cb->x, H, &post_tail));
            else P("gdn_out_proj", cuda_qmatmul(c, &d->out, 0, cb->ybf, T, cb->vd, cb->x, H, 1));
        }
    } else {
        const int qw = 2 * cb->qd;
        if (small) {
            cuda_gemv_seg s[4];
            const int n_seg = in_proj_segs(cb, l, s);
            P("attn_qkv_gemv", in_src ? cuda_tcv_multi_norm(c, s, n_seg, &in_ns, NULL)
                               : tcv  ? cuda_tcv_multi(c, s, n_seg, cb->xn)
                                      : cuda_gemv_multi(c, s, n_seg, cb->xn, T, H));
        } else {
            P("attn_qkv_gemm", cuda_gemm_dense(c, &d->q, 0, cb->xn, T, H, cb->proj, qw, 0));
            P("attn_qkv_gemm", cuda_gemm_dense(c, &d->k, 0, cb->xn, T, H, cb->kb, cb->kvd, 0));
            P("attn_qkv_gemm", cuda_gemm_dense(c, &d->v, 0, cb->xn, T, H, cb->vb, cb->kvd, 0));
        }
        if ((rc = attention(cb, d, m, c))) return rc;
        if (small)
            P("attn_o_proj+norm", tcv ? cuda_tcv_acc_norm(c, &d->o, cb->ybf, cb->x, post)
                                      : cuda_gemv_acc_norm(c, &d->o, cb->ybf, T, cb->qd, cb->x, H, &post_tail));
        else P("attn_o_proj", cuda_qmatmul(c, &d->o, 0, cb->ybf, T, cb->qd, cb->x, H, 1));
    }
    /* MoE */
    const int E = cb->E, K = cb->K;
    if (small) {
        const int ld_act = d->gate.rows > d->sh_gate.rows ? d->gate.rows : d->sh_gate.rows; /* the pair kernels' layout */
        const bool last = l + 1 == cf->n_layers;
        const cuda_tail_norm next = {cb->counters + 2, last ? NULL : cb->L[l + 1].in_norm, cf->rms_eps, cb->xn, NULL};
        const bool tk_pairs = tcv && post_src && topk_pairs_on(cb, d); /* the pairs take the top-k */
        const cuda_topk_src ts = {cb->rlog, E, cf->norm_topk_prob, cb->ids, cb->mw};
        if (post_src)
            P(tk_pairs ? "router" : "router+topk",
              cuda_moe_router_topk_norm(c, &d->router, &d->sh_eg, &post_ns, cb->rlog, cb->seg, K, cf->norm_topk_prob, cb->ids,
                                        cb->mw, tk_pairs ? NULL : cb->counters + 4));
        else
            P("router+topk", cuda_moe_router_topk(c, &d->router, &d->sh_eg, cb->xn32, H, T, cb->rlog, E, cb->seg, K,
                                                  cf->norm_topk_prob, cb->ids, cb->mw, cb->counters + 4));
        if (tcv) {
            P("moe_gateup_pairs", cuda_tcv_gateup_pairs(c, &d->gate, &d->up, &d->sh_gate, &d->sh_up, cb->ids, cb->xn, K,
                                                        cb->act, ld_act, tk_pairs ? &ts : NULL));
            P("moe_down_pairs+norm", cuda_tcv_down_pairs(c, &d->down, &d->sh_down, cb->ids, cb->mw, cb->seg, cb->act, ld_act,
                                                         K, cb->x, last || in_norm_src(cb, l + 1, T) ? NULL : &next));
            return 0;
        }
        P("moe_gateup_pairs", cuda_moe_gateup_pairs(c, &d->gate, &d->up, &d->sh_gate, &d->sh_up, cb->ids, cb->xn, H, T, K, cb->act));
        P("moe_down_pairs+norm", cuda_moe_down_pairs(c, &d->down, &d->sh_down, cb->ids, cb->mw, cb->seg, 1, cb->act, T, K,
                                                     cb->x, last ? NULL : &next));
        return 0;
    }
    P("post_rmsnorm", cuda_rmsnorm_split(c, cb->x, d->post_norm, T, H, cf->rms_eps, cb->xn, cb->xlo));
    /* the shared expert and its gate need only xn / xlo: on the side stream, beside the
     * router, the one-block route build and the grouped products (H200, 8 × 512-token pack:
     * the gate's three one-row passes and the route leave most SMs idle) */
    cuda_ctx cs;
    const bool side = side_fork(cb, c, &cs);
    if (side) {
        if ((rc = cuda_gemm_precise(&cs, &d->sh_eg, cb->xn, cb->xlo, T, H, cb->seg, 1, 0))) return rc;
        if ((rc = cuda_gemm_swiglu(&cs, &d->sh_gate, &d->sh_up, cb->xn, T, H, cb->sact, cb->Is))) return rc;
        if ((rc = cuda_gemm_dense(&cs, &d->sh_down, 0, cb->sact, T, cb->Is, cb->sd, H, 0))) return rc;
        if ((rc = side_record_join(cb, c))) return rc;
    }
    P("router", cuda_gemm_precise(c, &d->router, cb->xn, cb->xlo, T, H, cb->rlog, E, 0));
    if (!side) P("router", cuda_gemm_precise(c, &d->sh_eg, cb->xn, cb->xlo, T, H, cb->seg, 1, 0));
    P("moe_topk", cuda_moe_topk(c, cb->rlog, E, T, E, K, cf->norm_topk_prob, cb->ids, cb->mw));
    P("moe_route_build", cuda_moe_route_build(c, cb->ids, T, E, K, GEMM_TILE_ROWS, &cb->route));
    P("moe_grouped_swiglu", cuda_moe_grouped_swiglu(c, &d->gate, &d->up, cb->xn, H, &cb->route, cb->act));
    P("moe_grouped_down", cuda_moe_grouped_down(c, &d->down, cb->act, &cb->route, cb->ed));
    if (!side) {
        P("shared_swiglu", cuda_gemm_swiglu(c, &d->sh_gate, &d->sh_up, cb->xn, T, H, cb->sact, cb->Is));
        P("shared_down", cuda_gemm_dense(c, &d->sh_down, 0, cb->sact, T, cb->Is, cb->sd, H, 0));
    } else if ((rc = side_join(cb, c))) {
        return rc;
    }
    P("moe_combine", cuda_moe_combine(c, cb->ed, cb->route.slot_of_pair, cb->mw, cb->sd, cb->seg, 1, T, K, H, cb->x));
    return 0;
}

/* 2..MID_T tokens (batched decode of many sequences): every weight is read once for all
 * tokens by the tensor-core kernels of cuda_skinny.cu; the MoE goes through the sorted
 * route (each touched expert read once for all its tokens) and the fp32 router. The
 * post-mixer norm is a launch of its own; the input norm is computed by the previous
 * layer's MoE combine (mid_norm_fused), the first layer's by its own launch. */
static int run_layer_mid(struct cuda_backend *cb, int l, const dmeta &m, const cuda_ctx *c) {
    const struct model_config *cf = cb->cfg;
    const dlayer *d = &cb->L[l];
    const int T = m.T, H = cb->H, E = cb->E, K = cb->K;
    int rc;
    if (!mid_norm_fused(cb, l)) P("in_rmsnorm", cuda_rmsnorm(c, cb->x, d->in_norm, T, H, cf->rms_eps, NULL, cb->xn));
    if (d->kind == LAYER_LINEAR) {
        const int Hv = cb->Hv;
        cuda_gemv_seg s[4];
        const int n_seg = in_proj_segs(cb, l, s);
        P("gdn_in_skinny", cuda_skinny_multi(c, s, n_seg, cb->xn, T, H, mid_xstage(cb, l, T)));
        P("conv1d", cuda_conv1d(c, cb->proj, d->conv, m.tok_seq, m.seqs, m.n_seqs, d->ord, T, cb->C, cf->conv_kernel, cb->conv_out));
        P("gdn_scan", cuda_gdn_scan(c, cb->conv_out, cb->gab, cb->gab + Hv, 2 * Hv, d->A_log, d->dt_bias, m.seqs, m.n_seqs, d->ord,
                                    cb->Hk, Hv, cb->Dk, cb->Dv, T == m.n_seqs, 0, cb->y));
        P("gated_norm", cuda_gated_norm(c, cb->y, cb->zb, cb->vd, d->norm, T, Hv, cb->Dv, cf->rms_eps, cb->ybf));
        P("gdn_out_skinny", cuda_skinny_dense(c, &d->out, 0, cb->ybf, T, cb->vd, cb->x, H, 1));
    } else {
        cuda_gemv_seg s[4];
        const int n_seg = in_proj_segs(cb, l, s);
        P("attn_qkv_skinny", cuda_skinny_multi(c, s, n_seg, cb->xn, T, H, mid_xstage(cb, l, T)));
        if ((rc = attention(cb, d, m, c))) return rc;
        P("attn_o_skinny", cuda_skinny_dense(c, &d->o, 0, cb->ybf, T, cb->qd, cb->x, H, 1));
    }
    P("post_rmsnorm", cuda_rmsnorm2(c, cb->x, d->post_norm, T, H, cf->rms_eps, NULL, cb->xn, cb->xn32));
    /* the shared expert needs only xn: on the side stream, beside the router's chain of small
     * launches (router, route) that leave most SMs idle; its kernels' results do not depend
     * on what runs beside them (their reductions have a fixed order) */
    cuda_ctx cs;
    const bool side = side_fork(cb, c, &cs);
    if (side) {
        if ((rc = cuda_skinny_swiglu(&cs, &d->sh_gate, &d->sh_up, cb->xn, T, H, cb->sact, cb->Is))) return rc;
        if ((rc = cuda_skinny_dense(&cs, &d->sh_down, 0, cb->sact, T, cb->Is, cb->sd, H, 0))) return rc;
        if ((rc = side_record_join(cb, c))) return rc;
    }
    P("router+topk", cuda_moe_router_topk(c, &d->router, &d->sh_eg, cb->xn32, H, T, cb->rlog, E, cb->seg, K,
                                          cf->norm_topk_prob, cb->ids, cb->mw, cb->counters + 4));
    P("moe_route_build", cuda_moe_route_build(c, cb->ids, T, E, K, 64, &cb->route));
    P("moe_skinny_swiglu", cuda_skinny_grouped_swiglu(c, &d->gate, &d->up, cb->xn, H, &cb->route, cb->act));
    P("moe_skinny_down", cuda_skinny_grouped_down(c, &d->down, cb->act, &cb->route, cb->ed));
    if (!side) {
        P("shared_skinny_swiglu", cuda_skinny_swiglu(c, &d->sh_gate, &d->sh_up, cb->xn, T, H, cb->sact, cb->Is));
        P("shared_skinny_down", cuda_skinny_dense(c, &d->sh_down, 0, cb->sact, T, cb->Is, cb->sd, H, 0));
    } else if ((rc = side_join(cb, c))) {
        return rc;
    }
    if (mid_norm_fused(cb, l + 1))
        P("moe_combine+norm", cuda_moe_combine_norm(c, cb->ed, cb->route.slot_of_pair, cb->mw, cb->sd, cb->seg, 1, T, K, H, cb->x,
                                                     cb->L[l + 1].in_norm, cf->rms_eps, cb->xn, mid_xstage(cb, l + 1, T)));
    else
        P("moe_combine", cuda_moe_combine(c, cb->ed, cb->route.slot_of_pair, cb->mw, cb->sd, cb->seg, 1, T, K, H, cb->x));
    return 0;
}

static int run_layers(struct cuda_backend *cb, const dmeta &m, const cuda_ctx *c) {
    int rc;
    prof_mark(cb, "metadata");
    if ((rc = cuda_embed(c, &cb->embed, m.tok, m.T, cb->x))) return rc;
    prof_mark(cb, "embed");
    for (int l = 0; l < cb->cfg->n_layers; l++)
        if ((rc = run_layer(cb, l, m, c))) {
            error_prefix(c->err, c->errlen, "layer %d", l);
            return rc;
        }
    return 0;
}

/* Key splits of a decode-shaped attention launch for its longest kv_len: one split a 32
 * keys up to a cap that gives one query tile's KV heads about two blocks per SM (batch-1
 * decode at context 512: 16 splits of 32 keys). The cap does not depend on the batch: a
 * tile uses min(n_split, ⌈its kv_len / 32⌉) splits (CUDA_ATTN_SPLIT_KEYS), the same alone
 * and batched. */
static int split_for(const struct cuda_backend *cb, int kv_len) {
    const int by_len = (kv_len + CUDA_ATTN_SPLIT_KEYS - 1) / CUDA_ATTN_SPLIT_KEYS, cap = (2 * cb->n_sm + cb->kvh - 1) / cb->kvh;
    const int s = by_len < cap ? by_len : cap;
    return s < 1 ? 1 : s > MAX_SPLIT ? MAX_SPLIT : s;
}

/* ---- forward ---- */

static size_t al16(size_t x) { return (x + 15) & ~(size_t)15; }

/* Scored output rows of a forward (fwd_batch.out_score): the requests on the device
 * (metadata) and, from the host's copy, the most alternatives a pass of rows asks. */
struct fwd_scores {
    const struct row_score_req *d_req; /* NULL: none */
    const struct row_score_req *h_req;
};
static int pass_max_top(const fwd_scores &sc, int i0, int n) {
    int t = 0;
    for (int i = i0; i < i0 + n; i++)
        if (sc.h_req[i].token >= 0 && sc.h_req[i].n_top > t) t = sc.h_req[i].n_top;
    return t;
}

/* One lm_head pass of a forward: rows [i0, i0 + n) of the outputs (d_or: their token rows)
 * normalised, their logits, with scores the scored rows' (before the sampler, which writes
 * over a sampled row's logits), and with argmax their ids, with smp (the sampled rows'
 * requests) their drawn tokens over them. */
static int fwd_outputs(struct cuda_backend *cb, const cuda_ctx *c, int i0, int n, const int32_t *d_or, bool argmax,
                       const struct row_sampling *smp, const fwd_scores *sc = NULL) {
    int rc;
    if ((rc = cuda_rmsnorm(c, cb->x, cb->final_norm, n, cb->H, cb->cfg->rms_eps, d_or + i0, cb->xo))) return rc;
    if ((rc = cuda_qmatmul(c, &cb->lm_head, 0, cb->xo, n, cb->H, cb->logits, cb->V, 0))) return rc;
    prof_mark(cb, "lm_head");
    if (sc && sc->d_req) {
        if ((rc = cuda_row_scores(c, cb->logits, n, cb->V, sc->d_req + i0, pass_max_top(*sc, i0, n), cb->d_scores + i0))) return rc;
        prof_mark(cb, "row_scores");
    }
    /* argmax on the device (sampler_argmax's rule): only ids cross PCIe for rows whose
     * logits are not wanted (out_logits[i] == NULL) */
    if (argmax && (rc = cuda_argmax(c, cb->logits, n, cb->V, cb->amax_ids + i0, cb->amax_scratch))) return rc;
    /* rows that sample: the device sampler's token over the argmax (greedy rows keep it) */
    if (smp && (rc = cuda_sample(c, cb->logits, n, cb->V, smp + i0, cb->amax_ids + i0))) return rc;
    if (smp) prof_mark(cb, "sample");
    return 0;
}

/* ---- one-token forwards as a CUDA graph (ORCHID_NO_FORWARD_GRAPH=1: launched one by one)
 * The serving path launches a forward's ~265 kernels one by one: a batch-1 step took 1.94
 * ms that way against 1.84 ms replayed as the session decode graph (H200, session 14:
 * bench_batch_decode T = 1 argmax against the contract), ~5 % of a single stream's rate
 * (session 16, serve_load 1 stream 512 × 256 greedy: 505 → 540 tok/s with the graph). A
 * T = 1 forward whose outputs fit one lm_head pass is captured once per (n_split, n_out,
 * argmax, sampling) and replayed: all it reads that changes from step to step — token,
 * position, the session's buffers, the output row, a sampling request — is the metadata
 * uploaded before the launch, at the same addresses for that key; the logits downloads
 * (the step's host pointers) stay outside. n_split is rounded up to a multiple of
 * FG_SPLIT_ROUND within the cap: the same bits (a tile uses min(n_split, ⌈kv_len / 32⌉)
 * splits, and the rounded count is still ≥ ⌈kv_len / 32⌉ or the cap), so a growing context
 * is recaptured every 128 tokens rather than every 32. */
#define FG_SPLIT_ROUND 4
static int fg_forced = -1; /* tests: 1 / 0 force it on / off; -1: the environment */
extern "C" void cuda_backend_force_forward_graph(int on) { fg_forced = on < 0 ? -1 : on ? 1 : 0; }
static bool fwd_graph_on(void) {
    static const bool off = env_flag("ORCHID_NO_FORWARD_GRAPH");
    return fg_forced >= 0 ? fg_forced > 0 : !off;
}
/* n_split (split_for's, so ≤ the cap) rounded up to FG_SPLIT_ROUND, at most the cap */
static int fg_split(const struct cuda_backend *cb, int n_split) {
    const int cap = split_for(cb, 1 << 30), r = (n_split + FG_SPLIT_ROUND - 1) / FG_SPLIT_ROUND * FG_SPLIT_ROUND;
    return r < cap ? r : cap;
}

/* The forward of m (T = 1) with its n_out ≤ 1 outputs from the graph, captured first when
 * the key differs from the cached one's. A failed capture leaves no graph (and the error). */
static int fwd_graph(struct cuda_backend *cb, const dmeta &m, int n_out, bool argmax, const struct row_sampling *smp,
                     const int32_t *d_or, const cuda_ctx *c) {
    const int key[4] = {m.n_split, n_out, argmax, smp != NULL};
    if (!cb->fg || memcmp(key, cb->fg_key, sizeof key)) {
        if (cb->fg) cudaGraphExecDestroy(cb->fg);
        cb->fg = NULL;
        CUDA_TRY(cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal), c->err, c->errlen, "forward graph");
        int rc = run_layers(cb, m, c);
        if (!rc && n_out) rc = fwd_outputs(cb, c, 0, n_out, d_or, argmax, smp);
        cudaGraph_t g = NULL;
        cudaError_t e = cudaStreamEndCapture(cb->stream, &g);
        if (!rc && e == cudaSuccess) e = cudaGraphInstantiate(&cb->fg, g, 0);
        if (g) cudaGraphDestroy(g);
        if (rc || e != cudaSuccess) {
            cudaGetLastError();
            cb->fg = NULL;
            return rc ? rc : errorf(c->err, c->errlen, ST_DEVICE, "forward graph: capture failed: %s", cudaGetErrorString(e));
        }
        memcpy(cb->fg_key, key, sizeof key);
    }
    CUDA_TRY(cudaGraphLaunch(cb->fg, cb->stream), c->err, c->errlen, "forward graph: launch");
    return 0;
}

/* The logits of output rows [i0, i0 + n) that the batch wants, from the last lm_head pass. */
static int fwd_download(struct cuda_backend *cb, const struct fwd_batch *b, int i0, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        if (b->out_logits[i0 + i])
            CUDA_TRY(cudaMemcpyAsync(b->out_logits[i0 + i], cb->logits + (size_t)i * cb->V, (size_t)cb->V * 4,
                                     cudaMemcpyDeviceToHost, cb->stream), err, errlen, "cuda forward: logits download");
    return 0;
}

/* A forward's end: the last pass's logits and every row's ids downloaded, the stream
 * drained, then the profile or the trace collected. */
static int fwd_finish(struct cuda_backend *cb, const struct fwd_batch *b, char *err, size_t errlen) {
    int rc;
    if (b->n_out) {
        const int i0 = (b->n_out - 1) / LOGIT_ROWS * LOGIT_ROWS;
        if ((rc = fwd_download(cb, b, i0, b->n_out - i0, err, errlen))) return rc;
    }
    if (b->out_argmax && b->n_out)
        CUDA_TRY(cudaMemcpyAsync(cb->h_amax_ids, cb->amax_ids, (size_t)b->n_out * 4, cudaMemcpyDeviceToHost, cb->stream), err,
                 errlen, "cuda forward: argmax download");
    if (b->out_score && b->n_out)
        CUDA_TRY(cudaMemcpyAsync(cb->h_scores, cb->d_scores, (size_t)b->n_out * sizeof(struct sample_result), cudaMemcpyDeviceToHost,
                                 cb->stream), err, errlen, "cuda forward: row scores download");
    CUDA_TRY(cudaStreamSynchronize(cb->stream), err, errlen, "cuda forward");
    if (b->out_argmax && b->n_out) memcpy(b->out_argmax, cb->h_amax_ids, (size_t)b->n_out * 4);
    if (b->out_score && b->n_out) memcpy(b->out_scores, cb->h_scores, (size_t)b->n_out * sizeof *b->out_scores);
    if (cb->prof_on) prof_collect(cb);
    if (cb->trace_path) return trace_write(cb, err, errlen);
    return 0;
}

static int cuda_forward(struct backend *base, const struct fwd_batch *b, char *err, size_t errlen) {
    struct cuda_backend *cb = (struct cuda_backend *)base;
    const int T = b->n_tokens;
    if (T <= 0 || T > CUDA_MAX_BATCH)
        return errorf(err, errlen, ST_INTERNAL, "cuda forward: batch of %d tokens (1..%d)", T, CUDA_MAX_BATCH);
    for (int i = 0; b->out_sampling && i < b->n_out; i++) /* cuda_sample overwrites a sampled row's logits */
        if (b->out_sampling[i].temperature > 0.0f && (b->out_logits[i] || !b->out_argmax))
            return errorf(err, errlen, ST_INTERNAL, "cuda forward: sampled output row %d needs an id slot and no logits", i);
    int max_len = 0;
    for (int t = 0; t < T; t++) {
        const struct backend_session *s = b->sessions[b->seq[t]];
        if (b->pos[t] < 0 || b->pos[t] >= s->max_seq)
            return errorf(err, errlen, ST_RANGE, "cuda forward: position %d outside the session (capacity %d)", b->pos[t], s->max_seq);
        if (b->pos[t] + 1 > max_len) max_len = b->pos[t] + 1;
    }
    /* host metadata blob: tok | pos | tok_seq | out_rows | seqs | tiles */
    size_t o_tok = 0, o_pos = al16(T * 4), o_ts = o_pos + al16(T * 4), o_or = o_ts + al16(T * 4);
    size_t o_seq = o_or + al16((size_t)(b->n_out > 0 ? b->n_out : 1) * 4);
    size_t o_tile = o_seq + al16((size_t)b->n_seqs * sizeof(cuda_seq));
    char *h = cb->h_meta;
    const bool sampling = b->out_sampling && b->out_argmax && b->n_out > 0;
    const bool scoring = b->out_score && b->n_out > 0;
    memcpy(h + o_tok, b->tokens, T * 4);
    memcpy(h + o_pos, b->pos, T * 4);
    memcpy(h + o_ts, b->seq, T * 4);
    if (b->n_out) memcpy(h + o_or, b->out_rows, (size_t)b->n_out * 4);
    cuda_seq *hs = (cuda_seq *)(h + o_seq);
    for (int i = 0; i < b->n_seqs; i++) {
        const struct backend_session *s = b->sessions[i];
        hs[i].kv = s->kv;
        hs[i].conv = s->conv;
        hs[i].state = s->state;
        hs[i].max_seq = s->max_seq;
        hs[i].t0 = T;
        hs[i].t1 = 0;
    }
    for (int t = 0; t < T; t++) {
        cuda_seq *s = &hs[b->seq[t]];
        if (t < s->t0) s->t0 = t;
        if (t + 1 > s->t1) s->t1 = t + 1;
    }
    /* the attention's key splits (one for a prompt chunk), and its query tiles: consecutive
     * tokens of one sequence, as many as the kernel that will take them holds */
    const int n_split = T <= MID_T ? split_for(cb, max_len) : 1;
    const int qt = cuda_attn_tile_tokens(T, n_split, cb->nh, cb->kvh, cb->D);
    cuda_attn_tile *ht = (cuda_attn_tile *)(h + o_tile);
    int n_tiles = 0;
    for (int t = 0; t < T;) {
        int n = 1;
        while (t + n < T && n < qt && b->seq[t + n] == b->seq[t]) n++;
        ht[n_tiles].seq = b->seq[t];
        ht[n_tiles].t0 = t;
        ht[n_tiles].n = n;
        ht[n_tiles].pad = 0;
        n_tiles++;
        t += n;
    }
    const size_t o_smp = al16(o_tile + (size_t)n_tiles * sizeof(cuda_attn_tile)); /* sampled rows' requests */
    const size_t o_sc = al16(o_smp + (sampling ? (size_t)b->n_out * sizeof(struct row_sampling) : 0)); /* scored rows' */
    const size_t bytes = o_sc + (scoring ? (size_t)b->n_out * sizeof(struct row_score_req) : 0);
    if (bytes > cb->meta_cap) return errorf(err, errlen, ST_INTERNAL, "cuda forward: metadata of %zu bytes", bytes);
    if (sampling) memcpy(h + o_smp, b->out_sampling, (size_t)b->n_out * sizeof(struct row_sampling));
    if (scoring) memcpy(h + o_sc, b->out_score, (size_t)b->n_out * sizeof(struct row_score_req));
    cuda_ctx c = {(cuda_stream_t)cb->stream, err, errlen};
    CUDA_TRY(cudaMemcpyAsync(cb->d_meta, h, bytes, cudaMemcpyHostToDevice, cb->stream), err, errlen, "cuda forward: metadata upload");
    dmeta m;
    m.T = T;
    m.n_seqs = b->n_seqs;
    m.n_long = 0;
    for (int i = 0; i < b->n_seqs; i++) m.n_long += hs[i].t1 - hs[i].t0 >= CUDA_GDN_CHUNK_MIN;
    m.n_tiles = n_tiles;
    m.n_split = n_split;
    m.tok = (const int32_t *)(cb->d_meta + o_tok);
    m.pos = (const int32_t *)(cb->d_meta + o_pos);
    m.tok_seq = (const int32_t *)(cb->d_meta + o_ts);
    m.seqs = (const cuda_seq *)(cb->d_meta + o_seq);
    m.tiles = (const cuda_attn_tile *)(cb->d_meta + o_tile);
    const int32_t *d_or = (const int32_t *)(cb->d_meta + o_or);
    for (int i = 0; i < b->n_out && !b->out_argmax; i++)
        if (!b->out_logits[i] && !fwd_row_scored(b, i))
            return errorf(err, errlen, ST_INTERNAL, "cuda forward: output row %d wants nothing", i);
    const struct row_sampling *smp = sampling ? (const struct row_sampling *)(cb->d_meta + o_smp) : NULL;
    const fwd_scores sc = {scoring ? (const struct row_score_req *)(cb->d_meta + o_sc) : NULL, b->out_score};
    const bool graphed = fwd_graph_on() && T == 1 && b->n_out <= 1 && !scoring && !cb->prof_on && !cb->trace_path;
    if (graphed) {
        m.n_split = fg_split(cb, m.n_split);
        int rc = fwd_graph(cb, m, b->n_out, b->out_argmax != NULL, smp, d_or, &c);
        if (rc) return rc;
        return fwd_finish(cb, b, err, errlen);
    }
    if (cb->trace_path) {
        int trc = cuda_trace_begin(T > 16 ? 65536 : 16384, err, errlen); /* records a SM: a 64-token forward has ~2.5 M blocks */
        if (!trc) trc = cuda_spin(&c, 30000); /* the host queues the forward meanwhile */
        cb->trace_launch0 = cuda_trace_launch_count(); /* the spin is no op's launch */
        if (trc) {
            cb->trace_path = NULL;
            return trc;
        }
    }
    int rc = run_layers(cb, m, &c);
    if (rc) {
        if (cb->trace_path) { /* drop the trace; the error is the forward's */
            cuda_trace_rec *r;
            size_t n;
            char e2[64];
            if (!cuda_trace_end(&r, &n, e2, sizeof e2)) free(r);
            cb->trace_path = NULL;
        }
        return rc;
    }
    for (int i0 = 0; i0 < b->n_out; i0 += LOGIT_ROWS) {
        const int n = b->n_out - i0 < LOGIT_ROWS ? b->n_out - i0 : LOGIT_ROWS;
        if ((rc = fwd_outputs(cb, &c, i0, n, d_or, b->out_argmax != NULL, smp, &sc))) return rc;
        if (i0 + n < b->n_out && (rc = fwd_download(cb, b, i0, n, err, errlen))) return rc; /* the next pass reuses logits */
    }
    return fwd_finish(cb, b, err, errlen);
}

/* ---- greedy decode loop ---- */

static int capture_decode(struct cuda_backend *cb, struct backend_session *s, char *err, size_t errlen) {
    cuda_ctx c = {(cuda_stream_t)cb->stream, err, errlen};
    dmeta m;
    m.T = 1;
    m.n_seqs = 1;
    m.n_long = 0;
    m.n_tiles = 1;
    m.n_split = s->n_split;
    m.tok = s->d_dec;
    m.pos = s->d_dec + 1;
    m.tok_seq = s->d_dec + 3;
    m.seqs = s->d_dec_seq;
    m.tiles = s->d_dec_tile;
    /* with profiling on, the per-op event records become nodes of the graph */
    cb->prof_n = 0;
    CUDA_TRY(cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal), err, errlen, "decode graph");
    int rc = run_layers(cb, m, &c);
    if (!rc) rc = cuda_rmsnorm(&c, cb->x, cb->final_norm, 1, cb->H, cb->cfg->rms_eps, NULL, cb->xo);
    if (!rc) rc = cuda_qmatmul(&c, &cb->lm_head, 0, cb->xo, 1, cb->H, cb->logits, cb->V, 0);
    if (!rc) rc = cuda_argmax(&c, cb->logits, 1, cb->V, s->d_dec, cb->amax_scratch);
    if (!rc) rc = cuda_decode_advance(&c, s->d_dec + 1, s->d_dec + 2, s->d_dec, s->d_out_ids);
    prof_mark(cb, "lm_head+argmax");
    s->graph_prof_n = cb->prof_n;
    cb->prof_n = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(cb->stream, &g);
    if (rc) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        return rc;
    }
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "decode graph: capture failed: %s", cudaGetErrorString(e));
    e = cudaGraphInstantiate(&s->graph, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        s->graph = NULL;
        return errorf(err, errlen, ST_DEVICE, "decode graph: instantiate failed: %s", cudaGetErrorString(e));
    }
    return 0;
}

static int cuda_decode_greedy(struct backend *base, struct backend_session *s, int pos, int32_t first, int n_steps,
                              int32_t *out_ids, double *step_end, char *err, size_t errlen) {
    struct cuda_backend *cb = (struct cuda_backend *)base;
    if (n_steps <= 0) return 0;
    if (pos < 0 || pos + n_steps > s->max_seq)
        return errorf(err, errlen, ST_RANGE, "cuda decode: positions %d..%d outside the session (capacity %d)", pos,
                      pos + n_steps - 1, s->max_seq);
    const double t0 = now_s();
    int32_t *h = s->h_ids; /* pinned; first 4 words stage the loop state */
    h[0] = first;
    h[1] = pos;
    h[2] = 0;
    h[3] = 0;
    CUDA_TRY(cudaMemcpyAsync(s->d_dec, h, 16, cudaMemcpyHostToDevice, cb->stream), err, errlen, "cuda decode: state upload");
    CUDA_TRY(cudaStreamSynchronize(cb->stream), err, errlen, "cuda decode: state upload");
    if (s->graph && (cb->prof_on || s->graph_prof_n)) { /* (re)capture with or without the profile marks */
        cudaGraphExecDestroy(s->graph);
        s->graph = NULL;
    }
    if (!s->graph) {
        int rc = capture_decode(cb, s, err, errlen);
        if (rc) return rc;
    }
    for (int i = 0; i < n_steps; i++) {
        CUDA_TRY(cudaGraphLaunch(s->graph, cb->stream), err, errlen, "cuda decode: graph launch");
        CUDA_TRY(cudaMemcpyAsync(h + 4 + i, s->d_out_ids + i, 4, cudaMemcpyDeviceToHost, cb->stream), err, errlen,
                 "cuda decode: id download");
        CUDA_TRY(cudaEventRecord(cb->ev[i & 1], cb->stream), err, errlen, "cuda decode: event");
        if (i > 0) { /* two steps in flight: step i is queued before waiting for step i-1 */
            CUDA_TRY(cudaEventSynchronize(cb->ev[(i - 1) & 1]), err, errlen, "cuda decode: step");
            if (step_end) step_end[i - 1] = now_s() - t0;
        }
    }
    CUDA_TRY(cudaEventSynchronize(cb->ev[(n_steps - 1) & 1]), err, errlen, "cuda decode: step");
    if (step_end) step_end[n_steps - 1] = now_s() - t0;
    memcpy(out_ids, h + 4, (size_t)n_steps * 4);
    if (cb->prof_on && s->graph_prof_n) { /* the last replayed step's per-op times */
        cb->prof_n = s->graph_prof_n;
        prof_collect(cb);
    }
    return 0;
}

/* ---- sessions ---- */

static void cuda_session_destroy(struct backend *base, struct backend_session *s) {
    (void)base;
    if (!s) return;
    if (s->graph) cudaGraphExecDestroy(s->graph);
    cudaFree(s->kv);
    cudaFree(s->conv);
    cudaFree(s->state);
    cudaFree(s->d_dec);
    cudaFree(s->d_out_ids);
    if (s->h_ids) cudaFreeHost(s->h_ids);
    free(s);
}

static int cuda_session_create(struct backend *base, int max_seq, struct backend_session **out, char *err, size_t errlen) {
    struct cuda_backend *cb = (struct cuda_backend *)base;
    const struct model_config *c = cb->cfg;
    *out = NULL;
    struct backend_session *s = (struct backend_session *)calloc(1, sizeof *s);
    if (!s) return errorf(err, errlen, ST_NOMEM, "out of memory for a session");
    s->cb = cb;
    s->max_seq = max_seq;
    const size_t kv = (size_t)cb->n_attn * 2 * cb->kvh * (size_t)max_seq * cb->D * 2;
    const size_t conv = (size_t)cb->n_lin * (c->conv_kernel - 1) * cb->C * 4;
    const size_t st = (size_t)cb->n_lin * cb->Hv * cb->Dv * cb->Dk * 4;
    int rc;
    if ((rc = cuda_malloc((void **)&s->kv, kv, "the KV cache", err, errlen)) ||
        (rc = cuda_malloc((void **)&s->conv, conv, "the conv state", err, errlen)) ||
        (rc = cuda_malloc((void **)&s->state, st, "the GDN state", err, errlen)) ||
        (rc = cuda_malloc((void **)&s->d_dec, 64 + sizeof(cuda_seq) + sizeof(cuda_attn_tile), "decode state", err, errlen)) ||
        (rc = cuda_malloc((void **)&s->d_out_ids, (size_t)max_seq * 4, "decode ids", err, errlen))) {
        cuda_session_destroy(base, s);
        return rc;
    }
    if (cudaMallocHost((void **)&s->h_ids, ((size_t)max_seq + 4) * 4) != cudaSuccess) {
        cudaGetLastError();
        s->h_ids = NULL;
        cuda_session_destroy(base, s);
        return errorf(err, errlen, ST_NOMEM, "cudaMallocHost of decode ids failed");
    }
    s->d_dec_seq = (cuda_seq *)((char *)s->d_dec + 16);
    s->d_dec_tile = (cuda_attn_tile *)((char *)s->d_dec + 16 + sizeof(cuda_seq));
    cuda_seq hs = {s->kv, s->conv, s->state, max_seq, 0, 1, 0};
    cuda_attn_tile ht = {0, 0, 1, 0};
    int32_t z[4] = {0, 0, 0, 0};
    CUDA_TRY(cudaMemcpy(s->d_dec, z, 16, cudaMemcpyHostToDevice), err, errlen, "session create");
    CUDA_TRY(cudaMemcpy(s->d_dec_seq, &hs, sizeof hs, cudaMemcpyHostToDevice), err, errlen, "session create");
    CUDA_TRY(cudaMemcpy(s->d_dec_tile, &ht, sizeof ht, cudaMemcpyHostToDevice), err, errlen, "session create");
    CUDA_TRY(cudaMemset(s->kv, 0, kv), err, errlen, "session create");
    CUDA_TRY(cudaMemset(s->conv, 0, conv), err, errlen, "session create");
    CUDA_TRY(cudaMemset(s->state, 0, st), err, errlen, "session create");
    s->n_split = split_for(cb, max_seq); /* the graph's: enough for the longest context */
    *out = s;
    return 0;
}

static void cuda_session_reset(struct backend *base, struct backend_session *s) {
    struct cuda_backend *cb = (struct cuda_backend *)base;
    cudaStreamSynchronize(cb->stream);
    cudaMemset(s->conv, 0, (size_t)cb->n_lin * (cb->cfg->conv_kernel - 1) * cb->C * 4);
    cudaMemset(s->state, 0, (size_t)cb->n_lin * cb->Hv * cb->Dv * cb->Dk * 4);
    cudaDeviceSynchronize();
}

/* ---- state transfer (prefix checkpoints) ----
 * Host formats, read back only by these functions:
 *   state: conv [n_lin][conv_kernel-1][C] fp32, then GDN [n_lin][Hv][Dv][Dk] fp32 —
 *          the session's two device buffers byte for byte.
 *   KV rows [pos0, pos0+n): [n_attn][2 (K,V)][kv_heads][n][head_dim] bf16 — the session
 *          layout (cuda_ops.h) with max_seq cut to n: one strided 2-D copy.
 * Copies go on the backend stream (non-blocking: the legacy default stream does not
 * order with it) and are synchronised before returning. */

static size_t conv_bytes(const struct cuda_backend *cb) {
    return (size_t)cb->n_lin * (cb->cfg->conv_kernel - 1) * cb->C * 4;
}
static size_t gdn_bytes(const struct cuda_backend *cb) { return (size_t)cb->n_lin * cb->Hv * cb->Dv * cb->Dk * 4; }

static size_t cuda_state_bytes(struct backend *base) {
    const struct cuda_backend *cb = (const struct cuda_backend *)base;
    return conv_bytes(cb) + gdn_bytes(cb);
}

/* ---- checkpoint saves beside the decode stream (cuda_save.cu; ORCHID_NO_ASYNC_SAVE=1: each
 * a synchronous copy): a save snapshots on the stream and copies to host on another; every
 * load and every free of pinned memory first waits for the queued copies. The staging ring
 * is made at the first save (the sessions exist by then): a sixteenth of the free device
 * memory, at most 4 GB, at least two states (73 MB each for the real model). ---- */
static int async_forced = -1; /* tests: 1 / 0; -1: the environment */
extern "C" void cuda_backend_force_async_save(int on) { async_forced = on < 0 ? -1 : on ? 1 : 0; }
static bool async_save_on(void) {
    static const bool off = env_flag("ORCHID_NO_ASYNC_SAVE");
    return async_forced >= 0 ? async_forced > 0 : !off;
}
static struct cuda_saver *saver_get(struct cuda_backend *cb) {
    if (!async_save_on() || cb->saver_failed) return NULL;
    if (!cb->saver) {
        size_t free_b = 0, total = 0;
        if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) cudaGetLastError();
        const size_t two = 2 * (conv_bytes(cb) + gdn_bytes(cb)) + (1u << 20);
        size_t want = free_b / 16 < ((size_t)4 << 30) ? free_b / 16 : (size_t)4 << 30;
        if (want < two) want = two;
        char e[256];
        if (want > free_b / 2 || cuda_saver_create(&cb->saver, want, e, sizeof e)) {
            cb->saver_failed = true;
            fprintf(stderr, "orchid: cuda: checkpoint saves stay synchronous (no %zu MB of staging)\n", want >> 20);
            return NULL;
        }
    }
    return cb->saver;
}
/* A save of height rows of width bytes (pitch apart) at dev to host: queued beside the
 * stream (0) or not (1: the caller copies synchronously), or an error (< 0) — as
 * cuda_saver_copy. */
static int save_async(struct cuda_backend *cb, void *host, const void *dev, size_t width, size_t height, size_t pitch,
                      char *err, size_t errlen) {
    struct cuda_saver *sv = saver_get(cb);
    return sv ? cuda_saver_copy(sv, (cuda_stream_t)cb->stream, host, dev, width, height, pitch, err, errlen) : 1;
}

/* height rows of width bytes (pitch apart at dev, packed at host) between a session and a
 * host block: a save queued beside the stream where the saver takes it; otherwise — and
 * every load — synchronously, after the queued copies have landed (host may be a pooled
 * block a queued copy still writes into, or the checkpoint being loaded). */
static int host_copy(struct cuda_backend *cb, char *host, char *dev, size_t width, size_t height, size_t pitch, bool save,
                     const char *what, char *err, size_t errlen) {
    int rc;
    if (save && (rc = save_async(cb, host, dev, width, height, pitch, err, errlen)) <= 0) return rc; /* queued, or an error */
    if ((rc = cuda_saver_drain(cb->saver, err, errlen))) return rc;
    if (save)
        CUDA_TRY(cudaMemcpy2DAsync(host, width, dev, pitch, width, height, cudaMemcpyDeviceToHost, cb->stream), err, errlen, what);
    else
        CUDA_TRY(cudaMemcpy2DAsync(dev, pitch, host, width, width, height, cudaMemcpyHostToDevice, cb->stream), err, errlen, what);
    CUDA_TRY(cudaStreamSynchronize(cb->stream), err, errlen, what);
    return 0;
}

static int state_copy(struct cuda_backend *cb, struct backend_session *s, char *host, bool save, char *err, size_t errlen) {
    const size_t cv = conv_bytes(cb), st = gdn_bytes(cb);
    const char *what = save ? "cuda state save" : "cuda state load";
    const int rc = host_copy(cb, host, (char *)s->conv, cv, 1, cv, save, what, err, errlen);
    return rc ? rc : host_copy(cb, host + cv, (char *)s->state, st, 1, st, save, what, err, errlen);
}

static int cuda_state_save(struct backend *base, struct backend_session *s, void *dst, char *err, size_t errlen) {
    return state_copy((struct cuda_backend *)base, s, (char *)dst, true, err, errlen);
}

static int cuda_state_load(struct backend *base, struct backend_session *s, const void *src, char *err, size_t errlen) {
    return state_copy((struct cuda_backend *)base, s, (char *)src, false, err, errlen);
}

static size_t cuda_kv_bytes_per_token(struct backend *base) {
    const struct cuda_backend *cb = (const struct cuda_backend *)base;
    return (size_t)cb->n_attn * 2 * cb->kvh * cb->D * 2;
}

static int kv_copy(struct cuda_backend *cb, struct backend_session *s, int pos0, int n, char *host, bool save, char *err,
                   size_t errlen) {
    if (pos0 < 0 || n < 0 || pos0 + n > s->max_seq)
        return errorf(err, errlen, ST_RANGE, "cuda kv %s: rows %d..%d outside the session (capacity %d)", save ? "save" : "load",
                      pos0, pos0 + n, s->max_seq);
    if (n == 0 || cb->n_attn == 0) return 0;
    const size_t row = (size_t)cb->D * 2, width = (size_t)n * row, pitch = (size_t)s->max_seq * row;
    const size_t height = (size_t)cb->n_attn * 2 * cb->kvh;
    char *dev = (char *)s->kv + (size_t)pos0 * row;
    return host_copy(cb, host, dev, width, height, pitch, save, save ? "cuda kv save" : "cuda kv load", err, errlen);
}

static int cuda_kv_save(struct backend *base, struct backend_session *s, int pos0, int n, void *dst, char *err, size_t errlen) {
    return kv_copy((struct cuda_backend *)base, s, pos0, n, (char *)dst, true, err, errlen);
}

static int cuda_kv_load(struct backend *base, struct backend_session *s, int pos0, int n, const void *src, char *err,
                        size_t errlen) {
    return kv_copy((struct cuda_backend *)base, s, pos0, n, (char *)src, false, err, errlen);
}

/* ---- lifetime ---- */

static void cuda_destroy(struct backend *base) {
    struct cuda_backend *cb = (struct cuda_backend *)base;
    if (!cb) return;
    if (cb->stream) cudaStreamSynchronize(cb->stream);
    void *bufs[] = {cb->warena, cb->d_meta, cb->x, cb->xn32, cb->xlo, cb->proj, cb->zb, cb->kb, cb->vb, cb->gab, cb->conv_out, cb->y,
                    cb->rlog, cb->seg, cb->mw, cb->ed, cb->sd, cb->part, cb->logits, cb->xn, cb->ybf, cb->act, cb->sact,
                    cb->xo, cb->ids, cb->amax_scratch, cb->amax_ids, cb->route.counts, cb->counters,
                    cb->gdn_qk, cb->gdn_gates, cb->xn_stage.perm, cb->xn_stage.gsum, cb->d_scores};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    if (cb->fg) cudaGraphExecDestroy(cb->fg);
    cuda_saver_destroy(cb->saver); /* its ring and copy stream (it drains what is left) */
    if (cb->h_meta) cudaFreeHost(cb->h_meta);
    if (cb->h_amax_ids) cudaFreeHost(cb->h_amax_ids);
    if (cb->h_scores) cudaFreeHost(cb->h_scores);
    for (int i = 0; i <= PROF_MAX; i++)
        if (cb->prof_ev[i]) cudaEventDestroy(cb->prof_ev[i]);
    for (int i = 0; i < 2; i++)
        if (cb->ev[i]) cudaEventDestroy(cb->ev[i]);
    if (cb->fork_ev) cudaEventDestroy(cb->fork_ev);
    if (cb->join_ev) cudaEventDestroy(cb->join_ev);
    if (cb->side) cudaStreamDestroy(cb->side);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    free(cb);
}

/* Device memory in use (total − free, as the driver reports it: this process's
 * allocations plus the CUDA context). */
static size_t cuda_mem_used(struct backend *base) {
    (void)base;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return total_b - free_b;
}

/* Pinned host memory: device-to-host copies into it run at full PCIe speed and
 * asynchronously (pageable destinations are staged by the driver). */
static void *cuda_host_alloc(struct backend *base, size_t bytes) {
    (void)base;
    return cuda_pinned_alloc(bytes);
}

static void cuda_host_free(struct backend *base, void *p) {
    struct cuda_backend *cb = (struct cuda_backend *)base;
    char err[64];
    cuda_saver_drain(cb->saver, err, sizeof err); /* a queued save may still be writing into p */
    cuda_pinned_free(p);
}

static const char *cuda_device_desc(struct backend *base) { return ((struct cuda_backend *)base)->device; }

/* Device copy bandwidth: (read + write bytes) / time of a device-to-device cudaMemcpy of
 * `bytes`, best of 10 after one warm-up, timed with events. Buffers are filled first so
 * the copy moves real data. */
static int cuda_copy_gbs(struct backend *base, size_t bytes, double *gbs, char *err, size_t errlen) {
    struct cuda_backend *cb = (struct cuda_backend *)base;
    void *a = NULL, *b = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    int rc = 0;
    float best = 1e30f;
    if ((rc = cuda_malloc(&a, bytes, "copy benchmark", err, errlen)) || (rc = cuda_malloc(&b, bytes, "copy benchmark", err, errlen)))
        goto out;
#define COPY_TRY(x, what) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { rc = errorf(err, errlen, ST_DEVICE, "copy benchmark: %s: %s", what, cudaGetErrorString(e_)); goto out; } } while (0)
    COPY_TRY(cudaMemsetAsync(a, 0x5a, bytes, cb->stream), "memset");
    COPY_TRY(cudaEventCreate(&t0), "event");
    COPY_TRY(cudaEventCreate(&t1), "event");
    for (int i = 0; i < 11; i++) {
        COPY_TRY(cudaEventRecord(t0, cb->stream), "event record");
        COPY_TRY(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, cb->stream), "memcpy");
        COPY_TRY(cudaEventRecord(t1, cb->stream), "event record");
        COPY_TRY(cudaEventSynchronize(t1), "synchronize");
        float ms = 0;
        COPY_TRY(cudaEventElapsedTime(&ms, t0, t1), "elapsed time");
        if (i > 0 && ms < best) best = ms;
    }
#undef COPY_TRY
    *gbs = 2.0 * (double)bytes / (best * 1e-3) / 1e9;
out:
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    return rc;
}

extern "C" int cuda_backend_load_stats(const struct backend *b, double *seconds, double *bytes) {
    const struct cuda_backend *cb = (const struct cuda_backend *)b;
    if (seconds) *seconds = cb->load_s;
    if (bytes) *bytes = (double)cb->wused;
    return 0;
}

extern "C" int cuda_backend_create(struct backend **out, const struct model_config *c, const struct model_weights *w,
                                   char *err, size_t errlen) {
    *out = NULL;
    int dev_count = 0;
    cudaError_t e = cudaGetDeviceCount(&dev_count);
    if (e != cudaSuccess || dev_count == 0) {
        cudaGetLastError();
        return errorf(err, errlen, ST_UNSUPPORTED, "cuda backend: no CUDA device (%s)",
                      e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
    struct cuda_backend *cb = (struct cuda_backend *)calloc(1, sizeof *cb);
    if (!cb) return errorf(err, errlen, ST_NOMEM, "out of memory");
    cb->base.name = "cuda";
    cb->base.max_batch_tokens = CUDA_MAX_BATCH;
    cb->base.invariant_tokens = MID_T; /* one-token sequences up to here take the invariant kernels */
    cb->base.device_sampling = 1;      /* cuda_sample.cu */
    /* cuda_score.cu (checked on the H100, session 40: equal to the host's scores of the same
     * logits). ORCHID_NO_ROW_SCORES=1 turns it off: the server then takes logits rows, 16 a
     * forward, and scores them on the host (the echo check's reference path). */
    cb->base.row_scores = !env_flag("ORCHID_NO_ROW_SCORES");
    cb->base.session_create = cuda_session_create;
    cb->base.session_destroy = cuda_session_destroy;
    cb->base.session_reset = cuda_session_reset;
    cb->base.forward = cuda_forward;
    cb->base.decode_greedy = cuda_decode_greedy;
    cb->base.device_name = cuda_device_desc;
    cb->base.copy_gbs = cuda_copy_gbs;
    cb->base.device_mem_used = cuda_mem_used;
    cb->base.host_alloc = cuda_host_alloc;
    cb->base.host_free = cuda_host_free;
    cb->base.state_bytes = cuda_state_bytes;
    cb->base.state_save = cuda_state_save;
    cb->base.state_load = cuda_state_load;
    cb->base.kv_bytes_per_token = cuda_kv_bytes_per_token;
    cb->base.kv_save = cuda_kv_save;
    cb->base.kv_load = cuda_kv_load;
    cb->base.destroy = cuda_destroy;
    cb->cfg = c;
    cb->H = c->hidden; cb->V = c->vocab; cb->E = c->n_experts; cb->K = c->n_experts_per_tok;
    cb->I = c->moe_inter; cb->Is = c->shared_inter; cb->C = cfg_conv_dim(c); cb->vd = cfg_lin_value_dim(c);
    cb->kd = cfg_lin_key_dim(c); cb->qd = cfg_q_dim(c); cb->kvd = cfg_kv_dim(c);
    cb->Hv = c->lin_v_heads; cb->Hk = c->lin_k_heads; cb->Dk = c->lin_k_dim; cb->Dv = c->lin_v_dim;
    cb->D = c->head_dim; cb->nh = c->n_heads; cb->kvh = c->n_kv_heads;
    for (int l = 0; l < c->n_layers; l++) cb->L[l].ord = c->layer_kind[l] == LAYER_ATTENTION ? cb->n_attn++ : cb->n_lin++;
    int rc;
#define FAIL(x) do { rc = (x); if (rc) { cuda_destroy(&cb->base); return rc; } } while (0)
    if (c->hidden % 64 || c->n_experts > 256 || c->n_experts_per_tok > 32)
        FAIL(errorf(err, errlen, ST_UNSUPPORTED, "cuda backend: hidden %d, %d experts top-%d", c->hidden, c->n_experts,
                    c->n_experts_per_tok));
    e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) FAIL(errorf(err, errlen, ST_DEVICE, "cuda backend: cudaStreamCreate failed: %s", cudaGetErrorString(e)));
    for (int i = 0; i < 2; i++)
        if ((e = cudaEventCreateWithFlags(&cb->ev[i], cudaEventDisableTiming)) != cudaSuccess)
            FAIL(errorf(err, errlen, ST_DEVICE, "cuda backend: cudaEventCreate failed: %s", cudaGetErrorString(e)));
    if (!env_flag("ORCHID_NO_SIDE_STREAM")) {
        if ((e = cudaStreamCreateWithFlags(&cb->side, cudaStreamNonBlocking)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&cb->fork_ev, cudaEventDisableTiming)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&cb->join_ev, cudaEventDisableTiming)) != cudaSuccess)
            FAIL(errorf(err, errlen, ST_DEVICE, "cuda backend: side stream: %s", cudaGetErrorString(e)));
    }
    FAIL(cuda_gemm_init(err, errlen));
    FAIL(cuda_skinny_init(err, errlen));
    FAIL(cuda_moe_init(err, errlen));
    FAIL(cuda_gdn_prefill_init(err, errlen));
    const char *pe = getenv("ORCHID_CUDA_PROFILE");
    if (pe && atoi(pe)) FAIL(cuda_backend_set_profile(&cb->base, 1, err, errlen));
    FAIL(cuda_attn_init(c->n_heads, c->n_kv_heads, c->head_dim, err, errlen));

    {
        /* The L2 fetches 128 bytes from DRAM on a miss (a hint): the decode kernels' 8-byte
         * fragment loads touch one 32-byte sector of a line at a time, and the rest of the
         * line is asked for right after (H200: +1.4 % decode at 512). ORCHID_L2_FETCH=32/64
         * for A/B, 0 to leave the driver's setting. */
        const char *l2 = getenv("ORCHID_L2_FETCH");
        const int fetch = l2 && *l2 ? atoi(l2) : 128;
        if (fetch > 0 && cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, (size_t)fetch) != cudaSuccess) cudaGetLastError();
    }
    cb->n_sm = cuda_sm_count();
    if (cb->n_sm < 1) cb->n_sm = 132; /* a guess: it only sizes the decode attention splits */

    /* weights */
    const double t0 = now_s();
    cb->wbytes = weights_dev_bytes(c, w);
    FAIL(cuda_malloc((void **)&cb->warena, cb->wbytes, "the weights", err, errlen));
    FAIL(upload_weights(cb, w, err, errlen));
    CUDA_TRY(cudaDeviceSynchronize(), err, errlen, "cuda backend: weight upload");
    cb->load_s = now_s() - t0;
    cuda_device_name(cb->device, sizeof cb->device);
    fprintf(stderr, "cuda: %.2f GB of weights uploaded in %.2f s (%.1f GB/s) to %s\n", cb->wused / 1e9, cb->load_s,
            cb->wused / 1e9 / (cb->load_s > 0 ? cb->load_s : 1e-9), cb->device);

    /* scratch */
    const size_t T = CUDA_MAX_BATCH, H = cb->H, K = cb->K;
    const size_t P = (size_t)cb->C > 2 * (size_t)cb->qd ? (size_t)cb->C : 2 * (size_t)cb->qd;
    const size_t Imax = cb->I > cb->Is ? cb->I : cb->Is;
    const size_t ybw = cb->vd > cb->qd ? cb->vd : cb->qd;
    const size_t parts = (T * cb->nh > (size_t)MID_T * cb->nh * MAX_SPLIT ? T * cb->nh : (size_t)MID_T * cb->nh * MAX_SPLIT) * (cb->D + 2);
    const size_t pair_act = (SMALL_T * (K + 1) > T * K ? SMALL_T * (K + 1) : T * K) * Imax;
    FAIL(cuda_malloc((void **)&cb->x, T * H * 4, "x", err, errlen));
    FAIL(cuda_malloc((void **)&cb->xn, T * H * 2, "xn", err, errlen));
    FAIL(cuda_malloc((void **)&cb->xn32, T * H * 4, "xn32", err, errlen));
    if (H % (4 * QGROUP) == 0) {
        FAIL(cuda_malloc((void **)&cb->xn_stage.perm, (size_t)MID_T * H * 2, "xn staged", err, errlen));
        FAIL(cuda_malloc((void **)&cb->xn_stage.gsum, (size_t)MID_T * (H / QGROUP) * 4, "xn group sums", err, errlen));
    }
    FAIL(cuda_malloc((void **)&cb->xlo, T * H * 2, "xlo", err, errlen));
    FAIL(cuda_malloc((void **)&cb->proj, T * P * 4, "projections", err, errlen));
    FAIL(cuda_malloc((void **)&cb->zb, T * cb->vd * 4, "z", err, errlen));
    FAIL(cuda_malloc((void **)&cb->kb, T * cb->kvd * 4, "k", err, errlen));
    FAIL(cuda_malloc((void **)&cb->vb, T * cb->kvd * 4, "v", err, errlen));
    FAIL(cuda_malloc((void **)&cb->gab, T * 2 * cb->Hv * 4, "gdn gates", err, errlen));
    FAIL(cuda_malloc((void **)&cb->conv_out, T * cb->C * 4, "conv out", err, errlen));
    FAIL(cuda_malloc((void **)&cb->y, T * cb->vd * 4, "gdn out", err, errlen));
    if (cb->n_lin && cuda_gdn_prefill_supported(cb->Hk, cb->Hv, cb->Dk, cb->Dv)) {
        FAIL(cuda_malloc((void **)&cb->gdn_qk, T * cb->Hk * 2 * cb->Dk * 4, "gdn q/k", err, errlen));
        FAIL(cuda_malloc((void **)&cb->gdn_gates, T * cb->Hv * 2 * 4, "gdn gates", err, errlen));
    }
    FAIL(cuda_malloc((void **)&cb->ybf, T * ybw * 2, "mixer out", err, errlen));
    FAIL(cuda_malloc((void **)&cb->rlog, T * cb->E * 4, "router logits", err, errlen));
    FAIL(cuda_malloc((void **)&cb->seg, T * 4, "shared gate", err, errlen));
    FAIL(cuda_malloc((void **)&cb->mw, T * K * 4, "expert weights", err, errlen));
    FAIL(cuda_malloc((void **)&cb->ids, T * K * 4, "expert ids", err, errlen));
    FAIL(cuda_malloc((void **)&cb->act, pair_act * 2, "expert activations", err, errlen));
    FAIL(cuda_malloc((void **)&cb->ed, T * K * H * 4, "expert outputs", err, errlen));
    FAIL(cuda_malloc((void **)&cb->sact, T * cb->Is * 2, "shared activations", err, errlen));
    FAIL(cuda_malloc((void **)&cb->sd, T * H * 4, "shared output", err, errlen));
    FAIL(cuda_malloc((void **)&cb->part, parts * 4, "attention partials", err, errlen));
    FAIL(cuda_malloc((void **)&cb->logits, (size_t)LOGIT_ROWS * cb->V * 4, "logits", err, errlen));
    FAIL(cuda_malloc((void **)&cb->xo, (size_t)LOGIT_ROWS * H * 2, "final norm", err, errlen));
    /* argmax: cuda_argmax's scratch (ARGMAX_PARTS = 128 (value, index) pairs a row) for one
     * lm_head pass; ids of every output row of a forward, on the device and pinned */
    FAIL(cuda_malloc((void **)&cb->amax_scratch, (size_t)LOGIT_ROWS * 128 * 2 * 4, "argmax", err, errlen));
    FAIL(cuda_malloc((void **)&cb->amax_ids, (size_t)CUDA_MAX_BATCH * 4, "argmax ids", err, errlen));
    if (cudaMallocHost((void **)&cb->h_amax_ids, (size_t)CUDA_MAX_BATCH * 4) != cudaSuccess) {
        cudaGetLastError();
        cb->h_amax_ids = NULL;
        FAIL(errorf(err, errlen, ST_NOMEM, "cuda backend: cudaMallocHost of the argmax ids failed"));
    }
    FAIL(cuda_malloc((void **)&cb->d_scores, (size_t)CUDA_MAX_BATCH * sizeof(struct sample_result), "row scores", err, errlen));
    if (cudaMallocHost((void **)&cb->h_scores, (size_t)CUDA_MAX_BATCH * sizeof(struct sample_result)) != cudaSuccess) {
        cudaGetLastError();
        cb->h_scores = NULL;
        FAIL(errorf(err, errlen, ST_NOMEM, "cuda backend: cudaMallocHost of the row scores failed"));
    }
    FAIL(cuda_malloc((void **)&cb->counters, CNT_N * sizeof(int), "counters", err, errlen));
    if ((e = cudaMemset(cb->counters, 0, CNT_N * sizeof(int))) != cudaSuccess)
        FAIL(errorf(err, errlen, ST_DEVICE, "cuda backend: counters: %s", cudaGetErrorString(e)));
    const int max_tiles = (int)((T * K + 63) / 64) + cb->E;
    const size_t rwords = (size_t)(cb->E + 1) * 2 + cb->E + 2 * T * K + (size_t)max_tiles * 3 + 1;
    int32_t *rb;
    FAIL(cuda_malloc((void **)&rb, rwords * 4, "moe routing", err, errlen));
    cb->route.counts = rb;
    cb->route.offsets = rb + cb->E + 1;
    cb->route.cursor = rb + 2 * (cb->E + 1);
    cb->route.row_of_slot = cb->route.cursor + cb->E;
    cb->route.slot_of_pair = cb->route.row_of_slot + T * K;
    cb->route.tiles = cb->route.slot_of_pair + T * K;
    cb->route.max_tiles = max_tiles;
    cb->meta_cap = 8 * T * 4 + T * sizeof(cuda_seq) + T * sizeof(cuda_attn_tile) + T * sizeof(struct row_sampling) +
                   T * sizeof(struct row_score_req) + 256;
    FAIL(cuda_malloc((void **)&cb->d_meta, cb->meta_cap, "batch metadata", err, errlen));
    if (cudaMallocHost((void **)&cb->h_meta, cb->meta_cap) != cudaSuccess) {
        cudaGetLastError();
        cb->h_meta = NULL;
        FAIL(errorf(err, errlen, ST_NOMEM, "cuda backend: cudaMallocHost of the batch metadata failed"));
    }
#undef FAIL
    *out = &cb->base;
    return 0;
}
