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
 * 219,648 bytes at K = 2,048 (the generic instance, any K up to 2,048) */
static constexpr size_t tw_smem(int K) {
    return 1024 + (size_t)(K / QGROUP) * TW_N * 128 + (size_t)TW_N * (K / QGROUP + 4) * 4 + (size_t)4 * TW_WGS * TW_ST * TW_WSM;
}

/* ---- K = 2,048 (the lm_head): tall_wg_kernel<GPW>, GPW = 8 (K's slice width; 4 compiles too) ----
 * The generic instance (GPW 0: G and the slice width at run time) spent ~219 SASS a group and
 * warp of which ~58 are the scale and ~30 the dequantisation; the rest was the step's
 * divisions (s / SPT, s % SPT, s % TW_ST, (g0 + 4) % gpw), tcv_tile_async's per-lane address
 * arithmetic and zero-fill branches, a descriptor rebuilt every k16 step, 8 scalar Σx loads a
 * group and a guarded tile end. Here G = 32 (8 steps of 4 groups a tile) and the slice width
 * are compile-time: a tile is a loop of its 8 steps (not unrolled: one step's code, ~560 SASS,
 * stays in the instruction cache), a slice ending where g0 & (GPW - 1) == GPW - 4, the tile's
 * stores after the loop; the ring's stage offsets rotate by a compare; the copy of a tile
 * whose 16 rows are in the matrix (all but perhaps the last) is tk_copy (per-lane offsets
 * hoisted, the same bytes to the same shared addresses), the partial one tcv_tile_async; the
 * descriptors are one per block plus constants; the tokens' Σx are re-laid once into xq
 * (below) for two vector loads a group, a step's scales and biases are 4 8-byte loads; a full
 * tile of 32 tokens is stored unguarded. SASS a group and warp (K = 2,048, gpw 8): ~219 -> ~141.
 * Bits: every product, scale step, slice sum and store is the generic instance's operation on
 * the same values in the same order (the arithmetic is sk_frags, the same wgmma k16 steps,
 * sk_group_scale and the same adds: see tk_scale and the loop). Measured (H100, session 47,
 * the 64-sequence step's lm_head): 353.5 -> 261.5 µs a call, bitwise (test_cuda_ops); on by
 * default (ORCHID_TL_K2048=0: the generic instance, the A/B). */
#define TK_G 32          /* groups of K = 2,048 */
#define TK_SPT (TK_G / 4) /* a tile's steps */
#define TK_RB (TK_G * 32) /* a row's code bytes */

/* the generic layout, then xq [G][c 4][j 4][e 2] fp32 (token 8j + 2c + e's Σx of group g:
 * lane c's 8 sums of a group contiguous) before the ring: 223,744 bytes */
static constexpr size_t tk_smem() { return tw_smem(TK_G * QGROUP) + (size_t)TK_G * TW_N * 4; }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Group gi of a warp's step in wsm into four wgmma of the tokens' group grp (wg_group_issue,
 * the LOP3 form); returns the group's scales and biases for its scale after the wait. */
__device__ __forceinline__ sk_w tw_issue(const unsigned char *wsm, int gi, int gq, int c, uint32_t xb_s, int grp,
                                         float (&cg)[TW_N / 2]) {
    const sk_w f = tcv_smem_group<4>(wsm, gi, gq, c);
    wg_group_issue<TW_N, true>(f, xb_s + (uint32_t)(grp * TW_N * 128), cg);
    return f;
}

/* A slice's end: its sums onto the slices before (tot from 0, in slice order), acc zeroed. */
__device__ __forceinline__ void tw_slice_end(float (&acc)[TW_N / 8][4], float (&tot)[TW_N / 8][4]) {
#pragma unroll
    for (int j = 0; j < TW_N / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            tot[j][e] += acc[j][e];
            acc[j][e] = 0.0f;
        }
}

/* A tile's end: lane c's rows r, r + 8 and tokens 8j + 2c (+ 1) of the block's t0.., those
 * inside the matrix and below nT stored (accumulate: onto the old values), tot zeroed. */
__device__ __forceinline__ void tw_store_tile(float *y, int ldy, int t0, int r, int c, int nT, int rows, int accumulate,
                                              float (&tot)[TW_N / 8][4]) {
#pragma unroll
    for (int j = 0; j < TW_N / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int tok = 8 * j + 2 * c + (e & 1), rr = r + 8 * (e >> 1);
            if (tok < nT && rr < rows) {
                float *d = y + (size_t)(t0 + tok) * ldy + rr;
                *d = accumulate ? *d + tot[j][e] : tot[j][e];
            }
            tot[j][e] = 0.0f;
        }
}

