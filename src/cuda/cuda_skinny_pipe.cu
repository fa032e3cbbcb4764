// cuda/cuda_skinny_pipe.cu — the grouped MoE products of a batch of 2..64 tokens (routed
// gate/up with SwiGLU, and down) as a persistent, warp-specialized kernel on sm_90: one
// block an SM streams its share of (expert, row block, pass) units through a ring of
// shared-memory stages; producer warps copy a unit's tile while the consumer warps compute
// on the ones before. OPT-IN (ORCHID_SK_PIPE=1): on the H200 it does not yet beat
// cuda_skinny.cu's grouped kernel, which gives each unit a block of its own (copy the tile,
// wait, compute, exit) and idles its SM through the copies' round trips (64 sequences:
// ~160 µs a layer for gate/up's ~260 MB, ~1.6 TB/s). Measured forms (docs/PERFORMANCE.md,
// session 8; gate/up / down µs a layer at 64 sequences, against 163 / 102):
//   * one role, stages by cp.async.bulk from warp 0: 288 / 277 — a bulk copy a 1 KB codes
//     row (~38 a unit) held warp 0, and with it the block's barrier, ~5 µs a unit;
//   * one role, cp.async by every thread: 245 / 175; + 4 producer warps: 203 / 124; +
//     conflict-light scale and Σx loads: 192 / 122 (products 2.0 -> 1.5 µs a unit);
//   * Σx and reductions on their own warps (this form, 8 + 2 + 2 + 4 warps): 190 / 132;
//     with 6 producer warps and one aux role: 175 / 163; with one producer warp issuing
//     cp.async.bulk: 179 / 207 (the copy engine spends ~50–90 ns a copy, any size). The consumers wait on the copies
//     (~4.5 GB/s of cp.async a producer warp) or on the reducers, and their products take
//     ~1.5 µs a unit — the next step is tensor-map TMA copies (few instructions, deep in
//     flight, a swizzled layout for conflict-free fragments) so producers cost nothing.
//
// The sums are cuda_skinny.cu's, bit for bit: a unit is one of its RB-row tiles (the same
// RB for the same K, so the same k-slices a warp, in the same order) against one n-tile of
// at most 8 slots, each (row, slot) summed by sk_group_step over the warp's groups and the
// k-slices added in slice order. So a token's result is the same here, in the grouped
// kernel and in cuda_tcv.cu's one-token kernels (the GPU tests compare the two grouped
// kernels bitwise).
//
// Work: expert e with c_e slots has P_e = ⌈c_e / 8⌉ passes (8 slots a pass, one n-tile)
// and UPT = rows / orows row blocks; its units are (row block, pass), passes innermost (the
// passes of one row block read the same weights one after another: the second read hits
// L2). Units of all experts in expert order; block b takes the contiguous range
// [b·U/grid, (b+1)·U/grid) — every unit moves the same weight bytes, so a static split
// balances. Stage = the unit's weight tile (codes rows, scales, biases: the sk layout), its
// slots' x rows and their Σx.
#include "cuda/cuda_mma.h"

#define SP_MAX_STAGES 8
#define SP_SLOTS 8     /* slots of a pass: one n-tile of the mma */
#define SP_MAX_E 1024  /* experts the block-wide scan of the prologue takes */
#define SP_CONSUMERS 256 /* 8 warps: the products (cuda_skinny.cu's k-slices × m-tiles of a tile) */
#define SP_SUMS 64       /* 2 warps: Σx of each stage's tokens */
#define SP_REDUCERS 64   /* 2 warps: the reductions and stores */
#define SP_AUX (SP_SUMS + SP_REDUCERS)
#define SP_PRODUCERS 128 /* 4 warps: the stages' copies */
#define SP_THREADS (SP_CONSUMERS + SP_AUX + SP_PRODUCERS)

struct sp_args {
    cuda_qmat w0, w1;               /* gate (or down) and up: [E·rows, K] stacks */
    const uint16_t *x;              /* bf16 rows: xn by token (gate/up) or act by slot (down) */
    int ldx;
    const int32_t *x_rows;          /* x row of each slot (route.row_of_slot), NULL: the slot */
    const int32_t *counts, *offsets;/* route: slots of each expert, its first slot */
    int E, n_slots;
    int RB, stages;
    float *y;                       /* down: y[slot][ldy] */
    int ldy;
    uint16_t *act;                  /* SwiGLU: act[slot][ld_act] = bf16(silu(gate)·up) */
    int ld_act;
};

