/* FSDP: after 5 steps, ZeRO-2 and ZeRO-3 parameters (gathered to rank 0)
 * equal a single process's on the same global batch, for an mlp and a cnn,
 * flat and nested, with and without gradient checkpointing, with SGD and
 * AdamW; padding; metadata rebuilds every parameter; optimizer state is 1/N;
 * ZeRO-3 frees gathered parameters after forward; mismatched wrapping is an
 * error on every rank. */
#include "dist_check.h"

#include <string.h>

#define STEPS 5
#define B 2

enum { MLP, CNN };

static cx_module *make_model(int kind, uint64_t seed)
{
    cx_manual_seed(seed);
    if (kind == MLP) {
        /* numels 72, 60, 21: odd total, so every world size pads */
        cx_module *l[5] = { cx_nn_linear(7, 9, true), cx_nn_relu(), cx_nn_linear(9, 6, true), cx_nn_relu(),
                            cx_nn_linear(6, 3, true) };
        return cx_nn_sequential(l, 5);
    }
    cx_conv2d_opts co = cx_conv2d_default_opts();
    cx_module *l[8] = { cx_nn_conv2d(1, 4, 3, co), cx_nn_relu(), cx_nn_conv2d(4, 6, 3, co), cx_nn_relu(),
                        cx_nn_max_pool2d(2, 2, 0), cx_nn_flatten(1, -1), cx_nn_linear(6 * 5 * 5, 10, true),
                        cx_nn_log_softmax(1) };
    return cx_nn_sequential(l, 8);
}

static float sample(int64_t i) { return (float)sin(0.61 * (double)i + 0.3); }

static void batch(int kind, int s, int64_t row0, int64_t rows, cx_tensor **x, cx_tensor **y)
{
    int64_t feat = kind == MLP ? 7 : 14 * 14;
    float *hx = malloc(sizeof(float) * (size_t)(rows * feat));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < feat; j++) hx[r * feat + j] = sample((s * 100 + row0 + r) * feat + j);
    int64_t sx2[2] = { rows, feat }, sx4[4] = { rows, 1, 14, 14 };
    *x = kind == MLP ? cx_from_host(hx, sx2, 2, CX_F32) : cx_from_host(hx, sx4, 4, CX_F32);
    free(hx);
    if (kind == MLP) {
        float *hy = malloc(sizeof(float) * (size_t)(rows * 3));
        for (int64_t r = 0; r < rows * 3; r++) hy[r] = sample(999 + s * 100 * 3 + row0 * 3 + r);
        int64_t sy[2] = { rows, 3 };
        *y = cx_from_host(hy, sy, 2, CX_F32);
        free(hy);
    } else {
        int64_t *hy = malloc(sizeof(int64_t) * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) hy[r] = (s * 7 + row0 + r) % 10;
        *y = cx_from_host(hy, &rows, 1, CX_I64);
        free(hy);
    }
}

static cx_tensor *loss_of(int kind, cx_tensor *out, cx_tensor *y)
{
    return kind == MLP ? cx_mse_loss(out, y, CX_REDUCE_MEAN) : cx_nll_loss(out, y, CX_REDUCE_MEAN, -100);
}

static cx_optimizer *make_opt(const cx_named_tensor *ps, int n, int adamw)
{
    if (adamw) {
        cx_adam_opts o = cx_adamw_default_opts();
        o.lr = 0.01;
        return cx_optim_adamw(ps, n, o);
    }
    cx_sgd_opts o = cx_sgd_default_opts();
    o.lr = 0.05;
    o.momentum = 0.9;
    return cx_optim_sgd(ps, n, o);
}

/* name -> host values of a trained single-process reference */
typedef struct { int n; char **names; float **vals; int64_t *numels; } snapshot;

static void snap_free(snapshot *s)
{
    for (int i = 0; i < s->n; i++) { free(s->names[i]); free(s->vals[i]); }
    free(s->names); free(s->vals); free(s->numels);
    memset(s, 0, sizeof *s);
}

