/* The collective watchdog. Each rank keeps a status page in a directory the
 * launcher makes (CX_STATUS_DIR; parallel/watch_page.c writes it, both
 * sides with the format of proto/cx_status_page.h): which
 * collective it is in and since when, and its last 64 collectives. Once a
 * second the launcher reads the pages; when a rank has been inside one
 * collective for CX_COLLECTIVE_TIMEOUT seconds (default 300, 0 = off) it
 * prints one line saying where every rank is, in the manner of Horovod's
 * stall inspector, copies the pages (the flight recorder) next to the logs,
 * and the job is stopped. A rank that stops arriving at collectives shows
 * as the others waiting for it. The pages are node-local: on several nodes
 * the launcher sees the ranks of its own node. */
#define _GNU_SOURCE
#include "launcher.h"

#include "cx_settings.h"
#include "cx_status_page.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct rank_view {
    int rank;
    long long seq, since;
    bool in;
    char desc[160];  /* "#41 all_reduce f32[1024]" or "no collective yet" */
};

void xl_watch_init(struct xl_watch *w, bool for_restarts)
{
    memset(w, 0, sizeof *w);
    cx_setting_value t;
    char bad[512];
    if (cx_setting_read("CX_COLLECTIVE_TIMEOUT", &t, bad, sizeof bad) < 0) xl_die("%s", bad);
    w->timeout = t.d;
    if (w->timeout == 0 && !for_restarts) return;
    snprintf(w->dir, sizeof w->dir, "/dev/shm/xla-launch.%d.XXXXXX", (int)getpid());
    if (!mkdtemp(w->dir)) {
        snprintf(w->dir, sizeof w->dir, "/tmp/xla-launch.%d.XXXXXX", (int)getpid());
        if (!mkdtemp(w->dir)) {
            xl_err("warning: no collective watchdog (cannot make a status directory: %s)", strerror(errno));
            w->dir[0] = '\0';
            return;
        }
    }
    setenv(CX_STATUS_DIR_ENV, w->dir, 1);
}

void xl_watch_cleanup(struct xl_watch *w)
{
    if (!w->dir[0]) return;
    DIR *d = opendir(w->dir);
    struct dirent *e;
    char path[sizeof w->dir + 300];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", w->dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(w->dir);
    w->dir[0] = '\0';
}

/* Reads one page. @return false when it is missing or not (yet) a page. */
static bool read_page(const char *path, struct rank_view *v, char *page, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(page, 1, cap - 1, f);
    fclose(f);
    page[n] = '\0';
    char state[CX_STATUS_STATE_MAX + 1];
    int pid;
    if (n < CX_STATUS_LINE || sscanf(page, CX_STATUS_HEADER_SCAN, &v->rank, &pid, &v->seq, state, &v->since) !=
                                  CX_STATUS_HEADER_FIELDS)
        return false;
    v->in = !strcmp(state, CX_STATUS_STATE_IN);
    snprintf(v->desc, sizeof v->desc, "no collective yet");
    if (v->seq > 0 && n >= (size_t)(CX_STATUS_RING_LINE(v->seq) + 1) * CX_STATUS_LINE) {
        const char *l = page + (size_t)CX_STATUS_RING_LINE(v->seq) * CX_STATUS_LINE;
        char what[CX_STATUS_DESC_MAX + 1];
        long long s;
        if (sscanf(l, CX_STATUS_RING_SCAN, &s, what) == CX_STATUS_RING_SCAN_FIELDS)
            snprintf(v->desc, sizeof v->desc, "#%lld %s", s, what);
    }
    return true;
}

static int by_rank(const void *a, const void *b)
{
    return ((const struct rank_view *)a)->rank - ((const struct rank_view *)b)->rank;
}

/* "rank 1 is at #41 all_reduce f32[1024] (left it 312 s ago); ranks 0,2,3
 * wait in #42 all_gather f32[4096] (entered 300 s ago)": ranks in the same
 * place grouped, the laggards first. */
static void report(const struct xl_watch *w, struct rank_view *v, int n, double now_ns)
{
    qsort(v, (size_t)n, sizeof *v, by_rank);
    char line[4096];
    size_t len = (size_t)snprintf(line, sizeof line, "collective stall (CX_COLLECTIVE_TIMEOUT=%g s):", w->timeout);
    bool done[1024] = { false };
    for (int pass = 0; pass < 2; pass++) {   /* idle ranks (the laggards), then the waiting ones */
        for (int i = 0; i < n && i < 1024; i++) {
            if (done[i] || v[i].in != (pass == 1)) continue;
            char ranks[512];
            size_t rl = 0;
            int count = 0;
            for (int k = i; k < n && k < 1024; k++) {
                if (done[k] || v[k].in != v[i].in || v[k].seq != v[i].seq) continue;
                rl += (size_t)snprintf(ranks + rl, sizeof ranks - rl, "%s%d", count ? "," : "", v[k].rank);
                if (rl >= sizeof ranks) rl = sizeof ranks - 1;
                done[k] = true;
                count++;
            }
            double ago = (now_ns - (double)v[i].since) / 1e9;
            len += (size_t)snprintf(line + len, sizeof line - len, "%s %s %s %s %s (%s %.0f s ago)",
                                    len > 60 ? ";" : "", count > 1 ? "ranks" : "rank", ranks,
                                    v[i].in ? (count > 1 ? "wait in" : "waits in") : (count > 1 ? "are at" : "is at"),
                                    v[i].desc, v[i].in ? "entered" : v[i].seq ? "left it" : "started", ago);
            if (len >= sizeof line) len = sizeof line - 1;
        }
    }
    xl_err("%s", line);
}

