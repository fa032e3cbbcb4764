/* runtime/timing.h — monotonic wall clock in seconds (for summaries and benchmarks). */
#ifndef ORCHID_TIMING_H
#define ORCHID_TIMING_H

#include <time.h>

static inline double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
