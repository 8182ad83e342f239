/* A user's training program, on the public API only, for the debugging
 * scenarios of debug.sh: each mode makes one of the mistakes (or asks for
 * one of the dumps) the README's debugging section shows. The lines the
 * messages must name carry "@site NAME" comments, which debug.sh looks up.
 * usage: trainer_debug shape|const|live|dump|hlo|oom|desync|sharding [dist]
 *        (dist: under xla-launch, the ranks joined by cx_dist_init) */
#include <cxla/cxla.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IN 8
#define OUT 4
#define STEPS 9

/* host data, as a loader's: the values are inputs, not part of the graph */
static cx_tensor *batch(int64_t rows, int64_t cols, double v)
{
    float *h = malloc(sizeof(float) * (size_t)(rows * cols));
    if (!h) return NULL;
    for (int64_t i = 0; i < rows * cols; i++) h[i] = (float)(v + 0.01 * (double)i);
    cx_tensor *t = cx_from_host(h, (int64_t[]){ rows, cols }, 2, CX_F32);   /* @site batch */
    free(h);
    return t;
}

typedef struct {
    cx_module *m;
    cx_optimizer *opt;
    cx_named_tensor *ps;
} model;

static int model_init(model *md)
{
    cx_manual_seed(5);
    md->m = cx_nn_linear(IN, OUT, true);
    int n = 0;
    md->ps = cx_module_parameters(md->m, &n);
    md->opt = cx_optim_sgd(md->ps, n, cx_sgd_default_opts());
    return md->m && md->ps && md->opt ? 0 : 1;
}

static void model_free(model *md)
{
    cx_optim_free(md->opt);
    free(md->ps);
    cx_module_free(md->m);
}

static void print_info(void)
{
    cx_exec_info in = cx_last_exec_info();
    printf("exec: rank %d kernels %d collectives %d key %016llx%016llx\n", cx_global_ordinal(), in.num_kernels,
           in.num_collectives, (unsigned long long)in.key_hi, (unsigned long long)in.key_lo);
}

/* One step; rows: the batch's; scale: a float the loss is multiplied by,
 * or 0 for none; reduce: all-reduce the loss over the ranks. */
static int step(model *md, int s, int64_t rows, double scale, bool reduce)
{
    cx_step_begin();
    cx_optim_zero_grad(md->opt);
    cx_tensor *loss = cx_mse_loss(cx_module_forward(md->m, batch(rows, IN, 0.5)), batch(rows, OUT, 1.0), CX_REDUCE_MEAN);
    if (scale != 0) loss = cx_mul_scalar(loss, scale);   /* @site const */
    if (reduce) cx_keep(cx_all_reduce(loss, CX_RED_SUM, 1.0, NULL, false));
    if (cx_backward(loss) != CX_OK) { fprintf(stderr, "backward: %s\n", cx_last_error()); return 1; }
    cx_optim_step(md->opt);
    if (cx_step_end() != CX_OK) { fprintf(stderr, "step %d: %s\n", s, cx_last_error()); return 1; }
    return 0;
}

/* One step in which rank 1 all-reduces fewer floats than the others. */
static int disagreeing_step(void)
{
    cx_step_begin();
    cx_tensor *x = batch(1, cx_global_ordinal() == 1 ? 3 : 4, 1.0);
    cx_keep(cx_all_reduce(x, CX_RED_SUM, 1.0, NULL, false));   /* @site desync */
    if (cx_step_end() == CX_OK) { fprintf(stderr, "the desync went unnoticed\n"); return 1; }
    fprintf(stderr, "step: %s\n", cx_last_error());
    return 0;
}

/* A step whose intermediate (an outer product, 4 MB) does not fit under
 * CX_MEMORY_LIMIT=1M, though its inputs do. */
static int oom_step(void)
{
    cx_step_begin();
    cx_tensor *outer = cx_matmul(batch(1000, 1, 0.5), batch(1, 1000, 0.5));   /* @site outer */
    cx_keep(cx_sum(outer, NULL, 0, false));
    if (cx_step_end() == CX_OK) { fprintf(stderr, "the step fitted under CX_MEMORY_LIMIT\n"); return 1; }
    fprintf(stderr, "step: %s\n", cx_last_error());
    return 0;
}

/* Steps that keep the forward's output alive every third step (as a user
 * who logs it would): that step's graph computes one more output. */
static int live_steps(model *md)
{
    for (int s = 0; s < 6; s++) {
        cx_step_begin();
        cx_optim_zero_grad(md->opt);
        cx_tensor *y = cx_module_forward(md->m, batch(4, IN, 0.5));   /* @site forward */
        if (s % 3 == 2) cx_keep(y);
        cx_tensor *loss = cx_mse_loss(y, batch(4, OUT, 1.0), CX_REDUCE_MEAN);
        if (cx_backward(loss) != CX_OK) { fprintf(stderr, "backward: %s\n", cx_last_error()); return 1; }
        cx_optim_step(md->opt);
        if (cx_step_end() != CX_OK) { fprintf(stderr, "step %d: %s\n", s, cx_last_error()); return 1; }
        if (s % 3 == 2) cx_free(y);
    }
    return 0;
}

