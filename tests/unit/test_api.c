/* The public API's promises to a C programmer: a value of the wrong enum
 * family is refused by name, status codes have names, the error buffer may
 * be formatted from itself, the version macros match the library. */
#include <criterion/criterion.h>
#include <cxla/cxla.h>

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
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

Test(api, status_str_names_every_code)
{
    cr_expect_str_eq(cx_status_str(CX_OK), "CX_OK");
    cr_expect_str_eq(cx_status_str(CX_ERR_SHAPE), "CX_ERR_SHAPE");
    cr_expect_str_eq(cx_status_str(CX_ERR_ARG), "CX_ERR_ARG");
    cr_expect_str_eq(cx_status_str(CX_ERR_OOM), "CX_ERR_OOM");
    cr_expect_str_eq(cx_status_str(CX_ERR_IO), "CX_ERR_IO");
    cr_expect_str_eq(cx_status_str(CX_ERR_COMM), "CX_ERR_COMM");
    cr_expect_str_eq(cx_status_str(CX_ERR_STATE), "CX_ERR_STATE");
    cr_expect_str_eq(cx_status_str((cx_status)99), "CX_ERR_UNKNOWN");
    cr_expect_str_eq(cx_status_str((cx_status)-1), "CX_ERR_UNKNOWN");
}

Test(api, set_last_error_from_itself)
{
    cx_set_last_error("load %s", "w.h5");
    cx_set_last_error("%s: more", cx_last_error());
    cr_expect_str_eq(cx_last_error(), "load w.h5: more");
    /* the argument starting inside the buffer, shifted by the format */
    cx_set_last_error("abcdef");
    cx_set_last_error("[%s]", cx_last_error() + 2);
    cr_expect_str_eq(cx_last_error(), "[cdef]");
    /* a message that fills the buffer is cut, not overrun */
    char big[1500];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    cx_set_last_error("%s", big);
    cx_set_last_error("%s%s", cx_last_error(), cx_last_error());
    cr_expect_eq(strlen(cx_last_error()), 1023);
    cx_clear_error();
}

/* Items fail from index 20 on: the second batch of 16 cannot be gathered. */
static cx_status failing_get(void *ctx, int64_t index, void *const *item)
{
    (void)ctx;
    if (index >= 20) {
        cx_set_last_error("item %lld is unreadable", (long long)index);
        return CX_ERR_IO;
    }
    *(float *)item[0] = (float)index;
    return CX_OK;
}

Test(api, loader_tells_an_error_from_the_end)
{
    cx_field f = { .name = "v", .dtype = CX_F32, .ndim = 0 };
    cx_dataset_desc d = { CX_STRUCT_SIZE(cx_dataset_desc), .size = 40, .nfields = 1, .fields = &f, .get = failing_get };
    cx_dataset *ds = cx_dataset_new(&d);
    cr_assert(ds, "%s", cx_last_error());
    cx_sampler_opts so = cx_sampler_default_opts();
    so.shuffle = false;
    cx_sampler *s = cx_sampler_new(40, so);
    cx_loader_opts lo = cx_loader_default_opts();
    lo.batch_size = 16;
    cx_loader *l = cx_loader_new(ds, s, lo);
    cr_assert(l, "%s", cx_last_error());
    cx_batch b;
    cr_assert_eq(cx_loader_next(l, &b), CX_LOADER_BATCH, "%s", cx_last_error());
    cr_expect_eq(cx_loader_next(l, &b), CX_LOADER_ERROR);
    cr_expect(strstr(cx_last_error(), "unreadable") != NULL, "%s", cx_last_error());
    cr_expect_eq(b.nfields, 0, "no batch with an error");
    cr_expect_eq(cx_loader_error(l), CX_ERR_IO);
    cr_expect_eq(cx_loader_next(l, &b), CX_LOADER_END, "the error is reported once");
    cr_expect_eq(cx_loader_error(l), CX_ERR_IO, "and kept");

    /* a whole epoch that ends well ends with CX_LOADER_END */
    cx_loader_opts lo2 = lo;
    lo2.batch_size = 10;
    cx_sampler *s2 = cx_sampler_new(20, so);
    cx_loader *l2 = cx_loader_new(ds, s2, lo2);
    cr_assert(l2, "%s", cx_last_error());
    int n = 0;
    cx_loader_result r;
    while ((r = cx_loader_next(l2, &b)) == CX_LOADER_BATCH) n++;
    cr_expect_eq(r, CX_LOADER_END);
    cr_expect_eq(n, 2);
    cr_expect_eq(cx_loader_error(l2), CX_OK);
    cx_loader_free(l2);
    cx_sampler_free(s2);
    cx_loader_free(l);
    cx_sampler_free(s);
    cx_dataset_free(ds);
}

