/* cuda/cuda_internal.h — helpers shared by the .cu files (CUDA C++ only):
 * launch checking in the status.h convention, Programmatic Dependent Launch
 * (launch_k, pdl_wait, pdl_trigger), bf16 conversion, warp reductions, and the
 * MLX affine dequantization of packed codes. */
#ifndef ORCHID_CUDA_INTERNAL_H
#define ORCHID_CUDA_INTERNAL_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <utility>

#include "cuda/cuda_ops.h"

extern "C" {
#include "runtime/status.h"
}

#define QGROUP 64

/* Trace builds count every checked launch (cuda_trace_launches, cuda_util.cu), so the
 * timeline can say which launches each named op of a forward made. */
#ifdef ORCHID_TRACE
extern "C" unsigned cuda_trace_launches;
#define TRACE_COUNT_LAUNCH() (cuda_trace_launches++)
#else
#define TRACE_COUNT_LAUNCH() ((void)0)
#endif

/* Checks the launch just made; returns from the calling launcher on failure. */
#define LAUNCH_CHECK(c, what)                                                                          \
    do {                                                                                               \
        TRACE_COUNT_LAUNCH();                                                                          \
        cudaError_t e_ = cudaGetLastError();                                                           \
        if (e_ != cudaSuccess)                                                                         \
            return errorf((c)->err, (c)->errlen, ST_DEVICE, "CUDA launch of %s failed: %s", (what),    \
                          cudaGetErrorString(e_));                                                     \
        return 0;                                                                                      \
    } while (0)

#define CUDA_TRY(call, err, errlen, what)                                                              \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess)                                                                         \
            return errorf((err), (errlen), ST_DEVICE, "%s: %s failed: %s", (what), #call,              \
                          cudaGetErrorString(e_));                                                     \
    } while (0)

/* Checks a launch_k launch: its returned error, else the sticky one (cleared either way);
 * returns from the calling launcher on failure only. */
#define LAUNCH_TRY(c, call, what)                                                                      \
    do {                                                                                               \
        TRACE_COUNT_LAUNCH();                                                                          \
        cudaError_t r_ = (call);                                                                       \
        const cudaError_t l_ = cudaGetLastError();                                                     \
        if (r_ == cudaSuccess) r_ = l_;                                                                \
        if (r_ != cudaSuccess)                                                                         \
            return errorf((c)->err, (c)->errlen, ST_DEVICE, "CUDA launch of %s failed: %s", (what),    \
                          cudaGetErrorString(r_));                                                     \
    } while (0)

/* LAUNCH_TRY, then return 0 from the launcher (the LAUNCH_CHECK of a launch_k launch). */
#define LAUNCH_CHECK_RC(c, call, what)                                                                 \
    do {                                                                                               \
        LAUNCH_TRY(c, call, what);                                                                     \
        return 0;                                                                                      \
    } while (0)

static inline cudaStream_t cstream(const struct cuda_ctx *c) { return (cudaStream_t)c->stream; }

/* ---- in-kernel timeline trace (builds with -DORCHID_TRACE only; cuda_util.cu) ----
 * Thread 0 of every block keeps %globaltimer at its start, before and after its pdl_wait,
 * where it takes a launch's tail (last_block_done) and at up to four marks of the kernel's
 * own (trace_mark(TRACE_MARK4 .. 7)), in shared memory, and writes one
 * record with its end time (TRACE_KERNEL's destructor: after any tail) — one atomic per
 * block, at its end, so the timeline is barely disturbed. %gridid names the launch. The
 * records show what a graph's kernels do on the GPU's own clock: when a launch's blocks
 * became resident, when its wait released, how long its body and tail took. Each
 * translation unit has its own copy of the __constant__ pointer (no relocatable device
 * code), set by its CUDA_TRACE_TU setter. Without ORCHID_TRACE all of this is nothing. */
#define TRACE_START 0
#define TRACE_PREWAIT 1
#define TRACE_WAITED 2
#define TRACE_TAIL 3
#define TRACE_MARK4 4 /* free marks for a kernel's own phases (trace_mark) */
#define TRACE_MARK5 5
#define TRACE_MARK6 6
#define TRACE_MARK7 7
#define TRACE_SLOTS 8
#ifdef ORCHID_TRACE
static __constant__ cuda_trace_dev g_trace;
__device__ __forceinline__ unsigned long long *trace_slots() {
    __shared__ unsigned long long t[TRACE_SLOTS];
    return t;
}
__device__ __forceinline__ void trace_mark(int i) {
    if (threadIdx.x != 0) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    trace_slots()[i] = t;
}
struct trace_scope {
    __device__ trace_scope() {
        if (threadIdx.x != 0) return;
        for (int k = 1; k < TRACE_SLOTS; k++) trace_slots()[k] = 0;
        trace_mark(TRACE_START);
    }
    __device__ ~trace_scope() {
        if (threadIdx.x != 0 || !g_trace.buf) return;
        unsigned long long end, grid;
        unsigned sm;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(end));
        asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        const unsigned slot = sm % CUDA_TRACE_SMS, i = atomicAdd(g_trace.n + slot, 1u);
        if (i >= g_trace.cap_per_sm) return;
        cuda_trace_rec r;
        r.grid = grid;
        r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        r.sm = sm;
        for (int k = 0; k < TRACE_SLOTS; k++) r.t[k] = trace_slots()[k];
        r.t[TRACE_SLOTS] = end;
        g_trace.buf[(size_t)slot * g_trace.cap_per_sm + i] = r;
    }
};
#define TRACE_KERNEL() trace_scope trace_scope_
/* A block's time in up to four phases of a loop, summed over its rounds (thread 0's view;
 * lap(k) adds the time since the last lap to phase k, 4 = the rest) and written as marks
 * 4..7 laid end to end after the slot `base` (TRACE_WAITED, or TRACE_START for a kernel
 * without a wait), so a timeline's mark-to-mark deltas are the phases' sums. */
