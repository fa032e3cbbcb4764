/* tests/unit/check.h — the tiny assertion harness every tests/unit/test_*.c uses.
 *
 * CHECK(cond, fmt, ...) records a pass or a failure (with file:line and the
 * formatted reason) and keeps going; CHECK_CLOSE compares floats with
 * |a-b| <= atol + rtol*|b|. A test file's main() ends with `return check_summary();`
 * which prints the standard closing line "N passed, N failed" and returns
 * non-zero when anything failed. scripts/run_tests.sh sums those lines. */
#ifndef ORCHID_TEST_CHECK_H
#define ORCHID_TEST_CHECK_H

#include <math.h>
#include <stdio.h>

static int check_passed_, check_failed_;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            check_passed_++;                                               \
        } else {                                                           \
            check_failed_++;                                               \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

#define CHECK_CLOSE(a, b, atol, rtol, what)                                          \
    do {                                                                             \
        double a_ = (a), b_ = (b);                                                   \
        CHECK(fabs(a_ - b_) <= (atol) + (rtol) * fabs(b_) && !isnan(a_),            \
              "%s: got %.9g want %.9g", (what), a_, b_);                             \
    } while (0)

static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed_, check_failed_);
    return check_failed_ ? 1 : 0;
}

#endif
