/* The public API's promises to a C programmer: a value of the wrong enum
 * family is refused by name, status codes have names, the error buffer may
 * be formatted from itself, the version macros match the library. */
#include <criterion/criterion.h>
#include <cxla/cxla.h>

#include <math.h>
#include <string.h>

static cx_tensor *logits_2x3(void)
{
    const float d[] = { 0.1f, 0.2f, 0.3f, 1.0f, -1.0f, 0.5f };
    const int64_t s[] = { 2, 3 };
    return cx_from_host(d, s, 2, CX_F32);
}

static cx_tensor *targets_2(void)
{
    const int64_t d[] = { 0, 2 };
    const int64_t s[] = { 2 };
    return cx_from_host(d, s, 1, CX_I64);
}

static void expect_msg(const char *what, cx_tensor *t, const char *needle)
{
    const char *msg = cx_tensor_error(t);
    cr_assert(msg != NULL, "%s: not refused", what);
    cr_expect(strstr(msg, needle) != NULL, "%s: \"%s\" does not say \"%s\"", what, msg, needle);
    cr_expect(strstr(cx_last_error(), needle) != NULL, "%s: last error \"%s\" does not say \"%s\"", what,
              cx_last_error(), needle);
}

Test(api, enums_are_disjoint)
{
    int loss[] = { CX_REDUCE_MEAN, CX_REDUCE_SUM, CX_REDUCE_NONE };
    int coll[] = { CX_RED_SUM, CX_RED_MEAN, CX_RED_MAX, CX_RED_MIN };
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) cr_expect_neq(loss[i], coll[j], "cx_reduction %d == cx_reduce_op %d", i, j);
}

Test(api, loss_refuses_a_collective_reduction)
{
    cx_tensor *x = logits_2x3(), *y = targets_2();
    cx_tensor *ok = cx_cross_entropy(x, y, CX_REDUCE_SUM, -100, 0.0);
    cr_assert(cx_tensor_error(ok) == NULL);
    cr_assert(isfinite(cx_item(ok)));
    cx_clear_error();
    cx_tensor *bad = cx_cross_entropy(x, y, (cx_reduction)CX_RED_MEAN, -100, 0.0);
    expect_msg("cross_entropy(CX_RED_MEAN)", bad, "cross_entropy: reduction CX_RED_MEAN");
    expect_msg("cross_entropy(CX_RED_MEAN)", bad, "is a cx_reduce_op");
    cx_tensor *bad2 = cx_nll_loss(x, y, (cx_reduction)77, -100);
    expect_msg("nll_loss(77)", bad2, "reduction 77 is not a cx_reduction");
    cx_tensor *bad3 = cx_mse_loss(x, x, (cx_reduction)CX_RED_SUM);
    expect_msg("mse_loss(CX_RED_SUM)", bad3, "mse_loss: reduction CX_RED_SUM");
    cx_free(ok);
    cx_free(bad);
    cx_free(bad2);
    cx_free(bad3);
    cx_free(x);
    cx_free(y);
}

Test(api, all_reduce_refuses_a_loss_reduction)
{
    cx_tensor *x = logits_2x3();
    cx_tensor *ok = cx_all_reduce(x, CX_RED_MEAN, 1.0, NULL, false);
    cr_assert(cx_tensor_error(ok) == NULL);
    cx_tensor *bad = cx_all_reduce(x, (cx_reduce_op)CX_REDUCE_SUM, 1.0, NULL, false);
    expect_msg("all_reduce(CX_REDUCE_SUM)", bad, "all_reduce: reduction CX_REDUCE_SUM");
    expect_msg("all_reduce(CX_REDUCE_SUM)", bad, "is a cx_reduction");
    cx_tensor *bad2 = cx_reduce_scatter(x, (cx_reduce_op)CX_REDUCE_MEAN, 1.0, 0, NULL, false);
    expect_msg("reduce_scatter(CX_REDUCE_MEAN)", bad2, "reduce_scatter: reduction CX_REDUCE_MEAN");

    float buf[2] = { 1, 2 };
    cx_comm_op op = { .kind = CX_COLL_ALL_REDUCE, .red = (cx_reduce_op)CX_REDUCE_NONE, .scale = 1.0,
                      .dtype = CX_F32, .in = buf, .out = buf, .count = 2 };
    cx_clear_error();
    cr_expect_eq(cx_comm_run(&op), CX_ERR_ARG);
    cr_expect(strstr(cx_last_error(), "comm_run: reduction CX_REDUCE_NONE") != NULL, "%s", cx_last_error());
    cx_free(ok);
    cx_free(bad);
    cx_free(bad2);
    cx_free(x);
}
