/* server/metrics.c — the /metrics state (see metrics.h): request counts by
 * endpoint and status, token totals (argmax-only ones too), cancellations,
 * queue/running gauges, the prefix cache's state and costs (when there is
 * one), the scheduler's steps (time in forwards and on the host around them)
 * and latency histograms (time to first token, inter-token latency, step,
 * end to end). */
#include "server/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/status.h"

#define MAX_STATUSES 16
#define NB 14

static const char *const k_ep_names[EP_COUNT] = {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                                  "/health", "/metrics", "/v1/messages",
                                                  "/v1/messages/count_tokens", "/v1/responses", "/tokenize",
                                                  "/detokenize", "other"};

struct hist {
    const double *bounds;
    long counts[NB + 1];
    double sum;
    long n;
};

static const double k_lat_bounds[NB] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
static const double k_itl_bounds[NB] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10};

static struct {
    pthread_mutex_t mu;
    int statuses[MAX_STATUSES];
    int n_statuses;
    long req[EP_COUNT][MAX_STATUSES];
    long prompt, completion, cached, cancelled, argmax, dsampled;
    long generations, hit_generations; /* finished generations; those that reused cached tokens */
    long shared_waits;                 /* requests queued for another's checkpoint of a shared prefix */
    long fwd_calls, fwd_tokens;
    long steps;                   /* scheduler steps (metrics_step) */
    double step_fwd_s, step_host_s;
    int queued, running;
    long kv_used, kv_capacity;
    struct { /* the prefix cache (metrics_prefix_cache); `on` once reported */
        int on;
        long entries, bytes, max_bytes, pooled, lookups, hits, saves, evictions, allocs, frees;
        double save_s, restore_s, alloc_s;
    } pc;
    struct hist ttft, itl, e2e, step;
} M = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void observe_locked(struct hist *h, double v);

void metrics_init(void) {
    pthread_mutex_lock(&M.mu);
    M.ttft.bounds = k_lat_bounds;
    M.e2e.bounds = k_lat_bounds;
    M.itl.bounds = k_itl_bounds;
    M.step.bounds = k_itl_bounds;
    pthread_mutex_unlock(&M.mu);
}

void metrics_request(enum metrics_endpoint ep, int status) {
    if ((int)ep < 0 || ep >= EP_COUNT) ep = EP_OTHER;
    pthread_mutex_lock(&M.mu);
    int k = 0;
    while (k < M.n_statuses && M.statuses[k] != status) k++;
    if (k == M.n_statuses && k < MAX_STATUSES) M.statuses[M.n_statuses++] = status;
    if (k < MAX_STATUSES) M.req[ep][k]++;
    pthread_mutex_unlock(&M.mu);
}

void metrics_tokens(long prompt, long completion, long cached) {
    pthread_mutex_lock(&M.mu);
    M.prompt += prompt;
    M.completion += completion;
    M.cached += cached;
    M.generations++;
    M.hit_generations += cached > 0;
    pthread_mutex_unlock(&M.mu);
}

void metrics_cancelled(void) {
    pthread_mutex_lock(&M.mu);
    M.cancelled++;
    pthread_mutex_unlock(&M.mu);
}

void metrics_shared_prefix_wait(void) {
    pthread_mutex_lock(&M.mu);
    M.shared_waits++;
    pthread_mutex_unlock(&M.mu);
}

void metrics_argmax_tokens(long n) {
    pthread_mutex_lock(&M.mu);
    M.argmax += n;
    pthread_mutex_unlock(&M.mu);
}

void metrics_device_sampled_tokens(long n) {
    pthread_mutex_lock(&M.mu);
    M.dsampled += n;
    pthread_mutex_unlock(&M.mu);
}

void metrics_forward(long calls, long tokens) {
    pthread_mutex_lock(&M.mu);
    M.fwd_calls += calls;
    M.fwd_tokens += tokens;
    pthread_mutex_unlock(&M.mu);
}

void metrics_step(double forward_s, double host_s) {
    pthread_mutex_lock(&M.mu);
    M.steps++;
    M.step_fwd_s += forward_s;
    M.step_host_s += host_s;
    observe_locked(&M.step, forward_s + host_s);
    pthread_mutex_unlock(&M.mu);
}

void metrics_queue(int queued, int running) {
    pthread_mutex_lock(&M.mu);
    M.queued = queued;
    M.running = running;
    pthread_mutex_unlock(&M.mu);
}

void metrics_kv(long used, long capacity) {
    pthread_mutex_lock(&M.mu);
    M.kv_used = used;
    M.kv_capacity = capacity;
    pthread_mutex_unlock(&M.mu);
}

