/* Eager mode switched at run time (cx_set_eager) and compile regions
 * (cx_compile_begin / end, torch_xla.compile): the cnn's training step gives
 * lazy mode's results in eager mode, with its forward and backward in a
 * region, and lazy again after switching back; a region runs nothing until
 * it ends and then runs one graph; misuse is one clear error. */
#include <criterion/criterion.h>

#include "test_obs_cnn.h"

typedef struct {
    double loss;
    int n;
    float grads[8][4];   /* a few entries of each gradient */
    float params_after[8][4];
    int64_t executes_before_end;   /* graphs run from the step's start to its end */
} cnn_step;

static int64_t executions(void)
{
    cx_metric_stats ms;
    return cx_metric_data("ExecuteTime", &ms) ? ms.total_samples : 0;
}

static void head4(cx_tensor *t, float *out)
{
    cx_tensor *flat = cx_flatten(t, 0, -1);
    cx_tensor *head = cx_slice(flat, 0, 0, 4, 1);
    cr_assert_eq(cx_to_host(head, out, CX_F32), CX_OK, "%s", cx_last_error());
    cx_free(head);
    cx_free(flat);
}

/* one forward + backward + SGD step of the test cnn on a fixed batch;
 * region: forward and backward inside a compile region */
static void cnn_once(cnn_step *out, bool region)
{
    cx_manual_seed(3);
    cx_module *m = obs_cnn();
    cr_assert(m);
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cr_assert_leq(n, 8);
    cx_sgd_opts so = cx_sgd_default_opts();
    so.lr = 0.1;
    cx_optimizer *opt = cx_optim_sgd(ps, n, so);
    cr_assert(opt);
    float img[4 * 28 * 28];
    for (int i = 0; i < 4 * 28 * 28; i++) img[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    int64_t lab[4] = { 1, 7, 3, 0 };
    cx_tensor *x = cx_from_host(img, (int64_t[]){ 4, 1, 28, 28 }, 4, CX_F32);
    cx_tensor *t = cx_from_host(lab, (int64_t[]){ 4 }, 1, CX_I64);
    int64_t ex0 = executions();
    cx_step_begin();
    if (region) cr_assert_eq(cx_compile_begin(), CX_OK, "%s", cx_last_error());
    cx_tensor *loss = cx_keep(cx_nll_loss(cx_module_forward(m, x), t, CX_REDUCE_MEAN, -100));
    cr_assert_eq(cx_backward(loss), CX_OK, "%s", cx_last_error());
    if (region) {
        cr_expect_eq(executions(), ex0, "a region ran %lld graphs before its end", (long long)(executions() - ex0));
        cr_assert_eq(cx_compile_end(), CX_OK, "%s", cx_last_error());
        cr_expect_eq(executions(), ex0 + 1, "the region's end ran %lld graphs, not one", (long long)(executions() - ex0));
    }
    for (int i = 0; i < n; i++) {
        cx_tensor *g = cx_grad(ps[i].tensor);
        cr_assert(g);
        head4(g, out->grads[i]);
    }
    cr_assert_eq(cx_optim_step(opt), CX_OK);
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    out->executes_before_end = executions() - ex0;
    out->loss = cx_item(loss);
    out->n = n;
    for (int i = 0; i < n; i++) head4(ps[i].tensor, out->params_after[i]);
    free(ps);
    cx_free(loss);
    cx_free(x);
    cx_free(t);
    cx_optim_free(opt);
    cx_module_free(m);
}

static void expect_same(const cnn_step *a, const cnn_step *b, const char *what)
{
    cr_expect(isfinite(a->loss));
    cr_expect(fabs(a->loss - b->loss) <= 1e-5 * fabs(a->loss) + 1e-6, "%s: loss %.9g vs %.9g", what, b->loss, a->loss);
    cr_assert_eq(a->n, b->n);
    for (int i = 0; i < a->n; i++)
        for (int j = 0; j < 4; j++) {
            double x = a->grads[i][j], y = b->grads[i][j];
            cr_expect(fabs(x - y) <= 1e-4 * fabs(x) + 1e-6, "%s: grad %d[%d]: %.9g vs %.9g", what, i, j, y, x);
            x = a->params_after[i][j];
            y = b->params_after[i][j];
            cr_expect(fabs(x - y) <= 1e-5 * fabs(x) + 1e-6, "%s: param %d[%d]: %.9g vs %.9g", what, i, j, y, x);
        }
}

Test(eager_runtime, switching_and_regions_give_lazy_results)
{
    cnn_step lazy, eager, compiled, lazy_again;
    memset(&lazy, 0, sizeof lazy);
    memset(&eager, 0, sizeof eager);
    memset(&compiled, 0, sizeof compiled);
    memset(&lazy_again, 0, sizeof lazy_again);
    cr_assert(!cx_is_eager());
    cnn_once(&lazy, false);
    cr_assert_eq(cx_set_eager(true), CX_OK, "%s", cx_last_error());
    cr_assert(cx_is_eager());
    cnn_once(&eager, false);
    cnn_once(&compiled, true);
    cr_assert_eq(cx_set_eager(false), CX_OK, "%s", cx_last_error());
    cnn_once(&lazy_again, false);
    expect_same(&lazy, &eager, "eager");
    expect_same(&lazy, &compiled, "eager with a compile region");
    expect_same(&lazy, &lazy_again, "lazy again");
    /* eager runs every op; the region's forward and backward are one graph */
    cr_expect_gt(eager.executes_before_end, compiled.executes_before_end + 20, "eager %lld vs region %lld",
                 (long long)eager.executes_before_end, (long long)compiled.executes_before_end);
    cr_expect_lt(lazy_again.executes_before_end, compiled.executes_before_end, "lazy again %lld vs region %lld",
                 (long long)lazy_again.executes_before_end, (long long)compiled.executes_before_end);
}

Test(eager_runtime, region_in_lazy_mode_is_a_sync)
{
    cx_tensor *x = cx_from_host((float[]){ 1, 4, 9 }, (int64_t[]){ 3 }, 1, CX_F32);
    cr_assert_eq(cx_compile_begin(), CX_OK);
    cx_tensor *y = cx_sqrt(x);
    cr_expect(cx_is_pending(y));
    cr_assert_eq(cx_compile_end(), CX_OK, "%s", cx_last_error());
    cr_expect(!cx_is_pending(y));
    float out[3];
    cr_assert_eq(cx_to_host(y, out, CX_F32), CX_OK);
    cr_expect(out[0] == 1 && out[1] == 2 && out[2] == 3);
    cx_free(y);
    cx_free(x);
}

Test(eager_runtime, misuse_is_one_clear_error)
{
    cx_step_begin();
    cr_expect_eq(cx_set_eager(true), CX_ERR_STATE);
    cr_expect(strstr(cx_last_error(), "cx_set_eager: called inside an open step"), "%s", cx_last_error());
    cr_expect(!cx_is_eager(), "a refused switch changed the mode");
    cr_assert_eq(cx_step_end(), CX_OK);

    cr_expect_eq(cx_compile_end(), CX_ERR_STATE);
    cr_expect(strstr(cx_last_error(), "cx_compile_end: no compile region is open"), "%s", cx_last_error());

    cr_assert_eq(cx_compile_begin(), CX_OK);
    cr_expect_eq(cx_compile_begin(), CX_ERR_STATE);
    cr_expect(strstr(cx_last_error(), "already open (regions do not nest"), "%s", cx_last_error());
    cr_expect_eq(cx_set_eager(true), CX_ERR_STATE);
    cr_expect(strstr(cx_last_error(), "cx_set_eager: called inside a compile region"), "%s", cx_last_error());
    cr_assert_eq(cx_compile_end(), CX_OK, "%s", cx_last_error());

    /* a region that straddles a step boundary */
    cx_step_begin();
    cr_assert_eq(cx_compile_begin(), CX_OK);
    cr_assert_eq(cx_step_end(), CX_OK);
    cr_expect_eq(cx_compile_end(), CX_ERR_STATE);
    cr_expect(strstr(cx_last_error(), "cx_compile_end: the region opened at step depth 1 closes at depth 0"), "%s",
              cx_last_error());
    cr_expect_eq(cx_compile_end(), CX_ERR_STATE, "the unbalanced region stayed open");
}
