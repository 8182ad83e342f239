/* XLA_USE_BF16 / XLA_DOWNCAST_BF16 (seed 000): tensors made as f32 are held
 * and computed as bf16, read back as f32. Each test sets the variable
 * before its first tensor: Criterion runs every test in a process of its
 * own, and the library reads the variable once, at the first tensor. */
#include <criterion/criterion.h>
#include <cxla/cxla.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float rb(float x) { return cx_bf16_to_f32(cx_f32_to_bf16(x)); }

static void use_bf16(void) { cr_assert_eq(setenv("XLA_USE_BF16", "1", 1), 0); }

Test(use_bf16, f32_tensors_are_held_as_bf16)
{
    use_bf16();
    float v[4] = { 1.0f + 0x1p-12f, 3.14159265f, -2.7182818f, 1e-3f }, back[4];
    int64_t s[1] = { 4 }, s2[2] = { 2, 2 };
    cx_tensor *x = cx_from_host(v, s, 1, CX_F32);
    cr_expect_eq(cx_dtype_of(x), CX_BF16);
    cr_assert_eq(cx_to_host(x, back, CX_F32), CX_OK, "%s", cx_last_error());
    for (int i = 0; i < 4; i++) cr_expect_eq(back[i], rb(v[i]), "x[%d] %.9g, want %.9g", i, back[i], rb(v[i]));
    cx_tensor *made[] = { cx_zeros(s, 1, CX_F32), cx_ones(s2, 2, CX_F32), cx_scalar(0.5, CX_F32),
                          cx_randn(s2, 2, 0, 1, CX_F32), cx_rand(s, 1, 0, 1, CX_F32), cx_placeholder(s, 1, CX_F32) };
    for (size_t i = 0; i < sizeof made / sizeof *made; i++)
        cr_expect_eq(cx_dtype_of(made[i]), CX_BF16, "tensor %zu made as f32 is %s", i, cx_dtype_name(cx_dtype_of(made[i])));
    cx_tensor *idx = cx_zeros(s, 1, CX_I64);
    cr_expect_eq(cx_dtype_of(idx), CX_I64, "integers stay as they are");
    cx_step_begin();
    cx_tensor *m = cx_reshape(x, s2, 2);
    cx_tensor *y = cx_keep(cx_matmul(m, m));
    cr_expect_eq(cx_dtype_of(y), CX_BF16, "computed as bf16");
    cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
    float yv[4];
    cr_assert_eq(cx_to_host(y, yv, CX_F32), CX_OK, "%s", cx_last_error());
    float a = rb(v[0]), b = rb(v[1]), c = rb(v[2]), d = rb(v[3]);
    cr_expect_eq(yv[1], rb(a * b + b * d), "y[0,1] %.9g", yv[1]);
    cx_free(y);
    for (size_t i = 0; i < sizeof made / sizeof *made; i++) cx_free(made[i]);
    cx_free(idx);
    cx_free(x);
    (void)c;
}

/* The SPMD loader's and the sharded checkpoint's constructors hold f32 as
 * cx_from_host does (they had kept it f32, so a --precision bf16 SPMD run
 * computed its products in f32). A one-device mesh: the shard is it all. */
Test(use_bf16, sharded_constructors_hold_f32_as_bf16)
{
    use_bf16();
    cr_assert_eq(cx_use_spmd(), CX_OK, "%s", cx_last_error());
    cx_mesh *mesh = cx_mesh_new((int[]){ 0 }, 1, (int[]){ 1 }, (const char *const[]){ "data" });
    cr_assert(mesh, "%s", cx_last_error());
    const float v[4] = { 1.0f + 0x1p-12f, 3.14159265f, -2.7182818f, 1e-3f };
    const int64_t shape[2] = { 2, 2 };
    const cx_spec_entry spec[2] = { CX_SPEC_NAME("data"), CX_SPEC_NONE };
    const int64_t ids[2] = { 7, -3 };
    cx_tensor *made[] = { cx_from_host_sharded(v, 0, shape, 2, CX_F32, mesh, spec, 2),
                          cx_from_local_shard(v, shape, 2, CX_F32, mesh, spec, 2),
                          cx_from_host_sharded(ids, 0, shape, 1, CX_I64, mesh, spec, 1) };
    for (int i = 0; i < 2; i++) {
        cr_assert_not(cx_tensor_error(made[i]), "%s", cx_last_error());
        cr_expect_eq(cx_dtype_of(made[i]), CX_BF16, "sharded tensor %d made as f32 is %s", i,
                     cx_dtype_name(cx_dtype_of(made[i])));
        float back[4];
        cr_assert_eq(cx_to_host(made[i], back, CX_F32), CX_OK, "%s", cx_last_error());
        for (int k = 0; k < 4; k++) cr_expect_eq(back[k], rb(v[k]), "tensor %d [%d] %.9g, want %.9g", i, k, back[k], rb(v[k]));
    }
    cr_expect_eq(cx_dtype_of(made[2]), CX_I64, "integers stay as they are");
    int64_t ids_back[2];
    cr_assert_eq(cx_to_host(made[2], ids_back, CX_I64), CX_OK, "%s", cx_last_error());
    cr_expect(ids_back[0] == 7 && ids_back[1] == -3);
    for (size_t i = 0; i < sizeof made / sizeof *made; i++) cx_free(made[i]);
}

