// cuda/cuda_moe_fused.cu — one token's whole MoE block in one launch (batch-1 decode):
// router → top-k → gate/up with SwiGLU → down with the routing weights, the shared expert
// and the residual add → the next layer's input norm. It replaces cuda_moe.cu's router
// launch with its top-k tail and cuda_tcv.cu's two pair launches, with the same
// arithmetic in the same order (the bits of the three-launch form: tests/gpu).
//
// Why: on the H200 those three launches took 34 µs a layer (docs/PERFORMANCE.md, session
// 4 timeline) for 16 MB of weights (≈ 3.5 µs of bandwidth): each ended in a serial tail
// (one block: the top-k, then the norm), each boundary cost ~1 µs before the next grid's
// wait released, and the routed weights could only be requested after the router's grid
// had finished. Here one persistent grid (one block per SM, all resident: the grid
// barriers below need that) requests every weight it can as early as it can:
//
//   before pdl_wait   the shared expert's gate/up units and down rows (cp.async → shared
//                     memory, no registers held), the router rows (registers)
//   after it          router rows → logits; x staged           — grid barrier 1 —
//                     top-k in every block (the same warp function as the router's tail),
//                     then the routed gate/up units and the routed down rows requested
//                     together; gate/up from shared memory → act  — grid barrier 2 —
//                     down from shared memory (its weights arrived during gate/up),
//                     combine, x += ...; the last block normalises x (tail)
//
// Work split: 8-warp gate/up units = the tcv layout's block (MT m-tiles of 16 rows × KS
// k-slices, half gate rows, half the same up rows), shared expert first; unit u belongs
// to block u % grid, at most MF_MAXSLOT per block, two computed at a time. Down: block b
// owns output rows 16b .. 16b + 15 with (K + 1) × KS warps (pair × k-slice), exactly the
// tcv down kernel's block — so the block is (K + 1) × KS warps (18 for the model) and the
// tail norm runs on the same thread count as there.
#include "cuda/cuda_mma.h"
#include "cuda/cuda_route.h"

#define MF_GU 8       /* warps of a gate/up unit */
#define MF_WARPS 24   /* a block: 3 gate/up units at once; (K + 1) × KS ≤ 24 down warps */
#define MF_MAXSLOT 3  /* gate/up units a block holds (all computed in one round) */

struct mf_args {
    cuda_qmat router, sh_eg, gate, up, down, sgate, sup, sdown;
    const float *x32;     /* [H] the post-attention norm in fp32 (router) */
    const uint16_t *xn;   /* [H] the same in bf16 (experts) */
    float *logits, *seg;  /* [E], [1] */
    int K, renorm;
    int32_t *ids;         /* [K]: block 0 writes the routing it used (tests) */
    float *mw;            /* [K] */
    uint16_t *act;        /* [(K + 1)][ld_act]: pair K = the shared expert */
    int ld_act;
    float *x;             /* [H] residual stream, += the block's output */
    cuda_tail_norm tail;  /* counter NULL: no tail */
    unsigned *bar;        /* [2] zeroed: grid barrier count, generation */
};

/* Shared memory of a block, 16-byte aligned pieces. */
struct mf_layout {
    size_t xsum, acts, asum, red, sel, units, down, total;
};
__host__ __device__ __forceinline__ size_t mf_al(size_t x) { return (x + 15) & ~(size_t)15; }
__host__ __device__ __forceinline__ mf_layout mf_lay(int H, int I, int K, int gpwu, int gpwd) {
    const int dw = (K + 1) * ((I / QGROUP) / gpwd); /* down warps */
    mf_layout l;
    l.xsum = mf_al((size_t)H * 2);
    l.acts = l.xsum + mf_al((size_t)(H / QGROUP) * 4);
    l.asum = l.acts + mf_al((size_t)(K + 1) * I * 2);
    l.red = l.asum + mf_al((size_t)(K + 1) * (I / QGROUP) * 4);
    l.sel = l.red + (size_t)MF_WARPS * 16 * 4;
    l.units = l.sel + 64 * 4; /* ids, weights */
    l.down = l.units + (size_t)MF_MAXSLOT * MF_GU * TCV_WSM(gpwu);
    l.total = l.down + (size_t)dw * TCV_WSM(gpwd);
    return l;
}

/* Every block of the grid arrives, then all leave (all blocks are resident: one per SM,
 * grid ≤ SMs). bar[0] counts arrivals, bar[1] is the generation; the last arrival resets
 * the count and releases the next generation. acq_rel: the writes of every block before
 * the barrier (ordered by __syncthreads, then thread 0's release) are visible after it. */
