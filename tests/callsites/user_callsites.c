/* A user's training program, on the public API only, whose batch size
 * changes every few steps so that PT_XLA_DEBUG_LEVEL=1 reports a
 * recompilation at each change. The reports, and the desync message of a
 * step the ranks disagree on, must name this file's own lines (the
 * "@site" comments, which callsites.sh looks up), never a line inside
 * libcxla, even when the library syncs on its own (the DDP wrap, the
 * broadcast of rank 0's parameters).
 * usage: user_callsites single|ddp   (ddp: under xla-launch, 2+ ranks) */
#include <cxla/cxla.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IN 6
#define OUT 3
#define STEPS 9

/* 2, 2, 2, 3, 3, 3, 4, ...: a new shape, so a new graph, every 3 steps */
static int64_t rows_of_step(int s) { return 2 + s / 3; }

/* host data, as a loader's: the values are inputs, not part of the graph */
static cx_tensor *batch(int64_t rows, int64_t cols, double v)
{
    float *h = malloc(sizeof(float) * (size_t)(rows * cols));
    if (!h) return NULL;
    for (int64_t i = 0; i < rows * cols; i++) h[i] = (float)(v + 0.01 * (double)i);
    cx_tensor *t = cx_from_host(h, (int64_t[]){ rows, cols }, 2, CX_F32);
    free(h);
    return t;
}

static int train_single(void)
{
    cx_manual_seed(3);
    cx_module *m = cx_nn_linear(IN, OUT, true);
    cx_tensor *probe = cx_module_forward(m, batch(1, IN, 0.5));
    if (cx_sync() != CX_OK) return 1;   /* @site sync */
    cx_free(probe);
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_optimizer *opt = cx_optim_sgd(ps, n, cx_sgd_default_opts());
    for (int s = 0; s < STEPS; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        int64_t r = rows_of_step(s);
        cx_tensor *loss = cx_mse_loss(cx_module_forward(m, batch(r, IN, 0.5)), batch(r, OUT, 1.0), CX_REDUCE_MEAN);
        if (cx_backward(loss) != CX_OK) { fprintf(stderr, "backward: %s\n", cx_last_error()); return 1; }
        cx_optim_step(opt);
        /* a read mid-step runs the forward on its own: a graph of its own */
        double l = cx_item(loss);   /* @site item */
        if (!(l >= 0)) { fprintf(stderr, "step %d: loss %g\n", s, l); return 1; }
        if (cx_step_end() != CX_OK) { fprintf(stderr, "step %d: %s\n", s, cx_last_error()); return 1; }   /* @site step */
    }
    cx_optim_free(opt);
    free(ps);
    cx_module_free(m);
    return 0;
}

/* One step in which rank 1 all-reduces fewer floats than the others. */
static cx_status disagreeing_step(int rank)
{
    cx_step_begin();
    cx_keep(cx_all_reduce(batch(1, rank == 1 ? 3 : 4, 1.0), CX_RED_SUM, 1.0, NULL, false));
    return cx_step_end();   /* @site desync */
}

static int train_ddp(int rank)
{
    /* ranks start different: the broadcast and the wrap sync inside libcxla */
    cx_manual_seed(rank == 0 ? 3 : 50 + (uint64_t)rank);
    cx_module *m = cx_nn_linear(IN, OUT, true);
    if (cx_broadcast_master_params(m) != CX_OK) { fprintf(stderr, "broadcast: %s\n", cx_last_error()); return 1; }
    cx_ddp *ddp = cx_ddp_wrap(m, cx_ddp_default_opts());
    if (!ddp) { fprintf(stderr, "ddp_wrap: %s\n", cx_last_error()); return 1; }
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_optimizer *opt = cx_optim_sgd(ps, n, cx_sgd_default_opts());
    for (int s = 0; s < STEPS; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        int64_t r = rows_of_step(s);
        cx_tensor *loss = cx_mse_loss(cx_ddp_forward(ddp, batch(r, IN, 0.5 + rank)), batch(r, OUT, 1.0),
                                      CX_REDUCE_MEAN);
        if (cx_ddp_backward(ddp, loss) != CX_OK) { fprintf(stderr, "backward: %s\n", cx_last_error()); return 1; }
        cx_optim_step(opt);
        if (cx_step_end() != CX_OK) { fprintf(stderr, "step %d: %s\n", s, cx_last_error()); return 1; }   /* @site ddp */
    }
    cx_status st = disagreeing_step(rank);
    if (st != CX_ERR_COMM) { fprintf(stderr, "rank %d: the disagreeing step returned %d\n", rank, (int)st); return 1; }
    fprintf(stderr, "rank %d desync: %s\n", rank, cx_last_error());
    cx_optim_free(opt);
    free(ps);
    cx_ddp_free(ddp);
    cx_module_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "single")) return train_single();
    if (argc != 2 || strcmp(argv[1], "ddp")) { fprintf(stderr, "usage: %s single|ddp\n", argv[0]); return 2; }
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    int rc = train_ddp(cx_global_ordinal());
    cx_dist_finalize();
    return rc;
}
