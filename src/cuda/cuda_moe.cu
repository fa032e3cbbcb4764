// cuda/cuda_moe.cu — mixture of experts on the GPU, no host round trip:
// router softmax/top-k (one warp per token; one token's by a whole block), the small-batch
// path (gate/up GEMV with SwiGLU over (token, expert) pairs with the shared expert as pair
// K, and the down GEMV that sums the weighted pairs straight into the residual stream), and the
// large-batch path's routing (histogram, scan, scatter, tile list for the grouped
// tensor-core GEMM of cuda_gemm.cu: one block, or a cooperative launch of a block per 1,024
// pairs) and combine.
#include <limits.h>
#include <math.h>

#include "cuda/cuda_internal.h"
#include "cuda/cuda_mma.h" /* wg_stage_group: the staged rows of combine + norm */
#include "cuda/cuda_topk.h"

/* the cooperative route (route_coop_kernel, below; its scratch is made by cuda_moe_init) */
#define ROUTE_COOP_MIN 2048
static int *route_hist;      /* [route_max_blocks][1024] per-block counts, then 2 barrier ints */
static int route_max_blocks; /* blocks a cooperative route launch may have (the SMs); 0: off */
static int route_force = -1; /* test hook (cuda_moe_route_force): -1 by size, 0 one block, 1 cooperative */
static int route_coop_count; /* cooperative launches made (the GPU test asks) */

/* PDL (every kernel here triggers at its start, except the router: after its rows): the
 * router and the shared expert's gate/up rows issue their first weight loads before
 * pdl_wait(); the routed pairs wait before reading the expert ids (their weight addresses
 * depend on them); every other kernel waits before anything else. (cuda_tcv.cu's one-token
 * down pairs read the ids before their wait: see there.) */

/* ---- router logits from the fp32 normalised input, and the top-k ----
 * logits[t, e] = Σ_c x[t, c] W_router[e, c] and seg[t] = x[t] · w_shared_gate, with the
 * weights dequantized exactly in fp32 and x in fp32 (not rounded to bf16), because a
 * near-tie between the 8th and 9th expert flips on bf16-sized errors and a flipped
 * expert moves the output far more than rounding does. One warp per (row, 8 tokens). */

#define RT_TOK 8 /* tokens a router warp carries */

/* Batches of several tokens stage the row of blocks' RT_TOK token rows of x in shared
 * memory first (coalesced cp.async), with 4 floats of padding after every 32 so that a
 * lane's chunk (16 or 32 floats: 8- or 4-bit codes) reads conflict-free. From global
 * memory each lane read its own 64–128-byte run per token: 32 lines an instruction, the
 * L1's wavefronts the router's bound (31 µs a layer at 64 tokens, H200). One token keeps
 * the direct reads (its weights are requested before the PDL wait; staging would add a
 * barrier to the decode step's chain). The values and their order are the same: the bits. */
#define RT_XPAD 36 /* floats a 32-float run takes in shared memory */
__host__ __device__ __forceinline__ int rt_xstride(int H) { return H / 32 * RT_XPAD; } /* floats a staged token */
__device__ __forceinline__ const float *rt_xs_at(const float *xs, int H, int t, int f) {
    return xs + (size_t)t * rt_xstride(H) + (f >> 5) * RT_XPAD + (f & 31);
}
/* Whether a launch of these shapes can stage (rt_smem then picks router_kernel<RT_STAGED>):
 * whole 32-float runs, 16-byte aligned token rows, and the bytes within the opt-in. */
#define RT_SMEM_MAX (96 * 1024)
static bool rt_smem_ok(int H, int ldx) {
    return H % 32 == 0 && ldx % 4 == 0 && (size_t)RT_TOK * rt_xstride(H) * 4 <= RT_SMEM_MAX;
}

/* acc[t] += W_row · x[t0 + t] (t < nt) over the lane's chunks, weights dequantized exactly
 * in fp32, in two parts around the wait: rt_round from the lane issues the first round of its
 * weight loads (the whole row for K = 2048; PRE: before pdl_wait), rt_rest reads x (from
 * global memory, or staged in xs) and does the sums. router_row is the unstaged one-warp
 * form, waiting in between; the kernel's norm form stages x between them (block-wide). */
#define RT_RU 4 /* chunks a lane has in flight */
struct rt_regs {
    uint4 w[RT_RU];
    float sc[RT_RU], bi[RT_RU];
};
template <int BITS>
__device__ __forceinline__ void rt_round(const cuda_qmat &m, int row, int base, bool pre, rt_regs &r) {
    constexpr int per = BITS == 4 ? 32 : 16;
    const int nch = m.cols / per;
    const uint4 *cr = reinterpret_cast<const uint4 *>(qrow_codes(m, row));
    const size_t g0 = qrow_group0(m, row);
#pragma unroll
    for (int u = 0; u < RT_RU; u++) {
        const int ch = base + 32 * u;
        if (ch < nch) {
            r.w[u] = pre ? ld_stream_pre(cr + ch) : ld_stream(cr + ch);
            r.sc[u] = bf(m.scales[g0 + ch * per / QGROUP]);
            r.bi[u] = bf(m.biases[g0 + ch * per / QGROUP]);
        } else {
            r.w[u] = make_uint4(0, 0, 0, 0);
            r.sc[u] = r.bi[u] = 0.0f;
        }
    }
}
template <int BITS>
__device__ __forceinline__ void rt_rest(const cuda_qmat &m, int row, const float *x, int ldx, int t0, int nt, float *acc,
                                        int lane, const float *xs, rt_regs &r) {
    constexpr int per = BITS == 4 ? 32 : 16;
    const int nch = m.cols / per;
    for (int base = lane; base < nch; base += 32 * RT_RU) {
        if (base != lane) rt_round<BITS>(m, row, base, false, r);
#pragma unroll
        for (int u = 0; u < RT_RU; u++) {
            const int ch = base + 32 * u;
            if (ch >= nch) continue;
            const uint32_t ws[4] = {r.w[u].x, r.w[u].y, r.w[u].z, r.w[u].w};
            float wf[per];
#pragma unroll
            for (int e = 0; e < per; e++) {
                const uint32_t q = BITS == 4 ? (ws[e / 8] >> (4 * (e % 8))) & 15u : (ws[e / 4] >> (8 * (e % 4))) & 255u;
                wf[e] = fmaf(r.sc[u], u2f(q), r.bi[u]);
            }
#pragma unroll
            for (int t = 0; t < RT_TOK; t++) {
                if (t < nt) {
                    const float4 *xp = reinterpret_cast<const float4 *>(
                        xs ? rt_xs_at(xs, m.cols, t, ch * per) : x + (size_t)(t0 + t) * ldx + ch * per);
                    float a = acc[t];
#pragma unroll
                    for (int v = 0; v < per / 4; v++) {
                        const float4 x4 = xp[v];
                        a = fmaf(wf[4 * v], x4.x, a);
                        a = fmaf(wf[4 * v + 1], x4.y, a);
                        a = fmaf(wf[4 * v + 2], x4.z, a);
                        a = fmaf(wf[4 * v + 3], x4.w, a);
                    }
                    acc[t] = a;
                }
            }
        }
    }
}
template <int BITS>
__device__ __forceinline__ void router_row(const cuda_qmat &m, int row, const float *x, int ldx, int t0, int nt,
                                           float *acc, int lane) {
    rt_regs r;
    rt_round<BITS>(m, row, lane, true, r);
    pdl_wait();
    rt_rest<BITS>(m, row, x, ldx, t0, nt, acc, lane, nullptr, r);
}

/* The staged form's warp carries R router rows for its RT_TOK tokens (R = 2 past
 * RT_ROWS2_MIN tokens): a staged x value read from shared memory then serves both rows (one
 * row a warp read all of x once a row: at 64 tokens 135 MB of shared-memory reads, the
 * launch's bound at ~6 µs), and a row of blocks stages its tokens once for 8·R rows (16
 * copies of a row of blocks' 64 KB for E = 256, not 33). Each (row, token) sum is rt_rest's —
 * the same chunks of the same lane in the same order (u, then the values), so the bits do not
 * depend on the form. */
