/* A tied parameter under data parallelism: a tiny GPT (lm_head.weight is
 * transformer.wte.weight) trained 3 steps with DDP, FSDP ZeRO-2 and
 * ZeRO-3 (each block its own unit; the tie in the root unit) equals one
 * process on the whole batch within 1e-5 (SGD with momentum, weight decay
 * on 2-D weights only: under FSDP through decay masks over the flat
 * shards), and the tie still holds. */
#include "dist_check.h"

#include <string.h>

#define STEPS 3
#define GLOBAL_B 4
#define T 16

static cx_gpt_config tiny(void)
{
    return (cx_gpt_config){ CX_STRUCT_SIZE(cx_gpt_config), .vocab_size = 256, .block_size = T, .n_layer = 2, .n_head = 2, .n_embd = 32 };
}

static cx_module *make_model(void)
{
    cx_manual_seed(7);
    return cx_nn_gpt(tiny());
}

/* Rows [row0, row0 + b) of step s's global batch: x and its targets. */
static void batch(int s, int64_t row0, int64_t b, cx_tensor **x, cx_tensor **y)
{
    int64_t xs[GLOBAL_B * T], ys[GLOBAL_B * T], shape[2] = { b, T };
    for (int64_t i = 0; i < b * T; i++) {
        uint64_t g = (uint64_t)(s * GLOBAL_B * T + row0 * T + i);
        xs[i] = (int64_t)((g * 2654435761u >> 5) % 256);
        ys[i] = (int64_t)((g * 40503u + 17) % 256);
    }
    *x = cx_from_host(xs, shape, 2, CX_I64);
    *y = cx_from_host(ys, shape, 2, CX_I64);
}

/* SGD with momentum: an update linear in the gradient, so the ranks'
 * different summation order stays at rounding level. (Adam divides by
 * sqrt(v): an element whose gradient is ~1e-9, below the noise, moves by
 * up to lr either way, which no reduction order can reproduce.) Weight
 * decay on 2-D parameters only: groups by ndim, or under FSDP one group
 * over the flat shards with decay masks. */
static cx_optimizer *make_opt(cx_named_tensor *ps, int n, cx_fsdp *f, cx_tensor ***masks, int *nmasks)
{
    cx_sgd_opts o = cx_sgd_default_opts();
    o.lr = 0.5;   /* large enough that 3 steps move every weight visibly */
    o.momentum = 0.9;
    cx_param_group groups[2] = { { CX_STRUCT_SIZE(cx_param_group) } };
    if (f) {
        *masks = cx_fsdp_decay_masks(f, 2, nmasks);
        CHECK(*masks && *nmasks == n, "decay masks: %s", cx_last_error());
        groups[0] = cx_param_group_of(ps, n, 0.05);
        groups[0].decay_masks = *masks;
        return cx_optim_sgd_groups(groups, 1, o);
    }
    cx_named_tensor scratch[64];
    CHECK(n <= 64 && cx_param_groups_by_ndim(ps, n, 0.05, scratch, groups) == 2, "groups");
    return cx_optim_sgd_groups(groups, 2, o);
}

typedef enum { MODE_SINGLE, MODE_DDP, MODE_FSDP2, MODE_FSDP3 } mode;

typedef struct {
    cx_module *m;
    cx_ddp *ddp;
    cx_fsdp *fsdp;
} run;

/* 3 steps; the single process takes the whole batch, the others their rows. */
static void train(run *r, mode md)
{
    int rank = cx_global_ordinal(), world = cx_world_size();
    int64_t b = md == MODE_SINGLE ? GLOBAL_B : GLOBAL_B / world, row0 = md == MODE_SINGLE ? 0 : rank * b;
    int n = 0;
    cx_named_tensor *ps = r->fsdp ? cx_fsdp_parameters(r->fsdp, &n) : cx_module_parameters(r->m, &n);
    cx_tensor **masks = NULL;
    int nmasks = 0;
    cx_optimizer *opt = make_opt(ps, n, r->fsdp, &masks, &nmasks);
    CHECK(opt != NULL, "optimizer: %s", cx_last_error());
    for (int s = 0; s < STEPS && opt; s++) {
        cx_step_begin();
        cx_optim_zero_grad(opt);
        cx_tensor *x, *y, *out[2] = { 0 };
        batch(s, row0, b, &x, &y);
        cx_tensor *in[2] = { x, y };
        int k = r->fsdp ? cx_fsdp_forward_many(r->fsdp, in, 2, out, 2)
              : r->ddp  ? cx_ddp_forward_many(r->ddp, in, 2, out, 2)
                        : cx_module_forward_many(r->m, in, 2, out, 2);
        CHECK(k == 2, "forward: %s", cx_last_error());
        cx_status st = r->fsdp ? cx_fsdp_backward(r->fsdp, out[1]) : r->ddp ? cx_ddp_backward(r->ddp, out[1])
                                                                         : cx_backward(out[1]);
        CHECK(st == CX_OK, "backward: %s", cx_last_error());
        cx_optim_step(opt);
        CHECK(cx_step_end() == CX_OK, "step %d: %s", s, cx_last_error());
    }
    cx_optim_free(opt);
    for (int i = 0; i < nmasks; i++) cx_free(masks[i]);
    free(masks);
    free(ps);
}

