/* tests/unit/test_device_sampling.c — the device sampler's contract (model/device_sampling.h)
 * through its host reference, dsmp_reference, which the CUDA kernel is held to bit for bit
 * on the GPU (tests/gpu/test_cuda_sample.c). Stratified draws (u = (i + 0.5) / N) make the
 * distribution checks exact rather than statistical: token j is drawn for a run of u of
 * length w_j / M, so over N draws its count is N·w_j / M within 1. Also: the exp2
 * polynomial's accuracy, top_k / top_p / min_p as prefixes of the (p desc, id asc) order,
 * ties by id, NaN / inf rows, the u edges, and sampler_device_row's gate and RNG. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/device_sampling.h"
#include "model/sampler.h"

#define VMAX 600

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static double urand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}

static void *g_scratch;

static int32_t draw(const float *l, int V, struct row_sampling rs, double u) {
    rs.u = u;
    return dsmp_reference(l, V, &rs, g_scratch);
}

/* counts[j] of N stratified draws */
static void histogram(const float *l, int V, struct row_sampling rs, int N, int *counts) {
    memset(counts, 0, (size_t)V * sizeof *counts);
    for (int i = 0; i < N; i++) {
        const int32_t t = draw(l, V, rs, (i + 0.5) / N);
        if (t >= 0 && t < V) counts[t]++;
    }
}

/* weights of the tokens under the contract, from the header's functions */
static void weights(const float *l, int V, float T, float min_p, uint64_t *w) {
    float m = -INFINITY;
    for (int i = 0; i < V; i++)
        if (l[i] > m) m = l[i];
    const float k = dsmp_scale(T);
    for (int i = 0; i < V; i++) {
        const float p = dsmp_prob(l[i], m, k);
        w[i] = dsmp_kept(p, min_p) ? dsmp_weight(p) : 0;
    }
}

/* every count within 1 of N · want[j] / Σ want (want: finalists' weights, 0 elsewhere) */
static int counts_match(const int *counts, const uint64_t *want, int V, int N, const char *what) {
    double tot = 0;
    for (int i = 0; i < V; i++) tot += (double)want[i];
    int bad = 0;
    for (int i = 0; i < V; i++) {
        const double e = N * (double)want[i] / tot;
        if (fabs(counts[i] - e) > 1.0 + 1e-9) {
            if (bad++ < 3) fprintf(stderr, "  %s: token %d drawn %d times, expected %.2f\n", what, i, counts[i], e);
        }
    }
    return bad == 0;
}

/* ids sorted by (w desc, id asc), for the prefixes below (insertion sort: V is small) */
static void rank_order(const uint64_t *w, int V, int *ord) {
    for (int i = 0; i < V; i++) {
        int j = i;
        while (j > 0 && w[ord[j - 1]] < w[i]) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = i;
    }
}

static void test_exp2(void) {
    double worst = 0;
    for (int i = 0; i <= 124000; i++) {
        const float t = -(float)i * 0.001f;
        const double got = dsmp_exp2(t), want = exp2((double)t);
        const double rel = fabs(got / want - 1.0);
        if (rel > worst) worst = rel;
    }
    CHECK(worst < 1e-6, "dsmp_exp2 worst relative error %.3g over [-124, 0]", worst);
    CHECK(dsmp_exp2(0.0f) == 1.0f, "2^0 = %.9g", dsmp_exp2(0.0f));
    CHECK(dsmp_exp2(-125.0f) == 0.0f && dsmp_exp2(-INFINITY) == 0.0f && dsmp_exp2(NAN) == 0.0f, "cut-offs");
    CHECK(dsmp_exp2(-124.9f) > 0.0f && isnormal(dsmp_exp2(-124.9f)), "smallest kept value is normal");
    CHECK(dsmp_prob(3.5f, 3.5f, dsmp_scale(0.3f)) == 1.0f, "the maximum has p = 1");
    CHECK(dsmp_weight(1.0f) == (1ull << DSMP_FIX_BITS) && dsmp_weight(0.5f) == (1ull << (DSMP_FIX_BITS - 1)), "weights");
    CHECK(dsmp_draw(0.9999999999999999, 1000) == 999 && dsmp_draw(0.0, 1000) == 0, "draw edges");
    CHECK(dsmp_mass_target(0.5f, 1001) == 501, "top_p target is a ceiling: %llu",
          (unsigned long long)dsmp_mass_target(0.5f, 1001));
}

static void test_plain_temperature(void) {
    enum { V = 300, N = 20000 };
    float l[V];
    uint64_t w[V];
    int c[V];
    for (int i = 0; i < V; i++) l[i] = (float)(urand() * 8.0 - 4.0);
    const float temps[] = {0.3f, 0.7f, 1.0f, 1.8f};
    for (size_t t = 0; t < sizeof temps / sizeof *temps; t++) {
        struct row_sampling rs = {.temperature = temps[t], .top_p = 1.0f};
        histogram(l, V, rs, N, c);
        weights(l, V, temps[t], 0.0f, w);
        CHECK(counts_match(c, w, V, N, "temperature"), "temperature %.1f: counts follow p", temps[t]);
    }
}

