/* xla-launch: the xmp.spawn / torchrun of cxla, over Open MPI's mpirun.
 *
 *   xla-launch [flags] PROGRAM [ARGS...]
 *
 * The launcher runs `mpirun <the flags users would otherwise need to know> xla-launch
 * --rank-wrapper PROGRAM ARGS`; each per-rank wrapper (rank_wrapper.c) sets RANK,
 * LOCAL_RANK, ... for its rank, runs PROGRAM and streams its output and fate back here
 * over a socket (see launch.h). This process prints the output with a "[rank R] " prefix, writes
 * per-rank logs, notices the first failing rank, makes sure the whole job ends within
 * seconds, says in one line which rank failed and how, and optionally restarts the job.
 * mpirun's own multi-line reports are kept out of the way unless mpirun itself fails.
 * This file builds the mpirun command line; launcher.h lists the other parts. */
/* Linux-only APIs: pipe2, prctl, process_vm_readv. */
#define _GNU_SOURCE
#include "launcher.h"

#include <cxla/logging.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* srun exports the whole environment to the step; mpirun only what -x names */
static bool g_via_srun;

void xl_add_arg(char ***v, int *n, const char *a)
{
    *v = xl_realloc_array(*v, (size_t)*n + 2, sizeof **v);
    (*v)[(*n)++] = (char *)a;
    (*v)[*n] = NULL;
}

static void export_var(char ***v, int *n, const char *name, const char *value)
{
    if (value) setenv(name, value, 1);
    if (g_via_srun) return;
    xl_add_arg(v, n, "-x"); /* mpirun passes it on to other nodes too */
    xl_add_arg(v, n, name);
}

/* The settings of cxla, PyTorch/XLA, OpenMP and OpenBLAS set where the
 * launcher runs reach every rank on every node (mpirun -x NAME). The
 * launcher's own XLA_LAUNCH_* variables are exported one by one.
 * @return the names (NULL-terminated; free each, then the array). */
static char **forward_settings(char ***v, int *n)
{
    static const char *const prefixes[] = { "CX_", "XLA_", "PT_XLA_", "OMP_", "OPENBLAS_" };
    char **names = NULL;
    int k = 0;
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || !strncmp(*e, "XLA_LAUNCH_", 11)) continue;
        bool match = false;
        for (size_t p = 0; p < sizeof prefixes / sizeof *prefixes && !match; p++)
            match = !strncmp(*e, prefixes[p], strlen(prefixes[p]));
        if (!match) continue;
        names = xl_realloc_array(names, (size_t)k + 2, sizeof *names);
        names[k] = strndup(*e, (size_t)(eq - *e));
        if (!names[k]) xl_die("out of memory");
        export_var(v, n, names[k], NULL);
        names[++k] = NULL;
    }
    return names;
}

/* --nnodes and --node-rank against the hostfile: one xla-launch, on node 0, starts the
 * ranks of every node, so anything else is a mistake to name before mpirun runs. */
static void check_nodes(const struct options *o, int n_hosts)
{
    if (o->nnodes > 1 && !o->hostfile && !g_via_srun)
        xl_die("--nnodes %d needs --hostfile: Open MPI starts the ranks of every node from "
               "this one command, so run xla-launch once, on one node, with a hostfile listing "
               "all nodes", o->nnodes);
    if (o->nnodes > 0 && o->node_rank >= o->nnodes)
        xl_die("--node-rank %d must be less than --nnodes %d", o->node_rank, o->nnodes);
    if (o->node_rank > 0)
        xl_die("--node-rank %d: run xla-launch once, on node 0 only; with a hostfile it starts "
               "the ranks of every node itself", o->node_rank);
    if (o->nnodes > n_hosts && g_via_srun)
        xl_die("the Slurm allocation has %d node(s), fewer than --nnodes %d", n_hosts, o->nnodes);
    if (o->nnodes > n_hosts)
        xl_die("hostfile '%s' lists %d host(s), fewer than --nnodes %d", o->hostfile, n_hosts,
               o->nnodes);
}

/* mpirun's own flags: the ones users would otherwise need to know. */
static void add_mpirun_flags(char ***av, int *ac, const struct options *o, int nproc, bool cma_off)
{
    static char nbuf[16];   /* an argument of the command line, which outlives this call */
    xl_add_arg(av, ac, "--allow-run-as-root"); /* containers often run as root */
    xl_add_arg(av, ac, "--oversubscribe");     /* more ranks than cores is allowed */
    xl_add_arg(av, ac, "--bind-to");           /* ranks share cores via CX_NUM_THREADS */
    xl_add_arg(av, ac, "none");
    if (nproc > 0) {
        snprintf(nbuf, sizeof nbuf, "%d", nproc);
        xl_add_arg(av, ac, "-np");
        xl_add_arg(av, ac, nbuf);
    }
    if (o->hostfile) {
        xl_add_arg(av, ac, "--hostfile");
        xl_add_arg(av, ac, o->hostfile);
    }
    if (cma_off) {
        xl_add_arg(av, ac, "--mca");
        xl_add_arg(av, ac, "btl_vader_single_copy_mechanism");
        xl_add_arg(av, ac, "none");
    }
}

/* What every rank is told: the torchrun rendezvous and restart variables, and how to
 * reach this launcher (tcp_env NULL: only over the Unix socket). */
