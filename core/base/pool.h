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

/* Affine claims of the items [0, n) of a cx_pool_run_each job: one
 * contiguous range per part (thread), which its thread takes from the
 * front, in order, before it takes items from the back of the others'
 * ranges. While the threads keep pace, item i goes to the same thread in
 * every kernel that splits the same n, so an image's data stays in the
 * caches of the CPU that wrote it (when the host puts the two vCPUs on
 * different dies, data written by the other one is a cross-die read);
 * a thread that falls behind, or wakes late, still gets help. */
#define CX_CLAIM_PARTS 16
typedef struct {
    struct {
        _Alignas(64) _Atomic uint64_t range;   /* front (low 32 bits) and back (high 32 bits) */
    } part[CX_CLAIM_PARTS];
    int parts;
} cx_claims;
/* Splits [0, n) into min(threads, CX_CLAIM_PARTS) ranges. n < 2^32. */
void cx_claims_init(cx_claims *c, int64_t n, int64_t threads);
/* @return thread tid's next item (its own range's front first), or -1
 * when every item has been taken */
int64_t cx_claims_next(cx_claims *c, int64_t tid);

/* Stops the workers (tests, shutdown); the pool restarts on next use. */
void cx_pool_shutdown(void);

#endif
