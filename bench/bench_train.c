/* cxla-bench train: images/s of whole training steps (forward, backward,
 * SGD update: one graph per step) against the GEMM-bound limit: model FLOPs
 * per image over the cblas_sgemm rate at 2048^2, measured in every round
 * alongside the steps, so the limit drifts with the machine as they do. */
#include "bench.h"

#include <cxla/cxla.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resnet.h"

/* ---- the trainer (also the ddp bench's) ----------------------------------------- */

/* Distinct batches cycled through, so that hundreds of timed steps do not
 * drive a model that has memorized one batch into tiny (denormal) values. */
#define N_BATCHES 8
#define WARMUP_STEPS 3   /* the first steps compile (the momentum buffers appear in step 1) */

struct bench_trainer {
    cx_module *m;
    cx_ddp *d;
    cx_optimizer *opt;
    float *hx;
    int64_t *hy;
    int64_t batch;
    int next;
    cx_mesh *input_mesh;   /* SPMD: the batch splits over this mesh ... */
    cx_spec_entry input_spec[4];   /* ... as this spec says */
    bool autocast;                 /* bf16-mixed: the forward under autocast */
};

static bench_trainer *trainer_new(cx_module *m, int64_t batch, bool ddp, cx_mesh *input_mesh, const cx_spec_entry *spec)
{
    bench_trainer *t = calloc(1, sizeof *t);
    if (!t || !m) {
        fprintf(stderr, "cxla-bench: cannot build the model: %s\n", m ? "out of memory" : cx_last_error());
        free(t);
        cx_module_free(m);
        return NULL;
    }
    t->m = m;
    t->batch = batch;
    t->input_mesh = input_mesh;
    if (input_mesh) memcpy(t->input_spec, spec, sizeof t->input_spec);
    if (ddp && !(t->d = cx_ddp_wrap(m, cx_ddp_default_opts()))) {
        fprintf(stderr, "cxla-bench: DDP wrap: %s\n", cx_last_error());
        bench_trainer_free(t);
        return NULL;
    }
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_sgd_opts so = cx_sgd_default_opts();
    so.lr = 0.01;
    so.momentum = 0.5;
    t->opt = ps ? cx_optim_sgd(ps, n, so) : NULL;
    free(ps);
    size_t nx = (size_t)(N_BATCHES * batch * 784), ny = (size_t)(N_BATCHES * batch);
    t->hx = malloc(sizeof(float) * nx);
    t->hy = malloc(sizeof(int64_t) * ny);
    if (!t->opt || !t->hx || !t->hy) {
        fprintf(stderr, "cxla-bench: trainer set-up: %s\n", t->opt ? "out of memory" : cx_last_error());
        bench_trainer_free(t);
        return NULL;
    }
    for (size_t i = 0; i < nx; i++) t->hx[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < ny; i++) t->hy[i] = (int64_t)((i * 40503u) % 10);
    for (int s = 0; s < WARMUP_STEPS; s++)
        if (bench_trainer_step(t) < 0) {
            bench_trainer_free(t);
            return NULL;
        }
    return t;
}

bench_trainer *bench_trainer_new(cx_module *m, int64_t batch, bool ddp) { return trainer_new(m, batch, ddp, NULL, NULL); }

bench_trainer *bench_trainer_new_spmd(cx_module *m, int64_t global_batch, cx_mesh *input_mesh, const cx_spec_entry *spec)
{
    return trainer_new(m, global_batch, false, input_mesh, spec);
}