#define RT_ROWS2_MIN 33
#define RT_RUN 8 /* values of a chunk dequantized at a time (16 or 32: 4-bit chunks spilled) */
template <int BITS, int R>
__device__ __forceinline__ void rt_rest_rows(const cuda_qmat &m, const int (&row)[R], int nt, float (&acc)[R][RT_TOK],
                                             int lane, const float *xs, rt_regs (&rr)[R]) {
    constexpr int per = BITS == 4 ? 32 : 16;
    const int nch = m.cols / per;
    for (int base = lane; base < nch; base += 32 * RT_RU) {
        if (base != lane)
#pragma unroll
            for (int i = 0; i < R; i++) rt_round<BITS>(m, row[i], base, false, rr[i]);
#pragma unroll
        for (int u = 0; u < RT_RU; u++) {
            const int ch = base + 32 * u;
            if (ch >= nch) continue;
            /* a chunk in runs of RT_RUN values, each dequantized for the R rows and summed into
             * every token (registers: a whole 4-bit chunk's 32 a row spilled): a (row, token) sum
             * still takes the chunk's values in order */
#pragma unroll
            for (int h = 0; h < per / RT_RUN; h++) {
                float wf[R][RT_RUN];
#pragma unroll
                for (int i = 0; i < R; i++) {
                    const uint32_t ws[4] = {rr[i].w[u].x, rr[i].w[u].y, rr[i].w[u].z, rr[i].w[u].w};
#pragma unroll
                    for (int e = 0; e < RT_RUN; e++) {
                        const int k = RT_RUN * h + e;
                        const uint32_t q = BITS == 4 ? (ws[k / 8] >> (4 * (k % 8))) & 15u : (ws[k / 4] >> (8 * (k % 4))) & 255u;
                        wf[i][e] = fmaf(rr[i].sc[u], u2f(q), rr[i].bi[u]);
                    }
                }
#pragma unroll
                for (int t = 0; t < RT_TOK; t++) {
                    if (t < nt) {
                        const float4 *xp = reinterpret_cast<const float4 *>(rt_xs_at(xs, m.cols, t, ch * per + RT_RUN * h));
#pragma unroll
                        for (int v = 0; v < RT_RUN / 4; v++) {
                            const float4 x4 = xp[v];
#pragma unroll
                            for (int i = 0; i < R; i++) {
                                float a = acc[i][t];
                                a = fmaf(wf[i][4 * v], x4.x, a);
                                a = fmaf(wf[i][4 * v + 1], x4.y, a);
                                a = fmaf(wf[i][4 * v + 2], x4.z, a);
                                a = fmaf(wf[i][4 * v + 3], x4.w, a);
                                acc[i][t] = a;
                            }
                        }
                    }
                }
            }
        }
    }
}
/* Columns of router blocks of the staged form: 8·R rows each. */
__host__ __device__ __forceinline__ int rt_staged_cols(int E, int R) { return (E + 8 * R - 1) / (8 * R); }

__device__ __forceinline__ void rt_cas(float (&v)[8], int (&e)[8], int a, int b) {
    if (rt_before(v[b], e[b], v[a], e[a])) {
        const float tv = v[a];
        const int te = e[a];
        v[a] = v[b];
        e[a] = e[b];
        v[b] = tv;
        e[b] = te;
    }
}

/* Top-k of one token's E ≤ 256 logits by one warp (CG: read through L2, for data other
 * blocks wrote): ids in descending logit order (ties: lower expert), w = softmax over all
 * E (renorm: divided by the sum of the chosen K, summed in rank order). Lane l holds
 * experts l + 32i sorted once (19-comparator network), so each of the K rounds is one
 * warp arg-max of the lanes' heads (two redux instructions on order-preserving keys) and
 * a shift in the winning lane; the probabilities are computed after the rounds, one per
 * lane. (An earlier form rescanned all 8 values, ran a 5-step shuffle arg-max and divided
 * inside every round: one warp's serial chain, 4.9 µs of the router's tail on the H200 —
 * the same results, bit for bit.) The softmax statistics: topk_max_sum. */
template <bool CG>
__device__ __forceinline__ void topk_token_t(const float *l, int E, int K, int renorm, int32_t *ids, float *w, int lane) {
    float v[8];
    int e[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int ex = lane + 32 * i;
        v[i] = ex < E ? (CG ? __ldcg(l + ex) : l[ex]) : -INFINITY;
        e[i] = ex < E ? ex : INT_MAX;
    }
    float mx, sum;
    topk_max_sum(v, E, lane, mx, sum);
    trace_mark(TRACE_MARK4); /* (lane 0's) logits landed, their softmax sum formed */
    /* Batcher's odd-even merge sort of the lane's 8 (descending) */
    rt_cas(v, e, 0, 1); rt_cas(v, e, 2, 3); rt_cas(v, e, 4, 5); rt_cas(v, e, 6, 7);
    rt_cas(v, e, 0, 2); rt_cas(v, e, 1, 3); rt_cas(v, e, 4, 6); rt_cas(v, e, 5, 7);
    rt_cas(v, e, 1, 2); rt_cas(v, e, 5, 6);
    rt_cas(v, e, 0, 4); rt_cas(v, e, 1, 5); rt_cas(v, e, 2, 6); rt_cas(v, e, 3, 7);
    rt_cas(v, e, 2, 4); rt_cas(v, e, 3, 5);
    rt_cas(v, e, 1, 2); rt_cas(v, e, 3, 4); rt_cas(v, e, 5, 6);
    trace_mark(TRACE_MARK5); /* the lane's sort done */
    float mine = -INFINITY;
    int my_id = 0;
    for (int s = 0; s < K; s++) {
        /* arg-max of the heads in two warp reductions: the largest key, then the lowest
         * expert holding it — rt_before's order (for non-NaN logits) */
        const unsigned key = rt_key(v[0]), kmax = __reduce_max_sync(0xffffffffu, key);
        const int bi = (int)__reduce_min_sync(0xffffffffu, key == kmax ? (unsigned)e[0] : 0xffffffffu);
        const float bv = __shfl_sync(0xffffffffu, v[0], bi & 31);
        if ((bi & 31) == lane) { /* the winner is this lane's head: take it */
#pragma unroll
            for (int i = 0; i < 7; i++) {
                v[i] = v[i + 1];
                e[i] = e[i + 1];
            }
            v[7] = -INFINITY;
            e[7] = INT_MAX;
        }
        if (lane == s) {
            mine = bv;
            my_id = bi;
        }
    }
    trace_mark(TRACE_MARK6); /* the K rounds done */
    topk_write(my_id, mine, mx, sum, K, renorm, ids, w, lane);
    trace_mark(TRACE_MARK7); /* weights written */
}

__device__ __forceinline__ void topk_token(const float *l, int E, int K, int renorm, int32_t *ids, float *w, int lane) {
    topk_token_t<false>(l, E, K, renorm, ids, w, lane);
}
__device__ __forceinline__ void topk_token_cg(const float *l, int E, int K, int renorm, int32_t *ids, float *w, int lane) {
    topk_token_t<true>(l, E, K, renorm, ids, w, lane);
}

static __global__ void topk_kernel(const float *logits, int ld, int T, int E, int K, int renorm, int32_t *ids, float *w) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait();
    const int t = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= T) return;
    topk_token(logits + (size_t)t * ld, E, K, renorm, ids + (size_t)t * K, w + (size_t)t * K, lane);
}

/* One token's top-k by one block (the router tail's one-token form), for the GPU test. */
static __global__ void __launch_bounds__(256) topk_block_kernel(const float *logits, int E, int K, int renorm, int32_t *ids,
                                                                 float *w) {
    TRACE_KERNEL();
    __shared__ topk_scratch tks;
    pdl_trigger();
    pdl_wait();
    topk_block<true>(logits, E, K, renorm, ids, w, tks);
}

extern "C" int cuda_moe_topk_block(const struct cuda_ctx *c, const float *logits, int E, int K, int renorm, int32_t *ids,
                                   float *w) {
    if (E > 256 || K > 32 || K > E || K < 1)
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "moe_topk_block: %d experts, top-%d", E, K);
    LAUNCH_CHECK_RC(c, launch_k(topk_block_kernel, dim3(1), dim3(256), 0, cstream(c), logits, E, K, renorm, ids, w),
                    "moe_topk_block");
}

