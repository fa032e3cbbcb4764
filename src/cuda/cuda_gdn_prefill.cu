// cuda/cuda_gdn_prefill.cu — the Gated DeltaNet recurrence for long runs of tokens
// (prefill chunks), split in two launches so the sequential part never waits on
// per-token preparation:
//
//   1. gdn_prep: fully parallel over tokens — l2-normalised q (times 1/sqrt(Dk)) and k of
//      every key head into qk [T][Hk][2][Dk] fp32, and the gates of every value head
//      into gates [Hv][T][2] = (alpha = exp(-exp(A_log) softplus(a + dt_bias)),
//      beta = sigmoid(b)). Before, every block of the scan redid this for its head
//      (8 blocks per head) in the prologue of each 32-token chunk, with dependent global
//      loads: ~12 µs per chunk, more than half of the scan (docs/PERFORMANCE.md).
//   2. gdn_scan_prefill: the recurrence of cuda_gdn.cu (same state layout, same math per
//      token) with the next chunk's q, k, v and gates fetched by cp.async into the other
//      half of a double buffer while the current chunk runs. A value row is spread over
//      4 lanes (the decode form spreads it over Dk/8: 16 at Dk 128), so each lane's
//      per-token overhead covers 4x the elements; its sums are ordered differently from
//      the decode form's (gdnp_lpr_for: other bits, still independent of what else is in
//      the batch). H100, a pack of 8 x 512 tokens: the scan 1,082 -> 732 us a GDN layer,
//      the pack 117.4 -> 107.0 ms (docs/PERFORMANCE.md, session 27).
//
// Since session 31 step 2 takes only the sequences of fewer than CUDA_GDN_CHUNK_MIN tokens
// where the chunked form (cuda_gdn_chunk.cu: 64-token chunks on tensor cores, 732 -> 586 us
// for that pack) applies; the longer ones go there, after the same preparation.
#include <limits.h>
#include <math.h>

#include "cuda/cuda_internal.h"

/* Tokens a staged chunk. 16: with the decode form's split a block's two buffers take ~36
 * KB, six blocks an SM (40 registers a thread), where 32 (~71 KB) allowed three: a packed
 * prefill of 8 × 512 tokens has 2,048 blocks of 512 sequential tokens each, bound by how
 * many run at once. With 4 lanes a row (512 blocks, ~44 KB each) the registers allow two
 * an SM either way. (-DGDNP_CH=32: the A/B build.) */
#ifndef GDNP_CH
#define GDNP_CH 16
#endif

/* ---- 1. preparation ---- */

/* Block per token: warp w normalises (key head, q|k) pairs w, w+8, ...; then threads
 * compute the gates of the value heads. */
template <int DK>
static __global__ void __launch_bounds__(256) gdn_prep_kernel(const float *conv_out, const float *ga, const float *gb, int ldab,
                                                              const float *A_log, const float *dt_bias, int T, int Hk,
                                                              int Hv, int Dv, float *qk, float *gates) {
    TRACE_KERNEL();
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int key_dim = Hk * DK, C = 2 * key_dim + Hv * Dv;
    const float *row = conv_out + (size_t)t * C;
    const float qscale = rsqrtf((float)DK);
    for (int p = warp; p < 2 * Hk; p += blockDim.x >> 5) {
        const int kh = p >> 1, is_k = p & 1;
        gdn_l2norm_warp<DK>(row + (is_k ? key_dim : 0) + kh * DK, qk + (((size_t)t * Hk + kh) * 2 + is_k) * DK,
                            is_k ? 1.0f : qscale, lane);
    }
    for (int h = threadIdx.x; h < Hv; h += blockDim.x) {
        const float2 g = gdn_gates(ga[(size_t)t * ldab + h], gb[(size_t)t * ldab + h], dt_bias[h], __expf(A_log[h]));
        reinterpret_cast<float2 *>(gates)[(size_t)h * T + t] = g;
    }
}

/* ---- 2. the scan with a double-buffered chunk ---- */

