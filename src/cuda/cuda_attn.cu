// cuda/cuda_attn.cu — gated full attention: per-head q/k RMSNorm + partial NeoX RoPE
// with the K/V cache write (attn_prep), split-key causal attention with GQA sharing
// (one block = one KV head × a tile of ≤ 8 query tokens × its group of q heads, K/V
// tiles of 32 keys staged in shared memory, online softmax in fp32), and the combine
// of the splits with the sigmoid output gate → bf16 input of o_proj.
#include <math.h>

#include "cuda/cuda_internal.h"

#define KT 32

__device__ __forceinline__ uint16_t *kv_ptr(const cuda_seq &s, int layer_ord, int which, int kvh, int g, int pos, int D) {
    return s.kv + ((((size_t)layer_ord * 2 + which) * kvh + g) * (size_t)s.max_seq + pos) * D;
}

static __global__ void attn_prep_kernel(float *qg, const float *k, const float *v, const float *q_norm,
                                        const float *k_norm, const int32_t *pos, const int32_t *tok_seq,
                                        const cuda_seq *seqs, int layer_ord, int n_heads, int kvh, int D, int rot,
                                        float theta, float eps) {
    TRACE_KERNEL();
    __shared__ float sh[32];
    __shared__ float vals[512];
    pdl_trigger();
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const bool is_q = h < n_heads;
    /* PDL: the norm gain and the rotary frequency need nothing an earlier kernel wrote */
    const float gain = is_q ? q_norm[d] : k_norm[d];
    const int half = rot / 2;
    const float inv_freq = d < rot ? powf(theta, -2.0f * (float)(d % half) / (float)rot) : 0.0f;
    pdl_wait();
    float *src = is_q ? qg + (size_t)t * 2 * n_heads * D + (size_t)h * 2 * D
                      : const_cast<float *>(k) + (size_t)t * kvh * D + (size_t)(h - n_heads) * D;
    const float x = src[d];
    const float ss = block_sum(x * x, sh);
    const float y = x * rsqrtf(ss / (float)D + eps) * gain;
    vals[d] = y;
    __syncthreads();
    float o = y;
    const int p = pos[t];
    if (d < rot) {
        const float ang = (float)p * inv_freq;
        float sn, cs;
        sincosf(ang, &sn, &cs);
        o = d < half ? y * cs - vals[d + half] * sn : y * cs + vals[d - half] * sn;
    }
    if (is_q) {
        src[d] = o;
    } else {
        const int g = h - n_heads;
        const cuda_seq s = seqs[tok_seq[t]];
        kv_ptr(s, layer_ord, 0, kvh, g, p, D)[d] = f2bf(o);
        kv_ptr(s, layer_ord, 1, kvh, g, p, D)[d] = f2bf(v[(size_t)t * kvh * D + (size_t)g * D + d]);
    }
}

extern "C" int cuda_attn_prep(const struct cuda_ctx *c, float *qg, const float *k, const float *v, const float *q_norm,
                              const float *k_norm, const int32_t *pos, const int32_t *tok_seq,
                              const struct cuda_seq *seqs, int layer_ord, int T, int n_heads, int kv_heads, int D,
                              int rot, float theta, float eps) {
    if (T <= 0) return 0;
    if (D > 512 || D % 32) return errorf(c->err, c->errlen, ST_UNSUPPORTED, "attn_prep: head_dim %d", D);
    LAUNCH_CHECK_RC(c, launch_k(attn_prep_kernel, dim3(T, n_heads + kv_heads), dim3(D), 0, cstream(c), qg, k, v, q_norm,
                                k_norm, pos, tok_seq, seqs, layer_ord, n_heads, kv_heads, D, rot, theta, eps),
                    "attn_prep");
}

