/* server/sched.h — the scheduler: one thread that loads the model, owns it
 * and every session, and runs generation jobs; and the job object through
 * which an HTTP connection thread hands a request over and reads results back.
 *
 * Threads and ownership:
 *   - The scheduler thread is the only caller of the port's model functions.
 *     It keeps `parallel` slots (a session + a logits row each). Each step it
 *     admits queued jobs into free slots (a slot whose session tokens are a
 *     strict prefix of the prompt is preferred: prefix cache), then runs ONE
 *     batched forward over every running job (prefill chunks and decode
 *     tokens together: continuous batching), samples, detokenizes, applies
 *     stop ids / stop strings / max_tokens, and publishes text to the job.
 *   - A job is shared by its connection thread and the scheduler (refcount 2
 *     while queued or running). The scheduler appends text and logprob
 *     records under job->mu and signals job->cv; the connection thread copies
 *     text [0, released) out under job->mu. A slow client therefore never
 *     blocks the scheduler.
 *   - Cancellation: the connection thread sets job->cancel (client gone);
 *     the scheduler drops the job before the next forward (within one step)
 *     and frees its slot. Queued jobs are dropped from the queue the same way.
 *   - The pending queue is bounded (max_queue): sched_submit returns ST_RANGE
 *     when full (HTTP 429).
 */
#ifndef ORCHID_SERVER_SCHED_H
#define ORCHID_SERVER_SCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "model/sampler.h"
#include "server/port.h"
#include "server/textout.h"

enum finish_reason { FIN_NONE = 0, FIN_STOP, FIN_LENGTH, FIN_CANCELLED, FIN_ERROR };

struct tok_rec {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[SAMPLER_MAX_TOP_LOGPROBS];
    float top_lps[SAMPLER_MAX_TOP_LOGPROBS];
    size_t text_start, text_end; /* this token's span in the output text */
};

struct out_constraint;

/* Prompt rows a step's forward returns logits of for one prompt_logprobs job: the job's
 * chunk is cut to this many tokens, so its host buffer stays bounded (16 rows × 248,320 ×
 * 4 B = 16 MB at the real vocabulary) whatever the prompt's length. */
#define SCHED_PROMPT_LP_ROWS 16

struct job {
    /* request: set by the connection thread before sched_submit, then read-only */
    uint64_t id;
    int32_t *prompt; /* owned */
    int n_prompt;
    struct sampler_params sp;
    int max_tokens;
    bool ignore_eos; /* stop ids are generated like any token (benchmarks) */
    char *stops[TEXTOUT_MAX_STOPS]; /* owned */
    int n_stops;
    struct out_constraint *constraint; /* owned: constrained output (json_schema), or NULL */
    const char *end_mark, *end_arm; /* static strings, or NULL: the text ends right after the
                                       first end_mark past end_arm (textout_set_end) */
    bool prompt_logprobs; /* the logprobs of the prompt's own tokens too (/v1/completions echo with
                             logprobs): the prompt is prefilled from its first token (no prefix
                             reuse), each row scored by the model (port.row_scores: whole
                             chunks) or in chunks of SCHED_PROMPT_LP_ROWS with every row's logits; a
                             stop id it generates gets a record too (lm-evaluation-harness reads
                             the entry after the prompt's as the generated token's) */
    int prompt_top;       /* their alternatives, 0..SAMPLER_MAX_TOP_LOGPROBS */
    double t_arrive;

    /* scheduler-private */
    sampler *smp;
    int slot;
    int n_fed;          /* prompt tokens in the session */
    int32_t next_tok;   /* sampled, not yet fed */
    double t_last_tok;
    float *lp_rows;     /* prompt_logprobs without port.row_scores: [SCHED_PROMPT_LP_ROWS × vocab]
                           logits of a chunk's rows (admission to release) */
    struct row_score_req *score_req; /* prompt_logprobs with port.row_scores: a chunk's rows' */
    struct sample_result *score_res;     /* requests and results, [the scheduler's chunk] each */

    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct textout tx;  /* tx.buf[0, tx.released) is final */
    struct tok_rec *recs; /* when logprobs are wanted: [max_tokens] */
    int n_recs;
    struct tok_rec *prompt_recs; /* prompt_logprobs: [n_prompt], entry p (≥ 1) prompt token p's
                                    logprob after tokens 0..p-1 (entry 0: none); written by the
                                    scheduler, read-only once prompt_done */
    bool prompt_done;   /* every prompt token fed (the prompt's records complete) */
    int n_gen;          /* generated ids, stop id included */
    int cached;         /* prompt tokens reused from the prefix cache */
    bool waited_prefix; /* held in the queue for a running job's checkpoint of a shared prefix */
    int turn_first, turn_last; /* prompt positions of the first turn start after the
                                  system turn and of the last (the generation prompt);
                                  checkpoints are saved there (0: none) */
    bool done;
    enum finish_reason finish;
    char errmsg[256];   /* FIN_ERROR: internal detail (logged, never sent) */
    double t_first, t_done;

