/* Bad arguments never crash: ops return poisoned tensors whose error names
 * the op and the shapes, poison propagates, cx_sync reports it while it is
 * live, and the process carries on. API calls report cx_status codes. */
#include "ref.h"

#include <pthread.h>

static cx_tensor *zeros2(int64_t a, int64_t b)
{
    const int64_t s[] = { a, b };
    return cx_zeros(s, 2, CX_F32);
}

static cx_tensor *data(const int64_t *shape, int nd)
{
    int64_t n = ref_numel(shape, nd);
    float *d = calloc((size_t)(n ? n : 1), sizeof(float));
    for (int64_t i = 0; i < n; i++) d[i] = (float)(i % 7) - 3.0f;
    cx_tensor *t = tf32(d, shape, nd);
    free(d);
    return t;
}

/* Asserts t is poisoned and both its message and cx_last_error() contain
 * every one of the NULL-terminated needles. */
static void expect_poison(const char *what, cx_tensor *t, ...)
{
    cr_assert(t != NULL, "%s: returned NULL instead of a poisoned tensor", what);
    const char *msg = cx_tensor_error(t);
    cr_assert(msg != NULL, "%s: the result is not poisoned", what);
    const char *last = cx_last_error();
    cr_assert(last != NULL && *last, "%s: cx_last_error() is empty", what);
    va_list ap;
    va_start(ap, t);
    for (const char *needle = va_arg(ap, const char *); needle; needle = va_arg(ap, const char *)) {
        /* non-fatal: report every unhelpful message of a test, not just the first */
        cr_expect(strstr(msg, needle) != NULL, "%s: tensor error \"%s\" does not mention \"%s\"", what, msg, needle);
        cr_expect(strstr(last, needle) != NULL, "%s: cx_last_error \"%s\" does not mention \"%s\"", what, last, needle);
    }
    va_end(ap);
}

Test(errors, add_shape_mismatch)
{
    cx_clear_error();
    cr_assert_str_eq(cx_last_error(), "");
    cx_tensor *a = zeros2(2, 3), *b = zeros2(4, 5);
    cr_assert(cx_tensor_error(a) == NULL && cx_tensor_error(b) == NULL);
    cx_tensor *t = cx_add(a, b);
    expect_poison("add (2,3)+(4,5)", t, "add", "(2, 3)", "(4, 5)", NULL);
    cr_log_info("add error: %s", cx_last_error());
    cx_clear_error();
    cr_assert_str_eq(cx_last_error(), "", "cx_clear_error did not clear");
    /* the poisoned tensor keeps its message after the thread's error is cleared */
    cr_assert(cx_tensor_error(t) != NULL);
    cx_free(t);
    cx_free(a);
    cx_free(b);
}

Test(errors, poison_propagates_and_sync_reports_it)
{
    cx_tensor *a = zeros2(2, 3), *b = zeros2(4, 5);
    cx_tensor *bad = cx_add(a, b);
    cr_assert(cx_tensor_error(bad));
    const int64_t s6[] = { 6 };
    cx_tensor *gt = cx_gt(bad, a);
    cx_tensor *d[] = {
        cx_exp(bad),
        cx_add(bad, a),
        cx_mul(a, bad),
        cx_sum(bad, NULL, 0, false),
        cx_reshape(bad, s6, 1),
        cx_matmul(bad, a),
        cx_softmax(bad, -1),
        gt,
        cx_where(gt, a, a),
        cx_mse_loss(bad, a, CX_REDUCE_MEAN),
    };
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        cr_assert(d[i] != NULL, "derived %zu is NULL", i);
        cr_assert(cx_tensor_error(d[i]) != NULL, "op %zu on a poisoned tensor is healthy", i);
    }
    /* the message of the original error survives in the derived tensors */
    cr_assert(strstr(cx_tensor_error(d[0]), "add") != NULL, "derived error lost the cause: %s", cx_tensor_error(d[0]));
    /* reads report it */
    cr_assert(isnan(cx_item(d[3])), "cx_item of a poisoned tensor is not NaN");
    float buf[64];
    cr_assert_neq(cx_to_host(bad, buf, CX_F32), CX_OK, "cx_to_host of a poisoned tensor succeeded");
    cr_assert(isnan(cx_item(bad)));
    /* sync reports the shape error while poison is live, and stays that way */
    cr_assert_eq(cx_sync(), CX_ERR_SHAPE, "cx_sync with a live poisoned tensor");
    cr_assert_eq(cx_sync(), CX_ERR_SHAPE, "poisoned tensors stay poisoned");
    cr_assert(cx_tensor_error(bad) != NULL);
    /* healthy tensors in the same sync still get computed */
    float x[6] = { 1, 2, 3, 4, 5, 6 };
    const int64_t s23[] = { 2, 3 };
    cx_tensor *good = cx_mul_scalar(tf32(x, s23, 2), 2.0);
    (void)cx_sync();
    float out[6];
    cr_assert_eq(cx_to_host(good, out, CX_F32), CX_OK, "%s", cx_last_error());
    for (int i = 0; i < 6; i++) cr_assert_eq(out[i], 2 * x[i]);
    /* free the poison: later computations work and sync is clean */
    cx_free(bad);
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) cx_free(d[i]);
    cx_clear_error();
    cr_assert_eq(cx_sync(), CX_OK, "cx_sync after freeing every poisoned tensor: %s", cx_last_error());
    cx_tensor *y = cx_add(a, cx_ones(s23, 2, CX_F32));
    cr_assert_float_eq(cx_item(cx_sum(y, NULL, 0, false)), 6.0, 1e-6);
    cr_assert_eq(cx_sync(), CX_OK);
    cx_free(a);
    cx_free(b);
}