extern "C" int cuda_moe_topk(const struct cuda_ctx *c, const float *logits, int ld, int T, int E, int K, int renorm,
                             int32_t *ids, float *w) {
    if (T <= 0) return 0;
    if (E > 256 || K > 32 || K > E) return errorf(c->err, c->errlen, ST_UNSUPPORTED, "moe_topk: %d experts, top-%d", E, K);
    LAUNCH_CHECK_RC(c, launch_k(topk_kernel, dim3((T + 3) / 4), dim3(128), 0, cstream(c), logits, ld, T, E, K, renorm, ids, w),
                    "moe_topk");
}

struct topk_tail {
    int *counter; /* NULL: no top-k */
    int K, renorm;
    int32_t *ids;
    float *w;
    int block; /* one token's top-k by the whole block (topk_block), not one warp */
};
/* The one-token top-k by a block (ORCHID_TOPK_WARP=1: by one warp, the A/B; the same bits). */
static int topk_block_on(void) {
    static const bool off = env_flag("ORCHID_TOPK_WARP");
    return !off;
}

/* How a router launch reads x: straight from global memory (one token, RT_PLAIN), staged
 * in shared memory by cp.async (batches: rt_smem decides, RT_STAGED), or normalised from the
 * residual by every block into shared memory (one token, RT_NORM: cuda_norm_src, no tail
 * before it). The one-token launches keep their own instances: a kernel carrying both
 * forms measured −1 % on batch-1 decode. */
enum { RT_PLAIN = 0, RT_STAGED = 1, RT_NORM = 2 };
template <int MODE, int R = 1>
static __global__ void __launch_bounds__(256) router_kernel(cuda_qmat router, cuda_qmat sg, const float *x, int ldx, int T,
                                                            float *logits, int ld, float *seg, topk_tail tk, cuda_norm_src ns) {
    TRACE_KERNEL();
    extern __shared__ __align__(16) float rt_xs[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int E = router.rows;
    /* the block's row of RT_TOK tokens and its column: blockIdx (x, y) unstaged; staged, a
     * 1-D grid of every row's rt_staged_cols(E, R) router blocks (column-major in a row),
     * then one block a row for the shared gate's row — dispatched last and out of the
     * top-k's count (the combine reads seg launches later), so no row's top-k waits for it */
    const int ncols = MODE == RT_STAGED ? rt_staged_cols(E, R) : (int)gridDim.x;
    const int nrows = (T + RT_TOK - 1) / RT_TOK;
    const bool sg_blk = MODE == RT_STAGED && (int)blockIdx.x >= ncols * nrows;
    const int trow = MODE != RT_STAGED ? (int)blockIdx.y : sg_blk ? (int)blockIdx.x - ncols * nrows : (int)blockIdx.x / ncols;
    const int col = MODE != RT_STAGED ? (int)blockIdx.x : (int)blockIdx.x % ncols;
    const int t0 = trow * RT_TOK, nt = min(RT_TOK, T - t0);
    if (MODE == RT_STAGED) {
        /* a router block's warp w sums rows 8·R·col + R·w + i (those past E: E − 1's weights,
         * not stored); a shared-gate block's warp 0 sums its row */
        const int H = router.cols;
        int rows[R];
#pragma unroll
        for (int i = 0; i < R; i++) rows[i] = min(col * 8 * R + warp * R + i, E - 1);
        const bool busy = sg_blk ? warp == 0 : col * 8 * R + warp * R < E;
        /* the weights first (no launch writes them), then every thread waits and copies the row
         * of blocks' tokens */
        rt_regs rr[R];
        if (busy) {
            if (sg_blk) {
                if (sg.bits == 4) rt_round<4>(sg, 0, lane, true, rr[0]);
                else rt_round<8>(sg, 0, lane, true, rr[0]);
            } else {
#pragma unroll
                for (int i = 0; i < R; i++) {
                    if (router.bits == 4) rt_round<4>(router, rows[i], lane, true, rr[i]);
                    else rt_round<8>(router, rows[i], lane, true, rr[i]);
                }
            }
        }
        pdl_wait();
        for (int t = 0; t < nt; t++)
            for (int f = 4 * (int)threadIdx.x; f < H; f += 4 * (int)blockDim.x)
                cpa16(const_cast<float *>(rt_xs_at(rt_xs, H, t, f)), x + (size_t)(t0 + t) * ldx + f);
        cpa_commit();
        cpa_wait<0>();
        __syncthreads();
        trace_mark(TRACE_MARK4); /* the tokens staged */
        float acc[R][RT_TOK];
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int t = 0; t < RT_TOK; t++) acc[i][t] = 0.0f;
        if (busy && sg_blk) {
            if (sg.bits == 4) rt_rest<4>(sg, 0, x, ldx, t0, nt, acc[0], lane, rt_xs, rr[0]);
            else rt_rest<8>(sg, 0, x, ldx, t0, nt, acc[0], lane, rt_xs, rr[0]);
        } else if (busy) {
            if (router.bits == 4) rt_rest_rows<4, R>(router, rows, nt, acc, lane, rt_xs, rr);
            else rt_rest_rows<8, R>(router, rows, nt, acc, lane, rt_xs, rr);
        }
        trace_mark(TRACE_MARK5); /* (warp 0's) rows summed in its lanes */
        if (busy && sg_blk) {
            const float v = warp_sum_many<RT_TOK>(acc[0], lane); /* token lane >> 2 */
            const int t = lane >> 2;
            if ((lane & 3) == 0 && t < nt) seg[t0 + t] = v;
        } else if (busy) {
            constexpr int N = R * RT_TOK, G = 32 / N; /* N sums; sum j on lanes j·G .. j·G + G − 1 */
            float all[N];
#pragma unroll
            for (int i = 0; i < R; i++)
#pragma unroll
                for (int t = 0; t < RT_TOK; t++) all[i * RT_TOK + t] = acc[i][t];
            const float v = warp_sum_many<N>(all, lane);
            const int j = lane / G, i = j / RT_TOK, t = j % RT_TOK;
            const int row = col * 8 * R + warp * R + i;
            if (lane % G == 0 && t < nt && row < E) logits[(size_t)(t0 + t) * ld + row] = v;
        }
    } else {
        const int row = blockIdx.x * 8 + warp;
        const bool is_r = row < E;
        cuda_qmat m; /* by value (see gateup_pairs_kernel) */
        m.codes = is_r ? router.codes : sg.codes; m.scales = is_r ? router.scales : sg.scales;
        m.biases = is_r ? router.biases : sg.biases; m.rows = is_r ? router.rows : sg.rows;
        m.cols = is_r ? router.cols : sg.cols; m.bits = is_r ? router.bits : sg.bits; m.n_mats = 1;
        const int r = is_r ? row : 0;
        float acc[RT_TOK];
#pragma unroll
        for (int t = 0; t < RT_TOK; t++) acc[t] = 0.0f;
        if (MODE == RT_NORM) { /* weights first, then every thread stages the normalised row */
            rt_regs rr;
            if (row <= E) {
                if (m.bits == 4) rt_round<4>(m, r, lane, true, rr);
                else rt_round<8>(m, r, lane, true, rr);
            }
            float g[NS_REG];
            rms_row_load<NS_REG, false>(ns.gain, router.cols, g);
            pdl_wait();
            norm_src_row(ns, router.cols, g, [&](int i, float o) { *const_cast<float *>(rt_xs_at(rt_xs, router.cols, 0, i)) = o; });
            __syncthreads();
            trace_mark(TRACE_MARK4); /* the normalised row staged */
            if (row <= E) {
                if (m.bits == 4) rt_rest<4>(m, r, x, ldx, 0, 1, acc, lane, rt_xs, rr);
                else rt_rest<8>(m, r, x, ldx, 0, 1, acc, lane, rt_xs, rr);
            }
            trace_mark(TRACE_MARK5); /* (warp 0's) row summed in its lanes */
        } else if (row <= E) { /* router_row waits after its first weight loads */
            if (m.bits == 4) router_row<4>(m, r, x, ldx, t0, nt, acc, lane);
            else router_row<8>(m, r, x, ldx, t0, nt, acc, lane);
        } else {
            pdl_wait();
        }
        if (row <= E) {
#pragma unroll
            for (int t = 0; t < RT_TOK; t++) {
                if (t >= nt) break; /* warp-uniform */
                const float v = warp_sum(acc[t]);
                if (lane == 0) {
                    if (row < E) logits[(size_t)(t0 + t) * ld + row] = v;
                    else seg[t0 + t] = v;
                }
            }
        }
    }
    trace_mark(TRACE_MARK6); /* logits stored */
    /* Triggered here, not at the start: gateup_pairs is then scheduled during the top-k
     * tail instead of parking its blocks for the whole kernel (measured on the H200,
     * batch-1 decode: 2.89 -> 2.82 ms per token at context 512). */
    pdl_trigger();
    /* the top-k of this row of blocks' RT_TOK tokens, by its last block (one counter per
     * row: the rows' top-ks run side by side; one block for all 64 tokens took 50 µs a
     * layer on the H200), one warp per token; logits written by other blocks: through L2 */
    if (sg_blk) return;
    if (tk.counter && last_block_done(tk.counter + trow, ncols)) {
        const int t1 = min(T, t0 + RT_TOK);
        if (t1 - t0 == 1 && tk.block) { /* one token: the whole block (the same ids and weights) */
            __shared__ topk_scratch tks;
            topk_block<true>(logits + (size_t)t0 * ld, E, tk.K, tk.renorm, tk.ids + (size_t)t0 * tk.K,
                             tk.w + (size_t)t0 * tk.K, tks);
            return;
        }
        for (int t = t0 + (int)(threadIdx.x >> 5); t < t1; t += blockDim.x >> 5) {
            const float *lr = logits + (size_t)t * ld;
            topk_token_cg(lr, E, tk.K, tk.renorm, tk.ids + (size_t)t * tk.K, tk.w + (size_t)t * tk.K, lane);
        }
    }
}

