// cuda/cuda_flash.cu — tensor-core causal attention (flash style) with GQA row packing.
// One block = one KV head × one query tile (≤ 8 tokens of one sequence); its 64 rows
// are the (token, q head) pairs of that KV head's group, so every K/V tile staged in
// shared memory serves all the heads of the group. 4 warps × 16 rows; K/V tiles of
// 32 keys double-buffered with cp.async; S = Q·Kᵀ and O += P·V with mma.sync
// m16n8k16 bf16 → fp32; online softmax in fp32 (exp2 domain). The key range may be
// split (decode): each split writes (m, l, O) partials that cuda_attn.cu combines. A block
// may take several consecutive splits of its tile (spb): each is computed as its own block
// would (same tiles, same online softmax from a fresh state, same partial), with Q staged
// once and the next split's first K/V tile prefetched — a batch of 64 decode sequences at
// context 512 has 64 × 2 KV heads × 16 splits of 32 keys, and one block each staged a Q
// tile as large as its K/V and ran ~8 waves (H200: 95 µs a layer for 67 MB of KV).
//
// The fused decode form (FUSED = true; cuda_attention_fused, opt-in ORCHID_ATTN_FUSED=1
// until measured) runs a one-token-a-sequence step's whole attention in this one launch,
// where three launches ran (attn_prep, this kernel, attn_combine): every block normalises
// and rotates its group's q heads itself (attn_norm_val / attn_rope, the prep kernel's
// helpers), the block whose keys hold the new position prepares its k, writes the new K/V
// row to the cache and puts it straight into its shared tile, and the blocks of one
// (token, KV head) — a thread-block cluster of C ≤ 16, each taking ⌈n_split / C⌉ splits —
// keep their partials in shared memory (the Q tile's rows 16..63, which one token's ≤ 16
// rows leave unused) and combine them across the cluster (distributed shared memory) in
// the combine kernel's order, each block a slice of the outputs. Same bits as the three
// launches (GPU test), for ~2 launch boundaries less per attention layer.
#include <cooperative_groups.h>
#include <math.h>

#include "cuda/cuda_internal.h"

namespace cg = cooperative_groups;

#define FQ 64   /* query rows per block */
#define FK 32   /* keys per tile */