Test(errors, poison_in_a_step)
{
    cx_step_begin();
    cx_tensor *bad = cx_matmul(zeros2(2, 3), zeros2(4, 5));
    cr_assert(cx_tensor_error(bad));
    cx_keep(bad);
    cr_assert_eq(cx_step_end(), CX_ERR_SHAPE, "a kept poisoned tensor must fail the step's sync");
    cx_free(bad);
    /* the next step is healthy */
    cx_step_begin();
    cx_tensor *ok = cx_keep(cx_add(zeros2(2, 3), cx_ones((const int64_t[]){ 2, 3 }, 2, CX_F32)));
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cr_assert_float_eq(cx_item(cx_sum(ok, NULL, 0, false)), 6.0, 1e-6);
}

Test(errors, op_shape_errors)
{
    const int64_t s23[] = { 2, 3 }, s45[] = { 4, 5 };
    cx_tensor *a = data(s23, 2), *b = data(s45, 2);

    cx_clear_error();
    expect_poison("matmul inner mismatch", cx_matmul(a, b), "matmul", "(2, 3)", "(4, 5)", NULL);
    const int64_t sb1[] = { 2, 3, 4 }, sb2[] = { 3, 4, 5 };
    cx_clear_error();
    expect_poison("matmul batch mismatch", cx_matmul(data(sb1, 3), data(sb2, 3)), "matmul", NULL);

    const int64_t sx[] = { 1, 3, 5, 5 }, sw[] = { 4, 2, 3, 3 }, sb[] = { 5 };
    cx_clear_error();
    expect_poison("conv2d channel mismatch", cx_conv2d(data(sx, 4), data(sw, 4), NULL, 1, 1, 0, 0, 1, 1, 1), "conv2d",
                  NULL);
    const int64_t sw4[] = { 4, 3, 3, 3 };
    cx_clear_error();
    expect_poison("conv2d bias mismatch", cx_conv2d(data(sx, 4), data(sw4, 4), data(sb, 1), 1, 1, 0, 0, 1, 1, 1),
                  "conv2d", NULL);
    const int64_t sx4[] = { 1, 4, 5, 5 }, swg[] = { 3, 2, 3, 3 };
    cx_clear_error();
    expect_poison("conv2d groups not dividing O", cx_conv2d(data(sx4, 4), data(swg, 4), NULL, 1, 1, 0, 0, 1, 1, 2),
                  "conv2d", NULL);
    cx_clear_error();
    expect_poison("conv2d kernel larger than input", cx_conv2d(data(sx, 4), data((const int64_t[]){ 2, 3, 7, 7 }, 4),
                                                                NULL, 1, 1, 0, 0, 1, 1, 1),
                  "conv2d", NULL);
    cx_clear_error();
    expect_poison("conv2d stride 0", cx_conv2d(data(sx, 4), data(sw4, 4), NULL, 0, 1, 0, 0, 1, 1, 1), "conv2d", NULL);

    const int64_t s42[] = { 4, 2 };
    cx_clear_error();
    expect_poison("reshape wrong numel", cx_reshape(a, s42, 2), "reshape", "(2, 3)", "(4, 2)", NULL);
    const int64_t sm[] = { -1, -1 };
    cx_clear_error();
    expect_poison("reshape two -1", cx_reshape(a, sm, 2), "reshape", NULL);
    const int64_t s4m[] = { 4, -1 };
    cx_clear_error();
    expect_poison("reshape -1 not dividing", cx_reshape(a, s4m, 2), "reshape", NULL);

    const int p00[] = { 0, 0 }, p02[] = { 0, 2 };
    cx_clear_error();
    expect_poison("permute repeated axis", cx_permute(a, p00), "permute", NULL);
    cx_clear_error();
    expect_poison("permute axis out of range", cx_permute(a, p02), "permute", NULL);
    cx_clear_error();
    expect_poison("transpose bad axis", cx_transpose(a, 0, 2), "transpose", NULL);

    const int64_t se[] = { 4, 3 };
    cx_clear_error();
    expect_poison("expand non-1 dim", cx_expand(a, se, 2), "expand", NULL);
    cx_clear_error();
    expect_poison("expand to fewer dims", cx_expand(a, (const int64_t[]){ 3 }, 1), "expand", NULL);

    cx_clear_error();
    expect_poison("slice start out of range", cx_slice(a, 1, 5, 9, 1), "slice", NULL);
    cx_clear_error();
    expect_poison("slice step 0", cx_slice(a, 1, 0, 3, 0), "slice", NULL);
    cx_clear_error();
    expect_poison("slice bad axis", cx_slice(a, 2, 0, 1, 1), "slice", NULL);

    const int64_t lo_bad[] = { -1, 0 }, hi0[] = { 0, 0 };
    cx_clear_error();
    expect_poison("pad negative", cx_pad(a, lo_bad, hi0, 0.0), "pad", NULL);

    cx_tensor *cc[2] = { a, b };
    cx_clear_error();
    expect_poison("concat mismatch", cx_concat(cc, 2, 0), "concat", NULL);
    cx_tensor *cc2[2] = { a, a };
    cx_clear_error();
    expect_poison("concat bad axis", cx_concat(cc2, 2, 2), "concat", NULL);

    cx_clear_error();
    expect_poison("squeeze bad axis", cx_squeeze(a, 5), "squeeze", NULL);
    cx_clear_error();
    expect_poison("unsqueeze bad axis", cx_unsqueeze(a, 4), "unsqueeze", NULL);
    cx_clear_error();
    expect_poison("flatten start > end", cx_flatten(a, 1, 0), "flatten", NULL);

    cx_free(a);
    cx_free(b);
}