struct trace_clock {
    unsigned long long last, sum[5];
    __device__ void start() {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(last));
        sum[0] = sum[1] = sum[2] = sum[3] = sum[4] = 0;
    }
    __device__ void lap(int k) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        sum[k] += t - last;
        last = t;
    }
    __device__ void finish(int base) {
        if (threadIdx.x != 0) return;
        unsigned long long t = trace_slots()[base];
        for (int k = 0; k < 4; k++) trace_slots()[TRACE_MARK4 + k] = (t += sum[k]);
    }
};
#define CUDA_TRACE_TU(name)                                                                           \
    extern "C" int cuda_trace_set_##name(const cuda_trace_dev *d) {                                   \
        return cudaMemcpyToSymbol(g_trace, d, sizeof *d) == cudaSuccess ? 0 : -1;                     \
    }
#else
__device__ __forceinline__ void trace_mark(int) {}
struct trace_clock {
    __device__ void start() {}
    __device__ void lap(int) {}
    __device__ void finish(int) {}
};
#define TRACE_KERNEL() (void)0
#define CUDA_TRACE_TU(name)
#endif

/* ---- Programmatic Dependent Launch (PDL, sm_90+) ----
 * A kernel launched by launch_k may be scheduled while the kernel before it in the
 * stream is still running (once every block of that one has called pdl_trigger or
 * exited). Rules for every kernel launched by launch_k (docs/ARCHITECTURE.md, traps):
 *  (a) before pdl_wait() it reads only immutable data (weights, scales, biases, gains,
 *      its parameters) and writes nothing; everything an earlier kernel wrote, and every
 *      write (outputs, last_block_done counters, KV / conv / GDN state), comes after it;
 *  (b) every thread calls pdl_wait() on every path, early exits included: a grid that
 *      completes without waiting would let its own dependent run beside its predecessor;
 *  (c) it calls pdl_trigger() early (at its start, or where only a tail is left): the
 *      dependent's pdl_wait still waits for this grid's completion, the trigger only lets
 *      it be scheduled and prefetch;
 *  (d) both compile to nothing below sm_90, and the launch attribute is set only on
 *      devices of compute capability >= 9.0 with ORCHID_PDL != "0" (pdl_enabled()).
 * Without the attribute (old GPU, ORCHID_PDL=0, launch_k_pdl(false, ...) or a plain <<<>>>
 * launch) pdl_wait returns at once and pdl_trigger does nothing. A kernel whose blocks
 * are long-lived and few (the GDN scan, attention) can run slower when scheduled early
 * (its blocks land unevenly on the SMs the previous kernel frees): measure both ways. */
__device__ __forceinline__ void pdl_wait() {
    trace_mark(TRACE_PREWAIT);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    trace_mark(TRACE_WAITED);
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The current device's numbers the kernels' set-ups read: multiprocessors, compute
 * capability major, per-block opt-in and per-SM shared memory. Queried once (the first
 * caller: a backend's set-up, outside any graph capture); the error of that query, if any,
 * is returned every time (the numbers are then 0). */
struct cuda_caps {
    int sms, major, optin, per_sm, coop; /* coop: the device takes cooperative launches */
};
inline cudaError_t device_caps(cuda_caps *out) {
    static const std::pair<cudaError_t, cuda_caps> q = [] {
        cuda_caps c = {0, 0, 0, 0, 0};
        int dev = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c.major, cudaDevAttrComputeCapabilityMajor, dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&c.coop, cudaDevAttrCooperativeLaunch, dev);
        if (e != cudaSuccess) {
            cudaGetLastError();
            c = cuda_caps{0, 0, 0, 0, 0};
        }
        return std::make_pair(e, c);
    }();
    *out = q.second;
    return q.first;
}

/* True when launches get the PDL attribute: device 9.0+ and ORCHID_PDL not "0" (read once,
 * on the first launch; cuda_attn_init asks first, outside any graph capture). */
inline bool pdl_enabled() {
    static const bool on = [] {
        const char *e = getenv("ORCHID_PDL");
        if (e && !strcmp(e, "0")) return false;
        cuda_caps c;
        return device_caps(&c) == cudaSuccess && c.major >= 9;
    }();
    return on;
}

/* The SM count and the per-block opt-in shared memory of the current device (the set-up of
 * the persistent kernels, persistent_grid). */
static inline cudaError_t device_sms_optin(int *n_sm, int *optin) {
    cuda_caps c;
    const cudaError_t e = device_caps(&c);
    *n_sm = c.sms;
    *optin = c.optin;
    return e == cudaSuccess && c.sms < 1 ? cudaErrorInvalidDevice : e;
}

/* A persistent kernel's grid: its dynamic shared memory limit raised to smem, then as many
 * blocks of `threads` as fit on the n_sm SMs; *grid = 0 when smem is above optin (that form
 * stays off). */
template <typename... KArgs>
static inline cudaError_t persistent_grid(void (*kern)(KArgs...), int threads, size_t smem, int n_sm, int optin,
                                          int *grid) {
    *grid = 0;
    if (smem > (size_t)optin) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    int per_sm = 0;
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem);
    if (e == cudaSuccess) *grid = per_sm * n_sm;
    return e;
}

