// cuda/cuda_skinny_wide.cu — dense 4-bit products for 9..64 tokens (batched decode of
// many sequences): the projections, the shared expert and small lm_head passes of
// run_layer_mid, with one k-slice per block instead of all of K.
//
// Why: cuda_skinny.cu stages a block's whole weight tile (all K) and the tokens of one
// pass (8) in shared memory; at 64 tokens it takes 8 passes and rebuilds every A fragment
// from shared memory in each (measured on the H200: 96 µs for the 14 MB GDN
// in-projection of 64 tokens; double-buffering the token copy did not help). Here a block
// owns 8 m-tiles of one k-slice: each warp reads its m-tile's codes straight into
// registers (cuda_mma.h's tcv_load: 8 bytes a row a group), builds each group's A
// fragments once, and applies them to every n-tile of tokens staged in shared memory for
// that k-slice only (64 tokens × 512 columns = 66 KB at K = 2,048).
//
// Same sums as cuda_skinny.cu and cuda_tcv.cu for every token: KS = cuda_skinny_kslices(K)
// slices, a slice's groups in order into sk_group_scale's acc += fmaf(s, Σ(128+q)x, (b-128s)·Σx), the slices added in
// order from 0. The slices of a row tile are different blocks here, so each writes its
// partial sums to a workspace [tile][slice][token][128] and the last of them to finish
// (an acq_rel counter per tile) adds them in slice order and writes the output (sw_reduce).
//
// Two forms of the products, the same bits: on sm_90a sw_wg_kernel (wgmma, the tokens the
// B operand in shared memory, each warp's weights through shared memory), elsewhere
// sw_kernel (mma.sync, each warp's weights in registers). Both end in sw_finish.
#include "cuda/cuda_mma.h"
#include "cuda/cuda_wgmma.h"

#define SW_MAXSEG 4
#define SW_MAX_T 64
#define SW_ROWS 128       /* rows of a tile: 8 m-tiles (SwiGLU: 64 gate rows and the same 64 up rows) */
#define SW_MAX_TILES 160  /* tiles of one launch (20,480 rows): more goes to cuda_skinny.cu */
#define SW_MAX_KS 8

struct sw_args {
    cuda_qmat w[SW_MAXSEG]; /* SwiGLU: w[0] = gate */
    float *y[SW_MAXSEG];
    int ldy[SW_MAXSEG];
    int blk0[SW_MAXSEG + 1];
    int nseg, accumulate;
    cuda_qmat up;           /* SwiGLU */
    uint16_t *act;
    int ld_act;
    const uint16_t *x;
    int ldx, T;
    cuda_xstage xs; /* x's rows staged by their producer (perm NULL: none; sw_wgl_kernel<, true> reads them) */
    float *part; /* [tile][KS][T][SW_ROWS] */
    int *cnt;    /* [tile], zero between launches */
};

static float *sw_part;
static int *sw_cnt;
static int sw_sms = 1; /* multiprocessors (cuda_skinny_wide_init): the wave of sw_nsplit */
static bool sw_wg = false; /* the wgmma form takes the launches (sm_90a code runs; ORCHID_SW_NOWG=1: off) */
static bool sw_gpw_ok[2];  /* slices of 8 / 16 groups fit the device's shared memory (cuda_skinny_wide_init) */
static bool sw_wgl = false; /* sw_wgl_kernel can run (sm_90a, its shared memory fits) */
static int sw_wgl_force = -1; /* test hook (cuda_skinny_wide_force_loop): -1 by the launch's shape, 0 never, 1 always */
static int sw_wgl_count;     /* launches sw_wgl_kernel took (the GPU test asks) */

/* True in the last of the n blocks that count on *counter (then reset for the next
 * launch); the barrier and the acq_rel atomic order the blocks' partial writes before the
 * last block's reads (as last_block_done). */
__device__ __forceinline__ bool sw_last_of(int *counter, int n) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        int old;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
        last = old == n - 1;
        if (last) *counter = 0;
    }
    __syncthreads();
    return last;
}

/* Where a block's lane works, both product forms: the launch's segment s (matrix a.w[s]) and
 * the tile's index blk within it; the lane's first row lr0 of the tile (rows lr0, lr0 + 8;
 * SwiGLU: warps 4..7 take the up rows of the same 64 features) and its matrix row r0. */
struct sw_place {
    int s, blk, lr0, r0;
    bool is_up;
};
template <bool SWIGLU>
__device__ __forceinline__ sw_place sw_place_of(const sw_args &a, int tile, int warp, int gq) {
    sw_place p;
    p.s = 0;
    while (p.s + 1 < a.nseg && tile >= a.blk0[p.s + 1]) p.s++;
    p.blk = tile - a.blk0[p.s];
    p.is_up = SWIGLU && warp >= 4;
    p.lr0 = (SWIGLU ? (warp & 3) : warp) * 16 + gq;
    p.r0 = p.blk * (SWIGLU ? SW_ROWS / 2 : SW_ROWS) + p.lr0;
    return p;
}

/* The last block of a tile adds the slices' partials in slice order from 0 (v = 0 + p0 + p1
 * + ...; SwiGLU: the up rows' too, then silu(v)·u to bf16). A thread takes U runs of 4 rows
 * (one float4 of a token's partials a slice) and requests all of their KS partials (and
 * the outputs it accumulates into) before adding any: the tile's 8,192 outputs at 64 tokens
 * are two rounds of L2 round trips a thread (four scalar outputs at a time were eight
 * rounds; an output at a time, 32 — ~20 µs of the 64-token out-projection, H200). */