Test(errors, bad_axes)
{
    const int64_t s[] = { 2, 3 };
    cx_tensor *a = data(s, 2);
    const int ax5 = 5, axm3 = -3, ax_dup[2] = { 1, 1 };
    cx_clear_error();
    expect_poison("sum axis 5", cx_sum(a, &ax5, 1, false), "sum", NULL);
    cx_clear_error();
    expect_poison("sum axis -3", cx_sum(a, &axm3, 1, false), "sum", NULL);
    cx_clear_error();
    expect_poison("max axis 5", cx_max(a, &ax5, 1, true), "max", NULL);
    cx_clear_error();
    expect_poison("mean axis 5", cx_mean(a, &ax5, 1, false), "mean", NULL);
    cx_clear_error();
    expect_poison("var axis 5", cx_var(a, &ax5, 1, 1, false), "var", NULL);
    cx_clear_error();
    expect_poison("sum repeated axis", cx_sum(a, ax_dup, 2, false), "sum", NULL);
    cx_clear_error();
    expect_poison("argmax axis 2", cx_argmax(a, 2, false), "argmax", NULL);
    cx_clear_error();
    expect_poison("logsumexp axis 2", cx_logsumexp(a, 2, false), "logsumexp", NULL);
    cx_clear_error();
    expect_poison("softmax axis 2", cx_softmax(a, 2), "softmax", NULL);
    cx_clear_error();
    expect_poison("log_softmax axis -3", cx_log_softmax(a, -3), "log_softmax", NULL);
    cx_clear_error();
    expect_poison("layer_norm nnorm 3", cx_layer_norm(a, 3, NULL, NULL, 1e-5), "layer_norm", NULL);
    const int64_t sw[] = { 2 };
    cx_clear_error();
    expect_poison("layer_norm weight shape", cx_layer_norm(a, 1, data(sw, 1), NULL, 1e-5), "layer_norm", NULL);
    cx_free(a);
}

