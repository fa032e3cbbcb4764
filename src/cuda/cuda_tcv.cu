// cuda/cuda_tcv.cu — one token × 4-bit MLX weights on the tensor cores: the decode step's
// projections (several matrices per launch, optionally adding into the residual and then
// normalising it), the lm_head row, and the MoE's per-token expert pairs (gate/up with
// SwiGLU; down with the routing weights, the shared expert and the residual add).
//
// Why: the CUDA-core GEMV (cuda_gemv.cu) spends ~4 instructions per weight (shift, mask,
// magic-number convert, FMA) plus the bf16 → fp32 unpacking of x; here two codes cost one
// mask, one OR and one bf16x2 subtract (cuda_mma.h) and 256 multiply-adds one mma.sync.
// Measured on the H200 that bought less than predicted (the decode kernels are bound by
// dependent round trips, not instructions: docs/PERFORMANCE.md, session 3) — lm_head
// 192 → 148 µs, decode +2 % — but it gives a token the same bits as in a batch, and its
// epilogue/prologue carry the GDN fusions (conv step; gated norm).
//
// Layout (the same as cuda_skinny.cu's, on purpose): a block is 8 warps = MT m-tiles of 16
// rows × KS k-slices (gate/up: half the m-tiles gate rows, half up), KS =
// cuda_skinny_kslices(K), so each warp owns GPW = G/KS of the G quantisation groups of
// its rows. Every lane issues all of its weight loads (codes: 8 bytes per row per group,
// rows g and g + 8; scales and biases: one vector load per row) before it waits for the
// previous kernel (PDL), so a whole layer's matrix is in flight at once. The MoE pair
// kernels copy each warp's tile into shared memory by cp.async instead (whole rows a
// request: the routed gate/up rows are asked for only after the router's ids, where the
// fragment loads' 8 rows a request made the L1 the bottleneck); the dense form keeps the
// fragments in registers (tiles in shared memory measured slower there: session 13). The B operand holds x in all 8 columns; the
// lanes with c = 0 keep column 0. Per group: acc += fmaf(s, Σ(128+q)x, (b-128s)·Σx) in group order;
// the k-slices meet in shared memory summed in slice order from 0 — the exact sequence of
// cuda_skinny.cu for one token, so a token gets the same bits here (batch of one) as in a
// 2..64-token batch there (tests/gpu/test_cuda_ops.c checks it).
#include "cuda/cuda_mma.h"
#include "cuda/cuda_topk.h"

#define TCV_MAXSEG 4
/* Shared memory kept back from the device's per-block opt-in for a kernel's static shared
 * memory (the trace build's marks) when the tiled pair kernels raise their limit. */
#define TCV_STATIC_SMEM 1024

/* tcv_mma, tcv_mma_to_red, tcv_stage, tcv_mma_smem: cuda_mma.h. */

/* Shared memory of a launch: xs [n][K] bf16, xsum [n][G] fp32, red [warps][16] fp32; the
 * dense kernel also the conv windows of its epilogue threads [64][2·CUDA_TCV_CONV_MAX]. */
__host__ __device__ static size_t tcv_smem(int n, int K, int warps) {
    return (size_t)n * K * 2 + (size_t)n * (K / QGROUP) * 4 + (size_t)warps * 16 * 4;
}
static size_t tcv_dense_smem(int K) { return tcv_smem(1, K, 8) + (size_t)64 * 2 * CUDA_TCV_CONV_MAX * 4; }

/* ---- dense: up to 4 matrices sharing x, y = W x or y += W x, optional tail norm ---- */

struct tcv_args {
    cuda_qmat w[TCV_MAXSEG];
    float *y[TCV_MAXSEG];
    int blk0[TCV_MAXSEG + 1];
    int nseg, accumulate;
    const uint16_t *x;
    cuda_tail_norm tail; /* counter != NULL: one accumulating matrix, normalise y after */
    cuda_tcv_conv conv;  /* w != NULL: segment 0's rows go through the decode conv step */
    cuda_tcv_gnorm gn;   /* y != NULL: x is the gated RMSNorm of gn.y, gn.z (not a.x) */
    cuda_norm_src ns;    /* x != NULL: x is the RMSNorm of ns.x, by every block (not a.x) */
    int trig_late;       /* PDL trigger after the products (else at the start) */
};

/* Segment 0's epilogue for the GDN in-projection of one token: row r is conv channel r,
 * conv_out[r] = silu(Σ_j w[r][j]·win[j]) over the K-1 saved inputs and this one, and the
 * window shifts — the same operations as cuda_gdn.cu's conv1d_step_kernel for T = 1.
 * win[0..K-2] and the weights are copied to shared memory (cp.async) before pdl_wait by
 * the caller (the previous kernel writes neither: the state is this layer's, last
 * written a whole step ago). */
__device__ __forceinline__ void tcv_conv_row(const cuda_tcv_conv &cv, int r, float v, const float *win, const float *cw) {
    const cuda_seq &sq = cv.seqs[0];
    float *st = sq.conv + (size_t)cv.layer_ord * (cv.K - 1) * cv.C + r;
    float acc = 0.0f;
    for (int j = 0; j < cv.K - 1; j++) acc = fmaf(cw[j], win[j], acc);
    acc = fmaf(cw[cv.K - 1], v, acc);
    cv.out[(size_t)sq.t0 * cv.C + r] = silu(acc);
    for (int j = 0; j + 1 < cv.K - 1; j++) st[(size_t)j * cv.C] = win[j + 1];
    st[(size_t)(cv.K - 2) * cv.C] = v;
}

