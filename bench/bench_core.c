/* cxla-bench core: the lazy core against the machine's own limits. */
#include "bench.h"

#include <cxla/cxla.h>
#include <cblas.h>

/* the reference is OpenBLAS with all the threads cxla uses */
extern void openblas_set_num_threads(int);
/* OpenBLAS's threaded builds export it (not in their headers; a serial
 * build has no threads to stop): its threads start again at the next
 * threaded call */
extern int blas_thread_shutdown_(void) __attribute__((weak));
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- cblas_sgemm, also the train bench's rate ------------------------------------ */

struct bench_sgemm {
    int n;
    float *a, *b, *c;
};

bench_sgemm *bench_sgemm_new(int n)
{
    bench_sgemm *g = calloc(1, sizeof *g);
    size_t nn = (size_t)n * (size_t)n;
    if (g) {
        g->n = n;
        g->a = malloc(sizeof(float) * nn);
        g->b = malloc(sizeof(float) * nn);
        g->c = malloc(sizeof(float) * nn);
    }
    if (!g || !g->a || !g->b || !g->c) {
        fprintf(stderr, "cxla-bench: out of memory for a %d^2 sgemm\n", n);
        bench_sgemm_free(g);
        return NULL;
    }
    for (size_t i = 0; i < nn; i++) { g->a[i] = (float)(i % 13) * 0.1f; g->b[i] = (float)(i % 7) * 0.1f; g->c[i] = 0; }
    return g;
}

double bench_sgemm_run(void *p)
{
    bench_sgemm *g = p;
    int n = g->n;
    bench_openblas_begin();
    double t0 = bench_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, g->a, n, g->b, n, 0.0f, g->c, n);
    double dt = bench_now() - t0;
    bench_openblas_end();
    return dt;
}

void bench_openblas_begin(void) { openblas_set_num_threads(cx_get_num_threads()); }

void bench_openblas_end(void)
{
    /* cxla's workers each call OpenBLAS single-threaded. OpenBLAS's own
     * workers spin for up to 2^28 cycles after a call before they sleep:
     * left running, one took a CPU from the side timed next (a gpt step
     * after the sgemm took 250-320 ms, after any other side 245-265). */
    openblas_set_num_threads(1);
    if (blas_thread_shutdown_) blas_thread_shutdown_();
}

double bench_sgemm_flop(const bench_sgemm *g) { return 2.0 * g->n * (double)g->n * g->n; }

void bench_sgemm_free(bench_sgemm *g)
{
    if (!g) return;
    free(g->a); free(g->b); free(g->c);
    free(g);
}

/* ---- sides ----------------------------------------------------------------------- */

static cx_tensor *filled(int64_t n, float v0)
{
    float *h = malloc(sizeof(float) * (size_t)n);
    if (!h) return NULL;
    for (int64_t i = 0; i < n; i++) h[i] = v0 + (float)(i % 97) * 0.01f - 0.5f;
    cx_tensor *t = cx_from_host(h, &n, 1, CX_F32);
    free(h);
    return t;
}

static double fail(const char *what)
{
    fprintf(stderr, "cxla-bench core: %s: %s\n", what, cx_last_error());
    return -1;
}

typedef struct { cx_tensor *a, *b, *c; } fused_ctx;

static double fused_unit(void *p)
{
    fused_ctx *f = p;
    double t0 = bench_now();
    cx_tensor *y = cx_relu(cx_add(cx_mul(f->a, f->b), f->c));
    cx_status st = cx_sync_tensors(&y, 1);
    double dt = bench_now() - t0;
    cx_free(y);
    return st == CX_OK ? dt : fail("relu(a*b+c)");
}

/* The same relu(a*b+c) as a plain C loop the compiler vectorizes, split
 * over as many threads as cxla's pool has: what hand-written code gets
 * from this memory system with the same access pattern. */
typedef struct {
    const float *a, *b, *c;
    float *out;
    int64_t n;
    int threads;
} hand_ctx;

typedef struct { const hand_ctx *h; int64_t lo, hi; } hand_part;

static void *hand_part_run(void *p)
{
    const hand_part *q = p;
    const float *restrict a = q->h->a, *restrict b = q->h->b, *restrict c = q->h->c;
    float *restrict out = q->h->out;
    for (int64_t i = q->lo; i < q->hi; i++) {
        float v = a[i] * b[i] + c[i];
        out[i] = v > 0.0f ? v : 0.0f;
    }
    return NULL;
}

