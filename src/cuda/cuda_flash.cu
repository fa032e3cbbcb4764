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
// With tail counters (a decode step of one sequence: cuda_attention's tail) the launch also
// combines the splits itself (the TAIL instance: a cooperative launch whose blocks meet at a
// barrier, then share the rows among their warps — attn_combine_warp, the combine launch's
// own code), saving that launch and its gap: at context 512 flash + combine + o-projection
// 20.1 → 16.7 µs a layer on the H200. (A decode form with a warp a key split for batches of
// one-token tiles measured slower: docs/PERFORMANCE.md, session 37.)
#include <math.h>

#include "cuda/cuda_internal.h"

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

__device__ __forceinline__ const uint16_t *f_kv(const cuda_seq &s, int layer_ord, int which, int kvh, int g, int D) {
    return s.kv + ((((size_t)layer_ord * 2 + which) * kvh + g) * (size_t)s.max_seq) * D;
}

template <int D, bool TAIL>
static __global__ void __launch_bounds__(128) flash_kernel(const float *qg, const int32_t *pos, const cuda_seq *seqs,
                                                           const cuda_attn_tile *tiles, int layer_ord, int nh, int kvh,
                                                           int n_split, int spb, float *part, int *tail,
                                                           uint16_t *out) {
    TRACE_KERNEL();
    constexpr int DS = D + 8, NT = D / 8, KS = D / 16;
    extern __shared__ __align__(16) uint16_t fsm[];
    uint16_t *Qs = fsm;                 /* [FQ][DS] */
    uint16_t *Ks = Qs + FQ * DS;        /* [2][FK][DS] */
    uint16_t *Vs = Ks + 2 * FK * DS;    /* [2][FK][DS] */
    if (!TAIL) pdl_trigger(); /* TAIL: before its barrier (below) */
    pdl_wait(); /* PDL: tiles, seqs, q, pos and the KV cache all come from earlier work */
    const int group = nh / kvh;
    const int tile_i = blockIdx.x / kvh, g = blockIdx.x % kvh, split0 = blockIdx.y * spb;
    const int split_end = min(n_split, split0 + spb);
    const cuda_attn_tile tl = tiles[tile_i];
    const cuda_seq s = seqs[tl.seq];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nrows = tl.n * group;
    const float qscale = rsqrtf((float)D) * 1.4426950408889634f; /* fold log2(e): softmax in exp2 */

    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
    const int p0 = r0 < nrows ? pos[tl.t0 + r0 / group] : -1;
    const int p1 = r1 < nrows ? pos[tl.t0 + r1 / group] : -1;
    const int kv_len = pos[tl.t0 + tl.n - 1] + 1;
    const uint16_t *kb_ = f_kv(s, layer_ord, 0, kvh, g, D), *vb_ = f_kv(s, layer_ord, 1, kvh, g, D);

    /* K/V keys [kb, kb + FK) ∩ [.., k_hi) into buffer buf (zeros past k_hi) */
    auto load_tile = [&](int kb, int k_hi, int buf) {
        for (int i = tid; i < FK * (D / 8); i += 128) {
            const int j = i / (D / 8), c = (i % (D / 8)) * 8;
            const bool ok = kb + j < k_hi;
            const size_t off = (size_t)(ok ? kb + j : 0) * D + c;
            f_cp16(Ks + (buf * FK + j) * DS + c, kb_ + off, ok);
            f_cp16(Vs + (buf * FK + j) * DS + c, vb_ + off, ok);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };

    int buf = 0;          /* the buffer of the next tile to compute */
    bool pending = false; /* that tile (the first of this split) is already requested */
    {
        /* the first split's first tile goes out before the Q tile is staged: its copies and
         * the q loads below are in flight together (they waited on one another before) */
        int lo, hi;
        attn_split_keys(kv_len, n_split, split0, &lo, &hi);
        if (lo < hi) {
            load_tile(lo, hi, 0);
            pending = true;
        }
    }
    /* The Q tile: the nrows real rows (bf16 of q·qscale), 8 pairs a thread requested before
     * any is stored (a guarded load a pair made each wait for the last), then zero rows. */
    const int nq = nrows * (D / 2);
    for (int i0 = 0; i0 < nq; i0 += 8 * 128) {
        float2 qv[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = min(i0 + j * 128 + tid, nq - 1), r = i / (D / 2), d = (i % (D / 2)) * 2;
            qv[j] = *reinterpret_cast<const float2 *>(qg + (size_t)(tl.t0 + r / group) * 2 * nh * D +
                                                      (size_t)(g * group + r % group) * 2 * D + d);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = i0 + j * 128 + tid, r = i / (D / 2), d = (i % (D / 2)) * 2;
            if (i < nq) *reinterpret_cast<uint32_t *>(Qs + r * DS + d) = pack_bf2(qv[j].x * qscale, qv[j].y * qscale);
        }
    }
    for (int i = nq + tid; i < FQ * (D / 2); i += 128) {
        const int r = i / (D / 2), d = (i % (D / 2)) * 2;
        *reinterpret_cast<uint32_t *>(Qs + r * DS + d) = 0u; /* pack_bf2(0, 0) */
    }
    for (int split = split0; split < split_end; split++) {
        int k_lo, k_hi;
        attn_split_keys(kv_len, n_split, split, &k_lo, &k_hi);
        float O[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) O[j][0] = O[j][1] = O[j][2] = O[j][3] = 0.0f;
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

        if (k_lo < k_hi && !pending) load_tile(k_lo, k_hi, buf);
        pending = false; /* (the Q tile's stores are ordered before the products by the tile's barrier) */
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
                asm volatile("cp.async.wait_group 1;\n" ::);
            } else {
                asm volatile("cp.async.wait_group 0;\n" ::);
            }
            __syncthreads();
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
            /* Once the rows' maxima stop moving (most tiles of a long prompt) c0 = c1 = 1
             * exactly (exp2f(0)), and the rescale is 128 FMUL a tile at D = 256 that change
             * no bit: skipped when no lane of the warp has a c other than 1 (a vote; not
             * timed alone — prompt chunks of this model's shape take cuda_flash_wg.cu). */
            if (__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) {
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    O[j][0] *= c0; O[j][1] *= c0;
                    O[j][2] *= c1; O[j][3] *= c1;
                }
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
            float *o = part + (((size_t)t * nh + h) * n_split + split) * (D + 2);
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
    /* the combine (cuda_attention's tail): the (tile, KV head)'s blocks meet at a barrier (a
     * cooperative launch: all resident) and their warps share its rows' 64-column units. The
     * dependents are let in only here: the attention o-projection's blocks, scheduled at this
     * launch's start, sat ~9 µs on their prefetched weights and then took 4.9 µs instead of
     * 1.6 for their products (H200 timeline; cause not found) */
    if (TAIL) {
        pdl_trigger();
        blocks_barrier(tail + 2 * blockIdx.x, tail + 2 * blockIdx.x + 1, gridDim.y);
        trace_mark(TRACE_MARK4); /* past the barrier */
        const int per_row = D / 64, units = nrows * per_row, warps = (int)gridDim.y * 4;
        for (int u = warp * (int)gridDim.y + (int)blockIdx.y; u < units; u += warps) {
            const int r = u / per_row;
            attn_combine_warp<1>(part, qg, tl.t0 + r / group, g * group + r % group, nh, n_split, D, 32 * (u % per_row), out);
        }
    }
}

static size_t flash_smem(int D) { return (size_t)(FQ + 4 * FK) * (D + 8) * 2; }

/* The instance for head dim D (64, 128 or 256) with or without the in-launch combine. */
typedef void (*flash_fn_t)(const float *, const int32_t *, const cuda_seq *, const cuda_attn_tile *, int, int, int, int, int,
                           float *, int *, uint16_t *);
static flash_fn_t flash_fn(int D, bool tail) {
    if (tail) return D == 256 ? flash_kernel<256, true> : D == 128 ? flash_kernel<128, true> : flash_kernel<64, true>;
    return D == 256 ? flash_kernel<256, false> : D == 128 ? flash_kernel<128, false> : flash_kernel<64, false>;
}

/* Multiprocessors (cuda_flash_init), and splits a block forced by the tests (0: chosen). */
static int fl_sms = 132, fl_spb_forced = 0;
extern "C" void cuda_flash_force_spb(int spb) { fl_spb_forced = spb > 0 ? spb : 0; }
/* Tests: the combine launch even when tail counters are given. */
static int fl_tail_off = 0;
static bool fl_coop = false; /* the device takes cooperative launches (cuda_flash_init) */
static long fl_tail_launches = 0; /* launches that combined themselves (tests check it moves) */
extern "C" long cuda_flash_tail_launches(void) { return fl_tail_launches; }
extern "C" void cuda_flash_force_no_tail(int on) { fl_tail_off = on; }

/* Splits a block for n_units (query tile, KV head) pairs of n_split splits each: as many as
 * keep about two blocks an SM busy (two fit by shared memory), ⌊blocks / slots⌋; one where
 * the launch has no more blocks than that (batch-1 decode: 2 KV heads × 16 splits at
 * context 512; prefill: one split). ORCHID_ATTN_SPB overrides (A/B).
 * (Measured in session 34, H100: the fewest splits that fit one wave — 64 sequences at 512,
 * 8 a block and 256 blocks against 7 and 384 — gave the same forwards, 13.74 / 13.79 ms at
 * 64: the launch's waves are not the attention's cost. Session 35, H100, the attention op alone
 * at 64 sequences: 2 splits a block 67.1 µs, 4 66.7, 7 (this formula) 59.9, and all 16 in
 * one block that then combined them itself, no combine launch, 66.2 — forwards 13.56 (7)
 * against 13.71–13.72: not the splits' chain in a block either.) */
static int fl_spb(int n_units, int n_split) {
    static int env = -1;
    if (env < 0) {
        const char *v = getenv("ORCHID_ATTN_SPB");
        env = v && *v ? atoi(v) : 0;
    }
    int spb = fl_spb_forced ? fl_spb_forced : env;
    if (spb <= 0) spb = n_units * n_split / (2 * fl_sms);
    if (spb < 1) spb = 1;
    return spb < n_split ? spb : n_split;
}

extern "C" int cuda_flash_init(int D, char *err, size_t errlen) {
    const int smem = (int)flash_smem(D);
    cuda_caps caps;
    const bool caps_ok = device_caps(&caps) == cudaSuccess;
    fl_sms = caps_ok && caps.sms > 0 ? caps.sms : 132;
    fl_coop = caps_ok && caps.coop; /* the in-launch combine is a cooperative launch */
    (void)fl_spb(1, 1); /* reads the environment here, outside any graph capture */
    if (D != 256 && D != 128 && D != 64) return 0; /* other head dims use the scalar kernel */
    for (int tail = 0; tail < 2; tail++) {
        const cudaError_t e = cudaFuncSetAttribute((const void *)flash_fn(D, tail), cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess)
            return errorf(err, errlen, ST_DEVICE, "flash attention: cudaFuncSetAttribute(%d B) failed: %s", smem,
                          cudaGetErrorString(e));
    }
    return 0;
}

/* Returns 1 when the tensor-core kernel handles this shape (then it was launched), 0 to fall back. */
extern "C" int cuda_flash_attention(const struct cuda_ctx *c, const float *qg, const int32_t *pos,
                                    const struct cuda_seq *seqs, const struct cuda_attn_tile *tiles, int n_tiles,
                                    int n_split, int layer_ord, int n_heads, int kv_heads, int D, float *part, int *tail,
                                    uint16_t *out, int *launched, int *combined) {
    *launched = *combined = 0;
    const int group = n_heads / kv_heads;
    if (group * CUDA_ATTN_QT > FQ || (D != 64 && D != 128 && D != 256)) return 0;
    const int spb = fl_spb(n_tiles * kv_heads, n_split);
    const dim3 grid(n_tiles * kv_heads, (n_split + spb - 1) / spb);
    const size_t smem = flash_smem(D);
    /* the combine in the launch: its blocks meet at a barrier, so all must be resident at
     * once (a cooperative launch; at most one an SM here) */
    const bool fuse = tail && fl_coop && !fl_tail_off && n_split <= CUDA_ATTN_TAIL_SPLITS && (int)(grid.x * grid.y) <= fl_sms;
    const flash_fn_t kern = flash_fn(D, fuse);
    *launched = 1;
    *combined = fuse;
    fl_tail_launches += fuse;
    /* without the PDL attribute: see launch_attn in cuda_attn.cu */
    launch_cfg lc(grid, dim3(128), smem, cstream(c), false, 0, fuse);
    LAUNCH_CHECK_RC(c, lc.launch(kern, qg, pos, seqs, tiles, layer_ord, n_heads, kv_heads, n_split, spb, part, fuse ? tail : NULL,
                                 out),
                    "flash_attention");
}

CUDA_TRACE_TU(flash)
