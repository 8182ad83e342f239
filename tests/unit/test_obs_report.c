/* The metrics report: PyTorch/XLA's format, non-zero entries only, name
 * listings, clear, the short report and XLA_METRICS_FILE. */
#include <criterion/criterion.h>

#include "test_obs_cnn.h"

static void run_small_steps(int n)
{
    for (int i = 0; i < n; i++) {
        cx_step_begin();
        cx_tensor *x = cx_from_host((float[]){ 1, 2, 3, 4 }, (int64_t[]){ 4 }, 1, CX_F32);
        cx_tensor *y = cx_keep(cx_sum(cx_mul_scalar(x, 2.0), NULL, 0, false));
        cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
        cr_assert_eq(cx_item(y), 20.0);
    }
}

/* the lines of the block that starts with `header`, up to the next
 * "Metric:"/"Counter:" line */
static char *block(const char *report, const char *header)
{
    const char *p = strstr(report, header);
    if (!p) return NULL;
    const char *end = p + strlen(header);
    while (*end) {
        const char *nl = strchr(end, '\n');
        if (!nl) { end += strlen(end); break; }
        end = nl + 1;
        if (!strncmp(end, "Metric: ", 8) || !strncmp(end, "Counter: ", 9)) break;
    }
    return strndup(p, (size_t)(end - p));
}

Test(obs_report, format_names_and_fields)
{
    run_small_steps(3);
    char *r = cx_metrics_report();
    cr_assert(r);
    char *ct = block(r, "Metric: CompileTime\n");
    cr_assert(ct, "no CompileTime in:\n%s", r);
    cr_expect(strstr(ct, "\n  TotalSamples: 1\n"), "%s", ct);
    cr_expect(strstr(ct, "\n  Accumulator: "), "%s", ct);
    cr_expect(strstr(ct, "us\n"), "times print in us: %s", ct);
    cr_expect(strstr(ct, "\n  Percentiles: 1%="), "%s", ct);
    cr_expect(strstr(ct, "; 50%=") && strstr(ct, "; 99%="), "%s", ct);
    char *et = block(r, "Metric: ExecuteTime\n");
    cr_assert(et, "%s", r);
    cr_expect(strstr(et, "\n  TotalSamples: 3\n"), "%s", et);
    cr_expect(strstr(et, "\n  ValueRate: ") && strstr(et, " / second\n  Rate: "), "%s", et);
    char *cc = block(r, "Counter: CachedCompile\n");
    cr_assert(cc, "%s", r);
    cr_expect(!strcmp(cc, "Counter: CachedCompile\n  Value: 2\n"), "'%s'", cc);
    cr_expect(strstr(r, "Counter: UncachedCompile\n  Value: 1\n"), "%s", r);
    cr_expect(strstr(r, "Counter: MarkStep\n  Value: 3\n"), "%s", r);
    /* metrics before counters, each sorted by name */
    cr_expect(strstr(r, "Metric: CompileTime") < strstr(r, "Metric: ExecuteTime"));
    cr_expect(strstr(r, "Metric: TransferToDeviceTime") < strstr(r, "Counter: CachedCompile"));
    cr_expect(strstr(r, "Counter: CachedCompile") < strstr(r, "Counter: MarkStep"));
    /* non-zero entries only */
    cx_counter_add("ObsNeverCounted", 0);
    char *r2 = cx_metrics_report();
    cr_expect(!strstr(r2, "ObsNeverCounted"));
    cr_expect(!strstr(r2, "PersistentCache"), "no persistent cache, no counters: %s", r2);

    const char *names[64];
    int nc = cx_counter_names(names, 64);
    cr_assert_gt(nc, 2);
    bool found = false;
    for (int i = 0; i < nc && i < 64; i++) {
        if (!strcmp(names[i], "CachedCompile")) found = true;
        cr_expect(strcmp(names[i], "ObsNeverCounted"));
        if (i) cr_expect_lt(strcmp(names[i - 1], names[i]), 0, "sorted");
    }
    cr_expect(found);
    int nm = cx_metric_names(names, 64);
    cr_expect_gt(nm, 2);
    cr_expect_eq(cx_metric_names(NULL, 0), nm);
    free(ct); free(et); free(cc); free(r); free(r2);
}

