// cuda/cuda_tcv_moe_cluster.cu — one token's MoE experts (the K routed ones and the shared
// one) in a single launch of thread-block clusters: gate/up with SwiGLU, down, the routing
// weights and the residual add, the work of cuda_tcv.cu's two pair launches
// (tcv_gateup_kernel, tcv_down_kernel) with their bits. Opt-in (ORCHID_MOE_CLUSTER=1) until
// measured on the card.
//
// Why: between the router's ids and the next layer's input lie the two pair launches
// (H200 timeline, session 14: gate/up 9.4 µs a step, down 10.7, about 20 µs of a GDN
// layer's 47), and the down launch can only start its products once the gate/up launch has
// ended and its activations have gone through L2. Here each pair (expert) is one cluster of
// MC_C blocks: every block requests its share of the pair's gate/up tiles (shared memory,
// cp.async) and down fragments (registers) as soon as the id is known, computes 32 of the
// pair's activations, hands them to the other blocks of its cluster through distributed
// shared memory behind one cluster barrier, and multiplies its 128 down rows. The pairs'
// down rows meet in global memory: the last of the K + 1 blocks that own a slice of 128
// rows (a counter a slice, self-resetting) adds the slice into the residual, in
// tcv_down_kernel's order. No launch boundary and no grid barrier (trap 35: a grid barrier
// cost what a launch boundary costs); a cluster barrier spans 8 SMs.
//
// Bits: every warp does what one warp of the pair launches did — gate/up warp w of original
// blocks 2b and 2b + 1 (tcv_tile_async + tcv_mma_smem, the same k-slice), the activations by
// tcv_slice_sum and silu·up rounded to bf16, the down rows by tcv_load + tcv_mma (the
// register form: the same values and steps as tcv_mma_smem) against the activation row
// staged as tcv_stage stages it, each row's slices summed in order from 0, then
// σ(seg)·shared, fmaf(w_k, routed_k, ·) for k = 0..K-1, x + that. GPU test: x and the
// activations bitwise against the two launches (tests/gpu/test_cuda_ops.c).
//
// Shapes: the model's (hidden 2,048 = 32 groups: 8 a warp, 4 k-slices; expert width 512 =
// 8 groups: 4 a warp, 2 k-slices; routed and shared experts the same width), K + 1 ≤ 16
// clusters; cuda_tcv_moe_cluster_ok says when it serves. Shared memory of a block: x staged
// (4 KB + sums), 16 gate/up tiles (72 KB), the partials, the activation row (1 KB): about
// 80 KB, two blocks an SM; 256 threads at ≤ 128 registers.
#include <cooperative_groups.h>

#include "cuda/cuda_mma.h"

namespace cg = cooperative_groups;

#define MC_C 16      /* blocks a cluster (one cluster a pair) */
#define MC_GU_GPW 8  /* gate/up: groups a warp (K = 2,048: 4 k-slices, m-tiles gate and up) */
#define MC_DN_GPW 4  /* down: groups a warp (K = 512: 2 k-slices) */
#define MC_ACT 32    /* activations a block computes (two of tcv_gateup_kernel's blocks) */
#define MC_ROWS 128  /* down rows a block multiplies (8 m-tiles × 2 k-slices: 2 a warp) */

struct mc_args {
    cuda_qmat gate, up, down, sgate, sup, sdown;
    const int32_t *ids; /* [K] the router's experts */
    const float *w;     /* [K] their weights */
    const float *seg;   /* [1] the shared expert's gate logit */
    const uint16_t *xn; /* [H] the normalised token (the router's block 0 leaves it) */
    int K;
    float *v;           /* [K + 1][H] each pair's down rows, for the slice's last block */
    int *cnt;           /* [H / MC_ROWS] zeroed counters, reset by each slice's last block */
    float *x;           /* [H] the residual: x += the combined pairs */
    int trig_late;      /* PDL trigger after the activations (else after the wait): A/B */
};

