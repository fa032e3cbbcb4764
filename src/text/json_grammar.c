/* text/json_grammar.c — JSON Schema -> node graph, and the byte-level
 * pushdown recognizer over it (see json_grammar.h).
 *
 * Nodes: ANY (any JSON value), OBJECT (declared properties, or generic: any
 * key, values of one node), ARRAY, STRING, NUMBER, INTEGER, LITERAL (exact
 * JSON text: true, false, null, an enum or const value), ALT (alternatives).
 * A thread is one parse: a stack of frames, each a node and where in it the
 * text is. Feeding a byte steps every thread; an ALT frame at a value's start
 * splits its thread into one per alternative, and threads that die are
 * dropped, so the state is the set of parses still possible (deduplicated,
 * at most JG_MAX_THREADS: beyond that the extra parses are dropped, which only
 * narrows what can be written).
 *
 * A number has no closing byte: the byte after it completes it and is then
 * stepped again in the parent ("complete and re-step"). Every other value
 * ends on its own last byte.
 */
#include "text/json_grammar.h"

#include "text/json_decimal.h"
#include "text/json_regex.h"
#include "text/json_schema_merge.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum kind { K_ANY, K_OBJECT, K_ARRAY, K_STRING, K_NUMBER, K_INTEGER, K_LITERAL, K_ALT };

struct node {
    enum kind kind;
    /* OBJECT: declared properties (names as escaped JSON string content) */
    int n_props;
    char **names;
    size_t *name_lens;
    int *prop_nodes;
    uint64_t required, all;
    int value_node; /* generic object: the values' node (-1: declared properties) */
    uint32_t min_props, max_props; /* minProperties / maxProperties (counted: obj_count) */
    /* ARRAY: element i takes prefix[i] while i < n_prefix (a tuple: prefixItems, or the
     * older 'items' array), then items (-1: no further elements; max_items then ≤ n_prefix) */
    int items;
    int n_prefix;
    int *prefix;
    uint32_t min_items, max_items;
    bool unique; /* uniqueItems: items is a flat ALT of distinct literals (at most 64), each used
                  * once — the array frame's seen holds the ones taken */
    bool unique_hashed; /* uniqueItems over free strings or integers: items is the STRING node
                         * (no pattern, maxLength ≥ 1) or an INTEGER node without a maximum
                         * (compile's free_int); the array frame's seen:cand is a 128-bit Bloom
                         * filter of the items written (uniq_*) */
    /* STRING */
    uint32_t min_len, max_len;
    jr_nfa *re; /* pattern: the NFA the string's code points step (lengths then < JR_LENS) */
    /* INTEGER, NUMBER: minimum / maximum (the exclusive forms folded in), when bounded, in
     * units of 1 (INTEGER) or 1e-15 (NUMBER: 15 fraction digits at most; no exponent then) */
    bool bounded;
    __int128 lo, hi;
    __int128 mult; /* INTEGER: multipleOf (0: none; bounded then, at least by what can be written) */
    /* LITERAL */
    char *text;
    size_t len;
    /* ALT */
    int n_alt;
    int *alts;
};

struct memo {
    const cJSON *schema;
    int node;
};

struct jg_grammar {
    struct node *nodes;
    int n, cap;
    int root;
    /* shared nodes of ANY */
    int any, any_object, any_array, any_string, any_number, lit_true, lit_false, lit_null;
    /* compile only */
    const cJSON *doc;
    struct memo *memo;
    int n_memo, cap_memo;
};

/* ---- compiling ---- */

static int new_node(jg_grammar *g, enum kind k) {
    if (g->n == g->cap) {
        int c = g->cap ? g->cap * 2 : 32;
        struct node *p = realloc(g->nodes, (size_t)c * sizeof *p);
        if (!p) return -1;
        g->nodes = p;
        g->cap = c;
    }
    memset(&g->nodes[g->n], 0, sizeof g->nodes[0]);
    g->nodes[g->n].kind = k;
    g->nodes[g->n].value_node = -1;
    g->nodes[g->n].items = -1;
    g->nodes[g->n].max_items = UINT32_MAX;
    g->nodes[g->n].max_props = UINT32_MAX;
    g->nodes[g->n].max_len = UINT32_MAX;
    return g->n++;
}

static int literal(jg_grammar *g, const char *text) {
    int id = new_node(g, K_LITERAL);
    if (id < 0) return -1;
    g->nodes[id].text = strdup(text);
    g->nodes[id].len = strlen(text);
    return g->nodes[id].text ? id : -1;
}

/* A property name as the model writes it between the quotes (JSON-escaped),
 * malloc'd; NULL when out of memory. */
static char *escaped(const char *name, size_t *len) {
    cJSON *s = cJSON_CreateString(name);
    char *q = s ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    if (!q) return NULL;
    size_t n = strlen(q);
    memmove(q, q + 1, n - 2);
    q[n - 2] = 0;
    *len = n - 2;
    return q;
}

static const char *const k_unsupported[] = {
    "patternProperties", "propertyNames", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
    "contains", "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems"};

static int compile(jg_grammar *g, const cJSON *s, const char *path, int depth, char *err, size_t errlen);

/* Numbers: 18 integer digits and 15 fraction digits at most (the recognizer's caps), so a
 * bound or value in units of 1e-15 fits an __int128 (json_decimal.h). */
#define INT_DIGITS JD_INT_DIGITS
#define FRAC_DIGITS JD_FRAC_DIGITS
/* Exponent digits: two, so every number is a finite, normal double (at most 18 + 99 decimal
 * orders, at least 10^-114): 4e407 is valid JSON, but Go's and Rust's parsers refuse it */
#define EXP_DIGITS 2

/* Whether schema s's type is `name` or a list naming it. */
/* Whether schema s's 'type' (a name or a list of names) names name. */
static bool type_names(const cJSON *s, const char *name) {
    return jsm_names_have(cJSON_GetObjectItemCaseSensitive(s, "type"), name);
}

static bool is_bound_kw(const char *k) { return !strncmp(k, "minimum", 7) || !strncmp(k, "maximum", 7) || !strncmp(k, "exclusiveM", 10); }


/* A numeric node's bounds from s: minimum x -> lo = the least value >= x (exclusiveMinimum:
 * > x), maximum likewise, the tighter of each pair; in the node's units, clipped to what can
 * be written. */
static int num_bounds(const cJSON *s, struct node *nd, const char *path, char *err, size_t errlen) {
    static const char *const kw[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    const int scale = nd->kind == K_NUMBER ? FRAC_DIGITS : 0;
    const jd_num limit = jd_limit(scale);
    jd_num lo = -limit, hi = limit;
    bool any = false;
    for (int i = 0; i < 4; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, kw[i]);
        if (!v) continue;
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
            char m[96];
            snprintf(m, sizeof m, "'%s' must be a number", kw[i]);
            return jsm_fail(err, errlen, path, m);
        }
        bool exact;
        jd_num b = jd_scaled(v->valuedouble, scale, i < 2, limit, &exact);
        if (i == 1 && exact) b += 1; /* exclusive: the next value that can be written */
        if (i == 3 && exact) b -= 1;
        if (i < 2 && b > lo) lo = b;
        if (i >= 2 && b < hi) hi = b;
        any = true;
    }
    if (!any) return 0;
    if (lo > hi || lo > limit || hi < -limit)
        return jsm_fail(err, errlen, path,
                      nd->kind == K_NUMBER
                          ? "no number of at most 18 integer and 15 fraction digits lies within 'minimum' / 'maximum'"
                          : "no integer of at most 18 digits lies within 'minimum' / 'maximum'");
    nd->bounded = true;
    nd->lo = lo;
    nd->hi = hi;
    return 0;
}

/* Whether [x, y] holds a multiple of m (> 0): the largest multiple <= y is >= x. */
static bool has_multiple(jd_num x, jd_num y, jd_num m) {
    if (x > y) return false;
    jd_num r = y % m;
    if (r < 0) r += m;
    return y - r >= x;
}


/* A numeric node's multipleOf m, in the node's units: a positive decimal of at most
 * FRAC_DIGITS fraction digits (the shortest decimal that reads back as the schema's double,
 * as for the bounds: "multipleOf": 0.01 is exactly 0.01), or a whole number up to 10^18. On a
 * number, v is a multiple when v·10^15 is one of m·10^15 — in decimal, as JSON Schema means
 * it (a float validator computing 0.07 / 0.01 may disagree); on an integer, when v is one of
 * m·10^15 / gcd(m·10^15, 10^15) (2.5: the multiples of 5; 0.5: every integer). Compile checks
 * the type. The node is bounded from here (by what can be written when nothing tighter was
 * given: a number without an exponent), so the prefix test sees it, and some multiple must
 * lie within the bounds. */