static snapshot reference(int kind, int adamw, int world)
{
    cx_module *m = make_model(kind, 1);
    int n = 0;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_optimizer *opt = make_opt(ps, n, adamw);
    for (int s = 0; s < STEPS; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *x, *y;
        batch(kind, s, 0, (int64_t)B * world, &x, &y);
        cx_backward(loss_of(kind, cx_module_forward(m, x), y));
        cx_optim_step(opt);
        CHECK(cx_step_end() == CX_OK, "reference step: %s", cx_last_error());
    }
    snapshot r = { n, calloc((size_t)n, sizeof(char *)), calloc((size_t)n, sizeof(float *)), calloc((size_t)n, sizeof(int64_t)) };
    for (int i = 0; i < n; i++) {
        r.names[i] = strdup(ps[i].name);
        r.numels[i] = cx_numel(ps[i].tensor);
        r.vals[i] = malloc(sizeof(float) * (size_t)r.numels[i]);
        cx_to_host(ps[i].tensor, r.vals[i], CX_F32);
    }
    cx_optim_free(opt);
    free(ps);
    cx_module_free(m);
    return r;
}

typedef struct { const snapshot *ref; const char *what; int seen; double worst; } cmp_ctx;

static cx_status compare_fn(void *p, const char *name, const int64_t *shape, int ndim, const float *data)
{
    cmp_ctx *c = p;
    (void)shape; (void)ndim;
    for (int i = 0; i < c->ref->n; i++) {
        if (strcmp(c->ref->names[i], name)) continue;
        for (int64_t k = 0; k < c->ref->numels[i]; k++) {
            /* rtol = atol = 1e-5: Adam's normalization amplifies summation-order
             * noise on near-zero gradients (4 ranks sum in another order) */
            double d = fabs(data[k] - c->ref->vals[i][k]) / fmax(1.0, fabs(c->ref->vals[i][k]));
            if (d > c->worst) c->worst = d;
        }
        c->seen++;
        return CX_OK;
    }
    if (!strstr(name, "running")) CHECK(0, "%s: unexpected tensor %s in the full state dict", c->what, name);
    return CX_OK;
}

static cx_fsdp_opts opts_for(int zero, int nested, int ckpt)
{
    cx_fsdp_opts o = cx_fsdp_default_opts();
    o.reshard_after_forward = zero == 3;
    o.auto_wrap_min_params = nested ? 20 : 0;
    o.grad_ckpt = ckpt;
    return o;
}

static void run_case(int kind, int adamw, int zero, int nested, int ckpt, const snapshot *ref)
{
    int rank = cx_global_ordinal(), world = cx_world_size();
    char what[160];
    snprintf(what, sizeof what, "%s %s zero%d %s%s", kind == MLP ? "mlp" : "cnn", adamw ? "adamw" : "sgd", zero,
             nested ? "nested" : "flat", ckpt ? " grad-ckpt" : "");
    /* ranks start different: the wrap takes rank 0's values */
    cx_module *m = make_model(kind, rank == 0 ? 1 : 50 + (uint64_t)rank);
    cx_fsdp *f = cx_fsdp_wrap(m, opts_for(zero, nested, ckpt));
    CHECK(f != NULL, "%s: wrap: %s", what, cx_last_error());
    if (!f) { cx_module_free(m); return; }
    int nu = 0;
    const cx_fsdp_unit_info *meta = cx_fsdp_shard_metadata(f, &nu);
    CHECK(nested ? nu > 1 : nu == 1, "%s: %d units", what, nu);
    int64_t total = 0, shards = 0;
    for (int u = 0; u < nu; u++) {
        total += meta[u].flat_numel;
        shards += meta[u].shard_numel;
        CHECK(meta[u].padded_numel % world == 0 && meta[u].padded_numel - meta[u].flat_numel < world,
              "%s: unit %s padding %lld of %lld", what, meta[u].path, (long long)meta[u].padding, (long long)meta[u].padded_numel);
    }
    int n = 0;
    cx_named_tensor *ps = cx_fsdp_parameters(f, &n);
    cx_optimizer *opt = make_opt(ps, n, adamw);
    for (int s = 0; s < STEPS; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *x, *y;
        batch(kind, s, (int64_t)rank * B, B, &x, &y);
        cx_status st = cx_fsdp_backward(f, loss_of(kind, cx_fsdp_forward(f, x), y));
        CHECK(st == CX_OK, "%s: backward: %s", what, cx_last_error());
        cx_optim_step(opt);
        CHECK(cx_step_end() == CX_OK, "%s: step: %s", what, cx_last_error());
    }
    /* optimizer state per rank: 1/N of the unsharded state (plus padding) */
    int ns = 0;
    cx_named_tensor *state = cx_optim_state(opt, &ns);
    int64_t state_numel = 0;
    for (int i = 0; i < ns; i++) if (cx_numel(state[i].tensor) > 1) state_numel += cx_numel(state[i].tensor);
    int per_param = adamw ? 2 : 1;
    CHECK(state_numel == per_param * shards && shards * world - total < (int64_t)world * nu,
          "%s: optimizer state %lld elements, shards %lld, model %lld", what, (long long)state_numel, (long long)shards, (long long)total);
    free(state);
    cmp_ctx c = { ref, what, 0, 0 };
    CHECK(cx_fsdp_full_state_dict(f, compare_fn, &c) == CX_OK, "%s: full state dict: %s", what, cx_last_error());
    if (rank == 0) {
        CHECK(c.seen == ref->n, "%s: full state dict has %d of %d parameters", what, c.seen, ref->n);
        CHECK(c.worst <= 1e-5, "%s: parameters differ from the single process by %.3g relative", what, c.worst);
    }
    cx_optim_free(opt);
    free(ps);
    cx_fsdp_free(f);
    cx_module_free(m);
}