static void export_job_env(char ***av, int *ac, const struct options *o, const char *first_host,
                           int n_hosts, const char *sockname, const char *tcp_env)
{
    const char *maddr = o->master_addr ? o->master_addr : getenv("MASTER_ADDR");
    if (!maddr || !*maddr) maddr = first_host ? first_host : "127.0.0.1";
    char port[16];
    if (o->master_port) snprintf(port, sizeof port, "%d", o->master_port);
    const char *mport = o->master_port ? port : getenv("MASTER_PORT");
    if (!mport || !*mport) mport = "29500";
    char nnodes[16];
    snprintf(nnodes, sizeof nnodes, "%d", o->nnodes ? o->nnodes : n_hosts);
    char restarts[16];
    snprintf(restarts, sizeof restarts, "%d", o->max_restarts);
    export_var(av, ac, "MASTER_ADDR", maddr);
    export_var(av, ac, "MASTER_PORT", mport);
    export_var(av, ac, XL_ENV_NNODES, nnodes);
    export_var(av, ac, XL_ENV_NODE_RANK, "0");
    export_var(av, ac, XL_ENV_SOCKET, sockname);
    export_var(av, ac, XL_ENV_TOKEN, NULL); /* set by each attempt */
    if (tcp_env) export_var(av, ac, XL_ENV_TCP, tcp_env);
    export_var(av, ac, "XLA_LAUNCH_RESTART_COUNT", "0");
    export_var(av, ac, "TORCHELASTIC_RESTART_COUNT", "0");
    export_var(av, ac, "XLA_LAUNCH_MAX_RESTARTS", restarts);
    export_var(av, ac, "TORCHELASTIC_MAX_RESTARTS", restarts);
}

/* --verbose: the whole mpirun command line, on one line. */
static void print_command(char **av, int ac)
{
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

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--rank-wrapper") == 0)
        return xl_rank_wrapper_main(argc - 2, argv + 2);

    struct options o;
    xl_parse_options(argc, argv, &o);

    /* in an allocation the ranks are one job step of it, unless a hostfile
     * names the nodes (then mpirun over ssh, as outside Slurm) */
    struct xl_slurm slurm;
    xl_slurm_read(&slurm);
    g_via_srun = slurm.in_alloc && !o.hostfile;
    char *mpirun = g_via_srun ? xl_find_srun() : xl_find_mpirun(&o);
    xl_check_program(o.prog[0]);
    /* the ranks would each report a bad value and carry on with the default */
    char bad[512];
    if (!cx_settings_check(bad, sizeof bad)) xl_die("%s", bad);

    char *first_host = NULL;
    int n_hosts = o.hostfile ? xl_read_hostfile(o.hostfile, &first_host) : g_via_srun ? slurm.nodes : 1;
    if (g_via_srun && slurm.first_host[0] && !(first_host = strdup(slurm.first_host))) xl_die("out of memory");
    check_nodes(&o, n_hosts);
    if (o.log_dir) xl_make_log_dir(o.log_dir);

    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) xl_die("cannot find my own executable (/proc/self/exe): %s", strerror(errno));
    self[sl] = 0;

    /* before any signal handler exists: the probe's child must not run ours */
    bool cma_off = !getenv("OMPI_MCA_btl_vader_single_copy_mechanism") && !cma_works();

    int nproc = g_via_srun ? xl_slurm_nproc(&slurm, &o) : o.nproc ? o.nproc : (o.hostfile ? 0 : xl_cpu_count());

    /* Launcher state that must exist before any child does. */
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* orphans of the job come back to us to be ended */
    signal(SIGPIPE, SIG_IGN);
    struct launch l = { .o = &o, .tcp_fd = -1 };
    l.sigfd = xl_job_signals_init();
    char sockname[64];
    l.unix_fd = xl_listen_unix(sockname, sizeof sockname);
    char tcp_env[1024];
    /* a hostfile or an allocation may place ranks on other nodes: they report over TCP */
    if (o.hostfile || n_hosts > 1) l.tcp_fd = xl_listen_tcp(tcp_env, sizeof tcp_env);

    char **av = NULL;
    int ac = 0;
    xl_add_arg(&av, &ac, mpirun);
    if (g_via_srun) xl_slurm_srun_flags(&av, &ac, &o, nproc);
    else add_mpirun_flags(&av, &ac, &o, nproc, cma_off);
    if (g_via_srun && cma_off) setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
    export_job_env(&av, &ac, &o, first_host, n_hosts, sockname, l.tcp_fd >= 0 ? tcp_env : NULL);
    char **forwarded = forward_settings(&av, &ac);
    for (int i = 0; i < o.mpirun_args.n; i++) xl_add_arg(&av, &ac, o.mpirun_args.v[i]);
    xl_add_arg(&av, &ac, self);
    xl_add_arg(&av, &ac, "--rank-wrapper");
    for (int i = 0; i < o.nprog; i++) xl_add_arg(&av, &ac, o.prog[i]);
    if (o.verbose) print_command(av, ac);

    l.mpirun_argv = av;
    l.via_srun = g_via_srun;
    int rc = xl_run_attempts(&l);
    for (int i = 0; forwarded && forwarded[i]; i++) free(forwarded[i]);
    free(forwarded);
    free(av);
    free(mpirun);
    free(first_host);
    xl_options_free(&o);
    return rc;
}
