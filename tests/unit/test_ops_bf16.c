/* bf16 matmuls through the graph: the dtype rules (bf16 @ bf16 stays bf16,
 * a mix promotes to f32), the values against a double reference over the
 * same bf16 inputs, a bf16 epilogue fused after the kernel, and the
 * gradients, which are bf16 matmuls of bf16 operands.
 *
 * Tolerance: the kernel rounds once to bf16 after f32 sums, so within
 * 2^-9 |ref| plus the f32 sums' error; we allow 2^-8 |ref| + 1e-5 sum|ab|.
 * A gradient reaching the matmul through cast(., f32) is first rounded to
 * bf16 (the cast's gradient), and the reference rounds it the same way. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <stdio.h>
#include <unistd.h>
#include <cxla/debug.h>

#include "ref.h"

static uint16_t *to_bf16(const float *x, int64_t n)
{
    uint16_t *h = malloc(sizeof *h * (size_t)n);
    cr_assert(h);
    for (int64_t i = 0; i < n; i++) h[i] = cx_f32_to_bf16(x[i]);
    return h;
}

static cx_tensor *tbf16(const uint16_t *h, const int64_t *shape, int nd)
{
    cx_tensor *t = cx_from_host(h, shape, nd, CX_BF16);
    cr_assert(t && !cx_tensor_error(t));
    return t;
}

static void end_ok(void)
{
    cx_status st = cx_step_end();
    cr_assert_eq(st, CX_OK, "cx_step_end -> %d (%s)", (int)st, cx_last_error());
}

/* |got - sum_k a(i,k) b(k,j)| within the tolerance above; a, b as bf16 bits */
static void check_product(const char *what, const uint16_t *got, const uint16_t *a, int64_t lda_i, int64_t lda_k,
                          const uint16_t *b, int64_t ldb_k, int64_t ldb_j, int64_t m, int64_t n, int64_t k,
                          const uint16_t *add)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t q = 0; q < k; q++) {
                double t = (double)cx_bf16_to_f32(a[i * lda_i + q * lda_k]) * cx_bf16_to_f32(b[q * ldb_k + j * ldb_j]);
                ref += t;
                mag += fabs(t);
            }
            double tol = ldexp(fabs(ref), -8) + 1e-5 * mag;
            if (add) {
                /* bf16 matmul rounded, then a bf16 add rounded again */
                ref += cx_bf16_to_f32(add[j]);
                tol = 2 * tol + ldexp(fabs(ref), -8);
            }
            double g = cx_bf16_to_f32(got[i * n + j]);
            cr_assert(fabs(g - ref) <= tol, "%s[%lld][%lld] = %g, want %g (tol %g)", what, (long long)i, (long long)j, g,
                      ref, tol);
        }
}

Test(ops_bf16, matmul_stays_bf16_batched_transposed_with_epilogue)
{
    rng_seed(7);
    const int64_t B = 3, M = 21, K = 37, N = 45;
    float *af = rand_f32(B * M * K, -1, 1), *bf = rand_f32(B * N * K, -1, 1), *cf = rand_f32(N, -1, 1);
    uint16_t *a = to_bf16(af, B * M * K), *b = to_bf16(bf, B * N * K), *bias = to_bf16(cf, N);
    const int64_t sa[] = { B, M, K }, sb[] = { B, N, K }, sc[] = { N };
    uint16_t *gy = malloc(sizeof *gy * (size_t)(B * M * N)), *gz = malloc(sizeof *gz * (size_t)(B * M * N));
    cr_assert(gy && gz);
    /* twice: y alone, then only y + bias, so the add runs as the matmul's
     * epilogue in place over its bf16 output */
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        cx_step_begin();
        cx_tensor *ta = tbf16(a, sa, 3), *tb = tbf16(b, sb, 3), *tc = tbf16(bias, sc, 1);
        cx_tensor *y = cx_matmul(ta, cx_transpose(tb, -1, -2));
        cr_assert_eq(cx_dtype_of(y), CX_BF16, "bf16 @ bf16 -> %s", cx_dtype_name(cx_dtype_of(y)));
        cx_tensor *z = with_bias ? cx_add(y, tc) : y;
        cr_assert_eq(cx_dtype_of(z), CX_BF16);
        cr_assert_eq(cx_to_host(z, with_bias ? gz : gy, CX_BF16), CX_OK, "%s", cx_last_error());
        end_ok();
    }
    for (int64_t p = 0; p < B; p++) {
        /* b is (N, K): element (k, j) of its transpose at j*K + k */
        check_product("y", gy + p * M * N, a + p * M * K, K, 1, b + p * N * K, 1, K, M, N, K, NULL);
        check_product("y + bias", gz + p * M * N, a + p * M * K, K, 1, b + p * N * K, 1, K, M, N, K, bias);
    }
    free(af); free(bf); free(cf); free(a); free(b); free(bias); free(gy); free(gz);
}

Test(ops_bf16, mixed_operands_promote_to_f32)
{
    rng_seed(8);
    float *af = rand_f32(6 * 5, -1, 1), *bf = rand_f32(5 * 4, -1, 1);
    uint16_t *a = to_bf16(af, 30);
    const int64_t sa[] = { 6, 5 }, sb[] = { 5, 4 };
    cx_step_begin();
    cx_tensor *y = cx_matmul(tbf16(a, sa, 2), tf32(bf, sb, 2));
    cr_assert_eq(cx_dtype_of(y), CX_F32, "bf16 @ f32 -> %s", cx_dtype_name(cx_dtype_of(y)));
    float got[24];
    cr_assert_eq(cx_to_host(y, got, CX_F32), CX_OK, "%s", cx_last_error());
    end_ok();
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++) {
            double ref = 0;
            for (int q = 0; q < 5; q++) ref += (double)cx_bf16_to_f32(a[i * 5 + q]) * bf[q * 4 + j];
            cr_assert(fabs(got[i * 4 + j] - ref) <= 1e-5, "y[%d][%d] = %g, want %g (f32 sums)", i, j, got[i * 4 + j], ref);
        }
    free(af); free(bf); free(a);
}

