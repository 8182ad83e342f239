/* cxla-bench cache: what the persistent compile cache saves at start-up.
 *
 * Each unit is a fresh process (this binary, re-executed as
 * `cxla-bench cache --child DIR DEPTH WIDTH`) that builds a deep MLP with
 * Adam and runs one training step; it counts the wall time from spawning it
 * to its first step being done. Cold: an empty cache directory (every graph
 * is compiled and stored). Warm: a directory a cold run filled before the
 * rounds (every graph is loaded). Reported: warm_start_s with the cold start
 * as ref (target ratio <= 0.5 for a step graph whose compile takes >= 100
 * ms), and the warm runs' load time with the cold runs' compile time as ref
 * (means over each round's units). */
#include "bench.h"

#include <cxla/cxla.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    double start_s;          /* spawn to first step done */
    double compile_s;        /* CompileTime accumulator */
    double load_s;           /* PersistentCacheLoadTime accumulator */
    double step_compile_s;   /* the largest single compile (the step graph) */
    long long uncached, hits;
} sample;

static int child_main(const char *dir, int depth, int width)
{
    if (cx_cache_init(dir, false) != CX_OK) {
        fprintf(stderr, "cxla-bench cache: %s\n", cx_last_error());
        return 1;
    }
    cx_manual_seed(1);
    cx_module **mods = calloc((size_t)(2 * depth + 2), sizeof *mods);
    if (!mods) return 1;
    int n = 0;
    mods[n++] = cx_nn_linear(32, width, true);
    for (int i = 0; i < depth; i++) {
        mods[n++] = cx_nn_gelu(true);
        mods[n++] = cx_nn_linear(width, width, true);
    }
    mods[n++] = cx_nn_linear(width, 10, true);
    cx_module *m = cx_nn_sequential(mods, n);
    free(mods);
    int np;
    cx_named_tensor *ps = m ? cx_module_parameters(m, &np) : NULL;
    cx_optimizer *opt = ps ? cx_optim_adam(ps, np, cx_adam_default_opts()) : NULL;
    free(ps);
    if (!opt) { fprintf(stderr, "cxla-bench cache: %s\n", cx_last_error()); return 1; }
    float x[16 * 32];
    int64_t t[16];
    for (int i = 0; i < 16 * 32; i++) x[i] = (float)((i * 13) % 17) / 17.0f;
    for (int i = 0; i < 16; i++) t[i] = i % 10;
    cx_step_begin();
    cx_tensor *xs = cx_from_host(x, (int64_t[]){ 16, 32 }, 2, CX_F32);
    cx_tensor *ts = cx_from_host(t, (int64_t[]){ 16 }, 1, CX_I64);
    cx_tensor *loss = cx_cross_entropy(cx_module_forward(m, xs), ts, CX_REDUCE_MEAN, -100, 0.0);
    if (cx_backward(loss) != CX_OK || cx_optim_step(opt) != CX_OK || cx_step_end() != CX_OK) {
        fprintf(stderr, "cxla-bench cache: %s\n", cx_last_error());
        return 1;
    }
    cx_metric_stats cs = { 0 }, ls = { 0 };
    cx_metric_data("CompileTime", &cs);
    cx_metric_data("PersistentCacheLoadTime", &ls);
    printf("%.9f %.9f %.9f %lld %lld\n", cs.accumulator, ls.accumulator, cs.total_samples ? cs.max : 0.0,
           (long long)cx_counter_value("UncachedCompile"), (long long)cx_counter_value("PersistentCacheHit"));
    fflush(stdout);
    /* the parent has its figure; skip the teardown */
    _exit(0);
}

static bool spawn(const char *self, const char *dir, int depth, int width, sample *s)
{
    int fd[2];
    if (pipe(fd) != 0) return false;
    char dep[32], wid[32];
    snprintf(dep, sizeof dep, "%d", depth);
    snprintf(wid, sizeof wid, "%d", width);
    double t0 = bench_now();
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execl(self, self, "cache", "--child", dir, dep, wid, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[256];
    size_t got = 0;
    while (got + 1 < sizeof buf) {
        ssize_t k = read(fd[0], buf + got, sizeof buf - 1 - got);
        if (k <= 0) break;
        got += (size_t)k;
        if (memchr(buf, '\n', got)) break;
    }
    s->start_s = bench_now() - t0;
    buf[got] = '\0';
    close(fd[0]);
    int ws;
    waitpid(pid, &ws, 0);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) return false;
    return sscanf(buf, "%lf %lf %lf %lld %lld", &s->compile_s, &s->load_s, &s->step_compile_s, &s->uncached, &s->hits) == 5;
}

