/* cxla debugging: IR dumps, the debug analysis, and the call-site entry
 * points. Metrics are in metrics.h, the profiler in profiler.h, the
 * persistent compile cache in cache.h.
 *
 * Environment variables (read at the first sync, or by cx_debug_reload_env):
 *   XLA_METRICS_FILE=PATH|STDOUT|STDERR  append "[MetricsData; step=N]" and
 *       the metrics report at every step end (".<rank>" suffix on PATH when
 *       the world has more than one rank)
 *   XLA_SAVE_TENSORS_FILE=PATH, XLA_SAVE_TENSORS_FMT=text|dot|hlo  append
 *       one record per executed graph (".<rank>" suffix as above); hlo:
 *       the lowered program instead of the IR (and cx_ir_text returns it)
 *   PT_XLA_DEBUG_LEVEL=1|2  compilation analysis (1), plus execution
 *       analysis (2), and the "too frequent" warnings; only local rank 0
 *       prints unless CX_DEBUG_ALL_RANKS=1; PT_XLA_DEBUG_FILE=PATH appends
 *       it to a file (".<rank>" suffix as above) instead of stderr. A
 *       compilation of a graph like one compiled in an earlier step names
 *       the closest such graph and what differs: an input's shape or dtype,
 *       a constant (a float baked into the graph), a sharding, the set of
 *       live tensors
 *   XLA_IR_DEBUG=1  each IR node records the user's call site (the first
 *       frame outside libcxla, as function, file and line for a program
 *       built with -g), shown in the IR dumps, the analysis above (the
 *       lines that made a graph's outputs, and those of changed inputs)
 *       and the desync message; a node the same op on the same inputs finds again
 *       (interning) keeps the line that made it first
 *   XLA_HLO_DEBUG=1  with XLA_IR_DEBUG: the program dumps name each op's line
 *   XLA_FLAGS=--xla_dump_to=DIR or CX_DUMP_DIR=DIR  every compilation writes
 *       DIR/cxla_<graph hash>.r<rank>.captured.txt, .partitioned.txt
 *       (SPMD) and .program.txt (kernels with their fused ops, shapes and
 *       paths, collectives, the arena plan, aliasing, the key's parts); a
 *       program loaded from the persistent cache was not compiled and is
 *       not written
 *   XLA_SAVE_HLO_FILE=PATH  a graph whose compile or run fails is written
 *       to PATH (".<rank>" suffix as above; else into the dump directory,
 *       if set), and the error, cx_last_error(), ends with "(graph saved
 *       to PATH)"
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
 * with addr2line). libcxla's own sources never get the macros (its build
 * defines CX_BUILDING_LIBRARY): a sync inside the library, in the DDP wrap
 * say, must not be named as the user's line, nor overwrite the line of the
 * user's call it happens within.
 */
#ifndef CXLA_DEBUG_H
#define CXLA_DEBUG_H

#include <cxla/core.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- IR dumps --------------------------------------------------------------- */

/* The pending graph of `n` tensors (nothing runs), as text ("IR { ... }",
 * one "%i = f32[2,3] op(%a, %b), attrs" line per node, ROOT=k on the
 * outputs) or as a Graphviz digraph. Materialized tensors show as a
 * device_data leaf. With XLA_SAVE_TENSORS_FMT=hlo, cx_ir_text compiles the
 * graph (nothing runs or is cached) and returns the lowered program as the
 * dump directory's .program.txt shows it, without the buffer donation a
 * sync plans for cx_assign'd outputs (those show in the dumps of a run). They read the graph, so call
 * them on the training thread (core.h). @return a malloc'd string (free()
 * it), or NULL when out of memory or (hlo) when the graph cannot be
 * compiled, with the error set. */
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

#if !defined(CX_NO_CALLSITE_MACROS) && !defined(CX_BUILDING_LIBRARY)
#define cx_sync() cx_sync_at(__FILE__, __LINE__)
#define cx_step_end() cx_step_end_at(__FILE__, __LINE__)
#define cx_item(t) cx_item_at((t), __FILE__, __LINE__)
#endif

#ifdef __cplusplus
}
#endif
#endif