static int num_multiple(const cJSON *s, struct node *nd, const char *path, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, "multipleOf");
    if (!v) return 0;
    const bool number = nd->kind == K_NUMBER;
    const jd_num limit = jd_limit(number ? FRAC_DIGITS : 0);
    const bool whole = cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1e18 && v->valuedouble == floor(v->valuedouble);
    if (!number && whole) {
        nd->mult = (jd_num)v->valuedouble;
    } else {
        bool exact = false;
        const jd_num fl = jd_limit(FRAC_DIGITS);
        const jd_num m = cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble > 0
                            ? jd_scaled(v->valuedouble, FRAC_DIGITS, true, fl, &exact)
                            : 0;
        if (!exact || m < 1 || m > fl)
            return jsm_fail(err, errlen, path,
                            "'multipleOf' must be a positive decimal of at most 15 fraction digits and 18 integer digits");
        nd->mult = number ? m : m / jd_gcd(m, jd_pow10(FRAC_DIGITS));
    }
    if (!nd->bounded) {
        nd->bounded = true;
        nd->lo = -limit;
        nd->hi = limit;
    }
    if (!has_multiple(nd->lo, nd->hi, nd->mult))
        return jsm_fail(err, errlen, path, "no multiple of 'multipleOf' lies within 'minimum' / 'maximum'");
    return 0;
}

/* A count keyword (minItems ...): absent -> dflt; else an integer >= 0. */
static int count_kw(const cJSON *s, const char *kw, uint32_t dflt, uint32_t *out, const char *path, char *err,
                    size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, kw);
    *out = dflt;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 || v->valuedouble != (double)(long)v->valuedouble) {
        char m[96];
        snprintf(m, sizeof m, "'%s' must be a non-negative integer", kw);
        return jsm_fail(err, errlen, path, m);
    }
    *out = (uint32_t)v->valuedouble;
    return 0;
}

static int resolve_ref(jg_grammar *g, const char *ref, const char *path, int depth, char *err, size_t errlen) {
    const cJSON *target = jsm_ref_target(g->doc, ref);
    if (!target) {
        char m[320];
        snprintf(m, sizeof m, "'$ref' \"%.120s\" does not resolve (\"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" "
                              "in this schema are supported)", ref);
        return jsm_fail(err, errlen, path, m);
    }
    return compile(g, target, ref, depth + 1, err, errlen);
}

/* Gives node id the alternatives ids[0, n) (copied). Returns id, or -1. */
static int set_alts(jg_grammar *g, int id, const int *ids, int n) {
    int *a = malloc((size_t)n * sizeof *a);
    if (!a) return -1;
    memcpy(a, ids, (size_t)n * sizeof *a);
    g->nodes[id].alts = a;
    g->nodes[id].n_alt = n;
    return id;
}

/* The alternatives ids[0, n) as one node (the one itself when n is 1). */
static int alt_of(jg_grammar *g, const int *ids, int n) {
    if (n == 1) return ids[0];
    int id = new_node(g, K_ALT);
    return id < 0 ? -1 : set_alts(g, id, ids, n);
}

/* Whether lits[0, nl) holds a literal of this text. */
static bool lits_have(const jg_grammar *g, const int *lits, int nl, const char *text) {
    for (int i = 0; i < nl; i++)
        if (!strcmp(g->nodes[lits[i]].text, text)) return true;
    return false;
}

/* The distinct literal values node `id` allows (an enum, const, boolean or null, through
 * alternatives; a bounded integer's values — its multiples, with multipleOf — as literals of
 * their decimal text, when they fit: Pydantic's set[conint(ge=1, le=10)]), into lits (at
 * most 64, deduplicated by their canonical JSON text: cJSON prints 1 and 1.0 alike); -1 when
 * it allows anything else, or objects / arrays (whose texts need not be canonical), or more. */
static int unique_lits(jg_grammar *g, int id, int *lits, int *nl, int depth) {
    if (depth > 64) return -1;
    if (g->nodes[id].kind == K_ALT) {
        for (int i = 0; i < g->nodes[id].n_alt; i++) {
            const int rc = unique_lits(g, g->nodes[id].alts[i], lits, nl, depth + 1);
            if (rc < 0) return rc;
        }
        return 0;
    }
    if (g->nodes[id].kind == K_INTEGER) {
        const struct node n = g->nodes[id]; /* (literal() may move the node array) */
        if (!n.bounded) return -1;
        const jd_num step = n.mult ? n.mult : 1;
        jd_num r = n.lo % step;
        if (r < 0) r += step;
        jd_num v = r ? n.lo - r + step : n.lo; /* the least multiple ≥ lo */
        if (n.hi < v || (n.hi - v) / step >= 64) return -1; /* more than 64 values */
        for (; v <= n.hi; v += step) {
            char txt[24];
            snprintf(txt, sizeof txt, "%lld", (long long)v);
            if (lits_have(g, lits, *nl, txt)) continue;
            if (*nl == 64) return -1;
            const int lit = literal(g, txt);
            if (lit < 0) return -2; /* out of memory */
            lits[(*nl)++] = lit;
        }
        return 0;
    }
    const struct node *n = &g->nodes[id];
    if (n->kind != K_LITERAL || n->text[0] == '{' || n->text[0] == '[') return -1;
    if (lits_have(g, lits, *nl, n->text)) return 0;
    if (*nl == 64) return -1;
    lits[(*nl)++] = id;
    return 0;
}

#define UNIQ_STR_MAX 16 /* items of a uniqueItems array of free strings */
#define UNIQ_INT_MAX 10 /* of integers (compile's free_int: why no prefix is a dead end) */

/* Node id through ALTs of one alternative (what a schema's compile wraps its node in). */
static int single_node(const jg_grammar *g, int id) {
    for (int hops = 0; hops < 64 && g->nodes[id].kind == K_ALT && g->nodes[id].n_alt == 1; hops++) id = g->nodes[id].alts[0];
    return id;
}

