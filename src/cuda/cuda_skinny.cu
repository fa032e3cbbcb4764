// cuda/cuda_skinny.cu — tensor-core products of 4-bit MLX weights with a few tokens
// (2..64: batched decode of many sequences; the lm_head of 2..64 rows: cuda_skinny_tall.cu), dense and
// grouped by expert. The CUDA-core GEMV of cuda_gemv.cu re-does the dequantization per
// token and turns compute-bound from T ≈ 2; the prefill GEMM of cuda_gemm.cu stages
// 64 × 128 tiles through shared memory and idles at this size. Here every weight is
// read once from DRAM and enters mma.sync. A block copies its whole weight tile and the
// tokens of the pass to shared memory with independent cp.async loads, then computes
// from shared memory only (measured on the H200, docs/PERFORMANCE.md: fragments loaded
// straight from DRAM one group at a time, and tokens read from L2 per group, left every
// warp waiting on one round trip per group — 0.45–1.1 TB/s):
//
//   * A = the weights (16 rows per m-tile), B = the tokens (8 per n-tile), C fp32.
//   * The codes enter the tensor core as exact integers 128 + q (q ∈ [0, 15]) in bf16
//     (one LOP3 per two codes, cuda_mma.h q_pair); the affine form is applied per 64-wide
//     quantization group in fp32 afterwards, the 128 taken out through the bias:
//       y[r, t] = Σ_g s[r,g] · (Σ_{k∈g} (128 + q[r,k]) x[t,k]) + (b[r,g] - 128 s[r,g]) · (Σ_{k∈g} x[t,k]),
//     so each group is its own mma accumulation (4 k16 steps), scaled into fp32.
//   * The k order inside a group is permuted (a dot product does not care) so that
//     lane (g, c) = (lane/4, lane%4) reads words 2c, 2c+1 of its rows' group — one
//     8-byte load per row per group, 32 contiguous bytes per row per 4 lanes — and the
//     16 x values x[t][16c .. 16c+15] of the same k, two 16-byte loads; Σx of each
//     (token, group) is summed once per pass into shared memory, and the thread that sums
//     a group leaves its values rearranged in B-fragment order (sk_bperm, cuda_mma.h), so
//     the products take the two loads as the four steps' fragments. Logical k pair
//     (2c, 2c+1) of step s ↔ actual (8w + j, 8w + j + 4) with w = 2c + s/2, j = 2(s%2)
//     (nibbles j and j+4 of one word form one bf16x2); (2c+8, 2c+9) ↔ j + 1.
//   * A block is 8 warps over a tile of 32–128 rows × all K; warps split the m-tiles and
//     the groups; partial sums meet in shared memory in a fixed order (deterministic, so
//     a sequence's result does not depend on what else is in the batch).
//   * Grouped: block y is a (expert, slot range) tile of the route of cuda_moe.cu
//     (≤ 64 slots); tokens are gathered through row_of_slot; output rows are slots.
// Epilogues: fp32 store or accumulate (y[t, r]), or SwiGLU bf16(silu(gate)·up).
// Launched with PDL (sk_pdl, cuda_mma.h; trap 13's rules): trigger at the start, weights
// before the wait where they do not depend on the route.
#include "cuda/cuda_mma.h"

#define SK_MAX_T 64
#define SK_MAX_SMEM (200 * 1024)
#define SK_MAX_SEG 4

struct sk_args {
    cuda_qmat w0, w1;       /* w1: up of the SwiGLU variant */
    const uint16_t *x;      /* bf16 tokens, row stride ldx */
    int ldx;
    const int32_t *x_rows;  /* grouped: token row of each slot (NULL: the slot itself) */
    const int32_t *tiles;   /* grouped: route tiles [max_tiles][3] (expert, m0, m_end), count after */
    int max_tiles;
    int T;                  /* dense: tokens */
    float *y;               /* fp32 out [token or slot][ldy] */
    int ldy, accumulate;
    uint16_t *act;          /* SwiGLU out [token or slot][ld_act] */
    int ld_act;
    /* dense, several matrices sharing x in one launch: block x in [blk0[i], blk0[i+1])
     * computes 16 rows of wseg[i] into yseg[i] (nseg = 0: w0 / y only) */
    int nseg;
    int blk0[SK_MAX_SEG + 1];
    cuda_qmat wseg[SK_MAX_SEG];
    float *yseg[SK_MAX_SEG];
    int ldyseg[SK_MAX_SEG];
    int bulk; /* sm_90: stage the weight tile by cp.async.bulk (sk_bulk_stage) */
    int mrep; /* subtiles a block: RB-row tiles, each with the k-slices of one (sk_launch) */
};

/* Tile row i of a block of mrep subtiles of RB = 2^rbl rows (SwiGLU: each subtile orows =
 * RB/2 gate rows, then the same rows of up): its matrix row, and whether it is an up row.
 * (RB is a kernel argument: i / RB was a real division on every copied chunk.) */
__device__ __forceinline__ int sk_tile_row(int i, int rbl, int orows, int rbase, bool swiglu, bool *up) {
    const int sub = i >> rbl, ii = i & ((1 << rbl) - 1);
    *up = swiglu && ii >= orows;
    return rbase + sub * orows + (*up ? ii - orows : ii);
}

