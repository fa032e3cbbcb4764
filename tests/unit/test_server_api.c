/* tests/unit/test_server_api.c — request validation and the scheduler, with
 * the scripted mock model (no HTTP): field errors name their param, sampling
 * fields land in the sampler params, prompts are rendered/encoded and checked
 * against the context; then jobs run through a live scheduler thread
 * (script output, stop strings, max_tokens, cancellation, prefix cache,
 * queue-full), which also puts the scheduler under ASan/UBSan in `make asan`. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "runtime/status.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server/sched.h"

#define MODEL "Qwen3.6-35B-A3B"

static int parse(enum api_kind k, const char *body, struct api_request *r, struct api_error *e) {
    return api_parse(k, body, strlen(body), MODEL, 264, -1, NULL, r, e);
}

static void expect_bad_kind(enum api_kind kind, const char *body, int status, const char *param) {
    struct api_request r;
    struct api_error e;
    int rc = parse(kind, body, &r, &e);
    CHECK(rc == status, "%s: status %d want %d (%s)", body, rc, status, e.message);
    if (param) CHECK(strcmp(e.param, param) == 0, "%s: param '%s' want '%s'", body, e.param, param);
    api_request_free(&r);
}

static void expect_bad(const char *body, int status, const char *param) { expect_bad_kind(API_CHAT, body, status, param); }

/* Waits for a job to finish; returns its final text (static buffer). */
static const char *run_job(struct job *j) {
    static char out[4096];
    pthread_mutex_lock(&j->mu);
    while (!j->done) pthread_cond_wait(&j->cv, &j->mu);
    size_t n = j->tx.released < sizeof out - 1 ? j->tx.released : sizeof out - 1;
    memcpy(out, j->tx.buf ? j->tx.buf : "", n);
    out[n] = 0;
    pthread_mutex_unlock(&j->mu);
    return out;
}

static struct job *make_job(const struct model_port *p, const char *text, int max_tokens) {
    int32_t *ids;
    size_t n;
    char err[128];
    if (p->encode(p->ctx, text, strlen(text), &ids, &n, err, sizeof err)) return NULL;
    struct job *j = job_new(ids, (int)n);
    j->max_tokens = max_tokens;
    return j;
}

/* sched_plan_invariant on a hand-made batch: n_tokens of each entry, slots 0..nb-1;
 * want = the expected order of slots, then the expected forward sizes (entry counts). */
static void check_plan(const char *name, const int *ntok, int nb, int inv, int max_tokens, const int *want_slot,
                       const int *want_group, int want_ng) {
    struct batch_seq b[16];
    int slot[16], group[16];
    for (int i = 0; i < nb; i++) {
        b[i] = (struct batch_seq){.n_tokens = ntok[i]};
        slot[i] = i;
    }
    const int ng = sched_plan_invariant(b, slot, nb, inv, max_tokens, group);
    CHECK(ng == want_ng, "%s: %d forwards, want %d", name, ng, want_ng);
    for (int i = 0; i < nb; i++) {
        CHECK(slot[i] == want_slot[i], "%s: entry %d is slot %d, want %d", name, i, slot[i], want_slot[i]);
        CHECK(b[i].n_tokens == ntok[slot[i]], "%s: entry %d moved without its slot", name, i);
    }
    for (int g = 0; g < ng && g < want_ng; g++)
        CHECK(group[g] == want_group[g], "%s: forward %d has %d entries, want %d", name, g, group[g], want_group[g]);
}

