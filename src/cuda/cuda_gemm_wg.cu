// cuda/cuda_gemm_wg.cu — the prefill GEMMs on Hopper's warpgroup tensor-core instruction
// (wgmma.mma_async, sm_90a): y[M, N] = x[M, K] · W[N, K]ᵀ with W MLX affine 4-bit, for the
// dense, SwiGLU and grouped (MoE) products of cuda_gemm.cu, same arguments, same outputs.
//
// Roles. The weights are wgmma's A operand, taken from registers: a block holds 128 weight
// rows, 64 a warpgroup (two warpgroups, 256 threads), and a thread dequantizes exactly the
// rows and k positions of its own A fragment (rows g and g + 8 of its warp's 16, k = 2t,
// 2t + 1, 2t + 8, 2t + 9 of each k16 step: byte t of each code word) from the staged codes,
// so the bf16 weights never pass through shared memory. The tokens are the B operand: 128
// token rows (a dense block's, or one route tile of 128 slots) × 64 k, one quantization
// group a stage, copied by cp.async into 128-byte rows in the 128-byte swizzle wgmma reads
// (16-byte chunk c of row n at chunk c ^ (n & 7)); the accumulator is 64 weight rows × 128
// tokens in fp32 registers, written out transposed (y[token, row]). A route tile of at most
// 64 slots issues wgmma with N = 64 (cuda_wgmma.h); 128-slot route tiles halve the
// dequantization a grouped product pays per token against 64-slot ones (H200, 8 × 512-token
// pack: grouped gate/up 520 → 423 µs, down 323 → 278 µs a layer).
//
// Numerics: w = bf16(s·q + b) in one fused bf16x2 fma (s, q, b exact in bf16, the product
// exact: the rounding of cuda_gemm.cu's fp32 fma + bf16 conversion whenever that fma is
// exact), products accumulated in fp32 over k in order. A row's outputs do not depend on
// the other rows of the batch (prefill packing relies on it: docs/ARCHITECTURE.md).
//
// Pipeline, per group kg (STAGES stages, copies kept STAGES − 2 groups ahead):
//   wait for stage kg's copies, fence them to the async proxy, block barrier;
//   issue group kg + STAGES − 2 into the stage group kg − 2 used (both warpgroups finished
//   it: each waited for its group kg − 2 at the end of step kg − 1, before this barrier);
//   dequantize group kg into this step's A registers (two sets, alternate steps: the set
//   of group kg − 2 is free by the same wait); four wgmma k16 steps; commit; wait until
//   at most this group is in flight.
// Codes are staged 48 bytes a row (32 + 16 pad: a warp's 16-byte reads of 8 rows touch
// distinct banks); scales and biases of the block's rows for all K come once, at the start.
//
// The copies a step issues are cheap by construction (Nsight Compute, H100, the grouped
// gate/up of an 8 × 512 pack: ~230 instructions a warp a group, ~80 of them the copies'
// address and predicate arithmetic that ptxas recomputed every step for want of registers,
// the issue slots then as busy as the tensor pipe): each token row's element offset is
// looked up once, at the start, into a 128-entry table in shared memory (a thread's four
// rows in one 16-byte read; a row past the tile's end names the tile's last row, and in a
// route tile copies zeros); the thread's shared addresses and sources are computed once and
// held (wg_keep); weight rows past N copy a real row's codes (their scales and biases are
// zero-filled, their outputs never stored). The wgmma descriptors are the ring's first plus
// each stage's offset. Loop of two groups: 466 → 320 instructions (dense), 481 → 360
// (grouped gate/up); pack of 8 × 512 97.7–98.7 → 93.0–95.4 ms (docs/PERFORMANCE.md, session 40).
#include "cuda/cuda_gemm.h"
#include "cuda/cuda_wgmma.h"

#define WG_THREADS 256
#define WG_BT 128     /* token rows a block (dense) or route tile (grouped) */
#define WG_BT_WIDE 256 /* token rows a block of the wide dense form (below) */
#define WG_ROWS 128   /* weight rows a block (64 a warpgroup) */
#define WG_CSTRIDE 48 /* bytes a staged codes row */