/* f(row, col) for every cell of rows × cols, spread over the block's threads (each thread's
 * cells in row order). Where the block's width divides cols or cols divides it, a thread
 * keeps one column (or steps whole rows) and the loop has no division: the copy loops of
 * the grouped MoE kernels spent ~30 % of the down kernel's instructions on idx / cols and
 * idx % cols (ncu, H200, session 9). */
/* Whether a row of cols cells splits over the block by shifts: cols and the block's width
 * powers of two, cols at most the width (then thread t takes column t & (cols − 1) of rows
 * t >> log2(cols), stepping blockDim.x >> log2(cols) rows). */
__device__ __forceinline__ bool sk_pow2_cols(int cols) {
    const int nt = blockDim.x;
    return cols > 0 && cols <= nt && (cols & (cols - 1)) == 0 && (nt & (nt - 1)) == 0;
}

template <typename F>
__device__ __forceinline__ void sk_for_cells(int rows, int cols, F f) {
    const int nt = blockDim.x, t = threadIdx.x;
    if (sk_pow2_cols(cols)) {
        /* powers of two (the model's K = 512, 2,048, 4,096): shifts, not the three runtime
         * divisions below (~20 SASS each, a block's prologue runs several such loops) */
        const int lc = __ffs(cols) - 1;
        const int c = t & (cols - 1), step = nt >> lc;
        for (int r = t >> lc; r < rows; r += step) f(r, c);
    } else if (cols <= nt && nt % cols == 0) {
        const int c = t % cols, step = nt / cols;
        for (int r = t / cols; r < rows; r += step) f(r, c);
    } else if (cols % nt == 0) {
        for (int r = 0; r < rows; r++)
            for (int c = t; c < cols; c += nt) f(r, c);
    } else {
        for (int idx = t; idx < rows * cols; idx += nt) f(idx / cols, idx % cols);
    }
}

/* Whether the tile's scales and biases (and with `codes` its codes) start on 16-byte
 * boundaries in w0 and, for SwiGLU, w1: both copy forms move them in 16-byte units. */
__device__ __forceinline__ bool sk_al16(const sk_args &a, const cuda_qmat &w0, bool swiglu, bool codes) {
    const uintptr_t m0 = (uintptr_t)w0.scales | (uintptr_t)w0.biases | (codes ? (uintptr_t)w0.codes : 0);
    const uintptr_t m1 = (uintptr_t)a.w1.scales | (uintptr_t)a.w1.biases | (codes ? (uintptr_t)a.w1.codes : 0);
    return (m0 & 15) == 0 && (!swiglu || (m1 & 15) == 0);
}

/* sm_90: the weight tile by the bulk-copy engine — one instruction a codes row (K/2 bytes
 * into its padded shared row) and one a scales or biases run (a segment's rows are
 * contiguous there and in shared memory), completion counted in bytes on one mbarrier;
 * against ~RB·K/32 16-byte cp.async with their index arithmetic (2,304 for a gate/up
 * tile). A segment is one matrix's rows of one subtile (sk_tile_row). Returns false
 * (nothing issued) where it does not apply: then the caller copies with cp.async. Rows
 * past the matrix are not copied: their fragments are masked (ok0/ok1) and their outputs
 * never stored; their scales and biases are zeroed as the cp.async form does. The caller
 * waits for phase 0 of bar (mbar_wait) before reading the tile. */
__device__ __forceinline__ bool sk_bulk_stage(const sk_args &a, const cuda_qmat &w0, bool swiglu, int RB, int orows, int rbase,
                                              size_t erow, uint32_t *codes, uint16_t *scs, uint16_t *bis, int G, int K,
                                              int stride, unsigned long long *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (!a.bulk || !sk_al16(a, w0, swiglu, true) || (G * 2) % 16 || (K / 2) % 16) return false;
    const int rows = w0.rows, halves = swiglu ? 2 : 1, nseg = a.mrep * halves, per = orows + 2;
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int valid = 0; /* valid rows over the subtiles (each counted for every half) */
        for (int sub = 0; sub < a.mrep; sub++) valid += max(0, min(orows, rows - rbase - sub * orows));
        const unsigned bytes = (unsigned)(halves * valid * (K / 2 + 4 * G));
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
    }
    /* slot i: segment i / per (subtile seg / halves, half seg % halves); k < orows a codes
     * row, orows the scales, orows + 1 the biases */
    for (int i = threadIdx.x; i < nseg * per; i += blockDim.x) {
        const int seg = i / per, k = i % per, sub = seg / halves, h = seg % halves;
        const int r0 = rbase + sub * orows, nvalid = max(0, min(orows, rows - r0)), t0 = sub * RB + h * orows;
        const cuda_qmat &m = h ? a.w1 : w0;
        const void *src;
        void *dst;
        unsigned n;
        if (k < orows) {
            dst = codes + (size_t)(t0 + k) * stride;
            src = m.codes + (erow + r0 + k) * (size_t)(K / 8);
            n = k < nvalid ? K / 2 : 0;
        } else {
            const bool bias = k > orows;
            dst = (bias ? bis : scs) + (size_t)t0 * G;
            src = (bias ? m.biases : m.scales) + (erow + r0) * G;
            n = nvalid * G * 2;
            if (nvalid < orows) /* rows past the matrix: zero scales or biases */
                for (int e = nvalid * G; e < orows * G; e++) (bias ? bis : scs)[(size_t)t0 * G + e] = 0;
        }
        if (n)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(n), "r"(b)
                         : "memory");
    }
    return true;
