/* server/constraint.c — a JSON grammar or a thinking budget as a sampler
 * constraint (see constraint.h). */
#include "server/constraint.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/status.h"
#include "text/utf8.h"

/* Qwen's documented way to end thinking early: this text, "</think>" included
 * (without the "." Qwen's example has after the tag, which would open the
 * content). */
static const char k_budget_close[] =
    "\n\nConsidering the limited time by the user, I have to give the solution based on the thinking directly "
    "now.\n</think>\n\n";

struct out_constraint {
    /* thinking budget (g == NULL) */
    int budget, spent;   /* reasoning tokens allowed, taken */
    int32_t think_end;   /* the "</think>" token */
    bool reasoning;      /* still inside the reasoning */
    int32_t *forced;     /* the closing text's tokens, forced one by one once spent == budget */
    int n_forced, at;    /* at: forced tokens already given */
    /* JSON grammar */
    int mode;          /* CM_* below: the document, or where the tool calls are */
    int ws_after;      /* CM_AFTER_TOOL: whitespace bytes since the call closed */
    jg_grammar *g;
    const struct model_port *port;
    jg_state cur;      /* the text generated so far */
    jg_state scratch;  /* a candidate token's trial */
    bool first_known;  /* first[] and room are for cur */
    int64_t room;      /* jg_string_room of cur */
    uint8_t first[256]; /* 1: a byte that may come next */
    const struct out_vocab *vocab;
};

/* out_vocab's classes: a special token or one without bytes (never part of a
 * JSON text), a token to feed to the parse, or (1..VOCAB_PLAIN_MAX) a run of
 * that many plain string characters — no quote, backslash or control byte,
 * whole UTF-8 characters — which inside a string is allowed exactly when the
 * string has room for it. */
enum { VOCAB_FEED = 0, VOCAB_PLAIN_MAX = 254, VOCAB_NEVER = 255 };

struct out_vocab {
    const struct model_port *port;
    uint8_t *cls; /* [vocab] */
    int32_t tool_open, tool_close; /* the "<tool_call>" / "</tool_call>" tokens (-1: not one token) */
};

/* Where a grammar constraint beside tools is: the document only (or already
 * begun); nothing yet (the document or a call may come); inside a call (free);
 * after a call (whitespace, another call or the end). */
enum { CM_JSON = 0, CM_EITHER, CM_TOOL, CM_AFTER_TOOL };

/* *t = the single token that encodes s. Returns 0, ST_NOMEM, or ST_INVALID (s is not
 * one token of this vocabulary). */
static int one_token(const struct model_port *p, const char *s, int32_t *t) {
    int32_t *ids = NULL;
    size_t n = 0;
    char err[64];
    const int rc = p->encode(p->ctx, s, strlen(s), &ids, &n, err, sizeof err);
    if (!rc && n == 1) *t = ids[0];
    free(ids);
    return rc == ST_NOMEM ? ST_NOMEM : rc || n != 1 ? ST_INVALID : ST_OK;
}

/* Whitespace bytes allowed between and after tool calls (json_grammar.h's cap
 * between a document's tokens): no endless blank runs instead of the end. */
#define CM_MAX_WS 32

/* The number of bytes of a token that is all JSON whitespace, else 0 (a
 * special token is not). */
static size_t space_len(const struct out_vocab *v, int32_t t) {
    if (v->cls[t] == VOCAB_NEVER) return 0;
    size_t n = 0;
    const char *b = v->port->token_bytes(v->port->ctx, t, &n);
    for (size_t i = 0; i < n; i++)
        if (b[i] != ' ' && b[i] != '\n' && b[i] != '\r' && b[i] != '\t') return 0;
    return n;
}

static uint8_t token_class(const struct model_port *p, int32_t t) {
    size_t n = 0;
    const char *b = p->token_bytes(p->ctx, t, &n);
    if (!b || n == 0 || (p->is_special && p->is_special(p->ctx, t))) return VOCAB_NEVER;
    size_t chars = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)b[i];
        if (c < 0x20 || c == '"' || c == '\\') return VOCAB_FEED;
        int l = c < 0x80 ? 1 : utf8_seq_len((const unsigned char *)b + i, n - i);
        if (l <= 0) return VOCAB_FEED;
        i += (size_t)l;
        chars++;
    }
    return chars > VOCAB_PLAIN_MAX ? VOCAB_FEED : (uint8_t)chars;
}

int out_vocab_new(struct out_vocab **out, const struct model_port *port) {
    *out = NULL;
    struct out_vocab *v = calloc(1, sizeof *v);
    if (!v) return ST_NOMEM;
    v->port = port;
    v->cls = malloc((size_t)port->vocab);
    if (!v->cls) {
        free(v);
        return ST_NOMEM;
    }
    for (int t = 0; t < port->vocab; t++) v->cls[t] = token_class(port, t);
    if (one_token(port, "<tool_call>", &v->tool_open)) v->tool_open = -1;
    if (one_token(port, "</tool_call>", &v->tool_close)) v->tool_close = -1;
    *out = v;
    return ST_OK;
}

void out_vocab_free(struct out_vocab *v) {
    if (!v) return;
    free(v->cls);
    free(v);
}