Test(use_bf16, downcast_is_the_same_for_f32)
{
    cr_assert_eq(setenv("XLA_DOWNCAST_BF16", "1", 1), 0);
    int64_t s[1] = { 3 };
    cx_tensor *x = cx_ones(s, 1, CX_F32);
    cr_expect_eq(cx_dtype_of(x), CX_BF16);
    cx_free(x);
}

Test(use_bf16, off_by_default_and_yes_is_refused)
{
    cr_assert_eq(setenv("XLA_USE_BF16", "yes", 1), 0);
    char msg[256];
    cr_expect_not(cx_settings_check(msg, sizeof msg));
    cr_expect_str_eq(msg, "bad XLA_USE_BF16 'yes': want one of 0, 1 (default 0)");
    int64_t s[1] = { 3 };
    cx_tensor *x = cx_ones(s, 1, CX_F32);
    cr_expect_eq(cx_dtype_of(x), CX_F32, "a bad value means the default, f32");
    cx_free(x);
}

/* A Linear trained with SGD: parameters, gradients and the update all bf16,
 * and the loss still falls */
Test(use_bf16, trains_in_bf16)
{
    use_bf16();
    cx_manual_seed(3);
    cx_module *lin = cx_nn_linear(4, 1, true);
    cr_assert(lin, "%s", cx_last_error());
    int n;
    cx_named_tensor *ps = cx_module_parameters(lin, &n);
    cr_assert(ps);
    for (int i = 0; i < n; i++) cr_expect_eq(cx_dtype_of(ps[i].tensor), CX_BF16, "%s", ps[i].name);
    cx_sgd_opts o = cx_sgd_default_opts();
    o.lr = 0.3;
    cx_optimizer *opt = cx_optim_sgd(ps, n, o);
    cr_assert(opt, "%s", cx_last_error());
    float xv[8 * 4], yv[8];
    for (int i = 0; i < 8; i++) {
        yv[i] = 0;
        for (int j = 0; j < 4; j++) { xv[i * 4 + j] = (float)((i * 7 + j * 3) % 5) / 4.0f - 0.5f; yv[i] += (float)(j + 1) * xv[i * 4 + j]; }
    }
    int64_t xs[2] = { 8, 4 }, ys[2] = { 8, 1 };
    double first = 0, last = 0;
    for (int step = 0; step < 60; step++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *x = cx_from_host(xv, xs, 2, CX_F32), *y = cx_from_host(yv, ys, 2, CX_F32);
        cx_tensor *loss = cx_keep(cx_mse_loss(cx_module_forward(lin, x), y, CX_REDUCE_MEAN));
        cr_assert_eq(cx_backward(loss), CX_OK, "%s", cx_last_error());
        cr_assert_eq(cx_optim_step(opt), CX_OK, "%s", cx_last_error());
        cr_assert_eq(cx_step_end(), CX_OK, "%s", cx_last_error());
        cr_expect_eq(cx_dtype_of(loss), CX_BF16);
        double l = cx_item(loss);
        if (step == 0) first = l;
        last = l;
        cx_free(loss);
    }
    for (int i = 0; i < n; i++) cr_expect_eq(cx_dtype_of(ps[i].tensor), CX_BF16, "%s after training", ps[i].name);
    cr_expect(last < 0.2 * first, "loss %g -> %g", first, last);
    free(ps);
    cx_optim_free(opt);
    cx_module_free(lin);
}
