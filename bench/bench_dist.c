/* cxla-bench comm | ddp | fsdp: distributed figures.
 *
 *   xla-launch --nproc N cxla-bench comm   all-reduce, reduce-scatter and all-gather bus bandwidth
 *                                          vs MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather
 *   cxla-bench ddp                         DDP on 2 ranks x 1 thread vs 1 rank x 2 threads
 *                                          (runs the reference here, and each round one
 *                                          `xla-launch --nproc 2 cxla-bench ddp --worker`)
 *   xla-launch --nproc 4 cxla-bench fsdp   peak bytes and step time of ZeRO-2/3 and FSDPv2 vs DDP
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

static void from_rank0(const double *all, int world, int n, double *out)
{
    (void)world;
    for (int i = 0; i < n; i++) out[i] = all[i];
}

/* bench_cfg.agree: every rank repeats a unit as often as rank 0 does */
static bool agree_rank0(bool enough)
{
    double mine = enough, all0 = 0;
    if (cx_mesh_reduce("cxla-bench-agree", &mine, 1, from_rank0, &all0) != CX_OK) {
        fprintf(stderr, "cxla-bench: agreeing on the repetitions: %s\n", cx_last_error());
        exit(1);
    }
    return all0 != 0;
}

static void max_reduce(const double *all, int world, int n, double *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = all[i];
        for (int r = 1; r < world; r++)
            if (all[r * n + i] > out[i]) out[i] = all[r * n + i];
    }
}

/* MPI up, and at least 2 ranks: @return -1 to go on, else the exit code */
static int dist_start(const char *sub, int *argc, char ***argv, bench_cfg *cfg)
{
    if (cx_dist_init(argc, argv) != CX_OK) {
        fprintf(stderr, "cxla-bench %s: %s\n", sub, cx_last_error());
        return 1;
    }
    if (cx_world_size() < 2) {
        fprintf(stderr, "cxla-bench %s: run it under xla-launch --nproc N (N >= 2); it measures across ranks\n", sub);
        cx_dist_finalize();
        return 2;
    }
    cfg->agree = agree_rank0;
    return -1;
}

static void emit0(const char *name, const char *unit, bench_better better, const bench_series *s)
{
    if (cx_global_ordinal() == 0) bench_emit(name, unit, better, s);
}

/* ---- comm ------------------------------------------------------------------------ */

/* The collectives compared, each through the library (an IR op run by the
 * comm backend: shared memory inside a node unless CX_SHM_COLLECTIVES=0)
 * and through the MPI call a user would make instead. */
typedef enum { COMM_ALL_REDUCE, COMM_REDUCE_SCATTER, COMM_ALL_GATHER } comm_kind;

typedef struct {
    comm_kind kind;
    cx_tensor *x;
    float *h, *o;
    int64_t n;        /* floats in the whole buffer (the all-reduce's, the reduce-scatter's input, the gather's output) */
    int world;
} comm_ctx;

static double lib_comm_unit(void *p)
{
    comm_ctx *c = p;
    cx_barrier();
    double t0 = bench_now();
    cx_tensor *y = c->kind == COMM_ALL_REDUCE ? cx_all_reduce(c->x, CX_RED_SUM, 1.0, NULL, false)
                 : c->kind == COMM_REDUCE_SCATTER ? cx_reduce_scatter(c->x, CX_RED_SUM, 1.0, 0, NULL, false)
                                                  : cx_all_gather(c->x, 0, NULL, false);
    cx_status st = cx_sync_tensors(&y, 1);
    double dt = bench_now() - t0;
    cx_free(y);
    if (st != CX_OK) {
        fprintf(stderr, "cxla-bench comm: %s\n", cx_last_error());
        return -1;
    }
    return dt;
}

static double mpi_comm_unit(void *p)
{
    comm_ctx *c = p;
    int block = (int)(c->n / c->world);
    cx_barrier();
    double t0 = bench_now();
    int rc = c->kind == COMM_ALL_REDUCE ? MPI_Allreduce(c->h, c->o, (int)c->n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)
           : c->kind == COMM_REDUCE_SCATTER
               ? MPI_Reduce_scatter_block(c->h, c->o, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)
               : MPI_Allgather(c->h, block, MPI_FLOAT, c->o, block, MPI_FLOAT, MPI_COMM_WORLD);
    double dt = bench_now() - t0;
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "cxla-bench comm: the MPI reference failed (%d)\n", rc);
        return -1;
    }
    return dt;
}

/* One figure: the library against MPI for one collective and size.
 * @return 0, or 1 after saying why. */