/* Lanes a value row (LPR; the lane keeps E = DK / LPR of the row's state). The one-launch
 * scan (cuda_gdn.cu) spreads a row over DK / 8 = 16 lanes: per token and lane 8 elements
 * × 4 operations (decay, S·k, update, S·q) against 2 × 4 shuffle-and-add levels, 4 loads
 * and the token's bookkeeping — ~64 instructions for 8 elements; that split here was
 * issue-bound (a pack of 8 × 512 tokens: ~1.08 ms a GDN layer, 26 % of the pack). With 4
 * lanes a row the same ~20 instructions of overhead cover 32 elements: ~170 for 32 (a
 * row's token 32 → ~21 warp instructions) at 105 registers (two blocks an SM, against six):
 * 732 µs a layer on the H100 (8 lanes a row, 56 registers and four blocks an SM: 832 µs;
 * session 27). The order of the sums then differs from the decode form (its bits are not
 * these), which is allowed: a prompt chunk of more than `invariant_tokens` tokens takes the
 * GEMMs (other bits than the decode kernels) anyway; what must hold is that a sequence's
 * bits do not depend on what else is packed, and a row's arithmetic here depends on nothing
 * but its own tokens (the LPR is a constant, not the batch's). ORCHID_GDNP_LPR=16 (any
 * value of at least DK / 8) keeps the decode form's split and bits (A/B; the GPU test then
 * expects the one-launch scan bitwise). */
static int gdnp_lpr_for(int DK) {
    static const bool decode_split = [] {
        const char *e = getenv("ORCHID_GDNP_LPR");
        return e && atoi(e) >= 16;
    }();
    return decode_split || DK / 8 <= 4 ? DK / 8 : 4;
}

/* One token for a value row over LPR lanes, E = DK / LPR elements a lane (lane `sub` holds
 * j = 4·sub + 4·LPR·u + 0..3, u < E / 4: a warp's float4 reads of k and q are contiguous and
 * the row groups of a warp read the same addresses). Four partial sums a dot product
 * (the chains interleave), summed (0 + 1) + (2 + 3), then across the row's lanes by xor
 * shuffles. Where LPR = DK / 8 it is gdn_token itself (the decode form's bits). */
template <int DK, int LPR>
__device__ __forceinline__ float gdnp_token(float (&st)[DK / LPR], const float *k, const float *q, int sub, float v, float a,
                                            float beta) {
    constexpr int E = DK / LPR;
    if constexpr (E == 8) {
        return gdn_token<LPR>(st, k, q, sub, v, a, beta);
    } else {
        float kv[E];
#pragma unroll
        for (int u = 0; u < E / 4; u++) {
            const float4 k4 = *reinterpret_cast<const float4 *>(k + 4 * LPR * u + 4 * sub);
            kv[4 * u] = k4.x; kv[4 * u + 1] = k4.y; kv[4 * u + 2] = k4.z; kv[4 * u + 3] = k4.w;
        }
        float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int e = 0; e < E; e++) {
            st[e] *= a;
            m[e & 3] = fmaf(st[e], kv[e], m[e & 3]);
        }
        float mk = (m[0] + m[1]) + (m[2] + m[3]);
#pragma unroll
        for (int o = LPR / 2; o > 0; o >>= 1) mk += __shfl_xor_sync(0xffffffffu, mk, o);
        const float delta = (v - mk) * beta;
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int u = 0; u < E / 4; u++) {
            const float4 q4 = *reinterpret_cast<const float4 *>(q + 4 * LPR * u + 4 * sub);
            const float qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                st[4 * u + i] = fmaf(kv[4 * u + i], delta, st[4 * u + i]);
                p[i] = fmaf(st[4 * u + i], qv[i], p[i]);
            }
        }
        float o = (p[0] + p[1]) + (p[2] + p[3]);
#pragma unroll
        for (int off = LPR / 2; off > 0; off >>= 1) o += __shfl_xor_sync(0xffffffffu, o, off);
        return o;
    }
}

/* A block's staged chunk: q and k of its key head, v of its ROWS value rows, the gates. */
template <int DK, int ROWS>
struct gdnp_buf {
    float q[GDNP_CH][DK];
    float k[GDNP_CH][DK];
    float v[GDNP_CH][ROWS];
    float g[GDNP_CH][2];
};