#else
    return false;
#endif
}

/* Shared-memory layout of a block (RB weight rows × K, NT n-tiles of tokens):
 *   codes  [RB][K/8 + 8] words (row stride ≡ 8 mod 32 words for K % 256 == 0: the 8-byte
 *          fragment loads of a half-warp — 4 rows × 4 lanes — hit distinct banks)
 *   scales, biases [RB][G] bf16 each
 *   x      [NT*8][K + 8] bf16 (the pass's tokens; +16 bytes a row spreads the quarter-warp
 *          16-byte loads over all banks)
 *   xsum   [NT*8][G + 4] fp32 (Σx of each token over each group, for the bias term; the
 *          padding puts the 4 token columns a quarter-warp reads in distinct banks)
 *   red    [8 warps][NT*4][32] fp32 (split-K partials) */
struct sk_layout {
    size_t scales, x, xsum, red, total;
};
__host__ __device__ __forceinline__ int sk_stride(int K) { return K / 8 + 8; }
__host__ __device__ __forceinline__ sk_layout sk_lay(int RB, int K, int NT) {
    const int G = K / QGROUP;
    sk_layout l;
    l.scales = (size_t)RB * sk_stride(K) * 4;
    l.x = (l.scales + (size_t)4 * RB * G + 15) & ~(size_t)15;
    l.xsum = l.x + (size_t)NT * 8 * (K + 8) * 2;
    l.red = (l.xsum + (size_t)NT * 8 * (G + 4) * 4 + 15) & ~(size_t)15;
    l.total = l.red + (size_t)8 * NT * 4 * 32 * 4;
    return l;
}

/* Block = 8 warps over a tile of RB = 16·MT weight rows (MT = 2 or 4 m-tiles) × all K:
 * the whole tile is copied to shared memory at once (cp.async, every load independent:
 * a block has 16–64 KB in flight), then warp w multiplies m-tile w % MT over the k-slice
 * w / MT of the groups against NT n-tiles of tokens per pass, and the slices meet in
 * shared memory in a fixed order. SwiGLU tiles hold RB/2 gate rows then the same RB/2
 * up rows. */