Test(ops_bf16, gradients_are_bf16_matmuls)
{
    rng_seed(9);
    const int64_t M = 19, K = 30, N = 27;
    float *af = rand_f32(M * K, -1, 1), *bf = rand_f32(K * N, -1, 1), *w = rand_f32(M * N, -1, 1);
    uint16_t *a = to_bf16(af, M * K), *b = to_bf16(bf, K * N), *wr = to_bf16(w, M * N);
    const int64_t sa[] = { M, K }, sb[] = { K, N }, sw[] = { M, N };
    cx_tensor *A = cx_requires_grad(cx_persist(tbf16(a, sa, 2)), true);
    cx_tensor *Bt = cx_requires_grad(cx_persist(tbf16(b, sb, 2)), true);
    cx_step_begin();
    cx_tensor *y = cx_cast(cx_matmul(A, Bt), CX_F32);
    cx_tensor *loss = cx_sum(cx_mul(y, tf32(w, sw, 2)), NULL, 0, false);
    cr_assert_eq(cx_backward(loss), CX_OK, "%s", cx_last_error());
    end_ok();
    cx_tensor *ga = cx_grad(A), *gb = cx_grad(Bt);
    cr_assert(ga && gb);
    cr_assert_eq(cx_dtype_of(ga), CX_BF16, "dA is %s", cx_dtype_name(cx_dtype_of(ga)));
    cr_assert_eq(cx_dtype_of(gb), CX_BF16, "dB is %s", cx_dtype_name(cx_dtype_of(gb)));
    uint16_t *hga = malloc(sizeof *hga * (size_t)(M * K)), *hgb = malloc(sizeof *hgb * (size_t)(K * N));
    cr_assert(hga && hgb);
    cr_assert_eq(cx_to_host(ga, hga, CX_BF16), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_to_host(gb, hgb, CX_BF16), CX_OK, "%s", cx_last_error());
    /* dA (M, K) = W (M, N) @ B^T: B^T (n, k) at k*N + n; dB (K, N) = A^T @ W */
    check_product("dA", hga, wr, N, 1, b, 1, N, M, K, N, NULL);
    check_product("dB", hgb, a, 1, K, wr, N, 1, K, N, M, NULL);
    cx_free(A); cx_free(Bt);
    free(af); free(bf); free(w); free(a); free(b); free(wr); free(hga); free(hgb);
}

/* sdpa of bf16 q, k, v gives bf16, and its value is the f32 op's on the
 * same (rounded) inputs within one bf16 rounding of it, plus, where the
 * kernel runs its products on the bf16 GEMM (AVX512_BF16), the rounding
 * of P to bf16 before P V, which moves an output by at most 2^-9 of the
 * largest |v| (we allow 2^-8). The
 * gradients are bf16; they come from the bf16 output and the gradient
 * rounded to bf16, so they sit within a few bf16 roundings of the f32 op's
 * gradients: we allow 2^-6 of each value plus 2^-7 of the largest. */
static void sdpa_run(cx_dtype dt, const float *h, const float *w, int64_t n, float *out, float *grads)
{
    const int64_t s[] = { 2, 3, 17, 8 };
    cx_tensor *P[3];
    uint16_t *hb = to_bf16(h, 3 * n);
    for (int i = 0; i < 3; i++)
        P[i] = cx_requires_grad(cx_persist(dt == CX_BF16 ? tbf16(hb + i * n, s, 4) : tf32(h + i * n, s, 4)), true);
    free(hb);
    cx_step_begin();
    cx_tensor *y = cx_scaled_dot_product_attention(P[0], P[1], P[2], true, 0);
    cr_assert_eq(cx_dtype_of(y), dt, "sdpa of %s -> %s", cx_dtype_name(dt), cx_dtype_name(cx_dtype_of(y)));
    cx_tensor *yf = cx_cast(y, CX_F32);
    cr_assert_eq(cx_backward(cx_sum(cx_mul(yf, tf32(w, s, 4)), NULL, 0, false)), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_to_host(yf, out, CX_F32), CX_OK, "%s", cx_last_error());
    end_ok();
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(cx_dtype_of(cx_grad(P[i])), dt);
        cx_step_begin();
        cr_assert_eq(cx_to_host(cx_cast(cx_grad(P[i]), CX_F32), grads + i * n, CX_F32), CX_OK, "%s", cx_last_error());
        end_ok();
        cx_free(P[i]);
    }
}

Test(ops_bf16, attention_in_bf16)
{
    rng_seed(10);
    const int64_t n = 2 * 3 * 17 * 8;
    float *h = rand_f32(3 * n, -2, 2), *w = rand_f32(n, -1, 1);
    for (int64_t i = 0; i < 3 * n; i++) h[i] = cx_bf16_to_f32(cx_f32_to_bf16(h[i]));
    float *o16 = malloc(sizeof(float) * (size_t)n), *o32 = malloc(sizeof(float) * (size_t)n);
    float *g16 = malloc(sizeof(float) * (size_t)(3 * n)), *g32 = malloc(sizeof(float) * (size_t)(3 * n));
    cr_assert(o16 && o32 && g16 && g32);
    sdpa_run(CX_BF16, h, w, n, o16, g16);
    sdpa_run(CX_F32, h, w, n, o32, g32);
    double vmax = 0;
    for (int64_t i = 2 * n; i < 3 * n; i++) vmax = fmax(vmax, fabs(h[i]));
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs(o16[i] - o32[i]) <= ldexp(fabs(o32[i]), -8) + ldexp(vmax, -8), "out[%lld] = %g, f32 op %g",
                  (long long)i, o16[i], o32[i]);
    double big = 0;
    for (int64_t i = 0; i < 3 * n; i++) big = fmax(big, fabs(g32[i]));
    for (int64_t i = 0; i < 3 * n; i++)
        cr_assert(fabs(g16[i] - g32[i]) <= ldexp(fabs(g32[i]), -6) + ldexp(big, -7), "grad[%lld] = %g, f32 op %g",
                  (long long)i, g16[i], g32[i]);
    free(h); free(w); free(o16); free(o32); free(g16); free(g32);
}

/* conv2d of bf16 x and w with a bias, then relu: bf16 throughout, within
 * two bf16 roundings (the conv, the bias add: 2^-8 of the largest output
 * covers them where the two cancel) of the f32 op on the same rounded
 * values; gradients bf16, within the attention test's tolerance
 * of the f32 op's (relu's mask can differ only where the output rounds
 * across 0, which values this far from 0 do not). */
typedef struct {
    int64_t n, c, hw, o, k, ohw;   /* x (n, c, hw, hw), w (o, c, k, k), y (n, o, ohw, ohw) */
    int stride, pad;
} conv_case;

