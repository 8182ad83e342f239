/* xla-profile: capture a trace of every rank of a running job (the seed's
 * capture_profile against xp.start_server). The job runs with
 * CX_PROFILE_PORT=P, so each rank serves on 127.0.0.1, port P plus its local
 * rank; this asks every one of them for MS milliseconds of trace at once,
 * and, when their DIR/proc_<rank>/trace.json files are written, merges them
 * into DIR/trace.json, one process per rank, for Perfetto.
 *
 * Lining up: the ranks of one host share CLOCK_MONOTONIC, so their traces
 * are placed by the start each one recorded on it (on the real-time clock
 * when the hosts differ); then each rank is shifted by the median gap
 * between the ends of its collectives and the nearest same-named
 * collective of the lowest rank, since a collective ends on every rank at
 * once (the last to arrive releases them all).
 *
 * Ranks on other hosts: run it on each host into one shared DIR, then
 * `xla-profile --merge-only --dir DIR` merges every DIR/proc_<rank>.
 *
 * Exit codes: 0 success, 1 no server / a rank's error / unreadable trace,
 * 2 bad flag. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cx_cli.h"
#include "cx_fs.h"

#define MAX_RANKS 4096

typedef struct {
    int fd;
    int rank;            /* from the reply */
    char path[4200];     /* the rank's trace.json */
    char buf[4600];      /* its reply so far */
    size_t n;
    bool done, ok;
    cJSON *doc;          /* the parsed trace */
    double shift_us;     /* added to every ts */
} peer;

static int connect_port(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static bool send_all(int fd, const char *s)
{
    for (size_t n = strlen(s), put = 0; put < n;) {
        ssize_t k = write(fd, s + put, n - put);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        put += (size_t)k;
    }
    return true;
}

/* Reads every peer's one-line reply, waiting at most `timeout_s`.
 * @return false when some peer did not answer in time. */
static bool read_replies(peer *p, int n, double timeout_s)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct pollfd fds[MAX_RANKS];
        int open = 0;
        for (int i = 0; i < n; i++) if (!p[i].done) fds[open++] = (struct pollfd){ .fd = p[i].fd, .events = POLLIN };
        if (!open) return true;
        clock_gettime(CLOCK_MONOTONIC, &t);
        double left = timeout_s - ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9);
        if (left <= 0) return false;
        if (poll(fds, (nfds_t)open, (int)(left * 1000) + 1) < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        for (int i = 0; i < n; i++) {
            if (p[i].done) continue;
            struct pollfd q = { .fd = p[i].fd, .events = POLLIN };
            if (poll(&q, 1, 0) <= 0) continue;
            ssize_t k = read(p[i].fd, p[i].buf + p[i].n, sizeof p[i].buf - 1 - p[i].n);
            if (k > 0) p[i].n += (size_t)k;
            p[i].buf[p[i].n] = '\0';
            char *nl = strchr(p[i].buf, '\n');
            if (nl || k <= 0 || p[i].n == sizeof p[i].buf - 1) {
                if (nl) *nl = '\0';
                p[i].done = true;
                p[i].ok = sscanf(p[i].buf, "ok %d %4199[^\n]", &p[i].rank, p[i].path) == 2;
            }
        }
    }
}

static cJSON *load_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            char *g = realloc(s, cap = 2 * cap + 65536 + 1);
            if (!g) { free(s); fclose(f); return NULL; }
            s = g;
        }
        size_t k = fread(s + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
    }
    fclose(f);
    s[n] = '\0';
    cJSON *doc = cJSON_Parse(s);
    free(s);
    return doc;
}

static double other_num(const cJSON *doc, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "otherData"), name);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *other_str(const cJSON *doc, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "otherData"), name);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The ends (us) of the collective events of one trace, shifted. */
typedef struct { const char *name; double end; } coll_end;

static int collect(const peer *p, coll_end **out)
{
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(p->doc, "traceEvents");
    int n = 0, cap = cJSON_GetArraySize(evs) + 1;
    coll_end *c = malloc(sizeof *c * (size_t)cap);
    if (!c) return -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat"), *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts"), *dur = cJSON_GetObjectItemCaseSensitive(e, "dur");
        if (!cJSON_IsString(cat) || strcmp(cat->valuestring, "collective") || !cJSON_IsString(name) ||
            !cJSON_IsNumber(ts) || !cJSON_IsNumber(dur))
            continue;
        c[n++] = (coll_end){ name->valuestring, ts->valuedouble + dur->valuedouble + p->shift_us };
    }
    *out = c;
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Shifts p so its collectives end with ref's. @return how many matched. */
static int line_up(peer *p, const coll_end *ref, int nref)
{
    coll_end *mine;
    int n = collect(p, &mine);
    if (n < 0) return 0;
    if (n == 0) { free(mine); return 0; }
    double *gap = malloc(sizeof *gap * (size_t)n);
    int m = 0;
    for (int i = 0; gap && i < n; i++) {
        double best = INFINITY;
        for (int j = 0; j < nref; j++)
            if (!strcmp(ref[j].name, mine[i].name) && fabs(ref[j].end - mine[i].end) < fabs(best))
                best = ref[j].end - mine[i].end;
        if (isfinite(best)) gap[m++] = best;
    }
    if (m > 0) {
        qsort(gap, (size_t)m, sizeof *gap, cmp_double);
        p->shift_us += gap[m / 2];
    }
    free(gap);
    free(mine);
    return m;
}

