/* A small fork-join pool. Workers spin briefly then sleep on a condition
 * variable: kernels in a step come back to back, so a short spin avoids a
 * futex round trip per kernel without burning a core between steps. */
#include "pool.h"
#include <cxla/core.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#define CX_POOL_MAX 256

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    int nthreads;                 /* including the caller */
    pthread_t tids[CX_POOL_MAX];
    atomic_uint_fast64_t generation;
    uint64_t start_generation;    /* generation when the workers were created */
    atomic_int remaining;
    void (*job)(void *ctx, int64_t tid, int64_t nthreads);
    void *job_ctx;
    int stop;
    int started;
} cx_pool;

static cx_pool g_pool = { .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
                          .done = PTHREAD_COND_INITIALIZER };
static _Thread_local int t_in_pool_job;
static pthread_mutex_t g_dispatch = PTHREAD_MUTEX_INITIALIZER;

static void *worker_main(void *arg)
{
    int64_t tid = (int64_t)(intptr_t)arg;
    /* The generation keeps counting across restarts of the pool: a worker
     * that started from 0 would take the last job of an earlier pool (its
     * context long gone) for a new one. pool_start records the count
     * before creating the workers, and pthread_create publishes it. */
    uint64_t seen = g_pool.start_generation;
    t_in_pool_job = 1;
    for (;;) {
        uint64_t gen = 0;
        for (int spin = 0; spin < 20000; spin++) {
            gen = atomic_load_explicit(&g_pool.generation, memory_order_acquire);
            if (gen != seen) break;
        }
        if (gen == seen) {
            pthread_mutex_lock(&g_pool.mu);
            while (!g_pool.stop && (gen = atomic_load(&g_pool.generation)) == seen)
                pthread_cond_wait(&g_pool.wake, &g_pool.mu);
            pthread_mutex_unlock(&g_pool.mu);
        }
        if (g_pool.stop) return NULL;
        seen = gen;
        g_pool.job(g_pool.job_ctx, tid, g_pool.nthreads);
        if (atomic_fetch_sub(&g_pool.remaining, 1) == 1) {
            pthread_mutex_lock(&g_pool.mu);
            pthread_cond_signal(&g_pool.done);
            pthread_mutex_unlock(&g_pool.mu);
        }
    }
}

static void pool_start(void)
{
    int n = cx_get_num_threads();
    if (n > CX_POOL_MAX) n = CX_POOL_MAX;
    g_pool.nthreads = n;
    g_pool.stop = 0;
    g_pool.start_generation = atomic_load(&g_pool.generation);
    int started = 1;
    for (int i = 1; i < n; i++) {
        if (pthread_create(&g_pool.tids[i], NULL, worker_main, (void *)(intptr_t)i) != 0) break;
        started++;
    }
    g_pool.nthreads = started; /* degrade gracefully if threads cannot start */
    g_pool.started = 1;
}

void cx_pool_shutdown(void)
{
    pthread_mutex_lock(&g_dispatch);
    if (g_pool.started) {
        pthread_mutex_lock(&g_pool.mu);
        g_pool.stop = 1;
        pthread_cond_broadcast(&g_pool.wake);
        pthread_mutex_unlock(&g_pool.mu);
        for (int i = 1; i < g_pool.nthreads; i++) pthread_join(g_pool.tids[i], NULL);
        g_pool.started = 0;
    }
    pthread_mutex_unlock(&g_dispatch);
}

int cx_pool_threads(void)
{
    /* what the next dispatch runs on: after cx_set_num_threads the pool
     * restarts with the new count, so the running pool's own is stale */
    int want = cx_get_num_threads();
    if (want > CX_POOL_MAX) want = CX_POOL_MAX;
    if (!g_pool.started || g_pool.nthreads != want) return want;
    return g_pool.nthreads;
}

