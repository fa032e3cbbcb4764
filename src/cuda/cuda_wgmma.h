// cuda/cuda_wgmma.h — wgmma.mma_async m64nNk16 (sm_90a), bf16 × bf16 → fp32, A from registers
// and B through a shared-memory descriptor, for the prefill GEMM (cuda_gemm_wg.cu): N = 128
// (a full token tile) and N = 64 (a route tile of at most 64 slots, half the tensor work);
// and for the 9..64-token decode products (cuda_skinny_wide.cu): N = 64 and 32; and the prefill
// attention's two products (cuda_flash_wg.cu): A through a descriptor too, and B MN-major.
// The accumulator is a 64-float array (N/2 of it used: d[4j + e] is row g + 8(e >> 1),
// column 8j + 2t + (e & 1) of the warp's 16 rows); scale-d is the immediate 1 (accumulate),
// A and B unscaled, B K-major (not transposed).
#ifndef ORCHID_CUDA_WGMMA_H
#define ORCHID_CUDA_WGMMA_H

#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])

/* TB 1: B MN-major (imm-trans-b: B's N index contiguous in shared memory) — the flash
 * kernel's O += P·V, V read as loaded, [key][d] (cuda_flash_wg.cu) */
template <int TB = 0>
__device__ __forceinline__ void wgmma_n128(float (&d)[64], const uint32_t *a, uint64_t desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
        "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1, %69;\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(TB));
}
/* N = 256: the wide dense form of the prefill GEMM (256 token rows a block) */
__device__ __forceinline__ void wgmma_n256(float (&d)[128], const uint32_t *a, uint64_t desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
        "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, "
        "%85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, "
        "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "
        "%123, %124, %125, %126, %127}, "
        "{%128, %129, %130, %131}, %132, 1, 1, 1, 0;\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56), WG_D8(64), WG_D8(72),
          WG_D8(80), WG_D8(88), WG_D8(96), WG_D8(104), WG_D8(112), WG_D8(120)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
template <int S, int ACC = 1> /* S: the accumulator's size, 64 (the prefill's) or 32; ACC 0: d = a·b */
__device__ __forceinline__ void wgmma_n64(float (&d)[S], const uint32_t *a, uint64_t desc) {
    static_assert(S >= 32, "wgmma_n64: 32 accumulator floats");
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, %37, 1, 1, 0;\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ACC));
}
template <int ACC = 1>
__device__ __forceinline__ void wgmma_n32(float (&d)[16], const uint32_t *a, uint64_t desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, %21, 1, 1, 0;\n"
        : WG_D8(0), WG_D8(8)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ACC));
}
/* Both operands through descriptors (A K-major too), N = 64, 32 accumulator floats: the flash
 * kernel's S = Q·Kᵀ (cuda_flash_wg.cu), ACC 0 for a tile's first k16 step. */
template <int ACC>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, %34, 1, 1, 0, 0;\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
        : "l"(desc_a), "l"(desc_b), "n"(ACC));
}
#undef WG_D8

/* One k16 step of N = 32 or 64 columns into an accumulator of exactly N/2 floats (the
 * decode products of cuda_skinny_wide.cu; same layout as above); ACC 0: d = a·b, the form
 * ptxas makes of zeroed registers plus a·b (the same sums: the GPU tests compare them with
 * mma.sync's bitwise), with no instruction writing d while other wgmma are in flight. */
template <int N, int ACC = 1>
__device__ __forceinline__ void wgmma_k16(float (&d)[N / 2], const uint32_t *a, uint64_t desc) {
    static_assert(N == 32 || N == 64, "wgmma_k16: N = 32 or 64");
    if constexpr (N == 64) wgmma_n64<N / 2, ACC>(d, a, desc);
    else wgmma_n32<ACC>(d, a, desc);
}

/* Shared-memory matrix descriptor of a tile with 128-byte swizzle, 8-row groups of 128-byte
 * rows 1,024 apart (SBO), leading byte offset lbo. An MN-major tile (rows of 64 N-contiguous
 * bf16 along K): lbo = the distance between 64-column N blocks (the canonical MN-major SW128
 * layout ((64, n), (8, k)) : ((1, LBO), (64, SBO)) in elements). */
__device__ __forceinline__ uint64_t wg_desc_lbo(uint32_t saddr, uint32_t lbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}
/* A K-major tile: the leading offset unused (16 bytes, the encoding 1). */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) { return wg_desc_lbo(saddr, 16); }

/* Operand fences: a volatile empty asm that "writes" each register, so the compiler neither
 * moves their definitions below a wgmma.fence nor reads an accumulator before the
 * wgmma.wait_group that completes it (the wgmma asm statements' outputs look ready at once). */
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}

/* The four k16 steps of one quantization group: N = 128, or N = 64 when the tile has at
 * most 64 rows and may be partial (a grouped product's route tiles). The branch sits
 * outside the issue sequence, so no other instruction comes between a group's wgmma (ptxas
 * would serialise them); ptxas adds a warpgroup.arrive where the two paths join (its C7519
 * notes in the build log; two copies of the whole loop instead, one a N, made it serialise
 * the wgmma for want of registers).
 * Measured on the H200 (8 × 512-token pack): N by the tile's rows rounded to 8 (a 16-way
 * switch) was 1 % slower than this; the dense products, always N = 128, lost 5-15 % when
 * they took the branch. */
template <bool PARTIAL>
__device__ __forceinline__ void wgmma_group(int rows, float (&d)[64], const uint32_t *af, const uint64_t *desc) {
    if (PARTIAL && rows <= 64) {
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_n64(d, af + 4 * kk, desc[kk]);
    } else {
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_n128(d, af + 4 * kk, desc[kk]);
    }
}
/* The same group (four k16 steps) for the wide dense form: 256 token columns. */
__device__ __forceinline__ void wgmma_group_wide(float (&d)[128], const uint32_t *af, const uint64_t *desc) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_n256(d, af + 4 * kk, desc[kk]);
}
#endif

#endif
