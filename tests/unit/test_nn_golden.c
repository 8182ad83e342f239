/* Each layer's forward and gradients, and the losses, against PyTorch
 * (values from tests/golden/gen_golden.py; no torch needed here). */
#include <criterion/criterion.h>

#include "../golden/golden.h"

#define RTOL 1e-4

static char g_msg[512];

#define CHECK(key, t) GOLDEN_EXPECT(key, t, RTOL)

/* y = m(x), loss = sum(y * r); checks y, dx and every parameter gradient. */
static void run_layer(const char *gcase, cx_module *m, const int64_t *xs, int nd, float xscale)
{
    cr_assert(m, "constructor failed: %s", cx_last_error());
    cr_assert(golden_load_params(m, gcase), "loading parameters: %s", cx_last_error());
    cx_tensor *x = golden_input(gcase, "x", xs, nd, xscale);
    cx_requires_grad(x, true);
    cx_step_begin();
    cx_tensor *y = cx_module_forward(m, x);
    cr_assert(cx_tensor_error(y) == NULL, "%s forward: %s", gcase, cx_tensor_error(y));
    cx_tensor *r = golden_input(gcase, "r", cx_shape(y), cx_ndim(y), 1.0f);
    cx_tensor *loss = cx_sum(cx_mul(y, r), NULL, 0, false);
    cr_assert(cx_backward(loss) == CX_OK, "%s backward: %s", gcase, cx_last_error());
    cx_keep(y);
    cr_assert(cx_step_end() == CX_OK, "%s step: %s", gcase, cx_last_error());
    char key[256];
    snprintf(key, sizeof key, "%s/y", gcase);
    CHECK(key, y);
    snprintf(key, sizeof key, "%s/grad/x", gcase);
    CHECK(key, cx_grad(x));
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%s/grad/%s", gcase, ps[i].name);
        CHECK(key, cx_grad(ps[i].tensor));
    }
    free(ps);
    cx_free(y);
    cx_zero_grad(x);
    cx_free(x);
    cx_module_free(m);
}

#define SHAPE(...) (const int64_t[]){ __VA_ARGS__ }, (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t))

Test(nn_golden, linear) { run_layer("linear", cx_nn_linear(6, 4, true), SHAPE(2, 3, 6), 1.0f); }
Test(nn_golden, linear_nobias) { run_layer("linear_nobias", cx_nn_linear(5, 3, false), SHAPE(4, 5), 1.0f); }

Test(nn_golden, conv)
{
    run_layer("conv", cx_nn_conv2d(3, 4, 3, cx_conv2d_default_opts()), SHAPE(2, 3, 7, 7), 1.0f);
}

Test(nn_golden, conv_stride_padding)
{
    cx_conv2d_opts o = cx_conv2d_default_opts();
    o.stride = 2;
    o.padding = 1;
    run_layer("conv_s2p1", cx_nn_conv2d(2, 6, 3, o), SHAPE(2, 2, 8, 8), 1.0f);
}

Test(nn_golden, conv_groups_dilation)
{
    cx_conv2d_opts o = cx_conv2d_default_opts();
    o.dilation = 2;
    o.groups = 2;
    o.bias = false;
    run_layer("conv_g2d2", cx_nn_conv2d(4, 6, 3, o), SHAPE(1, 4, 9, 9), 1.0f);
}

