/* Batched sgemm. OpenBLAS threads each call itself, so batches run one
 * after another on the calling thread (never from pool workers). */
#include "kernels.h"

#include <cblas.h>
#include <limits.h>
#include <string.h>

static void gemm(float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k, bool trans_a,
                 bool trans_b)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, 1.0f, a, (blasint)(trans_a ? m : k), b,
                (blasint)(trans_b ? k : n), 0.0f, c, (blasint)n);
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
    if (stride_b == 0 && !trans_a && stride_a == m * k) {
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
