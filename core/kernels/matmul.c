/* Batched sgemm through cx_sgemm, which splits each product across the
 * worker pool (single-threaded library calls).
 *
 * Which library runs a product is decided on its whole shape, before the
 * split (docs/architecture.md, "Which library runs a GEMM", has the
 * figures): oneDNN's sgemm from about a million multiply-adds up when the
 * product splits by rows (it is at least as tall as wide, or 128 rows
 * tall), where its JIT kernels beat OpenBLAS by 5-15 % on every shape of a
 * transformer step; OpenBLAS below, where oneDNN's per-call set-up costs
 * more than its kernel saves. Products oneDNN does not take run on
 * OpenBLAS in parts of rows fixed by their shape (OB_PART_ROWS), since
 * the bits must not depend on the thread count. So does cx_sgemm_serial,
 * whose callers (convolution and attention tiles) were tuned on OpenBLAS
 * and mostly sit below the threshold. */
#include "kernels.h"
#include "pool.h"

#include <cblas.h>
#include <limits.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

/* OpenMP's API, declared here: clang's builds (fuzzing) have no omp.h, and
 * these two calls are all the core needs of libgomp */
int omp_get_max_threads(void);
void omp_set_num_threads(int n);

/* m*n*k from which oneDNN wins (measured: 128x128x64 and 64x128x128 win by
 * 10 %, 96^3 and 128x64x64 lose by 3-10 %) */
#define DNNL_MIN_MNK ((int64_t)1 << 20)
/* rows from which a wider-than-tall product still splits by rows */
#define DNNL_MIN_ROWS 128

/* The signals a handler may catch while oneDNN runs: all but those a fault
 * raises in the thread itself, which must stay deliverable. */
static void async_signals(sigset_t *set)
{
    sigfillset(set);
    const int faults[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS };
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(set, faults[i]);
}

void cx_dnnl_enter(cx_dnnl_call *call)
{
    /* Debian's oneDNN threads through OpenMP; the pool owns the compute
     * threads, so each call is one OpenMP thread, and the caller's own
     * setting (an application may use OpenMP itself) is put back */
    call->omp_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    /* oneDNN 2.6's f32 gemm kernels point rsp at a heap workspace (fixed
     * upstream in 2026): a signal handled meanwhile writes its frame into
     * the heap. A preempted trainer's SIGTERM did, and glibc aborted
     * ("corrupted size vs. prev_size"). Held here, a signal goes to another
     * thread or waits the call out, about a microsecond against the
     * product's 20 us and more (DNNL_MIN_MNK). */
    sigset_t held;
    async_signals(&held);
    pthread_sigmask(SIG_BLOCK, &held, &call->signals);
}

void cx_dnnl_leave(const cx_dnnl_call *call)
{
    pthread_sigmask(SIG_SETMASK, &call->signals, NULL);
    omp_set_num_threads(call->omp_threads);
}

/* oneDNN's sgemm on the calling thread only. @return false when oneDNN
 * refused the call (its packing buffer could not be allocated), C untouched. */
static bool dnnl_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cx_dnnl_call call;
    cx_dnnl_enter(&call);
    dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
    cx_dnnl_leave(&call);
    return st == dnnl_success;
}

/* OpenBLAS products run in parts of rows fixed by the shape alone, one
 * library call a part, whatever the thread count: OpenBLAS's sums depend on
 * the part's size (Haswell's kernels on its column range and on rows not a
 * multiple of 12, SkylakeX's on whether the part takes its small-matrix
 * kernels), so parts made from the thread count gave other bits on 1 and 3
 * threads. Each call packs all of op(B) again, so a part has about
 * OB_PART_ROWS rows: 48-row parts had repacked a gpt weight gradient's
 * 2048 x 768 B six times and made the f32 gpt on AVX2 5-8 % slower. Two
 * parts at least, for two threads; at most OB_MAX_PARTS; a multiple of
 * OB_PART_ALIGN rows (16: whole vectors of rows for the kernels). */
