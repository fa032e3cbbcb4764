/* tests/unit/test_json_grammar.c — the JSON Schema recognizer of constrained
 * output (text/json_grammar.h): documents a schema allows are accepted whole
 * and byte by byte, and every prefix of them stays alive; documents it does
 * not allow die (or are not complete); unsupported keywords are errors naming
 * the keyword and the place. The Python tests check generated outputs against
 * the `jsonschema` package; these pin the recognizer's edges. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "text/json_grammar.h"

static jg_grammar *grammar(const char *schema_json) {
    cJSON *s = schema_json ? cJSON_Parse(schema_json) : NULL;
    jg_grammar *g = NULL;
    char err[256];
    int rc = jg_compile(s, &g, err, sizeof err);
    CHECK(rc == 0, "compile %s: %s", schema_json ? schema_json : "(any object)", err);
    cJSON_Delete(s);
    return g;
}

/* 1: whole document accepted and complete, with every prefix alive and (for
 * documents that are not a bare number) not complete before the end; fed in
 * one piece and byte by byte alike. 0: rejected or incomplete. */
static int accepts(const jg_grammar *g, const char *doc) {
    static jg_state a, b;
    jg_start(g, &a);
    bool whole = jg_feed(g, &a, doc, strlen(doc)) && jg_complete(g, &a);
    jg_start(g, &b);
    bool bytes = true;
    for (size_t i = 0; doc[i] && bytes; i++) {
        bytes = jg_feed(g, &b, doc + i, 1);
        if (bytes && doc[i + 1] && jg_complete(g, &b) && !strchr("0123456789", doc[i])) bytes = false;
    }
    bytes = bytes && jg_complete(g, &b);
    CHECK(whole == bytes, "whole %d vs byte by byte %d: %s", whole, bytes, doc);
    return whole;
}

static void yes(const jg_grammar *g, const char *doc) { CHECK(accepts(g, doc), "should accept: %s", doc); }
static void no(const jg_grammar *g, const char *doc) { CHECK(!accepts(g, doc), "should reject: %s", doc); }
/* After prefix (which must be taken): bad refused at once, where a whole document's verdict
 * would only come at its end; good (NULL: none) taken and ending the document. */
static void refused_after(const jg_grammar *g, const char *prefix, const char *bad, const char *good) {
    jg_state st, probe;
    jg_start(g, &st);
    CHECK(jg_feed(g, &st, prefix, strlen(prefix)), "should take the prefix %s", prefix);
    jg_copy(&probe, &st);
    CHECK(!jg_feed(g, &probe, bad, strlen(bad)), "after %s: should refuse %s at once", prefix, bad);
    if (!good) return;
    jg_copy(&probe, &st);
    CHECK(jg_feed(g, &probe, good, strlen(good)) && jg_complete(g, &probe), "after %s: should take %s and end", prefix, good);
}

/* Every live prefix of up to 4 bytes over `alphabet` (numbers: digits, '-', '.') must reach
 * a complete document with up to 6 more digits, after a '.' or not: no dead ends. */
static void no_dead_ends(const jg_grammar *b, const char *schema, const char *alphabet) {
    const int na = (int)strlen(alphabet);
    for (int len = 1; len <= 4; len++) {
        int total = 1;
        for (int i = 0; i < len; i++) total *= na;
        for (int code = 0; code < total; code++) {
            char p[8];
            int x = code;
            for (int i = 0; i < len; i++, x /= na) p[i] = alphabet[x % na];
            p[len] = 0;
            static jg_state st, probe;
            jg_start(b, &st);
            if (!jg_feed(b, &st, p, (size_t)len)) continue;
            bool out = jg_complete(b, &st);
            for (int more = 0; more < 100000 && !out; more++)
                for (int pad = 1; pad <= 6 && !out; pad++)
                    for (int dot = 0; dot < 2 && !out; dot++) {
                        char t2[16];
                        snprintf(t2, sizeof t2, "%s%0*d", dot ? "." : "", pad, more);
                        jg_copy(&probe, &st);
                        out = jg_feed(b, &probe, t2, strlen(t2)) && jg_complete(b, &probe);
                    }
            if (!out) {
                CHECK(0, "%s: the live prefix '%s' has no way out", schema, p);
                return;
            }
        }
    }
}

static void compile_error(const char *schema_json, const char *needle) {
    cJSON *s = cJSON_Parse(schema_json);
    jg_grammar *g = NULL;
    char err[256] = "";
    int rc = jg_compile(s, &g, err, sizeof err);
    CHECK(rc < 0 && strstr(err, needle), "%s: want an error with '%s', got rc %d '%s'", schema_json, needle, rc, err);
    jg_free(g);
    cJSON_Delete(s);
}

