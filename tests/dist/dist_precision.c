/* bf16-mixed (autocast around the forward, f32 parameters) over ranks:
 * DDP all-reduces f32 gradients (or bf16 ones with grad_comm bf16), FSDP
 * with compute_dtype bf16 all-gathers bf16 parameters and reduce-scatters
 * f32 gradients (bf16 ones without fp32_reduce_scatter), as the graphs say;
 * after 5 SGD steps every rank's parameters equal a single process's
 * bf16-mixed run on the global batch within TOL.
 *
 * TOL: the single process rounds each weight gradient to bf16 (the bf16
 * matmul's output) from the whole batch's sum, each rank from its half's,
 * and the halves are then summed in f32: the step's gradients differ by up
 * to 2^-8 relative (2^-8 more when the reduction itself is bf16). With
 * lr 0.05, momentum 0.9 and gradients below 1 in size, 5 steps move a
 * parameter by at most 0.05 * (1 + 1.9 + 2.71 + 3.44 + 4.10) = 0.66 times
 * the gradient, so they differ by up to 0.66 * 2 * 2^-8 = 5e-3; TOL is
 * that. The bf16-mixed run itself is checked to differ from an f32 run by
 * more than 1e-5, and each distributed run's gradient graph to hold bf16
 * values: TOL is wide enough to pass an f32 run too. */
#include "dist_check.h"

#include <string.h>

#define STEPS 5
#define B 2
#define TOL 5e-3

static cx_module *make_model(uint64_t seed)
{
    cx_manual_seed(seed);
    cx_module *l[5] = { cx_nn_linear(7, 33, true), cx_nn_relu(), cx_nn_linear(33, 16, true), cx_nn_relu(),
                        cx_nn_linear(16, 3, true) };
    return cx_nn_sequential(l, 5);
}

static float sample(int64_t i) { return (float)sin(0.61 * (double)i + 0.3); }

static void batch(int s, int64_t row0, int64_t rows, cx_tensor **x, cx_tensor **y)
{
    float hx[64 * 7], hy[64 * 3];
    for (int64_t r = 0; r < rows; r++) {
        for (int j = 0; j < 7; j++) hx[r * 7 + j] = sample((s * 100 + row0 + r) * 7 + j);
        for (int j = 0; j < 3; j++) hy[r * 3 + j] = sample(999 + (s * 100 + row0 + r) * 3 + j);
    }
    int64_t sx[2] = { rows, 7 }, sy[2] = { rows, 3 };
    *x = cx_from_host(hx, sx, 2, CX_F32);
    *y = cx_from_host(hy, sy, 2, CX_F32);
}

static cx_optimizer *make_opt(const cx_named_tensor *ps, int n)
{
    cx_sgd_opts o = cx_sgd_default_opts();
    o.lr = 0.05;
    o.momentum = 0.9;
    return cx_optim_sgd(ps, n, o);
}

typedef struct { int n; char *names[8]; float *vals[8]; int64_t numels[8]; } snapshot;

static void snap_take(snapshot *r, cx_named_tensor *ps, int n)
{
    r->n = n;
    for (int i = 0; i < n && i < 8; i++) {
        r->names[i] = strdup(ps[i].name);
        r->numels[i] = cx_numel(ps[i].tensor);
        r->vals[i] = malloc(sizeof(float) * (size_t)r->numels[i]);
        cx_to_host(ps[i].tensor, r->vals[i], CX_F32);
    }
}

static void snap_free(snapshot *s)
{
    for (int i = 0; i < s->n; i++) { free(s->names[i]); free(s->vals[i]); }
}

/* a single process on the global batch */
static snapshot reference(bool bf16, int world)
{
    cx_module *m = make_model(1);
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_optimizer *opt = make_opt(ps, n);
    for (int s = 0; s < STEPS; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *x, *y;
        batch(s, 0, (int64_t)B * world, &x, &y);
        if (bf16) cx_autocast_begin(CX_BF16);
        cx_tensor *loss = cx_mse_loss(cx_module_forward(m, x), y, CX_REDUCE_MEAN);
        if (bf16) cx_autocast_end();
        cx_backward(loss);
        cx_optim_step(opt);
        CHECK(cx_step_end() == CX_OK, "reference step: %s", cx_last_error());
    }
    snapshot r = { 0 };
    snap_take(&r, ps, n);
    cx_optim_free(opt);
    free(ps);
    cx_module_free(m);
    return r;
}