Test(errors, indexing_and_loss_errors)
{
    const int64_t s45[] = { 4, 5 }, si[] = { 4 }, s3[] = { 3 };
    cx_tensor *x = data(s45, 2);
    int64_t idx[4] = { 0, 1, 2, 3 };
    cx_tensor *i1 = ti64(idx, si, 1);
    cx_clear_error();
    expect_poison("gather index ndim", cx_gather(x, 0, i1), "gather", NULL);
    cx_clear_error();
    expect_poison("gather float index", cx_gather(x, 0, x), "gather", NULL);
    const int64_t s4x[] = { 4, 6 };
    int64_t idx2[24] = { 0 };
    cx_clear_error();
    expect_poison("scatter_add src/index mismatch", cx_scatter_add(x, 0, ti64(idx2, s4x, 2), data(s45, 2)),
                  "scatter_add", NULL);
    cx_clear_error();
    expect_poison("embedding float index", cx_embedding(x, x), "embedding", NULL);
    cx_clear_error();
    expect_poison("embedding 1-d weight", cx_embedding(data(si, 1), i1), "embedding", NULL);
    cx_clear_error();
    expect_poison("nll_loss target length", cx_nll_loss(x, ti64(idx, s3, 1), CX_REDUCE_MEAN, -100), "nll_loss", NULL);
    cx_clear_error();
    expect_poison("cross_entropy float target", cx_cross_entropy(x, data(si, 1), CX_REDUCE_MEAN, -100, 0.0),
                  "cross_entropy", NULL);
    const int64_t s54[] = { 5, 4 };
    cx_clear_error();
    expect_poison("mse shape mismatch", cx_mse_loss(x, data(s54, 2), CX_REDUCE_MEAN), "mse", NULL);
    cx_clear_error();
    expect_poison("where shape mismatch", cx_where(cx_gt(x, x), x, data(s54, 2)), "where", NULL);
    cx_clear_error();
    expect_poison("one_hot float index", cx_one_hot(x, 3, CX_F32), "one_hot", NULL);
    cx_clear_error();
    expect_poison("max_pool kernel too large", cx_max_pool2d(data((const int64_t[]){ 1, 1, 2, 2 }, 4), 3, 3, 1, 1, 0, 0),
                  "pool", NULL);
    cx_clear_error();
    expect_poison("avg_pool on 2-d", cx_avg_pool2d(x, 2, 2, 2, 2, 0, 0), "pool", NULL);
    cx_free(x);
}

Test(errors, creation_errors)
{
    float d[4] = { 0 };
    const int64_t neg[] = { 2, -1 };
    cx_clear_error();
    cx_tensor *t = cx_from_host(d, neg, 2, CX_F32);
    cr_assert(t != NULL && cx_tensor_error(t) != NULL, "cx_from_host with a negative dim is healthy");
    cr_assert(*cx_last_error());
    cx_free(t);
    const int64_t nine[9] = { 1, 1, 1, 1, 1, 1, 1, 1, 1 };
    cx_clear_error();
    t = cx_from_host(d, nine, 9, CX_F32);
    cr_assert(t != NULL && cx_tensor_error(t) != NULL, "cx_from_host with 9 dims is healthy");
    cx_free(t);
    const int64_t s2[] = { 2 };
    cx_clear_error();
    t = cx_from_host(d, s2, 2 - 3, CX_F32);
    cr_assert(t != NULL && cx_tensor_error(t) != NULL, "cx_from_host with ndim -1 is healthy");
    cx_free(t);
    cx_clear_error();
    t = cx_from_host(d, s2, 1, CX_DTYPE_COUNT);
    cr_assert(t != NULL && cx_tensor_error(t) != NULL, "cx_from_host with a bad dtype is healthy");
    cx_free(t);
    cx_clear_error();
    t = cx_cast(tf32(d, s2, 1), (cx_dtype)42);
    cr_assert(t != NULL && cx_tensor_error(t) != NULL, "cx_cast to a bad dtype is healthy");
    cx_free(t);
    cx_clear_error();
    t = cx_full(neg, 2, 1.0, CX_F32);
    cr_assert(t != NULL && cx_tensor_error(t) != NULL, "cx_full with a negative dim is healthy");
    cx_free(t);
    cx_clear_error();
    t = cx_arange(-3, CX_F32);
    cr_assert(t != NULL && cx_tensor_error(t) != NULL, "cx_arange(-3) is healthy");
    cx_free(t);
    /* nothing above left the process in an error state */
    cr_assert_eq(cx_sync(), CX_OK, "%s", cx_last_error());
}