__device__ __forceinline__ void grid_sync(unsigned *bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned gen, old;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(bar + 1) : "memory");
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(bar) : "memory");
        if (old == gridDim.x - 1) {
            asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(bar), "r"(0u) : "memory");
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(bar + 1), "r"(gen + 1) : "memory");
        } else {
            unsigned cur;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(cur) : "l"(bar + 1) : "memory");
            } while (cur == gen);
        }
    }
    __syncthreads();
}

/* Pair p of unit u: the shared expert (p = K) for u < Us, else routed pair (u - Us) / Ur;
 * slice j = its 16·half output rows from row 16·half·j. */
struct mf_unit {
    int p, j;
};
__device__ __forceinline__ mf_unit mf_unit_of(int u, int Us, int Ur, int K) {
    mf_unit r;
    if (u < Us) {
        r.p = K;
        r.j = u;
    } else {
        r.p = (u - Us) / Ur;
        r.j = (u - Us) % Ur;
    }
    return r;
}

template <int GPWU, int GPWD>
static __global__ void __launch_bounds__(MF_WARPS * 32, 1) moe_fused_kernel(mf_args a) {
    TRACE_KERNEL();
    extern __shared__ __align__(16) unsigned char sm[];
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, NW = blockDim.x >> 5;
    const int gq = lane >> 2, c = lane & 3, b = blockIdx.x, nblk = gridDim.x, K = a.K, E = a.router.rows;
    const int Hin = a.gate.cols, KSu = (Hin / QGROUP) / GPWU, MTu = MF_GU / KSu, half = MTu / 2;
    const int urows = half * 16, Us = (a.sgate.rows + urows - 1) / urows, Ur = (a.gate.rows + urows - 1) / urows;
    const int U = Us + K * Ur, I = a.down.cols, Gd = I / QGROUP, KSd = Gd / GPWD, H = a.down.rows;
    const bool has_tile = b * 16 < H, down_warp = warp < (K + 1) * KSd;
    const int g8 = warp / MF_GU, w8 = warp % MF_GU, mt = w8 % MTu, ks = w8 / MTu;
    const int dp = warp / KSd, dks = warp % KSd; /* down: pair, k-slice */
    const mf_layout L = mf_lay(Hin, I, K, GPWU, GPWD);
    uint16_t *xs = reinterpret_cast<uint16_t *>(sm), *acts = reinterpret_cast<uint16_t *>(sm + L.acts);
    float *xsum = reinterpret_cast<float *>(sm + L.xsum), *asum = reinterpret_cast<float *>(sm + L.asum);
    float *red = reinterpret_cast<float *>(sm + L.red), *sel_w = reinterpret_cast<float *>(sm + L.sel) + 32;
    int32_t *sel_ids = reinterpret_cast<int32_t *>(sm + L.sel);
    const int ngroups = NW / MF_GU; /* gate/up units computed at once */
    unsigned char *dwsm = sm + L.down + (size_t)warp * TCV_WSM(GPWD);
    int nslots = 0;
    while (nslots < MF_MAXSLOT && b + nslots * nblk < U) nslots++;

    /* this warp's share of slot s's unit (computed by group s % 2) into shared memory */
    auto unit_async = [&](int s) {
        const mf_unit un = mf_unit_of(b + s * nblk, Us, Ur, K);
        const bool is_up = mt >= half, sh = un.p == K;
        const cuda_qmat &m = sh ? (is_up ? a.sup : a.sgate) : (is_up ? a.up : a.gate);
        const int r0 = (un.j * half + (is_up ? mt - half : mt)) * 16; /* tile row 0 within the expert */
        const size_t e0 = sh ? 0 : (size_t)sel_ids[un.p] * m.rows;
        tcv_tile_async<GPWU>(m, e0 + r0, min(16, m.rows - r0), ks * GPWU,
                             sm + L.units + ((size_t)s * MF_GU + w8) * TCV_WSM(GPWU));
    };
    auto down_async = [&]() {
        const bool sh = dp == K;
        const cuda_qmat &m = sh ? a.sdown : a.down;
        const size_t e0 = sh ? 0 : (size_t)sel_ids[dp] * H;
        tcv_tile_async<GPWD>(m, e0 + (size_t)b * 16, min(16, H - b * 16), dks * GPWD, dwsm);
    };

    /* (0) before the wait: the shared expert's weights (immutable) */
    for (int s = 0; s < nslots && b + s * nblk < Us; s++)
        if (g8 == s % ngroups) unit_async(s);
    if (has_tile && down_warp && dp == K) down_async();
    cpa_commit();
    /* (1) router rows (router_row waits after its first weight loads) */
    const int row = b * NW + warp;
    if (row <= E) {
        const bool is_r = row < E;
        cuda_qmat m; /* by value, field by field (see cuda_moe.cu's router_kernel) */
        m.codes = is_r ? a.router.codes : a.sh_eg.codes;
        m.scales = is_r ? a.router.scales : a.sh_eg.scales;
        m.biases = is_r ? a.router.biases : a.sh_eg.biases;
        m.rows = is_r ? a.router.rows : a.sh_eg.rows;
        m.cols = is_r ? a.router.cols : a.sh_eg.cols;
        m.bits = is_r ? a.router.bits : a.sh_eg.bits;
        m.n_mats = 1;
        float acc[RT_TOK];
#pragma unroll
        for (int t = 0; t < RT_TOK; t++) acc[t] = 0.0f;
        if (m.bits == 4) router_row<4>(m, is_r ? row : 0, a.x32, Hin, 0, 1, acc, lane);
        else router_row<8>(m, is_r ? row : 0, a.x32, Hin, 0, 1, acc, lane);
        const float v = warp_sum(acc[0]);
        if (lane == 0) {
            if (is_r) a.logits[row] = v;
            else a.seg[0] = v;
        }
    } else {
        pdl_wait();
    }
    tcv_stage(a.xn, Hin, 1, Hin, xs, xsum);
    grid_sync(a.bar); /* (2) every logit is written */
    trace_mark(TRACE_MARK4);

    /* (3) the routing, in every block */
    if (warp == 0) topk_token_cg(a.logits, E, K, a.renorm, sel_ids, sel_w, lane);
    __syncthreads();
    trace_mark(TRACE_MARK5);
    if (b == 0 && (int)threadIdx.x < K) {
        a.ids[threadIdx.x] = sel_ids[threadIdx.x];
        a.mw[threadIdx.x] = sel_w[threadIdx.x];
    }
    /* (4) the routed weights: gate/up units first, then the down rows */
    for (int s = 0; s < nslots; s++)
        if (b + s * nblk >= Us && g8 == s % ngroups) unit_async(s);
    cpa_commit();
    if (has_tile && down_warp && dp < K) down_async();
    cpa_commit();
    cpa_wait<1>();
    __syncthreads();
    trace_mark(TRACE_MARK6);

    /* (5) gate/up, ngroups units at a time: act[p][row] = bf16(silu(gate·x) · (up·x)) */
    for (int s0 = 0; s0 < nslots; s0 += ngroups) {
        const int s = s0 + g8;
        const bool mine = g8 < ngroups && s < nslots;
        if (mine) {
            float acc0 = 0.0f, acc1 = 0.0f;
            tcv_mma_smem<GPWU>(sm + L.units + ((size_t)s * MF_GU + w8) * TCV_WSM(GPWU), xs, xsum, ks * GPWU, acc0, acc1);
            if (c == 0) {
                red[warp * 16 + gq] = acc0;
                red[warp * 16 + gq + 8] = acc1;
            }
        }
        __syncthreads();
        const int t8 = threadIdx.x % (MF_GU * 32);
        if (mine && t8 < half * 16) {
            const mf_unit un = mf_unit_of(b + s * nblk, Us, Ur, K);
            const float *rg = red + g8 * MF_GU * 16;
            const int mm = t8 / 16, i = t8 % 16;
            float v = 0.0f, u = 0.0f;
            for (int k = 0; k < KSu; k++) v += rg[(k * MTu + mm) * 16 + i];
            for (int k = 0; k < KSu; k++) u += rg[(k * MTu + mm + half) * 16 + i];
            const int r = (un.j * half + mm) * 16 + i;
            if (r < (un.p == K ? a.sgate.rows : a.gate.rows)) a.act[(size_t)un.p * a.ld_act + r] = f2bf(silu(v) * u);
        }
        __syncthreads();
    }
    grid_sync(a.bar); /* (6) every act row is written */
    trace_mark(TRACE_MARK7);

    /* (7) down rows 16b.., combined as cuda_tcv.cu's down kernel */
    if (has_tile) {
        tcv_stage<true>(a.act, a.ld_act, K + 1, I, acts, asum);
        cpa_wait<0>();
        __syncthreads();
        if (down_warp) {
            float acc0 = 0.0f, acc1 = 0.0f;
            tcv_mma_smem<GPWD>(dwsm, acts + (size_t)dp * I, asum + dp * Gd, dks * GPWD, acc0, acc1);
            if (c == 0) {
                red[warp * 16 + gq] = acc0;
                red[warp * 16 + gq + 8] = acc1;
            }
        }
        __syncthreads();
        if (threadIdx.x < 16) {
            const int i = threadIdx.x, r = b * 16 + i;
            float vs = 0.0f;
            for (int k = 0; k < KSd; k++) vs += red[(K * KSd + k) * 16 + i];
            float acc = 1.0f / (1.0f + expf(-__ldcg(a.seg))) * vs;
            for (int q = 0; q < K; q++) {
                float v = 0.0f;
                for (int k = 0; k < KSd; k++) v += red[(q * KSd + k) * 16 + i];
                acc = fmaf(sel_w[q], v, acc);
            }
            if (r < H) a.x[r] += acc;
        }
    }
    if (a.tail.counter && last_block_done(a.tail.counter)) tail_rmsnorm(a.x, H, 1, H, a.tail);
}