static double distance(const snapshot *a, const char *name, const float *v, int64_t numel)
{
    for (int i = 0; i < a->n; i++) {
        if (strcmp(a->names[i], name)) continue;
        double worst = 0;
        for (int64_t k = 0; k < numel && k < a->numels[i]; k++) {
            double d = fabs(v[k] - a->vals[i][k]) / fmax(1.0, fabs(a->vals[i][k]));
            if (d > worst) worst = d;
        }
        return worst;
    }
    return INFINITY;
}

/* every line of the graph of t naming `op` has dtype `dt` (at least one does) */
static void expect_ir(cx_tensor *t, const char *op, const char *dt, const char *what)
{
    char *ir = cx_ir_text(&t, 1);
    CHECK(ir != NULL, "%s: ir text: %s", what, cx_last_error());
    if (!ir) return;
    int seen = 0;
    for (char *line = strtok(ir, "\n"); line; line = strtok(NULL, "\n")) {
        char *at = strstr(line, op);
        if (!at || at[strlen(op)] != '(') continue;
        seen++;
        char *eq = strstr(line, "= ");
        CHECK(eq && !strncmp(eq + 2, dt, strlen(dt)), "%s: %s is not %s: %s", what, op, dt, line);
    }
    CHECK(seen > 0, "%s: no %s in the gradient's graph", what, op);
    free(ir);
    /* TOL would also pass an f32 run: the forward must have run in bf16 */
    ir = cx_ir_text(&t, 1);
    CHECK(ir && strstr(ir, "= bf16[") && strstr(ir, " matmul("), "%s: no bf16 values in the gradient's graph", what);
    free(ir);
}

typedef struct { const snapshot *ref; double worst; int seen; } cmp_ctx;

static cx_status compare_fn(void *p, const char *name, const int64_t *shape, int ndim, const float *data)
{
    cmp_ctx *c = p;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    double d = distance(c->ref, name, data, numel);
    if (d > c->worst) c->worst = d;
    c->seen++;
    return CX_OK;
}

static void fsdp_case(int zero, bool fp32_rs, const snapshot *ref)
{
    int rank = cx_global_ordinal();
    char what[96];
    snprintf(what, sizeof what, "fsdp zero%d bf16 %s reduce-scatter", zero, fp32_rs ? "f32" : "bf16");
    cx_module *m = make_model(1);
    cx_fsdp_opts o = cx_fsdp_default_opts();
    o.reshard_after_forward = zero == 3;
    o.auto_wrap_min_params = 100;
    o.compute_dtype = CX_BF16;
    o.fp32_reduce_scatter = fp32_rs;
    cx_fsdp *f = cx_fsdp_wrap(m, o);
    CHECK(f != NULL, "%s: wrap: %s", what, cx_last_error());
    if (!f) { cx_module_free(m); return; }
    int n = 0;
    cx_named_tensor *ps = cx_fsdp_parameters(f, &n);
    cx_optimizer *opt = make_opt(ps, n);
    for (int s = 0; s < STEPS; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *x, *y;
        batch(s, (int64_t)rank * B, B, &x, &y);
        cx_autocast_begin(CX_BF16);
        cx_tensor *loss = cx_mse_loss(cx_fsdp_forward(f, x), y, CX_REDUCE_MEAN);
        cx_autocast_end();
        CHECK(cx_fsdp_backward(f, loss) == CX_OK, "%s: backward: %s", what, cx_last_error());
        if (s == 0)
            for (int i = 0; i < n; i++) {
                cx_tensor *g = cx_grad(ps[i].tensor);
                CHECK(g && cx_dtype_of(g) == CX_F32, "%s: shard %s's gradient is not f32", what, ps[i].name);
                if (!g) continue;
                expect_ir(g, "all_gather", "bf16", what);
                expect_ir(g, "reduce_scatter", fp32_rs ? "f32" : "bf16", what);
            }
        cx_optim_step(opt);
        CHECK(cx_step_end() == CX_OK, "%s: step: %s", what, cx_last_error());
    }
    cmp_ctx c = { ref, 0, 0 };
    CHECK(cx_fsdp_full_state_dict(f, compare_fn, &c) == CX_OK, "%s: state dict: %s", what, cx_last_error());
    if (rank == 0) {
        CHECK(c.seen == ref->n && c.worst <= TOL, "%s: %d parameters, %.3g from the single process (tolerance %g)",
              what, c.seen, c.worst, TOL);
        printf("%s: %.3g from the single process\n", what, c.worst);
    }
    cx_optim_free(opt);
    free(ps);
    cx_fsdp_free(f);
    cx_module_free(m);
}

