/* DDP and xm.optimizer_step equivalence: after 5 steps with per-rank batch b
 * on N ranks, parameters equal those of one process with batch N*b on the
 * same samples; the number of all-reduces per step equals the buckets the
 * policy predicts, on every rank. With gradients sent as bf16, they come
 * back as bf16 values near the f32 mean. */
#include "dist_check.h"

#include <string.h>

#define IN 12
#define HID 40
#define OUT 5
#define B 4
#define STEPS 5

static cx_module *make_mlp(uint64_t seed)
{
    cx_manual_seed(seed);
    cx_module *layers[3] = { cx_nn_linear(IN, HID, true), cx_nn_relu(), cx_nn_linear(HID, OUT, true) };
    return cx_nn_sequential(layers, 3);
}

static float sample(int64_t i) { return (float)sin(0.37 * (double)i + 0.1); }

/* rows [row0, row0 + rows) of the global batch of step s */
static void batch(int s, int64_t row0, int64_t rows, cx_tensor **x, cx_tensor **y)
{
    float *hx = malloc(sizeof(float) * (size_t)(rows * IN)), *hy = malloc(sizeof(float) * (size_t)(rows * OUT));
    for (int64_t r = 0; r < rows; r++) {
        for (int j = 0; j < IN; j++) hx[r * IN + j] = sample((s * 1000 + row0 + r) * IN + j);
        for (int j = 0; j < OUT; j++) hy[r * OUT + j] = sample(7777 + (s * 1000 + row0 + r) * OUT + j);
    }
    int64_t sx[2] = { rows, IN }, sy[2] = { rows, OUT };
    *x = cx_from_host(hx, sx, 2, CX_F32);
    *y = cx_from_host(hy, sy, 2, CX_F32);
    free(hx);
    free(hy);
}

static void compare(cx_module *a, cx_module *b, const char *what)
{
    int na = 0, nb = 0;
    cx_named_tensor *pa = cx_module_parameters(a, &na), *pb = cx_module_parameters(b, &nb);
    CHECK(na == nb, "%s: parameter counts", what);
    for (int i = 0; i < na && i < nb; i++) {
        int64_t n = cx_numel(pa[i].tensor);
        float *ha = malloc(sizeof(float) * (size_t)n), *hb = malloc(sizeof(float) * (size_t)n);
        cx_to_host(pa[i].tensor, ha, CX_F32);
        cx_to_host(pb[i].tensor, hb, CX_F32);
        double worst = 0;
        for (int64_t k = 0; k < n; k++) {
            double d = fabs(ha[k] - hb[k]) / fmax(1e-3, fabs(hb[k]));
            if (d > worst) worst = d;
        }
        CHECK(worst <= 1e-5, "%s: %s differs by %.3g relative", what, pa[i].name, worst);
        free(ha);
        free(hb);
    }
    free(pa);
    free(pb);
}

static void train_reference(cx_module *m, int world)
{
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_sgd_opts o = cx_sgd_default_opts();
    o.lr = 0.1;
    o.momentum = 0.9;
    cx_optimizer *opt = cx_optim_sgd(ps, n, o);
    for (int s = 0; s < STEPS; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *x, *y;
        batch(s, 0, (int64_t)B * world, &x, &y);
        cx_tensor *loss = cx_mse_loss(cx_module_forward(m, x), y, CX_REDUCE_MEAN);
        cx_backward(loss);
        cx_optim_step(opt);
        CHECK(cx_step_end() == CX_OK, "reference step: %s", cx_last_error());
    }
    cx_optim_free(opt);
    free(ps);
}

/* The gradients of one step on the global batch (host copies, f32). */
static float **grads_of_step(cx_module *m, cx_ddp *ddp, int64_t row0, int64_t rows, int *np)
{
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_step_begin();
    cx_tensor *x, *y;
    batch(0, row0, rows, &x, &y);
    cx_tensor *loss = cx_mse_loss(ddp ? cx_ddp_forward(ddp, x) : cx_module_forward(m, x), y, CX_REDUCE_MEAN);
    CHECK((ddp ? cx_ddp_backward(ddp, loss) : cx_backward(loss)) == CX_OK, "backward: %s", cx_last_error());
    float **g = calloc((size_t)n, sizeof *g);
    for (int i = 0; i < n; i++) {
        g[i] = malloc(sizeof(float) * (size_t)cx_numel(ps[i].tensor));
        CHECK(cx_to_host(cx_grad(ps[i].tensor), g[i], CX_F32) == CX_OK, "grad: %s", cx_last_error());
    }
    CHECK(cx_step_end() == CX_OK, "step: %s", cx_last_error());
    free(ps);
    *np = n;
    return g;
}

/* bf16_compress_hook: every gradient DDP hands back is a bf16 value (its
 * low 16 bits are zero) within bf16's rounding of the f32 mean; an unknown
 * grad_comm is refused. */