/* smem: Q bf16 [group][QT][D+8], K, V bf16 [KT][D+8] */
template <int D>
static __global__ void attn_kernel(const float *qg, const int32_t *pos, const cuda_seq *seqs, const cuda_attn_tile *tiles,
                                   int layer_ord, int n_heads, int kvh, int n_split, float *part) {
    TRACE_KERNEL();
    constexpr int DS = D + 8, DPL = D / 32;
    extern __shared__ __align__(16) uint16_t sm[];
    const int group = n_heads / kvh;
    uint16_t *Qs = sm;
    uint16_t *Ks = Qs + group * CUDA_ATTN_QT * DS;
    uint16_t *Vs = Ks + KT * DS;
    pdl_trigger();
    pdl_wait(); /* tiles, seqs, q, pos and the KV cache all come from earlier work */
    const int tile_i = blockIdx.x / kvh, g = blockIdx.x % kvh, split = blockIdx.y;
    const cuda_attn_tile tl = tiles[tile_i];
    const cuda_seq s = seqs[tl.seq];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nthr = blockDim.x;
    const int h = g * group + warp;
    const float scale = rsqrtf((float)D);

    /* stage Q (already normalised and rotated), pre-scaled by 1/sqrt(D) */
    for (int i = threadIdx.x; i < group * CUDA_ATTN_QT * D; i += nthr) {
        const int hw = i / (CUDA_ATTN_QT * D), r = (i / D) % CUDA_ATTN_QT, d = i % D;
        float q = 0.0f;
        if (r < tl.n) q = qg[(size_t)(tl.t0 + r) * 2 * n_heads * D + (size_t)(g * group + hw) * 2 * D + d] * scale;
        Qs[(hw * CUDA_ATTN_QT + r) * DS + d] = f2bf(q);
    }
    int qpos[CUDA_ATTN_QT];
#pragma unroll
    for (int r = 0; r < CUDA_ATTN_QT; r++) qpos[r] = r < tl.n ? pos[tl.t0 + r] : -1;
    const int kv_len = pos[tl.t0 + tl.n - 1] + 1;
    int k_lo, k_hi;
    attn_split_keys(kv_len, n_split, split, &k_lo, &k_hi);

    float m[CUDA_ATTN_QT], l[CUDA_ATTN_QT], acc[CUDA_ATTN_QT][DPL];
#pragma unroll
    for (int r = 0; r < CUDA_ATTN_QT; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[r][i] = 0.0f;
    }
    const uint16_t *kbase = kv_ptr(s, layer_ord, 0, kvh, g, 0, D);
    const uint16_t *vbase = kv_ptr(s, layer_ord, 1, kvh, g, 0, D);

    for (int kb = k_lo; kb < k_hi; kb += KT) {
        const int nk = min(KT, k_hi - kb);
        __syncthreads();
        for (int i = threadIdx.x; i < KT * (D / 8); i += nthr) {
            const int j = i / (D / 8), c8 = i % (D / 8);
            uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
            if (j < nk) {
                kv4 = *reinterpret_cast<const uint4 *>(kbase + (size_t)(kb + j) * D + c8 * 8);
                vv4 = *reinterpret_cast<const uint4 *>(vbase + (size_t)(kb + j) * D + c8 * 8);
            }
            *reinterpret_cast<uint4 *>(Ks + j * DS + c8 * 8) = kv4;
            *reinterpret_cast<uint4 *>(Vs + j * DS + c8 * 8) = vv4;
        }
        __syncthreads();
        if (warp >= group) continue;
        /* scores: lane = key */
        float sc[CUDA_ATTN_QT];
#pragma unroll
        for (int r = 0; r < CUDA_ATTN_QT; r++) sc[r] = 0.0f;
        const uint16_t *kr = Ks + lane * DS;
        const uint16_t *qw = Qs + warp * CUDA_ATTN_QT * DS;
        for (int d = 0; d < D; d += 8) {
            const uint4 k4 = *reinterpret_cast<const uint4 *>(kr + d);
            const float kf[8] = {bf_lo(k4.x), bf_hi(k4.x), bf_lo(k4.y), bf_hi(k4.y),
                                 bf_lo(k4.z), bf_hi(k4.z), bf_lo(k4.w), bf_hi(k4.w)};
#pragma unroll
            for (int r = 0; r < CUDA_ATTN_QT; r++) {
                if (r < tl.n) {
                    const uint4 q4 = *reinterpret_cast<const uint4 *>(qw + r * DS + d);
                    float a = sc[r];
                    a = fmaf(bf_lo(q4.x), kf[0], a); a = fmaf(bf_hi(q4.x), kf[1], a);
                    a = fmaf(bf_lo(q4.y), kf[2], a); a = fmaf(bf_hi(q4.y), kf[3], a);
                    a = fmaf(bf_lo(q4.z), kf[4], a); a = fmaf(bf_hi(q4.z), kf[5], a);
                    a = fmaf(bf_lo(q4.w), kf[6], a); a = fmaf(bf_hi(q4.w), kf[7], a);
                    sc[r] = a;
                }
            }
        }
        const int kp = kb + lane;
#pragma unroll
        for (int r = 0; r < CUDA_ATTN_QT; r++) {
            if (r >= tl.n) continue;
            const bool ok = lane < nk && kp <= qpos[r];
            const float sv = ok ? sc[r] : -INFINITY;
            const float mt = warp_max(sv);
            const float mn = fmaxf(m[r], mt);
            if (mn == -INFINITY) { sc[r] = 0.0f; continue; }
            const float corr = __expf(m[r] - mn);
            m[r] = mn;
            const float p = ok ? __expf(sv - mn) : 0.0f;
            l[r] = l[r] * corr + p;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[r][i] *= corr;
            sc[r] = p;
        }
        /* PV: lane holds dims [lane*DPL, lane*DPL+DPL) */
        for (int j = 0; j < nk; j++) {
            const uint16_t *vr = Vs + j * DS + lane * DPL;
            float vf[DPL];
#pragma unroll
            for (int i = 0; i < DPL; i += 2) {
                const uint32_t w = *reinterpret_cast<const uint32_t *>(vr + i);
                vf[i] = bf_lo(w);
                vf[i + 1] = bf_hi(w);
            }
#pragma unroll
            for (int r = 0; r < CUDA_ATTN_QT; r++) {
                if (r < tl.n) {
                    const float p = __shfl_sync(0xffffffffu, sc[r], j);
#pragma unroll
                    for (int i = 0; i < DPL; i++) acc[r][i] = fmaf(p, vf[i], acc[r][i]);
                }
            }
        }
    }
    if (warp >= group) return;
#pragma unroll
    for (int r = 0; r < CUDA_ATTN_QT; r++) {
        if (r >= tl.n) continue;
        const float lt = warp_sum(l[r]);
        float *o = part + (((size_t)(tl.t0 + r) * n_heads + h) * n_split + split) * (D + 2);
#pragma unroll
        for (int i = 0; i < DPL; i++) o[2 + lane * DPL + i] = acc[r][i];
        if (lane == 0) {
            o[0] = m[r];
            o[1] = lt;
        }
    }
}

