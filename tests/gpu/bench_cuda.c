/* tests/gpu/bench_cuda.c — benchmark harness of the CUDA backend on a full-shape
 * synthetic Qwen3.6-35B-A3B checkpoint built in memory (model/synth.h), following
 * the Lily contract: prompt token i = ((i·2654435761) mod 2^32) mod vocab, an
 * exact-shape warm-up, one measured prefill (time to first token), 64 measured
 * decode steps through the backend's greedy loop, FNV-1a digest of the ids,
 * median over rounds. Also measures the copy bandwidth, the weight upload, and the
 * GPU memory of a session of --max-seq tokens.
 *
 *   bench_cuda [--shape 35b-a3b] [--contexts 512,4096] [--decode-steps 64] [--rounds 1]
 *              [--max-seq-probe 262144] [--json FILE] [--profile 1]
 * --profile 1: after the timed runs, per-op GPU times (events between ops) of one
 * prefill chunk of 4096 tokens and of 16 single-token forwards (no graph). */
#include <stdint.h>

#include "gpu_common.h"

void cuda_backend_profile_dump(struct backend *b, FILE *f);
int cuda_backend_set_profile(struct backend *b, int on, char *err, size_t errlen);

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static size_t qb(const struct qmat *m) { return qmat_bytes(m); }

/* Bytes a decode step must read: dense weights + top-k experts + lm_head + one embedding row,
 * + GDN state read and written + the KV cache up to ctx. */
static double decode_bytes(const struct model_config *c, const struct model_weights *w, int ctx) {
    double b = (double)qb(&w->lm_head) + (double)qb(&w->embed) / c->vocab;
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *L = &w->layers[l];
        if (L->kind == LAYER_ATTENTION) b += qb(&L->attn.q) + qb(&L->attn.k) + qb(&L->attn.v) + qb(&L->attn.o);
        else b += qb(&L->gdn.qkv) + qb(&L->gdn.z) + qb(&L->gdn.a) + qb(&L->gdn.b) + qb(&L->gdn.out);
        const struct moe_weights *m = &L->moe;
        b += qb(&m->router) + qb(&m->sh_gate) + qb(&m->sh_up) + qb(&m->sh_down) + qb(&m->sh_expert_gate);
        b += (double)c->n_experts_per_tok / c->n_experts * (qb(&m->gate) + qb(&m->up) + qb(&m->down));
    }
    int n_lin = 0, n_attn = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] == LAYER_ATTENTION) n_attn++;
        else n_lin++;
    }
    b += 2.0 * n_lin * c->lin_v_heads * c->lin_v_dim * c->lin_k_dim * 4;
    b += (double)n_attn * 2 * c->n_kv_heads * c->head_dim * 2 * ctx;
    return b;
}

/* FLOPs of a prefill of n tokens (2 per MAC of every active weight; attention QK and PV causal). */
static double prefill_flops(const struct model_config *c, const struct model_weights *w, int n) {
    double macs = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *L = &w->layers[l];
        if (L->kind == LAYER_ATTENTION) {
            macs += (double)(L->attn.q.rows + L->attn.k.rows + L->attn.v.rows) * c->hidden + (double)L->attn.o.rows * L->attn.o.cols;
            macs += 2.0 * c->n_heads * c->head_dim * (n + 1) / 2.0; /* per token: QK + PV over ~n/2 keys */
        } else {
            macs += (double)(L->gdn.qkv.rows + L->gdn.z.rows + 64) * c->hidden + (double)L->gdn.out.rows * L->gdn.out.cols;
            macs += 3.0 * c->lin_v_heads * c->lin_v_dim * c->lin_k_dim;
        }
        macs += (double)(c->n_experts + 1) * c->hidden;
        macs += (double)(c->n_experts_per_tok + 1) * 3 * c->moe_inter * c->hidden;
    }
    return 2.0 * macs * n + 2.0 * (double)c->vocab * c->hidden;
}

