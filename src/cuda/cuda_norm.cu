// cuda/cuda_norm.cu — row-wise kernels: embedding gather + dequant, RMSNorm
// (fp32 residual → bf16 GEMM input; one row by its own kernel, the same bits), and the
// two-stage argmax over logits.
#include <math.h>

#include "cuda/cuda_internal.h"

/* PDL (every kernel here): trigger, then wait before the first read of tokens / x /
 * logits / scratch (the rows to read depend on them). */
static __global__ void embed_kernel(cuda_qmat m, const int32_t *tokens, float *x) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait();
    const int t = blockIdx.x;
    const size_t row = (size_t)tokens[t];
    const int per = 32 / m.bits, words = m.cols / per;
    const uint32_t *c = qrow_codes(m, row);
    const size_t g0 = qrow_group0(m, row);
    const uint32_t mask = (1u << m.bits) - 1u;
    float *o = x + (size_t)t * m.cols;
    for (int w = threadIdx.x; w < words; w += blockDim.x) {
        const uint32_t word = c[w];
        const int e0 = w * per, g = e0 / QGROUP;
        const float s = bf(m.scales[g0 + g]), b = bf(m.biases[g0 + g]);
        for (int k = 0; k < per; k++) o[e0 + k] = fmaf(s, u2f((word >> (k * m.bits)) & mask), b);
    }
}

extern "C" int cuda_embed(const struct cuda_ctx *c, const struct cuda_qmat *embed, const int32_t *tokens, int T, float *x) {
    if (T <= 0) return 0;
    LAUNCH_CHECK_RC(c, launch_k(embed_kernel, dim3(T), dim3(256), 0, cstream(c), *embed, tokens, x), "embed");
}

/* One row a block (256 threads), in tail_rmsnorm's order (rms_row_inv: lane l fmas x[l],
 * x[l + 256], ..., then block_sum; the output x·inv·gain): the bits every other norm of a row
 * has. The gains are the model's, read before the wait; the row's first NS_REG·256 values
 * (all of H = 2,048) are asked for at once after it and kept in registers for the second
 * pass. The loop form it replaces (session 44) fetched a thread's values one dependent round
 * trip at a time, then the gains the same way: 9.0 µs a call at 64 rows under ncu (H100),
 * 0.5 MB read, 6 % issue-slot use — the 2..64-token path's post-mixer norm, 40 a step. */
static __global__ void __launch_bounds__(256) rmsnorm_kernel(const float *x, const float *gain, int n, float eps,
                                                             const int32_t *rows, uint16_t *xn, float *xn32, uint16_t *xlo) {
    TRACE_KERNEL();
    __shared__ float sh[32];
    pdl_trigger();
    float g[NS_REG];
    rms_row_load<NS_REG, false>(gain, n, g);
    pdl_wait();
    const int t = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[t] : t) * n;
    float v[NS_REG];
    rms_row_load<NS_REG, false>(xr, n, v); /* written by earlier launches: visible after the wait */
    const float inv = rms_row_inv<NS_REG, false>(v, xr, n, eps, sh);
    uint16_t *o = xn + (size_t)t * n;
    float *o32 = xn32 ? xn32 + (size_t)t * n : NULL;
    uint16_t *olo = xlo ? xlo + (size_t)t * n : NULL;
    rms_row_out<NS_REG, false>(v, g, xr, gain, n, inv, [&](int i, float val) {
        const uint16_t h = f2bf(val);
        o[i] = h;
        if (o32) o32[i] = val;
        if (olo) olo[i] = f2bf(val - bf(h));
    });
}

/* One row (T = 1; rows: NULL or its index, read after the wait) by one block, the bits of
 * rmsnorm_kernel: the decode step's final norm before the lm_head. Its gains are read
 * before the wait and its x values all requested at once (norm_src_row): the generic
 * kernel's second pass read the gains only after the reduction (a DRAM round trip on the
 * step's chain; step 9.8 µs in the timeline, session 22). */
static __global__ void __launch_bounds__(256) rmsnorm_row_kernel(cuda_norm_src ns, int n, const int32_t *rows) {
    TRACE_KERNEL();
    float g[NS_REG];
    rms_row_load<NS_REG, false>(ns.gain, n, g);
    pdl_trigger();
    pdl_wait();
    if (rows) ns.x += (size_t)rows[0] * n;
    norm_src_row(ns, n, g, [](int, float) {});
}

