/* cxla-bench cache: what the persistent compile cache saves at start-up.
 *
 * Each sample is a fresh process (this binary, re-executed as
 * `cxla-bench cache --child DIR`) that builds a deep MLP with Adam and runs
 * one training step; the figure is the wall time from spawning it to its
 * first step being done. Cold: an empty cache directory (every graph is
 * compiled and stored). Warm: the directory a cold run filled (every graph
 * is loaded). Reported: warm_start_s with the cold start as ref (target
 * ratio <= 0.5 for a step graph whose compile takes >= 100 ms), and the
 * total load time with the total compile time as ref.
 *
 *   cxla-bench cache [--depth N] [--width N] [--reps N] */
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
        fprintf(stderr, "cache bench: %s\n", cx_last_error());
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
    if (!opt) { fprintf(stderr, "cache bench: %s\n", cx_last_error()); return 1; }
    float x[16 * 32];
    int64_t t[16];
    for (int i = 0; i < 16 * 32; i++) x[i] = (float)((i * 13) % 17) / 17.0f;
    for (int i = 0; i < 16; i++) t[i] = i % 10;
    cx_step_begin();
    cx_tensor *xs = cx_from_host(x, (int64_t[]){ 16, 32 }, 2, CX_F32);
    cx_tensor *ts = cx_from_host(t, (int64_t[]){ 16 }, 1, CX_I64);
    cx_tensor *loss = cx_cross_entropy(cx_module_forward(m, xs), ts, CX_REDUCE_MEAN, -100, 0.0);
    if (cx_backward(loss) != CX_OK || cx_optim_step(opt) != CX_OK || cx_step_end() != CX_OK) {
        fprintf(stderr, "cache bench: %s\n", cx_last_error());
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
    if (system(cmd) != 0) fprintf(stderr, "cache bench: cannot remove %s\n", dir);
}

int bench_cache(int argc, char **argv)
{
    if (argc >= 5 && !strcmp(argv[1], "--child")) return child_main(argv[2], atoi(argv[3]), atoi(argv[4]));
    int depth = 160, width = 64, reps = 3;   /* depth 160: the step graph compiles in ~0.2 s */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--depth")) depth = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--width")) width = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else { fprintf(stderr, "usage: cxla-bench cache [--depth N] [--width N] [--reps N]\n"); return 2; }
    }
    if (depth < 1 || width < 1 || reps < 1 || reps > 50) { fprintf(stderr, "cache bench: bad arguments\n"); return 2; }
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) { fprintf(stderr, "cache bench: cannot find this binary\n"); return 1; }
    self[k] = '\0';
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/cxla_bench_cache_%d", (int)getpid());
    double cold[50], warm[50], comp[50], load[50], step_comp = 0;
    for (int r = 0; r < reps; r++) {
        sample c, w;
        rm_rf(dir);
        if (!spawn(self, dir, depth, width, &c) || !spawn(self, dir, depth, width, &w)) {
            fprintf(stderr, "cache bench: a child run failed\n");
            rm_rf(dir);
            return 1;
        }
        if (w.uncached != 0 || w.hits != c.uncached)
            fprintf(stderr, "cache bench: warm run compiled %lld graphs (%lld hits of %lld)\n", w.uncached, w.hits, c.uncached);
        cold[r] = c.start_s;
        warm[r] = w.start_s;
        comp[r] = c.compile_s;
        load[r] = w.load_s;
        step_comp = c.step_compile_s;
    }
    rm_rf(dir);
    fprintf(stderr, "cache bench: depth %d width %d; step graph compile %.3f s\n", depth, width, step_comp);
    bench_emit("cache_warm_start_s", bench_median(warm, reps), "s", bench_median(cold, reps));
    bench_emit("cache_load_vs_compile_s", bench_median(load, reps), "s", bench_median(comp, reps));
    return 0;
}
