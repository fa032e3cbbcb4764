// cuda/cuda_gemm.h — what the two forms of the prefill GEMM share: the launch arguments
// (cuda_gemm.cu fills them for every dense, SwiGLU and grouped product) and the Hopper
// form's entry points (cuda_gemm_wg.cu), which cuda_gemm.cu's dispatch calls when the
// device and the matrix allow it.
#ifndef ORCHID_CUDA_GEMM_H
#define ORCHID_CUDA_GEMM_H

#include "cuda/cuda_internal.h"

/* y[M, N] = x[M, K] · W[N, K]ᵀ, W MLX affine (group 64). Grouped (MoE) launches set tiles:
 * block row y takes tile y of the route's list (expert, m0, m_end) and gathers its A rows
 * through a_rows (the route's row_of_slot); their outputs are indexed by slot. */
struct gemm_args {
    const uint16_t *x;
    int ldx;
    const int32_t *a_rows; /* gather map of A rows (NULL: identity) */
    int M, N, K;
    cuda_qmat b0, b1; /* b1: up matrix of the SwiGLU variant */
    float *y;
    int ldy, accumulate;
    uint16_t *act;
    int ld_act;
    const int32_t *tiles; /* grouped: [max_tiles][3] then the count */
    int max_tiles;
    int tile_rows; /* grouped: the route's slots a tile (64 or 128) */
    int wlo; /* dequantize the rounding residual w - bf16(w) instead of w (precise passes) */
    const uint16_t *x_lo; /* the fused precise form: x's low part, [M, ldx] as x */
};

/* Slots a route tile holds for the prefill GEMMs (cuda_moe_route_build's tile_rows): the
 * wgmma form takes one such tile a block row, the mma.sync form two blocks of 64 rows. The
 * batched-decode kernels (cuda_skinny.cu) need tiles of at most 64. */
#define GEMM_TILE_ROWS 128

/* The Hopper form (cuda_gemm_wg.cu). gemm_wg_init: shared-memory opt-ins and a probe that the
 * sm_90a code is what runs here (off with ORCHID_NO_WGMMA=1); gemm_wg_usable: whether this
 * product can take it (4-bit, no residual pass, shapes and alignment); gemm_wg_launch:
 * launches it (dense when a.tiles is NULL; grouped: tile_blocks block rows, one a route tile). */
int gemm_wg_init(char *err, size_t errlen);
bool gemm_wg_usable(const gemm_args &a, bool swiglu);
int gemm_wg_launch(const struct cuda_ctx *c, const gemm_args &a, bool swiglu, int tile_blocks, const char *what);

#endif
