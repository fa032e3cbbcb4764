// cuda/cuda_gdn_chunk.cu — the Gated DeltaNet recurrence of prefill runs in chunks of 64
// tokens on tensor cores (the WY / chunked form of docs/../MODEL.md §1.5, HF's
// torch_chunk_gated_delta_rule), for Dk = 128 and value rows in blocks of 64.
//
// Why: the per-token scan (cuda_gdn_prefill.cu) does ~64 k fp32 FMAs a token and head in
// a chain that cannot leave the CUDA cores: 732 µs a GDN layer for a pack of 8 × 512 tokens
// on the H100, ~21 % of the pack (docs/PERFORMANCE.md, session 27). In chunks the token
// chain becomes small matrix products:
//
//   per chunk of C = 64 tokens, γ_t = Σ_{i≤t} log α_i, e(t,j) = exp(γ_t − γ_j) (t ≥ j),
//   A[t][j] = β_t e(t,j) k_t·k_j (j < t),  P[t][j] = e(t,j) q_t·k_j (j ≤ t),
//   Z  = β ⊙ (V − e^γ ⊙ (K Sᵀ)),  (I + A) V' = Z   (blocked forward substitution in fp32: V' holds
//        the chunk's δ_t = β_t (v_t − S_t⁻ k_t); HF's W = T β e^γ K and U = T β V, never formed),
//   O  = e^γ ⊙ (Q Sᵀ) + P V',
//   S ← e^{γ_63} S + V'ᵀ (e^{γ_63 − γ} ⊙ K).
//
// Precision: every product runs on mma.sync bf16 with each fp32 operand split in two bf16
// halves (x = hi + lo, hi = bf16(x), lo = bf16(x − hi)) and three products hi·hi + hi·lo +
// lo·hi accumulated in fp32 — ~2⁻¹⁶ relative a product, where one bf16 pass would give
// 2⁻⁸; the substitution runs in fp32 FMAs. A numpy model of exactly this (600 tokens,
// decays from 0.99 to 1e-28) met the sequential fp32 recurrence at 4–7e-6 relative in y and
// the state; the GPU test holds this form to the CPU reference at 1e-4, as the other forms.
// Its sums are in another order than the per-token scan's: other bits, still independent
// of what else is packed (a block sees only its own sequence's tokens), but dependent on
// where the prefill call starts (chunks count from the call's first token).
//
// Block = 256 threads over R = 64 value rows of one head of one sequence (grid: heads × row
// blocks, sequences); the state's R × 128 slice lives in the mma accumulators of the S
// update (R / 2 floats a thread) for the whole run and, split, in shared memory as the B
// operand of the next chunk's products. ~209 KB of shared memory: one block an SM.
// A lone long sequence (a prompt prefilled alone) gives R = 64 only 2 blocks a head, 64 for
// the 32 heads, half the card's 132 SMs, each walking every chunk in a chain (H100, session
// 40: 1,069 µs a GDN layer for one 4,096-token prompt, 27 % of its prefill); where the
// R = 64 grid fills at most half the SMs, blocks take R = 32 rows (twice the blocks; the
// per-head work — K, Q planes, A, P, the solve's chain — repeated in each, the per-row work
// halved). A value row's arithmetic is the same in both (its own Z, solve column, O and
// state row, k in the same order): the same bits, which the GPU test checks.
#include <math.h>

#include "cuda/cuda_internal.h"
#include "cuda/cuda_mma.h"

#define GC_C 64    /* tokens a chunk */
#define GC_DK 128  /* key dim this form takes */
#define GC_R 64    /* value rows a block (R = 32: a lone sequence's form) */
#define GC_THREADS 256
#define GC_LD 136  /* u16 row stride of the [·][128] planes: rows 4 banks apart, fragment loads conflict-free */
#define GC_LDC 72  /* u16 row stride of the [·][64] planes (the same property) */
#define GC_LDF 68  /* float row stride of the fp32 [64][64] arrays */

/* Shared memory of a block. Planes are [hi, lo] bf16 pairs of an fp32 matrix. 214,016
 * bytes (the H100 / H200 give a block 227 KB). */
