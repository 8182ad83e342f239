/* cxla observability and debugging: the metrics report, IR dumps, the debug
 * analysis, step closures, the profiler and the persistent compile cache.
 *
 * Environment variables (read at the first sync, or by cx_debug_reload_env):
 *   XLA_METRICS_FILE=PATH|STDOUT|STDERR  append "[MetricsData; step=N]" and
 *       the metrics report at every step end (".<rank>" suffix on PATH when
 *       the world has more than one rank)
 *   XLA_SAVE_TENSORS_FILE=PATH, XLA_SAVE_TENSORS_FMT=text|dot  append one
 *       record per executed graph (".<rank>" suffix as above)
 *   PT_XLA_DEBUG_LEVEL=1|2  compilation analysis (1), plus execution
 *       analysis (2), and the "too frequent" warnings; only local rank 0
 *       prints unless CX_DEBUG_ALL_RANKS=1; PT_XLA_DEBUG_FILE=PATH appends
 *       it to a file (".<rank>" suffix as above) instead of stderr
 *   XLA_USE_EAGER_DEBUG_MODE=1  every op runs when it is recorded
 *   CX_CACHE_DIR=DIR  the persistent compile cache (as cx_cache_init(DIR,
 *       false); CX_CACHE_READONLY=1 makes it read-only)
 *   XLA_FLAGS, CX_COMPILE_OPTIONS  compile options: part of every cache key
 *
 * Call sites: with this header included, cx_sync(), cx_step_end() and
 * cx_item() are macros that pass __FILE__/__LINE__ to the *_at variants, so
 * the debug analysis names the line that caused an execution. Define
 * CX_NO_CALLSITE_MACROS before including to get the plain functions; the
 * analysis then names the calling function from the C stack (dladdr, which
 * sees exported symbols; other frames print as module+offset, resolvable
 * with addr2line).
 */
#ifndef CXLA_DEBUG_H
#define CXLA_DEBUG_H

#include <cxla/core.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- metrics report ------------------------------------------------------ */

/* The full report in PyTorch/XLA's format: every metric with samples
 * ("Metric: NAME", TotalSamples, Accumulator, ValueRate, Rate, Percentiles)
 * then every non-zero counter ("Counter: NAME", Value), each sorted by name.
 * @return a malloc'd string (free() it), or NULL when out of memory. */
CX_API char *cx_metrics_report(void);
/* The same for a few names; NULL lists mean PyTorch/XLA's defaults
 * (counters CachedCompile, MarkStep; metrics CompileTime, ExecuteTime,
 * TransferToDeviceTime, TransferFromDeviceTime). */
CX_API char *cx_short_metrics_report(const char *const *counter_names, int ncounters,
                              const char *const *metric_names, int nmetrics);
/* Names of the non-zero counters / the metrics with samples, sorted. Fills
 * up to `cap` entries of `names` (may be NULL with cap 0); the strings live
 * as long as the process. @return the total number of names. */
CX_API int cx_counter_names(const char **names, int cap);
CX_API int cx_metric_names(const char **names, int cap);
/* (cx_metrics_clear() in core.h clears counters, metrics and samples.) */

/* ---- IR dumps --------------------------------------------------------------- */

/* The pending graph of `n` tensors (nothing runs), as text ("IR { ... }",
 * one "%i = f32[2,3] op(%a, %b), attrs" line per node, ROOT=k on the
 * outputs) or as a Graphviz digraph. Materialized tensors show as a
 * device_data leaf. @return a malloc'd string, or NULL when out of memory. */
CX_API char *cx_ir_text(cx_tensor *const *ts, int n);
CX_API char *cx_ir_dot(cx_tensor *const *ts, int n);

/* ---- debug configuration ------------------------------------------------------ */

/* Reads the environment variables above again (they are otherwise read
 * once, at the first sync). */
CX_API void cx_debug_reload_env(void);
/* @return PT_XLA_DEBUG_LEVEL as configured (0 = off). */
CX_API int cx_debug_level(void);

/* ---- call sites ------------------------------------------------------------------- */

CX_API cx_status cx_sync_at(const char *file, int line);
CX_API cx_status cx_step_end_at(const char *file, int line);
CX_API double cx_item_at(cx_tensor *t, const char *file, int line);

#ifndef CX_NO_CALLSITE_MACROS
#define cx_sync() cx_sync_at(__FILE__, __LINE__)
#define cx_step_end() cx_step_end_at(__FILE__, __LINE__)
#define cx_item(t) cx_item_at((t), __FILE__, __LINE__)
#endif

/* ---- step closures ----------------------------------------------------------------- */

typedef void (*cx_step_closure_fn)(void *arg);
/* Runs fn(arg) after the current step's graph has run and materialized (at
 * the next cx_step_end), in the order added; tensors kept for the step can
 * be read in it without another execution. run_async: run on a background
 * thread instead (still in order among the async closures).
 * @return CX_OK, CX_ERR_ARG (fn NULL) or CX_ERR_OOM. */
CX_API cx_status cx_add_step_closure(cx_step_closure_fn fn, void *arg, bool run_async);
/* Waits until every async closure added so far has run. */
CX_API void cx_wait_step_closures(void);

/* ---- profiler ------------------------------------------------------------------------ */

/* Starts recording compile, execute, kernel, transfer, collective and user
 * events; cx_trace_stop writes them as a Chrome trace-event JSON to
 * DIR/proc_<rank>/trace.json (open it in Perfetto or chrome://tracing).
 * @return CX_OK, CX_ERR_STATE (already tracing / not tracing), CX_ERR_IO. */
CX_API cx_status cx_trace_start(const char *dir);
CX_API cx_status cx_trace_stop(void);
CX_API bool cx_trace_active(void);
/* A named user region on this thread. push returns whether it was recorded;
 * pop closes the innermost recorded region (no-op when there is none). */
CX_API bool cx_trace_push(const char *name);
CX_API void cx_trace_pop(void);

static inline void cx_trace_scope_end_(bool *recorded)
{
    if (*recorded) cx_trace_pop();
}
#define CX_TRACE_CAT2_(a, b) a##b
#define CX_TRACE_CAT_(a, b) CX_TRACE_CAT2_(a, b)
/* A region that lasts until the end of the enclosing block:
 *     { CX_TRACE("forward"); ... }                                         */
#define CX_TRACE(name)                                                                  \
    __attribute__((cleanup(cx_trace_scope_end_), unused)) bool CX_TRACE_CAT_(cx_trace_scope_, \
                                                                             __LINE__) = cx_trace_push(name)

/* ---- persistent compile cache --------------------------------------------------------- */

/* Keeps compiled executables in `path` (created if missing), one
 * zstd-compressed file per graph key, shared safely by several processes.
 * readonly: look up but never write. Must be called before any
 * computation. @return CX_OK, CX_ERR_STATE (too late, or already
 * initialized with another path), CX_ERR_IO (cannot create the directory). */
CX_API cx_status cx_cache_init(const char *path, bool readonly);
/* @return the cache directory, or NULL when there is none. */
CX_API const char *cx_cache_dir(void);
/* Compile options: a free-form string that is part of every cache key
 * (default: $XLA_FLAGS and $CX_COMPILE_OPTIONS). Changing it never reuses
 * an executable compiled under other options. */
CX_API void cx_set_compile_options(const char *opts);
CX_API const char *cx_get_compile_options(void);

#ifdef __cplusplus
}
#endif
#endif