/* A staged launch of RT_ROWS2_MIN.. tokens carries two rows a warp (ORCHID_ROUTER_ROWS1=1:
 * one, the A/B; the same bits). */
static bool rt_rows2_on(void) {
    static const bool off = env_flag("ORCHID_ROUTER_ROWS1");
    return !off;
}

/* Dynamic shared memory of a router launch: the staged tokens, or none. */
static size_t rt_smem(const struct cuda_qmat *router, const struct cuda_qmat *sh_gate, const float *x, int T, int ldx) {
    if (T <= 1 || !rt_smem_ok(router->cols, ldx) || sh_gate->cols != router->cols || ((uintptr_t)x & 15)) return 0;
    return (size_t)RT_TOK * rt_xstride(router->cols) * 4;
}

/* One router launch: staged when rt_smem gives it bytes; ns: the norm form (T = 1). */
static int rt_launch(const struct cuda_ctx *c, const struct cuda_qmat *router, const struct cuda_qmat *sh_gate, const float *x,
                     int ldx, int T, float *logits, int ld, float *seg, const topk_tail &tk, const char *what,
                     const cuda_norm_src *ns = NULL) {
    const dim3 grid((router->rows + 1 + 7) / 8, (T + RT_TOK - 1) / RT_TOK);
    cuda_norm_src none;
    memset(&none, 0, sizeof none);
    if (ns)
        LAUNCH_CHECK_RC(c, launch_k(router_kernel<RT_NORM>, grid, dim3(256), (size_t)rt_xstride(router->cols) * 4, cstream(c),
                                    *router, *sh_gate, x, ldx, T, logits, ld, seg, tk, *ns),
                        what);
    const size_t smem = rt_smem(router, sh_gate, x, T, ldx);
    if (smem && T >= RT_ROWS2_MIN && rt_rows2_on()) {
        const dim3 g(rt_staged_cols(router->rows, 2) * grid.y + grid.y);
        LAUNCH_CHECK_RC(c, launch_k(router_kernel<RT_STAGED, 2>, g, dim3(256), smem, cstream(c), *router, *sh_gate, x, ldx, T,
                                    logits, ld, seg, tk, none),
                        what);
    }
    if (smem)
        LAUNCH_CHECK_RC(c, launch_k(router_kernel<RT_STAGED, 1>, dim3(rt_staged_cols(router->rows, 1) * grid.y + grid.y),
                                    dim3(256), smem, cstream(c), *router, *sh_gate, x, ldx, T, logits, ld, seg, tk, none),
                        what);
    LAUNCH_CHECK_RC(c, launch_k(router_kernel<RT_PLAIN>, grid, dim3(256), 0, cstream(c), *router, *sh_gate, x, ldx, T, logits,
                                ld, seg, tk, none),
                    what);
}

extern "C" int cuda_moe_init(char *err, size_t errlen) {
    cudaError_t e = cudaFuncSetAttribute(router_kernel<RT_STAGED, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, RT_SMEM_MAX);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(router_kernel<RT_STAGED, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, RT_SMEM_MAX);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "moe: cudaFuncSetAttribute failed: %s", cudaGetErrorString(e));
    /* the cooperative route: a block an SM at most (1,024 threads: one fits anywhere), its
     * per-block counts and barrier in device memory, zeroed once (the barrier leaves it so) */
    cuda_caps caps;
    if (route_hist || device_caps(&caps) != cudaSuccess || !caps.coop || caps.sms < 2) return 0;
    const size_t bytes = ((size_t)caps.sms * 1024 + 2) * sizeof(int);
    int rc = cuda_malloc((void **)&route_hist, bytes, "moe route counts", err, errlen);
    if (!rc) rc = cuda_memset0(route_hist, bytes, err, errlen);
    if (rc) return rc;
    route_max_blocks = caps.sms;
    return 0;
}

extern "C" int cuda_moe_router(const struct cuda_ctx *c, const struct cuda_qmat *router, const struct cuda_qmat *sh_gate,
                               const float *x, int ldx, int T, float *logits, int ld, float *seg) {
    if (T <= 0) return 0;
    if ((router->bits != 4 && router->bits != 8) || (sh_gate->bits != 4 && sh_gate->bits != 8))
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "moe_router: %d/%d-bit weights", router->bits, sh_gate->bits);
    const topk_tail tk = {NULL, 0, 0, NULL, NULL, 0};
    return rt_launch(c, router, sh_gate, x, ldx, T, logits, ld, seg, tk, "moe_router");
}

extern "C" int cuda_moe_router_topk(const struct cuda_ctx *c, const struct cuda_qmat *router, const struct cuda_qmat *sh_gate,
                                    const float *x, int ldx, int T, float *logits, int ld, float *seg, int K, int renorm,
                                    int32_t *ids, float *w, int *counter) {
    if (T <= 0) return 0;
    if (T > 64 || router->rows > 256 || K > 32)
        return errorf(c->err, c->errlen, ST_INTERNAL, "moe_router_topk: %d tokens, %d experts, top-%d", T, router->rows, K);
    if ((router->bits != 4 && router->bits != 8) || (sh_gate->bits != 4 && sh_gate->bits != 8))
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "moe_router: %d/%d-bit weights", router->bits, sh_gate->bits);
    const topk_tail tk = {counter, K, renorm, ids, w, topk_block_on()};
    return rt_launch(c, router, sh_gate, x, ldx, T, logits, ld, seg, tk, "moe_router_topk");
}

extern "C" int cuda_moe_router_topk_norm(const struct cuda_ctx *c, const struct cuda_qmat *router,
                                         const struct cuda_qmat *sh_gate, const struct cuda_norm_src *ns, float *logits,
                                         float *seg, int K, int renorm, int32_t *ids, float *w, int *counter) {
    if (router->rows > 256 || K > 32 || !ns || !ns->x || !ns->gain || router->cols % 32 ||
        (size_t)rt_xstride(router->cols) * 4 > 48 * 1024 || sh_gate->cols != router->cols)
        return errorf(c->err, c->errlen, ST_INTERNAL, "moe_router_topk_norm: %d experts of %d columns, top-%d", router->rows,
                      router->cols, K);
    if ((router->bits != 4 && router->bits != 8) || (sh_gate->bits != 4 && sh_gate->bits != 8))
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "moe_router: %d/%d-bit weights", router->bits, sh_gate->bits);
    const topk_tail tk = {counter, K, renorm, ids, w, topk_block_on()};
    return rt_launch(c, router, sh_gate, NULL, router->cols, 1, logits, router->rows, seg, tk, "moe_router_topk_norm", ns);
}

