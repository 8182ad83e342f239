/* A parameter-shape mismatch across ranks is reported at wrap time, on
 * every rank, with one message naming the ranks that differ and the first
 * parameter where they do; nobody hangs. Odd ranks hold the other model.
 * Exit 0 when it is. */
#include "dist_check.h"

#include <string.h>

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    int rank = cx_global_ordinal();
    int hidden = rank % 2 ? 17 : 16;
    cx_module *layers[2] = { cx_nn_linear(8, hidden, true), cx_nn_linear(hidden, 3, true) };
    cx_module *m = cx_nn_sequential(layers, 2);
    cx_ddp *d = cx_ddp_wrap(m, cx_ddp_default_opts());
    CHECK(d == NULL, "wrap of mismatched models succeeded");
    CHECK(strstr(cx_last_error(), "0.weight") != NULL && strstr(cx_last_error(), "rank 1") != NULL,
          "error does not name the parameter and rank: %s", cx_last_error());
    if (cx_world_size() == 4)
        CHECK(strstr(cx_last_error(), "ranks 1, 3 set up") != NULL, "error does not name ranks 1 and 3: %s", cx_last_error());
    /* the same message on every rank: each compares rank 0's with its own */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", cx_last_error());
    void *all = NULL;
    size_t sizes[64];
    CHECK(cx_world_size() <= 64 && cx_rendezvous("message", msg, strlen(msg) + 1, &all, sizes) == CX_OK, "rendezvous: %s",
          cx_last_error());
    CHECK(all && !strcmp(all, msg), "rank 0 reported '%s', this rank '%s'", all ? (char *)all : "", msg);
    free(all);
    CHECK(cx_broadcast_master_params(m) == CX_ERR_ARG && strstr(cx_last_error(), "0.weight") != NULL,
          "broadcast_master_params accepted mismatched models: %s", cx_last_error());
    if (rank == 0) printf("mismatch reported: %s\n", msg);
    cx_ddp_free(d);
    cx_module_free(m);
    return dist_finish("dist_ddp_mismatch");
}
