// cuda/cuda_util.cu — device memory helpers exported to C (backend and tests),
// small utility kernels (fp32 → bf16, the decode-step advance).
#include <stdio.h>

#include "cuda/cuda_internal.h"

extern "C" int cuda_malloc(void **p, size_t bytes, const char *what, char *err, size_t errlen) {
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        *p = NULL;
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        return errorf(err, errlen, e == cudaErrorMemoryAllocation ? ST_NOMEM : ST_DEVICE,
                      "cudaMalloc of %.1f MiB for %s failed: %s (%.1f of %.1f GiB free)", (double)bytes / (1 << 20),
                      what, cudaGetErrorString(e), (double)fr / (1 << 30), (double)tot / (1 << 30));
    }
    return 0;
}

extern "C" void cuda_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" int cuda_h2d(void *dst, const void *src, size_t bytes, char *err, size_t errlen) {
    CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), err, errlen, "host to device copy");
    return 0;
}

extern "C" int cuda_d2h(void *dst, const void *src, size_t bytes, char *err, size_t errlen) {
    CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), err, errlen, "device to host copy");
    return 0;
}

extern "C" int cuda_memset0(void *dst, size_t bytes, char *err, size_t errlen) {
    CUDA_TRY(cudaMemset(dst, 0, bytes), err, errlen, "device memset");
    return 0;
}

extern "C" int cuda_sync(char *err, size_t errlen) {
    CUDA_TRY(cudaDeviceSynchronize(), err, errlen, "device synchronize");
    return 0;
}

extern "C" int cuda_device_name(char *buf, size_t len) {
    int dev = 0;
    cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        cudaGetLastError();
        snprintf(buf, len, "no CUDA device");
        return ST_DEVICE;
    }
    snprintf(buf, len, "%s (sm_%d%d, %d SMs, %.0f GiB)", p.name, p.major, p.minor, p.multiProcessorCount,
             (double)p.totalGlobalMem / (1 << 30));
    return 0;
}

/* PDL: both kernels trigger, then wait before touching anything. */
static __global__ void f32_to_bf16_kernel(const float *x, size_t n, uint16_t *y) {
    pdl_trigger();
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = f2bf(x[i]);
}

extern "C" int cuda_f32_to_bf16(const struct cuda_ctx *c, const float *x, size_t n, uint16_t *y) {
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    if (blocks == 0) return 0;
    LAUNCH_CHECK_RC(c, launch_k(f32_to_bf16_kernel, dim3((unsigned)blocks), dim3(256), 0, cstream(c), x, n, y),
                    "f32_to_bf16");
}

static __global__ void decode_advance_kernel(int32_t *pos, int32_t *step, const int32_t *tok, int32_t *out_ids) {
    pdl_trigger();
    pdl_wait();
    const int s = step[0];
    out_ids[s] = tok[0];
    step[0] = s + 1;
    pos[0] = pos[0] + 1;
}

extern "C" int cuda_decode_advance(const struct cuda_ctx *c, int32_t *pos, int32_t *step, const int32_t *tok,
                                   int32_t *out_ids) {
    LAUNCH_CHECK_RC(c, launch_k(decode_advance_kernel, dim3(1), dim3(1), 0, cstream(c), pos, step, tok, out_ids),
                    "decode_advance");
}

/* Holds the stream for `ns` nanoseconds of GPU time (%globaltimer). The per-op profile puts
 * it first so the host queues the whole forward (kernels and events) while the GPU waits:
 * the event deltas are then GPU time per op with the stream's own launch gaps, not the
 * host's launch rate (which otherwise dominates a single-token forward). */
static __global__ void spin_kernel(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

extern "C" int cuda_spin(const struct cuda_ctx *c, double us) {
    spin_kernel<<<1, 1, 0, cstream(c)>>>((unsigned long long)(us * 1e3));
    LAUNCH_CHECK_RC(c, cudaGetLastError(), "spin");
}

/* Device-to-device copy bandwidth (bytes read + written per second), for benchmarks. */
extern "C" int cuda_copy_bandwidth(size_t bytes, int reps, double *gbps, char *err, size_t errlen) {
    void *a = NULL, *b = NULL;
    int rc = cuda_malloc(&a, bytes, "copy benchmark", err, errlen);
    if (!rc) rc = cuda_malloc(&b, bytes, "copy benchmark", err, errlen);
    if (rc) { cuda_free(a); return rc; }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemset(a, 1, bytes);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0);
    for (int i = 0; i < reps; i++) cudaMemcpy(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaError_t e = cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cuda_free(a);
    cuda_free(b);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "copy benchmark: %s", cudaGetErrorString(e));
    *gbps = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9;
    return 0;
}

extern "C" int cuda_mem_info(size_t *free_b, size_t *total_b) {
    if (cudaMemGetInfo(free_b, total_b) != cudaSuccess) {
        cudaGetLastError();
        return ST_DEVICE;
    }
    return 0;
}
