/* cuda/cuda_ops.h — the C-visible surface of the CUDA kernels (the .cu files of src/cuda).
 *
 * Every kernel has one `extern "C" int cuda_<op>(const struct cuda_ctx *c, ...)`
 * launcher that checks the launch and returns 0 or ST_DEVICE with a message
 * naming the op (status.h convention, written into c->err). Pointers are device
 * pointers unless a name says host. bf16 tensors are passed as uint16_t.
 * Layouts (row-major, T = tokens of the batch):
 *   x       float32 [T, H] residual stream          xn  bf16 [T, ldx] GEMM inputs
 *   qmat    MLX affine codes/scales/biases as on disk, group 64, 4 or 8 bits
 *   KV      bf16 per session [n_attn][2 (K,V)][kv_heads][max_seq][head_dim]
 *   GDN     float32 state per session [n_lin][Hv][Dv][Dk], conv [n_lin][K-1][conv_dim]
 * This header is C11 so tests/gpu can call the launchers directly.
 */
#ifndef ORCHID_CUDA_OPS_H
#define ORCHID_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *cuda_stream_t; /* == cudaStream_t */

struct cuda_ctx {
    cuda_stream_t stream;
    char *err;
    size_t errlen;
};

/* One quantized matrix (or a stack of n_mats experts) in device memory. */
struct cuda_qmat {
    const uint32_t *codes;
    const uint16_t *scales, *biases;
    int rows, cols, n_mats, bits; /* group size is always 64 */
};

/* Per-sequence view of a batch (device array, [n_seqs]). */
struct cuda_seq {
    uint16_t *kv;   /* session KV cache base */
    float *conv;    /* session conv state base */
    float *state;   /* session GDN state base */
    int max_seq;
    int t0, t1;     /* its tokens in the batch */
    int pad;
};

/* An attention query tile: up to CUDA_ATTN_QT consecutive tokens of one sequence, or up to
 * CUDA_ATTN_QT_WIDE where the launch takes the wgmma kernel (cuda_attn_tile_tokens says which:
 * the tiles must be cut by it). */
#define CUDA_ATTN_QT 8
#define CUDA_ATTN_QT_WIDE 16
/* Forwards of at least this many tokens are prompt chunks (the prefill path: one key split).
 * A chunk of more tokens than the decode kernels take is on it alone and packed alike, so
 * the attention kernel it gets, and its bits, do not depend on the batch. */
#define CUDA_ATTN_WIDE_MIN_T 65
/* Key splits: a launch has n_split of them, a tile uses min(n_split, ⌈kv_len / 32⌉) — with
 * n_split = min(cap, ⌈longest kv_len / 32⌉) that is min(cap, ⌈own kv_len / 32⌉), a function
 * of the sequence's own length only, so its bits do not depend on the batch. */
#define CUDA_ATTN_SPLIT_KEYS 32
struct cuda_attn_tile {
    int seq, t0, n, pad;
};

/* Optional tail of a launch (decode fusion): the block that finishes last (atomic
 * counter, reset by that block for the next launch) RMS-normalises the T rows the
 * launch accumulated into, writing bf16 xn and, when xn32 != NULL, fp32 xn32. */
struct cuda_tail_norm {
    int *counter; /* zero-initialised device int; NULL = no tail */
    const float *gain;
    float eps;
    uint16_t *xn;
    float *xn32;
};

/* The other way round (one token): no tail; each block of the launch that reads the
 * normalised row computes it itself from the residual x (n = its columns) with gain, the
 * same bits as the tail and the batched norm kernels (cuda_internal.h norm_src_row); when
 * xn != NULL the launch's block 0 also leaves the bf16 row there for later launches. */
struct cuda_norm_src {
    const float *x;
    const float *gain;
    float eps;
    uint16_t *xn;
};

/* ---- memory helpers (for tests and the backend) ---- */
int cuda_malloc(void **p, size_t bytes, const char *what, char *err, size_t errlen);
void cuda_free(void *p);
int cuda_h2d(void *dst, const void *src, size_t bytes, char *err, size_t errlen);
int cuda_d2h(void *dst, const void *src, size_t bytes, char *err, size_t errlen);
int cuda_memset0(void *dst, size_t bytes, char *err, size_t errlen);
/* Page-locked host memory (cudaMallocHost): NULL when it cannot be had. */
void *cuda_pinned_alloc(size_t bytes);
void cuda_pinned_free(void *p);
int cuda_sync(char *err, size_t errlen);
int cuda_device_name(char *buf, size_t len);
int cuda_sm_count(void); /* multiprocessors of the current device, or ST_DEVICE */
/* Whether the environment sets the A/B switch `name` (anything but "" or "0"): the backend's rule. */
int cuda_env_flag(const char *name);
int cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
/* Device-to-device copy bandwidth in GB/s, bytes read + written. */
int cuda_copy_bandwidth(size_t bytes, int reps, double *gbps, char *err, size_t errlen);

/* One-time kernel attribute set-up (shared-memory limits); call before any launch. */
int cuda_gemm_init(char *err, size_t errlen);
/* Whether the prefill GEMMs take the wgmma form (cuda_gemm_wg.cu: sm_90a code on a compute
 * capability 9 device, ORCHID_NO_WGMMA unset); tests force the mma.sync form to compare. */