/* The node of one JSON type name, built from schema s's keywords for it. */
static int type_node(jg_grammar *g, const cJSON *s, const char *type, const char *path, int depth, char *err,
                     size_t errlen) {
    char sub[256];
    if (!strcmp(type, "null")) return g->lit_null;
    if (!strcmp(type, "boolean")) return alt_of(g, (const int[]){g->lit_true, g->lit_false}, 2);
    if (!strcmp(type, "integer") || !strcmp(type, "number")) {
        int id = new_node(g, type[0] == 'i' ? K_INTEGER : K_NUMBER);
        return id < 0 || num_bounds(s, &g->nodes[id], path, err, errlen) || num_multiple(s, &g->nodes[id], path, err, errlen)
                   ? -1
                   : id;
    }
    if (!strcmp(type, "string")) {
        uint32_t lo, hi;
        if (count_kw(s, "minLength", 0, &lo, path, err, errlen) || count_kw(s, "maxLength", UINT32_MAX, &hi, path, err, errlen))
            return -1;
        if (lo > hi) return jsm_fail(err, errlen, path, "'minLength' is above 'maxLength'");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
        jr_nfa *re = NULL;
        if (pat) {
            if (!cJSON_IsString(pat)) return jsm_fail(err, errlen, path, "'pattern' must be a string");
            if ((lo > 0 || hi != UINT32_MAX) && hi >= JR_LENS)
                return jsm_fail(err, errlen, path, "beside 'pattern', 'maxLength' must be given and at most 255");
            char m[200];
            if (jr_compile(pat->valuestring, &re, m, sizeof m)) return jsm_fail(err, errlen, path, m);
            if (hi < JR_LENS && !jr_len_ok(re, jr_start(re), (int)lo, (int)hi)) {
                jr_free(re);
                return jsm_fail(err, errlen, path, "no string the pattern matches has a length within 'minLength' / "
                                                 "'maxLength'");
            }
        }
        int id = new_node(g, K_STRING);
        if (id < 0) {
            jr_free(re);
            return -1;
        }
        g->nodes[id].min_len = lo;
        g->nodes[id].max_len = hi;
        g->nodes[id].re = re;
        return id;
    }
    if (!strcmp(type, "array")) {
        uint32_t lo, hi;
        if (count_kw(s, "minItems", 0, &lo, path, err, errlen) || count_kw(s, "maxItems", UINT32_MAX, &hi, path, err, errlen))
            return -1;
        if (lo > hi) return jsm_fail(err, errlen, path, "'minItems' is above 'maxItems'");
        /* a tuple: prefixItems (2020-12, Pydantic's tuple[...]) with 'items' for the rest, or
         * the older 'items' array with 'additionalItems'; otherwise 'items' for every element.
         * A rest of 'false' ends the array at the tuple's length. */
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
        const char *prefix_kw = "prefixItems", *rest_kw = "items";
        if (prefix && !cJSON_IsArray(prefix)) return jsm_fail(err, errlen, path, "'prefixItems' must be an array of schemas");
        if (!prefix && items && cJSON_IsArray(items)) {
            prefix = items;
            prefix_kw = "items";
            rest_kw = "additionalItems";
            items = cJSON_GetObjectItemCaseSensitive(s, "additionalItems");
        }
        const int n_prefix = prefix ? cJSON_GetArraySize(prefix) : 0;
        if (items && cJSON_IsFalse(items)) {
            if (lo > (uint32_t)n_prefix)
                return jsm_fail(err, errlen, path, "'minItems' is above the tuple's length, and no further items are allowed");
            if (hi > (uint32_t)n_prefix) hi = (uint32_t)n_prefix;
        }
        int id = new_node(g, K_ARRAY);
        if (id < 0) return -1;
        g->nodes[id].min_items = lo;
        g->nodes[id].max_items = hi;
        if (n_prefix > 0) {
            int *pre = malloc((size_t)n_prefix * sizeof *pre);
            if (!pre) return -1;
            g->nodes[id].prefix = pre; /* owned by the node from here (free_nodes) */
            for (int i = 0; i < n_prefix; i++) {
                snprintf(sub, sizeof sub, "%s/%s/%d", path, prefix_kw, i);
                const int el = compile(g, cJSON_GetArrayItem(prefix, i), sub, depth + 1, err, errlen);
                if (el < 0) return -1;
                g->nodes[id].prefix[i] = el;
                g->nodes[id].n_prefix = i + 1;
            }
        }
        snprintf(sub, sizeof sub, "%s/%s", path, rest_kw);
        int it = !items ? g->any : cJSON_IsFalse(items) ? -1 : compile(g, items, sub, depth + 1, err, errlen);
        if (it < 0 && !(items && cJSON_IsFalse(items))) return -1;
        g->nodes[id].items = it;
        /* uniqueItems over a finite set of literal values (Pydantic's set[Literal[...]],
         * set[bool]): each value at most once; beyond that (sets of strings, numbers,
         * objects) it cannot be enforced here */
        const cJSON *uq = cJSON_GetObjectItemCaseSensitive(s, "uniqueItems");
        if (uq && !cJSON_IsBool(uq)) return jsm_fail(err, errlen, path, "'uniqueItems' must be a boolean");
        const int str = it >= 0 ? single_node(g, it) : -1;
        const bool free_str = str >= 0 && g->nodes[str].kind == K_STRING && !g->nodes[str].re && g->nodes[str].max_len >= 1;
        /* Integers where no prefix runs out of values before the items do: no maximum, no
         * multipleOf, a minimum (if any) of 0 .. 10^16 (Pydantic's set[int], set[PositiveInt],
         * set[NonNegativeInt]). A prefix that can still grow then has at least 11 values to
         * end as (a 17-digit one: itself and its 10 extensions; the 18-digit cap and 0 end at
         * once and are refused at their digit while taken), and at most UNIQ_INT_MAX - 1 = 9
         * are taken when an item is written: never a dead end. A maximum, a negative minimum
         * or a multipleOf could leave a prefix whose every completion is taken. */
        const struct node *in = str >= 0 ? &g->nodes[str] : NULL;
        const bool free_int = in && in->kind == K_INTEGER && !in->mult &&
                              (!in->bounded || (in->lo >= 0 && in->lo <= jd_pow10(16) && in->hi == jd_limit(0)));
        if (cJSON_IsTrue(uq) && n_prefix == 0 && (free_str || free_int)) {
            /* a set of free strings (Pydantic's set[str]) or integers: each item's text (a
             * string's) or value (an integer's) hashed as it is written, a close refused while
             * the hash is in the filter (uniq_*). At most UNIQ_STR_MAX strings, so the 128-bit
             * filter stays sparse (a false positive, which makes the model write a longer
             * string or number, at ~2 % by the 16th item), UNIQ_INT_MAX integers (above) */
            const uint32_t cap = free_str ? UNIQ_STR_MAX : UNIQ_INT_MAX;
            if (lo > cap) {
                char m[96];
                snprintf(m, sizeof m, "'uniqueItems' over %s is enforced for at most %u items ('minItems' is above)",
                         free_str ? "strings" : "integers", (unsigned)cap);
                return jsm_fail(err, errlen, path, m);
            }
            g->nodes[id].items = str;
            g->nodes[id].unique_hashed = true;
            if (g->nodes[id].max_items > cap) g->nodes[id].max_items = cap;
        } else if (cJSON_IsTrue(uq)) {
            int lits[64], nl = 0, rc = -1;
            if (n_prefix == 0 && it >= 0 && (rc = unique_lits(g, it, lits, &nl, 0)) == -2)
                return jsm_fail(err, errlen, path, "out of memory");
            if (rc < 0)
                return jsm_fail(err, errlen, path, "'uniqueItems' is enforced only over items of at most 64 enum / const / "
                                                 "boolean / null / bounded integer values, strings without a 'pattern', or "
                                                 "integers without a maximum, 'multipleOf' or a minimum outside 0 .. 10^16 "
                                                 "(no tuple)");
            if (lo > (uint32_t)nl) return jsm_fail(err, errlen, path, "'minItems' is above the number of distinct values the items allow");
            const int flat = new_node(g, K_ALT);
            if (flat < 0 || set_alts(g, flat, lits, nl) < 0) return -1;
            g->nodes[id].items = flat;
            g->nodes[id].unique = true;
            if (g->nodes[id].max_items > (uint32_t)nl) g->nodes[id].max_items = (uint32_t)nl; /* so an element always has a value left */
        }
        return id;
    }
    if (!strcmp(type, "object")) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
        const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        if (props && !cJSON_IsObject(props)) return jsm_fail(err, errlen, path, "'properties' must be an object");
        if (req && !cJSON_IsArray(req)) return jsm_fail(err, errlen, path, "'required' must be an array of names");
        int n_declared = props ? cJSON_GetArraySize(props) : 0;
        uint32_t pmin, pmax;
        if (count_kw(s, "minProperties", 0, &pmin, path, err, errlen) ||
            count_kw(s, "maxProperties", UINT32_MAX, &pmax, path, err, errlen))
            return -1;
        if (pmin > pmax) return jsm_fail(err, errlen, path, "'minProperties' is above 'maxProperties'");
        int id = new_node(g, K_OBJECT);
        if (id < 0) return -1;
        g->nodes[id].min_props = pmin;
        g->nodes[id].max_props = pmax;
        if (n_declared == 0 && !(req && cJSON_GetArraySize(req) > 0)) {
            /* generic: any key; values of additionalProperties (a schema) or anything */
            int v = g->any;
            if (cJSON_IsObject(addl)) {
                snprintf(sub, sizeof sub, "%s/additionalProperties", path);
                v = compile(g, addl, sub, depth + 1, err, errlen);
                if (v < 0) return -1;
            } else if (cJSON_IsFalse(addl)) {
                v = -2; /* no keys at all: only {} */
                if (pmin > 0) return jsm_fail(err, errlen, path, "'minProperties' can never be met: no property is allowed");
            }
            g->nodes[id].value_node = v;
            return id;
        }
        /* declared: the properties, and required names not among them (values: anything) */
        int n_extra = 0;
        const cJSON *r;
        cJSON_ArrayForEach(r, req) {
            if (!cJSON_IsString(r)) return jsm_fail(err, errlen, path, "'required' must be an array of names");
            if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) n_extra++;
        }
        int total = n_declared + n_extra;
        if (total > 64) return jsm_fail(err, errlen, path, "more than 64 properties in one object are not supported");
        struct node *o = &g->nodes[id]; /* valid until the next new_node */
        o->names = calloc((size_t)total, sizeof *o->names);
        o->name_lens = calloc((size_t)total, sizeof *o->name_lens);
        o->prop_nodes = calloc((size_t)total, sizeof *o->prop_nodes);
        if (!o->names || !o->name_lens || !o->prop_nodes) return -1;
        int k = 0;
        const cJSON *p;
        cJSON_ArrayForEach(p, props) {
            g->nodes[id].names[k] = escaped(p->string, &g->nodes[id].name_lens[k]);
            if (!g->nodes[id].names[k]) return -1;
            g->nodes[id].n_props = k + 1;
            snprintf(sub, sizeof sub, "%s/properties/%.80s", path, p->string);
            int pn = compile(g, p, sub, depth + 1, err, errlen);
            if (pn < 0) return -1;
            g->nodes[id].prop_nodes[k] = pn;
            k++;
        }
        cJSON_ArrayForEach(r, req) {
            size_t len;
            char *name = escaped(r->valuestring, &len);
            if (!name) return -1;
            int at = -1;
            for (int i = 0; i < k && at < 0; i++)
                if (len == g->nodes[id].name_lens[i] && !memcmp(name, g->nodes[id].names[i], len)) at = i;
            if (at < 0) { /* required but not declared: any value */
                g->nodes[id].names[k] = name;
                g->nodes[id].name_lens[k] = len;
                g->nodes[id].prop_nodes[k] = g->any;
                g->nodes[id].n_props = k + 1;
                at = k++;
            } else {
                free(name);
            }
            g->nodes[id].required |= 1ull << at;
        }
        g->nodes[id].all = k == 64 ? ~0ull : (1ull << k) - 1;
        /* declared properties only (additionalProperties is not enforced beside them: no
         * other key is ever written), so the counts are over those */
        if (pmin > (uint32_t)k) return jsm_fail(err, errlen, path, "'minProperties' is above the number of properties that may be written");
        if ((uint32_t)__builtin_popcountll(g->nodes[id].required) > pmax)
            return jsm_fail(err, errlen, path, "'maxProperties' is below the number of required properties");
        return id;
    }
    char m[96];
    snprintf(m, sizeof m, "unknown type '%.40s'", type);
    return jsm_fail(err, errlen, path, m);
}