/* Whether this device runs the sm_90a code of the fat binary (cuda_util.cu): 1 / 0, negative
 * with err filled when the probe failed. The sm_90a-only forms check it before they take
 * launches: on another architecture, or from a build without sm_90a, their kernels are the
 * empty fallbacks. */
int cuda_sm90a_code(char *err, size_t errlen);

/* The chunked GDN form (cuda_gdn_chunk.cu), launched by cuda_gdn_scan_prefill after its
 * preparation: init raises the kernel's shared-memory limit where the device has it (at
 * backend creation, outside any capture); the scan reads qk and gates as prepared. */
extern "C" void cuda_gdn_chunk_init(void);
extern "C" int cuda_gdn_chunk_scan(const struct cuda_ctx *c, const float *qk, const float *conv_out, const float *gates,
                                   const struct cuda_seq *seqs, int n_seqs, int n_long, int layer_ord, int T, int Hk, int Hv,
                                   int Dv, float *y);

/* True when the environment variable is set to anything but "" or "0": the backend's A/B
 * switches (the C side's twin is runtime/env.h's env_on). */
inline bool env_flag(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0");
}
/* The same rule for a switch that is on by default: unset or "" gives dflt, "0" off, anything
 * else on (the kernels kept after their A/B: ORCHID_TL_K2048=0, ORCHID_SP_K2048=0). */
inline bool env_flag_or(const char *name, bool dflt) {
    const char *e = getenv(name);
    return e && *e ? strcmp(e, "0") != 0 : dflt;
}

/* A cudaLaunchKernelEx configuration: programmatic stream serialisation when pdl &&
 * pdl_enabled(); with cx > 0, thread-block clusters of cx blocks along x (sm_90). It holds
 * its attributes (cfg points at them: not copyable). */
struct launch_cfg {
    cudaLaunchAttribute attr[3];
    cudaLaunchConfig_t cfg;
    /* cx > 0: clusters of cx blocks; coop: every block resident at once (or the launch fails) */
    launch_cfg(dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl, int cx = 0, bool coop = false) {
        int n = 0;
        if (coop) {
            attr[n].id = cudaLaunchAttributeCooperative;
            attr[n++].val.cooperative = 1;
        }
        if (cx > 0) {
            attr[n].id = cudaLaunchAttributeClusterDimension;
            attr[n].val.clusterDim.x = cx;
            attr[n].val.clusterDim.y = 1;
            attr[n++].val.clusterDim.z = 1;
        }
        if (pdl && pdl_enabled()) {
            attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[n++].val.programmaticStreamSerializationAllowed = 1;
        }
        cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = st;
        cfg.attrs = attr;
        cfg.numAttrs = n;
    }
    launch_cfg(const launch_cfg &) = delete;
    /* Returns the launch's error (check with LAUNCH_TRY / LAUNCH_CHECK_RC). */
    template <typename... KArgs, typename... Args>
    cudaError_t launch(void (*kern)(KArgs...), Args &&...args) {
        return cudaLaunchKernelEx(&cfg, kern, std::forward<Args>(args)...);
    }
};

/* kern<<<grid, block, smem, st>>>(args...) through cudaLaunchKernelEx, with programmatic
 * stream serialisation when pdl && pdl_enabled(); kern must follow rules (a)-(c) above
 * either way. Returns the launch's error (check with LAUNCH_TRY / LAUNCH_CHECK_RC). */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_k_pdl(bool pdl, void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                       cudaStream_t st, Args &&...args) {
    launch_cfg lc(grid, block, smem, st, pdl);
    return lc.launch(kern, std::forward<Args>(args)...);
}
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_k(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                   Args &&...args) {
    return launch_k_pdl(true, kern, grid, block, smem, st, std::forward<Args>(args)...);
}

/* A Gated DeltaNet token's decay and write strength from its raw gate inputs a, b:
 * (α, β) = (exp(−A·softplus(a + dt_bias)), sigmoid(b)), A = exp(A_log), softplus linear
 * above 20 — one expression for the decode scan and the prefill's gate pass (same bits). */
__device__ __forceinline__ float2 gdn_gates(float a, float b, float dtb, float A) {
    const float xa = a + dtb;
    const float sp = xa > 20.0f ? xa : log1pf(expf(xa));
    return make_float2(expf(-A * sp), 1.0f / (1.0f + expf(-b)));
}
__device__ __forceinline__ float bf(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint16_t f2bf(float f) {
    __nv_bfloat16 b = __float2bfloat16_rn(f);
    return *reinterpret_cast<uint16_t *>(&b);
}
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* N = 2^n ≤ 32 warp sums at once, each bit for bit warp_sum's (the same pairs, xor 16 then 8
 * … 1, added in the same tree): at each of the first n levels a lane keeps half of its values
 * (the upper half where its lane bit is set) and swaps the other half with its partner, so
 * N values cost N − 1 + 5 − n shuffles instead of 5·N. Returns value j = lane >> (5 − n)
 * (every lane of that group of 32 / N holds it). */
