/* The profiler: records complete events ("ph": "X") while a trace is on and
 * writes them, at cx_trace_stop, as a Chrome trace-event JSON per rank
 * (DIR/proc_<rank>/trace.json) that Perfetto and chrome://tracing open.
 *
 * Tracks (tids): each OS thread that records gets a small id in order of
 * first use; collectives, which run asynchronously and overlap the kernels,
 * get their own track so events on every track nest properly. Times are
 * integer nanoseconds from the trace start, printed as microseconds with
 * three decimals, so a child's [ts, ts + dur] never leaks out of its parent
 * through rounding. */
#include "obs_internal.h"
#include "cx_vec.h"

#include <cxla/comm.h>
#include <cxla/profiler.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TID_COLLECTIVES 1000

typedef struct {
    char name[64];
    const char *cat;    /* static strings only */
    int64_t ns0, ns1;
    int tid;
    bool clipped;       /* began before the trace: drawn from its start */
    char args[112];
} trace_ev;

static pthread_mutex_t g_tr_mu = PTHREAD_MUTEX_INITIALIZER;
static trace_ev *g_ev;
static int g_nev, g_capev;
static bool g_dropped_oom;
static double g_base;
static int64_t g_base_unix_ns;   /* CLOCK_REALTIME at g_base: traces of ranks on other hosts line up */
static char *g_dir;
static int g_next_tid = 1;
static unsigned g_generation;   /* bumps at every start: stale thread stacks are ignored */

static _Thread_local int t_tid;

#define MAX_DEPTH 64
typedef struct { char name[64]; double t0; } region;
static _Thread_local region t_stack[MAX_DEPTH];
static _Thread_local int t_depth;
static _Thread_local unsigned t_generation;

bool cx_trace_active(void) { return (cx_obs_get() & OBS_TRACE) != 0; }

static int64_t to_ns(double t) { return (int64_t)llround((t - g_base) * 1e9); }