__device__ __forceinline__ void f_cp16(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void f_ldsm4(const void *p, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}
__device__ __forceinline__ void f_ldsm4t(const void *p, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}
__device__ __forceinline__ void f_mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint16_t *f_kv(const cuda_seq &s, int layer_ord, int which, int kvh, int g, int D) {
    return s.kv + ((((size_t)layer_ord * 2 + which) * kvh + g) * (size_t)s.max_seq) * D;
}

/* The fused decode form's operands beyond the plain kernel's (FUSED only; see the top). */
struct fl_fused {
    const float *k, *v;             /* the new tokens' k (raw) and v: [T][kvh][D] fp32 */
    const float *q_norm, *k_norm;   /* [D] gains */
    int rot;                        /* rotated dims (NeoX pairs d, d + rot/2) */
    float theta, eps;
    uint16_t *out;                  /* [T][nh][D] bf16: the gated output, o_proj's input */
};

/* Rows of the Q tile one token's group may use in the fused form; rows FL_FQ_USED.. hold
 * the block's partials instead. */
#define FL_FQ_USED 16

#define FL_COMBINE_BATCH 16 /* O values a thread requests at once in the fused combine */

/* The fused form's preparation of one token's tile (tl.n = 1; p_new its position): each
 * warp takes q heads warp, warp + 4, ... of the group and — in the block whose splits hold
 * p_new — the k head after them: the head's 256 (D) values, lane l holding d = 32·i + l,
 * Σx² in attn_prep's block order, attn_norm_val, attn_rope with the partner through the
 * warp's scratch row. q goes into the Q tile as the plain kernel stages it (bf16 of
 * q·qscale); k and v (bf16) into kv_new and the cache row p_new. Q rows group..15 (read by
 * warp 0's products, their results unused) are zeroed. */
template <int D, int NW>
__device__ __forceinline__ void fl_prepare(const float *qg, const cuda_seq &s, int t, int g, int group, int nh, int kvh,
                                           int layer_ord, float qscale, int p_new, bool holder, const fl_fused &fz,
                                           uint16_t *Qs, float *rot_s, uint16_t *kv_new) {
    constexpr int DS = D + 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, half = fz.rot / 2;
    float *scr = rot_s + warp * D;
    float inv[NW];
#pragma unroll
    for (int i = 0; i < NW; i++) inv[i] = attn_inv_freq(32 * i + lane, fz.rot, fz.theta);
    const int items = group + (holder ? 1 : 0);
    for (int it = warp; it < items; it += 4) {
        const bool is_k = it == group;
        const float *src = is_k ? fz.k + (size_t)t * kvh * D + (size_t)g * D
                                : qg + (size_t)t * 2 * nh * D + (size_t)(g * group + it) * 2 * D;
        const float *gain = is_k ? fz.k_norm : fz.q_norm;
        float x[NW], y[NW];
#pragma unroll
        for (int i = 0; i < NW; i++) x[i] = src[32 * i + lane];
        const float ss = warp_sumsq_blockorder<NW>(x);
#pragma unroll
        for (int i = 0; i < NW; i++) {
            y[i] = attn_norm_val(x[i], ss, D, fz.eps, gain[32 * i + lane]);
            scr[32 * i + lane] = y[i];
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < NW; i++) {
            const int d = 32 * i + lane;
            const float partner = d < fz.rot ? scr[d < half ? d + half : d - half] : 0.0f;
            const float o = attn_rope(y[i], partner, d, fz.rot, p_new, inv[i]);
            if (is_k) {
                const uint16_t kb = f2bf(o), vb = f2bf(fz.v[(size_t)t * kvh * D + (size_t)g * D + d]);
                kv_new[d] = kb;
                kv_new[D + d] = vb;
                f_kv(s, layer_ord, 0, kvh, g, D)[(size_t)p_new * D + d] = kb;
                f_kv(s, layer_ord, 1, kvh, g, D)[(size_t)p_new * D + d] = vb;
            } else {
                Qs[it * DS + d] = f2bf(o * qscale);
            }
        }
        __syncwarp(); /* the scratch row is the next item's */
    }
    for (int i = threadIdx.x; i < (FL_FQ_USED - group) * D; i += 128) Qs[(group + i / D) * DS + i % D] = 0;
}

template <int D, bool FUSED>
static __global__ void __launch_bounds__(128) flash_kernel(const float *qg, const int32_t *pos, const cuda_seq *seqs,
                                                           const cuda_attn_tile *tiles, int layer_ord, int nh, int kvh,
                                                           int n_split, int spb, float *part, fl_fused fz) {
    TRACE_KERNEL();
    constexpr int DS = D + 8, NT = D / 8, KS = D / 16, NW = D / 32;
    extern __shared__ __align__(16) uint16_t fsm[];
    uint16_t *Qs = fsm;                 /* [FQ][DS] */
    uint16_t *Ks = Qs + FQ * DS;        /* [2][FK][DS] */
    uint16_t *Vs = Ks + 2 * FK * DS;    /* [2][FK][DS] */
    /* FUSED: the warps' rotation scratch [4][D] fp32, the new K and V rows [2][D] bf16, and
     * the partials [spb][nrows][D + 2] fp32 in the Q tile's unused rows */
    float *rot_s = reinterpret_cast<float *>(Vs + 2 * FK * DS);
    uint16_t *kv_new = reinterpret_cast<uint16_t *>(rot_s + 4 * D);
    float *pbuf = reinterpret_cast<float *>(Qs + FL_FQ_USED * DS);
    pdl_trigger();
    pdl_wait(); /* PDL: tiles, seqs, q, pos and the KV cache all come from earlier work */
    const int group = nh / kvh;
    const int tile_i = blockIdx.x / kvh, g = blockIdx.x % kvh, split0 = blockIdx.y * spb;
    const int split_end = min(n_split, split0 + spb);
    const cuda_attn_tile tl = tiles[tile_i];
    const cuda_seq s = seqs[tl.seq];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nrows = tl.n * group;
    const float qscale = rsqrtf((float)D) * 1.4426950408889634f; /* fold log2(e): softmax in exp2 */

    if (!FUSED)
        for (int i = tid; i < FQ * (D / 2); i += 128) {
            const int r = i / (D / 2), d = (i % (D / 2)) * 2;
            float a = 0.0f, b = 0.0f;
            if (r < nrows) {
                const float *q = qg + (size_t)(tl.t0 + r / group) * 2 * nh * D + (size_t)(g * group + r % group) * 2 * D + d;
                a = q[0] * qscale;
                b = q[1] * qscale;
            }
            *reinterpret_cast<uint32_t *>(Qs + r * DS + d) = pack_bf2(a, b);
        }
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
    const int p0 = r0 < nrows ? pos[tl.t0 + r0 / group] : -1;
    const int p1 = r1 < nrows ? pos[tl.t0 + r1 / group] : -1;
    const int kv_len = pos[tl.t0 + tl.n - 1] + 1;
    const uint16_t *kb_ = f_kv(s, layer_ord, 0, kvh, g, D), *vb_ = f_kv(s, layer_ord, 1, kvh, g, D);
    /* FUSED: the new key (one token a tile), whose row this kernel writes, not loads */
    const int p_new = FUSED ? kv_len - 1 : -1;
    /* FUSED: only warp 0 holds real rows (≤ 16); the others load and wait with it */
    const bool computes = !FUSED || warp == 0;

    /* K/V keys [kb, kb + FK) ∩ [.., k_hi) into buffer buf (zeros past k_hi; FUSED: the new
     * key's row left to kv_patch) */
    auto load_tile = [&](int kb, int k_hi, int buf) {
        for (int i = tid; i < FK * (D / 8); i += 128) {
            const int j = i / (D / 8), c = (i % (D / 8)) * 8;
            if (FUSED && kb + j == p_new) continue;
            const bool ok = kb + j < k_hi;
            const size_t off = (size_t)(ok ? kb + j : 0) * D + c;
            f_cp16(Ks + (buf * FK + j) * DS + c, kb_ + off, ok);
            f_cp16(Vs + (buf * FK + j) * DS + c, vb_ + off, ok);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    /* FUSED: the new key's K/V row (kv_new) into buffer buf when the tile [kb, ..) holds it;
     * plain stores, shown to the block by the barrier before the tile's products */
    auto kv_patch = [&](int kb, int k_hi, int buf) {
        if constexpr (FUSED) {
            const int j = p_new - kb;
            if (j < 0 || j >= FK || p_new >= k_hi) return;
            for (int c = tid * 8; c < 2 * D; c += 128 * 8) {
                const int which = c >= D, cc = which ? c - D : c;
                uint16_t *dst = (which ? Vs : Ks) + (buf * FK + j) * DS + cc;
                *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(kv_new + c);
            }
        }
    };

    int buf = 0;          /* the buffer of the next tile to compute */
    bool pending = false; /* that tile (the first of this split) was prefetched by the previous split */
    if (FUSED) {
        /* the first tile's copies go out before the preparation below (its keys are older than
         * the new one, but for the one the patch adds) */
        int k_lo, k_hi;
        attn_split_keys(kv_len, n_split, split0, &k_lo, &k_hi);
        if (k_lo < k_hi) {
            load_tile(k_lo, k_hi, 0);
            pending = true;
        }
        bool live = false, holder = false; /* keys to attend to; the new key among them */
        for (int sp = split0; sp < split_end; sp++) {
            int lo, hi;
            attn_split_keys(kv_len, n_split, sp, &lo, &hi);
            live |= lo < hi;
            holder |= lo <= p_new && p_new < hi;
        }
        if (live)
            fl_prepare<D, NW>(qg, s, tl.t0, g, group, nh, kvh, layer_ord, qscale, p_new, holder, fz, Qs, rot_s, kv_new);
        __syncthreads(); /* Q rows and kv_new are the block's */
        if (pending) kv_patch(k_lo, k_hi, 0);
    }
    for (int split = split0; split < split_end; split++) {
        int k_lo, k_hi;
        attn_split_keys(kv_len, n_split, split, &k_lo, &k_hi);
        float O[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) O[j][0] = O[j][1] = O[j][2] = O[j][3] = 0.0f;
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

        if (k_lo < k_hi && !pending) {
            load_tile(k_lo, k_hi, buf);
            kv_patch(k_lo, k_hi, buf);
        }
        pending = false;
        for (int kb = k_lo; kb < k_hi; kb += FK) {
            /* the next tile: this split's, else the next split's first (splits of one
             * length are non-empty up to a count, then empty: only split + 1 can follow) */
            int next_kb = kb + FK, next_hi = k_hi;
            if (next_kb >= k_hi && split + 1 < split_end) {
                attn_split_keys(kv_len, n_split, split + 1, &next_kb, &next_hi);
                pending = next_kb < next_hi;
            }
            if (next_kb < next_hi) {
                load_tile(next_kb, next_hi, buf ^ 1);
                kv_patch(next_kb, next_hi, buf ^ 1);
                asm volatile("cp.async.wait_group 1;\n" ::);
            } else {
                asm volatile("cp.async.wait_group 0;\n" ::);
            }
            __syncthreads();
            if (!computes) { /* FUSED: warps 1..3 have no rows; they copied and wait */
                __syncthreads();
                buf ^= 1;
                continue;
            }
            const uint16_t *Kc = Ks + buf * FK * DS, *Vc = Vs + buf * FK * DS;
            float S[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++) S[j][0] = S[j][1] = S[j][2] = S[j][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                uint32_t a0, a1, a2, a3;
                f_ldsm4(Qs + (warp * 16 + (lane & 15)) * DS + ks * 16 + (lane >> 4) * 8, a0, a1, a2, a3);
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    uint32_t b0, b1, b2, b3;
                    f_ldsm4(Kc + (p * 16 + (lane & 7) + (lane >> 4) * 8) * DS + ks * 16 + ((lane >> 3) & 1) * 8, b0, b1, b2, b3);
                    f_mma(S[2 * p], a0, a1, a2, a3, b0, b1);
                    f_mma(S[2 * p + 1], a0, a1, a2, a3, b2, b3);
                }
            }
            /* mask, online softmax (rows r0: S[j][0..1], r1: S[j][2..3]) */
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = kb + 8 * j + 2 * (lane & 3) + e;
                    const bool in = key < k_hi;
                    if (!in || key > p0) S[j][e] = -INFINITY;
                    if (!in || key > p1) S[j][2 + e] = -INFINITY;
                    mx0 = fmaxf(mx0, S[j][e]);
                    mx1 = fmaxf(mx1, S[j][2 + e]);
                }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
            const float c0 = mn0 == -INFINITY ? 1.0f : exp2f(m0 - mn0);
            const float c1 = mn1 == -INFINITY ? 1.0f : exp2f(m1 - mn1);
            m0 = mn0;
            m1 = mn1;
            float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    S[j][e] = S[j][e] == -INFINITY ? 0.0f : exp2f(S[j][e] - mn0);
                    S[j][2 + e] = S[j][2 + e] == -INFINITY ? 0.0f : exp2f(S[j][2 + e] - mn1);
                    ps0 += S[j][e];
                    ps1 += S[j][2 + e];
                }
            l0 = l0 * c0 + ps0;
            l1 = l1 * c1 + ps1;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                O[j][0] *= c0; O[j][1] *= c0;
                O[j][2] *= c1; O[j][3] *= c1;
            }
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const uint32_t a0 = pack_bf2(S[2 * c][0], S[2 * c][1]), a1 = pack_bf2(S[2 * c][2], S[2 * c][3]);
                const uint32_t a2 = pack_bf2(S[2 * c + 1][0], S[2 * c + 1][1]), a3 = pack_bf2(S[2 * c + 1][2], S[2 * c + 1][3]);
#pragma unroll
                for (int n2 = 0; n2 < D / 16; n2++) {
                    uint32_t b0, b1, b2, b3;
                    f_ldsm4t(Vc + (c * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DS + n2 * 16 + (lane >> 4) * 8, b0, b1, b2, b3);
                    f_mma(O[2 * n2], a0, a1, a2, a3, b0, b1);
                    f_mma(O[2 * n2 + 1], a0, a1, a2, a3, b2, b3);
                }
            }
            __syncthreads();
            buf ^= 1;
        }
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float LN2 = 0.6931471805599453f;
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++) {
            const int r = h2 ? r1 : r0;
            if (r >= nrows) continue;
            const int t = tl.t0 + r / group, h = g * group + r % group;
            float *o = FUSED ? pbuf + ((size_t)(split - split0) * nrows + r) * (D + 2)
                             : part + (((size_t)t * nh + h) * n_split + split) * (D + 2);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int d = 8 * j + 2 * (lane & 3);
                o[2 + d] = O[j][2 * h2];
                o[2 + d + 1] = O[j][2 * h2 + 1];
            }
            if ((lane & 3) == 0) {
                const float m = h2 ? m1 : m0;
                o[0] = m == -INFINITY ? -INFINITY : m * LN2;
                o[1] = h2 ? l1 : l0;
            }
        }
    }
    if constexpr (FUSED) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        /* The combine of attn_combine_kernel (cuda_attn.cu) over the cluster: split sp's
         * partial is in block sp / spb's shared memory, slot sp % spb; block `rank` combines
         * outputs [rank·chunk, (rank + 1)·chunk) of the tile's nrows × D, each as that kernel
         * does (max of m, then the splits in order, e and the sums by the same fmaf, the gate) */
        cg::cluster_group cl = cg::this_cluster();
        cl.sync(); /* every block's partials are written */
        const int C = (int)cl.num_blocks(), rank = (int)cl.block_rank();
        float *ml = reinterpret_cast<float *>(Ks); /* [n_split][nrows] (m, l), staged from the cluster */
        for (int i = tid; i < n_split * nrows; i += 128) {
            const int sp = i / nrows, r = i - sp * nrows;
            const float *src = cl.map_shared_rank(pbuf, sp / spb) + ((size_t)(sp % spb) * nrows + r) * (D + 2);
            ml[2 * i] = src[0];
            ml[2 * i + 1] = src[1];
        }
        __syncthreads();
        const int total = nrows * D, chunk = (total + C - 1) / C, o_end = min(total, (rank + 1) * chunk);
        for (int oi = rank * chunk + tid; oi < o_end; oi += 128) {
            const int r = oi / D, d = oi - r * D, t = tl.t0, h = g * group + r;
            const float gate = qg[(size_t)t * 2 * nh * D + (size_t)h * 2 * D + D + d];
            float M = -INFINITY;
            for (int sp = 0; sp < n_split; sp++) M = fmaxf(M, ml[2 * (sp * nrows + r)]);
            float L = 0.0f, acc = 0.0f;
            if (M != -INFINITY) {
                for (int s0 = 0; s0 < n_split; s0 += FL_COMBINE_BATCH) {
                    float v[FL_COMBINE_BATCH];
#pragma unroll
                    for (int j = 0; j < FL_COMBINE_BATCH; j++) {
                        const int sp = s0 + j;
                        v[j] = sp < n_split
                                   ? cl.map_shared_rank(pbuf, sp / spb)[((size_t)(sp % spb) * nrows + r) * (D + 2) + 2 + d]
                                   : 0.0f;
                    }
#pragma unroll
                    for (int j = 0; j < FL_COMBINE_BATCH; j++) {
                        const int sp = s0 + j;
                        const float ms = sp < n_split ? ml[2 * (sp * nrows + r)] : -INFINITY;
                        if (sp < n_split && ms != -INFINITY) {
                            const float e = __expf(ms - M);
                            L = fmaf(e, ml[2 * (sp * nrows + r) + 1], L);
                            acc = fmaf(e, v[j], acc);
                        }
                    }
                }
            }
            const float a = L > 0.0f ? acc / L : 0.0f;
            fz.out[(size_t)t * nh * D + (size_t)h * D + d] = f2bf(a * sigm(gate));
        }
        cl.sync(); /* this block's partials stay until every block of the cluster has read them */
