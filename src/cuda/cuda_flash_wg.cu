// cuda/cuda_flash_wg.cu — causal attention of prompt chunks (the prefill path: forwards of
// more than 64 tokens) on Hopper's warpgroup tensor-core instruction (wgmma, sm_90a), for this
// model's shape only: head dim 256, 8 query heads a KV head.
//
// Why. cuda_flash.cu's mma.sync kernel takes 64 (token, head) rows a block and a K/V tile of
// 32 keys; for long prompts it ran at ~27 % of the tensor pipe (Nsight Compute, H100, session
// 40: 237 registers, 8 warps an SM, latency-bound on the Q·Kᵀ chains of 4 accumulators and on
// ldmatrix), and a 4,096-token prompt spent ~1.07 ms a layer in it (attention grows with the
// square of the prompt: the largest part of a 32k prefill).
//
// Shape. A block is one KV head × a tile of up to 16 tokens of one sequence (cuda_attn_tile
// of CUDA_ATTN_QT_WIDE tokens): 128 (token, q head) rows, two consumer warpgroups of 64 rows
// (warpgroup w: tokens 8w .. 8w + 7; row r = 8·token + head-in-group). Keys come in tiles of
// 64: S = Q·Kᵀ is 16 wgmma m64n64k16 (A = the warpgroup's Q rows, B = the K tile, both
// through descriptors), the online softmax in registers (exp2 domain, the scale and log2(e)
// folded into Q), O += P·V two wgmma m64n128k16 a 16-key step with P from registers (the S
// accumulator's layout is the A fragment's) and V MN-major (the B operand transposed: V stays
// [key][d] as loaded). O is 64 × 256 fp32 a warpgroup: 128 registers a thread.
//
// Shared memory, 1,024-byte aligned, every tile in 64-column blocks of 128-byte rows with the
// 128-byte swizzle (16-byte chunk c of row r at c ^ (r & 7)): Q [2 warpgroups][4 d-blocks][64
// rows] (64 KB), K and V [2 buffers][4 d-blocks][64 keys] (64 KB each): 192 KB, one block an
// SM (8 warps).
//
// Pipeline (per key tile i; a warpgroup computes only tiles that hold a key at or before its
// last row's position — later ones are masked whole, so skipping them changes no bit):
//   wait for this thread's copies of K(i + 1) and V(i), fence them to the async proxy, block
//   barrier (every warpgroup is done with S(i) and O(i − 1), so K(i)'s and V(i − 1)'s buffers
//   are free); copy K(i + 2) and V(i + 1) into them; pack P(i) from S(i)'s exponentials;
//   issue S(i + 1) = Q·K(i + 1), then O += P(i)·V(i); wait for S(i + 1) alone and run its
//   softmax (meant to run under O's products: ptxas hoists O's wait above it, see the loop);
//   wait for O; rescale O by S(i + 1)'s correction.
//
// Numerics: the mma.sync kernel's (bf16 Q, K, V and P, fp32 sums, m / l / c as there), but
// another key tile and another order of the k sums: not its bits. A row's result depends only
// on its own scores and the key tiles [64 i, 64 i + 64) — not on the block's other rows, the
// tile partition or the batch (batch invariance: a prompt chunk alone or packed). With one
// key split the output is written here (O / l times sigmoid(gate), as the combine launch
// computes it), and that launch and the fp32 split records are skipped.
#include "cuda/cuda_internal.h"
#include "cuda/cuda_wgmma.h"

