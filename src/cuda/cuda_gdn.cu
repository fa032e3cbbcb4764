// cuda/cuda_gdn.cu — Gated DeltaNet: causal depthwise conv1d + SiLU (reading and then
// advancing each session's conv state), the gated delta-rule recurrence in fp32, and
// the gated RMSNorm. The scan is sequential over tokens and parallel over (value
// head, value row): value rows of the state are independent, so a row of Dk floats
// lives in the registers of Dk/8 lanes; per token each lane does 8 MACs three times
// (in two independent chains) and two Dk/8-lane reductions. q/k l2-normalisation and the α/β gates are computed per
// chunk of 32 tokens into shared memory by the same block.
#include <limits.h>
#include <math.h>

#include "cuda/cuda_internal.h"

/* PDL (every kernel here): trigger at the start; wait before the first read of
 * activations, seqs or state (the early exits come after it). Only gdn_scan reads
 * anything first: its per-head constants A_log and dt_bias (and it is launched without
 * the attribute: see cuda_gdn_scan). */

/* ---- conv1d ---- */

/* A thread per (channel, run of CONV_RUN consecutive tokens): the window of the K − 1
 * inputs before each token slides along in registers, so every input is read once (a
 * thread per output read each K times and divided its index by C: 263 µs a GDN layer at
 * 4,096 tokens on the H200). A token whose sequence differs from the previous token's
 * (a packed batch) reloads its window from that sequence's inputs and state. The terms
 * are summed in the same order as before: fmaf over j = 0..K−1 from 0. */
#define CONV_RUN 16
/* The window before token t: inputs t − K + 1 .. t − 1 of sequence sq (its conv state for
 * those before the sequence's first token in the batch, sq.t0). */
template <int K>
__device__ __forceinline__ void conv_window(const float *qkv, const cuda_seq &sq, int layer_ord, int C, int c, int t,
                                            float (&win)[K]) {
    const float *st = sq.conv + (size_t)layer_ord * (K - 1) * C;
#pragma unroll
    for (int j = 0; j < K - 1; j++) {
        const int tp = t - (K - 1) + j;
        win[j] = tp >= sq.t0 ? qkv[(size_t)tp * C + c] : st[(size_t)((K - 1) - (sq.t0 - tp)) * C + c];
    }
}
/* One token: its input x completes the window, silu(Σ_j w_j·win_j) (fmaf from 0, j in
 * order) goes to *o, and the window slides by one. */
template <int K>
__device__ __forceinline__ void conv_step(const float (&wk)[K], float (&win)[K], float x, float *o) {
    win[K - 1] = x;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; j++) acc = fmaf(wk[j], win[j], acc);
    *o = silu(acc);
#pragma unroll
    for (int j = 0; j < K - 1; j++) win[j] = win[j + 1];
}
template <int K>
static __global__ void conv1d_run_kernel(const float *qkv, const float *w, const int32_t *tok_seq, const cuda_seq *seqs,
                                         int layer_ord, int T, int C, float *out) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int t0 = blockIdx.y * CONV_RUN, t1 = min(T, t0 + CONV_RUN);
    if (c >= C) return;
    float wk[K], win[K];
#pragma unroll
    for (int j = 0; j < K; j++) wk[j] = w[(size_t)c * K + j];
    if (t1 - t0 == CONV_RUN && tok_seq[t0] == tok_seq[t1 - 1]) {
        /* a whole run of one sequence (its tokens are consecutive in the batch): the run's
         * inputs requested together, then the same sums (one load in flight a thread made
         * the launch wait on DRAM latency; H100, session 42: 131 → 96 µs a GDN layer for a
         * 4,096-token prompt, 133 → 97 for a pack of 8 × 512) */
        float x[CONV_RUN];
#pragma unroll
        for (int i = 0; i < CONV_RUN; i++) x[i] = qkv[(size_t)(t0 + i) * C + c];
        conv_window<K>(qkv, seqs[tok_seq[t0]], layer_ord, C, c, t0, win);
#pragma unroll
        for (int i = 0; i < CONV_RUN; i++) conv_step<K>(wk, win, x[i], out + (size_t)(t0 + i) * C + c);
        return;
    }
    for (int t = t0, cur = -1; t < t1; t++) {
        const int q = tok_seq[t];
        if (q != cur) { /* (re)load the window: this token's sequence differs from the previous one's */
            cur = q;
            conv_window<K>(qkv, seqs[q], layer_ord, C, c, t, win);
        }
        conv_step<K>(wk, win, qkv[(size_t)t * C + c], out + (size_t)t * C + c);
    }
}

