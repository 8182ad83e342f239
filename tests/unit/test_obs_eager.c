/* XLA_USE_EAGER_DEBUG_MODE=1 runs every op when it is recorded and gives
 * the same results as lazy mode; step closures run after the step's graph
 * has run, in order. */
#include <criterion/criterion.h>

#include "test_obs_cnn.h"

typedef struct {
    double loss;
    int n;
    float grads[8][4];   /* a few entries of each gradient */
    float params_after[8][4];
    int64_t executes_before_sync;
} cnn_step;

/* one forward + backward + SGD step of the test cnn on a fixed batch */
static void cnn_once(cnn_step *out)
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
    cx_metric_stats ms;
    int64_t ex0 = cx_metric_data("ExecuteTime", &ms) ? ms.total_samples : 0;
    cx_step_begin();
    cx_tensor *loss = cx_keep(cx_nll_loss(cx_module_forward(m, x), t, CX_REDUCE_MEAN, -100));
    cr_assert_eq(cx_backward(loss), CX_OK, "%s", cx_last_error());
    for (int i = 0; i < n; i++) {
        cx_tensor *g = cx_grad(ps[i].tensor);
        cr_assert(g);
        cx_tensor *flat = cx_flatten(g, 0, -1);
        cx_tensor *head = cx_keep(cx_slice(flat, 0, 0, 4, 1));
        cr_assert_eq(cx_sync_tensors(&head, 1), CX_OK);
        float tmp[4] = { 0 };
        cr_assert_eq(cx_to_host(head, tmp, CX_F32), CX_OK);
        memcpy(out->grads[i], tmp, sizeof tmp);
    }
    cr_assert_eq(cx_optim_step(opt), CX_OK);
    out->executes_before_sync = (cx_metric_data("ExecuteTime", &ms) ? ms.total_samples : 0) - ex0;
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    out->loss = cx_item(loss);
    out->n = n;
    for (int i = 0; i < n; i++) {
        cx_tensor *flat = cx_flatten(ps[i].tensor, 0, -1);
        cx_tensor *head = cx_slice(flat, 0, 0, 4, 1);
        float tmp[4] = { 0 };
        cr_assert_eq(cx_to_host(head, tmp, CX_F32), CX_OK);
        memcpy(out->params_after[i], tmp, sizeof tmp);
        cx_free(head);
        cx_free(flat);
    }
    free(ps);
    cx_free(loss);
    cx_free(x);
    cx_free(t);
    cx_optim_free(opt);
    cx_module_free(m);
}

Test(obs_eager, same_results_as_lazy_for_the_cnn_step)
{
    cnn_step lazy, eager;
    memset(&lazy, 0, sizeof lazy);
    memset(&eager, 0, sizeof eager);
    unsetenv("XLA_USE_EAGER_DEBUG_MODE");
    cx_debug_reload_env();
    cnn_once(&lazy);
    setenv("XLA_USE_EAGER_DEBUG_MODE", "1", 1);
    cx_debug_reload_env();
    cnn_once(&eager);
    unsetenv("XLA_USE_EAGER_DEBUG_MODE");
    cx_debug_reload_env();
    /* lazy: only the gradient reads ran before the step end; eager: every op */
    cr_expect_gt(eager.executes_before_sync, lazy.executes_before_sync + 20, "eager %lld vs lazy %lld executions",
                 (long long)eager.executes_before_sync, (long long)lazy.executes_before_sync);
    cr_expect(isfinite(lazy.loss));
    cr_expect(fabs(eager.loss - lazy.loss) <= 1e-5 * fabs(lazy.loss) + 1e-6, "loss %.9g vs %.9g", eager.loss, lazy.loss);
    cr_assert_eq(eager.n, lazy.n);
    for (int i = 0; i < lazy.n; i++)
        for (int j = 0; j < 4; j++) {
            double a = lazy.grads[i][j], b = eager.grads[i][j];
            cr_expect(fabs(a - b) <= 1e-4 * fabs(a) + 1e-6, "grad %d[%d]: %.9g vs %.9g", i, j, a, b);
            a = lazy.params_after[i][j];
            b = eager.params_after[i][j];
            cr_expect(fabs(a - b) <= 1e-5 * fabs(a) + 1e-6, "param %d[%d]: %.9g vs %.9g", i, j, a, b);
        }
}