/* ---- small-batch pairs path ---- */

template <int BITS>
__device__ __forceinline__ float row_dot(const cuda_qmat &m, size_t row, const uint16_t *x, int lane) {
    const int per = BITS == 4 ? 32 : 16;
    const int nch = m.cols / per;
    const uint4 *cr = reinterpret_cast<const uint4 *>(qrow_codes(m, row));
    const size_t g0 = qrow_group0(m, row);
    float acc = 0.0f;
    for (int ch = lane; ch < nch; ch += 32) {
        const uint4 w = ld_stream(cr + ch);
        const int grp = ch * per / QGROUP;
        float qx = 0.0f, sx = 0.0f;
        qdot_chunk<BITS>(w, x + ch * per, qx, sx);
        acc = fmaf(bf(m.scales[g0 + grp]), qx, fmaf(bf(m.biases[g0 + grp]), sx, acc));
    }
    return acc;
}

__device__ __forceinline__ float row_dot_any(const cuda_qmat &m, size_t row, const uint16_t *x, int lane) {
    return m.bits == 4 ? row_dot<4>(m, row, x, lane) : row_dot<8>(m, row, x, lane);
}

/* Gate and up row f of one (token, expert) pair: both rows share each unpacked input
 * chunk; 2 chunks per lane per round trip (4 loads in flight). WAIT: the caller has not
 * waited yet (row is known without the ids: the shared expert), so pdl_wait() comes
 * after the first round of weight loads and before x is read. */
template <int BITS, bool WAIT>
__device__ __forceinline__ void gateup_rows(const cuda_qmat &G, const cuda_qmat &U, size_t row, const uint16_t *x,
                                            float &g, float &u, int lane) {
    constexpr int per = BITS == 4 ? 32 : 16;
    const int nch = G.cols / per;
    const uint4 *cr[2] = {reinterpret_cast<const uint4 *>(qrow_codes(G, row)), reinterpret_cast<const uint4 *>(qrow_codes(U, row))};
    const uint16_t *sc[2] = {G.scales + qrow_group0(G, row), U.scales + qrow_group0(U, row)};
    const uint16_t *bi[2] = {G.biases + qrow_group0(G, row), U.biases + qrow_group0(U, row)};
    float acc[2] = {0.0f, 0.0f};
    uint4 w[2][2];
    float s[2][2], bb[2][2];
    auto load_round = [&](int base, bool pre) {
#pragma unroll
        for (int v = 0; v < 2; v++) {
            const int ch = base + 32 * v;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                if (ch < nch) {
                    w[v][r] = pre ? ld_stream_pre(cr[r] + ch) : ld_stream(cr[r] + ch);
                    s[v][r] = bf(sc[r][ch * per / QGROUP]);
                    bb[v][r] = bf(bi[r][ch * per / QGROUP]);
                } else {
                    w[v][r] = make_uint4(0, 0, 0, 0);
                    s[v][r] = bb[v][r] = 0.0f;
                }
            }
        }
    };
    load_round(lane, WAIT);
    if (WAIT) pdl_wait();
    for (int base = lane; base < nch; base += 64) {
        if (base != lane) load_round(base, false);
#pragma unroll
        for (int v = 0; v < 2; v++) {
            const int ch = base + 32 * v;
            if (ch >= nch) continue;
            float xf[per];
            const float sx = unpack_x<BITS>(x + (size_t)ch * per, xf);
#pragma unroll
            for (int r = 0; r < 2; r++) acc[r] = fmaf(s[v][r], qdot_f<BITS>(w[v][r], xf), fmaf(bb[v][r], sx, acc[r]));
        }
    }
    g = warp_sum(acc[0]);
    u = warp_sum(acc[1]);
}

static __global__ void gateup_pairs_kernel(cuda_qmat gate, cuda_qmat up, cuda_qmat sg, cuda_qmat su, const int32_t *ids,
                                           const uint16_t *xn, int ldx, int K, int ld_act, uint16_t *act) {
    TRACE_KERNEL();
    pdl_trigger();
    const int p = blockIdx.y, t = p / (K + 1), k = p % (K + 1);
    const int f = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const bool shared = k == K;
    cuda_qmat G, U; /* by value: selecting a kernel parameter by reference would copy both to local memory */
    G.codes = shared ? sg.codes : gate.codes; G.scales = shared ? sg.scales : gate.scales;
    G.biases = shared ? sg.biases : gate.biases; G.rows = shared ? sg.rows : gate.rows;
    G.cols = shared ? sg.cols : gate.cols; G.bits = shared ? sg.bits : gate.bits; G.n_mats = 1;
    U.codes = shared ? su.codes : up.codes; U.scales = shared ? su.scales : up.scales;
    U.biases = shared ? su.biases : up.biases; U.rows = shared ? su.rows : up.rows;
    U.cols = shared ? su.cols : up.cols; U.bits = shared ? su.bits : up.bits; U.n_mats = 1;
    if (f >= G.rows) {
        pdl_wait();
        return;
    }
    const uint16_t *x = xn + (size_t)t * ldx;
    float g, u;
    if (G.bits == 4 && U.bits == 4 && shared) {
        gateup_rows<4, true>(G, U, (size_t)f, x, g, u, lane); /* weights first, then the wait */
    } else {
        pdl_wait(); /* before the ids: the routed rows depend on them */
        const size_t row = shared ? (size_t)f : (size_t)ids[t * K + k] * G.rows + f;
        if (G.bits == 4 && U.bits == 4) gateup_rows<4, false>(G, U, row, x, g, u, lane);
        else {
            g = warp_sum(row_dot_any(G, row, x, lane));
            u = warp_sum(row_dot_any(U, row, x, lane));
        }
    }
    if (lane == 0) act[(size_t)p * ld_act + f] = f2bf(silu(g) * u);
}

extern "C" int cuda_moe_gateup_pairs(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                     const struct cuda_qmat *sh_gate, const struct cuda_qmat *sh_up, const int32_t *ids,
                                     const uint16_t *xn, int ldx, int T, int K, uint16_t *act) {
    if (T <= 0) return 0;
    const int I = gate->rows > sh_gate->rows ? gate->rows : sh_gate->rows;
    LAUNCH_CHECK_RC(c, launch_k(gateup_pairs_kernel, dim3((I + 7) / 8, T * (K + 1)), dim3(256), 0, cstream(c), *gate, *up,
                                *sh_gate, *sh_up, ids, xn, ldx, K, I, act),
                    "moe_gateup_pairs");
}

template <int BITS>
__device__ __forceinline__ float chunk_dot(const cuda_qmat &m, size_t row, int ch, const uint16_t *x) {
    const int per = BITS == 4 ? 32 : 16;
    const uint4 w = ld_stream(reinterpret_cast<const uint4 *>(qrow_codes(m, row)) + ch);
    const size_t g = qrow_group0(m, row) + ch * per / QGROUP;
    float qx = 0.0f, sx = 0.0f;
    qdot_chunk<BITS>(w, x + ch * per, qx, sx);
    return fmaf(bf(m.scales[g]), qx, bf(m.biases[g]) * sx);
}

/* Output row r of token t: Σ over (pair, chunk) items, 4 items per lane per round trip;
 * the expert ids and weights live in lanes 0..K-1 and are fetched by shuffle. */
