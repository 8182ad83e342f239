/* The per-rank wrapper: `xla-launch --rank-wrapper PROGRAM ARGS...`, which mpirun starts
 * once per rank. RANK and LOCAL_RANK differ per process, so they can only be set here:
 * the wrapper turns Open MPI's OMPI_COMM_WORLD_* into the torchrun names, runs PROGRAM
 * as its child with stdout/stderr on pipes, forwards the output line by line to the
 * launcher (over the Unix socket on the launcher's node, TCP from other nodes, mpirun's
 * output forwarding if neither works) and finally reports how PROGRAM ended.
 *
 * Nothing may outlive the job: PROGRAM gets PR_SET_PDEATHSIG(SIGKILL) so it dies with
 * its wrapper, runs in its own process group that the wrapper signals as a whole, and
 * the wrapper is a child subreaper so that anything PROGRAM daemonizes comes back to it
 * and is killed when PROGRAM ends. */
/* Linux-only APIs: pipe2, prctl. */
#define _GNU_SOURCE
#include "launch.h"

#include "cx_job.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Grace between forwarding SIGTERM to PROGRAM and SIGKILL. mpirun itself escalates to
 * SIGKILL on the wrapper after ~1 s, which PDEATHSIG carries on to PROGRAM. */
#define TERM_GRACE 3.0
/* How long to wait for the output pipes to close once PROGRAM and its group are dead. */
#define DRAIN_GRACE 1.0

/* SIGUSR1: the early warning of a Slurm job (--signal=USR1@T), a stop like SIGTERM */
static const int k_signals[] = { SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGCHLD };
#define N_SIGNALS ((int)(sizeof k_signals / sizeof k_signals[0]))

struct wrapper {
    int rank, local_rank, world, local_world;
    int sock;            /* connection to the launcher, -1 in fallback mode */
    char prefix[32];     /* "[rank R] " for fallback output */
    size_t prefix_len;
    pid_t child;
    bool child_done;
    int child_wstatus;
    bool torn_down;      /* asked to stop before PROGRAM ended on its own */
    double kill_at;      /* when to SIGKILL PROGRAM's group, 0 = not scheduled */
    int64_t ended_ns;    /* CLOCK_MONOTONIC when PROGRAM was reaped */
};

static void set_env_int(const char *name, int v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%d", v);
    setenv(name, buf, 1);
}

/* Export the torchrun-style variables and the thread budget for PROGRAM. */
static void export_rank_env(struct wrapper *w)
{
    /* the library's reader of the launchers' variables: the rank a program
     * finds through cx_job_place is the one its output is prefixed with */
    cx_job_info j;
    char msg[512];
    if (!cx_job_read(&j, msg, sizeof msg)) xl_die("%s", msg);
    if (!cx_job_has_mpi(&j) || j.rank < 0 || j.world < 1 || j.local_rank < 0)
        xl_die("--rank-wrapper is internal and runs under mpirun or srun --mpi=pmix (no rank in the environment)");
    w->rank = j.rank;
    w->local_rank = j.local_rank;
    w->world = j.world;
    w->local_world = j.local_world < 1 ? 1 : j.local_world;
    set_env_int("RANK", w->rank);
    set_env_int("LOCAL_RANK", w->local_rank);
    set_env_int("WORLD_SIZE", w->world);
    set_env_int("LOCAL_WORLD_SIZE", w->local_world);

    /* Node numbering: with the default by-slot mapping every node holds LOCAL_WORLD_SIZE
     * consecutive ranks, so the node is RANK / LOCAL_WORLD_SIZE. For irregular layouts
     * keep what the launcher was told (--nnodes / --node-rank). */
    int nnodes = 1, node_rank = 0;
    const char *v = getenv(XL_ENV_NNODES);
    if (v) xl_parse_int(v, 1, 1 << 30, &nnodes);
    v = getenv(XL_ENV_NODE_RANK);
    if (v) xl_parse_int(v, 0, 1 << 30, &node_rank);
    if (w->world % w->local_world == 0) {
        nnodes = w->world / w->local_world;
        node_rank = w->rank / w->local_world;
    }
    set_env_int("NNODES", nnodes);
    set_env_int("NODE_RANK", node_rank);
    set_env_int("GROUP_WORLD_SIZE", nnodes);
    set_env_int("GROUP_RANK", node_rank);

    /* Ranks on one node share its cores; an explicit setting by the user wins. */
    int threads = xl_cpu_count() / w->local_world;
    if (threads < 1) threads = 1;
    if (!getenv("CX_NUM_THREADS")) set_env_int("CX_NUM_THREADS", threads);
    const char *cx = getenv("CX_NUM_THREADS");
    setenv("OMP_NUM_THREADS", cx, 0);
    setenv("OPENBLAS_NUM_THREADS", cx, 0);
}

