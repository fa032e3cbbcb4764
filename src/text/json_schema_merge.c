/* text/json_schema_merge.c — schema rewrites for constrained output (see the header): the
 * keywords beside an anyOf carried into its alternatives, and an allOf's schemas merged
 * into one. Every rewrite is exact (the result allows the same documents as the input) or
 * an error naming what it could not merge: a looser schema would let the model write a
 * document the request's schema refuses.
 */
#include "text/json_schema_merge.h"

#include "text/json_decimal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MERGE_MAX_DEPTH 32 /* nested allOf / $ref hops one merge follows ($ref cycles end here) */

int jsm_fail(char *err, size_t errlen, const char *path, const char *msg) {
    snprintf(err, errlen, "%s: %s", path[0] ? path : "#", msg);
    return -1;
}

bool jsm_names_have(const cJSON *v, const char *name) {
    if (cJSON_IsString(v)) return !strcmp(v->valuestring, name);
    if (!cJSON_IsArray(v)) return false;
    const cJSON *t;
    cJSON_ArrayForEach(t, v) if (cJSON_IsString(t) && !strcmp(t->valuestring, name)) return true;
    return false;
}

/* The validation keywords the compiler enforces. Annotations (title, description, format,
 * discriminator, ...) stay out; nullable is applied after the alternatives; the keywords
 * refused anyway ('not', 'if', ...) are refused before. */
bool jsm_carried_kw(const char *k) {
    static const char *const carried[] = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                          "items", "prefixItems", "additionalItems", "minItems", "maxItems",
                                          "uniqueItems", "minLength", "maxLength", "pattern", "minimum", "maximum",
                                          "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minProperties",
                                          "maxProperties"};
    for (size_t i = 0; i < sizeof carried / sizeof carried[0]; i++)
        if (!strcmp(k, carried[i])) return true;
    return false;
}

const cJSON *jsm_ref_target(const cJSON *doc, const char *ref) {
    if (!strcmp(ref, "#")) return doc;
    if (!strncmp(ref, "#/$defs/", 8)) return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "$defs"), ref + 8);
    if (!strncmp(ref, "#/definitions/", 14))
        return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "definitions"), ref + 14);
    return NULL;
}

/* The names of two 'type' keywords both hold (is_type), or of two 'required' lists either
 * holds, as a new array (NULL: out of memory). */
static cJSON *names_merged(const cJSON *a, const cJSON *b, bool is_type) {
    cJSON *out = cJSON_CreateArray();
    const cJSON *from[2] = {a, b};
    for (int li = 0; li < 2 && out; li++) {
        const bool list = cJSON_IsArray(from[li]);
        for (const cJSON *e = list ? from[li]->child : from[li]; e; e = list ? e->next : NULL) {
            if (!cJSON_IsString(e)) continue;
            const bool keep = is_type ? li == 0 && jsm_names_have(b, e->valuestring) : !jsm_names_have(out, e->valuestring);
            if (keep) cJSON_AddItemToArray(out, cJSON_CreateString(e->valuestring));
        }
    }
    return out;
}

/* Adds a copy of item under key to object o (0, or -1: out of memory). */
static int add_copy(cJSON *o, const char *key, const cJSON *item) {
    cJSON *dup = cJSON_Duplicate(item, 1);
    if (!dup || !cJSON_AddItemToObject(o, key, dup)) {
        cJSON_Delete(dup);
        return -1;
    }
    return 0;
}

/* ---- merging (allOf, and an anyOf's siblings carried into an alternative) ---- */

bool jsm_annotation_kw(const char *k) {
    static const char *const notes[] = {"title", "description", "default", "examples", "$comment", "$schema", "$id",
                                        "$anchor", "format", "deprecated", "readOnly", "writeOnly", "discriminator",
                                        "contentMediaType", "contentEncoding", "$defs", "definitions"};
    if (!strncmp(k, "x-", 2)) return true;
    for (size_t i = 0; i < sizeof notes / sizeof notes[0]; i++)
        if (!strcmp(k, notes[i])) return true;
    return false;
}