/* SPMD: the batch is split by rows for two steps, then by columns (a
 * changed sharding, so a new graph). */
static int sharding_steps(void)
{
    if (cx_use_spmd() != CX_OK) { fprintf(stderr, "use_spmd: %s\n", cx_last_error()); return 1; }
    int n = cx_world_size(), *ids = malloc(sizeof(int) * (size_t)n);
    if (!ids) return 1;
    for (int i = 0; i < n; i++) ids[i] = i;
    cx_mesh *mesh = cx_mesh_new(ids, 1, &n, (const char *const[]){ "data" });
    free(ids);
    if (!mesh) { fprintf(stderr, "mesh: %s\n", cx_last_error()); return 1; }
    int rc = 0;
    for (int s = 0; rc == 0 && s < 3; s++) {
        cx_step_begin();
        cx_spec_entry spec[2] = { s < 2 ? CX_SPEC_NAME("data") : CX_SPEC_NONE, s < 2 ? CX_SPEC_NONE : CX_SPEC_NAME("data") };
        cx_tensor *x = batch(4, IN, 0.5);
        if (cx_mark_sharding(x, mesh, spec, 2) != CX_OK) { fprintf(stderr, "mark: %s\n", cx_last_error()); rc = 1; }   /* @site shard */
        cx_keep(cx_sum(cx_mul_scalar(x, 2.0), NULL, 0, false));
        if (cx_step_end() != CX_OK) { fprintf(stderr, "step %d: %s\n", s, cx_last_error()); rc = 1; }
    }
    if (rc == 0) print_info();
    /* a graph that cannot compile: an explicit collective beside shardings */
    cx_step_begin();
    cx_spec_entry rows[2] = { CX_SPEC_NAME("data"), CX_SPEC_NONE };
    cx_tensor *x = batch(4, IN, 0.5);
    if (rc == 0 && cx_mark_sharding(x, mesh, rows, 2) != CX_OK) rc = 1;
    cx_keep(cx_all_reduce(cx_mul_scalar(x, 2.0), CX_RED_SUM, 1.0, NULL, false));
    if (rc == 0 && cx_step_end() == CX_OK) { fprintf(stderr, "a collective beside shardings compiled\n"); rc = 1; }
    else if (rc == 0) fprintf(stderr, "step 3: %s\n", cx_last_error());
    return rc;
}

/* The program of a pending step as XLA_SAVE_TENSORS_FMT=hlo's cx_ir_text
 * shows it, then the step run. */
static int hlo(model *md)
{
    cx_step_begin();
    cx_tensor *loss = cx_mse_loss(cx_module_forward(md->m, batch(4, IN, 0.5)), batch(4, OUT, 1.0), CX_REDUCE_MEAN);
    cx_keep(loss);
    char *txt = cx_ir_text(&loss, 1);
    if (!txt) { fprintf(stderr, "cx_ir_text: %s\n", cx_last_error()); return 1; }
    fputs(txt, stdout);
    free(txt);
    if (cx_sync_tensors(&loss, 1) != CX_OK) { fprintf(stderr, "sync: %s\n", cx_last_error()); return 1; }
    print_info();
    cx_step_end();
    cx_free(loss);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    bool dist = argc > 2 && !strcmp(argv[2], "dist");
    if (dist && cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    model md;
    int rc = model_init(&md);
    if (rc == 0 && !strcmp(mode, "shape")) {
        /* 4, 4, 4, 5, 5, 5, ...: a new batch shape, so a new graph, every 3 steps */
        for (int s = 0; rc == 0 && s < STEPS; s++) rc = step(&md, s, 4 + s / 3, 0, false);
    } else if (rc == 0 && !strcmp(mode, "const")) {
        /* a learning-rate-like float that changes every step, baked into the graph */
        for (int s = 0; rc == 0 && s < 4; s++) rc = step(&md, s, 4, 1.0 / (1.0 + s), false);
    } else if (rc == 0 && !strcmp(mode, "dump")) {
        for (int s = 0; rc == 0 && s < 2; s++) rc = step(&md, s, 4, 0, cx_world_size() > 1);
        if (rc == 0) print_info();
    } else if (rc == 0 && !strcmp(mode, "hlo")) {
        rc = hlo(&md);
    } else if (rc == 0 && !strcmp(mode, "oom")) {
        rc = oom_step();
    } else if (rc == 0 && !strcmp(mode, "live")) {
        rc = live_steps(&md);
    } else if (rc == 0 && !strcmp(mode, "sharding")) {
        rc = sharding_steps();
    } else if (rc == 0 && !strcmp(mode, "desync")) {
        rc = step(&md, 0, 4, 0, true);
        if (rc == 0) rc = disagreeing_step();
    } else if (rc == 0) {
        fprintf(stderr, "usage: trainer_debug shape|const|live|dump|hlo|oom|desync|sharding\n");
        rc = 2;
    }
    model_free(&md);
    if (dist) cx_dist_finalize();
    return rc;
}