int cuda_gemm_wg_active(void);
void cuda_gemm_force_mma(int on);
/* The wgmma form's wide dense blocks (256 token rows; on by default for K 1,024..2,048,
 * ORCHID_NO_WG_WIDE=1 the A/B): tests force them (1: every dense product their shared memory
 * holds, -1: never, 0: the environment) and count their launches. */
void cuda_gemm_wg_wide_force(int mode);
long cuda_gemm_wg_wide_launches(void);
int cuda_attn_init(int n_heads, int kv_heads, int head_dim, char *err, size_t errlen);

/* ---- dense / grouped quantized matrix products (cuda_gemv.cu, cuda_gemm.cu) ---- */
/* y[t, r] (+)= Σ_c x[t, c] W_mat[r, c] for t < T; picks the GEMV (T = 1, or T <= 16 for
 * 8-bit), the skinny tensor-core kernel (2..64 tokens, 4-bit) or the tensor-core GEMM. */
int cuda_qmatmul(const struct cuda_ctx *c, const struct cuda_qmat *m, int mat, const uint16_t *x, int T, int ldx,
                 float *y, int ldy, int accumulate);
/* Up to 4 matrices sharing the input, one launch (decode fusion). T <= 16. */
struct cuda_gemv_seg {
    struct cuda_qmat m;
    float *y;
    int ldy, accumulate;
};
int cuda_gemv_multi(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const uint16_t *x, int T,
                    int ldx);
/* bf16 rows x[T][K] (K a multiple of 64) as the wgmma products of 9..64 tokens stage them in
 * shared memory (cuda_mma.h's wg_tokens_finish), written once by the rows' producer so that
 * no consuming block redoes it: perm[t][K] holds each quantization group's 64 values in the
 * order of its four k16 steps' B fragments, gsum[t][K / 64] each group's Σx (its 8 chunks'
 * left-to-right sums added in chunk order onto 0). Same row stride as x; 16-byte aligned. */
struct cuda_xstage {
    uint16_t *perm;
    float *gsum;
};
/* One accumulating matrix (y += W x) whose last block then normalises y's T rows (tail). */
int cuda_gemv_acc_norm(const struct cuda_ctx *c, const struct cuda_qmat *m, const uint16_t *x, int T, int ldx, float *y,
                       int ldy, const struct cuda_tail_norm *tail);
/* Forces the tensor-core GEMM (any T; for tests). */
int cuda_gemm_dense(const struct cuda_ctx *c, const struct cuda_qmat *m, int mat, const uint16_t *x, int T, int ldx,
                    float *y, int ldy, int accumulate);
/* the fused one-launch form of cuda_gemm_precise on (default) or off (three launches: the GPU test's bitwise check) */
void cuda_gemm_precise_fused(int on);
/* ~fp32-accurate y (+)= x·Wᵀ from x = x_hi + x_lo (bf16 parts): three tensor-core products,
 * one launch where the mma.sync form takes them (cuda_gemm.cu). */
int cuda_gemm_precise(const struct cuda_ctx *c, const struct cuda_qmat *m, const uint16_t *x_hi, const uint16_t *x_lo,
                      int T, int ldx, float *y, int ldy, int accumulate);
/* act[t, f] = bf16(silu(gate_mat[f]·x_t) * (up_mat[f]·x_t)) with the GEMM (any T). */
int cuda_gemm_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                     const uint16_t *x, int T, int ldx, uint16_t *act, int ld_act);

/* ---- elementwise / norms (cuda_norm.cu) ---- */
int cuda_embed(const struct cuda_ctx *c, const struct cuda_qmat *embed, const int32_t *tokens, int T, float *x);
/* xn[t] = bf16(x[t] / rms(x[t]) * gain); rows optional (NULL = t); xn32 (optional) gets
 * the same values unrounded, fp32. */
int cuda_rmsnorm(const struct cuda_ctx *c, const float *x, const float *gain, int T, int n, float eps,
                 const int32_t *rows, uint16_t *xn);
int cuda_rmsnorm2(const struct cuda_ctx *c, const float *x, const float *gain, int T, int n, float eps,
                  const int32_t *rows, uint16_t *xn, float *xn32);
/* ... and xlo = bf16(value - xn): the low part for cuda_gemm_precise. */
int cuda_rmsnorm_split(const struct cuda_ctx *c, const float *x, const float *gain, int T, int n, float eps,
                       uint16_t *xn, uint16_t *xlo);
int cuda_f32_to_bf16(const struct cuda_ctx *c, const float *x, size_t n, uint16_t *y);
/* Argmax over n floats per row (first index on ties); writes ids[row]; also dst2 if non-NULL. */
int cuda_argmax(const struct cuda_ctx *c, const float *logits, int n_rows, int n, int32_t *ids, int32_t *scratch);

/* ---- the device sampler (cuda_sample.cu; model/device_sampling.h) ---- */
struct row_sampling;
/* For each row with rows[i].temperature > 0 (rows: device memory), ids[i] = the token the
 * device sampler draws from logits row i, and that row is overwritten (scratch); other rows'
 * ids and logits are left as they are (the argmax). */