double bench_trainer_step(void *p)
{
    bench_trainer *t = p;
    int64_t sx[4] = { t->batch, 1, 28, 28 };
    const float *hx = t->hx + (size_t)(t->next * t->batch * 784);
    const int64_t *hy = t->hy + (size_t)(t->next * t->batch);
    t->next = (t->next + 1) % N_BATCHES;
    double t0 = bench_now();
    cx_step_begin();
    cx_optim_zero_grad(t->opt);
    cx_tensor *x = cx_from_host(hx, sx, 4, CX_F32), *y = cx_from_host(hy, &t->batch, 1, CX_I64);
    if (t->input_mesh) cx_mark_sharding(x, t->input_mesh, t->input_spec, 4);
    if (t->autocast) cx_autocast_begin(CX_BF16);
    cx_tensor *out = t->d ? cx_ddp_forward(t->d, x) : cx_module_forward(t->m, x);
    cx_tensor *loss = cx_nll_loss(out, y, CX_REDUCE_MEAN, -100);
    if (t->autocast) cx_autocast_end();
    /* a bad shape poisons the loss: backward is where it surfaces */
    cx_status bst = t->d ? cx_ddp_backward(t->d, loss) : cx_backward(loss);
    cx_optim_step(t->opt);
    /* an error anywhere else in the step surfaces here */
    cx_status st = cx_step_end();
    if (bst != CX_OK && st == CX_OK) st = bst;
    double dt = bench_now() - t0;
    if (st != CX_OK) {
        fprintf(stderr, "cxla-bench: training step: %s\n", cx_last_error());
        return -1;
    }
    return dt;
}

bool bench_trainer_set_autocast(bench_trainer *t, bool on)
{
    t->autocast = on;
    for (int s = 0; s < WARMUP_STEPS; s++)
        if (bench_trainer_step(t) < 0) return false;
    return true;
}

void bench_trainer_free(bench_trainer *t)
{
    if (!t) return;
    cx_optim_free(t->opt);
    cx_ddp_free(t->d);
    cx_module_free(t->m);
    free(t->hx);
    free(t->hy);
    free(t);
}

/* ---- models ------------------------------------------------------------------------ */

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

/* ---- resnet50 on ImageNet-shaped batches ------------------------------------------- */

/* The seed's --fake_data recipe at the figure's size: 224^2, batch 32, 1000
 * classes. A step is ~0.8 TFLOP, seconds on 2 threads: few steps are timed
 * (RESNET_ROUNDS_MAX rounds of one step each, after RESNET_WARMUP). */
#define RESNET_SIZE 224
#define RESNET_BATCH 32
#define RESNET_CLASSES 1000
#define RESNET_WARMUP 2   /* the first compiles; the second has the momentum buffers */
#define RESNET_ROUNDS_MAX 3
#define RESNET_BATCHES 2

typedef struct {
    cx_module *m;
    cx_optimizer *opt;
    float *hx;         /* RESNET_BATCHES x (B, 3, S, S) */
    int64_t *hy;       /* RESNET_BATCHES x (B) */
    int next;
} resnet_trainer;

static double resnet_step(void *p)
{
    resnet_trainer *t = p;
    int64_t sx[4] = { RESNET_BATCH, 3, RESNET_SIZE, RESNET_SIZE }, sy = RESNET_BATCH;
    size_t per = (size_t)RESNET_BATCH * 3 * RESNET_SIZE * RESNET_SIZE;
    double t0 = bench_now();
    cx_step_begin();
    cx_optim_zero_grad(t->opt);
    cx_tensor *x = cx_from_host(t->hx + (size_t)t->next * per, sx, 4, CX_F32);
    cx_tensor *y = cx_from_host(t->hy + (size_t)t->next * RESNET_BATCH, &sy, 1, CX_I64);
    t->next = (t->next + 1) % RESNET_BATCHES;
    cx_tensor *loss = cx_nll_loss(cx_log_softmax(cx_module_forward(t->m, x), 1), y, CX_REDUCE_MEAN, -100);
    cx_status bst = cx_backward(loss);
    cx_optim_step(t->opt);
    cx_status st = cx_step_end();
    if (bst != CX_OK && st == CX_OK) st = bst;
    if (st != CX_OK) {
        fprintf(stderr, "cxla-bench: resnet step: %s\n", cx_last_error());
        return -1;
    }
    return bench_now() - t0;
}

static void resnet_free(resnet_trainer *t)
{
    if (!t) return;
    cx_optim_free(t->opt);
    cx_module_free(t->m);
    free(t->hx);
    free(t->hy);
    free(t);
}

/* SGD with momentum as the other trainers, on model m (taken); the
 * warm-up steps run. NULL after printing why. */
