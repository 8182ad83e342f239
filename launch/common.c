/* Utilities shared by the launcher and the per-rank wrapper. */
/* Linux-only APIs: pipe2, sched_getaffinity/CPU_COUNT. */
#define _GNU_SOURCE
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void verr(const char *fmt, va_list ap)
{
    char msg[1024];
    int n = snprintf(msg, sizeof msg, "%s: ", XL_NAME);
    if (n < 0) n = 0;
    vsnprintf(msg + n, sizeof msg - (size_t)n - 1, fmt, ap);
    size_t len = strlen(msg);
    msg[len++] = '\n';
    /* one write, so the error line never mixes with other output */
    xl_write_all(2, msg, len);
}

void xl_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verr(fmt, ap);
    va_end(ap);
}

_Noreturn void xl_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verr(fmt, ap);
    va_end(ap);
    exit(2);
}

void *xl_realloc_array(void *p, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) xl_die("out of memory");
    size_t bytes = n * size;
    void *q = realloc(p, bytes > 0 ? bytes : 1);   /* realloc(p, 0) may free p and return NULL */
    if (!q) xl_die("out of memory");
    return q;
}

double xl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool xl_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        p += w;
        len -= (size_t)w;
    }
    return true;
}

bool xl_sendv_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = iov;
        m.msg_iovlen = (size_t)n;
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        /* skip what went out; a stream socket may take only part */
        size_t done = (size_t)w;
        while (n > 0 && done >= iov->iov_len) {
            done -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + done;
            iov->iov_len -= done;
        }
    }
    return true;
}

void xl_put32(unsigned char *p, uint32_t v)
{
    for (int i = 3; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}

uint32_t xl_get32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void xl_put64(unsigned char *p, uint64_t v)
{
    xl_put32(p, (uint32_t)(v >> 32));
    xl_put32(p + 4, (uint32_t)v);
}

uint64_t xl_get64(const unsigned char *p) { return (uint64_t)xl_get32(p) << 32 | xl_get32(p + 4); }

bool xl_write3(int fd, const void *a, size_t na, const void *b, size_t nb,
               const void *c, size_t nc)
{
    struct iovec iov[3] = {
        { (void *)a, na }, { (void *)b, nb }, { (void *)c, nc },
    };
    size_t total = na + nb + nc;
    ssize_t w;
    do {
        w = writev(fd, iov, 3);
    } while (w < 0 && errno == EINTR);
    if (w < 0) return false;
    if ((size_t)w == total) return true;
    /* short write (pipe full, large line): finish piece by piece */
    size_t done = (size_t)w;
    for (int i = 0; i < 3; i++) {
        if (done >= iov[i].iov_len) {
            done -= iov[i].iov_len;
            continue;
        }
        if (!xl_write_all(fd, (char *)iov[i].iov_base + done, iov[i].iov_len - done))
            return false;
        done = 0;
    }
    return true;
}

int xl_cpu_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

bool xl_parse_int(const char *s, long lo, long hi, int *out)
{
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

void xl_random_hex(char *out, size_t nbytes)
{
    unsigned char raw[64];
    if (nbytes > sizeof raw) nbytes = sizeof raw;
    ssize_t got = -1;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        got = read(fd, raw, nbytes);
        close(fd);
    }
    if (got != (ssize_t)nbytes) xl_die("cannot read /dev/urandom");
    for (size_t k = 0; k < nbytes; k++) snprintf(out + 2 * k, 3, "%02x", raw[k]);
}

socklen_t xl_unix_addr(struct sockaddr_un *addr, const char *name)
{
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    size_t n = strlen(name);
    if (n >= sizeof addr->sun_path) n = sizeof addr->sun_path - 1;
    memcpy(addr->sun_path, name, n);
    /* "@name": Linux's abstract namespace, whose names start with a NUL byte and are
     * as long as the address length says */
    if (name[0] == '@') {
        addr->sun_path[0] = 0;
        return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    }
    return (socklen_t)sizeof *addr;
}

/* ---- self-pipe for signals ---- */

static int g_sig_wfd = -1;

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    /* non-blocking: if the pipe is full the loop already has wakeups pending */
    ssize_t r = write(g_sig_wfd, &b, 1);
    (void)r;
    errno = saved;
}

