/* cxla-bench comm | ddp | fsdp: distributed figures.
 *
 *   xla-launch --nproc N cxla-bench comm   all-reduce bus bandwidth vs raw MPI_Allreduce
 *   cxla-bench ddp                         DDP on 2 ranks x 1 thread vs 1 rank x 2 threads
 *                                          (runs the reference here, then itself under xla-launch)
 *   xla-launch --nproc 4 cxla-bench fsdp   peak bytes and step time of ZeRO-2/3 vs DDP
 */
#include "bench.h"

#include <cxla/cxla.h>
#include <mpi.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int dist_start(int *argc, char ***argv)
{
    if (cx_dist_init(argc, argv) != CX_OK) {
        fprintf(stderr, "cxla-bench: %s\n", cx_last_error());
        return -1;
    }
    return 0;
}

static void emit0(const char *name, double v, const char *unit, double ref)
{
    if (cx_global_ordinal() == 0) bench_emit(name, v, unit, ref);
}

/* ---- comm ------------------------------------------------------------------------ */

int bench_comm(int argc, char **argv)
{
    if (dist_start(&argc, &argv)) return 1;
    int world = cx_world_size();
    if (world < 2 && cx_global_ordinal() == 0) fprintf(stderr, "cxla-bench comm: run it under xla-launch --nproc N (N >= 2)\n");
    const int mib[3] = { 1, 16, 64 };
    for (int s = 0; s < 3; s++) {
        int64_t n = (int64_t)mib[s] << 18; /* floats */
        float *h = malloc(sizeof(float) * (size_t)n), *o = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) h[i] = (float)(i % 17);
        cx_tensor *x = cx_from_host(h, &n, 1, CX_F32);
        int reps = mib[s] >= 64 ? 9 : 31;
        double t[32], r[32];
        /* library and raw alternate, so neither gains from running second */
        for (int k = 0; k < reps + 1; k++) {
            cx_barrier();
            double t0 = bench_now();
            cx_tensor *y = cx_all_reduce(x, CX_RED_SUM, 1.0, NULL, false);
            cx_sync_tensors(&y, 1);
            double dt = bench_now() - t0;
            cx_free(y);
            if (k) t[k - 1] = dt;
            cx_barrier();
            t0 = bench_now();
            MPI_Allreduce(h, o, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            dt = bench_now() - t0;
            if (k) r[k - 1] = dt;
        }
        /* bus bandwidth, as nccl-tests defines it */
        double bytes = 4.0 * (double)n * 2.0 * (world - 1) / (world > 1 ? world : 1);
        char name[64];
        snprintf(name, sizeof name, "allreduce_busbw_gbps_%dMiB", mib[s]);
        emit0(name, bytes / bench_median(t, reps) / 1e9, "GB/s", bytes / bench_median(r, reps) / 1e9);
        cx_free(x);
        free(h);
        free(o);
    }
    cx_dist_finalize();
    return 0;
}

/* ---- ddp -------------------------------------------------------------------------- */


/* images/s of this rank and the per-step all-reduce wait / total (ms) */
static double ddp_run(int64_t batch, int steps, bool ddp, double *wait_ms, double *comm_ms)
{
    cx_manual_seed(1);
    cx_module *m = bench_cnn();
    cx_ddp *d = ddp ? cx_ddp_wrap(m, cx_ddp_default_opts()) : NULL;
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_sgd_opts so = cx_sgd_default_opts();
    so.momentum = 0.5;
    cx_optimizer *opt = cx_optim_sgd(ps, n, so);
    float *hx = malloc(sizeof(float) * (size_t)(batch * 784));
    int64_t *hy = malloc(sizeof(int64_t) * (size_t)batch);
    for (int64_t i = 0; i < batch * 784; i++) hx[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < batch; i++) hy[i] = i % 10;
    int64_t sx[4] = { batch, 1, 28, 28 };
    double *t = malloc(sizeof(double) * (size_t)steps);
    cx_metric_stats w0 = { 0 }, c0 = { 0 }, w1 = { 0 }, c1 = { 0 };
    for (int s = 0; s < steps + 3; s++) {
        if (s == 3) { cx_metric_data("CollectiveWaitTime", &w0); cx_metric_data("CollectiveTime", &c0); }
        double t0 = bench_now();
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *x = cx_from_host(hx, sx, 4, CX_F32), *y = cx_from_host(hy, &batch, 1, CX_I64);
        cx_tensor *out = d ? cx_ddp_forward(d, x) : cx_module_forward(m, x);
        cx_tensor *loss = cx_nll_loss(out, y, CX_REDUCE_MEAN, -100);
        if (d) cx_ddp_backward(d, loss);
        else cx_backward(loss);
        cx_optim_step(opt);
        cx_step_end();
        if (s >= 3) t[s - 3] = bench_now() - t0;
    }
    cx_metric_data("CollectiveWaitTime", &w1);
    cx_metric_data("CollectiveTime", &c1);
    if (wait_ms) *wait_ms = (w1.accumulator - w0.accumulator) * 1e3 / steps;
    if (comm_ms) *comm_ms = (c1.accumulator - c0.accumulator) * 1e3 / steps;
    double ips = (double)batch / bench_median(t, steps);
    free(t); free(hx); free(hy); free(ps);
    cx_optim_free(opt);
    cx_ddp_free(d);
    cx_module_free(m);
    return ips;
}