/* Shared memory: S stages of [codes RB × stride words | scales RB × G | biases RB × G |
 * x 8 × (K + 8) bf16 | Σx 8 × (G + 4) fp32], then the k-slices' partials, two buffers of
 * [8 warps][4][32] fp32,
 * the route's per-expert units prefix [E + 1], counts, offsets [E] and the slots' x rows
 * [n_slots]. Codes and x rows keep cuda_skinny.cu's padding (conflict-free fragment loads). */
struct sp_layout {
    size_t scales, x, xsum, stage, red, pfx, total;
};
__host__ __device__ __forceinline__ sp_layout sp_lay(int RB, int K, int S, int E, int n_slots) {
    const int G = K / QGROUP;
    sp_layout l;
    l.scales = (size_t)RB * (K / 8 + 8) * 4;
    l.x = l.scales + (size_t)4 * RB * G;
    l.xsum = l.x + (size_t)SP_SLOTS * (K + 8) * 2;
    l.stage = (l.xsum + (size_t)SP_SLOTS * (G + 4) * 4 + 127) & ~(size_t)127;
    l.red = l.stage * S;
    l.pfx = l.red + (size_t)2 * 8 * 4 * 32 * 4;
    l.total = l.pfx + (size_t)4 * ((E + 1) + 2 * E + n_slots);
    return l;
}

/* Producer thread tid of SP_PRODUCERS: its share of the copies of unit (expert e, rows
 * [rbase, rbase + orows), slots [m0, m0 + n)) into a stage, 16-byte cp.async each, then
 * one asynchronous arrival on the stage's mbarrier (count = the producers) that fires when
 * its copies have landed. Tile rows: per half (gate, up) orows codes rows; then per half a scales and a
 * biases run (a row block's scales are contiguous there and here); then the n x rows.
 * cp.async.bulk for the same bytes (one instruction a 1 KB row, issued by one warp)
 * held the issuing warp ~5 µs a unit at 64 sequences (see the header). cs: K/32 (16-byte
 * chunks a codes row), a divisor of SP_PRODUCERS (sp_launch), so a thread keeps one chunk
 * column. */
