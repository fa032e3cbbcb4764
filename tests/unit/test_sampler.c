/* tests/unit/test_sampler.c — sampler semantics: greedy tie/NaN rules, seeded
 * reproducibility, top_k / top_p / min_p support sets, penalties, logprobs,
 * logit_bias (forcing, banning, logprobs of the biased distribution, validation),
 * constraints (greedy and top_k over the allowed tokens, an all-allowing one
 * changes nothing). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/sampler.h"

#define V 1000

static float base[V], buf[V];

static void fill(void) {
    for (int i = 0; i < V; i++) base[i] = (float)((i * 7919) % 1000) / 100.0f; /* 0 .. 9.99, distinct */
}

static int32_t draw(sampler *s, struct sample_result *r) {
    memcpy(buf, base, sizeof buf);
    return sampler_sample(s, buf, r);
}

/* log Σ exp(l) over base[] with bias b added to token k (double) */
static double lse_biased(int k, double b) {
    double m = 0;
    for (int i = 0; i < V; i++) m = fmax(m, base[i] + (i == k ? b : 0));
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(base[i] + (i == k ? b : 0) - m);
    return m + log(z);
}

/* constraint: tokens whose id is a multiple of `mod` (mod 1: everything) */
struct con_ctx {
    int mod, asked, advanced, last;
};
static bool con_allow(void *ctx, int32_t t) {
    struct con_ctx *c = ctx;
    c->asked++;
    return t % c->mod == 0;
}
static void con_advance(void *ctx, int32_t t) {
    struct con_ctx *c = ctx;
    c->advanced++;
    c->last = t;
}

/* sampler_row_logprobs (echo's prompt tokens): log-softmax of the raw row at any token, the
 * top n most likely first, NaN ignored, a -inf logit a -inf logprob; the row unchanged. */
static void test_row_logprobs(void) {
    fill();
    memcpy(buf, base, sizeof buf);
    buf[3] = NAN;
    buf[5] = -INFINITY;
    double m = 0, z = 0;
    for (int i = 0; i < V; i++)
        if (i != 3 && i != 5) m = fmax(m, base[i]);
    for (int i = 0; i < V; i++)
        if (i != 3 && i != 5) z += exp(base[i] - m);
    const double lse = m + log(z);
    struct sample_result r;
    sampler_row_logprobs(buf, V, 17, 4, &r);
    CHECK(r.token == 17 && r.n_top == 4, "row logprobs: token %d n_top %d", r.token, r.n_top);
    CHECK_CLOSE(r.logprob, base[17] - lse, 1e-5, 0, "row logprob of token 17");
    int best = 0;
    for (int i = 1; i < V; i++)
        if (i != 3 && i != 5 && base[i] > base[best]) best = i;
    CHECK(r.top_ids[0] == best, "row logprobs: top id %d want %d", r.top_ids[0], best);
    CHECK_CLOSE(r.top_logprobs[0], base[best] - lse, 1e-5, 0, "row logprobs: top value");
    for (int i = 1; i < 4; i++) CHECK(r.top_logprobs[i] <= r.top_logprobs[i - 1], "row logprobs sorted");
    sampler_row_logprobs(buf, V, 5, 0, &r);
    CHECK(r.logprob == -INFINITY && r.n_top == 0, "a -inf logit: logprob %g, n_top %d", r.logprob, r.n_top);
    sampler_row_logprobs(buf, V, 3, 30, &r);
    CHECK(r.logprob == -INFINITY && r.n_top == SAMPLER_MAX_TOP_LOGPROBS, "a NaN logit: %g, n_top %d (capped)", r.logprob,
          r.n_top);
    CHECK(isnan(buf[3]) && buf[5] == -INFINITY && buf[17] == base[17], "the row is unchanged");
}

