/* xla-launch: the xmp.spawn / torchrun of cxla, over Open MPI's mpirun.
 *
 *   xla-launch [options] PROGRAM [ARGS...]
 *
 * The launcher runs `mpirun <the flags users would otherwise need to know> xla-launch
 * --rank-wrapper PROGRAM ARGS`; each per-rank wrapper (rank_wrapper.c) sets RANK,
 * LOCAL_RANK, ... for its rank, runs PROGRAM and streams its output and fate back here
 * over a socket (see launch.h). This process prints the output with a "[rank R] " prefix, writes
 * per-rank logs, notices the first failing rank, makes sure the whole job ends within
 * seconds, says in one line which rank failed and how, and optionally restarts the job.
 * mpirun's own multi-line reports are kept out of the way unless mpirun itself fails. */
/* Linux-only APIs: pipe2, accept4, prctl, process_vm_readv. */
#define _GNU_SOURCE
#include "launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef XLA_LAUNCH_MPIRUN_DEFAULT
#define XLA_LAUNCH_MPIRUN_DEFAULT "mpirun"
#endif

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

static const char k_usage[] =
    "usage: xla-launch [options] PROGRAM [ARGS...]\n"
    "\n"
    "Run PROGRAM as an N-rank job through Open MPI's mpirun. Every rank gets RANK,\n"
    "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, NODE_RANK,\n"
    "NNODES and CX_NUM_THREADS (= cores / ranks on its node, at least 1; also\n"
    "OMP_NUM_THREADS and OPENBLAS_NUM_THREADS) unless already set. Output lines are\n"
    "prefixed with \"[rank R] \". If any rank fails, the whole job is stopped and the\n"
    "launcher exits 1 naming the rank.\n"
    "\n"
    "options:\n"
    "  --nproc N            number of ranks (default: the number of cores; with a\n"
    "                       hostfile: one rank per slot it lists)\n"
    "  --hostfile F         Open MPI hostfile listing the nodes (multi-node jobs)\n"
    "  --nnodes M           number of nodes (M > 1 needs --hostfile)\n"
    "  --node-rank R        rank of this node (only 0: one command starts all nodes)\n"
    "  --master-addr A      MASTER_ADDR (default: $MASTER_ADDR, the first host of the\n"
    "                       hostfile, or 127.0.0.1)\n"
    "  --master-port P      MASTER_PORT (default: $MASTER_PORT or 29500)\n"
    "  --log-dir D          also write each rank's output to D/rank_<r>.log\n"
    "  --max-restarts K     re-run the whole job up to K times after a failure; the\n"
    "                       job sees XLA_LAUNCH_RESTART_COUNT (and\n"
    "                       TORCHELASTIC_RESTART_COUNT) = 0, 1, ...\n"
    "  --mpirun PATH        mpirun to use (default: $XLA_LAUNCH_MPIRUN, else the one\n"
    "                       found at build time)\n"
    "  --mpirun-arg ARG     pass ARG to mpirun (repeatable)\n"
    "  --verbose            show the mpirun command and mpirun's own messages\n"
    "  -h, --help           show this help\n"
    "  --                   end of options (for a PROGRAM starting with '-')\n"
    "\n"
    "exit status: 0 success, 1 the job failed, 2 bad usage or setup,\n"
    "128+S interrupted by signal S.\n";

struct options {
    int nproc;          /* 0: default */
    const char *hostfile;
    int nnodes;         /* 0: not given */
    int node_rank;
    const char *master_addr;
    const char *master_port;
    const char *log_dir;
    int max_restarts;
    const char *mpirun;
    bool verbose;
    const char **mpirun_args;
    int n_mpirun_args;
    char **prog;
    int nprog;
};

/* ---------------------------------------------------------------- options */

static const char *const k_value_opts[] = {
    "--nproc", "--hostfile", "--nnodes", "--node-rank", "--master-addr", "--master-port",
    "--log-dir", "--max-restarts", "--mpirun", "--mpirun-arg",
};

static int int_opt(const char *name, const char *val, long lo, long hi)
{
    int v;
    if (!xl_parse_int(val, lo, hi, &v))
        xl_die("%s needs an integer in [%ld, %ld], got '%s'", name, lo, hi, val);
    return v;
}

