/* Observability hooks called from the core's hot paths (graph.c, exec.c,
 * tensor.c, ops_elementwise.c). Every hook sits behind one test of
 * cx_obs_flags, so with no debug variable set and no tracing a sync pays a
 * few predictable branches. Implementations: debug.c (env, analysis, dumps,
 * eager mode, closures), trace.c (profiler), disk_cache.c (persistent
 * cache), report.c (metrics report and file). */
#ifndef CX_OBS_H
#define CX_OBS_H

#include "exec.h"
#include "cx_sbuf.h"

#include <stdatomic.h>

enum {
    OBS_UNINIT = 1 << 0,        /* environment not read yet */
    OBS_EAGER = 1 << 1,         /* XLA_USE_EAGER_DEBUG_MODE */
    OBS_DEBUG = 1 << 2,         /* PT_XLA_DEBUG_LEVEL >= 1 */
    OBS_DUMP = 1 << 3,          /* XLA_SAVE_TENSORS_FILE */
    OBS_TRACE = 1 << 4,         /* cx_trace_start ... stop */
    OBS_METRICS_FILE = 1 << 5,  /* XLA_METRICS_FILE */
    OBS_DISK_CACHE = 1 << 6,    /* cx_cache_init / CX_CACHE_DIR */
    OBS_CLOSURES = 1 << 7,      /* step closures pending */
};

extern _Atomic int cx_obs_flags;

void cx_obs_init(void);

/* @return the flags, reading the environment on first use. */
static inline int cx_obs_get(void)
{
    int f = atomic_load_explicit(&cx_obs_flags, memory_order_relaxed);
    if (__builtin_expect(f & OBS_UNINIT, 0)) {
        cx_obs_init();
        f = atomic_load_explicit(&cx_obs_flags, memory_order_relaxed);
    }
    return f;
}
void cx_obs_set(int bit, bool on);

/* ---- metrics registry snapshot (metrics.c) ---- */

#define CX_METRIC_SAMPLES 1024
typedef struct {
    const char *name;
    bool is_counter;
    int64_t value;
    cx_metric_stats stats;
    double *samples;      /* nsamples (value, time) pairs, oldest first */
    int nsamples;
} cx_metric_snap;
/* @return the number of entries (registration order), -1 when out of memory. */
int cx_metrics_snapshot(cx_metric_snap **out);
void cx_metrics_snapshot_free(cx_metric_snap *s, int n);

/* ---- report.c ---- */

/* Appends "[MetricsData; step=N]" and the report to XLA_METRICS_FILE. */
void cx_obs_metrics_file_step(const char *path, int64_t step);

/* ---- debug.c ---- */

/* The cause of a cx_step_end called from `ra` ("loader" when the data
 * loader ended the step, else "step end"). */
const char *cx_obs_step_cause(void *ra);
/* After a step's sync: step closures, metrics file, frequency warnings. */
void cx_obs_step_end(cx_status st);
/* A graph is about to run (after compile or cache hit): debug analysis and
 * the XLA_SAVE_TENSORS_FILE record. source: 0 in-memory cache hit,
 * 1 compiled, 2 persistent cache hit. */
void cx_obs_graph(const char *cause, uint64_t key_hi, uint64_t key_lo, cx_node *const *nodes, int n,
                  cx_node *const *outs, int nouts, const cx_executable *e, int source);
/* Eager debug mode: computes t's node now and keeps the value on the node. */
void cx_obs_eager_run(cx_tensor *t);
/* Eager debug mode: a tensor whose node already holds its value becomes a
 * device-data tensor (no execution). */
void cx_obs_settle(cx_tensor *t);
/* The call site given by a *_at entry point on this thread (NULL if none). */
const char *cx_obs_site_file(int *line);

/* ---- disk_cache.c ---- */

/* The compile options string mixed into every key. */
const char *cx_obs_compile_options(void);
/* Persistent cache: @return the executable for the key (counts
 * PersistentCacheHit/Miss/DeserializeFailure), or NULL. */
cx_executable *cx_disk_cache_load(uint64_t key_hi, uint64_t key_lo);
/* Notes a real compile (cx_cache_init is refused afterwards) and stores it
 * in the persistent cache when one is writable. */
void cx_obs_compiled(const cx_executable *e);
/* Tests: feeds mutated payloads of a cache file to the validating loader.
 * @return how many it accepted, -1 if the file is unreadable. */
int cx_disk_cache_fuzz(const char *path, int iters, unsigned seed);

/* ---- trace.c ---- */

/* A complete event [t0, t1] (cx_now seconds) on the calling thread.
 * args: a JSON object body ("\"bytes\": 12") or NULL. */
void cx_trace_event(const char *cat, const char *name, double t0, double t1, const char *args);
/* Kernel kind names for trace events and dumps. */
const char *cx_kernel_kind_name(int kind);

#endif
