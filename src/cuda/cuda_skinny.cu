// cuda/cuda_skinny.cu — tensor-core products of 4-bit MLX weights with a few tokens
// (2..64: batched decode of many sequences, the lm_head of a few rows), dense and
// grouped by expert. The CUDA-core GEMV of cuda_gemv.cu re-does the dequantization per
// token and turns compute-bound from T ≈ 2; the prefill GEMM of cuda_gemm.cu stages
// 64 × 128 tiles through shared memory and idles at this size. Here every weight is
// read once from DRAM straight into mma.sync fragments:
//
//   * A = the weights (16 rows per m-tile), B = the tokens (8 per n-tile), C fp32.
//   * The codes enter the tensor core as exact integers q ∈ [0, 15] in bf16 (built
//     with one AND/OR and one bf16x2 subtract per two codes); the affine form is
//     applied per 64-wide quantization group in fp32 afterwards:
//       y[r, t] = Σ_g s[r,g] · (Σ_{k∈g} q[r,k] x[t,k]) + b[r,g] · (Σ_{k∈g} x[t,k]),
//     so each group is its own mma accumulation (4 k16 steps), scaled into fp32.
//   * The k order inside a group is permuted (a dot product does not care) so that
//     lane (g, c) = (lane/4, lane%4) reads words 2c, 2c+1 of its rows' group — one
//     8-byte load per row per group, 32 contiguous bytes per row per 4 lanes — and the
//     16 x values x[t][16c .. 16c+15] of the same k, two 16-byte loads. Logical k pair
//     (2c, 2c+1) of step s ↔ actual (8w + j, 8w + j + 4) with w = 2c + s/2, j = 2(s%2)
//     (nibbles j and j+4 of one word form one bf16x2); (2c+8, 2c+9) ↔ j + 1.
//   * A block is KSPLIT warps that split the groups of one 16-row (or gate+up 2×16-row)
//     tile; partial sums meet in shared memory in a fixed order (deterministic, so
//     a sequence's result does not depend on what else is in the batch).
//   * Grouped: block y is a (expert, slot range) tile of the route of cuda_moe.cu
//     (≤ 64 slots); tokens are gathered through row_of_slot; output rows are slots.
// Epilogues: fp32 store or accumulate (y[t, r]), or SwiGLU bf16(silu(gate)·up).
#include "cuda/cuda_internal.h"

#define SK_MAX_T 64
#define SK_MAX_SMEM (64 * 1024)
#define SK_MAX_SEG 4

struct sk_args {
    cuda_qmat w0, w1;       /* w1: up of the SwiGLU variant */
    const uint16_t *x;      /* bf16 tokens, row stride ldx */
    int ldx;
    const int32_t *x_rows;  /* grouped: token row of each slot (NULL: the slot itself) */
    const int32_t *tiles;   /* grouped: route tiles [max_tiles][3] (expert, m0, m_end), count after */
    int max_tiles;
    int T;                  /* dense: tokens */
    float *y;               /* fp32 out [token or slot][ldy] */
    int ldy, accumulate;
    uint16_t *act;          /* SwiGLU out [token or slot][ld_act] */
    int ld_act;
    /* dense, several matrices sharing x in one launch: block x in [blk0[i], blk0[i+1])
     * computes 16 rows of wseg[i] into yseg[i] (nseg = 0: w0 / y only) */
    int nseg;
    int blk0[SK_MAX_SEG + 1];
    cuda_qmat wseg[SK_MAX_SEG];
    float *yseg[SK_MAX_SEG];
    int ldyseg[SK_MAX_SEG];
};

__device__ __forceinline__ uint2 ld_stream2(const void *p) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

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