template <int STAGES, int BT = WG_BT>
struct wg_shape {
    static constexpr int act = BT * 128;               /* BT tokens × 64 bf16 */
    static constexpr int codes = WG_ROWS * WG_CSTRIDE; /* 6,144 */
    static constexpr int stage = act + codes;
    static constexpr int ring = STAGES * stage;
    static_assert(stage % 1024 == 0, "a stage keeps the next stage's token rows swizzle-aligned");
};
/* Scales and biases: [WG_ROWS][G + 8] bf16 each (the pad keeps 8 rows' reads on distinct
 * banks and rows 16-byte aligned for cp.async), then the token rows' element offsets:
 * int32 [32][BT / 32], entry (n & 31, n >> 5) for tile row n (thread tid's rows tid / 8 + 32 i). */
static inline size_t wg_smem_bytes(int ring, int K, int BT = WG_BT) {
    return 1024 + (size_t)ring + (size_t)WG_ROWS * (K / 64 + 8) * 4 + (size_t)BT * 4;
}

/* Two blocks an SM (4 stages, registers capped at 128: a few bytes spill) where the shared
 * memory allows it (K ≤ 2,048 on the H200), else one block of 5 stages: measured on the
 * H200 at 4,096 tokens, GDN in-projection 149 → 131 µs a call as two blocks, the K = 4,096
 * out-projection 261 µs as one block against 274 as the 4-stage form alone.
 * ORCHID_WG_ONE_BLOCK=1 keeps every product on the one-block form (A/B). */
#define WG_STAGES1 5
#define WG_STAGES2 4
#define WG_STAGES3 3 /* two blocks an SM for K = 4,096 too, copies one group ahead: H200 pack,
                       * GDN out-projection 262 → 199 µs, attention o 259 → 196 µs */

/* The wide dense form (on by default for K of 1,024..2,048, ORCHID_NO_WG_WIDE=1 the A/B):
 * 256 token rows a block, each warpgroup 64 weight rows × 256 tokens (128 fp32 accumulators a
 * thread, m64n256k16), one block an SM, 5 stages (38 KB a stage + 20 KB of scales). A weight
 * row's dequantization (the A fragments, ~80 of a warp's ~180 instructions a 64-k group) then
 * feeds twice the products, and a 64-k stage's products take a warpgroup 512 tensor cycles
 * instead of 256; the price, 8 warps an SM instead of 16 to hide the copies' and barriers'
 * latency. Same bits: a (row, token) output is the same products summed in the same k order
 * in either form (the GPU test compares them bitwise). H100, session 43, a 4,096-token prompt:
 * GDN in-projection 122.5 → 116.4 µs a call, shared gate/up 40.7 → 36.9, attention q/k/v
 * 110 → 110 — and at K = 4,096 (4 stages) slower, out-projection 180 → 197, attention o
 * 183 → 198; at K = 512 (shared down) 31.1 → 31.9. −20..25 % had been predicted: the
 * two-block narrow form was not issue-bound to that degree. So K = 1,024..2,048 only. */
#define WG_STAGES_W5 5
#define WG_WIDE_MIN_M 512  /* rows a dense product needs for the wide form (a pack's, a long prompt's) */
#define WG_WIDE_MIN_K 1024 /* its depths (the measured ones: 2,048 faster, 512 and 4,096 slower) */
#define WG_WIDE_MAX_K 2048

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* A value ptxas must keep in a register: it cannot see through the empty asm, so it cannot
 * recompute the value from the thread index at each use (which it did, every step). */
__device__ __forceinline__ uint32_t wg_keep(uint32_t v) {
    asm volatile("" : "+r"(v));
    return v;
}
template <typename T>
__device__ __forceinline__ const T *wg_keep(const T *p) {
    uint64_t v = (uint64_t)p;
    asm volatile("" : "+l"(v));
    return (const T *)v;
}
/* Shared-memory reads and copies by 32-bit shared addresses (ordered after the step's
 * barrier: volatile, with the memory clobber). */
__device__ __forceinline__ uint4 wg_lds128(uint32_t s) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(s) : "memory");
    return v;
}
__device__ __forceinline__ uint32_t wg_lds16(uint32_t s) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(s) : "memory");
    return v;
}
__device__ __forceinline__ void wg_cpa16(uint32_t s, const void *g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
}

/* bf16x2 (q_lo, q_hi) of byte t of w, then s·q + b in one fused bf16x2 fma. The byte's two
 * codes land in the two halves (prmt: byte t of w and of w >> 4), 0x4300 | q = 128 + q
 * exactly, minus 128 exactly, then the fma: every step but the last is exact. */