Test(api, version_of_the_library_is_the_headers)
{
    cr_expect_eq(cx_version_number(), (unsigned)CX_VERSION_NUMBER);
    cr_expect_eq(cx_version_number(),
                 (unsigned)(CX_VERSION_MAJOR * 10000 + CX_VERSION_MINOR * 100 + CX_VERSION_PATCH));
    char s[32];
    snprintf(s, sizeof s, "%d.%d.%d", CX_VERSION_MAJOR, CX_VERSION_MINOR, CX_VERSION_PATCH);
    cr_expect_str_eq(s, CX_VERSION_STRING);
}

static cx_tensor *id_forward(cx_module *m, cx_tensor *x)
{
    (void)m;
    return cx_alias(x);
}

static int g_freed;
static void count_free(void *impl)
{
    (void)impl;
    g_freed++;
}

Test(api, sized_structs_refuse_a_missing_size)
{
    /* a type zeroed by hand: refused by name, its impl still released */
    cx_module_type bad = { .name = "NoSize", .forward = id_forward, .free = count_free };
    g_freed = 0;
    cr_expect_null(cx_module_new(&bad, &g_freed));
    cr_expect(strstr(cx_last_error(), "cx_module_type.struct_size is 0") != NULL, "%s", cx_last_error());
    cr_expect_eq(g_freed, 1);
    cx_module_type good = { CX_STRUCT_SIZE(cx_module_type), .name = "Sized", .forward = id_forward };
    cx_module *m = cx_module_new(&good, NULL);
    cr_assert(m, "%s", cx_last_error());
    cr_expect_str_eq(cx_module_type_name(m), "Sized");
    cx_module_free(m);

    cx_comm_backend be = { .name = "unsized" };
    cr_expect_eq(cx_comm_register(&be), CX_ERR_ARG);
    cr_expect(strstr(cx_last_error(), "cx_comm_backend.struct_size") != NULL, "%s", cx_last_error());
    cr_expect_eq(cx_world_size(), 1, "the world of one is kept");

    cx_field f = { .name = "v", .dtype = CX_F32, .ndim = 0 };
    cx_dataset_desc d = { .size = 4, .nfields = 1, .fields = &f, .get = failing_get };
    cr_expect_null(cx_dataset_new(&d));
    cr_expect(strstr(cx_last_error(), "cx_dataset_desc.struct_size") != NULL, "%s", cx_last_error());
    d.struct_size = sizeof d;
    cx_dataset *ds = cx_dataset_new(&d);
    cr_assert(ds, "%s", cx_last_error());
    cx_sampler *s = cx_sampler_new(4, cx_sampler_default_opts());
    cx_loader_opts lo = { .batch_size = 2, .prefetch = 1 };
    cr_expect_null(cx_loader_new(ds, s, lo));
    cr_expect(strstr(cx_last_error(), "cx_loader_opts.struct_size") != NULL, "%s", cx_last_error());
    cx_ddp_opts dd = { .bucket_bytes = 1 };
    cx_module *lin = cx_nn_linear(2, 2, true);
    cr_expect_null(cx_ddp_wrap(lin, dd));
    cr_expect(strstr(cx_last_error(), "cx_ddp_opts.struct_size") != NULL, "%s", cx_last_error());
    cx_ckpt_opts co = { .verify = true };
    cr_expect_eq(cx_ckpt_save_opts("/tmp/cx-test-api-never", cx_ckpt_model_single(lin), NULL, NULL, co), CX_ERR_ARG);
    cr_expect(strstr(cx_last_error(), "cx_ckpt_opts.struct_size") != NULL, "%s", cx_last_error());
    cx_module_free(lin);
    cx_sampler_free(s);
    cx_dataset_free(ds);
}

/* The size of T through `field`, as util/cx_struct.h has it: what a caller
 * whose headers ended the struct there would pass. */
#define SIZE_THROUGH(T, field) (offsetof(T, field) + sizeof(((T *)0)->field))