static resnet_trainer *resnet_new(cx_module *m)
{
    resnet_trainer *t = calloc(1, sizeof *t);
    size_t nx = (size_t)RESNET_BATCHES * RESNET_BATCH * 3 * RESNET_SIZE * RESNET_SIZE;
    size_t ny = (size_t)RESNET_BATCHES * RESNET_BATCH;
    if (t) {
        t->m = m;
        t->hx = malloc(nx * sizeof *t->hx);
        t->hy = malloc(ny * sizeof *t->hy);
    }
    int n = 0;
    cx_named_tensor *ps = t && t->m ? cx_module_parameters(t->m, &n) : NULL;
    cx_sgd_opts so = cx_sgd_default_opts();
    so.momentum = 0.9;
    if (ps) t->opt = cx_optim_sgd(ps, n, so);
    free(ps);
    if (!t || !t->opt || !t->hx || !t->hy) {
        fprintf(stderr, "cxla-bench: resnet set-up: %s\n", t && (!t->m || !t->opt) ? cx_last_error() : "out of memory");
        if (!t) cx_module_free(m);
        resnet_free(t);
        return NULL;
    }
    for (size_t i = 0; i < nx; i++) t->hx[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    for (size_t i = 0; i < ny; i++) t->hy[i] = (int64_t)((i * 40503u) % RESNET_CLASSES);
    for (int s = 0; s < RESNET_WARMUP; s++)
        if (resnet_step(t) < 0) {
            resnet_free(t);
            return NULL;
        }
    return t;
}

/* Training FLOPs per image of resnet50's convolutions and fc at side s:
 * 3x the forward multiply-adds x 2, as the other figures count (conv1's
 * input gradient, which autograd skips, included). 4.09 G multiply-adds
 * forward at 224, torchvision's figure. */
static double resnet50_flops(int s)
{
    static const int blocks[4] = { 3, 4, 6, 3 };
    double h = floor((s - 1) / 2.0) + 1;                 /* conv1 7x7/2 p3 */
    double macs = h * h * 64 * 3 * 49, in = 64;
    h = floor((h - 1) / 2.0) + 1;                        /* maxpool 3/2 p1 */
    for (int l = 0; l < 4; l++) {
        double planes = 64 << l;
        for (int b = 0; b < blocks[l]; b++) {
            int stride = b == 0 && l > 0 ? 2 : 1;
            double ho = floor((h - 1) / stride) + 1;
            macs += h * h * in * planes                  /* conv1 1x1 */
                  + ho * ho * planes * planes * 9        /* conv2 3x3, the stride */
                  + ho * ho * planes * 4 * planes;       /* conv3 1x1 */
            if (b == 0) macs += ho * ho * in * 4 * planes;   /* downsample 1x1 */
            in = 4 * planes;
            h = ho;
        }
    }
    return 6.0 * (macs + in * RESNET_CLASSES);
}

/* resnet50_fake_images_per_s at 2 threads: images/s vs the GEMM-bound limit
 * of its convolutions and fc at the sgemm rate of the same rounds. */
static int bench_resnet50(const bench_cfg *cfg)
{
    cx_set_num_threads(2);
    bench_sgemm *g = bench_sgemm_new(2048);
    cx_manual_seed(1);
    resnet_trainer *t = g ? resnet_new(model_resnet50(3, RESNET_CLASSES, false)) : NULL;
    int rc = 1;
    if (t) {
        bench_sgemm_run(g);
        bench_side sides[2] = { { .unit = bench_sgemm_run, .ctx = g }, { .unit = resnet_step, .ctx = t } };
        bench_series fig = { 0 };
        int rounds = cfg->rounds < RESNET_ROUNDS_MAX ? cfg->rounds : RESNET_ROUNDS_MAX;
        double flops = resnet50_flops(RESNET_SIZE);
        rc = 0;
        for (int r = 0; r < rounds && rc == 0; r++) {
            double sec[2];
            if (!bench_round(cfg, r, sides, 2, sec)) rc = 1;
            else bench_add(&fig, RESNET_BATCH / sec[1], bench_sgemm_flop(g) / sec[0] / flops);
        }
        if (rc == 0) bench_emit("resnet50_fake_images_per_s", "images/s", BENCH_HIGHER, &fig);
    }
    resnet_free(t);
    bench_sgemm_free(g);
    return rc;
}

/* imagefolder_loader_images_per_s: the image-folder loader with 2 workers
 * (bench_loader.c) vs resnet18 training steps at 224^2, batch 32, 2
 * threads: >= 2 means the loader never starves the step. */
static int bench_loader_vs_resnet18(const bench_cfg *cfg, const char *dir)
{
    cx_set_num_threads(2);
    cx_manual_seed(1);
    resnet_trainer *t = resnet_new(model_resnet18(3, RESNET_CLASSES, false));
    if (!t) return 1;
    bench_cfg c = *cfg;
    if (c.rounds > RESNET_ROUNDS_MAX) c.rounds = RESNET_ROUNDS_MAX;
    int rc = bench_loader_figure(&c, dir, "imagefolder_loader_images_per_s", 2,
                                 (bench_side){ .unit = resnet_step, .ctx = t }, RESNET_BATCH);
    resnet_free(t);
    return rc;
}

/* The loader's figures (bench_loader.c's, then the ratio to resnet18), over
 * one synthetic folder. */
static int bench_loader_all(const bench_cfg *cfg)
{
    char dir[64];
    if (!bench_loader_folder(dir)) return 1;
    int rc = bench_train_loader(cfg, dir);
    if (!rc) rc = bench_loader_vs_resnet18(cfg, dir);
    bench_loader_folder_remove(dir);
    return rc;
}

/* ---- the subcommand ------------------------------------------------------------------ */

#define N_CASES 3

int bench_train(int argc, char **argv, bench_cfg cfg)
{
    bool only_resnet = false, only_loader = false;
    const cli_flag extra[] = { { .name = "resnet-only", .kind = CLI_BOOL, .dest = &only_resnet,
                                 .help = "only resnet50_fake_images_per_s" },
                               { .name = "loader-only", .kind = CLI_BOOL, .dest = &only_loader,
                                 .help = "only the imagefolder_loader_* figures" } };
    int rc = bench_parse("train", argc, argv, extra, 2, &cfg);
    if (rc >= 0) return rc;
    if (only_resnet) return bench_resnet50(&cfg);
    if (only_loader) return bench_loader_all(&cfg);
    const struct { const char *name; int64_t batch; double flops; cx_module *(*make)(void); } cases[N_CASES] = {
        { "cnn_b64", 64, cnn_flops(), bench_cnn },
        { "cnn_b256", 256, cnn_flops(), bench_cnn },
        { "mlp4096_b256", 256, mlp_flops(), mlp },
    };
    for (int threads = 1; threads <= 2; threads++) {
        cx_set_num_threads(threads);
        /* side 0: the sgemm rate; sides 1..N_CASES: the models */
        bench_side sides[1 + N_CASES] = { { 0 } };
        bench_trainer *tr[N_CASES] = { 0 };
        bench_sgemm *g = bench_sgemm_new(2048);
        rc = 1;
        if (!g) goto out;
        bench_sgemm_run(g);   /* sizes OpenBLAS' buffers */
        sides[0] = (bench_side){ .unit = bench_sgemm_run, .ctx = g };
        for (int i = 0; i < N_CASES; i++) {
            cx_manual_seed(1);
            if (!(tr[i] = bench_trainer_new(cases[i].make(), cases[i].batch, false))) goto out;
            sides[1 + i] = (bench_side){ .unit = bench_trainer_step, .ctx = tr[i] };
        }
        bench_series fig[N_CASES] = { { 0 } };
        for (int r = 0; r < cfg.rounds; r++) {
            double sec[1 + N_CASES];
            if (!bench_round(&cfg, r, sides, 1 + N_CASES, sec)) goto out;
            double flop_per_s = bench_sgemm_flop(g) / sec[0];
            for (int i = 0; i < N_CASES; i++)
                bench_add(&fig[i], (double)cases[i].batch / sec[1 + i], flop_per_s / cases[i].flops);
        }
        for (int i = 0; i < N_CASES; i++) {
            char name[64];
            snprintf(name, sizeof name, "train_%s_t%d_images_per_s", cases[i].name, threads);
            bench_emit(name, "images/s", BENCH_HIGHER, &fig[i]);
        }
        rc = 0;
    out:
        for (int i = 0; i < N_CASES; i++) bench_trainer_free(tr[i]);
        bench_sgemm_free(g);
        if (rc) return rc;
    }
    rc = bench_resnet50(&cfg);
    return rc ? rc : bench_loader_all(&cfg);
}
