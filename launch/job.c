/* One run of the job and its supervision: mpirun is started in its own process group,
 * the wrappers' connections and mpirun's output are read in one poll loop, the first
 * failing rank stops the whole job (SIGTERM, then SIGKILL if it does not end), the
 * leftovers are swept, and the failure is named in one line; then the restarts. */
/* Linux-only APIs: pipe2, accept4, prctl, SO_PEERCRED. */
#define _GNU_SOURCE
#include "launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* Once a rank has failed, mpirun normally ends the job in about a second. If it has not
 * ended after STOP_TERM_AFTER we SIGTERM it (and the local wrappers), after
 * STOP_KILL_AFTER we SIGKILL them; the sweep that follows ends any straggler, so the job
 * is gone well inside 10 s. */
#define STOP_TERM_AFTER 3.0
#define STOP_KILL_AFTER 6.0
/* After mpirun exits, how long to wait for the wrappers' last lines and reports. */
#define DRAIN_AFTER_EXIT 2.0
/* mpirun lines kept to explain a failure of mpirun itself. */
#define MAX_NOISE 200

enum source { SRC_LOST, SRC_MPIRUN, SRC_WRAPPER }; /* trust in a status, low to high */

struct rank_slot {
    pid_t wrapper_pid;   /* local ranks only, while connected */
    bool have_status;
    enum source src;
    struct xl_status st;
    double ended;        /* launcher's CLOCK_MONOTONIC, orders the failures */
    double noticed;      /* when the launcher learnt of it */
    bool ended_exact;    /* ended is the program's end (this node), not the news's arrival */
    char host[64];       /* the wrapper's address as the launcher saw it; "" for this node */
    char node[XL_NODE_NAME_MAX + 1];   /* its node's name, as the wrapper says */
};

struct conn {
    int fd;
    int rank;            /* -1 until its hello */
    bool local;          /* over the Unix socket: same node, same clock */
    pid_t peer;          /* the wrapper's pid as the kernel says (Unix socket), or 0 */
    char host[64];       /* the peer's address (TCP: another node), or "" */
    unsigned char *buf;  /* bytes received, not yet a whole frame */
    size_t len, cap;
};

struct job {
    const struct options *o;
    int sigfd, listen_fd, tcp_fd;
    const char *token;
    const char *runner;  /* "mpirun", or "srun" in a Slurm allocation */
    struct rank_slot *ranks;
    int n_ranks;
    struct conn *conns;
    int n_conns;
    pid_t mpirun;
    bool mpirun_done;
    int mpirun_wstatus;
    double mpirun_done_at;
    int pipe_fd[2];
    struct xl_linebuf pipe_lb[2];
    char *noise[MAX_NOISE];
    int n_noise;
    double stop_at;      /* 0: running normally */
    double term_after;
    double kill_after;   /* SIGKILL this long after the stop began (0: STOP_KILL_AFTER) */
    int escalation;      /* 0 none, 1 SIGTERM sent, 2 SIGKILL sent */
    double killed_at;    /* when the SIGKILL went out (0: not yet): ranks silent after it may be ours */
    int interrupt_sig;
    char saved[512];     /* a rank's "saved step N in DIR; rerun with --resume auto" */
    struct xl_output out;
    struct xl_watch watch;
    double next_watch;
    bool stalled;        /* the watchdog stopped the job */
    int attempt;         /* 0, then one more per restart */
    double started;      /* when this attempt began */
    bool recovered;      /* a restarted attempt's first step is done (reported) */
    int pages, stepped;  /* ranks with a status page; of them, ranks that ended a step */
};

/* SIGUSR1: a Slurm job's early warning (#SBATCH --signal=B:USR1@T), a
 * preemption like SIGTERM */
static const int k_signals[] = { SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD };
#define N_SIGNALS ((int)(sizeof k_signals / sizeof k_signals[0]))

int xl_job_signals_init(void) { return xl_sigpipe_init(k_signals, N_SIGNALS); }

static struct rank_slot *slot(struct job *j, int rank)
{
    if (rank < 0 || rank >= XL_MAX_RANKS) return NULL;
    if (rank >= j->n_ranks) {
        int n = j->n_ranks ? j->n_ranks : 8;
        while (n <= rank) n *= 2;
        j->ranks = xl_realloc_array(j->ranks, (size_t)n, sizeof *j->ranks);
        for (int i = j->n_ranks; i < n; i++) j->ranks[i] = (struct rank_slot){ 0 };
        j->n_ranks = n;
    }
    return &j->ranks[rank];
}

