/* server/sched.c — the scheduler thread and the job object (see sched.h for
 * the threading and ownership rules). Everything the token loop touches is
 * allocated at admission (sampler, text buffer, logprob records) or at start
 * (sessions, logits rows, the batch array); the loop itself does not allocate
 * except for the amortised doubling of a job's text buffer.
 *
 * A job whose sampler would pick exactly the argmax (greedy, no logprobs, no
 * penalties, no logit_bias: sampler_argmax_only) asks the forward for the argmax alone, so no
 * logits row is copied to the host and nothing is sampled there; the token is the
 * one sampler_sample would have chosen. ORCHID_NO_DEVICE_ARGMAX=1 (read once at
 * start) turns this off: every token then comes from a host-sampled logits row.
 * A job that samples without penalties, logit_bias or logprobs (sampler_device_row) on a
 * model with a device sampler (port.device_sampling) has its token drawn where the logits
 * are (model/device_sampling.h): one id comes back, as for greedy, and no host thread
 * samples. ORCHID_NO_DEVICE_SAMPLING=1 (read once at start) samples those on the host.
 *
 * Batch-invariant mode on a backend with partial invariance (CUDA) packs the prompt
 * chunks of more than invariant_tokens tokens of one step into shared forwards
 * (sched_plan_invariant): a 512-token chunk alone leaves the prefill GEMMs and the
 * sequential GDN scan mostly idle. ORCHID_NO_PREFILL_PACK=1 (read once at start) gives
 * every chunk its own forward again (A/B measurements). In that mode a chunk keeps its
 * alone size (so its bits), so a step's prompt tokens are bounded by taking whole chunks,
 * oldest request first, up to max_step_prompt (default one forward's worth): 64 prompts
 * arriving at once were eight packed forwards in one step (~0.9 s on the H200), every
 * running stream waiting through all of them for its next token.
 *
 * ORCHID_NO_SHARED_PREFIX_WAIT=1 (read once at start) admits a request at once even while
 * a running one is about to checkpoint the prompt prefix they share
 * (wait_for_shared_prefix; A/B). */
#include "server/sched.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/env.h"
#include "runtime/status.h"
#include "runtime/threadpool.h"
#include "runtime/timing.h"
#include "server/constraint.h"
#include "server/metrics.h"

struct slot {
    session *s;
    float *logits;
    struct job *job;
    uint64_t last_used;
    int32_t argmax;           /* this step's argmax (or device-drawn token) when only it was asked for */
    struct row_sampling rs;   /* this step's device sampling request (want_token) */
    struct sample_result res; /* this step's token */
    bool lp_last;             /* this step's chunk of a prompt_logprobs job ends its prompt and
                                 its last row is sampled (copied into logits first) */
};

/* One prompt row whose logits give prompt token p's logprob (prompt_logprobs jobs). */
struct lp_item {
    struct job *j;
    int row; /* in j->lp_rows */
    int p;   /* the prompt token it scores */
};

struct sched {
    struct sched_options opt;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* work arrived / stop / state change */
    enum sched_state state;
    char load_err[512];
    bool stopping, joined;
    struct model_port port;
    bool port_open;
    struct out_vocab *out_vocab; /* the vocabulary's table for constrained output (constraint.h) */

    /* pending queue: ring of max_queue */
    struct job **q, **tmp;
    int q_head, q_len;
    atomic_int n_running, n_queued;

    struct slot *slots;
    int n_slots;
    uint64_t clock;
    struct batch_seq *batch;
    int *batch_slot;
    threadpool *pool;            /* samples the running sequences in parallel */
    int *samp_slot;              /* [n_slots] slots to sample on the host this step */
    int *prompt_slot;            /* [n_slots] slots feeding prompt tokens this step, oldest job first */
    int *group_len;              /* [n_slots] entries of each batch-invariant forward this step */
    struct pending_save *saves;  /* [n_slots] checkpoints this step owes, taken after its tokens */
    struct lp_item *lp_items;    /* [n_slots × SCHED_PROMPT_LP_ROWS] prompt rows to score this step */
    bool device_argmax;          /* argmax-only rows for plain greedy jobs (see the top) */
    bool device_sampling;        /* device-drawn tokens for plain sampling jobs (see the top) */
    bool pack_prompts;           /* batch-invariant mode packs long prompt chunks (see the top) */
    bool split;                  /* batch invariance asked for on a partially invariant backend (CUDA) */
    int step_prompt;             /* that mode's prompt tokens a step at most (0: no bound) */
    int chunk;                   /* prompt tokens a job feeds a step at most (opt.prefill_chunk resolved) */
    bool shared_wait;            /* queued jobs wait for a running job's checkpoint of a shared prefix */
};

/* A checkpoint a step's forward made due (its slot and the job it ran for): saved after the
 * step hands its tokens over, so a prompt's first token is not held back by the copy of its
 * state to the host (and, the first times, the pinned buffers' allocation). The session
 * does not change between the forward and the save: nothing is fed until the next step. */
struct pending_save {
    int slot;
    const struct job *job;
};

static void sample_item(void *ctx, int i) {
    struct sched *S = ctx;
    struct slot *sl = &S->slots[S->samp_slot[i]];
    sampler_sample(sl->job->smp, sl->logits, &sl->res);
}

/* A token's record from its sample result, or a prompt token's from the model's score of
 * the row before it (the text span left to the caller). */
