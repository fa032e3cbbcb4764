// cuda/cuda_skinny_pipe.cu — the grouped MoE products of a batch of 2..64 tokens (routed
// gate/up with SwiGLU, and down) as a persistent, warp-specialized kernel on sm_90: one
// block an SM streams its share of (expert, row block, pass) units through a ring of
// shared-memory stages; one producer warp fills a stage with tensor-map TMA copies (a few
// instructions a unit) while the consumer warps compute on the ones before. cuda_skinny.cu's
// grouped kernel gives each unit a block of its own (copy the tile, wait, compute, exit)
// and so idles its SM through every copy. H200, 64 sequences (docs/PERFORMANCE.md, session
// 17): gate/up 140.6 -> 110.0 µs a layer here. The down launch's units are small (128 rows ×
// K = 512: 36 KB), and handing each to reducer warps cost more than the copies it hid
// (93–128 µs against the grouped kernel's 78, session 17); its direct form (session 30:
// each consumer warp adds its own k-slices and stores, two sets of 8 consumer warps taking
// every other unit) is 67.5 -> 59.5 µs a layer at 64 sequences on the H100. Both launches
// come here by default (ORCHID_SK_PIPE=0 / swiglu / down: A/B; cuda_skinny_pipe_init).
// The model's gate/up (K = 2,048) runs in skinny_pipe_x_kernel: its shapes compile-time, each
// (expert, pass)'s x staged once (session 47: 113.7 -> 103.8 µs a layer, H100; ORCHID_SP_K2048=0
// the A/B).
//
// Measured and removed (session 30, H100, 64 sequences): gate/up as 128-row units in
// k-range stages (four stages of 45 KB, three copies in flight) 115 -> 119 µs, with two
// consumer sets 115 -> 115; ncu puts this launch at 2.5 TB/s of DRAM against bench_stream's
// 2.94 (85 %): it is bound by its bytes, not its copies' latency or its consumers.
//
// History (docs/PERFORMANCE.md, session 8; trap 24): the first forms fed the stages with
// cp.async from producer warps (~4.5 GB/s a warp) or a cp.async.bulk a 1 KB codes row
// (~50–90 ns of the copy engine a copy): 175–288 µs for gate/up. A tensor-map box moves a
// whole half-tile (32 rows × 2 KB of codes) in one copy: 6 copies and the unit's x rows
// a gate/up unit instead of ~72.
//
// The sums are cuda_skinny.cu's, bit for bit: a unit is one of its RB-row tiles (the same
// RB for the same K, so the same k-slices a warp, in the same order) against one n-tile of
// at most 8 slots, each (row, slot) summed by sk_group_step over the warp's groups and the
// k-slices added in slice order. So a token's result is the same here, in the grouped
// kernel and in cuda_tcv.cu's one-token kernels (the GPU tests compare the two grouped
// kernels bitwise).
//
// Shared layout of the codes: a half-tile (orows rows: SwiGLU's gate rows, then its up
// rows; down: all RB rows) is one TMA box of the 3-D view (32 words, rows, K/256 segments)
// of the [E·rows][K/8] codes, swizzled 128B: [segment][row][128 bytes], the 16-byte chunk
// c of row r stored at chunk c ^ (r % 8). A lane (g, c) reads words 2c, 2c+1 of a group
// (chunk 2·(group % 4) + c/2) for fragment rows g and g + 8; with fragment row g mapped to
// tile row sp_prow(g) (0, 2, 4, 6, 1, 3, 5, 7) the 16 lanes of a half-warp meet 8 distinct
// chunks of 4 rows: conflict-free. (Fragment rows are the mma's rows: which tile row a lane
// carries does not change any element's sum.) Scales and biases stay [rows][G].
//
// Work: expert e with c_e slots has P_e = ⌈c_e / 8⌉ passes (8 slots a pass, one n-tile)
// and UPT = rows / orows row blocks; its units are (row block, pass), passes innermost.
// Units of all experts in expert order; block b takes the contiguous range
// [b·U/grid, (b+1)·U/grid) — every unit moves the same weight bytes, so a static split
// balances. Stage = the unit's weight tile, its slots' x rows (a cp.async.bulk each) and
// their Σx.
#include <cudaTypedefs.h>

#include "cuda/cuda_mma.h"

#define SP_MAX_STAGES 8
#define SP_SLOTS 8       /* slots of a pass: one n-tile of the mma */
#define SP_MAX_E 1024    /* experts the block-wide scan of the prologue takes */
#define SP_CONSUMERS 256 /* 8 warps: the products (cuda_skinny.cu's k-slices × m-tiles of a tile) */
#define SP_SUMS 64       /* 2 warps: Σx of each stage's tokens (and the tokens rearranged for the B fragments) */
#define SP_REDUCERS 64   /* 2 warps: the reductions and stores */
#define SP_PRODUCER 32   /* 1 warp: lane 0 the tensor copies, lane j < n slot j's x row */
#define SP_THREADS (SP_CONSUMERS + SP_REDUCERS + SP_SUMS + SP_PRODUCER)
/* a block with SETS sets of 8 consumer warps (the direct down launch takes 2) */
#define SP_THREADS_SETS(SETS) (SP_CONSUMERS * (SETS) + SP_REDUCERS + SP_SUMS + SP_PRODUCER)
#define SP_SEG 32        /* words of a 128-byte codes segment (4 groups) */
/* skinny_pipe_x_kernel's shape (the model's gate/up: K = 2,048 with cuda_skinny.cu's RB for it,
 * sk_rb: 32 rows, 2 m-tiles × 4 k-slices) */
#define SP_KC_K 2048
#define SP_KC_RB 32
/* The direct down's compile-time instance at K = 512 (skinny_pipe_kernel<2, SP_KD_K>, opt-in
 * ORCHID_SP_K512=1): cuda_skinny.cu's RB 64 split for K = 512 (2 k-slices of 4 groups) */
#define SP_KD_K 512
#define SP_KD_KS 2

/* Kernel arguments; the tensor maps live in the parameter space (__grid_constant__) where
 * the TMA reads them. [h]: half h of a tile (gate, up; down: [0] only). */
struct sp_args {
    CUtensorMap codes[2];
    const uint16_t *scales[2], *biases[2]; /* a half's rows are one contiguous run of each */
    int rows, K;                    /* rows of one expert's matrix, its columns */
    const uint16_t *x;              /* bf16 rows: xn by token (gate/up) or act by slot (down) */
    int ldx;
    const int32_t *x_rows;          /* x row of each slot (route.row_of_slot), NULL: the slot */
    const int32_t *counts, *offsets;/* route: slots of each expert, its first slot */
    int E, n_slots;
    int RB, stages;
    int KS;                         /* DIRECT (down): cuda_skinny.cu's k-slices for K, each warp takes them all */
    float *y;                       /* down: y[slot][ldy] */
    int ldy;
    uint16_t *act;                  /* SwiGLU: act[slot][ld_act] = bf16(silu(gate)·up) */
    int ld_act;
};

/* Shared memory, from a 1,024-byte aligned base: S stages of [codes RB·K/2 bytes (halves
 * of orows rows, swizzled) | scales RB × G | biases RB × G | x 8 × (K + 8) bf16 | Σx 8 × (G
 * + 4) fp32], each a multiple of 1,024 bytes (the 128B swizzle's alignment), then the
 * k-slices' partials, two buffers of [8 warps][4][32] fp32, and the route's per-expert units
 * prefix [E + 1], counts and offsets [E]. x rows keep cuda_skinny.cu's padding (conflict-free
 * 16-byte fragment loads). */
struct sp_layout {
    size_t scales, x, xsum, stage, red, pfx, total;
};
__host__ __device__ __forceinline__ sp_layout sp_lay(int RB, int K, int S, int E) {
    const int G = K / QGROUP;
    sp_layout l;
    l.scales = (size_t)RB * K / 2;
    l.x = l.scales + (size_t)4 * RB * G;
    l.xsum = l.x + (size_t)SP_SLOTS * (K + 8) * 2;
    l.stage = (l.xsum + (size_t)SP_SLOTS * (G + 4) * 4 + 1023) & ~(size_t)1023;
    l.red = l.stage * S;
    l.pfx = l.red + (size_t)2 * 8 * 4 * 32 * 4;
    l.total = l.pfx + (size_t)4 * ((E + 1) + 2 * E) + 1024; /* + the base's alignment */
    return l;
}

/* The tile row that fragment row g (0..7) of an m-tile carries (+ 8 for g + 8): even rows
 * for the first half-warp, odd for the second, so that the swizzle spreads their chunks. */
__host__ __device__ __forceinline__ int sp_prow(int g) { return ((g & 3) << 1) | (g >> 2); }