template <int R>
struct gc_smem {
    uint16_t k[2][GC_C][GC_LD];    /* K [t][d] */
    uint16_t q[2][GC_C][GC_LD];    /* Q [t][d] */
    uint16_t kt[2][GC_DK][GC_LDC]; /* (e^{γ_63 − γ} ⊙ K)ᵀ [d][j] */
    uint16_t s[2][R][GC_LD];       /* S [r][d] at the chunk's start */
    uint16_t p[2][GC_C][GC_LDC];   /* P [t][j] */
    uint16_t vn[2][R][GC_LDC];     /* V'ᵀ [r][j] */
    float a[GC_C][GC_LDF];         /* A [t][j] (fp32, strictly lower) */
    float u[GC_C][GC_LDF];         /* v [t][r], then Z */
    float beta[GC_C], eg[GC_C], gam[GC_C], ec[GC_C]; /* β_t, e^{γ_t}, γ_t, e^{γ_63 − γ_t} */
};

__device__ __forceinline__ uint32_t gc_ld32(const uint16_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

/* x = hi + lo in bf16 halves (hi rounded to nearest, lo the rounded remainder). */
__device__ __forceinline__ void gc_split(float x, uint16_t &hi, uint16_t &lo) {
    hi = f2bf(x);
    lo = f2bf(x - bf(hi));
}

/* Four consecutive values into both planes (8-byte stores). */
__device__ __forceinline__ void gc_split4(float4 v, uint16_t *hi, uint16_t *lo) {
    uint16_t h[4], l[4];
    gc_split(v.x, h[0], l[0]); gc_split(v.y, h[1], l[1]); gc_split(v.z, h[2], l[2]); gc_split(v.w, h[3], l[3]);
    *reinterpret_cast<uint2 *>(hi) = make_uint2(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16);
    *reinterpret_cast<uint2 *>(lo) = make_uint2(l[0] | (uint32_t)l[1] << 16, l[2] | (uint32_t)l[3] << 16);
}

/* A fragment (16 × 16 at rows m0, columns k0) of both halves of plane X [m][k], row stride LD. */
template <int LD>
__device__ __forceinline__ void gc_afrag_ld(const uint16_t *hi, const uint16_t *lo, int m0, int k0, int gq, int c, uint32_t (&ah)[4],
                                            uint32_t (&al)[4]) {
    const int o = (m0 + gq) * LD + k0 + 2 * c;
    ah[0] = gc_ld32(hi + o); ah[1] = gc_ld32(hi + o + 8 * LD); ah[2] = gc_ld32(hi + o + 8); ah[3] = gc_ld32(hi + o + 8 * LD + 8);
    al[0] = gc_ld32(lo + o); al[1] = gc_ld32(lo + o + 8 * LD); al[2] = gc_ld32(lo + o + 8); al[3] = gc_ld32(lo + o + 8 * LD + 8);
}
/* B fragment (k16 × n8 at columns n0, k0) of both halves of plane Y [n][k]. */
template <int LD>
__device__ __forceinline__ void gc_bfrag_ld(const uint16_t *hi, const uint16_t *lo, int n0, int k0, int gq, int c, uint32_t (&bh)[2],
                                            uint32_t (&bl)[2]) {
    const int o = (n0 + gq) * LD + k0 + 2 * c;
    bh[0] = gc_ld32(hi + o); bh[1] = gc_ld32(hi + o + 8);
    bl[0] = gc_ld32(lo + o); bl[1] = gc_ld32(lo + o + 8);
}
/* a·b over the split halves: hi·hi into d, the two small products into lo (two chains, so
 * a k-step's three mma do not wait on each other; lo is added at the end: gc_product). */
__device__ __forceinline__ void gc_mma3(float (&d)[4], float (&lo)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                        const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
    mma16816(lo, al, bh[0], bh[1]);
    mma16816(d, ah, bh[0], bh[1]);
    mma16816(lo, ah, bl[0], bl[1]);
}
template <int N>
__device__ __forceinline__ void gc_add_lo(float (&d)[N][4], const float (&lo)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) d[j][e] += lo[j][e];
}

/* acc[j] += A · Bᵀ over k in [0, k_end) for a warp's NT tiles of 16 rows (m0) × 8 columns
 * (8·(nj0 + j)): A from the planes ahi / alo [m][k], B from bhi / blo [n][k], both of row
 * stride LD; the split products' small terms in their own chain, added at the end (gc_mma3). */