int out_constraint_new(struct out_constraint **out, jg_grammar *g, const struct out_vocab *v, int tools) {
    *out = NULL;
    if (tools != OUT_TOOLS_NONE && (v->tool_open < 0 || v->tool_close < 0)) {
        jg_free(g);
        return ST_INVALID;
    }
    struct out_constraint *c = calloc(1, sizeof *c);
    if (!c) {
        jg_free(g);
        return ST_NOMEM;
    }
    c->mode = tools == OUT_TOOLS_EITHER ? CM_EITHER : tools == OUT_TOOLS_IN_CALL ? CM_TOOL : CM_JSON;
    c->g = g;
    c->port = v->port;
    c->vocab = v;
    jg_start(g, &c->cur);
    *out = c;
    return ST_OK;
}

void out_constraint_free(struct out_constraint *c) {
    if (!c) return;
    jg_free(c->g);
    free(c->forced);
    free(c);
}

int out_constraint_new_budget(struct out_constraint **out, int budget, const struct model_port *port) {
    *out = NULL;
    struct out_constraint *c = calloc(1, sizeof *c);
    if (!c) return ST_NOMEM;
    c->port = port;
    c->budget = budget;
    c->reasoning = true;
    int rc = one_token(port, "</think>", &c->think_end);
    if (rc) {
        free(c);
        return rc;
    }
    char err[128];
    size_t nf = 0;
    if ((rc = port->encode(port->ctx, k_budget_close, sizeof k_budget_close - 1, &c->forced, &nf, err, sizeof err))) {
        free(c);
        return rc == ST_NOMEM ? ST_NOMEM : ST_INVALID;
    }
    c->n_forced = (int)nf;
    *out = c;
    return ST_OK;
}

/* Budget: free until the reasoning has spent it, then the closing text's
 * tokens in order; content after it is free. */
static bool budget_allow(struct out_constraint *c, int32_t t) {
    if (!c->reasoning || c->spent < c->budget) return true;
    return c->at < c->n_forced ? t == c->forced[c->at] : true;
}

static void budget_advance(struct out_constraint *c, int32_t t) {
    if (!c->reasoning) return;
    if (c->spent < c->budget) {
        c->spent++;
    } else if (c->at < c->n_forced) {
        c->at++;
        if (c->at == c->n_forced) c->reasoning = false; /* the forced text closed it */
        return;
    }
    if (t == c->think_end) c->reasoning = false;
}

static bool allow(void *ctx, int32_t t) {
    struct out_constraint *c = ctx;
    if (!c->g) return budget_allow(c, t);
    if (c->mode == CM_TOOL) return true; /* a call's body: the parser's, not the schema's */
    if (c->mode == CM_AFTER_TOOL) {
        if (t == c->vocab->tool_open || port_is_stop(c->port, t)) return true;
        const size_t n = space_len(c->vocab, t);
        return n && (size_t)c->ws_after + n <= CM_MAX_WS;
    }
    if (c->mode == CM_EITHER && t == c->vocab->tool_open) return true;
    /* end of sequence: when the document is complete — or, as a safety net that
     * should never be needed, when no parse is left, so the request ends */
    if (port_is_stop(c->port, t)) return jg_complete(c->g, &c->cur) || c->cur.n == 0;
    const uint8_t cls = c->vocab->cls[t];
    if (cls == VOCAB_NEVER) return false;
    if (!c->first_known) {
        for (int x = 0; x < 256; x++) {
            const char ch = (char)x;
            jg_copy(&c->scratch, &c->cur);
            c->first[x] = jg_feed(c->g, &c->scratch, &ch, 1);
        }
        c->room = jg_string_room(c->g, &c->cur);
        c->first_known = true;
    }
    if (c->room >= 0 && cls != VOCAB_FEED) return cls <= c->room;
    size_t n = 0;
    const char *b = c->port->token_bytes(c->port->ctx, t, &n);
    if (!c->first[(unsigned char)b[0]]) return false;
    if (n == 1) return true;
    jg_copy(&c->scratch, &c->cur);
    return jg_feed(c->g, &c->scratch, b, n);
}

static void advance(void *ctx, int32_t t) {
    struct out_constraint *c = ctx;
    if (!c->g) {
        budget_advance(c, t);
        return;
    }
    if (c->mode == CM_TOOL) {
        if (t == c->vocab->tool_close) {
            c->mode = CM_AFTER_TOOL;
            c->ws_after = 0;
        }
        return;
    }
    if (c->mode == CM_AFTER_TOOL || (c->mode == CM_EITHER && t == c->vocab->tool_open)) {
        if (t == c->vocab->tool_open) c->mode = CM_TOOL;
        else c->ws_after += (int)space_len(c->vocab, t);
        return;
    }
    if (port_is_stop(c->port, t)) return;
    size_t n = 0;
    const char *b = c->port->token_bytes(c->port->ctx, t, &n);
    if (b && n) jg_feed(c->g, &c->cur, b, n); /* an allowed token: it stays alive */
    if (c->mode == CM_EITHER) c->mode = CM_JSON; /* the document has begun */
    c->first_known = false;
}

struct sampler_constraint out_constraint_sampler(struct out_constraint *c) {
    return (struct sampler_constraint){.allow = allow, .advance = advance, .ctx = c};
}
