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
    int wlo; /* dequantize the rounding residual w - bf16(w) instead of w (precise passes) */
};

/* Rows of a grouped route tile (cuda_moe.cu's MOE_BM): both GEMM forms take one tile a block row. */
#define GEMM_TILE_ROWS 64

/* The Hopper form (cuda_gemm_wg.cu). gemm_wg_init: shared-memory opt-ins and a probe that the
 * sm_90a code is what runs here (off with ORCHID_NO_WGMMA=1); gemm_wg_usable: whether this
 * product can take it (4-bit, no residual pass, shapes and alignment); gemm_wg_launch:
 * launches it (grid from the arguments: dense when a.tiles is NULL). */
int gemm_wg_init(char *err, size_t errlen);
bool gemm_wg_usable(const gemm_args &a, bool swiglu);
int gemm_wg_launch(const struct cuda_ctx *c, const gemm_args &a, bool swiglu, int tile_rows, const char *what);

#endif
