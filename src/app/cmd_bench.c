/* app/cmd_bench.c — `orchid bench`: the benchmark contract (DESIGN.md §6, after
 * Lily's lily-bench, LILY.md §5.1), one context per process.
 *
 *   prompt      token i = ((i * 2654435761) mod 2^32) mod vocab  (u32 wrapping multiply)
 *   warm-up     a throwaway session of prompt_len + 2: prefill the exact prompt,
 *               then 2 greedy decode steps (every shape the measured run uses)
 *   each round  a fresh session of prompt_len + decode_steps + 1 (allocated outside
 *               the timers):
 *               prefill = engine_forward(prompt) + argmax of the last logits
 *                         (time to first token; that argmax is first_token_id)
 *               decode  = engine_decode_greedy(first, decode_steps): the backend's
 *                         device-resident loop when it has one; step_wall_secs[i]
 *                         are the intervals between the times each id was known
 *   digest      FNV-1a 64 (offset 0xcbf29ce484222325, prime 0x100000001b3, XOR then
 *               multiply) over the decode_steps decode ids — the first token (from
 *               prefill) excluded — each fed as its 4 little-endian bytes (u32);
 *               16 lowercase hex digits
 *   report      medians over rounds (the step list and ids of the median round);
 *               a digest that changes between rounds is reported and fails the run
 *   bandwidth   bytes_per_token = the bytes one decode token must read (below) at
 *               the mean context of the measured steps; achieved_gbs =
 *               bytes_per_token × decode tok/s; copy_gbs = (read + write bytes)/s of
 *               a large copy measured here (host memcpy over all cores, or the
 *               engine's device copy when it offers one)
 *
 * Bytes per decode token (a property of the model, not of one backend's layout):
 * quantized matrices as stored (codes + bf16 scales + bf16 biases): one embedding
 * row, every layer's projections (GDN in_proj_qkv/z/b/a + out_proj, or attention
 * q/k/v/o), the router, top-k experts' gate/up/down, the shared expert and its
 * gate, and lm_head; plus the f32 Gated DeltaNet recurrent state and conv state
 * (read + write), and the bf16 KV cache of the attention layers (read over the
 * context, plus the new entry written). Norm gains and conv taps are ignored
 * (< 0.1 %).
 *
 * `--synth SHAPE` benchmarks a synthetic checkpoint (model/synth.h) built in
 * memory and opened with engine_open_checkpoint: no 19 GB write first (the loading
 * path from files is measured separately, by `orchid info` / engine_open).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "app/cli.h"
#include "app/commands.h"
#include "model/config.h"
#include "model/engine.h"
#include "model/sampler.h"
#include "model/synth.h"
#include "runtime/safetensors.h"
#include "runtime/status.h"
#include "runtime/timing.h"

#ifndef ORCHID_VERSION
#define ORCHID_VERSION "0.1.0"
#endif

static const char *USAGE =
    "usage: orchid bench (--model DIR | --synth 35b-a3b|mini|small|tiny [--seed N]) --prompt-len N --json-out FILE\n"
    "                    [--decode-steps 64] [--rounds 1] [--backend auto|cpu|cuda] [--threads N] [--copy-mib 512]\n"
    "  stdout: one row  | prompt_len | backend | prefill tok/s | decode tok/s | achieved GB/s | copy GB/s | digest |";

/* ------------------------------------------------------------------------- */