/* Combines a (token, head)'s key splits: a warp per 64 columns (attn_combine_warp: the
 * splits' m and l, then their values, each one round trip). The old form had every thread
 * pass over all the splits' m serially and its loads wait behind its empty-split tests
 * (H200, batch-1 decode at 4,096 context, 128 splits: 514 → 551–559 tok/s with this one).
 * Blocks of D/2 threads; n_split ≤ 32·CMB_MAXC. */
#define CMB_MAXC 4
static __global__ void attn_combine_kernel(const float *part, const float *qg, int n_heads, int D, int n_split,
                                           uint16_t *out) {
    TRACE_KERNEL();
    pdl_trigger();
    pdl_wait();
    attn_combine_warp<CMB_MAXC>(part, qg, blockIdx.x, blockIdx.y, n_heads, n_split, D, 32 * (threadIdx.x >> 5), out);
}

/* Forces the scalar kernel instead of the tensor-core one (tests compare both). */
static int scalar_attn = 0;
extern "C" void cuda_attn_force_scalar(int on) { scalar_attn = on; }

extern "C" int cuda_attn_tile_tokens(int T, int n_split, int n_heads, int kv_heads, int D) {
    return !scalar_attn && cuda_flash_wg_takes(T, n_split, n_heads, kv_heads, D) ? CUDA_ATTN_QT_WIDE : CUDA_ATTN_QT;
}

static size_t attn_smem(int group, int D) { return ((size_t)group * CUDA_ATTN_QT + 2 * KT) * (D + 8) * 2; }

/* Raises the dynamic shared-memory limit of the attention kernel for this model's
 * (group, head_dim); called once at backend creation (never inside a graph capture). */
