// cuda/cuda_pdl_bench.cu — what a kernel boundary costs in a CUDA graph, by each way a
// dependent kernel can wait for the one before it (tests/gpu/bench_pdl.c prints the table).
// The decode step is a chain of ~260 dependent launches, each waiting for its predecessor's
// results, so the boundary's own cost is multiplied by the chain:
//   0 plain  stream order (the next kernel starts after the previous one has retired)
//   1 pdl    programmatic dependent launch: trigger at the start, griddepcontrol.wait
//            before the first dependent read (orchid's kernels: cuda_internal.h)
//   2 flag   PDL launch, trigger at the start, then thread 0 of each block polls a counter
//            in global memory (acquire) until every block of the previous kernel has
//            added itself to it (release, after its writes) — what persistent
//            "megakernel" runtimes use between tasks
//   3 flag + __nanosleep(64) between polls
// Each kernel of the chain reads its predecessor's output at a permuted index (data from
// other blocks) and adds 1, so a kernel that ran early leaves a wrong value: the check.
//
// Counters: one per launch of the chain, zeroed by a memset node at the head of the graph.
// A rotation of a few counters reset by later kernels hangs on the second replay: under
// PDL every kernel whose predecessor has triggered may be resident, so kernels far ahead
// read a counter the previous replay left full (docs/ARCHITECTURE.md, trap 44). A poll
// that runs past ~2^22 reads gives up and marks the run (the hang guard).
//
// H200, 300 kernels of 256 threads (docs/PERFORMANCE.md, session 20): the flag costs
// 1.7-3.6 µs a boundary against PDL's 0.9-1.9 — the counter's release and the polls cost
// more than the hardware's own grid-completion signal.
#include "cuda/cuda_internal.h"

#define PB_HANG_SLOT 4095 /* the counters' last word: set when a poll gave up */

__device__ __forceinline__ int pb_ld_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void pb_red_release(int *p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* Launch i of the chain: out[g] = in[perm(g)] + 1 over n = blocks × 256 floats. */
template <int MODE>
static __global__ void pb_step(const float *in, float *out, int n, int *slots, int i, int nprev, int nap) {
    if (MODE >= 1) pdl_trigger(); /* cuda_internal.h: griddepcontrol on sm_90, nothing before */
    if (MODE == 1 || (MODE == 2 && i == 0)) pdl_wait();
    if (MODE == 2 && i > 0) {
        if (threadIdx.x == 0) {
            long long k = 0;
            while (pb_ld_acquire(slots + i - 1) < nprev) {
                if (nap) __nanosleep(nap);
                if (++k > (1ll << 22)) {
                    slots[PB_HANG_SLOT] = 1;
                    break;
                }
            }
        }
        __syncthreads();
    }
    const int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g < n) out[g] = in[(int)(((long long)g * 37 + 11) % n)] + 1.0f;
    if (MODE == 2) {
        __syncthreads();
        if (threadIdx.x == 0) pb_red_release(slots + i, 1);
    }
}

/* One chain of `kernels` launches of `blocks` × 256 threads, captured into a graph and
 * replayed `reps` times after 3 warm-up replays: *us = µs a kernel; *bad = elements off
 * their expected value, *hung = 1 if a poll gave up. kernels: 2 .. 4,000, even. */