/* One step's copy of a tile whose 16 rows are all in the matrix: tcv_tile_async<4>'s bytes to
 * its shared addresses, the same instructions (cp.async.cg 16 bytes, .ca 8), its per-lane
 * offsets hoisted. Its i = lane + 32k (k = 0..3) is row r = (lane >> 3) + 4k, chunk ch =
 * lane & 7, with r & 3 = lane >> 3: the source is src + 4,096·k (src: row lane >> 3, chunk ch
 * of the step's first group: codes + (row0 + (lane >> 3))·1,024 + 128·step + 16·ch) and the
 * destination dst + 512·k (dst: the stage + (lane >> 3)·128 + ((ch >> 1) ^ (lane >> 3))·32 +
 * (ch & 1)·16); then lane l < 16 copies row l's 4 scales, l ≥ 16 row l - 16's 4 biases (ssrc:
 * 8 bytes) to sdst = the stage + 2,048 + (l >> 4)·128 + (l & 15)·8. */
__device__ __forceinline__ void tk_copy(const unsigned char *src, const uint16_t *ssrc, uint32_t dst, uint32_t sdst) {
#pragma unroll
    for (int k = 0; k < 4; k++)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + 512 * k), "l"(src + 4096 * k));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(sdst), "l"(ssrc));
}

/* Element gi (0..3, compile-time) of 4 bf16 in w as fp32: bf(sb[.. + gi]) of tcv_smem_group. */
__device__ __forceinline__ float tk_bf(uint2 w, int gi) {
    const uint32_t v = gi < 2 ? w.x : w.y;
    return gi & 1 ? bf_hi(v) : bf_lo(v);
}

/* Group gi of a step's stage wsm as tcv_smem_group<4>'s sk_w for lane (gq, c): code words at
 * wsm + gq·128 + ((gi ^ (gq & 3))·32) + 8c and 1,024 on (row gq + 8); its scales and biases
 * from sb, the step's [s0, s1, b0, b1] (rows gq, gq + 8: 4 bf16 each, one 8-byte load). */
__device__ __forceinline__ sk_w tk_group(const unsigned char *wq_lane, int gi, int qx, const uint2 (&sb)[4]) {
    sk_w f;
    const unsigned char *p = wq_lane + ((gi ^ qx) << 5);
    f.q0 = *reinterpret_cast<const uint2 *>(p);
    f.q1 = *reinterpret_cast<const uint2 *>(p + 1024);
    f.s0 = tk_bf(sb[0], gi);
    f.s1 = tk_bf(sb[1], gi);
    f.b0 = tk_bf(sb[2], gi);
    f.b1 = tk_bf(sb[3], gi);
    return f;
}

/* wg_group_issue<TW_N, true> with the group's first descriptor given: sk_frags' LOP3 form,
 * then k16 step st's descriptor desc + 2·st (wg_desc(xg_s + 32·st): the address field is
 * the shared address >> 4, below 2^14 — every shared address of the block is below 2^18 —
 * so 32 bytes on is 2 on in the low word with no carry into the LBO field at bit 16), the
 * same fences and the same four wgmma (wg_group_issue_desc: the first writes, three add), one
 * commit group. */
__device__ __forceinline__ void tk_issue(const sk_w &f, uint32_t dlo, uint32_t dhi, float (&cg)[TW_N / 2]) {
    uint32_t af[4][4];
    sk_frags<true>(f, af);
    uint64_t d[4];
#pragma unroll
    for (int st = 0; st < 4; st++) d[st] = (uint64_t)dhi << 32 | (dlo + 2 * st);
    wg_group_issue_desc<TW_N>(af, d, cg);
}

/* wg_group_scale<TW_N, W> with the group's Σx from xq (lane c's 8 sums: two 16-byte loads,
 * issued before the wait; sx[2j + e] = token 8j + 2c + e's, the value wg_group_scale reads
 * from xsum[(8j + 2c + e)·ld]): the wait, the fence, then sk_group_scale for n-tiles j = 0..3
 * in order — the same function on the same values. */