__device__ __forceinline__ uint32_t wg_dq(uint32_t w, uint32_t sel, uint32_t s2, uint32_t b2) {
    uint32_t r, v, q, o;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(w >> 4), "r"(sel));
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(r), "r"(0x000F000Fu), "r"(0x43004300u));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(q) : "r"(v), "r"(0x3F803F80u), "r"(0xC300C300u));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(o) : "r"(q), "r"(s2), "r"(b2));
    return o;
}
#endif

template <int STAGES, bool SWIGLU, int MINB, bool PARTIAL, int BT = WG_BT>
static __global__ void __launch_bounds__(WG_THREADS, MINB) gemm_wg_kernel(gemm_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(BT == WG_BT || (BT == WG_BT_WIDE && !PARTIAL), "token tiles of 128, or 256 for dense products");
    TRACE_KERNEL();
    typedef wg_shape<STAGES, BT> S;
    extern __shared__ __align__(16) uint8_t wg_raw[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(wg_raw);
    uint8_t *ring = wg_raw + ((1024 - (raw_s & 1023)) & 1023); /* the swizzle needs 1,024-byte atoms */
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    const int G = a.K >> 6, GS = G + 8;
    uint16_t *s_sc = reinterpret_cast<uint16_t *>(ring + S::ring); /* [WG_ROWS][GS] */
    uint16_t *s_bi = s_sc + WG_ROWS * GS;
    int32_t *s_tok = reinterpret_cast<int32_t *>(s_bi + WG_ROWS * GS); /* 16-byte aligned: GS % 8 == 0 */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;

    int m0, m_end, expert = 0;
    if (a.tiles) {
        const int n_tiles = a.tiles[a.max_tiles * 3];
        if ((int)blockIdx.y >= n_tiles) return;
        expert = a.tiles[blockIdx.y * 3];
        m0 = a.tiles[blockIdx.y * 3 + 1];
        m_end = min(a.tiles[blockIdx.y * 3 + 2], m0 + BT);
    } else {
        m0 = blockIdx.y * BT;
        m_end = min(a.M, m0 + BT);
    }
    const int f0 = blockIdx.x * (SWIGLU ? WG_ROWS / 2 : WG_ROWS);

    /* Staged weight row R (0..127): warp R / 16's rows; SwiGLU interleaves each warp's 16 as
     * 8 gate rows then the 8 up rows of the same features. */
    auto row_src = [&](int R, const cuda_qmat *&m, bool &ok) -> size_t {
        int f;
        m = &a.b0;
        if (SWIGLU) {
            f = f0 + (R >> 4) * 8 + (R & 7);
            if (R & 8) m = &a.b1;
        } else {
            f = f0 + R;
        }
        ok = f < a.N;
        return (size_t)expert * m->rows + (ok ? f : 0);
    };

    /* This thread's copies a stage: chunk (tid & 7) of token rows (tid >> 3) + 32 i, i < BT / 32
     * (their offsets from s_tok), and one 16-byte half of codes row tid >> 1 (a row past N:
     * row_src's row 0 of the matrix, whose products are never stored). */
    const int a_ch = tid & 7, a_n0 = tid >> 3;
    const int a_dst = a_n0 * 128 + ((a_ch ^ (a_n0 & 7)) << 4); /* + 4,096 i: rows 32 i further */
    if (tid < BT) {
        const int gr = min(m0 + tid, m_end - 1); /* the tile's last row stands in past its end */
        s_tok[(tid & 31) * (BT / 32) + (tid >> 5)] = (a.a_rows ? a.a_rows[gr] : gr) * a.ldx;
    }
    const int c_row = tid >> 1, c_half = tid & 1;
    const uint32_t *c_src;
    {
        const cuda_qmat *m;
        bool ok;
        const size_t r = row_src(c_row, m, ok);
        c_src = wg_keep(m->codes + r * (size_t)(a.K / 8) + c_half * 4);
    }
    const uint32_t tok_tab = wg_keep((uint32_t)__cvta_generic_to_shared(s_tok + a_n0 * (BT / 32)));
    const uint32_t tok_dst = wg_keep(ring_s + a_dst), code_dst = wg_keep(ring_s + S::act + c_row * WG_CSTRIDE + c_half * 16);
    const uint16_t *x_ch = wg_keep(a.x + a_ch * 8);
    /* A route tile is often part-filled: its rows past the end copy zeros, reading nothing
     * (reading the last row again in every pad row made the grouped products ~5-10 % slower,
     * H100 session 40). A dense product's last tile alone is short: it reads. */
    const int tok_rows = wg_keep((uint32_t)(m_end - m0 - a_n0)); /* row a_n0 + 32 i is real when 32 i < this */
    __syncthreads(); /* s_tok */
    auto issue = [&](int kg, int st) {
        const uint32_t k0 = (uint32_t)kg * 64u; /* 32-bit sums (gemm_wg_usable: < 2^31), one wide multiply-add each */
        const uint32_t d = tok_dst + st * S::stage;
        if (PARTIAL) { /* (BT = 128) */
            const uint4 o = wg_lds128(tok_tab); /* element offsets of this thread's four rows */
            cpa16n(d, x_ch + (o.x + k0), tok_rows > 0 ? 16 : 0);
            cpa16n(d + 4096, x_ch + (o.y + k0), tok_rows > 32 ? 16 : 0);
            cpa16n(d + 8192, x_ch + (o.z + k0), tok_rows > 64 ? 16 : 0);
            cpa16n(d + 12288, x_ch + (o.w + k0), tok_rows > 96 ? 16 : 0);
        } else {
#pragma unroll
            for (int h = 0; h < BT / 128; h++) {
                const uint4 o = wg_lds128(tok_tab + 16 * h); /* element offsets of rows a_n0 + 32 (4h .. 4h + 3) */
                wg_cpa16(d + 16384 * h, x_ch + (o.x + k0));
                wg_cpa16(d + 16384 * h + 4096, x_ch + (o.y + k0));
                wg_cpa16(d + 16384 * h + 8192, x_ch + (o.z + k0));
                wg_cpa16(d + 16384 * h + 12288, x_ch + (o.w + k0));
            }
        }
        wg_cpa16(code_dst + st * S::stage, c_src + kg * 8);
    };
    static_assert(BT % 128 == 0 && BT <= WG_THREADS, "issue: four token rows a thread per 128; s_tok filled a row a thread");

    /* Prologue: every row's scales and biases (with stage 0's copies), then stages up to STAGES − 3. */
    {
        const int cpr = G >> 3; /* 16-byte chunks a row */
        for (int i = tid; i < WG_ROWS * cpr; i += WG_THREADS) {
            const int R = i / cpr, j = i - R * cpr;
            const cuda_qmat *m;
            bool ok;
            const size_t r = row_src(R, m, ok);
            const size_t off = r * (size_t)G + j * 8;
            cpa16z(s_sc + R * GS + j * 8, ok ? (const void *)(m->scales + off) : (const void *)a.x, ok);
            cpa16z(s_bi + R * GS + j * 8, ok ? (const void *)(m->biases + off) : (const void *)a.x, ok);
        }
    }
#pragma unroll
    for (int s = 0; s < STAGES - 2; s++) {
        if (s < G) issue(s, s);
        cpa_commit();
    }

    float acc[BT / 2];
#pragma unroll
    for (int i = 0; i < BT / 2; i++) acc[i] = 0.0f;
    uint32_t af0[16], af1[16];
    const uint32_t sel = (uint32_t)t | ((uint32_t)(t + 4) << 8);
    const int R0 = warp * 16 + g; /* this thread's first staged row; the second is R0 + 8 */
    const uint64_t desc0 = wg_desc(ring_s); /* shared addresses < 2^18: a stage's offset never carries out of the field */
    /* this thread's staged codes (row R0; R0 + 8 is 8 rows further) and scales (row R0 and
     * R0 + 8; the biases WG_ROWS rows further), as shared addresses */
    const uint32_t code_row = wg_keep(ring_s + S::act + R0 * WG_CSTRIDE);
    const uint32_t sc_row0 = wg_keep((uint32_t)__cvta_generic_to_shared(s_sc + R0 * GS));
    const uint32_t row8_off = 8 * GS * 2, bi_off = WG_ROWS * GS * 2; /* uniform */

    auto step = [&](int kg, uint32_t(&af)[16]) {
        cpa_wait<STAGES - 3>();
        const int st = kg % STAGES;
        auto dequant = [&]() {
            const uint32_t cs = code_row + st * S::stage;
            const uint4 w0 = wg_lds128(cs);
            const uint4 w1 = wg_lds128(cs + 16);
            const uint4 v0 = wg_lds128(cs + 8 * WG_CSTRIDE);
            const uint4 v1 = wg_lds128(cs + 8 * WG_CSTRIDE + 16);
            const uint32_t s0 = wg_lds16(sc_row0 + 2 * kg), b0 = wg_lds16(sc_row0 + bi_off + 2 * kg);
            const uint32_t s1 = wg_lds16(sc_row0 + row8_off + 2 * kg), b1 = wg_lds16(sc_row0 + row8_off + bi_off + 2 * kg);
            const uint32_t s0x = s0 | (s0 << 16), b0x = b0 | (b0 << 16), s1x = s1 | (s1 << 16), b1x = b1 | (b1 << 16);
            const uint32_t wr[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
            const uint32_t vr[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                af[4 * kk + 0] = wg_dq(wr[2 * kk], sel, s0x, b0x);     /* row g,     k 2t, 2t+1 */
                af[4 * kk + 1] = wg_dq(vr[2 * kk], sel, s1x, b1x);     /* row g + 8, k 2t, 2t+1 */
                af[4 * kk + 2] = wg_dq(wr[2 * kk + 1], sel, s0x, b0x); /* row g,     k 2t+8, 2t+9 */
                af[4 * kk + 3] = wg_dq(vr[2 * kk + 1], sel, s1x, b1x); /* row g + 8, k 2t+8, 2t+9 */
            }
        };
        /* A warp's codes rows are its own lanes' copies (c_row = tid / 2: warp w copies rows
         * 16w .. 16w + 15, its A fragments' rows), so the grouped products dequantize before
         * the block barrier, which then waits for the token tile alone (and frees stage
         * kg − 2): a warp that is early dequantizes instead of waiting (H100, session 42, a
         * pack of 8 × 512: grouped gate/up 406 → 380 µs a layer, down 278 → 268). The dense instances
         * keep the dequantization after the copies' issue (before it, ptxas spilled inside
         * their loop at 128 registers). */
        if (PARTIAL) {
            __syncwarp();
            dequant();
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        {
            const int nk = kg + STAGES - 2;
            if (nk < G) issue(nk, nk % STAGES);
            cpa_commit();
        }
        if (!PARTIAL) dequant();
        uint64_t desc[4]; /* defined before the fence too: ptxas serialises wgmma whose inputs are computed between them */
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            desc[kk] = desc0 + (uint32_t)(st * (S::stage >> 4) + kk * 2); /* the start address field, bits 0..13 */
            asm volatile("" : "+l"(desc[kk])::"memory");
        }
        reg_fence(af);
        reg_fence(acc);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        if constexpr (BT == WG_BT_WIDE) wgmma_group_wide(acc, af, desc);
        else wgmma_group<PARTIAL>(m_end - m0, acc, af, desc);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        reg_fence(acc);
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    };
    /* Alternate register sets, unconditionally within the loop: a step may rewrite a set only
     * when the step before it used the other one (its wait retired this set's last group). */
    if (PARTIAL) { /* the dequantization runs before the step's barrier: the rows' scales and
                    * biases (group 0, every thread's copies) must be in for all first */
        cpa_wait<STAGES - 3>();
        __syncthreads();
    }
    int kg = 0;
    for (; kg + 1 < G; kg += 2) {
        step(kg, af0);
        step(kg + 1, af1);
    }
    if (kg < G) step(kg, af0);
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    reg_fence(acc);
    cpa_wait<0>();

    /* Epilogue: acc[4j + e] is row R0 + 8 (e >> 1), token 8j + 2t + (e & 1). */
#pragma unroll
    for (int j = 0; j < BT / 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int r = m0 + 8 * j + 2 * t + e;
            if (r >= m_end) continue;
            if (SWIGLU) {
                const int f = f0 + warp * 8 + g;
                if (f < a.N) a.act[(size_t)r * a.ld_act + f] = f2bf(silu(acc[4 * j + e]) * acc[4 * j + 2 + e]);
            } else {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int f = f0 + R0 + 8 * h;
                    if (f >= a.N) continue;
                    float *dst = a.y + (size_t)r * a.ldy + f;
                    const float v = acc[4 * j + 2 * h + e];
                    *dst = a.accumulate ? *dst + v : v;
                }
            }
        }
    }
#endif
}