/* Stages x = the gated RMSNorm of one token (cuda_gdn.cu's gated_norm_kernel, whose
 * 128-thread block_sum this reproduces per warp: four warp sums over d = 32·i + lane,
 * then a warp sum of them in lanes 0..3), bf16, into xs; then the group sums. */
__device__ __forceinline__ void tcv_stage_gnorm(const cuda_tcv_gnorm &gn, const float (&wv)[4], int K, uint16_t *xs,
                                                float *xsum) {
    constexpr int HW = 4; /* heads a warp holds at once: their y and z loads issue together */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int h0 = 0; h0 < gn.Hv; h0 += HW * nw) {
        float yv[HW][4], zv[HW][4];
#pragma unroll
        for (int j = 0; j < HW; j++) {
            const int h = h0 + j * nw + warp;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                yv[j][i] = h < gn.Hv ? gn.y[(size_t)h * 128 + 32 * i + lane] : 0.0f;
                zv[j][i] = h < gn.Hv ? gn.z[(size_t)h * 128 + 32 * i + lane] : 0.0f;
            }
        }
#pragma unroll
        for (int j = 0; j < HW; j++) {
            const int h = h0 + j * nw + warp;
            if (h >= gn.Hv) continue; /* warp-uniform */
            gnorm128_warp(yv[j], zv[j], wv, gn.eps, xs + h * 128);
        }
    }
    trace_mark(TRACE_MARK6); /* (warp 0's) normalised heads written: before the barrier and group sums */
    __syncthreads();
    sk_group_sums<true>(xs, 1, K, K / QGROUP, xsum); /* and rearranged, as tcv_stage */
    __syncthreads();
}

/* Stages x = the RMSNorm of ns.x (every block computes it: norm_src_row, the tail's bits),
 * bf16, into xs; then the group sums. g: the gains, read before the wait. */
__device__ __forceinline__ void tcv_stage_norm(const cuda_norm_src &ns, int K, const float (&g)[NS_REG], uint16_t *xs,
                                               float *xsum) {
    norm_src_row(ns, K, g, [&](int i, float o) { xs[i] = f2bf(o); });
    trace_mark(TRACE_MARK6); /* normalised values written: before the barrier and group sums */
    __syncthreads();
    sk_group_sums<true>(xs, 1, K, K / QGROUP, xsum); /* and rearranged, as tcv_stage */
    __syncthreads();
}

/* How the input is staged: a.x as given, the gated norm of a.gn (tcv_stage_gnorm), or the
 * RMSNorm of a.ns (tcv_stage_norm); separate instances, so neither's registers count
 * against the plain launches. */
enum { TCV_X = 0, TCV_GNORM = 1, TCV_NORM = 2 };
template <int GPW, int STAGE>
static __global__ void __launch_bounds__(256, GPW == 16 ? 1 : 3) tcv_dense_kernel(tcv_args a) {
    TRACE_KERNEL();
    extern __shared__ __align__(16) unsigned char sm[];
    if (!a.trig_late) pdl_trigger();
    int s = 0, blk = blockIdx.x;
    while (s + 1 < a.nseg && blk >= a.blk0[s + 1]) s++;
    blk -= a.blk0[s];
    const cuda_qmat m = a.w[s];
    /* KS and MT are powers of two (KS·MT = the block's warps): shifts, not runtime divisions,
     * on the way to the weight loads */
    const int K = m.cols, G = K / QGROUP, KS = G / GPW, lmt = __ffs((int)(blockDim.x >> 5)) - __ffs(KS), MT = 1 << lmt;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, c = lane & 3;
    const int mt = warp & (MT - 1), ks = warp >> lmt;
    const int r0 = (blk * MT + mt) * 16 + gq;
    tcv_w<GPW> w;
    tcv_load<GPW>(m, (size_t)r0, r0 < m.rows, r0 + 8 < m.rows, ks * GPW, c, w);
    /* conv epilogue: the row's saved window and weights, early (see tcv_conv_row) */
    const bool conv = s == 0 && a.conv.w && (int)threadIdx.x < MT * 16;
    const int crow = (blk * MT + (int)threadIdx.x / 16) * 16 + (int)threadIdx.x % 16;
    uint16_t *xs = reinterpret_cast<uint16_t *>(sm);
    float *xsum = reinterpret_cast<float *>(sm + (size_t)K * 2), *red = xsum + G;
    float *cvs = red + 8 * 16 + (int)threadIdx.x * 2 * CUDA_TCV_CONV_MAX; /* this thread's window, then weights */
    if (conv && crow < m.rows) { /* asynchronous copies: no registers held over the main loop */
        const float *st = a.conv.seqs[0].conv + (size_t)a.conv.layer_ord * (a.conv.K - 1) * a.conv.C + crow;
        for (int j = 0; j < a.conv.K - 1; j++) cpa4(cvs + j, st + (size_t)j * a.conv.C);
        for (int j = 0; j < a.conv.K; j++) cpa4(cvs + CUDA_TCV_CONV_MAX + j, a.conv.w + (size_t)crow * a.conv.K + j);
        cpa_commit();
    }
    float g[NS_REG], gw[4]; /* the norms' gains, before the wait */
    if (STAGE == TCV_NORM) rms_row_load<NS_REG, false>(a.ns.gain, K, g);
    if (STAGE == TCV_GNORM) gnorm128_gains(a.gn.w, gw);
    pdl_wait();
    if (STAGE == TCV_GNORM) tcv_stage_gnorm(a.gn, gw, K, xs, xsum);
    else if (STAGE == TCV_NORM) tcv_stage_norm(a.ns, K, g, xs, xsum);
    else tcv_stage(a.x, K, 1, K, xs, xsum);
    trace_mark(TRACE_MARK4); /* x staged */
    tcv_mma_to_red<GPW>(w, xs, xsum, ks * GPW, red);
    trace_mark(TRACE_MARK5); /* products in shared memory */
    if (a.trig_late) pdl_trigger();
    if ((int)threadIdx.x < MT * 16) {
        const int mm = threadIdx.x / 16, i = threadIdx.x % 16;
        const float v = tcv_slice_sum(red, KS, MT, mm, i);
        const int r = (blk * MT + mm) * 16 + i;
        if (r < m.rows) {
            float *dst = a.y[s] + r;
            *dst = a.accumulate ? *dst + v : v;
            if (conv) {
                cpa_wait<0>();
                tcv_conv_row(a.conv, r, a.accumulate ? *dst : v, cvs, cvs + CUDA_TCV_CONV_MAX);
            }
        }
    }
    if (a.tail.counter && last_block_done(a.tail.counter)) tail_rmsnorm(a.y[0], 0, 1, a.w[0].rows, a.tail);
}