#define OB_PART_ROWS 512
#define OB_PART_ALIGN 16
#define OB_MAX_PARTS 16

typedef struct {
    bool ta, tb;
    int64_t rows_per_part;   /* OpenBLAS: each unit is one part of this many rows */
    int64_t m, n, k, lda, ldb, ldc;
    const float *a, *b;
    float *c;
    float beta;
} sgemm_job;

void cx_sgemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                     const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (blasint)m,
                (blasint)n, (blasint)k, 1.0f, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

/* Below AVX-512 OpenBLAS runs every shape: with AVX2 kernels (oneDNN
 * capped to avx2, OpenBLAS's Haswell core, on the Zen 4) OpenBLAS won or
 * tied every gpt shape, and oneDNN fell off cliffs on some transposed A's:
 * a weight gradient's 1024x128x2048 at 44 GFLOP/s against 95. Every
 * product reaches oneDNN through this choice, so asking the level first
 * applies CX_CPU_ISA's cap to oneDNN before its first kernel (isa.c). */
bool cx_sgemm_prefers_dnnl(int64_t m, int64_t n, int64_t k)
{
    return cx_isa_active() >= CX_ISA_AVX512 && m * n * k >= DNNL_MIN_MNK && (m >= n || m >= DNNL_MIN_ROWS);
}