static void conv_run(const conv_case *cc, cx_dtype dt, const float *h, const float *w, float *out, float *grads)
{
    const int64_t sx[] = { cc->n, cc->c, cc->hw, cc->hw }, sw[] = { cc->o, cc->c, cc->k, cc->k }, sb[] = { cc->o };
    const int64_t sy[] = { cc->n, cc->o, cc->ohw, cc->ohw };
    const int64_t nx = sx[0] * sx[1] * sx[2] * sx[3], nw = sw[0] * sw[1] * sw[2] * sw[3];
    const float *src[3] = { h, h + nx, h + nx + nw };
    const int64_t *shp[3] = { sx, sw, sb };
    int64_t cnt[3] = { nx, nw, cc->o };
    cx_tensor *P[3];
    for (int i = 0; i < 3; i++) {
        uint16_t *hb = to_bf16(src[i], cnt[i]);
        P[i] = cx_requires_grad(cx_persist(dt == CX_BF16 ? tbf16(hb, shp[i], i == 2 ? 1 : 4)
                                                         : tf32(src[i], shp[i], i == 2 ? 1 : 4)), true);
        free(hb);
    }
    cx_step_begin();
    cx_tensor *y = cx_relu(cx_conv2d(P[0], P[1], P[2], cc->stride, cc->stride, cc->pad, cc->pad, 1, 1, 1));
    cr_assert_eq(cx_dtype_of(y), dt, "conv2d of %s -> %s", cx_dtype_name(dt), cx_dtype_name(cx_dtype_of(y)));
    cx_tensor *yf = cx_cast(y, CX_F32);
    cr_assert_eq(cx_backward(cx_sum(cx_mul(yf, tf32(w, sy, 4)), NULL, 0, false)), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_to_host(yf, out, CX_F32), CX_OK, "%s", cx_last_error());
    end_ok();
    int64_t off = 0;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(cx_dtype_of(cx_grad(P[i])), dt);
        cx_step_begin();
        cr_assert_eq(cx_to_host(cx_cast(cx_grad(P[i]), CX_F32), grads + off, CX_F32), CX_OK, "%s", cx_last_error());
        end_ok();
        off += cnt[i];
        cx_free(P[i]);
    }
}

static void conv_compare(const conv_case *cc, unsigned seed)
{
    rng_seed(seed);
    const int64_t nin = cc->n * cc->c * cc->hw * cc->hw + cc->o * cc->c * cc->k * cc->k + cc->o;
    const int64_t ny = cc->n * cc->o * cc->ohw * cc->ohw;
    float *h = rand_f32(nin, -1, 1), *w = rand_f32(ny, -1, 1);
    for (int64_t i = 0; i < nin; i++) h[i] = cx_bf16_to_f32(cx_f32_to_bf16(h[i]));
    float *o16 = malloc(sizeof(float) * (size_t)ny), *o32 = malloc(sizeof(float) * (size_t)ny);
    float *g16 = malloc(sizeof(float) * (size_t)nin), *g32 = malloc(sizeof(float) * (size_t)nin);
    cr_assert(o16 && o32 && g16 && g32);
    conv_run(cc, CX_BF16, h, w, o16, g16);
    conv_run(cc, CX_F32, h, w, o32, g32);
    /* the roundings scale with the conv's value and the bias, not with
     * their sum: the tolerance's second term covers the cancellation */
    int mask_flips = 0;
    double ymax = 0;
    for (int64_t i = 0; i < ny; i++) ymax = fmax(ymax, fabs(o32[i]));
    for (int64_t i = 0; i < ny; i++) {
        if ((o16[i] > 0) != (o32[i] > 0)) { mask_flips++; continue; }
        cr_assert(fabs(o16[i] - o32[i]) <= ldexp(fabs(o32[i]), -7) + ldexp(ymax, -8), "y[%lld] = %g, f32 op %g",
                  (long long)i, o16[i], o32[i]);
    }
    double big = 0;
    for (int64_t i = 0; i < nin; i++) big = fmax(big, fabs(g32[i]));
    if (mask_flips == 0)
        for (int64_t i = 0; i < nin; i++)
            cr_assert(fabs(g16[i] - g32[i]) <= ldexp(fabs(g32[i]), -6) + ldexp(big, -7), "grad[%lld] = %g, f32 op %g",
                      (long long)i, g16[i], g32[i]);
    cr_assert(mask_flips <= 2, "%d outputs changed sign", mask_flips);
    free(h); free(w); free(o16); free(o32); free(g16); free(g32);
}

Test(ops_bf16, conv_in_bf16)
{
    const conv_case cc = { .n = 2, .c = 4, .hw = 9, .o = 6, .k = 3, .ohw = 9, .stride = 1, .pad = 1 };
    conv_compare(&cc, 11);
}

/* 64 output channels, stride 2: the shape the bf16 conv lowers to the
 * bf16 GEMM with AVX512_BF16 (conv_bf16.c), its three directions through
 * the graph */
Test(ops_bf16, conv_on_the_bf16_gemm)
{
    const conv_case cc = { .n = 3, .c = 8, .hw = 9, .o = 64, .k = 3, .ohw = 5, .stride = 2, .pad = 1 };
    conv_compare(&cc, 12);
}

/* GELU is one op. In f32 it gives the bits of the composite it replaced,
 * (x / 2) (1 + erf(x / sqrt 2)) built from the graph's own ops; in bf16
 * it computes in f32 and rounds once, so its output is exactly that
 * value rounded to bf16, as PyTorch's bf16 gelu. Its gradient, g *
 * gelu'(x) with gelu' rounded to bf16 and the product rounded again, lies
 * within 2^-7 |ref| (plus 1e-6 near 0) of the double reference. */