/* metadata rebuilds every original parameter exactly (before training) */
typedef struct { cx_module *orig; int seen, bad; } meta_ctx;
static cx_status meta_fn(void *p, const char *name, const int64_t *shape, int ndim, const float *data)
{
    meta_ctx *c = p;
    cx_tensor *t = cx_module_get(c->orig, name);
    if (!t) return CX_OK;
    CHECK(cx_ndim(t) == ndim && !memcmp(cx_shape(t), shape, sizeof(int64_t) * (size_t)ndim), "metadata shape of %s", name);
    float *h = malloc(sizeof(float) * (size_t)cx_numel(t));
    cx_to_host(t, h, CX_F32);
    if (memcmp(h, data, sizeof(float) * (size_t)cx_numel(t))) c->bad++;
    free(h);
    c->seen++;
    return CX_OK;
}

static int64_t step_arena(int zero)
{
    /* params dominate (many units, tiny batch): ZeRO-2 holds every gathered
     * unit from forward into backward, ZeRO-3 about one at a time */
    cx_manual_seed(3);
    cx_module *l[12];
    for (int i = 0; i < 6; i++) { l[2 * i] = cx_nn_linear(64, 64, true); l[2 * i + 1] = cx_nn_relu(); }
    cx_module *m = cx_nn_sequential(l, 12);
    cx_fsdp_opts o = opts_for(zero, 1, 0);
    o.auto_wrap_min_params = 1000;
    (void)0;
    cx_fsdp *f = cx_fsdp_wrap(m, o);
    int n = 0;
    cx_named_tensor *ps = cx_fsdp_parameters(f, &n);
    cx_optimizer *opt = make_opt(ps, n, 0);
    cx_step_begin();
    float hx[2 * 64];
    for (int i = 0; i < 128; i++) hx[i] = sample(i);
    int64_t sx[2] = { 2, 64 };
    cx_tensor *x = cx_from_host(hx, sx, 2, CX_F32);
    cx_backward(cx_mean(cx_fsdp_forward(f, x), NULL, 0, false));
    cx_optim_step(opt);
    cx_step_end();
    int64_t a = cx_last_exec_info().arena_bytes;
    cx_optim_free(opt);
    free(ps);
    cx_fsdp_free(f);
    cx_module_free(m);
    return a;
}

/* no_sync: micro-batches accumulate locally (no reduce-scatter: a no_sync
 * step only all-gathers), and the synced backward gives the same shard
 * gradients as synchronizing every micro-batch. One step per micro-batch. */
