/* A program that never calls cx_dist_finalize (no_finalize.sh):
 *   dist_no_finalize         every rank returns 0 from main after a step
 *                            with an all-reduce, and a child it forked
 *                            exits 0 first: the job succeeds
 *   dist_no_finalize fail    rank 1 returns 3 instead: the launcher
 *                            stops the job and names the rank */
#include <cxla/cxla.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) {
        fprintf(stderr, "dist_no_finalize: %s\n", cx_last_error());
        return 1;
    }
    const bool fail = argc > 1 && !strcmp(argv[1], "fail");
    const int rank = cx_global_ordinal();
    int64_t n = 16;
    cx_tensor *x = cx_ones(&n, 1, CX_F32);
    cx_step_begin();
    cx_tensor *sum = cx_keep(cx_all_reduce(x, CX_RED_SUM, 1.0, NULL, false));
    if (cx_step_end() != CX_OK) {
        fprintf(stderr, "dist_no_finalize: %s\n", cx_last_error());
        return 1;
    }
    float got[16];
    if (cx_to_host(sum, got, CX_F32) != CX_OK || got[15] != (float)cx_world_size()) {
        fprintf(stderr, "dist_no_finalize: rank %d: the all-reduce gave %g, want %d\n", rank, got[15], cx_world_size());
        return 1;
    }
    /* the child inherits the exit handler, and must not finalize the
     * parent's MPI (the parent's next collective or finalize would hang) */
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) exit(0);
    int st = 0;
    if (child < 0 || waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "dist_no_finalize: rank %d: the forked child did not exit 0\n", rank);
        return 1;
    }
    cx_step_begin();
    cx_tensor *again = cx_keep(cx_all_reduce(x, CX_RED_SUM, 1.0, NULL, false));
    if (cx_step_end() != CX_OK) {
        fprintf(stderr, "dist_no_finalize: after the fork: %s\n", cx_last_error());
        return 1;
    }
    cx_free(again);
    printf("dist_no_finalize: rank %d done\n", rank);
    cx_free(sum);
    cx_free(x);
    return fail && rank == 1 ? 3 : 0;
}