template <int NT, bool SWIGLU, bool GROUPED>
static __global__ void __launch_bounds__(256, GROUPED && NT == 1 ? 4 : 2) skinny_kernel(sk_args a, int RB) {
    TRACE_KERNEL();
    extern __shared__ __align__(16) unsigned char sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gq = lane >> 2, c = lane & 3;
    pdl_trigger();
    int expert = 0, m0 = 0, count = a.T;
    if (GROUPED) { /* the tile count and this tile's entry requested together (one round trip) */
        pdl_wait(); /* the route is the previous kernels' */
        const int n_tiles = a.tiles[a.max_tiles * 3];
        const int e = a.tiles[blockIdx.y * 3], b = a.tiles[blockIdx.y * 3 + 1], end = a.tiles[blockIdx.y * 3 + 2];
        if ((int)blockIdx.y >= n_tiles) return;
        expert = e;
        m0 = b;
        count = end - b;
    }
    cuda_qmat w0 = a.w0;
    float *y = a.y;
    int ldy = a.ldy, blk = blockIdx.x;
    if (!SWIGLU && !GROUPED && a.nseg > 0) {
        int sg = 0;
        while (sg + 1 < a.nseg && blk >= a.blk0[sg + 1]) sg++;
        w0 = a.wseg[sg];
        y = a.yseg[sg];
        ldy = a.ldyseg[sg];
        blk -= a.blk0[sg];
    }
    const int rows = w0.rows, K = w0.cols, G = K / QGROUP, stride = sk_stride(K);
    /* RB = 16·MT, MT·KS = 8, all powers of two (sk_rb): shifts instead of runtime divisions */
    const int rbl = __ffs(RB) - 1, lmt = rbl - 4, MT = 1 << lmt, KS = 8 >> lmt;
    const int orows = SWIGLU ? RB / 2 : RB;   /* output rows of a subtile */
    const int TR = RB * a.mrep;               /* tile rows staged: mrep subtiles */
    const int rbase = blk * orows * a.mrep;
    const size_t erow = (size_t)expert * rows; /* absolute row of the expert's row 0 */
    const sk_layout L = sk_lay(TR, K, NT);
    const int xstride = K + 8;
    uint32_t *codes = reinterpret_cast<uint32_t *>(sm);
    uint16_t *scs = reinterpret_cast<uint16_t *>(sm + L.scales);
    uint16_t *bis = scs + TR * G;
    uint16_t *xs = reinterpret_cast<uint16_t *>(sm + L.x);
    float *xsum = reinterpret_cast<float *>(sm + L.xsum);
    float *red = reinterpret_cast<float *>(sm + L.red);

    /* PDL: a dense block issues its weight copies before its wait (weights are immutable)
     * and stages the tokens after it; a grouped block waited above (its tile is the route's).
     * Grouped: the token rows of the tile's slots, requested before the weight copies are
     * issued and read after (one round trip less on the way to the first pass's tokens). */
    __shared__ int slot_row[SK_MAX_T];
    int my_row = 0;
    if (GROUPED && (int)threadIdx.x < count) my_row = a.x_rows ? a.x_rows[m0 + threadIdx.x] : m0 + (int)threadIdx.x;

    /* stage the tile: tile row i is matrix row sk_tile_row(i) (SwiGLU: a subtile's gate
     * rows, then its up rows) */
    __shared__ __align__(8) unsigned long long wbar;
    const bool bulk = sk_bulk_stage(a, w0, SWIGLU, RB, orows, rbase, erow, codes, scs, bis, G, K, stride, &wbar);
    if (!bulk) {
        const int cpr = K / 32; /* 16-byte chunks a row */
        if (!SWIGLU && sk_pow2_cols(cpr)) {
            /* tile row i is matrix row rbase + i: a thread keeps its chunk column and steps
             * both pointers by whole rows (the general loop below spent ~25 instructions a
             * copy on the tile row and 64-bit addresses: 12 % of the grouped down kernel's
             * instructions at 64 sequences, ncu on the H200, session 18) */
            const int lc = __ffs(cpr) - 1, step = blockDim.x >> lc, nvalid = min(TR, rows - rbase), ch = threadIdx.x & (cpr - 1);
            int i = threadIdx.x >> lc;
            const uint32_t *src = w0.codes + (erow + rbase + i) * (size_t)(K / 8) + ch * 4;
            uint32_t *dst = codes + (size_t)i * stride + ch * 4;
            for (; i < nvalid; i += step, src += (size_t)step * (K / 8), dst += step * stride) cpa16(dst, src);
        } else {
            sk_for_cells(TR, cpr, [&](int i, int ch) { /* 16-byte chunks of the rows */
                bool up;
                const int r = sk_tile_row(i, rbl, orows, rbase, SWIGLU, &up);
                if (r < rows) {
                    const cuda_qmat &m = up ? a.w1 : w0;
                    cpa16(codes + (size_t)i * stride + ch * 4, m.codes + (erow + r) * (size_t)(K / 8) + ch * 4);
                }
            });
        }
        /* scales and biases: by cp.async too when each row's G of them are whole aligned
         * 16-byte chunks, beside the codes (H200, 64 sequences: 27.05 -> 25.34 ms a forward;
         * a loop of synchronous loads put up to RB·G/256 dependent DRAM round trips on every
         * block's path); the same values either way */
        if ((G * 2) % 16 == 0 && sk_al16(a, w0, SWIGLU, false)) {
            sk_for_cells(2 * TR, G / 8, [&](int ib, int ch) { /* rows of the scales, then of the biases */
                const bool bias = ib >= TR;
                const int i = bias ? ib - TR : ib;
                bool up;
                const int r = sk_tile_row(i, rbl, orows, rbase, SWIGLU, &up);
                uint16_t *dst = (bias ? bis : scs) + (size_t)i * G + ch * 8;
                if (r < rows) {
                    const cuda_qmat &m = up ? a.w1 : w0;
                    cpa16(dst, (bias ? m.biases : m.scales) + (erow + r) * G + ch * 8);
                } else {
                    *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
                }
            });
            cpa_commit();
        } else {
            cpa_commit();
            for (int idx = threadIdx.x; idx < TR * G; idx += blockDim.x) {
                const int i = idx / G, g = idx % G;
                bool up;
                const int r = sk_tile_row(i, rbl, orows, rbase, SWIGLU, &up);
                uint16_t sv = 0, bv = 0;
                if (r < rows) {
                    const cuda_qmat &m = up ? a.w1 : w0;
                    sv = __ldg(m.scales + (erow + r) * G + g);
                    bv = __ldg(m.biases + (erow + r) * G + g);
                }
                scs[idx] = sv;
                bis[idx] = bv;
            }
        }
    }

    if (GROUPED) {
        if ((int)threadIdx.x < count) slot_row[threadIdx.x] = my_row;
        __syncthreads();
    } else {
        pdl_wait();
    }
    trace_mark(TRACE_MARK4); /* the tile's copies issued */
    const int mt = warp & (MT - 1), ks = warp >> lmt;
    const int gper = G >> (3 - lmt), g0 = ks * gper; /* G / KS: KS divides G (sk_rb) */
    const int lr0 = mt * 16 + gq, lr1 = lr0 + 8; /* this lane's rows of a subtile */
    for (int p0 = 0; p0 < count; p0 += NT * 8) { /* passes of NT n-tiles over the staged tile */
        /* stage this pass's tokens (only the valid ones: a column of garbage stays in its
         * own column of the mma and is never written), then their group sums */
        const int nrows = min(NT * 8, count - p0);
        if (p0 > 0) __syncthreads(); /* the previous pass is done with xs */
        sk_for_cells(nrows, K / 8, [&](int j, int ch) { /* 16-byte chunks of the token rows */
            const int row = GROUPED ? slot_row[p0 + j] : p0 + j;
            cpa16(xs + (size_t)j * xstride + ch * 8, a.x + (size_t)row * a.ldx + ch * 8);
        });
        cpa_commit();
        cpa_wait<0>();
        if (bulk && p0 == 0) mbar_wait(&wbar, 0);
        __syncthreads();
        trace_mark(TRACE_MARK5); /* tile and tokens landed */
        sk_group_sums_by<true>(xs, nrows, xstride, G, xsum, threadIdx.x, blockDim.x, G + 4); /* and rearranged for PX */
        __syncthreads();
        trace_mark(TRACE_MARK6);
        for (int sub = 0; sub < a.mrep; sub++) { /* subtiles one after another, each as a tile of RB rows */
            const int tr0 = sub * RB + lr0, tr1 = sub * RB + lr1, sbase = rbase + sub * orows;
            const bool ok0 = sbase + (SWIGLU ? lr0 % orows : lr0) < rows, ok1 = sbase + (SWIGLU ? lr1 % orows : lr1) < rows;
            float acc[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
            const sk_lane_rows rw = {codes + (size_t)tr0 * stride + 2 * c, codes + (size_t)tr1 * stride + 2 * c, ok0, ok1,
                                     scs + tr0 * G, bis + tr0 * G, scs + tr1 * G, bis + tr1 * G,
                                     xs + (size_t)gq * xstride + 16 * c, (size_t)8 * xstride,
                                     xsum + (2 * c) * (G + 4), xsum + (2 * c + 1) * (G + 4), 8 * (G + 4)};
            sk_products<NT, true>(rw, g0, gper, acc);

            trace_mark(TRACE_MARK7); /* (warp 0's) products done */
            /* the k-slices meet in shared memory, summed in slice order */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) red[((size_t)warp * NT * 4 + nt * 4 + i) * 32 + lane] = acc[nt][i];
            __syncthreads();
            /* sixteen threads a (m-tile, token column) pair, a row each (rows fastest: the stores
             * of a token are contiguous); columns past the pass's tokens are skipped before their
             * sums (at 64 sequences a grouped tile has ~2 of its 8: the loop over every element
             * of red spent 14 % of the grouped down's instructions, ncu, H200, session 18) */
            const int rl = threadIdx.x & 15;
            for (int q = threadIdx.x >> 4; q < (SWIGLU ? MT / 2 : MT) * NT * 8; q += blockDim.x >> 4) {
                const int m = q / (NT * 8), jj = q % (NT * 8); /* m-tile (SwiGLU: of the gate half), column */
                const int r = sbase + m * 16 + rl;
                if (jj >= nrows || r >= rows) continue;
                const int nt = jj >> 3, jt = jj & 7;
                /* the accumulator element of (row rl, column jt): lane l, register i of the mma */
                const int l = ((rl & 7) << 2) | (jt >> 1), i = ((rl >> 3) << 1) | (jt & 1);
                const int j = p0 + jj; /* token / slot index in the tile */
                float v = 0.0f, u = 0.0f;
                for (int k = 0; k < KS; k++) v += red[((size_t)(k * MT + m) * NT * 4 + nt * 4 + i) * 32 + l];
                if (SWIGLU)
                    for (int k = 0; k < KS; k++) u += red[((size_t)(k * MT + m + MT / 2) * NT * 4 + nt * 4 + i) * 32 + l];
                const size_t orow = (size_t)(GROUPED ? m0 + j : j);
                if (SWIGLU) {
                    a.act[orow * a.ld_act + r] = f2bf(silu(v) * u);
                } else {
                    float *dst = y + orow * ldy + r;
                    *dst = a.accumulate ? *dst + v : v;
                }
            }
            __syncthreads(); /* red is reused by the next subtile or pass */
        }
    }
}