static void push_start(struct jg_thread *t, int node);

/* Whether the text (a complete JSON value) is a document of node id's grammar. */
static bool node_accepts(const jg_grammar *g, int id, const char *text) {
    jg_state st;
    st.n = 1;
    push_start(&st.t[0], id);
    return jg_feed(g, &st, text, strlen(text)) && jg_complete(g, &st);
}

/* The node of schema s without its enum / const: what its other keywords allow (compiled
 * from a copy; the memo entries made for the copy's objects are dropped with it, so no
 * freed pointer stays behind — $ref targets in the document compiled meanwhile are simply
 * compiled again where met). */
static int rest_node(jg_grammar *g, const cJSON *s, const char *path, int depth, char *err, size_t errlen) {
    cJSON *copy = cJSON_Duplicate(s, 1);
    if (!copy) return -1;
    cJSON_DeleteItemFromObjectCaseSensitive(copy, "enum");
    cJSON_DeleteItemFromObjectCaseSensitive(copy, "const");
    const int memo_mark = g->n_memo;
    const int id = compile(g, copy, path, depth + 1, err, errlen);
    g->n_memo = memo_mark;
    cJSON_Delete(copy);
    return id;
}

/* An anyOf / oneOf's alternatives as nodes into ids[*n]: each compiled with the keywords of
 * its schema carried in (jsm_carry_into; compiled from copies, whose memo entries are dropped
 * with them as in rest_node), or as it is when the schema has none. */
static int any_of_nodes(jg_grammar *g, const cJSON *s, const cJSON *any_of, const char *path, int depth, int *ids, int *n,
                        char *err, size_t errlen) {
    bool carry = false;
    const cJSON *k;
    cJSON_ArrayForEach(k, s) carry = carry || jsm_carried_kw(k->string);
    char sub[256];
    const cJSON *v;
    int i = 0, kept = 0;
    cJSON_ArrayForEach(v, any_of) {
        snprintf(sub, sizeof sub, "%s/anyOf/%d", path, i++);
        if (!carry) {
            if ((ids[(*n)++] = compile(g, v, sub, depth + 1, err, errlen)) < 0) return -1;
            continue;
        }
        int rc;
        cJSON *m = jsm_carry_into(g->doc, s, v, sub, &rc, err, errlen);
        if (!m) {
            if (rc < 0) return -1;
            continue; /* no type in common: this alternative allows nothing here */
        }
        const int memo_mark = g->n_memo;
        const int id = compile(g, m, sub, depth + 1, err, errlen);
        g->n_memo = memo_mark;
        cJSON_Delete(m);
        if (id < 0) return -1;
        ids[(*n)++] = id;
        kept++;
    }
    if (carry && !kept) return jsm_fail(err, errlen, path, "no alternative of 'anyOf' / 'oneOf' allows a type the schema's 'type' does");
    return 0;
}

static int compile(jg_grammar *g, const cJSON *s, const char *path, int depth, char *err, size_t errlen) {
    if (depth > 64) return jsm_fail(err, errlen, path, "the schema nests too deeply");
    if (cJSON_IsTrue(s)) return g->any;
    if (cJSON_IsFalse(s)) return jsm_fail(err, errlen, path, "the schema 'false' allows nothing");
    if (!cJSON_IsObject(s)) return jsm_fail(err, errlen, path, "a schema must be an object or a boolean");
    for (int i = 0; i < g->n_memo; i++)
        if (g->memo[i].schema == s) return g->memo[i].node;
    /* minimum / maximum bind numbers only (JSON Schema): enforced where the type names one.
     * Beside an allOf these checks wait for the merged schema (the type may be inside). */
    const bool numeric = type_names(s, "integer") || type_names(s, "number");
    const bool merging = cJSON_GetObjectItemCaseSensitive(s, "allOf") != NULL;
    if (!merging && cJSON_GetObjectItemCaseSensitive(s, "pattern") && !type_names(s, "string"))
        return jsm_fail(err, errlen, path, "'pattern' needs 'type': \"string\" to be enforced");
    if (!merging && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "uniqueItems")) && !type_names(s, "array") &&
        !cJSON_GetObjectItemCaseSensitive(s, "items") && !cJSON_GetObjectItemCaseSensitive(s, "prefixItems"))
        return jsm_fail(err, errlen, path, "'uniqueItems' needs 'type': \"array\" (and items) to be enforced");
    if (!merging && cJSON_GetObjectItemCaseSensitive(s, "multipleOf") && !numeric)
        return jsm_fail(err, errlen, path, "'multipleOf' needs a numeric 'type' (\"integer\" or \"number\") to be enforced");
    for (size_t i = 0; i < sizeof k_unsupported / sizeof k_unsupported[0]; i++)
        if (cJSON_GetObjectItemCaseSensitive(s, k_unsupported[i]) && !(numeric && is_bound_kw(k_unsupported[i])) &&
            !(merging && is_bound_kw(k_unsupported[i]))) {
            char m[128];
            if (is_bound_kw(k_unsupported[i]))
                snprintf(m, sizeof m, "'%s' needs a numeric 'type' (\"integer\" or \"number\") to be enforced",
                         k_unsupported[i]);
            else
                snprintf(m, sizeof m, "'%s' is not supported in constrained output", k_unsupported[i]);
            return jsm_fail(err, errlen, path, m);
        }
    /* reserve the node first (an ALT of one, filled below) so $ref cycles end here */
    int self = new_node(g, K_ALT);
    if (self < 0) return -1;
    if (g->n_memo == g->cap_memo) {
        int c = g->cap_memo ? g->cap_memo * 2 : 16;
        struct memo *p = realloc(g->memo, (size_t)c * sizeof *p);
        if (!p) return -1;
        g->memo = p;
        g->cap_memo = c;
    }
    g->memo[g->n_memo++] = (struct memo){s, self};

    int ids[16], n = 0;
    char sub[256];
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *any_of = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any_of) any_of = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const cJSON *all_of = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (!cn && !en && ref && !all_of &&
        (cJSON_GetObjectItemCaseSensitive(s, "minProperties") || cJSON_GetObjectItemCaseSensitive(s, "maxProperties")))
        return jsm_fail(err, errlen, path, "'minProperties' / 'maxProperties' beside '$ref' are not supported");
    if (cn || en) {
        /* the listed values that the schema's other keywords — $ref and allOf included —
         * allow too (all of a schema's keywords apply: {"type": "integer", "enum": [1, "a"]}
         * allows only 1) */
        if (en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0))
            return jsm_fail(err, errlen, path, "'enum' must be a non-empty array");
        const int rest = rest_node(g, s, path, depth, err, errlen);
        if (rest < 0) return -1;
        int m = cn ? 1 : cJSON_GetArraySize(en), k = 0;
        int *lits = malloc((size_t)m * sizeof *lits);
        if (!lits) return -1;
        for (int i = 0; i < m; i++) {
            char *t = cJSON_PrintUnformatted(cn ? cn : cJSON_GetArrayItem(en, i));
            if (!t) {
                free(lits);
                return -1;
            }
            if (node_accepts(g, rest, t) && (lits[k] = literal(g, t)) >= 0) k++;
            free(t);
        }
        ids[n] = k ? alt_of(g, lits, k) : -1;
        free(lits);
        if (!k) return jsm_fail(err, errlen, path, cn ? "'const' is not allowed by the schema's other keywords"
                                                    : "no value of 'enum' is allowed by the schema's other keywords");
        if (ids[n++] < 0) return -1;
    } else if (all_of) {
        /* one schema and nothing beside it to validate (Pydantic wraps a $ref in it to give
         * the field a description): that schema, shared with its other uses; else the
         * schemas merged into their intersection (jsm_all_of), compiled from the copy (its
         * memo entries dropped with it, as in rest_node) */
        bool alone = cJSON_IsArray(all_of) && cJSON_GetArraySize(all_of) == 1;
        const cJSON *k;
        cJSON_ArrayForEach(k, s) alone = alone && (!strcmp(k->string, "allOf") || jsm_annotation_kw(k->string));
        if (alone) {
            snprintf(sub, sizeof sub, "%s/allOf/0", path);
            ids[n] = compile(g, cJSON_GetArrayItem(all_of, 0), sub, depth + 1, err, errlen);
        } else {
            cJSON *merged = jsm_all_of(g->doc, s, path, err, errlen);
            if (!merged) return -1;
            const int memo_mark = g->n_memo;
            ids[n] = compile(g, merged, path, depth + 1, err, errlen);
            g->n_memo = memo_mark;
            cJSON_Delete(merged);
        }
        if (ids[n++] < 0) return -1;
    } else if (ref) {
        if (!cJSON_IsString(ref)) return jsm_fail(err, errlen, path, "'$ref' must be a string");
        ids[n] = resolve_ref(g, ref->valuestring, path, depth, err, errlen);
        if (ids[n++] < 0) return -1;
    } else if (any_of) {
        if (!cJSON_IsArray(any_of) || cJSON_GetArraySize(any_of) == 0 || cJSON_GetArraySize(any_of) > 16)
            return jsm_fail(err, errlen, path, "'anyOf' / 'oneOf' must be an array of 1 to 16 schemas");
        if (any_of_nodes(g, s, any_of, path, depth, ids, &n, err, errlen)) return -1;
    } else if (type) {
        if (cJSON_IsString(type)) {
            ids[n] = type_node(g, s, type->valuestring, path, depth, err, errlen);
            if (ids[n++] < 0) return -1;
        } else if (cJSON_IsArray(type) && cJSON_GetArraySize(type) > 0 && cJSON_GetArraySize(type) <= 7) {
            const cJSON *t;
            cJSON_ArrayForEach(t, type) {
                if (!cJSON_IsString(t)) return jsm_fail(err, errlen, path, "'type' must be a string or an array of strings");
                ids[n] = type_node(g, s, t->valuestring, path, depth, err, errlen);
                if (ids[n++] < 0) return -1;
            }
        } else {
            return jsm_fail(err, errlen, path, "'type' must be a string or an array of 1 to 7 strings");
        }
    } else if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
               cJSON_GetObjectItemCaseSensitive(s, "minProperties") || cJSON_GetObjectItemCaseSensitive(s, "maxProperties")) {
        ids[n] = type_node(g, s, "object", path, depth, err, errlen);
        if (ids[n++] < 0) return -1;
    } else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "prefixItems")) {
        ids[n] = type_node(g, s, "array", path, depth, err, errlen);
        if (ids[n++] < 0) return -1;
    } else {
        ids[n++] = g->any;
    }
    /* nullable (OpenAPI 3.0) adds null to an explicit type only, and never beside an enum or
     * const (which must list null then, 3.0.3); readings that add it more widely allow all
     * this allows, so what is written is valid under both */
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable")) && type && !en && !cn && n < 16) ids[n++] = g->lit_null;
    return set_alts(g, self, ids, n);
}

