/* model/sampler.c — the per-request token sampler (see sampler.h for the
 * semantics). It owns the request's RNG (xoshiro256** seeded by splitmix64, so
 * the same seed gives the same draws on every platform), its copy of the
 * logit_bias list (in its params, validated at sampler_new), the penalty
 * bookkeeping (counts + a list of distinct ids so applying penalties costs
 * O(distinct tokens), not O(vocab)), and scratch buffers sized to the
 * vocabulary at sampler_new. Filters run in O(vocab) expected time: top_k and
 * top_p use quickselect-style partitioning rather than a full sort. */
#include "model/sampler.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/status.h"

struct sampler {
    struct sampler_params p;
    int vocab;
    uint64_t rng[4];
    bool penalties; /* any penalty active */
    /* penalty state (allocated only when penalties are on) */
    int32_t *gen_count; /* [vocab] generated-token counts */
    uint8_t *seen;      /* [vocab] 1 if seen (prompt or generated) */
    int32_t *gen_list;  /* distinct generated ids */
    int n_gen_list;
    int32_t *seen_list; /* distinct seen ids */
    int n_seen_list;
    /* sampling scratch (allocated only when temperature > 0) */
    float *probs;  /* [vocab] */
    int32_t *idx;  /* [vocab] */
    /* copy of the (biased) logits for logprobs when penalties modify logits */
    float *raw;    /* [vocab] or NULL */
    /* constrained output (sampler_set_constraint) */
    bool has_con;
    struct sampler_constraint con;
    uint8_t *allowed; /* [vocab] this step's answers: 0 not asked, 1 allowed, 2 not */
};

struct sampler_params sampler_params_default(void) {
    struct sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.top_k = 0;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

static uint64_t auto_seed(void) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&mu);
    uint64_t c = ++counter;
    pthread_mutex_unlock(&mu);
    return ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ (c << 40) ^ c;
}

int sampler_new(sampler **out, int vocab, const struct sampler_params *p, char *err, size_t errlen) {
    *out = NULL;
    if (vocab <= 0) return errorf(err, errlen, ST_INVALID, "sampler: vocab must be > 0");
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return errorf(err, errlen, ST_INVALID, "temperature must be a finite number >= 0");
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return errorf(err, errlen, ST_INVALID, "top_p must be in (0, 1]");
    if (p->top_k < 0) return errorf(err, errlen, ST_INVALID, "top_k must be >= 0");
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return errorf(err, errlen, ST_INVALID, "min_p must be in [0, 1]");
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return errorf(err, errlen, ST_INVALID, "presence_penalty and frequency_penalty must be finite");
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return errorf(err, errlen, ST_INVALID, "repetition_penalty must be a finite number > 0");
    if (p->top_logprobs < 0 || p->top_logprobs > SAMPLER_MAX_TOP_LOGPROBS)
        return errorf(err, errlen, ST_INVALID, "top_logprobs must be in [0, %d]", SAMPLER_MAX_TOP_LOGPROBS);
    if (p->n_logit_bias < 0 || p->n_logit_bias > SAMPLER_MAX_LOGIT_BIAS)
        return errorf(err, errlen, ST_INVALID, "logit_bias may hold at most %d entries", SAMPLER_MAX_LOGIT_BIAS);
    for (int i = 0; i < p->n_logit_bias; i++) {
        const struct logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= vocab)
            return errorf(err, errlen, ST_INVALID, "logit_bias: token id %d is outside the vocabulary [0, %d)", b->token, vocab);
        if (!(b->bias >= -SAMPLER_MAX_BIAS && b->bias <= SAMPLER_MAX_BIAS))
            return errorf(err, errlen, ST_INVALID, "logit_bias: the bias of token %d must be in [-100, 100]", b->token);
        for (int k = 0; k < i; k++)
            if (p->logit_bias[k].token == b->token)
                return errorf(err, errlen, ST_INVALID, "logit_bias: token id %d appears twice", b->token);
    }

    sampler *s = calloc(1, sizeof *s);
    if (!s) return errorf(err, errlen, ST_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->vocab = vocab;
    uint64_t seed = p->has_seed ? p->seed : auto_seed();
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&seed);
    s->penalties = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f || p->repetition_penalty != 1.0f;
    bool ok = true;
    if (s->penalties) {
        s->gen_count = calloc((size_t)vocab, sizeof *s->gen_count);
        s->seen = calloc((size_t)vocab, 1);
        s->gen_list = malloc((size_t)vocab * sizeof *s->gen_list);
        s->seen_list = malloc((size_t)vocab * sizeof *s->seen_list);
        ok = s->gen_count && s->seen && s->gen_list && s->seen_list;
    }
    if (ok && p->temperature > 0.0f && p->top_k != 1) {
        s->probs = malloc((size_t)vocab * sizeof *s->probs);
        s->idx = malloc((size_t)vocab * sizeof *s->idx);
        ok = s->probs && s->idx;
    }
    if (ok && (p->logprobs || p->top_logprobs > 0) && s->penalties) {
        s->raw = malloc((size_t)vocab * sizeof *s->raw);
        ok = s->raw != NULL;
    }
    if (!ok) {
        sampler_free(s);
        return errorf(err, errlen, ST_NOMEM, "sampler: out of memory for vocab %d", vocab);
    }
    *out = s;
    return ST_OK;
}

