/* Adam and AdamW (torch.optim.Adam / AdamW, single-tensor path). */
#include "optim_internal.h"

#include <math.h>

enum { EXP_AVG = 0, EXP_AVG_SQ, MAX_EXP_AVG_SQ, STEP };
enum { HP_BETA1 = 0, HP_1MBETA1, HP_BETA2, HP_1MBETA2, HP_EPS, HP_WD, HP_DECAY, HP_LRWD, HP_COUNT };

static int adam_hyper(cx_optimizer *o, const cx_ogroup *g, cx_tensor **hp)
{
    const cx_adam_opts *a = &o->o.adam;
    hp[HP_BETA1] = cx_runtime_scalar(a->beta1, CX_F32);
    hp[HP_1MBETA1] = cx_runtime_scalar(1.0 - a->beta1, CX_F32);
    hp[HP_BETA2] = cx_runtime_scalar(a->beta2, CX_F32);
    hp[HP_1MBETA2] = cx_runtime_scalar(1.0 - a->beta2, CX_F32);
    hp[HP_EPS] = cx_runtime_scalar(a->eps, CX_F32);
    hp[HP_WD] = cx_runtime_scalar(g->weight_decay, CX_F32);
    hp[HP_DECAY] = cx_runtime_scalar(1.0 - o->lr * g->lr_scale * g->weight_decay, CX_F32);
    hp[HP_LRWD] = cx_runtime_scalar(o->lr * g->lr_scale * g->weight_decay, CX_F32);
    return HP_COUNT;
}

static cx_status adam_update(cx_optimizer *o, const cx_ogroup *gr, cx_oparam *p, cx_tensor *const *hp)
{
    const cx_adam_opts *a = &o->o.adam;
    cx_temps t = { .n = 0 };
    cx_status st = CX_OK;
    cx_tensor *g = cx_grad(p->p);
    cx_tensor *param = p->p;
    /* a group without decay records none (its graph differs, once) */
    if (gr->weight_decay != 0.0 && p->decay_mask) {
        cx_tensor *masked = cx_tmp(&t, cx_mul(param, p->decay_mask));
        if (o->decoupled) param = cx_tmp(&t, cx_sub(param, cx_tmp(&t, cx_mul(masked, hp[HP_LRWD]))));
        else g = cx_tmp(&t, cx_add(g, cx_tmp(&t, cx_mul(masked, hp[HP_WD]))));
    } else if (gr->weight_decay != 0.0) {
        if (o->decoupled) param = cx_tmp(&t, cx_mul(param, hp[HP_DECAY]));       // AdamW
        else g = cx_tmp(&t, cx_add(g, cx_tmp(&t, cx_mul(param, hp[HP_WD]))));   // Adam: L2
    }
    cx_tensor *m = p->state[EXP_AVG], *v = p->state[EXP_AVG_SQ];
    cx_tensor *nm = cx_tmp(&t, cx_add(cx_tmp(&t, cx_mul(m, hp[HP_BETA1])), cx_tmp(&t, cx_mul(g, hp[HP_1MBETA1]))));
    cx_tensor *g2 = cx_tmp(&t, cx_mul(g, g));
    cx_tensor *nv = cx_tmp(&t, cx_add(cx_tmp(&t, cx_mul(v, hp[HP_BETA2])), cx_tmp(&t, cx_mul(g2, hp[HP_1MBETA2]))));
    if ((st = cx_optim_assign(m, nm, "Adam exp_avg")) != CX_OK) goto out;
    if ((st = cx_optim_assign(v, nv, "Adam exp_avg_sq")) != CX_OK) goto out;
    cx_tensor *stp = p->state[STEP];
    if ((st = cx_optim_assign(stp, cx_tmp(&t, cx_add_scalar(stp, 1.0)), "Adam step")) != CX_OK) goto out;
    cx_tensor *second = nv;
    if (a->amsgrad) {
        cx_tensor *mx = p->state[MAX_EXP_AVG_SQ];
        second = cx_tmp(&t, cx_maximum(mx, nv));
        if ((st = cx_optim_assign(mx, second, "Adam max_exp_avg_sq")) != CX_OK) goto out;
    }
    /* Bias corrections from the host's step count, in double as PyTorch's
     * Python floats, passed as runtime scalars. */
    double step = (double)(p->steps + 1);
    double bc1 = 1.0 - pow(a->beta1, step), bc2 = 1.0 - pow(a->beta2, step);
    cx_tensor *step_size = cx_tmp(&t, cx_runtime_scalar(o->lr * gr->lr_scale / bc1, CX_F32));
    cx_tensor *bc2_sqrt = cx_tmp(&t, cx_runtime_scalar(sqrt(bc2), CX_F32));
    cx_tensor *denom = cx_tmp(&t, cx_add(cx_tmp(&t, cx_div(cx_tmp(&t, cx_sqrt(second)), bc2_sqrt)), hp[HP_EPS]));
    cx_tensor *upd = cx_tmp(&t, cx_mul(cx_tmp(&t, cx_div(nm, denom)), step_size));
    st = cx_optim_assign(p->p, cx_tmp(&t, cx_sub(param, upd)), o->decoupled ? "AdamW update" : "Adam update");
out:
    cx_temps_end(&t);
    return st;
}

