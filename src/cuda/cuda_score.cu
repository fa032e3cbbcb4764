// cuda/cuda_score.cu — prompt rows scored where their logits are (model/device_sampling.h,
// struct row_score_req in, struct sample_result out): /v1/completions echo with logprobs
// wants, for every prompt token, its logprob under the row before it and that row's top
// alternatives. Without this each row's
// 1 MB of logits crossed PCIe and was scored on the host, 16 rows a forward; here a row
// sends back one struct sample_result (~170 bytes) and the whole prompt chunk is one forward.
//
// One block of 1,024 threads a scored row (rows whose request has token < 0 return at
// once). Thread t reads ids t, t + 1024, ... (coalesced). Pass 1: the maximum m of the
// non-NaN logits (fmaxf ignores NaN), block-reduced. Pass 2: Σ exp(l − m) over the non-NaN
// l in double, block-reduced, and each thread's NT best (value descending, ties to the
// lower id, NaN never) in registers — a sorted list it inserts into in id order, so among
// equal values its earlier id stays first. Then n_top rounds of a block-wide best of the
// threads' list heads (the same order), the owner of the winner popping its head. The
// numbers are sampler_row_logprobs's: lse = m + log(sum) in double
// (±inf rows: lse = m), logprob = (float)(l_token − lse) (NaN: −inf), alternatives
// (float)(l − lse). The sum's order differs from the host's serial one, so lse may differ
// in its last bits (a logprob by an fp32 rounding at most); ids and their order are exact.
#include <limits.h>
#include <math.h>

#include "cuda/cuda_internal.h"
#include "model/device_sampling.h"

#define RS_THREADS 1024
#define RS_WARPS (RS_THREADS / 32)

/* (v, id) before (w, jd) in the top order: a real entry (id != INT_MAX) before an empty
 * one, then value descending, then id ascending. */
__device__ __forceinline__ bool rs_before(float v, int id, float w, int jd) {
    if (id == INT_MAX) return false;
    if (jd == INT_MAX) return true;
    return v > w || (v == w && id < jd);
}

/* The warp's best (v, id) in rs_before's order, in every lane. */
__device__ __forceinline__ void rs_warp_best(float &bv, int &bi) {
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, s);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, s);
        if (rs_before(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

template <int NT>
static __global__ void __launch_bounds__(RS_THREADS) row_score_kernel(const float *logits, int V,
                                                                      const row_score_req *req, sample_result *out) {
    __shared__ float s_f[RS_WARPS];
    __shared__ double s_d[RS_WARPS];
    __shared__ int s_i[RS_WARPS];
    __shared__ float s_bv;
    __shared__ int s_bi;
    pdl_trigger();
    pdl_wait();
    const row_score_req q = req[blockIdx.x];
    if (q.token < 0) return; /* the whole block: not a scored row */
    const float *l = logits + (size_t)blockIdx.x * V;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    /* pass 1: the maximum of the non-NaN logits */
    float m = -INFINITY;
    for (int i = tid; i < V; i += RS_THREADS) m = fmaxf(m, l[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) s_f[warp] = m;
    __syncthreads();
    m = s_f[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));

    /* pass 2: Σ exp(l − m) in double and the thread's NT best */
    const bool finite = m != -INFINITY && m != INFINITY;
    double sum = 0.0;
    constexpr int NL = NT > 0 ? NT : 1; /* the list's length (one unused entry when NT is 0) */
    float tv[NL];
    int ti[NL];
#pragma unroll
    for (int k = 0; k < NL; k++) {
        tv[k] = -INFINITY;
        ti[k] = INT_MAX;
    }
    for (int i = tid; i < V; i += RS_THREADS) {
        const float v = l[i];
        if (v != v) continue;
        if (finite) sum += exp((double)v - (double)m);
        if (NT > 0 && (ti[NT - 1] == INT_MAX || v > tv[NT - 1])) {
            /* insert: walk the list, swapping the carried entry in wherever it goes first */
            float cv = v;
            int ci = i;
#pragma unroll
            for (int k = 0; k < NT; k++) {
                if (rs_before(cv, ci, tv[k], ti[k])) {
                    const float sv = tv[k];
                    const int si = ti[k];
                    tv[k] = cv;
                    ti[k] = ci;
                    cv = sv;
                    ci = si;
                }
            }
        }
    }
    double lse = m; /* −inf (no non-NaN logit) or +inf */
    if (finite) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) s_d[warp] = sum;
        __syncthreads();
        double t = s_d[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        lse = (double)m + log(t);
    }
    sample_result *o = out + blockIdx.x;
    const int n_top = NT > 0 ? min(q.n_top, NT) : 0;
    int filled = 0;
    for (int r = 0; r < n_top; r++) {
        /* the block's best head: a warp's by shuffles, then the warps' in warp 0 */
        float bv = tv[0];
        int bi = ti[0];
        rs_warp_best(bv, bi);
        __syncthreads(); /* the previous round's s_bv / s_bi read by all */
        if (lane == 0) {
            s_f[warp] = bv;
            s_i[warp] = bi;
        }
        __syncthreads();
        if (warp == 0) {
            bv = s_f[lane];
            bi = s_i[lane];
            rs_warp_best(bv, bi);
            if (lane == 0) {
                s_bv = bv;
                s_bi = bi;
            }
        }
        __syncthreads();
        bv = s_bv;
        bi = s_bi;
        if (bi == INT_MAX) break; /* fewer non-NaN logits than asked: uniform */
        if (tid == 0) {
            o->top_ids[r] = bi;
            o->top_logprobs[r] = (float)((double)bv - lse);
        }
        filled = r + 1;
        if (NT > 0 && bi % RS_THREADS == tid) { /* the winner was this thread's head: pop it */
#pragma unroll
            for (int k = 0; k + 1 < NL; k++) {
                tv[k] = tv[k + 1];
                ti[k] = ti[k + 1];
            }
            tv[NL - 1] = -INFINITY;
            ti[NL - 1] = INT_MAX;
        }
    }
    if (tid == 0) {
        o->token = q.token;
        float lp = (float)((double)l[q.token] - lse);
        if (lp != lp) lp = -INFINITY;
        o->logprob = lp;
        o->n_top = filled;
    }
}

extern "C" int cuda_row_scores(const struct cuda_ctx *c, const float *logits, int n, int V, const struct row_score_req *req,
                               int max_top, struct sample_result *out) {
    if (n <= 0) return 0;
    if (max_top < 0 || max_top > SAMPLER_MAX_TOP_LOGPROBS)
        return errorf(c->err, c->errlen, ST_INTERNAL, "row_scores: %d alternatives (0..%d)", max_top, SAMPLER_MAX_TOP_LOGPROBS);
    const dim3 grid((unsigned)n), block(RS_THREADS);
    if (max_top == 0) LAUNCH_CHECK_RC(c, launch_k(row_score_kernel<0>, grid, block, 0, cstream(c), logits, V, req, out), "row_scores");
    if (max_top == 1) LAUNCH_CHECK_RC(c, launch_k(row_score_kernel<1>, grid, block, 0, cstream(c), logits, V, req, out), "row_scores");
    if (max_top <= 5) LAUNCH_CHECK_RC(c, launch_k(row_score_kernel<5>, grid, block, 0, cstream(c), logits, V, req, out), "row_scores");
    LAUNCH_CHECK_RC(c, launch_k(row_score_kernel<SAMPLER_MAX_TOP_LOGPROBS>, grid, block, 0, cstream(c), logits, V, req, out), "row_scores");
}

CUDA_TRACE_TU(score)
