/* tests/unit/test_quant_mlx.c — orchid's affine dequantizer and quantized matmul
 * against MLX itself: the fixture (.cache/quant_fixture.json, written by
 * tools/quant_fixture.py with mx.quantize / mx.dequantize / mx.quantized_matmul;
 * scripts/run_tests.sh makes it before the unit tests) holds 4- and 8-bit cases with
 * negative scales, tiny and huge magnitudes, constant rows and ramps. The test fails,
 * not skips, when the fixture is missing. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/cpu_ops.h"

static double num(const cJSON *a, int i) { return cJSON_GetArrayItem(a, i)->valuedouble; }

static void run_case(const cJSON *c) {
    const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
    const int bits = cJSON_GetObjectItem(c, "bits")->valueint, group = cJSON_GetObjectItem(c, "group_size")->valueint;
    const int rows = cJSON_GetObjectItem(c, "rows")->valueint, cols = cJSON_GetObjectItem(c, "cols")->valueint;
    const cJSON *wq = cJSON_GetObjectItem(c, "wq"), *sc = cJSON_GetObjectItem(c, "scales"), *bi = cJSON_GetObjectItem(c, "biases");
    const cJSON *deq = cJSON_GetObjectItem(c, "dequant"), *x = cJSON_GetObjectItem(c, "x"), *y = cJSON_GetObjectItem(c, "y");
    const int words = cols * bits / 32, ng = cols / group;
    CHECK(cJSON_GetArraySize(wq) == rows * words && cJSON_GetArraySize(deq) == rows * cols, "%s: fixture sizes", name);
    uint32_t *codes = malloc(sizeof(uint32_t) * rows * words);
    uint16_t *s = malloc(2 * rows * ng), *b = malloc(2 * rows * ng);
    float *xv = malloc(sizeof(float) * cols), *yv = malloc(sizeof(float) * rows), *row = malloc(sizeof(float) * cols);
    for (int i = 0; i < rows * words; i++) codes[i] = (uint32_t)num(wq, i);
    for (int i = 0; i < rows * ng; i++) { s[i] = (uint16_t)num(sc, i); b[i] = (uint16_t)num(bi, i); }
    for (int i = 0; i < cols; i++) xv[i] = (float)num(x, i);
    struct qmat m = {.codes = codes, .scales = s, .biases = b, .rows = rows, .cols = cols, .n_mats = 1, .bits = bits, .group = group};
    int bad = 0;
    for (int r = 0; r < rows; r++) {
        qmat_dequant_row(&m, 0, r, row);
        for (int i = 0; i < cols; i++) {
            const double want = num(deq, r * cols + i);
            /* MLX may or may not fuse s*q + b: allow a couple of ulps of the larger term */
            if (fabs(row[i] - want) > 4e-7 * (fabs(want) + fabs(row[i] - want) + 1e-30) + 1e-37 && bad++ < 3)
                CHECK(0, "%s: dequant[%d][%d] = %.9g, mlx %.9g", name, r, i, row[i], want);
        }
    }
    CHECK(bad == 0, "%s: %d dequantized values differ from mx.dequantize", name, bad);
    cpu_qmatmul(NULL, &m, 0, xv, 1, cols, yv, rows);
    for (int r = 0; r < rows; r++) {
        qmat_dequant_row(&m, 0, r, row);
        double mag = 0;
        for (int i = 0; i < cols; i++) mag += fabs((double)row[i] * xv[i]);
        CHECK(fabs(yv[r] - num(y, r)) <= 2e-6 * mag + 1e-30, "%s: y[%d] = %.9g, mx.quantized_matmul %.9g", name, r, yv[r], num(y, r));
    }
    free(codes); free(s); free(b); free(xv); free(yv); free(row);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : getenv("ORCHID_QUANT_FIXTURE");
    if (!path) path = ".cache/quant_fixture.json";
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "fixture %s missing: run .venv/bin/python tools/quant_fixture.py %s", path, path);
    if (!f) return check_summary();
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *text = malloc((size_t)n + 1);
    text[fread(text, 1, (size_t)n, f)] = 0;
    fclose(f);
    cJSON *root = cJSON_Parse(text);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases");
    CHECK(cJSON_GetArraySize(cases) >= 10, "fixture has %d cases", cJSON_GetArraySize(cases));
    int n4 = 0, n8 = 0;
    for (const cJSON *c = cases ? cases->child : NULL; c; c = c->next) {
        run_case(c);
        n4 += cJSON_GetObjectItem(c, "bits")->valueint == 4;
        n8 += cJSON_GetObjectItem(c, "bits")->valueint == 8;
    }
    CHECK(n4 > 0 && n8 > 0, "fixture must hold 4-bit (%d) and 8-bit (%d) cases", n4, n8);
    cJSON_Delete(root);
    free(text);
    return check_summary();
}