__device__ __forceinline__ void sp_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void sp_tma3(void *dst, const CUtensorMap *m, int c0, int c1, int c2, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                 ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2),
                 "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void sp_bulk(void *dst, const void *src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

/* The expert that owns unit u: pfx[e] = units before expert e, u < pfx[E]; the largest e
 * with pfx[e] <= u (a binary search: pfx[lo] <= u < pfx[hi]), which has units. */
__device__ __forceinline__ int sp_owner(int u, const int *pfx, int E) {
    int lo = 0, hi = E;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (pfx[mid] <= u) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Unit u of the block's work → expert, row block and pass. ec: the caller's cursor over the
 * experts (-1 at first: sp_owner; then, its units coming in increasing order, a forward walk). */
struct sp_unit {
    int e, rbase, m0, n;
};
__device__ __forceinline__ sp_unit sp_locate(int u, const int *pfx, const int *cnt, const int *off, int E, int orows, int &ec) {
    if (ec < 0) ec = sp_owner(u, pfx, E);
    while (pfx[ec + 1] <= u) ec++;
    const int passes = (cnt[ec] + SP_SLOTS - 1) / SP_SLOTS, v = u - pfx[ec], p = v % passes;
    sp_unit r;
    r.e = ec;
    r.rbase = (v / passes) * orows;
    r.m0 = off[ec] + p * SP_SLOTS;
    r.n = min(SP_SLOTS, cnt[ec] - p * SP_SLOTS);
    return r;
}

/* Unit i's reduction by the reducer warps (the SwiGLU launch; the down launch is DIRECT):
 * red holds its KS slices' partials, [k][MT m-tiles][4][32] (sk_group_scale's four outputs a
 * lane); each (row, slot) of the unit adds its slices in order from 0, the gate m-tile m and
 * the up m-tile m + MT/2, into act. Waits for the consumers' redfull of the unit's buffer
 * (i & 1) and frees it. */
__device__ __forceinline__ void sp_reduce_unit(const float *red, int MT, int KS, const sp_unit &w, int i,
                                               unsigned long long *redfull, unsigned long long *redfree, uint16_t *act,
                                               int ld_act) {
    const int at = threadIdx.x - SP_CONSUMERS, rb = i & 1;
    mbar_wait(&redfull[rb], (unsigned)(i / 2) & 1u);
    for (int q = at; q < MT / 2 * 128; q += SP_REDUCERS) {
        const int m = q >> 7, l = q & 31, k4 = (q >> 5) & 3;
        const int jj = 2 * (l & 3) + (k4 & 1);
        if (jj >= w.n) continue;
        const int r = w.rbase + m * 16 + sp_prow(l >> 2) + (k4 >= 2 ? 8 : 0);
        float v = 0.0f, u = 0.0f;
        for (int k = 0; k < KS; k++) v += red[((size_t)(k * MT + m) * 4 + k4) * 32 + l];
        for (int k = 0; k < KS; k++) u += red[((size_t)(k * MT + m + MT / 2) * 4 + k4) * 32 + l];
        act[(size_t)(w.m0 + jj) * ld_act + r] = f2bf(silu(v) * u);
    }
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(&redfree[rb]);
}

/* A consumer warp's unit i handed on (the gate/up launch): the stage released (its empty
 * barrier), then its four partial sums a lane into red buffer rb = i & 1 — once the reducers
 * have freed it (unit i - 2's) — and that buffer's full barrier. */
__device__ __forceinline__ void sp_handoff(unsigned long long *empty_st, unsigned long long *redfree,
                                           unsigned long long *redfull, float *red0, int i, int rb, int warp, int lane,
                                           const float (&acc)[4], trace_clock &clk) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty_st); /* this warp is done with the stage */
    clk.lap(2);
    if (i >= 2) mbar_wait(&redfree[rb], (unsigned)(i / 2 - 1) & 1u);
    float *red = red0 + (size_t)rb * 8 * 4 * 32;
#pragma unroll
    for (int q = 0; q < 4; q++) red[((size_t)warp * 4 + q) * 32 + lane] = acc[q];
    __syncwarp();
    if (lane == 0) mbar_arrive(&redfull[rb]);
    clk.lap(3);
}

/* Trace builds: thread 0's (a consumer's) time in each phase of its unit loop (trace_clock),
 * marks 4..7 after the wait: 4 = prologue (route scan), 5 = waiting for a stage (copies and
 * Σx), 6 = products, 7 = handing the partials to the reducers. */
/* The block's static shared state (both kernels): a stage's barriers full (the producer's
 * copies), ready (the Σx warps), empty (the consumer warps); the two red buffers' full
 * (consumers) and free (reducers); the route scan's warp totals. */
struct sp_shared {
    __align__(8) unsigned long long full[SP_MAX_STAGES], ready[SP_MAX_STAGES], empty[SP_MAX_STAGES];
    unsigned long long redfull[2], redfree[2];
    int wtot[16];
};
__device__ __forceinline__ void sp_init_bars(sp_shared &sh, int S) {
    const int tid = threadIdx.x;
    if (tid < S) {
        mbar_init(&sh.full[tid], 1);
        mbar_init(&sh.ready[tid], SP_SUMS);
        mbar_init(&sh.empty[tid], SP_CONSUMERS / 32);
    }
    if (tid < 2) {
        mbar_init(&sh.redfull[tid], SP_CONSUMERS / 32);
        mbar_init(&sh.redfree[tid], SP_REDUCERS / 32);
    }
    mbar_init_fence();
}

/* The route into shared memory (counts, offsets) and its units a expert (row blocks × passes,
 * upt row blocks an expert) scanned into pfx[0..E] over the experts by the NC consumer
 * threads (thread t owns experts [t·per, t·per + per), warps by shuffles, then the warp
 * totals in wtot[NC / 32]); every thread calls it (two block barriers); returns the launch's
 * units, pfx[E]. */
template <int NC = SP_CONSUMERS>
__device__ __forceinline__ int sp_route_units(const int32_t *counts, const int32_t *offsets, int E, int upt, int *pfx, int *cnt,
                                              int *off, int *wtot) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int per = (E + NC - 1) / NC, e0 = min(E, tid * per), e1 = tid < NC ? min(E, e0 + per) : e0;
    int mine = 0;
    for (int e = e0; e < e1; e++) {
        cnt[e] = counts[e];
        off[e] = offsets[e];
        mine += (cnt[e] + SP_SLOTS - 1) / SP_SLOTS * upt;
    }
    int incl = mine;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31 && warp < NC / 32) wtot[warp] = incl;
    __syncthreads();
    if (tid < NC) {
        int run = incl - mine;
        for (int w = 0; w < warp; w++) run += wtot[w];
        for (int e = e0; e < e1; e++) {
            pfx[e] = run;
            run += (cnt[e] + SP_SLOTS - 1) / SP_SLOTS * upt;
        }
        if (tid == NC - 1) pfx[E] = run; /* the last consumer's run is the total */
    }
    __syncthreads();
    return pfx[E];
}

/* A consumer lane's products over groups [g0, g0 + gper) of its two tile rows: cuda_mma.h's
 * sk_products<1, true> (the bitwise contract: sk_frags, the k16 steps of sk_group_mma, the
 * groups' sk_group_scale in group order, two groups' scales a 4-byte load) with the codes
 * read from the swizzled half-tile (two groups' chains interleaved, sk_mma2). cw0 / cw1: the rows'
 * words at group 0 chunk 0 plus the lane's word in the chunk; X = tile row % 8 (both rows),
 * h2 = c / 2; seg: words a segment of the half. gper is even (sp_launch). */