int xl_sigpipe_init(const int *signals, int n)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) xl_die("pipe: %s", strerror(errno));
    g_sig_wfd = fds[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int i = 0; i < n; i++) sigaction(signals[i], &sa, NULL);
    return fds[0];
}

int xl_sigpipe_read(int fd)
{
    unsigned char b;
    ssize_t r = read(fd, &b, 1);
    return r == 1 ? (int)b : 0;
}

void xl_block_signals(const int *signals, int n, bool block)
{
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < n; i++) sigaddset(&set, signals[i]);
    sigprocmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL);
}

void xl_child_reset_signals(const int *signals, int n)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < n; i++) sigaction(signals[i], &sa, NULL);
    sigaction(SIGPIPE, &sa, NULL); /* both parents ignore SIGPIPE; programs must not */
    xl_block_signals(signals, n, false);
}

/* ---- leftover processes ---- */

/* Parent pid and state of /proc/<pid>, or false if it is gone. */
static bool proc_parent(pid_t pid, pid_t *ppid, char *state)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = 0;
    /* "pid (comm) S ppid ...": comm may contain spaces and parentheses */
    char *rp = strrchr(buf, ')');
    if (!rp) return false;
    char st;
    int pp;
    if (sscanf(rp + 1, " %c %d", &st, &pp) != 2) return false;
    *ppid = (pid_t)pp;
    *state = st;
    return true;
}

int xl_sweep_children(double timeout)
{
    pid_t me = getpid();
    double deadline = xl_now() + timeout;
    int killed = 0;
    for (;;) {
        pid_t r;
        while ((r = waitpid(-1, NULL, WNOHANG)) > 0) {}
        if (r < 0 && errno == ECHILD) break;
        /* Children left: kill every live one. Killing one may hand its own children
         * to us (we are a subreaper), so loop until there are none. */
        DIR *d = opendir("/proc");
        if (!d) break;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            char *end;
            long pid = strtol(e->d_name, &end, 10);
            if (*end || pid <= 0 || pid == me) continue;
            pid_t ppid;
            char st;
            if (proc_parent((pid_t)pid, &ppid, &st) && ppid == me && st != 'Z') {
                if (kill((pid_t)pid, SIGKILL) == 0) killed++;
            }
        }
        closedir(d);
        if (xl_now() > deadline) break;
        struct timespec ts = { 0, 5 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return killed;
}

/* ---- line splitting ---- */

void xl_linebuf_init(struct xl_linebuf *lb, int stream)
{
    lb->stream = stream;
    lb->buf = malloc(XL_MAX_LINE);
    if (!lb->buf) xl_die("out of memory");
    lb->len = 0;
}

void xl_linebuf_feed(struct xl_linebuf *lb, const char *data, size_t n, xl_line_fn fn,
                     void *ctx)
{
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        size_t take = nl ? (size_t)(nl - data) : n;
        size_t room = XL_MAX_LINE - lb->len;
        if (take >= room) {
            /* an over-long line: forward what fits as a line of its own */
            memcpy(lb->buf + lb->len, data, room);
            fn(ctx, lb->stream, lb->buf, XL_MAX_LINE);
            lb->len = 0;
            data += room;
            n -= room;
            continue;
        }
        memcpy(lb->buf + lb->len, data, take);
        lb->len += take;
        data += take;
        n -= take;
        if (nl) {
            fn(ctx, lb->stream, lb->buf, lb->len);
            lb->len = 0;
            data++;
            n--;
        }
    }
}

void xl_linebuf_flush(struct xl_linebuf *lb, xl_line_fn fn, void *ctx)
{
    if (lb->len > 0) fn(ctx, lb->stream, lb->buf, lb->len);
    lb->len = 0;
}

void xl_linebuf_free(struct xl_linebuf *lb)
{
    free(lb->buf);
    lb->buf = NULL;
}