/* +1: a lower bound (the merge keeps the largest), -1: an upper bound (the smallest), 0: neither. */
static int bound_kw(const char *k) {
    static const char *const lower[] = {"minimum", "minLength", "minItems", "minProperties", "exclusiveMinimum"};
    static const char *const upper[] = {"maximum", "maxLength", "maxItems", "maxProperties", "exclusiveMaximum"};
    for (size_t i = 0; i < sizeof lower / sizeof lower[0]; i++) {
        if (!strcmp(k, lower[i])) return 1;
        if (!strcmp(k, upper[i])) return -1;
    }
    return 0;
}

/* The least common multiple of two multipleOf values, in decimal (0.1 and 0.25: 0.5), as
 * a number: each read as json_grammar.c reads a multipleOf (jd_scaled in units of
 * 10^-JD_FRAC_DIGITS, exactly), the result written back as the decimal it is; false when a
 * value is not such a decimal or a value or the multiple is past 10^JD_INT_DIGITS. */
static bool dec_lcm(double a, double b, double *out) {
    const jd_num lim = jd_pow10(JD_INT_DIGITS + JD_FRAC_DIGITS);
    bool ea = false, eb = false;
    const jd_num ua = a > 0 ? jd_scaled(a, JD_FRAC_DIGITS, true, lim, &ea) : 0;
    const jd_num ub = b > 0 ? jd_scaled(b, JD_FRAC_DIGITS, true, lim, &eb) : 0;
    if (!ea || !eb || ua < 1 || ub < 1) return false;
    const jd_num q = ua / jd_gcd(ua, ub);
    if (q > lim / ub) return false;
    const jd_num l = q * ub;
    /* l · 10^-JD_FRAC_DIGITS as a decimal string, read back as the nearest double */
    char digits[48], txt[64];
    int n = 0;
    for (jd_num t = l; t; t /= 10) digits[n++] = (char)('0' + (int)(t % 10));
    int o = 0;
    for (int i = n - 1; i >= JD_FRAC_DIGITS; i--) txt[o++] = digits[i];
    if (o == 0) txt[o++] = '0';
    txt[o++] = '.';
    for (int i = JD_FRAC_DIGITS - 1; i >= 0; i--) txt[o++] = i < n ? digits[i] : '0';
    txt[o] = 0;
    *out = strtod(txt, NULL);
    return true;
}