/* The most shared memory a block may opt into on this device (cuda_skinny_init), capped at
 * SK_MAX_SMEM for the choice of tile: every device with ≥ 200 KB (H100/H200) chooses the
 * same tiles, hence the same sums; an A100 (163 KB) falls back to tiles that fit it. */
static int sk_optin = SK_MAX_SMEM;
/* Weight tiles by cp.async.bulk (sk_bulk_stage): sm_90 and newer unless ORCHID_SK_NOBULK=1
 * (A/B; the same values land either way, so the same bits). Set by cuda_skinny_init. */
static int sk_bulk_on = 0;
/* ... for rows of at least this many bytes of codes: the grouped gate/up's 1 KB rows gained
 * (H200, 64 sequences: 194 -> 171 µs a layer, block prologue 4.7 -> 3.9 µs); the grouped
 * down's 256-byte rows lost (124 -> 128 µs: 66 copies of 256 bytes, prologue 3.0 -> 3.9). */
#define SK_BULK_MIN_ROW 1024
/* Subtiles a grouped block takes (sk_args.mrep; ORCHID_SK_MREP_SWIGLU / _DOWN = 1 or 2,
 * read by cuda_skinny_init). A grouped block's prologue (tile entry, token rows, copies
 * issued) costs the same whatever its bytes; two subtiles share it. H200, 64 sequences,
 * ms a forward: 22.47 (1 / 1) -> 22.16 (down 2: down 109 -> 102 µs a layer) -> 21.67
 * (both 2: gate/up 175 -> 163 µs a layer). Each subtile keeps the k-slices of an RB-row
 * tile, so the sums (and the one-token kernels' bits) do not change. */