static void rec_set(struct tok_rec *rec, const struct sample_result *r) {
    rec->id = r->token;
    rec->logprob = r->logprob;
    rec->n_top = r->n_top;
    memcpy(rec->top_ids, r->top_ids, (size_t)r->n_top * sizeof *rec->top_ids);
    memcpy(rec->top_lps, r->top_logprobs, (size_t)r->n_top * sizeof *rec->top_lps);
}

/* A prompt token's record from the row before it (threadpool item). */
static void score_prompt_row(void *ctx, int i) {
    const struct sched *S = ctx;
    const struct lp_item *it = &S->lp_items[i];
    struct job *j = it->j;
    struct sample_result r;
    sampler_row_logprobs(j->lp_rows + (size_t)it->row * S->port.vocab, S->port.vocab, j->prompt[it->p], j->prompt_top,
                         &r);
    rec_set(&j->prompt_recs[it->p], &r);
}

/* Asks for the slot's next token: the argmax alone when the job's sampler would pick
 * exactly that, a token drawn by the device sampler when it can draw it (this consumes
 * the job's RNG draw for the token), else the logits row for the host sampler. */
static void want_token(const struct sched *S, struct slot *sl, struct batch_seq *b) {
    const bool only = S->device_argmax && sampler_argmax_only(sl->job->smp);
    const bool drawn = !only && S->device_sampling && sampler_device_row(sl->job->smp, &sl->rs);
    b->logits = only || drawn ? NULL : sl->logits;
    b->argmax = only || drawn ? &sl->argmax : NULL;
    b->sampling = drawn ? &sl->rs : NULL;
}

/* Batch classes for sched_plan_invariant, in the order forwards are issued. */
static int invariant_class(const struct batch_seq *b, int inv) {
    return b->n_tokens == 1 ? 0 : b->n_tokens > inv ? 1 : 2;
}

int sched_plan_invariant(struct batch_seq *b, int *slot, int nb, int inv, int max_tokens, int *group_len) {
    /* stable insertion sort by class: nb is at most the slot count, and the batch
     * arrives nearly ordered (decoding rows first, then prompt chunks) */
    for (int i = 1; i < nb; i++) {
        const struct batch_seq x = b[i];
        const int xs = slot[i], c = invariant_class(&x, inv);
        int k = i;
        for (; k > 0 && invariant_class(&b[k - 1], inv) > c; k--) {
            b[k] = b[k - 1];
            slot[k] = slot[k - 1];
        }
        b[k] = x;
        slot[k] = xs;
    }
    int ng = 0;
    for (int k = 0; k < nb;) {
        const int c = invariant_class(&b[k], inv);
        int n = 1;
        if (c == 0) {
            while (k + n < nb && n < inv && b[k + n].n_tokens == 1) n++;
        } else if (c == 1) {
            long sum = b[k].n_tokens;
            while (k + n < nb && invariant_class(&b[k + n], inv) == 1 &&
                   (max_tokens <= 0 || sum + b[k + n].n_tokens <= max_tokens))
                sum += b[k + n++].n_tokens;
        }
        group_len[ng++] = n;
        k += n;
    }
    return ng;
}

/* ---- jobs ---- */

struct job *job_new(int32_t *prompt, int n_prompt) {
    static atomic_ulong next_id = 1;
    struct job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->id = atomic_fetch_add(&next_id, 1);
    j->prompt = prompt;
    j->n_prompt = n_prompt;
    j->sp = sampler_params_default();
    j->slot = -1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->cancel, 0);
    atomic_init(&j->refs, 1);
    j->t_arrive = now_seconds();
    return j;
}

int job_add_stop(struct job *j, const char *s, size_t len) {
    if (j->n_stops >= TEXTOUT_MAX_STOPS) return ST_INVALID;
    char *c = malloc(len + 1);
    if (!c) return ST_NOMEM;
    memcpy(c, s, len);
    c[len] = 0;
    j->stops[j->n_stops++] = c;
    return ST_OK;
}

