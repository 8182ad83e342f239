/* Observability hooks: what the core's hot paths (sync, the executor, host
 * transfers) tell the observers in core/obs/ (debug analysis, graph dumps,
 * the profiler, the metrics file, the persistent compile cache).
 *
 * The core never calls an observer directly. Each observer registers its
 * hooks in this table (at load time, or when the user turns it on: the
 * persistent cache, the profiler), the same pattern as the comm backend, and
 * sets the flag bits that say a hook wants to hear. With nothing turned on, a
 * sync pays a few predictable branches on cx_obs_get(). */
#ifndef CX_OBS_H
#define CX_OBS_H

#include "base.h"

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
    OBS_IR_DEBUG = 1 << 8,      /* XLA_IR_DEBUG: nodes record the user's line */
    OBS_PROGRAM_DUMP = 1 << 9,  /* XLA_FLAGS=--xla_dump_to / CX_DUMP_DIR: every compilation is written out */
    OBS_SAVE_FAILED = 1 << 10,  /* XLA_SAVE_HLO_FILE or a dump directory: a failing graph is written out */
    OBS_PROFILE_SERVER = 1 << 11, /* CX_PROFILE_PORT: start the profile server at the next step end */
};

struct cx_node;
struct cx_executable;
struct cx_graph;
struct cx_spmd_notes;

/* One executed graph, as the observers see it. source: 0 in-memory cache
 * hit, 1 compiled, 2 persistent cache hit. */
typedef struct {
    const char *cause;
    uint64_t key_hi, key_lo;
    struct cx_node *const *nodes;      /* topological, node->index = position */
    int n;
    struct cx_node *const *outs;
    int nouts;
    const struct cx_executable *e;
    int source;
} cx_obs_graph_info;

/* One compilation, successful or not: the captured graph (IR), the graph
 * the passes lowered (partitioned under SPMD; NULL when compiling failed
 * before it was made) and the executable (NULL when lowering failed). */
typedef struct {
    uint64_t key_hi, key_lo;
    struct cx_node *const *nodes;      /* topological, node->index = position */
    int n;
    struct cx_node *const *outs;
    int nouts;
    const struct cx_graph *lowered;
    bool partitioned;
    const struct cx_spmd_notes *notes;
    const struct cx_executable *e;
} cx_obs_program_info;

typedef struct {
    /* reads the environment once, at the first sync (obs/env.c) */
    void (*env)(void);
    /* a graph is about to run: debug analysis (obs/analysis.c) and the
     * XLA_SAVE_TENSORS_FILE record (obs/dump.c) */
    void (*analysis)(const cx_obs_graph_info *g);
    void (*dump)(const cx_obs_graph_info *g);
    /* a step's graph ran: XLA_METRICS_FILE (obs/report.c), the "too
     * frequent" warnings (obs/analysis.c) */
    void (*metrics_file)(void);
    void (*step_warnings)(void);
    /* the persistent cache (obs/disk_cache.c): an executable for the key or
     * NULL; a real compile to store */
    struct cx_executable *(*cache_load)(uint64_t key_hi, uint64_t key_lo);
    void (*compiled)(const struct cx_executable *e);
    /* the profiler (obs/trace.c): a complete event [t0, t1] on the calling
     * thread; args a JSON object body ("\"bytes\": 12") or NULL */
    void (*trace)(const char *cat, const char *name, double t0, double t1, const char *args);
    /* XLA_IR_DEBUG (obs/site.c): the caller's first frame outside libcxla
     * as a location index (0: none), and a location as "file:line" */
    uint32_t (*site)(void);
    void (*site_str)(uint32_t loc, char *buf, size_t cap);
    /* every compilation, when a dump directory is set (obs/program_dump.c) */
    void (*program)(const cx_obs_program_info *p);
    /* a graph whose compile or run failed with st: written out, and the
     * error extended with the file's name (obs/program_dump.c) */
    void (*failed)(const cx_obs_graph_info *g, cx_status st);
    /* the profile server (obs/profile_server.c), started at a step end,
     * when the comm backend knows the local rank its port depends on */
    void (*profile_server)(void);
} cx_obs_hook_table;

extern cx_obs_hook_table cx_obs_hooks;
extern _Atomic int cx_obs_flags;

void cx_obs_init(void);
void cx_obs_set(int bit, bool on);

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

/* A profiler event, when a trace records. */
static inline void cx_obs_trace(const char *cat, const char *name, double t0, double t1, const char *args)
{
    if ((cx_obs_get() & OBS_TRACE) && cx_obs_hooks.trace) cx_obs_hooks.trace(cat, name, t0, t1, args);
}

/* ---- metrics registry snapshot (metrics.c), for the report ---- */

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

#endif