__device__ __forceinline__ void sp_products(const uint32_t *cw0, const uint32_t *cw1, int X, int h2, int seg,
                                            const uint16_t *s0p, const uint16_t *b0p, const uint16_t *s1p,
                                            const uint16_t *b1p, const uint16_t *x16, const float *sxa, const float *sxb,
                                            int g0, int gper, float (&acc)[4]) {
    auto frags = [&](int grp, sk_w &w, uint32_t (&af)[4][4]) {
        const int o = (grp >> 2) * seg + (((((grp & 3) << 1) | h2) ^ X) << 2);
        w.q0 = *reinterpret_cast<const uint2 *>(cw0 + o);
        w.q1 = *reinterpret_cast<const uint2 *>(cw1 + o);
        sk_frags(w, af);
    };
    for (int gi = 0; gi < gper; gi += 2) {
        const int grp = g0 + gi;
        const uint32_t s0 = *reinterpret_cast<const uint32_t *>(s0p + grp), b0 = *reinterpret_cast<const uint32_t *>(b0p + grp);
        const uint32_t s1 = *reinterpret_cast<const uint32_t *>(s1p + grp), b1 = *reinterpret_cast<const uint32_t *>(b1p + grp);
        sk_w wa, wb;
        uint32_t fa[4][4], fb[4][4];
        frags(grp, wa, fa);
        frags(grp + 1, wb, fb);
        wa.s0 = bf_lo(s0); wa.b0 = bf_lo(b0); wa.s1 = bf_lo(s1); wa.b1 = bf_lo(b1);
        wb.s0 = bf_hi(s0); wb.b0 = bf_hi(b0); wb.s1 = bf_hi(s1); wb.b1 = bf_hi(b1);
        float ca[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        sk_mma2(fa, fb, x16 + grp * QGROUP, x16 + (grp + 1) * QGROUP, ca, cb);
        sk_group_scale(wa, ca, sxa[grp], sxb[grp], acc);
        sk_group_scale(wb, cb, sxa[grp + 1], sxb[grp + 1], acc);
    }
}

/* One pair of groups (the low and high halves of the scale / bias words s0, b0 of row r and
 * s1, b1 of row r + 8) of the compile-time instances: the lane's codes words of row r at pa
 * (the first group) and pb (the second), row r + 8's 1 KB (8 swizzled rows) on; x16 of the
 * first group at xa (the second QGROUP on), the two token columns' Σx at sxa, sxb (the
 * second group one on) — sp_products' pair: the same loads, sk_frags, sk_mma2 and
 * sk_group_scale calls onto acc in group order. */
__device__ __forceinline__ void spk_pair(const unsigned char *pa, const unsigned char *pb, uint32_t s0, uint32_t b0, uint32_t s1,
                                         uint32_t b1, const uint16_t *xa, const float *sxa, const float *sxb, float (&acc)[4]) {
    sk_w wa, wb;
    uint32_t fa[4][4], fb[4][4];
    wa.q0 = *reinterpret_cast<const uint2 *>(pa);
    wa.q1 = *reinterpret_cast<const uint2 *>(pa + 8 * SP_SEG * 4);
    sk_frags(wa, fa);
    wb.q0 = *reinterpret_cast<const uint2 *>(pb);
    wb.q1 = *reinterpret_cast<const uint2 *>(pb + 8 * SP_SEG * 4);
    sk_frags(wb, fb);
    wa.s0 = bf_lo(s0); wa.b0 = bf_lo(b0); wa.s1 = bf_lo(s1); wa.b1 = bf_lo(b1);
    wb.s0 = bf_hi(s0); wb.b0 = bf_hi(b0); wb.s1 = bf_hi(s1); wb.b1 = bf_hi(b1);
    float ca[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    sk_mma2(fa, fb, xa, xa + QGROUP, ca, cb);
    sk_group_scale(wa, ca, sxa[0], sxb[0], acc);
    sk_group_scale(wb, cb, sxa[1], sxb[1], acc);
}

/* A direct (down) consumer's four sums of unit w stored to y: rows r0 and r0 + 8 of the
 * unit's row block, the pass's slots 2c and 2c + 1 (those it has). */
__device__ __forceinline__ void sp_direct_store(const sp_args &a, const sp_unit &w, int c, int r0, const float (&tot)[4]) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int jj = 2 * c + (e & 1);
        if (jj < w.n) a.y[(size_t)(w.m0 + jj) * a.ldy + w.rbase + r0 + (e >= 2 ? 8 : 0)] = tot[e];
    }
}

/* Block = four warp roles, unit i in stage i % S, its partials in red buffer i % 2:
 *   producer (1 warp): wait empty[st] (the unit S before is consumed); lane 0 posts the
 *     unit's bytes on full[st] and issues its weight boxes, lane j < n slot j's x row;
 *     full[st] completes when they have landed;
 *   sums (2 warps): wait full[st], Σx of the unit's tokens into the stage and the tokens
 *     rearranged for the B fragments (sk_bperm), arrive ready[st] (64 arrivals);
 *   reducers (2 warps): wait redfull, sum the k-slices in slice order, store, arrive
 *     redfree (2);
 *   consumers (8 warps, cuda_skinny.cu's split: m-tile warp % MT, k-slice warp / MT): wait
 *     ready[st], products, arrive empty[st]; wait redfree, write the partials, arrive
 *     redfull (8 each).
 * The consumers never wait on each other: Σx, the reductions and the copies run beside
 * their products. Measured instead (H200, session 17, µs a gate/up launch at 64 sequences):
 * the eight consumers reducing after a named barrier a unit, 128 (each waits for the
 * slowest); a lead warp an output m-tile summing its group's partials, 184 (the leads
 * waited ~3.5 µs a unit for the others). The down launch in that form (54 units an SM of
 * 16 KB) waited on its reducers ~1 µs a unit; it runs DIRECT instead (1 or 2 consumer sets):
 *   consumers (8 warps a set, m-tile warp % 8 of a 128-row unit; set s = warp / 8 takes the
 *     units i with i % sets == s): wait ready[st], every k-slice of cuda_skinny.cu's split for
 *     K (a.KS) summed apart and added in slice order onto 0 — the reducers' operations —
 *     arrive empty[st], store y; the reducer warps exit at once. */