__device__ __forceinline__ void down_pairs_row(const cuda_qmat &down, const cuda_qmat &sd, const int32_t *ids,
                                               const float *w, const float *seg, int ld_seg, const uint16_t *act, int K,
                                               int ld_act, float *x, int H, int t, int r, int lane) {
    constexpr int DU = 4;
    const int perR = down.bits == 4 ? 32 : 16, perS = sd.bits == 4 ? 32 : 16;
    const int nchR = down.cols / perR, nchS = sd.cols / perS;
    const int items = K * nchR + nchS;
    const int my_e = lane < K ? ids[t * K + lane] : 0;
    const float my_w = lane < K ? w[t * K + lane] : 0.0f;
    const float sgate = 1.0f / (1.0f + expf(-seg[(size_t)t * ld_seg]));
    float acc = 0.0f;
    for (int base0 = 0; base0 < items; base0 += 32 * DU) { /* uniform trip count: shuffles inside */
        const int base = base0 + lane;
        uint4 wq[DU];
        float sc[DU], bi[DU], coef[DU];
        const uint16_t *a[DU];
        int kind[DU]; /* 0 none, 4 or 8: routed bits, 16 + bits: shared */
#pragma unroll
        for (int u = 0; u < DU; u++) {
            const int i = base + 32 * u;
            const int k = i < K * nchR ? i / nchR : K;
            const int e = __shfl_sync(0xffffffffu, my_e, k < K ? k : 0);
            const float we = __shfl_sync(0xffffffffu, my_w, k < K ? k : 0);
            kind[u] = 0;
            wq[u] = make_uint4(0, 0, 0, 0);
            sc[u] = bi[u] = coef[u] = 0.0f;
            a[u] = act;
            if (i < items) {
                const bool routed = k < K;
                const int ch = routed ? i % nchR : i - K * nchR;
                const int per = routed ? perR : perS;
                const int bits = routed ? down.bits : sd.bits, cols = routed ? down.cols : sd.cols;
                const uint32_t *codes = routed ? down.codes : sd.codes;
                const uint16_t *scales = routed ? down.scales : sd.scales, *biases = routed ? down.biases : sd.biases;
                const size_t row = routed ? (size_t)e * down.rows + r : (size_t)r;
                wq[u] = ld_stream(reinterpret_cast<const uint4 *>(codes + row * (size_t)(cols * bits / 32)) + ch);
                const size_t gi = row * (size_t)(cols / QGROUP) + ch * per / QGROUP;
                sc[u] = bf(scales[gi]);
                bi[u] = bf(biases[gi]);
                coef[u] = routed ? we : sgate;
                a[u] = act + ((size_t)t * (K + 1) + k) * ld_act + (size_t)ch * per;
                kind[u] = bits;
            }
        }
#pragma unroll
        for (int u = 0; u < DU; u++) {
            if (kind[u] == 4) {
                float xf[32];
                const float sx = unpack_x<4>(a[u], xf);
                acc = fmaf(coef[u], fmaf(sc[u], qdot_f<4>(wq[u], xf), bi[u] * sx), acc);
            } else if (kind[u] == 8) {
                float xf[16];
                const float sx = unpack_x<8>(a[u], xf);
                acc = fmaf(coef[u], fmaf(sc[u], qdot_f<8>(wq[u], xf), bi[u] * sx), acc);
            }
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) x[(size_t)t * H + r] += acc;
}

static __global__ void down_pairs_kernel(cuda_qmat down, cuda_qmat sd, const int32_t *ids, const float *w,
                                         const float *seg, int ld_seg, const uint16_t *act, int K, int ld_act, float *x,
                                         int H, cuda_tail_norm tail) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait(); /* ids, weights, act and x all come from earlier kernels */
    const int t = blockIdx.y;
    const int r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r < H) down_pairs_row(down, sd, ids, w, seg, ld_seg, act, K, ld_act, x, H, t, r, lane);
    if (tail.counter && last_block_done(tail.counter)) tail_rmsnorm(x, H, gridDim.y, H, tail);
}

extern "C" int cuda_moe_down_pairs(const struct cuda_ctx *c, const struct cuda_qmat *down, const struct cuda_qmat *sh_down,
                                   const int32_t *ids, const float *w, const float *seg, int ld_seg, const uint16_t *act,
                                   int T, int K, float *x, const struct cuda_tail_norm *tail) {
    if (T <= 0) return 0;
    const int H = down->rows;
    const int I = down->cols > sh_down->cols ? down->cols : sh_down->cols;
    cuda_tail_norm tn;
    if (tail) tn = *tail;
    else tn.counter = NULL;
    LAUNCH_CHECK_RC(c, launch_k(down_pairs_kernel, dim3((H + 7) / 8, T), dim3(256), 0, cstream(c), *down, *sh_down, ids, w,
                                seg, ld_seg, act, K, I, x, H, tn),
                    "moe_down_pairs");
}

/* Inclusive prefix sums of two ints over a warp's lanes at once (shuffles). */
__device__ __forceinline__ void warp_scan2(int &a, int &b, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int ya = __shfl_up_sync(0xffffffffu, a, o), yb = __shfl_up_sync(0xffffffffu, b, o);
        if (lane >= o) {
            a += ya;
            b += yb;
        }
    }
}

/* ---- large-batch routing: histogram, scan, tile list and scatter ----
 * route_kernel does all of it in one block; route_coop_kernel (S > ROUTE_COOP_MIN pairs) in
 * ⌈S / 1024⌉ blocks of a cooperative launch, a pair a thread: each block counts its pairs in
 * shared memory (a pair's rank among its block's pairs of the same expert is the atomic's
 * return), the blocks' counts meet through global memory at one barrier, and every block
 * then scans the totals itself and scatters its pairs to offset + the earlier blocks' counts
 * + rank. The one block took ~42 µs a layer for a pack of 8 × 512 tokens (32,768 pairs, H100
 * trace), on the critical path between the top-k and the grouped gate/up. Within an expert
 * the slots' order is the atomics' in both forms; no product depends on it (a slot's row is
 * computed alone, and the combine reads each pair's own slot). */

/* Offsets of the experts' runs and of their tiles (⌈count / tile rows⌉): exclusive scans of
 * cnt over the experts, thread e < E holding expert e (warp scans by shuffles, then the warp
 * totals — E <= 1024: 32 warps at most — by warp 0; a serial loop over E was ~4 µs of the
 * route's 11 at 64 tokens, H200). off[E] and toff[E]: the totals; the tile count goes to
 * r.tiles[max_tiles · 3] from block 0. Ends with a barrier. */
__device__ __forceinline__ void route_offsets(const int *cnt, int E, int tile_shift, int *off, int *toff, cuda_moe_route &r) {
    __shared__ int wsum[32], wtile[32];
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    const int n = tid < E ? cnt[tid] : 0, nt = (n + (1 << tile_shift) - 1) >> tile_shift;
    int a = n, b = nt;
    warp_scan2(a, b, lane);
    if (lane == 31) {
        wsum[wid] = a;
        wtile[wid] = b;
    }
    __syncthreads();
    if (wid == 0) {
        const int nw = (blockDim.x + 31) >> 5;
        int sa = lane < nw ? wsum[lane] : 0, sb = lane < nw ? wtile[lane] : 0;
        warp_scan2(sa, sb, lane);
        wsum[lane] = sa - (lane < nw ? wsum[lane] : 0); /* exclusive: the warps before */
        wtile[lane] = sb - (lane < nw ? wtile[lane] : 0);
    }
    __syncthreads();
    if (tid < E) {
        off[tid] = wsum[wid] + a - n;
        toff[tid] = wtile[wid] + b - nt;
    }
    if (tid == E - 1) {
        off[E] = wsum[wid] + a;
        toff[E] = wtile[wid] + b;
        if (blockIdx.x == 0) r.tiles[r.max_tiles * 3] = toff[E];
    }
    __syncthreads();
}

/* The counts, offsets and tile list (expert, m0, m_end) of the route (one block writes them). */
__device__ __forceinline__ void route_tiles(const int *cnt, const int *off, const int *toff, int E, int tile_shift,
                                            cuda_moe_route &r) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        r.counts[e] = cnt[e];
        r.offsets[e] = off[e];
        for (int j = 0; j < toff[e + 1] - toff[e]; j++) {
            const int ti = toff[e] + j;
            r.tiles[ti * 3] = e;
            r.tiles[ti * 3 + 1] = off[e] + (j << tile_shift);
            r.tiles[ti * 3 + 2] = off[e] + cnt[e];
        }
    }
    if (threadIdx.x == 0) r.offsets[E] = off[E];
}

static __global__ void __launch_bounds__(1024) route_kernel(const int32_t *ids, int S, int E, int K, int tile_shift,
                                                            cuda_moe_route r) {
    TRACE_KERNEL();
    __shared__ int cnt[1024], off[1025], toff[1025], cur[1024];
    pdl_trigger();
    pdl_wait();
    const int tid = threadIdx.x;
    for (int e = tid; e < E; e += blockDim.x) {
        cnt[e] = 0;
        cur[e] = 0;
    }
    __syncthreads();
    for (int i = tid; i < S; i += blockDim.x) atomicAdd(&cnt[ids[i]], 1);
    __syncthreads();
    route_offsets(cnt, E, tile_shift, off, toff, r);
    route_tiles(cnt, off, toff, E, tile_shift, r);
    for (int i = tid; i < S; i += blockDim.x) {
        const int e = ids[i];
        const int slot = off[e] + atomicAdd(&cur[e], 1);
        r.row_of_slot[slot] = i / K;
        r.slot_of_pair[i] = slot;
    }
}

