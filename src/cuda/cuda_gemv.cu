// cuda/cuda_gemv.cu — quantized matrix × few-token products (decode, small batches):
// one warp per pair of output rows, 16-byte streaming loads of packed codes (several
// in flight per lane), the affine form
// Σ_g s_g Σ q x + b_g Σ x in fp32. Up to 4 matrices sharing one input run in a
// single launch (fused projections). Also cuda_qmatmul, the dispatcher between
// this GEMV, the skinny tensor-core kernel of cuda_skinny.cu (2..64 tokens, 4-bit) and the
// tensor-core GEMM of cuda_gemm.cu.
#include "cuda/cuda_internal.h"

#define GEMV_WARPS 8
#define GEMV_MAXSEG 4

struct gemv_args {
    cuda_gemv_seg seg[GEMV_MAXSEG];
    int blk0[GEMV_MAXSEG + 1];
    int n;
    cuda_tail_norm tail; /* counter != NULL: single accumulating segment, normalise y after */
};

/* R rows per warp share each unpacked input chunk; U chunks per lane per round trip are
 * loaded before any is used, so 2·R·U 16-byte loads are in flight per lane. */
#define GEMV_R 2
#define GEMV_U 2

/* The first round trip of weight loads is issued before pdl_wait() (weights are
 * immutable): for K = 2048 at 4 bits (64 chunks a row) it is the whole row, so the
 * weight stream starts while the previous kernel finishes; x (and y when accumulating)
 * are read only after the wait. The caller's other warps wait on their own. */
template <int MAXT, int BITS>
__device__ __forceinline__ void gemv_rows(const cuda_gemv_seg &g, int row0, const uint16_t *x, int T, int ldx, int lane) {
    const cuda_qmat &m = g.m;
    constexpr int per = BITS == 4 ? 32 : 16;
    const int nch = m.cols / per;
    const uint4 *crow[GEMV_R];
    const uint16_t *sc[GEMV_R], *bi[GEMV_R];
    bool ok[GEMV_R];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) {
        ok[r] = row0 + r < m.rows;
        const size_t row = ok[r] ? row0 + r : row0;
        crow[r] = reinterpret_cast<const uint4 *>(qrow_codes(m, row));
        sc[r] = m.scales + qrow_group0(m, row);
        bi[r] = m.biases + qrow_group0(m, row);
    }
    float acc[MAXT][GEMV_R];
#pragma unroll
    for (int t = 0; t < MAXT; t++)
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) acc[t][r] = 0.0f;
    uint4 w[GEMV_U][GEMV_R];
    float s[GEMV_U][GEMV_R], bb[GEMV_U][GEMV_R];
    auto load_round = [&](int base, bool pre) {
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            const int ch = base + 32 * u;
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) {
                if (ch < nch && ok[r]) {
                    w[u][r] = pre ? ld_stream_pre(crow[r] + ch) : ld_stream(crow[r] + ch);
                    s[u][r] = bf(sc[r][ch * per / QGROUP]);
                    bb[u][r] = bf(bi[r][ch * per / QGROUP]);
                } else {
                    w[u][r] = make_uint4(0, 0, 0, 0);
                    s[u][r] = bb[u][r] = 0.0f;
                }
            }
        }
    };
    load_round(lane, true); /* weights only: before the wait */
    pdl_wait();
    for (int base = lane; base < nch; base += 32 * GEMV_U) {
        if (base != lane) load_round(base, false);
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            const int ch = base + 32 * u;
            if (ch >= nch) continue;
#pragma unroll
            for (int t = 0; t < MAXT; t++) {
                if (t < T) {
                    float xf[per];
                    const float sx = unpack_x<BITS>(x + (size_t)t * ldx + (size_t)ch * per, xf);
#pragma unroll
                    for (int r = 0; r < GEMV_R; r++)
                        acc[t][r] = fmaf(s[u][r], qdot_f<BITS>(w[u][r], xf), fmaf(bb[u][r], sx, acc[t][r]));
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MAXT; t++) {
        if (t < T) {
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) {
                const float v = warp_sum(acc[t][r]);
                if (lane == 0 && ok[r]) {
                    float *dst = g.y + (size_t)t * g.ldy + row0 + r;
                    *dst = g.accumulate ? *dst + v : v;
                }
            }
        }
    }
}