/* Issues the copies of chunk [c0, c0 + n) of head h / row block rb into buffer b. */
template <int DK, int ROWS>
__device__ __forceinline__ void gdnp_fetch(gdnp_buf<DK, ROWS> &b, const float *qk, const float *conv_out, const float *gates,
                                           int c0, int n, int T, int kh, int h, int rb, int Hk, int Hv, int Dv) {
    constexpr int Q4 = DK / 4, V4 = ROWS / 4;
    const int key_dim = Hk * DK, C = 2 * key_dim + Hv * Dv;
    for (int i = threadIdx.x; i < n * 2 * Q4; i += blockDim.x) { /* q then k rows of each token */
        const int tt = i / (2 * Q4), r = i % (2 * Q4), is_k = r / Q4, j = (r % Q4) * 4;
        cpa16(is_k ? &b.k[tt][j] : &b.q[tt][j], qk + (((size_t)(c0 + tt) * Hk + kh) * 2 + is_k) * DK + j);
    }
    for (int i = threadIdx.x; i < n * V4; i += blockDim.x) {
        const int tt = i / V4, j = (i % V4) * 4;
        cpa16(&b.v[tt][j], conv_out + (size_t)(c0 + tt) * C + 2 * key_dim + (size_t)h * Dv + rb * ROWS + j);
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) cpa8(&b.g[i][0], gates + ((size_t)h * T + c0 + i) * 2);
    cpa_commit();
}

/* Block = THREADS threads over ROWS = THREADS / LPR value rows of one head of one sequence,
 * all of the sequence's tokens of this batch in chunks of GDNP_CH (the next chunk's copies in
 * flight while this one runs). A row's arithmetic does not depend on THREADS (only on LPR),
 * so the launch may pick it from the batch's shape without changing any bits: 256 when the
 * batch has blocks enough to fill the SMs, 64 for few sequences (one 4,096-token prompt:
 * 64 blocks of 64 rows would leave half the SMs idle; 256 blocks of 16 rows do not). */
template <int DK, int LPR, int THREADS>
static __global__ void __launch_bounds__(THREADS) gdn_scan_prefill_kernel(const float *qk, const float *conv_out,
                                                                      const float *gates, const cuda_seq *seqs,
                                                                      int layer_ord, int T, int Hk, int Hv, int Dv,
                                                                      int skip_from, float *y) {
    TRACE_KERNEL();
    constexpr int ROWS = THREADS / LPR, E = DK / LPR;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    gdnp_buf<DK, ROWS> *buf = reinterpret_cast<gdnp_buf<DK, ROWS> *>(smem_raw);
    float(*ys)[ROWS] = reinterpret_cast<float(*)[ROWS]>(smem_raw + 2 * sizeof(gdnp_buf<DK, ROWS>));
    const int rblocks = Dv / ROWS;
    const int h = blockIdx.x / rblocks, rb = blockIdx.x % rblocks;
    const int kh = h / (Hv / Hk);
    const cuda_seq s = seqs[blockIdx.y];
    if (s.t1 - s.t0 >= skip_from) return; /* the chunked form's sequence */
    const int tid = threadIdx.x;
    const int rloc = tid / LPR, sub = tid % LPR;
    const int row = rb * ROWS + rloc;
    float *S = s.state + (((size_t)layer_ord * Hv + h) * Dv + row) * DK;
    float st[E];
#pragma unroll
    for (int u = 0; u < E / 4; u++) {
        const float4 v4 = *reinterpret_cast<const float4 *>(S + 4 * LPR * u + 4 * sub);
        st[4 * u] = v4.x; st[4 * u + 1] = v4.y; st[4 * u + 2] = v4.z; st[4 * u + 3] = v4.w;
    }
    if (s.t0 < s.t1)
        gdnp_fetch<DK, ROWS>(buf[0], qk, conv_out, gates, s.t0, min(GDNP_CH, s.t1 - s.t0), T, kh, h, rb, Hk, Hv, Dv);
    int cur = 0;
    for (int c0 = s.t0; c0 < s.t1; c0 += GDNP_CH, cur ^= 1) {
        const int n = min(GDNP_CH, s.t1 - c0);
        __syncthreads(); /* everyone is done with buffer cur^1 (the chunk before) and ys */
        if (c0 + GDNP_CH < s.t1) {
            gdnp_fetch<DK, ROWS>(buf[cur ^ 1], qk, conv_out, gates, c0 + GDNP_CH, min(GDNP_CH, s.t1 - c0 - GDNP_CH), T, kh, h,
                                rb, Hk, Hv, Dv);
            cpa_wait<1>();
        } else {
            cpa_wait<0>();
        }
        __syncthreads();
        const gdnp_buf<DK, ROWS> &b = buf[cur];
        for (int tt = 0; tt < n; tt++) {
            const float o = gdnp_token<DK, LPR>(st, b.k[tt], b.q[tt], sub, b.v[tt][rloc], b.g[tt][0], b.g[tt][1]);
            if (sub == 0) ys[tt][rloc] = o;
        }
        __syncthreads();
        for (int i = tid; i < n * ROWS; i += blockDim.x) {
            const int tt = i / ROWS, r = i % ROWS;
            y[(size_t)(c0 + tt) * Hv * Dv + (size_t)h * Dv + rb * ROWS + r] = ys[tt][r];
        }
    }
#pragma unroll
    for (int u = 0; u < E / 4; u++)
        *reinterpret_cast<float4 *>(S + 4 * LPR * u + 4 * sub) =
            make_float4(st[4 * u], st[4 * u + 1], st[4 * u + 2], st[4 * u + 3]);
}