int cuda_sample(const struct cuda_ctx *c, float *logits, int n_rows, int V, const struct row_sampling *rows,
                int32_t *ids);
/* Tests: blocks a row (1, 2, 4 or 8; sm_90 only above 1); 0 = the automatic choice. */
void cuda_sample_force_cluster(int c);
/* Tests: 1 = every row through the radix passes (the fast paths off; also
 * ORCHID_SAMPLE_NOFAST=1); and the rows the fast paths drew and handed back (too many
 * candidates) since the process began. */
void cuda_sample_force_slow(int on);
int cuda_sample_fast_counts(unsigned long long *fast, unsigned long long *fallbacks);

/* ---- attention (cuda_attn.cu) ---- */
/* q/k RMSNorm + NeoX RoPE in place on qg [T, n_heads, 2*D] (query half) and k [T, kvh*D]; writes K, V to the cache. */
int cuda_attn_prep(const struct cuda_ctx *c, float *qg, const float *k, const float *v, const float *q_norm,
                   const float *k_norm, const int32_t *pos, const int32_t *tok_seq, const struct cuda_seq *seqs,
                   int layer_ord, int T, int n_heads, int kv_heads, int D, int rot, float theta, float eps);
/* Causal attention for every tile (split over keys into n_split parts), then the combine
 * with the sigmoid output gate: out[t, h*D + d] = bf16(attn * sigmoid(gate)). tail: NULL,
 * or 2 × n_tiles × kv_heads zeroed ints (a barrier's arrivals, left zeroed, and its
 * generation, which counts on) with which the flash launch combines each (tile, KV head)'s
 * rows itself when it can (n_split ≤ CUDA_ATTN_TAIL_SPLITS), saving the combine launch; the
 * same bits either way. */
#define CUDA_ATTN_TAIL_SPLITS 32
int cuda_attention(const struct cuda_ctx *c, const float *qg, const int32_t *pos, const struct cuda_seq *seqs,
                   const struct cuda_attn_tile *tiles, int n_tiles, int n_split, int layer_ord, int T, int n_heads,
                   int kv_heads, int D, float *part, int *tail, uint16_t *out);

/* Tokens a query tile of this launch may hold (CUDA_ATTN_QT_WIDE where cuda_attention takes
 * the wgmma kernel: T ≥ CUDA_ATTN_WIDE_MIN_T, one split, head dim 256, 8 q heads a KV head,
 * an sm_90a device, switched on; else CUDA_ATTN_QT). */
int cuda_attn_tile_tokens(int T, int n_split, int n_heads, int kv_heads, int D);
/* The wgmma kernel (cuda_flash_wg.cu; ORCHID_NO_FLASH_WG=1 switches it off): init at backend creation;
 * whether it takes a launch; tests: 1 = wherever the device runs it, -1 = never (the mma.sync
 * kernel for prompt chunks too), 0 = as the environment says. */
int cuda_flash_wg_init(char *err, size_t errlen);
int cuda_flash_wg_takes(int T, int n_split, int n_heads, int kv_heads, int D);
void cuda_flash_wg_force(int mode);
/* Its ping-pong form (a copying warpgroup, mbarriers, the warpgroups taking turns; on by
 * default, ORCHID_NO_FLASH_WG_PP=1 the A/B): tests force it (1 / -1 / 0 the environment) and count its launches. */
void cuda_flash_wg_pp_force(int mode);
long cuda_flash_wg_pp_launches(void);
int cuda_flash_wg_attention(const struct cuda_ctx *c, const float *qg, const int32_t *pos, const struct cuda_seq *seqs,
                            const struct cuda_attn_tile *tiles, int n_tiles, int layer_ord, int n_heads, int kv_heads,
                            uint16_t *out);

/* The tensor-core kernel behind cuda_attention (cuda_flash.cu); *launched = 0 when the
 * shape needs the scalar kernel (more than 8 q heads per KV head, head_dim not 64/128/256). */
void cuda_attn_force_scalar(int on);
/* Key splits a flash block takes one after another (tests: 0 = chosen by the launch). */
void cuda_flash_force_spb(int spb);
/* Tests: 1 = the combine launch even when cuda_attention is given tail counters; how many
 * flash launches have combined their splits themselves so far. */
void cuda_flash_force_no_tail(int on);
long cuda_flash_tail_launches(void);
int cuda_flash_init(int head_dim, char *err, size_t errlen);
/* tail, out: cuda_attention's; *combined = 1 when the launch also combined (into out). */
int cuda_flash_attention(const struct cuda_ctx *c, const float *qg, const int32_t *pos, const struct cuda_seq *seqs,
                         const struct cuda_attn_tile *tiles, int n_tiles, int n_split, int layer_ord, int n_heads,
                         int kv_heads, int D, float *part, int *tail, uint16_t *out, int *launched, int *combined);

/* ---- Gated DeltaNet (cuda_gdn.cu) ---- */
/* Causal depthwise conv + SiLU over the batch (reads/updates each session's conv state). */
int cuda_conv1d(const struct cuda_ctx *c, const float *qkv, const float *w, const int32_t *tok_seq,
                const struct cuda_seq *seqs, int n_seqs, int layer_ord, int T, int C, int K, float *out);
