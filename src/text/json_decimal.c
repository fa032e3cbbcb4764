/* text/json_decimal.c — the fixed-point reading of JSON Schema numbers (see the header). */
#include "text/json_decimal.h"

#include <stdio.h>
#include <stdlib.h>

jd_num jd_pow10(int k) {
    jd_num r = 1;
    while (k-- > 0) r *= 10;
    return r;
}

jd_num jd_limit(int scale) { return jd_pow10(JD_INT_DIGITS) * jd_pow10(scale) - 1; }

jd_num jd_scaled(double x, int scale, bool up, jd_num limit, bool *exact) {
    char txt[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(txt, sizeof txt, "%.*e", prec - 1, x);
        if (strtod(txt, NULL) == x) break;
    }
    /* txt: [-]d.ddde[+-]XX: the digits D (nd of them) times 10^(X - (nd - 1)) */
    const bool neg = txt[0] == '-';
    jd_num d = 0;
    int nd = 0;
    const char *p = txt + neg;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') d = d * 10 + (*p - '0'), nd++;
    int e10 = atoi(p + 1) - (nd - 1) + scale;
    *exact = true;
    if (e10 > 40) d = limit + 1; /* far beyond: clipped below */
    else
        for (; e10 > 0 && d <= limit; e10--) d *= 10;
    for (; e10 < 0; e10++) { /* round toward the bound's side: up for a value above, after the sign */
        const bool rem = d % 10 != 0;
        d /= 10;
        if (rem) {
            *exact = false;
            if (up != neg) d += 1; /* magnitude up: the value up when positive, down when negative */
        }
    }
    if (d > limit) d = limit + 1, *exact = false;
    return neg ? -d : d;
}

jd_num jd_gcd(jd_num a, jd_num b) {
    while (b) {
        const jd_num r = a % b;
        a = b;
        b = r;
    }
    return a;
}
