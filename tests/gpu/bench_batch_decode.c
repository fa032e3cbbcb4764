/* tests/gpu/bench_batch_decode.c — where the time of one batched decode step goes on
 * the CUDA backend (issue 6: the server's continuous batching runs one forward over all
 * running sequences per step). Full-shape synthetic checkpoint in memory; B sessions,
 * each prefilled with --ctx tokens; then for each batch size T in --batches: T
 * sequences x one token, timed over --steps forwards (a) with every row's logits
 * downloaded into the backend's host buffers (pinned, as the server's) for a host sampler,
 * (b) with no outputs (n_out = 0), (c) with each row's argmax (greedy requests), (d) with
 * each row's token drawn by the device sampler at temperature 1, (e) at Qwen's
 * recommended 0.7 / top_p 0.8 / top_k 20 (sampled requests, cuda_sample.cu) and (f) at 0.7 /
 * top_p 0.8 without top_k (as OpenAI clients send it); then
 * five profiled forwards (per-op GPU times, events between ops, the host queued ahead
 * behind a 30 ms GPU spin so the deltas are GPU time). Prints a table and the profiles.
 *
 *   bench_batch_decode [--shape 35b-a3b] [--ctx 512] [--batches 1,8,16,17,32,64] [--steps 8]
 *                      [--trace DIR]
 *
 * --trace DIR: one more forward at T = 1 and at the largest T with the in-kernel timeline
 * on (cuda_backend_trace_next), written to DIR/trace_T<T>.csv (tools/trace_report.py); with
 * --pack K also one pack's, DIR/trace_packK.csv.
 * --pack K: the sessions are prefilled K at a time, one forward of K × ctx tokens each (the
 * server's packed prompt chunks, sched_plan_invariant; K · ctx ≤ the backend's
 * max_batch_tokens), each pack timed and the last one profiled per op.
 */
#include <stdint.h>

#include "gpu_common.h"

void cuda_backend_profile_dump(struct backend *b, FILE *f);
int cuda_backend_set_profile(struct backend *b, int on, char *err, size_t errlen);
int cuda_backend_trace_next(struct backend *b, const char *path);

enum out_mode { OUT_LOGITS, OUT_NONE, OUT_ARGMAX, OUT_SAMPLE_T1, OUT_SAMPLE_QWEN, OUT_SAMPLE_TOPP };

