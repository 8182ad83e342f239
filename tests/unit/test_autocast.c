/* Autocast (cx_autocast_begin / end): which ops take bf16, which stay f32,
 * nesting, gradients reaching f32 parameters, and a region left open at
 * cx_step_end. Public API only. */
#include <criterion/criterion.h>
#include <cxla/cxla.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float rb(float x) { return cx_bf16_to_f32(cx_f32_to_bf16(x)); }

static cx_tensor *mat(const float *v, int64_t r, int64_t c)
{
    int64_t s[2] = { r, c };
    return cx_from_host(v, s, 2, CX_F32);
}

/* values whose products need more than bf16's 8 bits, so a matmul in f32
 * and one on bf16-rounded operands differ */
static void fill(float *v, int n, float base)
{
    for (int i = 0; i < n; i++) v[i] = base + 0.01234567f * (float)i - 0.00071f * (float)(i * i % 7);
}

Test(autocast, matmul_takes_bf16_operands_and_gives_bf16)
{
    float a[2 * 3], b[3 * 2], out[4];
    fill(a, 6, 0.3f); fill(b, 6, -0.7f);
    cx_step_begin();
    cx_tensor *A = mat(a, 2, 3), *B = mat(b, 3, 2);
    cr_assert_eq(cx_autocast_dtype(), CX_F32);
    cr_assert_eq(cx_autocast_begin(CX_BF16), CX_OK);
    cr_expect_eq(cx_autocast_dtype(), CX_BF16);
    cx_tensor *y = cx_keep(cx_matmul(A, B));
    cr_assert_eq(cx_autocast_end(), CX_OK);
    cx_tensor *yf = cx_keep(cx_matmul(A, B));
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cr_expect_eq(cx_dtype_of(y), CX_BF16, "matmul under autocast gave %s", cx_dtype_name(cx_dtype_of(y)));
    cr_expect_eq(cx_dtype_of(yf), CX_F32, "matmul after the region gave %s", cx_dtype_name(cx_dtype_of(yf)));
    cr_assert_eq(cx_to_host(y, out, CX_F32), CX_OK, "%s", cx_last_error());
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            float acc = 0;
            for (int k = 0; k < 3; k++) acc += rb(a[i * 3 + k]) * rb(b[k * 2 + j]);
            /* operands rounded to bf16, summed in f32, the result rounded once */
            cr_expect_eq(out[i * 2 + j], rb(acc), "y[%d,%d] = %.8g, want %.8g", i, j, out[i * 2 + j], rb(acc));
        }
}

Test(autocast, f32_list_casts_bf16_inputs_up)
{
    float a[2 * 4];
    fill(a, 8, 0.1f);
    cx_step_begin();
    int64_t s[2] = { 2, 4 };
    cx_tensor *x = cx_from_host(a, s, 2, CX_F32);
    cx_tensor *xb = cx_cast(x, CX_BF16);
    cr_assert_eq(cx_autocast_begin(CX_BF16), CX_OK);
    cx_tensor *outs[] = { cx_softmax(xb, 1), cx_log_softmax(xb, 1), cx_sum(xb, NULL, 0, false),
                          cx_mean(xb, NULL, 0, false), cx_exp(xb), cx_log(xb), cx_logsumexp(xb, 1, false),
                          cx_layer_norm(xb, 1, NULL, NULL, 1e-5), cx_mse_loss(xb, xb, CX_REDUCE_MEAN) };
    cx_tensor *kept = cx_relu(xb); /* on neither list: the input's dtype */
    cx_tensor *mx = cx_max(xb, NULL, 0, false);
    cr_assert_eq(cx_autocast_end(), CX_OK);
    cx_tensor *outside = cx_softmax(xb, 1);
    for (size_t i = 0; i < sizeof outs / sizeof *outs; i++)
        cr_expect_eq(cx_dtype_of(outs[i]), CX_F32, "f32-list op %zu gave %s", i, cx_dtype_name(cx_dtype_of(outs[i])));
    cr_expect_eq(cx_dtype_of(kept), CX_BF16);
    cr_expect_eq(cx_dtype_of(mx), CX_BF16);
    cr_expect_eq(cx_dtype_of(outside), CX_BF16, "outside a region softmax keeps bf16");
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
}

