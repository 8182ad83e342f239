/* Worker pool: splits a loop [0, n) into contiguous chunks across the
 * compute threads. The calling thread takes part; calls do not nest (a
 * parallel_for inside a worker runs serially). */
#ifndef CX_POOL_H
#define CX_POOL_H

#include <stdint.h>

typedef void (*cx_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Runs fn over [0, n) split into at most num_threads chunks of at least
 * `grain` iterations each. */
void cx_pool_parallel_for(int64_t n, int64_t grain, cx_range_fn fn, void *ctx);
/* The number of threads the next dispatch runs on (cx_pool_run_each may
 * still start fewer when the system refuses a thread). */
int cx_pool_threads(void);
/* Runs fn(ctx, t, nthreads) once on each of the pool's threads (t = 0 is
 * the caller). */
void cx_pool_run_each(void (*fn)(void *ctx, int64_t tid, int64_t nthreads), void *ctx);
/* Stops the workers (tests, shutdown); the pool restarts on next use. */
void cx_pool_shutdown(void);

#endif
