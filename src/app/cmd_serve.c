/* app/cmd_serve.c — `orchid serve`: parses flags, starts the scheduler (which
 * loads the model in the background), binds the HTTP server before the load
 * finishes (so /health answers 503 "loading" meanwhile), then waits for
 * SIGINT/SIGTERM. Shutdown order: stop accepting, cancel queued and running
 * jobs, wait for every connection thread, close the model, exit 0. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app/commands.h"
#include "runtime/status.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/sched.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: orchid serve [--model DIR] [--host 127.0.0.1] [--port 8000] [--max-seq N]\n"
            "                    [--api-key KEY] [--max-queue N] [--parallel N] [--backend auto|cpu|cuda]\n"
            "                    [--threads N] [--max-body BYTES] [--prefix-cache-mb N | --cache-mem GiB] [--cache-interval N]\n"
            "                    [--thinking on|off] [--batch-invariant on|off] [--max-prefill-tokens N]\n"
            "                    [--prefill-chunk N] [--generation-config auto|none]\n"
            "                    [--quiet] [--mock]\n"
            "  --model DIR     checkpoint directory (default: models/tiny, made by `make run`)\n"
            "  --max-seq N     context per sequence, prompt + completion (default 8192)\n"
            "  --parallel N    sequences generated concurrently, batched in one forward per step\n"
            "                  (default 4; --max-running N is the same flag)\n"
            "  --max-queue N   requests waiting beyond those; more get 429 (default 256)\n"
            "  --prefix-cache-mb N  host memory for prefix checkpoints (default 2048; 0 = off;\n"
            "                       on CUDA pinned at start: state blocks and KV chunks)\n"
            "  --cache-mem GiB      the same budget in GiB (e.g. 0.5)\n"
            "  --cache-interval N   also checkpoint long prompts every N tokens (default 4096; 0 = never)\n"
            "  --api-key KEY   require `Authorization: Bearer KEY` or `x-api-key: KEY` (also $ORCHID_API_KEY)\n"
            "  --thinking X    default when a request does not say (default: the template's, on)\n"
            "  --batch-invariant X  on (default): a request's tokens are the bits it would get alone,\n"
            "                  whatever runs beside it (on CUDA prompt chunks then get forwards of\n"
            "                  their own); off: pack prompt chunks with decoding rows (faster\n"
            "                  prompt intake, results may differ in the last bits)\n"
            "  --max-prefill-tokens N  with --batch-invariant on, on CUDA: prompt tokens one step\n"
            "                  prefills at most over all new requests, whole 512-token chunks, oldest\n"
            "                  request first (default: one forward's worth, 4096); running streams\n"
            "                  get a token every step meanwhile; 0 = no bound (off and on the CPU a\n"
            "                  step takes --prefill-chunk prompt tokens; $ORCHID_MAX_PREFILL_TOKENS when\n"
            "                  not given)\n"
            "  --prefill-chunk N  prompt tokens a request feeds a step at most (with --batch-invariant\n"
            "                  on, on CUDA, the size of its chunks whatever runs beside it: default\n"
            "                  4096, one forward's worth; otherwise 512; $ORCHID_PREFILL_CHUNK when\n"
            "                  not given)\n"
            "  --generation-config X  auto (default): sampling fields a request leaves out take the\n"
            "                  checkpoint's generation_config.json (temperature, top_p, top_k, min_p,\n"
            "                  repetition_penalty; Qwen3.6: 1.0 / 0.95 / 20), greedy without one;\n"
            "                  none: greedy\n"
            "  --quiet         no per-request log lines\n"
            "  --mock          serve the scripted test model instead of a checkpoint (tests only)\n");
}

/* A flag of two values: *out = (v is yes); anything else is an error line and -1. */
static int parse_switch(const char *flag, const char *v, const char *yes, const char *no, bool *out) {
    if (!strcmp(v, yes) || !strcmp(v, no)) {
        *out = !strcmp(v, yes);
        return 0;
    }
    fprintf(stderr, "orchid serve: %s must be %s or %s; got '%s'\n", flag, yes, no, v);
    return -1;
}