template <bool SWIGLU>
__device__ __forceinline__ void sp_issue(const sp_args &a, int RB, int e, int rbase, int m0, int n, const int *rows_of,
                                         unsigned char *stage, const sp_layout &L, unsigned bar, int tid) {
    const int K = a.w0.cols, G = K / QGROUP, stride = K / 8 + 8, xstride = K + 8;
    const int halves = SWIGLU ? 2 : 1, orows = RB / halves, cs = K / 32;
    const size_t erow = (size_t)e * a.w0.rows + rbase;
    uint32_t *codes = reinterpret_cast<uint32_t *>(stage);
    uint16_t *scs = reinterpret_cast<uint16_t *>(stage + L.scales), *bis = scs + RB * G;
    uint16_t *xs = reinterpret_cast<uint16_t *>(stage + L.x);
    const int ch = tid % cs;
    for (int i = tid / cs; i < RB; i += SP_PRODUCERS / cs) {
        const bool up = SWIGLU && i >= orows;
        const cuda_qmat &m = up ? a.w1 : a.w0;
        cpa16(codes + (size_t)i * stride + ch * 4, m.codes + (erow + (up ? i - orows : i)) * (size_t)(K / 8) + ch * 4);
    }
    const int rc = orows * G / 8; /* 16-byte chunks of one scales or biases run */
    for (int idx = tid; idx < 2 * halves * rc; idx += SP_PRODUCERS) {
        const int run = idx / rc, k = idx % rc, h = run >> 1;
        const cuda_qmat &m = h ? a.w1 : a.w0;
        const bool bias = run & 1;
        cpa16((bias ? bis : scs) + (size_t)h * orows * G + k * 8, (bias ? m.biases : m.scales) + erow * G + k * 8);
    }
    for (int j = 0; j < n; j++) {
        const uint16_t *src = a.x + (size_t)(rows_of ? rows_of[m0 + j] : m0 + j) * a.ldx;
        for (int c8 = tid; c8 < K / 8; c8 += SP_PRODUCERS) cpa16(xs + (size_t)j * xstride + c8 * 8, src + c8 * 8);
    }
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

/* Unit u of the block's work → expert, row block and pass. pfx[e]: units before expert e;
 * the largest e with pfx[e] <= u owns u. ec: the caller's cursor over the experts (-1 at
 * first: a binary search; then, its units coming in increasing order, a forward walk). */
struct sp_unit {
    int e, rbase, m0, n;
};
__device__ __forceinline__ sp_unit sp_locate(int u, const int *pfx, const int *cnt, const int *off, int E, int orows, int &ec) {
    if (ec < 0) {
        int lo = 0, hi = E; /* pfx[lo] <= u < pfx[hi] */
        while (hi - lo > 1) {
            const int mid = (lo + hi) >> 1;
            if (pfx[mid] <= u) lo = mid;
            else hi = mid;
        }
        ec = lo;
    }
    while (pfx[ec + 1] <= u) ec++;
    const int passes = (cnt[ec] + SP_SLOTS - 1) / SP_SLOTS, v = u - pfx[ec], p = v % passes;
    sp_unit r;
    r.e = ec;
    r.rbase = (v / passes) * orows;
    r.m0 = off[ec] + p * SP_SLOTS;
    r.n = min(SP_SLOTS, cnt[ec] - p * SP_SLOTS);
    return r;
}

/* Trace builds: thread 0's (a consumer's) time in each phase of its unit loop, summed over
 * the block's units and written as marks 4..7 laid end to end after the wait (so a
 * timeline's phase deltas are the sums): 4 = prologue (route scan), 5 = waiting for a
 * stage (copies and Σx), 6 = products, 7 = handing the partials to the reducers. */
struct sp_clock {
#ifdef ORCHID_TRACE
    unsigned long long last, sum[5]; /* [4]: after the last unit (the remainder to the end) */
    __device__ void start() {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(last));
        sum[0] = sum[1] = sum[2] = sum[3] = sum[4] = 0;
    }
    __device__ void lap(int k) { /* the time since the last lap into phase k */
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        sum[k] += t - last;
        last = t;
    }
    __device__ void finish() {
        if (threadIdx.x != 0) return;
        unsigned long long t = trace_slots()[TRACE_WAITED];
        for (int k = 0; k < 4; k++) trace_slots()[TRACE_MARK4 + k] = (t += sum[k]);
    }
#else
    __device__ void start() {}
    __device__ void lap(int) {}
    __device__ void finish() {}
#endif
};

/* Block = four warp roles, unit i in stage i % S, its partials in red buffer i % 2:
 *   producers (4 warps): wait empty[st] (the unit S before is consumed), copy the unit,
 *     full[st] completes when the copies land (128 asynchronous arrivals);
 *   sums (2 warps): wait full[st], Σx of the unit's tokens into the stage, arrive ready[st]
 *     (64 arrivals);
 *   reducers (2 warps): wait redfull, sum the k-slices in slice order, store, arrive
 *     redfree (2);
 *   consumers (8 warps, cuda_skinny.cu's split: m-tile warp % MT, k-slice warp / MT): wait
 *     ready[st], products, arrive empty[st]; wait redfree, write the partials, arrive
 *     redfull (8 each).
 * The consumers never wait on a block barrier: Σx, the reductions and the copies run
 * beside their products (a form with one role doing everything spent ~0.4 µs a unit on Σx,
 * ~0.55 on the reduction and the copies it issued, 1.5–2 on products). */
