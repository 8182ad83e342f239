/* The launcher's parts (launch.h is what it shares with the per-rank wrapper):
 *   options.c    the command line, and the program, mpirun and log directory it names
 *   hostfile.c   the hosts of an Open MPI hostfile
 *   sockets.c    where the wrappers connect to report
 *   output.c     the ranks' lines on our stdout/stderr with "[rank R] ", and their logs
 *   job.c        one run of the job under mpirun, supervised, and its restarts
 *   slurm.c      inside a Slurm allocation: what it grants, and srun in mpirun's place
 *   xla-launch.c main: the mpirun (or srun) command line from all of the above */
#ifndef XLA_LAUNCHER_H
#define XLA_LAUNCHER_H

#include "cx_cli.h"
#include "launch.h"

#include <stdio.h>

/* A rank number from this on is not a rank of any job: garbage on the wire. */
#define XL_MAX_RANKS (1 << 22)

/* ---- options.c ---- */

struct options {
    int nproc;          /* 0: default */
    const char *hostfile;
    int nnodes;         /* 0: not given */
    int node_rank;
    const char *master_addr;
    int master_port;    /* 0: not given */
    const char *log_dir;
    int max_restarts;
    double preempt_grace;   /* SIGTERM: seconds the ranks get to save and stop; 0: stop at once */
    const char *mpirun;
    bool verbose;
    bool oversubscribe; /* more ranks than a Slurm allocation grants */
    cli_strings mpirun_args;
    char **prog;        /* PROGRAM [ARGS...] */
    int nprog;
};

/* Flags up to PROGRAM. --help: the help on stdout, exit 0; a mistake: one line, exit 2. */
void xl_parse_options(int argc, char **argv, struct options *o);
void xl_options_free(struct options *o);
/* Full path of the mpirun to run (--mpirun, $XLA_LAUNCH_MPIRUN, else the one found at
 * build time); exits 2 naming it when it is not there. */
char *xl_find_mpirun(const struct options *o);
/* Full path of srun on PATH; exits 2 naming it when there is none. */
char *xl_find_srun(void);
/* Exits 2 unless `prog` is an executable file, found as execvp would. */
void xl_check_program(const char *prog);
/* mkdir -p of --log-dir; exits 2 naming it when that fails. */
void xl_make_log_dir(const char *dir);

/* Appends a to the NULL-terminated command line *v of *n arguments (xla-launch.c). */
void xl_add_arg(char ***v, int *n, const char *a);

/* ---- slurm.c ---- */

struct xl_slurm {
    bool in_alloc;          /* SLURM_JOB_ID is set: this runs in an allocation */
    const char *job_id;
    int tasks;              /* the tasks it grants; -1: Slurm does not say */
    int nodes;
    char first_host[256];   /* of SLURM_JOB_NODELIST: MASTER_ADDR, as torchrun scripts take it */
};

void xl_slurm_read(struct xl_slurm *s);
/* --nproc, or the allocation's tasks; exits 2 naming both when --nproc asks
 * for more than granted without --oversubscribe. */
int xl_slurm_nproc(const struct xl_slurm *s, const struct options *o);
/* srun's flags for one step of nproc ranks. */
void xl_slurm_srun_flags(char ***av, int *ac, const struct options *o, int nproc);

/* ---- hostfile.c ---- */

/* Distinct hosts named in an Open MPI hostfile ("host [slots=N] ..." lines, '#'
 * comments); *first gets the first one (to free). Exits 2 on an unreadable or empty file. */
int xl_read_hostfile(const char *path, char **first);
/* The parser behind it, which never exits (the fuzzer calls it): the
 * distinct hosts of f, comments (#) and blank lines skipped; *first gets
 * the first one (malloc'd; NULL when there is none).
 * @return the number of hosts, or -1 with errno's value in *err. */
int xl_parse_hostfile(FILE *f, char **first, int *err);

/* ---- sockets.c ---- */

/* Listening Unix socket for the wrappers on this node; its name ("@..." abstract) into
 * `name`. */
int xl_listen_unix(char *name, size_t cap);
/* Listening TCP socket for wrappers on other nodes; "PORT:ADDR,ADDR,..." into `env`. */
int xl_listen_tcp(char *env, size_t cap);

/* ---- watch.c ---- */

/* The collective watchdog over the ranks' status pages. */
struct xl_watch {
    char dir[256];     /* CX_STATUS_DIR; empty: off */
    double timeout;    /* CX_COLLECTIVE_TIMEOUT seconds */
    bool fired;
};

/* Reads CX_COLLECTIVE_TIMEOUT (exits 2 on a bad value), makes the status
 * directory and exports CX_STATUS_DIR to the ranks to come: when the
 * watchdog is on, or when `for_restarts` (the pages also tell whether a
 * step completed, and how long recovery took). */
void xl_watch_init(struct xl_watch *w, bool for_restarts);

/* What the ranks' pages (this node's) say of their progress. Times are
 * CLOCK_MONOTONIC seconds; the maxima over ranks, since a step is done
 * when the slowest rank is done. */
struct xl_progress {
    int pages;           /* ranks with a page */
    int stepped;         /* of them, ranks that have ended a step */
    double opened;       /* the last page opened (the ranks' MPI_Init done) */
    double first_step;   /* the last rank's first step ended (0: not all yet) */
    double compile_s, load_s;   /* by the first step: compile and checkpoint-load seconds */
    long long cache_hits;       /* the fewest persistent-cache hits by the first step */
};
/* Reads every page's progress line. @return false when there is no page. */
bool xl_watch_progress(const struct xl_watch *w, struct xl_progress *p);
/* @return true once a rank has been inside one collective for the timeout:
 * the report line and the flight recorder (under log_dir, or
 * ./xla-launch-flight-<pid>) are written; the caller stops the job. */
bool xl_watch_check(struct xl_watch *w, const char *log_dir);
/* Removes the status directory. */
void xl_watch_cleanup(struct xl_watch *w);

/* ---- output.c ---- */

struct xl_output {
    const char *log_dir;   /* NULL: no logs */
    int attempt;           /* 0: logs start empty; later attempts append */
    int *log_fds;          /* per rank: -1 not open yet, -2 could not be opened */
    int n;
};

void xl_output_init(struct xl_output *out, const char *log_dir, int attempt);
/* Creates the rank's log now, so that even a rank that prints nothing has one. */
void xl_output_open_log(struct xl_output *out, int rank);
/* One line of a rank's output (without its '\n'): to our stdout (stream 1) or stderr
 * with the "[rank R] " prefix, in one write, and to the rank's log. */
void xl_output_line(struct xl_output *out, int rank, int stream, const char *line, size_t len);
void xl_output_close(struct xl_output *out);

/* ---- job.c ---- */

/* What stays the same from one attempt to the next. */
struct launch {
    const struct options *o;
    int sigfd;            /* from xl_job_signals_init */
    int unix_fd, tcp_fd;  /* listening sockets for the wrappers (tcp_fd -1: none) */
    char **mpirun_argv;  /* mpirun's, or srun's in a Slurm allocation */
    bool via_srun;
};

/* Routes the signals the launcher handles (SIGINT, SIGTERM, SIGHUP, SIGCHLD) to a
 * self-pipe; returns its read end. Before the first child is started. */
int xl_job_signals_init(void);
/* Runs the job, and again after each failure while --max-restarts allows.
 * @return the launcher's exit status (0, 1, or 128+S when interrupted by S). */
int xl_run_attempts(const struct launch *l);

#endif
