/* model/engine.c — engine and session lifetime, and batching onto a backend (engine.h).
 *
 * engine_open: config.json → struct model_config (validated), safetensors mmap,
 * weights_bind (every tensor named and checked), then the backend. Sessions own
 * their token list and the backend's per-sequence state. engine_forward
 * flattens a list of (session, new tokens) into fixed-capacity chunks of at most
 * backend->max_batch_tokens tokens — one sequence may span several chunks, its
 * state carries over — using buffers allocated at open, so the token loop does
 * not allocate. Output rows that want only an argmax pass a NULL logits
 * destination; the ids come back in c_amax and are copied to their batch_seq.
 */
#include "model/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model/weights.h"
#include "runtime/safetensors.h"
#include "runtime/status.h"
#include "runtime/timing.h"

struct engine {
    struct model_config cfg;
    safetensors *st;
    struct model_weights w;
    struct backend *be;
    char *model_dir;
    double load_seconds;
    /* chunk assembly buffers, [max_batch_tokens] each */
    int32_t *c_tokens, *c_pos, *c_seq, *c_out_rows, *c_amax;
    float **c_out;
    int32_t **c_amax_dst; /* where each output row's argmax goes (NULL: not wanted) */
    struct row_sampling *c_samp; /* each output row's device sampling (temperature 0: argmax) */
    struct row_score_req *c_score; /* each output row's score request (token -1: none) */
    struct sample_result *c_scores;    /* the backend's results, then copied to c_score_dst */
    struct sample_result **c_score_dst;
    struct backend_session **c_sessions;
};

struct session {
    engine *e;
    struct backend_session *bs;
    int32_t *tokens;
    int len, cap;
};

static int engine_open_rest(engine **out, engine *e, const struct engine_options *opt, double t0, char *err, size_t errlen);

