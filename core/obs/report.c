/* The metrics report, in the text format of PyTorch/XLA's metrics_report()
 * so existing habits (and scripts that grep it) carry over:
 *
 *   Metric: CompileTime
 *     TotalSamples: 3
 *     Accumulator: 412ms031.201us
 *     ValueRate: 180ms513.002us / second
 *     Rate: 1.31342 / second
 *     Percentiles: 1%=002ms120.015us; 5%=...; 99%=399ms010.000us
 *   Counter: CachedCompile
 *     Value: 19
 *
 * Metrics whose name ends in "Time" are seconds and print as d/h/m/s/ms/us;
 * names containing "Bytes" print as B/KB/MB/...; others as plain numbers.
 * Percentiles and rates come from the last CX_METRIC_SAMPLES samples. */
#include "obs_internal.h"

#include <cxla/metrics.h>

#include <math.h>
#include <stdarg.h>

static char *sb_finish(cx_sbuf *b)
{
    char *s = cx_sb_finish(b);
    if (!s) cx_set_last_error("metrics report: out of memory");
    return s;
}

/* ---- value formatting ---------------------------------------------------------- */

typedef enum { FMT_TIME, FMT_BYTES, FMT_VALUE } value_fmt;

static value_fmt fmt_of(const char *name)
{
    size_t n = strlen(name);
    if (n >= 4 && !strcmp(name + n - 4, "Time")) return FMT_TIME;
    if (strstr(name, "Bytes")) return FMT_BYTES;
    return FMT_VALUE;
}

/* 1h02m03s004ms005.006us: the leading unit is the largest non-zero one, the
 * following ones are zero padded, microseconds keep three decimals. */
static void fmt_time(cx_sbuf *b, double seconds)
{
    static const struct { const char *suffix; double scale; int width; } parts[] = {
        { "d", 86400.0, 2 }, { "h", 3600.0, 2 }, { "m", 60.0, 2 }, { "s", 1.0, 2 }, { "ms", 1e-3, 3 },
    };
    if (!(seconds >= 0) || isinf(seconds)) { cx_sb_printf(b, "%gs", seconds); return; }
    bool started = false;
    double rest = seconds;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        double whole = floor(rest / parts[i].scale);
        if (whole >= 1.0 || started) {
            cx_sb_printf(b, "%0*.0f%s", parts[i].width, whole, parts[i].suffix);
            rest -= whole * parts[i].scale;
            started = true;
        }
    }
    double us = rest * 1e6;
    if (us < 0) us = 0;
    if (started) cx_sb_printf(b, "%07.3fus", us);
    else cx_sb_printf(b, "%.3fus", us);
}