static __global__ void __launch_bounds__(1024) route_coop_kernel(const int32_t *ids, int S, int E, int K, int tile_shift,
                                                                 cuda_moe_route r, int *hist, int *bar) {
    TRACE_KERNEL();
    __shared__ int cnt[1024], off[1025], toff[1025], before[1024];
    pdl_trigger();
    pdl_wait();
    const int tid = threadIdx.x, blk = blockIdx.x, nb = gridDim.x, i = blk * 1024 + tid;
    for (int e = tid; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    const int e_i = i < S ? ids[i] : -1;
    const int rank = e_i >= 0 ? atomicAdd(&cnt[e_i], 1) : 0;
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x) hist[blk * 1024 + e] = cnt[e];
    blocks_barrier(bar, bar + 1, nb);
    for (int e = tid; e < E; e += blockDim.x) { /* every block's count of e: the total, and those before this block */
        int tot = 0, bef = 0;
        for (int bb = 0; bb < nb; bb++) {
            const int v = __ldcg(hist + bb * 1024 + e);
            tot += v;
            bef += bb < blk ? v : 0;
        }
        cnt[e] = tot;
        before[e] = bef;
    }
    __syncthreads();
    route_offsets(cnt, E, tile_shift, off, toff, r);
    if (blk == 0) route_tiles(cnt, off, toff, E, tile_shift, r);
    if (e_i >= 0) {
        const int slot = off[e_i] + before[e_i] + rank;
        r.row_of_slot[slot] = i / K;
        r.slot_of_pair[i] = slot;
    }
}

extern "C" int cuda_moe_route_force(int mode) {
    route_force = mode;
    return route_max_blocks > 0;
}
extern "C" int cuda_moe_route_coop_launches(void) { return route_coop_count; }

extern "C" int cuda_moe_route_build(const struct cuda_ctx *c, const int32_t *ids, int T, int E, int K, int tile_rows,
                                    struct cuda_moe_route *r) {
    if (E > 1024) return errorf(c->err, c->errlen, ST_UNSUPPORTED, "moe_route: %d experts", E);
    int shift = 3;
    while (shift < 7 && (1 << shift) < tile_rows) shift++;
    if ((1 << shift) != tile_rows) return errorf(c->err, c->errlen, ST_INTERNAL, "moe_route: tiles of %d slots", tile_rows);
    const int need = (T * K + tile_rows - 1) / tile_rows + E;
    if (need > r->max_tiles) return errorf(c->err, c->errlen, ST_INTERNAL, "moe_route: %d tiles > capacity %d", need, r->max_tiles);
    r->bound_tiles = need;
    r->tile_rows = tile_rows;
    r->n_experts = E;
    r->n_slots = T * K;
    const int S = T * K, nb = (S + 1023) / 1024;
    static const bool one = env_flag("ORCHID_ROUTE_ONE_BLOCK");
    if (route_max_blocks > 0 && nb <= route_max_blocks && route_force != 0 && (route_force == 1 || (!one && S > ROUTE_COOP_MIN))) {
        route_coop_count++;
        launch_cfg lc(dim3(nb), dim3(1024), 0, cstream(c), false, 0, true); /* cooperative without PDL, as cuda_flash.cu's */
        LAUNCH_CHECK_RC(c, lc.launch(route_coop_kernel, ids, S, E, K, shift, *r, route_hist,
                                      route_hist + (size_t)route_max_blocks * 1024), "moe_route (cooperative)");
    }
    LAUNCH_CHECK_RC(c, launch_k(route_kernel, dim3(1), dim3(1024), 0, cstream(c), ids, S, E, K, shift, *r), "moe_route");
}

/* Block (token t, 256 columns): one output a thread, its K expert rows requested together
 * (each thread's order of terms is the same as ever: sg·sd, then k = 0..K-1). One block a
 * token looping over the columns left every thread with H/256 rounds of K dependent-latency
 * gathers: 19 µs at 64 tokens (H200). */
#define COMBINE_KMAX 16
static __global__ void combine_kernel(const float *__restrict__ ed, const int32_t *__restrict__ slot_of_pair,
                                      const float *__restrict__ w, const float *__restrict__ sd, const float *__restrict__ seg,
                                      int ld_seg, int K, int H, float *__restrict__ x) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait();
    const int t = blockIdx.x, d = blockIdx.y * blockDim.x + threadIdx.x;
    if (d >= H) return;
    const float sg = 1.0f / (1.0f + expf(-seg[(size_t)t * ld_seg]));
    float e[COMBINE_KMAX];
#pragma unroll
    for (int k = 0; k < COMBINE_KMAX; k++)
        if (k < K) e[k] = ed[(size_t)slot_of_pair[t * K + k] * H + d];
    float acc = sg * sd[(size_t)t * H + d];
#pragma unroll
    for (int k = 0; k < COMBINE_KMAX; k++)
        if (k < K) acc = fmaf(w[t * K + k], e[k], acc);
    x[(size_t)t * H + d] += acc;
}

/* A token's routed slots and their weights (k < K ≤ KM), read once for all of a thread's columns. */
template <int KM>
__device__ __forceinline__ void combine_route(const int32_t *__restrict__ slot_of_pair, const float *__restrict__ w, int t,
                                              int K, int32_t (&slot)[KM], float (&wk)[KM]) {
#pragma unroll
    for (int k = 0; k < KM; k++)
        if (k < K) {
            slot[k] = slot_of_pair[t * K + k];
            wk[k] = w[t * K + k];
        }
}

/* Four consecutive outputs of token t at d and, RUNS = 2 and d2 < H, four more at d2 (float4
 * loads and stores, H % 4 == 0): every load of both runs (the K expert rows, the shared
 * expert's row, x) issued before the first sum, then each output's terms in combine_kernel's
 * order (sg·sd, then k = 0..K-1, then added to x). row (not NULL): the new x values also
 * stored there at the same columns (the combine + norm's row in shared memory). */
template <int RUNS, int KM>
__device__ __forceinline__ void combine4_pair(const float *__restrict__ ed, const int32_t (&slot)[KM], const float (&wk)[KM],
                                              const float *__restrict__ sd, float sg, int K, int H, int t, int d, int d2,
                                              float *__restrict__ x, float *row) {
    const int dd[2] = {d, d2};
    const bool on[2] = {true, RUNS == 2 && d2 < H};
    float4 e[RUNS][KM], s4[RUNS], xv[RUNS];
#pragma unroll
    for (int r = 0; r < RUNS; r++)
        if (on[r]) {
#pragma unroll
            for (int k = 0; k < KM; k++)
                if (k < K) e[r][k] = *reinterpret_cast<const float4 *>(ed + (size_t)slot[k] * H + dd[r]);
            s4[r] = *reinterpret_cast<const float4 *>(sd + (size_t)t * H + dd[r]);
            xv[r] = *reinterpret_cast<const float4 *>(x + (size_t)t * H + dd[r]);
        }
#pragma unroll
    for (int r = 0; r < RUNS; r++)
        if (on[r]) {
            float4 acc = make_float4(sg * s4[r].x, sg * s4[r].y, sg * s4[r].z, sg * s4[r].w);
#pragma unroll
            for (int k = 0; k < KM; k++)
                if (k < K) {
                    acc.x = fmaf(wk[k], e[r][k].x, acc.x);
                    acc.y = fmaf(wk[k], e[r][k].y, acc.y);
                    acc.z = fmaf(wk[k], e[r][k].z, acc.z);
                    acc.w = fmaf(wk[k], e[r][k].w, acc.w);
                }
            float4 o = xv[r];
            o.x += acc.x;
            o.y += acc.y;
            o.z += acc.z;
            o.w += acc.w;
            *reinterpret_cast<float4 *>(x + (size_t)t * H + dd[r]) = o;
            if (row) *reinterpret_cast<float4 *>(row + dd[r]) = o;
        }
}

