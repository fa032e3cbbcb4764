/* text/json_regex.c — JSON Schema "pattern" regular expressions as a bitset NFA (see
 * json_regex.h). Parsed to a small tree, then built Thompson-style: a state has epsilon
 * edges (a bitmask) and at most one character edge (a class of code point ranges); sets
 * are epsilon-closed and pruned to the states from which the match can still be reached. */
#include "text/json_regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/utf8.h"

#define JR_STATES 64
#define JR_CLASSES 64
#define JR_RANGES 1024
#define JR_NODES 512
#define JR_MAX_CP 0x10FFFFu

struct jr_range {
    uint32_t lo, hi;
};

struct jr_nfa {
    int n, match, start_state;
    uint64_t eps[JR_STATES];  /* epsilon edges */
    int cls[JR_STATES];       /* the character edge's class (-1: none) */
    int to[JR_STATES];        /* ... and its target */
    uint64_t clos[JR_STATES]; /* epsilon closure, live states only */
    /* lengths (code points) from a state to the match, bit k of JR_LENW words: k < JR_LENS
     * (the lengths json_grammar's maxLength may ask about) */
    uint64_t len[JR_STATES][JR_LENW];
    uint64_t start;
    int n_cls, n_rng;
    int cls_r0[JR_CLASSES], cls_nr[JR_CLASSES]; /* a class's ranges in rng[] */
    struct jr_range rng[JR_RANGES];
};

/* ---- character classes ---- */

/* Ranges being collected for one class (unsorted, may overlap). */
struct set {
    struct jr_range r[256];
    int n;
    bool overflow;
};
static void set_add(struct set *s, uint32_t lo, uint32_t hi) {
    if (s->n == 256) {
        s->overflow = true;
        return;
    }
    s->r[s->n++] = (struct jr_range){lo, hi};
}
static int cmp_range(const void *a, const void *b) {
    const struct jr_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}
/* Sorted and merged in place. */
static void set_norm(struct set *s) {
    qsort(s->r, (size_t)s->n, sizeof s->r[0], cmp_range);
    int k = 0;
    for (int i = 0; i < s->n; i++) {
        if (k && s->r[i].lo <= s->r[k - 1].hi + 1) {
            if (s->r[i].hi > s->r[k - 1].hi) s->r[k - 1].hi = s->r[i].hi;
        } else {
            s->r[k++] = s->r[i];
        }
    }
    s->n = k;
}
/* The complement within [0, top]. */
static void set_negate(struct set *s, uint32_t top) {
    set_norm(s);
    struct set c = {.n = 0};
    uint32_t next = 0;
    for (int i = 0; i < s->n && next <= top; i++) {
        if (s->r[i].lo > next) set_add(&c, next, s->r[i].lo - 1 < top ? s->r[i].lo - 1 : top);
        next = s->r[i].hi + 1;
    }
    if (next <= top) set_add(&c, next, top);
    *s = c;
}

/* The shorthand classes, read so that both ECMA-262 and Python's re accept what they give
 * (json_regex.h): \d \w \s as below, \D \W \S their complements within ASCII. */