static double hand_unit(void *p)
{
    const hand_ctx *h = p;
    pthread_t tid[64];
    hand_part part[64];
    int t = h->threads < 64 ? h->threads : 64;
    double t0 = bench_now();
    for (int i = 0; i < t; i++) {
        part[i] = (hand_part){ h, h->n * i / t, h->n * (i + 1) / t };
        if (i > 0 && pthread_create(&tid[i], NULL, hand_part_run, &part[i]) != 0) return fail("pthread_create");
    }
    hand_part_run(&part[0]);
    for (int i = 1; i < t; i++) pthread_join(tid[i], NULL);
    return bench_now() - t0;
}

typedef struct { cx_tensor *a, *b; } matmul_ctx;

static double matmul_unit(void *p)
{
    matmul_ctx *m = p;
    double t0 = bench_now();
    cx_tensor *c = cx_matmul(m->a, m->b);
    cx_status st = cx_sync_tensors(&c, 1);
    double dt = bench_now() - t0;
    cx_free(c);
    return st == CX_OK ? dt : fail("matmul");
}

/* a 100-node step on a 4-element tensor: trace, key, lookup, and a tiny run */
static double cache_hit_unit(void *p)
{
    cx_tensor *x = p;
    double t0 = bench_now();
    cx_step_begin();
    cx_tensor *v = x;
    for (int i = 0; i < 50; i++) v = cx_add(cx_mul_scalar(v, 1.0001), x);
    cx_tensor *s = cx_keep(cx_sum(v, NULL, 0, false));
    cx_status st = cx_step_end();
    double dt = bench_now() - t0;
    cx_free(s);
    return st == CX_OK ? dt : fail("cache-hit step");
}

/* ---- figures --------------------------------------------------------------------- */

/* relu(a*b+c) over 64 MiB per operand (3 reads + 1 write) through the core
 * against the same loop written by hand on as many threads. (Against
 * memcpy, as it once was, the figure moved 0.65-1.22 between runs: glibc's
 * single-threaded copy switches to non-temporal stores by cache size, and
 * its rate was bimodal on these VMs while the kernel's was not.) */
static float *host_filled(int64_t n, float v0)
{
    float *h = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; h && i < n; i++) h[i] = v0 + (float)(i % 97) * 0.01f - 0.5f;
    return h;
}

static int fused_elementwise(const bench_cfg *cfg)
{
    const int64_t n = (64ll << 20) / 4;
    const double bytes = (double)n * 4;
    fused_ctx f = { filled(n, 1), filled(n, 2), filled(n, -1) };
    hand_ctx h = { host_filled(n, 1), host_filled(n, 2), host_filled(n, -1), malloc((size_t)bytes), n,
                   cx_get_num_threads() };
    int rc = 1;
    if (!f.a || !f.b || !f.c || !h.a || !h.b || !h.c || !h.out) {
        fprintf(stderr, "cxla-bench core: out of memory for the 64 MiB operands\n");
        goto out;
    }
    /* the output written before the rounds, so that no run pays the first
     * touch of its pages; the first fused run compiles */
    memset(h.out, 0, (size_t)bytes);
    if (hand_unit(&h) < 0 || fused_unit(&f) < 0) goto out;
    cx_exec_info info = cx_last_exec_info();
    fprintf(stderr, "fused_elementwise: %d kernel(s), %d thread(s)\n", info.num_kernels, h.threads);
    bench_side sides[2] = { { .unit = fused_unit, .ctx = &f }, { .unit = hand_unit, .ctx = &h } };
    bench_series fig = { 0 };
    for (int r = 0; r < cfg->rounds; r++) {
        double sec[2];
        if (!bench_round(cfg, r, sides, 2, sec)) goto out;
        bench_add(&fig, 4 * bytes / sec[0] / 1e9, 4 * bytes / sec[1] / 1e9);
    }
    bench_emit("fused_elementwise_gbps", "GB/s", BENCH_HIGHER, &fig);
    rc = 0;
out:
    free((void *)h.a); free((void *)h.b); free((void *)h.c); free(h.out);
    cx_free(f.a); cx_free(f.b); cx_free(f.c);
    return rc;
}