Test(errors, assign_errors)
{
    const int64_t s23[] = { 2, 3 }, s32[] = { 3, 2 };
    float x[6] = { 1, 2, 3, 4, 5, 6 };
    cx_tensor *p = cx_persist(tf32(x, s23, 2));
    cx_clear_error();
    cr_assert_eq(cx_assign(p, data(s32, 2)), CX_ERR_SHAPE, "assign (3,2) into (2,3)");
    cr_assert(*cx_last_error(), "no message for a failed assign");
    cx_tensor *i = cx_cast(data(s23, 2), CX_I32);
    cr_assert_eq(cx_assign(p, i), CX_ERR_SHAPE, "assign i32 into f32");
    cx_tensor *bad = cx_add(zeros2(2, 3), zeros2(4, 5));
    cr_assert_neq(cx_assign(p, bad), CX_OK, "assign of a poisoned value succeeded");
    cx_free(bad);
    /* tensors created inside a step (and not cx_persist'ed) are not persistent */
    cx_step_begin();
    cx_tensor *np = data(s23, 2);
    cr_assert(!cx_is_persistent(np));
    cr_assert_eq(cx_assign(np, cx_ones(s23, 2, CX_F32)), CX_ERR_STATE, "assign to a non-persistent tensor");
    cx_keep(np);
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    /* failed assigns leave p untouched */
    cx_tensor *others[] = { i, np };
    for (int k = 0; k < 2; k++) cx_free(others[k]);
    cr_assert_eq(cx_sync(), CX_OK, "%s", cx_last_error());
    float out[6];
    cr_assert_eq(cx_to_host(p, out, CX_F32), CX_OK);
    for (int k = 0; k < 6; k++) cr_assert_eq(out[k], x[k], "p changed by a failed assign");
    /* and a good one works */
    cr_assert_eq(cx_assign(p, cx_mul_scalar(p, 3.0)), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_sync(), CX_OK);
    cr_assert_eq(cx_to_host(p, out, CX_F32), CX_OK);
    for (int k = 0; k < 6; k++) cr_assert_eq(out[k], 3 * x[k]);
    cx_free(p);
}

Test(errors, backward_errors)
{
    const int64_t s[] = { 3 };
    float x[3] = { 1, 2, 3 };
    cx_tensor *p = cx_requires_grad(cx_persist(tf32(x, s, 1)), true);
    cx_step_begin();
    cx_tensor *y = cx_mul(p, p); /* 3 elements */
    cr_assert_neq(cx_backward(y), CX_OK, "cx_backward on a 3-element tensor succeeded");
    cr_assert(*cx_last_error());
    cx_tensor *bad = cx_add(p, zeros2(4, 5));
    cr_assert_neq(cx_backward(bad), CX_OK, "cx_backward on a poisoned tensor succeeded");
    cx_free(bad);
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    cr_assert(cx_grad(p) == NULL, "a failed backward produced a gradient");
    /* after the failures, a good backward works */
    cx_step_begin();
    cr_assert_eq(cx_backward(cx_sum(cx_mul(p, p), NULL, 0, false)), CX_OK, "%s", cx_last_error());
    cr_assert_eq(cx_step_end(), CX_OK);
    float g[3];
    cr_assert_eq(cx_to_host(cx_grad(p), g, CX_F32), CX_OK);
    for (int i = 0; i < 3; i++) cr_assert_float_eq(g[i], 2 * x[i], 1e-6);
    cx_free(p);
}

Test(errors, api_misuse_is_harmless)
{
    cx_free(NULL);
    const int64_t s[] = { 2 };
    float x[2] = { 1, 2 };
    cx_tensor *t = cx_persist(tf32(x, s, 1));
    cx_zero_grad(t); /* no grad: fine */
    cr_assert(cx_grad(t) == NULL);
    cr_assert(isnan(cx_item(t)), "cx_item of a 2-element tensor should be NaN");
    cr_assert(*cx_last_error(), "no message for cx_item of a 2-element tensor");
    cx_free(t);
    /* a metrics query for a name that never counted */
    cr_assert_eq(cx_counter_value("NoSuchCounter"), 0);
}

static void *other_thread(void *arg)
{
    (void)arg;
    const char *e = cx_last_error();
    return (void *)(intptr_t)(e != NULL && e[0] == '\0');
}

Test(errors, last_error_is_per_thread)
{
    cx_tensor *bad = cx_add(zeros2(2, 3), zeros2(4, 5));
    cr_assert(*cx_last_error());
    pthread_t th;
    void *ret = NULL;
    cr_assert_eq(pthread_create(&th, NULL, other_thread, NULL), 0);
    pthread_join(th, &ret);
    cr_assert(ret != NULL, "another thread sees this thread's error");
    cr_assert(*cx_last_error(), "this thread's error was lost");
    cx_free(bad);
}