static void add_shorthand(struct set *s, char k) {
    struct set t = {.n = 0};
    const char lower = (char)(k | 0x20);
    if (lower == 'd') {
        set_add(&t, '0', '9');
    } else if (lower == 'w') {
        set_add(&t, '0', '9');
        set_add(&t, 'A', 'Z');
        set_add(&t, '_', '_');
        set_add(&t, 'a', 'z');
    } else { /* s: the whitespace both name (not \x1c-\x1f, \x85: Python only; not \ufeff: ECMA only) */
        static const uint32_t sp[][2] = {{0x09, 0x0D}, {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                                         {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                         {0x3000, 0x3000}};
        for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) set_add(&t, sp[i][0], sp[i][1]);
        if (k == 'S') { /* ... and not Python's extra spaces either */
            set_add(&t, 0x1C, 0x1F);
        }
    }
    if (k >= 'A' && k <= 'Z') set_negate(&t, 0x7F);
    for (int i = 0; i < t.n; i++) set_add(s, t.r[i].lo, t.r[i].hi);
}

static int new_class(jr_nfa *r, struct set *s) {
    set_norm(s);
    if (s->overflow || r->n_cls == JR_CLASSES || r->n_rng + s->n > JR_RANGES) return -1;
    r->cls_r0[r->n_cls] = r->n_rng;
    r->cls_nr[r->n_cls] = s->n;
    memcpy(r->rng + r->n_rng, s->r, (size_t)s->n * sizeof s->r[0]);
    r->n_rng += s->n;
    return r->n_cls++;
}

static bool in_class(const jr_nfa *r, int c, uint32_t cp) {
    const struct jr_range *g = r->rng + r->cls_r0[c];
    for (int i = 0; i < r->cls_nr[c]; i++)
        if (cp >= g[i].lo && cp <= g[i].hi) return true;
    return false;
}
/* Whether class c holds a code point in [lo, hi] outside the surrogates. */
static bool class_meets(const jr_nfa *r, int c, uint32_t lo, uint32_t hi) {
    const struct jr_range *g = r->rng + r->cls_r0[c];
    for (int i = 0; i < r->cls_nr[c]; i++) {
        const uint32_t a = g[i].lo > lo ? g[i].lo : lo, b = g[i].hi < hi ? g[i].hi : hi;
        if (a > b) continue;
        if (a < 0xD800 || b > 0xDFFF) return true; /* not wholly surrogates */
    }
    return false;
}

/* ---- parsing ---- */

enum { A_EMPTY, A_CLASS, A_CAT, A_ALT, A_REP };
struct ast {
    int kind, a, b, cls, min, max; /* max -1: unbounded */
};
struct parser {
    const char *s, *p;
    jr_nfa *r;
    struct ast node[JR_NODES];
    int n;
    char *err;
    size_t errlen;
    bool failed;
    bool top_alt; /* a '|' outside every group */
};

static int fail(struct parser *q, const char *msg) {
    if (!q->failed) snprintf(q->err, q->errlen, "pattern: %s at offset %d", msg, (int)(q->p - q->s));
    q->failed = true;
    return -1;
}
static int node(struct parser *q, int kind, int a, int b) {
    if (q->n == JR_NODES) return fail(q, "the pattern is too long");
    q->node[q->n] = (struct ast){kind, a, b, -1, 0, 0};
    return q->n++;
}
static int class_node(struct parser *q, struct set *s) {
    const int c = new_class(q->r, s);
    if (c < 0) return fail(q, "too many character classes");
    const int id = node(q, A_CLASS, -1, -1);
    if (id >= 0) q->node[id].cls = c;
    return id;
}
/* The next code point of the pattern (UTF-8), advancing. */
static int next_cp(struct parser *q, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)q->p;
    if (*u < 0x80) {
        *cp = *u;
        q->p++;
        return 0;
    }
    if (utf8_seq_len(u, strlen(q->p)) <= 0) return fail(q, "invalid UTF-8");
    q->p += utf8_decode(u, cp);
    return 0;
}

/* An escape after '\' (p at the letter): a shorthand into s (returns 1), or one code point
 * (returns 0), or -1. in_class: inside [...] (where \b is a backspace). */