static void test_constraint(void) {
    char err[256];
    struct sampler_params p = sampler_params_default();
    struct con_ctx cc = {.mod = 7};
    struct sampler_constraint con = {con_allow, con_advance, &cc};
    /* greedy: the best allowed token; only tokens that would beat it are asked about */
    sampler *s;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    CHECK(sampler_set_constraint(s, &con) == 0, "set");
    CHECK(!sampler_argmax_only(s), "a constrained sampler needs the logits row");
    int32_t want = -1;
    for (int i = 0; i < V; i++)
        if (i % 7 == 0 && (want < 0 || base[i] > base[want])) want = i;
    CHECK(draw(s, NULL) == want, "greedy over the allowed: want %d", want);
    CHECK(cc.asked < V / 2, "asked %d of %d", cc.asked, V);
    sampler_accept(s, &want, 1, false);
    sampler_accept(s, &want, 1, true); /* prompt tokens are not output */
    CHECK(cc.advanced == 1 && cc.last == want, "advance per generated token: %d", cc.advanced);
    sampler_free(s);

    /* top_k 3 over the allowed tokens (mask first): exactly the 3 best allowed are drawn */
    p.temperature = 5.0f;
    p.top_k = 3;
    p.seed = 5;
    p.has_seed = true;
    int32_t top[3] = {-1, -1, -1};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < V; i++)
            if (i % 7 == 0 && i != top[0] && i != top[1] && (top[k] < 0 || base[i] > base[top[k]])) top[k] = i;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    sampler_set_constraint(s, &con);
    int hits[3] = {0, 0, 0}, other = 0;
    for (int n = 0; n < 3000; n++) {
        int32_t t = draw(s, NULL);
        int k = t == top[0] ? 0 : t == top[1] ? 1 : t == top[2] ? 2 : -1;
        if (k < 0) other++;
        else hits[k]++;
    }
    CHECK(other == 0 && hits[0] > 0 && hits[1] > 0 && hits[2] > 0, "support: %d %d %d other %d", hits[0], hits[1],
          hits[2], other);
    sampler_free(s);

    /* everything allowed: the same draws as no constraint at all, bit for bit */
    cc.mod = 1;
    p.top_k = 0;
    p.top_p = 0.9f;
    sampler *a, *b;
    CHECK(sampler_new(&a, V, &p, err, sizeof err) == 0 && sampler_new(&b, V, &p, err, sizeof err) == 0, "%s", err);
    sampler_set_constraint(b, &con);
    bool same = true;
    for (int n = 0; n < 200; n++) same = same && draw(a, NULL) == draw(b, NULL);
    CHECK(same, "an all-allowing constraint changes nothing");
    sampler_free(a);
    sampler_free(b);
}