#define FW_D 256
#define FW_GROUP 8
#define FW_ROWS 128  /* (token, head) rows a block */
#define FW_BK 64     /* keys a tile */
#define FW_THREADS 256
#define FW_QBYTES (FW_ROWS * FW_D * 2)  /* 65,536 */
#define FW_TBYTES (FW_BK * FW_D * 2)    /* one K or V tile: 32,768 */
#define FW_DBLK (FW_BK * 128)           /* a 64-column block of a K/V tile (and of a warpgroup's Q): 8,192 */
#define FW_SMEM (1024 + FW_QBYTES + 4 * FW_TBYTES)
/* The ping-pong form (below): a third warpgroup copies K and V; 8 mbarriers after the buffers. */
#define FW_THREADS_PP (FW_THREADS + 128)
#define FW_REGS_PRODUCER 40  /* setmaxnreg: 128 × 40 + 256 × 232 = 64,512 of 65,536 */
#define FW_REGS_CONSUMER 232
#define FW_SMEM_PP (FW_SMEM + 8 * 8)
static_assert(FW_ROWS == 2 * 64 && FW_ROWS == CUDA_ATTN_QT_WIDE * FW_GROUP, "two warpgroups of 64 rows");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* cp.async completion as an arrival on a shared mbarrier (.noinc: counted in its init) */
__device__ __forceinline__ void fw_cpa_arrive(unsigned long long *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"((unsigned)__cvta_generic_to_shared(bar))
                 : "memory");
}
template <int N>
__device__ __forceinline__ void fw_regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void fw_regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }
/* named barrier `id` of n threads: wait for it, or only arrive */
__device__ __forceinline__ void fw_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void fw_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
#endif

/* PP (the ping-pong form, on by default, ORCHID_NO_FLASH_WG_PP=1 the A/B): the same products in the
 * same order — the same bits, which the GPU test checks — with the block barrier a tile
 * replaced. A third warpgroup (the producer; its registers handed to the two consumer
 * warpgroups by setmaxnreg, 40 / 232) copies every K and V tile into the two buffers of each
 * and signals each landed tile on an mbarrier (fullK / fullV, its 128 threads' cp.async
 * completions); each consumer warp releases a buffer on another (emptyK / emptyV, lane 0 of
 * the 8 consumer warps) once its products that read it have completed, and the producer
 * waits for that before refilling it. So the two warpgroups are no longer held in step: they
 * take turns issuing their products (named barriers 1 and 2, FlashAttention-3's ping-pong:
 * warpgroup 0 first, each arriving on the other's barrier after its issue), and one's softmax
 * runs while the tensor pipe does the other's products (trap 65: a warpgroup cannot overlap its
 * own). Phases: tile kt is its buffer's (kt >> 1)-th fill; a warpgroup past its last tile
 * still waits for each tile and releases it (the counts of every phase stay whole). 384
 * threads, 197 KB of shared memory. H100, session 43: a 4,096-token prompt's attention 443 → 423
 * µs a layer, a pack of 8 × 512 215 → 209 (~320 was predicted: the softmax hidden behind the
 * other warpgroup's products was a smaller share than counted). */