static void expect_last(const char *needle)
{
    cr_expect(strstr(cx_last_error(), needle) != NULL, "\"%s\" does not say \"%s\"", cx_last_error(), needle);
}

Test(api, layer_options_refuse_a_missing_size)
{
    cx_conv2d_opts co = { .stride = 1, .dilation = 1, .groups = 1, .bias = true };
    cr_expect_null(cx_nn_conv2d(1, 1, 3, co));
    expect_last("cx_conv2d_opts.struct_size is 0");
    co.struct_size = SIZE_THROUGH(cx_conv2d_opts, groups);
    cr_expect_null(cx_nn_conv2d(1, 1, 3, co), "below the first version's end");
    expect_last("cx_conv2d_opts.struct_size");
    /* the first version without its trailing padding is all there is to read */
    co.struct_size = SIZE_THROUGH(cx_conv2d_opts, bias);
    cx_module *conv = cx_nn_conv2d(1, 1, 3, co);
    cr_assert(conv, "%s", cx_last_error());
    cr_expect_eq(cx_module_num_own_params(conv), 2, "bias taken from the caller's bytes");
    cx_module_free(conv);

    cx_batch_norm_opts bo = { .eps = 1e-5, .momentum = 0.1 };
    cr_expect_null(cx_nn_batch_norm2d(2, bo));
    expect_last("cx_batch_norm_opts.struct_size is 0");

    cx_module *lin = cx_nn_linear(2, 2, true);
    cx_module_hooks h = { .ctx = lin };
    cr_expect_eq(cx_module_add_hooks(lin, &h), -1);
    expect_last("cx_module_hooks.struct_size is 0");
    h.struct_size = sizeof h;
    cr_expect_eq(cx_module_add_hooks(lin, &h), 0, "%s", cx_last_error());
    cx_module_free(lin);
}

/* cx_module_hooks.outputs: sees the forward's outputs before its hook's
 * post; a failure poisons the forward, and every post still runs. */
typedef struct {
    int outputs, posts;
    int64_t dim0;
    bool fail;
} hook_log;

static cx_status log_outputs(cx_module *m, cx_tensor **out, int n, void *ctx)
{
    hook_log *l = ctx;
    (void)m;
    l->outputs++;
    l->dim0 = n == 1 ? cx_dim(out[0], 0) : -1;
    if (l->fail) { cx_set_last_error("the hook refuses"); return CX_ERR_ARG; }
    return CX_OK;
}

static void log_post(cx_module *m, void *ctx)
{
    (void)m;
    ((hook_log *)ctx)->posts++;
}

Test(api, module_output_hooks)
{
    cx_module *lin = cx_nn_linear(3, 2, true);
    hook_log a = { 0 }, b = { 0 };
    cx_module_hooks ha = { CX_STRUCT_SIZE(cx_module_hooks), .post = log_post, .ctx = &a, .outputs = log_outputs };
    cx_module_hooks hb = { .struct_size = SIZE_THROUGH(cx_module_hooks, ctx), .post = log_post, .ctx = &b };
    cr_assert_eq(cx_module_add_hooks(lin, &ha), 0, "%s", cx_last_error());
    cr_assert_eq(cx_module_add_hooks(lin, &hb), 1, "a first-version hook (no outputs): %s", cx_last_error());
    int64_t shape[2] = { 5, 3 };
    float x[15] = { 0 };
    cx_tensor *in = cx_from_host(x, shape, 2, CX_F32), *y = cx_module_forward(lin, in);
    cr_expect_null(cx_tensor_error(y));
    cr_expect(a.outputs == 1 && a.dim0 == 5 && a.posts == 1 && b.posts == 1, "outputs %d (dim0 %lld), posts %d and %d",
              a.outputs, (long long)a.dim0, a.posts, b.posts);
    cx_free(y);
    a.fail = true;
    y = cx_module_forward(lin, in);
    cr_expect(cx_tensor_error(y) && strstr(cx_tensor_error(y), "the hook refuses"), "a failed outputs hook: %s",
              cx_tensor_error(y) ? cx_tensor_error(y) : "no error");
    cr_expect(a.posts == 2 && b.posts == 2, "posts after a failure: %d and %d", a.posts, b.posts);
    cx_tensor *outs[1];
    cr_expect_eq(cx_module_forward_many(lin, &in, 1, outs, 1), -1);
    cr_expect_null(outs[0], "a failed forward_many leaves no output");
    cx_free(y);
    cx_free(in);
    cx_module_free(lin);
}

