/* The rank's collective status page, for xla-launch's watchdog: when the
 * launcher sets CX_STATUS_DIR, each rank keeps a page there that the
 * launcher reads while the job runs; its format is
 * proto/cx_status_page.h's, which launch/watch.c reads with. Writing is
 * plain stores into a shared mapping, no system call; collectives run one
 * at a time (on the progress thread, or on the caller's when nothing is
 * queued), so one writer at a time. Without CX_STATUS_DIR it does nothing. */
#include "parallel_internal.h"

#include <cxla/metrics.h>

#include "cx_log.h"
#include "cx_settings.h"
#include "cx_status_page.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static struct {
    char *page;       /* CX_STATUS_LINES lines, NULL when off */
    int rank;
    long long seq;
    long long opened, first_step;   /* CLOCK_MONOTONIC ns */
    double compile_s, load_s;       /* by the end of the first step */
    long long cache_hits;
} S;

static long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Writes a padded line (ending in '\n') at line `i`. */
static void put_line(int i, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_line(int i, const char *fmt, ...)
{
    char buf[CX_STATUS_LINE];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if (n > CX_STATUS_LINE - 1) n = CX_STATUS_LINE - 1;
    memset(buf + n, ' ', (size_t)(CX_STATUS_LINE - 1 - n));
    buf[CX_STATUS_LINE - 1] = '\n';
    memcpy(S.page + (size_t)i * CX_STATUS_LINE, buf, CX_STATUS_LINE);
}

static void put_header(const char *state, long long since)
{
    put_line(CX_STATUS_HEADER_LINE, CX_STATUS_HEADER_FMT, S.rank, (int)getpid(), S.seq, state, since);
}

static double metric_sum(const char *name)
{
    cx_metric_stats m = { 0 };
    return cx_metric_data(name, &m) ? m.accumulator : 0;
}

static void put_progress(int64_t steps)
{
    put_line(CX_STATUS_PROGRESS_LINE, CX_STATUS_PROGRESS_FMT, (long long)steps, S.opened, S.first_step, S.compile_s,
             S.cache_hits, S.load_s);
}

/* The step observer (training thread; the progress line is its alone). */
static void on_step(void *arg, int64_t steps)
{
    (void)arg;
    if (!S.page) return;
    if (!S.first_step) {
        S.first_step = mono_ns();
        S.compile_s = metric_sum("CompileTime");
        S.load_s = metric_sum("CheckpointLoadTime");
        S.cache_hits = cx_counter_value("PersistentCacheHit");
    }
    put_progress(steps);
}

void cx_watch_page_open(int rank)
{
    const char *dir = cx_setting_str(CX_STATUS_DIR_ENV);
    if (!dir || !*dir || S.page) return;
    char path[4096], name[64];
    snprintf(name, sizeof name, CX_STATUS_FILE_FMT, rank);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    size_t bytes = CX_STATUS_BYTES;
    void *m = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)bytes) == 0) m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (m == MAP_FAILED) {
        /* the job runs on without the watchdog's view of this rank */
        cx_logf(CX_LOG_INFO, "watch", "no collective status page at %s: %s", path, strerror(errno));
        return;
    }
    S.page = m;
    S.rank = rank;
    S.seq = 0;
    memset(S.page, ' ', bytes);
    for (int i = 0; i < CX_STATUS_LINES; i++) S.page[(size_t)i * CX_STATUS_LINE + CX_STATUS_LINE - 1] = '\n';
    S.opened = mono_ns();
    put_header(CX_STATUS_STATE_IDLE, S.opened);
    put_progress(0);
    cx_set_step_observer(on_step, NULL);
}

void cx_watch_page_close(void)
{
    if (!S.page) return;
    cx_set_step_observer(NULL, NULL);
    munmap(S.page, CX_STATUS_BYTES);
    S.page = NULL;
}

static const char *kind_name(cx_coll_kind k)
{
    static const char *const names[] = { "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast" };
    return (unsigned)k < sizeof names / sizeof *names ? names[k] : "collective";
}

/* The ring line of the current collective, with its state and end. */
static char g_desc[CX_STATUS_DESC_MAX + 1];
static long long g_start;
static int g_group;

void cx_watch_enter(const cx_comm_op *op)
{
    if (!S.page) return;
    S.seq++;
    g_start = mono_ns();
    if (op && op->label) {
        snprintf(g_desc, sizeof g_desc, "%s", op->label);
        g_group = op->group ? op->group_size : -1;
    } else if (op) {
        snprintf(g_desc, sizeof g_desc, "%s %s[%lld]", kind_name(op->kind), cx_dtype_name(op->dtype),
                 (long long)op->count);
        g_group = op->group ? op->group_size : -1;
    } else {
        snprintf(g_desc, sizeof g_desc, "host_exchange");
        g_group = -1;
    }
    put_line(CX_STATUS_RING_LINE(S.seq), CX_STATUS_RING_FMT, S.seq, g_desc, g_group, CX_STATUS_RUNNING, g_start, 0LL);
    put_header(CX_STATUS_STATE_IN, g_start);
}

void cx_watch_leave(cx_status st)
{
    if (!S.page) return;
    long long end = mono_ns();
    put_line(CX_STATUS_RING_LINE(S.seq), CX_STATUS_RING_FMT, S.seq, g_desc, g_group,
             st == CX_OK ? CX_STATUS_DONE : CX_STATUS_FAILED, g_start, end);
    put_header(CX_STATUS_STATE_IDLE, end);
}