template <int LD, int NT>
__device__ __forceinline__ void gc_product(const uint16_t *ahi, const uint16_t *alo, const uint16_t *bhi, const uint16_t *blo,
                                           int m0, int nj0, int k_end, int gq, int c, float (&acc)[NT][4]) {
    float lo[NT][4] = {};
#pragma unroll
    for (int k0 = 0; k0 < k_end; k0 += 16) {
        uint32_t ah[4], al[4];
        gc_afrag_ld<LD>(ahi, alo, m0, k0, gq, c, ah, al);
#pragma unroll
        for (int j = 0; j < NT; j++) {
            uint32_t bh[2], bl[2];
            gc_bfrag_ld<LD>(bhi, blo, 8 * (nj0 + j), k0, gq, c, bh, bl);
            gc_mma3(acc[j], lo[j], ah, al, bh, bl);
        }
    }
    gc_add_lo(acc, lo);
}

/* The S planes from the state accumulators: this warp's rows 16·mi + gq (+8), columns
 * 8·(nj0 + j) + 2c (+1). */
template <int R, int N>
__device__ __forceinline__ void gc_put_s(gc_smem<R> &sm, const float (&st)[N][4], int mi, int nj0, int gq, int c) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = 16 * mi + gq + 8 * (e >> 1), d = 8 * (nj0 + j) + 2 * c + (e & 1);
            gc_split(st[j][e], sm.s[0][r][d], sm.s[1][r][d]);
        }
}

/* L2 prefetch of the next chunk's rows (PF): a chunk's first phase waits on its q / k / v /
 * gate loads — one round trip, from DRAM for a long prompt (the conv wrote ~130 MB for 4,096
 * tokens, more than the L2 keeps) — inside the ~3.8 µs of loads and planes a chunk (session
 * 31's phase clock). With PF every warp asks the L2 for the next chunk's lines of exactly the
 * loads it will issue (prefetch.global.L2: no registers, no shared memory, nothing waits on
 * it) right after issuing this chunk's, so they arrive during this chunk's products. Same
 * arithmetic, same bits (the GPU test compares the two bitwise). Measured (H100, session 44,
 * three rounds): a lone 4,096-token prompt's scan (R = 32) 840–842 → 818–830 µs a GDN layer
 * (predicted ~790). On by default in the R = 32 form, where it was measured
 * (ORCHID_NO_GC_PREFETCH=1: off, the A/B); ORCHID_GC_PREFETCH=1 also takes it into the
 * R = 64 form (packs of prompts: unmeasured). */
__device__ __forceinline__ void gc_prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