/* The recurrence of every value head of every sequence, then y [T, Hv*Dv] fp32 (pre-norm).
 * one_token: every sequence brings exactly one token (T == n_seqs: decode), which a leaner
 * instance serves with the same bits when there are several sequences. pdl: launched with
 * PDL (its sequence and state reads before its wait): for use after a launch that triggers
 * late (cuda_tcv_conv.trigger_late); otherwise its early blocks crowd the previous one. */
int cuda_gdn_scan(const struct cuda_ctx *c, const float *conv_out, const float *a, const float *b, int ldab,
                  const float *A_log, const float *dt_bias, const struct cuda_seq *seqs, int n_seqs, int layer_ord,
                  int Hk, int Hv, int Dk, int Dv, int one_token, int pdl, float *y);
/* The same recurrence for prefill chunks (cuda_gdn_prefill.cu): a parallel preparation
 * launch (l2-normalised q, k into qk [T][Hk][2][Dk], gates into [Hv][T][2]), then the
 * chunked form (below) for the long sequences and the scan with double-buffered chunks for
 * the rest; the same math as cuda_gdn_scan, summed in another order (the scan with
 * cuda_gdn_prefill_lanes Dk / 8: bit for bit; 4, the default, and the chunked form: within
 * 1e-4 of it). */
int cuda_gdn_prefill_init(char *err, size_t errlen);
int cuda_gdn_prefill_supported(int Hk, int Hv, int Dk, int Dv);
/* lanes a value row in the prefill scan (4 by default; Dk / 8, the decode form's bits, with ORCHID_GDNP_LPR=16) */
int cuda_gdn_prefill_lanes(int Dk);
/* n_long: how many of the sequences bring at least CUDA_GDN_CHUNK_MIN tokens (-1: not
 * known) — with the chunked form on, those take it and the rest the scan, and a launch with
 * no sequence of its kind is skipped. */
int cuda_gdn_scan_prefill(const struct cuda_ctx *c, const float *conv_out, const float *a, const float *b, int ldab,
                          const float *A_log, const float *dt_bias, const struct cuda_seq *seqs, int n_seqs, int n_long,
                          int layer_ord, int T, int Hk, int Hv, int Dk, int Dv, float *qk, float *gates, float *y);
/* The chunked form (cuda_gdn_chunk.cu: 64-token chunks on tensor cores, Dk 128, Dv a multiple
 * of 64, where the device holds its ~209 KB block) for the sequences of a prefill launch with
 * at least CUDA_GDN_CHUNK_MIN tokens (a shorter one costs a whole chunk there, ~25 of its
 * tokens' worth in the scan: a decode row beside a prompt chunk stays in the scan). On by
 * default; 1 / 0 forces it on / off, -1 leaves it to ORCHID_GDN_CHUNK (0: off). Within 1e-4
 * of the CPU reference, like the scan; a sequence's form depends on its own token count only. */
#define CUDA_GDN_CHUNK_MIN 32
void cuda_gdn_prefill_force_chunk(int on);
int cuda_gdn_chunk_supported(int Hk, int Hv, int Dk, int Dv);
/* Value rows a block of the chunked form (32 or 64; 0: 32 where 64's grid would fill at most
 * half the SMs — a lone long prompt — else 64). Both give the same bits (tests force each). */
void cuda_gdn_chunk_force_rows(int rows);
/* Its L2 prefetch of the next chunk's rows (the same bits; by default in the 32-row form,
 * ORCHID_NO_GC_PREFETCH=1 off, ORCHID_GC_PREFETCH=1 in both forms): tests force it (1 / -1 /
 * 0 the default and environment) and count its launches. */
void cuda_gdn_chunk_force_prefetch(int mode);
long cuda_gdn_chunk_prefetch_launches(void);
/* out[t, h*Dv + d] = bf16(w[d] * y / rms(y over the head) * silu(z)) */
int cuda_gated_norm(const struct cuda_ctx *c, const float *y, const float *z, int ldz, const float *w, int T, int Hv,
                    int Dv, float eps, uint16_t *out);

/* ---- MoE (cuda_moe.cu) ---- */
/* softmax over E logits per token, top-k (ties → lowest id), renormalise. */
int cuda_moe_topk(const struct cuda_ctx *c, const float *logits, int ld, int T, int E, int K, int renorm, int32_t *ids,
                  float *w);
/* The same top-k (ids and weights bit for bit) of one token by one block of 256 threads: the
 * router tail's one-token form (topk_block), launched alone for the GPU test. */
int cuda_moe_topk_block(const struct cuda_ctx *c, const float *logits, int E, int K, int renorm, int32_t *ids, float *w);
/* Router logits [T, ld] and shared-expert gate logit seg[T] from the fp32 normalised input
 * (exact fp32 weights: a near-tie in the top-k must not flip on rounding). */
int cuda_moe_router(const struct cuda_ctx *c, const struct cuda_qmat *router, const struct cuda_qmat *sh_gate,
                    const float *x, int ldx, int T, float *logits, int ld, float *seg);