static int sk_mrep_swiglu = 2, sk_mrep_down = 2;
static int sk_block_max(void) { return sk_optin < SK_MAX_SMEM ? sk_optin : SK_MAX_SMEM; }

/* Rows per block RB: 64 (4 m-tiles × 2 k-slices: G even), 32 (2 × 4: G % 4 == 0) or 128
 * (8 × 1: any G); the largest that leaves room for two blocks per SM, else one that fits
 * at all; 0 = none fits. */
static int sk_rb(int K, int NT) {
    const int G = K / QGROUP;
    const int cand[3] = {64, 32, 128};
    const bool ok[3] = {G % 2 == 0, G % 4 == 0, true};
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 3; i++)
            if (ok[i] && sk_lay(cand[i], K, NT).total <= (size_t)(pass == 0 ? SK_MAX_SMEM / 2 : sk_block_max())) return cand[i];
    return 0;
}

/* n-tiles per pass: the grouped forms take 8 slots a pass (most experts have a few
 * tokens); the dense ones up to 4 n-tiles when two blocks still fit an SM, else 1 and
 * more passes over the staged weights. */
static int sk_nt(int K, int want, bool grouped) {
    if (grouped || want <= 1) return 1;
    for (int nt = want >= 4 ? 4 : want >= 2 ? 2 : 1; nt > 1; nt >>= 1)
        if (sk_rb(K, nt) == sk_rb(K, 1) && sk_lay(sk_rb(K, nt), K, nt).total <= SK_MAX_SMEM / 2)
            return nt; /* same tile (same k-slices) as one token: batch-invariant sums */
    return 1;
}

/* a.mrep subtiles a block when they fit the shared memory of a block, else 1. */
template <int NT, bool SWIGLU, bool GROUPED>
static int sk_launch(const struct cuda_ctx *c, const sk_args &a0, int n_rows, int grid_y, const char *what) {
    const int RB = sk_rb(a0.w0.cols, NT);
    sk_args a = a0;
    if (a.mrep < 1 || sk_lay(RB * a.mrep, a.w0.cols, NT).total > (size_t)sk_block_max()) a.mrep = 1;
    const int orows = (SWIGLU ? RB / 2 : RB) * a.mrep;
    const dim3 grid((n_rows + orows - 1) / orows, grid_y);
    LAUNCH_CHECK_RC(c, launch_k_pdl(sk_pdl(), skinny_kernel<NT, SWIGLU, GROUPED>, grid, dim3(256),
                                    sk_lay(RB * a.mrep, a.w0.cols, NT).total, cstream(c), a, RB),
                    what);
}

/* n_rows: rows of the (per-expert) matrix, or for several matrices Σ blocks × RB. */
template <bool SWIGLU, bool GROUPED>
static int sk_dispatch(const struct cuda_ctx *c, const sk_args &a, int want_nt, int n_rows, int grid_y, const char *what) {
    const int nt = sk_nt(a.w0.cols, want_nt, GROUPED);
    if (nt == 1) return sk_launch<1, SWIGLU, GROUPED>(c, a, n_rows, grid_y, what);
    if (nt == 2) return sk_launch<2, SWIGLU, GROUPED>(c, a, n_rows, grid_y, what);
    return sk_launch<4, SWIGLU, GROUPED>(c, a, n_rows, grid_y, what);
}

#define SK_ATTR(NT, SW, GR)                                                                                            \
    if (e == cudaSuccess)                                                                                              \
        e = cudaFuncSetAttribute(skinny_kernel<NT, SW, GR>, cudaFuncAttributeMaxDynamicSharedMemorySize, sk_block_max());

extern "C" int cuda_skinny_init(char *err, size_t errlen) {
    cuda_caps caps;
    cudaError_t e = device_caps(&caps);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny: device attributes: %s", cudaGetErrorString(e));
    sk_optin = caps.optin;
    sk_bulk_on = caps.major >= 9 && !env_flag("ORCHID_SK_NOBULK");
    const char *ms = getenv("ORCHID_SK_MREP_SWIGLU"), *md = getenv("ORCHID_SK_MREP_DOWN");
    if (ms && *ms) sk_mrep_swiglu = atoi(ms) == 2 ? 2 : 1;
    if (md && *md) sk_mrep_down = atoi(md) == 2 ? 2 : 1;
    int rc = cuda_skinny_wide_init(err, errlen);
    if (!rc) rc = cuda_skinny_pipe_init(err, errlen);
    if (!rc) rc = cuda_skinny_tall_init(err, errlen);
    if (!rc) rc = cuda_tcv_init(err, errlen); /* its one-token kernels copy these tiles */
    if (rc) return rc;
    SK_ATTR(1, false, false) SK_ATTR(2, false, false) SK_ATTR(4, false, false)
    SK_ATTR(1, true, false) SK_ATTR(2, true, false) SK_ATTR(4, true, false)
    SK_ATTR(1, false, true) SK_ATTR(2, false, true)
    SK_ATTR(1, true, true) SK_ATTR(2, true, true)
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "skinny: cudaFuncSetAttribute failed: %s", cudaGetErrorString(e));
    return 0;
}