static void launcher_lost(struct wrapper *w);

/* One frame to the launcher; on failure the launcher is taken to be gone. */
static void send_msg(struct wrapper *w, const void *payload, size_t n, const void *body,
                     size_t nb)
{
    if (w->sock < 0) return;
    unsigned char len[4];
    xl_put32(len, (uint32_t)(n + nb));
    struct iovec iov[3] = { { len, 4 }, { (void *)payload, n }, { (void *)body, nb } };
    if (!xl_sendv_all(w->sock, iov, body ? 3 : 2)) launcher_lost(w);
}

/* The node's name goes along: a node that vanishes is named by it, not
 * only by the address its connection came from. */
static void send_hello(struct wrapper *w, const char *token)
{
    unsigned char msg[XL_HELLO_LEN] = { XL_MSG_HELLO };
    xl_put32(msg + 4, (uint32_t)w->rank);
    xl_put32(msg + 8, (uint32_t)getpid());
    memcpy(msg + 12, token, XL_TOKEN_LEN);
    char node[XL_NODE_NAME_MAX + 2] = "";
    const char *slurm = getenv("SLURMD_NODENAME");   /* Slurm's name for it, as scontrol shows it */
    if (slurm && *slurm) snprintf(node, sizeof node, "%s", slurm);
    else if (gethostname(node, sizeof node - 1) != 0) node[0] = '\0';
    node[XL_NODE_NAME_MAX] = '\0';
    send_msg(w, msg, sizeof msg, node, strlen(node));
}

