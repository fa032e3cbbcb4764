/* text/json_regex.h — the regular expressions of JSON Schema's "pattern" keyword, as a
 * small NFA that constrained output steps one code point at a time (json_grammar.c).
 *
 * Syntax (a subset of ECMA-262, which JSON Schema names): literals; escapes of the
 * metacharacters and \n \t \r \f \v \0 \/ \-; \d \D \w \W \s \S; '.'; classes [...] and
 * [^...] with ranges and those escapes; groups ( ) and (?: ); alternation |; quantifiers
 * * + ? {m} {m,} {m,n} (a lazy '?' after one is accepted: it does not change what
 * matches); '^' only first and '$' only last. Anything else (backreferences, lookaround,
 * \b, \uXXXX, named groups, anchors inside) is an error naming it.
 *
 * Matching is a search, as JSON Schema says: without '^' the match may start anywhere,
 * without '$' end anywhere. Where ECMA-262 and Python's re (the validators users test
 * with) read a class differently, the NFA takes only characters both accept: \d [0-9],
 * \w [A-Za-z0-9_], \s the whitespace both name, and \D \W \S and '.' their ASCII-safe
 * complements (\D \W \S: ASCII only; '.': no line terminator) — what is generated
 * matches under either reading.
 *
 * States: at most 64, a set of them is a uint64_t (epsilon-closed, and only states from
 * which the end can still be reached: a live set can always be finished). Each state also
 * knows the lengths (in code points, below JR_LENS) in which it can still reach the match,
 * for strings with minLength / maxLength beside the pattern.
 */
#ifndef ORCHID_TEXT_JSON_REGEX_H
#define ORCHID_TEXT_JSON_REGEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct jr_nfa jr_nfa;

/* Returns 0, or -1 with err saying what is not supported or malformed (and where). */
int jr_compile(const char *pattern, jr_nfa **out, char *err, size_t errlen);
void jr_free(jr_nfa *r);

uint64_t jr_start(const jr_nfa *r);
/* The live states after code point cp from set (0: no way on). */
uint64_t jr_step(const jr_nfa *r, uint64_t set, uint32_t cp);
/* Whether some code point in [lo, hi] (surrogates excluded) takes set somewhere live. */
bool jr_can(const jr_nfa *r, uint64_t set, uint32_t lo, uint32_t hi);
/* Whether the text so far (reaching set) matches. */
bool jr_accepts(const jr_nfa *r, uint64_t set);

/* Lengths: the code points still to write. JR_LENS bounds what is tracked exactly, so a
 * string with a pattern takes a maxLength below it (json_grammar.c). */
#define JR_LENS 256
#define JR_LENW (JR_LENS / 64)
/* Whether set can reach the match in some number of code points within [lo, hi]. */
bool jr_len_ok(const jr_nfa *r, uint64_t set, int lo, int hi);
/* Whether some code point in [cp_lo, cp_hi] (surrogates excluded) leads from set to states
 * that can then match in a number of code points within [lo, hi]. */
bool jr_can_len(const jr_nfa *r, uint64_t set, uint32_t cp_lo, uint32_t cp_hi, int lo, int hi);

#endif