template <int N, int C> /* one level with C values left (partner lane ^ 16·C/N), then the next */
__device__ __forceinline__ void warp_sum_level(float (&v)[N], int lane) {
    if constexpr (C > 1) {
        constexpr int h = C / 2, o = 16 * C / N;
        const bool upper = lane & o;
#pragma unroll
        for (int i = 0; i < h; i++) {
            const float lo = v[i], hi = v[h + i];
            v[i] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, o);
        }
        warp_sum_level<N, h>(v, lane);
    }
}
template <int N>
__device__ __forceinline__ float warp_sum_many(float (&v)[N], int lane) {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "warp_sum_many: N a power of two up to 32");
    warp_sum_level<N, N>(v, lane);
    float s = v[0];
#pragma unroll
    for (int o = 16 / N; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

/* One warp l2-normalises a Gated DeltaNet q or k head row of DK floats: dst = src · scale /
 * sqrt(Σ src² + 1e-6), the squares summed in lane order (lane's DK/32 values, then warp_sum);
 * scale = 1/√DK for q, 1 for k. Shared by the decode scan and the prefill's prep (same bits). */
template <int DK>
__device__ __forceinline__ void gdn_l2norm_warp(const float *src, float *dst, float scale, int lane) {
    float v[DK / 32], ss = 0.0f;
#pragma unroll
    for (int i = 0; i < DK / 32; i++) {
        v[i] = src[lane + 32 * i];
        ss += v[i] * v[i];
    }
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss + 1e-6f) * scale;
#pragma unroll
    for (int i = 0; i < DK / 32; i++) dst[lane + 32 * i] = v[i] * inv;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum for blockDim.x a multiple of 32 (<= 1024); every thread gets the result. */
__device__ __forceinline__ float block_sum(float v, float *sh32) {
    v = warp_sum(v);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (l == 0) sh32[w] = v;
    __syncthreads();
    float t = l < nw ? sh32[l] : 0.0f;
    return warp_sum(t);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + __expf(-x)); }

/* The gated RMSNorm of one 128-wide head by one warp, lane holding d = 32·i + lane: the
 * 128-thread block_sum's order (four warp sums, then a warp sum of them in lanes 0..3),
 * then w·y·inv·silu(z) as bf16 into dst[0..127]. cuda_gdn.cu's gated_norm128_kernel and
 * cuda_tcv.cu's fused stage both use it, so they agree with the block form bit for bit.
 * wv: the lane's 4 gains (gnorm128_gains), read before the kernel's pdl_wait — a constant
 * of the model, so not a round trip on the step's chain after it. */
__device__ __forceinline__ void gnorm128_gains(const float *w, float (&wv)[4]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < 4; i++) wv[i] = w[32 * i + lane];
}
__device__ __forceinline__ void gnorm128_warp(const float (&yv)[4], const float (&zv)[4], const float (&wv)[4], float eps,
                                              uint16_t *dst) {
    const int lane = threadIdx.x & 31;
    float part[4];
#pragma unroll
    for (int i = 0; i < 4; i++) part[i] = warp_sum(yv[i] * yv[i]);
    const float t = lane == 0 ? part[0] : lane == 1 ? part[1] : lane == 2 ? part[2] : lane == 3 ? part[3] : 0.0f;
    const float ss = warp_sum(t);
    const float inv = rsqrtf(ss / 128.0f + eps);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int d = 32 * i + lane;
        dst[d] = f2bf(wv[i] * yv[i] * inv * silu(zv[i]));
    }
}

/* Asynchronous global → shared copies (cp.async, sm_80+): 16 bytes through L2 only, 8 or
 * 4 bytes through L1; one commit group per call of cpa_commit; cpa_wait<N> returns when at
 * most N of this thread's groups are still in flight (a barrier then shows them to the
 * block). */