Test(autocast, conv_and_attention_take_bf16)
{
    cx_step_begin();
    int64_t xs[4] = { 1, 2, 5, 5 }, ws[4] = { 3, 2, 3, 3 }, bs[1] = { 3 }, qs[4] = { 1, 2, 4, 8 };
    cx_tensor *x = cx_randn(xs, 4, 0, 1, CX_F32), *w = cx_randn(ws, 4, 0, 1, CX_F32), *b = cx_randn(bs, 1, 0, 1, CX_F32);
    cx_tensor *q = cx_randn(qs, 4, 0, 1, CX_F32), *k = cx_randn(qs, 4, 0, 1, CX_F32), *v = cx_randn(qs, 4, 0, 1, CX_F32);
    cr_assert_eq(cx_autocast_begin(CX_BF16), CX_OK);
    cx_tensor *y = cx_keep(cx_conv2d(x, w, b, 1, 1, 1, 1, 1, 1, 1));
    cx_tensor *o = cx_keep(cx_scaled_dot_product_attention(q, k, v, true, 0));
    cx_tensor *o32 = cx_keep(cx_scaled_dot_product_attention(cx_cast(q, CX_BF16), cx_cast(k, CX_BF16), cx_cast(v, CX_BF16), true, 0));
    cr_assert_eq(cx_autocast_end(), CX_OK);
    cx_tensor *ref = cx_keep(cx_scaled_dot_product_attention(q, k, v, true, 0));
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cr_expect_eq(cx_dtype_of(y), CX_BF16);
    cr_expect_eq(cx_dtype_of(o), CX_BF16);
    cr_expect_eq(cx_dtype_of(o32), CX_BF16);
    float ob[64], of[64];
    cr_assert_eq(cx_to_host(o, ob, CX_F32), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_to_host(ref, of, CX_F32), CX_OK, "%s", cx_last_error());
    /* attention's outputs are averages of values of magnitude ~1: inputs and
     * output rounded to bf16 (relative 2^-9 each) keep them within 0.03 */
    for (int i = 0; i < 64; i++) cr_expect(fabsf(ob[i] - of[i]) < 0.03f, "o[%d] %g vs f32 %g", i, ob[i], of[i]);
}

Test(autocast, nesting_and_bad_calls)
{
    cr_expect_eq(cx_autocast_end(), CX_ERR_STATE);
    cr_expect(strstr(cx_last_error(), "no autocast region is open"), "%s", cx_last_error());
    cr_expect_eq(cx_autocast_begin(CX_I32), CX_ERR_ARG);
    cr_expect(strstr(cx_last_error(), "i32"), "%s", cx_last_error());
    cr_assert_eq(cx_autocast_begin(CX_BF16), CX_OK);
    cr_assert_eq(cx_autocast_begin(CX_F32), CX_OK);
    cr_expect_eq(cx_autocast_dtype(), CX_F32, "an inner f32 region turns autocast off");
    float a[4] = { 1, 2, 3, 4 };
    cx_step_begin();
    cx_tensor *A = mat(a, 2, 2);
    cx_tensor *off = cx_matmul(A, A);
    cr_assert_eq(cx_autocast_end(), CX_OK);
    cr_expect_eq(cx_autocast_dtype(), CX_BF16, "the outer region resumes");
    cx_tensor *on = cx_matmul(A, A);
    cr_expect_eq(cx_dtype_of(off), CX_F32);
    cr_expect_eq(cx_dtype_of(on), CX_BF16);
    /* a region opened outside the step may stay open across its end */
    cr_expect_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_autocast_end(), CX_OK);
    for (int i = 0; i < 16; i++) cr_assert_eq(cx_autocast_begin(CX_BF16), CX_OK);
    cr_expect_eq(cx_autocast_begin(CX_BF16), CX_ERR_STATE);
    for (int i = 0; i < 16; i++) cr_assert_eq(cx_autocast_end(), CX_OK);
    cr_expect_eq(cx_autocast_dtype(), CX_F32);
}

Test(autocast, region_left_open_at_step_end)
{
    cx_step_begin();
    float a[4] = { 1, 2, 3, 4 };
    cx_tensor *A = mat(a, 2, 2);
    cr_assert_eq(cx_autocast_begin(CX_BF16), CX_OK);
    cx_tensor *y = cx_keep(cx_sum(cx_matmul(A, A), NULL, 0, false));
    cr_expect_eq(cx_step_end(), CX_ERR_STATE);
    cr_expect(strstr(cx_last_error(), "cx_step_end: 1 autocast region (bf16) opened in this step is still open"),
              "%s", cx_last_error());
    cr_expect_eq(cx_autocast_dtype(), CX_F32, "the step end closed it");
    cr_expect_float_eq(cx_item(y), 54.0, 1e-6, "the step's graph still ran");
}

/* An outer region closed inside the step and another opened there: the
 * depth at the end is the depth at the start, but the open region is the
 * step's. The line names each open region's dtype, innermost first. */
