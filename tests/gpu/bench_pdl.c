/* tests/gpu/bench_pdl.c — what a kernel boundary costs in a CUDA graph, by each way a
 * dependent kernel can wait for its predecessor (cuda_pdl_bench.cu): plain stream order,
 * PDL (griddepcontrol.wait, orchid's way), and a release/acquire counter in global memory
 * polled by each block (with and without a nanosleep between polls). Prints µs a kernel
 * for chains of small kernels of 33..392 blocks, and whether every element came out right.
 *
 *   bench_pdl [--kernels 300] [--reps 20]
 */
#include "gpu_common.h"

int cuda_pdl_bench(int mode, int kernels, int blocks, int reps, double *us, int *bad, int *hung, char *err, size_t errlen);

int main(int argc, char **argv) {
    int kernels = 300, reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--kernels")) kernels = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_pdl: unknown option %s (--kernels N, --reps N)\n", argv[i]);
            return 2;
        }
    }
    const char *names[4] = {"stream order", "PDL wait", "flag poll", "flag poll + nanosleep 64"};
    const int grids[5] = {33, 64, 132, 264, 392};
    char err[256];
    int failed = 0;
    printf("| wait | blocks | µs a kernel | wrong elements | hang guard |\n|---|---:|---:|---:|---:|\n");
    for (int g = 0; g < 5; g++)
        for (int m = 0; m < 4; m++) {
            double us = 0;
            int bad = 0, hung = 0;
            if (cuda_pdl_bench(m, kernels, grids[g], reps, &us, &bad, &hung, err, sizeof err)) {
                printf("| %s | %d | error: %s | | |\n", names[m], grids[g], err);
                failed = 1;
                continue;
            }
            printf("| %s | %d | %.3f | %d | %d |\n", names[m], grids[g], us, bad, hung);
            failed |= bad != 0 || hung != 0;
        }
    return failed;
}
