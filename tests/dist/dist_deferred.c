/* Deferred models wrapped with ZeRO-3: each rank generates only its shards,
 * and the shards, gathered back, equal an eager whole-model init bit for
 * bit (mlp, cnn, transformer block, GPT); no rank's memory during
 * construction and wrapping exceeds 1/N of the parameters plus one unit;
 * three training steps from the deferred model equal three from the eager
 * one (losses and parameters, bit for bit); every rank must hold the same
 * recipes. */
#include "dist_check.h"

#include <string.h>

enum { MLP, CNN, BLOCK, GPT, NKINDS };
static const char *const k_names[NKINDS] = { "mlp", "cnn", "transformer block", "gpt" };
static const cx_gpt_config k_gpt = { CX_STRUCT_SIZE(cx_gpt_config), .vocab_size = 61, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 32 };

static cx_module *build(int kind, bool deferred, uint64_t seed)
{
    cx_manual_seed(seed);
    if (deferred) cx_deferred_init_begin();
    cx_module *m = NULL;
    if (kind == MLP) {
        cx_module *l[5] = { cx_nn_linear(17, 33, true), cx_nn_relu(), cx_nn_linear(33, 29, true), cx_nn_relu(),
                            cx_nn_linear(29, 3, true) };
        m = cx_nn_sequential(l, 5);
    } else if (kind == CNN) {
        cx_conv2d_opts co = cx_conv2d_default_opts();
        cx_module *l[7] = { cx_nn_conv2d(1, 5, 3, co), cx_nn_batch_norm2d(5, cx_batch_norm_default_opts()),
                            cx_nn_relu(), cx_nn_max_pool2d(2, 2, 0), cx_nn_flatten(1, -1),
                            cx_nn_linear(5 * 6 * 6, 10, true), cx_nn_log_softmax(1) };
        m = cx_nn_sequential(l, 7);
    } else if (kind == BLOCK) {
        m = cx_nn_transformer_block(24, 3);
    } else {
        m = cx_nn_gpt(k_gpt);
    }
    if (deferred) cx_deferred_init_end();
    return m;
}

/* Several units per model; GPT's by block, so that the tied wte and
 * lm_head stay in the root unit. */
static cx_fsdp_opts zero3(int kind)
{
    static const char *const gpt_units[] = { "Block" };
    cx_fsdp_opts o = cx_fsdp_default_opts();
    if (kind == GPT) {
        o.auto_wrap_types = gpt_units;
        o.n_auto_wrap_types = 1;
    } else {
        o.auto_wrap_min_params = 200;
    }
    return o;
}

static float sample(int64_t i) { return (float)sin(0.37 * (double)i + 0.1); }

static cx_tensor *host(const int64_t *shape, int ndim, int64_t seed)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = sample(seed * 1000 + i);
    cx_tensor *t = cx_from_host(v, shape, ndim, CX_F32);
    free(v);
    return t;
}

static cx_tensor *ints(const int64_t *shape, int ndim, int64_t seed, int64_t mod)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    int64_t *v = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = (seed * 7 + i * 3) % mod;
    cx_tensor *t = cx_from_host(v, shape, ndim, CX_I64);
    free(v);
    return t;
}

/* One rank's loss on step s. */
static cx_tensor *loss_of(int kind, cx_fsdp *f, int s)
{
    int64_t seed = s * 10 + cx_global_ordinal();
    if (kind == MLP) {
        int64_t xs[2] = { 4, 17 }, ys[2] = { 4, 3 };
        return cx_mse_loss(cx_fsdp_forward(f, host(xs, 2, seed)), host(ys, 2, seed + 5), CX_REDUCE_MEAN);
    }
    if (kind == CNN) {
        int64_t xs[4] = { 3, 1, 14, 14 }, ys[1] = { 3 };
        return cx_nll_loss(cx_fsdp_forward(f, host(xs, 4, seed)), ints(ys, 1, seed, 10), CX_REDUCE_MEAN, -100);
    }
    if (kind == BLOCK) {
        int64_t xs[3] = { 2, 5, 24 };
        return cx_mse_loss(cx_fsdp_forward(f, host(xs, 3, seed)), host(xs, 3, seed + 5), CX_REDUCE_MEAN);
    }
    int64_t is[2] = { 2, 8 };
    cx_tensor *in[2] = { ints(is, 2, seed, k_gpt.vocab_size), ints(is, 2, seed + 1, k_gpt.vocab_size) }, *out[2];
    int n = cx_fsdp_forward_many(f, in, 2, out, 2);
    return n == 2 ? out[1] : cx_poisoned("gpt forward: %s", cx_last_error());
}