static void parse_args(int argc, char **argv, struct options *o)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == 0) break; /* PROGRAM */
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(k_usage, stdout);
            exit(0);
        }
        /* "--name=value" or "--name value"; torchrun spells names with '_' or '-' */
        char name[64];
        const char *val = NULL;
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        if (nlen >= sizeof name) xl_die("unknown option '%s' (see --help)", a);
        memcpy(name, a, nlen);
        name[nlen] = 0;
        for (char *p = name + 2; *p; p++)
            if (*p == '_') *p = '-';
        if (eq) val = eq + 1;

        if (!strcmp(name, "--verbose") && !val) {
            o->verbose = true;
            continue;
        }
        bool known = false;
        for (size_t k = 0; k < sizeof k_value_opts / sizeof *k_value_opts; k++)
            known |= !strcmp(name, k_value_opts[k]);
        if (!known) xl_die("unknown option '%s' (see --help)", name);
        if (!val) {
            if (i + 1 >= argc) xl_die("%s needs a value", name);
            val = argv[++i];
        }
        if (!strcmp(name, "--nproc")) o->nproc = int_opt(name, val, 1, 1 << 20);
        else if (!strcmp(name, "--nnodes")) o->nnodes = int_opt(name, val, 1, 1 << 20);
        else if (!strcmp(name, "--node-rank")) o->node_rank = int_opt(name, val, 0, 1 << 20);
        else if (!strcmp(name, "--max-restarts")) o->max_restarts = int_opt(name, val, 0, 10000);
        else if (!strcmp(name, "--master-port")) {
            int_opt(name, val, 1, 65535);
            o->master_port = val;
        } else if (!*val) xl_die("%s needs a non-empty value", name);
        else if (!strcmp(name, "--hostfile")) o->hostfile = val;
        else if (!strcmp(name, "--master-addr")) o->master_addr = val;
        else if (!strcmp(name, "--log-dir")) o->log_dir = val;
        else if (!strcmp(name, "--mpirun")) o->mpirun = val;
        else if (!strcmp(name, "--mpirun-arg")) {
            size_t n = (size_t)o->n_mpirun_args + 1;
            o->mpirun_args = realloc(o->mpirun_args, sizeof(char *) * n);
            if (!o->mpirun_args) xl_die("out of memory");
            o->mpirun_args[o->n_mpirun_args++] = val;
        }
    }
    o->prog = argv + i;
    o->nprog = argc - i;
    if (o->nprog == 0) xl_die("no program given (usage: xla-launch [options] PROGRAM [ARGS...])");
}

/* ---------------------------------------------------------------- setup checks */

static bool is_exec_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Full path of an executable as execvp would find it, or NULL. */
static char *find_executable(const char *name)
{
    if (!*name) return NULL;
    if (strchr(name, '/')) return is_exec_file(name) ? strdup(name) : NULL;
    const char *path = getenv("PATH");
    if (!path) path = "/usr/local/bin:/usr/bin:/bin";
    while (1) {
        const char *colon = strchr(path, ':');
        size_t dlen = colon ? (size_t)(colon - path) : strlen(path);
        char *cand = malloc(dlen + strlen(name) + 3);
        if (!cand) xl_die("out of memory");
        if (dlen == 0) sprintf(cand, "./%s", name); /* empty entry = current directory */
        else sprintf(cand, "%.*s/%s", (int)dlen, path, name);
        if (is_exec_file(cand)) return cand;
        free(cand);
        if (!colon) return NULL;
        path = colon + 1;
    }
}

static void check_program(const char *prog)
{
    char *p = find_executable(prog);
    if (p) {
        free(p);
        return;
    }
    struct stat st;
    if (strchr(prog, '/') && stat(prog, &st) == 0)
        xl_die("program '%s' is not an executable file", prog);
    xl_die("program '%s' not found", prog);
}

static char *find_mpirun(const struct options *o)
{
    const char *want = o->mpirun ? o->mpirun : getenv("XLA_LAUNCH_MPIRUN");
    if (want && !*want) want = NULL;
    if (!want) want = XLA_LAUNCH_MPIRUN_DEFAULT;
    char *p = find_executable(want);
    if (!p)
        xl_die("mpirun '%s' not found (install Open MPI, or set --mpirun / XLA_LAUNCH_MPIRUN)",
               want);
    return p;
}

/* Hosts named in an Open MPI hostfile ("host [slots=N] ..." lines, '#' comments).
 * Returns the number of distinct hosts; *first gets the first one. */