static void free_nodes(jg_grammar *g) {
    for (int i = 0; i < g->n; i++) {
        struct node *n = &g->nodes[i];
        for (int k = 0; k < n->n_props; k++) free(n->names[k]);
        free(n->names);
        free(n->name_lens);
        free(n->prop_nodes);
        free(n->text);
        free(n->alts);
        free(n->prefix);
        jr_free(n->re);
    }
    free(g->nodes);
}

int jg_compile(const cJSON *schema, jg_grammar **out, char *err, size_t errlen) {
    *out = NULL;
    jg_grammar *g = calloc(1, sizeof *g);
    if (!g) return jsm_fail(err, errlen, "#", "out of memory");
    snprintf(err, errlen, "#: out of memory");
    g->doc = schema;
    int ok = (g->any = new_node(g, K_ANY)) >= 0 && (g->any_object = new_node(g, K_OBJECT)) >= 0 &&
             (g->any_array = new_node(g, K_ARRAY)) >= 0 && (g->any_string = new_node(g, K_STRING)) >= 0 &&
             (g->any_number = new_node(g, K_NUMBER)) >= 0 && (g->lit_true = literal(g, "true")) >= 0 &&
             (g->lit_false = literal(g, "false")) >= 0 && (g->lit_null = literal(g, "null")) >= 0;
    if (ok) {
        g->nodes[g->any_object].value_node = g->any;
        g->nodes[g->any_array].items = g->any;
        g->root = schema ? compile(g, schema, "#", 0, err, errlen) : g->any_object;
    }
    free(g->memo);
    g->memo = NULL;
    g->doc = NULL;
    if (!ok || g->root < 0) {
        free_nodes(g);
        free(g);
        return -1;
    }
    err[0] = 0;
    *out = g;
    return 0;
}

void jg_free(jg_grammar *g) {
    if (!g) return;
    free_nodes(g);
    free(g);
}

/* ---- recognizing ---- */

#define PAIR_LOW 16 /* P_S_HEX's pos flag: the digits of a surrogate pair's low half */

enum phase {
    P_START = 0, /* before the value (whitespace allowed) */
    /* object */
    P_O_FIRST,   /* after '{': a key or '}' */
    P_O_KEY,     /* inside a declared key */
    P_O_COLON,
    P_O_NEXT,    /* after a value: ',' or '}' */
    P_O_KEYSTART,/* after ',': a key */
    /* array */
    P_A_FIRST,   /* after '[': a value or ']' */
    P_A_NEXT,    /* after a value: ',' or ']' */
    P_A_VALUE,   /* after ',': a value */
    /* string */
    P_S_IN, P_S_ESC, P_S_HEX,
    P_S_PAIR, P_S_PAIRU, /* after a high surrogate's \uD800-DBFF: its low half's '\\', then 'u' */
    /* number */
    P_N_SIGN, P_N_ZERO, P_N_INT, P_N_DOT, P_N_FRAC, P_N_E, P_N_ESIGN, P_N_EXP,
    /* literal */
    P_L_IN,
};

/* A number frame's digits: seen = the integer part's value, its top bit the sign; cand =
 * the fraction digits' value (pos of them in P_N_FRAC). */
#define NUM_NEG (1ULL << 63)
static bool num_neg(const struct jg_frame *f) { return f->seen & NUM_NEG; }
static jd_num num_int(const struct jg_frame *f) { return (jd_num)(f->seen & ~NUM_NEG); }

/* The values (in the node's units) a bounded number's frame can still end as, [*a, *b];
 * false for the sign alone (any value <= 0 may follow). */
static bool num_span(const struct node *n, const struct jg_frame *f, int j, jd_num *a, jd_num *b) {
    const jd_num unit = jd_pow10(n->kind == K_NUMBER ? FRAC_DIGITS : 0);
    jd_num lo, width;
    switch (f->phase) {
    case P_N_ZERO: lo = 0, width = unit; break; /* 0, or 0.xxx */
    case P_N_INT: lo = num_int(f) * jd_pow10(j) * unit, width = jd_pow10(j) * unit; break; /* j more digits */
    case P_N_DOT: lo = num_int(f) * unit, width = unit; break;
    case P_N_FRAC: {
        const jd_num step = jd_pow10(FRAC_DIGITS - f->pos);
        lo = num_int(f) * unit + (jd_num)f->cand * step, width = step;
        break;
    }
    default: return false;
    }
    if (n->kind == K_INTEGER && f->phase == P_N_ZERO) width = 1;
    if (num_neg(f)) *a = -(lo + width - 1), *b = -lo;
    else *a = lo, *b = lo + width - 1;
    return true;
}

/* Whether some value within the node's bounds can still be written from this frame. */
/* Whether some value of [a, b] is within the node's bounds (and, with multipleOf, a multiple). */
static bool span_ok(const struct node *n, jd_num a, jd_num b) {
    if (a > n->hi || b < n->lo) return false;
    return !n->mult || has_multiple(a > n->lo ? a : n->lo, b < n->hi ? b : n->hi, n->mult);
}

static bool num_viable(const struct node *n, const struct jg_frame *f) {
    if (!n->bounded) return true;
    if (f->phase == P_N_SIGN) return span_ok(n, n->lo, 0); /* "-": some v <= 0 (-0 is 0) */
    const int more = f->phase == P_N_INT ? INT_DIGITS - f->pos : 0;
    for (int j = 0; j <= more; j++) {
        jd_num a, b;
        if (num_span(n, f, j, &a, &b) && span_ok(n, a, b)) return true;
    }
    return false;
}