Test(ops_bf16, gelu_rounds_once)
{
    enum { N = 1000 };
    rng_seed(12);
    float *xf = rand_f32(N, -5, 5);
    uint16_t *x = to_bf16(xf, N);
    float wide[N], f32_out[N], got[N], grad[N];
    for (int i = 0; i < N; i++) wide[i] = cx_bf16_to_f32(x[i]);
    const int64_t s[] = { N };
    float composite[N];
    cx_step_begin();
    cx_tensor *w = tf32(wide, s, 1);
    cx_tensor *ref = cx_gelu(w, false);
    cx_tensor *old = cx_mul(cx_mul_scalar(w, 0.5), cx_add_scalar(cx_erf(cx_mul_scalar(w, M_SQRT1_2)), 1.0));
    cr_assert_eq(cx_to_host(ref, f32_out, CX_F32), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_to_host(old, composite, CX_F32), CX_OK, "%s", cx_last_error());
    end_ok();
    for (int i = 0; i < N; i++)
        cr_assert(memcmp(&f32_out[i], &composite[i], sizeof(float)) == 0, "f32 gelu(%g) = %.9g, the composite %.9g",
                  (double)wide[i], (double)f32_out[i], (double)composite[i]);
    cx_tensor *p = cx_requires_grad(cx_persist(tbf16(x, s, 1)), true);
    cx_step_begin();
    cx_tensor *y = cx_keep(cx_gelu(p, false));
    cr_assert_eq(cx_dtype_of(y), CX_BF16);
    cr_assert_eq(cx_backward(cx_sum(cx_cast(y, CX_F32), NULL, 0, false)), CX_OK, "%s", cx_last_error());
    end_ok();
    cr_assert_eq(cx_to_host(y, got, CX_F32), CX_OK, "%s", cx_last_error());
    cx_free(y);
    cr_assert_eq(cx_to_host(cx_grad(p), grad, CX_F32), CX_OK, "%s", cx_last_error());
    for (int i = 0; i < N; i++) {
        float want = cx_bf16_to_f32(cx_f32_to_bf16(f32_out[i]));
        cr_assert(memcmp(&got[i], &want, sizeof want) == 0, "gelu(%g) = %.9g, want %.9g", (double)wide[i],
                  (double)got[i], (double)want);
        double v = wide[i], d = 0.5 * (1.0 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI);
        cr_assert(fabs(grad[i] - d) <= ldexp(fabs(d), -7) + 1e-6, "gelu'(%g) = %.9g, want %.9g", v, (double)grad[i], d);
    }
    cx_free(p);
    free(xf);
    free(x);
}

/* A bf16 erf, exp, log, tanh, GELU or GELU gradient of bf16 values reads
 * a table of every input's result (kernels/bf16_lut.c). Over all 65536
 * bit patterns (NaNs, infs and denormals among them), and a ragged block
 * after, each gives the f32 op's result rounded, bit for bit. */
static cx_tensor *gelu_exact(cx_tensor *x) { return cx_gelu(x, false); }

Test(ops_bf16, unary_tables_give_every_bf16_value_the_f32_ops_bits_rounded)
{
    enum { N = 65536 + 37 };
    cx_tensor *(*const ops[])(cx_tensor *) = { cx_exp, cx_log, cx_tanh, cx_erf, gelu_exact };
    const char *names[] = { "exp", "log", "tanh", "erf", "gelu" };
    uint16_t *x = malloc(sizeof *x * N), *got = malloc(sizeof *got * N);
    float *wide = malloc(sizeof *wide * N), *f32 = malloc(sizeof *f32 * N);
    cr_assert(x && got && wide && f32);
    for (int i = 0; i < N; i++) {
        x[i] = (uint16_t)(i * 40503u);   /* every pattern once in the first 65536 (40503 is odd) */
        wide[i] = cx_bf16_to_f32(x[i]);
    }
    const int64_t s[] = { N };
    for (size_t o = 0; o <= sizeof ops / sizeof *ops; o++) {
        const bool grad = o == sizeof ops / sizeof *ops;   /* the last: GELU's gradient */
        cx_tensor *pb = cx_requires_grad(cx_persist(tbf16(x, s, 1)), grad);
        cx_tensor *pf = cx_requires_grad(cx_persist(tf32(wide, s, 1)), grad);
        cx_step_begin();
        cx_tensor *yb = grad ? cx_gelu(pb, false) : ops[o](pb), *yf = grad ? cx_gelu(pf, false) : ops[o](pf);
        cr_assert_eq(cx_dtype_of(yb), CX_BF16);
        if (grad) {
            cr_assert_eq(cx_backward(cx_sum(cx_cast(yb, CX_F32), NULL, 0, false)), CX_OK, "%s", cx_last_error());
            cr_assert_eq(cx_backward(cx_sum(yf, NULL, 0, false)), CX_OK, "%s", cx_last_error());
        } else {
            cr_assert_eq(cx_to_host(yb, got, CX_BF16), CX_OK, "%s", cx_last_error());
            cr_assert_eq(cx_to_host(yf, f32, CX_F32), CX_OK, "%s", cx_last_error());
        }
        end_ok();
        if (grad) {
            cr_assert_eq(cx_to_host(cx_grad(pb), got, CX_BF16), CX_OK, "%s", cx_last_error());
            cr_assert_eq(cx_to_host(cx_grad(pf), f32, CX_F32), CX_OK, "%s", cx_last_error());
        }
        const char *name = grad ? "gelu'" : names[o];
        for (int i = 0; i < N; i++)
            cr_assert_eq(got[i], cx_f32_to_bf16(f32[i]), "bf16 %s(0x%04x) = 0x%04x, the f32 one rounded 0x%04x", name,
                         x[i], got[i], cx_f32_to_bf16(f32[i]));
        cx_free(pb);
        cx_free(pf);
    }
    free(x);
    free(got);
    free(wide);
    free(f32);
}

/* ---- folded epilogues in bf16 ---- */

static cx_tensor *persist_bf16(const float *v, const int64_t *shape, int nd, int64_t n, bool grad)
{
    uint16_t *h = to_bf16(v, n);
    cx_tensor *t = cx_persist(tbf16(h, shape, nd));
    free(h);
    return grad ? cx_requires_grad(t, true) : t;
}

static uint16_t *read_bf16(cx_tensor *t, int64_t n)
{
    uint16_t *h = malloc(sizeof *h * (size_t)n);
    cr_assert(h);
    cr_assert_eq(cx_to_host(t, h, CX_BF16), CX_OK, "%s", cx_last_error());
    return h;
}

/* The bf16 kernels apply a folded epilogue exactly as the program they
 * replace would, bit for bit (test_passes_codegen checks what folds):
 *  - forward: relu(conv(x, w) + cast(b, bf16)), the f32 bias cast in the
 *    program, folds; the same with the bias already bf16 in memory stays
 *    a program, and the two give the same bits;
 *  - relu's gradient through a conv input gradient and a max-pool
 *    backward: where(relu(z) > 0, g, 0) folds; it must equal the unmasked
 *    gradient (a step where relu's output is a leaf) masked on the host.
 * Two convs: 3x3 with 8 channels each way (Winograd's shape: the widening
 * route) and 1x1 with 32 -> 48 (the GEMM route where the CPU has
 * AVX512_BF16). */