extern "C" int cuda_rmsnorm(const struct cuda_ctx *c, const float *x, const float *gain, int T, int n, float eps,
                            const int32_t *rows, uint16_t *xn) {
    if (T <= 0) return 0;
    static const bool generic = env_flag("ORCHID_NORM_GENERIC");
    if (T == 1 && !generic) {
        const cuda_norm_src ns = {x, gain, eps, xn};
        LAUNCH_CHECK_RC(c, launch_k(rmsnorm_row_kernel, dim3(1), dim3(256), 0, cstream(c), ns, n, rows), "rmsnorm");
    }
    LAUNCH_CHECK_RC(c, launch_k(rmsnorm_kernel, dim3(T), dim3(256), 0, cstream(c), x, gain, n, eps, rows, xn,
                                (float *)NULL, (uint16_t *)NULL),
                    "rmsnorm");
}

extern "C" int cuda_rmsnorm2(const struct cuda_ctx *c, const float *x, const float *gain, int T, int n, float eps,
                             const int32_t *rows, uint16_t *xn, float *xn32) {
    if (T <= 0) return 0;
    LAUNCH_CHECK_RC(c, launch_k(rmsnorm_kernel, dim3(T), dim3(256), 0, cstream(c), x, gain, n, eps, rows, xn, xn32,
                                (uint16_t *)NULL),
                    "rmsnorm");
}

extern "C" int cuda_rmsnorm_split(const struct cuda_ctx *c, const float *x, const float *gain, int T, int n, float eps,
                                  uint16_t *xn, uint16_t *xlo) {
    if (T <= 0) return 0;
    LAUNCH_CHECK_RC(c, launch_k(rmsnorm_kernel, dim3(T), dim3(256), 0, cstream(c), x, gain, n, eps,
                                (const int32_t *)NULL, xn, (float *)NULL, xlo),
                    "rmsnorm_split");
}

#define ARGMAX_PARTS 128

/* (value, index) ordering: larger value wins, lower index on ties, NaN never wins. */
__device__ __forceinline__ void amax_merge(float &v, int &i, float v2, int i2) {
    if (isnan(v2)) return;
    if (isnan(v) || v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

__device__ __forceinline__ void amax_block(float &v, int &i) {
    __shared__ float sv[32];
    __shared__ int si[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
        amax_merge(v, i, v2, i2);
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0) {
        sv[w] = v;
        si[w] = i;
    }
    __syncthreads();
    if (w == 0) {
        v = l < nw ? sv[l] : -INFINITY;
        i = l < nw ? si[l] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
            amax_merge(v, i, v2, i2);
        }
    }
}

static __global__ void argmax_part_kernel(const float *logits, int n, int32_t *scratch) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait();
    const int row = blockIdx.y, part = blockIdx.x;
    const int per = (n + ARGMAX_PARTS - 1) / ARGMAX_PARTS;
    const int lo = part * per, hi = min(n, lo + per);
    const float *l = logits + (size_t)row * n;
    float v = -INFINITY;
    int idx = 0x7fffffff;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) amax_merge(v, idx, l[j], j);
    amax_block(v, idx);
    if (threadIdx.x == 0) {
        scratch[((size_t)row * ARGMAX_PARTS + part) * 2] = __float_as_int(v);
        scratch[((size_t)row * ARGMAX_PARTS + part) * 2 + 1] = idx;
    }
}

static __global__ void argmax_final_kernel(const int32_t *scratch, int32_t *ids) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait();
    const int row = blockIdx.x;
    float v = -INFINITY;
    int idx = 0x7fffffff;
    for (int p = threadIdx.x; p < ARGMAX_PARTS; p += blockDim.x)
        amax_merge(v, idx, __int_as_float(scratch[((size_t)row * ARGMAX_PARTS + p) * 2]),
                   scratch[((size_t)row * ARGMAX_PARTS + p) * 2 + 1]);
    amax_block(v, idx);
    if (threadIdx.x == 0) ids[row] = idx == 0x7fffffff ? 0 : idx;
}

/* scratch: [n_rows * ARGMAX_PARTS * 2] int32 */
extern "C" int cuda_argmax(const struct cuda_ctx *c, const float *logits, int n_rows, int n, int32_t *ids,
                           int32_t *scratch) {
    if (n_rows <= 0) return 0;
    LAUNCH_TRY(c, launch_k(argmax_part_kernel, dim3(ARGMAX_PARTS, n_rows), dim3(256), 0, cstream(c), logits, n, scratch),
               "argmax_part");
    LAUNCH_CHECK_RC(c, launch_k(argmax_final_kernel, dim3(n_rows), dim3(128), 0, cstream(c), scratch, ids), "argmax_final");
}

CUDA_TRACE_TU(norm)