template <int R, bool PF>
static __global__ void __launch_bounds__(GC_THREADS, 1)
    gdn_chunk_kernel(const float *qk, const float *conv_out, const float *gates, const cuda_seq *seqs, int layer_ord, int T, int Hk,
                     int Hv, int Dv, float *y) {
    TRACE_KERNEL();
    extern __shared__ __align__(16) unsigned char gc_raw[];
    gc_smem<R> &sm = *reinterpret_cast<gc_smem<R> *>(gc_raw);
    const int rblocks = Dv / R, h = blockIdx.x / rblocks, rb = blockIdx.x % rblocks, kh = h / (Hv / Hk);
    const cuda_seq s = seqs[blockIdx.y];
    if (s.t1 - s.t0 < CUDA_GDN_CHUNK_MIN) return; /* the scan's sequence (cuda_gdn_scan_prefill) */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, c = lane & 3;
    const int key_dim = Hk * GC_DK, C = 2 * key_dim + Hv * Dv;
    const size_t qk_row = (size_t)Hk * 2 * GC_DK; /* floats a token in qk [T][Hk][2][Dk] */
    float *S = s.state + (((size_t)layer_ord * Hv + h) * Dv + (size_t)rb * R) * GC_DK;

    /* the state slice in the S update's accumulators: m-tile smi (rows), n-tiles snj0 ..
     * + SNT − 1 (R / 16 m-tiles × 16 n-tiles over the 8 warps) */
    constexpr int SNT = R / 8, SWM = 16 / SNT; /* n-tiles a warp; warps an m-tile */
    const int smi = warp / SWM, snj0 = SNT * (warp % SWM);
    float st[SNT][4];
#pragma unroll
    for (int j = 0; j < SNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            const int r = 16 * smi + gq + 4 * e, d = 8 * (snj0 + j) + 2 * c;
            const float2 v2 = *reinterpret_cast<const float2 *>(S + (size_t)r * GC_DK + d);
            st[j][e] = v2.x;
            st[j][e + 1] = v2.y;
        }
    gc_put_s(sm, st, smi, snj0, gq, c);

    /* the products' tiles: Z and O give warp w m-tile w >> 1 (tokens) and n-tiles ONT·(w & 1)
     * .. + ONT − 1 (value rows) */
    constexpr int ONT = R / 16;
    const int omi = warp >> 1, onj0 = ONT * (warp & 1);
    trace_clock clk; /* trace builds: the phases' sums as marks 4..7 (tools/trace_report.py --phases gdn_scan) */
    clk.start();
    for (int c0 = s.t0; c0 < s.t1; c0 += GC_C) {
        const int n = min(GC_C, s.t1 - c0);
        /* 1. the chunk's global reads issued together (the gates, this thread's q / k / v
         * float4s: one round trip, not one a loop step), then γ in every warp (lane: tokens
         * 2·lane, 2·lane + 1; padding α = 1, β = 0), the planes, and K̃ᵀ's pieces (k again) */
        float2 gt[2];
#pragma unroll
        for (int e = 0; e < 2; e++)
            gt[e] = 2 * lane + e < n ? *reinterpret_cast<const float2 *>(gates + ((size_t)h * T + c0 + 2 * lane + e) * 2)
                                     : make_float2(1.0f, 0.0f);
        constexpr int NW = GC_THREADS / 32;
        float4 q4[GC_C / NW], k4[GC_C / NW], v4[GC_C * (R / 4) / GC_THREADS];
        const float4 z4 = make_float4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < GC_C / NW; i++) { /* q, k: warp w takes tokens w + 8i; lane the columns 4·lane .. + 3 */
            const int t = warp + NW * i;
            const float *row = qk + (size_t)(c0 + t) * qk_row + (size_t)kh * 2 * GC_DK + 4 * lane;
            q4[i] = t < n ? __ldg(reinterpret_cast<const float4 *>(row)) : z4;
            k4[i] = t < n ? __ldg(reinterpret_cast<const float4 *>(row + GC_DK)) : z4;
        }
#pragma unroll
        for (int i = 0; i < GC_C * (R / 4) / GC_THREADS; i++) {
            const int ii = tid + GC_THREADS * i, t = ii / (R / 4), r = 4 * (ii % (R / 4));
            v4[i] = t < n ? __ldg(reinterpret_cast<const float4 *>(conv_out + (size_t)(c0 + t) * C + 2 * key_dim + (size_t)h * Dv +
                                                                   (size_t)rb * R + r))
                          : z4;
        }
        if constexpr (PF) { /* the next chunk's lines of the same loads (q, k, v; gates: warp 0) */
            const int c1 = c0 + GC_C, n1 = min(GC_C, s.t1 - c1);
            if (n1 > 0) {
#pragma unroll
                for (int i = 0; i < GC_C / NW; i++) {
                    const int t = warp + NW * i;
                    const float *row = qk + (size_t)(c1 + t) * qk_row + (size_t)kh * 2 * GC_DK + 4 * lane;
                    if (t < n1) {
                        gc_prefetch_l2(row);
                        gc_prefetch_l2(row + GC_DK);
                    }
                }
#pragma unroll
                for (int i = 0; i < GC_C * (R / 4) / GC_THREADS; i++) {
                    const int ii = tid + GC_THREADS * i, t = ii / (R / 4), r = 4 * (ii % (R / 4));
                    if (t < n1) gc_prefetch_l2(conv_out + (size_t)(c1 + t) * C + 2 * key_dim + (size_t)h * Dv + (size_t)rb * R + r);
                }
                if (warp == 0 && 2 * lane < n1) gc_prefetch_l2(gates + ((size_t)h * T + c1 + 2 * lane) * 2);
            }
        }
        float gl[2];
#pragma unroll
        for (int e = 0; e < 2; e++) gl[e] = 2 * lane + e < n ? fmaxf(logf(gt[e].x), -80.0f) : 0.0f; /* α = 0: e^-80, not −∞ − −∞ */
        float incl = gl[0] + gl[1];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float u = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += u;
        }
        float excl = __shfl_up_sync(0xffffffffu, incl, 1);
        if (lane == 0) excl = 0.0f;
        const float g0 = excl + gl[0], g1 = g0 + gl[1];
        const float glast = __shfl_sync(0xffffffffu, g1, 31);
        const float ec0 = expf(glast - g0), ec1 = expf(glast - g1);
        if (warp == 0) {
            sm.gam[2 * lane] = g0; sm.gam[2 * lane + 1] = g1;
            sm.eg[2 * lane] = expf(g0); sm.eg[2 * lane + 1] = expf(g1);
            sm.ec[2 * lane] = ec0; sm.ec[2 * lane + 1] = ec1;
            sm.beta[2 * lane] = gt[0].y; sm.beta[2 * lane + 1] = gt[1].y;
        }