int main(int argc, char **argv) {
    const char *shape = "35b-a3b", *json = NULL;
    char ctx_list[256] = "512,4096";
    int steps = 64, rounds = 1, probe = 262144, profile = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shape")) shape = argv[i + 1];
        else if (!strcmp(argv[i], "--contexts")) snprintf(ctx_list, sizeof ctx_list, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--decode-steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-seq-probe")) probe = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--json")) json = argv[i + 1];
        else if (!strcmp(argv[i], "--profile")) profile = atoi(argv[i + 1]);
        else { fprintf(stderr, "bench_cuda: unknown option %s\n", argv[i]); return 2; }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    char err[512], dev[160];
    if (cuda_device_name(dev, sizeof dev)) { fprintf(stderr, "bench_cuda: no CUDA device\n"); return 1; }
    double copy = 0;
    if (cuda_copy_bandwidth((size_t)1 << 31, 10, &copy, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    printf("device: %s, copy bandwidth %.0f GB/s (read + write)\n", dev, copy);
    char where[64];
    snprintf(where, sizeof where, "synth:%s", shape);
    double t0 = now_seconds();
    struct tmodel m;
    if (tmodel_open(&m, where, err, sizeof err)) { fprintf(stderr, "bench_cuda: %s\n", err); return 1; }
    printf("synthetic %s weights in memory: %.1f s, %.2f GB quantized\n", shape, now_seconds() - t0, m.w.quant_bytes / 1e9);
    struct backend *be;
    if (cuda_backend_create(&be, &m.cfg, &m.w, err, sizeof err)) { fprintf(stderr, "bench_cuda: %s\n", err); return 1; }
    double load_s = 0, load_b = 0;
    cuda_backend_load_stats(be, &load_s, &load_b);
    printf("weights uploaded: %.2f GB in %.2f s = %.1f GB/s\n", load_b / 1e9, load_s, load_b / 1e9 / load_s);
    const int V = m.cfg.vocab;
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (jf) fprintf(jf, "{\"device\": \"%s\", \"copy_gbps\": %.1f, \"load_s\": %.3f, \"load_gb\": %.3f, \"runs\": [", dev, copy,
                    load_s, load_b / 1e9);
    printf("\n| context | prefill tok/s | TTFT ms | prefill TFLOP/s | decode tok/s | decode ms/tok | decode GB/s | %% of copy | digest |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    int first_run = 1;
    for (char *tokp = ctx_list, *sp; (tokp = strtok_r(tokp, ",", &sp)); tokp = NULL) {
        const int ctx = atoi(tokp);
        if (ctx < 1) continue;
        struct backend_session *s;
        if (be->session_create(be, ctx + steps + 16, &s, err, sizeof err)) { fprintf(stderr, "bench_cuda: %s\n", err); return 1; }
        int32_t *prompt = malloc((size_t)ctx * 4), *ids = malloc((size_t)steps * 4);
        for (int i = 0; i < ctx; i++) prompt[i] = (int32_t)(((uint64_t)i * 2654435761u & 0xffffffffu) % (uint64_t)V);
        float *lg = malloc((size_t)V * 4);
        double *pre = malloc(sizeof(double) * rounds), *dec = malloc(sizeof(double) * rounds), *se = malloc(sizeof(double) * steps);
        uint64_t digest = 0;
        for (int r = -1; r < rounds; r++) { /* r = -1: exact-shape warm-up */
            be->session_reset(be, s);
            const double a = now_seconds();
            if (feed(be, s, prompt, ctx, 0, ctx - 1, lg, V, err, sizeof err)) { fprintf(stderr, "bench_cuda: %s\n", err); return 1; }
            const double b = now_seconds();
            const int32_t first = argmax_row(lg, V);
            if (be->decode_greedy(be, s, ctx, first, steps, ids, se, err, sizeof err)) { fprintf(stderr, "bench_cuda: %s\n", err); return 1; }
            if (r >= 0) {
                pre[r] = b - a;
                dec[r] = se[steps - 1];
            }
            uint64_t h = 1469598103934665603ull;
            for (int i = 0; i < steps; i++)
                for (int k = 0; k < 4; k++) { h ^= ((uint32_t)ids[i] >> (8 * k)) & 0xff; h *= 1099511628211ull; }
            digest = h;
        }
        qsort(pre, (size_t)rounds, sizeof(double), cmp_d);
        qsort(dec, (size_t)rounds, sizeof(double), cmp_d);
        const double tp = pre[rounds / 2], td = dec[rounds / 2];
        const double dbytes = decode_bytes(&m.cfg, &m.w, ctx + steps / 2);
        const double gbps = dbytes * steps / td / 1e9;
        const double tflops = prefill_flops(&m.cfg, &m.w, ctx) / tp / 1e12;
        printf("| %d | %.0f | %.1f | %.1f | %.1f | %.3f | %.0f | %.0f%% | %016llx |\n", ctx, ctx / tp, tp * 1e3, tflops,
               steps / td, td / steps * 1e3, gbps, 100.0 * gbps / copy, (unsigned long long)digest);
        fflush(stdout);
        if (jf) {
            fprintf(jf, "%s{\"context\": %d, \"prefill_s\": %.6f, \"prefill_tok_s\": %.1f, \"decode_s\": %.6f, \"decode_tok_s\": %.2f, "
                        "\"decode_bytes_per_token\": %.0f, \"decode_gbps\": %.1f, \"prefill_flops\": %.4g, \"digest\": \"%016llx\"}",
                    first_run ? "" : ", ", ctx, tp, ctx / tp, td, steps / td, dbytes, gbps, prefill_flops(&m.cfg, &m.w, ctx),
                    (unsigned long long)digest);
            first_run = 0;
        }
        free(prompt); free(ids); free(lg); free(pre); free(dec); free(se);
        be->session_destroy(be, s);
    }
    if (profile) { /* after the timed runs: per-op event timing perturbs them */
        struct backend_session *s;
        cuda_backend_set_profile(be, 1, err, sizeof err);
        if (!be->session_create(be, 4200, &s, err, sizeof err)) {
            int32_t *p = malloc(4096 * 4);
            float *lg = malloc((size_t)V * 4);
            for (int i = 0; i < 4096; i++) p[i] = (int32_t)(((uint64_t)i * 2654435761u & 0xffffffffu) % (uint64_t)V);
            printf("\nprofile: one prefill chunk of 4096 tokens\n");
            feed(be, s, p, 4096, 0, 4095, lg, V, err, sizeof err);
            cuda_backend_profile_dump(be, stdout);
            printf("\nprofile: one decode step at context ~4100 (CUDA graph with event nodes between ops)\n");
            int32_t ids[4];
            be->decode_greedy(be, s, 4096, p[0], 4, ids, NULL, err, sizeof err);
            cuda_backend_profile_dump(be, stdout);
            printf("\nprofile: the same decode step at context ~4100 as single-token forwards (no graph)\n");
            for (int i = 0; i < 16; i++) feed(be, s, p + i, 1, 4100 + i, 0, lg, V, err, sizeof err);
            cuda_backend_profile_dump(be, stdout);
            free(p); free(lg);
            be->session_destroy(be, s);
        }
        cuda_backend_set_profile(be, 0, err, sizeof err);
    }
    int closed = 0;
    if (probe > 0) {
        size_t f0 = 0, tot = 0, f1 = 0;
        cuda_mem_info(&f0, &tot);
        struct backend_session *s;
        if (be->session_create(be, probe, &s, err, sizeof err)) {
            printf("session of %d tokens: %s\n", probe, err);
        } else {
            cuda_mem_info(&f1, &tot);
            printf("GPU memory: %.2f GiB in use with weights + scratch + one session of max_seq %d (session %.2f GiB) of %.1f GiB\n",
                   (double)(tot - f1) / (1 << 30), probe, (double)(f0 - f1) / (1 << 30), (double)tot / (1 << 30));
            closed = 1;
            if (jf) fprintf(jf, "], \"max_seq_probe\": %d, \"gpu_mem_used_gib\": %.3f, \"session_gib\": %.3f", probe,
                            (double)(tot - f1) / (1 << 30), (double)(f0 - f1) / (1 << 30));
            be->session_destroy(be, s);
        }
    }
    if (jf) {
        if (!closed) fprintf(jf, "]");
        fprintf(jf, "}\n");
        fclose(jf);
    }
    be->destroy(be);
    tmodel_close(&m);
    return 0;
}