static void check_bf16_grad_comm(int rank, int world)
{
    cx_module *ref = make_mlp(1), *m = make_mlp(1);
    int n = 0, nr = 0;
    float **want = grads_of_step(ref, NULL, 0, (int64_t)B * world, &nr);
    cx_ddp_opts o = cx_ddp_default_opts();
    o.first_bucket_bytes = 256;
    o.bucket_bytes = 1024;
    o.grad_comm = (cx_grad_comm)7;
    CHECK(cx_ddp_wrap(m, o) == NULL && strstr(cx_last_error(), "grad_comm"), "grad_comm 7 accepted");
    o.grad_comm = CX_GRAD_COMM_BF16;
    cx_ddp *ddp = cx_ddp_wrap(m, o);
    CHECK(ddp != NULL, "ddp_wrap: %s", cx_last_error());
    if (!ddp) return;
    float **got = grads_of_step(m, ddp, (int64_t)rank * B, B, &n);
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    for (int i = 0; i < n && i < nr; i++) {
        int64_t cnt = cx_numel(ps[i].tensor);
        double amax = 0, worst = 0;
        int not_bf16 = 0;
        for (int64_t k = 0; k < cnt; k++) amax = fmax(amax, fabs(want[i][k]));
        for (int64_t k = 0; k < cnt; k++) {
            uint32_t bits;
            memcpy(&bits, &got[i][k], sizeof bits);
            not_bf16 += (bits & 0xffffu) != 0;
            worst = fmax(worst, fabs(got[i][k] - want[i][k]));
        }
        CHECK(not_bf16 == 0, "bf16 grad_comm: %d entries of %s's gradient are not bf16 values", not_bf16, ps[i].name);
        /* each rank's part rounded to bf16, then the mean rounded once more */
        CHECK(worst <= amax / 64, "bf16 grad_comm: %s's gradient is %.3g from the f32 mean (max |g| %.3g)",
              ps[i].name, worst, amax);
        free(got[i]);
        free(want[i]);
    }
    free(got);
    free(want);
    free(ps);
    cx_ddp_free(ddp);
    cx_module_free(m);
    cx_module_free(ref);
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    int rank = cx_global_ordinal(), world = cx_world_size();
    check_bf16_grad_comm(rank, world);
    cx_module *ref = make_mlp(1);
    train_reference(ref, world);

    for (int mode = 0; mode < 2; mode++) {   /* 0: DDP, 1: xm.optimizer_step */
        /* ranks start different: the wrap (or the broadcast) must make them equal */
        cx_module *m = make_mlp(rank == 0 ? 1 : 100 + (uint64_t)rank);
        cx_ddp *ddp = NULL;
        if (mode == 0) {
            cx_ddp_opts o = cx_ddp_default_opts();
            o.first_bucket_bytes = 256;   /* several buckets on this small model */
            o.bucket_bytes = 1024;
            ddp = cx_ddp_wrap(m, o);
            CHECK(ddp != NULL, "ddp_wrap: %s", cx_last_error());
            if (!ddp) break;
        } else {
            CHECK(cx_broadcast_master_params(m) == CX_OK, "broadcast_master_params: %s", cx_last_error());
        }
        int n = 0;
        cx_named_tensor *ps = cx_module_parameters(m, &n);
        cx_sgd_opts so = cx_sgd_default_opts();
        so.lr = 0.1;
        so.momentum = 0.9;
        cx_optimizer *opt = cx_optim_sgd(ps, n, so);
        for (int s = 0; s < STEPS; s++) {
            int64_t c0 = cx_counter_value("CollectiveCount") - cx_counter_value("DesyncCheck");
            cx_step_begin();
            cx_optim_zero_grad(opt);
            cx_tensor *x, *y;
            batch(s, (int64_t)rank * B, B, &x, &y);
            cx_tensor *out = mode == 0 ? cx_ddp_forward(ddp, x) : cx_module_forward(m, x);
            cx_tensor *loss = cx_mse_loss(out, y, CX_REDUCE_MEAN);
            if (mode == 0) CHECK(cx_ddp_backward(ddp, loss) == CX_OK, "ddp_backward: %s", cx_last_error());
            else cx_backward(loss);
            if (mode == 0) cx_optim_step(opt);
            else CHECK(cx_optimizer_step(opt) == CX_OK, "optimizer_step: %s", cx_last_error());
            CHECK(cx_step_end() == CX_OK, "step: %s", cx_last_error());
            /* the desync check's all-gather is a collective too: not a bucket */
            int64_t colls = cx_counter_value("CollectiveCount") - cx_counter_value("DesyncCheck") - c0;
            if (mode == 0) {
                int predicted = cx_ddp_predict_buckets(ddp);
                CHECK(cx_ddp_num_buckets(ddp) == predicted && colls == predicted,
                      "step %d: %lld all-reduces, %d buckets, policy predicts %d", s, (long long)colls, cx_ddp_num_buckets(ddp), predicted);
                CHECK(predicted >= 3, "expected several buckets, policy gives %d", predicted);
                double c = (double)colls, mn = 0;
                cx_mesh_reduce("colls-min", &c, 1, NULL, &mn);
                CHECK(mn == c, "ranks ran different numbers of all-reduces (%g here, mean %g)", c, mn);
            }
        }
        compare(m, ref, mode == 0 ? "DDP vs single process" : "xm.optimizer_step vs single process");
        cx_optim_free(opt);
        free(ps);
        cx_ddp_free(ddp);
        cx_module_free(m);
    }
    cx_module_free(ref);
    return dist_finish("dist_ddp");
}