#pragma unroll
        for (int i = 0; i < GC_C / NW; i++) {
            const int t = warp + NW * i;
            gc_split4(q4[i], &sm.q[0][t][4 * lane], &sm.q[1][t][4 * lane]);
            gc_split4(k4[i], &sm.k[0][t][4 * lane], &sm.k[1][t][4 * lane]);
        }
        float4 t4[2 * (GC_DK / 4) / NW]; /* K̃ᵀ: lane = token (halves of 32), so its stores are consecutive (L1 hits: k again) */
#pragma unroll
        for (int i = 0; i < 2 * (GC_DK / 4) / NW; i++) {
            const int ii = warp + NW * i, t = 32 * (ii & 1) + lane, d = 4 * (ii >> 1);
            t4[i] = t < n ? __ldg(reinterpret_cast<const float4 *>(qk + (size_t)(c0 + t) * qk_row + (size_t)kh * 2 * GC_DK + GC_DK + d))
                          : z4;
        }
#pragma unroll
        for (int i = 0; i < 2 * (GC_DK / 4) / NW; i++) {
            const int ii = warp + NW * i, t = 32 * (ii & 1) + lane, d = 4 * (ii >> 1);
            const float ce = __shfl_sync(0xffffffffu, ec0, t >> 1), co = __shfl_sync(0xffffffffu, ec1, t >> 1);
            const float sc = (t & 1) ? co : ce; /* token t's e^{γ_63 − γ_t}: lane t / 2 holds it */
            const float kv[4] = {t4[i].x, t4[i].y, t4[i].z, t4[i].w};
#pragma unroll
            for (int e = 0; e < 4; e++) gc_split(sc * kv[e], sm.kt[0][d + e][t], sm.kt[1][d + e][t]);
        }