/* Groups per warp for K columns (0: not supported here). */
static int tcv_gpw(int K) {
    const int ks = cuda_skinny_kslices(K), G = K / QGROUP;
    if (!ks || G % ks) return 0;
    const int gpw = G / ks;
    return gpw == 4 || gpw == 8 || gpw == 16 ? gpw : 0;
}

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" int cuda_tcv_supported(const struct cuda_qmat *m) {
    return m->bits == 4 && m->cols % QGROUP == 0 && tcv_gpw(m->cols) != 0 && al16(m->codes) && al16(m->scales) &&
           al16(m->biases);
}

extern "C" int cuda_tcv_enabled(void) {
    static const bool off = env_flag("ORCHID_NO_TCV");
    return !off;
}

/* ---- tall matrices (the lm_head: 248,320 rows, 7,760 tiles of 32 rows): persistent
 * blocks (as many as fit, 2 per SM) stream tile after tile through a TCV_STAGES-deep ring
 * of cp.async copies in shared memory (tcv_tile_async): the next tile is in flight while
 * this one is multiplied; the dense kernel's 20 waves of blocks each loaded, waited,
 * computed and left (lm_head 145 µs, 2.0 TB/s; one block per SM with 4 stages: 110 µs,
 * the 8 warps' multiply then bounds it). Per row the same warps, groups and slice order
 * as tcv_dense_kernel (tcv_mma_smem): the same bits. ---- */
#define TCV_STAGES 2
#define TCV_STREAM_MIN_TILES 1024 /* below this, one or a few waves of tcv_dense_kernel */

static int tcv_stream_grid[2] = {0, 0}; /* cuda_tcv_init: resident blocks of the GPW 4 / 8 forms (0: off) */

/* xs, xsum, red of one token and 8 warps (tcv_smem), rounded up to 16 bytes: then the ring */
__host__ __device__ static size_t tcv_stream_head(int K) { return (tcv_smem(1, K, 8) + 15) & ~(size_t)15; }
template <int GPW>
static size_t tcv_stream_smem(int K) { return tcv_stream_head(K) + (size_t)TCV_STAGES * 8 * TCV_WSM(GPW); }