template <int DIRECT, int KC = 0> /* KC: 0 = K and RB from the arguments; SP_KD_K the down's compile-time instance */
static __global__ void __launch_bounds__(SP_THREADS_SETS(DIRECT > 1 ? DIRECT : 1), 1) skinny_pipe_kernel(const __grid_constant__ sp_args a) {
    static_assert(KC == 0 || (KC == SP_KD_K && DIRECT == 2), "the compile-time instance: the two-set direct down's K = 512");
    TRACE_KERNEL();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr bool SWIGLU = DIRECT == 0; /* the gate/up launch (reducers); the down launch is always direct */
    extern __shared__ __align__(1024) unsigned char sm_raw[];
    __shared__ sp_shared sh;
    unsigned long long *full = sh.full, *ready = sh.ready, *empty = sh.empty, *redfull = sh.redfull, *redfree = sh.redfree;
    /* the swizzled boxes need 1,024-byte aligned destinations (sp_lay leaves the room) */
    unsigned char *sm = sm_raw + ((1024 - ((unsigned)__cvta_generic_to_shared(sm_raw) & 1023)) & 1023);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, c = lane & 3;
    const int RB = KC == SP_KD_K ? 128 : a.RB, S = a.stages, K = KC ? KC : a.K, G = K / QGROUP, xstride = K + 8;
    const int E = a.E, orows = SWIGLU ? RB / 2 : RB, upt = a.rows / orows;
    const sp_layout L = sp_lay(RB, K, S, E);
    int *pfx = reinterpret_cast<int *>(sm + L.pfx), *cnt = pfx + E + 1, *off = cnt + E;
    constexpr int SETS = DIRECT > 1 ? DIRECT : 1, NC = SP_CONSUMERS * SETS; /* consumer sets, threads */
    pdl_trigger();
    sp_init_bars(sh, S);
    pdl_wait(); /* the route is the previous kernels' */
    trace_clock clk;
    clk.start();
    const int U = sp_route_units<NC>(a.counts, a.offsets, E, upt, pfx, cnt, off, sh.wtot);
    const int u0 = (int)((long long)U * blockIdx.x / gridDim.x), u1 = (int)((long long)U * (blockIdx.x + 1) / gridDim.x);
    const int n_mine = u1 - u0;
    const int MT = RB / 16, KS = 8 / MT;
    const int halves = SWIGLU ? 2 : 1;
    int ec = -1; /* this thread's cursor over the experts */

    if (tid >= NC + SP_REDUCERS + SP_SUMS) { /* the producer warp */
        const unsigned wbytes = (unsigned)(halves * orows * (K / 2 + 4 * G));
        /* unit i + 1's slots' x row ids are requested while unit i is issued (an L2 round
         * trip a unit otherwise on the producer's path) */
        auto x_row = [&](const sp_unit &w) { /* this lane's slot's x row (lanes past the unit's slots: none) */
            return lane < w.n ? (a.x_rows ? a.x_rows[w.m0 + lane] : w.m0 + lane) : 0;
        };
        sp_unit nx = n_mine > 0 ? sp_locate(u0, pfx, cnt, off, E, orows, ec) : sp_unit{0, 0, 0, 0};
        int nx_row = x_row(nx);
        for (int i = 0; i < n_mine; i++) {
            const int st = i % S;
            const sp_unit w = nx;
            const int xr = nx_row;
            if (i + 1 < n_mine) {
                nx = sp_locate(u0 + i + 1, pfx, cnt, off, E, orows, ec);
                nx_row = x_row(nx);
            }
            if (i >= S) mbar_wait(&empty[st], (unsigned)(i / S - 1) & 1u);
            unsigned char *stage = sm + (size_t)st * L.stage;
            const unsigned bar = (unsigned)__cvta_generic_to_shared(&full[st]);
            if (lane == 0) {
                sp_expect_tx(bar, wbytes + (unsigned)(w.n * K * 2));
                const int row = w.e * a.rows + w.rbase;
                uint16_t *scs = reinterpret_cast<uint16_t *>(stage + L.scales), *bis = scs + RB * G;
                const unsigned sb = (unsigned)(orows * G * 2); /* a half's scales (biases): one run */
                for (int h = 0; h < halves; h++) {
                    sp_tma3(stage + (size_t)h * orows * K / 2, &a.codes[h], 0, row, 0, bar);
                    sp_bulk(scs + h * orows * G, a.scales[h] + (size_t)row * G, sb, bar);
                    sp_bulk(bis + h * orows * G, a.biases[h] + (size_t)row * G, sb, bar);
                }
            }
            __syncwarp();
            if (lane < w.n)
                sp_bulk(stage + L.x + (size_t)lane * xstride * 2, a.x + (size_t)xr * a.ldx, (unsigned)(K * 2), bar);
        }
        return; /* the consumers wait for every stage: the copies land before the block ends */
    }

    if (tid >= NC + SP_REDUCERS) { /* Σx of each unit's tokens into its stage, the tokens rearranged (PX) */
        const int at = tid - NC - SP_REDUCERS;
        for (int i = 0; i < n_mine; i++) {
            const int st = i % S;
            const sp_unit w = sp_locate(u0 + i, pfx, cnt, off, E, orows, ec);
            unsigned char *stage = sm + (size_t)st * L.stage;
            mbar_wait(&full[st], (unsigned)(i / S) & 1u);
            sk_group_sums_by<true>(reinterpret_cast<const uint16_t *>(stage + L.x), w.n, xstride, G,
                                   reinterpret_cast<float *>(stage + L.xsum), at, SP_SUMS, G + 4);
            mbar_arrive(&ready[st]);
        }
        return;
    }

    if (tid >= NC) { /* each unit's reduction: the k-slices meet in slice order (cuda_skinny.cu's, one n-tile) */
        for (int j = 0; !DIRECT && j < n_mine; j++) { /* DIRECT: the consumers add their own slices */
            const sp_unit w = sp_locate(u0 + j, pfx, cnt, off, E, orows, ec);
            sp_reduce_unit(reinterpret_cast<const float *>(sm + L.red) + (size_t)(j & 1) * 8 * 4 * 32, MT, KS, w, j, redfull,
                           redfree, a.act, a.ld_act);
        }
        return;
    }

    /* consumers: tile rows lr0 = mt·16 + sp_prow(g) and lr0 + 8, in half h at row rr (DIRECT:
     * 8 m-tiles, a warp each, every k-slice of a.KS; with two sets, set s = warp / 8 takes the
     * units i with i % 2 == s) */
    const int mt = DIRECT ? warp & 7 : warp % MT, ks = warp / MT, gper = DIRECT ? G / a.KS : G / KS, g0 = DIRECT ? 0 : ks * gper;
    const int lr0 = mt * 16 + sp_prow(gq), lr1 = lr0 + 8, h = lr0 / orows, rr = lr0 % orows;
    const int seg = orows * SP_SEG; /* words of one segment of a half */
    const size_t cw = (size_t)h * orows * (K / 8) + (size_t)rr * SP_SEG + (c & 1) * 2;
    clk.lap(0);
    if constexpr (KC == SP_KD_K) {
        /* The down instance at K = 512 (opt-in ORCHID_SP_K512=1: on the H100 59.3 -> 59.7 µs,
         * session 47 — that launch runs near its DRAM rate there; kept for the H200, where
         * its ~23 % fewer consumer instructions may count; DIRECT, two sets; G = 8, 128-row units): warp w takes
         * m-tile dmt = w & 7 of the units i ≡ w / 8 (mod 2); lane (gq, c)'s rows dr0 =
         * 16·dmt + sp_prow(gq) and dr0 + 8 (X = sp_prow(gq)); its 8 groups as the generic
         * loop's two k-slices of sp_products (two pairs each, onto a part from 0), added to tot
         * in slice order — with every offset the stage base + a per-lane constant + an
         * immediate, a slice's 4 scales (biases) of a row one 8-byte load, no division for the stage */
        constexpr int DG = SP_KD_K / QGROUP, DGP = DG / SP_KD_KS, DXS = SP_KD_K + 8, DSX = DG + 4, DRB = 128;
        constexpr int DSEGB = DRB * SP_SEG * 4; /* bytes of one 128-byte-a-row segment (4 groups of 128 rows) */
        static_assert(DG == 8 && DGP == 4, "the instance's split: 2 k-slices of 4 groups");
        const int dmt = warp & 7, drr = sp_prow(gq), dr0 = dmt * 16 + drr;
        int dco[4]; /* codes: the lane's two words of group chunk j of row dr0 (row dr0 + 8: 1 KB on) */
#pragma unroll
        for (int j = 0; j < 4; j++) dco[j] = (dr0 * SP_SEG + (c & 1) * 2) * 4 + ((((j << 1) | (c >> 1)) ^ drr) << 4);
        const int dso = (int)L.scales + dr0 * DG * 2;
        const int dxo = (int)L.x + (gq * DXS + 16 * c) * 2;
        const int dsx = (int)L.xsum + 2 * c * DSX * 4;
        int st = warp >> 3, ph = 0; /* unit i's stage i % S and parity (i / S) & 1; i steps by 2 (S >= 2) */
        if (st >= S) st -= S, ph = 1;
        for (int i = warp >> 3; i < n_mine; i += 2) {
            const unsigned char *base = sm + (size_t)st * L.stage;
            mbar_wait(&ready[st], (unsigned)ph);
            clk.lap(1);
            float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1 /* both slices unrolled spilled (80 registers) */
            for (int k = 0; k < SP_KD_KS; k++) {
                /* the slice's 4 scales (biases) of rows dr0, dr0 + 8: 8-byte loads */
                const uint2 s0v = *reinterpret_cast<const uint2 *>(base + dso + k * 8);
                const uint2 s1v = *reinterpret_cast<const uint2 *>(base + dso + k * 8 + 8 * DG * 2);
                const uint2 b0v = *reinterpret_cast<const uint2 *>(base + dso + k * 8 + DRB * DG * 2);
                const uint2 b1v = *reinterpret_cast<const uint2 *>(base + dso + k * 8 + DRB * DG * 2 + 8 * DG * 2);
                const uint32_t s0a[2] = {s0v.x, s0v.y}, s1a[2] = {s1v.x, s1v.y}, b0a[2] = {b0v.x, b0v.y}, b1a[2] = {b1v.x, b1v.y};
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int gi = 0; gi < DGP; gi += 2) { /* groups grp = 4k + gi, grp + 1: sp_products' pair */
                    const int grp = k * DGP + gi, sg = k * DSEGB; /* grp % 4 = gi, grp / 4 = k */
                    const float *sxa = reinterpret_cast<const float *>(base + dsx + grp * 4);
                    spk_pair(base + dco[gi] + sg, base + dco[gi + 1] + sg, s0a[gi >> 1], b0a[gi >> 1], s1a[gi >> 1], b1a[gi >> 1],
                             reinterpret_cast<const uint16_t *>(base + dxo + grp * QGROUP * 2), sxa, sxa + DSX, part);
                }
#pragma unroll
                for (int e = 0; e < 4; e++) tot[e] += part[e];
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[st]);
            sp_direct_store(a, sp_locate(i + u0, pfx, cnt, off, E, orows, ec), c, dr0, tot);
            st += 2;
            if (st >= S) st -= S, ph ^= 1;
        }
    }
    for (int i = DIRECT ? warp >> 3 : 0; !KC && i < n_mine; i += SETS) { /* KC: the loop above */
        const int st = i % S, rb = i & 1;
        const unsigned char *stage = sm + (size_t)st * L.stage;
        const uint32_t *codes = reinterpret_cast<const uint32_t *>(stage);
        const uint16_t *scs = reinterpret_cast<const uint16_t *>(stage + L.scales), *bis = scs + RB * G;
        const uint16_t *xs = reinterpret_cast<const uint16_t *>(stage + L.x);
        const float *xsum = reinterpret_cast<const float *>(stage + L.xsum);
        mbar_wait(&ready[st], (unsigned)(i / S) & 1u);
        clk.lap(1);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (DIRECT) {
            /* the k-slices' sums added in slice order onto 0: the reducers' operations, here in
             * the warp that made them (no hand-off), stored straight to y */
            float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int k = 0; k < a.KS; k++) {
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                sp_products(codes + cw, codes + cw + 8 * SP_SEG, rr & 7, c >> 1, seg, scs + lr0 * G, bis + lr0 * G,
                            scs + lr1 * G, bis + lr1 * G, xs + (size_t)gq * xstride + 16 * c, xsum + (2 * c) * (G + 4),
                            xsum + (2 * c + 1) * (G + 4), k * gper, gper, part);
#pragma unroll
                for (int e = 0; e < 4; e++) tot[e] += part[e];
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[st]);
            sp_direct_store(a, sp_locate(u0 + i, pfx, cnt, off, E, orows, ec), c, lr0, tot); /* lr1 = lr0 + 8 */
            continue;
        }
        sp_products(codes + cw, codes + cw + 8 * SP_SEG, rr & 7, c >> 1, seg, scs + lr0 * G, bis + lr0 * G, scs + lr1 * G,
                    bis + lr1 * G, xs + (size_t)gq * xstride + 16 * c, xsum + (2 * c) * (G + 4), xsum + (2 * c + 1) * (G + 4),
                    g0, gper, acc);
        sp_handoff(&empty[st], redfree, redfull, reinterpret_cast<float *>(sm + L.red), i, rb, warp, lane, acc, clk);
    }
    clk.lap(4);
    clk.finish(TRACE_WAITED);
