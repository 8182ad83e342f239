/* Modules: names, state dicts, parameter order, modes, initialization,
 * dropout, and constructor errors. */
#include <criterion/criterion.h>

#include <cxla/cxla.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void expect_names(cx_named_tensor *nt, int n, const char *const *want, int nwant)
{
    cr_assert_eq(n, nwant, "got %d names, want %d", n, nwant);
    for (int i = 0; i < n; i++) cr_expect_str_eq(nt[i].name, want[i]);
}

Test(nn_module, state_dict_keys_compose_like_pytorch)
{
    cx_module *mods[4] = { cx_nn_conv2d(1, 2, 3, cx_conv2d_default_opts()),
                           cx_nn_batch_norm2d(2, cx_batch_norm_default_opts()), cx_nn_relu(),
                           cx_nn_linear(4, 3, true) };
    cx_module *seq = cx_nn_sequential(mods, 4);
    cr_assert(seq, "%s", cx_last_error());
    int n;
    cx_named_tensor *sd = cx_module_state_dict(seq, &n);
    static const char *const want[] = { "0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                        "1.running_var", "1.num_batches_tracked", "3.weight", "3.bias" };
    expect_names(sd, n, want, 9);
    free(sd);
    cx_named_tensor *ps = cx_module_parameters(seq, &n);
    static const char *const wantp[] = { "0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias" };
    expect_names(ps, n, wantp, 6);
    for (int i = 0; i < n; i++) cr_expect(cx_get_requires_grad(ps[i].tensor), "%s requires grad", ps[i].name);
    free(ps);
    cx_named_tensor *bs = cx_module_buffers(seq, &n);
    static const char *const wantb[] = { "1.running_mean", "1.running_var", "1.num_batches_tracked" };
    expect_names(bs, n, wantb, 3);
    cr_expect_eq(cx_dtype_of(bs[2].tensor), CX_I64);
    free(bs);
    cr_expect(cx_module_get(seq, "1.running_var") != NULL);
    cr_expect(cx_module_get(seq, "3.bias") != NULL);
    cr_expect(cx_module_get(seq, "3.nope") == NULL);
    cr_expect(cx_module_get(seq, "7.weight") == NULL);
    cr_expect_str_eq(cx_module_type_name(cx_module_find(seq, "1")), "BatchNorm2d");
    cr_expect_eq(cx_module_num_params(seq), 2 * 9 + 2 + 2 + 2 + 12 + 3);
    cx_module_free(seq);
}

Test(nn_module, transformer_block_names)
{
    cx_module *b = cx_nn_transformer_block(8, 2);
    cr_assert(b, "%s", cx_last_error());
    int n;
    cx_named_tensor *ps = cx_module_parameters(b, &n);
    static const char *const want[] = { "ln_1.weight", "ln_1.bias", "attn.qkv.weight", "attn.qkv.bias",
                                        "attn.proj.weight", "attn.proj.bias", "ln_2.weight", "ln_2.bias",
                                        "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias" };
    expect_names(ps, n, want, 12);
    free(ps);
    cr_expect_eq(cx_module_num_params(b), 2 * 8 + (24 * 8 + 24) + (64 + 8) + 2 * 8 + (32 * 8 + 32) + (8 * 32 + 8));
    cx_module_free(b);
}

static bool entry_is(cx_module_sig_entry e, const char *want)
{
    return e.len == (int)strlen(want) && !strncmp(e.text, want, (size_t)e.len);
}

Test(nn_module, signature_lists_structure_in_state_dict_order)
{
    cx_module *mods[2] = { cx_nn_linear(3, 2, true), cx_nn_batch_norm2d(2, cx_batch_norm_default_opts()) };
    cx_module *seq = cx_nn_sequential(mods, 2);
    cr_assert(seq, "%s", cx_last_error());
    char *sig = cx_module_signature(seq);
    cr_assert(sig, "%s", cx_last_error());
    cr_expect_str_eq(sig, "0.weight:f32:(2, 3);0.bias:f32:(2);1.weight:f32:(2);1.bias:f32:(2);"
                          "buffer 1.running_mean:f32:(2);buffer 1.running_var:f32:(2);"
                          "buffer 1.num_batches_tracked:i64:();");
    /* values play no part */
    float w[6] = { 1, 2, 3, 4, 5, 6 };
    cr_assert_eq(cx_module_load(seq, "0.weight", w, CX_F32), CX_OK);
    char *again = cx_module_signature(seq);
    cr_expect_str_eq(again, sig);
    cx_module_sig_entry ea, eb;
    cr_expect(!cx_module_signature_diff(sig, again, &ea, &eb));
    free(again);
    cx_module *other = cx_nn_linear(3, 4, true);
    char *osig = cx_module_signature(other);
    cr_assert(osig);
    /* the differing entry, whole, from both texts */
    cr_assert(cx_module_signature_diff(sig, osig, &ea, &eb));
    cr_expect(entry_is(ea, "0.weight:f32:(2, 3)"), "%.*s", ea.len, ea.text);
    cr_expect(entry_is(eb, "weight:f32:(4, 3)"), "%.*s", eb.len, eb.text);
    /* one text ending first: an empty entry on that side */
    cr_assert(cx_module_signature_diff("a:f32:(1);", "a:f32:(1);b:f32:(2);", &ea, &eb));
    cr_expect_eq(ea.len, 0);
    cr_expect(entry_is(eb, "b:f32:(2)"), "%.*s", eb.len, eb.text);
    cr_expect(!cx_module_signature_diff(NULL, "", NULL, NULL));
    cr_expect_null(cx_module_signature(NULL));
    free(osig);
    free(sig);
    cx_module_free(other);
    cx_module_free(seq);
}

Test(nn_module, train_eval_propagates)
{
    cx_module *mods[2] = { cx_nn_dropout(0.5), cx_nn_linear(2, 2, true) };
    cx_module *seq = cx_nn_sequential(mods, 2);
    cr_assert(cx_module_is_training(seq));
    cx_module_train(seq, false);
    cr_expect(!cx_module_is_training(cx_module_find(seq, "0")));
    cx_module_train(seq, true);
    cr_expect(cx_module_is_training(cx_module_find(seq, "1")));
    cx_module_free(seq);
}

static double host_stats(cx_tensor *t, double *mean, double *maxabs)
{
    int64_t n = cx_numel(t);
    float *v = malloc((size_t)n * sizeof *v);
    cr_assert(v && cx_to_host(t, v, CX_F32) == CX_OK);
    double s = 0, s2 = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        s2 += (double)v[i] * v[i];
        if (fabs(v[i]) > mx) mx = fabs(v[i]);
    }
    free(v);
    *mean = s / (double)n;
    *maxabs = mx;
    return sqrt(s2 / (double)n - *mean * *mean);
}