Test(autocast, region_swapped_inside_a_step_is_still_open)
{
    cr_assert_eq(cx_autocast_begin(CX_F32), CX_OK);
    cx_step_begin();
    cr_assert_eq(cx_autocast_end(), CX_OK);
    cr_assert_eq(cx_autocast_begin(CX_F32), CX_OK);
    cr_assert_eq(cx_autocast_begin(CX_BF16), CX_OK);
    cr_expect_eq(cx_step_end(), CX_ERR_STATE);
    cr_expect(strstr(cx_last_error(), "cx_step_end: 2 autocast regions (bf16, f32) opened in this step are still open"),
              "%s", cx_last_error());
    cr_expect_eq(cx_autocast_dtype(), CX_F32, "the step end closed them");
    cr_expect_eq(cx_autocast_end(), CX_ERR_STATE, "a region is still open");
}

/* loss = sum(x_bf16 @ w_bf16): d/dw = x_bf16^T @ ones, the bf16 matmul's
 * gradient cast back to f32 for the f32 w. The compiler folds that cast
 * into the matmul, which then writes its f32 sums unrounded (PyTorch rounds
 * them to bf16 first): each here the exact sum of three bf16 values. */
Test(autocast, gradient_reaches_f32_parameter)
{
    float xv[3 * 4], wv[4 * 2];
    fill(xv, 12, 0.2f); fill(wv, 8, -0.4f);
    cx_tensor *w = cx_requires_grad(cx_persist(mat(wv, 4, 2)), true);
    for (int inside = 0; inside < 2; inside++) {
        cx_zero_grad(w);
        cx_step_begin();
        cx_tensor *x = mat(xv, 3, 4);
        cr_assert_eq(cx_autocast_begin(CX_BF16), CX_OK);
        cx_tensor *loss = cx_sum(cx_matmul(x, w), NULL, 0, false);
        if (!inside) cr_assert_eq(cx_autocast_end(), CX_OK);
        cr_expect_eq(cx_dtype_of(loss), CX_F32);
        cr_assert_eq(cx_backward(loss), CX_OK, "%s", cx_last_error());
        if (inside) cr_assert_eq(cx_autocast_end(), CX_OK); /* backward inside the region: same gradients */
        cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
        cx_tensor *g = cx_grad(w);
        cr_assert(g);
        cr_expect_eq(cx_dtype_of(g), CX_F32);
        float gv[8];
        cr_assert_eq(cx_to_host(g, gv, CX_F32), CX_OK, "%s", cx_last_error());
        for (int k = 0; k < 4; k++) {
            float acc = 0;
            for (int i = 0; i < 3; i++) acc += rb(xv[i * 4 + k]);
            for (int j = 0; j < 2; j++)
                cr_expect_eq(gv[k * 2 + j], acc, "grad[%d,%d] %.8g, want %.8g", k, j, gv[k * 2 + j], acc);
        }
    }
    cx_free(w);
}

/* The shape autocast casts W at in x W^T, read off the recorded graph:
 * "[2,5]" (W's own, so the cast reads W in order and the matmul reads its
 * output transposed) or "[5,2]" (the permuted view, a transposing copy).
 * The transpose and the matmul are recorded with grad on or off. */
static const char *cast_shape_of_wt(cx_tensor *w, bool view_no_grad, bool matmul_no_grad)
{
    float xv[3 * 5];
    fill(xv, 15, 0.1f);
    cx_step_begin();
    cx_tensor *x = mat(xv, 3, 5);
    if (view_no_grad) cx_no_grad_begin();
    cx_tensor *wt = cx_transpose(w, 0, 1);   // (5, 2)
    if (view_no_grad) cx_no_grad_end();
    if (matmul_no_grad) cx_no_grad_begin();
    cr_assert_eq(cx_autocast_begin(CX_BF16), CX_OK);
    cx_tensor *y = cx_matmul(x, wt);
    cr_assert_eq(cx_autocast_end(), CX_OK);
    if (matmul_no_grad) cx_no_grad_end();
    char *ir = cx_ir_text(&y, 1);
    cr_assert(ir, "%s", cx_last_error());
    const char *shape = strstr(ir, "bf16[2,5] cast(") ? "[2,5]" : strstr(ir, "bf16[5,2] cast(") ? "[5,2]" : "none";
    free(ir);
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    return shape;
}

Test(autocast, transposed_weight_is_cast_in_its_own_layout)
{
    float wv[2 * 5];
    fill(wv, 10, -0.3f);
    cx_tensor *w = cx_requires_grad(cx_persist(mat(wv, 2, 5)), true);
    cr_expect_str_eq(cast_shape_of_wt(w, false, false), "[2,5]", "training");
    /* a Linear's forward under no_grad, as an evaluation runs it */
    cr_expect_str_eq(cast_shape_of_wt(w, true, true), "[2,5]", "evaluation");
    /* a view taken under no_grad and used with grad on is detached: its
     * own cast, so no gradient reaches w through it */
    cr_expect_str_eq(cast_shape_of_wt(w, true, false), "[5,2]", "a detached view");
    cx_free(w);
}