template <bool SWIGLU, int KS>
__device__ __forceinline__ void sw_reduce(const sw_args &a, int s, int blk, int tile) {
    const cuda_qmat &m = a.w[s];
    const int T = a.T;
    constexpr int ORW = SWIGLU ? SW_ROWS / 2 : SW_ROWS, Q = ORW / 4; /* float4 runs a token */
    constexpr int UK = 16 / (KS * (SWIGLU ? 2 : 1)), U = UK < 4 ? UK : 4; /* ≤ 64 partials held (KS ≤ 8: UK ≥ 1) */
    for (int i0 = threadIdx.x; i0 < T * Q; i0 += U * blockDim.x) {
        float4 pv[U][KS], pu[U][SWIGLU ? KS : 1];
        float old[U][4];
#pragma unroll
        for (int j = 0; j < U; j++) {
            const int i = i0 + j * blockDim.x, t = i / Q, lr = 4 * (i % Q), r = blk * ORW + lr;
            const bool in = i < T * Q && r < m.rows;
            const float4 *p = reinterpret_cast<const float4 *>(a.part + ((size_t)(tile * KS) * T + t) * SW_ROWS + lr);
#pragma unroll
            for (int k = 0; k < KS; k++) {
                pv[j][k] = in ? __ldcg(p + (size_t)k * T * (SW_ROWS / 4)) : make_float4(0, 0, 0, 0);
                if (SWIGLU) pu[j][k] = in ? __ldcg(p + (size_t)k * T * (SW_ROWS / 4) + ORW / 4) : make_float4(0, 0, 0, 0);
            }
#pragma unroll
            for (int e = 0; e < 4; e++)
                old[j][e] = !SWIGLU && in && a.accumulate && r + e < m.rows ? a.y[s][(size_t)t * a.ldy[s] + r + e] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < U; j++) {
            const int i = i0 + j * blockDim.x, t = i / Q, lr = 4 * (i % Q), r = blk * ORW + lr;
            if (i >= T * Q || r >= m.rows) continue;
            float v[4] = {0.0f, 0.0f, 0.0f, 0.0f}, u[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int k = 0; k < KS; k++) {
                v[0] += pv[j][k].x; v[1] += pv[j][k].y; v[2] += pv[j][k].z; v[3] += pv[j][k].w;
                if (SWIGLU) { u[0] += pu[j][k].x; u[1] += pu[j][k].y; u[2] += pu[j][k].z; u[3] += pu[j][k].w; }
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (r + e >= m.rows) break;
                if (SWIGLU) a.act[(size_t)t * a.ld_act + r + e] = f2bf(silu(v[e]) * u[e]);
                else a.y[s][(size_t)t * a.ldy[s] + r + e] = a.accumulate ? old[j][e] + v[e] : v[e];
            }
        }
    }
}

/* A block's end, both product forms: its slice's partial sums to the workspace (rows lr0,
 * lr0 + 8 — SwiGLU: up rows at 64 + — and tokens 2c, 2c + 1 of each of its nnt n-tiles from
 * token t0), then, in the last of the tile's KS · nz blocks, the slices added in order. */
template <bool SWIGLU>
__device__ __forceinline__ void sw_finish(const sw_args &a, int s, int blk, int tile, int ks, int KS, int lr0, bool is_up,
                                          int t0, int nnt, int nz, const float (&acc)[SW_MAX_T / 8][4]) {
    const int T = a.T, c = threadIdx.x & 3;
    constexpr int ORW = SWIGLU ? SW_ROWS / 2 : SW_ROWS; /* output rows of a tile */
    /* this slice's partials: rows lr0, lr0 + 8 (SwiGLU: up rows at 64 +), tokens 2c, 2c + 1 */
    float *P = a.part + (size_t)(tile * KS + ks) * T * SW_ROWS;
    const int pr = (is_up ? ORW : 0) + lr0;
#pragma unroll
    for (int nt = 0; nt < SW_MAX_T / 8; nt++) {
        if (nt >= nnt) break;
        const int ta = t0 + nt * 8 + 2 * c, tb = ta + 1;
        if (ta < T) {
            P[(size_t)ta * SW_ROWS + pr] = acc[nt][0];
            P[(size_t)ta * SW_ROWS + pr + 8] = acc[nt][2];
        }
        if (tb < T) {
            P[(size_t)tb * SW_ROWS + pr] = acc[nt][1];
            P[(size_t)tb * SW_ROWS + pr + 8] = acc[nt][3];
        }
    }
    if (!sw_last_of(&a.cnt[tile], KS * nz)) return;
    switch (KS) {
    case 1: sw_reduce<SWIGLU, 1>(a, s, blk, tile); break;
    case 2: sw_reduce<SWIGLU, 2>(a, s, blk, tile); break;
    case 4: sw_reduce<SWIGLU, 4>(a, s, blk, tile); break;
    default: sw_reduce<SWIGLU, 8>(a, s, blk, tile); break;
    }
}