Test(api, optimizer_options_refuse_a_missing_size)
{
    cx_module *lin = cx_nn_linear(2, 2, true);
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(lin, &n);
    cr_assert(ps && n == 2);
    cx_sgd_opts so = { .lr = 0.1 };
    cr_expect_null(cx_optim_sgd(ps, n, so));
    expect_last("cx_sgd_opts.struct_size is 0");
    cx_adam_opts ao = { .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999 };
    cr_expect_null(cx_optim_adamw(ps, n, ao));
    expect_last("AdamW: cx_adam_opts.struct_size is 0");
    ao.struct_size = SIZE_THROUGH(cx_adam_opts, weight_decay);
    cr_expect_null(cx_optim_adam(ps, n, ao), "older than the first version");
    expect_last("cx_adam_opts.struct_size");

    cx_param_group g = { .params = ps, .n = n, .lr_scale = 1.0 };
    cr_expect_null(cx_optim_sgd_groups(&g, 1, cx_sgd_default_opts()));
    expect_last("cx_param_group.struct_size is 0");
    cx_param_group two[2] = { cx_param_group_of(ps, 1, 0.1), cx_param_group_of(ps + 1, 1, 0.0) };
    two[1].struct_size = 0;
    cr_expect_null(cx_optim_sgd_groups(two, 2, cx_sgd_default_opts()));
    expect_last("parameter group 1: cx_param_group.struct_size is 0, not the");

    cx_lr_schedule s = { .kind = CX_LR_CONSTANT, .base_lr = 0.5 };
    cr_expect(isnan(cx_lr_at(&s, 0)));
    expect_last("cx_lr_schedule.struct_size is 0");
    s.struct_size = sizeof s;
    cr_expect_eq(cx_lr_at(&s, 3), 0.5);
    free(ps);
    cx_module_free(lin);
}

/* A caller built against newer headers: its cx_param_group has a member
 * this library does not know, and its array steps by that larger size. */
typedef struct {
    cx_param_group g;
    double added_later;
} newer_group;

Test(api, param_groups_step_by_the_callers_size)
{
    cx_module *lin = cx_nn_linear(2, 2, true);
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(lin, &n);
    cr_assert(ps && n == 2);
    newer_group groups[2] = { { cx_param_group_of(ps, 1, 0.1), -1.0 }, { cx_param_group_of(ps + 1, 1, 0.0), -1.0 } };
    for (int i = 0; i < 2; i++) groups[i].g.struct_size = sizeof(newer_group);
    cx_optimizer *opt = cx_optim_adamw_groups(&groups[0].g, 2, cx_adamw_default_opts());
    cr_assert(opt, "%s", cx_last_error());
    cr_expect_eq(cx_optim_num_groups(opt), 2);
    int np = 0;
    cx_named_tensor *got = cx_optim_params(opt, &np);
    cr_assert_eq(np, 2);
    cr_expect_str_eq(got[0].name, ps[0].name);
    cr_expect_str_eq(got[1].name, ps[1].name, "the second group read at the caller's stride");
    free(got);
    cx_optim_free(opt);
    free(ps);
    cx_module_free(lin);
}

/* The structs the library fills in the caller's memory (cx_gpt_config_of,
 * cx_param_groups_by_ndim) sit in a buffer of canary bytes: whatever the
 * caller's struct_size says is all the library may write. */
#define CANARY 0xa5

static void canary_with_size(void *buf, size_t n, size_t struct_size)
{
    memset(buf, CANARY, n);
    memcpy(buf, &struct_size, sizeof struct_size);
}

static void expect_canary(const void *buf, size_t from, size_t to, const char *what)
{
    const unsigned char *b = buf;
    for (size_t i = from; i < to; i++) cr_assert_eq(b[i], CANARY, "%s: byte %zu written", what, i);
}