static bool wg_on = false;     /* set by gemm_wg_init */
static bool wg_two = false;    /* products may take the two-blocks-an-SM form */
static bool wg_three = false;  /* ... in 3 stages where 4 do not fit (ORCHID_WG_NO3=1: one block of 5) */
static size_t wg_sm_smem = 0;  /* shared memory an SM */
static bool wg_forced_off = false; /* cuda_gemm_force_mma (tests compare the two forms) */
static size_t wg_optin = 0;
static bool wg_wide_env = true; /* not switched off by ORCHID_NO_WG_WIDE=1 */
static int wg_wide_mode = 0;     /* cuda_gemm_wg_wide_force: 1 wherever it fits, -1 never, 0 the environment */
static long wg_wide_count = 0;   /* wide launches made (the GPU test asks) */

extern "C" void cuda_gemm_force_mma(int on) { wg_forced_off = on != 0; }
extern "C" int cuda_gemm_wg_active(void) { return wg_on && !wg_forced_off; }
extern "C" void cuda_gemm_wg_wide_force(int mode) { wg_wide_mode = mode; }
extern "C" long cuda_gemm_wg_wide_launches(void) { return wg_wide_count; }

/* The opt-in less the kernel's static shared memory (none in a normal build; the trace
 * build's per-block marks take some, and asking for the whole opt-in then fails). */
