/* text/json_grammar.h — a byte-level recognizer of the JSON documents a JSON
 * Schema allows, for constrained decoding (response_format json_schema /
 * json_object): the sampler asks whether a token's bytes can extend the text
 * so far, and only tokens that can are chosen.
 *
 * Schemas compile to a graph of nodes (recursion through $ref is a cycle).
 * Supported: type (one or a list), enum, const, anyOf / oneOf (oneOf is
 * enforced as anyOf), $ref to "#", "#/$defs/..." or "#/definitions/...",
 * properties + required (at most 64 properties; keys only from properties,
 * each at most once, in any order; every required one before the '}'),
 * additionalProperties (a schema for the values of an object without
 * properties), items, minItems / maxItems, minLength / maxLength, nullable,
 * and on numeric types ("integer", "number", or a list with them) minimum /
 * maximum / exclusiveMinimum / exclusiveMaximum: a digit is allowed only while
 * some value within the bounds still begins with the text so far, and the
 * number ends only inside them (no prefix without a way out); bounded numbers
 * are plain decimals (no exponent), compared exactly in units of 1e-15 with the
 * bounds as written (the shortest decimal of the schema's double); and pattern on
 * strings (text/json_regex.h: a search, as JSON Schema says; each code point — raw
 * UTF-8 or escaped — steps the NFA, and a byte or escape digit is allowed only while
 * the code points it can still become go on; beside minLength / maxLength only with a
 * maxLength of at most 255, the NFA's remaining-length sets then deciding too).
 * Annotations (title, description, default, examples, format, $schema, ...)
 * and unknown keywords are ignored, as JSON Schema says. Validation keywords
 * that cannot be enforced here (bounds without a numeric type, multipleOf but on
 * an integer (a whole number there: enforced by the same prefix test), not, if /
 * then / else, uniqueItems but over at most 64 literal values or over strings
 * without a pattern, an allOf (or an anyOf's siblings) whose schemas disagree on a
 * keyword text/json_schema_merge.h cannot merge, ...) are an error naming the
 * keyword and where it is, never silently unenforced. allOf, and the keywords beside
 * an anyOf, are merged into one schema first (json_schema_merge.h). An object schema with
 * properties never gets keys outside them: the documents produced are a
 * subset of those the schema allows, so every one validates.
 *
 * Documents: no whitespace before the value or after it; between tokens at
 * most 32 whitespace bytes in a row (pretty-printing fits; endless blank runs
 * do not). Numbers: at most 18 integer digits, 15 fraction digits and 2
 * exponent digits, so a number always ends and is a finite double. Strings are
 * valid UTF-8 (RFC 3629) without control characters, with valid escapes — an
 * escaped surrogate only as a whole pair; min/maxLength count characters (code
 * points: an escape, a pair of them or a UTF-8 character is one), as JSON
 * Schema does. Tuples: prefixItems (or the older 'items' array) place by
 * place, then 'items' ('additionalItems'). enum / const: the listed values
 * that the schema's other keywords allow too (each fed through their grammar). uniqueItems over literal values: an
 * element's alternatives are those its array has not taken yet (the array frame's
 * seen), and maxItems is capped at their number so an element always has one; over
 * free strings: a Bloom filter of the items' hashes in the array frame, a close
 * refused while the string's bits are all set, at most 16 items.
 *
 * State: a small fixed-size struct (several alternative parses when anyOf,
 * enum or a type list leave more than one open), copied cheaply with
 * jg_copy; no allocation after jg_compile.
 */
#ifndef ORCHID_TEXT_JSON_GRAMMAR_H
#define ORCHID_TEXT_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define JG_MAX_DEPTH 32   /* nesting of values */
#define JG_MAX_THREADS 8  /* alternative parses kept at once */

typedef struct jg_grammar jg_grammar;

struct jg_frame {
    int32_t node;
    uint8_t phase;
    uint8_t ws;     /* whitespace bytes in a row here */
    uint16_t pos;   /* literal / key byte position, digit count */
    uint32_t count; /* array items, string characters, the property being read */
    uint64_t seen;  /* object: properties given */
    uint64_t cand;  /* object key: properties the key can still be */
};

struct jg_thread {
    int depth; /* 0: the document is complete */
    struct jg_frame f[JG_MAX_DEPTH];
};

typedef struct jg_state {
    int n; /* 0: dead (no parse left) */
    struct jg_thread t[JG_MAX_THREADS];
} jg_state;

/* schema NULL: any JSON object (json_object). Returns 0, or -1 with err
 * naming the keyword and its place ("#/properties/age: 'minimum' is not
 * supported"). */
int jg_compile(const cJSON *schema, jg_grammar **out, char *err, size_t errlen);
void jg_free(jg_grammar *g);

void jg_start(const jg_grammar *g, jg_state *s);
/* dst = src (only what is in use). */
void jg_copy(jg_state *dst, const jg_state *src);
/* Feeds bytes; false when the text can no longer be a prefix of an allowed
 * document (s is then dead). */
bool jg_feed(const jg_grammar *g, jg_state *s, const char *bytes, size_t n);
/* True when the text so far is a whole allowed document. */
bool jg_complete(const jg_grammar *g, const jg_state *s);
/* When the text is inside a string, between characters, in its only parse:
 * how many more characters the string takes (UINT32_MAX: no limit). Else -1.
 * Lets a caller accept a run of plain string characters (no quote, backslash
 * or control character; whole UTF-8 characters) without feeding it. */
int64_t jg_string_room(const jg_grammar *g, const jg_state *s);

#endif