int engine_open(engine **out, const struct engine_options *opt, char *err, size_t errlen) {
    *out = NULL;
    const double t0 = now_seconds();
    if (!opt || !opt->model_dir) return errorf(err, errlen, ST_INVALID, "no model directory given");
    engine *e = calloc(1, sizeof *e);
    if (!e) return errorf(err, errlen, ST_NOMEM, "out of memory");
    int rc;
    e->model_dir = strdup(opt->model_dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", opt->model_dir);
    if ((rc = config_load(&e->cfg, path, err, errlen))) goto fail;
    if ((rc = safetensors_open(&e->st, opt->model_dir, err, errlen))) goto fail;
    return engine_open_rest(out, e, opt, t0, err, errlen);
fail:
    engine_close(e);
    return rc;
}

int engine_open_checkpoint(engine **out, const struct engine_options *opt, const char *config_json, size_t config_len,
                           safetensors *st, char *err, size_t errlen) {
    *out = NULL;
    const double t0 = now_seconds();
    if (!opt || !config_json || !st) {
        safetensors_close(st);
        return errorf(err, errlen, ST_INVALID, "engine_open_checkpoint: no options, config or checkpoint");
    }
    engine *e = calloc(1, sizeof *e);
    if (!e) { safetensors_close(st); return errorf(err, errlen, ST_NOMEM, "out of memory"); }
    e->st = st;
    e->model_dir = strdup(opt->model_dir ? opt->model_dir : "<memory>");
    int rc = config_parse(&e->cfg, config_json, config_len, e->model_dir ? e->model_dir : "<memory>", err, errlen);
    if (rc) { engine_close(e); return rc; }
    return engine_open_rest(out, e, opt, t0, err, errlen);
}

/* Binds the weights of e->st to e->cfg and creates the backend; closes e on failure. */
static int engine_open_rest(engine **out, engine *e, const struct engine_options *opt, double t0, char *err, size_t errlen) {
    int rc;
    if ((rc = weights_bind(&e->w, &e->cfg, e->st, err, errlen))) goto fail;

    const char *backend = opt->backend ? opt->backend : "auto";
    if (strcmp(backend, "auto") == 0) {
        /* the GPU when this build has CUDA and a device is present, else the CPU */
        rc = ST_UNSUPPORTED;
#ifdef ORCHID_CUDA
        rc = cuda_backend_create(&e->be, &e->cfg, &e->w, err, errlen);
        if (rc && rc != ST_UNSUPPORTED) goto fail; /* a GPU exists but failed: say so, do not hide it */
#endif
        if (rc) rc = cpu_backend_create(&e->be, &e->cfg, &e->w, opt->threads, err, errlen);
    } else if (strcmp(backend, "cpu") == 0) {
        rc = cpu_backend_create(&e->be, &e->cfg, &e->w, opt->threads, err, errlen);
    } else if (strcmp(backend, "cuda") == 0) {
#ifdef ORCHID_CUDA
        rc = cuda_backend_create(&e->be, &e->cfg, &e->w, err, errlen);
#else
        rc = errorf(err, errlen, ST_UNSUPPORTED, "this build of orchid has no CUDA backend (built without nvcc)");
#endif
    } else {
        rc = errorf(err, errlen, ST_INVALID, "unknown backend \"%s\" (auto, cpu or cuda)", backend);
    }
    if (rc) goto fail;

    const size_t n = (size_t)e->be->max_batch_tokens;
    e->c_tokens = malloc(n * sizeof(int32_t));
    e->c_pos = malloc(n * sizeof(int32_t));
    e->c_seq = malloc(n * sizeof(int32_t));
    e->c_out_rows = malloc(n * sizeof(int32_t));
    e->c_out = malloc(n * sizeof(float *));
    e->c_sessions = malloc(n * sizeof(struct backend_session *));
    e->c_amax = malloc(n * sizeof(int32_t));
    e->c_amax_dst = malloc(n * sizeof(int32_t *));
    e->c_samp = malloc(n * sizeof(struct row_sampling));
    e->c_score = malloc(n * sizeof(struct row_score_req));
    e->c_scores = malloc(n * sizeof(struct sample_result));
    e->c_score_dst = malloc(n * sizeof(struct sample_result *));
    if (!e->c_tokens || !e->c_pos || !e->c_seq || !e->c_out_rows || !e->c_out || !e->c_sessions || !e->c_amax ||
        !e->c_amax_dst || !e->c_samp || !e->c_score || !e->c_scores || !e->c_score_dst) {
        rc = errorf(err, errlen, ST_NOMEM, "out of memory");
        goto fail;
    }
    e->load_seconds = now_seconds() - t0;
    *out = e;
    return 0;
fail:
    engine_close(e);
    return rc;
}

void engine_close(engine *e) {
    if (!e) return;
    if (e->be) e->be->destroy(e->be);
    weights_free(&e->w);
    safetensors_close(e->st);
    free(e->c_tokens); free(e->c_pos); free(e->c_seq); free(e->c_out_rows); free(e->c_out); free(e->c_sessions);
    free(e->c_amax); free(e->c_amax_dst); free(e->c_samp); free(e->c_score); free(e->c_scores); free(e->c_score_dst);
    free(e->model_dir);
    free(e);
}

const struct model_config *engine_config(const engine *e) { return &e->cfg; }
const char *engine_backend_name(const engine *e) { return e->be->name; }
int engine_invariant_tokens(const engine *e) { return e->be->invariant_tokens; }
int engine_max_batch_tokens(const engine *e) { return e->be->max_batch_tokens; }
bool engine_device_sampling(const engine *e) { return e->be->device_sampling != 0; }
bool engine_row_scores(const engine *e) { return e->be->row_scores != 0; }
const char *engine_model_dir(const engine *e) { return e->model_dir; }
double engine_load_seconds(const engine *e) { return e->load_seconds; }

size_t engine_tensor_count(const engine *e) { return (size_t)e->st->n_tensors; }
size_t engine_tensor_bytes(const engine *e) { return e->st->total_bytes; }
size_t engine_bound_tensors(const engine *e) { return e->w.n_bound; }
size_t engine_quant_bytes(const engine *e) { return e->w.quant_bytes; }

int session_open(engine *e, session **out, int max_seq, char *err, size_t errlen) {
    *out = NULL;
    if (max_seq < 1) return errorf(err, errlen, ST_INVALID, "session capacity must be at least 1 token (got %d)", max_seq);
    if (e->cfg.max_position > 0 && max_seq > e->cfg.max_position)
        return errorf(err, errlen, ST_RANGE, "session capacity %d exceeds max_position_embeddings %d", max_seq, e->cfg.max_position);
    session *s = calloc(1, sizeof *s);
    if (!s) return errorf(err, errlen, ST_NOMEM, "out of memory");
    s->e = e;
    s->cap = max_seq;
    s->tokens = malloc((size_t)max_seq * sizeof(int32_t));
    if (!s->tokens) { free(s); return errorf(err, errlen, ST_NOMEM, "out of memory for %d tokens", max_seq); }
    int rc = e->be->session_create(e->be, max_seq, &s->bs, err, errlen);
    if (rc) { free(s->tokens); free(s); return rc; }
    *out = s;
    return 0;
}

void session_close(session *s) {
    if (!s) return;
    s->e->be->session_destroy(s->e->be, s->bs);
    free(s->tokens);
    free(s);
}

void session_reset(session *s) {
    s->e->be->session_reset(s->e->be, s->bs);
    s->len = 0;
}

int session_length(const session *s) { return s->len; }
int session_capacity(const session *s) { return s->cap; }
const int32_t *session_tokens(const session *s) { return s->tokens; }

/* Runs the backend over the assembled chunk; hands the output rows' argmax ids and
 * scores to their batch_seq destinations when any row wants them. */
static int forward_chunk(engine *e, int n, int n_sess, int n_out, bool want_amax, bool want_samp, bool want_score,
                         char *err, size_t errlen) {
    struct fwd_batch b = {.n_tokens = n, .tokens = e->c_tokens, .pos = e->c_pos, .seq = e->c_seq,
                          .sessions = e->c_sessions, .n_seqs = n_sess, .n_out = n_out,
                          .out_rows = e->c_out_rows, .out_logits = e->c_out,
                          .out_argmax = want_amax ? e->c_amax : NULL, .out_sampling = want_samp ? e->c_samp : NULL,
                          .out_score = want_score ? e->c_score : NULL, .out_scores = want_score ? e->c_scores : NULL};
    int rc = e->be->forward(e->be, &b, err, errlen);
    if (rc) return rc;
    for (int i = 0; want_amax && i < n_out; i++)
        if (e->c_amax_dst[i]) *e->c_amax_dst[i] = e->c_amax[i];
    for (int i = 0; want_score && i < n_out; i++)
        if (e->c_score_dst[i]) *e->c_score_dst[i] = e->c_scores[i];
    return 0;
}

int engine_forward(engine *e, struct batch_seq *seqs, int n_seqs, char *err, size_t errlen) {
    const struct model_config *c = &e->cfg;
    /* Validate everything before touching any state. */
    for (int i = 0; i < n_seqs; i++) {
        const struct batch_seq *q = &seqs[i];
        if (!q->s || q->s->e != e) return errorf(err, errlen, ST_INVALID, "batch entry %d has no session of this engine", i);
        if (q->n_tokens < 1) return errorf(err, errlen, ST_INVALID, "batch entry %d has no tokens", i);
        if (q->n_tokens > q->s->cap - q->s->len)
            return errorf(err, errlen, ST_RANGE, "sequence full: %d tokens + %d new exceed the session capacity %d",
                          q->s->len, q->n_tokens, q->s->cap);
        for (int k = 0; k < q->n_tokens; k++)
            if (q->tokens[k] < 0 || q->tokens[k] >= c->vocab)
                return errorf(err, errlen, ST_INVALID, "token id %d is outside the vocabulary (0..%d)", q->tokens[k], c->vocab - 1);
        for (int j = 0; j < i; j++)
            if (seqs[j].s == q->s) return errorf(err, errlen, ST_INVALID, "a session appears twice in one batch");
        const struct row_sampling *rs = q->sampling;
        if (rs) {
            if (!e->be->device_sampling)
                return errorf(err, errlen, ST_UNSUPPORTED, "batch entry %d: the %s backend has no device sampler", i,
                              e->be->name);
            if (!q->argmax || q->logits || q->all_logits)
                return errorf(err, errlen, ST_INVALID, "batch entry %d: device sampling needs an argmax destination and "
                              "no logits", i);
            if (!(rs->temperature > 0.0f) || !isfinite(rs->temperature) || !(rs->top_p > 0.0f && rs->top_p <= 1.0f) ||
                !(rs->min_p >= 0.0f && rs->min_p <= 1.0f) || rs->top_k < 0 || !(rs->u >= 0.0 && rs->u < 1.0))
                return errorf(err, errlen, ST_INVALID, "batch entry %d: device sampling parameters out of range "
                              "(temperature %g, top_p %g, min_p %g, top_k %d, u %g)", i, rs->temperature, rs->top_p,
                              rs->min_p, rs->top_k, rs->u);
        }
        if (q->score) {
            if (!e->be->row_scores)
                return errorf(err, errlen, ST_UNSUPPORTED, "batch entry %d: the %s backend does not score rows", i, e->be->name);
            if (q->all_logits || !q->scores)
                return errorf(err, errlen, ST_INVALID, "batch entry %d: scored rows need score destinations and no all_logits", i);
            for (int k = 0; k < q->n_tokens; k++)
                if (q->score[k].token >= c->vocab || (q->score[k].token >= 0 && (q->score[k].n_top < 0 ||
                                                                                 q->score[k].n_top > SAMPLER_MAX_TOP_LOGPROBS)))
                    return errorf(err, errlen, ST_INVALID, "batch entry %d row %d: score of token %d with %d alternatives "
                                  "(vocabulary %d, at most %d)", i, k, q->score[k].token, q->score[k].n_top, c->vocab,
                                  SAMPLER_MAX_TOP_LOGPROBS);
        }
    }
    const int cap = e->be->max_batch_tokens;
    int n = 0, n_sess = 0, n_out = 0;
    bool want_amax = false, want_samp = false, want_score = false;
    struct backend_session *last = NULL;
    for (int i = 0; i < n_seqs; i++) {
        struct batch_seq *q = &seqs[i];
        for (int k = 0; k < q->n_tokens; k++) {
            if (n == cap) { /* flush a full chunk */
                int rc = forward_chunk(e, n, n_sess, n_out, want_amax, want_samp, want_score, err, errlen);
                if (rc) return rc;
                n = n_sess = n_out = 0;
                want_amax = want_samp = want_score = false;
                last = NULL;
            }
            if (q->s->bs != last) {
                e->c_sessions[n_sess++] = q->s->bs;
                last = q->s->bs;
            }
            const int pos = q->s->len;
            e->c_tokens[n] = q->tokens[k];
            e->c_pos[n] = pos;
            e->c_seq[n] = n_sess - 1;
            const bool out = (q->logits || q->argmax) && (q->all_logits || k == q->n_tokens - 1);
            const bool scored = q->score && q->score[k].token >= 0;
            if (out || scored) {
                const int row = q->all_logits ? k : 0;
                e->c_out_rows[n_out] = n;
                e->c_out[n_out] = out && q->logits ? q->logits + (size_t)row * c->vocab : NULL;
                e->c_amax_dst[n_out] = out && q->argmax ? q->argmax + row : NULL;
                want_amax |= out && q->argmax != NULL;
                e->c_samp[n_out] = out && q->sampling ? *q->sampling : (struct row_sampling){0};
                want_samp |= out && q->sampling != NULL;
                e->c_score[n_out] = scored ? q->score[k] : (struct row_score_req){-1, 0};
                e->c_score_dst[n_out] = scored ? q->scores + k : NULL;
                want_score |= scored;
                n_out++;
            }
            q->s->tokens[pos] = q->tokens[k];
            q->s->len++;
            n++;
        }
    }
    return n ? forward_chunk(e, n, n_sess, n_out, want_amax, want_samp, want_score, err, errlen) : 0;
}

int engine_decode_greedy(engine *e, session *s, int32_t first, int n_steps, int32_t *out_ids, double *step_end,
                         char *err, size_t errlen) {
    const struct model_config *c = &e->cfg;
    if (n_steps < 1) return 0;
    if (s->e != e) return errorf(err, errlen, ST_INVALID, "session belongs to another engine");
    if (n_steps > s->cap - s->len)
        return errorf(err, errlen, ST_RANGE, "sequence full: %d tokens + %d steps exceed the session capacity %d", s->len,
                      n_steps, s->cap);
    if (first < 0 || first >= c->vocab) return errorf(err, errlen, ST_INVALID, "token id %d is outside the vocabulary", first);
    const double t0 = now_seconds();
    if (e->be->decode_greedy) {
        const int pos = s->len;
        int rc = e->be->decode_greedy(e->be, s->bs, pos, first, n_steps, out_ids, step_end, err, errlen);
        if (rc) return rc;
        /* the session fed `first` and then all but the last chosen id */
        s->tokens[s->len++] = first;
        for (int i = 0; i + 1 < n_steps; i++) s->tokens[s->len++] = out_ids[i];
        return 0;
    }
    int32_t tok = first;
    for (int i = 0; i < n_steps; i++) {
        struct batch_seq q = {.s = s, .tokens = &tok, .n_tokens = 1, .argmax = &out_ids[i]};
        int rc = engine_forward(e, &q, 1, err, errlen);
        if (rc) return rc;
        tok = out_ids[i];
        if (step_end) step_end[i] = now_seconds() - t0;
    }
    return 0;
}

size_t engine_state_bytes(const engine *e) { return e->be->state_bytes ? e->be->state_bytes(e->be) : 0; }
size_t engine_kv_bytes_per_token(const engine *e) { return e->be->kv_bytes_per_token ? e->be->kv_bytes_per_token(e->be) : 0; }

static int no_transfer(const engine *e, char *err, size_t errlen) {
    return errorf(err, errlen, ST_UNSUPPORTED, "the %s backend cannot save or restore session state", e->be->name);
}

int session_save_state(session *s, void *dst, char *err, size_t errlen) {
    struct backend *b = s->e->be;
    if (!b->state_save) return no_transfer(s->e, err, errlen);
    return b->state_save(b, s->bs, dst, err, errlen);
}

int session_load_state(session *s, const void *src, const int32_t *tokens, int n, char *err, size_t errlen) {
    struct backend *b = s->e->be;
    if (!b->state_load) return no_transfer(s->e, err, errlen);
    if (n < 0 || n > s->cap) return errorf(err, errlen, ST_RANGE, "restoring %d tokens into a session of capacity %d", n, s->cap);
    int rc = b->state_load(b, s->bs, src, err, errlen);
    if (rc) return rc;
    memcpy(s->tokens, tokens, (size_t)n * sizeof(int32_t));
    s->len = n;
    return 0;
}

int session_save_kv(session *s, int pos0, int n, void *dst, char *err, size_t errlen) {
    struct backend *b = s->e->be;
    if (!b->kv_save) return no_transfer(s->e, err, errlen);
    return b->kv_save(b, s->bs, pos0, n, dst, err, errlen);
}

int session_load_kv(session *s, int pos0, int n, const void *src, char *err, size_t errlen) {
    struct backend *b = s->e->be;
    if (!b->kv_load) return no_transfer(s->e, err, errlen);
    return b->kv_load(b, s->bs, pos0, n, src, err, errlen);
}

const char *engine_device_name(const engine *e) {
    return e->be->device_name ? e->be->device_name(e->be) : e->be->name;
}

int engine_copy_gbs(engine *e, size_t bytes, double *gbs, char *err, size_t errlen) {
    if (!e->be->copy_gbs) return errorf(err, errlen, ST_UNSUPPORTED, "the %s backend does not measure copy bandwidth", e->be->name);
    return e->be->copy_gbs(e->be, bytes, gbs, err, errlen);
}

size_t engine_device_mem_used(engine *e) { return e->be->device_mem_used ? e->be->device_mem_used(e->be) : 0; }

void *engine_host_alloc(engine *e, size_t bytes) {
    return e->be->host_alloc ? e->be->host_alloc(e->be, bytes) : malloc(bytes);
}

bool engine_host_pinned(const engine *e) { return e->be->host_alloc != NULL; }

void engine_host_free(engine *e, void *p) {
    if (!p) return;
    if (e->be->host_free) e->be->host_free(e->be, p);
    else free(p);
}
