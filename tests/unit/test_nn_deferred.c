/* Deferred construction: a model built under cx_deferred_init_begin holds
 * no memory, advances the RNG as an eager build does, and its values (whole
 * or any range of one parameter) are bit-identical to the eager build's,
 * for every layer's init: Kaiming-uniform (Linear, Conv2d), normal
 * (Embedding, GPT), constants (biases, norms, buffers). */
#include <criterion/criterion.h>

#include <cxla/cxla.h>

#include <stdlib.h>
#include <string.h>

enum { MLP, CNN, BLOCK, GPT, NMODELS };
static const char *const k_names[NMODELS] = { "mlp", "cnn", "transformer block", "gpt" };

static cx_module *build(int kind)
{
    switch (kind) {
    case MLP: {
        cx_module *l[3] = { cx_nn_linear(13, 7, true), cx_nn_relu(), cx_nn_linear(7, 5, true) };
        return cx_nn_sequential(l, 3);
    }
    case CNN: {
        cx_conv2d_opts co = cx_conv2d_default_opts();
        cx_module *l[6] = { cx_nn_conv2d(1, 4, 3, co), cx_nn_batch_norm2d(4, cx_batch_norm_default_opts()), cx_nn_relu(),
                            cx_nn_flatten(1, -1), cx_nn_linear(4 * 6 * 6, 10, true), cx_nn_embedding(3, 5) };
        return cx_nn_sequential(l, 6);
    }
    case BLOCK: return cx_nn_transformer_block(24, 3);
    default: {
        cx_gpt_config c = { CX_STRUCT_SIZE(cx_gpt_config), .vocab_size = 37, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 16 };
        return cx_nn_gpt(c);
    }
    }
}

static cx_module *build_seeded(int kind, bool deferred)
{
    cx_manual_seed(1234);
    if (deferred) cx_deferred_init_begin();
    cx_module *m = build(kind);
    if (deferred) cx_deferred_init_end();
    cr_assert(m, "%s: %s", k_names[kind], cx_last_error());
    return m;
}

static float *values_of(cx_tensor *t)
{
    int64_t n = cx_numel(t);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    cr_assert(cx_to_host(t, v, CX_F32) == CX_OK, "%s", cx_last_error());
    return v;
}

Test(deferred, costs_no_memory_and_advances_rng_as_eager)
{
    for (int k = 0; k < NMODELS; k++) {
        cx_module *e = build_seeded(k, false);
        cx_rng_state after_eager = cx_get_rng_state();
        int64_t before = cx_memory_in_use();
        cx_module *d = build_seeded(k, true);
        cx_rng_state after_deferred = cx_get_rng_state();
        cr_expect_eq(cx_memory_in_use(), before, "%s: deferred build allocated %lld bytes", k_names[k],
                     (long long)(cx_memory_in_use() - before));
        cr_expect_eq(after_deferred.seed, after_eager.seed);
        cr_expect_eq(after_deferred.offset, after_eager.offset, "%s: RNG at %llu deferred, %llu eager", k_names[k],
                     (unsigned long long)after_deferred.offset, (unsigned long long)after_eager.offset);
        int n = 0;
        free(cx_module_state_dict(d, &n));
        cr_expect_eq(cx_module_num_deferred(d), n, "%s: %d of %d deferred", k_names[k], cx_module_num_deferred(d), n);
        cr_expect_eq(cx_module_num_deferred(e), 0);
        cx_module_free(d);
        cx_module_free(e);
    }
}