/* Two runs of four consecutive outputs a thread (d and d + 4·blockDim: a block covers
 * 8·blockDim columns of token t), both runs' loads in flight together. One output a thread
 * left the 4,096-token prefill at 181 µs a layer (H200) for ~370 MB of traffic; one run a
 * thread 139.7 µs (H100, session 46). */
template <int KM>
static __global__ void combine4_kernel(const float *__restrict__ ed, const int32_t *__restrict__ slot_of_pair,
                                       const float *__restrict__ w, const float *__restrict__ sd,
                                       const float *__restrict__ seg, int ld_seg, int K, int H, float *__restrict__ x) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait();
    const int t = blockIdx.x, step = 4 * (int)blockDim.x, d = 2 * step * (int)blockIdx.y + 4 * (int)threadIdx.x;
    if (d >= H) return;
    const float sg = 1.0f / (1.0f + expf(-seg[(size_t)t * ld_seg]));
    int32_t slot[KM];
    float wk[KM];
    combine_route<KM>(slot_of_pair, w, t, K, slot, wk);
    combine4_pair<2, KM>(ed, slot, wk, sd, sg, K, H, t, d, d + step, x, nullptr);
}

/* The combine of one token a block (256 threads), then the next layer's input RMSNorm of
 * the row it just finished (bf16 into xn), in rmsnorm_kernel's order (norm_src_row: 256 lanes,
 * lane l over x[l], x[l + 256], ...): the same bits as the separate norm launch it replaces
 * on the 2..64-token path (40 launches a step). The gains are the model's: read before the
 * wait. A thread's two runs of columns (d and d + 1,024 at H = 2,048) are combined with all
 * their loads in flight together (combine4_pair), and the finished row is kept in dynamic
 * shared memory — H floats, then its H bf16 values (cn_smem_bytes) — for the norm, whose
 * lanes own other columns than the combine's, and for the stage: one round trip to memory
 * on the block's chain instead of three (its own global writes were read back after each
 * barrier: 11.6 µs a call at 64 tokens alone, H100, session 44). With xs.perm (H a multiple
 * of 64), the bf16 row is then staged for the wgmma products (wg_stage_group, a thread a
 * group: struct cuda_xstage): the GDN in-projection's and attention q/k/v's blocks
 * (cuda_skinny_wide.cu's looped form) copy it instead of each summing and reordering the
 * same tokens. */
#define CN_MAX_H 8192 /* columns the shared row takes: 6 bytes a column within the 48 KB default */
static size_t cn_smem_bytes(int H) { return (size_t)H * (sizeof(float) + sizeof(uint16_t)); }
static __global__ void __launch_bounds__(256) combine_norm_kernel(const float *__restrict__ ed,
                                                                   const int32_t *__restrict__ slot_of_pair,
                                                                   const float *__restrict__ w, const float *__restrict__ sd,
                                                                   const float *__restrict__ seg, int ld_seg, int K, int H,
                                                                   float *__restrict__ x, const float *__restrict__ gain,
                                                                   float eps, uint16_t *__restrict__ xn, cuda_xstage xs) {
    TRACE_KERNEL();
    extern __shared__ __align__(16) float cn_row[]; /* [H] fp32, then [H] bf16 (H % 4 == 0: 16-byte aligned) */
    uint16_t *row16 = reinterpret_cast<uint16_t *>(cn_row + H);
    pdl_trigger();
    float g[NS_REG];
    rms_row_load<NS_REG, false>(gain, H, g);
    pdl_wait();
    const int t = blockIdx.x;
    const float sg = 1.0f / (1.0f + expf(-seg[(size_t)t * ld_seg]));
    int32_t slot[COMBINE_KMAX];
    float wk[COMBINE_KMAX];
    combine_route<COMBINE_KMAX>(slot_of_pair, w, t, K, slot, wk);
    const int step = 4 * (int)blockDim.x;
    for (int d = 4 * (int)threadIdx.x; d < H; d += 2 * step)
        combine4_pair<2, COMBINE_KMAX>(ed, slot, wk, sd, sg, K, H, t, d, d + step, x, cn_row);
    __syncthreads();
    const cuda_norm_src src = {cn_row, gain, eps, NULL}; /* (the consumers' norm, here of the shared row) */
    norm_src_row(src, H, g, [&](int i, float o) {
        const uint16_t b = f2bf(o);
        xn[(size_t)t * H + i] = b;
        row16[i] = b;
    });
    if (!xs.perm) return;
    __syncthreads(); /* the row's bf16 values, to every thread */
    for (int gi = threadIdx.x; gi < H / QGROUP; gi += blockDim.x) {
        const uint4 *src16 = reinterpret_cast<const uint4 *>(row16 + (size_t)gi * QGROUP);
        uint4 v[8];
#pragma unroll
        for (int ch = 0; ch < 8; ch++) v[ch] = src16[ch];
        xs.gsum[(size_t)t * (H / QGROUP) + gi] = wg_stage_group(v);
        uint4 *dst = reinterpret_cast<uint4 *>(xs.perm + (size_t)t * H + (size_t)gi * QGROUP);
#pragma unroll
        for (int ch = 0; ch < 8; ch++) dst[ch] = v[ch];
    }
}

extern "C" int cuda_moe_combine(const struct cuda_ctx *c, const float *ed, const int32_t *slot_of_pair, const float *w,
                                const float *sd, const float *seg, int ld_seg, int T, int K, int H, float *x) {
    if (T <= 0) return 0;
    if (K > COMBINE_KMAX) return errorf(c->err, c->errlen, ST_UNSUPPORTED, "moe_combine: %d experts a token (at most %d)", K,
                                        COMBINE_KMAX);
    if (H % 4 == 0 && !(((uintptr_t)ed | (uintptr_t)sd | (uintptr_t)x) & 15))
        LAUNCH_CHECK_RC(c, launch_k(K <= 8 ? combine4_kernel<8> : combine4_kernel<COMBINE_KMAX>, dim3(T, (H / 8 + 255) / 256),
                                    dim3(256), 0, cstream(c), ed, slot_of_pair, w, sd, seg, ld_seg, K, H, x),
                        "moe_combine");
    LAUNCH_CHECK_RC(c, launch_k(combine_kernel, dim3(T, (H + 255) / 256), dim3(256), 0, cstream(c), ed, slot_of_pair, w, sd, seg,
                                ld_seg, K, H, x),
                    "moe_combine");
}

extern "C" int cuda_moe_combine_norm(const struct cuda_ctx *c, const float *ed, const int32_t *slot_of_pair, const float *w,
                                     const float *sd, const float *seg, int ld_seg, int T, int K, int H, float *x,
                                     const float *gain, float eps, uint16_t *xn, const struct cuda_xstage *xs) {
    if (T <= 0) return 0;
    if (!cuda_moe_combine_norm_ok(H) || K > COMBINE_KMAX || (((uintptr_t)ed | (uintptr_t)sd | (uintptr_t)x) & 15))
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "moe_combine_norm: %d experts a token, %d columns", K, H);
    const cuda_xstage st = xs ? *xs : cuda_xstage{};
    if (st.perm && (H % QGROUP || !st.gsum || (((uintptr_t)xn | (uintptr_t)st.perm | (uintptr_t)st.gsum) & 15)))
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "moe_combine_norm: rows of %d columns cannot be staged", H);
    LAUNCH_CHECK_RC(c, launch_k(combine_norm_kernel, dim3(T), dim3(256), cn_smem_bytes(H), cstream(c), ed, slot_of_pair, w, sd,
                                seg, ld_seg, K, H, x, gain, eps, xn, st),
                    "moe_combine_norm");
}

extern "C" int cuda_moe_combine_norm_ok(int H) { return H % 4 == 0 && H > 0 && H <= CN_MAX_H; }

static __global__ void swiglu_kernel(const float *g, const float *u, size_t n, uint16_t *out) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = f2bf(silu(g[i]) * u[i]);
}

extern "C" int cuda_swiglu_bf16(const struct cuda_ctx *c, const float *g, const float *u, size_t n, uint16_t *out) {
    if (!n) return 0;
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    LAUNCH_CHECK_RC(c, launch_k(swiglu_kernel, dim3((unsigned)blocks), dim3(256), 0, cstream(c), g, u, n, out), "swiglu");
}

CUDA_TRACE_TU(moe)