Test(obs_eager, op_runs_immediately)
{
    setenv("XLA_USE_EAGER_DEBUG_MODE", "1", 1);
    cx_debug_reload_env();
    cx_metric_stats ms;
    int64_t ex0 = cx_metric_data("ExecuteTime", &ms) ? ms.total_samples : 0;
    cx_tensor *x = cx_from_host((float[]){ 1, 4, 9 }, (int64_t[]){ 3 }, 1, CX_F32);
    cx_tensor *y = cx_sqrt(x);
    cr_expect_eq(cx_metric_data("ExecuteTime", &ms) ? ms.total_samples : 0, ex0 + 1);
    float out[3];
    cr_assert_eq(cx_to_host(y, out, CX_F32), CX_OK);
    cr_expect_eq(cx_metric_data("ExecuteTime", &ms) ? ms.total_samples : 0, ex0 + 1, "reading needs no execution");
    cr_expect(out[0] == 1 && out[1] == 2 && out[2] == 3);
    unsetenv("XLA_USE_EAGER_DEBUG_MODE");
    cx_debug_reload_env();
}

/* ---- step closures ---- */

typedef struct {
    int order[16];
    int n;
    cx_tensor *t;
    double seen;
    bool was_pending;
} closure_log;

static closure_log g_log;

static void note(void *arg) { g_log.order[g_log.n++] = (int)(intptr_t)arg; }

static void read_kept(void *arg)
{
    (void)arg;
    g_log.was_pending = cx_is_pending(g_log.t);
    g_log.seen = cx_item(g_log.t);
}

Test(obs_closures, run_after_the_step_in_order)
{
    memset(&g_log, 0, sizeof g_log);
    cx_step_begin();
    cx_tensor *x = cx_from_host((float[]){ 1, 2, 3 }, (int64_t[]){ 3 }, 1, CX_F32);
    g_log.t = cx_keep(cx_sum(x, NULL, 0, false));
    cr_assert_eq(cx_add_step_closure(note, (void *)1, false), CX_OK);
    cr_assert_eq(cx_add_step_closure(read_kept, NULL, false), CX_OK);
    cr_assert_eq(cx_add_step_closure(note, (void *)2, false), CX_OK);
    cr_expect_eq(g_log.n, 0, "closures wait for the step end");
    cx_metric_stats ms;
    int64_t ex0 = cx_metric_data("ExecuteTime", &ms) ? ms.total_samples : 0;
    cr_assert_eq(cx_step_end(), CX_OK);
    cr_expect_eq(g_log.n, 2);
    cr_expect_eq(g_log.order[0], 1);
    cr_expect_eq(g_log.order[1], 2);
    cr_expect(!g_log.was_pending, "the step's graph ran before the closures");
    cr_expect_eq(g_log.seen, 6.0);
    cr_expect_eq(cx_metric_data("ExecuteTime", &ms) ? ms.total_samples : 0, ex0 + 1, "one execution for the step");
    /* they run once */
    cx_step_begin();
    cx_step_end();
    cr_expect_eq(g_log.n, 2);
    cr_expect_eq(cx_add_step_closure(NULL, NULL, false), CX_ERR_ARG);
}

Test(obs_closures, async_in_order)
{
    memset(&g_log, 0, sizeof g_log);
    cx_step_begin();
    for (int i = 0; i < 10; i++) cr_assert_eq(cx_add_step_closure(note, (void *)(intptr_t)i, true), CX_OK);
    cx_step_end();
    cx_wait_step_closures();
    cr_expect_eq(g_log.n, 10);
    for (int i = 0; i < 10; i++) cr_expect_eq(g_log.order[i], i);
}
