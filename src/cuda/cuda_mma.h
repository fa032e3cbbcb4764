// cuda/cuda_mma.h — the 4-bit tensor-core fragment helpers shared by cuda_skinny.cu (2..64
// tokens) and cuda_tcv.cu (one token): exact codes as bf16 integers, the permuted k order
// of a 64-wide quantization group, mma.sync m16n8k16. Both files build a token's sums
// from these in the same order, which is what makes one token's result the same bits
// alone (tcv) and inside a batch (skinny). See cuda_skinny.cu's header for the layout.
#ifndef ORCHID_CUDA_MMA_H
#define ORCHID_CUDA_MMA_H

#include "cuda/cuda_internal.h"
#include "cuda/cuda_wgmma.h"

/* Whether the skinny kernels (cuda_skinny.cu, cuda_skinny_wide.cu) launch with PDL:
 * their weight copies then go out while the previous kernel finishes (H200, 64 sequences:
 * see docs/PERFORMANCE.md, session 6). ORCHID_SK_NOPDL=1 launches them plainly (A/B). */
static inline bool sk_pdl() {
    static const bool off = env_flag("ORCHID_SK_NOPDL");
    return !off;
}

/* Codes j and j+4 of a word as the bf16x2 (128 + q_j, 128 + q_{j+4}), exact: the mask and the
 * bf16 128.0 pair in one LOP3 ((a & b) | c, lut 0xEA). The 128 is not subtracted here: the
 * group's Σ(128 + q)·x minus 128·Σx is taken once a row and group in sk_group_scale (the
 * bias becomes b - 128·s), which spares 16 HADD2 of a group's ~90 instructions in the
 * issue-bound grouped MoE kernels (H200, session 10; docs/PERFORMANCE.md). Written in C the
 * compiler emits an AND and an OR (a SASS LOP3 takes one immediate): 16 of a group's ~115
 * instructions in session 9 (the fused form took the grouped gate/up 158 -> 148 µs a layer,
 * down 94 -> 84, one-token decode 450 -> 469 tok/s). The wide kernel (cuda_skinny_wide.cu:
 * ~175 registers, one block an SM) keeps the C form: with the fused one its GDN
 * in-projection at 64 tokens went 46.7 -> 50.9 µs. Same values either way. */
template <bool LOP3 = true>
__device__ __forceinline__ uint32_t q_pair(uint32_t w, int j) {
    uint32_t v; /* bf16 128 + q */
    if (LOP3)
        asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(w >> (4 * j)), "n"(0x000F000F), "n"(0x43004300));
    else
        v = ((w >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
    return v;
}

__device__ __forceinline__ void mma16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* One m-tile's weights for one group: codes of rows g and g+8 (words 2c, 2c+1), scale, bias. */
struct sk_w {
    uint2 q0, q1;
    float s0, s1, b0, b1;
};

/* A fragments of the 4 k16 steps of one group (LOP3: q_pair's form). */
template <bool LOP3 = true>
__device__ __forceinline__ void sk_frags(const sk_w &w, uint32_t (&a)[4][4]) {
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const uint32_t w0 = s < 2 ? w.q0.x : w.q0.y, w1 = s < 2 ? w.q1.x : w.q1.y;
        const int j = 2 * (s & 1);
        a[s][0] = q_pair<LOP3>(w0, j);
        a[s][1] = q_pair<LOP3>(w1, j);
        a[s][2] = q_pair<LOP3>(w0, j + 1);
        a[s][3] = q_pair<LOP3>(w1, j + 1);
    }
}

/* B fragments of k16 step st from the 16 x values x[16c .. 16c+15] of a group (8 words e):
 * logical (2c, 2c+1) ↔ the pair of words ai, ai+2's low halves, (2c+8, 2c+9) ↔ high halves. */
__device__ __forceinline__ void sk_bfrag(const uint32_t (&e)[8], int st, uint32_t &b0, uint32_t &b1) {
    const int ai = (st >> 1) * 4 + (st & 1);
    b0 = __byte_perm(e[ai], e[ai + 2], 0x5410);
    b1 = __byte_perm(e[ai], e[ai + 2], 0x7632);
}

/* The 8 words of a lane's 16 x values of a group, x[16c .. 16c+15] (two 16-byte chunks lo,
 * hi), rearranged in place into the order the 4 k16 steps take them: (b0, b1) of step 0,
 * then 1, 2, 3 (sk_bfrag). Staged tokens rearranged once by the thread that sums their
 * group (sk_group_sums_by<true>) spare every warp that reads them 8 byte permutes a group
 * and n-tile (PX below); the same values reach the same mma. */