#else
    pdl_trigger();
    pdl_wait();
#endif
}

/* ---- Gate/up at K = 2,048 with each (expert, pass)'s x staged once (the default; ORCHID_SP_K2048=0 off) ----
 * skinny_pipe_kernel<0> copies a unit's slots' x rows (4 KB each) into its stage and
 * recomputes their Σx for every unit, though an expert's 32 row blocks of one pass read the
 * same rows; its reducers walk all 128 (row, slot) outputs of a unit whatever its slots
 * (2.3 on average at 64 tokens) and every role finds its unit by sp_locate's division. A SASS
 * count (docs/PERFORMANCE.md, session 46) put that at ~1,600 of a unit's ~7,250
 * warp-instructions; on the H200 the launch is held by its issue rate. This kernel:
 *  - orders an expert's units pass-major (pass p, then row block rb = 0..upt-1), so an
 *    (expert, pass) — an epoch — is up to upt consecutive units of a block's range; its x rows
 *    go once into one of two x buffers (barriers xfull: the producer's copies, xready: the Σx
 *    warps' sums and rearrangement, xempty: the consumers' release after the epoch's last
 *    unit) and the stages carry only the weights (36 KB: 4 stages fit beside the two buffers);
 *  - walks the units with a cursor (spx_cursor: one binary search and division a block, then
 *    increments), the consumers with the row block only (epoch starts at rb = 0, ends at upt - 1);
 *  - has the consumers write their partials swizzled (element q of lane l at l ^ q of row q)
 *    so that a reducer warp takes one slot pair — 32 lanes = 8 fragment rows × the 4 outputs
 *    (2 slots × rows g, g + 8) — conflict-free, and only the unit's slot pairs.
 * The consumers make skinny_pipe_kernel<0>'s sums (the same loads, sk_frags, sk_mma2 and
 * sk_group_scale in group order), the reducers add the same 4 slices from 0 in slice order
 * and the Σx are sk_group_sums_by's: the same act bits (test_moe compares them). Measured
 * (H100, session 47, 64 sequences): gate/up 113.7 -> 103.8 µs a layer; the consumers alone
 * compiled for K = 2,048 (session 46's instance, the loop above without the rest) 112.1,
 * removed. On by default where the shape is its own (ORCHID_SP_K2048=0: the generic kernel). */
struct spx_layout {
    size_t stage, xsum, xbuf, xb, red, pfx, total;
};
__host__ __device__ __forceinline__ spx_layout spx_lay(int S, int E) {
    constexpr int G = SP_KC_K / QGROUP;
    spx_layout l;
    l.stage = (size_t)SP_KC_RB * SP_KC_K / 2 + (size_t)4 * SP_KC_RB * G;    /* codes, scales, biases: 36,864 (1,024-aligned) */
    l.xsum = (size_t)SP_SLOTS * (SP_KC_K + 8) * 2;                             /* in an x buffer: 8 rows of K + 8 bf16, then Σx */
    l.xbuf = (l.xsum + (size_t)SP_SLOTS * (G + 4) * 4 + 1023) & ~(size_t)1023; /* 34,816 */
    l.xb = l.stage * S;
    l.red = l.xb + 2 * l.xbuf;
    l.pfx = l.red + (size_t)2 * 8 * 4 * 32 * 4;
    l.total = l.pfx + (size_t)4 * ((E + 1) + 2 * E) + 1024; /* + the base's alignment */
    return l;
}

/* A block's walk over its units: expert e (with units), pass p of its `passes`, row block rb
 * of upt; an expert's units are p·upt + rb. spx_first: unit u's (its expert by sp_owner);
 * spx_next: the unit after (the caller knows there is one). */
struct spx_cursor {
    int e, p, rb, passes;
};
__device__ __forceinline__ spx_cursor spx_first(int u, const int *pfx, const int *cnt, int E, int upt) {
    const int lo = sp_owner(u, pfx, E);
    spx_cursor k;
    const int v = u - pfx[lo];
    k.e = lo;
    k.p = v / upt;
    k.rb = v - k.p * upt;
    k.passes = (cnt[lo] + SP_SLOTS - 1) / SP_SLOTS;
    return k;
}
__device__ __forceinline__ void spx_next(spx_cursor &k, const int *pfx, const int *cnt, int upt) {
    if (++k.rb < upt) return;
    k.rb = 0;
    if (++k.p < k.passes) return;
    k.p = 0;
    do k.e++;
    while (pfx[k.e + 1] == pfx[k.e]); /* experts without slots have no units */
    k.passes = (cnt[k.e] + SP_SLOTS - 1) / SP_SLOTS;
}