static int comm_figure(comm_kind kind, int mib, int world, const bench_cfg *cfg)
{
    static const char *const names[] = { "allreduce", "reducescatter", "allgather" };
    comm_ctx c = { .kind = kind, .n = (int64_t)mib << 18, .world = world };   /* floats */
    c.n -= c.n % world;
    int64_t in_n = kind == COMM_ALL_GATHER ? c.n / world : c.n;
    c.h = malloc(sizeof(float) * (size_t)c.n);
    c.o = malloc(sizeof(float) * (size_t)c.n);
    if (!c.h || !c.o) {
        fprintf(stderr, "cxla-bench comm: out of memory for %d MiB\n", mib);
        free(c.h); free(c.o);
        return 1;
    }
    for (int64_t i = 0; i < c.n; i++) c.h[i] = (float)(i % 17);
    c.x = cx_from_host(c.h, &in_n, 1, CX_F32);
    /* bus bandwidth as nccl-tests defines it: an all-reduce moves
     * 2 (n-1)/n of the buffer per rank, a reduce-scatter or all-gather
     * (n-1)/n of the whole buffer */
    double bytes = 4.0 * (double)c.n * (kind == COMM_ALL_REDUCE ? 2.0 : 1.0) * (world - 1) / world;
    bench_side sides[2] = { { .unit = lib_comm_unit, .ctx = &c }, { .unit = mpi_comm_unit, .ctx = &c } };
    bench_series fig = { 0 };
    int rc = 1;
    /* the first of each compiles or sets up its buffers */
    if (c.x && lib_comm_unit(&c) >= 0 && mpi_comm_unit(&c) >= 0) {
        rc = 0;
        for (int r = 0; r < cfg->rounds && !rc; r++) {
            double sec[2];
            if (!bench_round(cfg, r, sides, 2, sec)) rc = 1;
            else bench_add(&fig, bytes / sec[0] / 1e9, bytes / sec[1] / 1e9);
        }
    }
    char name[64];
    snprintf(name, sizeof name, "%s_busbw_gbps_%dMiB", names[kind], mib);
    if (!rc) emit0(name, "GB/s", BENCH_HIGHER, &fig);
    cx_free(c.x);
    free(c.h);
    free(c.o);
    return rc;
}

int bench_comm(int argc, char **argv, bench_cfg cfg)
{
    int rc = bench_parse("comm", argc, argv, NULL, 0, &cfg);
    if (rc >= 0) return rc;
    if ((rc = dist_start("comm", &argc, &argv, &cfg)) >= 0) return rc;
    /* the reference calls MPI here while the library's progress thread
     * may be in MPI too */
    int level = 0;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "cxla-bench comm: this MPI does not provide MPI_THREAD_MULTIPLE, which the MPI reference needs\n");
        cx_dist_finalize();
        return 1;
    }
    int world = cx_world_size();
    const int mib[3] = { 1, 16, 64 };
    rc = 0;
    for (int k = COMM_ALL_REDUCE; k <= COMM_ALL_GATHER && !rc; k++)
        for (int s = 0; s < 3 && !rc; s++) rc = comm_figure((comm_kind)k, mib[s], world, &cfg);
    cx_dist_finalize();
    return rc;
}

/* ---- ddp -------------------------------------------------------------------------- */

#define DDP_RANKS 2
#define DDP_BATCH 64   /* per rank, and the reference's */

/* Per-step all-reduce times: their medians, not their means, since a step
 * now and then waits far longer (the two ranks share two cores with their
 * progress threads), and one such step would move a mean by half. */
#define DDP_MAX_STEPS 4096

typedef struct {
    bench_trainer *t;
    int steps;
    double wait_ms[DDP_MAX_STEPS], comm_ms[DDP_MAX_STEPS];   /* waited for, and in all */
    double desync_ms[DDP_MAX_STEPS], step_ms[DDP_MAX_STEPS];  /* the desync check's wait, the whole step */
} ddp_worker_ctx;

/* One DDP step; the collective metrics are read around the step alone, so
 * the agreement between steps does not count in them. */
static double ddp_worker_unit(void *p)
{
    ddp_worker_ctx *w = p;
    cx_metric_stats w0 = { 0 }, c0 = { 0 }, d0 = { 0 }, w1 = { 0 }, c1 = { 0 }, d1 = { 0 };
    cx_metric_data("CollectiveWaitTime", &w0);
    cx_metric_data("CollectiveTime", &c0);
    cx_metric_data("DesyncCheckTime", &d0);
    double dt = bench_trainer_step(w->t);
    cx_metric_data("CollectiveWaitTime", &w1);
    cx_metric_data("CollectiveTime", &c1);
    cx_metric_data("DesyncCheckTime", &d1);
    if (w->steps < DDP_MAX_STEPS) {
        w->wait_ms[w->steps] = (w1.accumulator - w0.accumulator) * 1e3;
        w->comm_ms[w->steps] = (c1.accumulator - c0.accumulator) * 1e3;
        w->desync_ms[w->steps] = (d1.accumulator - d0.accumulator) * 1e3;
        w->step_ms[w->steps] = dt * 1e3;
        w->steps++;
    }
    return dt;
}

/* The model whose gradients the communication figures time: an mlp with
 * 23 MB of them, where the cnn's 0.4 MB all-reduce took well under a
 * millisecond and its per-step time moved by half between runs with the
 * scheduling of two ranks and their progress threads on two cores. */
static cx_module *ddp_comm_mlp(void)
{
    cx_module *l[7] = { cx_nn_flatten(1, -1), cx_nn_linear(784, 2048, true), cx_nn_relu(),
                        cx_nn_linear(2048, 2048, true), cx_nn_relu(), cx_nn_linear(2048, 10, true),
                        cx_nn_log_softmax(1) };
    return cx_nn_sequential(l, 7);
}

/* One rank of a round's launch: DDP steps of the cnn or the mlp for at
 * least min_time; rank 0 prints "DDP <images/s of all ranks> <wait
 * ms/step> <all-reduce ms/step> <desync check wait ms/step> <step ms>"
 * (the first two: means over steps and ranks; the others: medians over
 * rank 0's steps). */