/* Shared memory: x staged [H] bf16 + [H/64] sums | 16 gate/up tiles | partials [16][16] |
 * this block's activations [MC_ACT] bf16 | the activation row [I] bf16 + [I/64] sums. */
struct mc_layout {
    size_t tiles, red, act, xd, xdsum, total;
};
__host__ __device__ inline mc_layout mc_lay(int H, int I) {
    mc_layout l;
    l.tiles = ((size_t)H * 2 + (size_t)(H / QGROUP) * 4 + 15) & ~(size_t)15;
    l.red = l.tiles + (size_t)16 * TCV_WSM(MC_GU_GPW);
    l.act = l.red + (size_t)16 * 16 * 4;
    l.xd = (l.act + (size_t)MC_ACT * 2 + 15) & ~(size_t)15;
    l.xdsum = l.xd + (size_t)I * 2;
    l.total = l.xdsum + (size_t)(I / QGROUP) * 4;
    return l;
}

static __global__ void __launch_bounds__(256, 2) moe_cluster_kernel(mc_args a) {
    TRACE_KERNEL();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) unsigned char sm[];
    __shared__ int last;
    cg::cluster_group cl = cg::this_cluster();
    const int p = blockIdx.y, b = (int)cl.block_rank(); /* pair p (K: the shared expert), block b of its cluster */
    const bool shared = p == a.K;
    const cuda_qmat gm = qsel(shared, a.sgate, a.gate), um = qsel(shared, a.sup, a.up), dm = qsel(shared, a.sdown, a.down);
    const int H = gm.cols, I = gm.rows, G = H / QGROUP, KSg = G / MC_GU_GPW, MTg = 8 / KSg, Gd = I / QGROUP;
    const int KSd = Gd / MC_DN_GPW;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, c = lane & 3;
    const mc_layout L = mc_lay(H, I);
    uint16_t *xs = reinterpret_cast<uint16_t *>(sm);
    float *xsum = reinterpret_cast<float *>(sm + (size_t)H * 2);
    unsigned char *tiles = sm + L.tiles;
    float *red = reinterpret_cast<float *>(sm + L.red);
    uint16_t *act = reinterpret_cast<uint16_t *>(sm + L.act);
    uint16_t *xd = reinterpret_cast<uint16_t *>(sm + L.xd);
    float *xdsum = reinterpret_cast<float *>(sm + L.xdsum);

    /* (1) weights: warp w is warp w of tcv_gateup_kernel's blocks 2b and 2b + 1 (unit w + 8j:
     * gate rows for m-tile 0, up rows for m-tile 1, k-slice w / MTg) and multiplies m-tile w
     * of the block's 128 down rows in both k-slices (fragments in registers). The routed
     * rows wait for the router's ids; the shared expert's are requested before the wait. */
    const int mt = warp % MTg, ks = warp / MTg;
    const int row_d = b * MC_ROWS + warp * 16; /* the warp's first down row */
    tcv_w<MC_DN_GPW> wd[2];
    auto issue = [&](size_t eg, size_t ed) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int rb = (2 * b + j) * 16; /* tcv_gateup_kernel's rb for block 2b + j (half = 1) */
            tcv_tile_async<MC_GU_GPW>(qsel(mt == 1, um, gm), eg + rb, min(16, I - rb), ks * MC_GU_GPW,
                                      tiles + (size_t)(warp + 8 * j) * TCV_WSM(MC_GU_GPW));
            tcv_load<MC_DN_GPW>(dm, ed + row_d + gq, row_d + gq < H, row_d + gq + 8 < H, j * MC_DN_GPW, c, wd[j]);
        }
        cpa_commit();
    };
    if (shared) {
        issue(0, 0);
        pdl_wait();
    } else {
        pdl_wait(); /* the ids are the router's */
        const size_t e = (size_t)a.ids[p];
        issue(e * I, e * H);
    }
    /* The next layer's first projection requests its weights once every block here has
     * triggered: after the wait they load beside this launch's 14 MB, after the activations
     * (ORCHID_MOE_CLUSTER_LATE=1) beside the down products only (trap 34: measure both). */
    if (!a.trig_late) pdl_trigger();
    /* the combine's operands, requested now (the slice's last block reads them) */
    const float x_old = tid < MC_ROWS && b * MC_ROWS + tid < H ? a.x[b * MC_ROWS + tid] : 0.0f;

    /* (2) the token, then the gate/up products of both units */
    tcv_stage(a.xn, H, 1, H, xs, xsum);
    cpa_wait<0>();
    __syncwarp(); /* the warp's tiles (its own copies and zero rows) visible to all its lanes */