template <bool PP>
static __global__ void __launch_bounds__(PP ? FW_THREADS_PP : FW_THREADS, 1)
    flash_wg_kernel(const float *qg, const int32_t *pos, const cuda_seq *seqs, const cuda_attn_tile *tiles, int n_tiles,
                    int layer_ord, int nh, int kvh, uint16_t *out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    TRACE_KERNEL();
    extern __shared__ __align__(16) uint8_t fw_raw[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(fw_raw);
    const uint32_t base_s = raw_s + ((1024 - (raw_s & 1023)) & 1023);
    const uint32_t q_s = base_s, k_s = base_s + FW_QBYTES, v_s = k_s + 2 * FW_TBYTES;
    /* PP: fullK[2], fullV[2], emptyK[2], emptyV[2] after the V buffers; tile kt is buffer
     * kt & 1's (kt >> 1)-th fill, so its full and empty phases have parity fill(kt) */
    auto fill = [](int kt) { return (unsigned)(kt >> 1) & 1u; };
    unsigned long long *mb = reinterpret_cast<unsigned long long *>(fw_raw + (base_s - raw_s) + FW_QBYTES + 4 * FW_TBYTES);
    if (PP && threadIdx.x == 0) {
        for (int b = 0; b < 4; b++) mbar_init(&mb[b], 128);   /* the producer's threads */
        for (int b = 4; b < 8; b++) mbar_init(&mb[b], 8);     /* lane 0 of each consumer warp */
        mbar_init_fence();
    }
    pdl_trigger();
    pdl_wait(); /* tiles, seqs, q, pos and the KV cache all come from earlier work */
    /* the tiles with the most keys (a sequence's last) first: fewer blocks left alone at the end */
    const int tile_i = n_tiles - 1 - (int)blockIdx.x / kvh, g_kv = (int)blockIdx.x % kvh;
    const cuda_attn_tile tl = tiles[tile_i];
    const cuda_seq s = seqs[tl.seq];
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3;
    const int g = lane >> 2, t = lane & 3;
    const float qscale = rsqrtf((float)FW_D) * 1.4426950408889634f; /* softmax in exp2 */

    /* this thread's two rows (warpgroup-local rl0 and rl0 + 8) and their positions */
    const int rl0 = 16 * wq + g;
    const int tok0 = 8 * wg + (rl0 >> 3), tok1 = tok0 + 1;
    const int p0 = tok0 < tl.n ? pos[tl.t0 + tok0] : -1;
    const int p1 = tok1 < tl.n ? pos[tl.t0 + tok1] : -1;
    const int kv_len = pos[tl.t0 + tl.n - 1] + 1;
    const int nkt = (kv_len + FW_BK - 1) / FW_BK;
    /* the warpgroup's last row's position: its tiles are those up to it (none for an empty one) */
    const int wg_last_tok = min(tl.n, 8 * wg + 8) - 1;
    const int wg_last = wg_last_tok >= 8 * wg ? pos[tl.t0 + wg_last_tok] : -1;
    const int n_act = wg_last >= 0 ? min(nkt, wg_last / FW_BK + 1) : 0;

    /* K/V copies: this thread's chunk (tid & 31: d-block ch >> 3, chunk ch & 7) of keys
     * kr + 8 q, q = 0..7; the swizzle's row bits are kr & 7 for all eight */
    const uint16_t *kbase = s.kv + ((((size_t)layer_ord * 2 + 0) * kvh + g_kv) * (size_t)s.max_seq) * FW_D;
    const uint16_t *vbase = s.kv + ((((size_t)layer_ord * 2 + 1) * kvh + g_kv) * (size_t)s.max_seq) * FW_D;
    const int ch = tid & 31;
    /* keys kr + 8 q of a tile (a lockstep thread's kr is its warp; producer warp w takes kr = w and w + 4) */
    auto load_rows = [&](const uint16_t *src, int kt, uint32_t buf_s, int kr) {
        const uint32_t kv_dst = (uint32_t)((ch >> 3) * FW_DBLK + kr * 128 + (((ch & 7) ^ (kr & 7)) << 4));
        const int kb = kt * FW_BK;
        const uint16_t *p = src + (size_t)(kb + kr) * FW_D + ch * 8;
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const bool ok = kb + kr + 8 * q < kv_len;
            cpa16n(buf_s + kv_dst + q * 1024, ok ? p + (size_t)q * 8 * FW_D : src, ok ? 16u : 0u);
        }
    };
    auto load_tile = [&](const uint16_t *src, int kt, uint32_t buf_s) { load_rows(src, kt, buf_s, tid >> 5); };
    if (!PP) { /* groups: {K(0)}, {K(1), V(0)}, then a group an iteration */
        load_tile(kbase, 0, k_s);
        cpa_commit();
        if (nkt > 1) load_tile(kbase, 1, k_s + FW_TBYTES);
        load_tile(vbase, 0, v_s);
        cpa_commit();
    }

    if (PP) {
        __syncthreads(); /* the mbarriers' init, for all */
        if (wg == 2) { /* the producer: tile kt into buffer kt & 1 once its last contents are released */
            fw_regs_dec<FW_REGS_PRODUCER>();
            const int kr = (tid >> 5) & 3; /* keys kr + 4 h + 8 q: warp kr's two of the eight key rows */
            for (int kt = 0; kt < nkt; kt++) {
                const int b = kt & 1;
                const unsigned par = fill(kt - 2); /* the release of tile kt − 2 */
                if (kt >= 2) mbar_wait(&mb[4 + b], par);
                load_rows(kbase, kt, k_s + (uint32_t)b * FW_TBYTES, kr);
                load_rows(kbase, kt, k_s + (uint32_t)b * FW_TBYTES, kr + 4);
                fw_cpa_arrive(&mb[b]);
                if (kt >= 2) mbar_wait(&mb[6 + b], par);
                load_rows(vbase, kt, v_s + (uint32_t)b * FW_TBYTES, kr);
                load_rows(vbase, kt, v_s + (uint32_t)b * FW_TBYTES, kr + 4);
                fw_cpa_arrive(&mb[2 + b]);
            }
            asm volatile("cp.async.wait_all;\n" ::: "memory");
            return;
        }
        fw_regs_inc<FW_REGS_CONSUMER>();
    }
    /* The Q tile: row r = 8·token + head (bf16 of q·qscale), zeros past the tile's tokens. */
    for (int i = tid; i < FW_ROWS * (FW_D / 8); i += FW_THREADS) {
        const int r = i >> 5, c8 = i & 31, tok = r >> 3, rl = r & 63;
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (tok < tl.n) {
            const float *src = qg + (size_t)(tl.t0 + tok) * 2 * nh * FW_D + (size_t)(g_kv * FW_GROUP + (r & 7)) * 2 * FW_D + c8 * 8;
            const float4 a = *reinterpret_cast<const float4 *>(src), b = *reinterpret_cast<const float4 *>(src + 4);
            w = make_uint4(pack_bf2(a.x * qscale, a.y * qscale), pack_bf2(a.z * qscale, a.w * qscale),
                           pack_bf2(b.x * qscale, b.y * qscale), pack_bf2(b.z * qscale, b.w * qscale));
        }
        const uint32_t d = q_s + (r >> 6) * (FW_QBYTES / 2) + (c8 >> 3) * FW_DBLK + rl * 128 + (((c8 & 7) ^ (rl & 7)) << 4);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(d), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w) : "memory");
    }

    const uint64_t q_desc = wg_desc(q_s + wg * (FW_QBYTES / 2));
    const uint64_t k_desc = wg_desc(k_s);
    const uint64_t v_desc = wg_desc_lbo(v_s, FW_DBLK);
    /* S[4j + e]: row g (e < 2) or g + 8 of the warp's 16, key 8j + 2t + (e & 1) of the tile;
     * Oa / Ob[4j + e]: the same rows, d = 8j + 2t + (e & 1) of the first / second 128 */
    float S[32], Oa[64], Ob[64];
