/* The one reader of the launchers' variables (util/cx_job.c, public as
 * cx_job_place): each launcher's environment gives its rank, world and
 * node layout; srun's tasks without PMIx are refused with the line that
 * says to add --mpi=pmix, by cx_job_place and by cx_dist_init alike. */
#include "cx_job.h"

#include <cxla/parallel.h>

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_vars[] = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_LOCALID",
    "SLURM_NODEID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
    "SLURM_JOB_ID", "SLURM_STEP_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
};

static void clear(void)
{
    for (size_t i = 0; i < sizeof k_vars / sizeof *k_vars; i++) unsetenv(k_vars[i]);
}

TestSuite(job, .init = clear, .fini = clear);

struct place {
    int rank, world, local_rank, local_world;
    const char *launcher;
    bool ok;
    char msg[512];
};

static struct place place(void)
{
    struct place p = { -9, -9, -9, -9, NULL, false, "" };
    p.ok = cx_job_place(&p.rank, &p.world, &p.local_rank, &p.local_world, &p.launcher, p.msg, sizeof p.msg);
    return p;
}

static void want(struct place p, int rank, int world, int local_rank, int local_world, const char *launcher)
{
    cr_assert(p.ok, "%s", p.msg);
    cr_assert_eq(p.rank, rank);
    cr_assert_eq(p.world, world);
    cr_assert_eq(p.local_rank, local_rank);
    cr_assert_eq(p.local_world, local_world);
    cr_assert_str_eq(p.launcher, launcher);
}

Test(job, alone_is_rank_0_of_1)
{
    want(place(), 0, 1, 0, 1, "none");
    /* a batch script is no task of a step: SLURM_NTASKS alone says nothing of this process */
    setenv("SLURM_JOB_ID", "7", 1);
    setenv("SLURM_NTASKS", "4", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x2)", 1);
    want(place(), 0, 1, 0, 1, "none");
}

Test(job, mpirun_wins_over_the_slurm_step_of_its_daemons)
{
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    setenv("PMIX_RANK", "3", 1);
    setenv("SLURM_PROCID", "1", 1);
    setenv("SLURM_STEP_NUM_TASKS", "2", 1);
    want(place(), 3, 4, 1, 2, "mpirun");
}

Test(job, srun_with_pmix_takes_slurm_s_layout)
{
    setenv("PMIX_RANK", "2", 1);
    setenv("SLURM_PROCID", "2", 1);
    setenv("SLURM_LOCALID", "0", 1);
    setenv("SLURM_NODEID", "1", 1);
    setenv("SLURM_STEP_NUM_TASKS", "5", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "2,3", 1);
    want(place(), 2, 5, 0, 3, "pmix");
}

Test(job, srun_without_pmix_is_refused_with_one_line)
{
    setenv("SLURM_PROCID", "1", 1);
    setenv("SLURM_STEP_NUM_TASKS", "4", 1);
    setenv("SLURM_LOCALID", "1", 1);
    struct place p = place();
    cr_assert_not(p.ok);
    cr_assert_eq(p.rank, 1);
    cr_assert_eq(p.world, 4);
    cr_assert(strstr(p.msg, "srun started 4 tasks with no PMIx") && strstr(p.msg, "add --mpi=pmix"), "%s", p.msg);
    cr_assert_null(strchr(p.msg, '\n'));
    /* and the runtime says the same before it would start a world of one */
    cr_assert_eq(cx_dist_init(NULL, NULL), CX_ERR_COMM);
    cr_assert(strstr(cx_last_error(), "add --mpi=pmix"), "%s", cx_last_error());
    /* one task needs no world */
    setenv("SLURM_STEP_NUM_TASKS", "1", 1);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_LOCALID", "0", 1);
    want(place(), 0, 1, 0, 1, "none");
}

Test(job, pmi_and_torchrun)
{
    setenv("PMI_RANK", "1", 1);
    setenv("PMI_SIZE", "3", 1);
    setenv("MPI_LOCALRANKID", "1", 1);
    setenv("MPI_LOCALNRANKS", "3", 1);
    want(place(), 1, 3, 1, 3, "pmi");
    clear();
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    want(place(), 1, 2, 1, 2, "torchrun");
}

Test(job, a_broken_variable_is_named)
{
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_RANK", "x1", 1);
    struct place p = place();
    cr_assert_not(p.ok);
    cr_assert(strstr(p.msg, "OMPI_COMM_WORLD_RANK='x1'"), "%s", p.msg);
    cr_assert_not(cx_job_place(NULL, NULL, NULL, NULL, NULL, NULL, 0));
}

Test(job, slurm_tasks_per_node)
{
    const char *t = "2(x3),1";
    cr_assert_eq(cx_job_slurm_tasks(t, 0), 2);
    cr_assert_eq(cx_job_slurm_tasks(t, 2), 2);
    cr_assert_eq(cx_job_slurm_tasks(t, 3), 1);
    cr_assert_eq(cx_job_slurm_tasks(t, 4), -1);
    cr_assert_eq(cx_job_slurm_tasks(t, -1), 7);
    cr_assert_eq(cx_job_slurm_tasks("4", -1), 4);
    static const char *const bad[] = { "", "2(x", "2(3)", "2(x0)", "a", "2,", "2;1", "-1", "99999999999999999999",
                                       "1(x99999999999)", "2,x" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(cx_job_slurm_tasks(bad[i], -1), -1, "'%s'", bad[i]);
    cr_assert_eq(cx_job_slurm_tasks(NULL, 0), -1);
    /* a malformed text is no answer for any node, even one before the fault
     * (found by fuzz_slurm: a count past int came back cast) */
    cr_assert_eq(cx_job_slurm_tasks("2,x", 0), -1);
    cr_assert_eq(cx_job_slurm_tasks("4444444444444444/4", 0), -1);
}