#pragma unroll
        for (int i = 0; i < GC_C * (R / 4) / GC_THREADS; i++) {
            const int ii = tid + GC_THREADS * i, t = ii / (R / 4), r = 4 * (ii % (R / 4));
            *reinterpret_cast<float4 *>(&sm.u[t][r]) = v4[i];
        }
        __syncthreads();
        clk.lap(0); /* the chunk's loads and planes */

        /* 2. A = β e (K Kᵀ) strictly lower (fp32) and P = e (Q Kᵀ) lower (planes): the 20 lower
         * 16 × 8 tiles (mi, nj ≤ 2·mi + 1), both products of a tile in one job (one B fragment),
         * each split product in its own accumulator: six independent mma chains of 8 */
        for (int job = warp; job < 20; job += NW) {
            const int mi = job < 2 ? 0 : job < 6 ? 1 : job < 12 ? 2 : 3;
            const int nj = job - (mi == 0 ? 0 : mi == 1 ? 2 : mi == 2 ? 6 : 12);
            float acc[2][3][4] = {};
#pragma unroll
            for (int k0 = 0; k0 < GC_DK; k0 += 16) {
                uint32_t kh4[4], kl4[4], qh4[4], ql4[4], bh[2], bl[2];
                gc_afrag_ld<GC_LD>(&sm.k[0][0][0], &sm.k[1][0][0], 16 * mi, k0, gq, c, kh4, kl4);
                gc_afrag_ld<GC_LD>(&sm.q[0][0][0], &sm.q[1][0][0], 16 * mi, k0, gq, c, qh4, ql4);
                gc_bfrag_ld<GC_LD>(&sm.k[0][0][0], &sm.k[1][0][0], 8 * nj, k0, gq, c, bh, bl);
                mma16816(acc[0][0], kh4, bh[0], bh[1]);
                mma16816(acc[0][1], kh4, bl[0], bl[1]);
                mma16816(acc[0][2], kl4, bh[0], bh[1]);
                mma16816(acc[1][0], qh4, bh[0], bh[1]);
                mma16816(acc[1][1], qh4, bl[0], bl[1]);
                mma16816(acc[1][2], ql4, bh[0], bh[1]);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = 16 * mi + gq + 4 * (e & 2), j = 8 * nj + 2 * c + (e & 1);
                const float dec = j <= i ? expf(sm.gam[i] - sm.gam[j]) : 0.0f;
                const float kk = acc[0][0][e] + (acc[0][1][e] + acc[0][2][e]), qk_ = acc[1][0][e] + (acc[1][1][e] + acc[1][2][e]);
                sm.a[i][j] = j < i ? sm.beta[i] * dec * kk : 0.0f;
                gc_split(j <= i ? dec * qk_ : 0.0f, sm.p[0][i][j], sm.p[1][i][j]);
            }
        }
        __syncthreads();

        /* 3. Z = β ⊙ (V − e^γ ⊙ (K Sᵀ)) [t][r] over v, this lane's elements only: it needs
         * nothing of step 2 (the barrier above keeps the warps in step; dropping it, with
         * K̃ᵀ's planes moved into step 4, measured slower: docs/PERFORMANCE.md, session 31) */
        {
            float zacc[ONT][4] = {};
            gc_product<GC_LD>(&sm.k[0][0][0], &sm.k[1][0][0], &sm.s[0][0][0], &sm.s[1][0][0], 16 * omi, onj0, GC_DK, gq, c, zacc);
#pragma unroll
            for (int jj = 0; jj < ONT; jj++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = 16 * omi + gq + 4 * (e & 2), r = 8 * (onj0 + jj) + 2 * c + (e & 1);
                    sm.u[t][r] = sm.beta[t] * (sm.u[t][r] - sm.eg[t] * zacc[jj][e]);
                }
        }
        __syncthreads();
        clk.lap(1); /* A, P and Z */

        /* 4. (I + A) V' = Z in place over Z, by blocks of 16 rows: the rows of block b first lose
         * the finished blocks' terms (16 · R / 4 threads: a row and 4 columns each), then the
         * block is solved within itself (R threads, a column each: ≤ 15 terms a row) */
        constexpr int CG = R / 4; /* column groups of 4 */
