/* text/json_decimal.h — JSON Schema numbers as the schema's author wrote them, in fixed
 * point: the shortest decimal that reads back as a double, in units of 10^-scale, in an
 * __int128. Constrained output's bounds and multipleOf (json_grammar.c) and allOf's merged
 * multipleOf (json_schema_merge.c) read numbers through this one reading, so a merged value
 * means what the compiler will take it to mean.
 */
#ifndef ORCHID_TEXT_JSON_DECIMAL_H
#define ORCHID_TEXT_JSON_DECIMAL_H

#include <stdbool.h>

/* The recognizer's caps: 18 integer and 15 fraction digits, so a value in units of 1e-15
 * fits an __int128. */
#define JD_INT_DIGITS 18
#define JD_FRAC_DIGITS 15

typedef __int128 jd_num;

jd_num jd_pow10(int k);
/* The largest magnitude written in units of 10^-scale: 10^(JD_INT_DIGITS + scale) - 1. */
jd_num jd_limit(int scale);
/* x (finite) in units of 10^-scale, rounded up (up) or down, clipped to +-(limit + 1);
 * *exact: nothing was rounded away or clipped. From the shortest decimal that reads back
 * as x — "minimum": 0.1 is exactly 0.1, as a document's "0.1" is. */
jd_num jd_scaled(double x, int scale, bool up, jd_num limit, bool *exact);
jd_num jd_gcd(jd_num a, jd_num b);

#endif