Test(nn_golden, max_pool) { run_layer("maxpool", cx_nn_max_pool2d(2, 0, 0), SHAPE(2, 3, 6, 6), 1.0f); }
Test(nn_golden, max_pool_k3s2p1) { run_layer("maxpool_k3s2p1", cx_nn_max_pool2d(3, 2, 1), SHAPE(1, 2, 7, 7), 1.0f); }
Test(nn_golden, avg_pool) { run_layer("avgpool", cx_nn_avg_pool2d(2, 0, 0), SHAPE(2, 3, 6, 6), 1.0f); }
Test(nn_golden, avg_pool_k3s2p1) { run_layer("avgpool_k3s2p1", cx_nn_avg_pool2d(3, 2, 1), SHAPE(1, 2, 7, 7), 1.0f); }
Test(nn_golden, adaptive_avg_pool) { run_layer("adaptive", cx_nn_adaptive_avg_pool2d(2, 3), SHAPE(2, 3, 6, 6), 1.0f); }
Test(nn_golden, adaptive_avg_pool_uneven)
{
    run_layer("adaptive_odd", cx_nn_adaptive_avg_pool2d(3, 2), SHAPE(1, 2, 7, 5), 1.0f);
}
Test(nn_golden, flatten) { run_layer("flatten", cx_nn_flatten(1, -1), SHAPE(2, 3, 4), 1.0f); }
Test(nn_golden, relu) { run_layer("relu", cx_nn_relu(), SHAPE(3, 7), 3.0f); }
Test(nn_golden, gelu) { run_layer("gelu", cx_nn_gelu(false), SHAPE(3, 7), 3.0f); }
Test(nn_golden, gelu_tanh) { run_layer("gelu_tanh", cx_nn_gelu(true), SHAPE(3, 7), 3.0f); }
Test(nn_golden, silu) { run_layer("silu", cx_nn_silu(), SHAPE(3, 7), 3.0f); }
Test(nn_golden, tanh) { run_layer("tanh", cx_nn_tanh(), SHAPE(3, 7), 3.0f); }
Test(nn_golden, sigmoid) { run_layer("sigmoid", cx_nn_sigmoid(), SHAPE(3, 7), 3.0f); }
Test(nn_golden, log_softmax) { run_layer("log_softmax", cx_nn_log_softmax(1), SHAPE(3, 7), 3.0f); }

Test(nn_golden, batch_norm_train)
{
    run_layer("batchnorm_train", cx_nn_batch_norm2d(3, cx_batch_norm_default_opts()), SHAPE(4, 3, 5, 5), 1.0f);
}

Test(nn_golden, batch_norm_running_stats)
{
    cx_module *bn = cx_nn_batch_norm2d(3, cx_batch_norm_default_opts());
    cr_assert(bn);
    cr_assert(golden_load_params(bn, "batchnorm_train"));
    int64_t xs[4] = { 4, 3, 5, 5 };
    cx_tensor *x = golden_input("batchnorm_train", "x", xs, 4, 1.0f);
    cx_step_begin();
    cx_module_forward(bn, x);
    cr_assert(cx_step_end() == CX_OK, "%s", cx_last_error());
    CHECK("batchnorm_train/running_mean", cx_module_get(bn, "running_mean"));
    CHECK("batchnorm_train/running_var", cx_module_get(bn, "running_var"));
    cr_expect_eq(cx_item(cx_module_get(bn, "num_batches_tracked")), 1.0);
    cx_free(x);
    cx_module_free(bn);
}

Test(nn_golden, batch_norm_eval)
{
    cx_module *bn = cx_nn_batch_norm2d(3, cx_batch_norm_default_opts());
    cr_assert(bn);
    float rm[3], rv[3];
    golden_vals(rm, 3, "batchnorm_eval/running_mean", 0.5f);
    golden_vals(rv, 3, "batchnorm_eval/running_var", 0.5f);
    for (int i = 0; i < 3; i++) rv[i] = fabsf(rv[i]) + 0.5f;
    cr_assert(cx_module_load(bn, "running_mean", rm, CX_F32) == CX_OK);
    cr_assert(cx_module_load(bn, "running_var", rv, CX_F32) == CX_OK);
    cx_module_train(bn, false);
    run_layer("batchnorm_eval", bn, SHAPE(4, 3, 5, 5), 1.0f);
}

Test(nn_golden, layer_norm) { run_layer("layernorm", cx_nn_layer_norm(8, 1e-5, true), SHAPE(2, 3, 8), 1.0f); }

Test(nn_golden, sequential)
{
    cx_module *mods[3] = { cx_nn_linear(6, 8, true), cx_nn_relu(), cx_nn_linear(8, 3, true) };
    run_layer("sequential", cx_nn_sequential(mods, 3), SHAPE(4, 6), 1.0f);
}

Test(nn_golden, transformer_block)
{
    run_layer("transformer", cx_nn_transformer_block(16, 4), SHAPE(2, 5, 16), 1.0f);
}

Test(nn_golden, embedding)
{
    cx_module *e = cx_nn_embedding(10, 4);
    cr_assert(e);
    cr_assert(golden_load_params(e, "embedding"));
    int64_t idx[10];
    golden_ints(idx, 10, "embedding/idx", 10);
    int64_t is[2] = { 2, 5 };
    cx_tensor *ix = cx_from_host(idx, is, 2, CX_I64);
    cx_step_begin();
    cx_tensor *y = cx_module_forward(e, ix);
    cx_tensor *r = golden_input("embedding", "r", cx_shape(y), cx_ndim(y), 1.0f);
    cr_assert(cx_backward(cx_sum(cx_mul(y, r), NULL, 0, false)) == CX_OK, "%s", cx_last_error());
    cx_keep(y);
    cr_assert(cx_step_end() == CX_OK, "%s", cx_last_error());
    CHECK("embedding/y", y);
    CHECK("embedding/grad/weight", cx_grad(cx_module_get(e, "weight")));
    cx_free(y);
    cx_free(ix);
    cx_module_free(e);
}