static void test_top_k_top_p_min_p(void) {
    enum { V = 200, N = 20000 };
    float l[V];
    uint64_t w[V], want[V];
    int c[V], ord[V];
    for (int i = 0; i < V; i++) l[i] = (float)(urand() * 6.0 - 3.0);
    weights(l, V, 0.8f, 0.0f, w);
    rank_order(w, V, ord);
    /* top_k: the k best, renormalised */
    const int ks[] = {1, 2, 5, 40, 199, 200, 500};
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        struct row_sampling rs = {.temperature = 0.8f, .top_p = 1.0f, .top_k = ks[i]};
        histogram(l, V, rs, N, c);
        memset(want, 0, sizeof want);
        for (int j = 0; j < ks[i] && j < V; j++) want[ord[j]] = w[ord[j]];
        CHECK(counts_match(c, want, V, N, "top_k"), "top_k %d", ks[i]);
    }
    /* top_p (after top_k): the shortest prefix reaching ceil(top_p · its mass) */
    const float ps[] = {0.05f, 0.3f, 0.9f, 0.999f};
    const int pks[] = {0, 0, 30, 0};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
        struct row_sampling rs = {.temperature = 0.8f, .top_p = ps[i], .top_k = pks[i]};
        histogram(l, V, rs, N, c);
        const int n = pks[i] ? pks[i] : V;
        uint64_t mass = 0, acc = 0;
        for (int j = 0; j < n; j++) mass += w[ord[j]];
        const uint64_t target = (uint64_t)ceil((double)ps[i] * (double)mass);
        memset(want, 0, sizeof want);
        int kept = 0;
        for (int j = 0; j < n && acc < target; j++, kept++) {
            acc += w[ord[j]];
            want[ord[j]] = w[ord[j]];
        }
        CHECK(counts_match(c, want, V, N, "top_p"), "top_p %.3f (top_k %d): %d finalists", ps[i], pks[i], kept);
    }
    /* min_p: tokens under min_p (relative to the best) never drawn */
    struct row_sampling rs = {.temperature = 0.8f, .top_p = 1.0f, .min_p = 0.2f};
    histogram(l, V, rs, N, c);
    weights(l, V, 0.8f, 0.2f, want);
    CHECK(counts_match(c, want, V, N, "min_p"), "min_p 0.2");
    rs.min_p = 1.0f; /* only the best survives */
    histogram(l, V, rs, 64, c);
    CHECK(c[ord[0]] == 64, "min_p 1 keeps the best only (%d of 64)", c[ord[0]]);
}

static void test_ties_and_edges(void) {
    enum { V = 12 };
    float l[V];
    int c[V];
    for (int i = 0; i < V; i++) l[i] = -1.0f;
    l[3] = l[7] = l[9] = 2.0f; /* three equal best */
    struct row_sampling rs = {.temperature = 1.0f, .top_p = 1.0f, .top_k = 2};
    histogram(l, V, rs, 1000, c);
    CHECK(c[3] == 500 && c[7] == 500 && c[9] == 0, "top_k 2 of three ties keeps the two lowest ids (%d %d %d)", c[3], c[7], c[9]);
    rs.top_k = 0;
    rs.top_p = 0.5f; /* mass of one best is 1/3 of the ties' ... the first two ties reach half of all */
    histogram(l, V, rs, 999, c);
    int others = 0;
    for (int i = 0; i < V; i++)
        if (i != 3 && i != 7 && i != 9) others += c[i];
    CHECK(others == 0 && c[9] == 0 && c[3] + c[7] == 999, "top_p 0.5 ties by id (%d %d %d, others %d)", c[3], c[7], c[9], others);
    /* u edges: 0 gives the first finalist in id order, just below 1 the last */
    rs = (struct row_sampling){.temperature = 1.0f, .top_p = 1.0f};
    CHECK(draw(l, V, rs, 0.0) == 0, "u = 0 draws id 0 (got %d)", draw(l, V, rs, 0.0));
    CHECK(draw(l, V, rs, 0.9999999999999999) == V - 1, "u -> 1 draws the last id");
    /* NaN never drawn; an all-NaN row gives 0; +inf gives the first +inf; all -inf the first */
    float n[V];
    for (int i = 0; i < V; i++) n[i] = i % 2 ? NAN : 0.0f;
    histogram(n, V, rs, 600, c);
    int nan_drawn = 0;
    for (int i = 1; i < V; i += 2) nan_drawn += c[i];
    CHECK(nan_drawn == 0 && c[0] == 100, "NaN tokens never drawn (%d), the rest uniform (%d)", nan_drawn, c[0]);
    for (int i = 0; i < V; i++) n[i] = NAN;
    CHECK(draw(n, V, rs, 0.5) == 0, "all-NaN row gives 0");
    for (int i = 0; i < V; i++) n[i] = (float)i;
    n[5] = n[8] = INFINITY;
    CHECK(draw(n, V, rs, 0.9) == 5, "+inf: the first +inf (argmax) wins");
    for (int i = 0; i < V; i++) n[i] = -INFINITY;
    n[0] = NAN;
    CHECK(draw(n, V, rs, 0.9) == 1, "all -inf: the first non-NaN (argmax)");
    /* a temperature so small that 1/T overflows: no p > 0 but the argmax */
    rs.temperature = 1e-45f;
    for (int i = 0; i < V; i++) l[i] = (float)(i % 5);
    CHECK(draw(l, V, rs, 0.7) == 4, "T -> 0 gives the argmax (got %d)", draw(l, V, rs, 0.7));
    /* a tiny temperature: only the best (ids 4 and 9 tie), evenly */
    rs.temperature = 1e-3f;
    histogram(l, V, rs, 100, c);
    CHECK(c[4] == 50 && c[9] == 50, "T = 0.001: the two best ids only, evenly (%d, %d)", c[4], c[9]);
}