/* NI: n-tiles whose mma chains interleave (sk_group_steps; 1 = one n-tile at a time). */
template <int GPW, bool SWIGLU, int NI>
static __global__ void __launch_bounds__(256, GPW == 16 ? 1 : 2) sw_kernel(sw_args a) {
    TRACE_KERNEL();
    extern __shared__ __align__(16) unsigned char sm[];
    const int ks = blockIdx.y, KS = gridDim.y, tile = blockIdx.x, T = a.T;
    /* n-split (blockIdx.z of gridDim.z): this block's n-tiles [nt0, nt1) of the ⌈T/8⌉,
     * tokens t0 .. t0 + nT - 1, staged from row 0 of xs */
    const int ntt = (T + 7) / 8, nt0 = (int)blockIdx.z * ntt / (int)gridDim.z;
    const int nnt = ((int)blockIdx.z + 1) * ntt / (int)gridDim.z - nt0, t0 = nt0 * 8, nT = min(T - t0, nnt * 8);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, c = lane & 3;
    const sw_place pl = sw_place_of<SWIGLU>(a, tile, warp, gq);
    const int s = pl.s, blk = pl.blk, lr0 = pl.lr0, r0 = pl.r0;
    const bool is_up = pl.is_up;
    const cuda_qmat m = a.w[s];
    pdl_trigger();
    tcv_w<GPW> w; /* weights before the wait (coherent loads: .nc ones would sink below it) */
    tcv_load<GPW>(is_up ? a.up : m, (size_t)r0, r0 < m.rows, r0 + 8 < m.rows, ks * GPW, c, w);
    trace_mark(TRACE_MARK4); /* (thread 0's) weight loads issued */
    pdl_wait();

    /* the k-slice's columns of every token, then their group sums */
    constexpr int XC = GPW * QGROUP, XS = XC + 8;
    uint16_t *xs = reinterpret_cast<uint16_t *>(sm);
    float *xsum = reinterpret_cast<float *>(sm + (size_t)SW_MAX_T * XS * 2);
    for (int i = threadIdx.x; i < nT * (XC / 8); i += blockDim.x) {
        const int t = i / (XC / 8), ch = i % (XC / 8);
        cpa16(xs + (size_t)t * XS + ch * 8, a.x + (size_t)(t0 + t) * a.ldx + (size_t)ks * XC + ch * 8);
    }
    cpa_commit();
    cpa_wait<0>();
    __syncthreads();
    trace_mark(TRACE_MARK5); /* tokens landed */
    /* PX: the tokens rearranged by their group sums for the k16 steps (sk_bperm), no byte
     * permutes in the products. H200, 64 tokens (session 9): SwiGLU (shared expert) 19.8 ->
     * 17.9 µs, GPW 16 (GDN out-projection, attention o) 41.6 -> 39.6 and 40.8 -> 38.5; the
     * plain GPW 8 form lost (GDN in-projection 46.6 -> 51.5, lm_head 752 -> 766) and keeps
     * the byte permutes. Same values into the same mma either way. */
    constexpr bool PX = SWIGLU || GPW == 16;
    sk_group_sums_by<PX>(xs, nT, XS, GPW, xsum, threadIdx.x, blockDim.x, GPW + 4); /* rows padded: see sw_smem */
    __syncthreads();
    trace_mark(TRACE_MARK6);

    /* columns of tokens past nT hold whatever shared memory held: they stay in their own
     * columns of the mma and are never written */
    float acc[SW_MAX_T / 8][4];
#pragma unroll
    for (int nt = 0; nt < SW_MAX_T / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
    for (int gi = 0; gi < GPW; gi++) {
        const sk_w f = tcv_group(w, gi);
        uint32_t af[4][4];
        sk_frags<false>(f, af); /* the C form: see q_pair */
#pragma unroll
        for (int nb = 0; nb < SW_MAX_T / 8; nb += NI) {
            if (nb >= nnt) break;
            const float *sx = xsum + (nb * 8 + 2 * c) * (GPW + 4) + gi;
            sk_group_steps<NI, PX>(af, f, xs + (size_t)(nb * 8 + gq) * XS + gi * QGROUP + 16 * c, 8 * XS, sx,
                                      sx + (GPW + 4), 8 * (GPW + 4), nnt - nb, acc + nb);
        }
    }

    trace_mark(TRACE_MARK7); /* (warp 0's) products done: its weights had landed */
    sw_finish<SWIGLU>(a, s, blk, tile, ks, KS, lr0, is_up, t0, nnt, (int)gridDim.z, acc);
}

/* ---- the same products on wgmma (sm_90a) ----
 * A block is the same tile (128 rows, one k-slice, every token), its two warpgroups the
 * two 64-row halves: warp w's 16 rows and its A fragments are sw_kernel's (tcv_load,
 * sk_frags: the same codes at the same k positions). The tokens are wgmma's B operand, one
 * 128-byte row a (token, group) in the 128-byte swizzle (wg_desc), N = 32 or 64 columns.
 * Bits: a group's first k16 step writes its sums (scale-d 0: ptxas made that of zeroed
 * registers too), the next three add, and each step's 16 products are the ones mma.sync
 * summed at the same k positions — B row position 16·st + κ of a group holds x[col(st, κ)],
 * the column sk_bfrag gives lane c's k 2c, 2c + 1, 2c + 8, 2c + 9 of step st — so each
 * group's Σ(128 + q)·x is mma.sync's (the prefill's two forms
 * give the same bits: test_cuda_ops), and sk_group_scale adds it in group order: the
 * same sums as sw_kernel and the one-token kernels (the GPU tests compare 9..64 tokens
 * with one token alone, bitwise). Why: per warp and group sw_kernel issues 4 mma.sync and
 * 2 LDS.128 an n-tile (64 tokens: 32 mma in dependent chains of 4), here 4 wgmma for all
 * 64 tokens, B read by the tensor cores from shared memory. Measured on the H200 (CUDA
 * events, a call alone): K = 4,096 (GDN out-projection, attention o) 27.9 / 27.0 -> 18.7 /
 * 17.5 µs at 32 tokens, 39.9 / 39.3 -> 35.0 / 34.2 at 64; the K = 2,048 launches did not
 * move (GDN in-projection 43 µs at 64 either way, attention q/k/v 45 -> 47, shared gate/up
 * 17.7 -> 18.0): what grows with the tokens there is not the products (the staging, the
 * partial sums and the last block's reduction all do: sw_reduce's float4 form then took
 * them to 30.1 / 30.4 / 15.4 µs). Forwards 16 / 32 / 64 sequences 7.58 / 10.46 / 15.10 ->
 * 7.20 / 9.86 / 14.92 ms (both forms with sw_reduce: 7.27 / 9.95 / 14.12 -> 6.97 / 9.46 /
 * 13.70). ORCHID_SW_NOWG=1: sw_kernel (A/B). Measured and not kept (docs/PERFORMANCE.md,
 * session 19): launches of fewer blocks than SMs as one warpgroup a block (the tile's two
 * halves apart), and two groups' wgmma in flight (groups in pairs; 155 registers, one block
 * an SM) — neither moved the forwards. */
template <int N>
static constexpr size_t sw_wg_smem(int gpw) {
    return 1024 + (size_t)gpw * N * 128 + (size_t)N * (gpw + 4) * 4 + 8 * (size_t)TCV_WSM(gpw);
}

template <int GPW, bool SWIGLU, int N>
static __global__ void __launch_bounds__(256, GPW == 16 ? 1 : 2) sw_wg_kernel(sw_args a) {
    TRACE_KERNEL();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) unsigned char sm[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(sm);
    unsigned char *xb = sm + ((1024 - (raw_s & 1023)) & 1023); /* [GPW][N][128 B], swizzled */
    const uint32_t xb_s = (uint32_t)__cvta_generic_to_shared(xb);
    float *xsum = reinterpret_cast<float *>(xb + (size_t)GPW * N * 128); /* [N][GPW + 4] */
    const int ks = blockIdx.y, KS = gridDim.y, tile = blockIdx.x, T = a.T;
    /* n-split (blockIdx.z of gridDim.z): tokens t0 .. t0 + nT - 1, staged as columns 0 .. nT - 1 */
    const int t0 = (int)blockIdx.z * N, nT = min(N, T - t0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, c = lane & 3;
    const sw_place pl = sw_place_of<SWIGLU>(a, tile, warp, gq);
    const int s = pl.s, blk = pl.blk, lr0 = pl.lr0, r0 = pl.r0;
    const bool is_up = pl.is_up;
    const cuda_qmat m = a.w[s];
    /* each warp's 16 rows of codes, scales and biases for the slice, copied before the wait
     * into its own shared tile (tcv_tile_async's layout) and read a group at a time: held in
     * registers for all groups (sw_kernel's way) they took ptxas to 255 registers with the
     * accumulators, spilling and serialising the wgmma */
    unsigned char *wsm = xb + (size_t)GPW * N * 128 + (size_t)N * (GPW + 4) * 4 + (size_t)warp * TCV_WSM(GPW);
    pdl_trigger();
    {
        const size_t base = (size_t)(r0 - gq);
        tcv_tile_async<GPW>(is_up ? a.up : m, base, m.rows - (int)base, ks * GPW, wsm);
        cpa_commit();
    }
    pdl_wait();

    wg_stage_tokens<N>(xb, xsum, GPW + 4, a.x, a.ldx, t0, nT, GPW, ks * GPW * QGROUP);

    float acc[SW_MAX_T / 8][4];
#pragma unroll
    for (int nt = 0; nt < SW_MAX_T / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll 1
    for (int gi = 0; gi < GPW; gi++) { /* rolled: unrolled, ptxas issued later groups' wgmma early, all their sums live */
        const sk_w f = tcv_smem_group<GPW>(wsm, gi, gq, c);
        float cg[N / 2];
        wg_group_issue<N, false>(f, xb_s + (uint32_t)(gi * N * 128), cg); /* the C form: see q_pair */
        wg_group_scale<N, 0>(f, cg, xsum + gi, GPW + 4, c, acc);
    }
    sw_finish<SWIGLU>(a, s, blk, tile, ks, KS, lr0, is_up, t0, N / 8, (int)gridDim.z, acc);
#endif
}

/* ---- the wgmma form with every slice in one block (dense, 8 groups a slice) ----
 * The split form above runs a launch of 98 tiles × 4 slices (the GDN in-projection at K =
 * 2,048) as 392 blocks in three waves, each block a serial chain of its copies, its products
 * and its partial sums' round trip, and the last block of a tile adds the slices: 26.5 µs
 * from the previous launch's end to its own for 14 MB of weights (H100 trace at 64
 * sequences, ~5 µs of DRAM). Here a block is a tile and walks its KS slices itself, two
 * slices' weights and tokens in flight (double-buffered: slice ks + 2's copies issued into
 * the buffer slice ks has just released), the slices' sums added in registers: one wave
 * of ≤ 132 blocks, no workspace, no counter.
 * Bits: each slice is the split form's block — the same tiles, the same group sums in the
 * same order onto an accumulator starting at 0 — and the slices are added in order from 0
 * (total = 0 + p0, then + p1, ...), then onto the old output when accumulating: sw_reduce's
 * sums exactly (the GPU tests compare with every token alone, bitwise). One block an SM
 * (two buffers: ~207 KB at N = 64), two groups' wgmma in flight (the loop unrolled: ptxas
 * serialised them otherwise).
 * Measured (H100, 64 sequences, docs/PERFORMANCE.md session 32): the launch's own span is
 * no shorter (a block's slice: ~1.0 µs of token sums and reordering, 3.1 of products — ~40 %
 * of the tensor rate at two warpgroups an SM — and ~1.5 of waiting for its copies, four
 * slices in a row), but the forward is 13.95 -> 13.86 ms: the 34 SMs it leaves free take the
 * next launches' blocks early (the GDN scan's state loads before its wait: 97.4 -> 95.1 µs a
 * layer from the conv's end). ORCHID_SW_NOLOOP=1: the split form.
 * PRE: the tokens come staged by their producer (a.xs: struct cuda_xstage, the previous
 * layer's combine + norm) — each slice's rows and Σx copied as they are, no block sums and
 * reorders them (~1 µs a slice of the chain above); the same bytes reach the same wgmma. */
#define SWL_GPW 8
template <int N>
static constexpr __host__ __device__ size_t swl_stride() { /* one buffer: tokens, Σx, the 8 warps' weight tiles; 1,024-aligned */
    return ((size_t)SWL_GPW * N * 128 + (size_t)N * (SWL_GPW + 4) * 4 + 8 * (size_t)TCV_WSM(SWL_GPW) + 1023) & ~(size_t)1023;
}
template <int N>
static constexpr size_t swl_smem() { return 1024 + 2 * swl_stride<N>(); }

template <int N, bool PRE>
static __global__ void __launch_bounds__(256, 1) sw_wgl_kernel(sw_args a, int KS) {
    TRACE_KERNEL();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int GPW = SWL_GPW, XL = GPW + 4;
    static_assert(GPW % 2 == 0, "sw_wgl_kernel: groups in pairs");
    extern __shared__ __align__(16) unsigned char sm[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(sm);
    unsigned char *base = sm + ((1024 - (raw_s & 1023)) & 1023);
    const int tile = blockIdx.x, nT = min(N, a.T);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, c = lane & 3;
    const sw_place pl = sw_place_of<false>(a, tile, warp, gq);
    const cuda_qmat m = a.w[pl.s];
    const size_t wrow = (size_t)(pl.r0 - gq); /* the warp's first row */
    /* buffer b: tokens [GPW][N][128 B] (swizzled), Σx [N][XL], then warp w's weight tile */
    auto xb = [&](int b) { return base + (size_t)b * swl_stride<N>(); };
    auto xsum = [&](int b) { return reinterpret_cast<float *>(xb(b) + (size_t)GPW * N * 128); };
    auto wsm = [&](int b) { return xb(b) + (size_t)GPW * N * 128 + (size_t)N * XL * 4 + (size_t)warp * TCV_WSM(GPW); };
    auto copy_w = [&](int ks, int b) { tcv_tile_async<GPW>(m, wrow, m.rows - (int)wrow, ks * GPW, wsm(b)); };
    auto copy_x = [&](int ks, int b) {
        wg_tokens_issue<N>(xb(b), PRE ? a.xs.perm : a.x, a.ldx, 0, nT, GPW, ks * GPW * QGROUP);
        if (PRE) /* the slice's Σx of each token: two 16-byte pieces (8 groups) into its row of XL */
            for (int i = tid; i < 2 * nT; i += blockDim.x)
                cpa16(xsum(b) + (i >> 1) * XL + 4 * (i & 1),
                      a.xs.gsum + (size_t)(i >> 1) * (a.ldx / QGROUP) + ks * GPW + 4 * (i & 1));
    };
    /* commit groups in order: W0, W1, X0, X1, then one a slice (slice ks + 2, maybe empty):
     * at slice ks, all but the newest group have landed <=> its weights and tokens have */
    pdl_trigger();
    copy_w(0, 0);
    cpa_commit();
    if (KS > 1) copy_w(1, 1);
    cpa_commit();
    pdl_wait();
    copy_x(0, 0);
    cpa_commit();
    if (KS > 1) copy_x(1, 1);
    cpa_commit();

    float total[N / 8][4];
#pragma unroll
    for (int j = 0; j < N / 8; j++) total[j][0] = total[j][1] = total[j][2] = total[j][3] = 0.0f;
#pragma unroll 1
    for (int ks = 0; ks < KS; ks++) {
        const int b = ks & 1;
        cpa_wait<1>();
        __syncthreads();
        trace_mark(TRACE_MARK4); /* (thread 0's) slice landed */
        if (PRE) { /* the copied rows (and the zeroed ones past nT), to wgmma's reads */
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();
        } else {
            wg_tokens_finish<N>(xb(b), xsum(b), XL, nT, GPW);
        }
        trace_mark(TRACE_MARK5); /* tokens summed and reordered */
        float acc[N / 8][4];
#pragma unroll
        for (int j = 0; j < N / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        const uint32_t xb_s = (uint32_t)__cvta_generic_to_shared(xb(b));
        const unsigned char *ws = wsm(b);
        const float *xs = xsum(b);
        /* two groups in flight: group gi + 1's wgmma issued before group gi's sums are
         * scaled (one block an SM: nothing else hides a group's round trip); the scaling
         * stays in group order */
        float cga[N / 2], cgb[N / 2];
        uint32_t afa[4][4], afb[4][4]; /* each group's A fragments, live until its wait */
        sk_w fa = tcv_smem_group<GPW>(ws, 0, gq, c), fb;
        sk_frags<false>(fa, afa);
        wg_group_issue_af<N>(afa, xb_s, cga);
        /* group gi into the x set, then group gi − 1's sums (the y set) scaled and its
         * fragments released */
        auto step = [&](int gi, sk_w &fx, uint32_t(&afx)[4][4], float(&cgx)[N / 2], const sk_w &fy,
                        uint32_t(&afy)[4][4], float(&cgy)[N / 2]) {
            fx = tcv_smem_group<GPW>(ws, gi, gq, c);
            sk_frags<false>(fx, afx);
            wg_group_issue_af<N>(afx, xb_s + (uint32_t)(gi * N * 128), cgx);
            wg_group_scale<N, 1>(fy, cgy, xs + gi - 1, XL, c, acc);
            reg_fence(*reinterpret_cast<uint32_t(*)[16]>(&afy));
        };
#pragma unroll /* rolled, ptxas serialised the wgmma (C7513: trap 56) */
        for (int gi = 1; gi < GPW - 1; gi += 2) {
            step(gi, fb, afb, cgb, fa, afa, cga);
            step(gi + 1, fa, afa, cga, fb, afb, cgb);
        }
        step(GPW - 1, fb, afb, cgb, fa, afa, cga);
        wg_group_scale<N, 0>(fb, cgb, xs + GPW - 1, XL, c, acc);
        reg_fence(*reinterpret_cast<uint32_t(*)[16]>(&afb));
#pragma unroll
        for (int j = 0; j < N / 8; j++) {
            total[j][0] += acc[j][0]; total[j][1] += acc[j][1];
            total[j][2] += acc[j][2]; total[j][3] += acc[j][3];
        }
        trace_mark(TRACE_MARK6); /* (warp 0's) slice's products added */
        __syncthreads(); /* every warp is done with buffer b (its wgmma waited for in wg_group_scale) */
        if (ks + 2 < KS) {
            copy_w(ks + 2, b);
            copy_x(ks + 2, b);
        }
        cpa_commit();
    }
    /* rows r0, r0 + 8 of matrix s; tokens 8j + 2c, 8j + 2c + 1 */
    float *y = a.y[pl.s];
    const int ldy = a.ldy[pl.s];
#pragma unroll
    for (int j = 0; j < N / 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int t = 8 * j + 2 * c + (e & 1), r = pl.r0 + 8 * (e >> 1);
            if (t >= nT || r >= m.rows) continue;
            float *o = y + (size_t)t * ldy + r;
            *o = a.accumulate ? *o + total[j][e] : total[j][e];
        }
    }
#endif
}

/* Tokens [64][GPW·64 + 8] bf16, then Σx [64][GPW + 4] fp32: the padding puts the 4 token
 * columns (2c) a quarter-warp reads in distinct banks (unpadded, GPW = 8 read them 2-way
 * and GPW = 16 4-way conflicted). */
static size_t sw_smem(int gpw) { return (size_t)SW_MAX_T * (gpw * QGROUP + 8) * 2 + (size_t)SW_MAX_T * (gpw + 4) * 4; }

/* Groups a block's slice covers for K (0: not this path). Slices of 4 groups (K = 512:
 * the shared expert's down projection) stay on cuda_skinny.cu: 32 blocks for its 2,048
 * rows measured 27.7 µs against 17.1 there (64 tokens, H200). */
static int sw_gpw(int K) {
    const int ks = cuda_skinny_kslices(K), G = K / QGROUP;
    if (!ks || G % ks || ks > SW_MAX_KS) return 0;
    const int gpw = G / ks;
    return gpw == 8 || gpw == 16 ? gpw : 0;
}

extern "C" int cuda_skinny_wide_init(char *err, size_t errlen) {
    if (sw_part) return 0;
    const int n_sm = cuda_sm_count();
    if (n_sm < 1) return errorf(err, errlen, ST_DEVICE, "skinny_wide: cannot read the multiprocessor count");
    sw_sms = n_sm;
    const size_t bytes = (size_t)SW_MAX_TILES * SW_MAX_KS * SW_MAX_T * SW_ROWS * 4;
    int rc = cuda_malloc((void **)&sw_part, bytes, "skinny_wide partial sums", err, errlen);
    if (!rc) rc = cuda_malloc((void **)&sw_cnt, SW_MAX_TILES * sizeof(int), "skinny_wide counters", err, errlen);
    if (!rc) rc = cuda_memset0(sw_cnt, SW_MAX_TILES * sizeof(int), err, errlen);
    if (rc) return rc;
    /* Each form needs its shared memory within the device's opt-in (the mma.sync form 70 KB
     * at K = 2,048, 137 KB at 4,096; the wgmma form up to 206 KB): a slice width or form that
     * does not fit stays off — its launches go to cuda_skinny.cu, the same bits — instead of
     * failing the backend (99 KB on sm_86 / sm_89; 163 KB on an A100, where the sm_90a form
     * cannot run anyway). */
    cuda_caps caps;
    if (device_caps(&caps) != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny_wide: device attributes unavailable");
    cudaError_t e = cudaSuccess;
#define SW_ATTR(G, S, N)                                                                                                \
    if (e == cudaSuccess && sw_smem(G) <= (size_t)caps.optin)                                                           \
        e = cudaFuncSetAttribute(sw_kernel<G, S, N>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sw_smem(G));
    SW_ATTR(8, false, 1) SW_ATTR(8, false, 2) SW_ATTR(16, false, 1) SW_ATTR(16, false, 4)
    SW_ATTR(8, true, 1) SW_ATTR(8, true, 2) SW_ATTR(16, true, 1) SW_ATTR(16, true, 4)
#undef SW_ATTR
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny_wide: cudaFuncSetAttribute failed: %s", cudaGetErrorString(e));
    sw_gpw_ok[0] = sw_smem(8) <= (size_t)caps.optin;
    sw_gpw_ok[1] = sw_smem(16) <= (size_t)caps.optin;
    if (env_flag("ORCHID_SW_NOWG") || sw_wg_smem<64>(16) > (size_t)caps.optin) return 0;
    const int code = cuda_sm90a_code(err, errlen);
    if (code < 0) return code;
    if (code != 1) return 0;
#define SW_WG_ATTR(G, S, N)                                                                                             \
    if (e == cudaSuccess) e = cudaFuncSetAttribute(sw_wg_kernel<G, S, N>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sw_wg_smem<N>(G));
    SW_WG_ATTR(8, false, 32) SW_WG_ATTR(8, false, 64) SW_WG_ATTR(16, false, 32) SW_WG_ATTR(16, false, 64)
    SW_WG_ATTR(8, true, 32) SW_WG_ATTR(8, true, 64) SW_WG_ATTR(16, true, 32) SW_WG_ATTR(16, true, 64)
#undef SW_WG_ATTR
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny_wide: cudaFuncSetAttribute (wgmma form) failed: %s",
                                        cudaGetErrorString(e));
    sw_wg = true;
    if (swl_smem<64>() <= (size_t)caps.optin) {
#define SWL_ATTR(N, P) \
    if (e == cudaSuccess) e = cudaFuncSetAttribute(sw_wgl_kernel<N, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)swl_smem<N>());
        SWL_ATTR(32, false) SWL_ATTR(64, false) SWL_ATTR(32, true) SWL_ATTR(64, true)
#undef SWL_ATTR
        if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny_wide: cudaFuncSetAttribute (looped form) failed: %s",
                                            cudaGetErrorString(e));
        sw_wgl = true;
    }
    return 0;
}

/* Whether this path takes the launch: 9..64 tokens, tiles that fit the workspace, a slice
 * width it has (all matrices 4-bit with the same columns: the caller checked). */
static bool sw_takes(int T, int K, int tiles) {
    static const bool off = env_flag("ORCHID_NO_WIDE");
    const int gpw = sw_gpw(K);
    return sw_part && !off && T > 8 && T <= SW_MAX_T && tiles <= SW_MAX_TILES && gpw != 0 && sw_gpw_ok[gpw == 16];
}

/* Row tiles of a launch: SW_ROWS rows of each matrix, or SW_ROWS / 2 gate (and up) rows. */
static int sw_dense_tiles(const struct cuda_gemv_seg *segs, int n_segs) {
    int tiles = 0;
    for (int i = 0; i < n_segs; i++) tiles += (segs[i].m.rows + SW_ROWS - 1) / SW_ROWS;
    return tiles;
}
static int sw_swiglu_tiles(const struct cuda_qmat *gate) { return (gate->rows + SW_ROWS / 2 - 1) / (SW_ROWS / 2); }

extern "C" int cuda_skinny_wide_max_rows(void) { return SW_MAX_TILES * SW_ROWS; }

extern "C" int cuda_skinny_wide_takes_dense(const struct cuda_gemv_seg *segs, int n_segs, int T) {
    return sw_takes(T, segs[0].m.cols, sw_dense_tiles(segs, n_segs));
}
extern "C" int cuda_skinny_wide_takes_swiglu(const struct cuda_qmat *gate, int T) {
    return sw_takes(T, gate->cols, sw_swiglu_tiles(gate));
}

/* The fields both forms set: tokens and the workspace. */
static sw_args sw_args_for(const uint16_t *x, int ldx, int T) {
    sw_args a;
    memset(&a, 0, sizeof a);
    a.x = x;
    a.ldx = ldx;
    a.T = T;
    a.part = sw_part;
    a.cnt = sw_cnt;
    return a;
}

/* Blocks a launch's (tile, slice) pairs are split into along the tokens: the most of 1,
 * 2, 4, 8 (at most one n-tile a block) that still fits one wave (resident blocks: 1 an SM
 * at GPW 16, 2 at 8). A launch of few tiles otherwise leaves SMs idle while each of its
 * blocks runs all n-tiles (H200, 64 tokens: the out-projection, 64 blocks on 132 SMs,
 * 21 µs of products a block; the shared expert's gate/up, 32 blocks). The sums of a
 * (row, token) do not depend on the split. */
static int sw_nsplit(int blocks, int ntt, int gpw) {
    static const bool off = env_flag("ORCHID_SW_NOSPLIT");
    const int wave = sw_sms * (gpw == 16 ? 1 : 2);
    int ns = 1;
    while (!off && ns * 2 <= ntt && ns < 8 && blocks * ns * 2 <= wave) ns *= 2;
    return ns;
}

/* Blocks of the wgmma form along the tokens: 33..64 tokens as two blocks of 32 columns when
 * the launch's (tile, slice) pairs fill at most half of the SMs (the GDN out-projection and
 * attention o, 64 blocks; the shared expert's gate/up, 32), else every token in one block.
 * A block stages 32 tokens × its slice (the larger operand at 64 tokens: 64 KB of tokens
 * against 32 KB of weights at K = 2,048 slices of 8 groups) and its products are half as
 * long; the weights are read twice, from L2 the second time. H200, alone at 64 tokens:
 * out-projection 22.2 -> 18.7 µs, o 21.8 -> 18.4, shared gate/up 15.7 -> 13.1; forward of
 * 64 sequences 13.55 -> 13.16 ms. Measured and not kept (docs/PERFORMANCE.md, session 20):
 * the split for every launch (the in-projection's 392 blocks: 30 -> 37 µs) and blocks of
 * 16 columns at 9..32 tokens (forwards at 16..32 slower). The sums of a (row, token) do not
 * depend on the split. ORCHID_SW_WG_NOSPLIT=1: one block (A/B). */
static int sw_wg_nsplit(int blocks, int T) {
    static const bool off = env_flag("ORCHID_SW_WG_NOSPLIT");
    return !off && T > 32 && 2 * blocks <= sw_sms ? 2 : 1;
}

/* Whether a dense launch goes to sw_wgl_kernel: slices of 8 groups, and tiles enough for
 * half the SMs at least but no more than one wave (one block an SM); fewer tiles keep the
 * split form, whose (tile, slice) blocks fill the SMs. ORCHID_SW_NOLOOP=1: never (A/B). */
static bool sw_wgl_takes(int tiles, int gpw) {
    static const bool off = env_flag("ORCHID_SW_NOLOOP");
    if (!sw_wgl || gpw != SWL_GPW || sw_wgl_force == 0) return false;
    return sw_wgl_force == 1 || (!off && 2 * tiles >= sw_sms && tiles <= sw_sms);
}

extern "C" int cuda_skinny_wide_reads_stage(const struct cuda_gemv_seg *segs, int n_segs, int T) {
    const int tiles = sw_dense_tiles(segs, n_segs);
    return sw_takes(T, segs[0].m.cols, tiles) && sw_wgl_takes(tiles, sw_gpw(segs[0].m.cols));
}

extern "C" int cuda_skinny_wide_force_loop(int mode) {
    sw_wgl_force = mode;
    return sw_wgl;
}
extern "C" int cuda_skinny_wide_loop_launches(void) { return sw_wgl_count; }

/* One launch, the slice width picked from K (the caller asked sw_takes). */
template <bool SWIGLU>
static int sw_go(const struct cuda_ctx *c, const sw_args &a, int tiles, int K) {
    const int gpw = sw_gpw(K), ks = (K / QGROUP) / gpw;
    if (!sw_takes(a.T, K, tiles)) return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_wide: %d tokens, K %d", a.T, K);
    const char *what = SWIGLU ? "skinny_wide_swiglu" : "skinny_wide";
    if (!SWIGLU && sw_wgl_takes(tiles, gpw)) { /* every slice of a tile in one block */
        sw_wgl_count++;
        const bool pre = a.xs.perm != NULL;
        void (*k)(sw_args, int) = a.T > 32 ? (pre ? sw_wgl_kernel<64, true> : sw_wgl_kernel<64, false>)
                                           : (pre ? sw_wgl_kernel<32, true> : sw_wgl_kernel<32, false>);
        const size_t smem = a.T > 32 ? swl_smem<64>() : swl_smem<32>();
        LAUNCH_CHECK_RC(c, launch_k_pdl(sk_pdl(), k, dim3(tiles), dim3(256), smem, cstream(c), a, ks), "skinny_wide_loop");
    }
    if (sw_wg) { /* the wgmma form: N = 32 or 64 token columns a block, one block or (sw_wg_nsplit) two along the tokens */
        const int nz = sw_wg_nsplit(tiles * ks, a.T);
        const bool n64 = a.T > 32 && nz == 1;
        void (*k)(sw_args) = gpw == 16 ? (n64 ? sw_wg_kernel<16, SWIGLU, 64> : sw_wg_kernel<16, SWIGLU, 32>)
                                       : (n64 ? sw_wg_kernel<8, SWIGLU, 64> : sw_wg_kernel<8, SWIGLU, 32>);
        const size_t smem = n64 ? sw_wg_smem<64>(gpw) : sw_wg_smem<32>(gpw);
        LAUNCH_CHECK_RC(c, launch_k_pdl(sk_pdl(), k, dim3(tiles, ks, nz), dim3(256), smem, cstream(c), a), what);
    }
    /* n-tiles whose mma chains interleave (sk_group_steps): 4 at GPW 16 (one block an SM;
     * 8 took it from 191 to 216 registers and measured slower in the forwards), 2 at GPW 8
     * (two blocks an SM, 128 registers: 4 spilled 72 bytes). H200, forwards at 16 / 32 / 64
     * sequences 7.75 / 10.87 / 15.97 -> 7.70 / 10.72 / 15.70 ms (docs/PERFORMANCE.md, session
     * 18). ORCHID_SW_NOIL=1: one n-tile at a time (A/B). */
    static const bool il = !env_flag("ORCHID_SW_NOIL");
    const dim3 grid(tiles, ks, sw_nsplit(tiles * ks, (a.T + 7) / 8, gpw));
    const size_t smem = sw_smem(gpw);
    void (*k)(sw_args) = gpw == 16 ? (il ? sw_kernel<16, SWIGLU, 4> : sw_kernel<16, SWIGLU, 1>)
                                   : (il ? sw_kernel<8, SWIGLU, 2> : sw_kernel<8, SWIGLU, 1>);
    LAUNCH_CHECK_RC(c, launch_k_pdl(sk_pdl(), k, grid, dim3(256), smem, cstream(c), a), what);
}

extern "C" int cuda_skinny_wide_dense(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs,
                                      const uint16_t *x, int T, int ldx, const struct cuda_xstage *xs) {
    sw_args a = sw_args_for(x, ldx, T);
    if (xs && xs->perm) {
        if (!xs->gsum || ldx % (4 * QGROUP) || (((uintptr_t)xs->perm | (uintptr_t)xs->gsum) & 15))
            return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_wide: staged rows of stride %d not aligned", ldx);
        a.xs = *xs;
    }
    a.nseg = n_segs;
    a.accumulate = segs[0].accumulate;
    int tiles = 0;
    for (int i = 0; i < n_segs; i++) {
        a.w[i] = segs[i].m;
        a.y[i] = segs[i].y;
        a.ldy[i] = segs[i].ldy;
        a.blk0[i] = tiles;
        tiles += (segs[i].m.rows + SW_ROWS - 1) / SW_ROWS;
    }
    a.blk0[n_segs] = tiles;
    return sw_go<false>(c, a, tiles, segs[0].m.cols);
}

extern "C" int cuda_skinny_wide_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                       const uint16_t *x, int T, int ldx, uint16_t *act, int ld_act) {
    sw_args a = sw_args_for(x, ldx, T);
    a.nseg = 1;
    a.w[0] = *gate;
    a.up = *up;
    a.act = act;
    a.ld_act = ld_act;
    a.blk0[1] = sw_swiglu_tiles(gate);
    return sw_go<true>(c, a, a.blk0[1], gate->cols);
}

CUDA_TRACE_TU(skinny_wide)