#else
        __trap(); /* never launched: fl_cluster_max is 0 before sm_90 */
#endif
    }
}

static size_t flash_smem(int D) { return (size_t)(FQ + 4 * FK) * (D + 8) * 2; }
/* + the fused form's rotation scratch (4 warps × D fp32) and new K/V row (2 × D bf16) */
static size_t flash_fused_smem(int D) { return flash_smem(D) + (size_t)4 * D * 4 + (size_t)2 * D * 2; }

/* Multiprocessors (cuda_flash_init), and splits a block forced by the tests (0: chosen). */
static int fl_sms = 132, fl_spb_forced = 0;
extern "C" void cuda_flash_force_spb(int spb) { fl_spb_forced = spb > 0 ? spb : 0; }

/* The fused decode form: the largest cluster its launch may use per head dim (64, 128, 256;
 * 16 where the device can hold one of 16 such blocks, else 8; 0 before sm_90, before that
 * dim's init or when the query failed), whether it is on (ORCHID_ATTN_FUSED=1, read at
 * init; tests force it either way: -1 = not forced). */
static int fl_cluster_max[3] = {0, 0, 0}, fl_fused_env = 0, fl_fused_forced = -1;
static int fl_dix(int D) { return D == 64 ? 0 : D == 128 ? 1 : 2; }
extern "C" void cuda_attn_force_fused(int on) { fl_fused_forced = on < 0 ? -1 : on ? 1 : 0; }