/* PDL: gemv_rows waits after its first weight loads; warps without rows wait here; the
 * tail's counter and reads come after every warp's wait. */
template <int MAXT>
static __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_kernel(gemv_args a, const uint16_t *x, int T, int ldx) {
    TRACE_KERNEL();
    pdl_trigger();
    const int blk = blockIdx.x;
    int s = 0;
    while (s + 1 < a.n && blk >= a.blk0[s + 1]) s++;
    const cuda_gemv_seg &g = a.seg[s];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = ((blk - a.blk0[s]) * GEMV_WARPS + warp) * GEMV_R;
    if (row < g.m.rows) {
        if (g.m.bits == 4) gemv_rows<MAXT, 4>(g, row, x, T, ldx, lane);
        else gemv_rows<MAXT, 8>(g, row, x, T, ldx, lane);
    } else {
        pdl_wait();
    }
    if (a.tail.counter && last_block_done(a.tail.counter)) tail_rmsnorm(g.y, g.ldy, T, g.m.rows, a.tail);
}

static int gemv_launch(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs, const uint16_t *x, int T,
                       int ldx, const cuda_tail_norm *tail) {
    if (n_segs < 1 || n_segs > GEMV_MAXSEG || T < 1 || T > 16)
        return errorf(c->err, c->errlen, ST_INTERNAL, "gemv: %d segments, %d tokens (1..4, 1..16)", n_segs, T);
    gemv_args a;
    a.n = n_segs;
    if (tail) a.tail = *tail;
    else a.tail.counter = NULL;
    int blocks = 0;
    for (int i = 0; i < n_segs; i++) {
        a.seg[i] = segs[i];
        a.blk0[i] = blocks;
        if (segs[i].m.bits != 4 && segs[i].m.bits != 8)
            return errorf(c->err, c->errlen, ST_UNSUPPORTED, "gemv: %d-bit weights", segs[i].m.bits);
        blocks += (segs[i].m.rows + GEMV_WARPS * GEMV_R - 1) / (GEMV_WARPS * GEMV_R);
    }
    a.blk0[n_segs] = blocks;
    const dim3 grid(blocks), block(GEMV_WARPS * 32);
    void (*kern)(gemv_args, const uint16_t *, int, int) = T == 1   ? gemv_kernel<1>
                                                          : T == 2 ? gemv_kernel<2>
                                                          : T <= 4 ? gemv_kernel<4>
                                                          : T <= 8 ? gemv_kernel<8>
                                                                   : gemv_kernel<16>;
    LAUNCH_CHECK_RC(c, launch_k(kern, grid, block, 0, cstream(c), a, x, T, ldx), "gemv");
}

extern "C" int cuda_gemv_multi(const struct cuda_ctx *c, const struct cuda_gemv_seg *segs, int n_segs,
                               const uint16_t *x, int T, int ldx) {
    return gemv_launch(c, segs, n_segs, x, T, ldx, NULL);
}

extern "C" int cuda_gemv_acc_norm(const struct cuda_ctx *c, const struct cuda_qmat *m, const uint16_t *x, int T, int ldx,
                                  float *y, int ldy, const struct cuda_tail_norm *tail) {
    cuda_gemv_seg s;
    s.m = *m;
    s.y = y;
    s.ldy = ldy;
    s.accumulate = 1;
    return gemv_launch(c, &s, 1, x, T, ldx, tail);
}

extern "C" int cuda_qmatmul(const struct cuda_ctx *c, const struct cuda_qmat *m, int mat, const uint16_t *x, int T,
                            int ldx, float *y, int ldy, int accumulate) {
    if (T >= 2 && T <= 64 && cuda_skinny_supported(m) && ldx % 8 == 0)
        return cuda_skinny_dense(c, m, mat, x, T, ldx, y, ldy, accumulate);
    if (T <= 16) {
        const cuda_gemv_seg s = {qmat_rows(*m, (size_t)mat * m->rows, m->rows), y, ldy, accumulate};
        if (T == 1 && cuda_tcv_supported(m) && cuda_tcv_enabled()) /* the sums skinny gives a token in a batch */
            return cuda_tcv_multi(c, &s, 1, x);
        return cuda_gemv_multi(c, &s, 1, x, T, ldx);
    }
    return cuda_gemm_dense(c, m, mat, x, T, ldx, y, ldy, accumulate);
}

CUDA_TRACE_TU(gemv)