static void shift_events(peer *p)
{
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p->doc, "traceEvents")) {
        cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
        if (cJSON_IsNumber(ts)) cJSON_SetNumberValue(ts, ts->valuedouble + p->shift_us);
    }
}

/* Places every trace on one clock, lines the collectives up, and writes
 * the merged file. @return the number of events, -1 on failure (said). */
static int merge(peer *p, int n, const char *out_path)
{
    bool one_host = true;
    for (int i = 1; i < n; i++) if (strcmp(other_str(p[i].doc, "host"), other_str(p[0].doc, "host"))) one_host = false;
    const char *clock = one_host ? "start_monotonic_ns" : "start_unix_ns";
    double first = INFINITY;
    for (int i = 0; i < n; i++) first = fmin(first, other_num(p[i].doc, clock));
    for (int i = 0; i < n; i++) p[i].shift_us = (other_num(p[i].doc, clock) - first) / 1000;
    int ref = 0;
    for (int i = 1; i < n; i++) if (p[i].rank < p[ref].rank) ref = i;
    coll_end *rc;
    int nref = collect(&p[ref], &rc);
    if (nref < 0) { fprintf(stderr, "xla-profile: out of memory\n"); return -1; }
    for (int i = 0; i < n; i++) {
        double before = p[i].shift_us;
        int m = i == ref ? 0 : line_up(&p[i], rc, nref);
        if (i != ref)
            printf("rank %d: %d collectives lined up with rank %d's (moved %+.1f us)\n", p[i].rank, m, p[ref].rank,
                   p[i].shift_us - before);
        shift_events(&p[i]);
    }
    free(rc);
    cJSON *root = cJSON_CreateObject(), *all = cJSON_AddArrayToObject(root, "traceEvents");
    cJSON *other = cJSON_AddObjectToObject(root, "otherData");
    cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
    cJSON_AddStringToObject(other, "merged_by", "xla-profile");
    cJSON_AddNumberToObject(other, "ranks", n);
    cJSON_AddStringToObject(other, "clock", one_host ? "monotonic (one host)" : "real time (several hosts)");
    int events = 0;
    for (int i = 0; i < n; i++) {
        cJSON *evs = cJSON_DetachItemFromObjectCaseSensitive(p[i].doc, "traceEvents"), *e;
        while (evs && (e = cJSON_DetachItemFromArray(evs, 0)) != NULL) {
            cJSON_AddItemToArray(all, e);
            events++;
        }
        cJSON_Delete(evs);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    FILE *f = text ? fopen(out_path, "w") : NULL;
    bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) ok = false;
    free(text);
    if (!ok) { fprintf(stderr, "xla-profile: cannot write %s: %s\n", out_path, strerror(errno)); return -1; }
    return events;
}

/* Asks every rank for its trace. @return false, having said why. */
static bool capture(peer *p, int n, int port, int ms, const char *dir)
{
    for (int i = 0; i < n; i++) {
        if ((p[i].fd = connect_port(port + i)) < 0) {
            fprintf(stderr, "xla-profile: no profile server on 127.0.0.1:%d (local rank %d): %s; run the job with "
                    "CX_PROFILE_PORT=%d, and wait for its first step\n", port + i, i, strerror(errno), port);
            return false;
        }
    }
    char req[4200];
    snprintf(req, sizeof req, "capture %d %s\n", ms, dir);
    for (int i = 0; i < n; i++)
        if (!send_all(p[i].fd, req)) {
            fprintf(stderr, "xla-profile: local rank %d (port %d) closed the connection\n", i, port + i);
            return false;
        }
    bool in_time = read_replies(p, n, ms / 1000.0 + 60);
    bool ok = true;
    for (int i = 0; i < n; i++) {
        if (p[i].ok) continue;
        ok = false;
        if (!p[i].done) fprintf(stderr, "xla-profile: local rank %d (port %d) did not answer in %.0f s\n", i, port + i,
                                ms / 1000.0 + 60);
        else fprintf(stderr, "xla-profile: local rank %d (port %d): %s\n", i, port + i,
                     p[i].n ? (strncmp(p[i].buf, "error ", 6) ? p[i].buf : p[i].buf + 6) : "closed without a reply");
    }
    return ok && in_time;
}

/* --merge-only: every DIR/proc_<rank>/trace.json. @return how many, -1
 * when DIR cannot be read (said). */