static __global__ void __launch_bounds__(SP_THREADS, 1) skinny_pipe_x_kernel(const __grid_constant__ sp_args a) {
    TRACE_KERNEL();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int K = SP_KC_K, G = K / QGROUP, RB = SP_KC_RB, OR = RB / 2, XS = K + 8, SXS = G + 4;
    constexpr int NC = SP_CONSUMERS, NW = NC / 32;
    extern __shared__ __align__(1024) unsigned char sm_raw[];
    /* stages: full (the producer's weight copies), empty (the 8 consumers); x buffers: xfull,
     * xready (the 64 Σx threads), xempty (the 8 consumers, after an epoch's last unit); the
     * red buffers: redfull (8 consumers), redfree (2 reducers) */
    __shared__ __align__(8) unsigned long long full[SP_MAX_STAGES], empty[SP_MAX_STAGES], xfull[2], xready[2], xempty[2],
        redfull[2], redfree[2];
    __shared__ int wtot[16];
    unsigned char *sm = sm_raw + ((1024 - ((unsigned)__cvta_generic_to_shared(sm_raw) & 1023)) & 1023);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int S = a.stages, E = a.E, upt = a.rows / OR;
    const spx_layout L = spx_lay(S, E);
    int *pfx = reinterpret_cast<int *>(sm + L.pfx), *cnt = pfx + E + 1, *off = cnt + E;
    pdl_trigger();
    if (tid < S) {
        mbar_init(&full[tid], 1);
        mbar_init(&empty[tid], NW);
    }
    if (tid < 2) {
        mbar_init(&xfull[tid], 1);
        mbar_init(&xready[tid], SP_SUMS);
        mbar_init(&xempty[tid], NW);
        mbar_init(&redfull[tid], NW);
        mbar_init(&redfree[tid], SP_REDUCERS / 32);
    }
    mbar_init_fence();
    pdl_wait(); /* the route is the previous kernels' */
    trace_clock clk;
    clk.start();
    const int U = sp_route_units<NC>(a.counts, a.offsets, E, upt, pfx, cnt, off, wtot); /* its block barriers order the inits */
    const int u0 = (int)((long long)U * blockIdx.x / gridDim.x), u1 = (int)((long long)U * (blockIdx.x + 1) / gridDim.x);
    const int n_mine = u1 - u0;
    if (n_mine <= 0) return;
    spx_cursor k = spx_first(u0, pfx, cnt, E, upt);
    /* the unit's (epoch's) first slot and slot count */
    auto slot0 = [&](const spx_cursor &q) { return off[q.e] + q.p * SP_SLOTS; };
    auto slots = [&](const spx_cursor &q) { return min(SP_SLOTS, cnt[q.e] - q.p * SP_SLOTS); };

    if (tid >= NC + SP_REDUCERS + SP_SUMS) { /* the producer warp */
        constexpr unsigned wbytes = (unsigned)(RB * (K / 2 + 4 * G));
        int st = 0, ph = 0, ep = 0; /* unit i's stage and parity; epochs begun */
        for (int i = 0; i < n_mine; i++) {
            if (i == 0 || k.rb == 0) { /* an epoch: its slots' x rows into buffer ep & 1 once the epoch two before is done */
                const int xb = ep & 1, n = slots(k), m0 = slot0(k);
                if (ep >= 2) mbar_wait(&xempty[xb], (unsigned)((ep >> 1) - 1) & 1u);
                const int xr = lane < n ? (a.x_rows ? a.x_rows[m0 + lane] : m0 + lane) : 0;
                const unsigned xbar = (unsigned)__cvta_generic_to_shared(&xfull[xb]);
                if (lane == 0) sp_expect_tx(xbar, (unsigned)(n * K * 2));
                __syncwarp();
                if (lane < n) sp_bulk(sm + L.xb + xb * L.xbuf + (size_t)lane * XS * 2, a.x + (size_t)xr * a.ldx, K * 2, xbar);
                ep++;
            }
            if (i >= S) mbar_wait(&empty[st], (unsigned)(ph ^ 1)); /* unit i - S's consumers are done */
            if (lane == 0) {
                unsigned char *stage = sm + (size_t)st * L.stage;
                const unsigned bar = (unsigned)__cvta_generic_to_shared(&full[st]);
                sp_expect_tx(bar, wbytes);
                const int row = k.e * a.rows + k.rb * OR;
                uint16_t *scs = reinterpret_cast<uint16_t *>(stage + RB * K / 2), *bis = scs + RB * G;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    sp_tma3(stage + h * OR * K / 2, &a.codes[h], 0, row, 0, bar);
                    sp_bulk(scs + h * OR * G, a.scales[h] + (size_t)row * G, OR * G * 2, bar);
                    sp_bulk(bis + h * OR * G, a.biases[h] + (size_t)row * G, OR * G * 2, bar);
                }
            }
            if (i + 1 < n_mine) spx_next(k, pfx, cnt, upt);
            if (++st == S) st = 0, ph ^= 1;
        }
        return; /* the consumers wait for every copy: they land before the block ends */
    }

    if (tid >= NC + SP_REDUCERS) { /* Σx of each epoch's tokens, the tokens rearranged (sk_bperm) in place */
        const int at = tid - NC - SP_REDUCERS;
        for (int i = 0, ep = 0; i < n_mine; ep++) {
            const int xb = ep & 1;
            unsigned char *xbuf = sm + L.xb + xb * L.xbuf;
            mbar_wait(&xfull[xb], (unsigned)(ep >> 1) & 1u);
            sk_group_sums_by<true>(reinterpret_cast<const uint16_t *>(xbuf), slots(k), XS, G,
                                   reinterpret_cast<float *>(xbuf + L.xsum), at, SP_SUMS, SXS);
            mbar_arrive(&xready[xb]);
            i += upt - k.rb; /* the epoch's units; then the next epoch's first */
            if (i < n_mine) {
                k.rb = upt - 1;
                spx_next(k, pfx, cnt, upt);
            }
        }
        return;
    }

    if (tid >= NC) { /* reducers: warp rw takes slot pairs rw, rw + 2, ..: lane = fragment row gf × output k4 */
        const int rw = (tid - NC) >> 5, k4 = lane & 3, gf = lane >> 2;
        const int rofs = sp_prow(gf) + (k4 >= 2 ? 8 : 0), sl = k4 & 1;
        for (int j = 0; j < n_mine; j++) {
            const int rb = j & 1, n = slots(k), m0 = slot0(k), r = k.rb * OR + rofs;
            const float *red = reinterpret_cast<const float *>(sm + L.red) + (size_t)rb * NW * 4 * 32;
            mbar_wait(&redfull[rb], (unsigned)(j >> 1) & 1u);
            for (int pr = rw; 2 * pr < n; pr += SP_REDUCERS / 32) {
                /* consumer warp w = 2·slice + m-tile wrote its output k4 of lane (gf, pr) at
                 * [w][k4][(4·gf + pr) ^ k4]; the gate's m-tile 0, the up's 1 */
                const int pos = k4 * 32 + ((gf * 4 + pr) ^ k4), jj = 2 * pr + sl;
                float v = 0.0f, u = 0.0f;
#pragma unroll
                for (int s = 0; s < 4; s++) v += red[(size_t)(2 * s) * 128 + pos];
#pragma unroll
                for (int s = 0; s < 4; s++) u += red[(size_t)(2 * s + 1) * 128 + pos];
                if (jj < n) a.act[(size_t)(m0 + jj) * a.ld_act + r] = f2bf(silu(v) * u);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&redfree[rb]);
            if (j + 1 < n_mine) spx_next(k, pfx, cnt, upt);
        }
        return;
    }

    /* consumers: skinny_pipe_kernel<0>'s split at this shape (G = 32, orows 16, MT 2, KS 4):
     * warp w takes m-tile cmt = w & 1 (= the half: gate, up) and groups [8·cks, 8·cks + 8),
     * cks = w >> 1; lane (gq, c)'s rows are half cmt's rows crr = sp_prow(gq) and crr + 8
     * (X = crr). sp_products' loop with every shape a constant, its four group pairs unrolled
     * (spk_pair): each shared read is the stage's (the x buffer's) base + a per-lane offset set
     * once here + an immediate (it must be fully unrolled: in session 46's CPU study
     * #pragma unroll 2 put the per-pair arrays in local memory). The same loads of the same
     * bits, the same sk_frags, sk_mma2 and sk_group_scale calls in the same group order onto
     * acc = 0: skinny_pipe_kernel<0>'s sums. cco[j]: the byte offset of the lane's two words in
     * group chunk j (group % 4 = j) of its slice's first segment, swizzled ((2j + c/2) ^ X);
     * cso: the slice's 8 scales of row cr0 (16 bytes from group cg0), of cr0 + 8 8 rows on, the
     * biases RB·G on; cxo / csx: the lane's x (x16 of group cg0) and Σx (columns 2c, 2c + 1). */
    const int gq = lane >> 2, c = lane & 3;
    constexpr int CGP = 8, CSEGB = OR * SP_SEG * 4;
    static_assert(G == 32 && CGP * 4 == G && RB == 32, "the instance's split: 2 m-tiles × 4 k-slices of 8 groups");
    const int cmt = warp & 1, cks = warp >> 1, cg0 = cks * CGP, crr = sp_prow(gq), cr0 = cmt * 16 + crr;
    int cco[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        cco[j] = (cmt * OR * (K / 8) + crr * SP_SEG + (c & 1) * 2) * 4 + (cg0 >> 2) * CSEGB + ((((j << 1) | (c >> 1)) ^ crr) << 4);
    const int cso = RB * K / 2 + (cr0 * G + cg0) * 2;
    const int cxo = (gq * XS + 16 * c + cg0 * QGROUP) * 2;
    const int csx = (int)L.xsum + (2 * c * SXS + cg0) * 4;
    clk.lap(0);
    int st = 0, ph = 0, ep = 0, rb = k.rb;
    const unsigned char *xbase = sm + L.xb;
    float *red0 = reinterpret_cast<float *>(sm + L.red);
    for (int i = 0; i < n_mine; i++) {
        if (i == 0 || rb == 0) { /* an epoch's first unit: its x and Σx */
            xbase = sm + L.xb + (ep & 1) * L.xbuf;
            mbar_wait(&xready[ep & 1], (unsigned)(ep >> 1) & 1u);
            ep++;
        }
        const unsigned char *base = sm + (size_t)st * L.stage;
        mbar_wait(&full[st], (unsigned)ph);
        clk.lap(1);
        const uint4 s0v = *reinterpret_cast<const uint4 *>(base + cso);
        const uint4 s1v = *reinterpret_cast<const uint4 *>(base + cso + 8 * G * 2);
        const uint4 b0v = *reinterpret_cast<const uint4 *>(base + cso + RB * G * 2);
        const uint4 b1v = *reinterpret_cast<const uint4 *>(base + cso + RB * G * 2 + 8 * G * 2);
        const uint32_t s0a[4] = {s0v.x, s0v.y, s0v.z, s0v.w}, s1a[4] = {s1v.x, s1v.y, s1v.z, s1v.w};
        const uint32_t b0a[4] = {b0v.x, b0v.y, b0v.z, b0v.w}, b1a[4] = {b1v.x, b1v.y, b1v.z, b1v.w};
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int gi = 0; gi < CGP; gi += 2) {
            const int j = gi & 3, sg = (gi >> 2) * CSEGB;
            const float *sxa = reinterpret_cast<const float *>(xbase + csx + gi * 4);
            spk_pair(base + cco[j] + sg, base + cco[j + 1] + sg, s0a[gi >> 1], b0a[gi >> 1], s1a[gi >> 1], b1a[gi >> 1],
                     reinterpret_cast<const uint16_t *>(xbase + cxo + gi * QGROUP * 2), sxa, sxa + SXS, acc);
        }
        __syncwarp();
        if (lane == 0) {
            mbar_arrive(&empty[st]);                                              /* the stage */
            if (i == n_mine - 1 || rb == upt - 1) mbar_arrive(&xempty[(ep - 1) & 1]); /* the epoch's x */
        }
        clk.lap(2);
        const int rbuf = i & 1;
        if (i >= 2) mbar_wait(&redfree[rbuf], (unsigned)((i >> 1) - 1) & 1u);
        float *red = red0 + (size_t)rbuf * NW * 4 * 32;
#pragma unroll
        for (int q = 0; q < 4; q++) red[((size_t)warp * 4 + q) * 32 + (lane ^ q)] = acc[q]; /* swizzled: the reducers' pairs */
        __syncwarp();
        if (lane == 0) mbar_arrive(&redfull[rbuf]);
        clk.lap(3);
        rb = rb + 1 == upt ? 0 : rb + 1;
        if (++st == S) st = 0, ph ^= 1;
    }
    clk.lap(4);
    clk.finish(TRACE_WAITED);