static void folds_match(int64_t c, int64_t o, int64_t k, unsigned seed)
{
    enum { NB = 2, HW = 10 };
    const int64_t oh = HW - k + 1, ph = oh / 2;
    const int64_t sx[] = { NB, c, HW, HW }, sw[] = { o, c, k, k }, sb[] = { o }, sg[] = { NB, o, ph, ph };
    const int64_t nx = NB * c * HW * HW, nw = o * c * k * k, ny = NB * o * oh * oh, np = NB * o * ph * ph;
    rng_seed(seed);
    float *z = rand_f32(nx, -1, 1), *w = rand_f32(nw, -1, 1), *b = rand_f32(o, -0.5f, 0.5f), *g = rand_f32(np, -1, 1);
    cx_tensor *Z = persist_bf16(z, sx, 4, nx, true), *W = persist_bf16(w, sw, 4, nw, false);
    cx_tensor *B = cx_persist(tf32(b, sb, 1)), *Bb = persist_bf16(b, sb, 1, o, false);
    cx_tensor *G = cx_persist(tf32(g, sg, 4));
    /* folded: y = relu(conv(relu(z), w, b)), pooled; the loss's gradient
     * reaches z through the pool's and the conv's folded masks */
    cx_step_begin();
    cx_tensor *x = cx_relu(Z);
    cx_tensor *y = cx_keep(cx_relu(cx_conv2d(x, W, cx_cast(B, CX_BF16), 1, 1, 0, 0, 1, 1, 1)));
    cx_tensor *p = cx_max_pool2d(y, 2, 2, 2, 2, 0, 0);
    cr_assert_eq(cx_backward(cx_sum(cx_mul(cx_cast(p, CX_F32), G), NULL, 0, false)), CX_OK, "%s", cx_last_error());
    end_ok();
    uint16_t *y_fold = read_bf16(y, ny), *dz_fold = read_bf16(cx_grad(Z), nx);
    /* programs: the bias already bf16; relu's outputs as leaves */
    cx_step_begin();
    cx_tensor *xr = cx_keep(cx_relu(Z));
    cx_tensor *y2 = cx_keep(cx_relu(cx_conv2d(xr, W, Bb, 1, 1, 0, 0, 1, 1, 1)));
    end_ok();
    uint16_t *y_prog = read_bf16(y2, ny), *xh = read_bf16(xr, nx), *yh = read_bf16(y2, ny);
    for (int64_t i = 0; i < ny; i++)
        cr_assert_eq(y_fold[i], y_prog[i], "conv %lldx%lld, y[%lld]: folded %#x, program %#x", (long long)k,
                     (long long)k, (long long)i, y_fold[i], y_prog[i]);
    cx_tensor *X = cx_requires_grad(cx_persist(cx_alias(xr)), true), *Y = cx_requires_grad(cx_persist(cx_alias(y2)), true);
    cx_step_begin();
    cr_assert_eq(cx_backward(cx_sum(cx_mul(cx_cast(cx_max_pool2d(Y, 2, 2, 2, 2, 0, 0), CX_F32), G), NULL, 0, false)),
                 CX_OK, "%s", cx_last_error());
    end_ok();
    uint16_t *dy = read_bf16(cx_grad(Y), ny);
    /* the pool's gradient masked by relu(conv) > 0, then through the conv */
    for (int64_t i = 0; i < ny; i++) dy[i] = cx_bf16_to_f32(yh[i]) > 0 ? dy[i] : 0;
    cx_tensor *DY = cx_persist(tbf16(dy, (const int64_t[]){ NB, o, oh, oh }, 4));
    cx_step_begin();
    cr_assert_eq(cx_backward(cx_sum(cx_mul(cx_cast(cx_conv2d(X, W, NULL, 1, 1, 0, 0, 1, 1, 1), CX_F32),
                                           cx_cast(DY, CX_F32)), NULL, 0, false)),
                 CX_OK, "%s", cx_last_error());
    end_ok();
    uint16_t *dx = read_bf16(cx_grad(X), nx);
    for (int64_t i = 0; i < nx; i++) {
        uint16_t want = cx_bf16_to_f32(xh[i]) > 0 ? dx[i] : 0;
        cr_assert_eq(dz_fold[i], want, "conv %lldx%lld, dz[%lld]: folded %#x, masked %#x", (long long)k, (long long)k,
                     (long long)i, dz_fold[i], want);
    }
    cx_free(Z); cx_free(W); cx_free(B); cx_free(Bb); cx_free(G); cx_free(X); cx_free(Y); cx_free(DY);
    cx_free(y); cx_free(xr); cx_free(y2);
    free(z); free(w); free(b); free(g); free(y_fold); free(dz_fold); free(y_prog); free(xh); free(yh); free(dy); free(dx);
}

Test(ops_bf16, conv_and_pool_epilogues_folded_in_bf16)
{
    folds_match(8, 8, 3, 31);
    folds_match(32, 48, 1, 32);
}

/* ---- autocast's Linear bias, folded into the bf16 matmul ---- */

/* Whether a program dumped into dir has a matmul line of `kind` (its
 * output's dtype and shape follow) whose path says `path`; removes the
 * dumps and dir. */
static bool dumped_matmul(const char *dir, const char *kind, const char *path)
{
    bool found = false;
    DIR *d = opendir(dir);
    cr_assert(d, "no dump directory %s", dir);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char file[1024], line[4096];
        snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
        FILE *f = fopen(file, "r");
        while (f && fgets(line, sizeof line, f))
            if (strstr(line, kind) && strstr(line, path)) found = true;
        if (f) fclose(f);
        remove(file);
    }
    closedir(d);
    rmdir(dir);
    return found;
}

/* programs dumped into a fresh directory, its name in dir, until
 * dump_stop() */
static void dump_into(char *dir, size_t size)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, size, "%s/cxla_fold_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert(mkdtemp(dir), "mkdtemp %s failed", dir);   /* it replaces the template's X's */
    setenv("CX_DUMP_DIR", dir, 1);
    cx_debug_reload_env();
}

