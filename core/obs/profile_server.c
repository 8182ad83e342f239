/* Profiles on demand (the seed's xp.start_server / capture_profile): a
 * thread per process listens on 127.0.0.1, port CX_PROFILE_PORT (or the one
 * given to cx_profiler_start_server) plus the rank's local rank, so the
 * ranks of a node take consecutive ports. A client (xla-profile) sends one
 * line, "capture MS DIR", and gets "ok RANK PATH" or "error MESSAGE" back
 * after the trace of MS milliseconds is written to DIR/proc_<rank>/.
 *
 * Loopback only: a request names a directory the process writes into, which
 * nobody off this host should choose. The training thread never waits for
 * the server; the trace it records is the ordinary cx_trace_start/stop one.
 * The server is started at the first step end with CX_PROFILE_PORT set: by
 * then the comm backend knows the local rank. */
#define _GNU_SOURCE
#include "obs_internal.h"
#include "backend.h"
#include "cx_log.h"
#include "cx_settings.h"

#include <cxla/comm.h>
#include <cxla/profiler.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CAPTURE_MS (10 * 60 * 1000)

static pthread_mutex_t g_ps_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_ps_port;   /* the port listened on, 0: no server */

/* Reads one line (at most cap - 1 bytes, without its '\n'). */
static bool read_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t k = read(fd, buf + n, 1);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        if (buf[n] == '\n') break;
        n++;
    }
    buf[n] = '\0';
    return n > 0;
}

static void reply(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void reply(int fd, const char *fmt, ...)
{
    char buf[4600];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    for (int put = 0; put < n;) {
        ssize_t k = write(fd, buf + put, (size_t)(n - put));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return;
        put += (int)k;
    }
}

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* One request: "capture MS DIR". */
static void serve(int fd)
{
    char line[4200], dir[4100];
    long ms = 0;
    if (!read_line(fd, line, sizeof line)) return;
    if (sscanf(line, "capture %ld %4095[^\n]", &ms, dir) != 2 || ms <= 0 || ms > MAX_CAPTURE_MS) {
        reply(fd, "error bad request '%.200s': want 'capture MS DIR' with 0 < MS <= %d", line, MAX_CAPTURE_MS);
        return;
    }
    if (cx_trace_start(dir) != CX_OK) { reply(fd, "error rank %d: %s", cx_global_ordinal(), cx_last_error()); return; }
    sleep_ms(ms);
    if (cx_trace_stop() != CX_OK) { reply(fd, "error rank %d: %s", cx_global_ordinal(), cx_last_error()); return; }
    reply(fd, "ok %d %s/proc_%d/trace.json", cx_global_ordinal(), dir, cx_global_ordinal());
}

static void *server_main(void *arg)
{
    int ls = (int)(intptr_t)arg;
    for (;;) {
        int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            cx_logf(CX_LOG_ERROR, "profiler", "profile server: accept: %s; the server stops", strerror(errno));
            close(ls);
            return NULL;
        }
        serve(fd);
        close(fd);
    }
}

static int listen_on(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 8) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

cx_status cx_profiler_start_server(int port)
{
    if (port <= 0 || port > 65535) {
        cx_set_last_error("profiler_start_server: port %d is not in 1..65535", port);
        return CX_ERR_ARG;
    }
    int mine = port + cx_comm_local_rank();
    pthread_mutex_lock(&g_ps_mu);
    if (g_ps_port) {
        int at = g_ps_port;
        pthread_mutex_unlock(&g_ps_mu);
        if (at == mine) return CX_OK;
        cx_set_last_error("profiler_start_server: a profile server already listens on port %d", at);
        return CX_ERR_STATE;
    }
    cx_status st = CX_OK;
    int fd = mine <= 65535 ? listen_on(mine) : (errno = EINVAL, -1);
    pthread_t th;
    if (fd < 0) {
        cx_set_last_error("profiler_start_server: cannot listen on 127.0.0.1:%d (rank %d): %s", mine,
                          cx_global_ordinal(), strerror(errno));
        st = CX_ERR_IO;
    } else if (pthread_create(&th, NULL, server_main, (void *)(intptr_t)fd) != 0) {
        close(fd);
        cx_set_last_error("profiler_start_server: cannot start its thread");
        st = CX_ERR_OOM;
    } else {
        pthread_detach(th);
        g_ps_port = mine;
    }
    pthread_mutex_unlock(&g_ps_mu);
    return st;
}

int cx_profiler_server_port(void)
{
    pthread_mutex_lock(&g_ps_mu);
    int p = g_ps_port;
    pthread_mutex_unlock(&g_ps_mu);
    return p;
}

/* CX_PROFILE_PORT: once, at the first step end (sync.c calls the hook while
 * the flag is set). A port that cannot be taken is one line, not an error
 * of the step. */
static void profile_server_from_env(void)
{
    cx_obs_set(OBS_PROFILE_SERVER, false);
    int port = (int)cx_setting_int("CX_PROFILE_PORT");
    if (port > 0 && cx_profiler_start_server(port) != CX_OK)
        cx_logf(CX_LOG_ERROR, "profiler", "CX_PROFILE_PORT=%d: %s", port, cx_last_error());
}

__attribute__((constructor)) static void register_profile_server(void)
{
    cx_obs_hooks.profile_server = profile_server_from_env;
}
