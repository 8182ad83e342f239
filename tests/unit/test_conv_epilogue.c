/* A conv whose bias and relu the compiler folds into the conv kernel
 * (EPI_BIAS_RELU) must not drop what the same fused program computes
 * after the relu. With the loss left out of the step's outputs, relu's
 * gradient 2 * relu(z) * (z > 0) fuses into the program after conv + bias +
 * relu; the fold once matched its first four instructions and threw the
 * rest away, and the input gradient came out as if dL/dy were relu(z).
 * Checked against a double reference of the same sums. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>

#include <cxla/cxla.h>

enum { N = 2, C = 3, O = 4, H = 7, K = 3, OH = H - K + 1 };

static double ref_grad(const float *x, const float *w, const float *b, double *gx)
{
    static double dz[N][O][OH][OH];
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++)
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OH; j++) {
                    double s = b[o];
                    for (int c = 0; c < C; c++)
                        for (int p = 0; p < K; p++)
                            for (int q = 0; q < K; q++)
                                s += (double)x[((n * C + c) * H + i + p) * H + j + q] * w[((o * C + c) * K + p) * K + q];
                    dz[n][o][i][j] = s > 0 ? 2 * s : 0;
                }
    double big = 0;
    for (int e = 0; e < N * C * H * H; e++) gx[e] = 0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++)
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OH; j++)
                    for (int c = 0; c < C; c++)
                        for (int p = 0; p < K; p++)
                            for (int q = 0; q < K; q++)
                                gx[((n * C + c) * H + i + p) * H + j + q] +=
                                    dz[n][o][i][j] * w[((o * C + c) * K + p) * K + q];
    for (int e = 0; e < N * C * H * H; e++) big = fmax(big, fabs(gx[e]));
    return big;
}

Test(conv_epilogue, bias_relu_fold_keeps_the_rest_of_the_program)
{
    float x[N * C * H * H], w[O * C * K * K], b[O], g[N * C * H * H];
    double gr[N * C * H * H];
    for (int i = 0; i < N * C * H * H; i++) x[i] = sinf((float)i * 0.37f);
    for (int i = 0; i < O * C * K * K; i++) w[i] = cosf((float)i * 0.91f);
    for (int i = 0; i < O; i++) b[i] = 0.3f * sinf((float)i * 1.3f);
    const int64_t sx[] = { N, C, H, H }, sw[] = { O, C, K, K }, sb[] = { O };
    cx_tensor *X = cx_requires_grad(cx_persist(cx_from_host(x, sx, 4, CX_F32)), true);
    cx_tensor *W = cx_persist(cx_from_host(w, sw, 4, CX_F32)), *B = cx_persist(cx_from_host(b, sb, 1, CX_F32));
    cx_step_begin();
    cx_tensor *y = cx_relu(cx_conv2d(X, W, B, 1, 1, 0, 0, 1, 1, 1));
    cr_assert_eq(cx_backward(cx_sum(cx_mul(y, y), NULL, 0, false)), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cx_step_begin();
    cr_assert_eq(cx_to_host(cx_grad(X), g, CX_F32), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    double big = ref_grad(x, w, b, gr);
    for (int i = 0; i < N * C * H * H; i++)
        cr_assert(fabs(g[i] - gr[i]) <= 1e-5 * big, "dx[%d] = %g, want %g", i, g[i], gr[i]);
    cx_free(X); cx_free(W); cx_free(B);
}