static int read_hostfile(const char *path, char **first)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) xl_die("hostfile '%s' not found", path);
        xl_die("cannot read hostfile '%s': %s", path, strerror(errno));
    }
    char line[1024];
    char **hosts = NULL;
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char host[256];
        if (sscanf(line, "%255s", host) != 1) continue;
        bool seen = false;
        for (int i = 0; i < n; i++) seen |= !strcmp(hosts[i], host);
        if (seen) continue;
        hosts = realloc(hosts, sizeof(char *) * (size_t)(n + 1));
        if (!hosts || !(hosts[n] = strdup(host))) xl_die("out of memory");
        n++;
    }
    fclose(f);
    if (n == 0) xl_die("hostfile '%s' lists no hosts", path);
    *first = hosts[0];
    for (int i = 1; i < n; i++) free(hosts[i]);
    free(hosts);
    return n;
}

static void mkdir_p(const char *dir)
{
    char *p = strdup(dir);
    if (!p) xl_die("out of memory");
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                xl_die("cannot create log directory '%s': %s", dir, strerror(errno));
            *s = c;
            if (!c) break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        xl_die("log directory '%s' is not a directory", dir);
    free(p);
}

/* Open MPI's shared-memory transport reads peer memory directly (CMA,
 * process_vm_readv). Containers often forbid that and the job then dies on its first
 * large message, so try it here (the way Open MPI does: the target allows any tracer)
 * and fall back to copy-in/copy-out when it does not work. */
static bool cma_works(void)
{
    static volatile unsigned long probe = 0;
    int ready[2], done[2];
    if (pipe2(ready, O_CLOEXEC) != 0) return false;
    if (pipe2(done, O_CLOEXEC) != 0) {
        close(ready[0]);
        close(ready[1]);
        return false;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(ready[0]);
        close(done[1]);
        prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
        probe = 0x5ca1ab1eUL;
        char c = 1;
        if (write(ready[1], &c, 1) != 1) _exit(1);
        ssize_t r = read(done[0], &c, 1); /* until the parent has looked */
        (void)r;
        _exit(0);
    }
    close(ready[1]);
    close(done[0]);
    bool ok = false;
    char c;
    /* bounded: a probe must never hold up the launch */
    struct pollfd pr = { ready[0], POLLIN, 0 };
    if (pid > 0 && poll(&pr, 1, 2000) == 1 && read(ready[0], &c, 1) == 1) {
        unsigned long v = 0;
        struct iovec local = { &v, sizeof v };
        struct iovec remote = { (void *)&probe, sizeof v };
        ok = process_vm_readv(pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof v &&
             v == 0x5ca1ab1eUL;
    }
    close(ready[0]);
    close(done[1]);
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return ok;
}

/* ---------------------------------------------------------------- sockets */

static char g_sockname[64];

/* Where the wrappers on this node connect: a Unix socket in the abstract namespace, so
 * there is no file to create or to leave behind; the token, not file permissions,
 * keeps strangers out. */
static int make_socket(void)
{
    char rnd[17];
    xl_random_hex(rnd, 8);
    snprintf(g_sockname, sizeof g_sockname, "@xla-launch.%d.%s", (int)getpid(), rnd);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) xl_die("socket: %s", strerror(errno));
    struct sockaddr_un addr;
    socklen_t len = xl_unix_addr(&addr, g_sockname);
    if (bind(fd, (struct sockaddr *)&addr, len) != 0 || listen(fd, SOMAXCONN) != 0)
        xl_die("cannot listen on Unix socket '%s': %s", g_sockname, strerror(errno));
    return fd;
}

/* Wrappers on other nodes connect over TCP, to any of our IPv4 addresses. Returns the
 * listening socket; *env gets "PORT:ADDR,ADDR,...". */
static int make_tcp_listener(char *env, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) xl_die("socket: %s", strerror(errno));
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t al = sizeof addr;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &al) != 0)
        xl_die("cannot listen on a TCP port: %s", strerror(errno));
    int n = snprintf(env, cap, "%d:", ntohs(addr.sin_port));
    struct ifaddrs *ifs = NULL, *i;
    bool any = false;
    if (getifaddrs(&ifs) == 0) {
        for (i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
            if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
            char ip[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip, sizeof ip);
            if ((size_t)n + strlen(ip) + 2 >= cap) break;
            n += snprintf(env + n, cap - (size_t)n, "%s%s", any ? "," : "", ip);
            any = true;
        }
        freeifaddrs(ifs);
    }
    if (!any) snprintf(env + n, cap - (size_t)n, "127.0.0.1");
    return fd;
}