/* Signal the wrappers we know: the local ones, while they are connected (an open
 * connection means the pid still belongs to the wrapper). */
static void signal_wrappers(struct job *j, int sig)
{
    for (int i = 0; i < j->n_conns; i++) {
        struct conn *c = &j->conns[i];
        if (c->fd >= 0 && c->rank >= 0 && j->ranks[c->rank].wrapper_pid > 0)
            kill(j->ranks[c->rank].wrapper_pid, sig);
    }
}

static void signal_job(struct job *j, int sig)
{
    if (!j->mpirun_done) kill(sig == SIGKILL ? -j->mpirun : j->mpirun, sig);
    signal_wrappers(j, sig);
}

static void begin_stop(struct job *j, double term_after)
{
    if (j->stop_at == 0) {
        j->stop_at = xl_now();
        j->term_after = term_after;
    } else if (term_after < j->term_after) {
        j->term_after = term_after;
    }
}

/* Once the job is being stopped, any further failure is a consequence of the stop. */
static bool stopping(const struct job *j) { return j->stop_at > 0; }

static void record_status(struct job *j, const struct xl_status *st, enum source src,
                          double ended, bool exact)
{
    struct rank_slot *s = slot(j, st->rank);
    if (!s) return;
    if (s->have_status && s->src >= src) return;
    s->have_status = true;
    s->src = src;
    s->st = *st;
    s->ended = ended;
    s->noticed = xl_now();
    s->ended_exact = exact;
    if (xl_status_failed(st) && !stopping(j)) {
        /* The other ranks would only hang in their next collective: stop the local ones
         * now (mpirun needs a second or more to do it); mpirun itself gets time to
         * wind down on its own before we step in. */
        begin_stop(j, STOP_TERM_AFTER);
        signal_wrappers(j, SIGTERM);
    }
}

static const char *sig_name(int sig)
{
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
    }
}

/* A rank's line goes out as it came. A preempted program's "saved step N in
 * DIR; rerun with --resume auto" is also kept: by the job's end it has
 * scrolled past the other ranks' lines, so the launcher's last line repeats it. */
static void rank_line(struct job *j, int rank, int stream, const char *line, size_t len)
{
    xl_output_line(&j->out, rank, stream, line, len);
    static const char head[] = "saved step ", tail[] = "; rerun with --resume auto";
    const char *at = j->interrupt_sig ? memmem(line, len, head, sizeof head - 1) : NULL;
    size_t n = at ? len - (size_t)(at - line) : 0;
    if (n < sizeof tail || n >= sizeof j->saved || memcmp(line + len - (sizeof tail - 1), tail, sizeof tail - 1)) return;
    memcpy(j->saved, at, n);
    j->saved[n] = 0;
}

/* One line of mpirun's (or srun's) own, under its name (srun's lines
 * carry it already). */
static void runner_line(const struct job *j, const char *line, size_t len)
{
    char head[16];
    int n = snprintf(head, sizeof head, "%s: ", j->runner);
    if (len >= (size_t)n && !memcmp(line, head, (size_t)n)) n = 0;
    xl_write3(2, head, (size_t)n, line, len, "\n", 1);
}

static void handle_mpirun_line(void *ctx, int stream, const char *line, size_t len)
{
    struct job *j = ctx;
    char head[256];
    size_t hn = len < sizeof head - 1 ? len : sizeof head - 1;
    memcpy(head, line, hn);
    head[hn] = 0;

    /* a wrapper on another node: its lines and report come through mpirun */
    size_t mlen = strlen(XL_STATUS_MARK);
    if (len >= mlen && memcmp(line, XL_STATUS_MARK, mlen) == 0) {
        struct xl_status st;
        int torn;
        if (sscanf(head + mlen, "rank=%d how=%c code=%d torn=%d", &st.rank, &st.how, &st.code,
                   &torn) == 4) {
            st.torn_down = torn != 0;
            record_status(j, &st, SRC_WRAPPER, xl_now(), false);
        }
        return;
    }
    int rank, off = 0;
    if (sscanf(head, "[rank %d]%n", &rank, &off) == 1 && off > 0 && (size_t)off < len &&
        line[off] == ' ') {
        off++;
        rank_line(j, rank, stream, line + off, len - (size_t)off);
        return;
    }

    /* mpirun's own words */
    if (j->o->verbose) runner_line(j, line, len);
    else if (j->n_noise < MAX_NOISE) {
        char *copy = malloc(len + 1);
        if (copy) {
            memcpy(copy, line, len);
            copy[len] = 0;
            j->noise[j->n_noise++] = copy;
        }
    }
    /* A wrapper killed outright cannot report; mpirun still names it. */
    int sig;
    if (sscanf(head, "mpirun noticed that process rank %d with PID %*d on node %*s exited "
                     "on signal %d", &rank, &sig) == 2) {
        struct xl_status st = { .rank = rank, .how = XL_SIGNALED, .code = sig,
                                .torn_down = stopping(j) };
        record_status(j, &st, SRC_MPIRUN, xl_now(), false);
    }
}

