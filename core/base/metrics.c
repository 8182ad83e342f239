/* Counters and metrics, named as PyTorch/XLA names them. */
#include "base.h"
#include "obs.h"

#include <pthread.h>
#include <math.h>

/* The report (report.c) needs percentiles and rates, so each metric also
 * keeps its last CX_METRIC_SAMPLES samples with their time stamps in a ring,
 * as PyTorch/XLA does (its reports are over the recent window too). The
 * ring is allocated on a metric's first sample. */
typedef struct metric {
    char *name;
    bool is_counter;
    int64_t value;            /* counter */
    cx_metric_stats stats;    /* metric */
    double *ring;             /* CX_METRIC_SAMPLES (value, time) pairs */
    int64_t ring_pos;         /* samples ever written into the ring */
    struct metric *next;
} metric;

static metric *g_metrics;
static pthread_mutex_t g_metrics_mu = PTHREAD_MUTEX_INITIALIZER;

static metric *find_or_add(const char *name, bool counter)
{
    for (metric *m = g_metrics; m; m = m->next)
        if (m->is_counter == counter && !strcmp(m->name, name)) return m;
    metric *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->name = strdup(name);
    if (!m->name) { free(m); return NULL; }
    m->is_counter = counter;
    m->stats.min = INFINITY;
    m->stats.max = -INFINITY;
    /* append, so reports list metrics in first-use order */
    metric **p = &g_metrics;
    while (*p) p = &(*p)->next;
    *p = m;
    return m;
}

void cx_counter_add(const char *name, int64_t delta)
{
    pthread_mutex_lock(&g_metrics_mu);
    metric *m = find_or_add(name, true);
    if (m) m->value += delta;
    pthread_mutex_unlock(&g_metrics_mu);
}

void cx_metric_add(const char *name, double value)
{
    pthread_mutex_lock(&g_metrics_mu);
    metric *m = find_or_add(name, false);
    if (m) {
        m->stats.total_samples++;
        m->stats.accumulator += value;
        m->stats.last = value;
        if (value < m->stats.min) m->stats.min = value;
        if (value > m->stats.max) m->stats.max = value;
        if (!m->ring) m->ring = calloc(2 * CX_METRIC_SAMPLES, sizeof *m->ring);
        if (m->ring) {
            double *slot = m->ring + 2 * (m->ring_pos++ % CX_METRIC_SAMPLES);
            slot[0] = value;
            slot[1] = cx_now();
        }
    }
    pthread_mutex_unlock(&g_metrics_mu);
}

int64_t cx_counter_value(const char *name)
{
    int64_t v = 0;
    pthread_mutex_lock(&g_metrics_mu);
    for (metric *m = g_metrics; m; m = m->next)
        if (m->is_counter && !strcmp(m->name, name)) { v = m->value; break; }
    pthread_mutex_unlock(&g_metrics_mu);
    return v;
}

bool cx_metric_data(const char *name, cx_metric_stats *out)
{
    bool found = false;
    pthread_mutex_lock(&g_metrics_mu);
    for (metric *m = g_metrics; m; m = m->next)
        if (!m->is_counter && !strcmp(m->name, name) && m->stats.total_samples > 0) {
            if (out) *out = m->stats;
            found = true;
            break;
        }
    pthread_mutex_unlock(&g_metrics_mu);
    return found;
}

void cx_metrics_clear(void)
{
    pthread_mutex_lock(&g_metrics_mu);
    for (metric *m = g_metrics; m; m = m->next) {
        m->value = 0;
        memset(&m->stats, 0, sizeof m->stats);
        m->stats.min = INFINITY;
        m->stats.max = -INFINITY;
        m->ring_pos = 0;
    }
    pthread_mutex_unlock(&g_metrics_mu);
}

/* A consistent copy of the registry for the report: taken under the lock,
 * formatted without it. Samples come out oldest first. */
int cx_metrics_snapshot(cx_metric_snap **out)
{
    *out = NULL;
    pthread_mutex_lock(&g_metrics_mu);
    int n = 0;
    for (metric *m = g_metrics; m; m = m->next) n++;
    cx_metric_snap *s = calloc((size_t)n + 1, sizeof *s);
    int k = 0;
    for (metric *m = g_metrics; s && m; m = m->next, k++) {
        s[k].name = m->name;   /* names live as long as the process */
        s[k].is_counter = m->is_counter;
        s[k].value = m->value;
        s[k].stats = m->stats;
        int64_t cnt = m->ring_pos < CX_METRIC_SAMPLES ? m->ring_pos : CX_METRIC_SAMPLES;
        if (m->is_counter || cnt == 0 || !m->ring) continue;
        s[k].samples = malloc(sizeof(double) * 2 * (size_t)cnt);
        if (!s[k].samples) continue;   /* the report then shows totals only */
        int64_t first = m->ring_pos - cnt;
        for (int64_t i = 0; i < cnt; i++) {
            const double *src = m->ring + 2 * ((first + i) % CX_METRIC_SAMPLES);
            s[k].samples[2 * i] = src[0];
            s[k].samples[2 * i + 1] = src[1];
        }
        s[k].nsamples = (int)cnt;
    }
    pthread_mutex_unlock(&g_metrics_mu);
    if (!s) return -1;
    *out = s;
    return n;
}

void cx_metrics_snapshot_free(cx_metric_snap *s, int n)
{
    for (int i = 0; s && i < n; i++) free(s[i].samples);
    free(s);
}