/* Whether a finished number (phase ZERO, INT or FRAC) is within the node's bounds. */
static bool num_within(const struct node *n, const struct jg_frame *f) {
    if (!n->bounded) return true;
    const jd_num unit = jd_pow10(n->kind == K_NUMBER ? FRAC_DIGITS : 0);
    jd_num v = f->phase == P_N_ZERO ? 0 : num_int(f) * unit;
    if (f->phase == P_N_FRAC) v += (jd_num)f->cand * jd_pow10(FRAC_DIGITS - f->pos);
    if (num_neg(f)) v = -v;
    return v >= n->lo && v <= n->hi && (!n->mult || v % n->mult == 0);
}

/* The characters a patterned string may still take after `count` of them (the pending one
 * counted): with min/maxLength, *lo..*hi; without, any (false). */
static bool re_lengths(const struct node *n, uint32_t count, int *lo, int *hi) {
    if (n->max_len == UINT32_MAX && n->min_len == 0) return false;
    *lo = (int)n->min_len - (int)count;
    *hi = (int)n->max_len - (int)count; /* max_len < JR_LENS here (type_node) */
    return true;
}

/* Whether some code point in [lo, hi] — the pending character, the count-th — takes the
 * pattern on, within the string's lengths. */
static bool re_range(const struct node *n, const struct jg_frame *f, uint32_t count, uint32_t lo, uint32_t hi) {
    int a, b;
    return re_lengths(n, count, &a, &b) ? jr_can_len(n->re, f->cand, lo, hi, a, b) : jr_can(n->re, f->cand, lo, hi);
}

/* A patterned string's next code point, or the code points [cp << 6·more, ...] a partial
 * UTF-8 sequence can still become (more continuation bytes due): a whole one steps the
 * NFA (cand), a partial one must be able to; false when the pattern cannot go on. */
static bool re_cp(const struct node *n, struct jg_frame *f, uint32_t cp, int more) {
    if (more == 0) {
        if (cp >= 0xD800 && cp <= 0xDFFF) return false;
        f->cand = jr_step(n->re, f->cand, cp);
        int a, b;
        return f->cand != 0 && (!re_lengths(n, f->count, &a, &b) || jr_len_ok(n->re, f->cand, a, b));
    }
    uint32_t lo = cp << (6 * more), hi = lo | ((1u << (6 * more)) - 1);
    const uint32_t least = more == 1 && cp < 0x20 ? 0x80 : more == 2 && cp < 0x10 ? 0x800 : more == 3 ? 0x10000 : 0;
    if (lo < least) lo = least; /* no overlongs (the byte ranges keep the rest) */
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    return lo <= hi && re_range(n, f, f->count, lo, hi);
}

#define WS_MAX 32

