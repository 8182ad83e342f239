/* cxla metrics: counters and timing metrics (torch_xla.debug.metrics), and
 * the report in PyTorch/XLA's format. The library counts CachedCompile,
 * UncachedCompile, MarkStep, CreateDataHandles, CollectiveCount, ... and
 * times CompileTime, ExecuteTime, SyncTime, TransferToDeviceTime,
 * TransferFromDeviceTime, CollectiveTime, ...; programs may add their own.
 * XLA_METRICS_FILE (debug.h) appends the report at every step end.
 *
 * Threads: the registry is under one lock, so every function here may be
 * called from any thread. Ownership: the two reports are the caller's, to
 * release with free(); the names cx_counter_names and cx_metric_names give
 * live as long as the process. */
#ifndef CXLA_METRICS_H
#define CXLA_METRICS_H

#include <cxla/core.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- counters and metrics ------------------------------------------------ */

/* @return the counter's value (0 if it never counted). */
CX_API int64_t cx_counter_value(const char *name);
typedef struct {
    int64_t total_samples;
    double accumulator;    /* seconds for timers, raw sum otherwise */
    double last;
    double min, max;
} cx_metric_stats;
/* @return true and fills `out` if the metric has samples. */
CX_API bool cx_metric_data(const char *name, cx_metric_stats *out);
CX_API void cx_counter_add(const char *name, int64_t delta);
CX_API void cx_metric_add(const char *name, double value);
/* Clears counters, metrics and samples. */
CX_API void cx_metrics_clear(void);

/* ---- metrics report ------------------------------------------------------ */

/* The full report in PyTorch/XLA's format: every metric with samples
 * ("Metric: NAME", TotalSamples, Accumulator, ValueRate, Rate, Percentiles)
 * then every non-zero counter ("Counter: NAME", Value), each sorted by name.
 * @return a malloc'd string (free() it), or NULL when out of memory. */
CX_API char *cx_metrics_report(void);
/* The same for a few names; NULL lists mean PyTorch/XLA's defaults
 * (counters CachedCompile, MarkStep; metrics CompileTime, ExecuteTime,
 * TransferToDeviceTime, TransferFromDeviceTime). @return as
 * cx_metrics_report: free() it. */
CX_API char *cx_short_metrics_report(const char *const *counter_names, int ncounters,
                              const char *const *metric_names, int nmetrics);
/* Names of the non-zero counters / the metrics with samples, sorted. Fills
 * up to `cap` entries of `names` (may be NULL with cap 0); the strings live
 * as long as the process. @return the total number of names. */
CX_API int cx_counter_names(const char **names, int cap);
CX_API int cx_metric_names(const char **names, int cap);

#ifdef __cplusplus
}
#endif
#endif