/* {"allOf": [a, b]} (copies), NULL: out of memory. */
static cJSON *all_of_pair(const cJSON *a, const cJSON *b) {
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    if (!o || !arr || !cJSON_AddItemToObject(o, "allOf", arr)) {
        cJSON_Delete(o);
        cJSON_Delete(arr);
        return NULL;
    }
    cJSON *da = cJSON_Duplicate(a, 1), *db = cJSON_Duplicate(b, 1);
    if (!da || !db) {
        cJSON_Delete(da);
        cJSON_Delete(db);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddItemToArray(arr, da);
    cJSON_AddItemToArray(arr, db);
    return o;
}

/* The merge's state: the document ($ref targets), the schemas seen that close their object
 * (additionalProperties other than true: each must declare every property of the merge). */
struct merge {
    const cJSON *doc;
    const char *where; /* how a keyword's two values met, for the error: "in several schemas of 'allOf'" */
    const cJSON *closed[MERGE_MAX_DEPTH];
    int n_closed;
    int typed, typed_nullable; /* schemas with a 'type', and of those the ones nullable (OpenAPI) */
    char *err;
    size_t errlen;
};

/* Keyword k (value v) of one of the schemas into the merge m (0, or -1: err set unless out
 * of memory). */
static int merge_kw(struct merge *mg, cJSON *m, const cJSON *v, const char *path) {
    const char *k = v->string;
    cJSON *have = cJSON_GetObjectItemCaseSensitive(m, k);
    if (!strcmp(k, "anyOf") || !strcmp(k, "oneOf")) {
        const bool other = cJSON_GetObjectItemCaseSensitive(m, "anyOf") || cJSON_GetObjectItemCaseSensitive(m, "oneOf");
        if (other && !(have && cJSON_Compare(have, v, 1)))
            return jsm_fail(mg->err, mg->errlen, path, "'allOf' of schemas with more than one 'anyOf' / 'oneOf' is not supported");
        return have ? 0 : add_copy(m, k, v);
    }
    if (!have) return add_copy(m, k, v);
    if (cJSON_Compare(have, v, 1)) return 0;
    if (!strcmp(k, "type") || !strcmp(k, "required")) {
        const bool is_type = k[0] == 't';
        cJSON *both = names_merged(have, v, is_type);
        if (!both) return -1;
        if (is_type && cJSON_GetArraySize(both) == 0) {
            cJSON_Delete(both);
            return jsm_fail(mg->err, mg->errlen, path, "the schemas of 'allOf' have no 'type' in common");
        }
        cJSON_ReplaceItemInObjectCaseSensitive(m, k, both);
        return 0;
    }
    if (!strcmp(k, "properties") && cJSON_IsObject(have) && cJSON_IsObject(v)) {
        const cJSON *p;
        cJSON_ArrayForEach(p, v) {
            const cJSON *mine = cJSON_GetObjectItemCaseSensitive(have, p->string);
            if (!mine) {
                if (add_copy(have, p->string, p)) return -1;
            } else if (!cJSON_Compare(mine, p, 1)) { /* a property in several: both its schemas */
                cJSON *both = all_of_pair(mine, p);
                if (!both) return -1;
                cJSON_ReplaceItemInObjectCaseSensitive(have, p->string, both);
            }
        }
        return 0;
    }
    if (!strcmp(k, "items") && !cJSON_IsArray(have) && !cJSON_IsArray(v)) {
        cJSON *both = all_of_pair(have, v);
        if (!both) return -1;
        cJSON_ReplaceItemInObjectCaseSensitive(m, k, both);
        return 0;
    }
    if (!strcmp(k, "multipleOf") && cJSON_IsNumber(have) && cJSON_IsNumber(v)) {
        /* both: the multiples of their least common multiple */
        double l;
        if (!dec_lcm(have->valuedouble, v->valuedouble, &l))
            return jsm_fail(mg->err, mg->errlen, path,
                            "the 'multipleOf' values of 'allOf' have no common multiple of at most 15 fraction "
                            "and 18 integer digits (or are not positive decimals)");
        cJSON *n = cJSON_CreateNumber(l);
        if (!n) return -1;
        cJSON_ReplaceItemInObjectCaseSensitive(m, k, n);
        return 0;
    }
    const int b = bound_kw(k);
    if (b && cJSON_IsNumber(have) && cJSON_IsNumber(v)) {
        if (b > 0 ? v->valuedouble > have->valuedouble : v->valuedouble < have->valuedouble) {
            cJSON *dup = cJSON_Duplicate(v, 1);
            if (!dup) return -1;
            cJSON_ReplaceItemInObjectCaseSensitive(m, k, dup);
        }
        return 0;
    }
    char msg[200];
    snprintf(msg, sizeof msg, "'%.40s' %s with other values is not supported", k, mg->where);
    return jsm_fail(mg->err, mg->errlen, path, msg);
}

/* Schema s merged into m: its $ref's target, its allOf's schemas, then its own keywords. */
static int merge_schema(struct merge *mg, cJSON *m, const cJSON *s, const char *path, int depth) {
    if (depth > MERGE_MAX_DEPTH) return jsm_fail(mg->err, mg->errlen, path, "'allOf' / '$ref' nest too deeply (or refer to themselves)");
    if (cJSON_IsTrue(s)) return 0;
    if (cJSON_IsFalse(s)) return jsm_fail(mg->err, mg->errlen, path, "a schema of 'allOf' is 'false': it allows nothing");
    if (!cJSON_IsObject(s)) return jsm_fail(mg->err, mg->errlen, path, "a schema must be an object or a boolean");
    char sub[256];
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        const cJSON *target = cJSON_IsString(ref) ? jsm_ref_target(mg->doc, ref->valuestring) : NULL;
        if (!target) {
            snprintf(sub, sizeof sub, "'$ref' \"%.120s\" does not resolve (\"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" "
                                      "in this schema are supported)", cJSON_IsString(ref) ? ref->valuestring : "");
            return jsm_fail(mg->err, mg->errlen, path, sub);
        }
        if (merge_schema(mg, m, target, ref->valuestring, depth + 1)) return -1;
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (all) {
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) == 0)
            return jsm_fail(mg->err, mg->errlen, path, "'allOf' must be a non-empty array of schemas");
        const cJSON *e;
        int i = 0;
        cJSON_ArrayForEach(e, all) {
            snprintf(sub, sizeof sub, "%s/allOf/%d", path, i++);
            if (merge_schema(mg, m, e, sub, depth + 1)) return -1;
        }
    }
    if (cJSON_GetObjectItemCaseSensitive(s, "type")) {
        mg->typed++;
        mg->typed_nullable += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable"));
    }
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (ap && !cJSON_IsTrue(ap)) {
        if (mg->n_closed == MERGE_MAX_DEPTH)
            return jsm_fail(mg->err, mg->errlen, path, "too many schemas of 'allOf' set 'additionalProperties'");
        mg->closed[mg->n_closed++] = s;
    }
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (!strcmp(k->string, "$ref") || !strcmp(k->string, "allOf") || jsm_annotation_kw(k->string)) continue;
        if (!strcmp(k->string, "nullable")) { /* settled at the end (jsm_all_of) */
            if (!cJSON_GetObjectItemCaseSensitive(m, "nullable") && !cJSON_AddBoolToObject(m, "nullable", 1)) return -1;
            continue;
        }
        if (merge_kw(mg, m, k, path)) return -1;
    }
    return 0;
}