void metrics_prefix_cache(const struct metrics_cache_stats *st) {
    pthread_mutex_lock(&M.mu);
    M.pc.on = 1;
    M.pc.entries = st->entries;
    M.pc.bytes = st->bytes;
    M.pc.max_bytes = st->max_bytes;
    M.pc.pooled = st->pooled;
    M.pc.lookups = st->lookups;
    M.pc.hits = st->hits;
    M.pc.saves = st->saves;
    M.pc.evictions = st->evictions;
    M.pc.allocs = st->host_allocs;
    M.pc.frees = st->host_frees;
    M.pc.save_s = st->save_s;
    M.pc.restore_s = st->restore_s;
    M.pc.alloc_s = st->host_alloc_s;
    pthread_mutex_unlock(&M.mu);
}

static void observe_locked(struct hist *h, double v) {
    if (!h->bounds) h->bounds = h == &M.itl || h == &M.step ? k_itl_bounds : k_lat_bounds;
    int b = 0;
    while (b < NB && v > h->bounds[b]) b++;
    h->counts[b]++;
    h->sum += v;
    h->n++;
}

static void observe(struct hist *h, double v) {
    pthread_mutex_lock(&M.mu);
    observe_locked(h, v);
    pthread_mutex_unlock(&M.mu);
}

void metrics_ttft(double s) { observe(&M.ttft, s); }
void metrics_itl(double s) { observe(&M.itl, s); }
void metrics_e2e(double s) { observe(&M.e2e, s); }

long metrics_get(const char *name) {
    long v = -1;
    pthread_mutex_lock(&M.mu);
    if (!strcmp(name, "cancelled")) v = M.cancelled;
    else if (!strcmp(name, "completion_tokens")) v = M.completion;
    else if (!strcmp(name, "prompt_tokens")) v = M.prompt;
    else if (!strcmp(name, "cached_tokens")) v = M.cached;
    else if (!strcmp(name, "generations")) v = M.generations;
    else if (!strcmp(name, "hit_generations")) v = M.hit_generations;
    else if (!strcmp(name, "shared_prefix_waits")) v = M.shared_waits;
    else if (!strcmp(name, "argmax_tokens")) v = M.argmax;
    else if (!strcmp(name, "device_sampled_tokens")) v = M.dsampled;
    else if (!strcmp(name, "forward_calls")) v = M.fwd_calls;
    else if (!strcmp(name, "forward_tokens")) v = M.fwd_tokens;
    else if (!strcmp(name, "steps")) v = M.steps;
    pthread_mutex_unlock(&M.mu);
    return v;
}

struct out {
    char *p;
    size_t len, cap;
    int oom;
};

static void outf(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(struct out *o, const char *fmt, ...) {
    if (o->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->oom = 1;
            return;
        }
        if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        size_t c = o->cap * 2 + (size_t)n;
        char *q = realloc(o->p, c);
        if (!q) {
            o->oom = 1;
            return;
        }
        o->p = q;
        o->cap = c;
    }
}

static void hist_out(struct out *o, const char *name, const char *help, const struct hist *h) {
    const double *bounds = h->bounds ? h->bounds : k_lat_bounds;
    outf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    long cum = 0;
    for (int b = 0; b < NB; b++) {
        cum += h->counts[b];
        outf(o, "%s_bucket{le=\"%g\"} %ld\n", name, bounds[b], cum);
    }
    cum += h->counts[NB];
    outf(o, "%s_bucket{le=\"+Inf\"} %ld\n%s_sum %.6f\n%s_count %ld\n", name, cum, name, h->sum, name, h->n);
}

