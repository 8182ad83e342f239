/* A job that stalls, for the collective watchdog's test (watchdog.sh):
 *   dist_stall sleep  rank 1 sleeps for a minute before step 5's all-reduce
 *   dist_stall skip   rank 1 leaves out the last step and exits
 * Every step is one graph with one all-reduce of f32[1024]. Without a
 * stall (another mode) it runs 8 steps and exits 0. */
#include <cxla/cxla.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define STEPS 8

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) {
        fprintf(stderr, "dist_stall: %s\n", cx_last_error());
        return 1;
    }
    const char *mode = argc > 1 ? argv[1] : "none";
    int rank = cx_global_ordinal();
    int64_t n = 1024;
    cx_tensor *x = cx_persist(cx_ones(&n, 1, CX_F32));
    for (int s = 0; s < STEPS; s++) {
        if (rank == 1 && !strcmp(mode, "sleep") && s == 5) sleep(60);
        if (rank == 1 && !strcmp(mode, "skip") && s == STEPS - 1) break;
        cx_step_begin();
        cx_tensor *y = cx_keep(cx_all_reduce(x, CX_RED_SUM, 1.0, NULL, false));
        if (cx_step_end() != CX_OK) {
            fprintf(stderr, "dist_stall: step %d: %s\n", s, cx_last_error());
            return 1;
        }
        cx_free(y);
    }
    printf("dist_stall: rank %d done\n", rank);
    cx_free(x);
    cx_dist_finalize();
    return 0;
}