static int existing_traces(const char *dir, peer **out)
{
    DIR *d = opendir(dir);
    if (!d) { fprintf(stderr, "xla-profile: --dir %s: %s\n", dir, strerror(errno)); return -1; }
    peer *p = NULL;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int rank, len = 0;
        if (sscanf(de->d_name, "proc_%d%n", &rank, &len) != 1 || de->d_name[len] || rank < 0) continue;
        peer *g = realloc(p, sizeof *p * (size_t)(n + 1));
        if (!g) { free(p); closedir(d); fprintf(stderr, "xla-profile: out of memory\n"); return -1; }
        p = g;
        memset(&p[n], 0, sizeof *p);
        p[n].fd = -1;
        p[n].rank = rank;
        p[n].ok = true;
        snprintf(p[n].path, sizeof p[n].path, "%.3900s/%.200s/trace.json", dir, de->d_name);
        n++;
    }
    closedir(d);
    *out = p;
    return n;
}

int main(int argc, char **argv)
{
    int port = 0, nproc = 1, ms = 1000;
    bool merge_only = false;
    const char *dir = NULL;
    const cli_flag flags[] = {
        { .name = "port", .kind = CLI_INT, .dest = &port, .metavar = "P", .min = 1, .max = 65535,
          .help = "the job's CX_PROFILE_PORT (required)" },
        { .name = "nproc", .kind = CLI_INT, .dest = &nproc, .metavar = "N", .min = 1, .max = MAX_RANKS,
          .help = "ranks on this host (ports P .. P+N-1)" },
        { .name = "duration-ms", .kind = CLI_INT, .dest = &ms, .metavar = "MS", .min = 1, .max = 600000,
          .help = "how long to record" },
        { .name = "dir", .kind = CLI_STRING, .dest = &dir, .metavar = "DIR",
          .help = "output (required): DIR/proc_<rank>/trace.json\nand the merged DIR/trace.json" },
        { .name = "merge-only", .kind = CLI_BOOL, .dest = &merge_only,
          .help = "capture nothing: merge the DIR/proc_<rank>\ntraces already there (hosts captured one by one)" },
    };
    const cli_spec spec = {
        .prog = "xla-profile",
        .args = "--port P --dir DIR [flags] | --merge-only --dir DIR",
        .summary = "Capture a trace of every rank of a running job (CX_PROFILE_PORT=P) and merge\n"
                   "them into one Chrome trace, one process per rank, for Perfetto.",
        .epilog = "exit codes: 0 ok, 1 no server, a rank's error or an unreadable trace, 2 bad flag",
        .flags = flags,
        .nflags = (int)(sizeof flags / sizeof *flags),
    };
    cli_result parsed = cli_parse(&spec, argc, argv, NULL);
    if (parsed != CLI_OK) return parsed == CLI_HELP ? 0 : 2;
    const char *bad = !dir                    ? "--dir is required"
                      : !port && !merge_only  ? "--port is required"
                      : port && merge_only    ? "--merge-only captures nothing: drop --port"
                                              : NULL;
    if (bad) { cli_error(&spec, "%s", bad); return 2; }
    char failed[4096], abs_dir[PATH_MAX];
    int err = cx_mkdir_p(dir, failed, sizeof failed);
    if (err || !realpath(dir, abs_dir)) {
        fprintf(stderr, "xla-profile: --dir %s: cannot create %s: %s\n", dir, err ? failed : dir, strerror(err ? err : errno));
        return 1;
    }
    peer *p = NULL;
    bool ok = true;
    if (merge_only) {
        if ((nproc = existing_traces(abs_dir, &p)) < 0) return 1;
        if (nproc == 0) { fprintf(stderr, "xla-profile: --merge-only: no proc_<rank>/trace.json in %s\n", abs_dir); return 1; }
    } else {
        if (!(p = calloc((size_t)nproc, sizeof *p))) { fprintf(stderr, "xla-profile: out of memory\n"); return 1; }
        for (int i = 0; i < nproc; i++) p[i].fd = -1;
        ok = capture(p, nproc, port, ms, abs_dir);
    }
    for (int i = 0; ok && i < nproc; i++)
        if (!(p[i].doc = load_json(p[i].path))) {
            fprintf(stderr, "xla-profile: rank %d's trace %s is not readable JSON\n", p[i].rank, p[i].path);
            ok = false;
        }
    char out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s/trace.json", abs_dir);
    int events = ok ? merge(p, nproc, out) : -1;
    for (int i = 0; i < nproc; i++) {
        if (p[i].fd >= 0) close(p[i].fd);
        cJSON_Delete(p[i].doc);
    }
    free(p);
    if (events < 0) return 1;
    if (merge_only) printf("xla-profile: %d ranks, %d events merged into %s (open it in Perfetto)\n", nproc, events, out);
    else printf("xla-profile: %d ranks, %d ms, %d events merged into %s (open it in Perfetto)\n", nproc, ms, events, out);
    return 0;
}
