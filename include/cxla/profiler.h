/* cxla profiler (torch_xla.debug.profiler): compile, execute, kernel,
 * transfer, collective and user events as a Chrome trace per rank.
 *
 * Threads: events from any thread go into the one trace under a lock;
 * user regions (cx_trace_push / pop, CX_TRACE) nest per thread. `name` and
 * `dir` are copied. */
#ifndef CXLA_PROFILER_H
#define CXLA_PROFILER_H

#include <cxla/core.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- profiler ------------------------------------------------------------------------ */

/* Starts recording compile, execute, kernel, transfer, collective and user
 * events; cx_trace_stop writes them as a Chrome trace-event JSON to
 * DIR/proc_<rank>/trace.json (open it in Perfetto or chrome://tracing).
 * An event that was running when the trace started (an execute, a
 * collective in flight) is drawn from the trace's start, with
 * "began_before_trace": true in its args.
 * @return CX_OK, CX_ERR_STATE (already tracing / not tracing), CX_ERR_IO. */
CX_API cx_status cx_trace_start(const char *dir);
CX_API cx_status cx_trace_stop(void);
CX_API bool cx_trace_active(void);
/* Starts the profile server (xp.start_server): a thread listening on
 * 127.0.0.1, port `port` plus this rank's local rank (the ranks of a node
 * take consecutive ports), through which `xla-profile` captures a trace of
 * every rank while the job runs (DIR/proc_<rank>/trace.json, then one
 * merged DIR/trace.json). CX_PROFILE_PORT=PORT starts it at the first step
 * end. Calling it again with the same port is a no-op.
 * @return CX_OK, CX_ERR_ARG (port out of 1..65535), CX_ERR_STATE (a server
 * already listens on another port), CX_ERR_IO (the port is taken: the
 * error names it and the rank), CX_ERR_OOM. */
CX_API cx_status cx_profiler_start_server(int port);
/* @return the port the profile server listens on, 0 when none does. */
CX_API int cx_profiler_server_port(void);
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

#ifdef __cplusplus
}
#endif
#endif