Test(nn_module, init_matches_pytorch_distributions)
{
    cx_manual_seed(3);
    cx_module *l = cx_nn_linear(400, 300, true);
    cr_assert(l, "%s", cx_last_error());
    double mean, mx;
    /* kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in)); its std is bound/sqrt(3). */
    double bound = 1.0 / sqrt(400.0);
    double sd = host_stats(cx_module_get(l, "weight"), &mean, &mx);
    cr_expect(mx <= bound, "max |w| %g > bound %g", mx, bound);
    cr_expect(mx > 0.99 * bound);
    cr_expect(fabs(sd - bound / sqrt(3.0)) < 0.02 * bound, "std %g", sd);
    cr_expect(fabs(mean) < 0.01 * bound);
    host_stats(cx_module_get(l, "bias"), &mean, &mx);
    cr_expect(mx <= bound);
    cx_module_free(l);

    cx_module *c = cx_nn_conv2d(8, 16, 3, cx_conv2d_default_opts());
    cr_assert(c);
    bound = 1.0 / sqrt(8.0 * 9.0);
    host_stats(cx_module_get(c, "weight"), &mean, &mx);
    cr_expect(mx <= bound && mx > 0.95 * bound, "conv max |w| %g, bound %g", mx, bound);
    cx_module_free(c);

    cx_module *e = cx_nn_embedding(1000, 64);
    cr_assert(e);
    sd = host_stats(cx_module_get(e, "weight"), &mean, &mx);
    cr_expect(fabs(sd - 1.0) < 0.02 && fabs(mean) < 0.02, "embedding mean %g std %g", mean, sd);
    cx_module_free(e);

    cx_module *ln = cx_nn_layer_norm(5, 1e-5, true);
    cr_expect_eq(cx_item(cx_sum(cx_module_get(ln, "weight"), NULL, 0, false)), 5.0);
    cr_expect_eq(cx_item(cx_sum(cx_module_get(ln, "bias"), NULL, 0, false)), 0.0);
    cx_module_free(ln);
}