template <bool SWIGLU>
static __global__ void __launch_bounds__(SP_THREADS, 1) skinny_pipe_kernel(sp_args a) {
    TRACE_KERNEL();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ __align__(8) unsigned long long full[SP_MAX_STAGES], ready[SP_MAX_STAGES], empty[SP_MAX_STAGES];
    __shared__ __align__(8) unsigned long long redfull[2], redfree[2];
    __shared__ int wtot[8];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, c = lane & 3;
    const int RB = a.RB, S = a.stages, K = a.w0.cols, G = K / QGROUP, stride = K / 8 + 8, xstride = K + 8;
    const int E = a.E, orows = SWIGLU ? RB / 2 : RB, upt = a.w0.rows / orows;
    const sp_layout L = sp_lay(RB, K, S, E, a.n_slots);
    int *pfx = reinterpret_cast<int *>(sm + L.pfx), *cnt = pfx + E + 1, *off = cnt + E, *rows_of = off + E;
    pdl_trigger();
    if (tid < S) {
        mbar_init(&full[tid], SP_PRODUCERS);
        mbar_init(&ready[tid], SP_SUMS);
        mbar_init(&empty[tid], SP_CONSUMERS / 32);
    }
    if (tid < 2) {
        mbar_init(&redfull[tid], SP_CONSUMERS / 32);
        mbar_init(&redfree[tid], SP_REDUCERS / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    pdl_wait(); /* the route is the previous kernels' */
    sp_clock clk;
    clk.start();
    /* the route into shared memory; units a expert = row blocks × passes, scanned over the
     * experts by the consumers (thread t owns experts [t·per, t·per + per), warps by
     * shuffles, then the warp totals) */
    const int per = (E + SP_CONSUMERS - 1) / SP_CONSUMERS, e0 = min(E, tid * per), e1 = tid < SP_CONSUMERS ? min(E, e0 + per) : e0;
    int mine = 0;
    for (int e = e0; e < e1; e++) {
        cnt[e] = a.counts[e];
        off[e] = a.offsets[e];
        mine += (cnt[e] + SP_SLOTS - 1) / SP_SLOTS * upt;
    }
    if (a.x_rows)
        for (int i = tid; i < a.n_slots; i += blockDim.x) rows_of[i] = a.x_rows[i];
    int incl = mine;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31 && warp < 8) wtot[warp] = incl;
    __syncthreads();
    if (tid < SP_CONSUMERS) {
        int run = incl - mine;
        for (int w = 0; w < warp; w++) run += wtot[w];
        for (int e = e0; e < e1; e++) {
            pfx[e] = run;
            run += (cnt[e] + SP_SLOTS - 1) / SP_SLOTS * upt;
        }
        if (tid == SP_CONSUMERS - 1) pfx[E] = run; /* the last consumer's run is the total */
    }
    __syncthreads();
    const int U = pfx[E];
    const int u0 = (int)((long long)U * blockIdx.x / gridDim.x), u1 = (int)((long long)U * (blockIdx.x + 1) / gridDim.x);
    const int n_mine = u1 - u0;
    const int *rows = a.x_rows ? rows_of : NULL;
    const int MT = RB / 16, KS = 8 / MT;
    int ec = -1; /* this thread's cursor over the experts */

    if (tid >= SP_CONSUMERS + SP_AUX) { /* producers */
        for (int i = 0; i < n_mine; i++) {
            const int st = i % S;
            if (i >= S) mbar_wait(&empty[st], (unsigned)(i / S - 1) & 1u);
            const sp_unit w = sp_locate(u0 + i, pfx, cnt, off, E, orows, ec);
            sp_issue<SWIGLU>(a, RB, w.e, w.rbase, w.m0, w.n, rows, sm + (size_t)st * L.stage, L,
                             (unsigned)__cvta_generic_to_shared(&full[st]), tid - SP_CONSUMERS - SP_AUX);
        }
        asm volatile("cp.async.wait_all;" ::: "memory"); /* its copies' arrivals land before it exits */
        return;
    }

    if (tid >= SP_CONSUMERS + SP_REDUCERS) { /* Σx of each unit's tokens into its stage */
        const int at = tid - SP_CONSUMERS - SP_REDUCERS;
        for (int i = 0; i < n_mine; i++) {
            const int st = i % S;
            const sp_unit w = sp_locate(u0 + i, pfx, cnt, off, E, orows, ec);
            unsigned char *stage = sm + (size_t)st * L.stage;
            mbar_wait(&full[st], (unsigned)(i / S) & 1u);
            sk_group_sums_by(reinterpret_cast<const uint16_t *>(stage + L.x), w.n, xstride, G,
                             reinterpret_cast<float *>(stage + L.xsum), at, SP_SUMS, G + 4);
            mbar_arrive(&ready[st]);
        }
        return;
    }

    if (tid >= SP_CONSUMERS) { /* each unit's reduction: the k-slices meet in slice order (cuda_skinny.cu's, one n-tile) */
        const int at = tid - SP_CONSUMERS;
        for (int j = 0; j < n_mine; j++) {
            const int rb = j & 1;
            const sp_unit w = sp_locate(u0 + j, pfx, cnt, off, E, orows, ec);
            const float *red = reinterpret_cast<const float *>(sm + L.red) + (size_t)rb * 8 * 4 * 32;
            mbar_wait(&redfull[rb], (unsigned)(j / 2) & 1u);
            for (int q = at; q < (SWIGLU ? MT / 2 : MT) * 128; q += SP_REDUCERS) {
                const int m = q >> 7, l = q & 31, k4 = (q >> 5) & 3;
                const int jj = 2 * (l & 3) + (k4 & 1);
                const int r = w.rbase + m * 16 + (l >> 2) + (k4 >= 2 ? 8 : 0);
                float v = 0.0f, u = 0.0f;
                for (int k = 0; k < KS; k++) v += red[((size_t)(k * MT + m) * 4 + k4) * 32 + l];
                if (SWIGLU)
                    for (int k = 0; k < KS; k++) u += red[((size_t)(k * MT + m + MT / 2) * 4 + k4) * 32 + l];
                if (jj >= w.n) continue;
                if (SWIGLU) a.act[(size_t)(w.m0 + jj) * a.ld_act + r] = f2bf(silu(v) * u);
                else a.y[(size_t)(w.m0 + jj) * a.ldy + r] = v;
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&redfree[rb]);
        }
        return;
    }

    /* consumers */
    const int mt = warp % MT, ks = warp / MT, gper = G / KS, g0 = ks * gper;
    const int lr0 = mt * 16 + gq, lr1 = lr0 + 8;
    clk.lap(0);
    for (int i = 0; i < n_mine; i++) {
        const int st = i % S, rb = i & 1;
        const unsigned char *stage = sm + (size_t)st * L.stage;
        const uint32_t *codes = reinterpret_cast<const uint32_t *>(stage);
        const uint16_t *scs = reinterpret_cast<const uint16_t *>(stage + L.scales), *bis = scs + RB * G;
        const uint16_t *xs = reinterpret_cast<const uint16_t *>(stage + L.x);
        const float *xsum = reinterpret_cast<const float *>(stage + L.xsum);
        mbar_wait(&ready[st], (unsigned)(i / S) & 1u);
        clk.lap(1);
        float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
        const sk_lane_rows rw = {codes + (size_t)lr0 * stride + 2 * c, codes + (size_t)lr1 * stride + 2 * c, true, true,
                                 scs + lr0 * G, bis + lr0 * G, scs + lr1 * G, bis + lr1 * G,
                                 xs + (size_t)gq * xstride + 16 * c, 0, xsum + (2 * c) * (G + 4), xsum + (2 * c + 1) * (G + 4), 0};
        sk_products<1>(rw, g0, gper, acc);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[st]); /* this warp is done with the stage */
        clk.lap(2);
        if (i >= 2) mbar_wait(&redfree[rb], (unsigned)(i / 2 - 1) & 1u);
        float *red = reinterpret_cast<float *>(sm + L.red) + (size_t)rb * 8 * 4 * 32;
#pragma unroll
        for (int q = 0; q < 4; q++) red[((size_t)warp * 4 + q) * 32 + lane] = acc[0][q];
        __syncwarp();
        if (lane == 0) mbar_arrive(&redfull[rb]);
        clk.lap(3);
    }
    clk.lap(4);
    clk.finish();
#else
    pdl_trigger();
    pdl_wait();
#endif
}

