/* cxla-bench train: images/s of whole training steps (forward, backward,
 * SGD update: one graph per step) against the GEMM-bound limit measured in
 * the same run: model FLOPs per image / cblas_sgemm GFLOP/s at 2048^2. */
#include "bench.h"

#include <cxla/cxla.h>
#include <cblas.h>

/* the reference is OpenBLAS with all the threads cxla uses */
extern void openblas_set_num_threads(int);
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* sgemm rate at 2048^2 with the current thread count */
static double sgemm_gflops(void)
{
    const int n = 2048;
    float *a = malloc(sizeof(float) * (size_t)n * n), *b = malloc(sizeof(float) * (size_t)n * n),
          *c = malloc(sizeof(float) * (size_t)n * n);
    for (int64_t i = 0; i < (int64_t)n * n; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; }
    double t[5];
    openblas_set_num_threads(cx_get_num_threads());
    for (int r = 0; r < 6; r++) {
        double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        if (r) t[r - 1] = bench_now() - t0;
    }
    openblas_set_num_threads(1);
    free(a); free(b); free(c);
    return 2.0 * n * n * (double)n / bench_median(t, 5) / 1e9;
}

/* The seed's MNIST cnn (shared with the ddp bench). */
cx_module *bench_cnn(void)
{
    cx_conv2d_opts co = cx_conv2d_default_opts();
    cx_module *l[10] = { cx_nn_conv2d(1, 32, 3, co), cx_nn_relu(), cx_nn_conv2d(32, 64, 3, co), cx_nn_relu(),
                         cx_nn_max_pool2d(2, 2, 0), cx_nn_flatten(1, -1), cx_nn_linear(9216, 128, true), cx_nn_relu(),
                         cx_nn_linear(128, 10, true), cx_nn_log_softmax(1) };
    return cx_nn_sequential(l, 10);
}

static cx_module *mlp(void)
{
    cx_module *l[8] = { cx_nn_flatten(1, -1), cx_nn_linear(784, 4096, true), cx_nn_relu(), cx_nn_linear(4096, 4096, true),
                        cx_nn_relu(), cx_nn_linear(4096, 4096, true), cx_nn_relu(), cx_nn_linear(4096, 10, true) };
    return cx_nn_sequential(l, 8);
}

/* training FLOPs per image: 3x the forward multiply-adds x 2 */
static double cnn_flops(void)
{
    double conv1 = 26.0 * 26 * 32 * 9, conv2 = 24.0 * 24 * 64 * 32 * 9, fc = 9216.0 * 128 + 128.0 * 10;
    return 6.0 * (conv1 + conv2 + fc);
}
static double mlp_flops(void) { return 6.0 * (784.0 * 4096 + 2.0 * 4096 * 4096 + 4096.0 * 10); }

/* images/s over `steps` timed steps after warm-up (median step time) */
double bench_train_images_per_s(cx_module *m, int64_t batch, int steps)
{
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_sgd_opts so = cx_sgd_default_opts();
    so.lr = 0.01;
    so.momentum = 0.5;
    cx_optimizer *opt = cx_optim_sgd(ps, n, so);
    float *hx = malloc(sizeof(float) * (size_t)(batch * 784));
    int64_t *hy = malloc(sizeof(int64_t) * (size_t)batch);
    for (int64_t i = 0; i < batch * 784; i++) hx[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < batch; i++) hy[i] = i % 10;
    int64_t sx[4] = { batch, 1, 28, 28 };
    double *t = malloc(sizeof(double) * (size_t)steps);
    for (int s = 0; s < steps + 3; s++) {
        double t0 = bench_now();
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *x = cx_from_host(hx, sx, 4, CX_F32), *y = cx_from_host(hy, &batch, 1, CX_I64);
        cx_tensor *loss = cx_nll_loss(cx_module_forward(m, x), y, CX_REDUCE_MEAN, -100);
        cx_backward(loss);
        cx_optim_step(opt);
        if (cx_step_end() != CX_OK) { fprintf(stderr, "bench train: %s\n", cx_last_error()); break; }
        if (s >= 3) t[s - 3] = bench_now() - t0;
    }
    double ips = (double)batch / bench_median(t, steps);
    free(t); free(hx); free(hy); free(ps);
    cx_optim_free(opt);
    return ips;
}

int bench_train(int argc, char **argv)
{
    (void)argc; (void)argv;
    for (int threads = 1; threads <= 2; threads++) {
        cx_set_num_threads(threads);
        double g = sgemm_gflops();
        char name[64];
        struct { const char *name; int64_t batch; double flops; int steps; cx_module *(*make)(void); } cases[3] = {
            { "cnn_b64", 64, cnn_flops(), 15, bench_cnn }, { "cnn_b256", 256, cnn_flops(), 7, bench_cnn },
            { "mlp4096_b256", 256, mlp_flops(), 5, mlp },
        };
        for (int i = 0; i < 3; i++) {
            cx_manual_seed(1);
            cx_module *m = cases[i].make();
            double ips = bench_train_images_per_s(m, cases[i].batch, cases[i].steps);
            snprintf(name, sizeof name, "train_%s_t%d_images_per_s", cases[i].name, threads);
            bench_emit(name, ips, "images/s", g * 1e9 / cases[i].flops);
            cx_module_free(m);
        }
    }
    return 0;
}