/* One frame from a wrapper; false if the connection is to be dropped. */
static bool handle_message(struct job *j, struct conn *c, const unsigned char *m, size_t n)
{
    if (n < 1) return false;
    if (c->rank < 0) {
        /* the first frame must be a hello carrying this launch's token */
        if (m[0] != XL_MSG_HELLO || n < XL_HELLO_LEN || n > XL_HELLO_LEN + XL_NODE_NAME_MAX ||
            memcmp(m + 12, j->token, XL_TOKEN_LEN) != 0)
            return false;
        int rank = (int)xl_get32(m + 4);
        struct rank_slot *s = slot(j, rank);
        if (!s) return false;
        c->rank = rank;
        /* the kernel's word, not the hello's: right even across pid namespaces */
        s->wrapper_pid = c->peer;
        memcpy(s->host, c->host, sizeof s->host);
        memcpy(s->node, m + XL_HELLO_LEN, n - XL_HELLO_LEN);
        s->node[n - XL_HELLO_LEN] = '\0';
        /* the wrapper may have finished already; its frames still count */
        char ack = XL_ACK;
        ssize_t sent = send(c->fd, &ack, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)sent;
        xl_output_open_log(&j->out, rank); /* every rank gets a log, even a silent one */
        return true;
    }
    if (m[0] == XL_MSG_LINE && n >= 2) {
        rank_line(j, c->rank, m[1], (const char *)m + 2, n - 2);
    } else if (m[0] == XL_MSG_STATUS && n == XL_STATUS_LEN) {
        struct xl_status st = { .rank = (int)xl_get32(m + 4), .how = (char)m[1],
                                .code = (int)xl_get32(m + 8), .torn_down = m[2] != 0 };
        /* on this node the wrapper's clock is ours: order by when the program really
         * ended; from another node, by arrival */
        double ended = c->local ? (double)(int64_t)xl_get64(m + 12) * 1e-9 : xl_now();
        record_status(j, &st, SRC_WRAPPER, ended, c->local);
    }
    return true;
}

static void conn_closed(struct job *j, struct conn *c)
{
    close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
    struct rank_slot *s = c->rank >= 0 ? slot(j, c->rank) : NULL;
    if (!s) return;
    s->wrapper_pid = 0;
    if (!s->have_status) {
        struct xl_status st = { .rank = c->rank, .how = XL_LOST, .torn_down = stopping(j) };
        record_status(j, &st, SRC_LOST, xl_now(), false);
    }
}

static void read_conn(struct job *j, struct conn *c)
{
    /* a bounded batch per wakeup keeps the other ranks' turns fair */
    for (int k = 0; k < 64; k++) {
        if (c->cap - c->len < 4096) {
            size_t cap = c->cap ? 2 * c->cap : 8192;
            if (cap > 4 + XL_MAX_FRAME + 4096) cap = 4 + XL_MAX_FRAME + 4096;
            if (cap <= c->cap) break;
            c->buf = xl_realloc_array(c->buf, cap, 1);
            c->cap = cap;
        }
        ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {
            conn_closed(j, c);
            return;
        }
        c->len += (size_t)n;
        /* every whole frame in the buffer */
        size_t at = 0;
        while (c->len - at >= 4) {
            size_t flen = xl_get32(c->buf + at);
            if (flen > XL_MAX_FRAME) {
                conn_closed(j, c); /* not one of our wrappers */
                return;
            }
            if (c->len - at - 4 < flen) break;
            if (!handle_message(j, c, c->buf + at + 4, flen)) {
                conn_closed(j, c);
                return;
            }
            at += 4 + flen;
        }
        memmove(c->buf, c->buf + at, c->len - at);
        c->len -= at;
    }
}