Test(deferred, materialized_equals_eager_bit_for_bit)
{
    for (int k = 0; k < NMODELS; k++) {
        cx_module *e = build_seeded(k, false), *d = build_seeded(k, true);
        cr_assert(cx_module_materialize(d) == CX_OK, "%s", cx_last_error());
        cr_expect_eq(cx_module_num_deferred(d), 0);
        int ne = 0, nd = 0;
        cx_named_tensor *se = cx_module_state_dict(e, &ne), *sd = cx_module_state_dict(d, &nd);
        cr_assert_eq(ne, nd);
        for (int i = 0; i < ne; i++) {
            cr_assert_str_eq(se[i].name, sd[i].name);
            cr_assert_eq(cx_dtype_of(se[i].tensor), cx_dtype_of(sd[i].tensor), "%s", se[i].name);
            int64_t n = cx_numel(se[i].tensor);
            float *a = values_of(se[i].tensor), *b = values_of(sd[i].tensor);
            cr_expect(!memcmp(a, b, sizeof(float) * (size_t)n), "%s %s differs", k_names[k], se[i].name);
            free(a);
            free(b);
        }
        /* parameters still train: requires-grad survived the materialization */
        cx_named_tensor *ps = cx_module_parameters(d, &nd);
        for (int i = 0; i < nd; i++) cr_expect(cx_get_requires_grad(ps[i].tensor), "%s", ps[i].name);
        free(ps);
        free(se);
        free(sd);
        cx_module_free(d);
        cx_module_free(e);
    }
}

/* Shards of any world size: ranges with boundaries anywhere, against the
 * same elements of the eager values. */
Test(deferred, any_range_equals_the_same_range_of_the_whole)
{
    for (int k = 0; k < NMODELS; k++) {
        cx_module *e = build_seeded(k, false), *d = build_seeded(k, true);
        int n = 0;
        cx_named_tensor *se = cx_module_state_dict(e, &n), *sd = cx_module_state_dict(d, &n);
        for (int i = 0; i < n; i++) {
            cx_init_recipe r;
            cr_assert(cx_deferred_recipe(sd[i].tensor, &r), "%s not deferred", sd[i].name);
            if (cx_dtype_of(se[i].tensor) != CX_F32) continue;
            int64_t numel = cx_numel(se[i].tensor);
            float *whole = values_of(se[i].tensor);
            for (int world = 2; world <= 5; world++) {
                int64_t shard = (numel + world - 1) / world;
                for (int rank = 0; rank < world; rank++) {
                    int64_t a = shard * rank, b = a + shard < numel ? a + shard : numel;
                    if (a >= b) continue;
                    cx_tensor *piece = cx_init_range(&r, a, b - a, CX_F32);
                    float *v = values_of(piece);
                    cr_expect(!memcmp(v, whole + a, sizeof(float) * (size_t)(b - a)), "%s %s [%lld, %lld) differs",
                              k_names[k], sd[i].name, (long long)a, (long long)b);
                    free(v);
                    cx_free(piece);
                }
            }
            free(whole);
        }
        free(se);
        free(sd);
        cx_module_free(d);
        cx_module_free(e);
    }
}

Test(deferred, using_a_deferred_model_names_the_cause)
{
    cx_module *d = build_seeded(MLP, true);
    int64_t shape[2] = { 2, 13 };
    cx_tensor *x = cx_ones(shape, 2, CX_F32);
    cx_tensor *y = cx_module_forward(d, x);
    float out[10];
    cr_assert_neq(cx_to_host(y, out, CX_F32), CX_OK);
    cr_expect(strstr(cx_last_error(), "deferred"), "%s", cx_last_error());
    cr_expect(strstr(cx_last_error(), "cx_module_materialize"), "%s", cx_last_error());
    float w[7 * 13];
    cr_assert_neq(cx_to_host(cx_module_get(d, "0.weight"), w, CX_F32), CX_OK);
    cr_expect(strstr(cx_last_error(), "deferred"), "%s", cx_last_error());
    cx_free(y);
    cx_free(x);
    cx_module_free(d);
}