/* ---- losses ------------------------------------------------------------------ */

typedef enum { L_NLL, L_CE } loss_kind;

static void run_loss(const char *gcase, loss_kind kind, cx_reduction red, int64_t ignore, double smoothing,
                     bool put_ignored)
{
    int64_t zs[2] = { 6, 5 };
    cx_tensor *z = golden_input(gcase, "x", zs, 2, 2.0f);
    cx_requires_grad(z, true);
    char key[256];
    snprintf(key, sizeof key, "%s/t", gcase);
    int64_t t[6];
    golden_ints(t, 6, key, 5);
    if (put_ignored) t[1] = t[4] = ignore;
    int64_t ts = 6;
    cx_step_begin();
    cx_tensor *tt = cx_from_host(t, &ts, 1, CX_I64);
    cx_tensor *loss = kind == L_NLL ? cx_nll_loss(cx_log_softmax(z, 1), tt, red, ignore)
                                    : cx_cross_entropy(z, tt, red, ignore, smoothing);
    cr_assert(cx_backward(loss) == CX_OK, "%s: %s", gcase, cx_last_error());
    cx_keep(loss);
    cr_assert(cx_step_end() == CX_OK, "%s: %s", gcase, cx_last_error());
    snprintf(key, sizeof key, "%s/loss", gcase);
    CHECK(key, loss);
    snprintf(key, sizeof key, "%s/grad/x", gcase);
    CHECK(key, cx_grad(z));
    cx_free(loss);
    cx_zero_grad(z);
    cx_free(z);
}

Test(loss_golden, nll_mean) { run_loss("nll_mean", L_NLL, CX_REDUCE_MEAN, -100, 0, false); }
Test(loss_golden, nll_sum) { run_loss("nll_sum", L_NLL, CX_REDUCE_SUM, -100, 0, false); }
Test(loss_golden, nll_ignore_index) { run_loss("nll_ignore", L_NLL, CX_REDUCE_MEAN, -100, 0, true); }
Test(loss_golden, cross_entropy_mean) { run_loss("ce_mean", L_CE, CX_REDUCE_MEAN, -100, 0, false); }
Test(loss_golden, cross_entropy_sum) { run_loss("ce_sum", L_CE, CX_REDUCE_SUM, -100, 0, false); }
Test(loss_golden, cross_entropy_ignore_index) { run_loss("ce_ignore", L_CE, CX_REDUCE_MEAN, 3, 0, true); }
Test(loss_golden, cross_entropy_label_smoothing) { run_loss("ce_smooth", L_CE, CX_REDUCE_MEAN, -100, 0.1, false); }
Test(loss_golden, cross_entropy_smoothing_ignore) { run_loss("ce_smooth_ignore", L_CE, CX_REDUCE_MEAN, -100, 0.2, true); }

static void run_mse(const char *gcase, cx_reduction red)
{
    int64_t s[2] = { 4, 3 };
    cx_tensor *z = golden_input(gcase, "x", s, 2, 1.0f);
    cx_tensor *y = golden_input(gcase, "target", s, 2, 1.0f);
    cx_requires_grad(z, true);
    cx_step_begin();
    cx_tensor *loss = cx_mse_loss(z, y, red);
    cr_assert(cx_backward(loss) == CX_OK, "%s", cx_last_error());
    cx_keep(loss);
    cr_assert(cx_step_end() == CX_OK, "%s", cx_last_error());
    char key[256];
    snprintf(key, sizeof key, "%s/loss", gcase);
    CHECK(key, loss);
    snprintf(key, sizeof key, "%s/grad/x", gcase);
    CHECK(key, cx_grad(z));
    cx_free(loss);
    cx_zero_grad(z);
    cx_free(z);
    cx_free(y);
}

Test(loss_golden, mse_mean) { run_mse("mse_mean", CX_REDUCE_MEAN); }
Test(loss_golden, mse_sum) { run_mse("mse_sum", CX_REDUCE_SUM); }