static int step(struct backend *be, struct backend_session **ss, int T, int pos, int32_t *tok, int32_t *posv, int32_t *seq,
                int32_t *rows, float **dst, enum out_mode mode, char *err, size_t errlen) {
    static float *none[4096];
    static int32_t ids[4096];
    static struct row_sampling rs[4096];
    for (int i = 0; i < T; i++) {
        posv[i] = pos;
        seq[i] = i;
        rows[i] = i;
        rs[i] = mode == OUT_SAMPLE_QWEN   ? (struct row_sampling){.temperature = 0.7f, .top_p = 0.8f, .top_k = 20}
                : mode == OUT_SAMPLE_TOPP ? (struct row_sampling){.temperature = 0.7f, .top_p = 0.8f}
                                          : (struct row_sampling){.temperature = 1.0f, .top_p = 1.0f};
        rs[i].u = (double)((i * 2654435761u + (unsigned)pos * 40503u) & 0xffffffu) / 16777216.0;
    }
    const bool sampled = mode == OUT_SAMPLE_T1 || mode == OUT_SAMPLE_QWEN || mode == OUT_SAMPLE_TOPP;
    const bool ids_only = mode == OUT_ARGMAX || sampled;
    struct fwd_batch b = {.n_tokens = T, .tokens = tok, .pos = posv, .seq = seq, .sessions = ss, .n_seqs = T,
                          .n_out = mode == OUT_NONE ? 0 : T, .out_rows = rows, .out_logits = ids_only ? none : dst,
                          .out_argmax = ids_only ? ids : NULL,
                          .out_sampling = sampled ? rs : NULL};
    return be->forward(be, &b, err, errlen);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *shape = "35b-a3b", *batches = "1,8,16,17,32,64", *trace_dir = NULL;
    int ctx = 512, steps = 8, pack = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shape")) shape = argv[i + 1];
        else if (!strcmp(argv[i], "--ctx")) ctx = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batches")) batches = argv[i + 1];
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--trace")) trace_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--pack")) pack = atoi(argv[i + 1]);
    }
    int Ts[32], nT = 0, maxT = 1;
    for (const char *p = batches; *p && nT < 32;) {
        Ts[nT] = atoi(p);
        if (Ts[nT] > maxT) maxT = Ts[nT];
        nT++;
        while (*p && *p != ',') p++;
        if (*p) p++;
    }
    char err[512], where[64];
    snprintf(where, sizeof where, "synth:%s", shape);
    struct tmodel m;
    double t0 = now_seconds();
    if (tmodel_open(&m, where, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    printf("%s built in %.1f s\n", where, now_seconds() - t0);
    struct backend *be;
    if (cuda_backend_create(&be, &m.cfg, &m.w, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    /* positions a session takes: the prompt, every (T, output mode) pair's warm-up step and
     * timed steps, the two traced steps, the five profiled ones a T (a step past the cap is
     * refused: an error, reported below, not a fast step) */
    const int V = m.cfg.vocab, cap = ctx + (steps + 1) * nT * (OUT_SAMPLE_TOPP + 1) + 2 + 5 * nT + 16;
    struct backend_session **ss = calloc((size_t)maxT, sizeof *ss);
    for (int i = 0; i < maxT; i++)
        if (be->session_create(be, cap, &ss[i], err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    /* prefill every session with its own ctx-token prompt, several sequences per call */
    int32_t *tok = malloc(sizeof(int32_t) * 4096), *posv = malloc(sizeof(int32_t) * 4096), *seq = malloc(sizeof(int32_t) * 4096);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)maxT);
    float **dst = malloc(sizeof(float *) * (size_t)maxT);
    const size_t lbytes = (size_t)maxT * V * sizeof(float);
    float *logits = be->host_alloc ? be->host_alloc(be, lbytes) : malloc(lbytes);
    for (int i = 0; i < maxT; i++) dst[i] = logits + (size_t)i * V;
    if (pack < 1 || pack > maxT || (long)pack * ctx > be->max_batch_tokens) {
        fprintf(stderr, "--pack %d: needs 1 <= K <= %d sessions and K x %d tokens <= %d\n", pack, maxT, ctx, be->max_batch_tokens);
        return 1;
    }
    t0 = now_seconds();
    int32_t *ptok = malloc(sizeof(int32_t) * (size_t)pack * ctx), *ppos = malloc(sizeof(int32_t) * (size_t)pack * ctx);
    int32_t *pseq = malloc(sizeof(int32_t) * (size_t)pack * ctx), *prow = malloc(sizeof(int32_t) * (size_t)pack);
    int32_t *pids = malloc(sizeof(int32_t) * (size_t)pack);
    float **pnone = calloc((size_t)pack, sizeof(float *));
    for (int s0 = 0; s0 < maxT; s0 += pack) {
        const int k = maxT - s0 < pack ? maxT - s0 : pack;
        for (int j = 0; j < k; j++)
            for (int i = 0; i < ctx; i++) {
                ptok[j * ctx + i] = (int32_t)((((uint64_t)(i + 131 * (s0 + j)) * 2654435761u) & 0xffffffffu) % (uint64_t)V);
                ppos[j * ctx + i] = i;
                pseq[j * ctx + i] = j;
            }
        for (int j = 0; j < k; j++) prow[j] = j * ctx + ctx - 1;
        /* one forward for the pack, each prompt's last row's argmax (as the server asks) */
        const bool last = s0 + pack >= maxT && s0 > 0;
        if (last && cuda_backend_set_profile(be, 1, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        /* --trace with --pack: the timeline of one pack too (the second when there are three or
         * more, else the first; never the profiled last one) */
        char tpath[512];
        const bool traced = trace_dir && pack > 1 && !last && s0 == (maxT >= 3 * pack ? pack : 0);
        if (traced) {
            snprintf(tpath, sizeof tpath, "%s/trace_pack%d.csv", trace_dir, pack);
            cuda_backend_trace_next(be, tpath);
        }
        const double tp = now_seconds();
        struct fwd_batch b = {.n_tokens = k * ctx, .tokens = ptok, .pos = ppos, .seq = pseq, .sessions = ss + s0,
                              .n_seqs = k, .n_out = k, .out_rows = prow, .out_logits = pnone, .out_argmax = pids};
        if (be->forward(be, &b, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        if (traced) printf("trace of one pack of %d x %d tokens: %s\n", k, ctx, tpath);
        else if (pack > 1 && !last)
            printf("pack of %d x %d tokens: %.1f ms (%.0f tok/s)\n", k, ctx, (now_seconds() - tp) * 1e3,
                   k * ctx / (now_seconds() - tp));
        if (last) {
            printf("\nprofile: one pack of %d sequences x %d tokens (GPU time per op)\n", k, ctx);
            cuda_backend_profile_dump(be, stdout);
            if (cuda_backend_set_profile(be, 0, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        }
    }
    free(ptok); free(ppos); free(pseq); free(prow); free(pids); free(pnone);
    printf("prefilled %d sessions x %d tokens, %d a forward, in %.2f s\n", maxT, ctx, pack, now_seconds() - t0);
    for (int i = 0; i < maxT; i++) tok[i] = (int32_t)(1000 + 7 * i);
    int pos = ctx;
    printf("\n| T | ms/step, T logits rows (pinned) | no outputs | T argmax ids | T sampled ids, T = 1 | T sampled ids, "
           "0.7 / 0.8 / 20 | T sampled ids, 0.7 / 0.8 |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int k = 0; k < nT; k++) {
        const int T = Ts[k];
        double ms[6];
        for (int mode = OUT_LOGITS; mode <= OUT_SAMPLE_TOPP; mode++) {
            if (step(be, ss, T, pos++, tok, posv, seq, rows, dst, mode, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
            t0 = now_seconds();
            for (int i = 0; i < steps; i++)
                if (step(be, ss, T, pos++, tok, posv, seq, rows, dst, mode, err, sizeof err)) {
                    fprintf(stderr, "%s\n", err);
                    return 1;
                }
            ms[mode] = (now_seconds() - t0) * 1e3 / steps;
        }
        printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", T, ms[OUT_LOGITS], ms[OUT_NONE], ms[OUT_ARGMAX],
               ms[OUT_SAMPLE_T1], ms[OUT_SAMPLE_QWEN], ms[OUT_SAMPLE_TOPP]);
    }
    for (int k = 0; trace_dir && k < 2; k++) {
        const int T = k ? maxT : 1;
        if (k && maxT == 1) break;
        char path[512];
        snprintf(path, sizeof path, "%s/trace_T%d.csv", trace_dir, T);
        cuda_backend_trace_next(be, path);
        if (step(be, ss, T, pos++, tok, posv, seq, rows, dst, OUT_LOGITS, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        printf("trace of one forward of %d sequences x 1 token: %s\n", T, path);
    }
    if (cuda_backend_set_profile(be, 1, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    for (int k = 0; k < nT; k++) {
        const int T = Ts[k];
        if (T != 1 && T != 16 && T != 17 && T != maxT) continue;
        for (int r = 0; r < 5; r++)
            if (step(be, ss, T, pos++, tok, posv, seq, rows, dst, OUT_SAMPLE_QWEN, err, sizeof err)) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
        printf("\nprofile: 5 forwards of %d sequences x 1 token (GPU time per op, summed over the 5)\n", T);
        cuda_backend_profile_dump(be, stdout);
    }
    for (int i = 0; i < maxT; i++) be->session_destroy(be, ss[i]);
    if (be->host_free) be->host_free(be, logits);
    else free(logits);
    be->destroy(be);
    tmodel_close(&m);
    free(ss); free(tok); free(posv); free(seq); free(rows); free(dst);
    return 0;
}
