// cuda/cuda_skinny_tall.cu — a tall 4-bit matrix (the lm_head: 248,320 rows × 2,048) times
// 2..64 tokens (batched decode's logits rows). The wide form took it in chunks of 20,480
// rows: 7,760 blocks each staging a k-slice of all 64 tokens (64 KB from L2) for 32 KB of
// weights and writing 32 KB of slice partials (774 µs for 64 tokens on the H200 against 90
// for one token). Here, as cuda_tcv.cu's stream form does for one token, persistent blocks
// (one an SM) stage their tokens once — NT·8 of them, all K, rows padded by 8 bf16 so a
// fragment load's 8 token rows fall in distinct banks — and stream 32-row tiles of the
// weights through a ring of cp.async copies (tcv_tile_async), a tile's 8 warps each one
// m-tile × one k-slice; the slices meet in shared memory and are added in slice order.
// Token groups of NT·8 are blockIdx.y; the blocks of the groups walk the same tiles in the
// same order, so the other groups can find a tile in L2 (ncu, 64 rows: 48 % L2 hits). The
// form is instruction- and occupancy-bound (one 8-warp block an SM at 220 KB of shared
// memory, 42 % issue-active: docs/PERFORMANCE.md, session 10).
//
// Bits: a (row, token)'s sum is cuda_tcv.cu's for one token — per k-slice the slice's
// groups in order by sk_group_step (fmaf(s, Σ(128+q)x, (b-128s)·Σx) onto 0), the slices
// added in order from 0 (tcv_slice_sum's order) — so a token's logits are the same bits
// alone and in any batch (tests/gpu: test_skinny's tall cases, test_decode_invariance).
#include <string.h>

#include "cuda/cuda_mma.h"
#include "cuda/cuda_wgmma.h"

#define TL_WARPS 8
#define TL_MIN_ROWS 65536 /* taller than this, 2..64 tokens: this form */

/* Shared memory: xs [NT·8][K + 8] bf16 (PX order), xsum [NT·8][G], red [8 warps][NT][16][8],
 * then the ring [STAGES][8 warps][TCV_WSM(GPW)]. */
__host__ __device__ static size_t tl_head(int K, int NT) {
    const size_t n = (size_t)NT * 8;
    return (n * (K + 8) * 2 + n * (K / QGROUP) * 4 + (size_t)TL_WARPS * NT * 128 * 4 + 15) & ~(size_t)15;
}
template <int GPW, int NT, int STAGES>
static size_t tl_smem(int K) {
    return tl_head(K, NT) + (size_t)STAGES * TL_WARPS * TCV_WSM(GPW);
}

