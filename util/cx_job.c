/* The launcher's environment, read in one place (cx_job.h). */
#include "cx_job.h"

#include <cxla/parallel.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -1 when unset; -2 when set but not a whole number in [0, 2^30] */
static int env_num(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || *end || n < 0 || n > (1L << 30)) return -2;
    return (int)n;
}

int cx_job_slurm_tasks(const char *per_node, int node)
{
    if (!per_node || !*per_node) return -1;
    const char *p = per_node;
    long total = 0, at = 0, mine = -1;
    /* the whole text is read, so a malformed one gives -1 for every node */
    while (*p) {
        char *end;
        long tasks = strtol(p, &end, 10), times = 1;
        if (end == p || tasks < 0 || tasks > (1L << 30)) return -1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x') return -1;
            times = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || times < 1 || times > (1L << 30)) return -1;
            p = end + 1;
        }
        if (node >= at && node < at + times) mine = tasks;
        total += tasks * times;
        at += times;
        if (total > (1L << 30) || at > (1L << 30)) return -1;
        if (*p == ',' && !*++p) return -1;
        else if (*p && p[-1] != ',') return -1;
    }
    return (int)(node >= 0 ? mine : total);
}

/* The layout of a Slurm step: srun's variables, with PMIx or without. */
static void slurm_place(cx_job_info *j)
{
    j->rank = env_num("SLURM_PROCID");
    j->local_rank = env_num("SLURM_LOCALID");
    j->world = env_num("SLURM_STEP_NUM_TASKS");
    if (j->world < 0) j->world = env_num("SLURM_NTASKS");
    int node = env_num("SLURM_NODEID");
    const char *per = getenv("SLURM_STEP_TASKS_PER_NODE");
    if (!per) per = getenv("SLURM_TASKS_PER_NODE");
    j->local_world = node >= 0 ? cx_job_slurm_tasks(per, node) : -1;
}

static bool bad(char *msg, size_t cap, const char *name)
{
    if (cap) snprintf(msg, cap, "%s='%s' is not a rank count: the launcher's environment is broken", name, getenv(name));
    return false;
}

/* Each launcher's own variables, the first found wins: mpirun sets
 * OMPI_* (and PMIX_RANK, and under Slurm SLURM_* for its daemons' step). */
static void read_source(cx_job_info *j)
{
    *j = (cx_job_info){ CX_JOB_ALONE, 0, 1, 0, 1 };
    if (getenv("OMPI_COMM_WORLD_SIZE")) {
        *j = (cx_job_info){ CX_JOB_OPEN_MPI, env_num("OMPI_COMM_WORLD_RANK"), env_num("OMPI_COMM_WORLD_SIZE"),
                            env_num("OMPI_COMM_WORLD_LOCAL_RANK"), env_num("OMPI_COMM_WORLD_LOCAL_SIZE") };
    } else if (getenv("PMIX_RANK")) {
        slurm_place(j);   /* PMIx's variables carry the rank alone */
        j->source = CX_JOB_PMIX;
        j->rank = env_num("PMIX_RANK");
    } else if (getenv("PMI_RANK")) {
        slurm_place(j);
        j->source = CX_JOB_PMI;
        j->rank = env_num("PMI_RANK");
        j->world = env_num("PMI_SIZE");
        if (getenv("MPI_LOCALRANKID")) j->local_rank = env_num("MPI_LOCALRANKID");
        if (getenv("MPI_LOCALNRANKS")) j->local_world = env_num("MPI_LOCALNRANKS");
    } else if (getenv("SLURM_STEP_NUM_TASKS") && getenv("SLURM_PROCID")) {
        /* a task of srun without a PMI (a batch script is no such task: it
         * has no SLURM_STEP_NUM_TASKS): CX_JOB_ALONE unless srun started several */
        slurm_place(j);
    } else if (getenv("WORLD_SIZE")) {
        *j = (cx_job_info){ CX_JOB_TORCHRUN, env_num("RANK"), env_num("WORLD_SIZE"), env_num("LOCAL_RANK"),
                            env_num("LOCAL_WORLD_SIZE") };
    }
}

bool cx_job_read(cx_job_info *out, char *msg, size_t cap)
{
    if (cap) msg[0] = '\0';
    cx_job_info j;
    read_source(&j);
    static const char *const names[] = { "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                                         "PMI_SIZE", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
                                         "RANK", "WORLD_SIZE" };
    *out = j;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (env_num(names[i]) == -2) return bad(msg, cap, names[i]);
    if (j.source == CX_JOB_ALONE && j.world > 1) {
        /* srun's tasks cannot find each other without PMIx: each would
         * train alone, a silently wrong job */
        if (cap)
            snprintf(msg, cap, "srun started %d tasks with no PMIx, so each would run alone as rank 0 of 1: add "
                               "--mpi=pmix (srun --mpi=pmix -n %d PROGRAM ...), or run xla-launch inside the "
                               "allocation", j.world, j.world);
        return false;
    }
    if (j.source == CX_JOB_ALONE) *out = (cx_job_info){ CX_JOB_ALONE, 0, 1, 0, 1 };
    return true;
}

bool cx_job_place(int *rank, int *world_size, int *local_rank, int *local_world_size, const char **launcher,
                  char *msg, size_t cap)
{
    static const char *const names[] = { "none", "mpirun", "pmix", "pmi", "torchrun" };
    cx_job_info j;
    bool ok = cx_job_read(&j, msg, cap);
    if (rank) *rank = j.rank;
    if (world_size) *world_size = j.world;
    if (local_rank) *local_rank = j.local_rank;
    if (local_world_size) *local_world_size = j.local_world;
    if (launcher) *launcher = names[j.source];
    return ok;
}