static void no_sync_case(int zero)
{
    int rank = cx_global_ordinal();
    float *grads[2] = { NULL, NULL };
    int64_t gn = 0, quiet_colls = -1, synced_colls = -1;
    int units = 0;
    for (int mode = 0; mode < 2; mode++) {   /* 0: no_sync for the first two, 1: always synced */
        cx_module *m = make_model(MLP, 1);
        cx_fsdp *f = cx_fsdp_wrap(m, opts_for(zero, 1, 0));
        int nu = 0;
        cx_fsdp_shard_metadata(f, &nu);
        units = nu;
        int n = 0;
        cx_named_tensor *ps = cx_fsdp_parameters(f, &n);
        for (int i = 0; i < n; i++) cx_zero_grad(ps[i].tensor);
        for (int micro = 0; micro < 3; micro++) {
            bool quiet = mode == 0 && micro < 2;
            if (quiet) cx_fsdp_no_sync_begin(f);
            int64_t c0 = cx_counter_value("CollectiveCount");
            cx_step_begin();
            cx_tensor *x, *y;
            batch(MLP, micro, (int64_t)rank * B, B, &x, &y);
            CHECK(cx_fsdp_backward(f, loss_of(MLP, cx_fsdp_forward(f, x), y)) == CX_OK, "no_sync backward: %s", cx_last_error());
            CHECK(cx_step_end() == CX_OK, "no_sync step: %s", cx_last_error());
            int64_t colls = cx_counter_value("CollectiveCount") - c0;
            if (quiet) {
                cx_fsdp_no_sync_end(f);
                quiet_colls = colls;
            } else if (mode == 1) {
                synced_colls = colls;
            }
        }
        gn = 0;
        for (int i = 0; i < n; i++) gn += cx_numel(ps[i].tensor);
        grads[mode] = malloc(sizeof(float) * (size_t)gn);
        int64_t off = 0;
        for (int i = 0; i < n; i++) {
            CHECK(cx_grad(ps[i].tensor) != NULL, "zero%d: shard %d has no gradient", zero, i);
            if (cx_grad(ps[i].tensor)) cx_to_host(cx_grad(ps[i].tensor), grads[mode] + off, CX_F32);
            off += cx_numel(ps[i].tensor);
        }
        free(ps);
        cx_fsdp_free(f);
        cx_module_free(m);
    }
    /* a no_sync step all-gathers like any other, but reduce-scatters nothing */
    CHECK(synced_colls - quiet_colls == units, "zero%d: a synced step ran %lld collectives, a no_sync step %lld, for %d units",
          zero, (long long)synced_colls, (long long)quiet_colls, units);
    double worst = 0;
    for (int64_t k = 0; k < gn; k++) {
        double d = fabs(grads[0][k] - grads[1][k]) / fmax(1e-3, fabs(grads[1][k]));
        if (d > worst) worst = d;
    }
    CHECK(worst <= 1e-5, "zero%d: no_sync accumulation differs from synced accumulation by %.3g", zero, worst);
    free(grads[0]);
    free(grads[1]);
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) { fprintf(stderr, "dist_init: %s\n", cx_last_error()); return 1; }
    int rank = cx_global_ordinal(), world = cx_world_size();
    for (int kind = MLP; kind <= CNN; kind++)
        for (int adamw = 0; adamw < 2; adamw++) {
            snapshot ref = reference(kind, adamw, world);
            for (int zero = 2; zero <= 3; zero++)
                for (int nested = 0; nested < 2; nested++)
                    for (int ckpt = 0; ckpt < 2; ckpt++) run_case(kind, adamw, zero, nested, ckpt, &ref);
            snap_free(&ref);
        }
    no_sync_case(2);
    no_sync_case(3);
    /* metadata */
    cx_module *orig = make_model(CNN, 1), *m = make_model(CNN, 1);
    cx_fsdp *f = cx_fsdp_wrap(m, opts_for(3, 1, 0));
    meta_ctx mc = { orig, 0, 0 };
    CHECK(f && cx_fsdp_full_state_dict(f, meta_fn, &mc) == CX_OK, "metadata walk: %s", cx_last_error());
    if (rank == 0) CHECK(mc.seen == 6 && mc.bad == 0, "metadata rebuilt %d parameters, %d differ", mc.seen, mc.bad);
    cx_fsdp_free(f);
    cx_module_free(m);
    cx_module_free(orig);
    /* ZeRO-3 frees each unit's gathered parameters after its forward */
    int64_t a2 = step_arena(2), a3 = step_arena(3);
    if (rank == 0) printf("arena per step: ZeRO-2 %lld bytes, ZeRO-3 %lld bytes\n", (long long)a2, (long long)a3);
    CHECK(a3 < a2, "ZeRO-3 arena %lld is not below ZeRO-2's %lld", (long long)a3, (long long)a2);
    /* a mismatch in wrapping is an error on every rank, not a hang */
    cx_module *mm = make_model(MLP, 1);
    cx_fsdp *bad = cx_fsdp_wrap(mm, opts_for(3, rank == 1, 0));
    CHECK(bad == NULL && strstr(cx_last_error(), "differently"), "mismatched wrapping: %s", bad ? "accepted" : cx_last_error());
    cx_fsdp_free(bad);
    /* so is a padding multiple that would size the collectives differently */
    cx_fsdp_opts so = opts_for(3, 0, 0);
    so.shard_size_multiple = rank == 1 ? 2 : 1;
    bad = cx_fsdp_wrap(mm, so);
    CHECK(bad == NULL && strstr(cx_last_error(), "shard multiple"), "mismatched shard_size_multiple: %s",
          bad ? "accepted" : cx_last_error());
    cx_fsdp_free(bad);
    cx_module_free(mm);
    return dist_finish("dist_fsdp");
}
