/* tests/gpu/bench_stream.c — DRAM read rate of each way of loading weights, on 1..all SMs
 * (cuda_stream_bench.cu): the per-SM rate is what bounds the decode kernels' one-shot
 * loads of 5-15 MB spread over the GPU.
 *
 *   bench_stream [--mb 1024]
 */
#include "gpu_common.h"

int cuda_stream_bench(int method, size_t bytes, int blocks, int threads, int reps, double *gbps, char *err, size_t errlen);

int main(int argc, char **argv) {
    size_t mb = 1024;
    for (int i = 1; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--mb")) mb = (size_t)atol(argv[i + 1]);
    const char *names[4] = {"ld8 (tcv fragments)", "ld16 coalesced", "cp.async 16 B ring", "cp.async.bulk ring"};
    const int n_sm = cuda_sm_count();
    const int counts[5] = {1, 8, 33, 66, n_sm};
    char err[256];
    printf("| method | threads | blocks | GB/s | GB/s per block |\n|---|---:|---:|---:|---:|\n");
    for (int m = 0; m < 4; m++)
        for (int th = 256; th <= 512; th += 256)
            for (int k = 0; k < 5; k++) {
                const int blocks = counts[k];
                size_t bytes = mb << 20;
                bytes -= bytes % ((size_t)blocks * 65536);
                if (blocks < 8) bytes /= 16;
                bytes -= bytes % ((size_t)blocks * 65536);
                double g = 0;
                if (cuda_stream_bench(m, bytes, blocks, th, 5, &g, err, sizeof err)) {
                    printf("| %s | %d | %d | error: %s | |\n", names[m], th, blocks, err);
                    continue;
                }
                printf("| %s | %d | %d | %.0f | %.1f |\n", names[m], th, blocks, g, g / blocks);
            }
    return 0;
}