__device__ __forceinline__ void sk_load_w(sk_w &w, const cuda_qmat &m, size_t row_base, int rows, int r0, int grp, int c) {
    const int G = m.cols / QGROUP;
    const int wpr = m.cols / 8; /* 32-bit words per row */
    const bool ok0 = r0 < rows, ok1 = r0 + 8 < rows;
    const size_t a0 = row_base + (ok0 ? r0 : 0), a1 = row_base + (ok1 ? r0 + 8 : 0);
    w.q0 = ok0 ? ld_stream2(m.codes + a0 * wpr + grp * 8 + 2 * c) : make_uint2(0, 0);
    w.q1 = ok1 ? ld_stream2(m.codes + a1 * wpr + grp * 8 + 2 * c) : make_uint2(0, 0);
    w.s0 = ok0 ? bf(__ldg(m.scales + a0 * G + grp)) : 0.0f;
    w.b0 = ok0 ? bf(__ldg(m.biases + a0 * G + grp)) : 0.0f;
    w.s1 = ok1 ? bf(__ldg(m.scales + a1 * G + grp)) : 0.0f;
    w.b1 = ok1 ? bf(__ldg(m.biases + a1 * G + grp)) : 0.0f;
}

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

template <int NT, int MR, bool SWIGLU, bool GROUPED>
static __global__ void __launch_bounds__(256, 2) skinny_kernel(sk_args a) {
    extern __shared__ __align__(16) float red[]; /* [KSPLIT][MR*NT*4][32] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ksplit = blockDim.x >> 5;
    const int gq = lane >> 2, c = lane & 3;
    int expert = 0, m0 = 0, count = a.T;
    if (GROUPED) {
        if ((int)blockIdx.y >= a.tiles[a.max_tiles * 3]) return;
        expert = a.tiles[blockIdx.y * 3];
        m0 = a.tiles[blockIdx.y * 3 + 1];
        count = a.tiles[blockIdx.y * 3 + 2] - m0;
    }
    cuda_qmat w0 = a.w0;
    float *y = a.y;
    int ldy = a.ldy, blk = blockIdx.x;
    if (!SWIGLU && !GROUPED && a.nseg > 0) {
        int sg = 0;
        while (sg + 1 < a.nseg && blk >= a.blk0[sg + 1]) sg++;
        w0 = a.wseg[sg];
        y = a.yseg[sg];
        ldy = a.ldyseg[sg];
        blk -= a.blk0[sg];
    }
    const int rows = w0.rows, K = w0.cols, G = K / QGROUP;
    const int rbase = blk * 16;
    const size_t erow = (size_t)expert * rows; /* absolute row of the expert's row 0 */
    const int gper = G / ksplit, g0 = warp * gper;

    for (int p0 = 0; p0 < count; p0 += NT * 8) { /* passes of NT n-tiles (grouped tiles can exceed NT) */
        /* x rows of this lane's tokens (one per n-tile): token p0 + nt*8 + gq */
        const uint16_t *xr[NT];
        bool xok[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int j = p0 + nt * 8 + gq;
            xok[nt] = j < count;
            int row = xok[nt] ? j : 0;
            if (GROUPED) row = a.x_rows ? a.x_rows[m0 + row] : m0 + row;
            xr[nt] = a.x + (size_t)row * a.ldx + 16 * c;
        }
        float acc[MR][NT][4];
#pragma unroll
        for (int mt = 0; mt < MR; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;

        sk_w cur[MR], nxt[MR];
#pragma unroll
        for (int mt = 0; mt < MR; mt++)
            sk_load_w(cur[mt], mt == 0 ? w0 : a.w1, erow, rows, rbase + (SWIGLU ? 0 : mt * 16) + gq, g0, c);
        for (int gi = 0; gi < gper; gi++) {
            const int grp = g0 + gi;
            if (gi + 1 < gper) {
#pragma unroll
                for (int mt = 0; mt < MR; mt++)
                    sk_load_w(nxt[mt], mt == 0 ? w0 : a.w1, erow, rows, rbase + (SWIGLU ? 0 : mt * 16) + gq, grp + 1, c);
            }
            uint4 xv[NT][2];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (xok[nt]) {
                    const uint4 *xp = reinterpret_cast<const uint4 *>(xr[nt] + grp * QGROUP);
                    xv[nt][0] = __ldg(xp);
                    xv[nt][1] = __ldg(xp + 1);
                } else {
                    xv[nt][0] = xv[nt][1] = make_uint4(0, 0, 0, 0);
                }
            }
            uint32_t af[MR][4][4];
#pragma unroll
            for (int mt = 0; mt < MR; mt++) sk_frags(cur[mt], af[mt]);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint32_t e[8] = {xv[nt][0].x, xv[nt][0].y, xv[nt][0].z, xv[nt][0].w,
                                       xv[nt][1].x, xv[nt][1].y, xv[nt][1].z, xv[nt][1].w};
                /* Σx over the group for token gq of this n-tile, then the sums of the C
                 * columns 2c and 2c+1 (held by lanes 8c and 8c + 4) */
                float sx = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) sx += bf_lo(e[i]) + bf_hi(e[i]);
                sx += __shfl_xor_sync(0xffffffffu, sx, 1);
                sx += __shfl_xor_sync(0xffffffffu, sx, 2);
                const float sxa = __shfl_sync(0xffffffffu, sx, 8 * c), sxb = __shfl_sync(0xffffffffu, sx, 8 * c + 4);
                uint32_t b0[4], b1[4];
#pragma unroll
                for (int s = 0; s < 4; s++) {
                    const int ai = (s >> 1) * 4 + (s & 1);
                    b0[s] = __byte_perm(e[ai], e[ai + 2], 0x5410);
                    b1[s] = __byte_perm(e[ai], e[ai + 2], 0x7632);
                }
#pragma unroll
                for (int mt = 0; mt < MR; mt++) {
                    float cg[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int s = 0; s < 4; s++) mma16816(cg, af[mt][s], b0[s], b1[s]);
                    const sk_w &w = cur[mt];
                    acc[mt][nt][0] += fmaf(w.s0, cg[0], w.b0 * sxa);
                    acc[mt][nt][1] += fmaf(w.s0, cg[1], w.b0 * sxb);
                    acc[mt][nt][2] += fmaf(w.s1, cg[2], w.b1 * sxa);
                    acc[mt][nt][3] += fmaf(w.s1, cg[3], w.b1 * sxb);
                }
            }
            if (gi + 1 < gper) {
#pragma unroll
                for (int mt = 0; mt < MR; mt++) cur[mt] = nxt[mt];
            }
        }

        /* split-K: warp partials meet in shared memory, summed in warp order */
        constexpr int PER = MR * NT * 4;