static void test_plan_invariant(void) {
    /* decode rows first (3, at most 4 a forward; then 5 at most 2), then long chunks
     * packed within 100 tokens, the short chunk (4 <= inv) alone, last */
    const int a[] = {1, 1, 1, 40, 4, 50, 30, 60};
    check_plan("mixed", a, 8, 4, 100, (const int[]){0, 1, 2, 3, 5, 6, 7, 4}, (const int[]){3, 2, 2, 1}, 4);
    const int a2[] = {1, 1, 1, 1, 1, 3};
    check_plan("rows", a2, 6, 2, 100, (const int[]){0, 1, 2, 3, 4, 5}, (const int[]){2, 2, 1, 1}, 4);
    /* unbounded packs; a one-token prompt chunk rides with the decode rows */
    const int c[] = {30, 1, 20, 10};
    check_plan("unbounded", c, 4, 4, 0, (const int[]){1, 0, 2, 3}, (const int[]){1, 3}, 2);
    /* a chunk over the bound goes alone; nothing else is dropped */
    const int d[] = {200, 40, 70};
    check_plan("over the bound", d, 3, 4, 100, (const int[]){0, 1, 2}, (const int[]){1, 1, 1}, 3);
    const int e[] = {1};
    check_plan("one row", e, 1, 4, 100, (const int[]){0}, (const int[]){1}, 1);
    check_plan("empty", e, 0, 4, 100, (const int[]){0}, (const int[]){0}, 0);
}