void sampler_free(sampler *s) {
    if (!s) return;
    free(s->gen_count);
    free(s->seen);
    free(s->gen_list);
    free(s->seen_list);
    free(s->probs);
    free(s->idx);
    free(s->raw);
    free(s->allowed);
    free(s);
}

int sampler_set_constraint(sampler *s, const struct sampler_constraint *c) {
    if (!s->allowed) s->allowed = malloc((size_t)s->vocab);
    if (!s->allowed) return ST_NOMEM;
    s->con = *c;
    s->has_con = true;
    return ST_OK;
}

static bool allowed(sampler *s, int32_t t) {
    uint8_t *m = &s->allowed[t];
    if (!*m) *m = s->con.allow(s->con.ctx, t) ? 1 : 2;
    return *m == 1;
}

/* Greedy over the allowed tokens: the first maximal logit among them (NaN never
 * wins); a token is asked about only when it would beat the best so far. -1
 * when none is allowed. */
static int32_t allowed_argmax(sampler *s, const float *logits) {
    int32_t best = -1;
    for (int i = 0; i < s->vocab; i++) {
        const float v = logits[i];
        if (v == v && (best < 0 || v > logits[best]) && allowed(s, i)) best = i;
    }
    return best;
}

void sampler_accept(sampler *s, const int32_t *tokens, int n, bool is_prompt) {
    if (s->has_con && !is_prompt)
        for (int i = 0; i < n; i++) s->con.advance(s->con.ctx, tokens[i]);
    if (!s->penalties) return;
    for (int i = 0; i < n; i++) {
        int32_t t = tokens[i];
        if (t < 0 || t >= s->vocab) continue;
        if (!s->seen[t]) {
            s->seen[t] = 1;
            s->seen_list[s->n_seen_list++] = t;
        }
        if (!is_prompt) {
            if (s->gen_count[t]++ == 0) s->gen_list[s->n_gen_list++] = t;
        }
    }
}

int32_t sampler_argmax(const float *logits, int n) {
    int32_t best = -1;
    float bv = 0.0f;
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (v != v) continue; /* NaN never wins */
        if (best < 0 || v > bv) {
            best = i;
            bv = v;
        }
    }
    return best;
}

bool sampler_argmax_only(const sampler *s) {
    /* mirrors sampler_sample: no logprobs, no penalties, and its greedy branch */
    const bool want_lp = s->p.logprobs || s->p.top_logprobs > 0;
    return !want_lp && !s->penalties && s->p.n_logit_bias == 0 && !s->has_con &&
           (s->p.temperature <= 0.0f || s->p.top_k == 1 || !s->probs);
}

bool sampler_device_row(sampler *s, struct row_sampling *rs) {
    const bool want_lp = s->p.logprobs || s->p.top_logprobs > 0;
    if (want_lp || s->penalties || s->p.n_logit_bias != 0 || s->has_con || !(s->p.temperature > 0.0f) ||
        s->p.top_k == 1 || !s->probs)
        return false;
    rs->temperature = s->p.temperature;
    rs->top_p = s->p.top_p;
    rs->min_p = s->p.min_p;
    rs->top_k = s->p.top_k;
    rs->u = rng_uniform(s->rng);
    return true;
}

/* Log-sum-exp of the raw logits (NaN ignored) and the top-n ids by logit. */
static double logsumexp(const float *l, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (l[i] > m) m = l[i];
    if (m == -INFINITY) return -INFINITY;
    if (m == INFINITY) return INFINITY;
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        if (l[i] == l[i]) sum += exp((double)l[i] - m);
    return m + log(sum);
}