#pragma unroll
    for (int i = 0; i < 32; i++) S[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; i++) Oa[i] = Ob[i] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    /* S of key tile kt into S (its buffer kt & 1), committed as one group */
    auto issue_s = [&](int kt) {
        const uint32_t koff = (uint32_t)(kt & 1) * (FW_TBYTES >> 4);
        reg_fence(S);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        wgmma_ss_n64<0>(S, q_desc, k_desc + koff);
#pragma unroll
        for (int ks = 1; ks < FW_D / 16; ks++) {
            const uint32_t off = (uint32_t)((ks >> 2) * FW_DBLK + (ks & 3) * 32) >> 4;
            wgmma_ss_n64<1>(S, q_desc + off, k_desc + koff + off);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    };
    /* O += P·V of key tile kt (its buffer kt & 1): four 16-key steps, two 128-column halves */
    auto issue_o = [&](int kt, const uint32_t(&P)[16]) {
        const uint32_t voff = (uint32_t)(kt & 1) * (FW_TBYTES >> 4);
        reg_fence(Oa);
        reg_fence(Ob);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < FW_BK / 16; kk++) {
            const uint32_t off = voff + ((uint32_t)(kk * 16 * 128) >> 4);
            wgmma_n128<1>(Oa, P + 4 * kk, v_desc + off);
            wgmma_n128<1>(Ob, P + 4 * kk, v_desc + off + ((uint32_t)(2 * FW_DBLK) >> 4));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    };
    /* The masked online softmax of key tile kt's scores in S: S becomes the exponentials, m the
     * new maxima; returns the corrections of O and l in c0, c1 and the row sums in ps0, ps1
     * (this thread's part: l is summed over the row's four lanes at the end). */
    auto softmax = [&](int kt, float &c0, float &c1, float &ps0, float &ps1) {
        reg_fence(S);
        const int kb = kt * FW_BK;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = kb + 8 * j + 2 * t + e;
                if (key > p0) S[4 * j + e] = -INFINITY;
                if (key > p1) S[4 * j + 2 + e] = -INFINITY;
                mx0 = fmaxf(mx0, S[4 * j + e]);
                mx1 = fmaxf(mx1, S[4 * j + 2 + e]);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        /* Branch-free (each exp2 computed, then selected): a branch here made ptxas wait for
         * O's products before the softmax, as it does across basic blocks while wgmma are in
         * flight. The selected values are those of the guarded form (exp2(-inf) = 0; the NaN
         * of -inf - -inf is never selected). */
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float e0 = exp2f(m0 - mn0), e1 = exp2f(m1 - mn1);
        c0 = mn0 == -INFINITY ? 1.0f : e0;
        c1 = mn1 == -INFINITY ? 1.0f : e1;
        m0 = mn0;
        m1 = mn1;
        ps0 = ps1 = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float x0 = exp2f(S[4 * j + e] - mn0), x1 = exp2f(S[4 * j + 2 + e] - mn1);
                S[4 * j + e] = S[4 * j + e] == -INFINITY ? 0.0f : x0;
                S[4 * j + 2 + e] = S[4 * j + 2 + e] == -INFINITY ? 0.0f : x1;
                ps0 += S[4 * j + e];
                ps1 += S[4 * j + 2 + e];
            }
    };
    /* O and l times the corrections; skipped when no lane's is other than 1 (a row whose
     * maximum did not move: multiplying by 1 changes no bit) */
    auto rescale = [&](float c0, float c1, float ps0, float ps1) {
        l0 = l0 * c0 + ps0;
        l1 = l1 * c1 + ps1;
        if (__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) {
#pragma unroll
            for (int j = 0; j < 16; j++) {
                Oa[4 * j + 0] *= c0; Oa[4 * j + 1] *= c0; Oa[4 * j + 2] *= c1; Oa[4 * j + 3] *= c1;
                Ob[4 * j + 0] *= c0; Ob[4 * j + 1] *= c0; Ob[4 * j + 2] *= c1; Ob[4 * j + 3] *= c1;
            }
        }
    };

    /* S(0) and its softmax (O is zero: nothing to rescale) */
    auto first_tile = [&]() {
        if (n_act > 0) {
            float c0, c1, ps0, ps1;
            issue_s(0);
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            softmax(0, c0, c1, ps0, ps1);
            l0 = ps0;
            l1 = ps1;
        }
    };
    /* Key tile i of an active warpgroup (its S(i) exponentials in S): O += P(i)·V(i), and S(i + 1)
     * with its softmax where the warpgroup has a tile i + 1. after_issue runs once the products
     * are issued (PP: the turn handed to the other warpgroup). */
    auto tile_step = [&](int i, auto &&after_issue) {
        uint32_t P[16];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            P[4 * kk + 0] = pack_bf2(S[8 * kk + 0], S[8 * kk + 1]); /* row g,     keys 16kk + 2t, +1 */
            P[4 * kk + 1] = pack_bf2(S[8 * kk + 2], S[8 * kk + 3]); /* row g + 8 */
            P[4 * kk + 2] = pack_bf2(S[8 * kk + 4], S[8 * kk + 5]); /* row g,     keys 16kk + 8 + 2t, +1 */
            P[4 * kk + 3] = pack_bf2(S[8 * kk + 6], S[8 * kk + 7]); /* row g + 8 */
        }
        if (i + 1 < n_act) { /* one branch a case: ptxas serialises wgmma across correlated ones */
            issue_s(i + 1);
            issue_o(i, P);
            after_issue();
            float c0, c1, ps0, ps1;
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); /* S(i + 1); O may run on */
            softmax(i + 1, c0, c1, ps0, ps1);
            /* its results pinned before O's wait and P kept live past it (the products read
             * P's registers while they run). ptxas still hoists the wait into the softmax
             * (SASS, nvcc 13.0: WARPGROUP.DEPBAR.LE 0 before the first MUFU.EX2, whatever the
             * softmax holds), so this warpgroup's softmax runs after its O; the tensor pipe
             * is then kept by the other warpgroup's products. */
            reg_fence(S);
            asm volatile("" : "+f"(c0), "+f"(c1), "+f"(ps0), "+f"(ps1)::"memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            reg_fence(P);
            reg_fence(Oa);
            reg_fence(Ob);
            rescale(c0, c1, ps0, ps1);
        } else {
            issue_o(i, P);
            after_issue();
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            reg_fence(Oa);
            reg_fence(Ob);
        }
    };

    if (PP) {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* Q, written by st.shared, for wgmma */
        fw_bar_sync(3, 2 * 128); /* Q, for both consumer warpgroups */
        if (wg == 1) fw_bar_arrive(1, 2 * 128); /* warpgroup 0 issues first */
        mbar_wait(&mb[0], fill(0));              /* K(0) */
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        first_tile();
        if (lane == 0) mbar_arrive(&mb[4]); /* K(0) read */
        for (int i = 0; i < nkt; i++) {
            if (i + 1 < nkt) mbar_wait(&mb[(i + 1) & 1], fill(i + 1)); /* K(i + 1) */
            mbar_wait(&mb[2 + (i & 1)], fill(i));                      /* V(i) */
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            fw_bar_sync(1 + wg, 2 * 128); /* this warpgroup's turn to issue */
            /* the other's turn (warpgroup 1's last hand-over would have no taker: skipped) */
            auto hand_over = [&]() {
                if (wg == 0 || i + 1 < nkt) fw_bar_arrive(2 - wg, 2 * 128);
            };
            if (i < n_act) tile_step(i, hand_over);
            else hand_over(); /* past this warpgroup's rows: its turns and releases only */
            if (lane == 0) {
                if (i + 1 < nkt) mbar_arrive(&mb[4 + ((i + 1) & 1)]); /* K(i + 1) read */
                mbar_arrive(&mb[6 + (i & 1)]);                         /* V(i) read */
            }
        }
    } else {
        cpa_wait<1>(); /* K(0) */
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads(); /* Q and K(0) for every warpgroup */
        first_tile();
        for (int i = 0; i < nkt; i++) {
            cpa_wait<0>(); /* K(i + 1), V(i) */
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();
            if (i + 2 < nkt) load_tile(kbase, i + 2, k_s + (uint32_t)(i & 1) * FW_TBYTES);
            if (i + 1 < nkt) load_tile(vbase, i + 1, v_s + (uint32_t)((i + 1) & 1) * FW_TBYTES);
            cpa_commit();
            if (i >= n_act) continue; /* warpgroup-uniform: this and later tiles are past its rows */
            tile_step(i, [] {});
        }
        cpa_wait<0>();
    }

    /* The output: O / l times sigmoid(gate) as bf16 (O times 1 / l: not the combine launch's
     * bits, which no path needs — a prompt chunk always comes here) */
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++) {
        const int tok = h2 ? tok1 : tok0;
        if (tok >= tl.n) continue;
        const int tg = tl.t0 + tok, h = g_kv * FW_GROUP + (rl0 & 7);
        const float L = h2 ? l1 : l0, inv = L > 0.0f ? 1.0f / L : 0.0f; /* one division a row, not 64 */
        const float *gate = qg + (size_t)tg * 2 * nh * FW_D + (size_t)h * 2 * FW_D + FW_D;
        uint16_t *orow = out + ((size_t)tg * nh + h) * FW_D;
        auto store = [&](const float(&O)[64], int d0) {
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int d = d0 + 8 * j + 2 * t;
                const float a0 = O[4 * j + 2 * h2] * inv, a1 = O[4 * j + 2 * h2 + 1] * inv;
                const float2 gt = *reinterpret_cast<const float2 *>(gate + d);
                *reinterpret_cast<uint32_t *>(orow + d) = pack_bf2(a0 * sigm(gt.x), a1 * sigm(gt.y));
            }
        };
        store(Oa, 0);
        store(Ob, 128);
    }
