// cuda/cuda_stream_bench.cu — how fast can one SM, and the whole GPU, pull weights from
// DRAM with each way of loading them (tests/gpu/bench_stream.c prints the table)? The
// decode kernels are chains of one-shot loads of 5-15 MB spread over all SMs, so what
// matters is the rate a single SM sustains with everything it can have in flight:
//   0 ld8    the tcv fragment loads: lane (g, c) takes 8 bytes of rows g and g + 8 in each
//            32-byte group, 16 loads in flight a thread (cuda_tcv.cu / tcv_load)
//   1 ld16   coalesced 16-byte loads, 8 in flight a thread
//   2 cpa16  cp.async 16 bytes a lane into a shared-memory ring of 4 × 16 KB stages
//   3 bulk   cp.async.bulk (the copy engine, one thread issues 16 KB) into the same ring,
//            completion on an mbarrier per stage
// Each block streams its own contiguous slice of `bytes` (grid = `blocks` blocks); the
// values are folded into one word per block so nothing is optimised away.
#include "cuda/cuda_internal.h"

#define SB_STAGE 16384
#define SB_STAGES 4

static __global__ void sb_ld8(const uint4 *src, size_t per_block, unsigned *out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, gq = lane >> 2, c = lane & 3;
    const unsigned char *base = reinterpret_cast<const unsigned char *>(src) + per_block * blockIdx.x;
    unsigned acc = 0;
    /* a tile = 16 rows × 256 bytes (8 groups of 32), rows 1 KB apart (K = 2048): 16 KB of
     * rows, 4 KB of it read per warp pass; the warps of the block take consecutive tiles */
    for (size_t t = (size_t)warp * 16384; t + 16384 <= per_block; t += (size_t)nw * 16384) {
        for (int seg = 0; seg < 4; seg++) {
            const unsigned char *p = base + t + seg * 256;
            uint2 v[16];
#pragma unroll
            for (int gi = 0; gi < 8; gi++) {
                v[gi] = *reinterpret_cast<const uint2 *>(p + (size_t)gq * 1024 + gi * 32 + c * 8);
                v[8 + gi] = *reinterpret_cast<const uint2 *>(p + (size_t)(gq + 8) * 1024 + gi * 32 + c * 8);
            }
#pragma unroll
            for (int i = 0; i < 16; i++) acc ^= v[i].x + v[i].y;
        }
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if (lane == 0) atomicXor(out + blockIdx.x, acc);
}

static __global__ void sb_ld16(const uint4 *src, size_t per_block, unsigned *out) {
    const uint4 *p = src + per_block / 16 * blockIdx.x;
    const size_t n = per_block / 16;
    unsigned acc = 0;
    for (size_t i = threadIdx.x; i + 7 * blockDim.x < n; i += 8 * (size_t)blockDim.x) {
        uint4 v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = ld_stream(p + i + k * blockDim.x);
#pragma unroll
        for (int k = 0; k < 8; k++) acc ^= v[k].x + v[k].w;
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, acc);
}

static __global__ void sb_cpa16(const uint4 *src, size_t per_block, unsigned *out) {
    extern __shared__ __align__(16) unsigned char sm[];
    const unsigned char *p = reinterpret_cast<const unsigned char *>(src) + per_block * blockIdx.x;
    const int n = (int)(per_block / SB_STAGE);
    unsigned acc = 0;
    auto issue = [&](int s) {
        if (s < n)
            for (int i = threadIdx.x; i < SB_STAGE / 16; i += blockDim.x)
                cpa16(sm + (s % SB_STAGES) * SB_STAGE + i * 16, p + (size_t)s * SB_STAGE + i * 16);
        cpa_commit();
    };
    for (int s = 0; s < SB_STAGES - 1; s++) issue(s);
    for (int s = 0; s < n; s++) {
        issue(s + SB_STAGES - 1);
        cpa_wait<SB_STAGES - 1>();
        __syncthreads();
        const uint32_t *st = reinterpret_cast<const uint32_t *>(sm + (s % SB_STAGES) * SB_STAGE);
        acc ^= st[threadIdx.x * 4];
        __syncthreads();
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, acc);
}

static __global__ void sb_bulk(const uint4 *src, size_t per_block, unsigned *out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) unsigned char sm[];
    __shared__ __align__(8) unsigned long long bar[SB_STAGES];
    const unsigned char *p = reinterpret_cast<const unsigned char *>(src) + per_block * blockIdx.x;
    const int n = (int)(per_block / SB_STAGE);
    unsigned acc = 0;
    if (threadIdx.x == 0) {
        for (int s = 0; s < SB_STAGES; s++) mbar_init(&bar[s], 1);
        mbar_init_fence();
    }
    __syncthreads();
    auto issue = [&](int s) {
        if (threadIdx.x == 0 && s < n) {
            const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[s % SB_STAGES]);
            const unsigned d = (unsigned)__cvta_generic_to_shared(sm + (s % SB_STAGES) * SB_STAGE);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(SB_STAGE) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(d),
                         "l"(p + (size_t)s * SB_STAGE), "r"(SB_STAGE), "r"(b)
                         : "memory");
        }
    };
    for (int s = 0; s < SB_STAGES - 1; s++) issue(s);
    for (int s = 0; s < n; s++) {
        issue(s + SB_STAGES - 1);
        mbar_wait(&bar[s % SB_STAGES], (unsigned)(s / SB_STAGES) & 1u);
        const uint32_t *st = reinterpret_cast<const uint32_t *>(sm + (s % SB_STAGES) * SB_STAGE);
        acc ^= st[threadIdx.x * 4];
        __syncthreads(); /* every thread is done with the stage before it is refilled */
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, acc);
#endif
}

/* GB/s of `method` streaming `bytes` (a multiple of blocks · 64 KB) with `blocks` blocks of
 * `threads`, best of `reps` timed launches after one warm-up. */
extern "C" int cuda_stream_bench(int method, size_t bytes, int blocks, int threads, int reps, double *gbps, char *err,
                                 size_t errlen) {
    if (method < 0 || method > 3 || blocks < 1 || threads < 32 || threads > 1024 || bytes % ((size_t)blocks * 65536))
        return errorf(err, errlen, ST_INVALID, "stream bench: method %d, %zu bytes, %d blocks of %d", method, bytes, blocks,
                      threads);
    void *src = NULL, *out = NULL;
    int rc = cuda_malloc(&src, bytes, "stream bench", err, errlen);
    if (!rc) rc = cuda_malloc(&out, (size_t)blocks * 4, "stream bench", err, errlen);
    if (rc) {
        cuda_free(src);
        return rc;
    }
    cudaMemset(src, 1, bytes);
    const size_t per = bytes / blocks, smem = (size_t)SB_STAGES * SB_STAGE;
    cudaFuncSetAttribute(sb_cpa16, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cudaFuncSetAttribute(sb_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int r = 0; r <= reps; r++) {
        cudaEventRecord(e0);
        const uint4 *s = (const uint4 *)src;
        unsigned *o = (unsigned *)out;
        if (method == 0) sb_ld8<<<blocks, threads>>>(s, per, o);
        else if (method == 1) sb_ld16<<<blocks, threads>>>(s, per, o);
        else if (method == 2) sb_cpa16<<<blocks, threads, smem>>>(s, per, o);
        else sb_bulk<<<blocks, threads, smem>>>(s, per, o);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r > 0 && ms < best) best = ms;
    }
    const cudaError_t e = cudaGetLastError();
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cuda_free(src);
    cuda_free(out);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "stream bench: %s", cudaGetErrorString(e));
    *gbps = bytes / (best * 1e-3) / 1e9;
    return 0;
}
