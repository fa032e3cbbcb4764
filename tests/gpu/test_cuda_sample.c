/* tests/gpu/test_cuda_sample.c — the device sampler (src/cuda/cuda_sample.cu) against its
 * host reference (model/device_sampling.c, whose semantics tests/unit/test_device_sampling.c
 * checks), bit for bit: the same token for every row, on fresh random rows each run —
 * realistic logits (normal, a few planted peaks), rows of many ties (logits on a 1/4 grid,
 * so top_k and top_p thresholds split ties and take the tie-cut pass), NaN / ±inf rows,
 * the real vocabulary's width and small ones, greedy rows beside sampled ones (their
 * argmax must stay), every parameter mix — through the top_k fast path and the radix
 * passes (both must be taken). Then through the CUDA backend on the tiny
 * checkpoint: sessions fed alike, one asking for its logits row and one for a sampled
 * token, the token must be the reference's draw on that row (fwd_batch.out_sampling's
 * plumbing, several rows, rows past LOGIT_ROWS). Needs an NVIDIA GPU; ends with
 * "N passed, N failed". ORCHID_GPU_TINY: the tiny checkpoint (as test_cuda_ops). */

#include "check.h"
#include "gpu_common.h"
#include "model/device_sampling.h"
#include "model/sampler.h"

static char errbuf[512];
static struct cuda_ctx ctx;

enum row_kind { ROW_NORMAL, ROW_TIES, ROW_PEAKS, ROW_SPECIAL };

static void make_row(float *l, int V, enum row_kind kind, int r) {
    for (int i = 0; i < V; i++) l[i] = rng_normal() * (1.0f + (float)(r % 4));
    if (kind == ROW_TIES)
        for (int i = 0; i < V; i++) l[i] = roundf(l[i] * 4.0f) / 4.0f;
    if (kind == ROW_PEAKS)
        for (int k = 0; k < 5; k++) l[rng_u64() % (uint64_t)V] = 12.0f + (float)k;
    if (kind == ROW_SPECIAL) {
        switch (r % 5) {
        case 0: for (int k = 0; k < V / 7; k++) l[rng_u64() % (uint64_t)V] = NAN; break;
        case 1: l[rng_u64() % (uint64_t)V] = INFINITY; break;
        case 2: for (int i = 0; i < V; i++) l[i] = NAN; break;
        case 3: for (int i = 0; i < V; i++) l[i] = -INFINITY; break;
        default: for (int i = 0; i < V; i++) l[i] = 1.0f; /* all tied */
        }
    }
}

static struct row_sampling rand_params(int r) {
    static const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.5f, 2.5f};
    static const float tops[] = {1.0f, 1.0f, 0.95f, 0.8f, 0.3f, 0.02f};
    static const int ks[] = {0, 0, 1, 5, 20, 64, 1000, 50000};
    static const float minps[] = {0.0f, 0.0f, 0.0f, 0.05f, 0.5f};
    struct row_sampling rs;
    rs.temperature = temps[rng_u64() % 6];
    if (r == 0) rs.temperature = 0.0f; /* a greedy row in every launch */
    rs.top_p = tops[rng_u64() % 6];
    rs.top_k = ks[rng_u64() % 8];
    rs.min_p = minps[rng_u64() % 5];
    rs.u = (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0);
    if (r == 1) rs.u = 0.0;
    if (r == 2) rs.u = 0.9999999999999999;
    return rs;
}