template <int GPW, int NT, int STAGES>
static __global__ void __launch_bounds__(TL_WARPS * 32, 1)
    tall_kernel(cuda_qmat m, const uint16_t *x, int ldx, int T, float *y, int ldy, int accumulate) {
    TRACE_KERNEL();
    extern __shared__ __align__(16) unsigned char sm[];
    pdl_trigger();
    constexpr int NTOK = NT * 8;
    const int K = m.cols, G = K / QGROUP, KS = G / GPW, MT = TL_WARPS / KS, XS = K + 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, c = lane & 3;
    const int mt = warp % MT, ks = warp / MT, n_tiles = (m.rows + MT * 16 - 1) / (MT * 16);
    const int lrows = __ffs(MT * 16) - 1; /* log2 of a tile's rows (MT = 8 / KS: 1, 2, 4 or 8) */
    const int t0 = blockIdx.y * NTOK, nt_tok = min(NTOK, T - t0);
    uint16_t *xs = reinterpret_cast<uint16_t *>(sm);
    float *xsum = reinterpret_cast<float *>(sm + (size_t)NTOK * XS * 2);
    float *red = xsum + NTOK * G;
    unsigned char *ring = sm + tl_head(K, NT);
    const int mine = (int)blockIdx.x < n_tiles ? (n_tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    auto issue = [&](int i) { /* the block's tile i into stage i % STAGES: this warp's m-tile and k-slice */
        if (i < mine) {
            const int r0 = (((int)blockIdx.x + i * (int)gridDim.x) * MT + mt) * 16;
            tcv_tile_async<GPW>(m, (size_t)r0, min(16, m.rows - r0), ks * GPW,
                                ring + ((size_t)(i % STAGES) * TL_WARPS + warp) * TCV_WSM(GPW));
        }
        cpa_commit();
    };
    for (int i = 0; i < STAGES - 1; i++) issue(i); /* weights: before the wait */
    pdl_wait();
    /* the group's tokens (zeros past T), then their group sums, rearranged for the k16 steps */
    for (int i = threadIdx.x; i < NTOK * (K / 8); i += blockDim.x) {
        const int v = i / (K / 8), j = i % (K / 8);
        reinterpret_cast<uint4 *>(xs + (size_t)v * XS)[j] =
            v < nt_tok ? reinterpret_cast<const uint4 *>(x + (size_t)(t0 + v) * ldx)[j] : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();
    sk_group_sums_by<true>(xs, NTOK, XS, G, xsum, threadIdx.x, blockDim.x, G);
    __syncthreads();
    for (int i = 0; i < mine; i++) {
        issue(i + STAGES - 1); /* into the stage tile i - 1 used: every warp is past it */
        cpa_wait<STAGES - 1>();
        __syncthreads();
        /* this warp's m-tile × k-slice against every n-tile: tcv_mma_smem's reads and steps */
        const unsigned char *wsm = ring + ((size_t)(i % STAGES) * TL_WARPS + warp) * TCV_WSM(GPW);
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
        for (int gi = 0; gi < GPW; gi++) {
            const int grp = ks * GPW + gi;
            const sk_w f = tcv_smem_group<GPW>(wsm, gi, gq, c);
            uint32_t af[4][4];
            sk_frags(f, af);
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                sk_group_step<true>(af, f, xs + (size_t)(nt * 8 + gq) * XS + grp * QGROUP + 16 * c,
                                    xsum[(nt * 8 + 2 * c) * G + grp], xsum[(nt * 8 + 2 * c + 1) * G + grp], acc[nt]);
        }
        /* red[warp][nt][row 0..15][token 0..7]; then (row, token) = Σ over slices in order */
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float *rw = red + ((size_t)warp * NT + nt) * 128;
            rw[gq * 8 + 2 * c] = acc[nt][0];
            rw[gq * 8 + 2 * c + 1] = acc[nt][1];
            rw[(gq + 8) * 8 + 2 * c] = acc[nt][2];
            rw[(gq + 8) * 8 + 2 * c + 1] = acc[nt][3];
        }
        __syncthreads();
        /* (row, token) pairs, rows fastest (coalesced stores); shifts only: MT·16 is a power
         * of two (ncu: the divisions of the first form were ~40 % of the kernel's instructions) */
        const int tile = (int)blockIdx.x + i * (int)gridDim.x;
        for (int o = threadIdx.x; o < (NTOK << lrows); o += blockDim.x) {
            const int tok = o >> lrows, rr = o & ((1 << lrows) - 1), mm = rr >> 4, ii = rr & 15;
            const float *rp = red + (size_t)mm * NT * 128 + (tok >> 3) * 128 + ii * 8 + (tok & 7);
            float v = 0.0f;
            for (int k = 0; k < KS; k++) v += rp[(size_t)k * MT * NT * 128];
            const int r = (tile << lrows) + rr;
            if (tok < nt_tok && r < m.rows) {
                float *d = y + (size_t)(t0 + tok) * ldy + r;
                *d = accumulate ? *d + v : v;
            }
        }
        /* red is rewritten after the next tile's barrier, which every thread passes after this */
    }
    cpa_wait<0>(); /* no copy outlives the block (the issues past `mine` are empty groups) */
}

/* ---- the same products on wgmma (sm_90a), 17..64 tokens: tall_wg_kernel ----
 * The mma.sync form above spends, per warp and group, 4 mma.sync and 2 shared loads of
 * tokens an n-tile (16 and 8 at 32 tokens), a tile's barrier and its cross-warp slice
 * reduction; ncu (session 10) had it 42 % issue-active at one 8-warp block an SM (528 µs
 * for 64 tokens on the H100, session 27, against ~95 µs of weight bytes). Here each
 * warpgroup owns whole 64-row tiles and all K: a warp's 16 rows are its A fragments
 * (tcv_smem_group, sk_frags: the same codes at the same k positions as above), the
 * block's N = 32 tokens are wgmma's B operand staged once (wg_stage_tokens: [G][N][128 B],
 * 128 KB at K = 2,048), four wgmma a group for all 32 tokens. A warp streams its rows
 * through its own ring of TW_ST steps of 4 groups (tcv_tile_async<4>: 2.3 KB, cp.async
 * issued TW_ST - 1 steps ahead; only the warp reads what it copied, so __syncwarp is the
 * only barrier after the token staging). Two groups' wgmma are in flight: a group's scale
 * runs while the next group's products do (wait_group 1). The kernel is latency-bound (~165
 * SASS a group and warp, most of them the scale's 48 FP operations and the dequantisation):
 * measured on the H100 at 64 tokens (session 28, lm_head µs a call): mma.sync form 531; 2
 * warpgroups, 4 stages, sk_frags' C form 436; the same with LOP3 402; 3 warpgroups, 3
 * stages, C form 389; 3 warpgroups and LOP3 (kept) 362.
 * Bits: a (row, token) is the mma.sync form's: each group's Σ(128 + q)·x is mma.sync's
 * (the first k16 step writes, three add — sw_wg_kernel's argument), sk_group_scale adds the
 * groups of a slice (GPW of them, in order) onto 0, and the slices' sums are added in order
 * onto 0 (tot += acc at each slice's end: the reduction's v = 0 + p0 + p1 + ...), then
 * accumulate ? old + v : v. The GPU tests compare every token of 17, 24, 33, 40 and 64 with the
 * token alone (cuda_tcv.cu), bitwise, in both forms. ORCHID_TL_NOWG=1: the mma.sync form. */
#define TW_N 32      /* tokens a block (two token groups for 33..64: blockIdx.y) */
#define TW_WGS 3     /* warpgroups a block (one block an SM) */
#define TW_ST 3      /* a warp's ring of 4-group steps */
#define TW_WSM TCV_WSM(4)

/* [align 1,024][xb G·N·128][xsum N × (G + 4) fp32][ring 4·TW_WGS warps × TW_ST × TW_WSM]:
 * 219,648 bytes at K = 2,048 */
static constexpr size_t tw_smem(int K) {
    return 1024 + (size_t)(K / QGROUP) * TW_N * 128 + (size_t)TW_N * (K / QGROUP + 4) * 4 + (size_t)4 * TW_WGS * TW_ST * TW_WSM;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Group gi of a warp's step in wsm into four wgmma of the tokens' group grp (wg_group_issue,
 * the LOP3 form); returns the group's scales and biases for its scale after the wait. */
__device__ __forceinline__ sk_w tw_issue(const unsigned char *wsm, int gi, int gq, int c, uint32_t xb_s, int grp,
                                         float (&cg)[TW_N / 2]) {
    const sk_w f = tcv_smem_group<4>(wsm, gi, gq, c);
    wg_group_issue<TW_N, true>(f, xb_s + (uint32_t)(grp * TW_N * 128), cg);
    return f;
}
#endif

/* gpw: groups of a k-slice (the reduction's slices: cuda_skinny_kslices), a multiple of 4. */
static __global__ void __launch_bounds__(TW_WGS * 128, 1)
    tall_wg_kernel(cuda_qmat m, const uint16_t *x, int ldx, int T, float *y, int ldy, int accumulate, int gpw) {
    TRACE_KERNEL();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) unsigned char sm[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(sm);
    unsigned char *xb = sm + ((1024 - (raw_s & 1023)) & 1023);
    const uint32_t xb_s = (uint32_t)__cvta_generic_to_shared(xb);
    const int G = m.cols / QGROUP, SPT = G / 4, xs_ld = G + 4; /* SPT: a tile's steps */
    float *xsum = reinterpret_cast<float *>(xb + (size_t)G * TW_N * 128);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, c = lane & 3, wq = warp & 3;
    unsigned char *ring = reinterpret_cast<unsigned char *>(xsum + (size_t)TW_N * xs_ld) + (size_t)warp * TW_ST * TW_WSM;
    const int t0 = (int)blockIdx.y * TW_N, nT = min(TW_N, T - t0);
    /* the warpgroup's tiles: wg0, wg0 + wgs, ... (every token group's blocks walk the same
     * tiles in the same order: the later ones may find them in L2) */
    const int n_tiles = (m.rows + 63) / 64, wg0 = (int)blockIdx.x * TW_WGS + (warp >> 2), wgs = (int)gridDim.x * TW_WGS;
    const int mine = wg0 < n_tiles ? (n_tiles - 1 - wg0) / wgs + 1 : 0, steps = mine * SPT;
    auto issue = [&](int s) { /* step s (tile s / SPT, groups 4·(s % SPT) ..) into its stage; always a commit group */
        if (s < steps) {
            const int r0 = (wg0 + (s / SPT) * wgs) * 64 + wq * 16;
            tcv_tile_async<4>(m, (size_t)r0, m.rows - r0, (s % SPT) * 4, ring + (size_t)(s % TW_ST) * TW_WSM);
        }
        cpa_commit();
    };
    pdl_trigger();
    for (int s = 0; s < TW_ST - 1; s++) issue(s); /* weights: before the wait */
    pdl_wait();
    wg_stage_tokens<TW_N>(xb, xsum, xs_ld, x, ldx, t0, nT, G, 0);

    float acc[TW_N / 8][4], tot[TW_N / 8][4];
#pragma unroll
    for (int j = 0; j < TW_N / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = tot[j][e] = 0.0f;
    for (int s = 0; s < steps; s++) {
        __syncwarp(); /* every lane is past step s - 1, whose stage issue() refills */
        issue(s + TW_ST - 1);
        cpa_wait<TW_ST - 1>();
        __syncwarp();
        const unsigned char *wsm = ring + (size_t)(s % TW_ST) * TW_WSM;
        const int sg = s % SPT, g0 = 4 * sg;
        float ca[TW_N / 2], cb[TW_N / 2];
        const sk_w f0 = tw_issue(wsm, 0, gq, c, xb_s, g0, ca);
        const sk_w f1 = tw_issue(wsm, 1, gq, c, xb_s, g0 + 1, cb);
        wg_group_scale<TW_N, 1>(f0, ca, xsum + g0, xs_ld, c, acc);
        const sk_w f2 = tw_issue(wsm, 2, gq, c, xb_s, g0 + 2, ca);
        wg_group_scale<TW_N, 1>(f1, cb, xsum + g0 + 1, xs_ld, c, acc);
        const sk_w f3 = tw_issue(wsm, 3, gq, c, xb_s, g0 + 3, cb);
        wg_group_scale<TW_N, 1>(f2, ca, xsum + g0 + 2, xs_ld, c, acc);
        wg_group_scale<TW_N, 0>(f3, cb, xsum + g0 + 3, xs_ld, c, acc);
        if ((g0 + 4) % gpw == 0) { /* a slice ends: its sum onto the slices before (from 0) */
#pragma unroll
            for (int j = 0; j < TW_N / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    tot[j][e] += acc[j][e];
                    acc[j][e] = 0.0f;
                }
        }
        if (sg == SPT - 1) { /* the tile ends: rows gq, gq + 8 of the warp's 16, tokens 8j + 2c (+ 1) */
            const int r = (wg0 + (s / SPT) * wgs) * 64 + wq * 16 + gq;
#pragma unroll
            for (int j = 0; j < TW_N / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int tok = 8 * j + 2 * c + (e & 1), rr = r + 8 * (e >> 1);
                    if (tok < nT && rr < m.rows) {
                        float *d = y + (size_t)(t0 + tok) * ldy + rr;
                        *d = accumulate ? *d + tot[j][e] : tot[j][e];
                    }
                    tot[j][e] = 0.0f;
                }
        }
    }
    cpa_wait<0>(); /* no copy outlives the block (the issues past `steps` are empty groups) */
#else
    pdl_trigger();
    pdl_wait();
#endif
}

/* Instances: NT = 1, 2 or 4 n-tiles (8, 16, 32 tokens a block: T rounded up to 8 up to 32,
 * then token groups of 32), GPW 4 or 8; two stages. */
#define TL_STAGES 2
static int tl_grid[3][2]; /* [NT 1/2/4][GPW 4/8]: resident blocks (0: off) */
static int tw_grid = 0;    /* tall_wg_kernel's resident blocks (0: not this device) */
static int tl_gpw(const struct cuda_qmat *m);
static int tw_on = 0;      /* the wgmma form takes 17..64 tokens (cuda_skinny_tall_wg_enable) */
static int tw_launches = 0; /* its launches (tests: the form ran) */

template <int GPW, int NT>
static cudaError_t tl_setup(int n_sm, int optin, int *grid) { /* K up to 2,048 */
    return persistent_grid(tall_kernel<GPW, NT, TL_STAGES>, TL_WARPS * 32, tl_smem<GPW, NT, TL_STAGES>(2048), n_sm, optin,
                           grid);
}

extern "C" int cuda_skinny_tall_init(char *err, size_t errlen) {
    int n = 0, optin = 0;
    cudaError_t e = device_sms_optin(&n, &optin);
    if (e == cudaSuccess) e = tl_setup<4, 1>(n, optin, &tl_grid[0][0]);
    if (e == cudaSuccess) e = tl_setup<8, 1>(n, optin, &tl_grid[0][1]);
    if (e == cudaSuccess) e = tl_setup<4, 2>(n, optin, &tl_grid[1][0]);
    if (e == cudaSuccess) e = tl_setup<8, 2>(n, optin, &tl_grid[1][1]);
    if (e == cudaSuccess) e = tl_setup<4, 4>(n, optin, &tl_grid[2][0]);
    if (e == cudaSuccess) e = tl_setup<8, 4>(n, optin, &tl_grid[2][1]);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny tall: setup: %s", cudaGetErrorString(e));
    if (env_flag("ORCHID_NO_TALL")) memset(tl_grid, 0, sizeof tl_grid); /* A/B: the wide form's chunks again */
    /* the wgmma form: sm_90a code running and its shared memory (K = 2,048) within the opt-in */
    tw_grid = 0;
    const int code = cuda_sm90a_code(err, errlen);
    if (code < 0) return code;
    if (code == 1) {
        e = persistent_grid(tall_wg_kernel, TW_WGS * 128, tw_smem(2048), n, optin, &tw_grid);
        if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny tall (wgmma): setup: %s", cudaGetErrorString(e));
    }
    tw_on = tw_grid > 0 && !env_flag("ORCHID_TL_NOWG");
    return 0;
}

extern "C" int cuda_skinny_tall_wg_enable(int on) {
    const int was = tw_on;
    tw_on = on && tw_grid > 0;
    return was;
}

extern "C" int cuda_skinny_tall_wg_launches(void) { return tw_launches; }

static int tl_nt_index(int T) { return T <= 8 ? 0 : T <= 16 ? 1 : 2; }

static int tl_gpw(const struct cuda_qmat *m) {
    const int ks = cuda_skinny_kslices(m->cols), G = m->cols / QGROUP;
    if (!ks || G % ks) return 0;
    const int gpw = G / ks;
    return gpw == 4 || gpw == 8 ? gpw : 0;
}

/* Whether this form takes the matrix for T tokens: tall, 4-bit with the one-token stream
 * form's split (4 or 8 groups a warp), K up to 2,048 (the staged tokens' room). */
extern "C" int cuda_skinny_tall_takes(const struct cuda_qmat *m, int T, int ldx) {
    if (T < 2 || T > 64 || m->rows < TL_MIN_ROWS || m->bits != 4 || m->cols > 2048 || ldx % 8) return 0;
    const int gpw = tl_gpw(m);
    return gpw && tl_grid[tl_nt_index(T)][gpw == 8] > 0 && cuda_tcv_supported(m);
}

template <int GPW, int NT>
static cudaError_t tl_launch(const struct cuda_ctx *c, const struct cuda_qmat *m, const uint16_t *x, int T, int ldx, float *y,
                             int ldy, int accumulate, int grid) {
    const int groups = (T + NT * 8 - 1) / (NT * 8);
    const int per = grid / groups > 0 ? grid / groups : 1;
    return launch_k(tall_kernel<GPW, NT, TL_STAGES>, dim3(per, groups), dim3(TL_WARPS * 32),
                    tl_smem<GPW, NT, TL_STAGES>(m->cols), cstream(c), *m, x, ldx, T, y, ldy, accumulate);
}

extern "C" int cuda_skinny_tall(const struct cuda_ctx *c, const struct cuda_qmat *m, const uint16_t *x, int T, int ldx,
                                float *y, int ldy, int accumulate) {
    if (!cuda_skinny_tall_takes(m, T, ldx))
        return errorf(c->err, c->errlen, ST_INTERNAL, "skinny tall: %d x %d for %d tokens not supported", m->rows, m->cols, T);
    const int nti = tl_nt_index(T), g8 = tl_gpw(m) == 8, grid = tl_grid[nti][g8];
    cudaError_t e;
    if (tw_on && T > 16) { /* the wgmma form: token groups of 32 (blockIdx.y) over the resident blocks */
        const int groups = (T + TW_N - 1) / TW_N, per = tw_grid / groups > 0 ? tw_grid / groups : 1;
        e = launch_k(tall_wg_kernel, dim3(per, groups), dim3(TW_WGS * 128), tw_smem(m->cols), cstream(c), *m, x, ldx, T, y,
                     ldy, accumulate, tl_gpw(m));
        if (e == cudaSuccess) tw_launches++;
    } else if (nti == 0) e = g8 ? tl_launch<8, 1>(c, m, x, T, ldx, y, ldy, accumulate, grid)
                         : tl_launch<4, 1>(c, m, x, T, ldx, y, ldy, accumulate, grid);
    else if (nti == 1) e = g8 ? tl_launch<8, 2>(c, m, x, T, ldx, y, ldy, accumulate, grid)
                              : tl_launch<4, 2>(c, m, x, T, ldx, y, ldy, accumulate, grid);
    else e = g8 ? tl_launch<8, 4>(c, m, x, T, ldx, y, ldy, accumulate, grid)
                : tl_launch<4, 4>(c, m, x, T, ldx, y, ldy, accumulate, grid);
    LAUNCH_CHECK_RC(c, e, "skinny_tall");
}

CUDA_TRACE_TU(skinny_tall)
