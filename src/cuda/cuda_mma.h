// cuda/cuda_mma.h — the 4-bit tensor-core fragment helpers shared by cuda_skinny.cu (2..64
// tokens) and cuda_tcv.cu (one token): exact codes as bf16 integers, the permuted k order
// of a 64-wide quantization group, mma.sync m16n8k16. Both files build a token's sums
// from these in the same order, which is what makes one token's result the same bits
// alone (tcv) and inside a batch (skinny). See cuda_skinny.cu's header for the layout.
// Also the cp.async copies both use.
#ifndef ORCHID_CUDA_MMA_H
#define ORCHID_CUDA_MMA_H

#include "cuda/cuda_internal.h"

/* Codes j and j+4 of a word as the bf16x2 (q_j, q_{j+4}), exact. */
__device__ __forceinline__ uint32_t q_pair(uint32_t w, int j) {
    const uint32_t v = ((w >> (4 * j)) & 0x000F000Fu) | 0x43004300u; /* bf16 128 + q */
    __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162 *>(&v);
    const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.0f, 128.0f);
    h = __hsub2(h, k128);
    return *reinterpret_cast<uint32_t *>(&h);
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

/* A fragments of the 4 k16 steps of one group. */
__device__ __forceinline__ void sk_frags(const sk_w &w, uint32_t (&a)[4][4]) {
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const uint32_t w0 = s < 2 ? w.q0.x : w.q0.y, w1 = s < 2 ? w.q1.x : w.q1.y;
        const int j = 2 * (s & 1);
        a[s][0] = q_pair(w0, j);
        a[s][1] = q_pair(w1, j);
        a[s][2] = q_pair(w0, j + 1);
        a[s][3] = q_pair(w1, j + 1);
    }
}

/* B fragments of k16 step st from the 16 x values x[16c .. 16c+15] of a group (8 words e):
 * logical (2c, 2c+1) ↔ the pair of words ai, ai+2's low halves, (2c+8, 2c+9) ↔ high halves. */
__device__ __forceinline__ void sk_bfrag(const uint32_t (&e)[8], int st, uint32_t &b0, uint32_t &b1) {
    const int ai = (st >> 1) * 4 + (st & 1);
    b0 = __byte_perm(e[ai], e[ai + 2], 0x5410);
    b1 = __byte_perm(e[ai], e[ai + 2], 0x7632);
}

/* cg += the group's Σ q·x for the lane's rows (g, g + 8) and columns (2c, 2c + 1): the 4 k16
 * steps against x16 = the 16 values x[16c .. 16c+15] of the group (one token's row, or the
 * lane's token column in the skinny kernel). */
__device__ __forceinline__ void sk_group_mma(const uint32_t (&af)[4][4], const uint16_t *x16, float (&cg)[4]) {
    const uint4 *xp = reinterpret_cast<const uint4 *>(x16);
    const uint4 x0 = xp[0], x1 = xp[1];
    const uint32_t e[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int st = 0; st < 4; st++) {
        uint32_t b0, b1;
        sk_bfrag(e, st, b0, b1);
        mma16816(cg, af[st], b0, b1);
    }
}

/* Σ of the 64 bf16 x values of one group, in the fixed order both files use. */
__device__ __forceinline__ float sk_group_sum(const uint4 *xp) {
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < 8; v++) {
        const uint4 q = xp[v];
        sum += bf_lo(q.x) + bf_hi(q.x) + bf_lo(q.y) + bf_hi(q.y) + bf_lo(q.z) + bf_hi(q.z) + bf_lo(q.w) + bf_hi(q.w);
    }
    return sum;
}

/* Asynchronous global → shared copies (cp.async): 16 bytes through L2 only, 4 bytes. */
__device__ __forceinline__ void cpa16(void *smem, const void *gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem));
}
__device__ __forceinline__ void cpa4(void *smem, const void *gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(gmem));
}

#endif