template <int STAGES, bool SWIGLU, int MINB, bool PARTIAL, int BT = WG_BT>
static cudaError_t wg_attr() {
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, gemm_wg_kernel<STAGES, SWIGLU, MINB, PARTIAL, BT>);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(gemm_wg_kernel<STAGES, SWIGLU, MINB, PARTIAL, BT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(wg_optin - fa.sharedSizeBytes));
}
template <bool PARTIAL>
static cudaError_t wg_attrs() {
    cudaError_t e = wg_attr<WG_STAGES1, false, 1, PARTIAL>();
    if (e == cudaSuccess) e = wg_attr<WG_STAGES1, true, 1, PARTIAL>();
    if (e == cudaSuccess) e = wg_attr<WG_STAGES2, false, 2, PARTIAL>();
    if (e == cudaSuccess) e = wg_attr<WG_STAGES2, true, 2, PARTIAL>();
    if (e == cudaSuccess) e = wg_attr<WG_STAGES3, false, 2, PARTIAL>();
    if (e == cudaSuccess) e = wg_attr<WG_STAGES3, true, 2, PARTIAL>();
    if (!PARTIAL) { /* the wide dense form */
        if (e == cudaSuccess) e = wg_attr<WG_STAGES_W5, false, 1, false, WG_BT_WIDE>();
        if (e == cudaSuccess) e = wg_attr<WG_STAGES_W5, true, 1, false, WG_BT_WIDE>();
    }
    return e;
}