/* Any kernel size (1..16): a thread per output. */
static __global__ void conv1d_kernel(const float *qkv, const float *w, const int32_t *tok_seq, const cuda_seq *seqs,
                                     int layer_ord, int T, int C, int K, float *out) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait();
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    const int t = (int)(i / C), c = (int)(i % C);
    const cuda_seq s = seqs[tok_seq[t]];
    const float *st = s.conv + (size_t)layer_ord * (K - 1) * C;
    float acc = 0.0f;
    for (int j = 0; j < K; j++) {
        const int tp = t - (K - 1) + j;
        float xin;
        if (tp >= s.t0) xin = qkv[(size_t)tp * C + c];
        else xin = st[(size_t)((K - 1) - (s.t0 - tp)) * C + c];
        acc = fmaf(w[(size_t)c * K + j], xin, acc);
    }
    out[i] = silu(acc);
}

static __global__ void conv_state_kernel(const float *qkv, const cuda_seq *seqs, int layer_ord, int C, int K) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait(); /* also orders its state writes after conv1d_kernel's state reads */
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const cuda_seq s = seqs[blockIdx.y];
    float *st = s.conv + (size_t)layer_ord * (K - 1) * C;
    const int n = s.t1 - s.t0;
    float nv[16];
    for (int i = 0; i < K - 1; i++) {
        const int tp = s.t1 - (K - 1) + i; /* absolute batch index of the raw input kept in row i */
        nv[i] = tp >= s.t0 ? qkv[(size_t)tp * C + c] : st[(size_t)(i + n) * C + c];
    }
    for (int i = 0; i < K - 1; i++) st[(size_t)i * C + c] = nv[i];
}

/* One token per sequence (decode): conv and state update in one pass, a thread per
 * (sequence, channel). KK > 0: the kernel size known at compile time (the model's 4), so
 * the window lives in registers and its loads are issued together; KK = 0: K at run time
 * (the window in local memory: 12.5 µs at 64 sequences on the H200). Same order of terms. */
template <int KK>
static __global__ void conv1d_step_kernel(const float *qkv, const float *w, const cuda_seq *seqs, int layer_ord, int T,
                                          int C, int K_rt, float *out) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait();
    constexpr int KMAX = KK > 0 ? KK : 16;
    const int K = KK > 0 ? KK : K_rt;
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    const int t = (int)(i / C), c = (int)(i % C);
    const cuda_seq s = seqs[t];
    float *st = s.conv + (size_t)layer_ord * (K - 1) * C + c;
    float win[KMAX];
#pragma unroll
    for (int j = 0; j < KMAX - 1; j++)
        if (j < K - 1) win[j] = st[(size_t)j * C];
    win[K - 1] = qkv[(size_t)s.t0 * C + c];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < KMAX; j++)
        if (j < K) acc = fmaf(w[(size_t)c * K + j], win[j], acc);
    out[(size_t)s.t0 * C + c] = silu(acc);
#pragma unroll
    for (int j = 0; j < KMAX - 1; j++)
        if (j < K - 1) st[(size_t)j * C] = win[j + 1];
}

