/* Step closures (xm.add_step_closure): functions run after a step's graph has
 * run and its tensors are materialized, in the order added; async ones on
 * one background thread, still in order among themselves. */
#include "api.h"
#include "cx_vec.h"

#include <pthread.h>

typedef struct {
    cx_step_closure_fn fn;
    void *arg;
    bool async;
} closure;

typedef struct {
    closure *v;
    int n, cap;
} closure_list;

static bool cl_push(closure_list *l, closure c)
{
    if (!CX_GROW(l->v, l->cap, l->n + 1)) return false;
    l->v[l->n++] = c;
    return true;
}

static pthread_mutex_t g_cl_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cl_cv = PTHREAD_COND_INITIALIZER;
static closure_list g_pending;        /* added during the current step */
static closure_list g_async_q;        /* waiting for the async thread */
static int g_async_head;
static bool g_async_busy, g_async_started;

static void *async_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_cl_mu);
    for (;;) {
        while (g_async_head == g_async_q.n) {
            g_async_busy = false;
            pthread_cond_broadcast(&g_cl_cv);
            pthread_cond_wait(&g_cl_cv, &g_cl_mu);
        }
        g_async_busy = true;
        closure c = g_async_q.v[g_async_head++];
        if (g_async_head == g_async_q.n) g_async_head = g_async_q.n = 0;
        pthread_mutex_unlock(&g_cl_mu);
        c.fn(c.arg);
        pthread_mutex_lock(&g_cl_mu);
    }
    return NULL;
}

cx_status cx_add_step_closure(cx_step_closure_fn fn, void *arg, bool run_async)
{
    if (!fn) { cx_set_last_error("add_step_closure: fn is NULL"); return CX_ERR_ARG; }
    pthread_mutex_lock(&g_cl_mu);
    bool ok = cl_push(&g_pending, (closure){ fn, arg, run_async });
    pthread_mutex_unlock(&g_cl_mu);
    if (!ok) { cx_set_last_error("add_step_closure: out of memory"); return CX_ERR_OOM; }
    cx_obs_set(OBS_CLOSURES, true);
    return CX_OK;
}

void cx_wait_step_closures(void)
{
    pthread_mutex_lock(&g_cl_mu);
    while (g_async_started && (g_async_busy || g_async_head != g_async_q.n)) pthread_cond_wait(&g_cl_cv, &g_cl_mu);
    pthread_mutex_unlock(&g_cl_mu);
}

void cx_closures_run(void)
{
    pthread_mutex_lock(&g_cl_mu);
    closure_list run = g_pending;   /* closures added while these run wait for the next step */
    g_pending = (closure_list){ 0 };
    cx_obs_set(OBS_CLOSURES, false);
    pthread_mutex_unlock(&g_cl_mu);
    for (int i = 0; i < run.n; i++) {
        closure c = run.v[i];
        if (!c.async) { c.fn(c.arg); continue; }
        pthread_mutex_lock(&g_cl_mu);
        bool queued = false;
        if (!g_async_started) {
            pthread_t th;
            pthread_attr_t at;
            pthread_attr_init(&at);
            pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            g_async_started = pthread_create(&th, &at, async_main, NULL) == 0;
            pthread_attr_destroy(&at);
        }
        if (g_async_started && cl_push(&g_async_q, c)) {
            queued = true;
            g_async_busy = true;
            pthread_cond_broadcast(&g_cl_cv);
        }
        pthread_mutex_unlock(&g_cl_mu);
        if (!queued) c.fn(c.arg);   /* no thread or no memory: run it here, still in order */
    }
    free(run.v);
}