__device__ __forceinline__ void cpa16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cpa8(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cpa4(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
/* 16 bytes, or 16 zero bytes when !valid (gmem must still be a valid address). */
__device__ __forceinline__ void cpa16z(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
/* The same by a 32-bit shared address, n = 16 bytes read or 0 (16 zero bytes written, nothing
 * read); ordered with shared accesses by its memory clobber (the wgmma kernels' copies). */
__device__ __forceinline__ void cpa16n(uint32_t s, const void *gmem, uint32_t n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void cpa_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cpa_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* Shared-memory mbarriers (sm_90 forms; nothing below): init with an arrival count (then
 * mbar_init_fence, by the initialising thread, and a block barrier before others use it), a
 * plain arrival, and a spin on the completion of the phase of the given parity. */
__device__ __forceinline__ void mbar_init(unsigned long long *bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(bar)), "r"(count));
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(unsigned long long *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(unsigned long long *bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                     : "=r"(done)
                     : "r"(b), "r"(parity)
                     : "memory");
#endif
}

/* Rows [r0, r0 + n) (absolute: matrix mat of a stack starts at mat·rows) of a qmat as a
 * one-matrix qmat of its own: the host's view for launches over a part of a stack. */
static inline cuda_qmat qmat_rows(const cuda_qmat &m, size_t r0, int n) {
    cuda_qmat v = m;
    v.codes = m.codes + r0 * (size_t)(m.cols * m.bits / 32);
    v.scales = m.scales + r0 * (size_t)(m.cols / QGROUP);
    v.biases = m.biases + r0 * (size_t)(m.cols / QGROUP);
    v.rows = n;
    v.n_mats = 1;
    return v;
}

/* Key range [*k_lo, *k_hi) of split `split` of a query tile whose last token sees kv_len
 * keys: the tile uses min(n_split, ⌈kv_len / CUDA_ATTN_SPLIT_KEYS⌉) splits (its own length
 * decides, not the batch: cuda_ops.h), later splits are empty. Both attention kernels. */
__device__ __forceinline__ void attn_split_keys(int kv_len, int n_split, int split, int *k_lo, int *k_hi) {
    const int own = min(n_split, (kv_len + CUDA_ATTN_SPLIT_KEYS - 1) / CUDA_ATTN_SPLIT_KEYS);
    const int per = (kv_len + own - 1) / own;
    *k_lo = split * per;
    *k_hi = min(kv_len, *k_lo + per);
}

/* The split combine of one attention row (token t, head h of nh) by one warp, over its
 * columns [2·c0, 2·c0 + 64) (lane: one column pair). The row's split records are
 * part[(t·nh + h)·n_split + s][D + 2] = (m, l, O[D]), its output gate qg's second half
 * (qg[t][h][2D]), its output out[t][h][D] (bf16). O = Σ_s e_s·O_s / Σ_s e_s·l_s, e_s = exp(m_s − M),
 * M = max m_s, the splits folded in order from 0 and empty ones (m_s = −inf) skipped, then
 * times sigmoid(gate). Lane j holds split 32·k + j's m and l (MAXC chunks: n_split ≤ 32·MAXC),
 * so a row's scalars cost one round trip, M is a warp max and e_s one exp a lane; each lane
 * requests a chunk's live values before folding them (e_s and l_s by shuffle, the same fmaf
 * sequence in s order whoever computes it): one more round trip (chunks after the first, at
 * long contexts: their m and l again, then their values). cuda_attn.cu's combine
 * launch and the flash launch's own combine (cuda_flash.cu) both come here, so their bits
 * agree. Plain loads: other blocks wrote the records, seen here after the launch boundary or
 * blocks_barrier's acquire; __ldcg's strong loads were not batched by ptxas (four in flight:
 * the 32 a lane asks for took one round trip each). */
template <int MAXC>
__device__ __forceinline__ void attn_combine_warp(const float *part, const float *qg, int t, int h, int nh, int n_split, int D,
                                                  int c0, uint16_t *out) {
    const size_t row = (size_t)t * nh + h;
    const float *prow = part + row * n_split * (D + 2), *gate = qg + (size_t)t * 2 * nh * D + (size_t)h * 2 * D + D;
    uint16_t *orow = out + row * D;
    const int lane = threadIdx.x & 31, c = 2 * (c0 + lane);
    const float2 gt = *reinterpret_cast<const float2 *>(gate + c);
    /* chunk 0's m and l stay in registers; later chunks' (long contexts) are read again */
    const float m0 = lane < n_split ? prow[(size_t)lane * (D + 2)] : -INFINITY;
    const float l0 = lane < n_split ? prow[(size_t)lane * (D + 2) + 1] : 0.0f;
    float M = m0;
#pragma unroll
    for (int k = 1; k < MAXC; k++) {
        const int s = 32 * k + lane;
        M = fmaxf(M, s < n_split ? prow[(size_t)s * (D + 2)] : -INFINITY);
    }
    M = warp_max(M);
    float L = 0.0f, o0 = 0.0f, o1 = 0.0f;
    if (M != -INFINITY) { /* warp-uniform */
#pragma unroll 1
        for (int k = 0; k < MAXC && 32 * k < n_split; k++) {
            const int s = 32 * k + lane;
            const float m = k == 0 ? m0 : s < n_split ? prow[(size_t)s * (D + 2)] : -INFINITY;
            const float l = k == 0 ? l0 : s < n_split ? prow[(size_t)s * (D + 2) + 1] : 0.0f;
            const unsigned live = __ballot_sync(0xffffffffu, m != -INFINITY);
            const float e = m != -INFINITY ? __expf(m - M) : 0.0f;
            /* every lane's 32 loads issue unconditionally (splits past n_split read the last
             * one's, unused) so none waits behind a branch */
            const float *pv = prow + (size_t)32 * k * (D + 2) + 2 + c;
            const int last = n_split - 1 - 32 * k;
            float2 v[32];
#pragma unroll
            for (int j = 0; j < 32; j++) v[j] = *reinterpret_cast<const float2 *>(pv + (size_t)min(j, last) * (D + 2));
#pragma unroll
            for (int j = 0; j < 32; j++) {
                const float ej = __shfl_sync(0xffffffffu, e, j), lj = __shfl_sync(0xffffffffu, l, j);
                if (live >> j & 1) {
                    L = fmaf(ej, lj, L);
                    o0 = fmaf(ej, v[j].x, o0);
                    o1 = fmaf(ej, v[j].y, o1);
                }
            }
        }
    }
    const float a0 = L > 0.0f ? o0 / L : 0.0f, a1 = L > 0.0f ? o1 / L : 0.0f;
    *reinterpret_cast<uint32_t *>(orow + c) = pack_bf2(a0 * sigm(gt.x), a1 * sigm(gt.y));
}

/* A barrier of the n blocks sharing cnt and gen (both zero at first; cnt is left zero): the
 * blocks must all be resident at once (a cooperative launch, or few enough blocks on an
 * otherwise idle device). Each block's writes before it are seen by every block after it:
 * the barrier orders them before thread 0's acq_rel arrival (as last_block_done), the last
 * arrival releases gen, the others see it change and then fence (acquire). gen is read
 * before the arrival, so a block cannot miss the flip of its own round. A count left dirty
 * (a launch killed between arrivals) would strand the late arrivals: their polls are
 * bounded and end in __trap (docs/ARCHITECTURE.md, trap 44). */
__device__ __forceinline__ void blocks_barrier(int *cnt, int *gen, int n) {
    __syncthreads();
    if (threadIdx.x == 0) {
        int g0, old, now;
        asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(g0) : "l"(gen) : "memory");
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(cnt) : "memory");
        if (old == n - 1) {
            *cnt = 0;
            asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(gen), "r"(g0 + 1) : "memory");
        } else {
            /* relaxed polls, then one acquire fence (polling with acquire loads measured the
             * same on the H200: the attention o-projection's slowdown they were suspected of
             * came from where the flash launch triggered, cuda_flash.cu) */
            long long polls = 0;
            do {
                asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(now) : "l"(gen) : "memory");
                if (++polls > (1ll << 26)) __trap(); /* ~a minute: a launch error, not a hang */
            } while (now == g0);
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
        }
    }
    __syncthreads();
}