/* The same, then (T <= 64) the top-k, by the last block of each row of blocks (8 tokens a
 * row): counter is ceil(T / 8) zeroed device ints, each reset for the next launch. */
int cuda_moe_router_topk(const struct cuda_ctx *c, const struct cuda_qmat *router, const struct cuda_qmat *sh_gate,
                         const float *x, int ldx, int T, float *logits, int ld, float *seg, int K, int renorm,
                         int32_t *ids, float *w, int *counter);
/* One token whose input is normalised by the router's blocks themselves (ns: the residual
 * row of router->cols values; ns->xn gets the bf16 row for the expert launches after it).
 * counter NULL: no top-k (the pair launches take it: cuda_topk_src). */
int cuda_moe_router_topk_norm(const struct cuda_ctx *c, const struct cuda_qmat *router, const struct cuda_qmat *sh_gate,
                              const struct cuda_norm_src *ns, float *logits, float *seg, int K, int renorm, int32_t *ids,
                              float *w, int *counter);
struct row_score_req;
struct sample_result;
/* Row scores (model/device_sampling.h) of n logits rows [n][V]: row i scored by req[i]
 * (token < 0: skipped) into out[i]; max_top ≥ every scored row's n_top (cuda_score.cu). */
int cuda_row_scores(const struct cuda_ctx *c, const float *logits, int n, int V, const struct row_score_req *req,
                    int max_top, struct sample_result *out);
/* Small-batch MoE (T*(K+1) pairs): act[p, I] for routed pairs and the shared expert (pair K of each token). */
int cuda_moe_gateup_pairs(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                          const struct cuda_qmat *sh_gate, const struct cuda_qmat *sh_up, const int32_t *ids,
                          const uint16_t *xn, int ldx, int T, int K, uint16_t *act);
/* x[t] += Σ_k w_k down_{e_k}(act) + sigmoid(seg[t]) sh_down(act_shared) */
int cuda_moe_down_pairs(const struct cuda_ctx *c, const struct cuda_qmat *down, const struct cuda_qmat *sh_down,
                        const int32_t *ids, const float *w, const float *seg, int ld_seg, const uint16_t *act, int T,
                        int K, float *x, const struct cuda_tail_norm *tail);
/* Grouped (sorted) route for large batches. */
struct cuda_moe_route {
    int32_t *counts;      /* [E+1] */
    int32_t *offsets;     /* [E+1] */
    int32_t *cursor;      /* [E] */
    int32_t *row_of_slot; /* [T*K] token row of each sorted slot */
    int32_t *slot_of_pair;/* [T*K] */
    int32_t *tiles;       /* [max_tiles * 3] (expert, m0, m_end), then n_tiles at [max_tiles*3] */
    int max_tiles;
    int bound_tiles;      /* the most tiles the last cuda_moe_route_build can have made: ⌈T·K/tile_rows⌉ + E */
    int tile_rows;        /* slots a tile of the last build (64: the skinny kernels; 128: the prefill GEMMs) */
    int n_experts, n_slots; /* E and T·K of the last cuda_moe_route_build (host side) */
};
/* Grid rows of a grouped launch over a route: its bound, not the capacity (a 64-token
 * batch has at most 264 tiles of the 768 a 4,096-token one may: the rest of the blocks
 * would only start, read the count and exit — H200: ~17,500 such blocks a launch). */
static inline int cuda_moe_route_grid(const struct cuda_moe_route *r) {
    return r->bound_tiles > 0 && r->bound_tiles < r->max_tiles ? r->bound_tiles : r->max_tiles;
}
/* Sorts the T·K (token, expert) pairs by expert into slots and cuts each expert's run into
 * tiles of at most tile_rows (a power of two, 8..128) slots. */
int cuda_moe_route_build(const struct cuda_ctx *c, const int32_t *ids, int T, int E, int K, int tile_rows,
                         struct cuda_moe_route *r);
/* test hooks: the route by its size (-1), always in one block (0) or always cooperative (1,
 * where the device has it: the return says) — and the cooperative launches made */
int cuda_moe_route_force(int mode);
int cuda_moe_route_coop_launches(void);
int cuda_moe_grouped_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                            const uint16_t *xn, int ldx, const struct cuda_moe_route *r, uint16_t *act);
int cuda_moe_grouped_down(const struct cuda_ctx *c, const struct cuda_qmat *down, const uint16_t *act,
                          const struct cuda_moe_route *r, float *out);
/* x[t] += Σ_k w ed[slot_of_pair[t*K+k]] + sigmoid(seg[t]) sd[t] */
int cuda_moe_combine(const struct cuda_ctx *c, const float *ed, const int32_t *slot_of_pair, const float *w,
                     const float *sd, const float *seg, int ld_seg, int T, int K, int H, float *x);
/* The same for T tokens, then each token's RMSNorm of x with gain into xn (bf16) — the next
 * layer's input norm, the bits of cuda_rmsnorm (the 2..64-token path: one launch less a
 * layer) — and, xs not NULL (H a multiple of 64), xn's rows staged (struct cuda_xstage).
 * cuda_moe_combine_norm_ok: the shapes it takes (H % 4 == 0, H ≤ 8,192: its row in shared memory). */