extern "C" int cuda_conv1d(const struct cuda_ctx *c, const float *qkv, const float *w, const int32_t *tok_seq,
                           const struct cuda_seq *seqs, int n_seqs, int layer_ord, int T, int C, int K, float *out) {
    if (T <= 0) return 0;
    if (K < 1 || K > 16) return errorf(c->err, c->errlen, ST_UNSUPPORTED, "conv1d: kernel size %d", K);
    const size_t n = (size_t)T * C;
    if (T == n_seqs) { /* one token per sequence: fused conv + state step */
        if (K == 4)
            LAUNCH_CHECK_RC(c, launch_k(conv1d_step_kernel<4>, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, cstream(c), qkv,
                                        w, seqs, layer_ord, T, C, K, out),
                            "conv1d_step");
        LAUNCH_CHECK_RC(c, launch_k(conv1d_step_kernel<0>, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, cstream(c), qkv, w,
                                    seqs, layer_ord, T, C, K, out),
                        "conv1d_step");
    }
    if (K == 4)
        LAUNCH_TRY(c, launch_k(conv1d_run_kernel<4>, dim3((unsigned)((C + 127) / 128), (unsigned)((T + CONV_RUN - 1) / CONV_RUN)),
                               dim3(128), 0, cstream(c), qkv, w, tok_seq, seqs, layer_ord, T, C, out),
                   "conv1d");
    else
        LAUNCH_TRY(c, launch_k(conv1d_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, cstream(c), qkv, w, tok_seq,
                               seqs, layer_ord, T, C, K, out),
                   "conv1d");
    LAUNCH_CHECK_RC(c, launch_k(conv_state_kernel, dim3((C + 255) / 256, n_seqs), dim3(256), 0, cstream(c), qkv, seqs,
                                layer_ord, C, K),
                    "conv_state");
}

/* ---- recurrence ---- */

#define GDN_CH 32 /* tokens a chunk (CH) of the general form */

/* Lanes per value row LPR = DK/8 (each lane holds 8 state elements of a row in two float4
 * runs, j = 4·sub + 4·LPR·u + 0..3, so a warp's shared-memory float4 reads are
 * contiguous); each thread carries RPT rows, 256/LPR apart: rows per block = RPT·256/LPR.
 * RPT = 2 for batches of several sequences: each block's chain of round trips (sequence,
 * state, q/k, barrier, update, store) then moves twice the state (H200, 64 sequences:
 * ~4 µs a block of 16 rows, ~5 resident an SM, 2.1 TB/s). Each row's arithmetic is the
 * same for either RPT: the same bits. CH: tokens a chunk staged in shared memory — GDN_CH,
 * or 1 where every sequence brings one token (decode: 41 KB of chunk buffers held for one
 * token capped the blocks an SM); the same per-token steps either way. */