Test(nn_module, init_is_seeded)
{
    float a[12], b[12], c[12];
    cx_manual_seed(11);
    cx_module *l1 = cx_nn_linear(4, 3, false);
    cx_to_host(cx_module_get(l1, "weight"), a, CX_F32);
    cx_manual_seed(11);
    cx_module *l2 = cx_nn_linear(4, 3, false);
    cx_to_host(cx_module_get(l2, "weight"), b, CX_F32);
    cx_manual_seed(12);
    cx_module *l3 = cx_nn_linear(4, 3, false);
    cx_to_host(cx_module_get(l3, "weight"), c, CX_F32);
    cr_expect(memcmp(a, b, sizeof a) == 0, "same seed, same weights");
    cr_expect(memcmp(a, c, sizeof a) != 0, "another seed, other weights");
    cx_module_free(l1);
    cx_module_free(l2);
    cx_module_free(l3);
}

Test(nn_module, dropout_train_and_eval)
{
    cx_module *d = cx_nn_dropout(0.25);
    cr_assert(d);
    int64_t s[1] = { 20000 };
    cx_tensor *x = cx_ones(s, 1, CX_F32);
    cx_step_begin();
    cx_tensor *y = cx_keep(cx_module_forward(d, x));
    cr_assert(cx_step_end() == CX_OK, "%s", cx_last_error());
    float *v = malloc(20000 * sizeof *v);
    cr_assert(v && cx_to_host(y, v, CX_F32) == CX_OK);
    int zeros = 0;
    for (int i = 0; i < 20000; i++) {
        if (v[i] == 0.0f) zeros++;
        else cr_assert_float_eq(v[i], 1.0f / 0.75f, 1e-6);
    }
    cr_expect(zeros > 4600 && zeros < 5400, "%d zeros of 20000 at p = 0.25", zeros);
    cx_free(y);
    cx_module_train(d, false);
    cx_step_begin();
    y = cx_keep(cx_module_forward(d, x));
    cr_assert(cx_step_end() == CX_OK);
    cr_assert(cx_to_host(y, v, CX_F32) == CX_OK);
    for (int i = 0; i < 20000; i++) cr_assert_eq(v[i], 1.0f);
    free(v);
    cx_free(y);
    cx_free(x);
    cx_module_free(d);
}

Test(nn_module, bad_arguments_are_one_line_errors)
{
    cr_expect(cx_nn_linear(0, 3, true) == NULL);
    cr_expect(strstr(cx_last_error(), "cx_nn_linear") != NULL, "%s", cx_last_error());
    cr_expect(cx_nn_dropout(1.5) == NULL);
    cr_expect(strstr(cx_last_error(), "1.5") != NULL, "%s", cx_last_error());
    cr_expect(cx_nn_transformer_block(10, 3) == NULL);
    cr_expect(strchr(cx_last_error(), '\n') == NULL);
    cx_module *l = cx_nn_linear(2, 2, true);
    int64_t s[1] = { 2 };
    cr_expect_eq(cx_module_register_parameter(l, "weight", cx_zeros(s, 1, CX_F32)), -1);
    cr_expect(strstr(cx_last_error(), "already") != NULL, "%s", cx_last_error());
    cr_expect_eq(cx_module_register_buffer(l, "a.b", cx_zeros(s, 1, CX_F32)), -1);
    float v[2] = { 1, 2 };
    cr_expect_eq(cx_module_load(l, "nope", v, CX_F32), CX_ERR_ARG);
    cr_expect(strstr(cx_last_error(), "nope") != NULL);
    cx_module *seq = cx_nn_sequential((cx_module *[]){ cx_nn_relu(), NULL }, 2);
    cr_expect(seq == NULL);
    cr_expect(strstr(cx_last_error(), "module 1") != NULL, "%s", cx_last_error());
    cx_module_free(l);
    cx_module_free(NULL);
    cr_expect(cx_tensor_error(cx_module_forward(NULL, NULL)) != NULL);
}

Test(nn_module, forward_shapes)
{
    int64_t xs[4] = { 2, 3, 9, 9 };
    cx_tensor *x = cx_zeros(xs, 4, CX_F32);
    cx_step_begin();
    cx_module *ap = cx_nn_adaptive_avg_pool2d(1, 1);
    cx_tensor *y = cx_module_forward(ap, x);
    cr_expect_eq(cx_ndim(y), 4);
    cr_expect_eq(cx_dim(y, 2), 1);
    cx_module *mp = cx_nn_max_pool2d(3, 2, 1);
    cr_expect_eq(cx_dim(cx_module_forward(mp, x), 3), 5);
    cx_module *fl = cx_nn_flatten(1, -1);
    cr_expect_eq(cx_dim(cx_module_forward(fl, x), 1), 3 * 81);
    cr_assert(cx_step_end() == CX_OK);
    cx_module_free(ap);
    cx_module_free(mp);
    cx_module_free(fl);
    cx_free(x);
}