#pragma unroll
    for (int j = 0; j < 2; j++) {
        float acc0 = 0.0f, acc1 = 0.0f;
        tcv_mma_smem<MC_GU_GPW>(tiles + (size_t)(warp + 8 * j) * TCV_WSM(MC_GU_GPW), xs, xsum, ks * MC_GU_GPW, acc0, acc1);
        if (c == 0) {
            red[(warp + 8 * j) * 16 + gq] = acc0;
            red[(warp + 8 * j) * 16 + gq + 8] = acc1;
        }
    }
    __syncthreads();
    if (tid < MC_ACT) { /* tcv_gateup_kernel's epilogue for block 2b + j, row i */
        const int j = tid / 16, i = tid % 16, row = (2 * b + j) * 16 + i;
        const float v = tcv_slice_sum(red + j * 128, KSg, MTg, 0, i), u = tcv_slice_sum(red + j * 128, KSg, MTg, 1, i);
        act[tid] = row < I ? f2bf(silu(v) * u) : 0;
    }
    cl.sync(); /* every block's activations are in its shared memory */
    if (a.trig_late) pdl_trigger();

    /* (3) the pair's activation row from the cluster, staged as tcv_stage stages it */
    for (int i = tid; i < I; i += blockDim.x) xd[i] = cl.map_shared_rank(act, i / MC_ACT)[i % MC_ACT];
    __syncthreads();
    sk_group_sums<true>(xd, 1, I, Gd, xdsum);
    __syncthreads();
    cl.sync(); /* every block has read the others' activations: they may go */

    /* (4) the down rows: warp w's m-tile in both k-slices, each row's slices summed from 0 */
#pragma unroll
    for (int j = 0; j < 2; j++) {
        float acc0 = 0.0f, acc1 = 0.0f;
        tcv_mma<MC_DN_GPW>(wd[j], xd, xdsum, j * MC_DN_GPW, c, acc0, acc1);
        if (c == 0) {
            red[(warp * KSd + j) * 16 + gq] = acc0;
            red[(warp * KSd + j) * 16 + gq + 8] = acc1;
        }
    }
    __syncthreads();
    if (tid < MC_ROWS && b * MC_ROWS + tid < H) {
        const int w = tid / 16, i = tid % 16;
        float v = 0.0f;
        for (int k = 0; k < KSd; k++) v += red[(w * KSd + k) * 16 + i];
        a.v[(size_t)p * H + b * MC_ROWS + tid] = v;
    }

    /* (5) the slice's last block adds the K + 1 pairs into the residual: σ(seg)·shared, then
     * fmaf(w_k, routed_k, ·) for k = 0..K-1 (tcv_down_kernel's order) */
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        last = atomicAdd(a.cnt + b, 1) == a.K;
        if (last) a.cnt[b] = 0; /* every block of the slice has counted: the next launch starts from 0 */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int row = b * MC_ROWS + tid;
    if (tid < MC_ROWS && row < H) {
        const float sg = 1.0f / (1.0f + expf(-__ldcg(a.seg)));
        float acc = sg * __ldcg(a.v + (size_t)a.K * H + row);
        for (int q = 0; q < a.K; q++) acc = fmaf(__ldcg(a.w + q), __ldcg(a.v + (size_t)q * H + row), acc);
        a.x[row] = x_old + acc;
    }
#else
    __trap(); /* never launched: mc_blocks is 0 before sm_90 */
#endif
}