static void test_logit_bias(int32_t best) {
    char err[256];
    sampler *s;
    struct sample_result r;
    int32_t low = 0; /* base[0] == 0: the least likely token */
    for (int i = 0; i < V; i++)
        if (base[i] < base[low]) low = i;

    /* greedy: +100 forces the least likely token; -100 bans the argmax (the runner-up wins) */
    struct sampler_params p = sampler_params_default();
    p.n_logit_bias = 1;
    p.logit_bias[0] = (struct logit_bias){.token = low, .bias = 100.0f};
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    CHECK(!sampler_argmax_only(s), "a logit_bias must disable the argmax-only path");
    CHECK(draw(s, NULL) == low && draw(s, NULL) == low, "+100 forces token %d under greedy", low);
    sampler_free(s);
    p.logit_bias[0] = (struct logit_bias){.token = best, .bias = -100.0f};
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    int32_t second = draw(s, NULL);
    CHECK(second != best && base[second] == 9.98f, "-100 bans the argmax: got %d (%g)", second, base[second]);
    sampler_free(s);
    /* a zero bias is still a bias: no argmax-only path, same token */
    p.logit_bias[0].bias = 0.0f;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0 && !sampler_argmax_only(s) && draw(s, NULL) == best, "zero bias");
    sampler_free(s);

    /* sampling: the forced token always, the banned one never */
    p = sampler_params_default();
    p.temperature = 1.0f;
    p.has_seed = true;
    p.seed = 3;
    p.n_logit_bias = 2;
    p.logit_bias[0] = (struct logit_bias){.token = low, .bias = 100.0f};
    p.logit_bias[1] = (struct logit_bias){.token = best, .bias = -100.0f};
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    int forced = 0;
    for (int i = 0; i < 200; i++) forced += draw(s, NULL) == low;
    CHECK(forced == 200, "+100 under sampling: %d / 200", forced);
    sampler_free(s);
    p.n_logit_bias = 1;
    p.logit_bias[0] = (struct logit_bias){.token = best, .bias = -100.0f};
    p.top_k = 3;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    int banned = 0;
    for (int i = 0; i < 500; i++) banned += draw(s, NULL) == best;
    CHECK(banned == 0, "-100 under top_k 3 sampling: the argmax drawn %d times", banned);
    sampler_free(s);

    /* logprobs describe the biased distribution (before penalties and temperature) */
    int32_t k = 0; /* base[k] == 6: with +4 it becomes the argmax (10 > 9.99) */
    while (k < V - 1 && base[k] != 6.0f) k++;
    p = sampler_params_default();
    p.logprobs = true;
    p.top_logprobs = 3;
    p.n_logit_bias = 1;
    p.logit_bias[0] = (struct logit_bias){.token = k, .bias = 4.0f};
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    draw(s, &r);
    double lse = lse_biased(k, 4.0);
    const int32_t want = base[k] + 4.0f > 9.99f ? k : best;
    CHECK(r.token == want, "biased greedy token %d want %d", r.token, want);
    CHECK_CLOSE(r.logprob, base[want] + (want == k ? 4.0 : 0) - lse, 1e-4, 0, "chosen logprob is biased");
    int found = 0;
    for (int i = 0; i < r.n_top; i++)
        if (r.top_ids[i] == k) {
            found = 1;
            CHECK_CLOSE(r.top_logprobs[i], base[k] + 4.0 - lse, 1e-4, 0, "top logprob of the biased token");
        }
    CHECK(found && want == k, "biased token %d (%g) missing from the top list", k, base[k] + 4.0f);
    sampler_free(s);
    /* +100: the forced token's logprob is ~0; the others' drop by ~100 */
    p.logit_bias[0] = (struct logit_bias){.token = low, .bias = 100.0f};
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    draw(s, &r);
    CHECK(r.token == low && r.top_ids[0] == low && r.logprob > -1e-3f && r.logprob <= 0.0f, "forced logprob %g", r.logprob);
    CHECK(r.n_top == 3 && r.top_ids[1] == best && r.top_logprobs[1] < -90.0f, "runner-up logprob %g", r.top_logprobs[1]);
    sampler_free(s);
    /* with a penalty as well (the sampler keeps a copy of the biased row): the bias counts, the penalty does not */
    p.logit_bias[0] = (struct logit_bias){.token = k, .bias = 4.0f};
    p.repetition_penalty = 3.0f;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    sampler_accept(s, &k, 1, true);
    draw(s, &r);
    CHECK(r.token == best, "penalised biased token not chosen: %d", r.token);
    CHECK_CLOSE(r.logprob, base[best] - lse, 1e-4, 0, "logprob with bias and penalty");
    for (int i = 0; i < r.n_top; i++)
        if (r.top_ids[i] == k) CHECK_CLOSE(r.top_logprobs[i], base[k] + 4.0 - lse, 1e-4, 0, "top logprob, penalty ignored");
    sampler_free(s);

    /* validation names logit_bias */
    const struct { int32_t token; float bias; int n; } bad[] = {
        {-1, 1, 1}, {V, 1, 1}, {3, 100.5f, 1}, {3, -101, 1}, {3, NAN, 1}, {3, INFINITY, 1}, {3, 1, SAMPLER_MAX_LOGIT_BIAS + 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = sampler_params_default();
        p.n_logit_bias = bad[i].n > SAMPLER_MAX_LOGIT_BIAS ? bad[i].n : 1;
        p.logit_bias[0] = (struct logit_bias){.token = bad[i].token, .bias = bad[i].bias};
        s = NULL;
        CHECK(sampler_new(&s, V, &p, err, sizeof err) != 0 && !s && strstr(err, "logit_bias"), "bad logit_bias %zu: %s", i, err);
    }
    p = sampler_params_default();
    p.n_logit_bias = 2;
    p.logit_bias[0] = p.logit_bias[1] = (struct logit_bias){.token = 5, .bias = 1};
    CHECK(sampler_new(&s, V, &p, err, sizeof err) != 0 && strstr(err, "twice"), "duplicate token: %s", err);
    p.n_logit_bias = SAMPLER_MAX_LOGIT_BIAS;
    for (int i = 0; i < SAMPLER_MAX_LOGIT_BIAS; i++) p.logit_bias[i] = (struct logit_bias){.token = i, .bias = -100.0f};
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%d entries: %s", SAMPLER_MAX_LOGIT_BIAS, err);
    int32_t g = draw(s, NULL);
    CHECK(g >= SAMPLER_MAX_LOGIT_BIAS, "every biased id banned: got %d", g);
    sampler_free(s);
}