int metrics_render(char **out, size_t *len) {
    struct out o = {malloc(4096), 0, 4096, 0};
    if (!o.p) return ST_NOMEM;
    o.p[0] = 0;
    pthread_mutex_lock(&M.mu);
    outf(&o, "# HELP orchid_requests_total HTTP requests by endpoint and status code.\n"
             "# TYPE orchid_requests_total counter\n");
    for (int e = 0; e < EP_COUNT; e++)
        for (int k = 0; k < M.n_statuses; k++)
            if (M.req[e][k])
                outf(&o, "orchid_requests_total{endpoint=\"%s\",status=\"%d\"} %ld\n", k_ep_names[e],
                     M.statuses[k], M.req[e][k]);
    outf(&o, "# HELP orchid_prompt_tokens_total Prompt tokens of completed generations.\n"
             "# TYPE orchid_prompt_tokens_total counter\norchid_prompt_tokens_total %ld\n", M.prompt);
    outf(&o, "# HELP orchid_completion_tokens_total Generated tokens.\n"
             "# TYPE orchid_completion_tokens_total counter\norchid_completion_tokens_total %ld\n", M.completion);
    outf(&o, "# HELP orchid_prefix_cache_hit_tokens_total Prompt tokens reused from the prefix cache.\n"
             "# TYPE orchid_prefix_cache_hit_tokens_total counter\norchid_prefix_cache_hit_tokens_total %ld\n",
         M.cached);
    outf(&o, "# HELP orchid_generations_total Finished generations (stopped or at their length).\n"
             "# TYPE orchid_generations_total counter\norchid_generations_total %ld\n", M.generations);
    outf(&o, "# HELP orchid_prefix_cache_hit_generations_total Finished generations whose prompt reused cached "
             "tokens (the slot's own session or a checkpoint); / orchid_generations_total = the hit rate.\n"
             "# TYPE orchid_prefix_cache_hit_generations_total counter\norchid_prefix_cache_hit_generations_total %ld\n",
         M.hit_generations);
    outf(&o, "# HELP orchid_prefix_cache_shared_waits_total Requests held in the queue until a running request "
             "checkpointed the prompt prefix they share (then restored instead of prefilled again).\n"
             "# TYPE orchid_prefix_cache_shared_waits_total counter\norchid_prefix_cache_shared_waits_total %ld\n",
         M.shared_waits);
    outf(&o, "# HELP orchid_argmax_only_tokens_total Generated tokens taken from the model's argmax (greedy, "
             "no logprobs or penalties) without copying their logits to the host.\n"
             "# TYPE orchid_argmax_only_tokens_total counter\norchid_argmax_only_tokens_total %ld\n", M.argmax);
    outf(&o, "# HELP orchid_device_sampled_tokens_total Generated tokens sampled on the device (temperature, "
             "top_k, top_p, min_p; no logprobs or penalties) without copying their logits to the host.\n"
             "# TYPE orchid_device_sampled_tokens_total counter\norchid_device_sampled_tokens_total %ld\n", M.dsampled);
    outf(&o, "# HELP orchid_model_forwards_total Model forward calls the scheduler issued.\n"
             "# TYPE orchid_model_forwards_total counter\norchid_model_forwards_total %ld\n", M.fwd_calls);
    outf(&o, "# HELP orchid_model_forward_tokens_total Tokens those forwards carried (prompt chunks and decode "
             "rows; tokens / forwards = the mean batch).\n"
             "# TYPE orchid_model_forward_tokens_total counter\norchid_model_forward_tokens_total %ld\n",
         M.fwd_tokens);
    outf(&o, "# HELP orchid_scheduler_steps_total Scheduler steps (one batch over every running request).\n"
             "# TYPE orchid_scheduler_steps_total counter\norchid_scheduler_steps_total %ld\n", M.steps);
    outf(&o, "# HELP orchid_scheduler_forward_seconds_total Wall time of the steps inside model forwards "
             "(host preparation and the device's work).\n# TYPE orchid_scheduler_forward_seconds_total counter\n"
             "orchid_scheduler_forward_seconds_total %.6f\n", M.step_fwd_s);
    outf(&o, "# HELP orchid_scheduler_host_seconds_total Wall time of the steps outside model forwards (admission, "
             "batching, host sampling, token hand-off, checkpoint saves): the model idles meanwhile.\n"
             "# TYPE orchid_scheduler_host_seconds_total counter\norchid_scheduler_host_seconds_total %.6f\n",
         M.step_host_s);
    outf(&o, "# HELP orchid_requests_cancelled_total Generations cancelled (client gone or shutdown).\n"
             "# TYPE orchid_requests_cancelled_total counter\norchid_requests_cancelled_total %ld\n", M.cancelled);
    outf(&o, "# HELP orchid_queue_depth Requests waiting for the scheduler.\n"
             "# TYPE orchid_queue_depth gauge\norchid_queue_depth %d\n", M.queued);
    outf(&o, "# HELP orchid_running_requests Requests being generated.\n"
             "# TYPE orchid_running_requests gauge\norchid_running_requests %d\n", M.running);
    outf(&o, "# HELP orchid_session_tokens Tokens held in sessions (KV/state in use, incl. kept prefixes).\n"
             "# TYPE orchid_session_tokens gauge\norchid_session_tokens %ld\n", M.kv_used);
    outf(&o, "# HELP orchid_session_capacity_tokens Token capacity of all sessions.\n"
             "# TYPE orchid_session_capacity_tokens gauge\norchid_session_capacity_tokens %ld\n", M.kv_capacity);
    if (M.pc.on) {
        outf(&o, "# HELP orchid_prefix_cache_entries Prefix cache checkpoints held.\n"
                 "# TYPE orchid_prefix_cache_entries gauge\norchid_prefix_cache_entries %ld\n", M.pc.entries);
        outf(&o, "# HELP orchid_prefix_cache_bytes Host bytes the prefix cache's checkpoints hold.\n"
                 "# TYPE orchid_prefix_cache_bytes gauge\norchid_prefix_cache_bytes %ld\n", M.pc.bytes);
        outf(&o, "# HELP orchid_prefix_cache_max_bytes The prefix cache's budget (checkpoints + pooled blocks).\n"
                 "# TYPE orchid_prefix_cache_max_bytes gauge\norchid_prefix_cache_max_bytes %ld\n", M.pc.max_bytes);
        outf(&o, "# HELP orchid_prefix_cache_pooled_bytes Free host blocks the prefix cache keeps for reuse.\n"
                 "# TYPE orchid_prefix_cache_pooled_bytes gauge\norchid_prefix_cache_pooled_bytes %ld\n", M.pc.pooled);
        outf(&o, "# HELP orchid_prefix_cache_lookups_total Checkpoint lookups (requests whose slot held no usable "
                 "prefix).\n# TYPE orchid_prefix_cache_lookups_total counter\norchid_prefix_cache_lookups_total %ld\n",
             M.pc.lookups);
        outf(&o, "# HELP orchid_prefix_cache_hits_total Checkpoint lookups that restored a checkpoint.\n"
                 "# TYPE orchid_prefix_cache_hits_total counter\norchid_prefix_cache_hits_total %ld\n", M.pc.hits);
        outf(&o, "# HELP orchid_prefix_cache_saves_total Checkpoints saved.\n"
                 "# TYPE orchid_prefix_cache_saves_total counter\norchid_prefix_cache_saves_total %ld\n", M.pc.saves);
        outf(&o, "# HELP orchid_prefix_cache_evictions_total Checkpoints evicted to make room.\n"
                 "# TYPE orchid_prefix_cache_evictions_total counter\norchid_prefix_cache_evictions_total %ld\n",
             M.pc.evictions);
        outf(&o, "# HELP orchid_prefix_cache_host_allocs_total Host blocks the prefix cache allocated (pinned under "
                 "CUDA), not taken from its pool.\n"
                 "# TYPE orchid_prefix_cache_host_allocs_total counter\norchid_prefix_cache_host_allocs_total %ld\n",
             M.pc.allocs);
        outf(&o, "# HELP orchid_prefix_cache_host_frees_total Host blocks the prefix cache freed.\n"
                 "# TYPE orchid_prefix_cache_host_frees_total counter\norchid_prefix_cache_host_frees_total %ld\n",
             M.pc.frees);
        outf(&o, "# HELP orchid_prefix_cache_save_seconds_total Wall time in checkpoint saves (scheduler thread).\n"
                 "# TYPE orchid_prefix_cache_save_seconds_total counter\norchid_prefix_cache_save_seconds_total %.6f\n",
             M.pc.save_s);
        outf(&o, "# HELP orchid_prefix_cache_restore_seconds_total Wall time in checkpoint restores (scheduler "
                 "thread).\n# TYPE orchid_prefix_cache_restore_seconds_total counter\n"
                 "orchid_prefix_cache_restore_seconds_total %.6f\n", M.pc.restore_s);
        outf(&o, "# HELP orchid_prefix_cache_host_alloc_seconds_total Wall time the prefix cache spent allocating and "
                 "freeing host blocks (prewarm included).\n# TYPE orchid_prefix_cache_host_alloc_seconds_total counter\n"
                 "orchid_prefix_cache_host_alloc_seconds_total %.6f\n", M.pc.alloc_s);
    }
    hist_out(&o, "orchid_time_to_first_token_seconds", "Time from request arrival to the first generated token.",
             &M.ttft);
    hist_out(&o, "orchid_inter_token_latency_seconds", "Time between consecutive generated tokens.", &M.itl);
    hist_out(&o, "orchid_scheduler_step_seconds", "Wall time of one scheduler step (forwards and host work).",
             &M.step);
    hist_out(&o, "orchid_request_duration_seconds", "Generation request duration, arrival to last token.", &M.e2e);
    pthread_mutex_unlock(&M.mu);
    if (o.oom) {
        free(o.p);
        return ST_NOMEM;
    }
    *out = o.p;
    *len = o.len;
    return ST_OK;
}