    atomic_int cancel;
    atomic_int refs;
};

/* A new job with refcount 1 (the caller's). Takes ownership of prompt. */
struct job *job_new(int32_t *prompt, int n_prompt);
void job_release(struct job *j);
/* Adds a stop string (copied); ST_INVALID beyond TEXTOUT_MAX_STOPS. */
int job_add_stop(struct job *j, const char *s, size_t len);

typedef int (*port_open_fn)(struct model_port *p, const struct port_options *opt, char *err, size_t errlen);

struct sched_options {
    int parallel;      /* slots = concurrently running sequences */
    int max_queue;     /* pending jobs beyond the running ones */
    int max_seq;       /* session capacity (prompt + completion); clamped to the model's */
    int prefill_chunk; /* prompt tokens fed per step, over all sequences (with batch
                          invariance on a partially invariant backend: a prompt chunk's
                          size, as alone; the step's total is max_step_prompt below);
                          0 = the default: in that mode the port's max_batch_tokens (one
                          forward's worth), else 512 */
    int max_step_prompt; /* that mode's prompt tokens a step at most, over all sequences,
                            whole chunks (the first always fits): 0 = the port's
                            max_batch_tokens (one forward), < 0 = no bound */
    int cache_interval; /* also checkpoint long prompts every this many tokens (0: never) */
    bool batch_invariant; /* each sequence gets the bits it would get alone (port.invariant_tokens) */
    port_open_fn open;
    struct port_options port;
};

enum sched_state { SCHED_LOADING = 0, SCHED_READY, SCHED_FAILED, SCHED_STOPPED };

struct sched;

/* Cuts one scheduler step's batch into forwards that give every sequence the bits it
 * gets alone on a backend with partial batch invariance (port.h invariant_tokens = inv
 * > 0; max_tokens = port.max_batch_tokens, 0 = unbounded). Reorders entries [0, nb) of
 * b and slot together, stably, as: one-token rows, prompt chunks of more than inv
 * tokens, shorter chunks; then forwards are one-token rows inv at most; long chunks
 * packed while their tokens total at most max_tokens (each is whole in one backend
 * call, so its GEMMs, scan and attention see exactly what they see alone); each short
 * chunk alone (alone it takes the 2..inv-token kernels, which a pack would not).
 * group_len[g] receives forward g's entry count; returns the number of forwards.
 * Exposed for tests. */
int sched_plan_invariant(struct batch_seq *b, int *slot, int nb, int inv, int max_tokens, int *group_len);

/* Starts the scheduler thread; it loads the model in the background. */
int sched_start(struct sched **out, const struct sched_options *opt, char *err, size_t errlen);
enum sched_state sched_state(struct sched *s, char *err, size_t errlen);
/* Blocks until the state is no longer LOADING. */
enum sched_state sched_wait_loaded(struct sched *s, char *err, size_t errlen);
/* The loaded port (NULL while loading). Text functions are safe from any thread. */
const struct model_port *sched_port(struct sched *s);
/* The vocabulary's table for constrained output (constraint.h), built with the
 * port; NULL until then. */
struct out_vocab;
const struct out_vocab *sched_out_vocab(struct sched *s);
int sched_max_seq(struct sched *s);
/* Queues a job (takes a reference). ST_RANGE: queue full; ST_UNSUPPORTED: not ready / stopping. */
int sched_submit(struct sched *s, struct job *j);
/* Queues n jobs together, in order, or none of them: ST_RANGE when they do not all fit now,
 * ST_INVALID when n is more than the queue ever holds. */
int sched_submit_many(struct sched *s, struct job *const *js, int n);
/* Stops the thread: cancels queued and running jobs (their connections see
 * FIN_CANCELLED), then refuses new work. The model stays open, so connection
 * threads may still call the port's text functions until sched_free. */
void sched_shutdown(struct sched *s);
/* Shuts down if needed, closes sessions and the model, frees. Only after
 * every connection thread is gone. */
void sched_free(struct sched *s);

#endif