Test(api, gpt_config_of_writes_only_the_callers_size)
{
    cx_gpt_config c = cx_gpt_default_config();
    c.vocab_size = 16, c.block_size = 4, c.n_layer = 1, c.n_head = 1, c.n_embd = 4;
    cx_module *m = cx_nn_gpt(c);
    cr_assert(m, "%s", cx_last_error());
    union {
        cx_gpt_config c;
        unsigned char b[sizeof(cx_gpt_config) + 32];
    } u;
    canary_with_size(&u, sizeof u, sizeof(cx_gpt_config));
    cr_assert_eq(cx_gpt_config_of(m, &u.c), CX_OK, "%s", cx_last_error());
    cr_expect_eq(u.c.struct_size, sizeof(cx_gpt_config));
    cr_expect(u.c.vocab_size == 16 && u.c.block_size == 4 && u.c.n_layer == 1 && u.c.n_head == 1 && u.c.n_embd == 4);
    expect_canary(&u, sizeof(cx_gpt_config), sizeof u, "this caller's size");

    /* a caller with newer headers: its members past ours keep their bytes */
    canary_with_size(&u, sizeof u, sizeof(cx_gpt_config) + 16);
    cr_assert_eq(cx_gpt_config_of(m, &u.c), CX_OK, "%s", cx_last_error());
    cr_expect_eq(u.c.struct_size, sizeof(cx_gpt_config) + 16, "the caller's size stays");
    cr_expect_eq(u.c.n_embd, 4);
    expect_canary(&u, sizeof(cx_gpt_config), sizeof u, "a newer caller's");

    /* older than the first version: refused, nothing written */
    canary_with_size(&u, sizeof u, SIZE_THROUGH(cx_gpt_config, n_head));
    cr_expect_eq(cx_gpt_config_of(m, &u.c), CX_ERR_ARG);
    expect_last("cx_gpt_config_of: cx_gpt_config.struct_size is");
    expect_canary(&u, sizeof(size_t), sizeof u, "a refused size");
    cr_expect_eq(cx_gpt_config_of(m, NULL), CX_ERR_ARG);
    cx_module_free(m);
}

Test(api, param_groups_by_ndim_write_at_the_callers_size)
{
    cx_module *lin = cx_nn_linear(2, 2, true);
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(lin, &n), scratch[2];
    cr_assert(ps && n == 2);
    /* a newer caller's groups: 16 bytes more each, and its array that far apart */
    const size_t stride = sizeof(cx_param_group) + 16;
    union {
        cx_param_group g;
        unsigned char b[2 * (sizeof(cx_param_group) + 16) + 16];
    } u;
    canary_with_size(&u, sizeof u, stride);
    cr_assert_eq(cx_param_groups_by_ndim(ps, n, 0.1, scratch, &u.g), 2, "%s", cx_last_error());
    for (int g = 0; g < 2; g++) {
        cx_param_group got;
        memcpy(&got, u.b + g * stride, sizeof got);
        cr_expect_eq(got.struct_size, stride, "group %d carries the caller's size", g);
        cr_expect_eq(got.n, 1);
        cr_expect_eq(got.weight_decay, g ? 0.0 : 0.1);
        cr_expect_eq(got.lr_scale, 1.0);
        expect_canary(u.b + g * stride, sizeof(cx_param_group), stride, "a newer caller's group");
    }
    expect_canary(&u, 2 * stride, sizeof u, "past the caller's two groups");

    canary_with_size(&u, sizeof u, sizeof(cx_param_group));
    cr_assert_eq(cx_param_groups_by_ndim(ps, n, 0.1, scratch, &u.g), 2, "%s", cx_last_error());
    expect_canary(&u, 2 * sizeof(cx_param_group), sizeof u, "past this caller's two groups");

    canary_with_size(&u, sizeof u, SIZE_THROUGH(cx_param_group, lr_scale));
    cr_expect_eq(cx_param_groups_by_ndim(ps, n, 0.1, scratch, &u.g), -1);
    expect_last("out[0].struct_size is");
    expect_canary(&u, sizeof(size_t), sizeof u, "a refused size");
    free(ps);
    cx_module_free(lin);
}