static void fmt_value(cx_sbuf *b, value_fmt f, double v)
{
    if (f == FMT_TIME) { fmt_time(b, v); return; }
    if (f == FMT_BYTES) {
        static const char *const suffix[] = { "B", "KB", "MB", "GB", "TB", "PB" };
        int i = 0;
        while (i < 5 && fabs(v) >= 1024.0) { v /= 1024.0; i++; }
        cx_sb_printf(b, "%.2f%s", v, suffix[i]);
        return;
    }
    cx_sb_printf(b, "%.2f", v);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void emit_metric(cx_sbuf *b, const cx_metric_snap *m)
{
    value_fmt f = fmt_of(m->name);
    cx_sb_printf(b, "Metric: %s\n  TotalSamples: %lld\n  Accumulator: ", m->name, (long long)m->stats.total_samples);
    fmt_value(b, f, m->stats.accumulator);
    cx_sb_printf(b, "\n");
    int n = m->nsamples;
    if (n > 1) {
        double total = 0;
        for (int i = 0; i < n; i++) total += m->samples[2 * i];
        double span = m->samples[2 * (n - 1) + 1] - m->samples[1];
        if (span > 0) {
            cx_sb_printf(b, "  ValueRate: ");
            fmt_value(b, f, total / span);
            cx_sb_printf(b, " / second\n  Rate: %g / second\n", (double)n / span);
        }
    }
    if (n > 0) {
        double *v = malloc(sizeof(double) * (size_t)n);
        if (!v) { b->oom = true; return; }
        for (int i = 0; i < n; i++) v[i] = m->samples[2 * i];
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        static const double pct[] = { 0.01, 0.05, 0.10, 0.20, 0.50, 0.80, 0.90, 0.95, 0.99 };
        cx_sb_printf(b, "  Percentiles: ");
        for (size_t i = 0; i < sizeof pct / sizeof *pct; i++) {
            size_t at = (size_t)(pct[i] * n);
            if (at >= (size_t)n) at = (size_t)n - 1;
            cx_sb_printf(b, "%s%g%%=", i ? "; " : "", pct[i] * 100.0);
            fmt_value(b, f, v[at]);
        }
        cx_sb_printf(b, "\n");
        free(v);
    }
}

static int cmp_snap(const void *a, const void *b)
{
    return strcmp(((const cx_metric_snap *)a)->name, ((const cx_metric_snap *)b)->name);
}

static bool in_list(const char *name, const char *const *list, int n)
{
    for (int i = 0; i < n; i++) if (list[i] && !strcmp(list[i], name)) return true;
    return false;
}

/* lists == NULL with all == true: every entry */
static char *report(bool all, const char *const *counters, int nc, const char *const *metrics, int nm)
{
    cx_metric_snap *s;
    int n = cx_metrics_snapshot(&s);
    if (n < 0) { cx_set_last_error("metrics report: out of memory"); return NULL; }
    qsort(s, (size_t)n, sizeof *s, cmp_snap);
    cx_sbuf b = { 0 };
    for (int i = 0; i < n; i++)
        if (!s[i].is_counter && s[i].stats.total_samples > 0 && (all || in_list(s[i].name, metrics, nm)))
            emit_metric(&b, &s[i]);
    for (int i = 0; i < n; i++)
        if (s[i].is_counter && s[i].value != 0 && (all || in_list(s[i].name, counters, nc)))
            cx_sb_printf(&b, "Counter: %s\n  Value: %lld\n", s[i].name, (long long)s[i].value);
    cx_metrics_snapshot_free(s, n);
    return sb_finish(&b);
}

char *cx_metrics_report(void) { return report(true, NULL, 0, NULL, 0); }

char *cx_short_metrics_report(const char *const *counter_names, int ncounters, const char *const *metric_names,
                              int nmetrics)
{
    static const char *const dc[] = { "CachedCompile", "MarkStep" };
    static const char *const dm[] = { "CompileTime", "ExecuteTime", "TransferToDeviceTime", "TransferFromDeviceTime" };
    if (!counter_names) { counter_names = dc; ncounters = 2; }
    if (!metric_names) { metric_names = dm; nmetrics = 4; }
    return report(false, counter_names, ncounters, metric_names, nmetrics);
}

static int names(bool counters, const char **out, int cap)
{
    cx_metric_snap *s;
    int n = cx_metrics_snapshot(&s);
    if (n < 0) return 0;
    qsort(s, (size_t)n, sizeof *s, cmp_snap);
    int k = 0;
    for (int i = 0; i < n; i++) {
        bool live = counters ? (s[i].is_counter && s[i].value != 0) : (!s[i].is_counter && s[i].stats.total_samples > 0);
        if (!live) continue;
        if (out && k < cap) out[k] = s[i].name;
        k++;
    }
    cx_metrics_snapshot_free(s, n);
    return k;
}

int cx_counter_names(const char **out, int cap) { return names(true, out, cap); }
int cx_metric_names(const char **out, int cap) { return names(false, out, cap); }

/* ---- XLA_METRICS_FILE ------------------------------------------------------------- */

/* XLA_METRICS_FILE: "[MetricsData; step=N]" and the report after every step. */
static void metrics_file_step(void)
{
    static int64_t step;
    const char *path = cx_obs_cfg.metrics_path;
    step++;
    char *r = cx_metrics_report();
    if (!r) return;
    FILE *f = NULL;
    bool close_it = false;
    if (!strcmp(path, "STDOUT")) f = stdout;
    else if (!strcmp(path, "STDERR")) f = stderr;
    else {
        char full[4096];
        cx_obs_rank_path(full, sizeof full, path);
        f = fopen(full, "a");
        close_it = true;
    }
    if (f) {
        fprintf(f, "[MetricsData; step=%lld]\n%s\n", (long long)step, r);
        if (close_it) fclose(f); else fflush(f);
    }
    free(r);
}

__attribute__((constructor)) static void register_metrics_file(void) { cx_obs_hooks.metrics_file = metrics_file_step; }