static int sp_sms = 0, sp_optin = 0, sp_on = 0, sp_sm90 = 0; /* sp_sm90: the device takes them (init) */
static int sp_stages_env(const char *name) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : 0;
}

/* Device facts and the kernels' shared-memory opt-in. The pipelined kernels are opt-in
 * (ORCHID_SK_PIPE=1, sm_90+): on the H200 they do not yet beat cuda_skinny.cu's grouped
 * kernel (64 sequences: 175–190 µs vs 164 for gate/up, 122–163 vs 102 for down; the
 * cp.async issue of the producer warps and the consumers' products, ~1.5 µs a unit, bound
 * them — docs/PERFORMANCE.md, session 8). The GPU tests switch them on to hold their bits
 * to the grouped kernel's. */
extern "C" int cuda_skinny_pipe_init(char *err, size_t errlen) {
    cuda_caps caps;
    cudaError_t e = device_caps(&caps);
    const int major = caps.major;
    sp_optin = caps.optin;
    sp_sms = caps.sms;
    /* the dynamic opt-in is what the static barriers leave of the block's maximum */
    cudaFuncAttributes fa0, fa1;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa0, skinny_pipe_kernel<true>);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa1, skinny_pipe_kernel<false>);
    if (e == cudaSuccess) sp_optin -= (int)(fa0.sharedSizeBytes > fa1.sharedSizeBytes ? fa0.sharedSizeBytes : fa1.sharedSizeBytes);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(skinny_pipe_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, sp_optin);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(skinny_pipe_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, sp_optin);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny_pipe: device attributes: %s", cudaGetErrorString(e));
    sp_sm90 = major >= 9;
    sp_on = sp_sm90 && env_flag("ORCHID_SK_PIPE");
    return 0;
}