static uint64_t bench_digest(const int32_t *ids, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) {
        const uint32_t v = (uint32_t)ids[i];
        for (int b = 0; b < 4; b++) h = (h ^ ((v >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
    }
    return h;
}

static double qbytes(double rows, int cols, int bits, int group) {
    return rows * ((double)cols * bits / 8.0 + (double)(cols / group) * 4.0);
}

struct bpt { double weights, state, kv, total; };

static double mod_bytes(const struct model_config *c, int layer, const char *suffix, double rows, int cols) {
    char name[192];
    int bits, group;
    if (layer >= 0) snprintf(name, sizeof name, "language_model.model.layers.%d.%s", layer, suffix);
    else snprintf(name, sizeof name, "%s", suffix);
    config_module_quant(c, name, &bits, &group);
    return qbytes(rows, cols, bits, group);
}

static struct bpt bytes_per_token(const struct model_config *c, double ctx) {
    struct bpt b = {0};
    const int H = c->hidden;
    b.weights += mod_bytes(c, -1, "language_model.model.embed_tokens", 1, H);
    b.weights += mod_bytes(c, -1, "language_model.lm_head", c->vocab, H);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] == LAYER_ATTENTION) {
            const int qd = cfg_q_dim(c), kvd = cfg_kv_dim(c);
            b.weights += mod_bytes(c, l, "self_attn.q_proj", (double)qd * (c->attn_output_gate ? 2 : 1), H);
            b.weights += mod_bytes(c, l, "self_attn.k_proj", kvd, H);
            b.weights += mod_bytes(c, l, "self_attn.v_proj", kvd, H);
            b.weights += mod_bytes(c, l, "self_attn.o_proj", H, qd);
            b.kv += (ctx + 1.0) * 2.0 * kvd * 2.0; /* read K and V over the context + write the new entry */
        } else {
            const int cd = cfg_conv_dim(c), vd = cfg_lin_value_dim(c);
            b.weights += mod_bytes(c, l, "linear_attn.in_proj_qkv", cd, H);
            b.weights += mod_bytes(c, l, "linear_attn.in_proj_z", vd, H);
            b.weights += mod_bytes(c, l, "linear_attn.in_proj_b", c->lin_v_heads, H);
            b.weights += mod_bytes(c, l, "linear_attn.in_proj_a", c->lin_v_heads, H);
            b.weights += mod_bytes(c, l, "linear_attn.out_proj", H, vd);
            b.state += 2.0 * 4.0 * (double)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim; /* f32 state read + write */
            b.state += 2.0 * 4.0 * (double)(c->conv_kernel - 1) * cd;                   /* f32 conv state */
        }
        b.weights += mod_bytes(c, l, "mlp.gate", c->n_experts, H);
        b.weights += c->n_experts_per_tok * (mod_bytes(c, l, "mlp.switch_mlp.gate_proj", c->moe_inter, H) +
                                             mod_bytes(c, l, "mlp.switch_mlp.up_proj", c->moe_inter, H) +
                                             mod_bytes(c, l, "mlp.switch_mlp.down_proj", H, c->moe_inter));
        b.weights += mod_bytes(c, l, "mlp.shared_expert.gate_proj", c->shared_inter, H);
        b.weights += mod_bytes(c, l, "mlp.shared_expert.up_proj", c->shared_inter, H);
        b.weights += mod_bytes(c, l, "mlp.shared_expert.down_proj", H, c->shared_inter);
        b.weights += mod_bytes(c, l, "mlp.shared_expert_gate", 1, H);
    }
    b.total = b.weights + b.state + b.kv;
    return b;
}

/* ------------------------------------------------------------------------- */
/* Host copy bandwidth: every core copies its slice of a large buffer. */

struct copy_part { uint8_t *dst; const uint8_t *src; size_t n; };

static void *copy_thread(void *arg) {
    struct copy_part *p = arg;
    memcpy(p->dst, p->src, p->n);
    return NULL;
}