Test(obs_report, short_report_and_clear)
{
    run_small_steps(2);
    char *s = cx_short_metrics_report(NULL, 0, NULL, 0);
    cr_assert(s);
    cr_expect(strstr(s, "Metric: CompileTime\n"));
    cr_expect(strstr(s, "Metric: ExecuteTime\n"));
    cr_expect(strstr(s, "Counter: CachedCompile\n  Value: 1\n"), "%s", s);
    cr_expect(strstr(s, "Counter: MarkStep\n  Value: 2\n"), "%s", s);
    cr_expect(!strstr(s, "SyncTime"), "%s", s);
    cr_expect(!strstr(s, "CreateDataHandles"), "%s", s);
    const char *only[] = { "UncachedCompile" };
    char *s2 = cx_short_metrics_report(only, 1, only, 0);
    cr_expect(!strcmp(s2, "Counter: UncachedCompile\n  Value: 1\n"), "'%s'", s2);
    free(s);
    free(s2);

    cx_metrics_clear();
    char *r = cx_metrics_report();
    cr_expect_str_eq(r, "");
    cr_expect_eq(cx_counter_names(NULL, 0), 0);
    cr_expect_eq(cx_metric_names(NULL, 0), 0);
    free(r);
    run_small_steps(1);
    r = cx_metrics_report();
    cr_expect(strstr(r, "Metric: ExecuteTime\n  TotalSamples: 1\n"), "%s", r);
    cr_expect(strstr(r, "Counter: CachedCompile\n  Value: 1\n"), "%s", r);
    cr_expect(!strstr(r, "Metric: CompileTime"), "cleared, then a cache hit: %s", r);
    free(r);
}

Test(obs_report, time_format)
{
    cx_metric_add("ObsFakeTime", 3723.004005006);   /* 1h02m03s004ms005.006us */
    cx_metric_add("ObsFakeBytes", 3.0 * 1024 * 1024);
    cx_metric_add("ObsFakeValue", 2.5);
    char *r = cx_metrics_report();
    cr_expect(strstr(r, "Metric: ObsFakeTime\n  TotalSamples: 1\n  Accumulator: 01h02m03s004ms005.006us\n"), "%s", r);
    cr_expect(strstr(r, "Percentiles: 1%=01h02m03s004ms005.006us; 5%="), "%s", r);
    cr_expect(strstr(r, "Accumulator: 3.00MB\n"), "%s", r);
    cr_expect(strstr(r, "Accumulator: 2.50\n"), "%s", r);
    free(r);
}

Test(obs_report, metrics_file_every_step)
{
    char path[256];
    snprintf(path, sizeof path, "/tmp/cx_obs_metrics_%d.txt", (int)getpid());
    unlink(path);
    setenv("XLA_METRICS_FILE", path, 1);
    cx_debug_reload_env();
    run_small_steps(3);
    unsetenv("XLA_METRICS_FILE");
    cx_debug_reload_env();
    run_small_steps(1);   /* not recorded */
    char *s = obs_read_file(path);
    cr_assert(s, "no %s", path);
    cr_expect_eq(obs_count(s, "[MetricsData; step="), 3, "%s", s);
    cr_expect(strstr(s, "[MetricsData; step=1]\nMetric: CompileTime\n"), "%s", s);
    cr_expect(strstr(s, "[MetricsData; step=3]\n"));
    cr_expect(strstr(s, "Counter: MarkStep\n  Value: 3\n"), "%s", s);
    cr_expect(!strstr(s, "Counter: MarkStep\n  Value: 4\n"));
    free(s);
    unlink(path);
}