template <int GPW>
static __global__ void __launch_bounds__(256, 2) tcv_stream_kernel(cuda_qmat m, float *y, int accumulate, const uint16_t *x) {
    TRACE_KERNEL();
    extern __shared__ __align__(16) unsigned char sm[];
    pdl_trigger();
    const int K = m.cols, G = K / QGROUP, KS = G / GPW, lmt = 4 - __ffs(KS), MT = 1 << lmt; /* MT = 8 / KS */
    const int warp = threadIdx.x >> 5;
    const int mt = warp & (MT - 1), ks = warp >> lmt, n_tiles = (m.rows + MT * 16 - 1) >> (lmt + 4);
    uint16_t *xs = reinterpret_cast<uint16_t *>(sm);
    float *xsum = reinterpret_cast<float *>(sm + (size_t)K * 2), *red = xsum + G;
    unsigned char *ring = sm + tcv_stream_head(K);
    const int mine = (int)blockIdx.x < n_tiles ? (n_tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    auto issue = [&](int i) { /* the block's tile i into stage i % TCV_STAGES: this warp's m-tile and k-slice */
        if (i < mine) {
            const int r0 = (((int)blockIdx.x + i * (int)gridDim.x) * MT + mt) * 16;
            tcv_tile_async<GPW>(m, (size_t)r0, min(16, m.rows - r0), ks * GPW,
                                ring + ((size_t)(i % TCV_STAGES) * 8 + warp) * TCV_WSM(GPW));
        }
        cpa_commit();
    };
    for (int i = 0; i < TCV_STAGES - 1; i++) issue(i); /* weights: before the wait */
    pdl_wait();
    tcv_stage(x, K, 1, K, xs, xsum);
    for (int i = 0; i < mine; i++) {
        issue(i + TCV_STAGES - 1); /* into the stage tile i - 1 used: every warp is past it */
        cpa_wait<TCV_STAGES - 1>();
        __syncthreads();
        float acc0 = 0.0f, acc1 = 0.0f;
        tcv_mma_smem<GPW>(ring + ((size_t)(i % TCV_STAGES) * 8 + warp) * TCV_WSM(GPW), xs, xsum, ks * GPW, acc0, acc1);
        tcv_to_red(acc0, acc1, red);
        if ((int)threadIdx.x < MT * 16) {
            const int mm = threadIdx.x / 16, ii = threadIdx.x % 16;
            const float v = tcv_slice_sum(red, KS, MT, mm, ii);
            const int r = (((int)blockIdx.x + i * (int)gridDim.x) * MT + mm) * 16 + ii;
            if (r < m.rows) y[r] = accumulate ? y[r] + v : v;
        }
    }
    cpa_wait<0>(); /* no copy outlives the block (the issues past `mine` are empty groups) */
}

template <int GPW, bool TK>
static __global__ void tcv_gateup_kernel(cuda_qmat gate, cuda_qmat up, cuda_qmat sgate, cuda_qmat sup, const int32_t *ids,
                                         const uint16_t *x, int K, uint16_t *act, int ld_act, cuda_topk_src ts);
template <int GPW>
static __global__ void tcv_down_kernel(cuda_qmat down, cuda_qmat sdown, const int32_t *ids, const float *wts,
                                       const float *seg, const uint16_t *act, int ld_act, int K, float *x, cuda_tail_norm tail);

/* The stream forms' grids (0 with small shared memory: the dense form only); the pair
 * kernels' shared-memory limit. */
extern "C" int cuda_tcv_init(char *err, size_t errlen) {
    int n = 0, optin = 0;
    cudaError_t e = device_sms_optin(&n, &optin);
    if (e == cudaSuccess)
        e = persistent_grid(tcv_stream_kernel<4>, 256, tcv_stream_smem<4>(4096), n, optin, &tcv_stream_grid[0]);
    if (e == cudaSuccess)
        e = persistent_grid(tcv_stream_kernel<8>, 256, tcv_stream_smem<8>(4096), n, optin, &tcv_stream_grid[1]);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "tcv: stream kernel setup: %s", cudaGetErrorString(e));
    /* the pair kernels' tiles: 74 KB a gate/up block at 16 groups a warp (K = 4,096 and up) */
    const int lim = optin - TCV_STATIC_SMEM;
    const void *tiled[9] = {(const void *)tcv_gateup_kernel<4, false>, (const void *)tcv_gateup_kernel<8, false>,
                            (const void *)tcv_gateup_kernel<16, false>, (const void *)tcv_gateup_kernel<4, true>,
                            (const void *)tcv_gateup_kernel<8, true>, (const void *)tcv_gateup_kernel<16, true>,
                            (const void *)tcv_down_kernel<4>, (const void *)tcv_down_kernel<8>,
                            (const void *)tcv_down_kernel<16>};
    for (int i = 0; i < 9 && lim > 0 && e == cudaSuccess; i++)
        e = cudaFuncSetAttribute(tiled[i], cudaFuncAttributeMaxDynamicSharedMemorySize, lim);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "tcv: pair kernel setup: %s", cudaGetErrorString(e));
    return 0;
}

/* 8-warp blocks (8 / KS m-tiles). One m-tile per block (KS warps, 2–4x the blocks) was
 * measured slower: K = 4,096 out-projection 15 → 20 µs, decode 357 → 329 tok/s (each
 * block stages all of x and its group sums for only 16 rows; the tail norm runs on 128
 * threads). docs/PERFORMANCE.md, session 3. */
template <int GPW>
static int tcv_dense_launch(const struct cuda_ctx *c, const tcv_args &a, int blocks, int K) {
    if (a.gn.y)
        LAUNCH_CHECK_RC(c, launch_k(tcv_dense_kernel<GPW, TCV_GNORM>, dim3(blocks), dim3(256), tcv_dense_smem(K), cstream(c), a),
                        "tcv_dense");
    if (a.ns.x)
        LAUNCH_CHECK_RC(c, launch_k(tcv_dense_kernel<GPW, TCV_NORM>, dim3(blocks), dim3(256), tcv_dense_smem(K), cstream(c), a),
                        "tcv_dense");
    LAUNCH_CHECK_RC(c, launch_k(tcv_dense_kernel<GPW, TCV_X>, dim3(blocks), dim3(256), tcv_dense_smem(K), cstream(c), a),
                    "tcv_dense");
}