/* ---- the gathered shards against the eager whole ------------------------ */

typedef struct { cx_module *eager; const char *what; int seen, bad; } cmp_ctx;

static cx_status compare_fn(void *p, const char *name, const int64_t *shape, int ndim, const float *data)
{
    cmp_ctx *c = p;
    (void)shape;
    (void)ndim;
    cx_tensor *t = cx_module_get(c->eager, name);
    CHECK(t != NULL, "%s: %s is not in the eager model", c->what, name);
    if (!t) return CX_OK;
    int64_t n = cx_numel(t);
    float *h = malloc(sizeof(float) * (size_t)n);
    cx_to_host(t, h, CX_F32);
    if (memcmp(h, data, sizeof(float) * (size_t)n)) {
        c->bad++;
        CHECK(0, "%s: %s differs from the eager init", c->what, name);
    }
    free(h);
    c->seen++;
    return CX_OK;
}

static void shards_equal_eager(int kind)
{
    int world = cx_world_size();
    const char *what = k_names[kind];
    cx_module *eager = build(kind, false, 42);
    int64_t nparams = cx_module_num_params(eager);
    /* every rank builds the deferred model; the memory it ever holds is
     * measured from here */
    cx_memory_reset_peak();
    int64_t base = cx_memory_in_use();
    cx_module *d = build(kind, true, 42);
    CHECK(cx_memory_in_use() == base, "%s: the deferred build allocated %lld bytes", what,
          (long long)(cx_memory_in_use() - base));
    cx_fsdp *f = cx_fsdp_wrap(d, zero3(kind));
    CHECK(f != NULL, "%s: wrap: %s", what, cx_last_error());
    if (!f) { cx_module_free(d); cx_module_free(eager); return; }
    int nu = 0;
    const cx_fsdp_unit_info *meta = cx_fsdp_shard_metadata(f, &nu);
    int64_t largest = 0;
    for (int u = 0; u < nu; u++) if (meta[u].padded_numel > largest) largest = meta[u].padded_numel;
    int64_t peak = cx_memory_peak() - base, bound = (int64_t)sizeof(float) * (nparams / world + largest) + 4096;
    CHECK(nu > 1, "%s: %d units", what, nu);
    CHECK(peak <= bound, "%s: peak %lld bytes while building and wrapping, over 1/%d of the parameters plus one unit (%lld)",
          what, (long long)peak, world, (long long)bound);
    CHECK(cx_module_num_deferred(d) == 0, "%s: %d tensors still deferred after the wrap", what, cx_module_num_deferred(d));
    cmp_ctx c = { eager, what, 0, 0 };
    CHECK(cx_fsdp_full_state_dict(f, compare_fn, &c) == CX_OK, "%s: full state dict: %s", what, cx_last_error());
    int ne = 0;
    free(cx_module_parameters(eager, &ne));
    if (cx_global_ordinal() == 0) CHECK(c.seen >= ne, "%s: %d of %d parameters gathered", what, c.seen, ne);
    if (cx_global_ordinal() == 0 && !c.bad)
        printf("%s: %lld parameters in %d units: gathered shards equal the eager init bit for bit; peak %lld bytes "
               "building and wrapping (bound %lld)\n", what, (long long)nparams, nu, (long long)peak, (long long)bound);
    cx_fsdp_free(f);
    cx_module_free(d);
    cx_module_free(eager);
}

/* ---- training from either ---------------------------------------------- */

#define STEPS 3

typedef struct { float loss[STEPS]; int n; char **names; float **vals; int64_t *numels; } run_result;

