/* Counters and metrics, named as PyTorch/XLA names them. */
#include "internal.h"

#include <pthread.h>
#include <math.h>

typedef struct metric {
    char *name;
    bool is_counter;
    int64_t value;            /* counter */
    cx_metric_stats stats;    /* metric */
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
    }
    pthread_mutex_unlock(&g_metrics_mu);
}