#endif
}

/* On by default (ORCHID_NO_FLASH_WG=1: the mma.sync kernel for prompt chunks too, the A/B;
 * tests force either). H100, session 42: a 4,096-token prompt's attention 1,061 → 443 µs a
 * layer, a pack of 8 × 512 482 → 214 µs (docs/PERFORMANCE.md). */
static bool fw_ready = false; /* the device runs it (cuda_flash_wg_init) */
static int fw_mode = 0;       /* 1 on, 0 by the environment, -1 off (cuda_flash_wg_force) */
static bool fw_env = true;    /* not switched off by the environment */
static bool fw_pp_ready = false; /* the ping-pong instance's attributes are set */
static bool fw_pp_env = true;    /* not switched off by ORCHID_NO_FLASH_WG_PP=1 */
static int fw_pp_mode = 0;       /* cuda_flash_wg_pp_force: 1 on, -1 off, 0 the environment */
static long fw_pp_count = 0;     /* ping-pong launches made (the GPU test asks) */
extern "C" void cuda_flash_wg_force(int mode) { fw_mode = mode; }
extern "C" void cuda_flash_wg_pp_force(int mode) { fw_pp_mode = mode; }
extern "C" long cuda_flash_wg_pp_launches(void) { return fw_pp_count; }

/* The dynamic shared memory of an instance, set where the device's opt-in holds it beside the
 * kernel's static bytes (a trace build's marks); fits says whether it did. */