/* ---------------------------------------------------------------- one job */

enum source { SRC_LOST, SRC_MPIRUN, SRC_WRAPPER }; /* trust in a status, low to high */

struct rank_slot {
    pid_t wrapper_pid;   /* local ranks only, while connected */
    int log_fd;          /* -1 not open, -2 failed */
    bool have_status;
    enum source src;
    struct xl_status st;
    double ended;        /* launcher's CLOCK_MONOTONIC, orders the failures */
};

struct conn {
    int fd;
    int rank;            /* -1 until its hello */
    bool local;          /* over the Unix socket: same node, same clock */
    pid_t peer;          /* the wrapper's pid as the kernel says (Unix socket), or 0 */
    unsigned char *buf;  /* bytes received, not yet a whole frame */
    size_t len, cap;
};

struct job {
    const struct options *o;
    int attempt;
    int sigfd, listen_fd, tcp_fd;
    const char *token;
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
    int escalation;      /* 0 none, 1 SIGTERM sent, 2 SIGKILL sent */
    int interrupt_sig;
};

static const int k_signals[] = { SIGINT, SIGTERM, SIGHUP, SIGCHLD };
#define N_SIGNALS ((int)(sizeof k_signals / sizeof k_signals[0]))

static struct rank_slot *slot(struct job *j, int rank)
{
    if (rank < 0 || rank >= (1 << 22)) return NULL;
    if (rank >= j->n_ranks) {
        int n = j->n_ranks ? j->n_ranks : 8;
        while (n <= rank) n *= 2;
        j->ranks = realloc(j->ranks, sizeof *j->ranks * (size_t)n);
        if (!j->ranks) xl_die("out of memory");
        for (int i = j->n_ranks; i < n; i++)
            j->ranks[i] = (struct rank_slot){ .log_fd = -1 };
        j->n_ranks = n;
    }
    return &j->ranks[rank];
}

static int rank_log(struct job *j, int rank)
{
    struct rank_slot *s = slot(j, rank);
    if (!j->o->log_dir || !s) return -1;
    if (s->log_fd == -1) {
        char path[4096];
        snprintf(path, sizeof path, "%s/rank_%d.log", j->o->log_dir, rank);
        /* a restart continues the log of the earlier attempts */
        int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (j->attempt == 0 ? O_TRUNC : 0);
        s->log_fd = open(path, flags, 0666);
        if (s->log_fd < 0) {
            xl_err("cannot write log '%s': %s", path, strerror(errno));
            s->log_fd = -2;
        } else if (j->attempt > 0) {
            char head[96];
            int n = snprintf(head, sizeof head, "=== %s: restart %d ===\n", XL_NAME, j->attempt);
            xl_write_all(s->log_fd, head, (size_t)n);
        }
    }
    return s->log_fd;
}

/* One line of a rank's output: to our stdout/stderr with the rank prefix, and to its log. */
static void emit_line(struct job *j, int rank, int stream, const char *line, size_t len)
{
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
    xl_write3(stream == 2 ? 2 : 1, prefix, (size_t)n, line, len, "\n", 1);
    int fd = rank_log(j, rank);
    if (fd >= 0) xl_write3(fd, line, len, "\n", 1, NULL, 0);
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
                          double ended)
{
    struct rank_slot *s = slot(j, st->rank);
    if (!s) return;
    if (s->have_status && s->src >= src) return;
    s->have_status = true;
    s->src = src;
    s->st = *st;
    s->ended = ended;
    if (xl_status_failed(st) && !stopping(j)) {
        /* The other ranks would only hang in their next collective: stop the local ones
         * now (mpirun needs a second or more to do it); mpirun itself gets time to
         * wind down on its own before we step in. */
        begin_stop(j, STOP_TERM_AFTER);
        signal_wrappers(j, SIGTERM);
    }
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
            record_status(j, &st, SRC_WRAPPER, xl_now());
        }
        return;
    }
    int rank, off = 0;
    if (sscanf(head, "[rank %d]%n", &rank, &off) == 1 && off > 0 && (size_t)off < len &&
        line[off] == ' ') {
        off++;
        emit_line(j, rank, stream, line + off, len - (size_t)off);
        return;
    }

    /* mpirun's own words */
    if (j->o->verbose) xl_write3(2, "mpirun: ", 8, line, len, "\n", 1);
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
        record_status(j, &st, SRC_MPIRUN, xl_now());
    }
}

