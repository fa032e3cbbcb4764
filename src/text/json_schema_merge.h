/* text/json_schema_merge.h — JSON Schema rewrites that fold several schemas into one, for
 * the constrained-output compiler (json_grammar.c): an anyOf / oneOf alternative with the
 * keywords beside it carried in, and an allOf's schemas merged into their intersection.
 * Both work on cJSON copies and leave the inputs untouched; what they cannot express
 * exactly is an error naming the keyword, never a looser schema.
 */
#ifndef ORCHID_TEXT_JSON_SCHEMA_MERGE_H
#define ORCHID_TEXT_JSON_SCHEMA_MERGE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

/* The compiler's one error form: "PATH: MSG" into err ('#' for the root); returns -1. */
int jsm_fail(char *err, size_t errlen, const char *path, const char *msg);

/* Whether v (a 'type' or 'required' value: a string or an array of strings) names name. */
bool jsm_names_have(const cJSON *v, const char *name);

/* Whether keyword k of a schema is a validation keyword the compiler enforces (carried
 * into an anyOf's alternatives, merged across an allOf). */
bool jsm_carried_kw(const char *k);

/* Alternative alt of an anyOf with the validation keywords of its schema s carried into it
 * (all of a schema's keywords apply: {"type": "object", "required": ["a"], "anyOf": [A, B]}
 * is anyOf [A + type + required, B + type + required]): the two merged as jsm_all_of merges
 * (alt's '$ref' resolved in doc). Returns a new schema (the caller deletes it), NULL with
 * *rc = 0 when the alternative allows nothing the rest of s does (no type in common), or
 * NULL with *rc = -1 (err set, unless memory ran out). */
cJSON *jsm_carry_into(const cJSON *doc, const cJSON *s, const cJSON *alt, const char *path, int *rc, char *err,
                      size_t errlen);

/* Schema s (with an 'allOf') as one schema: its own keywords and every allOf schema's
 * ('$ref's resolved in doc, nested allOfs flattened) merged — 'type' to the types all allow,
 * 'required' and 'properties' to their union (a property in several: an allOf of its
 * schemas), an 'items' schema in several to their allOf, minimum-like bounds to the largest
 * and maximum-like to the smallest, one 'anyOf' / 'oneOf' at most; any other validation
 * keyword must agree. Annotations (title, description, ...) are dropped. A schema that
 * closes its object ('additionalProperties' other than true) must declare every property
 * the others do. Returns a new schema (the caller deletes it) or NULL (err set, unless
 * memory ran out). */
cJSON *jsm_all_of(const cJSON *doc, const cJSON *s, const char *path, char *err, size_t errlen);

/* Whether keyword k only describes (title, description, format, x-..., $defs, ...): an
 * allOf's schemas may each carry their own. */
bool jsm_annotation_kw(const char *k);

/* The schema a local '$ref' names in doc ("#", "#/$defs/NAME", "#/definitions/NAME"), or
 * NULL. */
const cJSON *jsm_ref_target(const cJSON *doc, const char *ref);

#endif