int cuda_moe_combine_norm(const struct cuda_ctx *c, const float *ed, const int32_t *slot_of_pair, const float *w,
                          const float *sd, const float *seg, int ld_seg, int T, int K, int H, float *x, const float *gain,
                          float eps, uint16_t *xn, const struct cuda_xstage *xs);
int cuda_moe_combine_norm_ok(int H);
int cuda_swiglu_bf16(const struct cuda_ctx *c, const float *g, const float *u, size_t n, uint16_t *out);

/* ---- skinny tensor-core products for 2..64 tokens (cuda_skinny.cu), 4-bit weights ---- */
int cuda_skinny_init(char *err, size_t errlen);
/* The router's shared-memory opt-in (batches of several tokens stage their rows). */
int cuda_moe_init(char *err, size_t errlen);
int cuda_skinny_supported(const struct cuda_qmat *m); /* 4-bit, columns a multiple of 64 */
/* y[t, r] (+)= Σ_c x[t, c] W_mat[r, c] for t < T (1..64) */
int cuda_skinny_dense(const struct cuda_ctx *c, const struct cuda_qmat *m, int mat, const uint16_t *x, int T, int ldx,
                      float *y, int ldy, int accumulate);
/* Up to 4 matrices sharing x (same columns and accumulate flag), one launch. xs: x's rows
 * staged by their producer (struct cuda_xstage, stride ldx), or NULL; the launch forms that
 * read it skip their own staging pass, the others ignore it (the same sums either way). */
int cuda_skinny_multi(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const uint16_t *x, int T,
                      int ldx, const struct cuda_xstage *xs);
/* Whether cuda_skinny_multi of these segments and T tokens reads a stage it is given (the
 * looped wide form takes the launch): its producer stages the rows only then. */
int cuda_skinny_multi_reads_stage(const struct cuda_gemv_seg *segs, int n_segs, int T);
/* act[t, f] = bf16(silu(gate[f]·x_t) · (up[f]·x_t)) for t < T (1..64) */
int cuda_skinny_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                       const uint16_t *x, int T, int ldx, uint16_t *act, int ld_act);
/* The grouped forms over a route (any number of slots): act[slot, f] from x[row_of_slot],
 * and out[slot, r] = down_e · act[slot]. Same layouts as cuda_moe_grouped_*. */
int cuda_skinny_grouped_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                               const uint16_t *xn, int ldx, const struct cuda_moe_route *r, uint16_t *act);
int cuda_skinny_grouped_down(const struct cuda_ctx *c, const struct cuda_qmat *down, const uint16_t *act,
                             const struct cuda_moe_route *r, float *out);
/* k-slices per block the skinny kernels use for K columns (cuda_tcv.cu copies them). */
int cuda_skinny_kslices(int K);
/* cuda_skinny_pipe.cu: the grouped forms as persistent pipelined kernels (sm_90+, tensor-map
 * copies), the same sums as cuda_skinny.cu's grouped kernel for tiles of RB rows. Return 1
 * when launched, 0 when the case is not theirs (the caller launches the other), negative on
 * error. cuda_skinny_grouped_swiglu and _down hand over to them by default (ORCHID_SK_PIPE=0:
 * never; =swiglu / =down: that one only); cuda_skinny_pipe_enable (tests)
 * switches them (bit 0 the gate/up launch, bit 1 the down launch), returning the previous
 * bits, and cuda_skinny_pipe_launches counts the launches they took. */
int cuda_skinny_pipe_init(char *err, size_t errlen);
int cuda_skinny_pipe_enable(int on);
int cuda_skinny_pipe_launches(void);
int cuda_skinny_pipe_down_sets(int sets); /* the direct down launch's consumer sets (1 or 2); the previous */
/* The gate/up launch's K = 2,048 kernel (skinny_pipe_x_kernel: the same bits; on by default,
 * ORCHID_SP_K2048=0 off): mode -1 by the environment, 0 never, 1 whenever the shape matches
 * (K = 2,048, RB 32); returns whether this device and build can run it. _launches: those it took. */
int cuda_skinny_pipe_k2048_force(int mode);
int cuda_skinny_pipe_k2048_launches(void);
/* The direct down launch's compile-time K = 512 instance (two consumer sets; opt-in by
 * ORCHID_SP_K512=1, kept for the H200's A/B): the same modes and counter. */
int cuda_skinny_pipe_k512_force(int mode);
int cuda_skinny_pipe_k512_launches(void);
int cuda_skinny_pipe_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                            const uint16_t *xn, int ldx, const struct cuda_moe_route *r, int RB, uint16_t *act);
int cuda_skinny_pipe_down(const struct cuda_ctx *c, const struct cuda_qmat *down, const uint16_t *act,
                          const struct cuda_moe_route *r, int RB, float *out);
/* cuda_skinny_wide.cu: the dense forms for 9..64 tokens (one k-slice per block, the same
 * sums); cuda_skinny_dense / _multi / _swiglu hand over to it when it takes the launch.
 * ORCHID_NO_WIDE=1 keeps them on cuda_skinny.cu (A/B). */