/* Groups per warp of the tcv layout for K columns (cuda_tcv.cu's tcv_gpw). */
static int mf_gpw(int K) {
    const int ks = cuda_skinny_kslices(K), G = K / QGROUP;
    return ks && G % ks == 0 ? G / ks : 0;
}

static int mf_optin(void) {
    static int v = -1;
    if (v < 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
            cudaGetLastError();
            v = 0;
        }
    }
    return v;
}

extern "C" int cuda_moe_fused_supported(const struct cuda_qmat *router, const struct cuda_qmat *sh_eg,
                                        const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                        const struct cuda_qmat *down, const struct cuda_qmat *sh_gate,
                                        const struct cuda_qmat *sh_up, const struct cuda_qmat *sh_down, int K, int n_blocks) {
    if (K < 1 || K > 32) return 0;
    if (!cuda_tcv_moe_supported(gate, up, down, sh_gate, sh_up, sh_down, K)) return 0;
    if (mf_gpw(gate->cols) != 8 || mf_gpw(down->cols) != 4) return 0; /* the instance built */
    if ((router->bits != 4 && router->bits != 8) || (sh_eg->bits != 4 && sh_eg->bits != 8) || router->rows > 256 ||
        router->rows < K || router->cols != gate->cols || sh_eg->cols != gate->cols || sh_eg->rows != 1)
        return 0;
    const int KSu = (gate->cols / QGROUP) / 8, MTu = MF_GU / KSu, urows = MTu / 2 * 16;
    const int NW = (K + 1) * ((down->cols / QGROUP) / 4);
    const int U = (sh_gate->rows + urows - 1) / urows + K * ((gate->rows + urows - 1) / urows);
    if (NW > MF_WARPS || n_blocks < (down->rows + 15) / 16 || n_blocks * MF_WARPS < router->rows + 1 ||
        U > MF_MAXSLOT * n_blocks || router->rows > 256)
        return 0;
    const size_t smem = mf_lay(gate->cols, down->cols, K, 8, 4).total;
    if ((int)smem > mf_optin() ||
        cudaFuncSetAttribute(moe_fused_kernel<8, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moe_fused_kernel<8, 4>, MF_WARPS * 32, smem) != cudaSuccess ||
        per_sm < 1) {
        cudaGetLastError();
        return 0;
    }
    return 1;
}

