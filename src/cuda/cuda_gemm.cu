// cuda/cuda_gemm.cu — tensor-core GEMM with quantized weights, for prefill-sized batches:
// y[M, N] = x[M, K] (bf16) · W[N, K]ᵀ where W is MLX affine 4- or 8-bit. Each block
// computes a 64 × 128 tile; per 64-wide k step (one quantization group) A arrives by
// cp.async and the W tile is dequantized (s·q + b → bf16) from registers into shared
// memory, double buffered; mma.sync m16n8k16 bf16 → fp32. Variants: dense, SwiGLU
// (gate and up rows interleaved in one tile, epilogue silu(g)·u → bf16), and grouped
// (MoE: block y indexes a device tile list of (expert, m0, m_end), A rows gathered).
// On sm_90a, 4-bit products go to the wgmma form instead (cuda_gemm_wg.cu; dispatch below;
// ORCHID_NO_WGMMA=1 keeps this one): 8-bit matrices and the router's residual pass stay here.
#include "cuda/cuda_gemm.h"

#define BM 64 /* token rows a block (a route tile of 128 slots takes two) */
#define BN 128
#define BK 64
#define SPAD 72 /* shared row stride in bf16: 144 B, conflict-free ldmatrix */
#define GEMM_THREADS 256
#define GEMM_SMEM ((2 * BM * SPAD + 2 * BN * SPAD) * 2)
#define GEMM_SMEM_PREC (2 * GEMM_SMEM) /* the fused precise form: the low parts' tiles too */


__device__ __forceinline__ void ldsm_x4(const void *p, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
}

__device__ __forceinline__ void mma_bf16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int BITS>
struct bregs {
    uint4 w[BITS == 4 ? 1 : 2];
    float s, b;
};

template <int BITS>
__device__ __forceinline__ void load_b(bregs<BITS> &r, const uint32_t *codes_row, const uint16_t *sc, const uint16_t *bi,
                                       bool valid, int kt, int half) {
    if (!valid) {
#pragma unroll
        for (int i = 0; i < (BITS == 4 ? 1 : 2); i++) r.w[i] = make_uint4(0, 0, 0, 0);
        r.s = 0.0f;
        r.b = 0.0f;
        return;
    }
    if (BITS == 4) {
        r.w[0] = ld_stream(reinterpret_cast<const uint4 *>(codes_row + kt * 8 + half * 4));
    } else {
        const uint4 *p = reinterpret_cast<const uint4 *>(codes_row + kt * 16 + half * 8);
        r.w[0] = ld_stream(p);
        r.w[1] = ld_stream(p + 1);
    }
    r.s = bf(sc[kt]);
    r.b = bf(bi[kt]);
}

__device__ __forceinline__ float wres(float w) { return w - __bfloat162float(__float2bfloat16_rn(w)); }

template <int BITS, bool WLO>
__device__ __forceinline__ uint32_t dq2(const bregs<BITS> &r, uint32_t q0, uint32_t q1) {
    float a = fmaf(r.s, u2f(q0), r.b), b = fmaf(r.s, u2f(q1), r.b);
    if (WLO) {
        a = wres(a);
        b = wres(b);
    }
    return pack_bf2(a, b);
}

template <int BITS, bool WLO>
__device__ __forceinline__ void store_b(const bregs<BITS> &r, uint16_t *dst /* 32 bf16 */) {
    uint4 *d = reinterpret_cast<uint4 *>(dst);
    if (BITS == 4) {
        const uint32_t ws[4] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t w = ws[j];
            uint32_t o[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                o[k] = dq2<BITS, WLO>(r, (w >> (8 * k)) & 15u, (w >> (8 * k + 4)) & 15u);
            d[j] = make_uint4(o[0], o[1], o[2], o[3]);
        }
    } else {
        const uint32_t ws[8] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w, r.w[1].x, r.w[1].y, r.w[1].z, r.w[1].w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t o[4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t w = ws[2 * j + h];
                o[2 * h] = dq2<BITS, WLO>(r, w & 255u, (w >> 8) & 255u);
                o[2 * h + 1] = dq2<BITS, WLO>(r, (w >> 16) & 255u, w >> 24);
            }
            d[j] = make_uint4(o[0], o[1], o[2], o[3]);
        }
    }
}

/* A fragments of the warp's two m-tiles and B fragments of its four n-tiles, k16 step
 * k16 of a staged [rows][SPAD] tile (ldmatrix; the layouts mma_bf16 takes). */