void job_release(struct job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    free(j->prompt);
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    sampler_free(j->smp);
    out_constraint_free(j->constraint);
    textout_free(&j->tx);
    free(j->recs);
    free(j->prompt_recs);
    free(j->lp_rows);
    free(j->score_req);
    free(j->score_res);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* ---- scheduler helpers (scheduler thread) ---- */

static void finish_job(struct sched *S, struct slot *sl, struct job *j, enum finish_reason why,
                       const char *msg) {
    double t_done = now_seconds();
    /* metrics first, so whoever sees the job done also sees it counted */
    if (why == FIN_CANCELLED) metrics_cancelled();
    if (why == FIN_STOP || why == FIN_LENGTH) {
        metrics_tokens(j->n_prompt, j->n_gen, j->cached);
        metrics_e2e(t_done - j->t_arrive);
    }
    pthread_mutex_lock(&j->mu);
    if (why != FIN_STOP || !j->tx.stopped) textout_finish(&j->tx);
    j->finish = why;
    if (msg) snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
    j->done = true;
    j->t_done = t_done;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    sampler_free(j->smp);
    j->smp = NULL;
    if (sl && S->port.cache_save && (why == FIN_STOP || why == FIN_LENGTH)) {
        char err[256];
        if (S->port.cache_save(S->port.ctx, sl->s, err, sizeof err))
            fprintf(stderr, "prefix cache: save failed: %s\n", err);
    }
    if (sl) {
        if (why == FIN_ERROR) S->port.seq_reset(S->port.ctx, sl->s);
        sl->job = NULL;
        sl->last_used = ++S->clock;
        atomic_fetch_sub(&S->n_running, 1);
        metrics_queue(atomic_load(&S->n_queued), atomic_load(&S->n_running));
    }
    job_release(j);
}

/* Appends token r's logprob record (under j->mu), its text tx.buf[start, end). */
static void put_rec(struct job *j, const struct sample_result *r, size_t start, size_t end) {
    if (!j->recs || j->n_recs >= j->max_tokens) return;
    struct tok_rec *rec = &j->recs[j->n_recs++];
    rec_set(rec, r);
    rec->text_start = start < end ? start : end;
    rec->text_end = end;
}

/* Handles one sampled token; returns true when the job finished. */
static bool take_token(struct sched *S, struct slot *sl, struct job *j, const struct sample_result *r) {
    double now = now_seconds();
    if (j->n_gen == 0) {
        j->t_first = now;
        metrics_ttft(now - j->t_arrive);
    } else {
        metrics_itl(now - j->t_last_tok);
    }
    j->t_last_tok = now;
    int32_t t = r->token;
    sampler_accept(j->smp, &t, 1, false);
    if (!j->ignore_eos && port_is_stop(&S->port, t)) {
        pthread_mutex_lock(&j->mu);
        j->n_gen++;
        if (j->prompt_logprobs) put_rec(j, r, j->tx.len, j->tx.len); /* no text */
        pthread_mutex_unlock(&j->mu);
        finish_job(S, sl, j, FIN_STOP, NULL);
        return true;
    }
    size_t blen = 0;
    const char *bytes = NULL;
    if (!S->port.is_special(S->port.ctx, t)) bytes = S->port.token_bytes(S->port.ctx, t, &blen);
    pthread_mutex_lock(&j->mu);
    j->n_gen++;
    size_t start = j->tx.len;
    int hit = bytes && blen ? textout_push(&j->tx, bytes, blen) : 0;
    put_rec(j, r, start, j->tx.len);
    int n_gen = j->n_gen;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (hit < 0) {
        finish_job(S, sl, j, FIN_ERROR, "out of memory for output text");
        return true;
    }
    if (hit == 1) {
        finish_job(S, sl, j, FIN_STOP, NULL);
        return true;
    }
    if (n_gen >= j->max_tokens || j->n_prompt + n_gen >= S->opt.max_seq) {
        finish_job(S, sl, j, FIN_LENGTH, NULL);
        return true;
    }
    return false;
}

/* Sets up a job in a slot: sampler, buffers, prefix-cache match. */
static int admit(struct sched *S, struct job *j, int si) {
    struct slot *sl = &S->slots[si];
    char err[256];
    int rc = sampler_new(&j->smp, S->port.vocab, &j->sp, err, sizeof err);
    if (rc) return rc;
    if (j->constraint) {
        const struct sampler_constraint c = out_constraint_sampler(j->constraint);
        if ((rc = sampler_set_constraint(j->smp, &c))) return rc;
    }
    if (textout_init(&j->tx, 256, (const char *const *)j->stops, j->n_stops)) return ST_NOMEM;
    if (j->end_mark) textout_set_end(&j->tx, j->end_mark, j->end_arm);
    if ((j->sp.logprobs || j->sp.top_logprobs > 0) && j->max_tokens > 0) {
        j->recs = calloc((size_t)j->max_tokens, sizeof *j->recs);
        if (!j->recs) return ST_NOMEM;
    }
    if (j->prompt_logprobs) {
        j->prompt_recs = calloc((size_t)j->n_prompt, sizeof *j->prompt_recs);
        if (!j->prompt_recs) return ST_NOMEM;
        if (S->port.row_scores) {
            j->score_req = malloc((size_t)S->chunk * sizeof *j->score_req);
            j->score_res = malloc((size_t)S->chunk * sizeof *j->score_res);
            if (!j->score_req || !j->score_res) return ST_NOMEM;
        } else {
            j->lp_rows = malloc((size_t)SCHED_PROMPT_LP_ROWS * (size_t)S->port.vocab * sizeof *j->lp_rows);
            if (!j->lp_rows) return ST_NOMEM;
        }
    }
    int L = S->port.seq_length(S->port.ctx, sl->s);
    const int32_t *toks = S->port.seq_tokens(S->port.ctx, sl->s);
    /* a prompt_logprobs job needs every row's logits: no prefix of it may be reused */
    if (L > 0 && (j->prompt_logprobs || !(L < j->n_prompt && memcmp(toks, j->prompt, (size_t)L * sizeof *toks) == 0))) {
        S->port.seq_reset(S->port.ctx, sl->s);
        L = 0;
    }
    if (L == 0 && S->port.cache_restore && !j->prompt_logprobs) {
        /* the slot holds nothing useful: try the checkpoint store */
        int matched = 0;
        if (S->port.cache_restore(S->port.ctx, sl->s, j->prompt, j->n_prompt, &matched, err, sizeof err)) {
            fprintf(stderr, "prefix cache: restore failed: %s\n", err);
            S->port.seq_reset(S->port.ctx, sl->s);
            matched = 0;
        }
        L = matched;
    }
    j->n_fed = L;
    j->cached = L;
    /* Checkpoint boundaries: a conversation's next turn re-sends this prompt with the
     * model's reply re-rendered (not token-identical to what was generated), so the
     * useful reusable prefixes end where a turn starts: after the system prompt (two
     * conversations that share it both reuse it) and before the generation prompt (the
     * next turn of this conversation extends it). */
    j->turn_first = j->turn_last = 0;
    if (S->port.turn_start_id >= 0)
        for (int p = 1; p < j->n_prompt; p++)
            if (j->prompt[p] == S->port.turn_start_id) {
                if (!j->turn_first) j->turn_first = p;
                j->turn_last = p;
            }
    sampler_accept(j->smp, j->prompt, j->n_prompt, true);
    sl->job = j;
    j->slot = si;
    atomic_fetch_add(&S->n_running, 1);
    return ST_OK;
}

/* The next position after n_fed (and before the prompt's end) where the prefill stops
 * to save a checkpoint: a turn start, or a multiple of cache_interval; 0 if none. */
static int next_checkpoint(const struct sched *S, const struct job *j) {
    int best = 0;
    const int iv = S->opt.cache_interval;
    if (iv > 0) {
        int k = (j->n_fed / iv + 1) * iv;
        if (k < j->n_prompt) best = k;
    }
    const int turns[2] = {j->turn_first, j->turn_last};
    for (int i = 0; i < 2; i++)
        if (turns[i] > j->n_fed && turns[i] < j->n_prompt && (!best || turns[i] < best)) best = turns[i];
    return best;
}

/* Prompt tokens a queued job must stand to gain before it waits for another job's
 * checkpoint (below): a short shared prefix is cheaper to prefill again than a step. */
#define SHARED_PREFIX_MIN 128

/* The furthest checkpoint a running job a still has to save at or before position lim:
 * next_checkpoint's positions past a->n_fed (turn starts, multiples of cache_interval
 * inside the prompt) and, for a prompt without chat turns, its end; 0 if none. */
static int checkpoint_ahead(const struct sched *S, const struct job *a, int lim) {
    int c = 0;
    const int iv = S->opt.cache_interval;
    if (iv > 0) {
        const int k = lim / iv * iv;
        if (k > a->n_fed && k < a->n_prompt) c = k;
    }
    const int turns[2] = {a->turn_first, a->turn_last};
    for (int i = 0; i < 2; i++)
        if (turns[i] > a->n_fed && turns[i] < a->n_prompt && turns[i] <= lim && turns[i] > c) c = turns[i];
    if (!a->turn_last && a->n_prompt <= lim && a->n_prompt > a->n_fed && a->n_prompt > a->cached) c = a->n_prompt;
    return c;
}

/* Whether queued job j should stay queued this step: a running job is prefilling a prefix
 * of j's prompt and will checkpoint it (at least SHARED_PREFIX_MIN tokens beyond what j
 * would restore now: held, its slot's session prefix (pick_slot), or the store's match), so j admitted after that save restores it instead of prefilling the
 * same tokens beside it. Agents fan out requests that share a long system prompt: each
 * prefilled it again, the first one's checkpoint not yet saved when the rest arrived. A
 * wait ends when that job saves, passes the position, finishes or is cancelled. */
static bool wait_for_shared_prefix(const struct sched *S, const struct job *j, int held) {
    if (!S->shared_wait || !S->port.cache_save || !S->port.cache_match || j->n_prompt < 2 || j->prompt_logprobs)
        return false;
    int have = -1;
    for (int i = 0; i < S->n_slots; i++) {
        const struct job *a = S->slots[i].job;
        if (!a || a->n_fed >= a->n_prompt) continue;
        const int lim = a->n_prompt < j->n_prompt - 1 ? a->n_prompt : j->n_prompt - 1;
        int P = 0;
        while (P < lim && a->prompt[P] == j->prompt[P]) P++;
        if (P < SHARED_PREFIX_MIN) continue;
        const int c = checkpoint_ahead(S, a, P);
        if (c < SHARED_PREFIX_MIN) continue;
        if (have < 0) { /* only now (a scan of the store): most steps have no checkpoint ahead */
            have = S->port.cache_match(S->port.ctx, j->prompt, j->n_prompt);
            if (held > have) have = held;
        }
        if (c >= have + SHARED_PREFIX_MIN) return true;
    }
    return false;
}

/* Picks the free slot for a prompt: longest strict-prefix session, else LRU; *held: the
 * prefix of j's prompt that slot's session holds (0: none). */
static int pick_slot(struct sched *S, const struct job *j, int *held) {
    int best = -1, best_len = -1;
    uint64_t best_used = 0;
    for (int i = 0; i < S->n_slots; i++) {
        struct slot *sl = &S->slots[i];
        if (sl->job) continue;
        int L = S->port.seq_length(S->port.ctx, sl->s);
        const int32_t *t = S->port.seq_tokens(S->port.ctx, sl->s);
        int m = 0;
        if (L > 0 && L < j->n_prompt && memcmp(t, j->prompt, (size_t)L * sizeof *t) == 0) m = L;
        if (m > best_len || (m == best_len && m > 0 && sl->last_used > best_used) ||
            (m == best_len && m == 0 && sl->last_used < best_used)) {
            best = i;
            best_len = m;
            best_used = sl->last_used;
        }
    }
    *held = best_len > 0 ? best_len : 0;
    return best;
}

static int count_running(const struct sched *S) {
    int n = 0;
    for (int i = 0; i < S->n_slots; i++) n += S->slots[i].job != NULL;
    return n;
}

static int load(struct sched *S) {
    char err[512] = "";
    int rc = S->opt.open(&S->port, &S->opt.port, err, sizeof err);
    if (rc) goto fail;
    S->port_open = true;
    if ((rc = out_vocab_new(&S->out_vocab, &S->port))) {
        errorf(err, sizeof err, rc, "out of memory for the vocabulary table");
        goto fail;
    }
    pthread_mutex_lock(&S->mu);
    if (S->port.max_position > 0 && S->opt.max_seq > S->port.max_position) S->opt.max_seq = S->port.max_position;
    pthread_mutex_unlock(&S->mu);
    if (S->opt.max_seq < 2) {
        rc = errorf(err, sizeof err, ST_INVALID, "--max-seq must be >= 2");
        goto fail;
    }
    S->slots = calloc((size_t)S->n_slots, sizeof *S->slots);
    S->batch = calloc((size_t)S->n_slots, sizeof *S->batch);
    S->batch_slot = calloc((size_t)S->n_slots, sizeof *S->batch_slot);
    if (!S->slots || !S->batch || !S->batch_slot) {
        rc = errorf(err, sizeof err, ST_NOMEM, "out of memory for scheduler slots");
        goto fail;
    }
    for (int i = 0; i < S->n_slots; i++) {
        rc = S->port.seq_open(S->port.ctx, &S->slots[i].s, S->opt.max_seq, err, sizeof err);
        if (rc) {
            error_prefix(err, sizeof err, "opening session %d of %d (max_seq %d)", i + 1, S->n_slots,
                         S->opt.max_seq);
            goto fail;
        }
        const size_t lbytes = (size_t)S->port.vocab * sizeof(float);
        S->slots[i].logits = S->port.host_alloc ? S->port.host_alloc(S->port.ctx, lbytes) : malloc(lbytes);
        if (!S->slots[i].logits) {
            rc = errorf(err, sizeof err, ST_NOMEM, "out of memory for logits");
            goto fail;
        }
    }
    S->samp_slot = calloc((size_t)S->n_slots, sizeof *S->samp_slot);
    S->prompt_slot = calloc((size_t)S->n_slots, sizeof *S->prompt_slot);
    S->group_len = calloc((size_t)S->n_slots, sizeof *S->group_len);
    S->saves = calloc((size_t)S->n_slots, sizeof *S->saves);
    S->lp_items = calloc((size_t)S->n_slots * SCHED_PROMPT_LP_ROWS, sizeof *S->lp_items);
    if (!S->samp_slot || !S->prompt_slot || !S->group_len || !S->saves || !S->lp_items) {
        rc = errorf(err, sizeof err, ST_NOMEM, "out of memory for scheduler slots");
        goto fail;
    }
    {
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int threads = cores > 0 ? (int)cores : 1;
        if (threads > 16) threads = 16;
        if (threads > S->n_slots) threads = S->n_slots;
        if ((rc = threadpool_create(&S->pool, threads, err, sizeof err))) goto fail;
    }
    S->device_argmax = !env_on("ORCHID_NO_DEVICE_ARGMAX");
    if (!S->device_argmax) fprintf(stderr, "ORCHID_NO_DEVICE_ARGMAX: every token is sampled on the host from its logits\n");
    S->device_sampling = S->port.device_sampling && !env_on("ORCHID_NO_DEVICE_SAMPLING");
    if (S->port.device_sampling && !S->device_sampling)
        fprintf(stderr, "ORCHID_NO_DEVICE_SAMPLING: sampled tokens are drawn on the host from their logits\n");
    /* a prompt's chunk: in the split mode one forward's worth unless told (a lone long prompt
     * then prefills at the backend's best rate: H200, a 4,096-token prompt's first token
     * 0.307 -> 0.130 s, docs/PERFORMANCE.md session 25), else 512 */
    S->split = S->opt.batch_invariant && S->port.invariant_tokens > 0;
    S->chunk = S->opt.prefill_chunk > 0 ? S->opt.prefill_chunk
               : S->split && S->port.max_batch_tokens > 0 ? S->port.max_batch_tokens
               : 512;
    /* the split mode's prompt tokens a step: one forward's worth unless told (< 0: none) */
    S->step_prompt = S->opt.max_step_prompt > 0 ? S->opt.max_step_prompt
                     : S->opt.max_step_prompt < 0 ? 0
                     : S->port.max_batch_tokens;
    S->shared_wait = !env_on("ORCHID_NO_SHARED_PREFIX_WAIT");
    if (!S->shared_wait) fprintf(stderr, "ORCHID_NO_SHARED_PREFIX_WAIT: requests sharing a prompt prefix prefill it side by side\n");
    S->pack_prompts = !env_on("ORCHID_NO_PREFILL_PACK");
    if (!S->pack_prompts) fprintf(stderr, "ORCHID_NO_PREFILL_PACK: every prompt chunk gets a forward of its own\n");
    pthread_mutex_lock(&S->mu);
    S->state = SCHED_READY;
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
    return 0;
fail:
    pthread_mutex_lock(&S->mu);
    snprintf(S->load_err, sizeof S->load_err, "%s", err);
    S->state = SCHED_FAILED;
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
    return rc;
}

static void *sched_main(void *arg) {
    struct sched *S = arg;
    if (load(S)) return NULL;
    char err[512];
    for (;;) {
        pthread_mutex_lock(&S->mu);
        while (!S->stopping && S->q_len == 0 && count_running(S) == 0) pthread_cond_wait(&S->cv, &S->mu);
        if (S->stopping) {
            pthread_mutex_unlock(&S->mu);
            break;
        }
        const double t_step = now_seconds(); /* the step's wall time starts here, idle waits excluded */
        /* Drop cancelled queued jobs; admit into free slots, in order. */
        int w = 0, n = S->q_len;
        struct job **keep = S->tmp;
        int nk = 0;
        for (int i = 0; i < n; i++) {
            struct job *j = S->q[(S->q_head + i) % S->opt.max_queue];
            if (atomic_load(&j->cancel)) {
                finish_job(S, NULL, j, FIN_CANCELLED, NULL);
                continue;
            }
            keep[nk++] = j;
        }
        S->q_head = 0;
        S->q_len = 0;
        for (int i = 0; i < nk; i++) {
            struct job *j = keep[i];
            int held;
            const int si = pick_slot(S, j, &held);
            if (si < 0 || wait_for_shared_prefix(S, j, held)) {
                /* no free slot, or a running job is about to checkpoint j's prefix: stays
                 * queued, in order */
                if (si >= 0 && !j->waited_prefix) {
                    j->waited_prefix = true;
                    metrics_shared_prefix_wait();
                }
                S->q[w++] = j;
                continue;
            }
            int rc = admit(S, j, si);
            if (rc) finish_job(S, NULL, j, FIN_ERROR, "admission failed (out of memory)");
        }
        S->q_len = w;
        atomic_store(&S->n_queued, w);
        metrics_queue(w, atomic_load(&S->n_running));
        pthread_mutex_unlock(&S->mu);

        /* Build one batch over every running job: the decoding ones (one token each) first,
         * then prompt chunks, oldest job first (their tokens shared out of prefill_chunk).
         * With batch invariance asked for on a backend that has it only for some batches
         * (port.invariant_tokens > 0: CUDA), each prompt chunk gets the whole chunk, as
         * alone, whole chunks are taken while the step's prompt tokens stay within
         * step_prompt (the rest wait for the next step: a burst of new prompts must not
         * hold the running streams' next token for all of its prefill), and
         * sched_plan_invariant cuts the batch into forwards that keep every sequence's
         * alone bits (long prompt chunks packed, short ones alone, one-token rows at most
         * invariant_tokens a forward). */
        const bool split = S->split;
        int nb = 0, np = 0, budget = S->chunk;
        for (int i = 0; i < S->n_slots; i++) {
            struct slot *sl = &S->slots[i];
            struct job *j = sl->job;
            if (!j) continue;
            /* cancellations are taken here only: a job already in the batch (decoding)
             * must not be finished — freed — before its forward */
            if (atomic_load(&j->cancel)) {
                finish_job(S, sl, j, FIN_CANCELLED, NULL);
                continue;
            }
            if (j->n_fed < j->n_prompt) {
                int k = np++; /* insertion by job id: the oldest request's prompt goes first */
                while (k > 0 && S->slots[S->prompt_slot[k - 1]].job->id > j->id) {
                    S->prompt_slot[k] = S->prompt_slot[k - 1];
                    k--;
                }
                S->prompt_slot[k] = i;
                continue;
            }
            struct batch_seq *b = &S->batch[nb];
            b->s = sl->s;
            b->all_logits = false;
            b->tokens = &j->next_tok;
            b->n_tokens = 1;
            b->score = NULL;
            b->scores = NULL;
            want_token(S, sl, b);
            S->batch_slot[nb++] = i;
        }
        int step_prompt = 0; /* split: prompt tokens taken this step */
        for (int k = 0; k < np; k++) {
            const int i = S->prompt_slot[k];
            struct slot *sl = &S->slots[i];
            struct job *j = sl->job;
            int left = j->n_prompt - j->n_fed;
            const int room = split ? S->chunk : budget;
            int take = left < room ? left : room;
            const int ck = S->port.cache_save ? next_checkpoint(S, j) : 0;
            if (ck && j->n_fed + take > ck) take = ck - j->n_fed; /* stop there to save it */
            if (j->prompt_logprobs && !S->port.row_scores && take > SCHED_PROMPT_LP_ROWS) take = SCHED_PROMPT_LP_ROWS;
            if (take <= 0) continue;
            if (split && S->step_prompt > 0 && step_prompt > 0 && step_prompt + take > S->step_prompt) break;
            if (!split) budget -= take;
            step_prompt += take;
            struct batch_seq *b = &S->batch[nb];
            b->s = sl->s;
            b->all_logits = false;
            b->tokens = j->prompt + j->n_fed;
            b->n_tokens = take;
            b->logits = NULL;
            b->argmax = NULL;
            b->sampling = NULL;
            b->score = NULL;
            b->scores = NULL;
            sl->lp_last = false;
            if (j->prompt_logprobs && S->port.row_scores) {
                /* row r scores prompt token n_fed + r + 1 (the prompt's last row: none; it
                 * gives the first token as any prompt's does) */
                for (int r = 0; r < take; r++) {
                    const int p = j->n_fed + r + 1;
                    j->score_req[r] = p < j->n_prompt ? (struct row_score_req){j->prompt[p], j->prompt_top}
                                                      : (struct row_score_req){-1, 0};
                }
                b->score = j->score_req;
                b->scores = j->score_res;
                if (take == left && j->max_tokens > 0) want_token(S, sl, b);
            } else if (j->prompt_logprobs) { /* every row's logits; the last one's sampled from the host */
                b->all_logits = true;
                b->logits = j->lp_rows;
                sl->lp_last = take == left && j->max_tokens > 0;
            } else if (take == left && j->max_tokens > 0) {
                want_token(S, sl, b);
            }
            S->batch_slot[nb++] = i;
        }
        if (nb == 0) continue;
        long step_tokens = 0;
        for (int k = 0; k < nb; k++) step_tokens += S->batch[k].n_tokens;
        err[0] = 0;
        int rc = 0;
        const double t_fwd = now_seconds();
        if (!split) {
            rc = S->port.forward(S->port.ctx, S->batch, nb, err, sizeof err);
            metrics_forward(1, step_tokens);
        } else {
            const int ng = sched_plan_invariant(S->batch, S->batch_slot, nb, S->port.invariant_tokens,
                                                S->pack_prompts ? S->port.max_batch_tokens : 1, S->group_len);
            for (int g = 0, k = 0; g < ng && !rc; k += S->group_len[g++])
                rc = S->port.forward(S->port.ctx, S->batch + k, S->group_len[g], err, sizeof err);
            metrics_forward(ng, step_tokens);
        }
        const double fwd_s = now_seconds() - t_fwd;
        if (rc) {
            fprintf(stderr, "request failed: forward: %s\n", err);
            for (int k = 0; k < nb; k++) {
                struct slot *sl = &S->slots[S->batch_slot[k]];
                finish_job(S, sl, sl->job, FIN_ERROR, err);
            }
            continue;
        }
        long used = 0;
        for (int i = 0; i < S->n_slots; i++) used += S->port.seq_length(S->port.ctx, S->slots[i].s);
        metrics_kv(used, (long)S->n_slots * S->opt.max_seq);
        int n_save = 0, n_lp = 0;
        for (int k = 0; k < nb; k++) {
            struct slot *sl = &S->slots[S->batch_slot[k]];
            struct job *j = sl->job;
            struct batch_seq *b = &S->batch[k];
            if (b->all_logits) /* row r scores prompt token n_fed + r + 1 (the last row: none) */
                for (int r = 0; r < b->n_tokens && j->n_fed + r + 1 < j->n_prompt; r++)
                    S->lp_items[n_lp++] = (struct lp_item){j, r, j->n_fed + r + 1};
            if (b->score) /* scored by the model: the records straight from its results */
                for (int r = 0; r < b->n_tokens && j->n_fed + r + 1 < j->n_prompt; r++)
                    rec_set(&j->prompt_recs[j->n_fed + r + 1], &b->scores[r]);
            if (j->n_fed < j->n_prompt) {
                const int ck = S->port.cache_save ? next_checkpoint(S, j) : 0;
                j->n_fed += b->n_tokens;
                /* a prompt without chat turns (e.g. token ids on /v1/completions) is also
                 * checkpointed where it ends: a follow-up request may extend it exactly */
                if ((ck && j->n_fed == ck) ||
                    (j->n_fed == j->n_prompt && j->n_prompt > j->cached && !j->turn_last && S->port.cache_save))
                    S->saves[n_save++] = (struct pending_save){S->batch_slot[k], j};
            }
        }
        /* The prompt rows' records, in parallel; a job whose prompt is now all in has them
         * complete (its connection may read them from here on). */
        threadpool_run(S->pool, n_lp, score_prompt_row, S);
        for (int k = 0; k < nb; k++) {
            struct job *j = S->slots[S->batch_slot[k]].job;
            if (!(S->batch[k].all_logits || S->batch[k].score) || j->n_fed < j->n_prompt) continue;
            pthread_mutex_lock(&j->mu);
            j->prompt_done = true;
            pthread_cond_broadcast(&j->cv);
            pthread_mutex_unlock(&j->mu);
        }
        /* Sample every sequence that has logits, in parallel (each job owns its sampler
         * and its logits row); argmax-only rows already hold their token. Then hand the
         * tokens over in slot order. */
        int ns = 0, na = 0, nd = 0;
        for (int k = 0; k < nb; k++) {
            struct slot *sl = &S->slots[S->batch_slot[k]];
            if (S->batch[k].all_logits) {
                if (sl->lp_last) {
                    const struct batch_seq *b = &S->batch[k];
                    memcpy(sl->logits, b->logits + (size_t)(b->n_tokens - 1) * S->port.vocab,
                           (size_t)S->port.vocab * sizeof *sl->logits);
                    S->samp_slot[ns++] = S->batch_slot[k];
                }
            } else if (S->batch[k].logits) {
                S->samp_slot[ns++] = S->batch_slot[k];
            } else if (S->batch[k].argmax) {
                sl->res = (struct sample_result){.token = sl->argmax};
                if (S->batch[k].sampling) nd++;
                else na++;
            }
        }
        threadpool_run(S->pool, ns, sample_item, S);
        if (na) metrics_argmax_tokens(na);
        if (nd) metrics_device_sampled_tokens(nd);
        for (int k = 0; k < nb; k++) {
            const struct batch_seq *b = &S->batch[k];
            struct slot *sl = &S->slots[S->batch_slot[k]];
            struct job *j = sl->job;
            if (b->all_logits ? !sl->lp_last : !b->logits && !b->argmax) {
                /* no token this step; a job that asked for none (echo with max_tokens 0) ends
                 * with its prompt */
                if (j->max_tokens == 0 && j->n_fed == j->n_prompt) finish_job(S, sl, j, FIN_LENGTH, NULL);
                continue;
            }
            if (!take_token(S, sl, j, &sl->res)) j->next_tok = sl->res.token;
        }
        /* the checkpoints this step made due; a job its first token finished was saved by
         * finish_job (or, cancelled or failed, is not worth keeping) */
        for (int i = 0; i < n_save; i++) {
            struct slot *sl = &S->slots[S->saves[i].slot];
            if (sl->job != S->saves[i].job) continue;
            if (S->port.cache_save(S->port.ctx, sl->s, err, sizeof err)) fprintf(stderr, "prefix cache: save failed: %s\n", err);
        }
        metrics_step(fwd_s, now_seconds() - t_step - fwd_s);
    }
    /* stopping: cancel everything */
    pthread_mutex_lock(&S->mu);
    for (int i = 0; i < S->q_len; i++) finish_job(S, NULL, S->q[(S->q_head + i) % S->opt.max_queue], FIN_CANCELLED, NULL);
    S->q_len = 0;
    pthread_mutex_unlock(&S->mu);
    for (int i = 0; i < S->n_slots; i++)
        if (S->slots[i].job) finish_job(S, &S->slots[i], S->slots[i].job, FIN_CANCELLED, NULL);
    metrics_queue(0, 0);
    return NULL;
}

/* ---- public ---- */

int sched_start(struct sched **out, const struct sched_options *opt, char *err, size_t errlen) {
    *out = NULL;
    if (opt->parallel < 1 || opt->parallel > 256) return errorf(err, errlen, ST_INVALID, "--parallel must be in [1, 256]");
    if (opt->max_queue < 1) return errorf(err, errlen, ST_INVALID, "--max-queue must be >= 1");
    if (opt->prefill_chunk < 0) return errorf(err, errlen, ST_INVALID, "prefill chunk must be >= 0 (0: the default)");
    struct sched *S = calloc(1, sizeof *S);
    if (!S) return errorf(err, errlen, ST_NOMEM, "out of memory");
    S->opt = *opt;
    S->n_slots = opt->parallel;
    S->q = calloc((size_t)opt->max_queue, sizeof *S->q);
    S->tmp = calloc((size_t)opt->max_queue, sizeof *S->tmp);
    atomic_init(&S->n_running, 0);
    atomic_init(&S->n_queued, 0);
    if (!S->q || !S->tmp) {
        free(S->q);
        free(S->tmp);
        free(S);
        return errorf(err, errlen, ST_NOMEM, "out of memory");
    }
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);
    S->state = SCHED_LOADING;
    int rc = pthread_create(&S->thread, NULL, sched_main, S);
    if (rc) {
        free(S->q);
        free(S->tmp);
        free(S);
        return errorf(err, errlen, ST_INTERNAL, "pthread_create: %s", strerror(rc));
    }
    *out = S;
    return ST_OK;
}