static void dump_stop(void)
{
    unsetenv("CX_DUMP_DIR");
    cx_debug_reload_env();
}

/* y = matmul(x, w^T) + cast(b, bf16) [then relu], the f32 bias cast in the
 * graph, folds into the bf16 matmul (the dump says so); the same with the
 * bias already bf16 in memory stays a program; the two give the same
 * bits. Shapes: one K block with ragged rows and columns (the micro-tiles
 * that round straight into C and those through the tile), K over one
 * block (through the tile), a batch of sequences, and more columns than
 * one column block of either route (256; 1024 on the f32 route), so the
 * bias is read from a block's own first column; test_ops_bf16_avx2 runs
 * the f32 route. */
static void linear_fold_matches(int64_t batch, int64_t m, int64_t k, int64_t n, bool relu, unsigned seed)
{
    const int64_t rows = batch * m, nx = rows * k, nw = n * k, ny = rows * n;
    const int64_t sx3[] = { batch, m, k }, sw[] = { n, k }, sb[] = { n };
    rng_seed(seed);
    float *x = rand_f32(nx, -1, 1), *w = rand_f32(nw, -1, 1), *b = rand_f32(n, -2, 2);
    cx_tensor *X = persist_bf16(x, batch > 1 ? sx3 : sx3 + 1, batch > 1 ? 3 : 2, nx, false);
    cx_tensor *W = persist_bf16(w, sw, 2, nw, false), *Bb = persist_bf16(b, sb, 1, n, false);
    cx_tensor *B = cx_persist(tf32(b, sb, 1));
    char dir[512];
    dump_into(dir, sizeof dir);
    cx_step_begin();
    cx_tensor *y = cx_add(cx_matmul(X, cx_transpose(W, 0, 1)), cx_cast(B, CX_BF16));
    if (relu) y = cx_relu(y);
    uint16_t *fold = read_bf16(y, ny);
    end_ok();
    dump_stop();
    cr_assert(dumped_matmul(dir, " matmul bf16", "epilogue fused: bias"), "(%lld x %lld) x (%lld x %lld): the bias did not fold into the matmul", (long long)rows,
              (long long)k, (long long)k, (long long)n);
    cx_step_begin();
    cx_tensor *y2 = cx_add(cx_matmul(X, cx_transpose(W, 0, 1)), Bb);
    if (relu) y2 = cx_relu(y2);
    uint16_t *prog = read_bf16(y2, ny);
    end_ok();
    for (int64_t i = 0; i < ny; i++)
        cr_assert_eq(fold[i], prog[i], "(%lld x %lld) x (%lld x %lld)%s, y[%lld]: folded %#x, program %#x",
                     (long long)rows, (long long)k, (long long)k, (long long)n, relu ? ", relu" : "", (long long)i,
                     fold[i], prog[i]);
    cx_free(X); cx_free(W); cx_free(B); cx_free(Bb);
    free(x); free(w); free(b); free(fold); free(prog);
}

Test(ops_bf16, linear_bias_folded_in_bf16)
{
    linear_fold_matches(1, 30, 24, 40, false, 41);
    linear_fold_matches(1, 36, 64, 64, true, 42);
    linear_fold_matches(1, 26, 600, 70, false, 43);
    linear_fold_matches(2, 13, 48, 33, true, 44);
    linear_fold_matches(1, 24, 40, 300, true, 45);
    linear_fold_matches(1, 13, 520, 300, false, 46);
    linear_fold_matches(1, 12, 16, 1100, false, 47);
}

/* The same fold in f32: matmul(x, w^T) + b, then relu (epi 1) or added
 * into a residual r (epi 2, r + (xw^T + b), as a transformer block's
 * projection adds into its stream), folds into the matmul (the dump says
 * so) and gives the bits of the program over the matmul's output computed
 * in a step of its own. */
static void linear_f32_fold_matches(int64_t batch, int64_t m, int64_t k, int64_t n, int epi, unsigned seed)
{
    static const char *const path[] = { "epilogue fused: bias\n", "epilogue fused: bias+relu", "epilogue fused: bias+addend" };
    const int64_t rows = batch * m, nx = rows * k, nw = n * k, ny = rows * n;
    const int64_t sx3[] = { batch, m, k }, sy3[] = { batch, m, n }, sw[] = { n, k }, sb[] = { n };
    const int nd = batch > 1 ? 3 : 2;
    rng_seed(seed);
    float *x = rand_f32(nx, -1, 1), *w = rand_f32(nw, -1, 1), *b = rand_f32(n, -2, 2), *r = rand_f32(ny, -3, 3);
    cx_tensor *X = cx_persist(tf32(x, batch > 1 ? sx3 : sx3 + 1, nd)), *W = cx_persist(tf32(w, sw, 2));
    cx_tensor *B = cx_persist(tf32(b, sb, 1)), *R = cx_persist(tf32(r, batch > 1 ? sy3 : sy3 + 1, nd));
    char dir[512];
    dump_into(dir, sizeof dir);
    cx_step_begin();
    cx_tensor *y = cx_add(cx_matmul(X, cx_transpose(W, 0, 1)), B);
    y = epi == 1 ? cx_relu(y) : epi == 2 ? cx_add(R, y) : y;
    float *fold = fetch_f32("folded", y);
    end_ok();
    dump_stop();
    cr_assert(dumped_matmul(dir, " matmul f32", path[epi]), "(%lld x %lld) x (%lld x %lld): the epilogue %d did not fold",
              (long long)rows, (long long)k, (long long)k, (long long)n, epi);
    cx_step_begin();
    cx_tensor *p = cx_keep(cx_matmul(X, cx_transpose(W, 0, 1)));
    end_ok();
    cx_step_begin();
    cx_tensor *y2 = cx_add(p, B);
    y2 = epi == 1 ? cx_relu(y2) : epi == 2 ? cx_add(R, y2) : y2;
    float *prog = fetch_f32("program", y2);
    end_ok();
    cr_assert_eq(memcmp(fold, prog, sizeof *fold * (size_t)ny), 0, "(%lld x %lld) x (%lld x %lld), epilogue %d: bits differ",
                 (long long)rows, (long long)k, (long long)k, (long long)n, epi);
    cx_free(p); cx_free(X); cx_free(W); cx_free(B); cx_free(R);
    free(x); free(w); free(b); free(r); free(fold); free(prog);
}