__device__ __forceinline__ void ld_a_frags(const uint16_t *Ac, int wm, int lane, int k16, uint32_t (&af)[2][4]) {
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
        ldsm_x4(Ac + (wm * 32 + mi * 16 + (lane & 15)) * SPAD + k16 * 16 + (lane >> 4) * 8, af[mi][0], af[mi][1], af[mi][2],
                af[mi][3]);
}
__device__ __forceinline__ void ld_b_frags(const uint16_t *Bc, int wn, int lane, int k16, uint32_t (&bfr)[4][2]) {
#pragma unroll
    for (int p = 0; p < 2; p++)
        ldsm_x4(Bc + (wn * 32 + p * 16 + (lane & 7) + (lane >> 4) * 8) * SPAD + k16 * 16 + ((lane >> 3) & 1) * 8,
                bfr[2 * p][0], bfr[2 * p][1], bfr[2 * p + 1][0], bfr[2 * p + 1][1]);
}

/* PREC: cuda_gemm_precise's three products in one pass — x_hi·W_hi, x_lo·W_hi and x_hi·W_lo,
 * each into its own accumulator (acc, acc_l, acc_w), added in that order at the end as the
 * three launches of the old form added them into y: the same bits, one launch instead of
 * three, W dequantized once into both parts (hi = bf16(w), lo = bf16(w − hi)). Shared
 * memory doubles: As / Bs then As_lo / Bs_lo. */
template <int BITS, bool SWIGLU, bool WLO, bool PREC = false>
static __global__ void __launch_bounds__(GEMM_THREADS) gemm_q_kernel(gemm_args a) {
    TRACE_KERNEL();
    static_assert(!(PREC && (SWIGLU || WLO)), "the fused precise form is dense, its residual part built in");
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *As = smem;                   /* [2][BM][SPAD] */
    uint16_t *Bs = smem + 2 * BM * SPAD;   /* [2][BN][SPAD] */
    uint16_t *As_lo = Bs + 2 * BN * SPAD;  /* PREC: [2][BM][SPAD] x_lo */
    uint16_t *Bs_lo = As_lo + 2 * BM * SPAD; /* PREC: [2][BN][SPAD] W_lo */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;

    int m0, m_end, expert = 0;
    if (a.tiles) { /* block row y: part y % subs of tile y / subs */
        const int n_tiles = a.tiles[a.max_tiles * 3];
        const int subs = a.tile_rows > BM ? a.tile_rows / BM : 1, ti = blockIdx.y / subs;
        if (ti >= n_tiles) return;
        expert = a.tiles[ti * 3];
        m0 = a.tiles[ti * 3 + 1] + (blockIdx.y - ti * subs) * BM;
        m_end = min(a.tiles[ti * 3 + 2], a.tiles[ti * 3 + 1] + a.tile_rows);
        if (m0 >= m_end) return;
    } else {
        m0 = blockIdx.y * BM;
        m_end = a.M;
    }

    /* A rows this thread copies: chunks tid and tid + 256 of the 64 × 8 chunk grid. */
    const uint16_t *a_src[2], *a_src_lo[2];
    bool a_ok[2];
    int a_row[2], a_ch[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int idx = tid + i * GEMM_THREADS;
        a_row[i] = idx >> 3;
        a_ch[i] = idx & 7;
        const int gr = m0 + a_row[i];
        a_ok[i] = gr < m_end;
        const int src = a_ok[i] ? (a.a_rows ? a.a_rows[gr] : gr) : 0;
        a_src[i] = a.x + (size_t)src * a.ldx + a_ch[i] * 8;
        a_src_lo[i] = PREC ? a.x_lo + (size_t)src * a.ldx + a_ch[i] * 8 : NULL;
    }

    /* B row this thread dequantizes: shared row tid/2, half tid%2. */
    const int b_n = tid >> 1, b_half = tid & 1;
    const cuda_qmat *bm = &a.b0;
    int w_row;
    if (SWIGLU) {
        const int s = b_n & 31;
        w_row = blockIdx.x * 64 + (b_n >> 5) * 16 + (s & 15);
        if (s >= 16) bm = &a.b1;
    } else {
        w_row = blockIdx.x * BN + b_n;
    }
    const bool b_ok = w_row < a.N;
    const size_t abs_row = (size_t)expert * bm->rows + (b_ok ? w_row : 0);
    const uint32_t *b_codes = bm->codes + abs_row * (size_t)(a.K * BITS / 32);
    const uint16_t *b_sc = bm->scales + abs_row * (size_t)(a.K / QGROUP);
    const uint16_t *b_bi = bm->biases + abs_row * (size_t)(a.K / QGROUP);

    float acc[2][4][4], acc_l[2][4][4], acc_w[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][j][k] = acc_l[i][j][k] = acc_w[i][j][k] = 0.0f;

    const int nk = a.K / BK;
    bregs<BITS> br;
    /* prologue: stage 0 */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        cpa16z(As + a_row[i] * SPAD + a_ch[i] * 8, a_ok[i] ? (const void *)a_src[i] : (const void *)a.x, a_ok[i]);
        if (PREC) cpa16z(As_lo + a_row[i] * SPAD + a_ch[i] * 8, a_ok[i] ? (const void *)a_src_lo[i] : (const void *)a.x, a_ok[i]);
    }
    cpa_commit();
    load_b<BITS>(br, b_codes, b_sc, b_bi, b_ok, 0, b_half);
    store_b<BITS, WLO>(br, Bs + b_n * SPAD + b_half * 32);
    if (PREC) store_b<BITS, true>(br, Bs_lo + b_n * SPAD + b_half * 32);
    cpa_wait<0>();
    __syncthreads();

    for (int kt = 0; kt < nk; kt++) {
        const int buf = kt & 1;
        const bool more = kt + 1 < nk;
        if (more) {
            uint16_t *An = As + (buf ^ 1) * BM * SPAD;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                cpa16z(An + a_row[i] * SPAD + a_ch[i] * 8,
                           a_ok[i] ? (const void *)(a_src[i] + (kt + 1) * BK) : (const void *)a.x, a_ok[i]);
                if (PREC)
                    cpa16z(An + 2 * (BM + BN) * SPAD + a_row[i] * SPAD + a_ch[i] * 8,
                           a_ok[i] ? (const void *)(a_src_lo[i] + (kt + 1) * BK) : (const void *)a.x, a_ok[i]);
            }
            cpa_commit();
            load_b<BITS>(br, b_codes, b_sc, b_bi, b_ok, kt + 1, b_half);
        }
        const uint16_t *Ac = As + buf * BM * SPAD;
        const uint16_t *Bc = Bs + buf * BN * SPAD;
