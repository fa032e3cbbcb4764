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

extern "C" void *cuda_pinned_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 16) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

extern "C" void cuda_pinned_free(void *p) {
    if (p) cudaFreeHost(p);
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

/* The backend's reading of an A/B switch (env_flag), for tests that check a default choice. */
extern "C" int cuda_env_flag(const char *name) { return env_flag(name); }

extern "C" int cuda_sm_count(void) {
    cuda_caps c;
    return device_caps(&c) == cudaSuccess && c.sms > 0 ? c.sms : ST_DEVICE;
}

/* Writes 1 when the sm_90a code is what this device runs (a binary without it, or another
 * architecture, gets the empty body and 0). Every file is built with the same -gencode
 * list, so this one kernel answers for all the sm_90a-only forms (wgmma, the pipelined
 * MoE). */
static __global__ void sm90a_probe(int *out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}

/* 1 / 0, or negative (err filled) when the probe could not run; asked once, then remembered. */
int cuda_sm90a_code(char *err, size_t errlen) {
    static int known = -1;
    if (known >= 0) return known;
    int *d = NULL, h = 0;
    if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "sm_90a probe: allocation failed");
    sm90a_probe<<<1, 1>>>(d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess) return errorf(err, errlen, ST_DEVICE, "sm_90a probe failed: %s", cudaGetErrorString(e));
    return known = h == 1;
}

/* PDL: both kernels trigger, then wait before touching anything. */
static __global__ void f32_to_bf16_kernel(const float *x, size_t n, uint16_t *y) {
    TRACE_KERNEL();
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
    TRACE_KERNEL();
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
    TRACE_KERNEL();
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

CUDA_TRACE_TU(util)

/* ---- the in-kernel trace's host side: every translation unit's g_trace set at once ---- */
#define TRACE_TUS(X) X(attn) X(flash) X(gdn) X(gdn_chunk) X(gdn_prefill) X(gemm) X(gemm_wg) X(gemv) X(moe) X(norm) X(sample) X(skinny) \
    X(skinny_pipe) X(skinny_tall) X(skinny_wide) X(tcv)
#ifdef ORCHID_TRACE
#define TRACE_DECL(name) extern "C" int cuda_trace_set_##name(const cuda_trace_dev *d);
TRACE_TUS(TRACE_DECL)
#endif

static cuda_trace_dev trace_on; /* host copy of what the kernels see (buf NULL: off) */

#ifdef ORCHID_TRACE
static int trace_set(const cuda_trace_dev *d) {
    int rc = cuda_trace_set_util(d);
#define TRACE_CALL(name) rc |= cuda_trace_set_##name(d);
    TRACE_TUS(TRACE_CALL)
    return rc;
}
#else
static int trace_set(const cuda_trace_dev *) { return -1; }
#endif

#ifdef ORCHID_TRACE
unsigned cuda_trace_launches; /* declared in cuda_internal.h */
extern "C" unsigned cuda_trace_launch_count(void) { return cuda_trace_launches; }
#else
extern "C" unsigned cuda_trace_launch_count(void) { return 0; }
#endif

extern "C" int cuda_trace_begin(unsigned cap_per_sm, char *err, size_t errlen) {
#ifndef ORCHID_TRACE
    (void)cap_per_sm;
    return errorf(err, errlen, ST_UNSUPPORTED, "cuda trace: built without ORCHID_TRACE (make NVCC_EXTRA=-DORCHID_TRACE)");
#endif
    if (trace_on.buf) return errorf(err, errlen, ST_INTERNAL, "cuda trace: already on");
    cuda_trace_dev d = {NULL, NULL, cap_per_sm};
    int rc = cuda_malloc((void **)&d.buf, (size_t)CUDA_TRACE_SMS * cap_per_sm * sizeof(cuda_trace_rec), "trace", err, errlen);
    if (!rc) rc = cuda_malloc((void **)&d.n, CUDA_TRACE_SMS * sizeof(unsigned), "trace", err, errlen);
    if (!rc && cudaMemset(d.n, 0, CUDA_TRACE_SMS * sizeof(unsigned)) != cudaSuccess)
        rc = errorf(err, errlen, ST_DEVICE, "cuda trace: clearing the counters failed");
    if (!rc && trace_set(&d)) rc = errorf(err, errlen, ST_DEVICE, "cuda trace: setting the trace pointers failed");
    if (rc) {
        cuda_free(d.buf);
        cuda_free(d.n);
        return rc;
    }
    trace_on = d;
    return 0;
}

extern "C" int cuda_trace_end(cuda_trace_rec **out, size_t *n_out, char *err, size_t errlen) {
    *out = NULL;
    *n_out = 0;
    if (!trace_on.buf) return errorf(err, errlen, ST_INTERNAL, "cuda trace: not on");
    const cuda_trace_dev d = trace_on, off = {NULL, NULL, 0};
    trace_on = off;
    unsigned counts[CUDA_TRACE_SMS];
    cuda_trace_rec *all = (cuda_trace_rec *)malloc((size_t)CUDA_TRACE_SMS * d.cap_per_sm * sizeof(cuda_trace_rec));
    int rc = trace_set(&off) ? errorf(err, errlen, ST_DEVICE, "cuda trace: clearing the trace pointers failed") : 0;
    if (!rc && !all) rc = errorf(err, errlen, ST_NOMEM, "cuda trace: no memory for the records");
    if (!rc && (cudaMemcpy(counts, d.n, sizeof counts, cudaMemcpyDeviceToHost) != cudaSuccess ||
                cudaMemcpy(all, d.buf, (size_t)CUDA_TRACE_SMS * d.cap_per_sm * sizeof(cuda_trace_rec),
                           cudaMemcpyDeviceToHost) != cudaSuccess))
        rc = errorf(err, errlen, ST_DEVICE, "cuda trace: reading the records failed");
    size_t n = 0;
    for (int s = 0; !rc && s < CUDA_TRACE_SMS; s++) /* compact the per-SM slices */
        for (unsigned i = 0; i < counts[s] && i < d.cap_per_sm; i++) all[n++] = all[(size_t)s * d.cap_per_sm + i];
    cuda_free(d.buf);
    cuda_free(d.n);
    if (rc) {
        free(all);
        return rc;
    }
    *out = all;
    *n_out = n;
    return 0;
}