/* Whether the device holds such a cluster (two blocks an SM), set by cuda_tcv_moe_cluster_init;
 * on: ORCHID_MOE_CLUSTER=1 or forced by the tests (-1: not forced). */
static int mc_fits = 0, mc_env = 0, mc_forced = -1;

extern "C" void cuda_tcv_moe_cluster_force(int on) { mc_forced = on < 0 ? -1 : on ? 1 : 0; }

extern "C" int cuda_tcv_moe_cluster_init(int H, int I, char *err, size_t errlen) {
    mc_env = env_flag("ORCHID_MOE_CLUSTER");
    mc_fits = 0;
    cuda_caps caps;
    if (device_caps(&caps) != cudaSuccess || caps.major < 9 || H <= 0 || I <= 0) return 0;
    const size_t smem = mc_lay(H, I).total;
    if (cudaFuncSetAttribute(moe_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess ||
        cudaFuncSetAttribute(moe_cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
        cudaGetLastError(); /* the form stays off; the pair launches serve */
        return 0;
    }
    launch_cfg lc(dim3(MC_C, 1), dim3(256), smem, 0, false, MC_C);
    mc_fits = lc.max_active_clusters(moe_cluster_kernel) > 0;
    (void)err;
    (void)errlen;
    return 0;
}

extern "C" int cuda_tcv_moe_cluster_ok(const struct cuda_qmat *gate, const struct cuda_qmat *up, const struct cuda_qmat *down,
                                       const struct cuda_qmat *sh_gate, const struct cuda_qmat *sh_up,
                                       const struct cuda_qmat *sh_down, int K) {
    const bool on = mc_forced >= 0 ? mc_forced > 0 : mc_env;
    if (!on || !mc_fits || K < 1 || K + 1 > 16) return 0;
    const int H = gate->cols, I = gate->rows;
    const struct cuda_qmat *all[6] = {gate, up, down, sh_gate, sh_up, sh_down};
    for (int i = 0; i < 6; i++)
        if (all[i]->bits != 4 || all[i]->n_mats < 1) return 0;
    /* the model's shapes: hidden 2,048 (32 groups: 4 k-slices of 8), experts of 512 (8
     * groups: 2 of 4), the shared expert as wide as the routed ones */
    return H == 2048 && I == MC_C * MC_ACT && cuda_skinny_kslices(H) == 4 && cuda_skinny_kslices(I) == 2 &&
           up->rows == I && up->cols == H && down->rows == H && down->cols == I && sh_gate->rows == I &&
           sh_gate->cols == H && sh_up->rows == I && sh_up->cols == H && sh_down->rows == H && sh_down->cols == I &&
           H == MC_C * MC_ROWS;
}

extern "C" int cuda_tcv_moe_cluster(const struct cuda_ctx *c, const struct cuda_qmat *gate, const struct cuda_qmat *up,
                                    const struct cuda_qmat *down, const struct cuda_qmat *sh_gate,
                                    const struct cuda_qmat *sh_up, const struct cuda_qmat *sh_down, const int32_t *ids,
                                    const float *w, const float *seg, const uint16_t *xn, int K, float *v, int *cnt,
                                    float *x) {
    if (!cuda_tcv_moe_cluster_ok(gate, up, down, sh_gate, sh_up, sh_down, K))
        return errorf(c->err, c->errlen, ST_UNSUPPORTED, "moe_cluster: not for %d × %d experts, top-%d", gate->rows,
                      gate->cols, K);
    static const bool late = env_flag("ORCHID_MOE_CLUSTER_LATE");
    const mc_args a = {*gate, *up, *down, *sh_gate, *sh_up, *sh_down, ids, w, seg, xn, K, v, cnt, x, late};
    launch_cfg lc(dim3(MC_C, K + 1), dim3(256), mc_lay(gate->cols, gate->rows).total, cstream(c), true, MC_C);
    LAUNCH_CHECK_RC(c, lc.launch(moe_cluster_kernel, a), "moe_cluster");
}

CUDA_TRACE_TU(tcv_moe_cluster)