/* k-slices of a block for K columns at one n-tile: the split cuda_tcv.cu must copy for one
 * token's sums to be the same bits there and here (0: unsupported K). */
extern "C" int cuda_skinny_kslices(int K) {
    const int rb = K % QGROUP == 0 ? sk_rb(K, 1) : 0;
    return rb ? 8 / (rb / 16) : 0;
}

extern "C" int cuda_skinny_supported(const struct cuda_qmat *m) {
    return m->bits == 4 && m->cols % QGROUP == 0 && sk_rb(m->cols, 1) != 0;
}

static int sk_check(const struct cuda_ctx *c, const struct cuda_qmat *m, int ldx, const char *what) {
    if (!cuda_skinny_supported(m))
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "%s: %d-bit weights with %d columns (needs 4-bit, a multiple of 64)",
                      what, m->bits, m->cols);
    if (ldx % 8) return errorf(c->err, c->errlen, ST_INTERNAL, "%s: ldx %d not a multiple of 8", what, ldx);
    if (!sk_rb(m->cols, 1))
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "%s: %d columns need too much shared memory", what, m->cols);
    return 0;
}

/* The fields every launch sets: the (first) weight matrix and the tokens; grouped launches
 * (r != NULL) also the route's tile list. */
static sk_args sk_args_for(const struct cuda_qmat *w, const uint16_t *x, int ldx, const struct cuda_moe_route *r) {
    sk_args a = {};
    a.w0 = *w;
    a.x = x;
    a.ldx = ldx;
    a.bulk = sk_bulk_on && w->cols / 2 >= SK_BULK_MIN_ROW;
    a.mrep = 1;
    if (r) {
        a.tiles = r->tiles;
        a.max_tiles = r->max_tiles;
    }
    return a;
}

extern "C" int cuda_skinny_dense(const struct cuda_ctx *c, const struct cuda_qmat *m, int mat, const uint16_t *x, int T,
                                 int ldx, float *y, int ldy, int accumulate) {
    int rc;
    if ((rc = sk_check(c, m, ldx, "skinny_dense"))) return rc;
    if (T < 1 || T > SK_MAX_T) return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_dense: %d tokens (1..%d)", T, SK_MAX_T);
    sk_args a = sk_args_for(m, x, ldx, NULL);
    a.T = T;
    a.y = y;
    a.ldy = ldy;
    a.accumulate = accumulate;
    a.w0 = qmat_rows(*m, (size_t)mat * m->rows, m->rows); /* matrix `mat` of a stack */
    const cuda_gemv_seg sg = {a.w0, y, ldy, accumulate};
    if (cuda_skinny_tall_takes(&a.w0, T, ldx)) return cuda_skinny_tall(c, &a.w0, x, T, ldx, y, ldy, accumulate);
    if (cuda_skinny_wide_takes_dense(&sg, 1, T)) return cuda_skinny_wide_dense(c, &sg, 1, x, T, ldx, NULL);
    /* a tall matrix (the lm_head of 2..64 rows): persistent blocks streaming its tiles
     * (cuda_skinny_tall.cu); where that form does not take it, the wide form in chunks of the rows
     * one launch of it takes: one pass builds each A fragment once for all tokens, where
     * this kernel's 8-token passes build it T/8 times (the same sums either way) */
    const int chunk = cuda_skinny_wide_max_rows();
    cuda_gemv_seg part = {qmat_rows(a.w0, 0, chunk), y, ldy, accumulate};
    if (m->rows > chunk && chunk % 16 == 0 && cuda_skinny_wide_takes_dense(&part, 1, T)) {
        for (int r0 = 0; r0 < m->rows; r0 += chunk) {
            part.m = qmat_rows(a.w0, r0, m->rows - r0 < chunk ? m->rows - r0 : chunk);
            part.y = y + r0;
            if ((rc = cuda_skinny_wide_dense(c, &part, 1, x, T, ldx, NULL))) return rc;
        }
        return 0;
    }
    return sk_dispatch<false, false>(c, a, (T + 7) / 8, m->rows, 1, "skinny_dense");
}