#pragma unroll
        for (int mt = 0; mt < MR; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) red[((size_t)warp * PER + (mt * NT + nt) * 4 + i) * 32 + lane] = acc[mt][nt][i];
        __syncthreads();
        for (int q = threadIdx.x; q < NT * 4 * 32; q += blockDim.x) {
            const int l = q & 31, i = (q >> 5) & 3, nt = q >> 7;
            const int j = p0 + nt * 8 + 2 * (l & 3) + (i & 1); /* token / slot index in the tile */
            const int r = rbase + (l >> 2) + (i >= 2 ? 8 : 0);
            float v[MR];
#pragma unroll
            for (int mt = 0; mt < MR; mt++) {
                float s = 0.0f;
                for (int w = 0; w < ksplit; w++) s += red[((size_t)w * PER + (mt * NT + nt) * 4 + i) * 32 + l];
                v[mt] = s;
            }
            if (j >= count) continue;
            const size_t orow = (size_t)(GROUPED ? m0 + j : j);
            if (SWIGLU) {
                if (r < rows) a.act[orow * a.ld_act + r] = f2bf(silu(v[0]) * v[MR - 1]);
            } else {
#pragma unroll
                for (int mt = 0; mt < MR; mt++) {
                    const int rr = r + mt * 16;
                    if (rr < rows) {
                        float *dst = y + orow * ldy + rr;
                        *dst = a.accumulate ? *dst + v[mt] : v[mt];
                    }
                }
            }
        }
        __syncthreads(); /* red is reused by the next pass */
    }
}

static int sk_ksplit(int G, int nt) {
    (void)nt;
    for (int k = 8; k > 1; k >>= 1)
        if (G % k == 0) return k;
    return 1;
}

template <int NT, int MR, bool SWIGLU, bool GROUPED>
static int sk_launch(const struct cuda_ctx *c, const sk_args &a, dim3 grid, int ksplit, const char *what) {
    const size_t smem = (size_t)ksplit * MR * NT * 4 * 32 * 4;
    skinny_kernel<NT, MR, SWIGLU, GROUPED><<<grid, 32 * ksplit, smem, cstream(c)>>>(a);
    LAUNCH_CHECK(c, what);
}