static int top_n(const float *l, int vocab, int n, int32_t *ids, float *vals) {
    int k = 0;
    for (int i = 0; i < vocab; i++) {
        float v = l[i];
        if (v != v) continue;
        if (k == n && !(v > vals[k - 1])) continue;
        int j = k < n ? k++ : n - 1;
        while (j > 0 && vals[j - 1] < v) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = v;
        ids[j] = i;
    }
    return k;
}

void sampler_row_logprobs(const float *logits, int vocab, int32_t token, int n_top, struct sample_result *res) {
    const double lse = logsumexp(logits, vocab);
    if (n_top > SAMPLER_MAX_TOP_LOGPROBS) n_top = SAMPLER_MAX_TOP_LOGPROBS;
    res->token = token;
    res->n_top = n_top > 0 ? top_n(logits, vocab, n_top, res->top_ids, res->top_logprobs) : 0;
    for (int i = 0; i < res->n_top; i++) res->top_logprobs[i] = (float)(res->top_logprobs[i] - lse);
    res->logprob = (float)(logits[token] - lse);
    if (!(res->logprob == res->logprob)) res->logprob = -INFINITY;
}

static void apply_penalties(sampler *s, float *l) {
    float r = s->p.repetition_penalty;
    if (r != 1.0f) {
        for (int i = 0; i < s->n_seen_list; i++) {
            int32_t t = s->seen_list[i];
            l[t] = l[t] > 0.0f ? l[t] / r : l[t] * r;
        }
    }
    float pp = s->p.presence_penalty, fp = s->p.frequency_penalty;
    if (pp != 0.0f || fp != 0.0f) {
        for (int i = 0; i < s->n_gen_list; i++) {
            int32_t t = s->gen_list[i];
            l[t] -= pp + fp * (float)s->gen_count[t];
        }
    }
}

static inline void swap_i32(int32_t *a, int32_t *b) {
    int32_t t = *a;
    *a = *b;
    *b = t;
}

/* Three-way partition of idx[lo, hi) by probs descending around `pv`:
 * [lo, *a) > pv, [*a, *b) == pv, [*b, hi) < pv. */
static void partition3(int32_t *idx, const float *pr, int lo, int hi, float pv, int *a, int *b) {
    int lt = lo, i = lo, gt = hi;
    while (i < gt) {
        float v = pr[idx[i]];
        if (v > pv) swap_i32(&idx[lt++], &idx[i++]);
        else if (v < pv) swap_i32(&idx[i], &idx[--gt]);
        else i++;
    }
    *a = lt;
    *b = gt;
}

static float pivot_of(const int32_t *idx, const float *pr, int lo, int hi, uint64_t *rng) {
    int n = hi - lo;
    float x = pr[idx[lo + (int)(rng_next(rng) % (uint64_t)n)]];
    float y = pr[idx[lo + (int)(rng_next(rng) % (uint64_t)n)]];
    float z = pr[idx[lo + (int)(rng_next(rng) % (uint64_t)n)]];
    if (x > y) { float t = x; x = y; y = t; }
    if (y > z) y = z;
    return x > y ? x : y; /* median of three */
}

/* Reorders idx[0, n) so that its first k entries are the k most probable. */
static void select_top_k(int32_t *idx, const float *pr, int n, int k, uint64_t *rng) {
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        float pv = pivot_of(idx, pr, lo, hi, rng);
        int a, b;
        partition3(idx, pr, lo, hi, pv, &a, &b);
        if (k < a) hi = a;
        else if (k <= b) return;
        else lo = b;
    }
}

/* Reorders idx[0, n) so that a prefix of minimal length has mass >= target;
 * returns that length (>= 1). */
static int select_mass(int32_t *idx, const float *pr, int n, double target, uint64_t *rng) {
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        float pv = pivot_of(idx, pr, lo, hi, rng);
        int a, b;
        partition3(idx, pr, lo, hi, pv, &a, &b);
        double gt = 0.0;
        for (int i = lo; i < a; i++) gt += pr[idx[i]];
        if (gt >= target && a > lo) {
            hi = a;
            continue;
        }
        double eq = (double)pv * (b - a);
        if (gt + eq >= target) {
            int need = pv > 0.0f ? (int)ceil((target - gt) / pv) : 1;
            if (need < 1) need = 1;
            if (need > b - a) need = b - a;
            return a + need;
        }
        target -= gt + eq;
        lo = b;
    }
    return hi < 1 ? 1 : hi;
}