static void accept_conns(struct job *j, int listen_fd, bool local)
{
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) return;
        j->conns = xl_realloc_array(j->conns, (size_t)j->n_conns + 1, sizeof *j->conns);
        struct conn c = { .fd = fd, .rank = -1, .local = local };
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (local && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) c.peer = cred.pid;
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        if (!local && getpeername(fd, (struct sockaddr *)&sa, &sl) == 0 &&
            getnameinfo((struct sockaddr *)&sa, sl, c.host, sizeof c.host, NULL, 0, NI_NUMERICHOST) != 0)
            c.host[0] = 0;
        j->conns[j->n_conns++] = c;
    }
}

static void on_signal(struct job *j, int sig)
{
    if (sig == SIGCHLD) {
        int st;
        pid_t p;
        /* we are a subreaper: orphans of the job land here too */
        while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
            if (p == j->mpirun) {
                j->mpirun_done = true;
                j->mpirun_wstatus = st;
                j->mpirun_done_at = xl_now();
            }
        }
        return;
    }
    if (!j->interrupt_sig && (sig == SIGTERM || sig == SIGINT || sig == SIGUSR1) && j->o->preempt_grace > 0) {
        /* preemption, and a first Ctrl-C alike (a checkpoint manager saves
         * on either): the ranks get SIGTERM first, which the wrappers pass
         * on with the grace, to agree on a step, save and exit; mpirun only
         * after it */
        j->interrupt_sig = sig;
        xl_err("%s: asking the ranks to save and stop (grace %g s%s)", sig_name(sig), j->o->preempt_grace,
               sig == SIGINT ? "; Ctrl-C again stops at once" : "");
        signal_wrappers(j, SIGTERM);
        begin_stop(j, j->o->preempt_grace);
        j->kill_after = j->o->preempt_grace + STOP_KILL_AFTER;
    } else if (!j->interrupt_sig) {
        j->interrupt_sig = sig;
        begin_stop(j, 0);
    } else {
        /* asked twice: no more grace */
        signal_job(j, SIGKILL);
        j->escalation = 2;
        j->killed_at = xl_now();
    }
}

static pid_t start_mpirun(struct job *j, char **argv)
{
    int outp[2], errp[2];
    if (pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0)
        xl_die("pipe: %s", strerror(errno));
    pid_t self = getpid();
    xl_block_signals(k_signals, N_SIGNALS, true);
    pid_t pid = fork();
    if (pid == 0) {
        /* own process group: a terminal's Ctrl-C reaches only us, and we stop the job
         * in order; PDEATHSIG ends mpirun (and so the job) if we are killed */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != self) _exit(127);
        xl_child_reset_signals(k_signals, N_SIGNALS);
        dup2(outp[1], 1);
        dup2(errp[1], 2);
        execv(argv[0], argv);
        dprintf(2, "%s: cannot run mpirun '%s': %s\n", XL_NAME, argv[0], strerror(errno));
        _exit(127);
    }
    int e = errno;
    if (pid > 0) setpgid(pid, pid);
    xl_block_signals(k_signals, N_SIGNALS, false);
    if (pid < 0) xl_die("fork: %s", strerror(e));
    close(outp[1]);
    close(errp[1]);
    j->pipe_fd[0] = outp[0];
    j->pipe_fd[1] = errp[0];
    fcntl(outp[0], F_SETFL, O_NONBLOCK);
    fcntl(errp[0], F_SETFL, O_NONBLOCK);
    return pid;
}

static double next_deadline(const struct job *j, double now)
{
    double t = now + 1.0;
    if (j->mpirun_done) {
        if (j->mpirun_done_at + DRAIN_AFTER_EXIT < t) t = j->mpirun_done_at + DRAIN_AFTER_EXIT;
    } else if (j->stop_at > 0) {
        if (j->escalation < 1 && j->stop_at + j->term_after < t) t = j->stop_at + j->term_after;
        double kill = j->kill_after > 0 ? j->kill_after : STOP_KILL_AFTER;
        if (j->escalation < 2 && j->stop_at + kill < t) t = j->stop_at + kill;
    }
    return t;
}