static const cx_optim_kind adam_kind = {
    .name = "Adam", .nstate = 4, .state_names = { "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step" },
    .update = adam_update, .hyper = adam_hyper,
};
static const cx_optim_kind adamw_kind = {
    .name = "AdamW", .nstate = 4, .state_names = { "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step" },
    .update = adam_update, .hyper = adam_hyper,
};

static bool adam_opts_ok(const cx_optim_kind *kind, cx_adam_opts a)
{
    if (!(a.lr >= 0) || !(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1) || !(a.eps >= 0) ||
        !(a.weight_decay >= 0)) {
        cx_set_last_error("%s: bad hyper-parameters: lr %g, betas (%g, %g), eps %g, weight_decay %g (want lr, eps, "
                     "weight_decay >= 0 and betas in [0, 1))", kind->name, a.lr, a.beta1, a.beta2, a.eps,
                     a.weight_decay);
        return false;
    }
    return true;
}

static cx_optimizer *adam_new(const cx_optim_kind *kind, const cx_param_group *groups, int ngroups, cx_adam_opts a,
                              bool decoupled)
{
    if (!adam_opts_ok(kind, a)) return NULL;
    bool want[CX_OPTIM_MAX_STATE] = { true, true, a.amsgrad, true };
    cx_optimizer *o = cx_optim_new(kind, groups, ngroups, a.lr, want);
    if (o) {
        o->o.adam = a;
        o->decoupled = decoupled;
    }
    return o;
}

/* The caller's options over the kind's defaults. @return false, error set,
 * when their struct_size is below the first version's. */
static bool take_opts(const cx_optim_kind *kind, cx_adam_opts *own, const cx_adam_opts *given)
{
    char serr[256];
    *own = kind == &adamw_kind ? cx_adamw_default_opts() : cx_adam_default_opts();
    if (cx_struct_take(own, sizeof *own, given, given->struct_size, CX_SIZE_THROUGH(cx_adam_opts, amsgrad),
                       "cx_adam_opts", serr, sizeof serr))
        return true;
    cx_set_last_error("%s: %s", kind->name, serr);
    return false;
}

/* One group of `params` with the options' weight decay. */
static cx_optimizer *adam_plain(const cx_optim_kind *kind, const cx_named_tensor *params, int n, cx_adam_opts given)
{
    cx_adam_opts a;
    if (!take_opts(kind, &a, &given)) return NULL;
    cx_param_group g = cx_param_group_of(params, n, a.weight_decay);
    return adam_new(kind, &g, 1, a, kind == &adamw_kind);
}

static cx_optimizer *adam_groups(const cx_optim_kind *kind, const cx_param_group *groups, int ngroups,
                                 cx_adam_opts given)
{
    cx_adam_opts a;
    return take_opts(kind, &a, &given) ? adam_new(kind, groups, ngroups, a, kind == &adamw_kind) : NULL;
}

cx_optimizer *cx_optim_adam(const cx_named_tensor *params, int n, cx_adam_opts a)
{
    return adam_plain(&adam_kind, params, n, a);
}

cx_optimizer *cx_optim_adamw(const cx_named_tensor *params, int n, cx_adam_opts a)
{
    return adam_plain(&adamw_kind, params, n, a);
}

cx_optimizer *cx_optim_adam_groups(const cx_param_group *groups, int ngroups, cx_adam_opts a)
{
    return adam_groups(&adam_kind, groups, ngroups, a);
}

cx_optimizer *cx_optim_adamw_groups(const cx_param_group *groups, int ngroups, cx_adam_opts a)
{
    return adam_groups(&adamw_kind, groups, ngroups, a);
}
