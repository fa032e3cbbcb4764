/* cpu/cpu_ops.h — the scalar reference math of every model stage, in float32.
 *
 * These functions are the definition other backends are tested against: plain
 * loops, no fusion beyond what reads naturally. Quantized matrices are
 * dequantized one row at a time (in registers, or into a one-row buffer) and never
 * materialised.
 * Shapes are given as [rows, cols] row-major with explicit leading dimensions.
 */
#ifndef ORCHID_CPU_OPS_H
#define ORCHID_CPU_OPS_H

#include <stdint.h>

#include "model/weights.h"
#include "runtime/threadpool.h"

/* Dequantizes row `row` of matrix `mat` of m into out[m->cols] (float32: s*q + b). */
void qmat_dequant_row(const struct qmat *m, int mat, int row, float *out);

/* y[t, r] = Σ_c x[t, c] · W_mat[r, c] for t < T, r < m->rows. x: [T, ldx], y: [T, ldy].
 * Batch-invariant: y[t, r] is bit-identical whatever T is and wherever token t sits in
 * the batch (the same operations in the same order for every T; a thread count does not
 * change it either), so batching never changes a sequence's results. With AVX2+FMA,
 * 4/8-bit rows dequantize as fma(q, s, b) and dot with two 8-lane accumulators (fast for
 * one token and for many); otherwise the generic dequantize-then-dot_f32 path. */
void cpu_qmatmul(threadpool *pool, const struct qmat *m, int mat, const float *x, int T, int ldx, float *y, int ldy);

float dot_f32(const float *a, const float *b, int n);

/* out = x / sqrt(mean(x²) + eps) · gain (gain may be NULL: 1). In place allowed. */
void rmsnorm(float *out, const float *x, const float *gain, int n, float eps);

/* Half-split (NeoX) RoPE on the first rot dims of one head vector x[head_dim] at position pos:
 * pairs (x_j, x_{j+rot/2}), angle pos · theta^(-2j/rot). */
void rope_neox(float *x, int rot, int pos, float theta);

static inline float silu_f32(float x) { return x / (1.0f + __builtin_expf(-x)); }
static inline float sigmoid_f32(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
static inline float softplus_f32(float x) { return x > 20.0f ? x : __builtin_log1pf(__builtin_expf(x)); }

/* MoE routing for one token: softmax over n logits (in float32), top-k by probability
 * (ties → lowest index), renormalised to sum 1 when `renorm`. */
void moe_route(const float *logits, int n, int k, int renorm, int32_t *ids, float *weights);

/* One gated-delta-rule step for one value head. S: [Dv, Dk] float32 state (updated in place);
 * q, k: [Dk] already normalised (q also scaled by Dk^-1/2); v: [Dv]; decay = α ∈ (0, 1]; y: [Dv]. */
void gdn_step(float *S, const float *q, const float *k, const float *v, float decay, float beta, int Dk, int Dv, float *y);

#endif