static void ddp_case(cx_grad_comm comm, const snapshot *ref)
{
    int rank = cx_global_ordinal();
    const char *what = comm == CX_GRAD_COMM_BF16 ? "ddp bf16-mixed, grad_comm bf16" : "ddp bf16-mixed";
    cx_module *m = make_model(rank == 0 ? 1 : 7);   /* the wrap takes rank 0's values */
    cx_ddp_opts o = cx_ddp_default_opts();
    o.grad_comm = comm;
    cx_ddp *d = cx_ddp_wrap(m, o);
    CHECK(d != NULL, "%s: wrap: %s", what, cx_last_error());
    if (!d) { cx_module_free(m); return; }
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_optimizer *opt = make_opt(ps, n);
    for (int s = 0; s < STEPS; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *x, *y;
        batch(s, (int64_t)rank * B, B, &x, &y);
        cx_autocast_begin(CX_BF16);
        cx_tensor *loss = cx_mse_loss(cx_ddp_forward(d, x), y, CX_REDUCE_MEAN);
        cx_autocast_end();
        CHECK(cx_ddp_backward(d, loss) == CX_OK, "%s: backward: %s", what, cx_last_error());
        if (s == 0) {
            cx_tensor *g = cx_grad(ps[0].tensor);
            CHECK(g && cx_dtype_of(g) == CX_F32, "%s: %s's gradient is not f32", what, ps[0].name);
            if (g) expect_ir(g, "all_reduce", comm == CX_GRAD_COMM_BF16 ? "bf16" : "f32", what);
        }
        cx_optim_step(opt);
        CHECK(cx_step_end() == CX_OK, "%s: step: %s", what, cx_last_error());
    }
    double worst = 0;
    for (int i = 0; i < n; i++) {
        float *v = malloc(sizeof(float) * (size_t)cx_numel(ps[i].tensor));
        cx_to_host(ps[i].tensor, v, CX_F32);
        double dd = distance(ref, ps[i].name, v, cx_numel(ps[i].tensor));
        if (dd > worst) worst = dd;
        free(v);
    }
    CHECK(worst <= TOL, "%s: rank %d's parameters %.3g from the single process (tolerance %g)", what, rank, worst, TOL);
    if (rank == 0) printf("%s: %.3g from the single process\n", what, worst);
    cx_optim_free(opt);
    free(ps);
    cx_ddp_free(d);
    cx_module_free(m);
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    int world = cx_world_size();
    snapshot ref = reference(true, world), ref32 = reference(false, world);
    double apart = 0;
    for (int i = 0; i < ref.n; i++) {
        double d = distance(&ref32, ref.names[i], ref.vals[i], ref.numels[i]);
        if (d > apart) apart = d;
    }
    CHECK(apart > 1e-5, "the bf16-mixed reference is %.3g from the f32 one: autocast did not engage", apart);
    if (cx_global_ordinal() == 0) printf("bf16-mixed single process: %.3g from f32\n", apart);
    ddp_case(CX_GRAD_COMM_F32, &ref);
    ddp_case(CX_GRAD_COMM_BF16, &ref);
    for (int zero = 2; zero <= 3; zero++) {
        fsdp_case(zero, true, &ref);
        fsdp_case(zero, false, &ref);
    }
    snap_free(&ref);
    snap_free(&ref32);
    return dist_finish("dist_precision");
}