/* Pointers of row r (absolute, i.e. mat*rows + row) of a qmat. */
__device__ __forceinline__ const uint32_t *qrow_codes(const cuda_qmat &m, size_t r) {
    return m.codes + r * (size_t)(m.cols * m.bits / 32);
}
__device__ __forceinline__ size_t qrow_group0(const cuda_qmat &m, size_t r) { return r * (size_t)(m.cols / QGROUP); }

/* True in exactly one block of the launch: the last to get here (all blocks must call it,
 * with every thread). That block sees every other block's global writes; it resets the
 * counter for the next launch. The block's writes are ordered before thread 0's release
 * by the first barrier (release is cumulative over what the barrier made visible to it,
 * as in CUTLASS's semaphore), the last block's reads after its acquire by the second:
 * one acq_rel atomic instead of two full fences (__threadfence) on the decode step's
 * critical path (measured: 384 → 391 tok/s at context 512, docs/PERFORMANCE.md). */
/* total: the blocks that count on this counter (default: the whole launch; the router
 * keeps one counter per row of blocks). */
__device__ __forceinline__ bool last_block_done(int *counter, int total = 0) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        if (total <= 0) total = gridDim.x * gridDim.y * gridDim.z;
        int old;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
        last = old == total - 1;
        if (last) {
            *counter = 0; /* no other block touches it again in this launch */
            trace_mark(TRACE_TAIL);
        }
    }
    __syncthreads();
    return last;
}

/* RMSNorm of T rows of x (L2 reads: other blocks wrote them) by one block. It runs after
 * every other block of its launch, on the critical path of the decode step, so the first
 * TN_REG·L values of a row and their gains are read once, together, and kept in registers
 * for the second pass (same sums in the same order as reading them twice). The sum runs on
 * L = 256 lanes (the block's first 256 threads; the rest add 0) in rmsnorm_kernel's order
 * — lane l sums x[l], x[l + 256], ... by fma, then block_sum — so a row normalised here (one
 * token's decode) has the bits the batched path's rmsnorm kernel gives it. A block of fewer
 * than 256 threads (none of the tails today) sums on all of them: correct, other bits. */
#define TN_REG 16
#define TN_LANES 256
/* rsqrt(mean(x²) + eps) of one row of n values in that order: lane l < L = min(block, 256)
 * fmas x[l], x[l + L], ... (the first NR from v[], the rest read through L2), then
 * block_sum. Every one-token norm goes through here (the tails below, the consumers'
 * norms of norm_src_row), so they agree with rmsnorm_kernel bit for bit. */
template <int NR, bool CG = true>
__device__ __forceinline__ float rms_row_inv(const float (&v)[NR], const float *xr, int n, float eps, float *sh) {
    const int L = blockDim.x < TN_LANES ? blockDim.x : TN_LANES;
    const bool lane = (int)threadIdx.x < L;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NR; k++) /* !CG: v is 0 past the row and the lanes, ss unchanged (no predicates) */
        if (!CG || (lane && (int)threadIdx.x + k * L < n)) ss = __fmaf_rn(v[k], v[k], ss);
    for (int i = threadIdx.x + NR * L; lane && i < n; i += L) {
        const float a = CG ? __ldcg(xr + i) : xr[i];
        ss = __fmaf_rn(a, a, ss);
    }
    ss = block_sum(ss, sh);
    return rsqrtf(ss / (float)n + eps);
}