/* Reads the ranks' progress (once a second, and at the end): whether a step
 * completed in this attempt, and, after a restart, how long recovery took. */
static void watch_progress(struct job *j)
{
    struct xl_progress p;
    if (!xl_watch_progress(&j->watch, &p)) return;
    if (p.pages > j->pages) j->pages = p.pages;
    if (p.stepped > j->stepped) j->stepped = p.stepped;
    if (j->attempt == 0 || j->recovered || p.first_step <= 0) return;
    j->recovered = true;
    double total = p.first_step - j->started, spawn = p.opened - j->started;
    double step = total - spawn - p.load_s - p.compile_s;
    char compile[96];
    if (p.cache_hits > 0)
        snprintf(compile, sizeof compile, "compile %.3f s (persistent cache: %lld hits)", p.compile_s, p.cache_hits);
    else
        snprintf(compile, sizeof compile, "compile %.3f s (no persistent cache hits)", p.compile_s);
    xl_err("recovered in %.2f s (restart %d: spawn %.2f s, load %.3f s, %s, first step %.2f s)", total, j->attempt,
           spawn, p.load_s, compile, step > 0 ? step : 0);
}

static void event_loop(struct job *j)
{
    static char buf[65536];
    for (;;) {
        double now = xl_now();
        if (j->mpirun_done) {
            bool open = j->pipe_fd[0] >= 0 || j->pipe_fd[1] >= 0 || j->n_conns > 0;
            if (!open || now >= j->mpirun_done_at + DRAIN_AFTER_EXIT) return;
        } else if (j->stop_at > 0) {
            double since = now - j->stop_at;
            if (j->escalation < 1 && since >= j->term_after) {
                if (j->o->verbose) xl_err("stopping the job (SIGTERM)");
                signal_job(j, SIGTERM);
                j->escalation = 1;
            }
            if (j->escalation < 2 && since >= (j->kill_after > 0 ? j->kill_after : STOP_KILL_AFTER)) {
                if (j->o->verbose) xl_err("the job did not stop; killing it (SIGKILL)");
                signal_job(j, SIGKILL);
                j->escalation = 2;
                j->killed_at = now;
            }
        }
        if (!j->mpirun_done && j->stop_at == 0 && now >= j->next_watch) {
            j->next_watch = now + 1.0;
            watch_progress(j);
            if (xl_watch_check(&j->watch, j->o->log_dir)) {
                j->stalled = true;
                begin_stop(j, 0);
            }
        }
        int timeout = (int)((next_deadline(j, now) - now) * 1000) + 1;
        if (timeout < 0) timeout = 0;

        int np = 5 + j->n_conns;
        struct pollfd *p = calloc((size_t)np, sizeof *p);
        if (!p) xl_die("out of memory");
        p[0] = (struct pollfd){ j->sigfd, POLLIN, 0 };
        p[1] = (struct pollfd){ j->pipe_fd[0], POLLIN, 0 };
        p[2] = (struct pollfd){ j->pipe_fd[1], POLLIN, 0 };
        p[3] = (struct pollfd){ j->listen_fd, POLLIN, 0 };
        p[4] = (struct pollfd){ j->tcp_fd, POLLIN, 0 };
        for (int i = 0; i < j->n_conns; i++)
            p[5 + i] = (struct pollfd){ j->conns[i].fd, POLLIN, 0 };
        int r = poll(p, (nfds_t)np, timeout);
        if (r < 0 && errno != EINTR) xl_die("poll: %s", strerror(errno));
        if (r <= 0) {
            free(p);
            continue;
        }
        /* the ranks' reports first: they name the cause better than mpirun does */
        int nc = j->n_conns;
        for (int i = 0; i < nc; i++)
            if (p[5 + i].revents) read_conn(j, &j->conns[i]);
        if (p[3].revents) accept_conns(j, j->listen_fd, true);
        if (p[4].revents) accept_conns(j, j->tcp_fd, false);
        for (int s = 0; s < 2; s++) {
            if (!p[1 + s].revents) continue;
            ssize_t n = read(j->pipe_fd[s], buf, sizeof buf);
            if (n > 0) {
                xl_linebuf_feed(&j->pipe_lb[s], buf, (size_t)n, handle_mpirun_line, j);
            } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                xl_linebuf_flush(&j->pipe_lb[s], handle_mpirun_line, j);
                close(j->pipe_fd[s]);
                j->pipe_fd[s] = -1;
            }
        }
        if (p[0].revents) {
            int sig;
            while ((sig = xl_sigpipe_read(j->sigfd)) != 0) on_signal(j, sig);
        }
        free(p);
        /* drop closed connections */
        int k = 0;
        for (int i = 0; i < j->n_conns; i++)
            if (j->conns[i].fd >= 0) j->conns[k++] = j->conns[i];
        j->n_conns = k;
    }
}