typedef struct {
    cx_module *ref;
    const char *what;
    int seen;
    double worst;
    char worst_name[128];
} cmp_ctx;

static cx_status compare_fn(void *p, const char *name, const int64_t *shape, int ndim, const float *data)
{
    (void)shape; (void)ndim;
    cmp_ctx *c = p;
    cx_tensor *t = cx_module_get(c->ref, name);
    if (!t) return CX_OK;   /* buffers: the GPT has none */
    int64_t n = cx_numel(t);
    float *want = malloc(sizeof *want * (size_t)n);
    if (!want || cx_to_host(t, want, CX_F32) != CX_OK) { free(want); return CX_ERR_OOM; }
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)data[i] - want[i]) / fmax(1.0, fabs(want[i]));
        if (d > c->worst) { c->worst = d; snprintf(c->worst_name, sizeof c->worst_name, "%s[%lld]", name, (long long)i); }
    }
    free(want);
    c->seen++;
    return CX_OK;
}

static cx_status module_state(cx_module *m, cx_fsdp_tensor_fn fn, void *ctx)
{
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    cx_status st = ps ? CX_OK : CX_ERR_OOM;
    for (int i = 0; i < n && st == CX_OK; i++) {
        cx_tensor *t = ps[i].tensor;
        float *v = malloc(sizeof *v * (size_t)cx_numel(t));
        st = v && cx_to_host(t, v, CX_F32) == CX_OK ? fn(ctx, ps[i].name, cx_shape(t), cx_ndim(t), v) : CX_ERR_OOM;
        free(v);
    }
    free(ps);
    return st;
}

static void check_mode(cx_module *ref, mode md, const char *what)
{
    run r = { make_model(), NULL, NULL };
    if (md == MODE_DDP) r.ddp = cx_ddp_wrap(r.m, cx_ddp_default_opts());
    if (md == MODE_FSDP2 || md == MODE_FSDP3) {
        static const char *const units[] = { "Block" };
        cx_fsdp_opts fo = cx_fsdp_default_opts();
        fo.reshard_after_forward = md == MODE_FSDP3;
        fo.auto_wrap_types = units;
        fo.n_auto_wrap_types = 1;
        r.fsdp = cx_fsdp_wrap(r.m, fo);
    }
    CHECK(md == MODE_DDP ? r.ddp != NULL : r.fsdp != NULL, "%s: wrap: %s", what, cx_last_error());
    if (r.ddp || r.fsdp) {
        if (r.fsdp) {
            int nu = 0;
            const cx_fsdp_unit_info *meta = cx_fsdp_shard_metadata(r.fsdp, &nu);
            int tied_entries = 0;
            for (int u = 0; u < nu; u++)
                for (int p = 0; p < meta[u].nparams; p++)
                    tied_entries += !strcmp(meta[u].params[p].name, "transformer.wte.weight") ||
                                    !strcmp(meta[u].params[p].name, "lm_head.weight");
            CHECK(nu == 3 && tied_entries == 1, "%s: %d units, the tied weight flattened %d times", what, nu,
                  tied_entries);
        }
        train(&r, md);
        cmp_ctx c = { ref, what, 0, 0, "" };
        cx_status st = r.fsdp ? cx_fsdp_full_state_dict(r.fsdp, compare_fn, &c) : module_state(r.m, compare_fn, &c);
        CHECK(st == CX_OK, "%s: state: %s", what, cx_last_error());
        if (cx_global_ordinal() == 0 || r.ddp) {
            CHECK(c.seen == 2 + 12 * 2 + 2, "%s: compared %d parameters", what, c.seen);
            CHECK(c.worst <= 1e-5, "%s: parameters differ from one process by %.3g relative (%s)", what, c.worst,
                  c.worst_name);
        }
        if (r.ddp)
            CHECK(cx_module_get(r.m, "lm_head.weight") == cx_module_get(r.m, "transformer.wte.weight"),
                  "%s: the tie came apart", what);
    }
    cx_ddp_free(r.ddp);
    cx_fsdp_free(r.fsdp);
    cx_module_free(r.m);
}

int main(int argc, char **argv)
{
    if (cx_dist_init(&argc, &argv) != CX_OK) {
        fprintf(stderr, "dist_gpt_tie: %s\n", cx_last_error());
        return 1;
    }
    if (GLOBAL_B % cx_world_size()) {
        fprintf(stderr, "dist_gpt_tie: wants a world size dividing %d\n", GLOBAL_B);
        cx_dist_finalize();
        return 1;
    }
    run ref = { make_model(), NULL, NULL };
    train(&ref, MODE_SINGLE);
    check_mode(ref.m, MODE_DDP, "ddp");
    check_mode(ref.m, MODE_FSDP2, "fsdp zero2");
    check_mode(ref.m, MODE_FSDP3, "fsdp zero3");
    cx_module_free(ref.m);
    return dist_finish("dist_gpt_tie");
}