template <int DK, int ROWS>
static size_t gdnp_smem() {
    return 2 * sizeof(gdnp_buf<DK, ROWS>) + (size_t)GDNP_CH * ROWS * 4;
}

/* The instances: DK 128 / 64 with 4 lanes a row or the decode form's DK / 8; DK 32 has
 * DK / 8 = 4 either way. */
template <int DK, int LPR, int THREADS>
static cudaError_t gdnp_attr() {
    return cudaFuncSetAttribute(gdn_scan_prefill_kernel<DK, LPR, THREADS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)gdnp_smem<DK, THREADS / LPR>());
}

/* The chunked form (cuda_gdn_chunk.cu) for the sequences of at least CUDA_GDN_CHUNK_MIN
 * tokens where it applies (H100, session 31: this scan 732 -> 586 us a GDN layer for a pack of
 * 8 x 512, prefill of one 4,096-token prompt 32,217 -> 34,253 tok/s); ORCHID_GDN_CHUNK=0 keeps
 * every sequence here (A/B), cuda_gdn_prefill_force_chunk overrides both. */
static int gdnp_chunk_forced = -1;
extern "C" void cuda_gdn_prefill_force_chunk(int on) { gdnp_chunk_forced = on; }
static bool gdnp_chunk_on() {
    static const bool env = [] {
        const char *e = getenv("ORCHID_GDN_CHUNK");
        return !e || atoi(e) != 0;
    }();
    return gdnp_chunk_forced >= 0 ? gdnp_chunk_forced > 0 : env;
}

static int gdnp_sms = 132; /* multiprocessors (cuda_gdn_prefill_init, device_caps): the block-size choice */

extern "C" int cuda_gdn_prefill_init(char *err, size_t errlen) {
    cudaError_t e = gdnp_attr<128, 4, 256>();
    if (e == cudaSuccess) e = gdnp_attr<128, 4, 64>();
    if (e == cudaSuccess) e = gdnp_attr<128, 16, 256>();
    if (e == cudaSuccess) e = gdnp_attr<64, 4, 256>();
    if (e == cudaSuccess) e = gdnp_attr<64, 4, 64>();
    if (e == cudaSuccess) e = gdnp_attr<64, 8, 256>();
    if (e == cudaSuccess) e = gdnp_attr<32, 4, 256>();
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "gdn prefill: cudaFuncSetAttribute failed: %s", cudaGetErrorString(e));
    cuda_gdn_chunk_init();
    cuda_caps caps;
    if (device_caps(&caps) == cudaSuccess && caps.sms > 0) gdnp_sms = caps.sms;
    return 0;
}

/* Lanes a value row the prefill form uses for this key dim (4; DK / 8, the decode form's bits, with ORCHID_GDNP_LPR=16). */
extern "C" int cuda_gdn_prefill_lanes(int Dk) { return gdnp_lpr_for(Dk); }

/* Which shapes the two-launch form takes (the rest use cuda_gdn_scan). Dv must hold whole
 * blocks of 256 / LPR rows; the 64-thread blocks take a quarter of that, which divides too. */