/* One launch of n rows of width V against the reference. */
static void test_rows(int n, int V, enum row_kind kind, const char *what) {
    float *l = malloc((size_t)n * V * 4);
    struct row_sampling *rs = malloc((size_t)n * sizeof *rs);
    int32_t *amax = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    void *scratch = malloc(dsmp_reference_scratch(V));
    for (int r = 0; r < n; r++) {
        make_row(l + (size_t)r * V, V, kind, r);
        rs[r] = rand_params(r);
        const int32_t a = sampler_argmax(l + (size_t)r * V, V); /* the device argmax's rule: NaN never wins */
        amax[r] = a < 0 ? 0 : a;
    }
    float *dl;
    int32_t *di, *ds;
    struct row_sampling *drs;
    if (cuda_malloc((void **)&dl, (size_t)n * V * 4, "logits", errbuf, sizeof errbuf) ||
        cuda_malloc((void **)&di, (size_t)n * 4, "ids", errbuf, sizeof errbuf) ||
        cuda_malloc((void **)&ds, (size_t)n * 128 * 2 * 4, "scratch", errbuf, sizeof errbuf) ||
        cuda_malloc((void **)&drs, (size_t)n * sizeof *drs, "rows", errbuf, sizeof errbuf) ||
        cuda_h2d(dl, l, (size_t)n * V * 4, errbuf, sizeof errbuf) ||
        cuda_h2d(drs, rs, (size_t)n * sizeof *rs, errbuf, sizeof errbuf) ||
        cuda_argmax(&ctx, dl, n, V, di, ds) || cuda_sample(&ctx, dl, n, V, drs, di) || cuda_sync(errbuf, sizeof errbuf) ||
        cuda_d2h(got, di, (size_t)n * 4, errbuf, sizeof errbuf)) {
        CHECK(0, "%s: %s", what, errbuf);
    } else {
        int bad = 0, sampled = 0, moved = 0;
        for (int r = 0; r < n; r++) {
            const int32_t want = rs[r].temperature > 0.0f ? dsmp_reference(l + (size_t)r * V, V, &rs[r], scratch) : amax[r];
            sampled += rs[r].temperature > 0.0f;
            moved += want != amax[r];
            if (got[r] != want && bad++ < 4)
                fprintf(stderr, "  %s row %d (T %g top_p %g top_k %d min_p %g u %.17g): device %d, reference %d\n", what, r,
                        rs[r].temperature, rs[r].top_p, rs[r].top_k, rs[r].min_p, rs[r].u, got[r], want);
        }
        CHECK(bad == 0, "%s: %d rows of %d (%d sampled, %d not the argmax): %d differ from the reference", what, n, V,
              sampled, moved, bad);
    }
    cuda_free(dl); cuda_free(di); cuda_free(ds); cuda_free(drs);
    free(l); free(rs); free(amax); free(got); free(scratch);
}

/* Through the backend: for each of n sequences two sessions fed the same prompt; one asks
 * for its last row's logits, the other for a sampled token (one forward each, all the
 * sequences' rows together). The token must be the reference's draw on those logits
 * (a sequence's rows are the same bits alone and batched within one forward shape). */
static void test_backend(const char *where, int n) {
    char err[512];
    struct tmodel m;
    if (tmodel_open(&m, where, err, sizeof err)) { CHECK(0, "%s: %s", where, err); return; }
    struct backend *gpu = NULL;
    if (cuda_backend_create(&gpu, &m.cfg, &m.w, err, sizeof err)) { CHECK(0, "%s: %s", where, err); tmodel_close(&m); return; }
    CHECK(gpu->device_sampling == 1, "the CUDA backend reports its device sampler");
    const int V = m.cfg.vocab, P = 5;
    struct backend_session **sa = calloc((size_t)n, sizeof *sa), **sb = calloc((size_t)n, sizeof *sb);
    int32_t *tok = malloc((size_t)n * P * 4), *pos = malloc((size_t)n * P * 4), *seq = malloc((size_t)n * P * 4);
    int32_t *rows = malloc((size_t)n * 4), *ids = malloc((size_t)n * 4);
    float *lg = malloc((size_t)n * V * 4);
    float **dst = malloc((size_t)n * sizeof *dst), **none = calloc((size_t)n, sizeof *none);
    struct row_sampling *rs = malloc((size_t)n * sizeof *rs);
    void *scratch = malloc(dsmp_reference_scratch(V));
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = gpu->session_create(gpu, 64, &sa[i], err, sizeof err) || gpu->session_create(gpu, 64, &sb[i], err, sizeof err);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < P; k++) {
            tok[i * P + k] = (int32_t)((i * 7919u + k * 104729u + 17u) % (unsigned)V);
            pos[i * P + k] = k;
            seq[i * P + k] = i;
        }
        rows[i] = i * P + P - 1;
        dst[i] = lg + (size_t)i * V;
        rs[i] = rand_params(i + 3);
        if (rs[i].temperature <= 0.0f) rs[i].temperature = 0.9f;
        if (i % 3 == 0) rs[i].top_k = 0, rs[i].top_p = 1.0f, rs[i].min_p = 0.0f; /* plain temperature */
    }
    struct fwd_batch a = {.n_tokens = n * P, .tokens = tok, .pos = pos, .seq = seq, .sessions = sa, .n_seqs = n,
                          .n_out = n, .out_rows = rows, .out_logits = dst};
    struct fwd_batch b = a;
    b.sessions = sb;
    b.out_logits = none;
    b.out_argmax = ids;
    b.out_sampling = rs;
    if (!rc) rc = gpu->forward(gpu, &a, err, sizeof err);
    if (!rc) rc = gpu->forward(gpu, &b, err, sizeof err);
    CHECK(rc == 0, "%s: %s", where, err);
    int bad = 0, moved = 0;
    for (int i = 0; i < n && !rc; i++) {
        const int32_t want = dsmp_reference(lg + (size_t)i * V, V, &rs[i], scratch);
        moved += want != argmax_row(lg + (size_t)i * V, V);
        bad += ids[i] != want;
    }
    printf("  %s: %d sequences, sampled rows in a forward: %d differ from the reference on their logits (%d not the "
           "argmax)\n", where, n, bad, moved);
    CHECK(!rc && bad == 0, "%s: %d of %d device-sampled tokens differ from the reference", where, bad, n);
    for (int i = 0; i < n; i++) {
        if (sa[i]) gpu->session_destroy(gpu, sa[i]);
        if (sb[i]) gpu->session_destroy(gpu, sb[i]);
    }
    free(sa); free(sb); free(tok); free(pos); free(seq); free(rows); free(ids); free(lg); free(dst); free(none); free(rs);
    free(scratch);
    gpu->destroy(gpu);
    tmodel_close(&m);
}