/* The rank whose failure explains the job's end: among failures that were not caused
 * by the stop itself, the one that ended first. */
static const struct rank_slot *find_culprit(const struct job *j)
{
    const struct rank_slot *best = NULL;
    for (int i = 0; i < j->n_ranks; i++) {
        const struct rank_slot *s = &j->ranks[i];
        if (!s->have_status || !xl_status_failed(&s->st)) continue;
        if (!best || (s->st.torn_down < best->st.torn_down) ||
            (s->st.torn_down == best->st.torn_down && s->ended < best->ended))
            best = s;
    }
    return best;
}

enum job_result { JOB_OK, JOB_FAILED, JOB_INTERRUPTED };

/* When every rank of another node vanished without a word (the node died,
 * or everything on it was killed): says so, naming the node and its ranks.
 * A lost node explains the job's end whatever ended first: the ranks of
 * the other nodes may fail (a peer gone) or be stopped before the lost
 * ones' connections are seen to close.
 * @return whether that is what happened. */
static bool lost_host(const struct job *j)
{
    for (int h = 0; h < j->n_ranks; h++) {
        const struct rank_slot *first = &j->ranks[h];
        if (!first->have_status || first->st.how != XL_LOST || !first->host[0]) continue;
        char ranks[512];
        size_t len = 0;
        int n = 0;
        bool all = true;
        for (int i = 0; i < j->n_ranks && all; i++) {
            const struct rank_slot *s = &j->ranks[i];
            if (strcmp(s->host, first->host)) continue;
            all = s->have_status && s->st.how == XL_LOST && (j->killed_at == 0 || s->noticed < j->killed_at);
            len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%s%d", n ? "," : "", i);
            if (len >= sizeof ranks) len = sizeof ranks - 1;
            n++;
        }
        if (!all) continue;
        char name[sizeof first->node + sizeof first->host + 4];
        if (first->node[0]) snprintf(name, sizeof name, "%s (%s;", first->node, first->host);
        else snprintf(name, sizeof name, "%s (", first->host);
        xl_err("lost node %s rank%s %s): every process of it ended without a report (the node died or was killed)",
               name, n > 1 ? "s" : "", ranks);
        return true;
    }
    return false;
}

static enum job_result finish_job(struct job *j)
{
    for (int s = 0; s < 2; s++) {
        if (j->pipe_fd[s] >= 0) {
            xl_linebuf_flush(&j->pipe_lb[s], handle_mpirun_line, j);
            close(j->pipe_fd[s]);
        }
        xl_linebuf_free(&j->pipe_lb[s]);
    }
    for (int i = 0; i < j->n_conns; i++) conn_closed(j, &j->conns[i]);
    j->n_conns = 0;
    /* mpirun is gone; anything of the job still alive was orphaned to us */
    int strays = xl_sweep_children(3.0);
    if (strays > 0 && j->o->verbose) xl_err("killed %d leftover process(es) of the job", strays);