int main(void) {
    /* json_object: any object, values anything */
    jg_grammar *g = grammar(NULL);
    yes(g, "{}");
    yes(g, "{\"a\": 1, \"b\": [true, false, null, \"x\\n\\u00e9\"], \"c\": {\"d\": -0.5e+3}}");
    yes(g, "{\n  \"k\": \"v\"\n}");
    no(g, "[]");
    no(g, " {}");       /* nothing before the value */
    no(g, "{} ");       /* nor after it */
    no(g, "{\"a\" 1}");
    no(g, "{\"a\": 01}");
    no(g, "{\"a\": 1,}");
    no(g, "{\"a\": \"x\ny\"}"); /* raw control character in a string */
    no(g, "{\"a\": \"\\q\"}");
    no(g, "{\"a\": tru}");
    no(g, "{");
    {
        char blanks[80] = "{";
        memset(blanks + 1, ' ', 40);
        strcpy(blanks + 41, "}");
        no(g, blanks); /* a whitespace run beyond 32 */
    }
    jg_free(g);

    /* declared properties: required ones before '}', each key once, no others */
    g = grammar("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
                "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},"
                "\"minItems\":1,\"maxItems\":2}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}");
    yes(g, "{\"name\":\"Ann\",\"age\":30}");
    yes(g, "{\"age\": -2, \"name\": \"\", \"tags\": [\"a\", \"b\"]}");
    no(g, "{\"name\":\"Ann\"}");                 /* age missing */
    no(g, "{\"name\":\"Ann\",\"age\":30,\"x\":1}"); /* not declared */
    no(g, "{\"name\":\"Ann\",\"name\":\"B\",\"age\":1}");
    no(g, "{\"name\":\"Annabel\",\"age\":30}");  /* maxLength 5 */
    no(g, "{\"name\":\"A\",\"age\":3.5}");       /* integer */
    no(g, "{\"name\":\"A\",\"age\":3,\"tags\":[]}");
    no(g, "{\"name\":\"A\",\"age\":3,\"tags\":[\"a\",\"b\",\"a\"]}");
    no(g, "{\"name\":\"A\",\"age\":3,\"tags\":[\"c\"]}");
    jg_free(g);

    /* numbers, with their digit caps; a bare number ends with the document */
    g = grammar("{\"type\":\"number\"}");
    yes(g, "0");
    yes(g, "-12.5E-3");
    yes(g, "123456789012345678");
    no(g, "1234567890123456789");
    no(g, "1.");
    no(g, "-");
    no(g, "1e");
    jg_free(g);

    /* anyOf / nullable / type lists / const: several parses at once */
    g = grammar("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"const\":1}},\"required\":[\"a\"]},"
                "{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"boolean\"}},\"required\":[\"ab\"]},"
                "{\"type\":[\"null\",\"string\"]}]}");
    yes(g, "{\"a\":1}");
    yes(g, "{\"ab\":true}");
    yes(g, "null");
    yes(g, "\"s\"");
    no(g, "{\"a\":2}");
    no(g, "{\"ab\":1}");
    jg_free(g);

    /* nullable (OpenAPI 3.0): null beside an explicit type only, not beside an enum / const
     * that does not list it, nor beside $ref or anyOf without a type */
    g = grammar("{\"type\":\"string\",\"maxLength\":2,\"nullable\":true}");
    yes(g, "null");
    yes(g, "\"ab\"");
    jg_free(g);
    g = grammar("{\"type\":\"string\",\"enum\":[\"a\",\"b\"],\"nullable\":true}");
    yes(g, "\"a\"");
    no(g, "null");
    jg_free(g);
    g = grammar("{\"enum\":[\"a\",null],\"nullable\":true}");
    yes(g, "null");
    jg_free(g);
    g = grammar("{\"anyOf\":[{\"type\":\"integer\"}],\"nullable\":true}");
    yes(g, "5");
    no(g, "null");
    jg_free(g);
    g = grammar("{\"$defs\":{\"i\":{\"type\":\"integer\"}},\"$ref\":\"#/$defs/i\",\"nullable\":true}");
    no(g, "null");
    jg_free(g);

    /* enum of mixed values; a numeric literal is exact */
    g = grammar("{\"enum\":[\"red\",1,10,[1,2],{\"k\":null}]}");
    yes(g, "\"red\"");
    yes(g, "1");
    yes(g, "10");
    yes(g, "[1,2]");
    yes(g, "{\"k\":null}");
    no(g, "100");
    no(g, "\"blue\"");
    jg_free(g);

    /* $ref recursion through $defs; keys with escapes */
    g = grammar("{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{"
                "\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}},"
                "\"q\\\"k\":{\"type\":\"boolean\"}},\"required\":[\"v\"]}}}");
    yes(g, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3,\"kids\":[{\"v\":4}]}]}");
    yes(g, "{\"q\\\"k\":false,\"v\":0}");
    no(g, "{\"v\":1,\"kids\":[{\"kids\":[]}]}");
    jg_free(g);

    /* generic objects: additionalProperties as the values' schema, or none at all */
    g = grammar("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}");
    yes(g, "{\"x\":1,\"y\":2}");
    no(g, "{\"x\":\"1\"}");
    jg_free(g);
    g = grammar("{\"type\":\"object\",\"additionalProperties\":false}");
    yes(g, "{}");
    no(g, "{\"x\":1}");
    jg_free(g);

    /* string lengths count characters (an escape or a UTF-8 character is one) */
    g = grammar("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");
    yes(g, "\"\\u00e9\\n\"");
    yes(g, "\"\xc3\xa9\xc3\xa9\xc3\xa9\"");
    no(g, "\"a\"");
    no(g, "\"abcd\"");
    no(g, "\"\x80\x80\"");         /* stray continuation bytes */
    no(g, "\"\xc0\xaf\xc3\xa9\""); /* an overlong */
    no(g, "\"\xed\xa0\x80x\"");    /* a UTF-16 surrogate */
    no(g, "\"\xe4\xb8\"");         /* a character cut short */
    yes(g, "\"\xf0\x9f\x98\x80\xe4\xb8\x96\"");
    jg_free(g);
    /* escaped surrogates: a pair is one character; a lone half is never written (strict
     * parsers refuse it), and a high half leaves only its low half to follow */
    g = grammar("{\"type\":\"string\",\"minLength\":2,\"maxLength\":2}");
    yes(g, "\"\\ud83d\\ude00\\u00e9\"");  /* 😀é: two characters */
    yes(g, "\"\\uDBFF\\uDFFFx\"");
    no(g, "\"\\ud83d\\ude00\"");            /* one character: below minLength */
    no(g, "\"\\ud83dxy\"");                   /* a lone high half */
    no(g, "\"\\ude00xy\"");                   /* a lone low half */
    no(g, "\"x\\ud83d\\u0041\"");           /* a high half followed by no low one */
    no(g, "\"\\ud83d\\ud83d\\ude00\"");
    {
        static const char *const live[] = {"\"\\ud83d", "\"\\ud83d\\", "\"\\ud83d\\u", "\"\\ud83d\\ud", "\"\\ud83d\\udf",
                                           "\"\\ud", "\"\\udb"};
        static const char *const dead[] = {"\"\\udc", "\"\\udf", "\"\\ud83d\"", "\"\\ud83d\\n", "\"\\ud83d\\ud8",
                                           "\"\\ud83d\\u0"};
        for (size_t i = 0; i < sizeof live / sizeof live[0]; i++) {
            jg_state st;
            jg_start(g, &st);
            CHECK(jg_feed(g, &st, live[i], strlen(live[i])), "surrogates: '%s' should be live", live[i]);
        }
        for (size_t i = 0; i < sizeof dead / sizeof dead[0]; i++) {
            jg_state st;
            jg_start(g, &st);
            CHECK(!jg_feed(g, &st, dead[i], strlen(dead[i])), "surrogates: '%s' should be dead", dead[i]);
        }
    }
    jg_free(g);

    /* exponents of two digits at most: every number is a finite double */
    g = grammar("{\"type\":\"number\"}");
    yes(g, "4e99");
    yes(g, "-1.5E-99");
    no(g, "4e407");
    no(g, "1e100");
    jg_free(g);

    /* a $ref cycle with no value in between is refused at compile or dies, never loops */
    {
        cJSON *s = cJSON_Parse("{\"$ref\":\"#\"}");
        jg_grammar *c = NULL;
        char err[256];
        if (jg_compile(s, &c, err, sizeof err) == 0) {
            jg_state st;
            jg_start(c, &st);
            CHECK(!jg_feed(c, &st, "{}", 2), "a self-reference allows nothing");
            jg_free(c);
        }
        cJSON_Delete(s);
    }

    /* integer bounds: exactly the integers within them, and no prefix without a way out */
    {
        static const char *const schemas[] = {
            "{\"type\":\"integer\",\"minimum\":10,\"maximum\":250}",
            "{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":5.5}",
            "{\"type\":\"integer\",\"minimum\":-20,\"maximum\":-3}",
            "{\"type\":\"integer\",\"minimum\":-7.5,\"maximum\":0}",
            "{\"type\":\"integer\",\"minimum\":1000}",
        };
        static const long lo[] = {10, 1, -20, -7, 1000}, hi[] = {250, 5, -3, 0, 999999999999999999L};
        for (int k = 0; k < 5; k++) {
            jg_grammar *b = grammar(schemas[k]);
            char doc[32];
            int wrong = 0;
            for (long v = -1200; v <= 1200 && wrong < 3; v++) {
                snprintf(doc, sizeof doc, "%ld", v);
                const bool want = v >= lo[k] && v <= hi[k];
                if (accepts(b, doc) != want) {
                    CHECK(0, "%s: %s should be %s", schemas[k], doc, want ? "accepted" : "rejected");
                    wrong++;
                }
            }
            /* every live prefix of digits (and '-') has a completion */
            if (wrong < 3) no_dead_ends(b, schemas[k], "-0123456789");
            jg_free(b);
        }
        /* fractional bounds on numbers: plain decimals (no exponent) within them, to the
         * bounds as written ("minimum": 0.1 is 0.1, as a document's "0.1" is) */
        static const char *const nschemas[] = {
            "{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
            "{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}",
            "{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.3}",
            "{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-0.5}",
            "{\"type\":[\"number\",\"null\"],\"exclusiveMinimum\":-1.25,\"maximum\":7}",
        };
        static const double nlo[] = {0, 0, 0.1, -2.5, -1.25}, nhi[] = {1, 1, 0.3, -0.5, 7};
        static const bool lo_ex[] = {0, 1, 0, 0, 1}, hi_ex[] = {0, 1, 0, 0, 0};
        for (int k = 0; k < 5; k++) {
            jg_grammar *b = grammar(nschemas[k]);
            char doc[32];
            int wrong = 0;
            for (int v = -1000; v <= 1000 && wrong < 3; v++) { /* v / 100, written with two decimals and trimmed forms */
                for (int form = 0; form < 3 && wrong < 3; form++) {
                    const double x = v / 100.0;
                    if (form == 0) snprintf(doc, sizeof doc, "%.2f", x);
                    else if (form == 1) snprintf(doc, sizeof doc, "%.3f", x);
                    else if (v % 100 == 0) snprintf(doc, sizeof doc, "%d", v / 100);
                    else continue;
                    const double r = strtod(doc, NULL);
                    const bool want = (lo_ex[k] ? r > nlo[k] : r >= nlo[k]) && (hi_ex[k] ? r < nhi[k] : r <= nhi[k]);
                    if (accepts(b, doc) != want) {
                        CHECK(0, "%s: %s should be %s", nschemas[k], doc, want ? "accepted" : "rejected");
                        wrong++;
                    }
                }
            }
            no(b, "1e-1");
            /* every live prefix over digits, '-' and '.' has a completion */
            if (wrong < 3) no_dead_ends(b, nschemas[k], "-0123456789.");
            jg_free(b);
        }
        jg_grammar *e = grammar("{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}");
        yes(e, "0.000000000000001"); /* the least value above 0 that 15 fraction digits write */
        no(e, "0.000000000000000");
        yes(e, "0.999999999999999");
        jg_free(e);

        /* inside an object (the number ends at the next byte) and beside null */
        jg_grammar *o = grammar("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":0,"
                                "\"maximum\":9}},\"required\":[\"n\"]}");
        yes(o, "{\"n\": 5}");
        yes(o, "{\"n\":0}");
        no(o, "{\"n\": 10}");
        no(o, "{\"n\": -1}");
        no(o, "{\"n\": 5.0}");
        jg_free(o);
        o = grammar("{\"type\":[\"integer\",\"null\"],\"minimum\":1}");
        yes(o, "null");
        yes(o, "3");
        no(o, "0");
        no(o, "-3");
        jg_free(o);
    }

    /* pattern: ECMA-262's search semantics on the decoded string, and never a dead end */
    {
        static const struct { const char *pattern, *yes[4], *no[4]; } pc[] = {
            {"^\\d{4}-\\d{2}-\\d{2}$", {"\"2024-01-31\"", NULL}, {"\"2024-1-31\"", "\"x2024-01-31\"", "\"2024-01-311\"", NULL}},
            {"ab", {"\"xxabyy\"", "\"ab\"", "\"a\\u0062\"", NULL}, {"\"a b\"", "\"\"", NULL}},
            {"^[a-z]+$", {"\"abc\"", NULL}, {"\"\xc3\xa9\"", "\"a1\"", "\"\"", NULL}},
            {"^\xc3\xa9+$", {"\"\xc3\xa9\xc3\xa9\"", "\"\\u00e9\"", "\"\\u00E9\xc3\xa9\"", NULL}, {"\"e\"", NULL}},
            {"^(ab|cd){2}$", {"\"abcd\"", "\"cdcd\"", NULL}, {"\"abc\"", "\"ab\"", "\"abcdab\"", NULL}},
            {"^[^\\d]+$", {"\"ab\"", NULL}, {"\"1\"", "\"\xc3\xa9\"", NULL}},
            {"^.{0,3}$", {"\"abc\"", "\"\"", NULL}, {"\"abcd\"", "\"\\n\"", NULL}},
            {"^\\\"[\\w.-]+@x\\.org\\\"$", {"\"\\\"a.b-c@x.org\\\"\"", NULL}, {"\"a@x.org\"", NULL}},
            {"^(?:yes|no)$", {"\"yes\"", "\"no\"", NULL}, {"\"yesno\"", "\"n\"", NULL}},
            {"^(?:[0-9a-f]{2}:){2}[0-9a-f]{2}$", {"\"0a:ff:12\"", NULL}, {"\"0A:ff:12\"", "\"0a:ff\"", NULL}},
        };
        for (size_t k = 0; k < sizeof pc / sizeof pc[0]; k++) {
            cJSON *sch = cJSON_CreateObject();
            cJSON_AddStringToObject(sch, "type", "string");
            cJSON_AddStringToObject(sch, "pattern", pc[k].pattern);
            char *text = cJSON_PrintUnformatted(sch);
            jg_grammar *pg = grammar(text);
            for (int i = 0; pc[k].yes[i]; i++) CHECK(accepts(pg, pc[k].yes[i]), "%s should accept %s", text, pc[k].yes[i]);
            for (int i = 0; pc[k].no[i]; i++) CHECK(!accepts(pg, pc[k].no[i]), "%s should reject %s", text, pc[k].no[i]);
            /* every live prefix of up to 3 bytes over this alphabet completes within 12 more */
            /* (escapes: the cases above and below; here the plain bytes a model writes most) */
            static const char *const alpha[] = {"a", "b", "c", "d", "1", "-", ":", ".", "@", "x", "o", "r", "g",
                                                 "\xc3", "\xa9", "\"", "2", "0", "e", "9", "f"};
            const int na = (int)(sizeof alpha / sizeof alpha[0]);
            for (int len = 1; len <= 3; len++) {
                int total = 1;
                for (int i = 0; i < len; i++) total *= na;
                for (int code = 0; code < total; code++) {
                    char p[16] = "\"";
                    int x = code;
                    for (int i = 0; i < len; i++, x /= na) strcat(p, alpha[x % na]);
                    static jg_state st;
                    jg_start(pg, &st);
                    if (!jg_feed(pg, &st, p, strlen(p)) || jg_complete(pg, &st)) continue;
                    /* breadth-first over the alphabet: some continuation completes */
                    static jg_state q[4096];
                    int head = 0, tail = 0, depth_end = 1, depth = 0;
                    bool out = false;
                    jg_copy(&q[tail++], &st);
                    while (head < tail && !out && depth < 12) {
                        jg_state *cur = &q[head++ % 4096];
                        for (int a = 0; a < na && !out; a++) {
                            static jg_state nx;
                            jg_copy(&nx, cur);
                            if (!jg_feed(pg, &nx, alpha[a], strlen(alpha[a]))) continue;
                            if (jg_complete(pg, &nx)) out = true;
                            else if (tail - head < 4000) jg_copy(&q[tail++ % 4096], &nx);
                        }
                        if (head == depth_end) depth++, depth_end = tail;
                    }
                    CHECK(out, "%s: the live prefix %s finds no end", text, p);
                    if (!out) break;
                }
            }
            jg_free(pg);
            free(text);
            cJSON_Delete(sch);
        }
        {   /* escapes: alive exactly while the code points they can still name fit */
            jg_grammar *pg = grammar("{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}");
            static const char *const live[] = {"\"\\", "\"\\u", "\"\\u00", "\"\\u006", "\"\\u0061", "\"a\\u007a"};
            static const char *const dead[] = {"\"\\n", "\"\\u002", "\"\\u1", "\"\\ud83d", "\"\\u007b", "\"\\\""};
            for (size_t i = 0; i < 6; i++) {
                static jg_state st;
                jg_start(pg, &st);
                CHECK(jg_feed(pg, &st, live[i], strlen(live[i])), "^[a-z]+$: %s should be alive", live[i]);
                jg_start(pg, &st);
                CHECK(!jg_feed(pg, &st, dead[i], strlen(dead[i])), "^[a-z]+$: %s should be dead", dead[i]);
            }
            jg_free(pg);
        }
        compile_error("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookaround");
        compile_error("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences");
        compile_error("{\"type\":\"string\",\"pattern\":\"a{2,1}\"}", "n < m");
        compile_error("{\"type\":\"string\",\"pattern\":\"[ab\"}", "unclosed '['");
        compile_error("{\"type\":\"string\",\"pattern\":\"a^b\"}", "anchors other than");
        compile_error("{\"type\":\"string\",\"pattern\":\"^a|b$\"}", "top-level '|'");
        compile_error("{\"type\":\"string\",\"pattern\":\"\\\\bx\"}", "word boundaries");
        compile_error("{\"type\":\"string\",\"pattern\":\"[a-f]{70}\"}", "64 states");
        compile_error("{\"type\":\"string\",\"pattern\":\"^a\",\"minLength\":3}", "'maxLength' must be given");
        compile_error("{\"type\":\"string\",\"pattern\":\"^a\",\"maxLength\":300}", "at most 255");
        compile_error("{\"type\":\"string\",\"pattern\":\"^a{3}$\",\"maxLength\":2}", "no string the pattern matches");
        {   /* a pattern within minLength / maxLength: the lengths the NFA can still end at decide */
            static const char *const sch[] = {"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"minLength\":2,\"maxLength\":4}",
                                              "{\"type\":\"string\",\"pattern\":\"^(ab)+$\",\"maxLength\":5}",
                                              "{\"type\":\"string\",\"pattern\":\"b\",\"minLength\":3,\"maxLength\":3}"};
            static const char *const yes_docs[][3] = {{"\"ab\"", "\"abcd\"", "\"a\\u0062\""}, {"\"ab\"", "\"abab\"", "\"abab\""},
                                                      {"\"abc\"", "\"bbb\"", "\"x\\u0062y\""}};
            static const char *const no_docs[][3] = {{"\"a\"", "\"abcde\"", "\"\""}, {"\"ababa\"", "\"ababab\"", "\"a\""},
                                                     {"\"ab\"", "\"acd\"", "\"abcd\""}};
            static const char *const alpha[] = {"a", "b", "c", "\"", "\xc3", "\xa9", "1"};
            for (int k = 0; k < 3; k++) {
                jg_grammar *pg = grammar(sch[k]);
                for (int i = 0; i < 3; i++) {
                    CHECK(accepts(pg, yes_docs[k][i]), "%s should accept %s", sch[k], yes_docs[k][i]);
                    CHECK(!accepts(pg, no_docs[k][i]), "%s should reject %s", sch[k], no_docs[k][i]);
                }
                /* every live prefix of up to 5 bytes ends within 6 more over the alphabet (depth-first) */
                for (int len = 1; len <= 5; len++) {
                    int total = 1;
                    for (int i = 0; i < len; i++) total *= 7;
                    for (int code = 0; code < total; code++) {
                        char p[16] = "\"";
                        int x = code;
                        for (int i = 0; i < len; i++, x /= 7) strcat(p, alpha[x % 7]);
                        static jg_state st, probe;
                        jg_start(pg, &st);
                        if (!jg_feed(pg, &st, p, strlen(p)) || jg_complete(pg, &st)) continue;
                        bool out = false;
                        for (int code2 = 0, t2 = 1; !out && t2 <= 117649; code2++) { /* 7^6 suffixes */
                            if (code2 == t2) t2 *= 7, code2 = 0;
                            char q[16] = "";
                            int y = code2;
                            for (int i = 1; i < t2; i *= 7, y /= 7) strcat(q, alpha[y % 7]);
                            jg_copy(&probe, &st);
                            out = jg_feed(pg, &probe, q, strlen(q)) && jg_complete(pg, &probe);
                            if (t2 == 1) t2 = 7, code2 = -1;
                        }
                        CHECK(out, "%s: the live prefix %s finds no end", sch[k], p);
                        if (!out) break;
                    }
                }
                jg_free(pg);
            }
        }
        compile_error("{\"type\":\"integer\",\"pattern\":\"^a\"}", "'pattern' needs 'type'");
    }
    compile_error("{\"type\":\"object\",\"properties\":{\"n\":{\"minimum\":0}}}",
                  "#/properties/n: 'minimum' needs a numeric 'type'");
    compile_error("{\"type\":\"string\",\"maximum\":3}", "'maximum' needs a numeric 'type'");
    compile_error("{\"type\":\"number\",\"minimum\":5,\"maximum\":4.5}", "no number");
    compile_error("{\"type\":\"number\",\"exclusiveMinimum\":1,\"exclusiveMaximum\":1.000000000000001}", "no number");
    compile_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer");
    compile_error("{\"type\":\"integer\",\"exclusiveMinimum\":true}", "'exclusiveMinimum' must be a number");
    compile_error("{\"type\":\"integer\",\"minimum\":1e30}", "no integer");
    {   /* multipleOf on integers: the value a multiple, with or without bounds; no dead ends */
        jg_grammar *w = grammar("{\"type\":\"integer\",\"multipleOf\":7}");
        yes(w, "0");
        yes(w, "-0");
        yes(w, "49");
        yes(w, "-700");
        no(w, "50");
        no(w, "-1");
        no_dead_ends(w, "multipleOf 7", "0123456789-");
        jg_free(w);
        w = grammar("{\"type\":[\"integer\",\"null\"],\"multipleOf\":25,\"minimum\":30,\"maximum\":110}");
        yes(w, "50");
        yes(w, "100");
        yes(w, "null");
        no(w, "25");  /* below the minimum */
        no(w, "125"); /* above the maximum */
        no(w, "60");
        no(w, "0");
        no_dead_ends(w, "multipleOf 25 in [30, 110]", "0123456789-");
        jg_free(w);
        w = grammar("{\"type\":\"integer\",\"multipleOf\":1000000007,\"exclusiveMaximum\":0}");
        yes(w, "-1000000007");
        yes(w, "-3000000021");
        no(w, "0");
        no(w, "-1000000008");
        jg_free(w);
        w = grammar("{\"type\":\"integer\",\"multipleOf\":997,\"exclusiveMaximum\":0}");
        yes(w, "-1994");
        no(w, "-0");
        no_dead_ends(w, "multipleOf 997 below 0", "0123456789-");
        jg_free(w);
        /* a fractional multipleOf on an integer: v·10^15 a multiple of m·10^15 */
        w = grammar("{\"type\":\"integer\",\"multipleOf\":2.5}");
        yes(w, "5");
        yes(w, "-10");
        yes(w, "0");
        no(w, "2");
        no(w, "7");
        no_dead_ends(w, "integer multipleOf 2.5", "0123456789-");
        jg_free(w);
        w = grammar("{\"type\":\"integer\",\"multipleOf\":0.5,\"minimum\":-3,\"maximum\":3}");
        yes(w, "-3");
        yes(w, "1");
        no(w, "4");
        jg_free(w);
        compile_error("{\"multipleOf\":2}", "needs a numeric 'type'");
        compile_error("{\"type\":\"string\",\"multipleOf\":2}", "needs a numeric 'type'");
        compile_error("{\"type\":\"integer\",\"multipleOf\":0}", "positive decimal");
        compile_error("{\"type\":\"integer\",\"multipleOf\":1e19}", "18 integer digits");
        compile_error("{\"type\":\"integer\",\"multipleOf\":10,\"minimum\":11,\"maximum\":19}", "no multiple");
    }
    {   /* multipleOf on numbers (Pydantic's confloat(multiple_of=0.01)): decimal multiples, no
         * exponent, a digit only while a multiple can still be written */
        jg_grammar *w = grammar("{\"type\":\"number\",\"multipleOf\":0.01}");
        yes(w, "0.07"); /* in decimal, as JSON Schema means it (0.07 / 0.01 in floats is 7.000000000000001) */
        yes(w, "12.34");
        yes(w, "-0.5");
        yes(w, "3");
        yes(w, "0");
        yes(w, "1.10");
        no(w, "0.075");
        no(w, "0.001");
        no(w, "1e2"); /* bounded numbers come without an exponent */
        refused_after(w, "0.07", "5", "0");
        refused_after(w, "1.23", "4", NULL);
        no_dead_ends(w, "number multipleOf 0.01", "0123456789-.");
        jg_free(w);
        w = grammar("{\"type\":[\"number\",\"null\"],\"multipleOf\":0.25,\"minimum\":0.3,\"exclusiveMaximum\":1.25}");
        yes(w, "0.5");
        yes(w, "0.75");
        yes(w, "1");
        yes(w, "1.0");
        yes(w, "null");
        no(w, "0.25"); /* below the minimum */
        no(w, "1.25"); /* at the exclusive maximum */
        no(w, "0.3");
        no(w, "-0.5");
        refused_after(w, "0.", "3", "5");
        no_dead_ends(w, "number multipleOf 0.25 in [0.3, 1.25)", "0123456789-.");
        jg_free(w);
        w = grammar("{\"type\":\"number\",\"multipleOf\":3}");
        yes(w, "6");
        yes(w, "6.0");
        yes(w, "-3");
        no(w, "6.5");
        no(w, "4");
        no_dead_ends(w, "number multipleOf 3", "0123456789-.");
        jg_free(w);
        w = grammar("{\"type\":\"number\",\"multipleOf\":1e-15}");
        yes(w, "0.000000000000001");
        yes(w, "123.456");
        no(w, "0.0000000000000001"); /* 16 fraction digits: not written */
        jg_free(w);
        w = grammar("{\"type\":\"number\",\"multipleOf\":0.1}");
        yes(w, "0.3"); /* 0.1 as written, not its double (0.3 / 0.1 in floats is 2.9999999999999996) */
        no(w, "0.35");
        jg_free(w);
        compile_error("{\"type\":\"number\",\"multipleOf\":1e-16}", "15 fraction digits");
        compile_error("{\"type\":\"number\",\"multipleOf\":0.1234567890123456}", "15 fraction digits");
        compile_error("{\"type\":\"number\",\"multipleOf\":-0.5}", "positive decimal");
        compile_error("{\"type\":\"number\",\"multipleOf\":0.3,\"minimum\":0.1,\"maximum\":0.2}", "no multiple");
    }
    {   /* uniqueItems over free strings (Pydantic's set[str]): no item twice, as JSON values —
         * escapes and raw UTF-8 alike; a string at maxLength never left where only a repeat
         * could close it */
        jg_grammar *w = grammar("{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}");
        yes(w, "[]");
        yes(w, "[\"a\",\"b\",\"ab\",\"\"]");
        yes(w, "[\"\\u00e9\",\"e\"]");
        no(w, "[\"a\",\"a\"]");
        no(w, "[\"\",\"\"]");
        no(w, "[\"x\",\"y\",\"x\"]");
        no(w, "[\"a\",\"\\u0061\"]");           /* the same string, escaped */
        no(w, "[\"\\u00e9\",\"\xc3\xa9\"]");     /* é escaped, then raw */
        no(w, "[\"\xf0\x9f\x98\x80\",\"\\ud83d\\ude00\"]"); /* 😀 raw, then as a pair */
        no(w, "[\"a\\n\",\"a\\u000a\"]");
        yes(w, "[\"ab\",\"abc\",\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\"]");
        no(w, "[\"ab\",\"abc\",\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\"]"); /* 16 at most */
        jg_free(w);
        /* maxLength 1: after "a", the 'a' that would leave the string only a repeat is refused */
        w = grammar("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":1,\"minLength\":1},\"uniqueItems\":true}");
        yes(w, "[\"a\",\"b\"]");
        no(w, "[\"a\",\"a\"]");
        refused_after(w, "[\"a\",\"", "a", "b\"]"); /* a second "a" refused at its character, not at the quote */
        jg_free(w);
        /* nested: each array its own filter */
        w = grammar("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}}");
        yes(w, "[[\"a\",\"b\"],[\"a\",\"b\"]]");
        no(w, "[[\"a\"],[\"b\",\"b\"]]");
        jg_free(w);
    }
    {   /* uniqueItems over integers without bounds (Pydantic's set[int]): no value twice —
         * -0 and 0 alike; a value that can only close (0, or at the digit cap) refused at its
         * digit while taken, so no prefix is a dead end */
        jg_grammar *w = grammar("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"uniqueItems\":true}");
        yes(w, "[]");
        yes(w, "[1,2,3]");
        yes(w, "[1,10,100,-1,-10,0]");
        yes(w, "[ 7 , 70 ]");
        no(w, "[1,1]");
        no(w, "[5,6,5]");
        no(w, "[0,-0]");
        no(w, "[-0,0]");
        no(w, "[-3, -3]");
        no(w, "[1.0]");
        yes(w, "[1,2,3,4,5,6,7,8,9,10]");
        no(w, "[1,2,3,4,5,6,7,8,9,10,11]"); /* 10 at most */
        refused_after(w, "[0,4,", "0", "40]"); /* a second 0 refused at its digit; 40 after 4 closes */
        refused_after(w, "[0,4,", "-0", NULL);   /* -0 after 0 likewise */
        refused_after(w, "[0,4,4", ",", NULL);   /* a second 4 may grow but not close */
        /* the digit cap: 18 digits, then only a close — the digit that repeats a capped value refused */
        refused_after(w, "[123456789012345678,12345678901234567", "8", "9]");
        jg_free(w);
        /* nested arrays: each its own filter; integers beside strings in separate arrays */
        w = grammar("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},"
                    "\"uniqueItems\":true},\"b\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"uniqueItems\":true}}}");
        yes(w, "{\"a\":[1,2],\"b\":[1,2]}");
        no(w, "{\"a\":[1],\"b\":[2,2]}");
        jg_free(w);
        /* a minimum of 0 .. 10^16 keeps every growing prefix's values plenty (set[PositiveInt]) */
        w = grammar("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"exclusiveMinimum\":0},\"uniqueItems\":true}");
        yes(w, "[1,2,30]");
        no(w, "[0]");
        no(w, "[4,4]");
        jg_free(w);
        w = grammar("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":0},\"uniqueItems\":true}");
        yes(w, "[-0,1]");
        no(w, "[0,-0]");
        refused_after(w, "[0,", "-", "1]"); /* items at least 0: once 0 is taken a '-' (only ever -0) is refused */
        jg_free(w);
        compile_error("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":-5},\"uniqueItems\":true}",
                      "'uniqueItems' is enforced only");
        compile_error("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"maximum\":50},\"uniqueItems\":true}",
                      "'uniqueItems' is enforced only");
        compile_error("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1e17},\"uniqueItems\":true}",
                      "'uniqueItems' is enforced only");
        compile_error("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"multipleOf\":2},\"uniqueItems\":true}",
                      "'uniqueItems' is enforced only");
        compile_error("{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"uniqueItems\":true}", "'uniqueItems' is enforced only");
        compile_error("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"uniqueItems\":true,\"minItems\":11}",
                      "over integers is enforced for at most 10 items");
    }
    {   /* uniqueItems over bounded integers of at most 64 values (Pydantic's
         * set[conint(ge=1, le=5)]): their values as literals, each at most once, no dead ends */
        jg_grammar *w = grammar("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":5},"
                                "\"uniqueItems\":true}");
        yes(w, "[]");
        yes(w, "[3, 1]");
        yes(w, "[5,4,3,2,1]");
        no(w, "[1,1]");
        no(w, "[2,6]");
        no(w, "[0]");
        no(w, "[01]");
        {   /* after all five, no ',' */
            jg_state st;
            jg_start(w, &st);
            const char *full = "[5,4,3,2,1";
            CHECK(jg_feed(w, &st, full, strlen(full)) && !jg_feed(w, &st, ",", 1), "a full set of 1..5 takes no more");
        }
        refused_after(w, "[1,", "1", "2]");
        jg_free(w);
        w = grammar("{\"type\":\"array\",\"items\":{\"type\":[\"integer\",\"null\"],\"multipleOf\":5,\"minimum\":-22,"
                    "\"exclusiveMaximum\":20},\"uniqueItems\":true}");
        yes(w, "[-20,0,15,null]");
        no(w, "[-20,-20]");
        no(w, "[null,null]");
        no(w, "[3]");
        no(w, "[20]");
        no(w, "[-0]"); /* a literal's text: 0 */
        jg_free(w);
        w = grammar("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"const\":3},{\"type\":\"integer\",\"minimum\":1,"
                    "\"maximum\":64}]},\"uniqueItems\":true,\"minItems\":64}");
        no(w, "[3,3]"); /* the const and the range's 3 are one value */
        jg_free(w);
        compile_error("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":65},\"uniqueItems\":true}",
                      "'uniqueItems' is enforced only");
        compile_error("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":5},\"uniqueItems\":true,"
                      "\"minItems\":6}",
                      "distinct values");
    }
    {   /* uniqueItems over literal values (Pydantic's set[Literal[...]], set[bool]) */
        jg_grammar *w = grammar("{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"uniqueItems\":true}");
        yes(w, "[]");
        yes(w, "[\"c\", \"a\"]");
        yes(w, "[\"b\",\"a\",\"c\"]");
        no(w, "[\"a\",\"a\"]");
        no(w, "[\"a\",\"b\",\"a\"]");
        {   /* after all three, no ',' (an element would have no value left) */
            jg_state st;
            jg_start(w, &st);
            const char *full = "[\"b\",\"a\",\"c\"";
            CHECK(jg_feed(w, &st, full, strlen(full)) && !jg_feed(w, &st, ",", 1), "a full set takes no more");
        }
        jg_free(w);
        w = grammar("{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"uniqueItems\":true,\"minItems\":1}");
        yes(w, "[true,false]");
        yes(w, "[false]");
        no(w, "[true,true]");
        no(w, "[]");
        jg_free(w);
        w = grammar("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"const\":1},{\"enum\":[1.0,null]}]},\"uniqueItems\":true}");
        yes(w, "[null,1]");
        no(w, "[1,1]"); /* 1 and 1.0 are one value */
        jg_free(w);
        w = grammar("{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"y\"]},"
                    "\"uniqueItems\":true},\"more\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"y\"]}}},"
                    "\"required\":[\"tags\"]}");
        yes(w, "{\"tags\":[\"y\",\"x\"],\"more\":[\"x\",\"x\"]}");
        no(w, "{\"tags\":[\"x\",\"x\"]}");
        jg_free(w);
        w = grammar("{\"type\":\"array\",\"items\":{\"enum\":[\"a\"]},\"uniqueItems\":false}");
        yes(w, "[\"a\",\"a\"]");
        jg_free(w);
        compile_error("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"a\"},\"uniqueItems\":true}",
                      "'uniqueItems' is enforced only");
        compile_error("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":0},\"uniqueItems\":true}",
                      "'uniqueItems' is enforced only");
        compile_error("{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true,\"minItems\":17}", "at most 16 items");
        compile_error("{\"type\":\"array\",\"items\":{\"enum\":[[1],[2]]},\"uniqueItems\":true}", "'uniqueItems' is enforced only");
        compile_error("{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems' is enforced only");
        compile_error("{\"uniqueItems\":true}", "needs 'type'");
        compile_error("{\"type\":\"array\",\"items\":{\"enum\":[1,2]},\"uniqueItems\":true,\"minItems\":3}", "distinct values");
        compile_error("{\"type\":\"array\",\"items\":{\"enum\":[1,2]},\"uniqueItems\":\"yes\"}", "must be a boolean");
    }
    {   /* enum / const: only the values the schema's other keywords allow too */
        jg_grammar *w = grammar("{\"type\":\"integer\",\"enum\":[1,\"a\",2.5,3,null]}");
        yes(w, "1");
        yes(w, "3");
        no(w, "\"a\"");
        no(w, "2.5");
        no(w, "null");
        jg_free(w);
        w = grammar("{\"enum\":[\"ab\",\"abc\",7],\"maxLength\":2,\"type\":[\"string\",\"integer\"],\"minimum\":8}");
        yes(w, "\"ab\"");
        no(w, "\"abc\"");
        no(w, "7");
        jg_free(w);
        w = grammar("{\"type\":[\"string\",\"null\"],\"enum\":[\"a\",null],\"description\":\"d\"}");
        yes(w, "\"a\"");
        yes(w, "null");
        jg_free(w);
        w = grammar("{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"$ref\":\"#/$defs/n\"}}}},"
                    "\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"enum\":[[{\"k\":{}}],[1]]}");
        yes(w, "[{\"k\":{}}]");
        no(w, "[1]");
        jg_free(w);
        w = grammar("{\"$defs\":{\"C\":{\"type\":\"string\",\"maxLength\":1}},\"$ref\":\"#/$defs/C\",\"enum\":[\"a\",\"bb\"]}");
        yes(w, "\"a\"");
        no(w, "\"bb\"");
        jg_free(w);
        w = grammar("{\"allOf\":[{\"type\":\"integer\"}],\"enum\":[1,\"x\"]}");
        yes(w, "1");
        no(w, "\"x\"");
        jg_free(w);
        compile_error("{\"const\":\"x\",\"type\":\"integer\"}", "'const' is not allowed");
        compile_error("{\"enum\":[5,6],\"type\":\"integer\",\"minimum\":7}", "no value of 'enum'");
    }
    {   /* allOf of several schemas, and beside other keywords: their intersection (jsm_all_of) */
        /* composition, as OpenAPI writes an extended model: a $ref'd base and more fields */
        jg_grammar *w = grammar("{\"$defs\":{\"Base\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},"
                                "\"required\":[\"id\"],\"title\":\"Base\"}},\"allOf\":[{\"$ref\":\"#/$defs/Base\"},{\"type\":\"object\","
                                "\"properties\":{\"name\":{\"type\":\"string\"}},\"required\":[\"name\"],\"title\":\"More\"}]}");
        yes(w, "{\"id\":1,\"name\":\"a\"}");
        yes(w, "{\"name\":\"a\",\"id\":-4}");
        no(w, "{\"id\":1}");
        no(w, "{\"name\":\"a\"}");
        no(w, "{\"id\":\"x\",\"name\":\"a\"}");
        no(w, "[]");
        jg_free(w);
        /* the types all allow; bounds: the largest minimum, the smallest maximum */
        w = grammar("{\"allOf\":[{\"type\":[\"string\",\"integer\"]},{\"type\":[\"integer\",\"null\"],\"minimum\":3},{\"maximum\":7,"
                    "\"minimum\":1}]}");
        yes(w, "3");
        yes(w, "7");
        no(w, "2");
        no(w, "8");
        no(w, "\"a\"");
        no(w, "null");
        jg_free(w);
        w = grammar("{\"type\":\"integer\",\"minimum\":0,\"allOf\":[{\"maximum\":5}]}"); /* beside the allOf */
        yes(w, "5");
        yes(w, "0");
        no(w, "6");
        no(w, "-1");
        jg_free(w);
        w = grammar("{\"allOf\":[{\"type\":\"string\"}],\"type\":\"string\",\"maxLength\":2}");
        yes(w, "\"ab\"");
        no(w, "\"abc\"");
        jg_free(w);
        /* a property in several schemas: both of its schemas */
        w = grammar("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"properties\":{\"a\":{\"minimum\":2}},"
                    "\"required\":[\"a\"]}]}");
        yes(w, "{\"a\":2}");
        no(w, "{\"a\":1}");
        no(w, "{\"a\":\"x\"}");
        no(w, "{}");
        jg_free(w);
        /* one closes its object: the others may only narrow the properties it declares */
        w = grammar("{\"allOf\":[{\"properties\":{\"a\":{},\"b\":{}},\"additionalProperties\":false},{\"properties\":"
                    "{\"b\":{\"type\":\"integer\"}},\"required\":[\"b\"]}]}");
        yes(w, "{\"b\":1}");
        yes(w, "{\"a\":true,\"b\":1}");
        no(w, "{\"b\":\"x\"}");
        no(w, "{\"c\":1,\"b\":1}");
        jg_free(w);
        /* an anyOf in one schema, a type in another: the alternatives the type allows */
        w = grammar("{\"allOf\":[{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]},{\"type\":[\"integer\",\"boolean\"]}]}");
        yes(w, "1");
        no(w, "\"a\"");
        no(w, "true");
        jg_free(w);
        /* nullable (OpenAPI) only where every schema with a type is */
        w = grammar("{\"allOf\":[{\"type\":\"string\",\"nullable\":true},{\"type\":\"string\",\"maxLength\":3}]}");
        yes(w, "\"abc\"");
        no(w, "null");
        jg_free(w);
        w = grammar("{\"allOf\":[{\"type\":\"string\",\"nullable\":true},{\"type\":\"string\",\"nullable\":true,\"maxLength\":3}]}");
        yes(w, "null");
        no(w, "\"abcd\"");
        jg_free(w);
        w = grammar("{\"allOf\":[{},true,{\"type\":\"boolean\"}]}");
        yes(w, "true");
        no(w, "1");
        jg_free(w);
        /* multipleOf in several: their least common multiple, in decimal */
        w = grammar("{\"type\":\"number\",\"allOf\":[{\"multipleOf\":0.1},{\"multipleOf\":0.25}],\"maximum\":10}");
        yes(w, "0.5");
        yes(w, "1.5");
        yes(w, "10");
        no(w, "0.25");
        no(w, "0.1");
        no(w, "0.3");
        jg_free(w);
        w = grammar("{\"allOf\":[{\"type\":\"integer\",\"multipleOf\":6},{\"multipleOf\":4},{\"multipleOf\":1.5}]}");
        yes(w, "12");
        yes(w, "-24");
        yes(w, "0");
        no(w, "6");
        no(w, "8");
        no(w, "18");
        jg_free(w);
        w = grammar("{\"type\":\"number\",\"allOf\":[{\"multipleOf\":0.07},{\"multipleOf\":0.01}],\"minimum\":0,"
                    "\"maximum\":1}");
        yes(w, "0.07");
        yes(w, "0.7");
        no(w, "0.01");
        jg_free(w);
        /* exclusive bounds in several: the tightest */
        w = grammar("{\"type\":\"integer\",\"allOf\":[{\"exclusiveMinimum\":1,\"exclusiveMaximum\":9},"
                    "{\"exclusiveMinimum\":3,\"exclusiveMaximum\":20}]}");
        yes(w, "4");
        yes(w, "8");
        no(w, "3");
        no(w, "9");
        jg_free(w);
    }
    compile_error("{\"type\":\"number\",\"allOf\":[{\"multipleOf\":1e-15},{\"multipleOf\":7e17},{\"multipleOf\":0.9}]}",
                  "no common multiple");
    compile_error("{\"type\":\"number\",\"allOf\":[{\"multipleOf\":0.1},{\"multipleOf\":1e-16}]}", "no common multiple");
    compile_error("{\"type\":\"number\",\"allOf\":[{\"multipleOf\":0.1},{\"multipleOf\":-2}]}", "no common multiple");
    compile_error("{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "no 'type' in common");
    compile_error("{\"allOf\":[{\"type\":\"string\"},false]}", "allows nothing");
    compile_error("{\"allOf\":[{\"type\":\"string\",\"pattern\":\"a\"},{\"pattern\":\"b\"}]}", "'pattern' in several schemas");
    compile_error("{\"allOf\":[{\"enum\":[1,2]},{\"enum\":[2,3]}]}", "'enum' in several schemas");
    compile_error("{\"allOf\":[{\"anyOf\":[{\"type\":\"string\"}]},{\"oneOf\":[{\"type\":\"integer\"}]}]}", "more than one 'anyOf'");
    compile_error("{\"allOf\":[{\"properties\":{\"a\":{}},\"additionalProperties\":false},{\"properties\":{\"b\":{}}}]}",
                  "does not declare \"b\"");
    compile_error("{\"$defs\":{\"A\":{\"allOf\":[{\"$ref\":\"#/$defs/A\"},{\"type\":\"integer\"}]}},\"$ref\":\"#/$defs/A\"}",
                  "nest too deeply");
    compile_error("{\"allOf\":[{\"$ref\":\"#/$defs/none\"},{}]}", "does not resolve");
    compile_error("{\"allOf\":[{\"not\":{}},{}]}", "'not' is not supported");
    compile_error("{\"allOf\":[{\"type\":\"string\"}],\"not\":{}}", "'not' is not supported");
    {   /* allOf of one schema (Pydantic's $ref with a description): that schema */
        jg_grammar *w = grammar("{\"$defs\":{\"P\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                                "\"required\":[\"a\"]}},\"type\":\"object\",\"properties\":{\"p\":{\"allOf\":"
                                "[{\"$ref\":\"#/$defs/P\"}],\"description\":\"the p\"}},\"required\":[\"p\"]}");
        yes(w, "{\"p\":{\"a\":1}}");
        no(w, "{\"p\":{}}");
        no(w, "{\"p\":1}");
        jg_free(w);
    }
    {   /* tuples: prefixItems (Pydantic's tuple[int, str] sets min/maxItems too), then 'items' */
        jg_grammar *w = grammar("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],"
                                "\"minItems\":2,\"maxItems\":2}");
        yes(w, "[1,\"a\"]");
        yes(w, "[ -7 , \"\" ]");
        no(w, "[\"a\",1]");   /* each place its own schema */
        no(w, "[1]");         /* minItems */
        no(w, "[1,\"a\",2]"); /* maxItems */
        no(w, "[1,2]");
        jg_free(w);
        /* no count bounds: the tuple's places, then any further items of 'items' */
        w = grammar("{\"prefixItems\":[{\"enum\":[\"x\",\"y\"]},{\"type\":\"boolean\"}],\"items\":{\"type\":\"integer\"}}");
        yes(w, "[]");
        yes(w, "[\"x\"]");
        yes(w, "[\"y\",true,3,4]");
        no(w, "[\"z\"]");
        no(w, "[\"x\",1]");
        no(w, "[\"x\",false,\"s\"]");
        jg_free(w);
        /* 'items': false ends the array at the tuple's length (maxItems above it is lowered) */
        w = grammar("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"null\"}],\"items\":false,\"maxItems\":5}");
        yes(w, "[null]");
        yes(w, "[]");
        no(w, "[null,null]");
        jg_free(w);
        /* the older form: 'items' as an array, 'additionalItems' for the rest */
        w = grammar("{\"type\":\"array\",\"items\":[{\"type\":\"string\"}],\"additionalItems\":{\"type\":\"number\"},"
                    "\"minItems\":1}");
        yes(w, "[\"a\"]");
        yes(w, "[\"a\",1.5,2]");
        no(w, "[]");
        no(w, "[1]");
        no(w, "[\"a\",\"b\"]");
        jg_free(w);
        /* a nested tuple inside an object, as Pydantic writes a tuple field */
        w = grammar("{\"type\":\"object\",\"properties\":{\"pt\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"number\"},"
                    "{\"type\":\"number\"}],\"minItems\":2,\"maxItems\":2}},\"required\":[\"pt\"]}");
        yes(w, "{\"pt\":[0.5,-1]}");
        no(w, "{\"pt\":[0.5]}");
        jg_free(w);
        compile_error("{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}", "above the tuple's length");
        compile_error("{\"type\":\"array\",\"prefixItems\":{}}", "'prefixItems' must be an array");
        compile_error("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"widget\"}]}", "#/prefixItems/0: unknown type");
        compile_error("{\"type\":\"array\",\"items\":[{}],\"additionalItems\":{\"type\":\"widget\"}}", "#/additionalItems");
    }
    {   /* minProperties / maxProperties: declared properties (a required one among them), a
         * generic object, an object only by the keyword, the empty object only */
        jg_grammar *w = grammar("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},"
                                "\"c\":{\"type\":\"integer\"}},\"required\":[\"a\"],\"minProperties\":2,\"maxProperties\":2}");
        yes(w, "{\"a\":1,\"b\":2}");
        yes(w, "{\"c\":3,\"a\":1}");
        yes(w, "{ \"b\" : 1 , \"a\" : 2 }");
        no(w, "{\"a\":1}");
        no(w, "{}");
        no(w, "{\"a\":1,\"b\":2,\"c\":3}");
        no(w, "{\"b\":1,\"c\":2}");
        static jg_state st;
        jg_start(w, &st); /* no dead end: after one optional property only the required one may follow */
        CHECK(!jg_feed(w, &st, "{\"b\":1,\"c", 9), "maxProperties: a second optional key must die at once");
        jg_start(w, &st);
        CHECK(jg_feed(w, &st, "{\"b\":1,\"a", 9), "maxProperties: the required key stays open");
        jg_free(w);
        w = grammar("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},\"minProperties\":1,\"maxProperties\":2}");
        yes(w, "{\"x\":1}");
        yes(w, "{\"x\":1,\"y\":-2}");
        no(w, "{}");
        no(w, "{\"x\":1,\"y\":2,\"z\":3}");
        no(w, "{\"x\":\"1\"}");
        jg_free(w);
        w = grammar("{\"minProperties\":1}");
        yes(w, "{\"k\":null}");
        yes(w, "{\"k\":[1,{}],\"j\":true}");
        no(w, "{}");
        no(w, "5");
        jg_free(w);
        w = grammar("{\"type\":[\"object\",\"null\"],\"properties\":{\"a\":{}},\"maxProperties\":0}");
        yes(w, "{}");
        yes(w, "null");
        no(w, "{\"a\":1}");
        jg_free(w);
        compile_error("{\"type\":\"object\",\"minProperties\":3,\"maxProperties\":2}", "'minProperties' is above 'maxProperties'");
        compile_error("{\"type\":\"object\",\"properties\":{\"a\":{}},\"minProperties\":2}", "above the number of properties");
        compile_error("{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}},\"required\":[\"a\",\"b\"],\"maxProperties\":1}",
                      "below the number of required");
        compile_error("{\"type\":\"object\",\"additionalProperties\":false,\"minProperties\":1}", "can never be met");
        compile_error("{\"type\":\"object\",\"minProperties\":-1}", "'minProperties' must be a non-negative integer");
        compile_error("{\"$defs\":{\"o\":{\"type\":\"object\"}},\"$ref\":\"#/$defs/o\",\"minProperties\":1}",
                      "beside '$ref'");
    }
    {   /* anyOf / oneOf beside other keywords: those apply to every alternative (carried in) */
        jg_grammar *w = grammar("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\","
                                "\"maxLength\":3}},\"additionalProperties\":false,\"anyOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}");
        yes(w, "{\"a\":1}");
        yes(w, "{\"b\":\"xy\"}");
        yes(w, "{\"b\":\"x\",\"a\":2}");
        no(w, "{}");
        no(w, "{\"a\":\"1\"}");
        no(w, "{\"c\":1}");
        jg_free(w);
        w = grammar("{\"type\":\"string\",\"anyOf\":[{\"maxLength\":2},{\"pattern\":\"^x\"}]}");
        yes(w, "\"ab\"");
        yes(w, "\"xyzzy\"");
        no(w, "\"abc\"");
        no(w, "5");
        jg_free(w);
        w = grammar("{\"type\":[\"string\",\"null\"],\"oneOf\":[{\"type\":\"string\",\"minLength\":2},{\"type\":\"integer\"}]}");
        yes(w, "\"ab\"");
        no(w, "\"a\"");
        no(w, "5");
        no(w, "null");
        jg_free(w);
        w = grammar("{\"type\":\"integer\",\"minimum\":0,\"anyOf\":[{\"maximum\":5},{\"multipleOf\":10}],\"title\":\"n\"}");
        yes(w, "3");
        yes(w, "20");
        no(w, "-1");
        no(w, "7");
        no(w, "-10");
        jg_free(w);
        w = grammar("{\"type\":\"object\",\"required\":[\"a\"],\"anyOf\":[{\"required\":[\"b\"]},{\"type\":\"null\"}],\"nullable\":true}");
        yes(w, "{\"a\":1,\"b\":2}");
        yes(w, "null");
        no(w, "{\"a\":1}");
        jg_free(w);
        /* Pydantic's discriminated union: annotations beside oneOf stay out of the alternatives */
        w = grammar("{\"$defs\":{\"A\":{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"}},\"required\":[\"k\"]}},"
                    "\"oneOf\":[{\"$ref\":\"#/$defs/A\"}],\"discriminator\":{\"propertyName\":\"k\"},\"title\":\"U\"}");
        yes(w, "{\"k\":\"a\"}");
        no(w, "{\"k\":\"b\"}");
        jg_free(w);
        w = grammar("{\"type\":\"object\",\"anyOf\":[{\"properties\":{\"a\":{}}},{\"properties\":{\"b\":{}}}],\"minProperties\":1}");
        yes(w, "{\"a\":1}");
        yes(w, "{\"b\":[]}");
        no(w, "{}");
        jg_free(w);
        compile_error("{\"type\":\"integer\",\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}", "no alternative");
        /* properties both beside and inside: joined, as an allOf joins them */
        w = grammar("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"anyOf\":[{\"properties\":{\"b\":"
                    "{\"type\":\"string\"}}},{\"required\":[\"a\"]}]}");
        yes(w, "{\"b\":\"x\"}");
        yes(w, "{\"a\":1}");
        yes(w, "{\"b\":\"x\",\"a\":2}");
        no(w, "{\"a\":\"x\"}");
        no(w, "{\"b\":1}");
        jg_free(w);
        /* an alternative that is a $ref, with the keywords beside the anyOf carried in */
        w = grammar("{\"$defs\":{\"A\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"}},\"required\":[\"k\"]}},"
                    "\"type\":\"object\",\"required\":[\"z\"],\"anyOf\":[{\"$ref\":\"#/$defs/A\"},{\"type\":\"null\"}]}");
        yes(w, "{\"k\":1,\"z\":0}");
        no(w, "{\"k\":1}");
        no(w, "{\"k\":\"1\",\"z\":0}");
        no(w, "null");
        jg_free(w);
        compile_error("{\"type\":\"string\",\"pattern\":\"a\",\"anyOf\":[{\"pattern\":\"b\"}]}",
                      "#/anyOf/0: 'pattern' both beside 'anyOf' / 'oneOf' and inside an alternative");
        compile_error("{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":false,\"anyOf\":[{\"properties\":"
                      "{\"b\":{}}}]}", "does not declare \"b\"");
    }
    compile_error("{\"$ref\":\"#/$defs/missing\"}", "does not resolve");
    compile_error("{\"type\":\"widget\"}", "unknown type");
    compile_error("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems");
    compile_error("false", "allows nothing");
    return check_summary();
}