extern "C" int cuda_moe_fused_enabled(void) {
    static const bool on = env_flag("ORCHID_FUSED_MOE");
    return on;
}

extern "C" int cuda_moe_fused(const struct cuda_ctx *c, const struct cuda_moe_fused_args *f, int n_blocks) {
    mf_args a;
    a.router = f->router; a.sh_eg = f->sh_eg; a.gate = f->gate; a.up = f->up; a.down = f->down;
    a.sgate = f->sh_gate; a.sup = f->sh_up; a.sdown = f->sh_down;
    a.x32 = f->x32; a.xn = f->xn; a.logits = f->logits; a.seg = f->seg; a.K = f->K; a.renorm = f->renorm;
    a.ids = f->ids; a.mw = f->mw; a.act = f->act; a.ld_act = f->ld_act; a.x = f->x; a.bar = f->bar;
    if (f->tail) a.tail = *f->tail;
    else a.tail.counter = NULL;
    const size_t smem = mf_lay(a.gate.cols, a.down.cols, a.K, 8, 4).total;
    LAUNCH_CHECK_RC(c, launch_k(moe_fused_kernel<8, 4>, dim3(n_blocks), dim3(MF_WARPS * 32), smem, cstream(c), a),
                    "moe_fused");
}

CUDA_TRACE_TU(moe_fused)