    enum job_result res = JOB_OK;
    const struct rank_slot *c = find_culprit(j);
    if (j->interrupt_sig) {
        if (j->saved[0]) xl_err("interrupted by %s; %s", sig_name(j->interrupt_sig), j->saved);
        else xl_err("interrupted by %s; job stopped", sig_name(j->interrupt_sig));
        res = JOB_INTERRUPTED;
    } else if (j->stalled) {
        xl_err("job stopped by the collective watchdog");
        res = JOB_FAILED;
    } else if (c && lost_host(j)) {
        res = JOB_FAILED;   /* said by lost_host */
    } else if (c) {
        int r = c->st.rank, code = c->st.code;
        /* the time to detect: the program's end until the launcher knew (on
         * this node, where the wrapper's clock is the launcher's) */
        char detect[64] = "";
        if (c->ended_exact) snprintf(detect, sizeof detect, " (detected in %.2f ms)", (c->noticed - c->ended) * 1e3);
        if (c->st.how == XL_EXITED) xl_err("rank %d exited with status %d%s", r, code, detect);
        else if (c->st.how == XL_SIGNALED) xl_err("rank %d killed by signal %d%s", r, code, detect);
        else xl_err("rank %d ended without a report (its wrapper was killed)", r);
        res = JOB_FAILED;
    } else if (!WIFEXITED(j->mpirun_wstatus) || WEXITSTATUS(j->mpirun_wstatus) != 0) {
        /* no rank explains it: mpirun's own words are the explanation */
        for (int i = 0; i < j->n_noise; i++) {
            const char *l = j->noise[i];
            if (l[0] && strspn(l, "-") != strlen(l)) /* not the boxes' rules */
                runner_line(j, l, strlen(l));
        }
        if (WIFEXITED(j->mpirun_wstatus))
            xl_err("%s failed with status %d", j->runner, WEXITSTATUS(j->mpirun_wstatus));
        else
            xl_err("%s killed by signal %d", j->runner, WTERMSIG(j->mpirun_wstatus));
        res = JOB_FAILED;
    }
    for (int i = 0; i < j->n_noise; i++) free(j->noise[i]);
    watch_progress(j);   /* the pages outlive the ranks until the cleanup */
    xl_watch_cleanup(&j->watch);
    xl_output_close(&j->out);
    free(j->ranks);
    free(j->conns);
    return res;
}

/* One attempt. *stepped: -1 when no rank kept a status page (not a cxla
 * program, or no page could be made), else whether a rank ended a step. */
static enum job_result run_job(const struct launch *l, int attempt, int *interrupt_sig, int *stepped)
{
    char n[16];
    snprintf(n, sizeof n, "%d", attempt);
    setenv("XLA_LAUNCH_RESTART_COUNT", n, 1);
    setenv("TORCHELASTIC_RESTART_COUNT", n, 1);

    /* a new secret per attempt: a straggler of an earlier attempt cannot join */
    char token[XL_TOKEN_LEN + 1];
    xl_random_hex(token, XL_TOKEN_LEN / 2);
    setenv(XL_ENV_TOKEN, token, 1);

    struct job j;
    memset(&j, 0, sizeof j);
    j.o = l->o;
    j.sigfd = l->sigfd;
    j.listen_fd = l->unix_fd;
    j.tcp_fd = l->tcp_fd;
    j.token = token;
    j.runner = l->via_srun ? "srun" : "mpirun";
    xl_output_init(&j.out, l->o->log_dir, attempt);
    xl_linebuf_init(&j.pipe_lb[0], 1);
    xl_linebuf_init(&j.pipe_lb[1], 2);
    xl_watch_init(&j.watch, l->o->max_restarts > 0);
    j.attempt = attempt;
    j.started = xl_now();
    char grace[32];
    snprintf(grace, sizeof grace, "%g", l->o->preempt_grace);
    setenv("XLA_LAUNCH_PREEMPT_GRACE", grace, 1);
    j.mpirun = start_mpirun(&j, l->mpirun_argv);
    event_loop(&j);
    enum job_result r = finish_job(&j);
    *interrupt_sig = j.interrupt_sig;
    *stepped = j.pages == 0 ? -1 : j.stepped > 0;
    return r;
}

/* A Ctrl-C that arrived between two attempts. */
static int pending_interrupt(int sigfd)
{
    int sig, got = 0;
    while ((sig = xl_sigpipe_read(sigfd)) != 0)
        if (sig != SIGCHLD && !got) got = sig;
    return got;
}

int xl_run_attempts(const struct launch *l)
{
    const struct options *o = l->o;
    for (int attempt = 0;; attempt++) {
        int isig = pending_interrupt(l->sigfd);
        if (isig) {
            xl_err("interrupted by %s", sig_name(isig));
            return 128 + isig;
        }
        int stepped;
        enum job_result r = run_job(l, attempt, &isig, &stepped);
        if (r == JOB_OK) return 0;
        if (r == JOB_INTERRUPTED) return 128 + isig;
        if (attempt >= o->max_restarts) {
            if (o->max_restarts > 0) xl_err("giving up after %d restart(s)", o->max_restarts);
            return 1;
        }
        if (stepped == 0) {
            xl_err("not restarting: the job failed before its first step completed, and would fail the same way");
            return 1;
        }
        xl_err("restarting the job (restart %d of %d)", attempt + 1, o->max_restarts);
    }
}