enum sched_state sched_state(struct sched *S, char *err, size_t errlen) {
    pthread_mutex_lock(&S->mu);
    enum sched_state st = S->state;
    if (err && errlen) snprintf(err, errlen, "%s", S->load_err);
    pthread_mutex_unlock(&S->mu);
    return st;
}

enum sched_state sched_wait_loaded(struct sched *S, char *err, size_t errlen) {
    pthread_mutex_lock(&S->mu);
    while (S->state == SCHED_LOADING) pthread_cond_wait(&S->cv, &S->mu);
    enum sched_state st = S->state;
    if (err && errlen) snprintf(err, errlen, "%s", S->load_err);
    pthread_mutex_unlock(&S->mu);
    return st;
}

const struct out_vocab *sched_out_vocab(struct sched *S) {
    return sched_state(S, NULL, 0) == SCHED_READY ? S->out_vocab : NULL;
}

const struct model_port *sched_port(struct sched *S) {
    return sched_state(S, NULL, 0) == SCHED_READY ? &S->port : NULL;
}

int sched_max_seq(struct sched *S) {
    pthread_mutex_lock(&S->mu); /* load() may still clamp it */
    int m = S->opt.max_seq;
    pthread_mutex_unlock(&S->mu);
    return m;
}

int sched_submit_many(struct sched *S, struct job *const *js, int n) {
    pthread_mutex_lock(&S->mu);
    if (S->state != SCHED_READY || S->stopping) {
        pthread_mutex_unlock(&S->mu);
        return ST_UNSUPPORTED;
    }
    if (n > S->opt.max_queue || S->q_len + n > S->opt.max_queue) {
        pthread_mutex_unlock(&S->mu);
        return n > S->opt.max_queue ? ST_INVALID : ST_RANGE;
    }
    for (int i = 0; i < n; i++) { /* in order, under one lock: admitted in this order */
        atomic_fetch_add(&js[i]->refs, 1);
        S->q[(S->q_head + S->q_len) % S->opt.max_queue] = js[i];
        S->q_len++;
    }
    atomic_store(&S->n_queued, S->q_len);
    metrics_queue(S->q_len, atomic_load(&S->n_running));
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
    return ST_OK;
}