int gemm_wg_init(char *err, size_t errlen) {
    wg_on = false;
    cuda_caps caps;
    if (device_caps(&caps) != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "gemm_wg: device attributes unavailable");
    if (caps.major != 9 || env_flag("ORCHID_NO_WGMMA")) return 0;
    wg_optin = (size_t)caps.optin;
    wg_sm_smem = (size_t)caps.per_sm;
    wg_two = !env_flag("ORCHID_WG_ONE_BLOCK");
    wg_three = !env_flag("ORCHID_WG_NO3");
    wg_wide_env = !env_flag("ORCHID_NO_WG_WIDE");
    cudaError_t e = wg_attrs<false>();
    if (e == cudaSuccess) e = wg_attrs<true>();
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "gemm_wg: cudaFuncSetAttribute failed: %s", cudaGetErrorString(e));
    const int h = cuda_sm90a_code(err, errlen);
    if (h < 0) return h;
    wg_on = h == 1;
    return 0;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

bool gemm_wg_usable(const gemm_args &a, bool swiglu) {
    if (!wg_on || wg_forced_off || a.wlo || a.x_lo || a.b0.bits != 4 || (swiglu && a.b1.bits != 4)) return false;
    if (a.tiles && a.tile_rows != WG_BT) return false; /* a route of 64-slot tiles: the mma.sync form */
    /* a row's scales in whole 16-byte chunks; token rows in 16-byte chunks */
    if (a.K % 512 != 0 || a.ldx % 8 != 0 || !aligned16(a.x)) return false;
    /* token rows' element offsets in int32 (s_tok): a grouped product's rows are slots, or tokens fewer than its slots */
    const size_t rows = a.tiles ? (size_t)a.max_tiles * WG_BT : (size_t)a.M;
    if (rows * (size_t)a.ldx > (size_t)INT32_MAX) return false;
    if (!aligned16(a.b0.codes) || !aligned16(a.b0.scales) || !aligned16(a.b0.biases)) return false;
    if (swiglu && (!aligned16(a.b1.codes) || !aligned16(a.b1.scales) || !aligned16(a.b1.biases))) return false;
    return wg_smem_bytes(wg_shape<WG_STAGES1>::ring, a.K) <= wg_optin;
}