#else
    pdl_trigger();
    pdl_wait();
#endif
}

static int sp_sms = 0, sp_optin = 0, sp_sm90 = 0; /* sp_sm90: the device takes them (init) */
static int sp_on_swiglu = 0, sp_on_down = 0;       /* which of the two launches go here */
static int sp_down_sets = 2; /* consumer sets of the direct down launch (ORCHID_SP_DOWN_SETS=1: one; A/B) */
static int sp_launches = 0;                                  /* launches taken (tests: the kernel ran) */
/* skinny_pipe_x_kernel for the gate/up launches of its shape: on unless ORCHID_SP_K2048=0 (read
 * at init), the tests' override (-1: the environment, 0: never, 1: whenever the shape
 * matches), launches it took */
static int sp_kc_env = 1, sp_kc_force = -1, sp_kc_launches = 0;
static int sp_kd_env = 0, sp_kd_force = -1, sp_kd_launches = 0; /* the same for the down's K = 512 instance (opt-in) */
static PFN_cuTensorMapEncodeTiled_v12000 sp_encode = NULL;    /* the driver's encoder (init) */
static int sp_stages_env(const char *name) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : 0;
}

/* Device facts, the kernels' shared-memory opt-in and the driver's tensor-map encoder (sm_90+
 * with a driver that has it; otherwise every launch stays on cuda_skinny.cu's kernel). The
 * GPU tests switch both forms on to hold their bits to that kernel's. */
extern "C" int cuda_skinny_pipe_init(char *err, size_t errlen) {
    cuda_caps caps;
    cudaError_t e = device_caps(&caps);
    const int major = e == cudaSuccess ? caps.major : 0;
    sp_optin = caps.optin;
    sp_sms = caps.sms;
    /* the dynamic opt-in is what the static barriers leave of the block's maximum */
    cudaFuncAttributes fa0, fa1, fa2;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa0, skinny_pipe_kernel<0>);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa1, skinny_pipe_kernel<2>);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa2, skinny_pipe_x_kernel);
    if (e == cudaSuccess) {
        size_t st = fa0.sharedSizeBytes > fa1.sharedSizeBytes ? fa0.sharedSizeBytes : fa1.sharedSizeBytes;
        sp_optin -= (int)(st > fa2.sharedSizeBytes ? st : fa2.sharedSizeBytes);
    }
    if (e == cudaSuccess) e = cudaFuncSetAttribute(skinny_pipe_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, sp_optin);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(skinny_pipe_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, sp_optin);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(skinny_pipe_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, sp_optin);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(skinny_pipe_x_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sp_optin);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(skinny_pipe_kernel<2, SP_KD_K>, cudaFuncAttributeMaxDynamicSharedMemorySize, sp_optin);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny_pipe: device attributes: %s", cudaGetErrorString(e));
    sp_sm90 = 0;
    /* the sm_90a body must be what runs (another architecture or a build without sm_90a gets
     * the empty fallback kernel), and the driver must have the encoder: otherwise the grouped
     * kernel takes every launch */
    const int code = major == 9 ? cuda_sm90a_code(err, errlen) : 0;
    if (code < 0) return code;
    if (code == 1) {
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        void *fn = NULL;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess && fn) {
            sp_encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
            sp_sm90 = 1;
        }
        (void)cudaGetLastError();
    }
    /* default: both launches here (the down launch in its direct form with two consumer
     * sets since session 30; its reducer form lost to cuda_skinny.cu's kernel in session 17:
     * docs/PERFORMANCE.md); ORCHID_SK_PIPE=0: neither, =1: both, =swiglu or =down: that one
     * only (A/B) */
    const char *pe = getenv("ORCHID_SK_PIPE");
    const bool set = pe && *pe, sw = set && !strcmp(pe, "swiglu"), dn = set && !strcmp(pe, "down");
    const bool all = set && strcmp(pe, "0") && !sw && !dn;
    sp_on_swiglu = sp_sm90 && (!set || all || sw);
    sp_on_down = sp_sm90 && (!set || all || dn);
    sp_down_sets = sp_stages_env("ORCHID_SP_DOWN_SETS") == 1 ? 1 : 2;
    sp_kc_env = env_flag_or("ORCHID_SP_K2048", true); /* =0: the gate/up's generic kernel at K = 2,048 too (A/B) */
    sp_kd_env = env_flag("ORCHID_SP_K512"); /* opt-in (A/B, for the H200): the down's K = 512 instance */
    return 0;
}

extern "C" int cuda_skinny_pipe_enable(int on) {
    const int was = sp_on_swiglu | sp_on_down << 1;
    sp_on_swiglu = sp_sm90 && (on & 1);
    sp_on_down = sp_sm90 && (on & 2);
    return was;
}

extern "C" int cuda_skinny_pipe_down_sets(int sets) {
    const int was = sp_down_sets;
    sp_down_sets = sets == 1 ? 1 : 2;
    return was;
}

extern "C" int cuda_skinny_pipe_launches(void) { return sp_launches; }

extern "C" int cuda_skinny_pipe_k2048_force(int mode) {
    sp_kc_force = mode < 0 ? -1 : mode ? 1 : 0;
    return sp_sm90; /* the kernel is in the sm_90a body with the rest */
}

extern "C" int cuda_skinny_pipe_k2048_launches(void) { return sp_kc_launches; }

extern "C" int cuda_skinny_pipe_k512_force(int mode) {
    sp_kd_force = mode < 0 ? -1 : mode ? 1 : 0;
    return sp_sm90;
}

extern "C" int cuda_skinny_pipe_k512_launches(void) { return sp_kd_launches; }

/* Stages of a launch: as many as fit the opt-in (lay(S): the layout's bytes at S stages), at
 * most cap or the environment's `name` (2..SP_MAX_STAGES) where set; 0 when fewer than 2 fit.
 * Caps measured (H100, session 47, 64 sequences): the direct down 4 (all that fit) -> 3
 * stages 59.0 -> 57.5 µs a layer, skinny_pipe_x_kernel 4 / 3 / 2 stages 103.7 / 103.2 / 102.7
 * (the forward 12.92 / 12.80 / 12.75 ms: a smaller block leaves the SM to the shared
 * expert's launches beside it) — 3 kept for the H200's higher rate (more bytes in flight). */
template <class Lay>
static int sp_fit_stages(const char *name, int cap, Lay lay) {
    const int want = sp_stages_env(name), lim = want >= 2 ? want : cap;
    int S = SP_MAX_STAGES;
    while (S >= 2 && lay(S) > (size_t)sp_optin) S--;
    if (lim < S) S = lim;
    return S >= 2 ? S : 0;
}
static int sp_stages(int RB, int K, int E, bool swiglu) {
    return sp_fit_stages(swiglu ? "ORCHID_SP_STAGES_SWIGLU" : "ORCHID_SP_STAGES_DOWN", swiglu ? SP_MAX_STAGES : 3,
                         [&](int S) { return sp_lay(RB, K, S, E).total; });
}
static int spx_stages(int E) {
    return sp_fit_stages("ORCHID_SP_STAGES_SWIGLU", 3, [&](int S) { return spx_lay(S, E).total; });
}

/* The codes' tensor maps of one stack of expert matrices (boxes of orows rows × `inner`
 * 128-byte segments), encoded once per (stack, box) and kept: a forward reuses its layers'
 * weights every step and encoding costs host time. The table is the backend thread's (one
 * stream of launches); a full table encodes without keeping. */
struct sp_map {
    cuda_qmat w; /* the stack it describes (w.codes NULL: a free slot) */
    int orows, inner;
    CUtensorMap m;
};
#define SP_MAP_CACHE 1024
static sp_map sp_cache[SP_MAP_CACHE];

