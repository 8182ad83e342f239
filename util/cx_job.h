/* Where this process sits in its job, as the launcher's environment says it
 * before any MPI call: the one reader of mpirun's, PMIx's, PMI's, Slurm's
 * and torchrun's variables. The library (parallel/runtime.c), xla-launch's
 * per-rank wrapper (which compiles this file in) and the programs, through
 * cx_job_place (include/cxla/parallel.h), all read the place here, so a
 * rank is the same rank to every one of them. */
#ifndef CX_UTIL_JOB_H
#define CX_UTIL_JOB_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    CX_JOB_ALONE,     /* no launcher: a world of one */
    CX_JOB_OPEN_MPI,  /* mpirun (xla-launch runs the ranks through it) */
    CX_JOB_PMIX,      /* a PMIx server, e.g. srun --mpi=pmix */
    CX_JOB_PMI,       /* a PMI-1/2 launcher (MPICH's Hydra) */
    CX_JOB_TORCHRUN,  /* RANK / WORLD_SIZE only: processes without an MPI world */
} cx_job_source;

typedef struct {
    cx_job_source source;
    int rank, world, local_rank, local_world;   /* -1: the launcher does not say */
} cx_job_info;

/* Reads the place. @return false, with one line in msg[cap], when the
 * environment is a job that cannot form one world: srun started several
 * tasks without PMIx (each would run alone), or a variable is not a number. */
bool cx_job_read(cx_job_info *out, char *msg, size_t cap);

/* The processes share an MPI world that MPI_Init joins. */
static inline bool cx_job_has_mpi(const cx_job_info *j)
{
    return j->source == CX_JOB_OPEN_MPI || j->source == CX_JOB_PMIX || j->source == CX_JOB_PMI;
}

/* The tasks Slurm's "2(x3),1" (SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE)
 * gives node `node` (from 0), or the total over all nodes when node < 0.
 * @return -1 when the text is not of that form or the node is not in it. */
int cx_job_slurm_tasks(const char *per_node, int node);

#endif