#pragma unroll
        for (int k16 = 0; k16 < BK / 16; k16++) {
            uint32_t af[2][4], bfr[4][2];
            ld_a_frags(Ac, wm, lane, k16, af);
            ld_b_frags(Bc, wn, lane, k16, bfr);
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) mma_bf16(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
            if (PREC) {
                uint32_t af_lo[2][4], bfr_lo[4][2];
                ld_a_frags(As_lo + buf * BM * SPAD, wm, lane, k16, af_lo);
                ld_b_frags(Bs_lo + buf * BN * SPAD, wn, lane, k16, bfr_lo);
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        mma_bf16(acc_l[mi][ni], af_lo[mi], bfr[ni][0], bfr[ni][1]);
                        mma_bf16(acc_w[mi][ni], af[mi], bfr_lo[ni][0], bfr_lo[ni][1]);
                    }
            }
        }
        if (more) {
            store_b<BITS, WLO>(br, Bs + (buf ^ 1) * BN * SPAD + b_n * SPAD + b_half * 32);
            if (PREC) store_b<BITS, true>(br, Bs_lo + (buf ^ 1) * BN * SPAD + b_n * SPAD + b_half * 32);
            cpa_wait<0>();
        }
        __syncthreads();
    }

    /* epilogue */
#pragma unroll
    for (int mi = 0; mi < 2; mi++) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = m0 + wm * 32 + mi * 16 + (lane >> 2) + hr * 8;
            if (r >= m_end) continue;
            if (SWIGLU) {
#pragma unroll
                for (int ni = 0; ni < 2; ni++) {
                    const int f = blockIdx.x * 64 + wn * 16 + ni * 8 + 2 * (lane & 3);
                    if (f >= a.N) continue;
                    const float g0 = acc[mi][ni][hr * 2], g1 = acc[mi][ni][hr * 2 + 1];
                    const float u0 = acc[mi][ni + 2][hr * 2], u1 = acc[mi][ni + 2][hr * 2 + 1];
                    uint16_t *dst = a.act + (size_t)r * a.ld_act + f;
                    if (f + 1 < a.N) *reinterpret_cast<uint32_t *>(dst) = pack_bf2(silu(g0) * u0, silu(g1) * u1);
                    else dst[0] = f2bf(silu(g0) * u0);
                }
            } else {
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const int col = blockIdx.x * BN + wn * 32 + ni * 8 + 2 * (lane & 3);
                    float *dst = a.y + (size_t)r * a.ldy + col;
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        if (col + e >= a.N) continue;
                        const float v = acc[mi][ni][hr * 2 + e];
                        float o = a.accumulate ? dst[e] + v : v;
                        if (PREC) o = (o + acc_l[mi][ni][hr * 2 + e]) + acc_w[mi][ni][hr * 2 + e];
                        dst[e] = o;
                    }
                }
            }
        }
    }
}