static int matmul(const bench_cfg *cfg)
{
    const int n = 2048;
    bench_sgemm *g = bench_sgemm_new(n);
    if (!g) return 1;
    int64_t s[2] = { n, n };
    matmul_ctx m = { cx_from_host(g->a, s, 2, CX_F32), cx_from_host(g->b, s, 2, CX_F32) };
    int rc = 1;
    if (!m.a || !m.b) { fail("2048^2 operands"); goto out; }
    /* the first matmul compiles; the first sgemm sizes OpenBLAS' buffers */
    if (matmul_unit(&m) < 0) goto out;
    bench_sgemm_run(g);
    bench_side sides[2] = { { .unit = matmul_unit, .ctx = &m }, { .unit = bench_sgemm_run, .ctx = g } };
    bench_series fig = { 0 };
    double flop = bench_sgemm_flop(g);
    for (int r = 0; r < cfg->rounds; r++) {
        double sec[2];
        if (!bench_round(cfg, r, sides, 2, sec)) goto out;
        bench_add(&fig, flop / sec[0] / 1e9, flop / sec[1] / 1e9);
    }
    bench_emit("matmul_gflops", "GFLOP/s", BENCH_HIGHER, &fig);
    rc = 0;
out:
    cx_free(m.a); cx_free(m.b);
    bench_sgemm_free(g);
    return rc;
}

/* Against a fixed 50 us target: one side, timed in rounds all the same. */
static int cache_hit(const bench_cfg *cfg)
{
    int64_t four = 4;
    float h[4] = { 0.5f, 0.25f, 0.125f, 1.0f };
    cx_tensor *x = cx_from_host(h, &four, 1, CX_F32);
    int rc = 1;
    if (!x || cache_hit_unit(x) < 0) goto out;   /* the first step compiles */
    cx_exec_info info = cx_last_exec_info();
    fprintf(stderr, "cache_hit: %d IR nodes per step\n", info.num_nodes);
    bench_side side = { .unit = cache_hit_unit, .ctx = x };
    bench_series fig = { 0 };
    for (int r = 0; r < cfg->rounds; r++) {
        double sec;
        if (!bench_round(cfg, r, &side, 1, &sec)) goto out;
        bench_add(&fig, sec * 1e6, 50);
    }
    bench_emit("cache_hit_overhead_us", "us", BENCH_LOWER, &fig);
    rc = 0;
out:
    cx_free(x);
    return rc;
}

/* The same step with XLA_IR_DEBUG on, switched before each timed unit
 * (outside the time): every new node records its call site (a backtrace;
 * resolving it waits for a dump). Off, a node pays one flag test. */
typedef struct { cx_tensor *x; bool on; } ir_debug_ctx;

static double ir_debug_unit(void *p)
{
    ir_debug_ctx *c = p;
    static int was = -1;
    if (was != (int)c->on) {
        setenv("XLA_IR_DEBUG", c->on ? "1" : "0", 1);
        cx_debug_reload_env();
        was = c->on;
    }
    return cache_hit_unit(c->x);
}

static int ir_debug(const bench_cfg *cfg)
{
    int64_t four = 4;
    float h[4] = { 0.5f, 0.25f, 0.125f, 1.0f };
    ir_debug_ctx on = { cx_from_host(h, &four, 1, CX_F32), true }, off = { on.x, false };
    char *saved = getenv("XLA_IR_DEBUG") ? strdup(getenv("XLA_IR_DEBUG")) : NULL;
    int rc = 1;
    if (!on.x || ir_debug_unit(&on) < 0 || ir_debug_unit(&off) < 0) goto out;
    bench_side sides[2] = { { .unit = ir_debug_unit, .ctx = &on }, { .unit = ir_debug_unit, .ctx = &off } };
    bench_series fig = { 0 };
    for (int r = 0; r < cfg->rounds; r++) {
        double sec[2];
        if (!bench_round(cfg, r, sides, 2, sec)) goto out;
        bench_add(&fig, sec[0] * 1e6, sec[1] * 1e6);
    }
    bench_emit("ir_debug_cache_hit_us", "us", BENCH_LOWER, &fig);
    rc = 0;
out:
    if (saved) setenv("XLA_IR_DEBUG", saved, 1);
    else unsetenv("XLA_IR_DEBUG");
    free(saved);
    cx_debug_reload_env();
    cx_free(on.x);
    return rc;
}

int bench_core(int argc, char **argv, bench_cfg cfg)
{
    int rc = bench_parse("core", argc, argv, NULL, 0, &cfg);
    if (rc >= 0) return rc;
    if (fused_elementwise(&cfg) || matmul(&cfg) || cache_hit(&cfg) || ir_debug(&cfg)) return 1;
    return 0;
}