static double host_copy_gbs(size_t bytes, int threads) {
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) { free(a); free(b); return 0.0; }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    struct copy_part parts[64];
    pthread_t tid[64];
    const size_t slice = (bytes / (size_t)threads) & ~(size_t)63;
    double best = 1e30;
    for (int it = 0; it < 6; it++) {
        const double t0 = now_seconds();
        int started = 0;
        for (int i = 0; i < threads; i++) {
            parts[i].dst = b + (size_t)i * slice;
            parts[i].src = a + (size_t)i * slice;
            parts[i].n = i == threads - 1 ? bytes - (size_t)i * slice : slice;
            if (i == threads - 1 || pthread_create(&tid[started], NULL, copy_thread, &parts[i]) != 0) copy_thread(&parts[i]);
            else started++;
        }
        for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
        const double t = now_seconds() - t0;
        if (it > 0 && t < best) best = t; /* the first pass only warms up */
    }
    volatile uint8_t sink = b[bytes - 1];
    (void)sink;
    free(a);
    free(b);
    return 2.0 * (double)bytes / best / 1e9;
}

/* ------------------------------------------------------------------------- */

static void cpu_name(char *out, size_t len) {
    snprintf(out, len, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *v = strchr(line, ':');
            if (v) {
                v++;
                while (*v == ' ' || *v == '\t') v++;
                v[strcspn(v, "\n")] = 0;
                snprintf(out, len, "%s", v);
            }
            break;
        }
    }
    fclose(f);
}

/* The git commit of the checkout the binary was built in (two levels up from it), or "". */
static void git_info(char *sha, size_t len, int *dirty) {
    sha[0] = 0;
    *dirty = -1;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = 0;
    for (size_t i = 0; exe[i]; i++)
        if (exe[i] == '\'') return; /* keep the shell command simple and safe */
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "git -C '%s' rev-parse HEAD 2>/dev/null", exe);
    FILE *p = popen(cmd, "r");
    if (!p) return;
    char buf[128] = {0};
    if (fgets(buf, sizeof buf, p)) {
        buf[strcspn(buf, "\n")] = 0;
        if (strlen(buf) == 40) snprintf(sha, len, "%s", buf);
    }
    pclose(p);
    if (!sha[0]) return;
    snprintf(cmd, sizeof cmd, "git -C '%s' status --porcelain --untracked-files=no 2>/dev/null", exe);
    if ((p = popen(cmd, "r"))) {
        *dirty = fgetc(p) != EOF;
        pclose(p);
    }
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return v[0];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    const double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

