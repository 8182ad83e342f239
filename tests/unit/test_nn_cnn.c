/* The reference trainer's cnn: one whole step (loss and every gradient)
 * against PyTorch, and a training step that compiles once with the loader. */
#include <criterion/criterion.h>

#include "../golden/golden.h"
/* The very model the trainer uses. */
#include "../../examples/models.c"

static char g_msg[512];

Test(nn_cnn, step_matches_pytorch)
{
    cx_module *m = model_cnn();
    cr_assert(m, "%s", cx_last_error());
    cr_expect_eq(cx_module_num_params(m), 1199882);
    cr_assert(golden_load_params(m, "cnn"), "%s", cx_last_error());
    int64_t xs[4] = { 4, 1, 28, 28 }, ts = 4;
    cx_tensor *x = golden_input("cnn", "x", xs, 4, 1.0f);
    int64_t t[4];
    golden_ints(t, 4, "cnn/t", 10);
    cx_tensor *tt = cx_from_host(t, &ts, 1, CX_I64);
    cx_step_begin();
    cx_tensor *loss = cx_nll_loss(cx_module_forward(m, x), tt, CX_REDUCE_MEAN, -100);
    cr_assert(cx_backward(loss) == CX_OK, "%s", cx_last_error());
    cx_keep(loss);
    cr_assert(cx_step_end() == CX_OK, "%s", cx_last_error());
    const char *e = golden_check("cnn/loss", loss, 1e-4, g_msg, sizeof g_msg);
    cr_expect(e == NULL, "%s", e ? e : "");
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cr_assert_eq(n, 8);
    for (int i = 0; i < n; i++) {
        char key[128];
        snprintf(key, sizeof key, "cnn/grad/%s", ps[i].name);
        e = golden_check(key, cx_grad(ps[i].tensor), 1e-4, g_msg, sizeof g_msg);
        cr_expect(e == NULL, "%s", e ? e : "");
    }
    free(ps);
    cx_free(loss);
    cx_free(x);
    cx_free(tt);
    cx_module_free(m);
}

Test(nn_cnn, training_step_compiles_once_with_loader)
{
    cx_manual_seed(1);
    cx_module *m = model_cnn();
    cr_assert(m);
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_sgd_opts so = cx_sgd_default_opts();
    so.momentum = 0.5;
    cx_optimizer *opt = cx_optim_sgd(ps, n, so);
    free(ps);
    cr_assert(opt, "%s", cx_last_error());
    cx_fake_data_opts fo = cx_fake_data_default_opts();
    fo.size = 64;
    cx_dataset *ds;
    cr_assert(cx_fake_data(fo, &ds) == CX_OK);
    cx_sampler *s = cx_sampler_new(cx_dataset_size(ds), cx_sampler_default_opts());
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = 16;
    cx_loader *l = cx_loader_new(ds, s, lo);
    cr_assert(l, "%s", cx_last_error());

    int64_t uncached0 = cx_counter_value("UncachedCompile"), cached0 = cx_counter_value("CachedCompile");
    cx_batch b;
    double losses[3];
    cx_tensor *kept[3] = { 0 };
    int steps = 0;
    while (steps < 3 && cx_loader_next(l, &b) == CX_LOADER_BATCH) {
        cx_optim_set_lr(opt, 0.01 * (steps + 1));   /* a schedule must not recompile */
        cx_optim_zero_grad(opt);
        cx_tensor *loss = cx_nll_loss(cx_module_forward(m, cx_batch_field(&b, CX_FIELD_IMAGES)), cx_batch_field(&b, CX_FIELD_LABELS), CX_REDUCE_MEAN, -100);
        cr_assert(cx_backward(loss) == CX_OK);
        cr_assert(cx_optim_step(opt) == CX_OK);
        kept[steps++] = cx_persist(loss);   /* past several steps (cx_keep spans one) */
    }
    cr_assert(cx_loader_end_step(l) == CX_OK, "%s", cx_last_error());
    cr_assert_eq(steps, 3);
    for (int i = 0; i < 3; i++) {
        losses[i] = cx_item(kept[i]);
        cr_expect(isfinite(losses[i]));
        cx_free(kept[i]);
    }
    int64_t uncached = cx_counter_value("UncachedCompile") - uncached0;
    int64_t cached = cx_counter_value("CachedCompile") - cached0;
    cr_expect_eq(uncached, 1, "the step compiled %lld times", (long long)uncached);
    cr_expect_eq(cached, 2, "%lld cache hits", (long long)cached);
    cx_loader_free(l);
    cx_sampler_free(s);
    cx_dataset_free(ds);
    cx_optim_free(opt);
    cx_module_free(m);
}