static int tcv_dense_go(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const uint16_t *x,
                        const cuda_tail_norm *tail, const cuda_tcv_conv *conv, const cuda_tcv_gnorm *gn,
                        const cuda_norm_src *ns = NULL) {
    if (n_segs < 1 || n_segs > TCV_MAXSEG) return errorf(c->err, c->errlen, ST_INTERNAL, "tcv: %d matrices (1..4)", n_segs);
    tcv_args a;
    memset(&a, 0, sizeof a);
    a.nseg = n_segs;
    a.x = x;
    a.accumulate = segs[0].accumulate;
    if (tail) a.tail = *tail;
    if (conv) {
        if (conv->K < 2 || conv->K - 1 > CUDA_TCV_CONV_MAX || conv->C != segs[0].m.rows)
            return errorf(c->err, c->errlen, ST_UNSUPPORTED, "tcv: conv of %d taps over %d channels (rows %d)", conv->K, conv->C,
                          segs[0].m.rows);
        a.conv = *conv;
        a.trig_late = conv->trigger_late;
    }
    if (gn) {
        if (gn->Dv != 128 || gn->Hv * gn->Dv != segs[0].m.cols)
            return errorf(c->err, c->errlen, ST_UNSUPPORTED, "tcv: gated norm of %d x %d for %d columns", gn->Hv, gn->Dv,
                          segs[0].m.cols);
        a.gn = *gn;
    }
    const int K = segs[0].m.cols, gpw = tcv_gpw(K);
    if (ns) {
        if (!ns->x || !ns->gain || tail || gn)
            return errorf(c->err, c->errlen, ST_UNSUPPORTED, "tcv: a normalised input of %d columns with a tail or gated norm", K);
        a.ns = *ns;
    }
    int blocks = 0;
    for (int i = 0; i < n_segs; i++) {
        if (!cuda_tcv_supported(&segs[i].m) || segs[i].m.cols != K || segs[i].accumulate != a.accumulate)
            return errorf(c->err, c->errlen, ST_UNSUPPORTED, "tcv: matrix %d (%d-bit, %d columns) not supported or mixed", i,
                          segs[i].m.bits, segs[i].m.cols);
        a.w[i] = segs[i].m;
        a.y[i] = segs[i].y;
        a.blk0[i] = blocks;
        const int rows_per_block = 16 * (8 / ((K / QGROUP) / gpw));
        blocks += (segs[i].m.rows + rows_per_block - 1) / rows_per_block;
    }
    a.blk0[n_segs] = blocks;
    const int sgrid = gpw == 4 ? tcv_stream_grid[0] : gpw == 8 ? tcv_stream_grid[1] : 0;
    if (n_segs == 1 && !tail && !conv && !gn && !ns && sgrid > 0 && blocks >= TCV_STREAM_MIN_TILES && K <= 4096) {
        const int grid = sgrid < blocks ? sgrid : blocks;
        if (gpw == 4)
            LAUNCH_CHECK_RC(c, launch_k(tcv_stream_kernel<4>, dim3(grid), dim3(256), tcv_stream_smem<4>(K), cstream(c), a.w[0],
                                        a.y[0], a.accumulate, x),
                            "tcv_stream");
        LAUNCH_CHECK_RC(c, launch_k(tcv_stream_kernel<8>, dim3(grid), dim3(256), tcv_stream_smem<8>(K), cstream(c), a.w[0],
                                    a.y[0], a.accumulate, x),
                        "tcv_stream");
    }
    if (gpw == 4) return tcv_dense_launch<4>(c, a, blocks, K);
    if (gpw == 8) return tcv_dense_launch<8>(c, a, blocks, K);
    return tcv_dense_launch<16>(c, a, blocks, K);
}

extern "C" int cuda_tcv_multi(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const uint16_t *x) {
    return tcv_dense_go(c, segs, n_segs, x, NULL, NULL, NULL);
}

extern "C" int cuda_tcv_multi_conv(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const uint16_t *x,
                                   const struct cuda_tcv_conv *conv) {
    return tcv_dense_go(c, segs, n_segs, x, NULL, conv, NULL);
}

extern "C" int cuda_tcv_multi_norm(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs,
                                   const struct cuda_norm_src *ns, const struct cuda_tcv_conv *conv) {
    if (!ns) return errorf(c->err, c->errlen, ST_INTERNAL, "tcv_multi_norm: no input");
    return tcv_dense_go(c, segs, n_segs, NULL, NULL, conv, NULL, ns);
}

/* y += W·(x or the gated norm gn), then the tail. */
static int tcv_acc(const struct cuda_ctx *c, const struct cuda_qmat *m, const uint16_t *x, const cuda_tcv_gnorm *gn, float *y,
                   const struct cuda_tail_norm *tail) {
    cuda_gemv_seg s;
    s.m = *m;
    s.y = y;
    s.ldy = m->rows;
    s.accumulate = 1;
    return tcv_dense_go(c, &s, 1, x, tail, NULL, gn);
}

extern "C" int cuda_tcv_gnorm_acc_norm(const struct cuda_ctx *c, const struct cuda_qmat *m, const struct cuda_tcv_gnorm *gn,
                                       float *y, const struct cuda_tail_norm *tail) {
    return tcv_acc(c, m, NULL, gn, y, tail);
}

extern "C" int cuda_tcv_acc_norm(const struct cuda_ctx *c, const struct cuda_qmat *m, const uint16_t *x, float *y,
                                 const struct cuda_tail_norm *tail) {
    return tcv_acc(c, m, x, NULL, y, tail);
}

/* ---- MoE, one token: block (tile, pair); pair p < K is routed expert ids[p], p = K the
 * shared expert. gate/up: MT/2 m-tiles of gate rows then the same rows of up; act[p][r] =
 * bf16(silu(gate·x) · (up·x)), as the skinny SwiGLU epilogue. ---- */

/* Each warp's 16 rows × GPW groups go to shared memory by cp.async (tcv_tile_async: 16 bytes
 * a lane over whole rows) rather than into registers by tcv_load's 8-byte fragment loads: a
 * fragment load asks for one 32-byte sector of each of 8 rows, so after the router's ids
 * arrive the L1 took ~4 times the requests to issue the same 9 MB (timeline: wait → loads
 * issued 2.8 µs, then x staged behind them 2.1 µs). Multiplied by tcv_mma_smem: the same values
 * and steps as tcv_mma. Shared memory: tcv_stream_head(cols), then 8 × TCV_WSM(GPW), then
 * (TK) the top-k's scratch (topk_scratch). */
__host__ __device__ static size_t tcv_gateup_smem(int gpw, int cols) {
    return tcv_stream_head(cols) + (size_t)8 * TCV_WSM(gpw);
}

/* Copies one token's K bf16 of x into xs by cp.async (the caller commits), the bytes
 * tcv_stage's plain copy leaves: so x can be requested before the top-k and the weights. */
__device__ __forceinline__ void tcv_stage_async(const uint16_t *x, int K, uint16_t *xs) {
    for (int j = threadIdx.x; j < K / 8; j += blockDim.x) cpa16(xs + 8 * j, x + 8 * j);
}