static int ddp_worker(int argc, char **argv)
{
    char *end = NULL;
    double min_time = argc == 4 ? strtod(argv[2], &end) : -1;
    if (!end || *end || min_time < 0 || (strcmp(argv[3], "cnn") && strcmp(argv[3], "mlp"))) {
        fprintf(stderr, "cxla-bench ddp: --worker is internal (cxla-bench ddp --worker MIN_TIME {cnn,mlp})\n");
        return 2;
    }
    bool mlp = !strcmp(argv[3], "mlp");
    argc = 3;
    bench_cfg cfg = { .rounds = 1, .min_time = min_time };
    int rc = dist_start("ddp --worker", &argc, &argv, &cfg);
    if (rc >= 0) return rc;
    cx_manual_seed(1);
    ddp_worker_ctx *w = calloc(1, sizeof *w);
    if (!w) { fprintf(stderr, "cxla-bench ddp: out of memory\n"); return 1; }
    w->t = bench_trainer_new(mlp ? ddp_comm_mlp() : bench_cnn(), DDP_BATCH, true);
    double sec = w->t ? bench_repeat(&cfg, ddp_worker_unit, w) : -1;
    if (sec < 0 || w->steps == 0) { free(w); return 1; }
    double ips = (double)DDP_BATCH / sec, total = 0;
    cx_mesh_reduce("ddp-ips", &ips, 1, NULL, &total);
    total *= cx_world_size();
    /* a step either waits for its all-reduce or hardly at all (two ranks and
     * their progress threads share two cores): the median of such a
     * distribution jumps between its modes from run to run, so the
     * communication times are means over steps and ranks */
    double comm[2] = { 0, 0 }, comm_all[2] = { 0, 0 };
    for (int s = 0; s < w->steps; s++) { comm[0] += w->wait_ms[s]; comm[1] += w->comm_ms[s]; }
    comm[0] /= w->steps;
    comm[1] /= w->steps;
    cx_mesh_reduce("ddp-comm", comm, 2, NULL, comm_all);
    if (cx_global_ordinal() == 0)
        printf("DDP %.6f %.6f %.6f %.6f %.6f\n", total, comm_all[0], comm_all[1], bench_median(w->desync_ms, w->steps),
               bench_median(w->step_ms, w->steps));
    bench_trainer_free(w->t);
    free(w);
    cx_dist_finalize();
    return 0;
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

typedef struct {
    char cmd[3 * PATH_MAX + 16];
    double ips, wait_ms, comm_ms, desync_ms, step_ms;   /* of the last launch */
} ddp_launch_ctx;

/* bench_side.whole_round: one launch of DDP_RANKS ranks that time their
 * steps for at least min_time; the launch's start-up is not timed. */
static double ddp_launch_round(void *p, const bench_cfg *cfg)
{
    ddp_launch_ctx *l = p;
    char cmd[sizeof l->cmd + 64];
    snprintf(cmd, sizeof cmd, "%s 2>&1", l->cmd);
    char *at = strstr(cmd, "MIN_TIME");   /* the worker's first argument */
    if (at) {
        char t[32];
        snprintf(t, sizeof t, "%.9g", cfg->min_time);
        memmove(at + strlen(t), at + 8, strlen(at + 8) + 1);
        memcpy(at, t, strlen(t));
    }
    FILE *f = popen(cmd, "r");
    if (!f) {
        fprintf(stderr, "cxla-bench ddp: cannot run %s\n", l->cmd);
        return -1;
    }
    char line[512];
    bool got = false;
    while (fgets(line, sizeof line, f)) {
        char *s = strstr(line, "DDP ");
        if (s && sscanf(s, "DDP %lf %lf %lf %lf %lf", &l->ips, &l->wait_ms, &l->comm_ms, &l->desync_ms, &l->step_ms) == 5)
            got = true;
        else fputs(line, stderr);
    }
    int rc = pclose(f);
    if (!got || rc != 0 || !(l->ips > 0)) {
        fprintf(stderr, "cxla-bench ddp: the %d-rank run failed\n", DDP_RANKS);
        return -1;
    }
    return (double)DDP_BATCH * DDP_RANKS / l->ips;
}

int bench_ddp(int argc, char **argv, bench_cfg cfg)
{
    if (argc > 1 && !strcmp(argv[1], "--worker")) return ddp_worker(argc, argv);
    int rc = bench_parse("ddp", argc, argv, NULL, 0, &cfg);
    if (rc >= 0) return rc;
    /* mpirun refuses to be started from inside one of its own ranks */
    if (bench_in_launched_rank()) {
        /* one line for the job, not one per rank */
        if (bench_is_rank0())
            fprintf(stderr, "cxla-bench ddp: this subcommand starts its own ranks (it runs xla-launch itself); "
                            "run it directly, not under xla-launch or mpirun\n");
        return 2;
    }
    ddp_launch_ctx l, lm, big, bigm;
    char launcher[PATH_MAX], self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0 || !find_launcher(launcher, sizeof launcher)) {
        fprintf(stderr, "cxla-bench ddp: cannot find xla-launch next to this program\n");
        return 1;
    }
    self[len] = 0;
    /* the cnn, then the same ranks with every collective through MPI; the
     * communication figures' model both ways */
    ddp_launch_ctx *runs[4] = { &l, &lm, &big, &bigm };
    for (int i = 0; i < 4; i++)
        snprintf(runs[i]->cmd, sizeof runs[i]->cmd, "%sCX_NUM_THREADS=1 '%s' --nproc %d '%s' ddp --worker MIN_TIME %s",
                 i % 2 ? "CX_SHM_COLLECTIVES=0 " : "", launcher, DDP_RANKS, self, i < 2 ? "cnn" : "mlp");
    /* reference: one rank, two threads, in this process */
    cx_set_num_threads(2);
    cx_manual_seed(1);
    bench_trainer *ref = bench_trainer_new(bench_cnn(), DDP_BATCH, false);
    if (!ref) return 1;
    bench_side sides[5] = { { .whole_round = ddp_launch_round, .ctx = &l },
                            { .unit = bench_trainer_step, .ctx = ref },
                            { .whole_round = ddp_launch_round, .ctx = &lm },
                            { .whole_round = ddp_launch_round, .ctx = &big },
                            { .whole_round = ddp_launch_round, .ctx = &bigm } };
    bench_series ips = { 0 }, exposed = { 0 }, shm_ips = { 0 }, shm_exposed = { 0 }, shm_comm = { 0 }, desync = { 0 };
    rc = 0;
    for (int r = 0; r < cfg.rounds && !rc; r++) {
        double sec[5];
        if (!bench_round(&cfg, r, sides, 5, sec)) rc = 1;
        else {
            bench_add(&ips, l.ips, (double)DDP_BATCH / sec[1]);
            bench_add(&shm_ips, l.ips, lm.ips);
            bench_add(&desync, l.desync_ms, l.step_ms);
            bench_add(&exposed, big.wait_ms, big.comm_ms);
            bench_add(&shm_exposed, big.wait_ms, bigm.wait_ms);
            bench_add(&shm_comm, big.comm_ms, bigm.comm_ms);
        }
    }
    bench_trainer_free(ref);
    if (rc) return rc;
    bench_emit("ddp_images_per_s", "images/s", BENCH_HIGHER, &ips);
    bench_emit("ddp_exposed_comm_ms", "ms/step", BENCH_LOWER, &exposed);
    bench_emit("ddp_shm_images_per_s", "images/s", BENCH_HIGHER, &shm_ips);
    bench_emit("ddp_shm_exposed_comm_ms", "ms/step", BENCH_LOWER, &shm_exposed);
    bench_emit("ddp_shm_allreduce_ms", "ms/step", BENCH_LOWER, &shm_comm);
    bench_emit("ddp_desync_check_ms", "ms/step", BENCH_LOWER, &desync);
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

#define FSDP_DEPTH 8
#define FSDP_BATCH 8

typedef struct {
    int mode;   /* 0: DDP, 2: ZeRO-2, 3: ZeRO-3 */
    cx_module *m;
    cx_ddp *d;
    cx_fsdp *f;
    cx_optimizer *opt;
    int64_t construct_peak;   /* peak bytes in use once built and wrapped (before the optimizer) */
    float hx[FSDP_BATCH * 784];
    int64_t hy[FSDP_BATCH];
} fsdp_runner;

static const char *mode_name(int mode) { return mode == 0 ? "ddp" : mode == 2 ? "zero2" : "zero3"; }

static void fsdp_free(fsdp_runner *r)
{
    if (!r) return;
    cx_optim_free(r->opt);
    cx_ddp_free(r->d);
    cx_fsdp_free(r->f);
    cx_module_free(r->m);
    free(r);
}

/* A model of `depth` Linear layers, built eagerly or deferred, wrapped as
 * `mode` says (FSDP: one unit per Linear), with AdamW. */
static fsdp_runner *fsdp_new(int mode, int width, int depth, bool deferred)
{
    fsdp_runner *r = calloc(1, sizeof *r);
    if (!r) { fprintf(stderr, "cxla-bench fsdp: out of memory\n"); return NULL; }
    r->mode = mode;
    cx_manual_seed(1);
    if (deferred) cx_deferred_init_begin();
    r->m = big_mlp(width, depth);
    if (deferred) cx_deferred_init_end();
    int n = 0;
    cx_named_tensor *ps = NULL;
    if (r->m && mode == 0) {
        if ((r->d = cx_ddp_wrap(r->m, cx_ddp_default_opts()))) ps = cx_module_parameters(r->m, &n);
    } else if (r->m) {
        cx_fsdp_opts o = cx_fsdp_default_opts();
        static const char *const types[1] = { "Linear" };
        o.reshard_after_forward = mode == 3;
        o.auto_wrap_types = types;
        o.n_auto_wrap_types = 1;
        if ((r->f = cx_fsdp_wrap(r->m, o))) ps = cx_fsdp_parameters(r->f, &n);
    }
    r->construct_peak = cx_memory_peak();
    if (ps) r->opt = cx_optim_adamw(ps, n, cx_adamw_default_opts());
    free(ps);
    if (!r->opt) {
        fprintf(stderr, "cxla-bench fsdp: %s set-up: %s\n", mode_name(mode), cx_last_error());
        fsdp_free(r);
        return NULL;
    }
    for (int64_t i = 0; i < FSDP_BATCH * 784; i++) r->hx[i] = (float)(i % 100) / 100.0f;
    for (int64_t i = 0; i < FSDP_BATCH; i++) r->hy[i] = i % 10;
    return r;
}

/* one step, between barriers so that every rank times the same thing */
static double fsdp_step(void *p)
{
    fsdp_runner *r = p;
    int64_t sx[2] = { FSDP_BATCH, 784 }, batch = FSDP_BATCH;
    cx_barrier();
    double t0 = bench_now();
    cx_step_begin();
    cx_optim_zero_grad(r->opt);
    cx_tensor *x = cx_from_host(r->hx, sx, 2, CX_F32), *y = cx_from_host(r->hy, &batch, 1, CX_I64);
    cx_tensor *loss = cx_cross_entropy(cx_module_forward(r->m, x), y, CX_REDUCE_MEAN, -100, 0.0);
    if (r->d) cx_ddp_backward(r->d, loss);
    else cx_backward(loss);
    cx_optim_step(r->opt);
    cx_status st = cx_step_end();
    cx_barrier();
    double dt = bench_now() - t0;
    if (st != CX_OK) {
        fprintf(stderr, "cxla-bench fsdp: %s step: %s\n", mode_name(r->mode), cx_last_error());
        return -1;
    }
    return dt;
}

/* The worst rank's peak bytes over the first steps (the optimizer state
 * appears in the first, the graphs settle by the third), with the model
 * freed afterwards. */
#define PEAK_STEPS 3
static bool fsdp_peak(int mode, int width, double *peak)
{
    fsdp_runner *r = fsdp_new(mode, width, FSDP_DEPTH, false);
    if (!r) return false;
    cx_memory_reset_peak();
    for (int s = 0; s < PEAK_STEPS; s++)
        if (fsdp_step(r) < 0) { fsdp_free(r); return false; }
    double mine = (double)cx_memory_peak();
    fsdp_free(r);
    cx_cache_clear();
    if (cx_mesh_reduce("cxla-bench-fsdp-peak", &mine, 1, max_reduce, peak) != CX_OK) {
        fprintf(stderr, "cxla-bench fsdp: %s\n", cx_last_error());
        return false;
    }
    if (cx_global_ordinal() == 0) fprintf(stderr, "%s: peak %.1f MB on the worst rank\n", mode_name(mode), *peak / 1e6);
    return true;
}

/* ---- the largest model under a per-rank memory limit ---------------------------- */

#define LIMIT_DEPTH 24

typedef struct {
    double peak;        /* the worst rank's peak bytes in use: construction and 3 steps */
    double construct;   /* ... during construction and wrapping only */
    int64_t nparams, largest_unit;
} limit_trial;

/* A deferred mlp of `width` under ZeRO-3 (one unit per Linear) with AdamW:
 * built, wrapped and trained 3 steps from an empty cache and arena, as a
 * fresh process would. @return false on an error (it said why). */
static bool limit_run(int width, limit_trial *t)
{
    cx_cache_clear();
    cx_memory_reset_peak();
    fsdp_runner *r = fsdp_new(3, width, LIMIT_DEPTH, true);
    if (!r) return false;
    double mine[2] = { (double)r->construct_peak, 0 };
    t->nparams = 0;
    t->largest_unit = 0;
    int nu = 0;
    const cx_fsdp_unit_info *meta = cx_fsdp_shard_metadata(r->f, &nu);
    for (int u = 0; u < nu; u++) {
        t->nparams += meta[u].flat_numel;
        if (meta[u].padded_numel > t->largest_unit) t->largest_unit = meta[u].padded_numel;
    }
    bool ok = true;
    for (int s = 0; ok && s < PEAK_STEPS; s++) ok = fsdp_step(r) >= 0;
    mine[1] = (double)cx_memory_peak();
    fsdp_free(r);
    cx_cache_clear();
    double worst[2];
    if (!ok || cx_mesh_reduce("cxla-bench-fsdp-limit", mine, 2, max_reduce, worst) != CX_OK) {
        if (ok) fprintf(stderr, "cxla-bench fsdp: %s\n", cx_last_error());
        return false;
    }
    t->construct = worst[0];
    t->peak = worst[1];
    if (cx_global_ordinal() == 0)
        fprintf(stderr, "limit search: width %d, %.1fM parameters: peak %.1f MB (construction %.1f MB)\n", width,
                (double)t->nparams / 1e6, t->peak / 1e6, t->construct / 1e6);
    return true;
}

/* Binary search for the widest model whose peak stays under `limit`; the
 * peak grows with the width. @return the width (0: not even the smallest),
 * -1 on an error. */
static int largest_width_under(double limit, limit_trial *best)
{
    int lo = 0, hi = 16;
    limit_trial t;
    /* grow until over: every trial is a real build and run */
    for (;;) {
        if (!limit_run(hi, &t)) return -1;
        if (t.peak > limit) break;
        lo = hi;
        *best = t;
        hi *= 2;
    }
    while (hi - lo > 16) {
        int mid = (lo + hi) / 2 / 16 * 16;
        if (!limit_run(mid, &t)) return -1;
        if (t.peak <= limit) { lo = mid; *best = t; }
        else hi = mid;
    }
    return lo;
}

/* zero3_largest_model_vs_limit and the construction peak of that model. */
static bool bench_limit(double limit_mb)
{
    double limit = limit_mb * 1e6;
    limit_trial best = { 0 };
    int w = largest_width_under(limit, &best);
    if (w < 0) return false;
    if (w == 0) {
        if (cx_global_ordinal() == 0) fprintf(stderr, "cxla-bench fsdp: no model fits under %.0f MB\n", limit_mb);
        return false;
    }
    int world = cx_world_size();
    /* parameters, gradients and AdamW's two moments, f32 */
    bench_series fit = { 0 }, cons = { 0 };
    bench_add(&fit, 16.0 * (double)best.nparams, limit);
    bench_add(&cons, best.construct, 4.0 * ((double)best.nparams / world + (double)best.largest_unit));
    if (cx_global_ordinal() == 0)
        fprintf(stderr, "largest under %.0f MB per rank: width %d x %d layers, %.1fM parameters\n", limit_mb, w,
                LIMIT_DEPTH, (double)best.nparams / 1e6);
    emit0("zero3_largest_model_vs_limit", "bytes", BENCH_HIGHER, &fit);
    emit0("zero3_deferred_construction_peak_bytes", "bytes", BENCH_LOWER, &cons);
    return true;
}

/* ---- FSDPv2 against DDP on a GPT ------------------------------------------------------ */

/* Parameters and AdamW state dominate the memory: a short context and a
 * small batch (global 8 rows of 32 tokens) on 3.2M parameters. */
static cx_gpt_config fsdpv2_gpt(void)
{
    cx_gpt_config c = cx_gpt_default_config();
    c.block_size = 32;
    return c;
}
#define FSDPV2_BATCH 8

/* The worst rank's peak device bytes while one side is built, warmed up
 * (the first steps compile and make the optimizer state) and stepped
 * twice, from an empty cache and arena, the model freed afterwards. */
static bool fsdpv2_peak(bool v2, const cx_mesh *mesh, double *peak)
{
    int n = cx_world_size();
    cx_cache_clear();
    cx_memory_reset_peak();
    bench_gpt_trainer *t = v2 ? bench_gpt_trainer_new(fsdpv2_gpt(), FSDPV2_BATCH, BENCH_GPT_FSDPV2, mesh)
                              : bench_gpt_trainer_new(fsdpv2_gpt(), FSDPV2_BATCH / n, BENCH_GPT_DDP, NULL);
    bool ok = t && bench_gpt_trainer_step(t) >= 0 && bench_gpt_trainer_step(t) >= 0;
    double mine = (double)cx_memory_peak();
    bench_gpt_trainer_free(t);
    cx_cache_clear();
    /* every rank reduces, also after a failure, so none waits alone */
    if (cx_mesh_reduce("cxla-bench-fsdpv2-peak", &mine, 1, max_reduce, peak) != CX_OK) {
        fprintf(stderr, "cxla-bench fsdp: %s\n", cx_last_error());
        return false;
    }
    return ok;
}

/* fsdpv2_peak_bytes_per_rank and fsdpv2_step_s: FSDPv2 wrapped per block
 * on the (fsdp = every rank, model = 1) mesh against DDP, the same GPT and
 * global batch, sides alternated in every round. */
static bool fsdpv2_figures(const bench_cfg *cfg)
{
    int n = cx_world_size(), shape[2] = { n, 1 };
    const char *axes[2] = { "fsdp", "model" };
    cx_use_spmd();
    cx_mesh *mesh = cx_mesh_new(NULL, 2, shape, axes);
    if (!mesh) { fprintf(stderr, "cxla-bench fsdp: fsdpv2 mesh: %s\n", cx_last_error()); return false; }
    bench_series pk = { 0 }, st = { 0 };
    for (int r = 0; r < cfg->rounds; r++) {
        double p[2];
        bool first = r % 2 == 0;   /* which side goes first alternates */
        if (!fsdpv2_peak(first, mesh, &p[first ? 0 : 1]) || !fsdpv2_peak(!first, mesh, &p[first ? 1 : 0])) return false;
        bench_add(&pk, p[0], p[1]);
        if (cx_global_ordinal() == 0)
            fprintf(stderr, "fsdpv2 round %d: peak %.1f MB, ddp %.1f MB on the worst rank\n", r, p[0] / 1e6, p[1] / 1e6);
    }
    bench_gpt_trainer *v2 = bench_gpt_trainer_new(fsdpv2_gpt(), FSDPV2_BATCH, BENCH_GPT_FSDPV2, mesh);
    bench_gpt_trainer *dp = v2 ? bench_gpt_trainer_new(fsdpv2_gpt(), FSDPV2_BATCH / n, BENCH_GPT_DDP, NULL) : NULL;
    bool ok = dp != NULL;
    bench_side sides[2] = { { .unit = bench_gpt_trainer_step, .ctx = v2 }, { .unit = bench_gpt_trainer_step, .ctx = dp } };
    for (int r = 0; ok && r < cfg->rounds; r++) {
        double sec[2];
        ok = bench_round(cfg, r, sides, 2, sec);
        if (ok) bench_add(&st, sec[0], sec[1]);
    }
    bench_gpt_trainer_free(v2);
    bench_gpt_trainer_free(dp);
    if (!ok) return false;
    emit0("fsdpv2_peak_bytes_per_rank", "bytes", BENCH_LOWER, &pk);
    emit0("fsdpv2_step_s", "s", BENCH_LOWER, &st);
    return true;
}

int bench_fsdp(int argc, char **argv, bench_cfg cfg)
{
    int width = 4096;
    double limit_mb = 128;
    const cli_flag extra[] = {
        { .name = "width", .kind = CLI_INT, .dest = &width, .help = "hidden width of the 8-layer mlp (4096: 120M parameters)",
          .min = 16, .max = 1 << 16 },
        { .name = "limit-mb", .kind = CLI_DOUBLE, .dest = &limit_mb, .min = 1, .max = 1e9,
          .help = "per-rank memory limit of zero3_largest_model_vs_limit" },
    };
    int rc = bench_parse("fsdp", argc, argv, extra, 2, &cfg);
    if (rc >= 0) return rc;
    if ((rc = dist_start("fsdp", &argc, &argv, &cfg)) >= 0) return rc;

    /* Peaks: ZeRO-3, ZeRO-2, then DDP, once. The intermediate arena only
     * grows, so a run after a larger one would count that one's arena: the
     * order is fixed and the figure has one round. */
    double pk[4] = { 0 };
    const int order[3] = { 3, 2, 0 };
    for (int i = 0; i < 3; i++)
        if (!fsdp_peak(order[i], width, &pk[order[i]])) return 1;
    bench_series z3 = { 0 }, z2 = { 0 };
    bench_add(&z3, pk[3], pk[0]);
    bench_add(&z2, pk[2], pk[0]);
    emit0("zero3_peak_bytes_per_rank", "bytes", BENCH_LOWER, &z3);
    emit0("zero2_peak_bytes_per_rank", "bytes", BENCH_LOWER, &z2);
    if (!bench_limit(limit_mb)) return 1;

    /* Step time: ZeRO-3 and DDP side by side in rounds; both stay built so
     * that no round pays a model's set-up or compile. */
    fsdp_runner *z = fsdp_new(3, width, FSDP_DEPTH, false), *d = z ? fsdp_new(0, width, FSDP_DEPTH, false) : NULL;
    rc = 1;
    /* warm-up: the first steps compile */
    if (!d || fsdp_step(z) < 0 || fsdp_step(z) < 0 || fsdp_step(d) < 0 || fsdp_step(d) < 0) goto out;
    bench_side sides[2] = { { .unit = fsdp_step, .ctx = z }, { .unit = fsdp_step, .ctx = d } };
    bench_series st = { 0 };
    for (int r = 0; r < cfg.rounds; r++) {
        double sec[2];
        if (!bench_round(&cfg, r, sides, 2, sec)) goto out;
        bench_add(&st, sec[0], sec[1]);
    }
    emit0("zero3_step_s", "s", BENCH_LOWER, &st);
    rc = 0;
out:
    fsdp_free(z);
    fsdp_free(d);
    /* after the mlps are freed: their bytes would count in its peaks */
    if (rc == 0) rc = fsdpv2_figures(&cfg) ? 0 : 1;
    cx_dist_finalize();
    return rc;
}

/* ---- spmd ------------------------------------------------------------------------ */

/* The mlp the FSDPv2 figure trains: 784-2048-2048-10 on MNIST-shaped input. */
static cx_module *spmd_bench_mlp(void)
{
    cx_module *l[7] = { cx_nn_flatten(1, -1), cx_nn_linear(784, 2048, true), cx_nn_relu(),
                        cx_nn_linear(2048, 2048, true), cx_nn_relu(), cx_nn_linear(2048, 10, true),
                        cx_nn_log_softmax(1) };
    return cx_nn_sequential(l, 7);
}

/* The seed's mnist_xla.py shardings on the cnn (train --parallel spmd).
 * @return the input's mesh, NULL after printing why. */
static cx_mesh *seed_shardings(cx_module *m)
{
    int n = cx_world_size(), conv_shape[4] = { n / 2, 2, 1, 1 }, linear_shape[2] = { n / 2, 2 };
    const char *conv_axes[4] = { "data", "dim1", "dim2", "dim3" }, *linear_axes[2] = { "data", "model" };
    cx_mesh *conv = cx_mesh_new(NULL, 4, conv_shape, conv_axes);
    cx_mesh *linear = conv ? cx_mesh_new(NULL, 2, linear_shape, linear_axes) : NULL;
    cx_spec_entry none = CX_SPEC_NONE, data = CX_SPEC_NAME("data"), model = CX_SPEC_NAME("model");
    const cx_spec_entry conv_w[4] = { data, none, none, none }, fc1[2] = { data, none }, fc2[2] = { data, model };
    int np = 0;
    cx_named_tensor *ps = linear ? cx_module_parameters(m, &np) : NULL;
    bool ok = ps != NULL;
    for (int i = 0; ok && i < np; i++) {
        const char *nm = ps[i].name;
        if (!strcmp(nm, "conv1.weight") || !strcmp(nm, "conv2.weight")) ok = cx_mark_sharding(ps[i].tensor, conv, conv_w, 4) == CX_OK;
        else if (!strcmp(nm, "fc1.weight")) ok = cx_mark_sharding(ps[i].tensor, linear, fc1, 2) == CX_OK;
        else if (!strcmp(nm, "fc2.weight")) ok = cx_mark_sharding(ps[i].tensor, linear, fc2, 2) == CX_OK;
    }
    free(ps);
    if (!ok) fprintf(stderr, "cxla-bench spmd: %s\n", cx_last_error());
    return ok ? conv : NULL;
}

/* Megatron-style tensor parallelism of the gpt program's model over 2 ranks
 * (mesh (n/2, 2): the batch over data, the blocks over model) against DDP
 * on the same ranks and global batch: the parameters' and AdamW state's
 * bytes per rank against one process's, and the step time.
 * @return false after printing why. */
static bool spmd_tp_figures(const bench_cfg *cfg, int64_t gpt_batch)
{
    int n = cx_world_size(), shape[2] = { n / 2, 2 };
    const char *axes[2] = { "data", "model" };
    cx_gpt_config c = cx_gpt_default_config();
    cx_mesh *mesh = cx_mesh_new(NULL, 2, shape, axes);
    bench_gpt_trainer *tp = mesh ? bench_gpt_trainer_new(c, gpt_batch, BENCH_GPT_SPMD, mesh) : NULL;
    bench_gpt_trainer *dp = tp ? bench_gpt_trainer_new(c, gpt_batch / n, BENCH_GPT_DDP, NULL) : NULL;
    bool ok = dp != NULL;
    if (!mesh) fprintf(stderr, "cxla-bench spmd: %s\n", cx_last_error());
    bench_series state = { 0 }, step = { 0 };
    bench_add(&state, ok ? (double)bench_gpt_trainer_state_bytes(tp, true) : 0, ok ? (double)bench_gpt_trainer_state_bytes(tp, false) : 0);
    bench_side sides[2] = { { .unit = bench_gpt_trainer_step, .ctx = tp }, { .unit = bench_gpt_trainer_step, .ctx = dp } };
    for (int r = 0; ok && r < cfg->rounds; r++) {
        double sec[2];
        ok = bench_round(cfg, r, sides, 2, sec);
        if (ok) bench_add(&step, sec[0], sec[1]);
    }
    if (ok) {
        emit0("tp_state_bytes_per_rank", "bytes (ref: one process's)", BENCH_LOWER, &state);
        emit0("spmd_tp_step_s", "s", BENCH_LOWER, &step);
    }
    bench_gpt_trainer_free(tp);
    bench_gpt_trainer_free(dp);
    return ok;
}

int bench_spmd(int argc, char **argv, bench_cfg cfg)
{
    int64_t batch = 256, gpt_batch = 16;
    const cli_flag extra[] = {
        { .name = "batch-size", .kind = CLI_I64, .dest = &batch, .min = 2, .max = 1 << 16, .help = "global batch (the seed's: 256)" },
        { .name = "gpt-batch-size", .kind = CLI_I64, .dest = &gpt_batch, .min = 2, .max = 1 << 16,
          .help = "global batch of the tensor-parallel gpt (16)" },
    };
    int rc = bench_parse("spmd", argc, argv, extra, 2, &cfg);
    if (rc >= 0) return rc;
    if ((rc = dist_start("spmd", &argc, &argv, &cfg)) >= 0) return rc;
    int n = cx_world_size();
    if (n % 2 || batch % n || gpt_batch % n) {
        fprintf(stderr, "cxla-bench spmd: needs an even number of ranks dividing the batches (%d ranks, batch %lld, "
                "gpt batch %lld)\n", n, (long long)batch, (long long)gpt_batch);
        cx_dist_finalize();
        return 2;
    }
    cx_use_spmd();
    /* both stay built, so no round pays a set-up or compile; DDP's graphs
     * carry no sharding and are not partitioned */
    cx_module *sm = bench_cnn();
    cx_mesh *mesh = sm ? seed_shardings(sm) : NULL;
    const cx_spec_entry seed_input[4] = { CX_SPEC_NAME("data"), CX_SPEC_NAME("dim1"), CX_SPEC_NONE, CX_SPEC_NONE };
    bench_trainer *s = mesh ? bench_trainer_new_spmd(sm, batch, mesh, seed_input) : NULL;
    bench_trainer *d = s ? bench_trainer_new(bench_cnn(), batch / n, true) : NULL;
    /* FSDPv2 on an mlp against DDP on the same mlp: ZeRO-3 through SPMD */
    int fshape[2] = { n, 1 };
    const char *faxes[2] = { "fsdp", "model" };
    cx_mesh *fm = d ? cx_mesh_new(NULL, 2, fshape, faxes) : NULL;
    cx_module *fmod = fm ? spmd_bench_mlp() : NULL;
    cx_spmd_fsdp *fw = fmod ? cx_spmd_fsdp_wrap(fmod, fm, NULL, NULL) : NULL;
    const cx_spec_entry fsdp_input[4] = { CX_SPEC_NAME("fsdp"), CX_SPEC_NONE, CX_SPEC_NONE, CX_SPEC_NONE };
    bench_trainer *f = fw ? bench_trainer_new_spmd(fmod, batch, fm, fsdp_input) : NULL;
    bench_trainer *fd = f ? bench_trainer_new(spmd_bench_mlp(), batch / n, true) : NULL;
    rc = 1;
    if (!fd) {
        if (fmod && !fw) fprintf(stderr, "cxla-bench spmd: FSDPv2: %s\n", cx_last_error());
        goto out;
    }
    bench_side sides[2] = { { .unit = bench_trainer_step, .ctx = s }, { .unit = bench_trainer_step, .ctx = d } };
    bench_side fsides[2] = { { .unit = bench_trainer_step, .ctx = f }, { .unit = bench_trainer_step, .ctx = fd } };
    bench_series ips = { 0 }, fst = { 0 };
    for (int r = 0; r < cfg.rounds; r++) {
        double sec[2], fsec[2];
        if (!bench_round(&cfg, r, sides, 2, sec) || !bench_round(&cfg, r, fsides, 2, fsec)) goto out;
        bench_add(&ips, (double)batch / sec[0], (double)batch / sec[1]);
        bench_add(&fst, fsec[0], fsec[1]);
    }
    emit0("spmd_seed_images_per_s", "images/s", BENCH_HIGHER, &ips);
    emit0("spmd_fsdpv2_step_s", "s", BENCH_LOWER, &fst);
    rc = spmd_tp_figures(&cfg, gpt_batch) ? 0 : 1;
out:
    cx_spmd_fsdp_free(fw);   /* first: it unhooks the model the trainer frees */
    bench_trainer_free(s);
    bench_trainer_free(d);
    bench_trainer_free(f);   /* a trainer takes its model, even when it fails */
    bench_trainer_free(fd);
    if (fmod && !fw) cx_module_free(fmod);
    if (sm && !mesh) cx_module_free(sm);
    cx_dist_finalize();
    return rc;
}