static int escape(struct parser *q, bool in_class, struct set *s, uint32_t *cp) {
    const char c = *q->p;
    if (!c) return fail(q, "a trailing '\\'");
    if (strchr("dDwWsS", c)) {
        q->p++;
        add_shorthand(s, c);
        return 1;
    }
    static const char simple[] = "n\nt\tr\rf\fv\v0";
    const char *k = strchr("ntrfv0", c);
    if (k && c) {
        q->p++;
        *cp = c == '0' ? 0 : (uint32_t)(unsigned char)simple[2 * (k - "ntrfv0") + 1];
        return 0;
    }
    if (c == 'b' && in_class) {
        q->p++;
        *cp = 8;
        return 0;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9'))
        return fail(q, c >= '1' && c <= '9' ? "backreferences are not supported"
                       : c == 'b' || c == 'B' ? "word boundaries (\\b, \\B) are not supported"
                                              : "this escape is not supported (\\u, \\x, \\p, \\c, \\k ...)");
    return next_cp(q, cp); /* an escaped punctuation or other character: itself */
}

static int parse_alt(struct parser *q, int depth);

static int parse_class(struct parser *q) { /* p after '[' */
    struct set s = {.n = 0};
    bool neg = false, shorthand = false;
    if (*q->p == '^') neg = true, q->p++;
    if (*q->p == ']') return fail(q, "a class opening with ']' (escape it)");
    while (*q->p != ']') {
        if (!*q->p) return fail(q, "an unclosed '['");
        uint32_t lo, hi;
        int k;
        if (*q->p == '\\') {
            q->p++;
            if ((k = escape(q, true, &s, &lo)) < 0) return -1;
            if (k == 1) {
                shorthand = true;
                continue;
            }
        } else if (next_cp(q, &lo) < 0) {
            return -1;
        }
        hi = lo;
        if (q->p[0] == '-' && q->p[1] && q->p[1] != ']') {
            q->p++;
            if (*q->p == '\\') {
                q->p++;
                if ((k = escape(q, true, &s, &hi)) < 0) return -1;
                if (k == 1) return fail(q, "a range ending in a class shorthand");
            } else if (next_cp(q, &hi) < 0) {
                return -1;
            }
            if (hi < lo) return fail(q, "a range out of order");
        }
        set_add(&s, lo, hi);
    }
    q->p++;
    /* a negated class with a shorthand: within ASCII, where both readings agree */
    if (neg) set_negate(&s, shorthand ? 0x7F : JR_MAX_CP);
    return class_node(q, &s);
}

static int parse_atom(struct parser *q, int depth) {
    const char c = *q->p;
    struct set s = {.n = 0};
    uint32_t cp;
    switch (c) {
    case '(': {
        q->p++;
        if (q->p[0] == '?') {
            if (q->p[1] != ':') return fail(q, "lookaround and named groups are not supported");
            q->p += 2;
        }
        const int a = parse_alt(q, depth + 1);
        if (a < 0) return -1;
        if (*q->p != ')') return fail(q, "an unclosed '('");
        q->p++;
        return a;
    }
    case '[': q->p++; return parse_class(q);
    case '.': /* no line terminator (ECMA-262; Python's '.' only excludes \n) */
        q->p++;
        set_add(&s, 0, 0x09);
        set_add(&s, 0x0B, 0x0C);
        set_add(&s, 0x0E, 0x2027);
        set_add(&s, 0x202A, JR_MAX_CP);
        return class_node(q, &s);
    case '\\': {
        q->p++;
        const int k = escape(q, false, &s, &cp);
        if (k < 0) return -1;
        if (k == 0) set_add(&s, cp, cp);
        return class_node(q, &s);
    }
    case '^': case '$': return fail(q, "anchors other than a leading '^' and a trailing '$' are not supported");
    case '*': case '+': case '?': case '{': return fail(q, "a quantifier with nothing to repeat");
    case ']': case '}': return fail(q, "an unescaped closing bracket");
    default:
        if (next_cp(q, &cp) < 0) return -1;
        set_add(&s, cp, cp);
        return class_node(q, &s);
    }
}

static int number(struct parser *q, int *out) {
    if (*q->p < '0' || *q->p > '9') return -1;
    long v = 0;
    while (*q->p >= '0' && *q->p <= '9') {
        v = v * 10 + (*q->p++ - '0');
        if (v > 1000) return fail(q, "a repetition count above 1000");
    }
    *out = (int)v;
    return 0;
}

static int parse_repeat(struct parser *q, int depth) {
    int a = parse_atom(q, depth);
    if (a < 0) return -1;
    int min, max;
    const char c = *q->p;
    if (c == '*') min = 0, max = -1, q->p++;
    else if (c == '+') min = 1, max = -1, q->p++;
    else if (c == '?') min = 0, max = 1, q->p++;
    else if (c == '{') {
        q->p++;
        if (number(q, &min) < 0) return fail(q, "a '{' that is not a quantifier (escape it)");
        max = min;
        if (*q->p == ',') {
            q->p++;
            max = -1;
            if (*q->p != '}' && number(q, &max) < 0) return fail(q, "a malformed {m,n}");
        }
        if (*q->p != '}') return fail(q, "a malformed {m,n}");
        q->p++;
        if (max >= 0 && max < min) return fail(q, "{m,n} with n < m");
    } else {
        return a;
    }
    if (*q->p == '?') q->p++; /* lazy: the same language */
    if (*q->p && strchr("*+?{", *q->p)) return fail(q, "a quantifier on a quantifier");
    const int id = node(q, A_REP, a, -1);
    if (id >= 0) q->node[id].min = min, q->node[id].max = max;
    return id;
}

static int parse_cat(struct parser *q, int depth) {
    int left = -1;
    while (*q->p && *q->p != '|' && *q->p != ')') {
        if (*q->p == '$' && !q->p[1] && depth == 0) break; /* the trailing anchor */
        const int item = parse_repeat(q, depth);
        if (item < 0) return -1;
        left = left < 0 ? item : node(q, A_CAT, left, item);
        if (left < 0) return -1;
    }
    return left < 0 ? node(q, A_EMPTY, -1, -1) : left;
}

static int parse_alt(struct parser *q, int depth) {
    if (depth > 32) return fail(q, "groups nest too deeply");
    int left = parse_cat(q, depth);
    while (left >= 0 && *q->p == '|') {
        if (depth == 0) q->top_alt = true;
        q->p++;
        const int right = parse_cat(q, depth);
        if (right < 0) return -1;
        left = node(q, A_ALT, left, right);
    }
    return left;
}

/* ---- building ---- */

static int new_state(jr_nfa *r) {
    if (r->n == JR_STATES) return -1;
    r->eps[r->n] = 0;
    r->cls[r->n] = -1;
    r->to[r->n] = -1;
    return r->n++;
}
/* A character edge of class c from `in` (on `in` itself while it has none). Returns the target. */
static int char_edge(jr_nfa *r, int in, int c) {
    int from = in;
    if (r->cls[in] >= 0) {
        if ((from = new_state(r)) < 0) return -1;
        r->eps[in] |= 1ull << from;
    }
    const int o = new_state(r);
    if (o < 0) return -1;
    r->cls[from] = c;
    r->to[from] = o;
    return o;
}

/* Builds tree node i from state `in`; returns the state where it ends, or -1 (too many states). */
static int build(struct parser *q, int i, int in) {
    jr_nfa *r = q->r;
    const struct ast *a = &q->node[i];
    if (in < 0) return -1;
    switch (a->kind) {
    case A_EMPTY: return in;
    case A_CLASS: return char_edge(r, in, a->cls);
    case A_CAT: return build(q, a->b, build(q, a->a, in));
    case A_ALT: {
        const int e1 = build(q, a->a, in), e2 = build(q, a->b, in), j = new_state(r);
        if (e1 < 0 || e2 < 0 || j < 0) return -1;
        r->eps[e1] |= 1ull << j;
        r->eps[e2] |= 1ull << j;
        return j;
    }
    default: { /* A_REP */
        int cur = in;
        for (int k = 0; k < a->min && cur >= 0; k++) cur = build(q, a->a, cur);
        if (cur < 0) return -1;
        if (a->max < 0) { /* a loop state: the child from it and back */
            const int l = new_state(r);
            if (l < 0) return -1;
            r->eps[cur] |= 1ull << l;
            const int e = build(q, a->a, l);
            if (e < 0) return -1;
            r->eps[e] |= 1ull << l;
            return l;
        }
        for (int k = a->min; k < a->max; k++) { /* optional copies */
            const int e = build(q, a->a, cur), j = new_state(r);
            if (e < 0 || j < 0) return -1;
            r->eps[cur] |= 1ull << j;
            r->eps[e] |= 1ull << j;
            cur = j;
        }
        return cur;
    }
    }
}

int jr_compile(const char *pattern, jr_nfa **out, char *err, size_t errlen) {
    *out = NULL;
    jr_nfa *r = calloc(1, sizeof *r);
    struct parser *q = calloc(1, sizeof *q);
    if (!r || !q) {
        free(r);
        free(q);
        snprintf(err, errlen, "pattern: out of memory");
        return -1;
    }
    q->s = q->p = pattern;
    q->r = r;
    q->err = err;
    q->errlen = errlen;
    const bool head = *q->p == '^';
    if (head) q->p++;
    const int root = parse_alt(q, 0);
    const bool tail = root >= 0 && *q->p == '$' && !q->p[1];
    if (tail) q->p++;
    if (root >= 0 && *q->p) fail(q, *q->p == ')' ? "an unmatched ')'" : "an anchor inside the pattern");
    /* "^a|b$" anchors each side alone (ECMA-262): say so rather than read it as ^(a|b)$ */
    if (!q->failed && (head || tail) && q->top_alt)
        fail(q, "'^' or '$' beside a top-level '|' (group the alternatives: ^(a|b)$)");
    struct set any = {.n = 0};
    set_add(&any, 0, JR_MAX_CP);
    const int any_cls = q->failed ? -1 : new_class(r, &any);
    int s0 = -1, e = -1;
    if (!q->failed && any_cls >= 0 && (s0 = new_state(r)) >= 0) {
        if (!head) { /* a search: anything before the match */
            r->cls[s0] = any_cls;
            r->to[s0] = s0;
        }
        e = build(q, root, s0);
        if (e >= 0 && !tail) { /* ... and after it */
            const int t = new_state(r);
            if (t >= 0) {
                r->eps[e] |= 1ull << t;
                r->cls[t] = any_cls;
                r->to[t] = t;
            }
            e = t;
        }
    }
    if (!q->failed && (any_cls < 0 || e < 0)) fail(q, "the pattern needs more than 64 states");
    if (q->failed) {
        free(q);
        free(r);
        return -1;
    }
    free(q);
    r->match = e;
    r->start_state = s0;
    /* epsilon closures; the states that reach the match; closures pruned to them */
    for (int s = 0; s < r->n; s++) r->clos[s] = 1ull << s;
    for (bool more = true; more;) {
        more = false;
        for (int s = 0; s < r->n; s++)
            for (int t = 0; t < r->n; t++)
                if ((r->eps[s] >> t & 1) && (r->clos[s] | r->clos[t]) != r->clos[s]) r->clos[s] |= r->clos[t], more = true;
    }
    uint64_t live = 1ull << r->match;
    for (bool more = true; more;) {
        more = false;
        for (int s = 0; s < r->n; s++) {
            if (live >> s & 1) continue;
            if ((r->clos[s] & live) || (r->cls[s] >= 0 && r->cls_nr[r->cls[s]] > 0 && (live >> r->to[s] & 1)))
                live |= 1ull << s, more = true;
        }
    }
    for (int s = 0; s < r->n; s++) r->clos[s] &= live;
    r->start = r->clos[s0];
    /* the remaining lengths: the match has 0; a character edge shifts its target's by one;
     * epsilon edges merge (to a fixpoint: monotone bitsets) */
    r->len[r->match][0] = 1;
    for (bool more = true; more;) {
        more = false;
        for (int st = 0; st < r->n; st++) {
            uint64_t w[JR_LENW];
            memcpy(w, r->len[st], sizeof w);
            for (int t = 0; t < r->n; t++)
                if (r->eps[st] >> t & 1)
                    for (int k = 0; k < JR_LENW; k++) w[k] |= r->len[t][k];
            if (r->cls[st] >= 0 && r->cls_nr[r->cls[st]] > 0)
                for (int k = JR_LENW - 1; k >= 0; k--)
                    w[k] |= r->len[r->to[st]][k] << 1 | (k ? r->len[r->to[st]][k - 1] >> 63 : 0);
            if (memcmp(w, r->len[st], sizeof w)) memcpy(r->len[st], w, sizeof w), more = true;
        }
    }
    if (!r->start) {
        snprintf(err, errlen, "pattern: no string matches it");
        free(r);
        return -1;
    }
    *out = r;
    return 0;
}

void jr_free(jr_nfa *r) { free(r); }

uint64_t jr_start(const jr_nfa *r) { return r->start; }

uint64_t jr_step(const jr_nfa *r, uint64_t set, uint32_t cp) {
    uint64_t out = 0;
    for (uint64_t m = set; m; m &= m - 1) {
        const int s = __builtin_ctzll(m);
        if (r->cls[s] >= 0 && in_class(r, r->cls[s], cp)) out |= r->clos[r->to[s]];
    }
    return out;
}

bool jr_can(const jr_nfa *r, uint64_t set, uint32_t lo, uint32_t hi) {
    for (uint64_t m = set; m; m &= m - 1) {
        const int s = __builtin_ctzll(m);
        if (r->cls[s] >= 0 && r->clos[r->to[s]] && class_meets(r, r->cls[s], lo, hi)) return true;
    }
    return false;
}

bool jr_accepts(const jr_nfa *r, uint64_t set) { return set >> r->match & 1; }

/* Whether bitset w holds a length in [lo, hi] (clipped to [0, JR_LENS)). */
static bool len_meets(const uint64_t *w, int lo, int hi) {
    if (lo < 0) lo = 0;
    if (hi >= JR_LENS) hi = JR_LENS - 1;
    for (int k = lo; k <= hi; k++)
        if (w[k >> 6] >> (k & 63) & 1) return true;
    return false;
}

bool jr_len_ok(const jr_nfa *r, uint64_t set, int lo, int hi) {
    for (uint64_t m = set; m; m &= m - 1)
        if (len_meets(r->len[__builtin_ctzll(m)], lo, hi)) return true;
    return false;
}

bool jr_can_len(const jr_nfa *r, uint64_t set, uint32_t cp_lo, uint32_t cp_hi, int lo, int hi) {
    for (uint64_t m = set; m; m &= m - 1) {
        const int s = __builtin_ctzll(m);
        if (r->cls[s] < 0 || !class_meets(r, r->cls[s], cp_lo, cp_hi)) continue;
        if (jr_len_ok(r, r->clos[r->to[s]], lo, hi)) return true;
    }
    return false;
}