static int parse_int(const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "orchid serve: %s must be an integer in [%ld, %ld]; got '%s'\n", flag, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* *v from the environment variable name when the flag left it unset (< 0) and the variable
 * is set; a bad value is the same error as the flag's. */
static int env_int(const char *name, long lo, long hi, long *v) {
    const char *e = getenv(name);
    if (*v >= 0 || !e || !*e) return 0;
    return parse_int(name, e, lo, hi, v);
}

int cmd_serve(int argc, char **argv) {
    const char *model = NULL, *host = "127.0.0.1", *api_key = getenv("ORCHID_API_KEY"), *backend = NULL;
    long port = 8000, max_seq = 8192, max_queue = 256, parallel = 4, threads = 0, max_body = 8L << 20;
    long cache_mb = 2048, cache_interval = 4096, max_prefill = -1, prefill_chunk = -1; /* -1: the default */
    double cache_gib = -1; /* --cache-mem, when given (the last of the two flags wins) */
    int thinking = -1;
    bool invariant = true, gen_config = true;
    bool mock = false, quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = strcmp(a, "--mock") && strcmp(a, "--quiet") && strcmp(a, "-h") && strcmp(a, "--help");
        if (takes && !v) {
            fprintf(stderr, "orchid serve: %s needs a value\n", a);
            return 2;
        }
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--mock")) mock = true;
        else if (!strcmp(a, "--quiet")) quiet = true;
        else if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--api-key")) api_key = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--port")) bad = parse_int(a, v, 0, 65535, &port);
        else if (!strcmp(a, "--max-seq")) bad = parse_int(a, v, 2, 1L << 24, &max_seq);
        else if (!strcmp(a, "--max-queue")) bad = parse_int(a, v, 1, 1L << 20, &max_queue);
        else if (!strcmp(a, "--parallel") || !strcmp(a, "--max-running")) bad = parse_int(a, v, 1, 256, &parallel);
        else if (!strcmp(a, "--threads")) bad = parse_int(a, v, 0, 4096, &threads);
        else if (!strcmp(a, "--max-body")) bad = parse_int(a, v, 1024, 1L << 30, &max_body);
        else if (!strcmp(a, "--prefix-cache-mb")) {
            bad = parse_int(a, v, 0, 1L << 24, &cache_mb);
            cache_gib = -1;
        }
        else if (!strcmp(a, "--cache-interval")) bad = parse_int(a, v, 0, 1L << 24, &cache_interval);
        else if (!strcmp(a, "--max-prefill-tokens")) bad = parse_int(a, v, 0, 1L << 24, &max_prefill);
        else if (!strcmp(a, "--prefill-chunk")) bad = parse_int(a, v, 16, 1L << 20, &prefill_chunk);
        else if (!strcmp(a, "--cache-mem")) { /* the same budget in GiB (fractions allowed) */
            char *end;
            double gib = strtod(v, &end);
            if (*end || !(gib >= 0 && gib <= 16384)) {
                fprintf(stderr, "orchid serve: --cache-mem must be a number of GiB in 0..16384, got \"%s\"\n", v);
                return 2;
            }
            cache_gib = gib; /* bytes, not whole MiB: 0.0006 is 629 KiB, not 0 (off) */
        }
        else if (!strcmp(a, "--batch-invariant")) bad = parse_switch(a, v, "on", "off", &invariant);
        else if (!strcmp(a, "--generation-config")) bad = parse_switch(a, v, "auto", "none", &gen_config);
        else if (!strcmp(a, "--thinking")) {
            bool on = false;
            bad = parse_switch(a, v, "on", "off", &on);
            thinking = on ? 1 : 0;
        } else {
            fprintf(stderr, "orchid serve: unknown flag '%s' (see --help)\n", a);
            return 2;
        }
        if (bad) return 2;
        if (takes) i++;
    }
    if (!model) model = "models/tiny";
    /* the flags' values from the environment when not given (A/B runs: arms differ by env) */
    if (env_int("ORCHID_MAX_PREFILL_TOKENS", 0, 1L << 24, &max_prefill) ||
        env_int("ORCHID_PREFILL_CHUNK", 16, 1L << 20, &prefill_chunk))
        return 2;
    if (prefill_chunk < 0) prefill_chunk = 0; /* the scheduler's default (sched.h) */

    /* Every thread inherits this mask; the main thread takes the signals with sigwait. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    metrics_init();
    char err[1024];
    struct sched_options so = {0};
    so.parallel = (int)parallel;
    so.max_queue = (int)max_queue;
    so.max_seq = (int)max_seq;
    so.prefill_chunk = (int)prefill_chunk;
    so.max_step_prompt = max_prefill < 0 ? 0 : max_prefill == 0 ? -1 : (int)max_prefill; /* sched.h's 0 / < 0 */
    so.cache_interval = (int)cache_interval;
    so.batch_invariant = invariant;
    so.open = mock ? port_open_mock : port_open_engine;
    so.port.model_dir = model;
    so.port.backend = backend;
    so.port.threads = (int)threads;
    so.port.no_generation_config = !gen_config;
    so.port.cache_bytes = cache_gib >= 0 ? (size_t)(cache_gib * (double)(1u << 30)) : (size_t)cache_mb << 20;
    struct sched *sched;
    if (sched_start(&sched, &so, err, sizeof err)) {
        fprintf(stderr, "orchid serve: %s\n", err);
        return 2;
    }
    struct http_options ho = {0};
    ho.host = host;
    ho.port = (int)port;
    ho.api_key = api_key;
    ho.max_body = (size_t)max_body;
    ho.default_thinking = thinking;
    ho.log_requests = !quiet;
    struct http_server *http;
    if (http_start(&http, &ho, sched, err, sizeof err)) {
        fprintf(stderr, "orchid serve: %s\n", err);
        sched_free(sched);
        return 1;
    }
    fprintf(stderr, "orchid: listening on http://%s:%d (loading %s)\n", host, http_port(http),
            mock ? "the mock model" : model);

    int rc = 0;
    bool announced = false;
    for (;;) {
        struct timespec ts = {0, 200 * 1000000L};
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig == SIGINT || sig == SIGTERM) {
            fprintf(stderr, "orchid: %s received, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
            break;
        }
        enum sched_state st = sched_state(sched, err, sizeof err);
        if (st == SCHED_FAILED) {
            fprintf(stderr, "orchid serve: %s\n", err);
            rc = 1;
            break;
        }
        if (st == SCHED_READY && !announced) {
            const struct model_port *p = sched_port(sched);
            fprintf(stderr, "orchid: serving %s on http://%s:%d (%s; max_seq %d, parallel %ld)\n",
                    p ? p->model_id : "?", host, http_port(http), p ? p->description : "", sched_max_seq(sched),
                    parallel);
            announced = true;
        }
    }
    http_quiesce(http);
    sched_shutdown(sched);
    http_stop(http);
    sched_free(sched);
    if (rc == 0) fprintf(stderr, "orchid: stopped\n");
    return rc;
}