int main(void) {
    test_plan_invariant();
    struct api_request r;
    struct api_error e;

    /* ---- parsing ---- */
    int rc = parse(API_CHAT,
                   "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                   "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.1,\"seed\":42,"
                   "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.2,"
                   "\"stop\":[\"a\",\"\",\"bc\"],\"max_completion_tokens\":7,\"stream\":true,"
                   "\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":3,"
                   "\"reasoning_effort\":\"none\",\"user\":\"u\",\"some_future_field\":{\"x\":1}}",
                   &r, &e);
    CHECK(rc == 0, "valid request: %s", e.message);
    CHECK(r.sp.temperature == 0.5f && r.sp.top_p == 0.9f && r.sp.top_k == 40 && r.sp.min_p == 0.1f, "sampling");
    CHECK(r.sp.has_seed && r.sp.seed == 42, "seed");
    CHECK(r.sp.presence_penalty == 0.5f && r.sp.frequency_penalty == -0.5f && r.sp.repetition_penalty == 1.2f,
          "penalties");
    CHECK(r.n_stops == 2 && !strcmp(r.stops[1], "bc"), "stops (empty dropped)");
    CHECK(r.max_tokens == 7 && r.stream && r.include_usage, "max/stream");
    CHECK(r.sp.logprobs && r.sp.top_logprobs == 3, "logprobs");
    CHECK(r.enable_thinking == 0, "reasoning_effort none");
    api_request_free(&r);
    /* a uint64 seed past INT64_MAX: accepted as is (was an undefined double -> long long cast; fuzz_chat) */
    rc = parse(API_CHAT, "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                         "\"seed\":10248191152060862000}", &r, &e);
    CHECK(rc == 0 && r.sp.has_seed && r.sp.seed == 10248191152060862464ull, "uint64 seed: %s", e.message);
    api_request_free(&r);
    rc = parse(API_CHAT, "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                         "\"seed\":-5}", &r, &e);
    CHECK(rc == 0 && r.sp.seed == (uint64_t)-5, "negative seed");
    CHECK(!r.ignore_eos, "ignore_eos defaults to false");
    api_request_free(&r);
    /* ignore_eos (vLLM's extension, used by bench/serve_load.py) */
    rc = parse(API_COMPLETION, "{\"model\":\"" MODEL "\",\"prompt\":[1,2,3],\"ignore_eos\":true}", &r, &e);
    CHECK(rc == 0 && r.ignore_eos, "ignore_eos: %s", e.message);
    api_request_free(&r);
    expect_bad("{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"ignore_eos\":1}", 400,
               "ignore_eos");

    /* a batch of prompts: each index takes its own, every one is validated, an index past it is a 400 */
    {
        const char *body = "{\"model\":\"" MODEL "\",\"prompt\":[[1,2],[3,4,5]],\"echo\":true,\"max_tokens\":0}";
        rc = api_parse_at(API_COMPLETION, body, strlen(body), MODEL, 264, -1, NULL, 1, &r, &e);
        CHECK(rc == 0 && r.n_prompts == 2 && r.prompt_index == 1 && r.n_prompt_ids == 3 && r.prompt_ids[0] == 3 &&
                  r.echo_prompt && r.max_tokens == 0,
              "batch prompt 1: rc %d n %d ids %d: %s", rc, r.n_prompts, r.n_prompt_ids, e.message);
        api_request_free(&r);
        rc = api_parse_at(API_COMPLETION, body, strlen(body), MODEL, 264, -1, NULL, 2, &r, &e);
        CHECK(rc == 400 && !strcmp(e.param, "prompt"), "batch index past the prompts: rc %d", rc);
        api_request_free(&r);
        const char *strs = "{\"model\":\"" MODEL "\",\"prompt\":[\"a\",\"bc\"]}";
        rc = api_parse_at(API_COMPLETION, strs, strlen(strs), MODEL, 264, -1, NULL, 0, &r, &e);
        CHECK(rc == 0 && r.n_prompts == 2 && r.prompt_len == 1 && r.max_tokens == 16, "string batch: %s", e.message);
        api_request_free(&r);
        /* prompt 1 is bad: refused whichever index is parsed */
        const char *bad = "{\"model\":\"" MODEL "\",\"prompt\":[[1,2],[3,264]]}";
        rc = api_parse_at(API_COMPLETION, bad, strlen(bad), MODEL, 264, -1, NULL, 0, &r, &e);
        CHECK(rc == 400 && !strcmp(e.param, "prompt"), "a bad later prompt: rc %d", rc);
        api_request_free(&r);
        expect_bad_kind(API_COMPLETION, "{\"model\":\"" MODEL "\",\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens");
        expect_bad_kind(API_COMPLETION, "{\"model\":\"" MODEL "\",\"prompt\":[\"x\",[1]]}", 400, "prompt");
        expect_bad_kind(API_COMPLETION, "{\"model\":\"" MODEL "\",\"prompt\":[]}", 400, "prompt");
    }

    /* logit_bias: token-id keys (a token named twice keeps the last value), numbers in [-100, 100] */
    rc = parse(API_COMPLETION, "{\"model\":\"" MODEL "\",\"prompt\":[1],"
                               "\"logit_bias\":{\"65\":100,\"263\":-100,\"7\":0.5,\"007\":-2.25,\"0\":0}}", &r, &e);
    CHECK(rc == 0 && r.sp.n_logit_bias == 4, "logit_bias: rc %d n %d: %s", rc, r.sp.n_logit_bias, e.message);
    CHECK(r.sp.logit_bias[0].token == 65 && r.sp.logit_bias[0].bias == 100.0f && r.sp.logit_bias[1].token == 263 &&
              r.sp.logit_bias[1].bias == -100.0f && r.sp.logit_bias[2].token == 7 && r.sp.logit_bias[2].bias == -2.25f &&
              r.sp.logit_bias[3].token == 0 && r.sp.logit_bias[3].bias == 0.0f,
          "logit_bias entries");
    api_request_free(&r);
    rc = parse(API_CHAT, "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                         "\"logit_bias\":{}}", &r, &e);
    CHECK(rc == 0 && r.sp.n_logit_bias == 0, "empty logit_bias: %s", e.message);
    api_request_free(&r);
    rc = parse(API_CHAT, "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                         "\"logit_bias\":null}", &r, &e);
    CHECK(rc == 0 && r.sp.n_logit_bias == 0, "null logit_bias: %s", e.message);
    api_request_free(&r);
    {
        const char *bad[] = {"[]", "{\"264\":1}", "{\"-1\":1}", "{\"1.0\":1}", "{\"\":1}", "{\" 5\":1}",
                             "{\"abc\":1}", "{\"99999999999999999999\":1}", "{\"5\":100.5}", "{\"5\":-101}",
                             "{\"5\":\"1\"}", "{\"5\":null}", "{\"5\":true}", "{\"5\":[1]}", "1"};
        char body[512];
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            snprintf(body, sizeof body, "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                        "\"logit_bias\":%s}", bad[i]);
            expect_bad(body, 400, "logit_bias");
        }
        /* more than SAMPLER_MAX_LOGIT_BIAS entries (the vocabulary is 264: repeat ids with leading zeros) */
        char big[8192];
        size_t o = (size_t)snprintf(big, sizeof big, "{\"model\":\"" MODEL "\",\"prompt\":[1],\"logit_bias\":{"), o300 = 0;
        for (int i = 0; i <= SAMPLER_MAX_LOGIT_BIAS; i++) {
            if (i == SAMPLER_MAX_LOGIT_BIAS) o300 = o;
            o += (size_t)snprintf(big + o, sizeof big - o, "%s\"%s%d\":1", i ? "," : "", i >= 200 ? "0" : "", i % 200);
        }
        snprintf(big + o, sizeof big - o, "}}");
        rc = parse(API_COMPLETION, big, &r, &e);
        CHECK(rc == 400 && !strcmp(e.param, "logit_bias") && strstr(e.message, "at most 300"), "301 entries: %d %s", rc,
              e.message);
        api_request_free(&r);
        snprintf(big + o300, sizeof big - o300, "}}"); /* without the last entry: exactly 300 */
        rc = parse(API_COMPLETION, big, &r, &e);
        CHECK(rc == 0 && r.sp.n_logit_bias == 200, "300 entries (200 distinct ids): %d %s n %d", rc, e.message,
              r.sp.n_logit_bias);
        api_request_free(&r);
    }

    expect_bad("{", 400, "");
    expect_bad("{\"model\":\"" MODEL "\"} x", 400, "");
    expect_bad("{\"model\":\"other\",\"messages\":[]}", 404, "model");
    expect_bad("{\"model\":\"" MODEL "\",\"messages\":[]}", 400, "messages");
    expect_bad("{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":1}]}", 400,
               "messages[0].content");
    expect_bad("{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":3}",
               400, "temperature");
    expect_bad("{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":17}", 400, "n");
    expect_bad("{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":0}", 400, "n");
    expect_bad("{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400,
               "max_tokens");
    expect_bad("{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
               "\"tool_choice\":\"required\"}",
               400, "tool_choice");

    struct api_error ee;
    api_error_set(&ee, 400, NULL, "temperature", NULL, "bad \"quote\"");
    char *js = api_error_json(&ee);
    CHECK(js && !strcmp(js, "{\"error\":{\"message\":\"bad \\\"quote\\\"\",\"type\":\"invalid_request_error\","
                            "\"param\":\"temperature\",\"code\":null}}"),
          "error json: %s", js);
    free(js);

    /* ---- scheduler with the mock model ---- */
    metrics_init();
    setenv("ORCHID_MOCK_STEP_MS", "1", 1); /* read once, at load */
    struct sched_options so = {0};
    so.parallel = 2;
    so.max_queue = 2;
    so.max_seq = 256;
    so.prefill_chunk = 16;
    so.open = port_open_mock;
    struct sched *S;
    char err[256];
    CHECK(sched_start(&S, &so, err, sizeof err) == 0, "%s", err);
    CHECK(sched_wait_loaded(S, err, sizeof err) == SCHED_READY, "load: %s", err);
    const struct model_port *p = sched_port(S);

    /* prompt preparation + context check */
    rc = parse(API_CHAT, "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"SCRIPT:hi\"}],"
                         "\"max_tokens\":500}", &r, &e);
    int32_t *ids;
    int n_ids;
    char *forced;
    bool reasoning;
    rc = api_prepare_prompt(&r, p, 256, &ids, &n_ids, &forced, &reasoning, &e);
    CHECK(rc == 400 && !strcmp(e.code, "context_length_exceeded") && strstr(e.message, "256") &&
              strstr(e.message, "500"),
          "context: %s", e.message);
    api_request_free(&r);
    rc = parse(API_CHAT, "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"SCRIPT:hi\"}]}", &r,
               &e);
    rc = api_prepare_prompt(&r, p, 256, &ids, &n_ids, &forced, &reasoning, &e);
    CHECK(rc == 0 && reasoning && r.max_tokens == 256 - n_ids, "default max_tokens fills the context");
    free(ids);
    free(forced);
    api_request_free(&r);
    /* a forced tool-call prefix is not returned (leaked) when the context check fails (fuzz_http) */
    rc = parse(API_CHAT, "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\","
                         "\"max_tokens\":500}", &r, &e);
    forced = (char *)"not set";
    rc = api_prepare_prompt(&r, p, 256, &ids, &n_ids, &forced, &reasoning, &e);
    CHECK(rc == 400 && forced == NULL && ids == NULL, "refused prompt returns no forced prefix (rc %d)", rc);
    api_request_free(&r);

    /* script, long prompt (several prefill chunks) */
    const long steps0 = metrics_get("steps");
    struct job *j = make_job(p, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxSCRIPT:hello there<|im_end|>", 50);
    CHECK(sched_submit(S, j) == 0, "submit");
    CHECK(!strcmp(run_job(j), "hello there") && j->finish == FIN_STOP && j->n_gen == 12, "script: '%s' %d",
          run_job(j), j->n_gen);
    const int prompt_steps = (j->n_prompt - j->cached + so.prefill_chunk - 1) / so.prefill_chunk;
    job_release(j);
    /* a step a prompt chunk of 16 tokens (the last one also gives the first token), then a
     * step a further token: each counted once, its time split forward / host. A step is
     * recorded at its end, after its tokens were handed over: the job can be done a moment
     * before its last step is counted, so wait for it (bounded) */
    long steps = metrics_get("steps") - steps0;
    for (int k = 0; k < 2000 && steps < prompt_steps + 11; k++) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
        steps = metrics_get("steps") - steps0;
    }
    CHECK(steps == prompt_steps + 11, "steps of a 12-token job: %ld (prompt chunks %d)", steps, prompt_steps);
    {
        char *txt = NULL;
        size_t tlen = 0;
        CHECK(metrics_render(&txt, &tlen) == 0, "metrics render");
        char want[96];
        snprintf(want, sizeof want, "orchid_scheduler_steps_total %ld\n", metrics_get("steps"));
        CHECK(txt && strstr(txt, want), "steps in /metrics");
        snprintf(want, sizeof want, "orchid_scheduler_step_seconds_count %ld\n", metrics_get("steps"));
        CHECK(txt && strstr(txt, want), "step histogram counts every step");
        const char *f = txt ? strstr(txt, "\norchid_scheduler_forward_seconds_total ") : NULL;
        const char *h = txt ? strstr(txt, "\norchid_scheduler_host_seconds_total ") : NULL;
        /* the mock's forward sleeps ORCHID_MOCK_STEP_MS (1 ms here) a call */
        CHECK(f && h && atof(strchr(f + 1, ' ')) >= 0.001 * (double)steps && atof(strchr(h + 1, ' ')) >= 0.0,
              "forward / host seconds: %.40s / %.40s", f ? f + 1 : "-", h ? h + 1 : "-");
        free(txt);
    }

    /* stop string + max_tokens */
    j = make_job(p, "SCRIPT:one two three<|im_end|>", 50);
    job_add_stop(j, "two", 3);
    sched_submit(S, j);
    CHECK(!strcmp(run_job(j), "one ") && j->finish == FIN_STOP, "stop string");
    job_release(j);
    j = make_job(p, "SCRIPT:abcdef<|im_end|>", 3);
    sched_submit(S, j);
    CHECK(!strcmp(run_job(j), "abc") && j->finish == FIN_LENGTH, "max_tokens");
    job_release(j);

    /* prefix cache: the session holding exactly this prompt is reused */
    j = make_job(p, "SCRIPT:q<|im_end|>", 1);
    sched_submit(S, j);
    run_job(j);
    int n1 = j->n_prompt;
    job_release(j);
    j = make_job(p, "SCRIPT:q<|im_end|>more", 2);
    sched_submit(S, j);
    run_job(j);
    CHECK(j->cached == n1, "cached %d want %d", j->cached, n1);
    job_release(j);

    /* cancellation of running jobs; queue full */
    struct job *run[4];
    for (int i = 0; i < 4; i++) run[i] = make_job(p, "noise", 200);
    for (int i = 0; i < 2; i++) CHECK(sched_submit(S, run[i]) == 0, "submit %d", i);
    for (int i = 0; i < 2; i++) { /* wait until both run */
        for (int k = 0; k < 2000; k++) {
            pthread_mutex_lock(&run[i]->mu);
            int g = run[i]->n_gen;
            pthread_mutex_unlock(&run[i]->mu);
            if (g > 0) break;
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    for (int i = 2; i < 4; i++) CHECK(sched_submit(S, run[i]) == 0, "queue %d", i);
    struct job *extra = make_job(p, "noise", 5);
    CHECK(sched_submit(S, extra) == ST_RANGE, "queue full");
    job_release(extra);
    for (int i = 0; i < 4; i++) atomic_store(&run[i]->cancel, 1);
    for (int i = 0; i < 4; i++) {
        run_job(run[i]);
        CHECK(run[i]->finish == FIN_CANCELLED, "cancelled %d: %d", i, run[i]->finish);
        CHECK(i >= 2 || run[i]->n_gen < 200, "stopped early %d", i);
        job_release(run[i]);
    }
    CHECK(metrics_get("cancelled") == 4, "cancel counted: %ld", metrics_get("cancelled"));

    /* shutdown with a job in flight */
    j = make_job(p, "noise", 200);
    sched_submit(S, j);
    sched_shutdown(S);
    run_job(j);
    CHECK(j->done, "done after shutdown");
    job_release(j);
    j = make_job(p, "x", 1);
    CHECK(sched_submit(S, j) == ST_UNSUPPORTED, "refused after shutdown");
    job_release(j);
    sched_free(S);

    /* batch invariance on a backend that has it only for some batches (the mock enforces
     * CUDA's kind: at most 2 one-token rows a forward, chunks of 2 tokens alone, longer
     * chunks packed within 40 tokens): with it asked for, every job runs its script
     * whatever runs beside it; without, the mixed batches break the contract (the mock
     * fails them), so the split above is what kept them whole */
    setenv("ORCHID_MOCK_INVARIANT_TOKENS", "2", 1);
    setenv("ORCHID_MOCK_MAX_BATCH_TOKENS", "40", 1);
    for (int inv = 1; inv >= 0; inv--) {
        so.parallel = 5;
        so.max_queue = 8;
        so.batch_invariant = inv;
        CHECK(sched_start(&S, &so, err, sizeof err) == 0, "%s", err);
        CHECK(sched_wait_loaded(S, err, sizeof err) == SCHED_READY, "load: %s", err);
        p = sched_port(S);
        CHECK(p->invariant_tokens == 2, "mock reports invariant_tokens %d", p->invariant_tokens);
        static const char *texts[5] = {"SCRIPT:alpha<|im_end|>", "yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyySCRIPT:beta gamma<|im_end|>",
                                       "SCRIPT:d<|im_end|>", "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzSCRIPT:epsilon<|im_end|>",
                                       "SCRIPT:zeta eta<|im_end|>"};
        static const char *want[5] = {"alpha", "beta gamma", "d", "epsilon", "zeta eta"};
        struct job *jobs[5];
        for (int i = 0; i < 5; i++) {
            jobs[i] = make_job(p, texts[i], 40);
            CHECK(sched_submit(S, jobs[i]) == 0, "submit %d", i);
        }
        int ok = 0, failed = 0;
        for (int i = 0; i < 5; i++) {
            const char *out = run_job(jobs[i]);
            ok += jobs[i]->finish == FIN_STOP && !strcmp(out, want[i]);
            failed += jobs[i]->finish == FIN_ERROR;
            job_release(jobs[i]);
        }
        if (inv) CHECK(ok == 5, "batch-invariant scheduling: %d of 5 scripts whole (%d failed)", ok, failed);
        else CHECK(failed > 0, "packed scheduling should break the mock's contract (%d of 5 whole)", ok);
        sched_shutdown(S);
        sched_free(S);
    }
    /* a burst of prompts beside a running stream (same mock contract): with the step's
     * prompt tokens bounded (default: one forward's worth, 40 here, so two 16-token chunks
     * a step) the running job gets a token every step while the burst's 20 chunks take ten
     * steps, and the burst's first tokens come oldest request first; unbounded, all five
     * prompts' chunks share each step and the running job waits through their forwards */
    setenv("ORCHID_MOCK_STEP_MS", "4", 1);
    int gained[2] = {0, 0};
    for (int bounded = 1; bounded >= 0; bounded--) {
        so.parallel = 6;
        so.max_queue = 8;
        so.batch_invariant = true;
        so.max_step_prompt = bounded ? 0 : -1;
        CHECK(sched_start(&S, &so, err, sizeof err) == 0, "%s", err);
        CHECK(sched_wait_loaded(S, err, sizeof err) == SCHED_READY, "load: %s", err);
        p = sched_port(S);
        struct job *run = make_job(p, "noise", 1000), *burst[5];
        CHECK(sched_submit(S, run) == 0, "submit the running job");
        for (int k = 0; k < 5000; k++) {
            pthread_mutex_lock(&run->mu);
            const int g = run->n_gen;
            pthread_mutex_unlock(&run->mu);
            if (g > 0) break;
            struct timespec ts = {0, 200000L};
            nanosleep(&ts, NULL);
        }
        static const char *btexts[5] = {
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaSCRIPT:one<|im_end|>",
            "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbSCRIPT:two<|im_end|>",
            "ccccccccccccccccccccccccccccccccccccccccccccccccccccSCRIPT:six<|im_end|>",
            "ddddddddddddddddddddddddddddddddddddddddddddddddddddSCRIPT:ten<|im_end|>",
            "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeSCRIPT:won<|im_end|>"};
        pthread_mutex_lock(&run->mu);
        const int g0 = run->n_gen;
        pthread_mutex_unlock(&run->mu);
        for (int i = 0; i < 5; i++) {
            burst[i] = make_job(p, btexts[i], 1);
            CHECK(sched_submit(S, burst[i]) == 0, "submit burst %d", i);
        }
        for (int i = 0; i < 5; i++) run_job(burst[i]); /* one token each: done at its first token */
        pthread_mutex_lock(&run->mu);
        gained[bounded] = run->n_gen - g0;
        pthread_mutex_unlock(&run->mu);
        int whole = 0, in_order = 1;
        for (int i = 0; i < 5; i++) {
            whole += burst[i]->finish == FIN_LENGTH && burst[i]->n_prompt > 48;
            /* two jobs finishing their prompts in one step get their tokens microseconds
             * apart, in batch order: out of order means a step (>= 4 ms) later */
            if (i && burst[i]->t_first + 0.002 < burst[i - 1]->t_first) in_order = 0;
        }
        CHECK(whole == 5, "burst (%s): %d of 5 prompts of 4 chunks done", bounded ? "bounded" : "unbounded", whole);
        if (bounded) CHECK(in_order, "bounded burst: first tokens oldest request first (%.4f %.4f %.4f %.4f %.4f)", burst[0]->t_first, burst[1]->t_first, burst[2]->t_first, burst[3]->t_first, burst[4]->t_first);
        atomic_store(&run->cancel, 1);
        run_job(run);
        for (int i = 0; i < 5; i++) job_release(burst[i]);
        job_release(run);
        sched_shutdown(S);
        sched_free(S);
    }
    CHECK(gained[1] >= 9, "bounded: the running job got %d tokens during the burst's ten steps", gained[1]);
    CHECK(gained[0] <= gained[1] - 3, "unbounded: the running job got %d tokens during the burst (bounded %d)", gained[0],
          gained[1]);
    so.max_step_prompt = 0;
    setenv("ORCHID_MOCK_STEP_MS", "1", 1);
    unsetenv("ORCHID_MOCK_INVARIANT_TOKENS");
    unsetenv("ORCHID_MOCK_MAX_BATCH_TOKENS");
    return check_summary();
}