/* TK: the launch takes the token's top-k from the router's logits itself (topk_block: the
 * router's tail's ids and weights, bit for bit) instead of reading the ids the router's last
 * block wrote — the router then has no tail on the step's chain. Its scratch (topk_scratch)
 * sits after the launch's other shared memory (16-byte aligned). */
template <int GPW, bool TK>
static __global__ void __launch_bounds__(256, GPW == 16 ? 1 : 3) tcv_gateup_kernel(cuda_qmat gate, cuda_qmat up, cuda_qmat sgate, cuda_qmat sup,
                                                                const int32_t *ids, const uint16_t *x, int K, uint16_t *act,
                                                                int ld_act, cuda_topk_src ts) {
    TRACE_KERNEL();
    extern __shared__ __align__(16) unsigned char sm[];
    /* pdl_trigger comes after pdl_wait here (both branches below): the down launch that
     * follows is then scheduled only once the router has finished (TK: once block (0, 0)
     * wrote the ids), so it may read the ids and request its routed rows before its own
     * wait (tcv_down_kernel) */
    const int p = blockIdx.y, blk = blockIdx.x;
    const bool shared = p == K;
    const cuda_qmat gm = qsel(shared, sgate, gate), um = qsel(shared, sup, up);
    const int cols = gm.cols, G = cols / QGROUP, KS = G / GPW, lmt = 4 - __ffs(KS), MT = 1 << lmt, half = MT / 2; /* MT = 8 / KS */
    if (blk * half * 16 >= gm.rows) { /* the shared expert may have fewer rows */
        pdl_wait();
        return;
    }
    const int warp = threadIdx.x >> 5;
    const int mt = warp & (MT - 1), ks = warp >> lmt;
    const bool is_up = mt >= half;
    const int rb = (blk * half + (is_up ? mt - half : mt)) * 16; /* the warp's first row within the expert */
    unsigned char *wsm = sm + tcv_stream_head(cols) + (size_t)warp * TCV_WSM(GPW);
    uint16_t *xs = reinterpret_cast<uint16_t *>(sm);
    float *xsum = reinterpret_cast<float *>(sm + (size_t)cols * 2), *red = xsum + G;
    if (shared) {
        tcv_tile_async<GPW>(qsel(is_up, um, gm), (size_t)rb, min(16, gm.rows - rb), ks * GPW, wsm);
        cpa_commit();
        pdl_wait();
        pdl_trigger();
    } else {
        pdl_wait(); /* the routed rows depend on the router's ids (TK: its logits) */
        int e;
        if (TK) { /* x requested first, beside the logits; then the top-k; this block's pick is rank p */
            tcv_stage_async(x, cols, xs);
            cpa_commit();
            topk_scratch &tk = *reinterpret_cast<topk_scratch *>(sm + tcv_gateup_smem(GPW, cols));
            /* block (0, 0) leaves the ids and weights for the down launch, which reads the ids
             * before its wait: written and fenced before this block's trigger, and that grid
             * starts only after every block here triggered (trap 13); the others need only
             * their pick (no weights: topk_block<, false>) */
            if (blk == 0 && p == 0) {
                topk_block<false>(ts.logits, ts.E, K, ts.renorm, ts.ids, ts.w, tk);
                __threadfence();
                __syncthreads();
            } else {
                topk_block<false, false>(ts.logits, ts.E, K, ts.renorm, nullptr, nullptr, tk);
            }
            e = tk.sel[p];
        } else {
            e = ids[p];
        }
        pdl_trigger();
        tcv_tile_async<GPW>(qsel(is_up, um, gm), (size_t)e * gm.rows + rb, min(16, gm.rows - rb), ks * GPW, wsm);
        cpa_commit();
    }
    trace_mark(TRACE_MARK4); /* (warp 0's) weight copies issued: the routed ones after its id arrived */
    if (TK && !shared) { /* x's copies landed (the older group), then its group sums */
        cpa_wait<1>();
        __syncthreads();
        sk_group_sums<true>(xs, 1, cols, G, xsum);
        __syncthreads();
    } else {
        tcv_stage(x, cols, 1, cols, xs, xsum);
    }
    trace_mark(TRACE_MARK5); /* x staged */
    cpa_wait<0>();
    __syncwarp(); /* the warp's tile (its own copies and zero rows) visible to all its lanes */
    float acc0 = 0.0f, acc1 = 0.0f;
    tcv_mma_smem<GPW>(wsm, xs, xsum, ks * GPW, acc0, acc1);
    tcv_to_red(acc0, acc1, red);
    trace_mark(TRACE_MARK6); /* products in shared memory */
    if ((int)threadIdx.x < half * 16) {
        const int mm = threadIdx.x / 16, i = threadIdx.x % 16;
        const float v = tcv_slice_sum(red, KS, MT, mm, i), u = tcv_slice_sum(red, KS, MT, mm + half, i);
        const int row = (blk * half + mm) * 16 + i;
        if (row < gm.rows) act[(size_t)p * ld_act + row] = f2bf(silu(v) * u);
    }
}

/* The down launch's shared memory: tcv_smem of the K + 1 activation rows, the epilogue's
 * 17 + K operands, then (16-byte aligned: tcv_down_head) each of its (K + 1)·KS warps' tile
 * of weights (tcv_down_smem). */