Test(deferred, recipes_and_ranges_refuse_bad_arguments)
{
    cx_init_recipe bad = { .kind = (cx_init_kind)7 };
    int64_t s = 3;
    cr_expect(cx_tensor_error(cx_deferred(&s, 1, CX_F32, &bad)));
    cr_expect(cx_tensor_error(cx_deferred(&s, 1, CX_F32, NULL)));
    cx_init_recipe u = { .kind = CX_INIT_UNIFORM, .a = 0, .b = 1 };
    cr_expect(cx_tensor_error(cx_deferred(&s, 1, CX_I64, &u)), "a random int tensor");
    cr_expect(cx_tensor_error(cx_init_range(&u, -1, 2, CX_F32)));
    cr_expect(cx_tensor_error(cx_init_range(&u, 0, -2, CX_F32)));
    cx_tensor *plain = cx_placeholder(&s, 1, CX_F32);
    cr_expect(!cx_deferred_recipe(plain, NULL));
    cr_expect_eq(cx_deferred_materialize(plain), CX_OK, "not deferred: left alone");
    cx_free(plain);
}

Test(deferred, materialize_respects_the_memory_limit)
{
    /* 4 MB of weights under a 1 MB cap: the error names the parameter.
     * The cap is read at the first allocation; this test runs in its own
     * process (Criterion forks one per test). */
    setenv("CX_MEMORY_LIMIT", "1MB", 1);
    cx_manual_seed(5);
    cx_deferred_init_begin();
    cx_module *m = cx_nn_linear(1000, 1000, true);
    cx_deferred_init_end();
    cr_assert(m);
    cx_status st = cx_module_materialize(m);
    cr_expect_eq(st, CX_ERR_OOM, "%s", cx_last_error());
    cr_expect(strstr(cx_last_error(), "weight"), "%s", cx_last_error());
    cx_module_free(m);
}

/* A module of the user's own that registers its parameters and buffers
 * through the cx_init_* functions is deferred like the built-in layers. */
typedef struct { int w, b, count; } scaler;

static cx_tensor *scaler_forward(cx_module *m, cx_tensor *x)
{
    const scaler *s = cx_module_impl(m);
    cx_tensor *y = cx_mul(x, cx_module_param(m, s->w));
    cx_tensor *z = cx_add(y, cx_module_param(m, s->b));
    cx_drop(y);
    return z;
}

static const cx_module_type scaler_type = { CX_STRUCT_SIZE(cx_module_type), .name = "Scaler", .forward = scaler_forward, .free = free };

static cx_module *make_scaler(void)
{
    scaler *s = calloc(1, sizeof *s);
    cx_module *m = cx_module_new(&scaler_type, s);
    int64_t n = 37;
    s->w = cx_module_register_parameter(m, "weight", cx_init_normal(&n, 1, 1.0, 0.5));
    s->b = cx_module_register_parameter(m, "bias", cx_init_uniform(&n, 1, -0.25, 0.25));
    s->count = cx_module_register_buffer(m, "count", cx_init_constant(NULL, 0, 3.0, CX_I64));
    return m;
}

Test(deferred, a_custom_module_is_deferred_too)
{
    cx_manual_seed(99);
    cx_module *e = make_scaler();
    cx_manual_seed(99);
    cx_deferred_init_begin();
    cx_module *d = make_scaler();
    cx_deferred_init_end();
    cr_assert_eq(cx_module_num_deferred(d), 3);
    cr_assert(cx_module_materialize(d) == CX_OK, "%s", cx_last_error());
    const char *keys[2] = { "weight", "bias" };
    for (int i = 0; i < 2; i++) {
        float *a = values_of(cx_module_get(e, keys[i])), *b = values_of(cx_module_get(d, keys[i]));
        cr_expect(!memcmp(a, b, sizeof(float) * 37), "%s differs", keys[i]);
        free(a);
        free(b);
    }
    int64_t c = 0;
    cr_assert(cx_to_host(cx_module_get(d, "count"), &c, CX_I64) == CX_OK);
    cr_expect_eq(c, 3);
    cx_module_free(d);
    cx_module_free(e);
}