/* 0 = encoded; the encoder's refusal (CUresult) otherwise. The view (32 words, rows, K/256
 * segments), strides K/2 and 128 bytes, swizzled 128B. */
static int sp_encode_map(const cuda_qmat &w, int orows, int inner, sp_map *out) {
    const int K = w.cols;
    const cuuint64_t rows = (cuuint64_t)w.rows * (cuuint64_t)(w.n_mats > 0 ? w.n_mats : 1);
    const cuuint32_t one[3] = {1, 1, 1};
    const cuuint64_t dim[3] = {SP_SEG, rows, (cuuint64_t)K / 256}, str[2] = {(cuuint64_t)K / 2, 128};
    const cuuint32_t box[3] = {SP_SEG, (cuuint32_t)orows, (cuuint32_t)inner};
    const CUresult r = sp_encode(&out->m, CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, (void *)w.codes, dim, str, box, one,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    out->w = w;
    out->orows = orows;
    out->inner = inner;
    return (int)r;
}

/* A freed and re-made model may get a stack at the same address with other shapes: every
 * field of the stack is the key. */
static bool sp_same(const cuda_qmat &a, const cuda_qmat &b) {
    return a.codes == b.codes && a.scales == b.scales && a.biases == b.biases && a.rows == b.rows && a.cols == b.cols &&
           a.n_mats == b.n_mats && a.bits == b.bits;
}
static const CUtensorMap *sp_map_for(const cuda_qmat &w, int orows, int inner, sp_map *scratch, int *rc) {
    const size_t h0 = ((uintptr_t)w.codes >> 12) * 2654435761u % SP_MAP_CACHE;
    for (size_t i = 0; i < SP_MAP_CACHE; i++) {
        sp_map *s = &sp_cache[(h0 + i) % SP_MAP_CACHE];
        if (s->w.codes && s->orows == orows && s->inner == inner && sp_same(s->w, w)) return &s->m;
        if (!s->w.codes) return (*rc = sp_encode_map(w, orows, inner, s)) ? (s->w.codes = NULL, nullptr) : &s->m;
    }
    return (*rc = sp_encode_map(w, orows, inner, scratch)) ? nullptr : &scratch->m;
}

/* Whether a stack's codes, scales and biases (and the second's, w1 non-NULL) start on 16
 * bytes, as the tensor maps and bulk copies need. */
static bool sp_aligned(const cuda_qmat &w0, const cuda_qmat *w1) {
    const uintptr_t al = (uintptr_t)w0.codes | (uintptr_t)w0.scales | (uintptr_t)w0.biases |
                         (w1 ? (uintptr_t)w1->codes | (uintptr_t)w1->scales | (uintptr_t)w1->biases : 0);
    return (al & 15) == 0;
}

/* 1 = launched; 0 = this case is not the pipelined kernel's (the caller launches
 * cuda_skinny.cu's); negative = error. RB: cuda_skinny.cu's rows a tile for K. Shapes it
 * takes: K a multiple of 256 (whole 128-byte codes segments), whole row blocks, a half's
 * scales a whole number of 16-byte chunks, 16-byte aligned operands, boxes of at most 256
 * rows. */
static int sp_launch(const struct cuda_ctx *c, sp_args a, const cuda_qmat &w0, const cuda_qmat *w1, bool swiglu,
                     const char *what) {
    /* the down launch only in its direct form (its reducer form lost, session 17: else the
     * grouped kernel): 128-row units, each warp an m-tile over all of cuda_skinny.cu's
     * k-slices for K (a.KS of its RB), no reducers */
    if (!swiglu) {
        if (a.RB < 16 || a.RB > 128 || 128 % a.RB || w0.rows % 128) return 0;
        a.KS = 8 / (a.RB / 16);
        a.RB = 128;
    }
    const int K = w0.cols, G = K / QGROUP, orows = swiglu ? a.RB / 2 : a.RB;
    if (!(swiglu ? sp_on_swiglu : sp_on_down) || a.RB < 16 || w0.bits != 4 || K % 256 || a.E > SP_MAX_E || a.n_slots < 1 ||
        orows > 256)
        return 0;
    if (w0.rows % orows || a.ldx % 8 || ((uintptr_t)a.x & 15) || (orows * G * 2) % 16) return 0;
    if (!swiglu ? G % a.KS || (G / a.KS) % 2 : (G / (8 / (a.RB / 16))) % 2) return 0; /* a warp's groups go two at a time (sp_products) */
    if (w0.n_mats < a.E || (w1 && (w1->cols != K || w1->rows != w0.rows || w1->bits != 4 || w1->n_mats < a.E))) return 0;
    if (!sp_aligned(w0, w1)) return 0;
    a.stages = sp_stages(a.RB, K, a.E, swiglu);
    if (!a.stages) return 0;
    a.rows = w0.rows;
    a.K = K;
    for (int h = 0; h < (w1 ? 2 : 1); h++) {
        const cuda_qmat &w = h ? *w1 : w0;
        sp_map scratch;
        int rc = 0;
        const CUtensorMap *m = sp_map_for(w, orows, K / 256, &scratch, &rc);
        if (!m) return errorf(c->err, c->errlen, ST_DEVICE, "%s: tensor map refused (CUresult %d)", what, rc);
        a.codes[h] = *m;
        a.scales[h] = w.scales;
        a.biases[h] = w.biases;
    }
    size_t smem = sp_lay(a.RB, K, a.stages, a.E).total;
    const dim3 grid(sp_sms);
    /* skinny_pipe_x_kernel where the shape is the one it was built for (and two stages fit
     * beside its x buffers) */
    const bool kx = swiglu && K == SP_KC_K && a.RB == SP_KC_RB && (sp_kc_force < 0 ? sp_kc_env : sp_kc_force);
    const int xs = kx ? spx_stages(a.E) : 0;
    const bool kd = !swiglu && sp_down_sets == 2 && (sp_kd_force < 0 ? sp_kd_env : sp_kd_force) && K == SP_KD_K &&
                    a.KS == SP_KD_KS;
    if (xs) {
        a.stages = xs;
        smem = spx_lay(xs, a.E).total;
        LAUNCH_TRY(c, launch_k_pdl(sk_pdl(), skinny_pipe_x_kernel, grid, dim3(SP_THREADS), smem, cstream(c), a), what);
    } else if (swiglu)
        LAUNCH_TRY(c, launch_k_pdl(sk_pdl(), skinny_pipe_kernel<0>, grid, dim3(SP_THREADS), smem, cstream(c), a), what);
    else if (kd)
        LAUNCH_TRY(c, launch_k_pdl(sk_pdl(), skinny_pipe_kernel<2, SP_KD_K>, grid, dim3(SP_THREADS_SETS(2)), smem, cstream(c), a),
                   what);
    else if (sp_down_sets == 2)
        LAUNCH_TRY(c, launch_k_pdl(sk_pdl(), skinny_pipe_kernel<2>, grid, dim3(SP_THREADS_SETS(2)), smem, cstream(c), a), what);
    else
        LAUNCH_TRY(c, launch_k_pdl(sk_pdl(), skinny_pipe_kernel<1>, grid, dim3(SP_THREADS), smem, cstream(c), a), what);
    sp_launches++;
    sp_kc_launches += xs > 0;
    sp_kd_launches += kd;
    return 1;
}

/* The fields both launches take from the route. */
static sp_args sp_args_for(const uint16_t *x, int ldx, const struct cuda_moe_route *r, int RB) {
    sp_args a;
    memset(&a, 0, sizeof a);
    a.x = x;
    a.ldx = ldx;
    a.counts = r->counts;
    a.offsets = r->offsets;
    a.E = r->n_experts;
    a.n_slots = r->n_slots;
    a.RB = RB;
    return a;
}

extern "C" int cuda_skinny_pipe_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                       const uint16_t *xn, int ldx, const struct cuda_moe_route *r, int RB, uint16_t *act) {
    sp_args a = sp_args_for(xn, ldx, r, RB);
    a.x_rows = r->row_of_slot;
    a.act = act;
    a.ld_act = gate->rows;
    return sp_launch(c, a, *gate, up, true, "skinny_pipe_swiglu");
}

extern "C" int cuda_skinny_pipe_down(const struct cuda_ctx *c, const struct cuda_qmat *down, const uint16_t *act,
                                     const struct cuda_moe_route *r, int RB, float *out) {
    sp_args a = sp_args_for(act, down->cols, r, RB);
    a.y = out;
    a.ldy = down->rows;
    return sp_launch(c, a, *down, NULL, false, "skinny_pipe_down");
}

CUDA_TRACE_TU(skinny_pipe)