template <int DK, int RPT, int CH>
static __global__ void __launch_bounds__(256) gdn_scan_kernel(const float *conv_out, const float *ga, const float *gb,
                                                              int ldab, const float *A_log, const float *dt_bias,
                                                              const cuda_seq *seqs, int layer_ord, int Hk, int Hv,
                                                              int Dv, float *y) {
    TRACE_KERNEL();
    constexpr int LPR = DK / 8, TROWS = 256 / LPR, ROWS = RPT * TROWS;
    __shared__ __align__(16) float qs[CH][DK];
    __shared__ __align__(16) float ks[CH][DK];
    __shared__ float vs[CH][ROWS];
    __shared__ float ys[CH][ROWS];
    __shared__ float al[CH], be[CH];
    pdl_trigger();
    const int rblocks = (Dv + ROWS - 1) / ROWS;
    const int h = blockIdx.x / rblocks, rb = blockIdx.x % rblocks;
    const int kh = h / (Hv / Hk);
    const float A = __expf(A_log[h]), dtb = dt_bias[h]; /* weights: before the wait */
    /* The sequence and its state rows are read before the wait too: the previous kernel (the
     * in-projection, or the conv) writes neither — the state is this layer's, last written by
     * this kernel a whole step ago, and the sequences are the batch's metadata, uploaded
     * before the forward — so with the PDL launch (cuda_gdn_scan) the state is in flight while
     * the in-projection finishes. */
    const cuda_seq s = seqs[blockIdx.y];
    const int C = 2 * Hk * DK + Hv * Dv, key_dim = Hk * DK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rloc0 = tid / LPR, sub = tid % LPR;
    float *S[RPT];
    bool row_ok[RPT];
    float st[RPT][8];
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        const int row = rb * ROWS + rloc0 + i * TROWS;
        row_ok[i] = row < Dv;
        S[i] = s.state + (((size_t)layer_ord * Hv + h) * Dv + (row_ok[i] ? row : 0)) * DK;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const float4 v4 =
                row_ok[i] ? *reinterpret_cast<const float4 *>(S[i] + 4 * LPR * u + 4 * sub) : make_float4(0, 0, 0, 0);
            st[i][4 * u] = v4.x; st[i][4 * u + 1] = v4.y; st[i][4 * u + 2] = v4.z; st[i][4 * u + 3] = v4.w;
        }
    }
    const float qscale = rsqrtf((float)DK);
    pdl_wait();

    for (int c0 = s.t0; c0 < s.t1; c0 += CH) {
        const int n = min(CH, s.t1 - c0);
        __syncthreads();
        /* per token (one warp each): l2-normalise q and k into shared memory, stage v and the
         * gates. (A variant where all threads first copied the raw chunk and then normalised
         * in shared memory measured slower on the H200: 86 ms against 55 ms per 4096-token
         * prefill, docs/PERFORMANCE.md.)
         * Where a block scans one token (CH = 1: batched decode) its four parts go to four
         * warps — q, k, v, the gates — instead of one warp in turn: the whole staging chain
         * after the PDL wait was one warp's (H200, 64 sequences: scan 88.0 -> 76.7 µs a
         * layer). The chunked form keeps one warp a token: with the split its batch-1
         * decode measured slower (549 -> 510 tok/s at 512, cause not found; its 48 -> 40
         * registers let 6 blocks an SM in place of 5). Same arithmetic either way. */
        if constexpr (CH == 1) {
            const float *row_in = conv_out + (size_t)c0 * C;
            if (warp < 2) /* q (scaled by 1/√DK) or k */
                gdn_l2norm_warp<DK>(row_in + (warp ? key_dim : 0) + kh * DK, warp ? ks[0] : qs[0], warp ? 1.0f : qscale,
                                    lane);
            else if (warp == 2) {
                for (int r = lane; r < ROWS; r += 32) {
                    const int rr = rb * ROWS + r;
                    vs[0][r] = rr < Dv ? row_in[2 * key_dim + h * Dv + rr] : 0.0f;
                }
            } else if (warp == 3 && lane == 0) {
                const float2 g = gdn_gates(ga[(size_t)c0 * ldab + h], gb[(size_t)c0 * ldab + h], dtb, A);
                al[0] = g.x;
                be[0] = g.y;
            }
        } else {
            for (int tt = warp; tt < n; tt += 8) {
                const float *row_in = conv_out + (size_t)(c0 + tt) * C;
                /* The token's v rows and gates are requested with its q and k, unpredicated
                 * (clamped indices, the extra values dropped), so all of the warp's loads are
                 * one L2 round trip: after the norms, v and then the gates were two more on
                 * every layer's chain at batch 1 (docs/ARCHITECTURE.md, trap 47). */
                constexpr int VR = (ROWS + 31) / 32;
                float vv[VR];
#pragma unroll
                for (int u = 0; u < VR; u++)
                    vv[u] = row_in[2 * key_dim + h * Dv + min(rb * ROWS + min(lane + 32 * u, ROWS - 1), Dv - 1)];
                const float ga_t = ga[(size_t)(c0 + tt) * ldab + h], gb_t = gb[(size_t)(c0 + tt) * ldab + h];
                float sq = 0.0f, sk = 0.0f;
                for (int j = lane; j < DK; j += 32) {
                    const float q = row_in[kh * DK + j], k = row_in[key_dim + kh * DK + j];
                    sq += q * q;
                    sk += k * k;
                }
                sq = warp_sum(sq);
                sk = warp_sum(sk);
                const float iq = rsqrtf(sq + 1e-6f) * qscale, ik = rsqrtf(sk + 1e-6f);
                for (int j = lane; j < DK; j += 32) {
                    qs[tt][j] = row_in[kh * DK + j] * iq;
                    ks[tt][j] = row_in[key_dim + kh * DK + j] * ik;
                }
#pragma unroll
                for (int u = 0; u < VR; u++) {
                    const int r = lane + 32 * u;
                    if (r < ROWS) vs[tt][r] = rb * ROWS + r < Dv ? vv[u] : 0.0f;
                }
                const float2 g = gdn_gates(ga_t, gb_t, dtb, A); /* on every lane: its loads are not sunk into a branch */
                if (lane == 0) {
                    al[tt] = g.x;
                    be[tt] = g.y;
                }
            }
        }
        __syncthreads();
        for (int tt = 0; tt < n; tt++)
#pragma unroll
            for (int i = 0; i < RPT; i++) {
                const int rl = rloc0 + i * TROWS;
                const float o = gdn_token<LPR>(st[i], ks[tt], qs[tt], sub, vs[tt][rl], al[tt], be[tt]);
                if (sub == 0) ys[tt][rl] = o;
            }
        __syncthreads();
        for (int i = tid; i < n * ROWS; i += blockDim.x) {
            const int tt = i / ROWS, r = i % ROWS;
            if (rb * ROWS + r < Dv) y[(size_t)(c0 + tt) * Hv * Dv + (size_t)h * Dv + rb * ROWS + r] = ys[tt][r];
        }
    }