extern "C" int cuda_gdn_prefill_supported(int Hk, int Hv, int Dk, int Dv) {
    return (Dk == 128 || Dk == 64 || Dk == 32) && Hv % Hk == 0 && Dv % (256 / gdnp_lpr_for(Dk)) == 0;
}

template <int DK, int LPR, int THREADS>
static int gdnp_launch(const struct cuda_ctx *c, const float *conv_out, const float *a, const float *b, int ldab,
                       const float *A_log, const float *dt_bias, const struct cuda_seq *seqs, int n_seqs, int n_long,
                       int layer_ord, int T, int Hk, int Hv, int Dv, float *qk, float *gates, float *y) {
    gdn_prep_kernel<DK><<<T, 256, 0, cstream(c)>>>(conv_out, a, b, ldab, A_log, dt_bias, T, Hk, Hv, Dv, qk, gates);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return errorf(c->err, c->errlen, ST_DEVICE, "CUDA launch of gdn_prep failed: %s", cudaGetErrorString(e));
    int skip_from = INT_MAX; /* the scan's sequences: all, or those shorter than the chunked form's */
    if (gdnp_chunk_on() && cuda_gdn_chunk_supported(Hk, Hv, DK, Dv)) {
        int rc;
        if (n_long != 0 && (rc = cuda_gdn_chunk_scan(c, qk, conv_out, gates, seqs, n_seqs, n_long, layer_ord, T, Hk, Hv, Dv, y))) return rc;
        if (n_long == n_seqs) return 0;
        skip_from = CUDA_GDN_CHUNK_MIN;
    }
    constexpr int ROWS = THREADS / LPR;
    const dim3 grid(Hv * (Dv / ROWS), n_seqs);
    gdn_scan_prefill_kernel<DK, LPR, THREADS><<<grid, THREADS, gdnp_smem<DK, ROWS>(), cstream(c)>>>(qk, conv_out, gates, seqs,
                                                                                                 layer_ord, T, Hk, Hv, Dv,
                                                                                                 skip_from, y);
    LAUNCH_CHECK(c, "gdn_scan_prefill");
}

extern "C" int cuda_gdn_scan_prefill(const struct cuda_ctx *c, const float *conv_out, const float *a, const float *b, int ldab,
                                     const float *A_log, const float *dt_bias, const struct cuda_seq *seqs, int n_seqs,
                                     int n_long, int layer_ord, int T, int Hk, int Hv, int Dk, int Dv, float *qk, float *gates,
                                     float *y) {
    if (n_seqs <= 0 || T <= 0) return 0;
    if (!cuda_gdn_prefill_supported(Hk, Hv, Dk, Dv))
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "gdn prefill: Hk %d Hv %d Dk %d Dv %d", Hk, Hv, Dk, Dv);
    /* the instance for (Dk, lanes a row): gdnp_lpr_for gives 4 or Dk / 8 (Dk 32: both 4);
     * 4 lanes take 64-thread blocks when 256-thread ones (64 rows each) would not give every
     * SM two (the 4-lane form's residency: 105 registers) — the same bits either way */
    const bool narrow = gdnp_lpr_for(Dk) == 4;
    static const int forced = [] { /* ORCHID_GDNP_THREADS=64 or 256: that block size always (tests, A/B) */
        const char *e = getenv("ORCHID_GDNP_THREADS");
        return e ? atoi(e) : 0;
    }();
    const bool small = forced == 64 || (forced != 256 && (long long)n_seqs * Hv * (Dv / 64) < 2LL * gdnp_sms);
    const auto launch = Dk == 128 ? (narrow ? (small ? gdnp_launch<128, 4, 64> : gdnp_launch<128, 4, 256>) : gdnp_launch<128, 16, 256>)
                        : Dk == 64 ? (narrow ? (small ? gdnp_launch<64, 4, 64> : gdnp_launch<64, 4, 256>) : gdnp_launch<64, 8, 256>)
                                   : gdnp_launch<32, 4, 256>;
    return launch(c, conv_out, a, b, ldab, A_log, dt_bias, seqs, n_seqs, n_long, layer_ord, T, Hk, Hv, Dv, qk, gates, y);
}

CUDA_TRACE_TU(gdn_prefill)