#pragma unroll
        for (int b = 0; b < GC_C / 16; b++) {
            if (b > 0) {
                if (tid < 16 * CG) {
                    const int i = 16 * b + tid / CG, r = 4 * (tid % CG);
                    float4 acc = *reinterpret_cast<const float4 *>(&sm.u[i][r]);
#pragma unroll 4
                    for (int j = 0; j < 16 * b; j += 4) {
                        const float4 a4 = *reinterpret_cast<const float4 *>(&sm.a[i][j]);
                        const float av[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
                        for (int jj = 0; jj < 4; jj++) {
                            const float4 x4 = *reinterpret_cast<const float4 *>(&sm.u[j + jj][r]);
                            acc.x = fmaf(-av[jj], x4.x, acc.x);
                            acc.y = fmaf(-av[jj], x4.y, acc.y);
                            acc.z = fmaf(-av[jj], x4.z, acc.z);
                            acc.w = fmaf(-av[jj], x4.w, acc.w);
                        }
                    }
                    *reinterpret_cast<float4 *>(&sm.u[i][r]) = acc;
                }
                __syncthreads();
            }
            if (tid < R) {
                float x[16];
#pragma unroll
                for (int i = 0; i < 16; i++) x[i] = sm.u[16 * b + i][tid];
#pragma unroll
                for (int i = 1; i < 16; i++) {
                    float acc = x[i];
#pragma unroll
                    for (int j = 0; j < i; j++) acc = fmaf(-sm.a[16 * b + i][16 * b + j], x[j], acc);
                    x[i] = acc;
                }
#pragma unroll
                for (int i = 1; i < 16; i++) sm.u[16 * b + i][tid] = x[i];
            }
            __syncthreads();
        }
        /* V'ᵀ's planes: thread r = tid % R takes tokens TPT·(tid / R) .. + TPT − 1, two a store */
        {
            constexpr int TPT = GC_C * R / GC_THREADS;
            const int r = tid % R, t0 = TPT * (tid / R);
#pragma unroll
            for (int i = 0; i < TPT; i += 2) {
                uint16_t h0, l0, h1, l1;
                gc_split(sm.u[t0 + i][r], h0, l0);
                gc_split(sm.u[t0 + i + 1][r], h1, l1);
                *reinterpret_cast<uint32_t *>(&sm.vn[0][r][t0 + i]) = h0 | (uint32_t)h1 << 16;
                *reinterpret_cast<uint32_t *>(&sm.vn[1][r][t0 + i]) = l0 | (uint32_t)l1 << 16;
            }
        }
        __syncthreads();
        clk.lap(2); /* the solve and V'ᵀ's planes */

        /* 5. O = e^γ ⊙ (Q Sᵀ) + P V' → y (rows t < n) */
        {
            float oacc[ONT][4] = {};
            gc_product<GC_LD>(&sm.q[0][0][0], &sm.q[1][0][0], &sm.s[0][0][0], &sm.s[1][0][0], 16 * omi, onj0, GC_DK, gq, c, oacc);
            const float e0 = sm.eg[16 * omi + gq], e1 = sm.eg[16 * omi + gq + 8];
#pragma unroll
            for (int jj = 0; jj < ONT; jj++) {
                oacc[jj][0] *= e0; oacc[jj][1] *= e0; oacc[jj][2] *= e1; oacc[jj][3] *= e1;
            }
            /* j ≤ t: the k-steps up to the diagonal block, whose upper half is 0 in P */
            gc_product<GC_LDC>(&sm.p[0][0][0], &sm.p[1][0][0], &sm.vn[0][0][0], &sm.vn[1][0][0], 16 * omi, onj0, 16 * (omi + 1),
                               gq, c, oacc);
            float *yb = y + (size_t)h * Dv + (size_t)rb * R;
#pragma unroll
            for (int jj = 0; jj < ONT; jj++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int t = 16 * omi + gq + 4 * e, r = 8 * (onj0 + jj) + 2 * c;
                    if (t < n)
                        *reinterpret_cast<float2 *>(yb + (size_t)(c0 + t) * Hv * Dv + r) = make_float2(oacc[jj][e], oacc[jj][e + 1]);
                }
        }

        /* 6. S ← e^{γ_63} S + V'ᵀ K̃ (reads the V'ᵀ and K̃ᵀ planes only), then, once every warp is
         * past its reads of the S planes (4, 5), the planes of the new S */
        {
            const float dl = sm.eg[GC_C - 1];
#pragma unroll
            for (int j = 0; j < SNT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) st[j][e] *= dl;
            gc_product<GC_LDC>(&sm.vn[0][0][0], &sm.vn[1][0][0], &sm.kt[0][0][0], &sm.kt[1][0][0], 16 * smi, snj0, GC_C, gq, c, st);
        }
        __syncthreads();
        clk.lap(3); /* O and the S update's products */
        gc_put_s(sm, st, smi, snj0, gq, c);
        clk.lap(4);
    }
#pragma unroll
    for (int j = 0; j < SNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            const int r = 16 * smi + gq + 4 * e, d = 8 * (snj0 + j) + 2 * c;
            *reinterpret_cast<float2 *>(S + (size_t)r * GC_DK + d) = make_float2(st[j][e], st[j][e + 1]);
        }
    clk.finish(TRACE_START);
}