/* One frame from a wrapper; false if the connection is to be dropped. */
static bool handle_message(struct job *j, struct conn *c, const unsigned char *m, size_t n)
{
    if (n < 1) return false;
    if (c->rank < 0) {
        /* the first frame must be a hello carrying this launch's token */
        if (m[0] != XL_MSG_HELLO || n != XL_HELLO_LEN ||
            memcmp(m + 12, j->token, XL_TOKEN_LEN) != 0)
            return false;
        int rank = (int)xl_get32(m + 4);
        struct rank_slot *s = slot(j, rank);
        if (!s) return false;
        c->rank = rank;
        /* the kernel's word, not the hello's: right even across pid namespaces */
        s->wrapper_pid = c->peer;
        /* the wrapper may have finished already; its frames still count */
        char ack = XL_ACK;
        ssize_t sent = send(c->fd, &ack, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)sent;
        rank_log(j, rank); /* every rank gets a log, even a silent one */
        return true;
    }
    if (m[0] == XL_MSG_LINE && n >= 2) {
        emit_line(j, c->rank, m[1], (const char *)m + 2, n - 2);
    } else if (m[0] == XL_MSG_STATUS && n == XL_STATUS_LEN) {
        struct xl_status st = { .rank = (int)xl_get32(m + 4), .how = (char)m[1],
                                .code = (int)xl_get32(m + 8), .torn_down = m[2] != 0 };
        /* on this node the wrapper's clock is ours: order by when the program really
         * ended; from another node, by arrival */
        double ended = c->local ? (double)(int64_t)xl_get64(m + 12) * 1e-9 : xl_now();
        record_status(j, &st, SRC_WRAPPER, ended);
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
        record_status(j, &st, SRC_LOST, xl_now());
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
            c->buf = realloc(c->buf, cap);
            if (!c->buf) xl_die("out of memory");
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
        j->conns = realloc(j->conns, sizeof *j->conns * (size_t)(j->n_conns + 1));
        if (!j->conns) xl_die("out of memory");
        struct conn c = { .fd = fd, .rank = -1, .local = local };
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (local && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) c.peer = cred.pid;
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
    if (!j->interrupt_sig) {
        j->interrupt_sig = sig;
        begin_stop(j, 0);
    } else {
        /* asked twice: no more grace */
        signal_job(j, SIGKILL);
        j->escalation = 2;
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
        if (j->escalation < 2 && j->stop_at + STOP_KILL_AFTER < t) t = j->stop_at + STOP_KILL_AFTER;
    }
    return t;
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
            if (j->escalation < 2 && since >= STOP_KILL_AFTER) {
                if (j->o->verbose) xl_err("the job did not stop; killing it (SIGKILL)");
                signal_job(j, SIGKILL);
                j->escalation = 2;
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

static const char *sig_name(int sig)
{
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
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
        xl_err("interrupted by %s; job stopped", sig_name(j->interrupt_sig));
        res = JOB_INTERRUPTED;
    } else if (c) {
        int r = c->st.rank, code = c->st.code;
        if (c->st.how == XL_EXITED) xl_err("rank %d exited with status %d", r, code);
        else if (c->st.how == XL_SIGNALED) xl_err("rank %d killed by signal %d", r, code);
        else xl_err("rank %d ended without a report (its wrapper was killed)", r);
        res = JOB_FAILED;
    } else if (!WIFEXITED(j->mpirun_wstatus) || WEXITSTATUS(j->mpirun_wstatus) != 0) {
        /* no rank explains it: mpirun's own words are the explanation */
        for (int i = 0; i < j->n_noise; i++) {
            const char *l = j->noise[i];
            if (l[0] && strspn(l, "-") != strlen(l)) /* not the boxes' rules */
                xl_write3(2, "mpirun: ", 8, l, strlen(l), "\n", 1);
        }
        if (WIFEXITED(j->mpirun_wstatus))
            xl_err("mpirun failed with status %d", WEXITSTATUS(j->mpirun_wstatus));
        else
            xl_err("mpirun killed by signal %d", WTERMSIG(j->mpirun_wstatus));
        res = JOB_FAILED;
    }
    for (int i = 0; i < j->n_noise; i++) free(j->noise[i]);
    for (int i = 0; i < j->n_ranks; i++)
        if (j->ranks[i].log_fd >= 0) close(j->ranks[i].log_fd);
    free(j->ranks);
    free(j->conns);
    return res;
}

/* What stays the same from one attempt to the next. */
struct launch {
    const struct options *o;
    int sigfd;
    int unix_fd, tcp_fd;  /* listening sockets for the wrappers (tcp_fd -1: none) */
    char **mpirun_argv;
};

static enum job_result run_job(const struct launch *l, int attempt, int *interrupt_sig)
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
    j.attempt = attempt;
    j.sigfd = l->sigfd;
    j.listen_fd = l->unix_fd;
    j.tcp_fd = l->tcp_fd;
    j.token = token;
    xl_linebuf_init(&j.pipe_lb[0], 1);
    xl_linebuf_init(&j.pipe_lb[1], 2);
    j.mpirun = start_mpirun(&j, l->mpirun_argv);
    event_loop(&j);
    enum job_result r = finish_job(&j);
    *interrupt_sig = j.interrupt_sig;
    return r;
}

/* ---------------------------------------------------------------- main */

/* A Ctrl-C that arrived between two attempts. */
static int pending_interrupt(int sigfd)
{
    int sig, got = 0;
    while ((sig = xl_sigpipe_read(sigfd)) != 0)
        if (sig != SIGCHLD && !got) got = sig;
    return got;
}

/* The job, and again after each failure while --max-restarts allows. */
static int run_attempts(const struct launch *l)
{
    const struct options *o = l->o;
    for (int attempt = 0;; attempt++) {
        int isig = pending_interrupt(l->sigfd);
        if (isig) {
            xl_err("interrupted by %s", sig_name(isig));
            return 128 + isig;
        }
        enum job_result r = run_job(l, attempt, &isig);
        if (r == JOB_OK) return 0;
        if (r == JOB_INTERRUPTED) return 128 + isig;
        if (attempt >= o->max_restarts) {
            if (o->max_restarts > 0) xl_err("giving up after %d restart(s)", o->max_restarts);
            return 1;
        }
        xl_err("restarting the job (restart %d of %d)", attempt + 1, o->max_restarts);
    }
}

static void add_arg(char ***v, int *n, const char *a)
{
    *v = realloc(*v, sizeof(char *) * (size_t)(*n + 2));
    if (!*v) xl_die("out of memory");
    (*v)[(*n)++] = (char *)a;
    (*v)[*n] = NULL;
}

static void export_var(char ***v, int *n, const char *name, const char *value)
{
    if (value) setenv(name, value, 1);
    add_arg(v, n, "-x"); /* mpirun passes it on to other nodes too */
    add_arg(v, n, name);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--rank-wrapper") == 0)
        return xl_rank_wrapper_main(argc - 2, argv + 2);

    struct options o;
    memset(&o, 0, sizeof o);
    parse_args(argc, argv, &o);

    char *mpirun = find_mpirun(&o);
    check_program(o.prog[0]);

    char *first_host = NULL;
    int n_hosts = o.hostfile ? read_hostfile(o.hostfile, &first_host) : 1;
    if (o.nnodes > 1 && !o.hostfile)
        xl_die("--nnodes %d needs --hostfile: Open MPI starts the ranks of every node from "
               "this one command, so run xla-launch once, on one node, with a hostfile listing "
               "all nodes", o.nnodes);
    if (o.nnodes > 0 && o.node_rank >= o.nnodes)
        xl_die("--node-rank %d must be less than --nnodes %d", o.node_rank, o.nnodes);
    if (o.node_rank > 0)
        xl_die("--node-rank %d: run xla-launch once, on node 0 only; with a hostfile it starts "
               "the ranks of every node itself", o.node_rank);
    if (o.nnodes > n_hosts)
        xl_die("hostfile '%s' lists %d host(s), fewer than --nnodes %d", o.hostfile, n_hosts,
               o.nnodes);
    if (o.log_dir) mkdir_p(o.log_dir);

    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) xl_die("cannot find my own executable (/proc/self/exe): %s", strerror(errno));
    self[sl] = 0;

    /* before any signal handler exists: the probe's child must not run ours */
    bool cma_off = !getenv("OMPI_MCA_btl_vader_single_copy_mechanism") && !cma_works();

    int cores = xl_cpu_count();
    int nproc = o.nproc ? o.nproc : (o.hostfile ? 0 : cores);

    /* Launcher state that must exist before any child does. */
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* orphans of the job come back to us to be ended */
    signal(SIGPIPE, SIG_IGN);
    struct launch l = { .o = &o, .tcp_fd = -1 };
    l.sigfd = xl_sigpipe_init(k_signals, N_SIGNALS);
    l.unix_fd = make_socket();
    char tcp_env[1024];
    /* a hostfile may place ranks on other nodes: they report over TCP */
    if (o.hostfile) l.tcp_fd = make_tcp_listener(tcp_env, sizeof tcp_env);

    /* mpirun command line */
    char **av = NULL;
    int ac = 0;
    char nbuf[16];
    add_arg(&av, &ac, mpirun);
    add_arg(&av, &ac, "--allow-run-as-root"); /* containers often run as root */
    add_arg(&av, &ac, "--oversubscribe");     /* more ranks than cores is allowed */
    add_arg(&av, &ac, "--bind-to");           /* ranks share cores via CX_NUM_THREADS */
    add_arg(&av, &ac, "none");
    if (nproc > 0) {
        snprintf(nbuf, sizeof nbuf, "%d", nproc);
        add_arg(&av, &ac, "-np");
        add_arg(&av, &ac, nbuf);
    }
    if (o.hostfile) {
        add_arg(&av, &ac, "--hostfile");
        add_arg(&av, &ac, o.hostfile);
    }
    if (cma_off) {
        add_arg(&av, &ac, "--mca");
        add_arg(&av, &ac, "btl_vader_single_copy_mechanism");
        add_arg(&av, &ac, "none");
    }
    const char *maddr = o.master_addr ? o.master_addr : getenv("MASTER_ADDR");
    if (!maddr || !*maddr) maddr = first_host ? first_host : "127.0.0.1";
    const char *mport = o.master_port ? o.master_port : getenv("MASTER_PORT");
    if (!mport || !*mport) mport = "29500";
    char nnodes[16];
    snprintf(nnodes, sizeof nnodes, "%d", o.nnodes ? o.nnodes : n_hosts);
    char restarts[16];
    snprintf(restarts, sizeof restarts, "%d", o.max_restarts);
    export_var(&av, &ac, "MASTER_ADDR", maddr);
    export_var(&av, &ac, "MASTER_PORT", mport);
    export_var(&av, &ac, XL_ENV_NNODES, nnodes);
    export_var(&av, &ac, XL_ENV_NODE_RANK, "0");
    export_var(&av, &ac, XL_ENV_SOCKET, g_sockname);
    export_var(&av, &ac, XL_ENV_TOKEN, NULL); /* set by each attempt */
    if (l.tcp_fd >= 0) export_var(&av, &ac, XL_ENV_TCP, tcp_env);
    export_var(&av, &ac, "XLA_LAUNCH_RESTART_COUNT", "0");
    export_var(&av, &ac, "TORCHELASTIC_RESTART_COUNT", "0");
    export_var(&av, &ac, "XLA_LAUNCH_MAX_RESTARTS", restarts);
    export_var(&av, &ac, "TORCHELASTIC_MAX_RESTARTS", restarts);
    static const char *const user_vars[] = { "CX_NUM_THREADS", "OMP_NUM_THREADS",
                                             "OPENBLAS_NUM_THREADS" };
    for (size_t i = 0; i < sizeof user_vars / sizeof *user_vars; i++)
        if (getenv(user_vars[i])) export_var(&av, &ac, user_vars[i], NULL);
    for (int i = 0; i < o.n_mpirun_args; i++) add_arg(&av, &ac, o.mpirun_args[i]);
    add_arg(&av, &ac, self);
    add_arg(&av, &ac, "--rank-wrapper");
    for (int i = 0; i < o.nprog; i++) add_arg(&av, &ac, o.prog[i]);

    if (o.verbose) {
        size_t len = 0;
        for (int i = 0; i < ac; i++) len += strlen(av[i]) + 1;
        char *cmd = malloc(len + 1);
        if (!cmd) xl_die("out of memory");
        cmd[0] = 0;
        for (int i = 0; i < ac; i++) {
            strcat(cmd, av[i]);
            if (i + 1 < ac) strcat(cmd, " ");
        }
        xl_err("running: %s", cmd);
        free(cmd);
    }

    l.mpirun_argv = av;
    int rc = run_attempts(&l);
    free(av);
    free(mpirun);
    free(first_host);
    free(o.mpirun_args);
    return rc;
}