static int connect_unix(void)
{
    const char *name = getenv(XL_ENV_SOCKET);
    if (!name || !*name) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_un addr;
    socklen_t len = xl_unix_addr(&addr, name);
    /* on another node there is no such socket */
    if (connect(fd, (struct sockaddr *)&addr, len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* wait for fd to be ready for `events`, at most `timeout` seconds */
static bool wait_fd(int fd, short events, double timeout)
{
    double end = xl_now() + timeout;
    for (;;) {
        struct pollfd p = { fd, events, 0 };
        int ms = (int)((end - xl_now()) * 1000);
        if (ms < 0) return false;
        int r = poll(&p, 1, ms);
        if (r > 0) return true;
        if (r == 0 || errno != EINTR) return false;
    }
}

static int connect_tcp(const char *ip, int port, double timeout)
{
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, ip, &addr.sin_addr) != 1) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int err = 0;
    socklen_t el = sizeof err;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 &&
        (errno != EINPROGRESS || !wait_fd(fd, POLLOUT, timeout) ||
         getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0)) {
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int one = 1; /* lines should not wait for more lines */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Send the hello on a fresh connection and wait for the launcher's ack: proof that the
 * other end is this job's launcher, and nothing left unread when we close. */
static bool handshake(struct wrapper *w, const char *token, double timeout)
{
    int fd = w->sock;
    send_hello(w, token);
    char ack = 0;
    if (w->sock >= 0 && wait_fd(fd, POLLIN, timeout) && recv(fd, &ack, 1, 0) == 1 &&
        ack == XL_ACK)
        return true;
    if (w->sock >= 0) close(w->sock);
    w->sock = -1;
    return false;
}

/* Reach the launcher: its Unix socket on the same node, else one of its addresses over
 * TCP. Leaves w->sock = -1 when neither works: output then goes through mpirun. */
static void connect_launcher(struct wrapper *w)
{
    const char *token = getenv(XL_ENV_TOKEN);
    if (!token || strlen(token) != XL_TOKEN_LEN) return;
    /* the socket exists, so the launcher does: give it time to answer */
    w->sock = connect_unix();
    if (w->sock >= 0 && handshake(w, token, 30.0)) return;
    const char *tcp = getenv(XL_ENV_TCP);
    int port, off = 0;
    if (!tcp || sscanf(tcp, "%d:%n", &port, &off) != 1 || off == 0) return;
    char list[1024];
    snprintf(list, sizeof list, "%s", tcp + off);
    char *save = NULL;
    for (char *ip = strtok_r(list, ",", &save); ip; ip = strtok_r(NULL, ",", &save)) {
        w->sock = connect_tcp(ip, port, 2.0);
        /* an address that is not the launcher's will not answer the hello */
        if (w->sock >= 0 && handshake(w, token, 3.0)) return;
    }
}

/* One line of PROGRAM's output (or of the wrapper's own messages). */
static void sink_line(void *ctx, int stream, const char *line, size_t len)
{
    struct wrapper *w = ctx;
    if (w->sock >= 0) {
        unsigned char hdr[2] = { XL_MSG_LINE, (unsigned char)stream };
        send_msg(w, hdr, sizeof hdr, line, len);
        if (w->sock >= 0) return;
    }
    xl_write3(stream == 2 ? 2 : 1, w->prefix, w->prefix_len, line, len, "\n", 1);
}

static void wrapper_say(struct wrapper *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void wrapper_say(struct wrapper *w, const char *fmt, ...)
{
    char msg[512];
    int n = snprintf(msg, sizeof msg, "%s: ", XL_NAME);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    sink_line(w, 2, msg, strlen(msg));
}

static void send_status(struct wrapper *w, const struct xl_status *st)
{
    if (w->sock >= 0) {
        unsigned char msg[XL_STATUS_LEN] = { XL_MSG_STATUS, (unsigned char)st->how,
                                             (unsigned char)st->torn_down };
        xl_put32(msg + 4, (uint32_t)st->rank);
        xl_put32(msg + 8, (uint32_t)st->code);
        xl_put64(msg + 12, (uint64_t)w->ended_ns);
        send_msg(w, msg, sizeof msg, NULL, 0);
        if (w->sock >= 0) return;
    }
    char line[128];
    int n = snprintf(line, sizeof line, "%srank=%d how=%c code=%d torn=%d\n", XL_STATUS_MARK,
                     st->rank, st->how, st->code, st->torn_down ? 1 : 0);
    xl_write_all(2, line, (size_t)n);
}

/* The job is being stopped (mpirun's SIGTERM, our parent died, or the launcher went
 * away): pass it on to PROGRAM's whole group and schedule the SIGKILL. */
/* SIGTERM from the launcher is a preemption: PROGRAM gets the launcher's
 * grace (XLA_LAUNCH_PREEMPT_GRACE) to save and stop; other stops get TERM_GRACE. */
static void begin_teardown(struct wrapper *w, int sig)
{
    if (w->child <= 0 || w->child_done || w->torn_down) return;
    w->torn_down = true;
    kill(-w->child, sig);
    const char *g = getenv("XLA_LAUNCH_PREEMPT_GRACE");
    double grace = sig == SIGTERM && g ? atof(g) : 0;
    w->kill_at = xl_now() + (grace > TERM_GRACE ? grace : TERM_GRACE);
}

/* The connection broke: the launcher is gone, so the job is over. (While connecting,
 * before PROGRAM runs, it only means: use mpirun's forwarding.) */
static void launcher_lost(struct wrapper *w)
{
    if (w->sock >= 0) close(w->sock);
    w->sock = -1;
    begin_teardown(w, SIGTERM);
}

static void reap(struct wrapper *w)
{
    int st;
    pid_t p;
    /* also reaps orphans we adopted as subreaper */
    while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        if (p == w->child && !w->child_done) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            w->ended_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
            w->child_done = true;
            w->child_wstatus = st;
            /* whatever PROGRAM left behind goes with it */
            kill(-w->child, SIGKILL);
            xl_sweep_children(1.0);
        }
    }
}

static pid_t spawn_program(struct wrapper *w, char **argv, int out_w, int err_w)
{
    pid_t parent = getpid();
    xl_block_signals(k_signals, N_SIGNALS, true);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127); /* wrapper already gone */
        xl_child_reset_signals(k_signals, N_SIGNALS);
        dup2(out_w, 1);
        dup2(err_w, 2);
        /* the launcher's plumbing is not PROGRAM's business */
        unsetenv(XL_ENV_SOCKET);
        unsetenv(XL_ENV_TCP);
        unsetenv(XL_ENV_TOKEN);
        unsetenv(XL_ENV_NNODES);
        unsetenv(XL_ENV_NODE_RANK);
        execvp(argv[0], argv);
        dprintf(2, "%s: cannot run '%s': %s\n", XL_NAME, argv[0], strerror(errno));
        _exit(127);
    }
    int e = errno;
    if (pid > 0) setpgid(pid, pid); /* closes the race with the child's own setpgid */
    xl_block_signals(k_signals, N_SIGNALS, false);
    if (pid < 0) wrapper_say(w, "fork failed: %s", strerror(e));
    return pid;
}