template <bool PP>
static cudaError_t fw_attr(const cuda_caps &caps, bool &fits) {
    const size_t smem = PP ? FW_SMEM_PP : FW_SMEM;
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, flash_wg_kernel<PP>);
    fits = e == cudaSuccess && smem + fa.sharedSizeBytes <= (size_t)caps.optin;
    if (e == cudaSuccess && fits) e = cudaFuncSetAttribute(flash_wg_kernel<PP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    return e;
}

extern "C" int cuda_flash_wg_init(char *err, size_t errlen) {
    fw_ready = fw_pp_ready = false;
    fw_env = !env_flag("ORCHID_NO_FLASH_WG");
    fw_pp_env = !env_flag("ORCHID_NO_FLASH_WG_PP");
    cuda_caps caps;
    if (device_caps(&caps) != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "flash_wg: device attributes unavailable");
    if (caps.major != 9 || env_flag("ORCHID_NO_WGMMA")) return 0;
    bool fits = false, pp_fits = false;
    cudaError_t e = fw_attr<false>(caps, fits);
    if (e == cudaSuccess) e = fw_attr<true>(caps, pp_fits);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "flash_wg: cudaFuncSetAttribute failed: %s", cudaGetErrorString(e));
    if (!fits) return 0;
    const int h = cuda_sm90a_code(err, errlen);
    if (h < 0) return h;
    fw_ready = h == 1;
    fw_pp_ready = fw_ready && pp_fits;
    return 0;
}