/* The merge's last rules on m (0, or -1 with err set): nullable, the closed objects. */
static int settle(struct merge *mg, cJSON *m, const char *path) {
    /* nullable adds null beside a type: the merge allows it only when every schema with a
     * type does */
    if (mg->typed_nullable < mg->typed || !mg->typed) cJSON_DeleteItemFromObjectCaseSensitive(m, "nullable");
    /* JSON Schema's additionalProperties sees only its own schema's properties: a schema that
     * closes its object refuses what the others add. Merged, the others' properties would be
     * allowed, so that is refused here instead. */
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(m, "properties"), *p;
    for (int i = 0; i < mg->n_closed; i++) {
        const cJSON *own = cJSON_GetObjectItemCaseSensitive(mg->closed[i], "properties");
        cJSON_ArrayForEach(p, props) {
            if (cJSON_GetObjectItemCaseSensitive(own, p->string)) continue;
            char msg[240];
            snprintf(msg, sizeof msg, "a schema sets 'additionalProperties' and does not declare \"%.60s\", which another "
                                      "(%s) declares: not supported", p->string, mg->where);
            return jsm_fail(mg->err, mg->errlen, path, msg);
        }
    }
    return 0;
}

cJSON *jsm_all_of(const cJSON *doc, const cJSON *s, const char *path, char *err, size_t errlen) {
    struct merge mg = {.doc = doc, .where = "in several schemas of 'allOf'", .err = err, .errlen = errlen};
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    if (merge_schema(&mg, m, s, path, 0) || settle(&mg, m, path)) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

cJSON *jsm_carry_into(const cJSON *doc, const cJSON *s, const cJSON *alt, const char *path, int *rc, char *err,
                      size_t errlen) {
    *rc = -1;
    if (cJSON_IsFalse(alt)) {
        *rc = 0;
        return NULL;
    }
    struct merge mg = {.doc = doc, .where = "both beside 'anyOf' / 'oneOf' and inside an alternative", .err = err,
                       .errlen = errlen};
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    if (merge_schema(&mg, m, alt, path, 0)) goto fail;
    /* no type in common: the alternative allows nothing the rest of s does (dropped) */
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(s, "type"), *at = cJSON_GetObjectItemCaseSensitive(m, "type");
    if (st && at) {
        cJSON *both = names_merged(at, st, true);
        if (!both) goto fail;
        const bool none = cJSON_GetArraySize(both) == 0;
        cJSON_Delete(both);
        if (none) {
            cJSON_Delete(m);
            *rc = 0;
            return NULL;
        }
    }
    const cJSON *k;
    cJSON_ArrayForEach(k, s) if (jsm_carried_kw(k->string) && merge_kw(&mg, m, k, path)) goto fail;
    if (st) { /* s's own nullable adds null after the alternatives; in them it counts as one typed schema */
        mg.typed++;
        mg.typed_nullable += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable"));
    }
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (ap && !cJSON_IsTrue(ap) && mg.n_closed < MERGE_MAX_DEPTH) mg.closed[mg.n_closed++] = s;
    if (settle(&mg, m, path)) goto fail;
    *rc = 0;
    return m;
fail:
    cJSON_Delete(m);
    return NULL;
}
