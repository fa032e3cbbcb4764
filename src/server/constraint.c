/* server/constraint.c — a JSON grammar as a sampler constraint (see constraint.h). */
#include "server/constraint.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/status.h"

struct out_constraint {
    jg_grammar *g;
    const struct model_port *port;
    jg_state cur;      /* the text generated so far */
    jg_state scratch;  /* a candidate token's trial */
    bool first_known;  /* first[] is for cur */
    uint8_t first[256]; /* 1: a byte that may come next */
};

int out_constraint_new(struct out_constraint **out, jg_grammar *g, const struct model_port *port) {
    *out = NULL;
    struct out_constraint *c = calloc(1, sizeof *c);
    if (!c) {
        jg_free(g);
        return ST_NOMEM;
    }
    c->g = g;
    c->port = port;
    jg_start(g, &c->cur);
    *out = c;
    return ST_OK;
}

void out_constraint_free(struct out_constraint *c) {
    if (!c) return;
    jg_free(c->g);
    free(c);
}

static bool is_stop(const struct model_port *p, int32_t t) {
    for (int i = 0; i < p->n_stop; i++)
        if (p->stop_ids[i] == t) return true;
    return false;
}

static bool allow(void *ctx, int32_t t) {
    struct out_constraint *c = ctx;
    /* end of sequence: when the document is complete — or, as a safety net that
     * should never be needed, when no parse is left, so the request ends */
    if (is_stop(c->port, t)) return jg_complete(c->g, &c->cur) || c->cur.n == 0;
    if (c->port->is_special && c->port->is_special(c->port->ctx, t)) return false;
    size_t n = 0;
    const char *b = c->port->token_bytes(c->port->ctx, t, &n);
    if (!b || n == 0) return false;
    if (!c->first_known) {
        for (int x = 0; x < 256; x++) {
            const char ch = (char)x;
            jg_copy(&c->scratch, &c->cur);
            c->first[x] = jg_feed(c->g, &c->scratch, &ch, 1);
        }
        c->first_known = true;
    }
    if (!c->first[(unsigned char)b[0]]) return false;
    if (n == 1) return true;
    jg_copy(&c->scratch, &c->cur);
    return jg_feed(c->g, &c->scratch, b, n);
}

static void advance(void *ctx, int32_t t) {
    struct out_constraint *c = ctx;
    if (is_stop(c->port, t)) return;
    size_t n = 0;
    const char *b = c->port->token_bytes(c->port->ctx, t, &n);
    if (b && n) jg_feed(c->g, &c->cur, b, n); /* an allowed token: it stays alive */
    c->first_known = false;
}

struct sampler_constraint out_constraint_sampler(struct out_constraint *c) {
    return (struct sampler_constraint){.allow = allow, .advance = advance, .ctx = c};
}