static void test_large_row(void) {
    /* the real vocabulary's width, flat-ish logits: sums over 2^18 weights stay exact */
    enum { V = 248320 };
    float *l = malloc((size_t)V * sizeof *l);
    for (int i = 0; i < V; i++) l[i] = (float)(urand() * 3.0);
    l[12345] = 9.0f;
    struct row_sampling rs = {.temperature = 1.0f, .top_p = 1.0f};
    int hits = 0, in_range = 1;
    for (int i = 0; i < 200; i++) {
        const int32_t t = draw(l, V, rs, urand());
        hits += t == 12345;
        in_range &= t >= 0 && t < V;
    }
    /* p(12345) = e^9 / (e^9 + Σ e^l) ≈ 8103 / (8103 + 248320 · (e^3 - 1) / 3) ≈ 0.0051 */
    CHECK(in_range && hits < 10, "large row: ids in range, the peak drawn %d of 200", hits);
    rs.top_k = 1000;
    rs.top_p = 0.5f;
    int peak = 0;
    for (int i = 0; i < 200; i++) peak += draw(l, V, rs, (i + 0.5) / 200) == 12345;
    /* the 999 next best have l ≈ 3 (p ≈ e^-6 of the peak's): the peak is ~29 % of the top
     * 1000's mass, so half the mass is the peak and ~300 of them, the peak ~58 % of it */
    CHECK(peak >= 105 && peak <= 125, "large row, top_k 1000 + top_p 0.5: the peak's share (%d of 200)", peak);
    free(l);
}

static void test_sampler_gate(void) {
    char err[256];
    struct sampler_params p = sampler_params_default();
    sampler *s = NULL;
    struct row_sampling rs;
    CHECK(sampler_new(&s, 100, &p, err, sizeof err) == 0 && !sampler_device_row(s, &rs), "greedy is not device-sampled");
    sampler_free(s);
    p.temperature = 0.7f;
    p.top_p = 0.9f;
    p.top_k = 20;
    p.min_p = 0.05f;
    p.seed = 42;
    p.has_seed = true;
    sampler *a = NULL, *b = NULL;
    CHECK(sampler_new(&a, 100, &p, err, sizeof err) == 0 && sampler_new(&b, 100, &p, err, sizeof err) == 0, "%s", err);
    bool same = true, ok = true;
    for (int i = 0; i < 50; i++) {
        struct row_sampling ra, rb;
        ok &= sampler_device_row(a, &ra) && sampler_device_row(b, &rb);
        same &= ra.u == rb.u && ra.u >= 0.0 && ra.u < 1.0;
        ok &= ra.temperature == 0.7f && ra.top_p == 0.9f && ra.top_k == 20 && ra.min_p == 0.05f;
    }
    CHECK(ok && same, "a seeded sampler gives the device the same draws, and its parameters");
    sampler_free(a);
    sampler_free(b);
    struct sampler_params off[5];
    for (int i = 0; i < 5; i++) off[i] = p;
    off[0].top_k = 1;
    off[1].logprobs = true;
    off[2].presence_penalty = 0.5f;
    off[3].n_logit_bias = 1;
    off[3].logit_bias[0] = (struct logit_bias){7, 2.0f};
    off[4].repetition_penalty = 1.1f;
    for (int i = 0; i < 5; i++) {
        CHECK(sampler_new(&s, 100, &off[i], err, sizeof err) == 0, "%s", err);
        CHECK(!sampler_device_row(s, &rs), "case %d stays on the host sampler", i);
        sampler_free(s);
    }
}

int main(void) {
    g_scratch = malloc(dsmp_reference_scratch(248320));
    test_exp2();
    test_plain_temperature();
    test_top_k_top_p_min_p();
    test_ties_and_edges();
    test_large_row();
    test_sampler_gate();
    free(g_scratch);
    return check_summary();
}