int sched_submit(struct sched *S, struct job *j) { return sched_submit_many(S, &j, 1); }

void sched_shutdown(struct sched *S) {
    if (!S) return;
    pthread_mutex_lock(&S->mu);
    bool joined = S->joined;
    S->stopping = true;
    S->joined = true;
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
    if (!joined) pthread_join(S->thread, NULL);
    pthread_mutex_lock(&S->mu);
    if (S->state == SCHED_READY) S->state = SCHED_STOPPED;
    pthread_mutex_unlock(&S->mu);
}

void sched_free(struct sched *S) {
    if (!S) return;
    sched_shutdown(S);
    if (S->slots) {
        for (int i = 0; i < S->n_slots; i++) {
            if (S->slots[i].s) S->port.seq_close(S->port.ctx, S->slots[i].s);
            if (S->port.host_free) S->port.host_free(S->port.ctx, S->slots[i].logits);
            else free(S->slots[i].logits);
        }
    }
    out_vocab_free(S->out_vocab);
    if (S->port_open && S->port.close) S->port.close(S->port.ctx);
    free(S->slots);
    free(S->batch);
    free(S->batch_slot);
    threadpool_destroy(S->pool);
    free(S->samp_slot);
    free(S->prompt_slot);
    free(S->group_len);
    free(S->saves);
    free(S->lp_items);
    free(S->q);
    free(S->tmp);
    pthread_mutex_destroy(&S->mu);
    pthread_cond_destroy(&S->cv);
    free(S);
}