static void rm_rf(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cxla-bench cache: cannot remove %s\n", dir);
}

typedef struct {
    const char *self, *dir;
    int depth, width;
    bool cold;                  /* empty the directory before each unit */
    long long expect_hits;      /* warm: graphs the filling run compiled */
    double compile_s, load_s;   /* sums over this round's units */
    long n;
} cache_side;

static double cache_unit(void *p)
{
    cache_side *s = p;
    if (s->cold) rm_rf(s->dir);
    sample x;
    if (!spawn(s->self, s->dir, s->depth, s->width, &x)) {
        fprintf(stderr, "cxla-bench cache: a %s child run failed\n", s->cold ? "cold" : "warm");
        return -1;
    }
    if (!s->cold && (x.uncached != 0 || x.hits != s->expect_hits))
        fprintf(stderr, "cxla-bench cache: warm run compiled %lld graphs (%lld hits of %lld)\n", x.uncached, x.hits,
                s->expect_hits);
    s->compile_s += x.compile_s;
    s->load_s += x.load_s;
    s->n++;
    return x.start_s;
}

int bench_cache(int argc, char **argv, bench_cfg cfg)
{
    /* internal: the child of a unit */
    if (argc == 5 && !strcmp(argv[1], "--child")) return child_main(argv[2], atoi(argv[3]), atoi(argv[4]));
    int depth = 160, width = 64;   /* depth 160: the step graph compiles in ~0.2 s */
    const cli_flag extra[] = {
        { .name = "depth", .kind = CLI_INT, .dest = &depth, .help = "hidden layers of the mlp", .min = 1, .max = 100000 },
        { .name = "width", .kind = CLI_INT, .dest = &width, .help = "their width", .min = 1, .max = 1 << 20 },
    };
    int rc = bench_parse("cache", argc, argv, extra, 2, &cfg);
    if (rc >= 0) return rc;
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) { fprintf(stderr, "cxla-bench cache: cannot find this binary (/proc/self/exe)\n"); return 1; }
    self[k] = '\0';
    char cold_dir[256], warm_dir[256];
    snprintf(cold_dir, sizeof cold_dir, "/tmp/cxla_bench_cache_%d_cold", (int)getpid());
    snprintf(warm_dir, sizeof warm_dir, "/tmp/cxla_bench_cache_%d_warm", (int)getpid());
    cache_side warm = { self, warm_dir, depth, width, false, 0, 0, 0, 0 };
    cache_side cold = { self, cold_dir, depth, width, true, 0, 0, 0, 0 };
    rm_rf(warm_dir);
    sample fill;
    rc = 1;
    if (!spawn(self, warm_dir, depth, width, &fill)) {
        fprintf(stderr, "cxla-bench cache: the run filling %s failed\n", warm_dir);
        goto out;
    }
    warm.expect_hits = fill.uncached;
    fprintf(stderr, "cxla-bench cache: depth %d width %d; step graph compile %.3f s\n", depth, width, fill.step_compile_s);
    bench_side sides[2] = { { .unit = cache_unit, .ctx = &warm }, { .unit = cache_unit, .ctx = &cold } };
    bench_series start = { 0 }, load = { 0 };
    for (int r = 0; r < cfg.rounds; r++) {
        warm.compile_s = warm.load_s = cold.compile_s = cold.load_s = 0;
        warm.n = cold.n = 0;
        double sec[2];
        if (!bench_round(&cfg, r, sides, 2, sec)) goto out;
        bench_add(&start, sec[0], sec[1]);
        bench_add(&load, warm.load_s / (double)warm.n, cold.compile_s / (double)cold.n);
    }
    bench_emit("cache_warm_start_s", "s", BENCH_LOWER, &start);
    bench_emit("cache_load_vs_compile_s", "s", BENCH_LOWER, &load);
    rc = 0;
out:
    rm_rf(warm_dir);
    rm_rf(cold_dir);
    return rc;
}