#pragma unroll
    for (int i = 0; i < RPT; i++)
        if (row_ok[i]) {
#pragma unroll
            for (int u = 0; u < 2; u++)
                *reinterpret_cast<float4 *>(S[i] + 4 * LPR * u + 4 * sub) =
                    make_float4(st[i][4 * u], st[i][4 * u + 1], st[i][4 * u + 2], st[i][4 * u + 3]);
        }
}

/* The scan instance for key dim DK, rows a thread and tokens a chunk (NULL: none). */
typedef void (*gdn_scan_fn)(const float *, const float *, const float *, int, const float *, const float *, const cuda_seq *,
                            int, int, int, int, float *);
template <int DK>
static gdn_scan_fn gdn_scan_pick(int rpt, bool one) {
    if (one) return rpt == 4 ? gdn_scan_kernel<DK, 4, 1> : rpt == 2 ? gdn_scan_kernel<DK, 2, 1> : gdn_scan_kernel<DK, 1, 1>;
    return rpt == 2 ? gdn_scan_kernel<DK, 2, GDN_CH> : gdn_scan_kernel<DK, 1, GDN_CH>;
}

extern "C" int cuda_gdn_scan(const struct cuda_ctx *c, const float *conv_out, const float *a, const float *b, int ldab,
                             const float *A_log, const float *dt_bias, const struct cuda_seq *seqs, int n_seqs,
                             int layer_ord, int Hk, int Hv, int Dk, int Dv, int one_token, int pdl, float *y) {
    if (n_seqs <= 0) return 0;
    if (Hv % Hk) return errorf(c->err, c->errlen, ST_UNSUPPORTED, "gdn: %d value heads over %d key heads", Hv, Hk);
    /* Rows a thread for several sequences: 4 where every sequence brings one token (the
     * one-token instance: 78 registers, 3 blocks an SM × 64 rows in flight against 4 × 32;
     * H200, 64 sequences: 94.4 µs a layer chunked, 93.8 one-token with 2 rows, 89.3 with 4),
     * else 2. One sequence keeps the chunked form with one row a thread (its 256 blocks are
     * not limited by residency; batch-1 decode was measured with it). A/B: ORCHID_GDN_RPT=1,
     * 2 or 4 (4 only for one-token batches); ORCHID_GDN_CH1=0 keeps the chunked form for
     * those too, ORCHID_GDN_CH1=all takes the one-token instance for one sequence as well. */
    static const int rpt_env = [] {
        const char *e = getenv("ORCHID_GDN_RPT");
        return e && !strcmp(e, "1") ? 1 : e && !strcmp(e, "2") ? 2 : e && !strcmp(e, "4") ? 4 : 0;
    }();
    static const int ch1_min = [] { /* fewest sequences for the one-token instance */
        const char *e = getenv("ORCHID_GDN_CH1");
        return e && !strcmp(e, "0") ? INT_MAX : e && !strcmp(e, "all") ? 1 : 2;
    }();
    const bool one = one_token && n_seqs >= ch1_min;
    int rpt = n_seqs < 2 ? 1 : rpt_env ? rpt_env : one ? 4 : 2;
    if (rpt == 4 && !one) rpt = 2;
    const int rows = rpt * 256 / (Dk / 8);
    const dim3 grid(Hv * ((Dv + rows - 1) / rows), n_seqs);
    const gdn_scan_fn kern = Dk == 128 ? gdn_scan_pick<128>(rpt, one)
                             : Dk == 64 ? gdn_scan_pick<64>(rpt, one)
                             : Dk == 32 ? gdn_scan_pick<32>(rpt, one)
                                        : NULL;
    if (!kern) return errorf(c->err, c->errlen, ST_UNSUPPORTED, "gdn: key head dim %d (32, 64 or 128)", Dk);
    /* Launched without the PDL attribute (it still triggers, so gated_norm after it may
     * start early): scheduled early, its long-lived latency-bound blocks land on whatever
     * SMs the previous kernel's last blocks leave free, unevenly, and run slower there —
     * measured on the H200 (when prefill still used this kernel): prefill at 4,096 tokens
     * 214 -> 256 ms with it, and batch-1 decode 2.94 ms per token without it, 2.98 with.
     * With `pdl` the caller's previous launch triggers only after its products (the one-token
     * in-projection, cuda_tcv_conv.trigger_late), so this grid is scheduled as that one's
     * blocks finish, and its sequence and state reads come before its wait: H200, batch-1
     * decode at 512 536.4 -> 544.9 tok/s (the PDL launch with the early trigger: 531.9). */
    LAUNCH_CHECK_RC(c, launch_k_pdl(pdl != 0, kern, grid, dim3(256), 0, cstream(c), conv_out, a, b, ldab, A_log, dt_bias, seqs, layer_ord,
                                Hk, Hv, Dv, y),
                    "gdn_scan");
}