/* nt = n-tiles wanted. Under the 128-register bound of 2 blocks per SM, two m-tiles
 * (SwiGLU) keep 2 n-tiles per pass and one m-tile 4 (more spill): larger batches take
 * several passes over the block's rows (the repeated weight reads hit L2), and the
 * grouped forms take the route's tiles 16 slots per pass. */
template <int MR, bool SWIGLU, bool GROUPED>
static int sk_dispatch(const struct cuda_ctx *c, const sk_args &a, int nt, dim3 grid, const char *what) {
    const int ks = sk_ksplit(a.w0.cols / QGROUP, nt);
    if (nt <= 1) return sk_launch<1, MR, SWIGLU, GROUPED>(c, a, grid, ks, what);
    if constexpr (MR == 1 && !GROUPED) {
        if (nt <= 2) return sk_launch<2, MR, SWIGLU, GROUPED>(c, a, grid, ks, what);
        return sk_launch<4, MR, SWIGLU, GROUPED>(c, a, grid, sk_ksplit(a.w0.cols / QGROUP, 4), what);
    }
    return sk_launch<2, MR, SWIGLU, GROUPED>(c, a, grid, sk_ksplit(a.w0.cols / QGROUP, 2), what);
}

#define SK_ATTR(NT, MR, SW, GR)                                                                                        \
    if (e == cudaSuccess)                                                                                              \
        e = cudaFuncSetAttribute(skinny_kernel<NT, MR, SW, GR>, cudaFuncAttributeMaxDynamicSharedMemorySize, SK_MAX_SMEM);

extern "C" int cuda_skinny_init(char *err, size_t errlen) {
    cudaError_t e = cudaSuccess;
    SK_ATTR(1, 1, false, false) SK_ATTR(2, 1, false, false) SK_ATTR(4, 1, false, false)
    SK_ATTR(1, 2, true, false) SK_ATTR(2, 2, true, false)
    SK_ATTR(1, 1, false, true) SK_ATTR(2, 1, false, true)
    SK_ATTR(1, 2, true, true) SK_ATTR(2, 2, true, true)
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny: cudaFuncSetAttribute failed: %s", cudaGetErrorString(e));
    return 0;
}

extern "C" int cuda_skinny_supported(const struct cuda_qmat *m) { return m->bits == 4 && m->cols % QGROUP == 0; }

static int sk_check(const struct cuda_ctx *c, const struct cuda_qmat *m, int ldx, const char *what) {
    if (!cuda_skinny_supported(m))
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "%s: %d-bit weights with %d columns (needs 4-bit, a multiple of 64)",
                      what, m->bits, m->cols);
    if (ldx % 8) return errorf(c->err, c->errlen, ST_INTERNAL, "%s: ldx %d not a multiple of 8", what, ldx);
    return 0;
}

extern "C" int cuda_skinny_dense(const struct cuda_ctx *c, const struct cuda_qmat *m, int mat, const uint16_t *x, int T,
                                 int ldx, float *y, int ldy, int accumulate) {
    int rc;
    if ((rc = sk_check(c, m, ldx, "skinny_dense"))) return rc;
    if (T < 1 || T > SK_MAX_T) return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_dense: %d tokens (1..%d)", T, SK_MAX_T);
    sk_args a = {};
    a.w0 = *m;
    a.x = x;
    a.ldx = ldx;
    a.T = T;
    a.y = y;
    a.ldy = ldy;
    a.accumulate = accumulate;
    /* matrix `mat` of a stack: offset by whole matrices (same as the grouped expert offset) */
    const size_t rows = (size_t)mat * m->rows;
    a.w0.codes = m->codes + rows * (size_t)(m->cols / 8);
    a.w0.scales = m->scales + rows * (size_t)(m->cols / QGROUP);
    a.w0.biases = m->biases + rows * (size_t)(m->cols / QGROUP);
    return sk_dispatch<1, false, false>(c, a, (T + 7) / 8, dim3((m->rows + 15) / 16), "skinny_dense");
}

