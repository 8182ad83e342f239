/* cxla-bench core: the lazy core against the machine's own limits. */
#include "bench.h"

#include <cxla/cxla.h>
#include <cblas.h>

/* the reference is OpenBLAS with all the threads cxla uses */
extern void openblas_set_num_threads(int);
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPS 9

static cx_tensor *filled(int64_t n, float v0)
{
    float *h = malloc(sizeof(float) * (size_t)n);
    if (!h) return NULL;
    for (int64_t i = 0; i < n; i++) h[i] = v0 + (float)(i % 97) * 0.01f - 0.5f;
    cx_tensor *t = cx_from_host(h, &n, 1, CX_F32);
    free(h);
    return t;
}

/* relu(a*b+c) over 64 MiB per operand: 3 reads + 1 write, against memcpy
 * (1 read + 1 write) of the same size. */
static void fused_elementwise(void)
{
    const int64_t n = (64ll << 20) / 4;
    cx_tensor *a = filled(n, 1), *b = filled(n, 2), *c = filled(n, -1);
    double t[REPS];
    for (int r = 0; r < REPS + 1; r++) {
        double t0 = bench_now();
        cx_tensor *y = cx_relu(cx_add(cx_mul(a, b), c));
        cx_sync_tensors(&y, 1);
        double dt = bench_now() - t0;
        if (r) t[r - 1] = dt; /* the first run compiles */
        cx_free(y);
    }
    double gbps = 4.0 * (double)n * 4 / bench_median(t, REPS) / 1e9;
    char *src = malloc((size_t)n * 4), *dst = malloc((size_t)n * 4);
    memset(src, 1, (size_t)n * 4);
    memset(dst, 0, (size_t)n * 4);
    double m[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = bench_now();
        memcpy(dst, src, (size_t)n * 4);
        m[r] = bench_now() - t0;
    }
    double ref = 2.0 * (double)n * 4 / bench_median(m, REPS) / 1e9;
    free(src);
    free(dst);
    cx_exec_info info = cx_last_exec_info();
    fprintf(stderr, "fused_elementwise: %d kernel(s)\n", info.num_kernels);
    bench_emit("fused_elementwise_gbps", gbps, "GB/s", ref);
    cx_free(a); cx_free(b); cx_free(c);
}

static void matmul(void)
{
    const int64_t n = 2048;
    int64_t s[2] = { n, n };
    float *ha = malloc(sizeof(float) * (size_t)(n * n)), *hb = malloc(sizeof(float) * (size_t)(n * n)),
          *hc = malloc(sizeof(float) * (size_t)(n * n));
    for (int64_t i = 0; i < n * n; i++) { ha[i] = (float)(i % 13) * 0.1f; hb[i] = (float)(i % 7) * 0.1f; }
    cx_tensor *a = cx_from_host(ha, s, 2, CX_F32), *b = cx_from_host(hb, s, 2, CX_F32);
    double flop = 2.0 * (double)n * n * n;
    double t[REPS], r[REPS];
    for (int k = 0; k < REPS + 1; k++) {
        double t0 = bench_now();
        cx_tensor *c = cx_matmul(a, b);
        cx_sync_tensors(&c, 1);
        double dt = bench_now() - t0;
        if (k) t[k - 1] = dt;
        cx_free(c);
    }
    openblas_set_num_threads(cx_get_num_threads());
    for (int k = 0; k < REPS + 1; k++) {
        double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, ha, (int)n, hb, (int)n, 0.0f, hc, (int)n);
        double dt = bench_now() - t0;
        if (k) r[k - 1] = dt;
    }
    openblas_set_num_threads(1);
    bench_emit("matmul_gflops", flop / bench_median(t, REPS) / 1e9, "GFLOP/s", flop / bench_median(r, REPS) / 1e9);
    free(ha); free(hb); free(hc);
    cx_free(a); cx_free(b);
}

/* A 100-node step on tiny tensors: what a cache hit costs (trace, key,
 * lookup, plus a one-element run). */
static void cache_hit(void)
{
    int64_t one = 4;
    float h[4] = { 0.5f, 0.25f, 0.125f, 1.0f };
    cx_tensor *x = cx_from_host(h, &one, 1, CX_F32);
    double t[101];
    int reps = 101;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = bench_now();
        cx_step_begin();
        cx_tensor *v = x;
        for (int i = 0; i < 50; i++) {
            cx_tensor *m = cx_mul_scalar(v, 1.0001);
            v = cx_add(m, x);
        }
        cx_tensor *s = cx_keep(cx_sum(v, NULL, 0, false));
        cx_step_end();
        double dt = bench_now() - t0;
        cx_free(s);
        if (r) t[r - 1] = dt;
    }
    cx_exec_info info = cx_last_exec_info();
    fprintf(stderr, "cache_hit: %d IR nodes per step\n", info.num_nodes);
    bench_emit("cache_hit_overhead_us", bench_median(t, reps) * 1e6, "us", 50);
    cx_free(x);
}

int bench_core(int argc, char **argv)
{
    (void)argc; (void)argv;
    fused_elementwise();
    matmul();
    cache_hit();
    return 0;
}