/* Pipes for PROGRAM's stdout and stderr, then PROGRAM; fds gets the read ends, made
 * non-blocking because one loop serves both of them, the signals and the launcher. */
static void start_program(struct wrapper *w, char **argv, int fds[2])
{
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
        xl_die("pipe: %s", strerror(errno));
    w->child = spawn_program(w, argv, out[1], err[1]);
    close(out[1]);
    close(err[1]);
    if (w->child < 0) {
        w->child_done = true;
        w->child_wstatus = 127 << 8;
    }
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    fds[0] = out[0];
    fds[1] = err[0];
}

/* What poll found ready: p[0] the signal pipe, p[1] and p[2] PROGRAM's stdout and
 * stderr (fds, closed here at EOF), p[3] the launcher's socket. */
static void serve_ready(struct wrapper *w, int sigfd, const struct pollfd *p, int fds[2],
                        struct xl_linebuf lb[2])
{
    static char buf[65536];
    if (p[0].revents) {
        int sig;
        while ((sig = xl_sigpipe_read(sigfd)) != 0) {
            if (sig == SIGCHLD) reap(w);
            else begin_teardown(w, SIGTERM);
        }
    }
    for (int i = 0; i < 2; i++) {
        if (fds[i] < 0 || !p[1 + i].revents) continue;
        ssize_t n = read(fds[i], buf, sizeof buf);
        if (n > 0) {
            xl_linebuf_feed(&lb[i], buf, (size_t)n, sink_line, w);
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
            close(fds[i]);
            fds[i] = -1;
        }
    }
    if (w->sock >= 0 && p[3].revents) {
        /* the launcher never sends more than the ack: EOF or an error means it is gone */
        char b[16];
        ssize_t n = recv(w->sock, b, sizeof b, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) launcher_lost(w);
    }
}

/* Forwards PROGRAM's output until PROGRAM has ended and its pipes are drained (at most
 * DRAIN_GRACE after its end: a grandchild may hold them open), passing stops on to it
 * and killing its group once the grace of a stop is over. */