static bool gc_ok = false; /* the device gives a block the form's shared memory (cuda_gdn_chunk_init) */
static int gc_sms = 132;     /* multiprocessors: the choice of R */
static int gc_rows_forced = 0; /* cuda_gdn_chunk_force_rows: 32 or 64 (tests), 0: by the grid */
static bool gc_pf_all = false; /* ORCHID_GC_PREFETCH=1: the L2 prefetch form (PF) in both R forms */
static bool gc_pf_off = false; /* ORCHID_NO_GC_PREFETCH=1: in neither (the A/B; PF is R = 32's default) */
static int gc_pf_mode = 0;     /* cuda_gdn_chunk_force_prefetch: 1 on, -1 off, 0 the default and environment */
static long gc_pf_count = 0;   /* PF launches made (the GPU test asks) */
extern "C" void cuda_gdn_chunk_force_rows(int rows) { gc_rows_forced = rows == 32 || rows == 64 ? rows : 0; }
extern "C" void cuda_gdn_chunk_force_prefetch(int mode) { gc_pf_mode = mode; }
extern "C" long cuda_gdn_chunk_prefetch_launches(void) { return gc_pf_count; }

template <int R, bool PF>
static bool gc_attr() {
    return cudaFuncSetAttribute(gdn_chunk_kernel<R, PF>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(gc_smem<R>)) ==
           cudaSuccess;
}

/* Raises the kernel's shared-memory limit where the device has it (sm_90: 227 KB a block;
 * an A100's 163 KB does not hold the form, which then stays off: not an error). */
extern "C" void cuda_gdn_chunk_init(void) {
    gc_ok = gc_attr<64, false>() && gc_attr<32, false>() && gc_attr<64, true>() && gc_attr<32, true>();
    (void)cudaGetLastError(); /* a refused limit leaves no sticky error behind */
    gc_pf_all = env_flag("ORCHID_GC_PREFETCH");
    gc_pf_off = env_flag("ORCHID_NO_GC_PREFETCH");
    cuda_caps caps;
    if (device_caps(&caps) == cudaSuccess && caps.sms > 0) gc_sms = caps.sms;
}

extern "C" int cuda_gdn_chunk_supported(int Hk, int Hv, int Dk, int Dv) {
    return gc_ok && Dk == GC_DK && Hv % Hk == 0 && Dv % GC_R == 0;
}

template <int R, bool PF>
static void gc_launch(const struct cuda_ctx *c, const float *qk, const float *conv_out, const float *gates,
                      const struct cuda_seq *seqs, int n_seqs, int layer_ord, int T, int Hk, int Hv, int Dv, float *y) {
    gdn_chunk_kernel<R, PF><<<dim3(Hv * (Dv / R), n_seqs), GC_THREADS, sizeof(gc_smem<R>), cstream(c)>>>(
        qk, conv_out, gates, seqs, layer_ord, T, Hk, Hv, Dv, y);
}

/* n_long: the sequences of the launch that take this form (the others' blocks return at
 * once; -1: not counted); R = 32 where R = 64's blocks would fill at most half the SMs. */
extern "C" int cuda_gdn_chunk_scan(const struct cuda_ctx *c, const float *qk, const float *conv_out, const float *gates,
                                   const struct cuda_seq *seqs, int n_seqs, int n_long, int layer_ord, int T, int Hk, int Hv,
                                   int Dv, float *y) {
    const long longs = n_long < 0 ? n_seqs : n_long; /* -1: not counted */
    const int rows = gc_rows_forced ? gc_rows_forced : longs * Hv * (Dv / 64) * 2 <= gc_sms ? 32 : 64;
    const bool pf = gc_pf_mode > 0 || (gc_pf_mode == 0 && !gc_pf_off && (rows == 32 || gc_pf_all));
    gc_pf_count += pf;
    if (rows == 32) {
        if (pf) gc_launch<32, true>(c, qk, conv_out, gates, seqs, n_seqs, layer_ord, T, Hk, Hv, Dv, y);
        else gc_launch<32, false>(c, qk, conv_out, gates, seqs, n_seqs, layer_ord, T, Hk, Hv, Dv, y);
    } else {
        if (pf) gc_launch<64, true>(c, qk, conv_out, gates, seqs, n_seqs, layer_ord, T, Hk, Hv, Dv, y);
        else gc_launch<64, false>(c, qk, conv_out, gates, seqs, n_seqs, layer_ord, T, Hk, Hv, Dv, y);
    }
    LAUNCH_CHECK(c, "gdn_chunk_scan");
}

CUDA_TRACE_TU(gdn_chunk)
