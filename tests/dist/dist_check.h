/* Tiny assertion helpers for multi-rank test programs. */
#ifndef DIST_CHECK_H
#define DIST_CHECK_H

#include <cxla/cxla.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int g_failures;

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                  \
            fprintf(stderr, __VA_ARGS__);                                         \
            fprintf(stderr, "\n");                                                \
            g_failures++;                                                         \
        }                                                                         \
    } while (0)

static inline bool close_rel(double a, double b, double tol)
{
    return fabs(a - b) <= tol * fmax(1.0, fmax(fabs(a), fabs(b)));
}

static inline int dist_finish(const char *name)
{
    int r = cx_global_ordinal();
    if (g_failures) fprintf(stderr, "%s: rank %d: %d check(s) failed\n", name, r, g_failures);
    else if (r == 0) printf("%s: all checks passed on %d ranks\n", name, cx_world_size());
    cx_dist_finalize();
    return g_failures ? 1 : 0;
}

#endif