static __host__ __device__ size_t tcv_down_head(int K, int cols, int warps) {
    return (tcv_smem(K + 1, cols, warps) + (size_t)(17 + K) * 4 + 15) & ~(size_t)15;
}
static int tcv_down_warps(int gpw, int K, int cols) { return (K + 1) * ((cols / QGROUP) / gpw); }
static size_t tcv_down_smem(int gpw, int K, int cols) {
    const int warps = tcv_down_warps(gpw, K, cols);
    return tcv_down_head(K, cols, warps) + (size_t)warps * TCV_WSM(gpw);
}

/* down: block = one 16-row tile of the H outputs, (K + 1) × KS warps (pair p = warp / KS,
 * slice warp % KS), each warp's tile copied to shared memory by cp.async before the wait (as
 * in tcv_gateup_kernel; with tcv_load's fragments in registers: 64 registers, spills, and
 * decode at 512 1.3 % slower); each pair's row value is summed over slices in order, then
 * combined as cuda_moe_combine does: acc = σ(seg)·shared, acc = fmaf(w_k, routed_k, acc) for
 * k = 0..K-1, x += acc; the last block then normalises x (tail). */
template <int GPW>
static __global__ void __launch_bounds__(1024) tcv_down_kernel(cuda_qmat down, cuda_qmat sdown, const int32_t *ids,
                                                               const float *wts, const float *seg, const uint16_t *act,
                                                               int ld_act, int K, float *x, cuda_tail_norm tail) {
    TRACE_KERNEL();
    extern __shared__ __align__(16) unsigned char sm[];
    pdl_trigger();
    const int cols = down.cols, G = cols / QGROUP, KS = G / GPW, H = down.rows;
    const int warp = threadIdx.x >> 5, warps = (K + 1) * KS;
    const int p = warp / KS, ks = warp % KS;
    /* Every row is requested before the wait, the routed ones too: this grid is scheduled
     * only after every block of the gate/up launch before it passed its own wait, i.e.
     * after the router (two launches back) finished, so its ids are final (read through
     * L2; with the gate/up's own top-k, TK, its block (0, 0) wrote them, fenced, before
     * it triggered). An exception to PDL rule (a): docs/ARCHITECTURE.md, trap 13. */
    const size_t e0 = p == K ? 0 : (size_t)__ldcg(ids + p) * H;
    const int row0 = blockIdx.x * 16; /* the block's first output row */
    unsigned char *wsm = sm + tcv_down_head(K, cols, warps) + (size_t)warp * TCV_WSM(GPW); /* as tcv_gateup_kernel */
    tcv_tile_async<GPW>(qsel(p == K, sdown, down), e0 + row0, min(16, H - row0), ks * GPW, wsm);
    cpa_commit();
    pdl_wait();
    uint16_t *xs = reinterpret_cast<uint16_t *>(sm);
    float *xsum = reinterpret_cast<float *>(sm + (size_t)(K + 1) * cols * 2), *red = xsum + (K + 1) * G;
    float *epi = red + (K + 1) * KS * 16; /* [16] x rows, [K] routing weights, [1] σ(seg) */
    /* The epilogue's operands are requested now, beside the staging loads, and parked in
     * shared memory before the products' barrier: read after the products they were three
     * more L2 round trips on the chain (m6 → end 2.1 µs in the timeline). Thread i < 16
     * holds x[row i], 16 + q the weight of pair q, 16 + K the shared expert's gate. */
    const int ti = threadIdx.x;
    float pre = 0.0f;
    if (ti < 16) pre = row0 + ti < H ? x[row0 + ti] : 0.0f;
    else if (ti < 16 + K) pre = wts[ti - 16];
    else if (ti == 16 + K) pre = seg[0];
    tcv_stage(act, ld_act, K + 1, cols, xs, xsum);
    trace_mark(TRACE_MARK5); /* activations staged */
    cpa_wait<0>();
    __syncwarp();
    float acc0 = 0.0f, acc1 = 0.0f;
    tcv_mma_smem<GPW>(wsm, xs + (size_t)p * cols, xsum + p * G, ks * GPW, acc0, acc1);
    if (ti <= 16 + K) epi[ti] = ti == 16 + K ? 1.0f / (1.0f + expf(-pre)) : pre;
    tcv_to_red(acc0, acc1, red); /* and the barrier */
    trace_mark(TRACE_MARK6); /* products in shared memory: every warp's weights had landed */
    if (ti < 16) {
        const int i = ti, row = row0 + i;
        float vs = 0.0f;
        for (int k = 0; k < KS; k++) vs += red[(K * KS + k) * 16 + i];
        float acc = epi[16 + K] * vs;
        for (int q = 0; q < K; q++) {
            float v = 0.0f;
            for (int k = 0; k < KS; k++) v += red[(q * KS + k) * 16 + i];
            acc = fmaf(epi[16 + q], v, acc);
        }
        if (row < H) x[row] = epi[i] + acc;
    }
    if (tail.counter && last_block_done(tail.counter)) tail_rmsnorm(x, H, 1, H, tail);
}

/* The pair kernels' dynamic shared memory: cuda_tcv_init's limit (0: the device query failed). */
static size_t tcv_pair_smem_lim(void) {
    int n_sm = 0, optin = 0;
    if (device_sms_optin(&n_sm, &optin) != cudaSuccess) return 0;
    return optin > TCV_STATIC_SMEM ? (size_t)(optin - TCV_STATIC_SMEM) : 0;
}