/* A row's first NR values of lane threadIdx.x (i = lane + k·L) into v; past n (or past the
 * L lanes) 0. CG: written by other blocks of this launch, so through L2 (__ldcg); false:
 * written by earlier launches (read after pdl_wait, whose acquire makes them visible) or
 * constants — plain loads, unpredicated, so ptxas issues all NR before the first use
 * (docs/ARCHITECTURE.md, trap 47). */
template <int NR, bool CG = true>
__device__ __forceinline__ void rms_row_load(const float *xr, int n, float (&v)[NR]) {
    const int L = blockDim.x < TN_LANES ? blockDim.x : TN_LANES;
    if (CG) {
#pragma unroll
        for (int k = 0; k < NR; k++) {
            const int i = threadIdx.x + k * L;
            v[k] = (int)threadIdx.x < L && i < n ? __ldcg(xr + i) : 0.0f;
        }
    } else {
        /* an index past the row reads the row's last value, dropped below: predicated loads
         * (strong or plain) had the first sum scheduled between the first load and the other
         * seven — two L2 round trips after every wait (SASS, session 24) */
        float raw[NR];
#pragma unroll
        for (int k = 0; k < NR; k++) raw[k] = xr[min((int)threadIdx.x + k * L, n - 1)];
#pragma unroll
        for (int k = 0; k < NR; k++) v[k] = (int)threadIdx.x < L && (int)threadIdx.x + k * L < n ? raw[k] : 0.0f;
    }
}

/* The normalised row x[i]·inv·gain[i] handed to f(i, value) by the lanes that summed it
 * (v, g: rms_row_load's values of x and of the gains; the rest read again). */
template <int NR, bool CG = true, typename F>
__device__ __forceinline__ void rms_row_out(const float (&v)[NR], const float (&g)[NR], const float *xr, const float *gain,
                                            int n, float inv, F f) {
    const int L = blockDim.x < TN_LANES ? blockDim.x : TN_LANES;
    if ((int)threadIdx.x >= L) return;
#pragma unroll
    for (int k = 0; k < NR; k++) {
        const int i = threadIdx.x + k * L;
        if (i < n) f(i, v[k] * inv * g[k]);
    }
    for (int i = threadIdx.x + NR * L; i < n; i += L) f(i, (CG ? __ldcg(xr + i) : xr[i]) * inv * gain[i]);
}

/* RMSNorm of T rows of x (L2 reads: other blocks wrote them) by one block. It runs after
 * every other block of its launch, on the critical path of the decode step, so the first
 * TN_REG·L values of a row and their gains are read once, together, and kept in registers
 * for the second pass (same sums in the same order as reading them twice). The sum runs on
 * L = 256 lanes (the block's first 256 threads; the rest add 0) in rmsnorm_kernel's order
 * — lane l sums x[l], x[l + 256], ... by fma, then block_sum — so a row normalised here (one
 * token's decode) has the bits the batched path's rmsnorm kernel gives it. A block of fewer
 * than 256 threads (none of the tails today) sums on all of them: correct, other bits. */
__device__ __forceinline__ void tail_rmsnorm(const float *x, int ldx, int T, int n, const cuda_tail_norm &tn) {
    __shared__ float sh[32];
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * ldx;
        float v[TN_REG], g[TN_REG];
        rms_row_load<TN_REG>(xr, n, v);
        rms_row_load<TN_REG>(tn.gain, n, g);
        const float inv = rms_row_inv<TN_REG>(v, xr, n, tn.eps, sh);
        rms_row_out<TN_REG>(v, g, xr, tn.gain, n, inv, [&](int i, float o) {
            tn.xn[(size_t)t * n + i] = f2bf(o);
            if (tn.xn32) tn.xn32[(size_t)t * n + i] = o;
        });
    }
}

/* The consumer's side of a one-token norm (cuda_norm_src): every block of the launch that
 * reads the normalised row computes it itself from the residual, in the tail's order, instead
 * of waiting for its producer's last block to write it (a counter atomic, the tail's reads
 * and a one-block grid end on the decode step's chain, ~3 µs twice a layer: H200, session
 * 4). NS_REG values a thread: n ≤ NS_REG·256 (2,048 here) stay in registers. The gains are
 * the model's and constant: the caller reads them (rms_row_load) before pdl_wait. */
#define NS_REG 8
/* After pdl_wait: f(i, x[i]·inv·gain[i]) for the row (block 0 also stores bf16 into ns.xn). */
template <typename F>
__device__ __forceinline__ void norm_src_row(const cuda_norm_src &ns, int n, const float (&g)[NS_REG], F f) {
    __shared__ float sh[32];
    float v[NS_REG];
    rms_row_load<NS_REG, false>(ns.x, n, v); /* the residual: earlier launches wrote it */
    const float inv = rms_row_inv<NS_REG, false>(v, ns.x, n, ns.eps, sh);
    uint16_t *xn = blockIdx.x == 0 && blockIdx.y == 0 ? ns.xn : nullptr;
    rms_row_out<NS_REG, false>(v, g, ns.x, ns.gain, n, inv, [&](int i, float o) {
        f(i, o);
        if (xn) xn[i] = f2bf(o);
    });
}

/* Exact small-integer to float: q < 2^23. */
__device__ __forceinline__ float u2f(uint32_t q) { return __uint_as_float(0x4B000000u | q) - 8388608.0f; }