extern "C" int cuda_pdl_bench(int mode, int kernels, int blocks, int reps, double *us, int *bad, int *hung, char *err,
                              size_t errlen) {
    if (mode < 0 || mode > 3 || kernels < 2 || kernels > 4000 || kernels % 2 || blocks < 1 || blocks > 4096 || reps < 1)
        return errorf(err, errlen, ST_INVALID, "pdl bench: mode %d, %d kernels of %d blocks, %d replays", mode, kernels, blocks,
                      reps);
    const int n = blocks * 256, m = mode == 3 ? 2 : mode, nap = mode == 3 ? 64 : 0;
    float *a = NULL, *b = NULL;
    int *slots = NULL;
    int rc = cuda_malloc((void **)&a, (size_t)n * 4, "pdl bench", err, errlen);
    if (!rc) rc = cuda_malloc((void **)&b, (size_t)n * 4, "pdl bench", err, errlen);
    if (!rc) rc = cuda_malloc((void **)&slots, (PB_HANG_SLOT + 1) * sizeof(int), "pdl bench", err, errlen);
    cudaStream_t st = NULL;
    cudaGraph_t gr = NULL;
    cudaGraphExec_t ge = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t e = cudaSuccess;
    if (rc) goto out;
#define PB_TRY(call)                                                                                   \
    do {                                                                                               \
        if ((e = (call)) != cudaSuccess) {                                                             \
            rc = errorf(err, errlen, ST_DEVICE, "pdl bench: %s: %s", #call, cudaGetErrorString(e));   \
            goto out;                                                                                  \
        }                                                                                              \
    } while (0)
    PB_TRY(cudaMemset(a, 0, (size_t)n * 4));
    PB_TRY(cudaMemset(b, 0, (size_t)n * 4));
    PB_TRY(cudaMemset(slots, 0, (PB_HANG_SLOT + 1) * sizeof(int)));
    PB_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    PB_TRY(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    if (m == 2) e = cudaMemsetAsync(slots, 0, (size_t)kernels * sizeof(int), st); /* checked with the launches, after the capture ends */
    for (int i = 0; i < kernels && e == cudaSuccess; i++) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(256);
        cfg.stream = st;
        cfg.attrs = at;
        cfg.numAttrs = m ? 1 : 0;
        const float *in = i & 1 ? b : a;
        float *o = i & 1 ? a : b;
        void (*k)(const float *, float *, int, int *, int, int, int) = m == 0 ? pb_step<0> : m == 1 ? pb_step<1> : pb_step<2>;
        e = cudaLaunchKernelEx(&cfg, k, in, o, n, slots, i, blocks, nap);
    }
    {
        const cudaError_t ec = cudaStreamEndCapture(st, &gr);
        if (e == cudaSuccess) e = ec;
    }
    if (e != cudaSuccess) {
        rc = errorf(err, errlen, ST_DEVICE, "pdl bench: capture: %s", cudaGetErrorString(e));
        goto out;
    }
    PB_TRY(cudaGraphInstantiate(&ge, gr, 0));
    for (int w = 0; w < 3; w++) PB_TRY(cudaGraphLaunch(ge, st));
    PB_TRY(cudaEventCreate(&e0));
    PB_TRY(cudaEventCreate(&e1));
    PB_TRY(cudaEventRecord(e0, st));
    for (int r = 0; r < reps; r++) PB_TRY(cudaGraphLaunch(ge, st));
    PB_TRY(cudaEventRecord(e1, st));
    PB_TRY(cudaEventSynchronize(e1));
    {
        float ms = 0;
        PB_TRY(cudaEventElapsedTime(&ms, e0, e1));
        *us = ms * 1e3 / ((double)reps * kernels);
        /* after 3 + reps replays of an even chain every element of a holds (3 + reps) · kernels */
        float *h = (float *)malloc((size_t)n * 4);
        if (!h) {
            rc = errorf(err, errlen, ST_NOMEM, "pdl bench: %d floats", n);
            goto out;
        }
        PB_TRY(cudaMemcpy(h, a, (size_t)n * 4, cudaMemcpyDeviceToHost));
        const float want = (float)(3 + reps) * (float)kernels;
        int nb = 0;
        for (int g = 0; g < n; g++) nb += h[g] != want;
        free(h);
        *bad = nb;
        PB_TRY(cudaMemcpy(hung, slots + PB_HANG_SLOT, sizeof(int), cudaMemcpyDeviceToHost));
    }
#undef PB_TRY
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (ge) cudaGraphExecDestroy(ge);
    if (gr) cudaGraphDestroy(gr);
    if (st) cudaStreamDestroy(st);
    cuda_free(a);
    cuda_free(b);
    cuda_free(slots);
    return rc;
}