extern "C" int cuda_skinny_multi(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const uint16_t *x,
                                 int T, int ldx, const struct cuda_xstage *xs) {
    int rc;
    if (n_segs < 1 || n_segs > SK_MAX_SEG) return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_multi: %d matrices", n_segs);
    if (T < 1 || T > SK_MAX_T) return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_multi: %d tokens (1..%d)", T, SK_MAX_T);
    sk_args a = sk_args_for(&segs[0].m, x, ldx, NULL); /* w0: K for the split */
    a.T = T;
    a.accumulate = segs[0].accumulate;
    a.nseg = n_segs;
    const int rb = sk_rb(segs[0].m.cols, sk_nt(segs[0].m.cols, (T + 7) / 8, false));
    int blocks = 0;
    for (int i = 0; i < n_segs; i++) {
        if ((rc = sk_check(c, &segs[i].m, ldx, "skinny_multi"))) return rc;
        if (segs[i].m.cols != segs[0].m.cols || segs[i].accumulate != a.accumulate)
            return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_multi: matrices differ in columns or accumulation");
        a.wseg[i] = segs[i].m;
        a.yseg[i] = segs[i].y;
        a.ldyseg[i] = segs[i].ldy;
        a.blk0[i] = blocks;
        blocks += (segs[i].m.rows + rb - 1) / rb;
    }
    a.blk0[n_segs] = blocks;
    if (cuda_skinny_wide_takes_dense(segs, n_segs, T)) return cuda_skinny_wide_dense(c, segs, n_segs, x, T, ldx, xs);
    return sk_dispatch<false, false>(c, a, (T + 7) / 8, blocks * rb, 1, "skinny_multi");
}

extern "C" int cuda_skinny_multi_reads_stage(const struct cuda_gemv_seg *segs, int n_segs, int T) {
    return n_segs >= 1 && n_segs <= SK_MAX_SEG && T >= 1 && T <= SK_MAX_T && cuda_skinny_wide_reads_stage(segs, n_segs, T);
}

extern "C" int cuda_skinny_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                  const uint16_t *x, int T, int ldx, uint16_t *act, int ld_act) {
    int rc;
    if ((rc = sk_check(c, gate, ldx, "skinny_swiglu")) || (rc = sk_check(c, up, ldx, "skinny_swiglu"))) return rc;
    if (T < 1 || T > SK_MAX_T) return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_swiglu: %d tokens (1..%d)", T, SK_MAX_T);
    if (gate->rows != up->rows || gate->cols != up->cols)
        return errorf(c->err, c->errlen, ST_INTERNAL, "skinny_swiglu: gate %dx%d vs up %dx%d", gate->rows, gate->cols, up->rows,
                      up->cols);
    if (cuda_skinny_wide_takes_swiglu(gate, T))
        return cuda_skinny_wide_swiglu(c, gate, up, x, T, ldx, act, ld_act);
    sk_args a = sk_args_for(gate, x, ldx, NULL);
    a.w1 = *up;
    a.T = T;
    a.act = act;
    a.ld_act = ld_act;
    return sk_dispatch<true, false>(c, a, (T + 7) / 8, gate->rows, 1, "skinny_swiglu");
}

static int sk_check_route(const struct cuda_ctx *c, const struct cuda_moe_route *r, const char *what) {
    if (r->tile_rows > 64)
        return errorf(c->err, c->errlen, ST_INTERNAL, "%s: route tiles of %d slots (at most 64 here)", what, r->tile_rows);
    return 0;
}

/* Grouped by the route's tiles: tiles hold at most 64 slots; the kernel takes them in
 * passes of 8 (NT = 1), which covers the usual decode counts (a few tokens per expert)
 * in one pass. */
extern "C" int cuda_skinny_grouped_swiglu(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                          const uint16_t *xn, int ldx, const struct cuda_moe_route *r, uint16_t *act) {
    int rc;
    if ((rc = sk_check(c, gate, ldx, "skinny_grouped_swiglu")) || (rc = sk_check(c, up, ldx, "skinny_grouped_swiglu")) ||
        (rc = sk_check_route(c, r, "skinny_grouped_swiglu")))
        return rc;
    sk_args a = sk_args_for(gate, xn, ldx, r);
    a.w1 = *up;
    a.x_rows = r->row_of_slot;
    a.act = act;
    a.ld_act = gate->rows;
    a.mrep = sk_mrep_swiglu;
    if ((rc = cuda_skinny_pipe_swiglu(c, gate, up, xn, ldx, r, sk_rb(gate->cols, 1), act))) return rc < 0 ? rc : 0;
    return sk_dispatch<true, true>(c, a, 2, gate->rows, cuda_moe_route_grid(r), "skinny_grouped_swiglu");
}

extern "C" int cuda_skinny_grouped_down(const struct cuda_ctx *c, const struct cuda_qmat *down, const uint16_t *act,
                                        const struct cuda_moe_route *r, float *out) {
    int rc;
    if ((rc = sk_check(c, down, down->cols, "skinny_grouped_down")) || (rc = sk_check_route(c, r, "skinny_grouped_down")))
        return rc;
    sk_args a = sk_args_for(down, act, down->cols, r);
    a.y = out;
    a.ldy = down->rows;
    a.mrep = sk_mrep_down;
    if ((rc = cuda_skinny_pipe_down(c, down, act, r, sk_rb(down->cols, 1), out))) return rc < 0 ? rc : 0;
    return sk_dispatch<false, true>(c, a, 2, down->rows, cuda_moe_route_grid(r), "skinny_grouped_down");
}

CUDA_TRACE_TU(skinny)