void cx_pool_run_each(void (*fn)(void *ctx, int64_t tid, int64_t nthreads), void *ctx)
{
    if (t_in_pool_job) { fn(ctx, 0, 1); return; }
    pthread_mutex_lock(&g_dispatch);
    if (!g_pool.started || g_pool.nthreads != cx_get_num_threads()) {
        if (g_pool.started) {
            pthread_mutex_unlock(&g_dispatch);
            cx_pool_shutdown();
            pthread_mutex_lock(&g_dispatch);
        }
        pool_start();
    }
    if (g_pool.nthreads == 1) {
        pthread_mutex_unlock(&g_dispatch);
        t_in_pool_job = 1;
        fn(ctx, 0, 1);
        t_in_pool_job = 0;
        return;
    }
    g_pool.job = fn;
    g_pool.job_ctx = ctx;
    atomic_store(&g_pool.remaining, g_pool.nthreads - 1);
    pthread_mutex_lock(&g_pool.mu);
    atomic_fetch_add_explicit(&g_pool.generation, 1, memory_order_release);
    pthread_cond_broadcast(&g_pool.wake);
    pthread_mutex_unlock(&g_pool.mu);
    t_in_pool_job = 1;
    fn(ctx, 0, g_pool.nthreads);
    t_in_pool_job = 0;
    for (int spin = 0; spin < 200000 && atomic_load(&g_pool.remaining) > 0; spin++) {}
    if (atomic_load(&g_pool.remaining) > 0) {
        pthread_mutex_lock(&g_pool.mu);
        while (atomic_load(&g_pool.remaining) > 0) pthread_cond_wait(&g_pool.done, &g_pool.mu);
        pthread_mutex_unlock(&g_pool.mu);
    }
    pthread_mutex_unlock(&g_dispatch);
}

typedef struct {
    int64_t n, grain;
    cx_range_fn fn;
    void *ctx;
} range_job;

static void range_each(void *p, int64_t tid, int64_t nthreads)
{
    range_job *j = p;
    int64_t chunks = j->n / (j->grain > 0 ? j->grain : 1);
    if (chunks < 1) chunks = 1;
    if (chunks > nthreads) chunks = nthreads;
    if (tid >= chunks) return;
    int64_t b = j->n * tid / chunks, e = j->n * (tid + 1) / chunks;
    if (b < e) j->fn(j->ctx, b, e);
}

void cx_pool_parallel_for(int64_t n, int64_t grain, cx_range_fn fn, void *ctx)
{
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (n < 2 * grain || t_in_pool_job || cx_get_num_threads() == 1) { fn(ctx, 0, n); return; }
    range_job j = { n, grain, fn, ctx };
    cx_pool_run_each(range_each, &j);
}

void cx_claims_init(cx_claims *c, int64_t n, int64_t threads)
{
    c->parts = (int)(threads < 1 ? 1 : threads > CX_CLAIM_PARTS ? CX_CLAIM_PARTS : threads);
    for (int p = 0; p < c->parts; p++) {
        uint64_t lo = (uint64_t)(n * p / c->parts), hi = (uint64_t)(n * (p + 1) / c->parts);
        atomic_init(&c->part[p].range, lo | hi << 32);
    }
}

/* one item off the front (own) or the back (taken from another), or -1 */
static int64_t claim_from(cx_claims *c, int p, bool front)
{
    uint64_t r = atomic_load_explicit(&c->part[p].range, memory_order_relaxed);
    for (;;) {
        uint64_t lo = r & 0xffffffffu, hi = r >> 32;
        if (lo >= hi) return -1;
        uint64_t next = front ? (lo + 1) | hi << 32 : lo | (hi - 1) << 32;
        if (atomic_compare_exchange_weak_explicit(&c->part[p].range, &r, next, memory_order_relaxed,
                                                  memory_order_relaxed))
            return (int64_t)(front ? lo : hi - 1);
    }
}

int64_t cx_claims_next(cx_claims *c, int64_t tid)
{
    const int own = (int)(tid % c->parts);
    int64_t item = claim_from(c, own, true);
    for (int k = 1; item < 0 && k < c->parts; k++) item = claim_from(c, (own + k) % c->parts, false);
    return item;
}