/* Builds a synthetic checkpoint in memory (no 19 GB write) and opens an engine on it. */
static int open_synth(engine **e, struct engine_options *opt, const char *shape, uint64_t seed, double *synth_secs,
                      char *where, size_t wlen, char *err, size_t errlen) {
    struct synth_options so = {.shape = shape, .seed = seed, .threads = opt->threads, .quiet = false};
    struct synth_result res;
    safetensors *st;
    char *config;
    int rc = synth_build_memory(&so, &st, &config, &res, err, errlen);
    if (rc) return rc;
    *synth_secs = res.seconds;
    snprintf(where, wlen, "memory");
    rc = engine_open_checkpoint(e, opt, config, strlen(config), st, err, errlen);
    free(config);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    const char *model = NULL, *synth = NULL, *json_out = NULL, *backend = "auto";
    long prompt_len = -1, steps = 64, rounds = 1, threads = 0, seed = 0, copy_mib = 512;
    bool seed_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { puts(USAGE); return 0; }
        static const char *known[] = {"--model", "--synth", "--seed", "--prompt-len", "--decode-steps", "--json-out",
                                      "--rounds", "--backend", "--threads", "--copy-mib"};
        bool ok = false;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) ok |= !strcmp(a, known[k]);
        if (!ok) return cli_usage_error("bench", "unknown flag \"%s\" (see orchid bench --help)", a);
        if (!(v = cli_value(argc, argv, &i))) return cli_usage_error("bench", "%s needs a value", a);
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--synth")) synth = v;
        else if (!strcmp(a, "--json-out")) json_out = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--seed")) {
            if (!cli_parse_int(v, 0, 1L << 53, &seed)) return cli_usage_error("bench", "--seed must be an integer in 0..2^53, got \"%s\"", v);
            seed_given = true;
        } else if (!strcmp(a, "--prompt-len")) {
            if (!cli_parse_int(v, 1, 1 << 24, &prompt_len))
                return cli_usage_error("bench", "--prompt-len must be an integer in 1..16777216, got \"%s\"", v);
        } else if (!strcmp(a, "--decode-steps")) {
            if (!cli_parse_int(v, 1, 1 << 20, &steps)) return cli_usage_error("bench", "--decode-steps must be an integer in 1..1048576, got \"%s\"", v);
        } else if (!strcmp(a, "--rounds")) {
            if (!cli_parse_int(v, 1, 1000, &rounds)) return cli_usage_error("bench", "--rounds must be an integer in 1..1000, got \"%s\"", v);
        } else if (!strcmp(a, "--threads")) {
            if (!cli_parse_int(v, 0, 1024, &threads)) return cli_usage_error("bench", "--threads must be an integer in 0..1024, got \"%s\"", v);
        } else if (!strcmp(a, "--copy-mib")) {
            if (!cli_parse_int(v, 1, 1 << 16, &copy_mib)) return cli_usage_error("bench", "--copy-mib must be an integer in 1..65536, got \"%s\"", v);
        }
    }
    if (!model && !synth) return cli_usage_error("bench", "--model DIR or --synth SHAPE is required");
    if (model && synth) return cli_usage_error("bench", "--model and --synth are exclusive");
    if (seed_given && !synth) return cli_usage_error("bench", "--seed only applies to --synth");
    if (synth && !synth_shape_valid(synth)) return cli_usage_error("bench", "unknown --synth shape \"%s\" (%s)", synth, SYNTH_SHAPES);
    if (model && !cli_is_dir(model)) return cli_usage_error("bench", "%s: not a directory", model);
    if (prompt_len < 0) return cli_usage_error("bench", "--prompt-len N is required");
    if (!json_out) return cli_usage_error("bench", "--json-out FILE is required");
    if (strcmp(backend, "auto") && strcmp(backend, "cpu") && strcmp(backend, "cuda"))
        return cli_usage_error("bench", "--backend must be auto, cpu or cuda, got \"%s\"", backend);
    FILE *jf = fopen(json_out, "w");
    if (!jf) return cli_usage_error("bench", "%s: cannot open for writing: %s", json_out, strerror(errno));

    const int P = (int)prompt_len, D = (int)steps, R = (int)rounds;
    char err[1024], where[PATH_MAX + 64] = "", model_name[PATH_MAX + 64];
    int rc = 1;
    engine *e = NULL;
    session *s = NULL;
    int32_t *prompt = NULL, *ids = NULL, *round_ids = NULL;
    float *logits = NULL;
    double *step_end = NULL, *round_steps = NULL, *pre = NULL, *dec = NULL, synth_secs = 0;
    int32_t *first_ids = NULL;
    uint64_t *digests = NULL;
    cJSON *root = NULL;
    char *text = NULL;
    bool wrote = false;

    struct engine_options opt = {.model_dir = model, .backend = backend, .threads = (int)threads, .quiet = true};
    const double t_load0 = now_seconds();
    if (synth) {
        if (open_synth(&e, &opt, synth, (uint64_t)seed, &synth_secs, where, sizeof where, err, sizeof err)) {
            fprintf(stderr, "orchid bench: synth %s: %s\n", synth, err);
            goto out;
        }
        snprintf(model_name, sizeof model_name, "synth:%s seed %ld", synth, seed);
    } else {
        if (engine_open(&e, &opt, err, sizeof err)) { fprintf(stderr, "orchid bench: %s\n", err); goto out; }
        snprintf(model_name, sizeof model_name, "%s", model);
    }
    backend = engine_backend_name(e); /* what "auto" resolved to */
    const double load_secs = now_seconds() - t_load0;
    const struct model_config *c = engine_config(e);
    if (c->max_position > 0 && (long)P + D + 1 > c->max_position) {
        rc = cli_usage_error("bench", "--prompt-len %d + --decode-steps %d + 1 exceeds max_position_embeddings %d", P, D, c->max_position);
        goto out;
    }

    prompt = malloc((size_t)P * sizeof *prompt);
    ids = malloc((size_t)D * sizeof *ids);
    round_ids = malloc((size_t)R * D * sizeof *round_ids);
    step_end = malloc((size_t)D * sizeof *step_end);
    round_steps = malloc((size_t)R * D * sizeof *round_steps);
    pre = malloc((size_t)R * sizeof *pre);
    dec = malloc((size_t)R * sizeof *dec);
    first_ids = malloc((size_t)R * sizeof *first_ids);
    digests = malloc((size_t)R * sizeof *digests);
    logits = malloc((size_t)c->vocab * sizeof *logits);
    if (!prompt || !ids || !round_ids || !step_end || !round_steps || !pre || !dec || !first_ids || !digests || !logits) {
        fprintf(stderr, "orchid bench: out of memory\n");
        goto out;
    }
    for (int i = 0; i < P; i++) prompt[i] = (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)c->vocab);

    /* warm-up: the exact prompt shape and two decode steps on a throwaway session */
    {
        if (session_open(e, &s, P + 2, err, sizeof err)) { fprintf(stderr, "orchid bench: %s\n", err); goto out; }
        struct batch_seq q = {.s = s, .tokens = prompt, .n_tokens = P, .logits = logits};
        int32_t w[2];
        if (engine_forward(e, &q, 1, err, sizeof err) ||
            engine_decode_greedy(e, s, sampler_argmax(logits, c->vocab), 2, w, NULL, err, sizeof err)) {
            fprintf(stderr, "orchid bench: warm-up: %s\n", err);
            goto out;
        }
        session_close(s);
        s = NULL;
    }

    size_t mem_peak = 0;
    for (int r = 0; r < R; r++) {
        if (session_open(e, &s, P + D + 1, err, sizeof err)) { fprintf(stderr, "orchid bench: %s\n", err); goto out; }
        struct batch_seq q = {.s = s, .tokens = prompt, .n_tokens = P, .logits = logits};
        const double t0 = now_seconds();
        if (engine_forward(e, &q, 1, err, sizeof err)) { fprintf(stderr, "orchid bench: prefill: %s\n", err); goto out; }
        const int32_t first = sampler_argmax(logits, c->vocab);
        const double t1 = now_seconds();
        if (engine_decode_greedy(e, s, first, D, ids, step_end, err, sizeof err)) {
            fprintf(stderr, "orchid bench: decode: %s\n", err);
            goto out;
        }
        const double t2 = now_seconds();
        pre[r] = t1 - t0;
        dec[r] = t2 - t1;
        first_ids[r] = first;
        for (int i = 0; i < D; i++) {
            round_steps[(size_t)r * D + i] = step_end[i] - (i ? step_end[i - 1] : 0.0);
            round_ids[(size_t)r * D + i] = ids[i];
        }
        digests[r] = bench_digest(ids, D);
        const size_t mem = engine_device_mem_used(e); /* weights + scratch + this session */
        if (mem > mem_peak) mem_peak = mem;
        session_close(s);
        s = NULL;
    }

    /* medians; the median round (decode wall closest to the median) supplies the step list */
    const double pre_med = median(pre, R), dec_med = median(dec, R);
    int mr = 0;
    for (int r = 1; r < R; r++)
        if (fabs(dec[r] - dec_med) < fabs(dec[mr] - dec_med)) mr = r;
    bool stable = true;
    for (int r = 1; r < R; r++) stable &= digests[r] == digests[0] && first_ids[r] == first_ids[0];

    const double ctx_mean = (double)P + 1.0 + (D - 1) / 2.0; /* context attended by the mean measured step */
    const struct bpt bpt = bytes_per_token(c, ctx_mean);
    const double dec_tok_s = D / dec_med, pre_tok_s = P / pre_med;
    const double achieved = bpt.total * dec_tok_s / 1e9;
    double copy_gbs = 0;
    const char *copy_kind = "host_memcpy";
    if (strcmp(backend, "cpu") != 0) {
        if (engine_copy_gbs(e, (size_t)copy_mib << 20, &copy_gbs, err, sizeof err) == 0) copy_kind = "device_copy";
        else { fprintf(stderr, "orchid bench: device copy bandwidth: %s; using host memcpy\n", err); copy_gbs = 0; }
    }
    if (copy_gbs <= 0) {
        const long nproc = sysconf(_SC_NPROCESSORS_ONLN);
        copy_gbs = host_copy_gbs((size_t)copy_mib << 20, threads > 0 ? (int)threads : (int)(nproc > 0 ? nproc : 1));
        copy_kind = "host_memcpy";
    }
    char dev[256], sha[128], digest_hex[17], desc[1024];
    if (strcmp(backend, "cpu") != 0) snprintf(dev, sizeof dev, "%s", engine_device_name(e));
    else cpu_name(dev, sizeof dev);
    int dirty;
    git_info(sha, sizeof sha, &dirty);
    snprintf(digest_hex, sizeof digest_hex, "%016llx", (unsigned long long)digests[mr]);
    config_describe(c, desc, sizeof desc);

    root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "schema_version", 1);
    cJSON *meta = cJSON_AddObjectToObject(root, "meta");
    cJSON_AddStringToObject(meta, "engine", "orchid");
    cJSON_AddStringToObject(meta, "version", ORCHID_VERSION);
    cJSON_AddStringToObject(meta, "backend", engine_backend_name(e));
    cJSON_AddStringToObject(meta, "device", dev);
    if (sha[0]) cJSON_AddStringToObject(meta, "git_sha", sha); else cJSON_AddNullToObject(meta, "git_sha");
    if (dirty >= 0) cJSON_AddBoolToObject(meta, "git_dirty", dirty); else cJSON_AddNullToObject(meta, "git_dirty");
    cJSON_AddStringToObject(meta, "model", model_name);
    if (synth) cJSON_AddStringToObject(meta, "synth_built_in", where);
    cJSON_AddStringToObject(meta, "model_shape", desc);
    cJSON_AddBoolToObject(meta, "production_shape", c->is_production_shape);
    cJSON_AddNumberToObject(meta, "threads", (double)threads);
    cJSON_AddNumberToObject(meta, "load_secs", load_secs);
    if (synth) cJSON_AddNumberToObject(meta, "synth_secs", synth_secs);
    {
        char ts[64];
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
        cJSON_AddStringToObject(meta, "timestamp_utc", ts);
    }
    cJSON *wl = cJSON_AddObjectToObject(root, "workload");
    cJSON_AddNumberToObject(wl, "prompt_len", P);
    cJSON_AddStringToObject(wl, "prompt_kind", "u32_golden_ratio_hash_mod_vocab");
    cJSON_AddNumberToObject(wl, "decode_steps", D);
    cJSON_AddNumberToObject(wl, "rounds", R);
    cJSON_AddStringToObject(wl, "decode_mode", "engine_decode_greedy");
    cJSON_AddStringToObject(wl, "token_digest_def",
                            "FNV-1a 64 over the decode_steps decode ids (first token excluded), each as 4 little-endian bytes");
    cJSON *res = cJSON_AddObjectToObject(root, "results");
    cJSON *jp = cJSON_AddObjectToObject(res, "prefill");
    cJSON_AddNumberToObject(jp, "wall_secs", pre_med);
    cJSON_AddNumberToObject(jp, "tok_s", pre_tok_s);
    cJSON_AddNumberToObject(jp, "first_token_id", first_ids[mr]);
    cJSON *jd = cJSON_AddObjectToObject(res, "decode");
    cJSON_AddNumberToObject(jd, "wall_secs", dec_med);
    cJSON_AddNumberToObject(jd, "tok_s", dec_tok_s);
    cJSON_AddItemToObject(jd, "step_wall_secs", cJSON_CreateDoubleArray(round_steps + (size_t)mr * D, D));
    cJSON_AddNumberToObject(jd, "steps_from_round", mr); /* index into results.rounds */
    cJSON_AddStringToObject(jd, "token_digest", digest_hex);
    cJSON_AddItemToObject(jd, "token_ids", cJSON_CreateIntArray((const int *)(round_ids + (size_t)mr * D), D));
    cJSON_AddNumberToObject(res, "bytes_per_token", bpt.total);
    cJSON *jb = cJSON_AddObjectToObject(res, "bytes_per_token_detail");
    cJSON_AddNumberToObject(jb, "weights", bpt.weights);
    cJSON_AddNumberToObject(jb, "gdn_state", bpt.state);
    cJSON_AddNumberToObject(jb, "kv_cache", bpt.kv);
    cJSON_AddNumberToObject(jb, "mean_context", ctx_mean);
    cJSON_AddNumberToObject(res, "achieved_gbs", achieved);
    cJSON_AddNumberToObject(res, "copy_gbs", copy_gbs);
    cJSON_AddStringToObject(res, "copy_kind", copy_kind);
    if (mem_peak) {
        cJSON_AddNumberToObject(res, "device_mem_used_bytes", (double)mem_peak);
        fprintf(stderr, "orchid bench: device memory in use with the measured session: %.2f GiB\n", mem_peak / 1073741824.0);
    }
    cJSON_AddNumberToObject(res, "bandwidth_fraction", copy_gbs > 0 ? achieved / copy_gbs : 0.0);
    cJSON_AddBoolToObject(res, "digest_stable", stable);
    cJSON *jr = cJSON_AddArrayToObject(res, "rounds");
    for (int r = 0; r < R; r++) {
        cJSON *o = cJSON_CreateObject();
        char h[17];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)digests[r]);
        cJSON_AddNumberToObject(o, "prefill_wall_secs", pre[r]);
        cJSON_AddNumberToObject(o, "decode_wall_secs", dec[r]);
        cJSON_AddNumberToObject(o, "first_token_id", first_ids[r]);
        cJSON_AddStringToObject(o, "token_digest", h);
        cJSON_AddItemToArray(jr, o);
    }
    if (!(text = cJSON_Print(root)) || fputs(text, jf) < 0 || fputc('\n', jf) == EOF) {
        fprintf(stderr, "orchid bench: writing %s failed\n", json_out);
        goto out;
    }
    wrote = true;
    printf("| %d | %s | %.1f | %.2f | %.2f | %.2f | %s |\n", P, engine_backend_name(e), pre_tok_s, dec_tok_s, achieved, copy_gbs,
           digest_hex);
    fprintf(stderr, "orchid bench: %s, prompt %d: prefill %.1f tok/s (%.3f s, first token %d), decode %.2f tok/s over %d steps, "
                    "%.2f GB/s of %.2f GB/s copy, digest %s, %d round%s\n",
            model_name, P, pre_tok_s, pre_med, first_ids[mr], dec_tok_s, D, achieved, copy_gbs, digest_hex, R, R == 1 ? "" : "s");
    if (!stable) {
        fprintf(stderr, "orchid bench: the token digest or first token changed between rounds (see results.rounds)\n");
        goto out;
    }
    rc = 0;
out:
    if (jf && fclose(jf) != 0 && rc == 0) { fprintf(stderr, "orchid bench: closing %s failed\n", json_out); rc = 1; wrote = false; }
    if (!wrote) unlink(json_out); /* no half report: a report exists only when it is complete */
    cJSON_free(text);
    cJSON_Delete(root);
    session_close(s);
    engine_close(e);
    free(prompt); free(ids); free(round_ids); free(step_end); free(round_steps);
    free(pre); free(dec); free(first_ids); free(digests); free(logits);
    return rc;
}