template <int STAGES, bool SWIGLU, int MINB, bool PARTIAL, int BT = WG_BT>
static int wg_run(const struct cuda_ctx *c, const gemm_args &a, dim3 grid, size_t smem, const char *what) {
    gemm_wg_kernel<STAGES, SWIGLU, MINB, PARTIAL, BT><<<grid, WG_THREADS, smem, cstream(c)>>>(a);
    LAUNCH_CHECK(c, what);
}

/* Dense products fill every tile but the last: N is always 128. A grouped tile of at most 64
 * slots issues N = 64 (H200, 8 × 512 pack: gate/up 425 µs a layer against 445 with N = 128
 * for every tile, down 280 against 283). */
template <bool PARTIAL>
static int wg_launch_n(const struct cuda_ctx *c, const gemm_args &a, bool swiglu, dim3 grid, const char *what) {
    const size_t smem2 = wg_smem_bytes(wg_shape<WG_STAGES2>::ring, a.K);
    if (wg_two && 2 * (smem2 + 1024) <= wg_sm_smem) /* (1 KB an SM block is the runtime's) */
        return swiglu ? wg_run<WG_STAGES2, true, 2, PARTIAL>(c, a, grid, smem2, what)
                      : wg_run<WG_STAGES2, false, 2, PARTIAL>(c, a, grid, smem2, what);
    const size_t smem3 = wg_smem_bytes(wg_shape<WG_STAGES3>::ring, a.K);
    if (wg_two && wg_three && 2 * (smem3 + 1024) <= wg_sm_smem)
        return swiglu ? wg_run<WG_STAGES3, true, 2, PARTIAL>(c, a, grid, smem3, what)
                      : wg_run<WG_STAGES3, false, 2, PARTIAL>(c, a, grid, smem3, what);
    const size_t smem1 = wg_smem_bytes(wg_shape<WG_STAGES1>::ring, a.K);
    return swiglu ? wg_run<WG_STAGES1, true, 1, PARTIAL>(c, a, grid, smem1, what)
                  : wg_run<WG_STAGES1, false, 1, PARTIAL>(c, a, grid, smem1, what);
}

/* Whether a dense product of M rows and depth K takes the wide form (where it was faster). */
static bool wg_wide_on(int M, int K) {
    if (wg_wide_mode != 0) return wg_wide_mode > 0;
    return wg_wide_env && M >= WG_WIDE_MIN_M && K >= WG_WIDE_MIN_K && K <= WG_WIDE_MAX_K;
}

int gemm_wg_launch(const struct cuda_ctx *c, const gemm_args &a, bool swiglu, int tile_blocks, const char *what) {
    const int fr = swiglu ? WG_ROWS / 2 : WG_ROWS; /* features a block */
    if (!a.tiles && wg_wide_on(a.M, a.K)) {
        const size_t s5 = wg_smem_bytes(wg_shape<WG_STAGES_W5, WG_BT_WIDE>::ring, a.K, WG_BT_WIDE);
        if (s5 <= wg_optin) {
            const dim3 gw((a.N + fr - 1) / fr, (a.M + WG_BT_WIDE - 1) / WG_BT_WIDE);
            wg_wide_count++;
            return swiglu ? wg_run<WG_STAGES_W5, true, 1, false, WG_BT_WIDE>(c, a, gw, s5, what)
                          : wg_run<WG_STAGES_W5, false, 1, false, WG_BT_WIDE>(c, a, gw, s5, what);
        }
    }
    const dim3 grid((a.N + fr - 1) / fr, a.tiles ? tile_blocks : (a.M + WG_BT - 1) / WG_BT);
    return a.tiles ? wg_launch_n<true>(c, a, swiglu, grid, what) : wg_launch_n<false>(c, a, swiglu, grid, what);
}

CUDA_TRACE_TU(gemm_wg)