static bool find_launcher(char *out, size_t n)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return false;
    self[len] = 0;
    char *dir = dirname(self);
    const char *cands[2] = { "%s/xla-launch", "%s/../launch/xla-launch" };
    for (int i = 0; i < 2; i++) {
        snprintf(out, n, cands[i], dir);
        if (access(out, X_OK) == 0) return true;
    }
    return false;
}

int bench_ddp(int argc, char **argv)
{
    bool worker = argc > 1 && !strcmp(argv[1], "--worker");
    if (worker) {
        if (dist_start(&argc, &argv)) return 1;
        double wait_ms = 0, comm_ms = 0;
        double ips = ddp_run(64, 10, true, &wait_ms, &comm_ms);
        double total = 0;
        cx_mesh_reduce("ddp-ips", &ips, 1, NULL, &total);
        total *= cx_world_size();
        if (cx_global_ordinal() == 0) printf("DDP %.3f %.3f %.3f\n", total, wait_ms, comm_ms);
        cx_dist_finalize();
        return 0;
    }
    /* reference: one rank, two threads */
    cx_set_num_threads(2);
    double ref = ddp_run(64, 10, false, NULL, NULL);
    char launcher[PATH_MAX], self[PATH_MAX], cmd[3 * PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0 || !find_launcher(launcher, sizeof launcher)) {
        fprintf(stderr, "cxla-bench ddp: cannot find xla-launch next to this program\n");
        return 1;
    }
    self[len] = 0;
    snprintf(cmd, sizeof cmd, "CX_NUM_THREADS=1 '%s' --nproc 2 '%s' ddp --worker 2>&1", launcher, self);
    FILE *p = popen(cmd, "r");
    if (!p) { fprintf(stderr, "cxla-bench ddp: cannot run %s\n", launcher); return 1; }
    char line[512];
    double ips = 0, wait_ms = 0, comm_ms = 0;
    bool got = false;
    while (fgets(line, sizeof line, p)) {
        char *s = strstr(line, "DDP ");
        if (s && sscanf(s, "DDP %lf %lf %lf", &ips, &wait_ms, &comm_ms) == 3) got = true;
        else fputs(line, stderr);
    }
    int rc = pclose(p);
    if (!got || rc != 0) { fprintf(stderr, "cxla-bench ddp: the 2-rank run failed\n"); return 1; }
    bench_emit("ddp_images_per_s", ips, "images/s", ref);
    bench_emit("ddp_exposed_comm_ms", wait_ms, "ms/step", comm_ms);
    return 0;
}

/* ---- fsdp ----------------------------------------------------------------------------- */

static cx_module *big_mlp(int width, int depth)
{
    cx_module *l[64];
    int k = 0;
    l[k++] = cx_nn_linear(784, width, true);
    for (int i = 0; i < depth - 1; i++) { l[k++] = cx_nn_relu(); l[k++] = cx_nn_linear(width, width, true); }
    l[k++] = cx_nn_relu();
    l[k++] = cx_nn_linear(width, 10, true);
    return cx_nn_sequential(l, k);
}