/* one product on OpenBLAS, one on oneDNN (with AVX-512), a batch, and
 * ragged column counts */
Test(ops_bf16, linear_epilogues_folded_in_f32)
{
    for (int epi = 0; epi < 3; epi++) {
        linear_f32_fold_matches(1, 30, 24, 40, epi, 51 + (unsigned)epi);
        linear_f32_fold_matches(1, 256, 256, 300, epi, 54 + (unsigned)epi);
        linear_f32_fold_matches(2, 13, 48, 33, epi, 57 + (unsigned)epi);
    }
}

/* ---- a bf16 matmul's cast to f32, folded into it ---- */

/* cast(matmul(x, w^T), f32), the matmul read by the cast alone (a
 * gradient going on into an f32 layer, a weight's gradient to its f32
 * master): the matmul writes its f32 sums unrounded (the dump says so).
 * Those sums rounded are the bf16 matmul's result bit for bit, and they
 * are within the f32 sums' error of a double reference, far inside the
 * 2^-9 |y| a rounding to bf16 moves most values by. One K block with
 * ragged tiles, K over a block, a batch; test_ops_bf16_avx2 runs the f32
 * route. */
static void cast_fold_matches(int64_t batch, int64_t m, int64_t k, int64_t n, unsigned seed)
{
    const int64_t rows = batch * m, nx = rows * k, nw = n * k, ny = rows * n;
    const int64_t sx3[] = { batch, m, k }, sw[] = { n, k };
    rng_seed(seed);
    float *x = rand_f32(nx, -1, 1), *w = rand_f32(nw, -1, 1);
    cx_tensor *X = persist_bf16(x, batch > 1 ? sx3 : sx3 + 1, batch > 1 ? 3 : 2, nx, false);
    cx_tensor *W = persist_bf16(w, sw, 2, nw, false);
    char dir[512];
    dump_into(dir, sizeof dir);
    cx_step_begin();
    cx_tensor *y = cx_keep(cx_cast(cx_matmul(X, cx_transpose(W, 0, 1)), CX_F32));
    end_ok();
    dump_stop();
    float *got = malloc(sizeof *got * (size_t)ny);
    cr_assert(got);
    cr_assert_eq(cx_to_host(y, got, CX_F32), CX_OK, "%s", cx_last_error());
    cx_free(y);
    cr_assert(dumped_matmul(dir, " matmul f32", "f32 sums out"), "(%lld x %lld) x (%lld x %lld): the cast did not fold",
              (long long)rows, (long long)k, (long long)k, (long long)n);
    cx_step_begin();
    uint16_t *bf = read_bf16(cx_matmul(X, cx_transpose(W, 0, 1)), ny);
    end_ok();
    uint16_t *xb = to_bf16(x, nx), *wb = to_bf16(w, nw);
    int64_t moved = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t q = 0; q < k; q++) {
                double t = (double)cx_bf16_to_f32(xb[i * k + q]) * cx_bf16_to_f32(wb[j * k + q]);
                ref += t;
                mag += fabs(t);
            }
            float g = got[i * n + j];
            cr_assert(fabs(g - ref) <= 1e-6 * mag, "y[%lld][%lld] = %.9g, want %.9g", (long long)i, (long long)j, (double)g,
                      ref);
            cr_assert_eq(cx_f32_to_bf16(g), bf[i * n + j], "y[%lld][%lld] = %.9g rounds to %#x, the bf16 matmul %#x",
                         (long long)i, (long long)j, (double)g, cx_f32_to_bf16(g), bf[i * n + j]);
            moved += cx_bf16_to_f32(bf[i * n + j]) != g;
        }
    cr_assert(moved > ny / 2, "only %lld of %lld sums differ from their bf16 rounding", (long long)moved, (long long)ny);
    cx_free(X); cx_free(W);
    free(x); free(w); free(xb); free(wb); free(got); free(bf);
}

Test(ops_bf16, cast_to_f32_folded_into_the_matmul)
{
    cast_fold_matches(1, 30, 24, 40, 51);
    cast_fold_matches(1, 26, 600, 70, 52);
    cast_fold_matches(2, 13, 48, 33, 53);
}

/* ---- autocast's layer norm before a bf16 product: the cast folded ---- */

/* cast(layer_norm(x, w, b), bf16), the cast its only reader, folds into
 * the norm, which rounds as it writes (the dump says so): the bits of the
 * f32 norm's output (a step that keeps it) rounded on the host. Rows of
 * 256 (whole lanes) and 37 (a ragged tail), a NaN and an inf in a row
 * (NaN rows, which must stay NaN), a row of huge values and one constant
 * row (its values the bias); w and b keep the outputs off bf16's grid. */
static void norm_fold_matches(int64_t rows, int64_t c, unsigned seed)
{
    const int64_t n = rows * c, sx[] = { rows, c }, sc[] = { c };
    rng_seed(seed);
    float *x = rand_f32(n, -3, 3), *w = rand_f32(c, 0.5, 1.5), *b = rand_f32(c, -1, 1);
    x[1 * c + 3] = NAN;
    x[2 * c + c - 1] = INFINITY;
    for (int64_t e = 0; e < c; e++) x[3 * c + e] *= 1e30f;
    for (int64_t e = 0; e < c; e++) x[4 * c + e] = 0.75f;
    cx_tensor *X = cx_persist(tf32(x, sx, 2)), *W = cx_persist(tf32(w, sc, 1)), *B = cx_persist(tf32(b, sc, 1));
    char dir[512];
    dump_into(dir, sizeof dir);
    cx_step_begin();
    uint16_t *fold = read_bf16(cx_cast(cx_layer_norm(X, 1, W, B, 1e-5), CX_BF16), n);
    end_ok();
    dump_stop();
    cr_assert(dumped_matmul(dir, " layer_norm bf16", "fused kernel"), "(%lld, %lld): the cast did not fold into the norm",
              (long long)rows, (long long)c);
    cx_step_begin();
    cx_tensor *y = cx_keep(cx_layer_norm(X, 1, W, B, 1e-5));
    end_ok();
    float *f32 = malloc(sizeof *f32 * (size_t)n);
    cr_assert(f32);
    cr_assert_eq(cx_to_host(y, f32, CX_F32), CX_OK, "%s", cx_last_error());
    cx_free(y);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(fold[i], cx_f32_to_bf16(f32[i]), "(%lld, %lld), y[%lld]: folded %#x, the f32 norm's %.9g rounds to %#x",
                     (long long)rows, (long long)c, (long long)i, fold[i], (double)f32[i], cx_f32_to_bf16(f32[i]));
    for (int64_t e = 0; e < c; e++) cr_assert(isnan(cx_bf16_to_f32(fold[1 * c + e])), "a NaN's row is NaN");
    cx_free(X); cx_free(W); cx_free(B);
    free(x); free(w); free(b); free(fold); free(f32);
}