/* Copies every page to DIR/flight/rank-<r>.txt: each rank's last collectives. */
static void dump_flight(const struct xl_watch *w, const char *log_dir)
{
    char out[4200];
    if (log_dir) snprintf(out, sizeof out, "%s/flight", log_dir);
    else snprintf(out, sizeof out, "xla-launch-flight-%d", (int)getpid());
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        xl_err("cannot write the flight recorder to %s: %s", out, strerror(errno));
        return;
    }
    DIR *d = opendir(w->dir);
    struct dirent *e;
    static char page[CX_STATUS_BYTES + 1];
    int copied = 0;
    while (d && (e = readdir(d))) {
        int r;
        if (sscanf(e->d_name, CX_STATUS_FILE_FMT, &r) != 1) continue;
        char src[sizeof w->dir + 300], dst[4400];
        snprintf(src, sizeof src, "%s/%s", w->dir, e->d_name);
        snprintf(dst, sizeof dst, "%s/rank-%d.txt", out, r);
        FILE *in = fopen(src, "r"), *o = in ? fopen(dst, "w") : NULL;
        if (in && o) {
            size_t n = fread(page, 1, sizeof page - 1, in);
            fwrite(page, 1, n, o);
            copied++;
        }
        if (in) fclose(in);
        if (o) fclose(o);
    }
    if (d) closedir(d);
    xl_err("flight recorder: the last %d collectives of %d rank(s) in %s/", CX_STATUS_RING, copied, out);
}

bool xl_watch_check(struct xl_watch *w, const char *log_dir)
{
    if (!w->dir[0] || w->fired || w->timeout <= 0) return false;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now_ns = (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
    DIR *d = opendir(w->dir);
    if (!d) return false;
    struct rank_view v[1024];
    int n = 0;
    bool stalled = false;
    static char page[CX_STATUS_BYTES + 1];
    struct dirent *e;
    while ((e = readdir(d)) && n < 1024) {
        if (strncmp(e->d_name, CX_STATUS_FILE_PREFIX, strlen(CX_STATUS_FILE_PREFIX))) continue;
        char path[sizeof w->dir + 300];
        snprintf(path, sizeof path, "%s/%s", w->dir, e->d_name);
        if (!read_page(path, &v[n], page, sizeof page)) continue;
        if (v[n].in && (now_ns - (double)v[n].since) / 1e9 >= w->timeout) stalled = true;
        n++;
    }
    closedir(d);
    if (!stalled) return false;
    w->fired = true;
    report(w, v, n, now_ns);
    dump_flight(w, log_dir);
    return true;
}

/* The progress line (parallel/watch_page.c writes it after the ring). */
static bool read_progress(const char *path, long long *steps, long long *open_ns, long long *first_ns,
                          double *compile_s, long long *hits, double *load_s)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[CX_STATUS_LINE + 1];
    bool ok = fseek(f, (long)CX_STATUS_PROGRESS_LINE * CX_STATUS_LINE, SEEK_SET) == 0 && fgets(line, sizeof line, f) &&
              sscanf(line, CX_STATUS_PROGRESS_SCAN, steps, open_ns, first_ns, compile_s, hits, load_s) ==
                  CX_STATUS_PROGRESS_FIELDS;
    fclose(f);
    return ok;
}

bool xl_watch_progress(const struct xl_watch *w, struct xl_progress *p)
{
    memset(p, 0, sizeof *p);
    if (!w->dir[0]) return false;
    DIR *d = opendir(w->dir);
    if (!d) return false;
    struct dirent *e;
    double first = 0;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, CX_STATUS_FILE_PREFIX, strlen(CX_STATUS_FILE_PREFIX))) continue;
        char path[sizeof w->dir + 300];
        snprintf(path, sizeof path, "%s/%s", w->dir, e->d_name);
        long long steps, open_ns, first_ns, hits;
        double compile_s, load_s;
        if (!read_progress(path, &steps, &open_ns, &first_ns, &compile_s, &hits, &load_s)) continue;
        if (p->pages == 0 || hits < p->cache_hits) p->cache_hits = hits;
        p->pages++;
        if (open_ns * 1e-9 > p->opened) p->opened = open_ns * 1e-9;
        if (steps <= 0) continue;
        p->stepped++;
        if (first_ns * 1e-9 > first) first = first_ns * 1e-9;
        if (compile_s > p->compile_s) p->compile_s = compile_s;
        if (load_s > p->load_s) p->load_s = load_s;
    }
    closedir(d);
    if (p->stepped == p->pages) p->first_step = first;
    return p->pages > 0;
}