static void forward_until_done(struct wrapper *w, int sigfd, int fds[2], struct xl_linebuf lb[2])
{
    double drain_until = 0;
    for (;;) {
        double now = xl_now();
        if (w->child_done) {
            if (drain_until == 0) drain_until = now + DRAIN_GRACE;
            if ((fds[0] < 0 && fds[1] < 0) || now >= drain_until) break;
        }
        if (w->kill_at > 0 && !w->child_done && now >= w->kill_at) {
            kill(-w->child, SIGKILL);
            w->kill_at = 0;
        }
        double next = w->child_done ? drain_until : (w->kill_at > 0 ? w->kill_at : now + 3600);
        int timeout = (int)((next - now) * 1000) + 1;
        if (timeout < 0) timeout = 0;

        struct pollfd p[4];
        int np = 0;
        p[np++] = (struct pollfd){ sigfd, POLLIN, 0 };
        for (int i = 0; i < 2; i++) p[np++] = (struct pollfd){ fds[i], POLLIN, 0 };
        /* the ack is long read: readable or hung up now means the launcher is gone */
        p[np++] = (struct pollfd){ w->sock, POLLIN, 0 };
        if (poll(p, (nfds_t)np, timeout) < 0) {
            if (errno == EINTR) continue;
            xl_die("poll: %s", strerror(errno));
        }
        serve_ready(w, sigfd, p, fds, lb);
    }
}

/* Tells the launcher how PROGRAM ended. @return the wrapper's exit code: PROGRAM's, or
 * 128 + the signal that killed it, as a shell would report it. */
static int report_end(struct wrapper *w)
{
    struct xl_status st = { .rank = w->rank, .torn_down = w->torn_down };
    int code;
    if (WIFSIGNALED(w->child_wstatus)) {
        st.how = XL_SIGNALED;
        st.code = WTERMSIG(w->child_wstatus);
        code = 128 + st.code;
    } else {
        st.how = XL_EXITED;
        st.code = WEXITSTATUS(w->child_wstatus);
        code = st.code;
    }
    send_status(w, &st);
    if (w->sock >= 0) close(w->sock);
    return code;
}

int xl_rank_wrapper_main(int argc, char **argv)
{
    if (argc < 1) xl_die("--rank-wrapper needs a program");
    struct wrapper w;
    memset(&w, 0, sizeof w);
    w.sock = -1;
    export_rank_env(&w);
    w.prefix_len = (size_t)snprintf(w.prefix, sizeof w.prefix, "[rank %d] ", w.rank);

    /* If mpirun (or orted) dies, so do we, and PDEATHSIG takes PROGRAM along. */
    pid_t parent = getppid();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) return 1;
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    signal(SIGPIPE, SIG_IGN);
    int sigfd = xl_sigpipe_init(k_signals, N_SIGNALS);

    connect_launcher(&w);

    /* stopped while still connecting: do not start PROGRAM at all */
    for (int sig; (sig = xl_sigpipe_read(sigfd)) != 0;) {
        if (sig == SIGCHLD) continue;
        struct xl_status st = { .rank = w.rank, .how = XL_SIGNALED, .code = SIGTERM,
                                .torn_down = true };
        send_status(&w, &st);
        return 128 + SIGTERM;
    }

    int fds[2];
    start_program(&w, argv, fds);
    struct xl_linebuf lb[2];
    xl_linebuf_init(&lb[0], 1);
    xl_linebuf_init(&lb[1], 2);
    forward_until_done(&w, sigfd, fds, lb);
    reap(&w);
    for (int i = 0; i < 2; i++) {
        xl_linebuf_flush(&lb[i], sink_line, &w);
        xl_linebuf_free(&lb[i]);
        if (fds[i] >= 0) close(fds[i]);
    }
    return report_end(&w);
}