void cx_sgemm_serial_on(bool dnnl, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float *a,
                        int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (dnnl && dnnl_serial(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc)) return;
    cx_sgemm_serial(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

/* rows [lo, hi) of C and of op(A), through oneDNN or OpenBLAS */
static void product_rows(const sgemm_job *j, bool dnnl, int64_t lo, int64_t hi)
{
    const float *a = j->ta ? j->a + lo : j->a + lo * j->lda;
    cx_sgemm_serial_on(dnnl, j->ta, j->tb, hi - lo, j->n, j->k, a, j->lda, j->b, j->ldb, j->beta, j->c + lo * j->ldc,
                       j->ldc);
}

static void openblas_parts(void *p, int64_t lo, int64_t hi)
{
    const sgemm_job *j = p;
    for (int64_t u = lo; u < hi; u++) {
        int64_t r0 = u * j->rows_per_part, r1 = r0 + j->rows_per_part < j->m ? r0 + j->rows_per_part : j->m;
        product_rows(j, false, r0, r1);
    }
}

/* oneDNN's sums over k do not depend on the row range
 * (tests/unit/test_kernels.c): any split */
static void dnnl_rows(void *p, int64_t lo, int64_t hi) { product_rows(p, true, lo, hi); }

void cx_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
              const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
    /* a product oneDNN wins splits by rows whenever it has rows enough for
     * the parts (a GPT's MLP weight gradient, 256 x 1024); the rule reads
     * the shape alone, so the library does not depend on the thread count */
    bool dnnl = cx_sgemm_prefers_dnnl(m, n, k);
    sgemm_job j = { trans_a, trans_b, 0, m, n, k, lda, ldb, ldc, a, b, c, beta };
    /* parts of at least ~2 MFLOP and 16 rows: smaller ones do not pay for a fork */
    int64_t grain = (int64_t)(2e6 / (2.0 * (double)(n * (k > 0 ? k : 1)))) + 1;
    if (grain < 16) grain = 16;
    if (dnnl) {
        cx_pool_parallel_for(m, grain, dnnl_rows, &j);
        return;
    }
    const int64_t by_grain = m / grain > 1 ? m / grain : 1;
    int64_t parts = m / OB_PART_ROWS;
    if (parts < 2) parts = 2;
    if (parts > OB_MAX_PARTS) parts = OB_MAX_PARTS;
    if (parts > by_grain) parts = by_grain;
    const int64_t rows = (m + parts - 1) / parts;
    j.rows_per_part = (rows + OB_PART_ALIGN - 1) / OB_PART_ALIGN * OB_PART_ALIGN;
    cx_pool_parallel_for((m + j.rows_per_part - 1) / j.rows_per_part, 1, openblas_parts, &j);
}

static void gemm(float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k, bool trans_a,
                 bool trans_b)
{
    cx_sgemm(trans_a, trans_b, m, n, k, a, trans_a ? m : k, b, trans_b ? k : n, 0.0f, c, n);
}

/* A shared B under back-to-back untransposed A blocks: one tall
 * (batch*M, K) product, the C blocks stacked the same way. */
static bool tall_product(int64_t m, int64_t k, bool trans_a, int64_t stride_a, int64_t stride_b)
{
    return stride_a != 0 && stride_b == 0 && !trans_a && stride_a == m * k;
}

bool cx_matmul_f32_on_dnnl(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, int64_t stride_a,
                           int64_t stride_b)
{
    int64_t per = m > 0 ? INT_MAX / m : 0;
    int64_t rows = batch > 1 && tall_product(m, k, trans_a, stride_a, stride_b) ? (batch < per ? batch : per) * m : m;
    return cx_sgemm_prefers_dnnl(rows, n, k);
}

void cx_matmul_f32(float *c, const float *a, const float *b,
                   int64_t batch, int64_t m, int64_t n, int64_t k,
                   bool trans_a, bool trans_b,
                   int64_t stride_a, int64_t stride_b)
{
    if (batch <= 0 || m <= 0 || n <= 0) return;
    const int64_t c_size = m * n;
    if (k <= 0) {
        /* An empty sum; do not rely on the BLAS to clear C when K = 0. */
        memset(c, 0, sizeof(float) * (size_t)(batch * c_size));
        return;
    }
    if (stride_a == 0 && stride_b == 0) {
        /* Every batch computes the same product: do it once and copy. */
        gemm(c, a, b, m, n, k, trans_a, trans_b);
        for (int64_t i = 1; i < batch; i++) memcpy(c + i * c_size, c, sizeof(float) * (size_t)c_size);
        return;
    }
    if (tall_product(m, k, trans_a, stride_a, stride_b)) {
        /* A shared B and back-to-back untransposed A blocks form one tall
         * (batch*M, K) matrix, and the C blocks stack the same way: one
         * large sgemm instead of `batch` small ones. Split only if the row
         * count would overflow a BLAS int. */
        int64_t per = INT_MAX / m;
        for (int64_t b0 = 0; b0 < batch; b0 += per) {
            int64_t nb = batch - b0 < per ? batch - b0 : per;
            gemm(c + b0 * c_size, a + b0 * stride_a, b, nb * m, n, k, false, trans_b);
        }
        return;
    }
    for (int64_t i = 0; i < batch; i++)
        gemm(c + i * c_size, a + i * stride_a, b + i * stride_b, m, n, k, trans_a, trans_b);
}

typedef struct {
    float *c;
    const float *bias, *addend;
    bool relu;
    int64_t n;
} linear_epi_job;

CX_HOT static void linear_epi_rows(void *p, int64_t r0, int64_t r1)
{
    const linear_epi_job *j = p;
    const int64_t n = j->n;
    for (int64_t r = r0; r < r1; r++) {
        float *c = j->c + r * n;
        if (j->addend) {
            const float *x = j->addend + r * n;
            for (int64_t e = 0; e < n; e++) c[e] = (c[e] + j->bias[e]) + x[e];
        } else if (j->relu) {
            for (int64_t e = 0; e < n; e++) {
                const float v = c[e] + j->bias[e];
                c[e] = v > 0 ? v : 0.0f;
            }
        } else {
            for (int64_t e = 0; e < n; e++) c[e] += j->bias[e];
        }
    }
}

void cx_linear_epilogue_f32(float *c, const float *bias, const float *addend, bool relu, int64_t rows, int64_t n)
{
    if (rows <= 0 || n <= 0) return;
    linear_epi_job j = { c, bias, addend, relu, n };
    /* ~32K elements a part, as the fused loops */
    cx_pool_parallel_for(rows, 32768 / n + 1, linear_epi_rows, &j);
}