extern "C" int cuda_tcv_moe_supported(const struct cuda_qmat *gate, const struct cuda_qmat *up, const struct cuda_qmat *down,
                                      const struct cuda_qmat *sh_gate, const struct cuda_qmat *sh_up,
                                      const struct cuda_qmat *sh_down, int K) {
    const struct cuda_qmat *all[6] = {gate, up, down, sh_gate, sh_up, sh_down};
    for (int i = 0; i < 6; i++)
        if (!cuda_tcv_supported(all[i])) return 0;
    const int gpw = tcv_gpw(down->cols), gpw_gu = tcv_gpw(gate->cols);
    const size_t lim = tcv_pair_smem_lim(); /* the tiles in shared memory */
    return lim > 0 && gate->cols == sh_gate->cols && down->cols == sh_down->cols && up->rows == gate->rows &&
           sh_up->rows == sh_gate->rows && gate->rows == down->cols && sh_gate->rows == sh_down->cols &&
           tcv_down_warps(gpw, K, down->cols) <= 32 && (8 / ((gate->cols / QGROUP) / gpw_gu)) >= 2 &&
           tcv_gateup_smem(gpw_gu, gate->cols) <= lim && tcv_down_smem(gpw, K, down->cols) <= lim;
}

/* The gate/up launch's own top-k (TK): E ≤ 256 logits, K ≤ 32 (topk_block on its 256
 * threads), and the scratch within the shared memory the kernel may take. */
extern "C" int cuda_tcv_topk_supported(const struct cuda_qmat *gate, int K, int E) {
    const int gpw = tcv_gpw(gate->cols);
    return gpw && E <= 256 && K >= 1 && K <= 32 && K <= E &&
           tcv_gateup_smem(gpw, gate->cols) + sizeof(topk_scratch) <= tcv_pair_smem_lim();
}

template <int GPW>
static int tcv_gateup_launch(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                             const struct cuda_qmat *sg, const struct cuda_qmat *su, const int32_t *ids, const uint16_t *xn,
                             int K, uint16_t *act, int ld_act, const cuda_topk_src *ts) {
    const int cols = gate->cols, MT = 8 / ((cols / QGROUP) / GPW), rows_per_block = MT / 2 * 16;
    const int rows = gate->rows > sg->rows ? gate->rows : sg->rows;
    const dim3 grid((rows + rows_per_block - 1) / rows_per_block, K + 1);
    const size_t smem = tcv_gateup_smem(GPW, cols);
    cuda_topk_src none;
    memset(&none, 0, sizeof none);
    if (ts)
        LAUNCH_CHECK_RC(c, launch_k(tcv_gateup_kernel<GPW, true>, grid, dim3(256), smem + sizeof(topk_scratch), cstream(c),
                                    *gate, *up, *sg, *su, ids, xn, K, act, ld_act, *ts),
                        "tcv_gateup (top-k)");
    LAUNCH_CHECK_RC(c, launch_k(tcv_gateup_kernel<GPW, false>, grid, dim3(256), smem, cstream(c), *gate, *up, *sg, *su, ids, xn,
                                K, act, ld_act, none),
                    "tcv_gateup");
}

extern "C" int cuda_tcv_gateup_pairs(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                     const struct cuda_qmat *sh_gate, const struct cuda_qmat *sh_up, const int32_t *ids,
                                     const uint16_t *xn, int K, uint16_t *act, int ld_act, const struct cuda_topk_src *ts) {
    const int gpw = tcv_gpw(gate->cols);
    if (gpw == 4) return tcv_gateup_launch<4>(c, gate, up, sh_gate, sh_up, ids, xn, K, act, ld_act, ts);
    if (gpw == 8) return tcv_gateup_launch<8>(c, gate, up, sh_gate, sh_up, ids, xn, K, act, ld_act, ts);
    if (gpw == 16) return tcv_gateup_launch<16>(c, gate, up, sh_gate, sh_up, ids, xn, K, act, ld_act, ts);
    return errorf(c->err, c->errlen, ST_UNSUPPORTED, "tcv_gateup: %d columns", gate->cols);
}

template <int GPW>
static int tcv_down_launch(const struct cuda_ctx *c, const struct cuda_qmat *down, const struct cuda_qmat *sd,
                           const int32_t *ids, const float *w, const float *seg, const uint16_t *act, int ld_act, int K,
                           float *x, const cuda_tail_norm &tn) {
    const int cols = down->cols;
    LAUNCH_CHECK_RC(c, launch_k(tcv_down_kernel<GPW>, dim3((down->rows + 15) / 16), dim3(32 * tcv_down_warps(GPW, K, cols)),
                                tcv_down_smem(GPW, K, cols), cstream(c), *down, *sd, ids, w, seg, act, ld_act, K, x, tn),
                    "tcv_down");
}

extern "C" int cuda_tcv_down_pairs(const struct cuda_ctx *c, const struct cuda_qmat *down, const struct cuda_qmat *sh_down,
                                   const int32_t *ids, const float *w, const float *seg, const uint16_t *act, int ld_act,
                                   int K, float *x, const struct cuda_tail_norm *tail) {
    cuda_tail_norm tn;
    if (tail) tn = *tail;
    else tn.counter = NULL;
    const int gpw = tcv_gpw(down->cols);
    if (gpw == 4) return tcv_down_launch<4>(c, down, sh_down, ids, w, seg, act, ld_act, K, x, tn);
    if (gpw == 8) return tcv_down_launch<8>(c, down, sh_down, ids, w, seg, act, ld_act, K, x, tn);
    if (gpw == 16) return tcv_down_launch<16>(c, down, sh_down, ids, w, seg, act, ld_act, K, x, tn);
    return errorf(c->err, c->errlen, ST_UNSUPPORTED, "tcv_down: %d columns", down->cols);
}

CUDA_TRACE_TU(tcv)
