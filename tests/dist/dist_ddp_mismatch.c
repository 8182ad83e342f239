/* A parameter-shape mismatch across ranks is reported at wrap time, on
 * every rank, naming the parameter; nobody hangs. Exit 0 when it is. */
#include "dist_check.h"

#include <string.h>

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    int rank = cx_global_ordinal();
    cx_module *layers[2] = { cx_nn_linear(8, rank == 1 ? 17 : 16, true), cx_nn_linear(rank == 1 ? 17 : 16, 3, true) };
    cx_module *m = cx_nn_sequential(layers, 2);
    cx_ddp *d = cx_ddp_wrap(m, cx_ddp_default_opts());
    CHECK(d == NULL, "wrap of mismatched models succeeded");
    CHECK(strstr(cx_last_error(), "0.weight") != NULL && strstr(cx_last_error(), "rank 1") != NULL,
          "error does not name the parameter and rank: %s", cx_last_error());
    if (rank == 0) printf("mismatch reported: %s\n", cx_last_error());
    cx_ddp_free(d);
    cx_module_free(m);
    return dist_finish("dist_ddp_mismatch");
}