/* Raises the dynamic shared-memory limit of every GEMM instantiation; called once at
 * backend creation (never inside a graph capture). */
extern "C" int cuda_gemm_init(char *err, size_t errlen) {
    cudaError_t e = cudaFuncSetAttribute(gemm_q_kernel<4, false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMM_SMEM);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(gemm_q_kernel<4, true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMM_SMEM);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(gemm_q_kernel<8, false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMM_SMEM);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(gemm_q_kernel<8, true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMM_SMEM);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(gemm_q_kernel<4, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMM_SMEM);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(gemm_q_kernel<8, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMM_SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_q_kernel<4, false, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMM_SMEM_PREC);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_q_kernel<8, false, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMM_SMEM_PREC);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "gemm: cudaFuncSetAttribute failed: %s", cudaGetErrorString(e));
    return gemm_wg_init(err, errlen);
}

template <int BITS, bool SWIGLU, bool WLO, bool PREC = false>
static int launch_gemm(const struct cuda_ctx *c, const gemm_args &a, dim3 grid, const char *what) {
    gemm_q_kernel<BITS, SWIGLU, WLO, PREC><<<grid, GEMM_THREADS, PREC ? GEMM_SMEM_PREC : GEMM_SMEM, cstream(c)>>>(a);
    LAUNCH_CHECK(c, what);
}

static int dispatch(const struct cuda_ctx *c, const gemm_args &a, bool swiglu, dim3 grid, const char *what) {
    if (a.K % BK != 0) return errorf(c->err, c->errlen, ST_UNSUPPORTED, "%s: K = %d is not a multiple of %d", what, a.K, BK);
    if (a.ldx % 8 != 0) return errorf(c->err, c->errlen, ST_INTERNAL, "%s: ldx %d not a multiple of 8", what, a.ldx);
    const int bits = a.b0.bits;
    if (swiglu && a.b1.bits != bits) return errorf(c->err, c->errlen, ST_UNSUPPORTED, "%s: gate/up bit widths differ", what);
    if (a.wlo && swiglu) return errorf(c->err, c->errlen, ST_INTERNAL, "%s: residual weights with SwiGLU", what);
    /* x_lo: cuda_gemm_precise's fused form, dense (the wgmma form does not take it) */
    if (a.x_lo && (swiglu || a.wlo || a.tiles))
        return errorf(c->err, c->errlen, ST_INTERNAL, "%s: the fused precise form is dense", what);
    if (gemm_wg_usable(a, swiglu)) return gemm_wg_launch(c, a, swiglu, (int)grid.y, what);
    if (a.tiles && a.tile_rows > BM) grid.y *= a.tile_rows / BM; /* grouped: grid.y counts route tiles */
    if (bits == 4)
        return swiglu  ? launch_gemm<4, true, false>(c, a, grid, what)
               : a.wlo ? launch_gemm<4, false, true>(c, a, grid, what)
               : a.x_lo ? launch_gemm<4, false, false, true>(c, a, grid, what)
                        : launch_gemm<4, false, false>(c, a, grid, what);
    if (bits == 8)
        return swiglu  ? launch_gemm<8, true, false>(c, a, grid, what)
               : a.wlo ? launch_gemm<8, false, true>(c, a, grid, what)
               : a.x_lo ? launch_gemm<8, false, false, true>(c, a, grid, what)
                        : launch_gemm<8, false, false>(c, a, grid, what);
    return errorf(c->err, c->errlen, ST_UNSUPPORTED, "%s: %d-bit weights", what, bits);
}


/* The fields every launch sets: the activations x [M, ldx] and the weight b0 ([N, K]). */
static gemm_args args_for(const uint16_t *x, int ldx, int M, const struct cuda_qmat *w) {
    gemm_args a = {};
    a.x = x;
    a.ldx = ldx;
    a.M = M;
    a.N = w->rows;
    a.K = w->cols;
    a.b0 = *w;
    return a;
}

extern "C" int cuda_gemm_dense(const struct cuda_ctx *c, const struct cuda_qmat *m, int mat, const uint16_t *x, int T,
                               int ldx, float *y, int ldy, int accumulate) {
    if (T <= 0) return 0;
    gemm_args a = args_for(x, ldx, T, m);
    a.b1 = *m;
    /* select matrix `mat` through the expert offset of the kernel: emulate with a one-tile list? simpler: offset pointers */
    const size_t rows = (size_t)mat * m->rows;
    a.b0.codes = m->codes + rows * (size_t)(m->cols * m->bits / 32);
    a.b0.scales = m->scales + rows * (size_t)(m->cols / QGROUP);
    a.b0.biases = m->biases + rows * (size_t)(m->cols / QGROUP);
    a.y = y;
    a.ldy = ldy;
    a.accumulate = accumulate;
    return dispatch(c, a, false, dim3((m->rows + BN - 1) / BN, (T + BM - 1) / BM), "gemm_dense");
}