/* The default functions are built into the caller at its own size. */
Test(api, defaults_carry_the_callers_size)
{
    cr_expect_eq(cx_ddp_default_opts().struct_size, sizeof(cx_ddp_opts));
    cr_expect_eq(cx_fsdp_default_opts().struct_size, sizeof(cx_fsdp_opts));
    cr_expect_eq(cx_ckpt_default_opts().struct_size, sizeof(cx_ckpt_opts));
    cr_expect_eq(cx_ckpt_manager_default_opts().struct_size, sizeof(cx_ckpt_manager_opts));
    cr_expect_eq(cx_ckpt_consolidate_default_opts().struct_size, sizeof(cx_ckpt_consolidate_opts));
    cr_expect_eq(cx_mnist_default_opts().struct_size, sizeof(cx_mnist_opts));
    cr_expect_eq(cx_fake_data_default_opts().struct_size, sizeof(cx_fake_data_opts));
    cr_expect_eq(cx_text_default_opts().struct_size, sizeof(cx_text_opts));
    cr_expect_eq(cx_sampler_default_opts().struct_size, sizeof(cx_sampler_opts));
    cr_expect_eq(cx_loader_default_opts().struct_size, sizeof(cx_loader_opts));
    cr_expect_eq(cx_gpt_default_config().struct_size, sizeof(cx_gpt_config));
    cr_expect_eq(cx_conv2d_default_opts().struct_size, sizeof(cx_conv2d_opts));
    cr_expect_eq(cx_batch_norm_default_opts().struct_size, sizeof(cx_batch_norm_opts));
    cr_expect_eq(cx_sgd_default_opts().struct_size, sizeof(cx_sgd_opts));
    cr_expect_eq(cx_adam_default_opts().struct_size, sizeof(cx_adam_opts));
    cr_expect_eq(cx_adamw_default_opts().weight_decay, 1e-2);
    cr_expect_eq(cx_lr_schedule_default_opts().struct_size, sizeof(cx_lr_schedule));
    cr_expect_eq(cx_param_group_of(NULL, 0, 0.0).struct_size, sizeof(cx_param_group));
}

Test(api, data_options_refuse_a_missing_size)
{
    cx_sampler_opts so = { .world_size = 1 };
    cr_expect_null(cx_sampler_new(4, so));
    expect_last("cx_sampler_opts.struct_size is 0");
    so.struct_size = SIZE_THROUGH(cx_sampler_opts, world_size);
    cr_expect_null(cx_sampler_new(4, so), "older than the first version");
    expect_last("cx_sampler_opts.struct_size");

    cx_dataset *ds = NULL;
    cx_fake_data_opts fo = { .size = 4, .channels = 1, .height = 2, .width = 2, .num_classes = 2 };
    cr_expect_eq(cx_fake_data(fo, &ds), CX_ERR_ARG);
    expect_last("cx_fake_data_opts.struct_size is 0");
    cr_expect_null(ds);
    fo.struct_size = SIZE_THROUGH(cx_fake_data_opts, seed);
    cr_expect_eq(cx_fake_data(fo, &ds), CX_OK, "%s", cx_last_error());
    cr_expect_eq(cx_dataset_size(ds), 4, "the caller's size, not the default 60000");
    cx_dataset_free(ds);

    cx_text_opts to = { .path = "/nonexistent", .block = 4, .train_fraction = 0.9 };
    cr_expect_eq(cx_text_open(to, &ds), CX_ERR_ARG);
    expect_last("cx_text_opts.struct_size is 0");
    cx_mnist_opts mo = { .dir = "/nonexistent", .train = true };
    cr_expect_eq(cx_mnist_load(mo, &ds), CX_ERR_ARG);
    expect_last("cx_mnist_opts.struct_size is 0");
}

Test(api, gpt_config_refuses_a_missing_size)
{
    cx_gpt_config c = { .vocab_size = 16, .block_size = 4, .n_layer = 1, .n_head = 1, .n_embd = 4 };
    cr_expect_null(cx_nn_gpt(c));
    expect_last("cx_nn_gpt: cx_gpt_config.struct_size is 0");
    cr_expect(isnan(cx_gpt_flops_per_token(c, 4)));
    expect_last("cx_gpt_config.struct_size is 0");
    c.struct_size = SIZE_THROUGH(cx_gpt_config, n_head);
    cr_expect_null(cx_nn_gpt(c), "older than the first version");
    c.struct_size = sizeof c;
    cx_module *m = cx_nn_gpt(c);
    cr_assert(m, "%s", cx_last_error());
    cx_gpt_config back = cx_gpt_default_config();
    cr_assert_eq(cx_gpt_config_of(m, &back), CX_OK, "%s", cx_last_error());
    cr_expect_eq(back.struct_size, sizeof back, "a config read back can be passed again");
    cr_expect_eq(back.vocab_size, 16);
    cr_expect_eq(cx_gpt_flops_per_token(back, 4), cx_gpt_flops_per_token(c, 4));
    cx_module_free(m);
}
