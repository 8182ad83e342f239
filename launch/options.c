/* xla-launch's command line (through cli/, as every program of the project), and the
 * checks of what it names: PROGRAM, mpirun, the log directory. */
#include "launcher.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef XLA_LAUNCH_MPIRUN_DEFAULT
#define XLA_LAUNCH_MPIRUN_DEFAULT "mpirun"
#endif

static const char k_summary[] =
    "Run PROGRAM as an N-rank job through Open MPI's mpirun (in a Slurm allocation,\n"
    "as one job step through srun --mpi=pmix, on the nodes and tasks it grants).\n"
    "Every rank gets RANK,\n"
    "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, NODE_RANK,\n"
    "NNODES and CX_NUM_THREADS (= cores / ranks on its node, at least 1; also\n"
    "OMP_NUM_THREADS and OPENBLAS_NUM_THREADS) unless already set. Output lines are\n"
    "prefixed with \"[rank R] \". If any rank fails, the whole job is stopped and the\n"
    "launcher exits 1 naming the rank.";

static const char k_epilog[] =
    "The flags end at PROGRAM, or at \"--\" (for a PROGRAM starting with '-').\n"
    "\n"
    "exit status: 0 success, 1 the job failed, 2 bad usage or setup,\n"
    "128+S interrupted by signal S.";