static bool is_ws(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_hex(int c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* Whitespace where it may stand; false when the run is too long. */
static bool take_ws(struct jg_frame *f) { return ++f->ws <= WS_MAX; }

/* An object's properties so far: the declared ones given (seen is their mask), or the keys
 * begun (a generic object counts them in seen). */
static uint32_t obj_count(const struct node *n, const struct jg_frame *f) {
    return n->value_node == -1 ? (uint32_t)__builtin_popcountll(f->seen) : (uint32_t)f->seen;
}
/* Whether the object may end here: no required property missing, minProperties met. */
static bool obj_may_close(const struct node *n, const struct jg_frame *f) {
    return !(n->value_node == -1 && (n->required & ~f->seen)) && obj_count(n, f) >= n->min_props;
}
/* The declared properties a next key may be: any not yet given, or only required ones once
 * another optional one would leave no room under maxProperties for those still missing. */
static uint64_t obj_keys(const struct node *n, const struct jg_frame *f) {
    const uint64_t left = n->all & ~f->seen, need = n->required & ~f->seen;
    /* invariant: count + |need| <= max (compile checked it for the empty object) */
    return (uint64_t)obj_count(n, f) + 1 + (uint64_t)__builtin_popcountll(need) > n->max_props ? need : left;
}

static void emit(jg_state *out, const struct jg_thread *t) {
    for (int i = 0; i < out->n; i++) {
        const struct jg_thread *o = &out->t[i];
        if (o->depth == t->depth && !memcmp(o->f, t->f, (size_t)t->depth * sizeof t->f[0])) return;
    }
    if (out->n == JG_MAX_THREADS) return; /* narrower, never wrong */
    struct jg_thread *d = &out->t[out->n++];
    d->depth = t->depth;
    memcpy(d->f, t->f, (size_t)t->depth * sizeof t->f[0]);
}

static bool push(struct jg_thread *t, int node, int phase) {
    if (t->depth == JG_MAX_DEPTH) return false;
    struct jg_frame *f = &t->f[t->depth++];
    memset(f, 0, sizeof *f);
    f->node = node;
    f->phase = (uint8_t)phase;
    return true;
}

/* ---- uniqueItems over strings ----
 * An item's UTF-16 code units are hashed (FNV-1a, 64 bits) into its frame's cand as they
 * complete — raw UTF-8 and \u escapes alike, so equal JSON strings hash alike. The array's
 * frame keeps a Bloom filter of 4 bits (of its seen:cand) an item: a close is refused while
 * all 4 of the string's bits are set, which a string written before always has — no item
 * repeats; another rarely has them (a false positive: the model writes a longer string
 * instead). A string at maxLength can only close, so the character that would bring it there
 * as a string in the filter is refused too: never a dead end (maxLength ≥ 1 is compiled). */
static uint64_t uniq_unit(uint64_t h, uint32_t u) {
    h = (h ^ (u & 0xFF)) * 0x100000001b3ull;
    return (h ^ (u >> 8 & 0xFF)) * 0x100000001b3ull;
}
static uint64_t uniq_cp(uint64_t h, uint32_t cp) {
    if (cp < 0x10000) return uniq_unit(h, cp);
    cp -= 0x10000;
    return uniq_unit(uniq_unit(h, 0xD800 + (cp >> 10)), 0xDC00 + (cp & 0x3FF));
}
/* The array frame when thread t's top frame is an item of a unique-strings array, else NULL. */
static struct jg_frame *uniq_parent(const jg_grammar *g, struct jg_thread *t) {
    if (t->depth < 2) return NULL;
    struct jg_frame *p = &t->f[t->depth - 2];
    const struct node *pn = &g->nodes[p->node];
    return pn->kind == K_ARRAY && pn->unique_hashed && pn->items == t->f[t->depth - 1].node ? p : NULL;
}
/* Whether hash h's 4 bits are all set in the array frame's filter; add: set them. */
static bool uniq_bits(struct jg_frame *p, uint64_t h, bool add) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    bool all = true;
    for (int j = 0; j < 4; j++) {
        const unsigned i = (unsigned)(h >> (7 * j)) & 127;
        uint64_t *w = i < 64 ? &p->seen : &p->cand;
        all = all && (*w >> (i & 63) & 1);
        if (add) *w |= 1ull << (i & 63);
    }
    return all;
}
/* An item of hash h closing: refused (false) while h is in its unique array's filter (a
 * value written before, or a false positive), else marked there. True outside such arrays. */
static bool uniq_close(const jg_grammar *g, struct jg_thread *t, uint64_t h) {
    struct jg_frame *p = uniq_parent(g, t);
    if (!p) return true;
    if (uniq_bits(p, h, false)) return false;
    uniq_bits(p, h, true);
    return true;
}
/* A unique-integers item's value as a filter hash: the frame's magnitude, negative unless
 * zero (-0 and 0 are one value). */
static uint64_t uniq_int_hash(const struct jg_frame *f) {
    const uint64_t mag = f->seen & ~NUM_NEG;
    return (mag << 1 | (uint64_t)(mag && (f->seen & NUM_NEG))) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
}
/* Whether a unique-integers item may stay at the value its frame now holds: one that can no
 * longer grow (a 0 or -0, or INT_DIGITS digits) can only close, so it is refused while in the
 * filter; any other prefix has more values to end as than the array has items (compile's
 * free_int), so it is never a dead end. */
static bool uniq_int_ok(const jg_grammar *g, struct jg_thread *t, const struct jg_frame *f) {
    struct jg_frame *p = uniq_parent(g, t);
    if (!p) return true;
    const struct node *n = &g->nodes[f->node];
    /* (a '-' where the items are at least 0 can only become -0) */
    const bool final = f->phase == P_N_ZERO || (f->phase == P_N_INT && f->pos >= INT_DIGITS) ||
                       (f->phase == P_N_SIGN && n->bounded && n->lo >= 0);
    return !final || !uniq_bits(p, uniq_int_hash(f), false);
}

/* A unique-strings item's code unit (unit) or code point v hashed; done: a character is
 * complete, refused (false) when the string would then sit at maxLength in the filter. */
static bool uniq_char(const jg_grammar *g, struct jg_thread *t, struct jg_frame *f, const struct node *n, uint32_t v,
                      bool unit, bool done) {
    struct jg_frame *p = uniq_parent(g, t);
    if (!p) return true;
    f->cand = unit ? uniq_unit(f->cand, v) : uniq_cp(f->cand, v);
    return !done || f->count < n->max_len || !uniq_bits(p, f->cand, false);
}

/* Steps thread t (a private copy) with byte c; the surviving threads go to out. */
static void step(const jg_grammar *g, jg_state *out, struct jg_thread *t, int c, int hops) {
    if (hops > 64) return; /* alternatives that only lead to themselves ($ref cycles) */
    for (;;) {
        if (t->depth == 0) return; /* nothing may follow the document */
        struct jg_frame *f = &t->f[t->depth - 1];
        const struct node *n = &g->nodes[f->node];
        if (f->phase == P_START) {
            if (is_ws(c)) {
                /* no whitespace before the document itself */
                if (t->depth > 1 && take_ws(f)) emit(out, t);
                return;
            }
            switch (n->kind) {
            case K_ALT: {
                /* a uniqueItems array's element: only the values it has not taken yet, and
                 * the one chosen is marked taken in this thread's array frame */
                struct jg_frame *pf = t->depth >= 2 ? &t->f[t->depth - 2] : NULL;
                const bool uniq = pf && g->nodes[pf->node].kind == K_ARRAY && g->nodes[pf->node].unique &&
                                  g->nodes[pf->node].items == f->node;
                for (int i = 0; i < n->n_alt; i++) {
                    if (uniq && (pf->seen >> i & 1)) continue;
                    struct jg_thread copy;
                    copy.depth = t->depth;
                    memcpy(copy.f, t->f, (size_t)t->depth * sizeof t->f[0]);
                    copy.f[copy.depth - 1].node = n->alts[i];
                    if (uniq) copy.f[copy.depth - 2].seen |= 1ull << i;
                    step(g, out, &copy, c, hops + 1);
                }
                return;
            }
            case K_ANY:
                f->node = c == '{' ? g->any_object : c == '[' ? g->any_array : c == '"' ? g->any_string
                        : c == '-' || is_digit(c) ? g->any_number : c == 't' ? g->lit_true
                        : c == 'f' ? g->lit_false : c == 'n' ? g->lit_null : -1;
                if (f->node < 0) return;
                continue;
            /* a container opens only where its members fit under JG_MAX_DEPTH, so an
             * opened value can always be finished */
            case K_OBJECT:
                if (c != '{' || t->depth >= JG_MAX_DEPTH) return;
                f->phase = P_O_FIRST;
                f->ws = 0;
                emit(out, t);
                return;
            case K_ARRAY:
                if (c != '[' || t->depth >= JG_MAX_DEPTH) return;
                f->phase = P_A_FIRST;
                f->ws = 0;
                emit(out, t);
                return;
            case K_STRING: /* a pattern's NFA set in cand, a code point being read in seen */
                if (c != '"') return;
                f->phase = P_S_IN;
                f->cand = n->re ? jr_start(n->re) : 0xcbf29ce484222325ull; /* the NFA, or FNV-1a's start (uniq_*) */
                emit(out, t);
                return;
            case K_NUMBER:
            case K_INTEGER: /* the digits' values kept for bounds (num_span) */
                if (c == '-') f->phase = P_N_SIGN, f->seen = NUM_NEG;
                else if (c == '0') f->phase = P_N_ZERO;
                else if (is_digit(c)) f->phase = P_N_INT, f->pos = 1, f->seen = (uint64_t)(c - '0');
                else return;
                if (!num_viable(n, f) || !uniq_int_ok(g, t, f)) return;
                emit(out, t);
                return;
            case K_LITERAL:
                if ((unsigned char)n->text[0] != c) return;
                if (n->len == 1) t->depth--;
                else f->phase = P_L_IN, f->pos = 1;
                emit(out, t);
                return;
            }
            return;
        }
        switch (f->phase) {
        case P_O_FIRST:
        case P_O_KEYSTART:
            if (is_ws(c)) {
                if (take_ws(f)) emit(out, t);
                return;
            }
            if (c == '}' && f->phase == P_O_FIRST && obj_may_close(n, f)) {
                t->depth--;
                emit(out, t);
                return;
            }
            if (c != '"') return;
            f->ws = 0;
            if (n->value_node == -2) return; /* additionalProperties false, no properties: only {} */
            if (n->value_node >= 0) { /* generic: a free key, as a string */
                if (f->seen >= n->max_props) return;
                f->seen++;
                f->phase = P_O_COLON;
                if (push(t, g->any_string, P_S_IN)) emit(out, t);
                return;
            }
            f->cand = obj_keys(n, f);
            if (!f->cand) return;
            f->phase = P_O_KEY;
            f->pos = 0;
            emit(out, t);
            return;
        case P_O_KEY: {
            uint64_t next = 0;
            int closing = -1;
            for (int i = 0; i < n->n_props; i++) {
                if (!(f->cand >> i & 1)) continue;
                if (f->pos < n->name_lens[i] && (unsigned char)n->names[i][f->pos] == c) next |= 1ull << i;
                else if (c == '"' && f->pos == n->name_lens[i]) closing = i;
            }
            if (closing >= 0) {
                f->seen |= 1ull << closing;
                f->count = (uint32_t)closing;
                f->phase = P_O_COLON;
                f->ws = 0;
                emit(out, t);
                return;
            }
            if (!next) return;
            f->cand = next;
            f->pos++;
            emit(out, t);
            return;
        }
        case P_O_COLON:
            if (is_ws(c)) {
                if (take_ws(f)) emit(out, t);
                return;
            }
            if (c != ':') return;
            f->phase = P_O_NEXT;
            f->ws = 0;
            if (push(t, n->value_node >= 0 ? n->value_node : n->prop_nodes[f->count], P_START)) emit(out, t);
            return;
        case P_O_NEXT:
            if (is_ws(c)) {
                if (take_ws(f)) emit(out, t);
                return;
            }
            if (c == '}') {
                if (!obj_may_close(n, f)) return;
                t->depth--;
                emit(out, t);
                return;
            }
            if (c != ',') return;
            if (obj_count(n, f) >= n->max_props || (n->value_node == -1 && !obj_keys(n, f))) return;
            f->phase = P_O_KEYSTART;
            f->ws = 0;
            emit(out, t);
            return;
        case P_A_FIRST:
        case P_A_VALUE:
            if (is_ws(c)) {
                if (take_ws(f)) emit(out, t);
                return;
            }
            if (c == ']' && f->phase == P_A_FIRST) {
                if (f->count < n->min_items) return;
                t->depth--;
                emit(out, t);
                return;
            }
            if (f->count >= n->max_items) return;
            f->count++;
            f->phase = P_A_NEXT;
            f->ws = 0;
            if (!push(t, f->count <= (uint32_t)n->n_prefix ? n->prefix[f->count - 1] : n->items, P_START)) return;
            continue; /* the value's first byte */
        case P_A_NEXT:
            if (is_ws(c)) {
                if (take_ws(f)) emit(out, t);
                return;
            }
            if (c == ']') {
                if (f->count < n->min_items) return;
                t->depth--;
                emit(out, t);
                return;
            }
            if (c != ',' || f->count >= n->max_items) return;
            f->phase = P_A_VALUE;
            f->ws = 0;
            emit(out, t);
            return;
        case P_S_IN:
            /* strict UTF-8 (RFC 3629), so the text never needs repair: pos holds the
             * continuation bytes still due (low 4 bits) and the first one's range */
            if (f->pos) {
                const int need = f->pos & 15, range = f->pos >> 4;
                const int lo = range == 1 ? 0xA0 : range == 3 ? 0x90 : 0x80;
                const int hi = range == 2 ? 0x9F : range == 4 ? 0x8F : 0xBF;
                if (c < lo || c > hi) return;
                f->pos = (uint16_t)(need - 1);
                f->seen = f->seen << 6 | (uint64_t)(c & 0x3F);
                /* the code points this byte leaves possible must take the pattern on */
                if (n->re && !re_cp(n, f, (uint32_t)f->seen, need - 1)) return;
                if (need == 1 && !uniq_char(g, t, f, n, (uint32_t)f->seen, false, true)) return;
                emit(out, t);
                return;
            }
            if (c >= 0x80) {
                if (c < 0xC2 || c > 0xF4) return; /* a stray continuation, an overlong or beyond U+10FFFF */
                if (++f->count > n->max_len) return;
                if (c < 0xE0) f->pos = 1;
                else if (c < 0xF0) f->pos = (uint16_t)(2 | (c == 0xE0 ? 1 : c == 0xED ? 2 : 0) << 4);
                else f->pos = (uint16_t)(3 | (c == 0xF0 ? 3 : c == 0xF4 ? 4 : 0) << 4);
                f->seen = (uint64_t)(c & (c < 0xE0 ? 0x1F : c < 0xF0 ? 0x0F : 0x07));
                if (n->re && !re_cp(n, f, (uint32_t)f->seen, f->pos & 15)) return;
                emit(out, t);
                return;
            }
            if (c == '"') {
                if (f->count < n->min_len) return;
                if (n->re && !jr_accepts(n->re, f->cand)) return;
                if (!uniq_close(g, t, f->cand)) return;
                t->depth--;
                emit(out, t);
                return;
            }
            if (c < 0x20) return;
            if (c == '\\') {
                if (f->count + 1 > n->max_len) return; /* the escape is a character */
                /* some escapable code point, counted, must take the pattern on */
                if (n->re && !re_range(n, f, f->count + 1, 0, 0xFFFF)) return;
                f->phase = P_S_ESC;
                emit(out, t);
                return;
            }
            if (++f->count > n->max_len) return;
            if (n->re && !re_cp(n, f, (uint32_t)c, 0)) return;
            if (!uniq_char(g, t, f, n, (uint32_t)c, false, true)) return;
            emit(out, t);
            return;
        case P_S_ESC:
            f->count++; /* the escape is one character; room was checked at the backslash */
            if (c == 'u') {
                f->phase = P_S_HEX;
                f->pos = 0;
                f->seen = 0;
            } else if (c && strchr("\"\\/bfnrt", c)) {
                f->phase = P_S_IN;
                static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
                const uint32_t cp = (uint32_t)(unsigned char)to[strchr(from, c) - from];
                if (n->re && !re_cp(n, f, cp, 0)) return;
                if (!uniq_char(g, t, f, n, cp, false, true)) return;
            } else {
                return;
            }
            emit(out, t);
            return;
        case P_S_HEX: {
            /* pos: the digits so far (low 4 bits), PAIR_LOW while this is a pair's low half;
             * seen: the code unit so far. Only whole code points are written: a high surrogate
             * (D800-DBFF) must be followed by its low half (DC00-DFFF), and a low one never
             * stands alone (strict parsers — Pydantic's, Rust's, Go's — reject lone ones). */
            if (!is_hex(c)) return;
            const int k = f->pos & 15;
            const bool low = f->pos & PAIR_LOW;
            f->seen = f->seen << 4 | (uint64_t)(is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10);
            const int sh = 4 * (3 - k);
            const uint32_t lo = (uint32_t)f->seen << sh, hi = lo | ((1u << sh) - 1);
            if (low ? hi < 0xDC00 || lo > 0xDFFF : lo >= 0xDC00 && hi <= 0xDFFF) return;
            if (n->re) { /* the code unit so far; a pattern's strings take no escaped surrogates */
                if (k == 3 && !re_cp(n, f, (uint32_t)f->seen, 0)) return;
                if (k < 3 && !re_range(n, f, f->count, lo, hi)) return;
            }
            /* a whole code unit: hashed; a character done unless it is a pair's high half */
            if (k == 3 && !uniq_char(g, t, f, n, (uint32_t)f->seen, true, low || f->seen < 0xD800 || f->seen > 0xDBFF)) return;
            if (k < 3) {
                f->pos = (uint16_t)(f->pos + 1);
            } else if (!low && f->seen >= 0xD800 && f->seen <= 0xDBFF) {
                f->phase = P_S_PAIR; /* one character with its low half: counted at the first backslash */
                f->pos = 0;
            } else {
                f->phase = P_S_IN;
                f->pos = 0;
            }
            emit(out, t);
            return;
        }
        case P_S_PAIR:
        case P_S_PAIRU:
            if (c != (f->phase == P_S_PAIR ? '\\' : 'u')) return;
            if (f->phase == P_S_PAIR) {
                f->phase = P_S_PAIRU;
            } else {
                f->phase = P_S_HEX;
                f->pos = PAIR_LOW;
                f->seen = 0;
            }
            emit(out, t);
            return;
        case P_N_SIGN:
            if (c == '0') f->phase = P_N_ZERO;
            else if (is_digit(c)) f->phase = P_N_INT, f->pos = 1, f->seen = NUM_NEG | (uint64_t)(c - '0');
            else return;
            if (!num_viable(n, f) || !uniq_int_ok(g, t, f)) return;
            emit(out, t);
            return;
        case P_N_ZERO:
        case P_N_INT:
        case P_N_FRAC:
        case P_N_EXP:
            if (is_digit(c) && f->phase != P_N_ZERO) {
                int cap = f->phase == P_N_INT ? INT_DIGITS : f->phase == P_N_FRAC ? FRAC_DIGITS : EXP_DIGITS;
                if (++f->pos > cap) return;
                if (f->phase == P_N_INT) f->seen = (f->seen & NUM_NEG) | ((f->seen & ~NUM_NEG) * 10 + (uint64_t)(c - '0'));
                if (f->phase == P_N_FRAC) f->cand = f->cand * 10 + (uint64_t)(c - '0');
                if (!num_viable(n, f) || !uniq_int_ok(g, t, f)) return;
                emit(out, t);
                return;
            }
            if (n->kind == K_NUMBER && c == '.' && f->phase <= P_N_INT) {
                f->phase = P_N_DOT;
                if (!num_viable(n, f)) return;
                emit(out, t);
                return;
            }
            if (n->kind == K_NUMBER && (c == 'e' || c == 'E') && f->phase != P_N_EXP && !n->bounded) {
                f->phase = P_N_E;
                emit(out, t);
                return;
            }
            if (!num_within(n, f)) return; /* (a bounded number has no exponent) */
            if (!uniq_close(g, t, uniq_int_hash(f))) return; /* a unique-integers item: not written before */
            t->depth--; /* the number ended before c: the parent takes c */
            continue;
        case P_N_DOT:
            if (!is_digit(c)) return;
            f->phase = P_N_FRAC;
            f->pos = 1;
            f->cand = (uint64_t)(c - '0');
            if (!num_viable(n, f)) return;
            emit(out, t);
            return;
        case P_N_E:
            if (c == '+' || c == '-') {
                f->phase = P_N_ESIGN;
                emit(out, t);
                return;
            }
            /* fall through */
        case P_N_ESIGN:
            if (!is_digit(c)) return;
            f->phase = P_N_EXP;
            f->pos = 1;
            emit(out, t);
            return;
        case P_L_IN:
            if ((unsigned char)n->text[f->pos] != c) return;
            if (++f->pos == n->len) t->depth--;
            emit(out, t);
            return;
        default:
            return;
        }
    }
}

static void push_start(struct jg_thread *t, int node) {
    t->depth = 0;
    push(t, node, P_START);
}

void jg_start(const jg_grammar *g, jg_state *s) {
    s->n = 1;
    push_start(&s->t[0], g->root);
}

void jg_copy(jg_state *dst, const jg_state *src) {
    dst->n = src->n;
    for (int i = 0; i < src->n; i++) {
        dst->t[i].depth = src->t[i].depth;
        memcpy(dst->t[i].f, src->t[i].f, (size_t)src->t[i].depth * sizeof src->t[i].f[0]);
    }
}

bool jg_feed(const jg_grammar *g, jg_state *s, const char *bytes, size_t n) {
    jg_state next;
    for (size_t i = 0; i < n && s->n; i++) {
        next.n = 0;
        for (int k = 0; k < s->n; k++) {
            struct jg_thread t;
            t.depth = s->t[k].depth;
            memcpy(t.f, s->t[k].f, (size_t)t.depth * sizeof t.f[0]);
            step(g, &next, &t, (unsigned char)bytes[i], 0);
        }
        jg_copy(s, &next);
    }
    return s->n > 0;
}

bool jg_complete(const jg_grammar *g, const jg_state *s) {
    for (int k = 0; k < s->n; k++) {
        const struct jg_thread *t = &s->t[k];
        if (t->depth == 0) return true;
        /* a number at the top level ends with the document */
        if (t->depth == 1) {
            const struct jg_frame *f = &t->f[0];
            const enum kind kd = g->nodes[f->node].kind;
            if ((kd == K_NUMBER || kd == K_INTEGER) &&
                (f->phase == P_N_ZERO || f->phase == P_N_INT || f->phase == P_N_FRAC || f->phase == P_N_EXP) &&
                num_within(&g->nodes[f->node], f))
                return true;
        }
    }
    return false;
}

int64_t jg_string_room(const jg_grammar *g, const jg_state *s) {
    if (s->n != 1 || s->t[0].depth == 0) return -1;
    const struct jg_frame *f = &s->t[0].f[s->t[0].depth - 1];
    if (f->phase != P_S_IN || f->pos) return -1;
    const struct node *n = &g->nodes[f->node];
    if (n->re) return -1; /* a pattern decides each character */
    return n->max_len == UINT32_MAX ? (int64_t)UINT32_MAX : (int64_t)n->max_len - f->count;
}