extern "C" int cuda_flash_wg_takes(int T, int n_split, int n_heads, int kv_heads, int D) {
    const bool on = fw_mode > 0 || (fw_mode == 0 && fw_env);
    return fw_ready && on && T >= CUDA_ATTN_WIDE_MIN_T && n_split == 1 && D == FW_D && kv_heads > 0 &&
           n_heads == FW_GROUP * kv_heads;
}

extern "C" int cuda_flash_wg_attention(const struct cuda_ctx *c, const float *qg, const int32_t *pos,
                                       const struct cuda_seq *seqs, const struct cuda_attn_tile *tiles, int n_tiles,
                                       int layer_ord, int n_heads, int kv_heads, uint16_t *out) {
    /* not PDL-launched, as the other attention launches (cuda_attn.cu's launch_attn) */
    const bool pp = fw_pp_ready && (fw_pp_mode > 0 || (fw_pp_mode == 0 && fw_pp_env));
    fw_pp_count += pp;
    launch_cfg lc(dim3(n_tiles * kv_heads), dim3(pp ? FW_THREADS_PP : FW_THREADS), pp ? FW_SMEM_PP : FW_SMEM, cstream(c), false);
    LAUNCH_CHECK_RC(c,
                    lc.launch(pp ? flash_wg_kernel<true> : flash_wg_kernel<false>, qg, pos, seqs, tiles, n_tiles, layer_ord,
                              n_heads, kv_heads, out),
                    pp ? "flash_attention_wg (ping-pong)" : "flash_attention_wg");
}

CUDA_TRACE_TU(flash_wg)