int cuda_skinny_wide_init(char *err, size_t errlen);
int cuda_skinny_wide_takes_dense(const struct cuda_gemv_seg *segs, int n_segs, int T);
int cuda_skinny_wide_max_rows(void); /* rows of one matrix one launch takes (taller ones go in chunks) */
int cuda_skinny_wide_takes_swiglu(const struct cuda_qmat *gate, int T);
/* test hooks: the looped form (every slice of a tile in one block) by the launch's shape
 * (-1), never (0) or wherever it can run (1) — returns whether it can run on this device;
 * and how many launches it took */
int cuda_skinny_wide_force_loop(int mode);
/* whether this path takes the launch in the looped form, which reads a stage it is given */
int cuda_skinny_wide_reads_stage(const struct cuda_gemv_seg *segs, int n_segs, int T);
int cuda_skinny_wide_loop_launches(void);
int cuda_skinny_wide_dense(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const uint16_t *x, int T,
                           int ldx, const struct cuda_xstage *xs);
int cuda_skinny_wide_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                            const uint16_t *x, int T, int ldx, uint16_t *act, int ld_act);
/* cuda_skinny_tall.cu: a tall matrix (the lm_head) for 2..64 tokens by persistent blocks, the
 * same sums; cuda_skinny_dense hands over to it when it takes the matrix. ORCHID_NO_TALL=1
 * leaves it to the wide form's chunks (A/B). */
int cuda_skinny_tall_init(char *err, size_t errlen); /* (cuda_skinny_init calls it) */
int cuda_skinny_tall_takes(const struct cuda_qmat *m, int T, int ldx);
int cuda_skinny_tall(const struct cuda_ctx *c, const struct cuda_qmat *m, const uint16_t *x, int T, int ldx, float *y,
                     int ldy, int accumulate);
/* Its wgmma form (sm_90a, 17..64 tokens; ORCHID_TL_NOWG=1: off): switched on (where the device
 * takes it) or off, returning the previous state; launches taken so far (tests). */
int cuda_skinny_tall_wg_enable(int on);
int cuda_skinny_tall_wg_launches(void);
/* test hooks: the wgmma form's K = 2,048 instance on (1) or off (0; on by default,
 * ORCHID_TL_K2048=0 off) — returns the previous state — and the launches it took */
int cuda_skinny_tall_k2048_enable(int on);
int cuda_skinny_tall_k2048_launches(void);

/* ---- one token on the tensor cores (cuda_tcv.cu), 4-bit weights; the same sums, in the
 * same order, as the skinny kernels give that token inside a batch ---- */
int cuda_tcv_init(char *err, size_t errlen); /* (cuda_skinny_init calls it) */
int cuda_tcv_supported(const struct cuda_qmat *m);
int cuda_tcv_enabled(void); /* 0 when ORCHID_NO_TCV is set (A/B against the GEMV path) */
/* Up to 4 matrices sharing x (same columns and accumulate flag): y_i (+)= W_i x. */
int cuda_tcv_multi(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const uint16_t *x);
/* y += W x, then the last block normalises y (tail). */
int cuda_tcv_acc_norm(const struct cuda_ctx *c, const struct cuda_qmat *m, const uint16_t *x, float *y,
                      const struct cuda_tail_norm *tail);
/* The GDN decode fusions of one token (cuda_gdn.cu's kernels, same operations): segment 0
 * of cuda_tcv_multi_conv is the conv input (C rows): its epilogue runs the conv step on
 * the session seqs[0] (conv_out, state shift); cuda_tcv_gnorm_acc_norm's input is the
 * gated RMSNorm of y and z (Hv heads of Dv = 128) instead of a bf16 x. */
#define CUDA_TCV_CONV_MAX 4 /* saved conv inputs (kernel size - 1) the fused form holds in registers */
struct cuda_tcv_conv {
    const float *w;             /* conv weights [C][K] */
    const struct cuda_seq *seqs; /* device, [1] */
    int layer_ord, K, C;
    float *out;                 /* conv_out [C] */
    int trigger_late;           /* the launch triggers its PDL dependents after its products, not at
                                 * its start (the GDN scan after it is then launched with PDL) */
};
struct cuda_tcv_gnorm {
    const float *y, *z, *w; /* scan output [Hv·Dv], gate [Hv·Dv], norm weight [Dv] */
    int Hv, Dv;
    float eps;
};
int cuda_tcv_multi_conv(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const uint16_t *x,
                        const struct cuda_tcv_conv *conv);
/* cuda_tcv_multi / _conv (conv may be NULL) with x the RMSNorm of ns->x, computed by every
 * block (no tail before it; ns->xn, if set, gets the bf16 row from block 0). */
int cuda_tcv_multi_norm(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const struct cuda_norm_src *ns,
                        const struct cuda_tcv_conv *conv);
int cuda_tcv_gnorm_acc_norm(const struct cuda_ctx *c, const struct cuda_qmat *m, const struct cuda_tcv_gnorm *gn, float *y,
                            const struct cuda_tail_norm *tail);
/* The pair kernels' contracts (cuda_moe_gateup_pairs / cuda_moe_down_pairs) for T = 1;
 * act rows are pairs (K routed, then the shared expert), ld_act apart. */