/* peak bytes per rank over training steps, and the median step time */
static void fsdp_run(int mode, int width, int depth, int64_t *peak, double *step_s)
{
    /* mode 0: DDP, 2: ZeRO-2, 3: ZeRO-3 */
    cx_manual_seed(1);
    cx_module *m = big_mlp(width, depth);
    cx_ddp *d = NULL;
    cx_fsdp *f = NULL;
    int n = 0;
    cx_named_tensor *ps;
    if (mode == 0) {
        d = cx_ddp_wrap(m, cx_ddp_default_opts());
        ps = cx_module_parameters(m, &n);
    } else {
        cx_fsdp_opts o = cx_fsdp_default_opts();
        static const char *const types[1] = { "Linear" };
        o.reshard_after_forward = mode == 3;
        o.auto_wrap_types = types;
        o.n_auto_wrap_types = 1;
        f = cx_fsdp_wrap(m, o);
        ps = cx_fsdp_parameters(f, &n);
    }
    if ((mode == 0 && !d) || (mode && !f)) { fprintf(stderr, "cxla-bench fsdp: %s\n", cx_last_error()); exit(1); }
    cx_adam_opts ao = cx_adamw_default_opts();
    cx_optimizer *opt = cx_optim_adamw(ps, n, ao);
    const int64_t batch = 8;
    float *hx = malloc(sizeof(float) * (size_t)(batch * 784));
    int64_t *hy = malloc(sizeof(int64_t) * (size_t)batch);
    for (int64_t i = 0; i < batch * 784; i++) hx[i] = (float)(i % 100) / 100.0f;
    for (int64_t i = 0; i < batch; i++) hy[i] = i % 10;
    int64_t sx[2] = { batch, 784 };
    double t[4];
    cx_memory_reset_peak();
    for (int s = 0; s < 5; s++) {
        cx_barrier();
        double t0 = bench_now();
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *x = cx_from_host(hx, sx, 2, CX_F32), *y = cx_from_host(hy, &batch, 1, CX_I64);
        cx_tensor *out = cx_module_forward(m, x);
        cx_tensor *loss = cx_cross_entropy(out, y, CX_REDUCE_MEAN, -100, 0.0);
        if (d) cx_ddp_backward(d, loss);
        else cx_backward(loss);
        cx_optim_step(opt);
        if (cx_step_end() != CX_OK) { fprintf(stderr, "cxla-bench fsdp: %s\n", cx_last_error()); exit(1); }
        cx_barrier();
        if (s >= 1) t[s - 1] = bench_now() - t0;
    }
    *peak = cx_memory_peak();
    *step_s = bench_median(t, 4);
    free(hx); free(hy); free(ps);
    cx_optim_free(opt);
    cx_ddp_free(d);
    cx_fsdp_free(f);
    cx_module_free(m);
    cx_cache_clear();
}

int bench_fsdp(int argc, char **argv)
{
    if (dist_start(&argc, &argv)) return 1;
    int width = 4096, depth = 8;
    if (argc > 2 && !strcmp(argv[1], "--width")) width = atoi(argv[2]);
    int64_t pk[4] = { 0 };
    double st[4] = { 0 };
    /* ZeRO-3, ZeRO-2, then DDP: the intermediate arena only grows, so each
     * run's peak includes no larger arena from an earlier run */
    const int order[3] = { 3, 2, 0 };
    for (int oi = 0; oi < 3; oi++) {
        int mode = order[oi];
        fsdp_run(mode, width, depth, &pk[mode], &st[mode]);
        /* the worst rank's peak */
        double v = (double)pk[mode], mx = 0;
        cx_mesh_reduce("fsdp-peak", &v, 1, NULL, &mx);
        if (cx_global_ordinal() == 0)
            fprintf(stderr, "%s: peak %.1f MB/rank (mean), step %.3f s\n", mode == 0 ? "ddp" : mode == 2 ? "zero2" : "zero3",
                    mx / 1e6, st[mode]);
        pk[mode] = (int64_t)mx;
    }
    emit0("zero3_peak_bytes_per_rank", (double)pk[3], "bytes", (double)pk[0]);
    emit0("zero2_peak_bytes_per_rank", (double)pk[2], "bytes", (double)pk[0]);
    emit0("zero3_step_s", st[3], "s", st[0]);
    cx_dist_finalize();
    return 0;
}