int main(void) {
    char err[256];
    fill();
    int32_t best = sampler_argmax(base, V);
    CHECK(base[best] == 9.99f, "argmax value %f", base[best]);

    /* greedy: first max wins, NaN never wins */
    float t[4] = {NAN, 1.0f, 3.0f, 3.0f};
    CHECK(sampler_argmax(t, 4) == 2, "tie -> first");
    float all_nan[2] = {NAN, NAN};
    CHECK(sampler_argmax(all_nan, 2) == -1, "all NaN");

    struct sampler_params p = sampler_params_default();
    sampler *s;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    CHECK(draw(s, NULL) == best, "greedy");
    sampler_free(s);

    /* invalid params */
    struct sampler_params bad = p;
    bad.temperature = NAN;
    CHECK(sampler_new(&s, V, &bad, err, sizeof err) != 0 && strstr(err, "temperature"), "nan temperature");
    bad = p;
    bad.top_p = 0.0f;
    CHECK(sampler_new(&s, V, &bad, err, sizeof err) != 0 && strstr(err, "top_p"), "top_p 0");
    bad = p;
    bad.top_logprobs = 21;
    CHECK(sampler_new(&s, V, &bad, err, sizeof err) != 0, "top_logprobs 21");
    bad = p;
    bad.repetition_penalty = 0.0f;
    CHECK(sampler_new(&s, V, &bad, err, sizeof err) != 0, "repetition 0");

    /* seeded reproducibility and variety */
    p.temperature = 5.0f;
    p.has_seed = true;
    p.seed = 42;
    int32_t seq1[50], seq2[50];
    sampler *a, *b;
    CHECK(sampler_new(&a, V, &p, err, sizeof err) == 0, "%s", err);
    CHECK(sampler_new(&b, V, &p, err, sizeof err) == 0, "%s", err);
    int distinct = 0;
    for (int i = 0; i < 50; i++) {
        seq1[i] = draw(a, NULL);
        seq2[i] = draw(b, NULL);
        if (i && seq1[i] != seq1[i - 1]) distinct++;
    }
    CHECK(memcmp(seq1, seq2, sizeof seq1) == 0, "same seed same draws");
    CHECK(distinct > 10, "temperature gives variety (%d)", distinct);
    sampler_free(a);
    sampler_free(b);

    /* top_k: only the k best can appear */
    p.top_k = 3;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    int ok = 1;
    for (int i = 0; i < 300; i++) {
        int32_t x = draw(s, NULL);
        if (base[x] < 9.97f) ok = 0;
    }
    CHECK(ok, "top_k support");
    sampler_free(s);

    /* top_p: small p with sharp distribution -> argmax only */
    p.top_k = 0;
    p.temperature = 0.001f;
    p.top_p = 0.5f;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    ok = 1;
    for (int i = 0; i < 100; i++)
        if (draw(s, NULL) != best) ok = 0;
    CHECK(ok, "top_p support (sharp)");
    sampler_free(s);

    /* top_p with a flat-ish distribution: kept set is a top prefix with mass >= p */
    p.temperature = 1.0f;
    p.top_p = 0.9f;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    float minseen = 100.0f;
    for (int i = 0; i < 2000; i++) {
        int32_t x = draw(s, NULL);
        if (base[x] < minseen) minseen = base[x];
    }
    /* mass of tokens >= threshold; compute the exact cutoff */
    {
        double z = 0, acc = 0;
        for (int i = 0; i < V; i++) z += exp(base[i] - 9.99);
        float cut = 0;
        for (int v = 999; v >= 0; v--) { /* values are v/100 */
            acc += exp(v / 100.0 - 9.99);
            if (acc >= 0.9 * z) { cut = v / 100.0f; break; }
        }
        CHECK(minseen >= cut - 1e-4f, "top_p cutoff: min seen %f cut %f", minseen, cut);
        CHECK(minseen < cut + 1.0f, "top_p keeps the tail near the cut: %f vs %f", minseen, cut);
    }
    sampler_free(s);

    /* min_p */
    p.top_p = 1.0f;
    p.min_p = 0.5f; /* keep tokens with p >= 0.5 * pmax: logit >= max - ln 2 */
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    ok = 1;
    for (int i = 0; i < 500; i++)
        if (base[draw(s, NULL)] < 9.99f - 0.6932f) ok = 0;
    CHECK(ok, "min_p support");
    sampler_free(s);

    /* penalties: frequency penalty pushes greedy off a repeated token */
    p = sampler_params_default();
    p.frequency_penalty = 1.0f;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    int32_t x0 = draw(s, NULL);
    sampler_accept(s, &x0, 1, false);
    int32_t x1 = draw(s, NULL);
    CHECK(x0 == best && x1 != best, "frequency penalty %d %d", x0, x1);
    sampler_free(s);
    /* presence penalty does not apply to prompt tokens, repetition does */
    p = sampler_params_default();
    p.presence_penalty = 2.0f;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    sampler_accept(s, &best, 1, true);
    CHECK(draw(s, NULL) == best, "presence ignores prompt");
    sampler_free(s);
    p = sampler_params_default();
    p.repetition_penalty = 2.0f;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    sampler_accept(s, &best, 1, true);
    CHECK(draw(s, NULL) != best, "repetition applies to prompt");
    sampler_free(s);

    /* logprobs: raw log-softmax, top list sorted, chosen included */
    p = sampler_params_default();
    p.logprobs = true;
    p.top_logprobs = 5;
    p.repetition_penalty = 1.5f;
    CHECK(sampler_new(&s, V, &p, err, sizeof err) == 0, "%s", err);
    struct sample_result r;
    draw(s, &r);
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(base[i] - 9.99);
    CHECK(r.n_top == 5, "n_top %d", r.n_top);
    CHECK(r.top_ids[0] == best, "top[0]");
    CHECK_CLOSE(r.top_logprobs[0], -log(z), 1e-4, 0, "top logprob");
    CHECK_CLOSE(r.logprob, -log(z), 1e-4, 0, "chosen logprob");
    for (int i = 1; i < 5; i++) CHECK(r.top_logprobs[i] <= r.top_logprobs[i - 1], "sorted");
    /* after penalising the best, the chosen logprob is still the raw one */
    sampler_accept(s, &best, 1, true);
    draw(s, &r);
    CHECK(r.token != best, "penalised");
    CHECK_CLOSE(r.logprob, base[r.token] - 9.99 - log(z), 1e-4, 0, "raw logprob after penalty");
    sampler_free(s);

    test_logit_bias(best);
    test_constraint();
    test_row_logprobs();
    return check_summary();
}