/* ---- gated RMSNorm ---- */

static __global__ void gated_norm_kernel(const float *y, const float *z, int ldz, const float *w, int Hv, int Dv, float eps,
                                         uint16_t *out) {
    TRACE_KERNEL();
    __shared__ float sh[32];
    pdl_trigger();
    pdl_wait();
    const int t = blockIdx.x, h = blockIdx.y;
    const float *yr = y + (size_t)t * Hv * Dv + (size_t)h * Dv;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) ss += yr[d] * yr[d];
    ss = block_sum(ss, sh);
    const float inv = rsqrtf(ss / (float)Dv + eps);
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        const float zz = z[(size_t)t * ldz + (size_t)h * Dv + d];
        out[(size_t)t * Hv * Dv + (size_t)h * Dv + d] = f2bf(w[d] * yr[d] * inv * silu(zz));
    }
}

/* Dv = 128: a warp per (token, head), eight a block — the 128-thread blocks above were
 * 131,072 launches' worth of block start-up at 4,096 tokens (162 µs a layer on the H200).
 * gnorm128_warp reproduces their block_sum order, so the bits are the same. */
static __global__ void gated_norm128_kernel(const float *y, const float *z, int ldz, const float *w, int T, int Hv,
                                            float eps, uint16_t *out) {
    TRACE_KERNEL();
    pdl_trigger();
    float wv[4];
    gnorm128_gains(w, wv);
    pdl_wait();
    const int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (item >= T * Hv) return;
    const int t = item / Hv, h = item - t * Hv;
    const float *yr = y + (size_t)item * 128;
    const float *zr = z + (size_t)t * ldz + (size_t)h * 128;
    float yv[4], zv[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        yv[i] = yr[32 * i + lane];
        zv[i] = zr[32 * i + lane];
    }
    gnorm128_warp(yv, zv, wv, eps, out + (size_t)item * 128);
}

extern "C" int cuda_gated_norm(const struct cuda_ctx *c, const float *y, const float *z, int ldz, const float *w, int T,
                               int Hv, int Dv, float eps, uint16_t *out) {
    if (T <= 0) return 0;
    if (Dv == 128)
        LAUNCH_CHECK_RC(c, launch_k(gated_norm128_kernel, dim3((unsigned)((T * Hv + 7) / 8)), dim3(256), 0, cstream(c), y, z,
                                    ldz, w, T, Hv, eps, out),
                        "gated_norm");
    int threads = Dv < 128 ? ((Dv + 31) / 32) * 32 : 128;
    LAUNCH_CHECK_RC(c, launch_k(gated_norm_kernel, dim3(T, Hv), dim3(threads), 0, cstream(c), y, z, ldz, w, Hv, Dv, eps, out),
                    "gated_norm");
}

CUDA_TRACE_TU(gdn)