/* y (+)= x·Wᵀ to ~fp32 accuracy on the tensor cores: x = x_hi + x_lo and W = W_hi + W_lo
 * split into bf16 parts, y = x_hi·W_hi + x_lo·W_hi + x_hi·W_lo (the lo·lo term, ~2^-18
 * relative, is dropped). For the router, where a rounding-sized error can flip an expert.
 * One launch of gemm_q_kernel's PREC form where the first product would take the mma.sync
 * kernel anyway (the checkpoint's 8-bit router and shared-expert gate): the same sums in
 * the same order as three launches, W read and dequantized once. A 4-bit matrix whose
 * x·W the wgmma form takes keeps the three launches (that form's bits).
 * ORCHID_NO_PRECISE_FUSED=1, or cuda_gemm_precise_fused(0) (the GPU test's bitwise check):
 * three launches always. */
static int precise_fused = -1; /* -1: from the environment at the first call */

extern "C" void cuda_gemm_precise_fused(int on) { precise_fused = on ? 1 : 0; }

extern "C" int cuda_gemm_precise(const struct cuda_ctx *c, const struct cuda_qmat *m, const uint16_t *x_hi,
                                 const uint16_t *x_lo, int T, int ldx, float *y, int ldy, int accumulate) {
    if (precise_fused < 0) {
        const char *e = getenv("ORCHID_NO_PRECISE_FUSED");
        precise_fused = e && atoi(e) == 1 ? 0 : 1;
    }
    if (T <= 0) return 0;
    gemm_args a = args_for(x_hi, ldx, T, m);
    a.b1 = *m;
    a.y = y;
    a.ldy = ldy;
    a.accumulate = accumulate;
    const dim3 grid((m->rows + BN - 1) / BN, (T + BM - 1) / BM);
    if (precise_fused && !gemm_wg_usable(a, false)) { /* x_hi·W_hi would take mma.sync: one launch */
        a.x_lo = x_lo;
        return dispatch(c, a, false, grid, "gemm_precise");
    }
    int rc = cuda_gemm_dense(c, m, 0, x_hi, T, ldx, y, ldy, accumulate);
    if (!rc) rc = cuda_gemm_dense(c, m, 0, x_lo, T, ldx, y, ldy, 1);
    if (rc) return rc;
    a.accumulate = 1; /* x_hi·W_lo onto the two before */
    a.wlo = 1;
    return dispatch(c, a, false, grid, "gemm_precise");
}

extern "C" int cuda_gemm_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                const uint16_t *x, int T, int ldx, uint16_t *act, int ld_act) {
    if (T <= 0) return 0;
    gemm_args a = args_for(x, ldx, T, gate);
    a.b1 = *up;
    a.act = act;
    a.ld_act = ld_act;
    return dispatch(c, a, true, dim3((gate->rows + 63) / 64, (T + BM - 1) / BM), "gemm_swiglu");
}

extern "C" int cuda_moe_grouped_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                       const uint16_t *xn, int ldx, const struct cuda_moe_route *r, uint16_t *act) {
    gemm_args a = args_for(xn, ldx, 0, gate);
    a.a_rows = r->row_of_slot;
    a.b1 = *up;
    a.act = act;
    a.ld_act = gate->rows;
    a.tiles = r->tiles;
    a.max_tiles = r->max_tiles;
    a.tile_rows = r->tile_rows;
    return dispatch(c, a, true, dim3((gate->rows + 63) / 64, cuda_moe_route_grid(r)), "moe_grouped_swiglu");
}

extern "C" int cuda_moe_grouped_down(const struct cuda_ctx *c, const struct cuda_qmat *down, const uint16_t *act,
                                     const struct cuda_moe_route *r, float *out) {
    gemm_args a = args_for(act, down->cols, 0, down);
    a.b1 = *down;
    a.y = out;
    a.ldy = down->rows;
    a.tiles = r->tiles;
    a.max_tiles = r->max_tiles;
    a.tile_rows = r->tile_rows;
    return dispatch(c, a, false, dim3((down->rows + BN - 1) / BN, cuda_moe_route_grid(r)), "moe_grouped_down");
}

CUDA_TRACE_TU(gemm)