extern "C" int cuda_attn_init(int n_heads, int kv_heads, int D, char *err, size_t errlen) {
    if (kv_heads <= 0 || n_heads % kv_heads || n_heads / kv_heads > 32)
        return errorf(err, errlen, ST_UNSUPPORTED, "attention: %d heads over %d KV heads", n_heads, kv_heads);
    const int smem = (int)attn_smem(n_heads / kv_heads, D);
    cudaError_t e;
    if (D == 256) e = cudaFuncSetAttribute(attn_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    else if (D == 128) e = cudaFuncSetAttribute(attn_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    else if (D == 64) e = cudaFuncSetAttribute(attn_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    else return errorf(err, errlen, ST_UNSUPPORTED, "attention: head_dim %d (64, 128 or 256)", D);
    if (e != cudaSuccess)
        return errorf(err, errlen, ST_DEVICE, "attention: cudaFuncSetAttribute(%d B of shared memory) failed: %s", smem,
                      cudaGetErrorString(e));
    (void)pdl_enabled(); /* its one device query happens here, outside any graph capture */
    const int rc = cuda_flash_wg_init(err, errlen);
    return rc ? rc : cuda_flash_init(D, err, errlen);
}

template <int D>
static int launch_attn(const struct cuda_ctx *c, const float *qg, const int32_t *pos, const cuda_seq *seqs,
                       const cuda_attn_tile *tiles, int n_tiles, int n_split, int layer_ord, int n_heads, int kvh,
                       float *part) {
    const int group = n_heads / kvh;
    const size_t smem = attn_smem(group, D);
    const int threads = 32 * (group < 4 ? 4 : group);
    /* not PDL-launched (nor the flash kernel and the combine): both kernels keep their
     * pdl_wait, but scheduled early they measured slower on the H200 (batch-1 decode
     * 2.92 -> 2.89 ms per token at context 512, 3.03 -> 2.99 at 4,096 without it; again in
     * session 16: flash and combine both under PDL 548 -> 539 tok/s at 512, 494 -> 461 at
     * 4,096, either alone within the spread) */
    LAUNCH_CHECK_RC(c, launch_k_pdl(false, attn_kernel<D>, dim3(n_tiles * kvh, n_split), dim3(threads), smem, cstream(c),
                                    qg, pos, seqs, tiles, layer_ord, n_heads, kvh, n_split, part),
                    "attention");
}

extern "C" int cuda_attention(const struct cuda_ctx *c, const float *qg, const int32_t *pos, const struct cuda_seq *seqs,
                              const struct cuda_attn_tile *tiles, int n_tiles, int n_split, int layer_ord, int T,
                              int n_heads, int kv_heads, int D, float *part, int *tail, uint16_t *out) {
    if (T <= 0) return 0;
    if (n_heads % kv_heads || n_heads / kv_heads > 32)
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "attention: %d heads over %d KV heads", n_heads, kv_heads);
    if (cuda_attn_tile_tokens(T, n_split, n_heads, kv_heads, D) == CUDA_ATTN_QT_WIDE)
        return cuda_flash_wg_attention(c, qg, pos, seqs, tiles, n_tiles, layer_ord, n_heads, kv_heads, out);
    int rc, launched = 0, combined = 0;
    if (!scalar_attn) {
        rc = cuda_flash_attention(c, qg, pos, seqs, tiles, n_tiles, n_split, layer_ord, n_heads, kv_heads, D, part, tail, out,
                                  &launched, &combined);
        if (rc || combined) return rc;
    }
    if (launched) rc = 0;
    else if (D == 256) rc = launch_attn<256>(c, qg, pos, seqs, tiles, n_tiles, n_split, layer_ord, n_heads, kv_heads, part);
    else if (D == 128) rc = launch_attn<128>(c, qg, pos, seqs, tiles, n_tiles, n_split, layer_ord, n_heads, kv_heads, part);
    else if (D == 64) rc = launch_attn<64>(c, qg, pos, seqs, tiles, n_tiles, n_split, layer_ord, n_heads, kv_heads, part);
    else return errorf(c->err, c->errlen, ST_UNSUPPORTED, "attention: head_dim %d (64, 128 or 256)", D);
    if (rc) return rc;
    if (n_split > 32 * CMB_MAXC)
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "attention: %d key splits (at most %d)", n_split, 32 * CMB_MAXC);
    LAUNCH_CHECK_RC(c, launch_k_pdl(false, attn_combine_kernel, dim3(T, n_heads), dim3(D / 2), 0, cstream(c),
                                    part, qg, n_heads, D, n_split, out),
                    "attention_combine");
}

CUDA_TRACE_TU(attn)