extern "C" int cuda_skinny_multi(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const uint16_t *x,
                                 int T, int ldx) {
    int rc;
    if (n_segs < 1 || n_segs > SK_MAX_SEG) return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_multi: %d matrices", n_segs);
    if (T < 1 || T > SK_MAX_T) return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_multi: %d tokens (1..%d)", T, SK_MAX_T);
    sk_args a = {};
    a.x = x;
    a.ldx = ldx;
    a.T = T;
    a.accumulate = segs[0].accumulate;
    a.nseg = n_segs;
    int blocks = 0;
    for (int i = 0; i < n_segs; i++) {
        if ((rc = sk_check(c, &segs[i].m, ldx, "skinny_multi"))) return rc;
        if (segs[i].m.cols != segs[0].m.cols || segs[i].accumulate != a.accumulate)
            return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_multi: matrices differ in columns or accumulation");
        a.wseg[i] = segs[i].m;
        a.yseg[i] = segs[i].y;
        a.ldyseg[i] = segs[i].ldy;
        a.blk0[i] = blocks;
        blocks += (segs[i].m.rows + 15) / 16;
    }
    a.blk0[n_segs] = blocks;
    a.w0 = segs[0].m; /* K for the split */
    return sk_dispatch<1, false, false>(c, a, (T + 7) / 8, dim3(blocks), "skinny_multi");
}

extern "C" int cuda_skinny_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                  const uint16_t *x, int T, int ldx, uint16_t *act, int ld_act) {
    int rc;
    if ((rc = sk_check(c, gate, ldx, "skinny_swiglu")) || (rc = sk_check(c, up, ldx, "skinny_swiglu"))) return rc;
    if (T < 1 || T > SK_MAX_T) return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_swiglu: %d tokens (1..%d)", T, SK_MAX_T);
    if (gate->rows != up->rows || gate->cols != up->cols)
        return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_swiglu: gate %dx%d vs up %dx%d", gate->rows, gate->cols, up->rows,
                      up->cols);
    sk_args a = {};
    a.w0 = *gate;
    a.w1 = *up;
    a.x = x;
    a.ldx = ldx;
    a.T = T;
    a.act = act;
    a.ld_act = ld_act;
    return sk_dispatch<2, true, false>(c, a, (T + 7) / 8, dim3((gate->rows + 15) / 16), "skinny_swiglu");
}

/* Grouped by the route's tiles: tiles hold at most 64 slots; the kernel takes them in
 * passes of 16 (NT = 2), which covers the usual decode counts (a few tokens per expert)
 * in one pass. */
extern "C" int cuda_skinny_grouped_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                          const uint16_t *xn, int ldx, const struct cuda_moe_route *r, uint16_t *act) {
    int rc;
    if ((rc = sk_check(c, gate, ldx, "skinny_grouped_swiglu")) || (rc = sk_check(c, up, ldx, "skinny_grouped_swiglu")))
        return rc;
    sk_args a = {};
    a.w0 = *gate;
    a.w1 = *up;
    a.x = xn;
    a.ldx = ldx;
    a.x_rows = r->row_of_slot;
    a.tiles = r->tiles;
    a.max_tiles = r->max_tiles;
    a.act = act;
    a.ld_act = gate->rows;
    return sk_dispatch<2, true, true>(c, a, 2, dim3((gate->rows + 15) / 16, r->max_tiles), "skinny_grouped_swiglu");
}

extern "C" int cuda_skinny_grouped_down(const struct cuda_ctx *c, const struct cuda_qmat *down, const uint16_t *act,
                                        const struct cuda_moe_route *r, float *out) {
    int rc;
    if ((rc = sk_check(c, down, down->cols, "skinny_grouped_down"))) return rc;
    sk_args a = {};
    a.w0 = *down;
    a.x = act;
    a.ldx = down->cols;
    a.tiles = r->tiles;
    a.max_tiles = r->max_tiles;
    a.y = out;
    a.ldy = down->rows;
    return sk_dispatch<1, false, true>(c, a, 2, dim3((down->rows + 15) / 16, r->max_tiles), "skinny_grouped_down");
}