/* Splits a block: as many as keep about two blocks an SM busy (two fit by shared memory),
 * one where the launch has no more blocks than that (batch-1 decode: 2 KV heads × 16
 * splits at context 512; prefill: one split). ORCHID_ATTN_SPB overrides (A/B). */
static int fl_spb(int n_blocks, int n_split) {
    static int env = -1;
    if (env < 0) {
        const char *v = getenv("ORCHID_ATTN_SPB");
        env = v && *v ? atoi(v) : 0;
    }
    int spb = fl_spb_forced ? fl_spb_forced : env > 0 ? env : n_blocks / (2 * fl_sms);
    if (spb < 1) spb = 1;
    return spb < n_split ? spb : n_split;
}

template <int D>
static cudaError_t fl_set_attrs(int *cluster_max) {
    cudaError_t e = cudaFuncSetAttribute(flash_kernel<D, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)flash_smem(D));
    if (e != cudaSuccess) return e;
    *cluster_max = 0;
    cuda_caps caps;
    if (device_caps(&caps) != cudaSuccess || caps.major < 9) return cudaSuccess;
    /* the fused form: failures here only leave it off (the plain form serves) */
    const int smem = (int)flash_fused_smem(D);
    if (cudaFuncSetAttribute(flash_kernel<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
        cudaFuncSetAttribute(flash_kernel<D, true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
        cudaGetLastError();
        return cudaSuccess;
    }
    for (int C = 16; C >= 8; C /= 2) {
        launch_cfg cl(dim3(1, C), dim3(128), smem, 0, false, 1, C);
        if (cl.max_active_clusters(flash_kernel<D, true>) > 0) {
            *cluster_max = C;
            break;
        }
    }
    return cudaSuccess;
}

extern "C" int cuda_flash_init(int D, char *err, size_t errlen) {
    cuda_caps caps;
    fl_sms = device_caps(&caps) == cudaSuccess && caps.sms > 0 ? caps.sms : 132;
    (void)fl_spb(0, 1); /* reads the environment here, outside any graph capture */
    const char *fv = getenv("ORCHID_ATTN_FUSED");
    fl_fused_env = fv && *fv && atoi(fv) > 0;
    cudaError_t e;
    if (D == 256) e = fl_set_attrs<256>(&fl_cluster_max[fl_dix(D)]);
    else if (D == 128) e = fl_set_attrs<128>(&fl_cluster_max[fl_dix(D)]);
    else if (D == 64) e = fl_set_attrs<64>(&fl_cluster_max[fl_dix(D)]);
    else return 0; /* other head dims use the scalar kernel */
    if (e != cudaSuccess)
        return errorf(err, errlen, ST_DEVICE, "flash attention: cudaFuncSetAttribute(%d B) failed: %s", (int)flash_smem(D),
                      cudaGetErrorString(e));
    return 0;
}

/* Returns 1 when the tensor-core kernel handles this shape (then it was launched), 0 to fall back. */
extern "C" int cuda_flash_attention(const struct cuda_ctx *c, const float *qg, const int32_t *pos,
                                    const struct cuda_seq *seqs, const struct cuda_attn_tile *tiles, int n_tiles,
                                    int n_split, int layer_ord, int n_heads, int kv_heads, int D, float *part, int *launched) {
    *launched = 0;
    const int group = n_heads / kv_heads;
    if (group * CUDA_ATTN_QT > FQ || (D != 64 && D != 128 && D != 256)) return 0;
    const int spb = fl_spb(n_tiles * kv_heads * n_split, n_split);
    const dim3 grid(n_tiles * kv_heads, (n_split + spb - 1) / spb);
    const size_t smem = flash_smem(D);
    void (*kern)(const float *, const int32_t *, const cuda_seq *, const cuda_attn_tile *, int, int, int, int, int, float *,
                 fl_fused) = D == 256 ? flash_kernel<256, false> : D == 128 ? flash_kernel<128, false> : flash_kernel<64, false>;
    *launched = 1;
    /* without the PDL attribute: see launch_attn in cuda_attn.cu */
    LAUNCH_CHECK_RC(c, launch_k_pdl(false, kern, grid, dim3(128), smem, cstream(c), qg, pos, seqs, tiles, layer_ord, n_heads,
                                    kv_heads, n_split, spb, part, fl_fused{}),
                    "flash_attention");
}

/* The fused form's splits a block for n_split splits over at most fl_cluster_max blocks;
 * 0 when it cannot serve the shape (off, no clusters, more than 16 q heads a KV head, a head
 * dim without a tensor-core instance, or more splits a block than the Q tile's free rows hold). */
static int fl_fused_spb(int n_split, int n_heads, int kv_heads, int D) {
    const bool on = fl_fused_forced >= 0 ? fl_fused_forced > 0 : fl_fused_env;
    if (!on || (D != 64 && D != 128 && D != 256) || kv_heads <= 0 || n_heads % kv_heads || n_split < 1) return 0;
    const int group = n_heads / kv_heads, cmax = fl_cluster_max[fl_dix(D)];
    if (!cmax || group > FL_FQ_USED) return 0;
    const int spb = (n_split + cmax - 1) / cmax;
    const int slots = (FQ - FL_FQ_USED) * (D + 8) * 2 / (group * (D + 2) * 4);
    return spb <= slots ? spb : 0;
}

/* ... and only while its grid is one wave at two blocks an SM: beyond that the plain form's
 * several splits a block (fl_spb) is what a large batch needs (trap 26), and the fused
 * form's blocks are as many as its clusters are wide. */
extern "C" int cuda_attention_fused_ok(int T, int n_tiles, int n_split, int n_heads, int kv_heads, int D) {
    const int spb = T >= 1 && n_tiles == T ? fl_fused_spb(n_split, n_heads, kv_heads, D) : 0;
    return spb > 0 && (long)n_tiles * kv_heads * ((n_split + spb - 1) / spb) <= 2L * fl_sms;
}

extern "C" int cuda_attention_fused(const struct cuda_ctx *c, const float *qg, const float *k, const float *v,
                                    const float *q_norm, const float *k_norm, const int32_t *pos,
                                    const struct cuda_seq *seqs, const struct cuda_attn_tile *tiles, int n_tiles,
                                    int n_split, int layer_ord, int T, int n_heads, int kv_heads, int D, int rot,
                                    float theta, float eps, uint16_t *out) {
    if (!cuda_attention_fused_ok(T, n_tiles, n_split, n_heads, kv_heads, D))
        return errorf(c->err, c->errlen, ST_UNSUPPORTED,
                      "fused attention: not for %d tokens in %d tiles, %d splits, %d heads over %d, head_dim %d", T,
                      n_tiles, n_split, n_heads, kv_heads, D);
    if (rot < 2 || rot > D || rot % 2)
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "fused attention: rotary_dim %d of head_dim %d", rot, D);
    const int spb = fl_fused_spb(n_split, n_heads, kv_heads, D), C = (n_split + spb - 1) / spb;
    void (*kern)(const float *, const int32_t *, const cuda_seq *, const cuda_attn_tile *, int, int, int, int, int, float *,
                 fl_fused) = D == 256 ? flash_kernel<256, true> : D == 128 ? flash_kernel<128, true> : flash_kernel<64, true>;
    /* without PDL, as the plain form (launch_attn in cuda_attn.cu) */
    launch_cfg cl(dim3(n_tiles * kv_heads, C), dim3(128), flash_fused_smem(D), cstream(c), false, 1, C);
    const fl_fused fz = {k, v, q_norm, k_norm, rot, theta, eps, out};
    LAUNCH_CHECK_RC(c, cl.launch(kern, qg, pos, seqs, tiles, layer_ord, n_heads, kv_heads, n_split, spb, (float *)NULL, fz),
                    "attention_fused");
}

CUDA_TRACE_TU(flash)
