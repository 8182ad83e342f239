/* Monotonic seconds, for timing and metrics in every layer. */
#ifndef CX_UTIL_TIME_H
#define CX_UTIL_TIME_H

#include <time.h>

static inline double cx_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