template <int W>
__device__ __forceinline__ void tk_scale(const sk_w &f, float (&cg)[TW_N / 2], const float *xq_g, float (*acc)[4]) {
    const float4 lo = reinterpret_cast<const float4 *>(xq_g)[0], hi = reinterpret_cast<const float4 *>(xq_g)[1];
    const float sx[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(W) : "memory");
    reg_fence(cg);
#pragma unroll
    for (int j = 0; j < TW_N / 8; j++) {
        const float cj[4] = {cg[4 * j], cg[4 * j + 1], cg[4 * j + 2], cg[4 * j + 3]};
        sk_group_scale(f, cj, sx[2 * j], sx[2 * j + 1], acc[j]);
    }
}

/* The K = 2,048 body (see above): the generic one's steps, copies, waits and arithmetic in
 * the same order. */
template <int GPW>
__device__ __forceinline__ void tk_run(const cuda_qmat &m, const uint16_t *x, int ldx, int T, float *y, int ldy,
                                       int accumulate) {
    static_assert(GPW == 4 || GPW == 8, "tall_wg_kernel: a slice of 4 or 8 groups");
    constexpr int G = TK_G, xs_ld = G + 4;
    extern __shared__ __align__(16) unsigned char sm[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(sm);
    unsigned char *xb = sm + ((1024 - (raw_s & 1023)) & 1023);
    const uint32_t xb_s = (uint32_t)__cvta_generic_to_shared(xb);
    float *xsum = reinterpret_cast<float *>(xb + (size_t)G * TW_N * 128);
    float *xq = xsum + TW_N * xs_ld;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, c = lane & 3, wq = warp & 3;
    /* 128-byte aligned (xb + 131,072 + 4,608 + 4,096, stages of 2,304 = 18·128): tk_group's XOR */
    unsigned char *ring = reinterpret_cast<unsigned char *>(xq + G * TW_N) + (size_t)warp * TW_ST * TW_WSM;
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    const int t0 = (int)blockIdx.y * TW_N, nT = min(TW_N, T - t0);
    const int n_tiles = (m.rows + 63) / 64, wg0 = (int)blockIdx.x * TW_WGS + (warp >> 2), wgs = (int)gridDim.x * TW_WGS;
    const int mine = wg0 < n_tiles ? (n_tiles - 1 - wg0) / wgs + 1 : 0;
    /* the warp's tiles whose 16 rows are all in the matrix: all but perhaps the last */
    const int full = mine > 0 && (wg0 + (mine - 1) * wgs) * 64 + wq * 16 + 16 > m.rows ? mine - 1 : mine;

    /* the next copy: tile it of the warp's, step iu of it, into stage offset io; its lane's
     * code source ic (row r0 + (lane >> 3), chunk lane & 7 of the step's groups) and scale or
     * bias source isb (row r0 + (lane & 15), the step's first group) — 128 bytes and 4 bf16 a
     * step, and from a tile's last step to the next tile's first wgs·64 rows less 7 steps */
    const int r00 = wg0 * 64 + wq * 16;
    const unsigned char *ic =
        reinterpret_cast<const unsigned char *>(m.codes) + ((size_t)r00 + (lane >> 3)) * TK_RB + (lane & 7) * 16;
    const uint16_t *isb = (lane < 16 ? m.scales : m.biases) + ((size_t)r00 + (lane & 15)) * G;
    const uint32_t cdst = (lane >> 3) * 128 + ((((lane & 7) >> 1) ^ (lane >> 3)) << 5) + (lane & 1) * 16;
    const uint32_t sdst = 4 * 512 + (lane >> 4) * 128 + (lane & 15) * 8;
    const size_t cjump = (size_t)wgs * 64 * TK_RB - (TK_SPT - 1) * 128, sjump = (size_t)wgs * 64 * G - (TK_SPT - 1) * 4;
    int it = 0, iu = 0;
    uint32_t io = 0;
    auto issue = [&]() { /* the generic issue(s) for the next s: always a commit group */
        if (it < full) tk_copy(ic, isb, ring_s + io + cdst, ring_s + io + sdst);
        else if (it < mine) { /* the partial last tile: rows past the matrix zeroed */
            const int r0 = (wg0 + it * wgs) * 64 + wq * 16;
            tcv_tile_async<4>(m, (size_t)r0, m.rows - r0, iu * 4, ring + io);
        }
        cpa_commit();
        const bool last = iu == TK_SPT - 1;
        ic += last ? cjump : (size_t)128;
        isb += last ? sjump : (size_t)4;
        it += last;
        iu = last ? 0 : iu + 1;
        io = io == (TW_ST - 1) * TW_WSM ? 0 : io + TW_WSM;
    };
    pdl_trigger();
    for (int s = 0; s < TW_ST - 1; s++) issue(); /* weights: before the wait */
    pdl_wait();
    wg_stage_tokens<TW_N>(xb, xsum, xs_ld, x, ldx, t0, nT, G, 0);
    /* xq[g][c][j][e] = token 8j + 2c + e's Σx of group g, copied (tokens past nT, never
     * stored: 0; the generic instance reads xsum's unwritten rows for them) */
    for (int i = tid; i < G * TW_N; i += blockDim.x) {
        const int g = i >> 5, t = 8 * ((i >> 1) & 3) + 2 * ((i >> 3) & 3) + (i & 1);
        xq[i] = t < nT ? xsum[t * xs_ld + g] : 0.0f;
    }
    __syncthreads();

    const unsigned char *wq_lane = ring + gq * 128 + c * 8; /* + the stage: tk_group's code words */
    const float *xq_lane = xq + c * 8;                         /* + 32 g: lane c's Σx of group g */
    const uint64_t desc0 = wg_desc(xb_s); /* low word + 256 g: group g's first k16 step (tk_issue) */
    const uint32_t dlo0 = (uint32_t)desc0;
    const uint32_t dhi = (uint32_t)(desc0 >> 32);
    const int qx = gq & 3;
    float acc[TW_N / 8][4], tot[TW_N / 8][4];
#pragma unroll
    for (int j = 0; j < TW_N / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = tot[j][e] = 0.0f;
    uint32_t so = 0; /* the step's stage offset (step s: stage s % TW_ST) */
    for (int ti = 0; ti < mine; ti++) {
#pragma unroll 1
        for (int g0 = 0; g0 < G; g0 += 4) { /* the tile's steps: groups g0 .. g0 + 3 */
            { /* the generic loop's step: its copy, wait and four groups, two in flight */
                __syncwarp(); /* every lane is past the previous step, whose stage issue() refills */
                issue();
                cpa_wait<TW_ST - 1>();
                __syncwarp();
                const unsigned char *wl = wq_lane + so;
                const uint2 *sbp = reinterpret_cast<const uint2 *>(ring + so + 4 * 512) + gq; /* [4][16] uint2 */
                const uint2 sb[4] = {sbp[0], sbp[8], sbp[16], sbp[24]};
                const float *xg = xq_lane + g0 * 32;
                const uint32_t dg = dlo0 + g0 * 256;
                float ca[TW_N / 2], cb[TW_N / 2];
                const sk_w f0 = tk_group(wl, 0, qx, sb);
                tk_issue(f0, dg, dhi, ca);
                const sk_w f1 = tk_group(wl, 1, qx, sb);
                tk_issue(f1, dg + 256, dhi, cb);
                tk_scale<1>(f0, ca, xg, acc);
                const sk_w f2 = tk_group(wl, 2, qx, sb);
                tk_issue(f2, dg + 512, dhi, ca);
                tk_scale<1>(f1, cb, xg + 32, acc);
                const sk_w f3 = tk_group(wl, 3, qx, sb);
                tk_issue(f3, dg + 768, dhi, cb);
                tk_scale<1>(f2, ca, xg + 64, acc);
                tk_scale<0>(f3, cb, xg + 96, acc);
                so = so == (TW_ST - 1) * TW_WSM ? 0 : so + TW_WSM;
            }
            if ((g0 & (GPW - 1)) == GPW - 4) { /* a slice ends: its sum onto the slices before (from 0) */
                tw_slice_end(acc, tot);
            }
        }
        /* the tile ends: rows gq, gq + 8 of the warp's 16, tokens 8j + 2c (+ 1) */
        const int r = (wg0 + ti * wgs) * 64 + wq * 16 + gq;
        if (ti < full && nT == TW_N) { /* every (row, token) of the lane's is stored */
            float *yl = y + (size_t)(t0 + 2 * c) * ldy + r;
#pragma unroll
            for (int j = 0; j < TW_N / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float *d = yl + (size_t)(8 * j + (e & 1)) * ldy + 8 * (e >> 1);
                    *d = accumulate ? *d + tot[j][e] : tot[j][e];
                    tot[j][e] = 0.0f;
                }
        } else {
            tw_store_tile(y, ldy, t0, r, c, nT, m.rows, accumulate, tot);
        }
    }
    cpa_wait<0>(); /* no copy outlives the block (the issues past the last tile are empty groups) */
}
#endif

/* gpw: groups of a k-slice (the reduction's slices: cuda_skinny_kslices), a multiple of 4.
 * GPW 0: any K (G, gpw at run time); 8: K = 2,048 with gpw = 8 (tk_run; the launcher's only other instance). */
template <int GPW>
static __global__ void __launch_bounds__(TW_WGS * 128, 1)
    tall_wg_kernel(cuda_qmat m, const uint16_t *x, int ldx, int T, float *y, int ldy, int accumulate, int gpw) {
    TRACE_KERNEL();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (GPW != 0) {
        (void)gpw;
        tk_run<GPW>(m, x, ldx, T, y, ldy, accumulate);
        return;
    }
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
            tw_slice_end(acc, tot);
        }
        if (sg == SPT - 1) { /* the tile ends: rows gq, gq + 8 of the warp's 16, tokens 8j + 2c (+ 1) */
            const int r = (wg0 + (s / SPT) * wgs) * 64 + wq * 16 + gq;
            tw_store_tile(y, ldy, t0, r, c, nT, m.rows, accumulate, tot);
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
static int tw_grid_k = 0;  /* its K = 2,048 instance's (GPW 8; 0: the generic one takes K = 2,048) */
static int tk_on = 0;      /* it takes K = 2,048 (init: unless ORCHID_TL_K2048=0; cuda_skinny_tall_k2048_enable) */
static int tk_launches = 0;
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
    tw_grid = tw_grid_k = 0;
    const int code = cuda_sm90a_code(err, errlen);
    if (code < 0) return code;
    if (code == 1) {
        e = persistent_grid(tall_wg_kernel<0>, TW_WGS * 128, tw_smem(2048), n, optin, &tw_grid);
        if (e == cudaSuccess) e = persistent_grid(tall_wg_kernel<8>, TW_WGS * 128, tk_smem(), n, optin, &tw_grid_k);
        if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny tall (wgmma): setup: %s", cudaGetErrorString(e));
    }
    tw_on = tw_grid > 0 && !env_flag("ORCHID_TL_NOWG");
    tk_on = tw_grid_k > 0 && env_flag_or("ORCHID_TL_K2048", true); /* on by default since session 47's measurement */
    return 0;
}

extern "C" int cuda_skinny_tall_k2048_enable(int on) {
    const int was = tk_on;
    tk_on = on && tw_grid_k > 0;
    return was;
}

extern "C" int cuda_skinny_tall_k2048_launches(void) { return tk_launches; }

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
        /* K = 2,048 has slices of 8 groups (cuda_skinny_kslices is K's): tall_wg_kernel<8> */
        const int gpw = tl_gpw(m), k = m->cols == TK_G * QGROUP && gpw == 8 && tk_on, wgrid = k ? tw_grid_k : tw_grid;
        const int groups = (T + TW_N - 1) / TW_N, per = wgrid / groups > 0 ? wgrid / groups : 1;
        const dim3 wgd(per, groups), block(TW_WGS * 128);
        if (k) e = launch_k(tall_wg_kernel<8>, wgd, block, tk_smem(), cstream(c), *m, x, ldx, T, y, ldy, accumulate, gpw);
        else e = launch_k(tall_wg_kernel<0>, wgd, block, tw_smem(m->cols), cstream(c), *m, x, ldx, T, y, ldy, accumulate, gpw);
        if (e == cudaSuccess) tw_launches++, tk_launches += k;
    } else if (nti == 0) e = g8 ? tl_launch<8, 1>(c, m, x, T, ldx, y, ldy, accumulate, grid)
                         : tl_launch<4, 1>(c, m, x, T, ldx, y, ldy, accumulate, grid);
    else if (nti == 1) e = g8 ? tl_launch<8, 2>(c, m, x, T, ldx, y, ldy, accumulate, grid)
                              : tl_launch<4, 2>(c, m, x, T, ldx, y, ldy, accumulate, grid);
    else e = g8 ? tl_launch<8, 4>(c, m, x, T, ldx, y, ldy, accumulate, grid)
                : tl_launch<4, 4>(c, m, x, T, ldx, y, ldy, accumulate, grid);
    LAUNCH_CHECK_RC(c, e, "skinny_tall");
}

CUDA_TRACE_TU(skinny_tall)