Test(ops_bf16, layer_norm_takes_its_cast_to_bf16)
{
    norm_fold_matches(40, 256, 61);
    norm_fold_matches(23, 37, 62);
}

/* A bf16 product over an empty K is zeros, and with a folded bias the
 * bias rounded to bf16 (no scratch is planned for it). */
Test(ops_bf16, empty_k_matmul_is_zeros_then_the_bias)
{
    const int64_t sx[] = { 4, 0 }, sw[] = { 3, 0 }, sb[] = { 3 };
    const float b[3] = { 0.5f, -1.25f, 3.0f };
    uint16_t none[1] = { 0 };
    cx_step_begin();
    cx_tensor *X = tbf16(none, sx, 2), *W = tbf16(none, sw, 2);
    cx_tensor *y = cx_matmul(X, cx_transpose(W, 0, 1));
    cx_tensor *z = cx_add(cx_matmul(X, cx_transpose(W, 0, 1)), cx_cast(tf32(b, sb, 1), CX_BF16));
    uint16_t *gy = read_bf16(y, 12), *gz = read_bf16(z, 12);
    end_ok();
    for (int i = 0; i < 12; i++) {
        cr_assert_eq(gy[i], 0, "y[%d] = %#x, want 0", i, gy[i]);
        cr_assert_eq(gz[i], cx_f32_to_bf16(b[i % 3]), "z[%d] = %#x, want the bias %g", i, gz[i], b[i % 3]);
    }
    free(gy); free(gz);
}

/* A sum of a bf16 tensor over its leading and trailing axes (a conv's bias
 * gradient, (N, C, H, W) -> (C)) reads the bf16 rows in place: the sums
 * of these values are exact in double whatever the order, so the result
 * must be that exact sum rounded through f32 to bf16, to the bit, for
 * rows shorter than a vector and longer than a block. */
Test(ops_bf16, sums_over_bf16_rows_are_exact_then_rounded)
{
    const int64_t shapes[][4] = { { 3, 5, 7, 9 }, { 2, 3, 2, 600 } };
    for (int si = 0; si < 2; si++) {
        const int64_t *sh = shapes[si], n = sh[0] * sh[1] * sh[2] * sh[3];
        float *x = malloc(sizeof *x * (size_t)n);
        cr_assert(x);
        srand(7 + si);
        for (int64_t i = 0; i < n; i++) x[i] = (float)(rand() % 2001 - 1000) / 256.0f;
        uint16_t *h = to_bf16(x, n), got[8];
        cx_step_begin();
        const int axes[3] = { 0, 2, 3 };
        cx_tensor *s = cx_sum(tbf16(h, sh, 4), axes, 3, false);
        cr_assert_eq(cx_to_host(s, got, CX_BF16), CX_OK, "%s", cx_last_error());
        end_ok();
        for (int64_t c = 0; c < sh[1]; c++) {
            double exact = 0;
            for (int64_t a = 0; a < sh[0]; a++)
                for (int64_t q = 0; q < sh[2] * sh[3]; q++) exact += cx_bf16_to_f32(h[(a * sh[1] + c) * sh[2] * sh[3] + q]);
            cr_assert_eq(got[c], cx_f32_to_bf16((float)exact), "shape %d, channel %lld: %g, want %g", si, (long long)c,
                         cx_bf16_to_f32(got[c]), exact);
        }
        free(x);
        free(h);
    }
}

/* A fused program rounds f32 values to bf16 in a cast (cast_block), as an
 * intermediate or as its result, and must give cx_f32_to_bf16's bits for
 * every value: NaNs whose low bits would carry round to nearest even into
 * the sign or the exponent (0x7fffffff would become -0, 0x7f80ffff
 * inf's neighbour), ties both ways, values that round up to inf, -0. The
 * f32 add keeps each value (x + 0, with a zero tensor, so no fold) and
 * makes the cast part of an interpreted program rather than a plain cast
 * kernel; the product by a bf16 one, read first, has the cast in its own
 * program, rounded in the program's loop, and the product in its store. */
Test(ops_bf16, fused_casts_round_nans_ties_and_overflow_bit_for_bit)
{
    static const uint32_t bits[] = { 0x7fffffffu, 0xffffffffu, 0x7fc0ffffu, 0x7f80ffffu, 0xff80ffffu, 0x3f808000u,
                                     0x3f818000u, 0x3f80ffffu, 0x3f807fffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
                                     0x80000000u, 0x00000000u, 0x00018000u, 0x80008000u };
    enum { N = sizeof bits / sizeof *bits };
    float x[N], zero[N] = { 0 }, sums[N];
    uint16_t ones[N], cast[N], prod[N];
    for (int i = 0; i < N; i++) {
        memcpy(&x[i], &bits[i], sizeof x[i]);
        sums[i] = x[i] + zero[i];
        ones[i] = cx_f32_to_bf16(1.0f);
    }
    const int64_t s[] = { N };
    cx_step_begin();
    cx_tensor *c = cx_cast(cx_add(tf32(x, s, 1), tf32(zero, s, 1)), CX_BF16);
    cx_tensor *p = cx_mul(c, tbf16(ones, s, 1));
    cr_assert_eq(cx_to_host(p, prod, CX_BF16), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_to_host(c, cast, CX_BF16), CX_OK, "%s", cx_last_error());
    end_ok();
    for (int i = 0; i < N; i++) {
        uint16_t want = cx_f32_to_bf16(sums[i]);
        uint16_t want_prod = cx_f32_to_bf16(cx_bf16_to_f32(want) * 1.0f);
        cr_assert_eq(prod[i], want_prod, "cast of 0x%08x times 1: 0x%04x, want 0x%04x", bits[i], prod[i], want_prod);
        cr_assert_eq(cast[i], want, "cast of 0x%08x: 0x%04x, want 0x%04x", bits[i], cast[i], want);
    }
}