int cuda_tcv_moe_supported(const struct cuda_qmat *gate, const struct cuda_qmat *up, const struct cuda_qmat *down,
                           const struct cuda_qmat *sh_gate, const struct cuda_qmat *sh_up, const struct cuda_qmat *sh_down,
                           int K);
/* The gate/up launch may take the token's top-k from the router's logits itself (ts:
 * logits of E experts, renorm as cuda_moe_topk; the router launched without its top-k,
 * cuda_moe_router_topk_norm with counter NULL): the same ids and weights, bit for bit,
 * without the router's one-block tail; it leaves them in ts->ids and ts->w for the down
 * launch (ids then ignored). cuda_tcv_topk_supported: whether the shapes take it. */
struct cuda_topk_src {
    const float *logits;
    int E, renorm;
    int32_t *ids;
    float *w;
};
int cuda_tcv_topk_supported(const struct cuda_qmat *gate, int K, int E);
int cuda_tcv_gateup_pairs(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                          const struct cuda_qmat *sh_gate, const struct cuda_qmat *sh_up, const int32_t *ids,
                          const uint16_t *xn, int K, uint16_t *act, int ld_act, const struct cuda_topk_src *ts);
/* cuda_tcv_down_pairs requests its routed rows before its PDL wait: launch it right after
 * the cuda_tcv_gateup_pairs of the same ids (whose blocks trigger only after their wait, so
 * the ids' writer has finished), or after a synchronisation. */
int cuda_tcv_down_pairs(const struct cuda_ctx *c, const struct cuda_qmat *down, const struct cuda_qmat *sh_down,
                        const int32_t *ids, const float *w, const float *seg, const uint16_t *act, int ld_act, int K,
                        float *x, const struct cuda_tail_norm *tail);

/* Tests: one-token forwards from a CUDA graph (1), launched one by one (0), or as
 * ORCHID_NO_FORWARD_GRAPH says (-1: on unless set). cuda_backend.cu. */
void cuda_backend_force_forward_graph(int on);

/* Checkpoint saves beside the decode stream (cuda_save.cu): a device staging ring of `bytes`
 * and a copy stream. cuda_saver_copy snapshots height rows of width bytes (pitch apart) on
 * `stream` and copies them to host (packed) on the copy stream: 0 queued, 1 too large (copy
 * synchronously instead), < 0 error; host must be pinned for the copy to run beside the
 * stream. cuda_saver_drain: every queued copy has landed. */
struct cuda_saver;
int cuda_saver_create(struct cuda_saver **out, size_t bytes, char *err, size_t errlen);
void cuda_saver_destroy(struct cuda_saver *s);
int cuda_saver_copy(struct cuda_saver *s, cuda_stream_t stream, void *host, const void *dev, size_t width, size_t height,
                    size_t pitch, char *err, size_t errlen);
int cuda_saver_drain(struct cuda_saver *s, char *err, size_t errlen);
/* Tests: checkpoint saves queued beside the stream (1), synchronous (0), or as
 * ORCHID_NO_ASYNC_SAVE says (-1: queued unless set). cuda_backend.cu, cuda_save.cu. */
void cuda_backend_force_async_save(int on);

/* ---- decode-loop helpers ---- */
/* pos[0]++, step[0]++, out_ids[step] = tok[0] (run at the end of a captured decode step) */
int cuda_decode_advance(const struct cuda_ctx *c, int32_t *pos, int32_t *step, const int32_t *tok, int32_t *out_ids);
/* Holds the stream for `us` microseconds (per-op profiling: lets the host queue ahead). */
int cuda_spin(const struct cuda_ctx *c, double us);

/* In-kernel timeline trace (cuda_internal.h, TRACE_*): one record per block. */
#define CUDA_TRACE_SMS 256
typedef struct cuda_trace_rec {
    unsigned long long grid; /* %gridid: one launch */
    unsigned int block;      /* linear block index */
    unsigned int sm;
    unsigned long long t[9]; /* %globaltimer ns: start, before pdl_wait, after it, tail start, marks 4..7,
                              * end (0: none) */
} cuda_trace_rec;
typedef struct cuda_trace_dev {
    cuda_trace_rec *buf;     /* [CUDA_TRACE_SMS][cap_per_sm] */
    unsigned int *n;         /* [CUDA_TRACE_SMS] records taken per SM slot */
    unsigned int cap_per_sm;
} cuda_trace_dev;
/* Starts recording (allocates the buffers; not during graph capture). ST_UNSUPPORTED
 * unless the CUDA sources were built with -DORCHID_TRACE (Makefile: NVCC_EXTRA). */
int cuda_trace_begin(unsigned cap_per_sm, char *err, size_t errlen);
/* Stops recording; *out (malloc'd, caller frees) gets the records, *n their count. */
int cuda_trace_end(cuda_trace_rec **out, size_t *n, char *err, size_t errlen);
/* Kernel launches made so far (trace builds; 0 otherwise): the difference between two
 * calls is the launches of what ran between them. */
unsigned cuda_trace_launch_count(void);

#ifdef __cplusplus
}
#endif

#endif