void xl_parse_options(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof *o);
    o->preempt_grace = 60;
    /* torchrun's spellings are the same flags: --master_addr, --nproc_per_node */
    const char *rdzv = NULL;
    bool standalone = false;
    const cli_flag flags[] = {
        { .name = "nproc", .kind = CLI_INT, .dest = &o->nproc, .min = 1, .max = 1 << 20,
          .help = "number of ranks (default: the number of cores; with a\nhostfile: one rank per slot it lists; in a Slurm\nallocation: the tasks it grants)" },
        { .name = "nproc-per-node", .kind = CLI_INT, .dest = &o->nproc, .min = 1, .max = 1 << 20,
          .help = "torchrun's name for --nproc" },
        { .name = "rdzv-endpoint", .kind = CLI_STRING, .dest = &rdzv, .metavar = "HOST[:PORT]",
          .help = "torchrun's rendezvous: MASTER_ADDR (and MASTER_PORT)" },
        { .name = "standalone", .kind = CLI_BOOL, .dest = &standalone,
          .help = "torchrun's single node with a local rendezvous: what\nxla-launch does without --hostfile" },
        { .name = "hostfile", .kind = CLI_STRING, .dest = &o->hostfile, .metavar = "F",
          .help = "Open MPI hostfile listing the nodes (multi-node jobs)" },
        { .name = "nnodes", .kind = CLI_INT, .dest = &o->nnodes, .metavar = "M", .min = 1, .max = 1 << 20,
          .help = "number of nodes (M > 1 needs --hostfile)" },
        { .name = "node-rank", .kind = CLI_INT, .dest = &o->node_rank, .metavar = "R", .min = 0, .max = 1 << 20,
          .help = "rank of this node: only 0, one command starts all nodes" },
        { .name = "master-addr", .kind = CLI_STRING, .dest = &o->master_addr, .metavar = "A",
          .help = "MASTER_ADDR (default: $MASTER_ADDR, the first host of the\nhostfile, or 127.0.0.1)" },
        { .name = "master-port", .kind = CLI_INT, .dest = &o->master_port, .metavar = "P", .min = 1, .max = 65535,
          .help = "MASTER_PORT (default: $MASTER_PORT or 29500)" },
        { .name = "log-dir", .kind = CLI_STRING, .dest = &o->log_dir, .metavar = "D",
          .help = "also write each rank's output to D/rank_<r>.log" },
        { .name = "max-restarts", .kind = CLI_INT, .dest = &o->max_restarts, .metavar = "K", .min = 0, .max = 10000,
          .help = "re-run the whole job up to K times after a failure; the\n"
                  "job sees XLA_LAUNCH_RESTART_COUNT (and\nTORCHELASTIC_RESTART_COUNT) = 0, 1, ..." },
        { .name = "preempt-grace", .kind = CLI_DOUBLE, .dest = &o->preempt_grace, .metavar = "S", .min = 0,
          .max = 86400, .help = "on SIGTERM or a first Ctrl-C, give the ranks S seconds to\n"
                                "save a checkpoint and stop (programs with a checkpoint\n"
                                "manager; Ctrl-C again stops at once), 0 = stop\nat once" },
        { .name = "mpirun", .kind = CLI_STRING, .dest = &o->mpirun, .metavar = "PATH",
          .help = "mpirun to use (default: $XLA_LAUNCH_MPIRUN, else the one\nfound at build time, "
                  XLA_LAUNCH_MPIRUN_DEFAULT ")" },
        { .name = "oversubscribe", .kind = CLI_BOOL, .dest = &o->oversubscribe,
          .help = "in a Slurm allocation, allow --nproc above the tasks it\ngrants (srun --overcommit)" },
        { .name = "mpirun-arg", .kind = CLI_STRINGS, .dest = &o->mpirun_args, .metavar = "ARG",
          .help = "pass ARG to mpirun (to srun in a Slurm allocation)" },
        { .name = "verbose", .kind = CLI_BOOL, .dest = &o->verbose,
          .help = "show the mpirun command and mpirun's own messages" },
    };
    const cli_spec spec = {
        .prog = XL_NAME,
        .args = "[flags] PROGRAM [ARGS...]",
        .summary = k_summary,
        .epilog = k_epilog,
        .flags = flags,
        .nflags = (int)(sizeof flags / sizeof *flags),
        .positionals = true,
    };
    int first;
    switch (cli_parse(&spec, argc, argv, &first)) {
    case CLI_OK: break;
    case CLI_HELP: xl_options_free(o); exit(0);
    case CLI_ERROR: xl_options_free(o); exit(2);
    }
    if (standalone && (o->hostfile || o->nnodes > 1)) {
        if (o->hostfile) cli_error(&spec, "--standalone is one node: it cannot go with --hostfile");
        else cli_error(&spec, "--standalone is one node: it cannot go with --nnodes %d", o->nnodes);
        xl_options_free(o);
        exit(2);
    }
    if (rdzv && !o->master_addr) {
        /* HOST[:PORT]; the address stays in argv, the port is split off into a copy */
        static char host[256];
        snprintf(host, sizeof host, "%s", rdzv);
        char *colon = strrchr(host, ':');
        if (colon) {
            *colon = '\0';
            if (!o->master_port && !xl_parse_int(colon + 1, 1, 65535, &o->master_port)) {
                cli_error(&spec, "--rdzv-endpoint %s: bad port", rdzv);
                xl_options_free(o);
                exit(2);
            }
        }
        o->master_addr = host;
    }
    o->prog = argv + first;
    o->nprog = argc - first;
    if (o->nprog == 0) {
        cli_error(&spec, "no program given");
        xl_options_free(o);
        exit(2);
    }
}

void xl_options_free(struct options *o)
{
    free(o->mpirun_args.v);
    o->mpirun_args = (cli_strings){ NULL, 0 };
}

static bool is_exec_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Full path of an executable as execvp would find it, or NULL. */
static char *find_executable(const char *name)
{
    if (!*name) return NULL;
    if (strchr(name, '/')) {
        if (!is_exec_file(name)) return NULL;
        char *p = strdup(name);
        if (!p) xl_die("out of memory");
        return p;
    }
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

void xl_check_program(const char *prog)
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

char *xl_find_srun(void)
{
    char *p = find_executable("srun");
    if (!p)
        xl_die("srun not found: in a Slurm allocation (SLURM_JOB_ID is set) xla-launch starts the ranks as a job "
               "step with srun (Debian: slurm-client)");
    return p;
}

char *xl_find_mpirun(const struct options *o)
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

void xl_make_log_dir(const char *dir)
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