int main(void) {
    if (gpu_test_start(&ctx, errbuf, sizeof errbuf)) {
        CHECK(0, "no CUDA device");
        return check_summary();
    }
    printf("device sampler vs reference:\n");
    const int widths[] = {248320, 33333, 1000, 64, 31};
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
        const int V = widths[w], n = V > 100000 ? 24 : 64;
        char what[96];
        snprintf(what, sizeof what, "normal V=%d", V);
        test_rows(n, V, ROW_NORMAL, what);
        snprintf(what, sizeof what, "ties V=%d", V);
        test_rows(n, V, ROW_TIES, what);
        snprintf(what, sizeof what, "peaks V=%d", V);
        test_rows(n, V, ROW_PEAKS, what);
        snprintf(what, sizeof what, "special V=%d", V);
        test_rows(10, V, ROW_SPECIAL, what);
    }
    for (int rep = 0; rep < 4; rep++) test_rows(64, 248320, rep & 1 ? ROW_TIES : ROW_NORMAL, "more V=248320");
    /* the fast paths (top_k, top_p alone) drew rows, and handed rows with too many
     * candidates (all-tied, many-tie rows) to the radix passes; then those passes for every row */
    unsigned long long fast = 0, fallbacks = 0;
    CHECK(cuda_sample_fast_counts(&fast, &fallbacks) == 0, "sample: fast-path counters unreadable");
    CHECK(fast > 0, "sample: the fast paths drew no row");
    CHECK(fallbacks > 0, "sample: no row fell back from the fast paths");
    printf("  fast paths: %llu rows drawn, %llu handed to the radix passes\n", fast, fallbacks);
    cuda_sample_force_slow(1);
    test_rows(64, 248320, ROW_NORMAL, "radix passes: normal V=248320");
    test_rows(64, 248320, ROW_TIES, "radix passes: ties V=248320");
    test_rows(64, 1000, ROW_PEAKS, "radix passes: peaks V=1000");
    test_rows(10, 33333, ROW_SPECIAL, "radix passes: special V=33333");
    cuda_sample_force_slow(0);
    /* every cluster size (blocks a row) must draw the same tokens: a row alone and in a batch */
    const int clusters[] = {1, 2, 4, 8};
    for (size_t i = 0; i < sizeof clusters / sizeof *clusters; i++) {
        char what[96];
        cuda_sample_force_cluster(clusters[i]);
        snprintf(what, sizeof what, "cluster %d: normal V=248320", clusters[i]);
        test_rows(16, 248320, ROW_NORMAL, what);
        snprintf(what, sizeof what, "cluster %d: ties V=248320", clusters[i]);
        test_rows(16, 248320, ROW_TIES, what);
        snprintf(what, sizeof what, "cluster %d: ties V=33333", clusters[i]);
        test_rows(16, 33333, ROW_TIES, what);
        snprintf(what, sizeof what, "cluster %d: special V=1000", clusters[i]);
        test_rows(10, 1000, ROW_SPECIAL, what);
    }
    cuda_sample_force_cluster(0);
    printf("through the backend:\n");
    const char *tiny = getenv("ORCHID_GPU_TINY");
    test_backend(tiny && *tiny ? tiny : ".cache/gpu_models/tiny", 3);
    test_backend("synth:mini", 70); /* past LOGIT_ROWS (64): two lm_head passes */
    return check_summary();
}
