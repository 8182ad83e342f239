/* The f32 GEMM libraries on this machine, shape by shape, single-threaded
 * as cxla's pool calls them: the figures behind kernels/matmul.c's choice
 * (docs/architecture.md, "Which library runs a GEMM"). Not part of the
 * build, so that the build needs no libxsmm; run it on the CPU you want
 * the choice for:
 *
 *   cc -O2 scripts/gemm_libs.c -o /tmp/gemm_libs -lopenblas -ldnnl -lxsmm -lgomp -lm
 *   /tmp/gemm_libs                       # a GPT step's shapes, each half of cx_sgemm's 2-way split
 *   /tmp/gemm_libs 64,64,64,nt ...       # m,n,k,transposes of row-major C = op(A) op(B)
 *
 * Time is the thread's CPU time, not the wall clock: on a shared machine
 * the wall clock measures the neighbours. Each library is timed in turn,
 * 9 rounds, so a slow spell hits all three; the median and the range are
 * printed. ONEDNN_MAX_CPU_ISA=AVX2 and OPENBLAS_CORETYPE=Haswell give the
 * AVX2 kernels on an AVX-512 CPU (not an AVX2 CPU's caches and ports). */
#include <cblas.h>
#include <libxsmm.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void omp_set_num_threads(int n);

typedef struct { int m, n, k; int ta, tb; } shape;
enum { ROUNDS = 9, LIBS = 3 };

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void openblas(shape s, const float *a, const float *b, float *c)
{
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.0f,
                a, s.ta ? s.m : s.k, b, s.tb ? s.k : s.n, 0.0f, c, s.n);
}

static void onednn(shape s, const float *a, const float *b, float *c)
{
    dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a, s.ta ? s.m : s.k, b, s.tb ? s.k : s.n, 0.0f,
               c, s.n);
}

/* libxsmm is column-major: row-major C = op(A) op(B) is C^T = op(B)^T op(A)^T */
static void xsmm(shape s, const float *a, const float *b, float *c)
{
    char ta = s.tb ? 'T' : 'N', tb = s.ta ? 'T' : 'N';
    libxsmm_blasint m = s.n, n = s.m, k = s.k, lda = s.tb ? s.k : s.n, ldb = s.ta ? s.m : s.k, ldc = s.n;
    float one = 1.0f, zero = 0.0f;
    libxsmm_sgemm(&ta, &tb, &m, &n, &k, &one, b, &lda, a, &ldb, &zero, c, &ldc);
}

static int by_value(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv)
{
    /* the default GPT (n_embd 256, 16 x 128 tokens): forward x W^T, dX = dY W, dW = dY^T X */
    static shape shapes[64] = {
        { 1024, 768, 256, 0, 1 }, { 1024, 256, 256, 0, 1 }, { 1024, 1024, 256, 0, 1 }, { 1024, 256, 1024, 0, 1 },
        { 1024, 256, 768, 0, 0 }, { 1024, 256, 256, 0, 0 }, { 1024, 256, 1024, 0, 0 }, { 1024, 1024, 256, 0, 0 },
        { 384, 256, 2048, 1, 0 }, { 128, 256, 2048, 1, 0 }, { 512, 256, 2048, 1, 0 }, { 256, 512, 2048, 1, 0 },
        { 64, 64, 64, 0, 1 }, { 64, 64, 64, 0, 0 }, { 2048, 2048, 2048, 0, 0 },
    };
    int ns = 15;
    if (argc > 1) {
        ns = 0;
        for (int i = 1; i < argc && ns < 64; i++) {
            char t[3] = "nn";
            if (sscanf(argv[i], "%d,%d,%d,%2s", &shapes[ns].m, &shapes[ns].n, &shapes[ns].k, t) < 3 ||
                shapes[ns].m < 1 || shapes[ns].n < 1 || shapes[ns].k < 1 || shapes[ns].m * (long)shapes[ns].k > (1L << 24) ||
                shapes[ns].k * (long)shapes[ns].n > (1L << 24) || shapes[ns].m * (long)shapes[ns].n > (1L << 24)) {
                fprintf(stderr, "gemm_libs: bad shape '%s': want m,n,k[,nn|nt|tn|tt], each matrix at most 2^24 floats\n",
                        argv[i]);
                return 2;
            }
            shapes[ns].ta = t[0] == 't';
            shapes[ns].tb = t[1] == 't';
            ns++;
        }
    }
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
    libxsmm_init();
    float *a = malloc(sizeof(float) << 24), *b = malloc(sizeof(float) << 24), *c = malloc(sizeof(float) << 24);
    if (!a || !b || !c) { fprintf(stderr, "gemm_libs: out of memory\n"); return 1; }
    for (int i = 0; i < 1 << 24; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; }
    void (*lib[LIBS])(shape, const float *, const float *, float *) = { openblas, onednn, xsmm };
    const char *name[LIBS] = { "openblas", "onednn", "libxsmm" };
    for (int i = 0; i < ns; i++) {
        shape s = shapes[i];
        double flop = 2.0 * s.m * s.n * (double)s.k, g[LIBS][ROUNDS];
        for (int l = 0; l < LIBS; l++)
            for (int w = 0; w < 3; w++) lib[l](s, a, b, c);   /* JIT and packing buffers first */
        for (int r = 0; r < ROUNDS; r++)
            for (int l = 0; l < LIBS; l++) {
                double t0 = cpu_now(), t;
                int it = 0;
                do { lib[l](s, a, b, c); it++; } while ((t = cpu_now() - t0) < 0.03);
                g[l][r] = flop * it / t * 1e-9;
            }
        printf("m=%4d n=%4d k=%4d %c%c:", s.m, s.n, s.k, s.ta ? 't' : 'n', s.tb ? 't' : 'n');
        for (int l = 0; l < LIBS; l++) {
            qsort(g[l], ROUNDS, sizeof g[l][0], by_value);
            printf("  %s %5.1f [%5.1f-%5.1f]", name[l], g[l][ROUNDS / 2], g[l][0], g[l][ROUNDS - 1]);
        }
        printf("  GFLOPS\n");
    }
    free(a);
    free(b);
    free(c);
    return 0;
}
