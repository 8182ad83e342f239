/* Inside a Slurm allocation (salloc, sbatch): what it grants, read from the
 * variables Slurm gives the allocation's shell. The launcher then starts
 * the ranks as one job step, `srun --mpi=pmix`, so Slurm places them on its
 * nodes, tracks them, signals them on scancel or at the time limit, and
 * never is asked for more than it granted; no ssh is needed between nodes. */
#include "launcher.h"

#include "cx_job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first host of a Slurm host list: "cxhost[1-2,5],gpu7" -> "cxhost1",
 * "rack[3-4]-n[07-09]" -> "rack3-n07". */
static void first_host(const char *list, char *out, size_t cap)
{
    size_t n = 0;
    bool in = false, skip = false;
    for (const char *p = list; *p && n + 1 < cap; p++) {
        if (!in && *p == ',') break;
        if (*p == '[') { in = true; skip = false; continue; }
        if (*p == ']') { in = false; continue; }
        if (in && (*p == '-' || *p == ',')) skip = true;
        if (in && skip) continue;
        out[n++] = *p;
    }
    out[n] = '\0';
}

static int env_count(const char *name)
{
    int v;
    const char *s = getenv(name);
    return s && xl_parse_int(s, 1, 1 << 30, &v) ? v : -1;
}

void xl_slurm_read(struct xl_slurm *s)
{
    memset(s, 0, sizeof *s);
    s->job_id = getenv("SLURM_JOB_ID");
    if (!s->job_id || !*s->job_id) return;
    s->in_alloc = true;
    s->tasks = env_count("SLURM_NTASKS");
    /* -N without -n: one task per node, as Slurm's own count says */
    if (s->tasks < 0) s->tasks = cx_job_slurm_tasks(getenv("SLURM_TASKS_PER_NODE"), -1);
    s->nodes = env_count("SLURM_JOB_NUM_NODES");
    if (s->nodes < 0) s->nodes = 1;
    const char *list = getenv("SLURM_JOB_NODELIST");
    if (list) first_host(list, s->first_host, sizeof s->first_host);
}

int xl_slurm_nproc(const struct xl_slurm *s, const struct options *o)
{
    if (s->tasks < 1) {
        if (o->nproc) return o->nproc;
        xl_die("in Slurm job %s, but neither SLURM_NTASKS nor SLURM_TASKS_PER_NODE says how many tasks it "
               "grants: give --nproc", s->job_id);
    }
    if (!o->nproc) return s->tasks;
    if (o->nproc > s->tasks && !o->oversubscribe)
        xl_die("--nproc %d is more than the %d task(s) Slurm job %s grants: ask salloc/sbatch for more (-n %d), "
               "or pass --oversubscribe to run them on what it has", o->nproc, s->tasks, s->job_id, o->nproc);
    return o->nproc;
}

/* srun's own flags: one step of nproc tasks, PMIx for MPI_Init, and the
 * whole step ended by Slurm too when a task fails. */
void xl_slurm_srun_flags(char ***av, int *ac, const struct options *o, int nproc)
{
    static char ntasks[32];   /* an argument of the command line, which outlives this call */
    snprintf(ntasks, sizeof ntasks, "--ntasks=%d", nproc);
    xl_add_arg(av, ac, "--mpi=pmix");
    xl_add_arg(av, ac, ntasks);
    xl_add_arg(av, ac, "--kill-on-bad-exit=1");
    if (o->oversubscribe) xl_add_arg(av, ac, "--overcommit");
}