static cx_status keep_fn(void *p, const char *name, const int64_t *shape, int ndim, const float *data)
{
    run_result *r = p;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    r->names = realloc(r->names, sizeof(char *) * (size_t)(r->n + 1));
    r->vals = realloc(r->vals, sizeof(float *) * (size_t)(r->n + 1));
    r->numels = realloc(r->numels, sizeof(int64_t) * (size_t)(r->n + 1));
    r->names[r->n] = strdup(name);
    r->vals[r->n] = malloc(sizeof(float) * (size_t)(n ? n : 1));
    memcpy(r->vals[r->n], data, sizeof(float) * (size_t)n);
    r->numels[r->n++] = n;
    return CX_OK;
}

static run_result train(int kind, bool deferred)
{
    run_result r = { 0 };
    cx_module *m = build(kind, deferred, 7);
    cx_fsdp *f = cx_fsdp_wrap(m, zero3(kind));
    CHECK(f != NULL, "%s: wrap: %s", k_names[kind], cx_last_error());
    if (!f) { cx_module_free(m); return r; }
    int n = 0;
    cx_named_tensor *ps = cx_fsdp_parameters(f, &n);
    cx_adam_opts o = cx_adamw_default_opts();
    o.lr = 0.01;
    cx_optimizer *opt = cx_optim_adamw(ps, n, o);
    for (int s = 0; s < STEPS; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *loss = loss_of(kind, f, s);
        CHECK(cx_fsdp_backward(f, loss) == CX_OK, "%s: backward: %s", k_names[kind], cx_last_error());
        cx_optim_step(opt);
        cx_keep(loss);
        CHECK(cx_step_end() == CX_OK, "%s: step: %s", k_names[kind], cx_last_error());
        cx_to_host(loss, &r.loss[s], CX_F32);
        cx_free(loss);
    }
    CHECK(cx_fsdp_full_state_dict(f, keep_fn, &r) == CX_OK, "%s: state dict: %s", k_names[kind], cx_last_error());
    cx_optim_free(opt);
    free(ps);
    cx_fsdp_free(f);
    cx_module_free(m);
    return r;
}

static void result_free(run_result *r)
{
    for (int i = 0; i < r->n; i++) { free(r->names[i]); free(r->vals[i]); }
    free(r->names); free(r->vals); free(r->numels);
}

static void training_equals_eager(int kind)
{
    if (getenv("EAGER_WARM")) { run_result w = train(kind, false); result_free(&w); }
    run_result e = train(kind, false), d = train(kind, true);
    CHECK(!memcmp(e.loss, d.loss, sizeof e.loss), "%s: losses differ: eager %.9g %.9g %.9g, deferred %.9g %.9g %.9g",
          k_names[kind], e.loss[0], e.loss[1], e.loss[2], d.loss[0], d.loss[1], d.loss[2]);
    CHECK(e.n == d.n && (e.n > 0 || cx_global_ordinal() != 0), "%s: %d and %d tensors", k_names[kind], e.n, d.n);
    int bad = 0;
    for (int i = 0; i < e.n && i < d.n; i++)
        if (strcmp(e.names[i], d.names[i]) || e.numels[i] != d.numels[i] ||
            memcmp(e.vals[i], d.vals[i], sizeof(float) * (size_t)e.numels[i])) {
            CHECK(0, "%s: %s differs after %d steps", k_names[kind], e.names[i], STEPS);
            bad++;
        }
    if (cx_global_ordinal() == 0 && !bad)
        printf("%s: %d steps from the deferred model equal the eager one (losses %.6f %.6f %.6f, %d tensors)\n",
               k_names[kind], STEPS, d.loss[0], d.loss[1], d.loss[2], d.n);
    result_free(&e);
    result_free(&d);
}

/* A rank whose recipes differ (another seed) is an error on every rank. */
static void recipes_must_agree(void)
{
    cx_module *d = build(MLP, true, cx_global_ordinal() == 1 ? 8 : 7);
    cx_fsdp *f = cx_fsdp_wrap(d, zero3(MLP));
    CHECK(f == NULL, "a wrap with different seeds on rank 1 succeeded");
    CHECK(f != NULL || strstr(cx_last_error(), "deferred"), "the error names no deferred tensor: %s", cx_last_error());
    cx_fsdp_free(f);
    cx_module_free(d);
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    for (int k = 0; k < NKINDS; k++) shards_equal_eager(k);
    for (int k = 0; k < NKINDS; k++) training_equals_eager(k);
    recipes_must_agree();
    return dist_finish("dist_deferred");
}