__device__ __forceinline__ void sk_bperm(uint4 &lo, uint4 &hi) {
    const uint32_t e[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint32_t b[8];
#pragma unroll
    for (int st = 0; st < 4; st++) sk_bfrag(e, st, b[2 * st], b[2 * st + 1]);
    lo = make_uint4(b[0], b[1], b[2], b[3]);
    hi = make_uint4(b[4], b[5], b[6], b[7]);
}

/* cg += the group's Σ q·x for the lane's rows (g, g + 8) and columns (2c, 2c + 1): the 4 k16
 * steps against x16 = the 16 values x[16c .. 16c+15] of the group (one token's row, or the
 * lane's token column in the skinny kernel); PX: x16 rearranged by sk_bperm. */
template <bool PX = false>
__device__ __forceinline__ void sk_group_mma(const uint32_t (&af)[4][4], const uint16_t *x16, float (&cg)[4]) {
    const uint4 *xp = reinterpret_cast<const uint4 *>(x16);
    const uint4 x0 = xp[0], x1 = xp[1];
    const uint32_t e[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int st = 0; st < 4; st++) {
        uint32_t b0, b1;
        if (PX) {
            b0 = e[2 * st];
            b1 = e[2 * st + 1];
        } else {
            sk_bfrag(e, st, b0, b1);
        }
        mma16816(cg, af[st], b0, b1);
    }
}

/* Two groups' k16 steps with their mma chains interleaved (A0 B0 A1 B1 ...): mma.sync is
 * volatile asm, kept in program order, and one group's four steps are a dependent chain, so
 * a warp running one group at a time waits out each mma's latency (one block of 8 warps an
 * SM: the pipelined gate/up's products 84 -> 64 µs a launch, H200, session 17). Each chain
 * is sk_group_mma<true>'s operations in its order (x rearranged by sk_bperm): the same
 * sums. (sk_products below stays one group at a time: interleaved there, the grouped down
 * and the dense 2..8-token launches did not move — 78.4 vs 78.7 µs, forwards within 0.3 % —
 * their blocks wait elsewhere.) */
__device__ __forceinline__ void sk_mma2(const uint32_t (&fa)[4][4], const uint32_t (&fb)[4][4], const uint16_t *xa,
                                        const uint16_t *xb, float (&ca)[4], float (&cb)[4]) {
    const uint4 a0 = reinterpret_cast<const uint4 *>(xa)[0], a1 = reinterpret_cast<const uint4 *>(xa)[1];
    const uint4 b0 = reinterpret_cast<const uint4 *>(xb)[0], b1 = reinterpret_cast<const uint4 *>(xb)[1];
    const uint32_t ea[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const uint32_t eb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
    for (int st = 0; st < 4; st++) {
        mma16816(ca, fa[st], ea[2 * st], ea[2 * st + 1]);
        mma16816(cb, fb[st], eb[2 * st], eb[2 * st + 1]);
    }
}

/* One group of one n-tile, the step every path repeats in the same order (the bitwise
 * contract of cuda_skinny.cu, cuda_skinny_wide.cu and cuda_tcv.cu): for rows (g, g + 8) ×
 * columns (2c, 2c + 1), acc += fmaf(s, Σ (128 + q)·x, (b - 128·s) · Σx), with sxa / sxb the
 * columns' Σx: s·q + b = s·(128 + q) + (b - 128·s). b - 128·s is exact in fp32 (two bf16
 * values, 128·s exact); the fp32 sums of the mma carry ~4 bits more magnitude than Σ q·x
 * did, far below the bf16 roundings of the activations around them. */
__device__ __forceinline__ void sk_group_scale(const sk_w &w, const float (&cg)[4], float sxa, float sxb, float (&acc)[4]) {
    const float b0 = fmaf(-128.0f, w.s0, w.b0), b1 = fmaf(-128.0f, w.s1, w.b1);
    acc[0] += fmaf(w.s0, cg[0], b0 * sxa);
    acc[1] += fmaf(w.s0, cg[1], b0 * sxb);
    acc[2] += fmaf(w.s1, cg[2], b1 * sxa);
    acc[3] += fmaf(w.s1, cg[3], b1 * sxb);
}
template <bool PX = false>
__device__ __forceinline__ void sk_group_step(const uint32_t (&af)[4][4], const sk_w &w, const uint16_t *x16, float sxa,
                                              float sxb, float (&acc)[4]) {
    float cg[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    sk_group_mma<PX>(af, x16, cg);
    sk_group_scale(w, cg, sxa, sxb, acc);
}

/* sk_group_step for n-tiles 0 .. nv − 1 (at most NI) of one group, their mma chains
 * interleaved: step st of every n-tile, then step st + 1 (x16 + i·xnt: n-tile i's 16 values;
 * sxa[i·snt], sxb[i·snt]: its columns' Σx). Each n-tile's chain and scale are
 * sk_group_step's operations in its order, so the sums are the same bits. One n-tile at a
 * time, ptxas kept each chain's four dependent mma back to back in the wide kernel (SASS:
 * one HMMA chain in flight a warp, one block of 8 warps an SM). x is read a half group
 * (steps 2h, 2h + 1) at a time. Used by cuda_skinny_wide.cu (the widths and the measured
 * gain are there); the tall lm_head form did not gain from it (H200, session 18: 527 -> 532
 * µs at 64 tokens) and keeps one n-tile at a time. */
template <int NI, bool PX>
__device__ __forceinline__ void sk_group_steps(const uint32_t (&af)[4][4], const sk_w &w, const uint16_t *x16, int xnt,
                                               const float *sxa, const float *sxb, int snt, int nv, float (*acc)[4]) {
    float cg[NI][4];
#pragma unroll
    for (int i = 0; i < NI; i++) cg[i][0] = cg[i][1] = cg[i][2] = cg[i][3] = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint4 e[NI];
#pragma unroll
        for (int i = 0; i < NI; i++)
            if (i < nv) e[i] = reinterpret_cast<const uint4 *>(x16 + (size_t)i * xnt)[h];
#pragma unroll
        for (int s2 = 0; s2 < 2; s2++) {
#pragma unroll
            for (int i = 0; i < NI; i++) {
                if (i >= nv) continue;
                /* PX: words 2·s2, 2·s2 + 1 of the half; else sk_bfrag's permutes of words s2, s2 + 2 */
                const uint32_t w0 = s2 ? e[i].y : e[i].x, w1 = s2 ? e[i].w : e[i].z;
                const uint32_t p0 = s2 ? e[i].z : e[i].x, p1 = s2 ? e[i].w : e[i].y;
                const uint32_t b0 = PX ? p0 : __byte_perm(w0, w1, 0x5410);
                const uint32_t b1 = PX ? p1 : __byte_perm(w0, w1, 0x7632);
                mma16816(cg[i], af[2 * h + s2], b0, b1);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NI; i++)
        if (i < nv) sk_group_scale(w, cg[i], sxa[i * snt], sxb[i * snt], acc[i]);
}

/* Σ of the 8 bf16 values of one 16-byte chunk, left to right. */
__device__ __forceinline__ float sk_chunk_sum(const uint4 q) {
    return bf_lo(q.x) + bf_hi(q.x) + bf_lo(q.y) + bf_hi(q.y) + bf_lo(q.z) + bf_hi(q.z) + bf_lo(q.w) + bf_hi(q.w);
}

/* Σ of the 64 bf16 values of one group: its 8 chunks' sums added in chunk order to 0 (the
 * fixed order every path uses). PERM: then the group is rearranged in place for PX reads
 * (sk_bperm, the chunk pair of each lane c). */
template <bool PERM = false>
__device__ __forceinline__ float sk_group_sum(const uint16_t *x64) {
    const uint4 *xp = reinterpret_cast<const uint4 *>(x64);
    float sum = 0.0f;
    if (!PERM) {
#pragma unroll
        for (int v = 0; v < 8; v++) sum += sk_chunk_sum(xp[v]);
        return sum;
    }
    uint4 *wp = reinterpret_cast<uint4 *>(const_cast<uint16_t *>(x64));
#pragma unroll
    for (int c = 0; c < 4; c++) { /* lane c's chunk pair: summed in chunk order, then rearranged */
        uint4 lo = xp[2 * c], hi = xp[2 * c + 1];
        sum += sk_chunk_sum(lo);
        sum += sk_chunk_sum(hi);
        sk_bperm(lo, hi);
        wp[2 * c] = lo;
        wp[2 * c + 1] = hi;
    }
    return sum;
}

/* Σx of every group of n staged rows of G groups (row r at xs + r·stride) into
 * xsum[r·ldsum + g] (sk_group_sums: ldsum = G), each by sk_group_sum, by threads tid of nthr. A thread takes one (row, group) sum at
 * a time, two at once (independent chains), rows fastest across the block's threads:
 * with stride ≡ 16 bytes mod 128 (the skinny kernels pad their rows by 8 bf16) the 8
 * lanes of a 16-byte load phase read 8 rows' chunks in distinct banks. (Groups fastest
 * put a warp's loads 128 bytes apart, an 8-way bank conflict on every load: 1.3 µs of a
 * grouped MoE block's 10 and 4–5 µs of a 64-token wide block on the H200.) */
template <bool PERM = false>
__device__ __forceinline__ void sk_group_sums_by(const uint16_t *xs, int n, size_t stride, int G, float *xsum, int tid,
                                                 int nthr, int ldsum) {
    if (n == 1) { /* one token (the decode kernels): group g at xs + 64 g, no divisions on their path */
        for (int g = tid; g < G; g += nthr) xsum[g] = sk_group_sum<PERM>(xs + g * QGROUP);
        return;
    }
    const int total = n * G;
    for (int i0 = tid; i0 < total; i0 += 2 * nthr) {
        const int i1 = i0 + nthr; /* two independent sums a round */
        const int r0 = i0 % n, g0 = i0 / n, r1 = i1 % n, g1 = i1 / n;
        const float s0 = sk_group_sum<PERM>(xs + (size_t)r0 * stride + g0 * QGROUP);
        const float s1 = i1 < total ? sk_group_sum<PERM>(xs + (size_t)r1 * stride + g1 * QGROUP) : 0.0f;
        xsum[r0 * ldsum + g0] = s0;
        if (i1 < total) xsum[r1 * ldsum + g1] = s1;
    }
}
/* ... by every thread of the block. Where the block has 4 threads a (row, group) sum, they
 * share it: thread c of the four sums the group's chunks 2c and 2c + 1 (and rearranges
 * that pair, PERM), then the first folds the 8 chunk sums in chunk order from the others
 * by shuffles — sk_group_sum's operations in its order, so the same bits. One thread a
 * group read its 8 chunks 128 bytes apart from its neighbours' (an 8-way bank conflict on
 * every load and store) and added 64 values in one chain: ~1 µs between a one-token
 * projection's staged x and its products (H200 timeline, session 24). */
template <bool PERM = false>
__device__ __forceinline__ void sk_group_sums(const uint16_t *xs, int n, size_t stride, int G, float *xsum) {
    const int total = n * G, tid = threadIdx.x, lane = tid & 31;
    if (4 * total > (int)blockDim.x) {
        sk_group_sums_by<PERM>(xs, n, stride, G, xsum, tid, blockDim.x, G);
        return;
    }
    const int i = tid >> 2, c = tid & 3, r = n == 1 ? 0 : i % n, g = n == 1 ? i : i / n; /* rows fastest, as _by */
    float s_lo = 0.0f, s_hi = 0.0f;
    if (i < total) {
        uint4 *wp = reinterpret_cast<uint4 *>(const_cast<uint16_t *>(xs + (size_t)r * stride + g * QGROUP));
        uint4 lo = wp[2 * c], hi = wp[2 * c + 1];
        s_lo = sk_chunk_sum(lo);
        s_hi = sk_chunk_sum(hi);
        if (PERM) {
            sk_bperm(lo, hi);
            wp[2 * c] = lo;
            wp[2 * c + 1] = hi;
        }
    }
    float sum = 0.0f; /* every lane folds (the shuffles take the whole warp); lane c = 0 stores */
#pragma unroll
    for (int q = 0; q < 4; q++) {
        sum += __shfl_sync(0xffffffffu, s_lo, (lane & ~3) + q);
        sum += __shfl_sync(0xffffffffu, s_hi, (lane & ~3) + q);
    }
    if (i < total && c == 0) xsum[r * G + g] = sum;
}

/* ---- a lane's groups of a tile staged in shared memory (cuda_skinny.cu, cuda_skinny_pipe.cu) ---- */
/* One lane's view of a staged tile for its rows (tile rows tr0, tr1 = lr0, lr0 + 8 of a
 * subtile): their code words at group 0 (ok0 / ok1: the row is inside the matrix; rows past
 * it are never copied), scales and biases at group 0, its token row's 16 values of group 0
 * for n-tile 0 and the n-tile stride, Σx of its columns 2c, 2c + 1 at group 0 for n-tile 0
 * and the n-tile stride. */
struct sk_lane_rows {
    const uint32_t *c0, *c1;
    bool ok0, ok1;
    const uint16_t *s0, *b0, *s1, *b1;
    const uint16_t *x16;
    size_t xnt;
    const float *sxa, *sxb;
    int snt;
};

/* Group grp of the lane's rows against NT n-tiles, scales and biases given: one
 * sk_group_step an n-tile (the bitwise contract). */
template <int NT, bool PX>
__device__ __forceinline__ void sk_group_nt(const sk_lane_rows &r, int grp, float s0, float b0, float s1, float b1,
                                            float (&acc)[NT][4]) {
    sk_w w;
    w.q0 = r.ok0 ? *reinterpret_cast<const uint2 *>(r.c0 + grp * 8) : make_uint2(0, 0);
    w.q1 = r.ok1 ? *reinterpret_cast<const uint2 *>(r.c1 + grp * 8) : make_uint2(0, 0);
    w.s0 = s0;
    w.b0 = b0;
    w.s1 = s1;
    w.b1 = b1;
    uint32_t af[4][4];
    sk_frags(w, af);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        sk_group_step<PX>(af, w, r.x16 + nt * r.xnt + grp * QGROUP, r.sxa[nt * r.snt + grp], r.sxb[nt * r.snt + grp], acc[nt]);
}

/* The lane's gper groups from g0, in group order. An even count goes two groups at a time,
 * each row's two scales (and two biases) one 4-byte load: with 64-byte scale rows (G = 32)
 * the 8 rows a warp reads share 2 banks, so every 2-byte load was 4 wavefronts — 16 of a
 * group's ~36 (H200, session 8: the products of a grouped gate/up unit 112 -> 80 µs a
 * launch in the first form of cuda_skinny_pipe.cu once its scales and Σx loads were made conflict-light;
 * here: grouped gate/up 163 -> 158 µs, down 102 -> 94 µs with Σx rows padded as well). */
template <int NT, bool PX = false>
__device__ __forceinline__ void sk_products(const sk_lane_rows &r, int g0, int gper, float (&acc)[NT][4]) {
    if ((gper & 1) == 0) {
        for (int gi = 0; gi < gper; gi += 2) {
            const int grp = g0 + gi;
            const uint32_t s0 = *reinterpret_cast<const uint32_t *>(r.s0 + grp), b0 = *reinterpret_cast<const uint32_t *>(r.b0 + grp);
            const uint32_t s1 = *reinterpret_cast<const uint32_t *>(r.s1 + grp), b1 = *reinterpret_cast<const uint32_t *>(r.b1 + grp);
            sk_group_nt<NT, PX>(r, grp, bf_lo(s0), bf_lo(b0), bf_lo(s1), bf_lo(b1), acc);
            sk_group_nt<NT, PX>(r, grp + 1, bf_hi(s0), bf_hi(b0), bf_hi(s1), bf_hi(b1), acc);
        }
    } else {
        for (int gi = 0; gi < gper; gi++) {
            const int grp = g0 + gi;
            sk_group_nt<NT, PX>(r, grp, bf(r.s0[grp]), bf(r.b0[grp]), bf(r.s1[grp]), bf(r.b1[grp]), acc);
        }
    }
}

/* ---- a warp's m-tile read straight into registers (cuda_tcv.cu, cuda_skinny_wide.cu) ----
 * A warp's share of one m-tile: rows r0 and r0 + 8 of lane (g, c) = (lane/4, lane%4),
 * GPW groups: code words 2c, 2c+1 of each group, scales and biases as bf16 pairs. */
template <int GPW>
struct tcv_w {
    uint2 q0[GPW], q1[GPW];
    uint32_t s0[GPW / 2], s1[GPW / 2], b0[GPW / 2], b1[GPW / 2];
};

/* 8-byte weight load, issued before pdl_wait by every caller (no .nc: ptxas would sink it
 * below the wait, cuda_internal.h trap). */
__device__ __forceinline__ uint2 tcv_ld2(const void *p) {
    uint2 r;
    asm volatile("ld.global.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

/* N (4, 8 or 16) bf16 values at p (2N-byte aligned) as N/2 words. */
template <int N>
__device__ __forceinline__ void tcv_ld_bf16(const uint16_t *p, uint32_t *out) {
    if (N == 4) {
        const uint2 v = tcv_ld2(p);
        out[0] = v.x;
        out[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < N / 8; i++) {
            const uint4 v = ld_stream_pre(reinterpret_cast<const uint4 *>(p) + i);
            out[4 * i] = v.x;
            out[4 * i + 1] = v.y;
            out[4 * i + 2] = v.z;
            out[4 * i + 3] = v.w;
        }
    }
}

/* Loads rows r0, r0 + 8 (absolute rows of m; ok0/ok1 false: zeros) over groups g0.. */
template <int GPW>
__device__ __forceinline__ void tcv_load(const cuda_qmat &m, size_t r0, bool ok0, bool ok1, int g0, int c, tcv_w<GPW> &w) {
    const int G = m.cols / QGROUP;
    const size_t wpr = (size_t)m.cols / 8; /* code words per row */
    const uint32_t *c0 = m.codes + r0 * wpr + 2 * c, *c1 = c0 + 8 * wpr;
#pragma unroll
    for (int gi = 0; gi < GPW; gi++) {
        w.q0[gi] = ok0 ? tcv_ld2(c0 + (g0 + gi) * 8) : make_uint2(0, 0);
        w.q1[gi] = ok1 ? tcv_ld2(c1 + (g0 + gi) * 8) : make_uint2(0, 0);
    }
#pragma unroll
    for (int i = 0; i < GPW / 2; i++) w.s0[i] = w.s1[i] = w.b0[i] = w.b1[i] = 0;
    if (ok0) {
        tcv_ld_bf16<GPW>(m.scales + r0 * G + g0, w.s0);
        tcv_ld_bf16<GPW>(m.biases + r0 * G + g0, w.b0);
    }
    if (ok1) {
        tcv_ld_bf16<GPW>(m.scales + (r0 + 8) * G + g0, w.s1);
        tcv_ld_bf16<GPW>(m.biases + (r0 + 8) * G + g0, w.b1);
    }
}

/* Group gi of a register tile as the skinny kernel's sk_w. */
template <int GPW>
__device__ __forceinline__ sk_w tcv_group(const tcv_w<GPW> &w, int gi) {
    sk_w f;
    f.q0 = w.q0[gi];
    f.q1 = w.q1[gi];
    f.s0 = gi & 1 ? bf_hi(w.s0[gi / 2]) : bf_lo(w.s0[gi / 2]);
    f.s1 = gi & 1 ? bf_hi(w.s1[gi / 2]) : bf_lo(w.s1[gi / 2]);
    f.b0 = gi & 1 ? bf_hi(w.b0[gi / 2]) : bf_lo(w.b0[gi / 2]);
    f.b1 = gi & 1 ? bf_hi(w.b1[gi / 2]) : bf_lo(w.b1[gi / 2]);
    return f;
}

/* acc0 / acc1 (rows r0, r0 + 8) += the warp's groups against x staged in shared memory
 * (xs: the K values, xsum: Σ of each group). Same operations, same order as the skinny
 * kernel's per-group step for its token 0. */
template <int GPW>
__device__ __forceinline__ void tcv_mma(const tcv_w<GPW> &w, const uint16_t *xs, const float *xsum, int g0, int c,
                                        float &acc0, float &acc1) {
    float acc[4] = {acc0, 0.0f, acc1, 0.0f}; /* columns 2c + 1 hold the same token: unused */
#pragma unroll
    for (int gi = 0; gi < GPW; gi++) {
        const int grp = g0 + gi;
        const sk_w f = tcv_group(w, gi);
        uint32_t af[4][4];
        sk_frags(f, af);
        sk_group_step<true>(af, f, xs + grp * QGROUP + 16 * c, xsum[grp], xsum[grp], acc); /* xs: tcv_stage's order */
    }
    acc0 = acc[0];
    acc1 = acc[2];
}

/* The warp's partial sums of its rows (acc0, acc1: rows g, g + 8) into red[warp][16] (lanes
 * c = 0 hold column 0), then the block barrier: every k-slice's partials are in shared
 * memory after it. */
__device__ __forceinline__ void tcv_to_red(float acc0, float acc1, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2;
    if ((lane & 3) == 0) {
        red[warp * 16 + gq] = acc0;
        red[warp * 16 + gq + 8] = acc1;
    }
    __syncthreads();
}

template <int GPW>
__device__ __forceinline__ void tcv_mma_to_red(const tcv_w<GPW> &w, const uint16_t *xs, const float *xsum, int g0, float *red) {
    float acc0 = 0.0f, acc1 = 0.0f;
    tcv_mma<GPW>(w, xs, xsum, g0, threadIdx.x & 3, acc0, acc1);
    tcv_to_red(acc0, acc1, red);
}

/* Row i of m-tile m from the KS k-slices' partials (warp k·MT + m), summed in slice order
 * from 0: the order the skinny kernels use, so one token's bits match a batch's. */
__device__ __forceinline__ float tcv_slice_sum(const float *red, int KS, int MT, int m, int i) {
    float v = 0.0f;
    for (int k = 0; k < KS; k++) v += red[(k * MT + m) * 16 + i];
    return v;
}

/* Stages n vectors of K bf16 (vector v at x + v·ldx, written by earlier kernels: plain
 * loads after pdl_wait) into xs[v·K ..] and their group sums into xsum[v·G ..]; xs is left
 * rearranged for the k16 steps (sk_bperm), the order tcv_mma and tcv_mma_smem read. */
__device__ __forceinline__ void tcv_stage(const uint16_t *x, int ldx, int n, int K, uint16_t *xs, float *xsum) {
    const int per = K / 8;
    for (int i = threadIdx.x; i < n * per; i += blockDim.x) {
        const int v = i / per, j = i % per;
        reinterpret_cast<uint4 *>(xs + (size_t)v * K)[j] = reinterpret_cast<const uint4 *>(x + (size_t)v * ldx)[j];
    }
    __syncthreads();
    sk_group_sums<true>(xs, n, K, K / QGROUP, xsum);
    __syncthreads();
}


/* ---- a warp's m-tile through shared memory (cuda_tcv.cu's stream form): the values
 * tcv_load would put in registers, copied with cp.async into a per-warp area of
 * TCV_WSM(GPW) bytes so the copy can be issued long before the values are used (before
 * pdl_wait, or a tile ahead) without holding registers; tcv_mma_smem reads it group by group.
 * The copy moves whole rows: the warp's 16 rows × GPW groups are 16 runs of GPW·32
 * contiguous bytes, copied 16 bytes a lane so that one instruction covers whole 128-byte
 * lines (tcv_load's 8-byte fragment loads ask for one 32-byte sector of each of 8 rows).
 * Layout: row r's 32-byte group j at [r][j ^ (r & (GPW - 1) & 7)] (the XOR spreads the 8
 * rows a fragment read touches over the banks: 2 wavefronts for 256 bytes), then the 16
 * rows' scales and biases, GPW bf16 each. ---- */
#define TCV_WSM(GPW) ((GPW) * 512 + 16 * (GPW) * 4)

/* a or b, field by field (a ternary on the structs themselves goes through local memory) */
__device__ __forceinline__ cuda_qmat qsel(bool first, const cuda_qmat &a, const cuda_qmat &b) {
    cuda_qmat r;
    r.codes = first ? a.codes : b.codes;
    r.scales = first ? a.scales : b.scales;
    r.biases = first ? a.biases : b.biases;
    r.rows = first ? a.rows : b.rows;
    r.cols = first ? a.cols : b.cols;
    r.n_mats = first ? a.n_mats : b.n_mats;
    r.bits = first ? a.bits : b.bits;
    return r;
}

/* Rows base .. base + 15 of m (absolute rows; row base + t exists for t < nvalid), groups
 * g0 .. g0 + GPW - 1. Rows past nvalid are zeros (plain shared stores: visible after the
 * block barrier that follows cpa_wait). The caller commits the group. */
template <int GPW>
__device__ __forceinline__ void tcv_tile_async(const cuda_qmat &m, size_t base, int nvalid, int g0, unsigned char *wsm) {
    constexpr int RB = GPW * 32, CPR = RB / 16, X = (GPW - 1) & 7; /* row bytes, 16-byte chunks a row */
    const int lane = threadIdx.x & 31, G = m.cols / QGROUP;
    const size_t row_bytes = (size_t)m.cols / 2;
    const unsigned char *src = reinterpret_cast<const unsigned char *>(m.codes) + base * row_bytes + (size_t)g0 * 32;
#pragma unroll
    for (int i = lane; i < 16 * CPR; i += 32) {
        const int r = i / CPR, ch = i % CPR;
        unsigned char *dst = wsm + r * RB + (((ch >> 1) ^ (r & X)) * 32) + (ch & 1) * 16;
        if (r < nvalid) cpa16(dst, src + r * row_bytes + ch * 16);
        else *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
    }
    /* lanes 0-15: scales of row `lane`; 16-31: biases of row lane - 16 */
    const int t = lane & 15;
    uint16_t *sdst = reinterpret_cast<uint16_t *>(wsm + GPW * 512) + (lane >> 4) * 16 * GPW + t * GPW;
    const uint16_t *ssrc = (lane < 16 ? m.scales : m.biases) + (base + t) * G + g0;
    if (t < nvalid) {
        if (GPW == 4) cpa8(sdst, ssrc);
#pragma unroll
        for (int i = 0; i < GPW / 8; i++) cpa16(sdst + 8 * i, ssrc + 8 * i);
    } else {
#pragma unroll
        for (int i = 0; i < GPW; i++) sdst[i] = 0;
    }
}

/* Group gi of a warp's tile in shared memory (tcv_tile_async's layout) as lane (gq, c)'s
 * sk_w: its rows gq, gq + 8, code words 2c, 2c + 1, scales and biases. */
template <int GPW>
__device__ __forceinline__ sk_w tcv_smem_group(const unsigned char *wsm, int gi, int gq, int c) {
    constexpr int RB = GPW * 32, X = (GPW - 1) & 7;
    const uint16_t *sb = reinterpret_cast<const uint16_t *>(wsm + GPW * 512); /* [2][16][GPW] bf16 */
    const int pos = (gi ^ (gq & X)) * 32 + c * 8;
    sk_w f;
    f.q0 = *reinterpret_cast<const uint2 *>(wsm + gq * RB + pos);
    f.q1 = *reinterpret_cast<const uint2 *>(wsm + (gq + 8) * RB + pos);
    f.s0 = bf(sb[gq * GPW + gi]);
    f.s1 = bf(sb[(gq + 8) * GPW + gi]);
    f.b0 = bf(sb[(16 + gq) * GPW + gi]);
    f.b1 = bf(sb[(16 + gq + 8) * GPW + gi]);
    return f;
}

/* tcv_mma with the warp's tile in shared memory (tcv_tile_async's layout), each group's
 * values read when its step runs (few registers held): the same values, the same steps. */
template <int GPW>
__device__ __forceinline__ void tcv_mma_smem(const unsigned char *wsm, const uint16_t *xs, const float *xsum, int g0,
                                             float &acc0, float &acc1) {
    const int lane = threadIdx.x & 31, gq = lane >> 2, c = lane & 3;
    float acc[4] = {acc0, 0.0f, acc1, 0.0f};
#pragma unroll
    for (int gi = 0; gi < GPW; gi++) {
        const int grp = g0 + gi;
        const sk_w f = tcv_smem_group<GPW>(wsm, gi, gq, c);
        uint32_t af[4][4];
        sk_frags(f, af);
        sk_group_step<true>(af, f, xs + grp * QGROUP + 16 * c, xsum[grp], xsum[grp], acc); /* xs: tcv_stage's order */
    }
    acc0 = acc[0];
    acc1 = acc[2];
}

/* ---- the tokens as wgmma's B operand (cuda_skinny_wide.cu's sw_wg_kernel, cuda_skinny_tall.cu's
 * tall_wg_kernel), block-wide: groups [0, ng) of columns col0 + 64·g of tokens t0 .. t0 + nT - 1,
 * one 128-byte row a (group g, token t) at xb + (g·N + t)·128, its chunk ch at ch ^ (t & 7) —
 * the swizzle wgmma reads (wg_desc), and the pass below reads 8 tokens' same chunk from
 * distinct banks. Rows of columns nT .. N - 1 are zeroed (their columns are never written
 * out). Then each (token, group): Σx into xsum[t·xs_ld + g] in sk_group_sum's order (chunks
 * 0..7), and the row rewritten in place in the k order of the four steps: out chunk 2·st +
 * hf, word c = sk_bfrag's b0 (hf 0) or b1 (hf 1) of step st from lane c's 16 values (chunks
 * 2c, 2c + 1). Waits for all of the thread's cp.async groups; ends with the rows visible to
 * the async proxy and a block barrier. wg_tokens_issue is the first half (the copies, not
 * committed: cuda_skinny_wide.cu's looped form keeps them a slice ahead). ---- */
template <int N>
__device__ __forceinline__ void wg_tokens_issue(unsigned char *xb, const uint16_t *x, int ldx, int t0, int nT, int ng, int col0) {
    for (int i = threadIdx.x; i < N * ng * 8; i += blockDim.x) {
        const int t = i / (ng * 8), r = i % (ng * 8), g = r >> 3, ch = r & 7;
        unsigned char *dst = xb + ((size_t)g * N + t) * 128 + ((ch ^ (t & 7)) << 4);
        if (t < nT) cpa16(dst, x + (size_t)(t0 + t) * ldx + (size_t)col0 + g * QGROUP + ch * 8);
        else *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
    }
}
/* The second half, once the copies of wg_tokens_issue have landed and a block barrier has
 * made every thread's visible: the sums and the rows in the steps' order, as above. */
/* One (token, group): its 8 chunks v (the 64 values in k order) rewritten in place into the
 * steps' order — out chunk 2·st + hf, word c = sk_bfrag's b0 (hf 0) or b1 (hf 1) of step st
 * from chunks 2c, 2c + 1 — returning the group's Σx (sk_group_sum's order: chunk sums added
 * in chunk order onto 0). wg_tokens_finish applies it in shared memory; a producer that
 * stages its rows once for every consumer (struct cuda_xstage: cuda_moe.cu's combine + norm)
 * applies it to its own output, so the staged bytes and sums are the same. */
__device__ __forceinline__ float wg_stage_group(uint4 (&v)[8]) {
    float sum = 0.0f;
#pragma unroll
    for (int ch = 0; ch < 8; ch++) sum += sk_chunk_sum(v[ch]);
    uint32_t o[8][4];
#pragma unroll
    for (int cc = 0; cc < 4; cc++) {
        const uint32_t e[8] = {v[2 * cc].x, v[2 * cc].y, v[2 * cc].z, v[2 * cc].w,
                               v[2 * cc + 1].x, v[2 * cc + 1].y, v[2 * cc + 1].z, v[2 * cc + 1].w};
#pragma unroll
        for (int st = 0; st < 4; st++) sk_bfrag(e, st, o[2 * st][cc], o[2 * st + 1][cc]);
    }
#pragma unroll
    for (int ch = 0; ch < 8; ch++) v[ch] = make_uint4(o[ch][0], o[ch][1], o[ch][2], o[ch][3]);
    return sum;
}

template <int N>
__device__ __forceinline__ void wg_tokens_finish(unsigned char *xb, float *xsum, int xs_ld, int nT, int ng) {
    for (int i = threadIdx.x; i < nT * ng; i += blockDim.x) {
        const int t = i % nT, g = i / nT;
        uint4 *row = reinterpret_cast<uint4 *>(xb + ((size_t)g * N + t) * 128);
        uint4 v[8];
#pragma unroll
        for (int ch = 0; ch < 8; ch++) v[ch] = row[ch ^ (t & 7)];
        xsum[t * xs_ld + g] = wg_stage_group(v);
#pragma unroll
        for (int ch = 0; ch < 8; ch++) row[ch ^ (t & 7)] = v[ch];
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* the rows, to wgmma's reads */
#endif
    __syncthreads();
}
template <int N>
__device__ __forceinline__ void wg_stage_tokens(unsigned char *xb, float *xsum, int xs_ld, const uint16_t *x, int ldx, int t0,
                                                int nT, int ng, int col0) {
    wg_tokens_issue<N>(xb, x, ldx, t0, nT, ng, col0);
    cpa_commit();
    cpa_wait<0>();
    __syncthreads();
    wg_tokens_finish<N>(xb, xsum, xs_ld, nT, ng);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* A group's four k16 steps on wgmma from its A fragments and the steps' descriptors (built by
 * wg_group_issue_af below, or kept by the caller: cuda_skinny_tall.cu's tk_issue). */
template <int N>
__device__ __forceinline__ void wg_group_issue_desc(uint32_t (&af)[4][4], const uint64_t (&desc)[4], float (&cg)[N / 2]) {
    reg_fence(*reinterpret_cast<uint32_t(*)[16]>(&af));
    reg_fence(cg);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    wgmma_k16<N, 0>(cg, af[0], desc[0]);
#pragma unroll
    for (int st = 1; st < 4; st++) wgmma_k16<N>(cg, af[st], desc[st]);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* One quantization group on wgmma (sw_wg_kernel, tall_wg_kernel): f's A fragments (LOP3:
 * sk_frags' fused form, else its C form — the same values) against the N tokens' row of the
 * group at xg_s (wg_stage_tokens' layout), four k16 steps into cg — the first writes (cg's old
 * values unread), three add: each group's Σ(128 + q)·x the same as mma.sync's — committed as
 * one wgmma group. The caller waits for it (wg_group_scale). */
template <int N>
__device__ __forceinline__ void wg_group_issue_af(uint32_t (&af)[4][4], uint32_t xg_s, float (&cg)[N / 2]) {
    uint64_t desc[4];
#pragma unroll
    for (int st = 0; st < 4; st++) {
        desc[st] = wg_desc(xg_s + (uint32_t)(st * 32));
        asm volatile("" : "+l"(desc[st])::"memory");
    }
    wg_group_issue_desc<N>(af, desc, cg);
}
/* The same from f, its A fragments built here (dead once issued: the caller waits for the
 * group before building another's). With two groups in flight the caller keeps each group's
 * fragments in registers of their own (wg_group_issue_af) until its wait: wgmma reads them
 * asynchronously, and ptxas serialises the wgmma when their registers are redefined inside. */
template <int N, bool LOP3>
__device__ __forceinline__ void wg_group_issue(const sk_w &f, uint32_t xg_s, float (&cg)[N / 2]) {
    uint32_t af[4][4];
    sk_frags<LOP3>(f, af);
    wg_group_issue_af<N>(af, xg_s, cg);
}

/* Waits until at most W wgmma groups are in flight (the group of cg done), then adds the
 * group's sums onto acc in sk_group_scale's order: n-tile j (tokens 8j .. 8j + 7) onto acc[j],
 * xsum[t·ld] being token t's Σx of this group. */
template <int N, int W>
__device__ __forceinline__ void wg_group_scale(const sk_w &f, float (&cg)[N / 2], const float *xsum, int ld, int c,
                                               float (*acc)[4]) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(W) : "memory");
    reg_fence(cg);
#pragma unroll
    for (int j = 0; j < N / 8; j++) {
        const float cj[4] = {cg[4 * j], cg[4 * j + 1], cg[4 * j + 2], cg[4 * j + 3]};
        sk_group_scale(f, cj, xsum[(8 * j + 2 * c) * ld], xsum[(8 * j + 2 * c + 1) * ld], acc[j]);
    }
}
#endif

#endif