/* Σ q_i x_i and Σ x_i over one 16-byte chunk of codes (32 4-bit or 16 8-bit) against
 * the matching bf16 inputs xp (4 or 2 uint4). */
template <int BITS>
__device__ __forceinline__ void qdot_chunk(const uint4 w, const uint16_t *xq, float &qx, float &sx) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    const uint4 *xp = reinterpret_cast<const uint4 *>(xq);
    if (BITS == 4) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint4 xv = xp[j];
            const uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w};
            const uint32_t word = ws[j];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float x0 = bf_lo(xs[k]), x1 = bf_hi(xs[k]);
                qx = fmaf(u2f((word >> (8 * k)) & 15u), x0, qx);
                qx = fmaf(u2f((word >> (8 * k + 4)) & 15u), x1, qx);
                sx += x0 + x1;
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint4 xv = xp[j];
            const uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint32_t word = ws[(8 * j + 2 * k) / 4];
                const int sh = ((2 * k) % 4) * 8;
                const float x0 = bf_lo(xs[k]), x1 = bf_hi(xs[k]);
                qx = fmaf(u2f((word >> sh) & 255u), x0, qx);
                qx = fmaf(u2f((word >> (sh + 8)) & 255u), x1, qx);
                sx += x0 + x1;
            }
        }
    }
}

/* Unpacks the bf16 inputs of one chunk (32 for 4-bit, 16 for 8-bit codes) to fp32; returns their sum. */
template <int BITS>
__device__ __forceinline__ float unpack_x(const uint16_t *xq, float *xf) {
    const uint4 *xp = reinterpret_cast<const uint4 *>(xq);
    float sx = 0.0f;
#pragma unroll
    for (int j = 0; j < (BITS == 4 ? 4 : 2); j++) {
        const uint4 xv = xp[j];
        const uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            xf[8 * j + 2 * k] = bf_lo(xs[k]);
            xf[8 * j + 2 * k + 1] = bf_hi(xs[k]);
            sx += xf[8 * j + 2 * k] + xf[8 * j + 2 * k + 1];
        }
    }
    return sx;
}

/* Σ q_i xf_i over one 16-byte chunk of codes. */
template <int BITS>
__device__ __forceinline__ float qdot_f(const uint4 w, const float *xf) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    float a = 0.0f, b = 0.0f;
    if (BITS == 4) {
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 8; k += 2) {
                a = fmaf(u2f((ws[j] >> (4 * k)) & 15u), xf[8 * j + k], a);
                b = fmaf(u2f((ws[j] >> (4 * k + 4)) & 15u), xf[8 * j + k + 1], b);
            }
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k += 2) {
                a = fmaf(u2f((ws[j] >> (8 * k)) & 255u), xf[4 * j + k], a);
                b = fmaf(u2f((ws[j] >> (8 * k + 8)) & 255u), xf[4 * j + k + 1], b);
            }
    }
    return a + b;
}

/* Streaming 16-byte load of weights (read once: skip L1). */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* The same for weight loads issued before pdl_wait(): without .nc, because ptxas sinks
 * non-coherent loads below griddepcontrol.wait (it keeps coherent ones above it), which
 * would delay them to after the previous kernel's end. */
__device__ __forceinline__ uint4 ld_stream_pre(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* One token of the gated delta rule for a value row whose Dk = 8·LPR state elements are
 * spread over LPR lanes (lane `sub` holds j = 4·sub + 0..3 and 4·LPR + 4·sub + 0..3):
 * S ← a·S; delta = (v − S·k)·β; S ← S + k·delta; returns S·q summed over the row's lanes.
 * k and q are the token's rows in shared memory. Both scan forms (cuda_gdn.cu and
 * cuda_gdn_prefill.cu) use it, so they agree bit for bit. */
template <int LPR>
__device__ __forceinline__ float gdn_token(float (&st)[8], const float *k, const float *q, int sub, float v, float a,
                                           float beta) {
    const float4 k0 = *reinterpret_cast<const float4 *>(k + 4 * sub);
    const float4 k1 = *reinterpret_cast<const float4 *>(k + 4 * LPR + 4 * sub);
    const float4 q0 = *reinterpret_cast<const float4 *>(q + 4 * sub);
    const float4 q1 = *reinterpret_cast<const float4 *>(q + 4 * LPR + 4 * sub);
    const float kv[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
    const float qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    float ma = 0.0f, mb = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        st[e] *= a;
        st[e + 4] *= a;
        ma = fmaf(st[e], kv[e], ma);
        mb = fmaf(st[e + 4], kv[e + 4], mb);
    }
    float mk = ma + mb;
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) mk += __shfl_xor_sync(0xffffffffu, mk, o);
    const float delta = (v - mk) * beta;
    float oa = 0.0f, ob = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        st[e] = fmaf(kv[e], delta, st[e]);
        st[e + 4] = fmaf(kv[e + 4], delta, st[e + 4]);
        oa = fmaf(st[e], qv[e], oa);
        ob = fmaf(st[e + 4], qv[e + 4], ob);
    }
    float o = oa + ob;
#pragma unroll
    for (int off = LPR / 2; off > 0; off >>= 1) o += __shfl_xor_sync(0xffffffffu, o, off);
    return o;
}

#endif