static void add_event(const char *cat, const char *name, double t0, double t1, const char *args, int tid)
{
    pthread_mutex_lock(&g_tr_mu);
    if (!(atomic_load_explicit(&cx_obs_flags, memory_order_relaxed) & OBS_TRACE)) { pthread_mutex_unlock(&g_tr_mu); return; }
    if (tid == 0) {
        if (t_tid == 0) t_tid = g_next_tid++;
        tid = t_tid;
    }
    if (!CX_GROW(g_ev, g_capev, g_nev + 1)) { g_dropped_oom = true; pthread_mutex_unlock(&g_tr_mu); return; }
    trace_ev *e = &g_ev[g_nev++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->cat = cat;
    /* An event is recorded when it ends, so one that was running when the
     * trace started (an execute, a collective in flight) begins before the
     * trace's zero. It is kept, cut at the start and marked: a negative ts
     * would print as "-1.-500" and, cut or not, it still encloses the
     * kernels that ran after the start. */
    e->ns0 = to_ns(t0);
    e->clipped = e->ns0 < 0;
    if (e->clipped) e->ns0 = 0;
    e->ns1 = to_ns(t1);
    if (e->ns1 < e->ns0) e->ns1 = e->ns0;
    e->tid = tid;
    snprintf(e->args, sizeof e->args, "%s", args ? args : "");
    pthread_mutex_unlock(&g_tr_mu);
}

static void trace_event(const char *cat, const char *name, double t0, double t1, const char *args)
{
    add_event(cat, name, t0, t1, args, strcmp(cat, "collective") ? 0 : TID_COLLECTIVES);
}

__attribute__((constructor)) static void register_trace(void) { cx_obs_hooks.trace = trace_event; }

bool cx_trace_push(const char *name)
{
    if (!(cx_obs_get() & OBS_TRACE)) return false;
    if (t_generation != g_generation) { t_depth = 0; t_generation = g_generation; }
    if (t_depth == MAX_DEPTH) return false;
    region *r = &t_stack[t_depth++];
    snprintf(r->name, sizeof r->name, "%s", name ? name : "(null)");
    r->t0 = cx_now();
    return true;
}

void cx_trace_pop(void)
{
    if (t_depth == 0 || t_generation != g_generation) return;
    region *r = &t_stack[--t_depth];
    add_event("user", r->name, r->t0, cx_now(), NULL, 0);
}


cx_status cx_trace_start(const char *dir)
{
    if (!dir || !*dir) { cx_set_last_error("trace_start: no directory"); return CX_ERR_ARG; }
    cx_obs_get();
    pthread_mutex_lock(&g_tr_mu);
    bool on = atomic_load(&cx_obs_flags) & OBS_TRACE;
    pthread_mutex_unlock(&g_tr_mu);
    if (on) { cx_set_last_error("trace_start: a trace is already recording (to %s)", g_dir); return CX_ERR_STATE; }
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/proc_%d", dir, cx_global_ordinal());
    cx_status st = cx_obs_mkdir("trace_start", sub);
    if (st != CX_OK) return st;
    char *d = strdup(sub);
    if (!d) { cx_set_last_error("trace_start: out of memory"); return CX_ERR_OOM; }
    pthread_mutex_lock(&g_tr_mu);
    free(g_dir);
    g_dir = d;
    g_nev = 0;
    g_dropped_oom = false;
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    g_base = cx_now();
    g_base_unix_ns = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec;
    g_generation++;
    cx_obs_set(OBS_TRACE, true);
    pthread_mutex_unlock(&g_tr_mu);
    return CX_OK;
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static int cmp_ev(const void *a, const void *b)
{
    const trace_ev *x = a, *y = b;
    if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
    if (x->ns0 != y->ns0) return x->ns0 < y->ns0 ? -1 : 1;
    /* same start: the longer (outer) event first */
    return x->ns1 > y->ns1 ? -1 : x->ns1 < y->ns1;
}

cx_status cx_trace_stop(void)
{
    pthread_mutex_lock(&g_tr_mu);
    if (!(atomic_load(&cx_obs_flags) & OBS_TRACE)) {
        pthread_mutex_unlock(&g_tr_mu);
        cx_set_last_error("trace_stop: no trace is recording");
        return CX_ERR_STATE;
    }
    cx_obs_set(OBS_TRACE, false);
    if (g_nev > 0) qsort(g_ev, (size_t)g_nev, sizeof *g_ev, cmp_ev); /* g_ev is NULL before the first event */
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/trace.json", g_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int rank = cx_global_ordinal();
    FILE *f = fopen(tmp, "w");
    cx_status st = CX_OK;
    if (!f) {
        cx_set_last_error("trace_stop: cannot write %s: %s", tmp, strerror(errno));
        st = CX_ERR_IO;
    } else {
        /* the start on both clocks, in ns: xla-profile puts the ranks of a
         * host on the shared monotonic clock, those of other hosts on the
         * real-time one, before it lines their collectives up */
        char host[64] = "";
        gethostname(host, sizeof host - 1);
        fprintf(f, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"library\": \"cxla %s\", \"rank\": %d, "
                   "\"host\": ", CX_VERSION_STRING, rank);
        json_str(f, host);
        fprintf(f, ", \"start_monotonic_ns\": %lld, \"start_unix_ns\": %lld%s},\n\"traceEvents\": [\n",
                (long long)llround(g_base * 1e9), (long long)g_base_unix_ns, g_dropped_oom ? ", \"dropped_events\": true" : "");
        fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"rank %d\"}},\n",
                rank, rank);
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"collectives\"}}",
                rank, TID_COLLECTIVES);
        for (int i = 0; i < g_nev; i++) {
            const trace_ev *e = &g_ev[i];
            fprintf(f, ",\n{\"name\": ");
            json_str(f, e->name);
            int64_t dur = e->ns1 - e->ns0;
            fprintf(f, ", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %lld.%03lld, \"dur\": %lld.%03lld, \"pid\": %d, \"tid\": %d",
                    e->cat, (long long)(e->ns0 / 1000), (long long)(e->ns0 % 1000), (long long)(dur / 1000),
                    (long long)(dur % 1000), rank, e->tid);
            if (e->args[0] || e->clipped)
                fprintf(f, ", \"args\": {%s%s%s}", e->args, e->args[0] && e->clipped ? ", " : "",
                        e->clipped ? "\"began_before_trace\": true" : "");
            fputc('}', f);
        }
        fprintf(f, "\n]}\n");
        if (fclose(f) != 0 || rename(tmp, path) != 0) {
            cx_set_last_error("trace_stop: cannot write %s: %s", path, strerror(errno));
            unlink(tmp);
            st = CX_ERR_IO;
        }
    }
    g_nev = 0;
    pthread_mutex_unlock(&g_tr_mu);
    return st;
}