extern "C" int cuda_skinny_pipe_enable(int on) {
    const int was = sp_on;
    sp_on = on && sp_sm90;
    return was;
}

/* Stages for a unit layout: as many as fit the opt-in (at most SP_MAX_STAGES, or the
 * ORCHID_SP_STAGES override), 0 when fewer than 2 fit. */
static int sp_stages(int RB, int K, int E, int n_slots, bool swiglu) {
    const int want = sp_stages_env(swiglu ? "ORCHID_SP_STAGES_SWIGLU" : "ORCHID_SP_STAGES_DOWN");
    int S = SP_MAX_STAGES;
    while (S >= 2 && sp_lay(RB, K, S, E, n_slots).total > (size_t)sp_optin) S--;
    if (want >= 2 && want < S) S = want;
    return S >= 2 ? S : 0;
}

/* 1 = launched; 0 = this case is not the pipelined kernel's (the caller launches
 * cuda_skinny.cu's); negative = error. RB: cuda_skinny.cu's rows a tile for K. */
static int sp_launch(const struct cuda_ctx *c, sp_args a, bool swiglu, const char *what) {
    const int K = a.w0.cols, G = K / QGROUP, orows = swiglu ? a.RB / 2 : a.RB;
    if (!sp_on || a.RB < 16 || a.w0.bits != 4 || K % QGROUP || a.E > SP_MAX_E || a.n_slots < 1) return 0;
    if (a.w0.rows % orows || a.ldx % 8 || ((uintptr_t)a.x & 15) || (orows * G * 2) % 16 || SP_PRODUCERS % (K / 32)) return 0;
    const uintptr_t al = (uintptr_t)a.w0.codes | (uintptr_t)a.w0.scales | (uintptr_t)a.w0.biases |
                         (swiglu ? (uintptr_t)a.w1.codes | (uintptr_t)a.w1.scales | (uintptr_t)a.w1.biases : 0);
    if (al & 15) return 0;
    a.stages = sp_stages(a.RB, K, a.E, a.n_slots, swiglu);
    if (!a.stages) return 0;
    const size_t smem = sp_lay(a.RB, K, a.stages, a.E, a.n_slots).total;
    if (swiglu) LAUNCH_TRY(c, launch_k_pdl(sk_pdl(), skinny_pipe_kernel<true>, dim3(sp_sms), dim3(SP_THREADS), smem, cstream(c), a), what);
    else LAUNCH_TRY(c, launch_k_pdl(sk_pdl(), skinny_pipe_kernel<false>, dim3(sp_sms), dim3(SP_THREADS), smem, cstream(c), a), what);
    return 1;
}

/* The fields both launches take from the route and the first matrix. */
static sp_args sp_args_for(const struct cuda_qmat *w0, const uint16_t *x, int ldx, const struct cuda_moe_route *r, int RB) {
    sp_args a = {};
    a.w0 = *w0;
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
    sp_args a = sp_args_for(gate, xn, ldx, r, RB);
    a.w1 = *up;
    a.x_rows = r->row_of_slot;
    a.act = act;
    a.ld_act = gate->rows;
    return sp_launch(c, a, true, "skinny_pipe_swiglu");
}

extern "C" int cuda_skinny_pipe_down(const struct cuda_ctx *c, const struct cuda_qmat *down, const uint16_t *act,
                                     const struct cuda_moe_route *r, int RB, float *out) {
    sp_args a = sp_args_for(down, act, down->cols, r, RB);
    a.y = out;
    a.ldy = down->rows;
    return sp_launch(c, a, false, "skinny_pipe_down");
}

CUDA_TRACE_TU(skinny_pipe)