/* The sampling candidates: logits / T, then min_p, top_k and top_p, into
 * s->idx[0, n) with their weights in s->probs. 0 when the row has no finite
 * maximum (all -inf or NaN, or a +inf): the caller takes the argmax. */
static int candidates(sampler *s, const float *logits) {
    const int V = s->vocab;
    float m = -INFINITY;
    for (int i = 0; i < V; i++)
        if (logits[i] > m) m = logits[i];
    if (!(m > -INFINITY) || m == INFINITY) return 0;
    float invt = 1.0f / s->p.temperature, minp = s->p.min_p;
    int n = 0;
    for (int i = 0; i < V; i++) {
        float v = logits[i];
        float pr = v == v ? expf((v - m) * invt) : 0.0f;
        s->probs[i] = pr;
        if (pr > 0.0f && pr >= minp) s->idx[n++] = i;
    }
    if (n == 0) s->idx[n++] = sampler_argmax(logits, V);
    if (s->p.top_k > 0 && n > s->p.top_k) {
        select_top_k(s->idx, s->probs, n, s->p.top_k, s->rng);
        n = s->p.top_k;
    }
    if (s->p.top_p < 1.0f && n > 1) {
        double total = 0.0;
        for (int i = 0; i < n; i++) total += s->probs[s->idx[i]];
        n = select_mass(s->idx, s->probs, n, (double)s->p.top_p * total, s->rng);
    }
    return n;
}

int32_t sampler_sample(sampler *s, float *logits, struct sample_result *res) {
    const int V = s->vocab;
    bool want_lp = s->p.logprobs || s->p.top_logprobs > 0;
    double lse = 0.0;
    const float *raw = logits;
    for (int i = 0; i < s->p.n_logit_bias; i++) logits[s->p.logit_bias[i].token] += s->p.logit_bias[i].bias;
    if (want_lp) {
        lse = logsumexp(logits, V);
        if (res) {
            res->n_top = 0;
            if (s->p.top_logprobs > 0) {
                res->n_top = top_n(logits, V, s->p.top_logprobs, res->top_ids, res->top_logprobs);
                for (int i = 0; i < res->n_top; i++) res->top_logprobs[i] = (float)(res->top_logprobs[i] - lse);
            }
        }
        if (s->raw) {
            memcpy(s->raw, logits, (size_t)V * sizeof *logits);
            raw = s->raw;
        }
    } else if (res) {
        res->n_top = 0;
    }
    if (s->penalties) apply_penalties(s, logits);

    if (s->has_con) memset(s->allowed, 0, (size_t)V);
    int32_t tok;
    if (s->p.temperature <= 0.0f || s->p.top_k == 1 || !s->probs) {
        tok = s->has_con ? allowed_argmax(s, logits) : sampler_argmax(logits, V);
    } else {
        /* Constrained: when every candidate is allowed, the set and its weights are
         * the ones masking every disallowed token first would give, having asked only
         * about the candidates (the RNG may have moved differently: same distribution,
         * not the same bits as a pre-masked row); otherwise every disallowed token is masked in one pass
         * (redoing the filters candidate by candidate can take thousands of rounds
         * where few tokens fit, e.g. top_k 20 inside a JSON key) and the filters run
         * again. */
        int n = candidates(s, logits);
        if (n > 0 && s->has_con) {
            bool bad = false;
            for (int i = 0; i < n && !bad; i++) bad = !allowed(s, s->idx[i]);
            if (bad) {
                for (int i = 0; i < V; i++)
                    if (logits[i] > -INFINITY && !allowed(s, i)) logits[i] = -INFINITY;
                n = candidates(s, logits);
            }
        }
        if (n == 0) {
            tok = s->has_con ? allowed_argmax(s, logits) : sampler_argmax(logits, V);
        } else {
            double total = 0.0;
            for (int i = 0; i < n; i++) total += s->probs[s->idx[i]];
            double r = rng_uniform(s->rng) * total, acc = 0.0;
            tok = s->idx[n - 1];
            for (int i = 0; i < n; i++) {
                acc += s->probs[s->idx[i]];
                if (r < acc) {
                    tok = s->idx[i];
                    break;
                }
            }
        }
    }
    if (tok < 0) tok = 0; /* all-NaN logits: a broken model; keep the id valid */
    if (res) {
        res->token = tok;
        res->logprob = want_lp ? (float)(raw[tok] - lse) : 0.0f;
        if (want_lp && !(res->logprob == res->logprob)) res->logprob = -INFINITY;
    }
    return tok;
}
