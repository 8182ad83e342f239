/* SGD with momentum, dampening, Nesterov and weight decay (torch.optim.SGD). */
#include "optim_internal.h"

enum { SGD_MOMENTUM_BUFFER = 0 };
enum { HP_LR = 0, HP_WD, HP_MOMENTUM, HP_COUNT };

static int sgd_hyper(cx_optimizer *o, const cx_ogroup *g, cx_tensor **hp)
{
    hp[HP_LR] = cx_runtime_scalar(o->lr * g->lr_scale, CX_F32);
    hp[HP_WD] = cx_runtime_scalar(g->weight_decay, CX_F32);
    hp[HP_MOMENTUM] = cx_runtime_scalar(o->o.sgd.momentum, CX_F32);
    return HP_COUNT;
}

static cx_status sgd_update(cx_optimizer *o, const cx_ogroup *gr, cx_oparam *p, cx_tensor *const *hp)
{
    const cx_sgd_opts *s = &o->o.sgd;
    cx_temps t = { .n = 0 };
    cx_tensor *g = cx_grad(p->p);
    if (gr->weight_decay != 0.0) {
        cx_tensor *decayed = p->decay_mask ? cx_tmp(&t, cx_mul(p->p, p->decay_mask)) : p->p;
        g = cx_tmp(&t, cx_add(g, cx_tmp(&t, cx_mul(decayed, hp[HP_WD]))));
    }
    if (s->momentum != 0.0) {
        /* PyTorch starts the buffer as a copy of the first gradient. The
         * buffer is zeros until then, so buf * 0 + g * 1 is that copy, and
         * the coefficients being runtime scalars keeps one graph for all steps. */
        bool first = p->steps == 0;
        cx_tensor *keep = cx_tmp(&t, cx_runtime_scalar(first ? 0.0 : s->momentum, CX_F32));
        cx_tensor *take = cx_tmp(&t, cx_runtime_scalar(first ? 1.0 : 1.0 - s->dampening, CX_F32));
        cx_tensor *buf = p->state[SGD_MOMENTUM_BUFFER];
        cx_tensor *nb = cx_tmp(&t, cx_add(cx_tmp(&t, cx_mul(buf, keep)), cx_tmp(&t, cx_mul(g, take))));
        cx_status st = cx_optim_assign(buf, nb, "SGD momentum_buffer");
        if (st != CX_OK) { cx_temps_end(&t); return st; }
        g = s->nesterov ? cx_tmp(&t, cx_add(g, cx_tmp(&t, cx_mul(nb, hp[HP_MOMENTUM])))) : nb;
    }
    cx_tensor *np = cx_tmp(&t, cx_sub(p->p, cx_tmp(&t, cx_mul(g, hp[HP_LR]))));
    cx_status st = cx_optim_assign(p->p, np, "SGD update");
    cx_temps_end(&t);
    return st;
}

static const cx_optim_kind sgd_kind = {
    .name = "SGD", .nstate = 1, .state_names = { "momentum_buffer" },
    .update = sgd_update, .hyper = sgd_hyper,
};

static cx_optimizer *sgd_new(const cx_param_group *groups, int ngroups, cx_sgd_opts s)
{
    if (!(s.lr >= 0) || !(s.momentum >= 0) || !(s.weight_decay >= 0) || !(s.dampening >= 0) ||
        (s.nesterov && (s.momentum <= 0 || s.dampening != 0))) {
        cx_set_last_error("SGD: bad hyper-parameters: lr %g, momentum %g, dampening %g, weight_decay %g, nesterov %d "
                     "(want non-negative; nesterov needs momentum and zero dampening)",
                     s.lr, s.momentum, s.dampening, s.weight_decay, (int)s.nesterov);
        return NULL;
    }
    bool want[CX_OPTIM_MAX_STATE] = { s.momentum != 0.0 };
    cx_optimizer *o = cx_optim_new(&sgd_kind, groups, ngroups, s.lr, want);
    if (o) o->o.sgd = s;
    return o;
}

/* The caller's options over the defaults. @return false, error set, when
 * their struct_size is below the first version's. */
static bool take_opts(cx_sgd_opts *own, const cx_sgd_opts *given)
{
    char serr[256];
    *own = cx_sgd_default_opts();
    if (cx_struct_take(own, sizeof *own, given, given->struct_size, CX_SIZE_THROUGH(cx_sgd_opts, nesterov),
                       "cx_sgd_opts", serr, sizeof serr))
        return true;
    cx_set_last_error("SGD: %s", serr);
    return false;
}

cx_optimizer *cx_optim_sgd(const cx_named_tensor *params, int n, cx_sgd_opts given)
{
    cx_sgd_opts s;
    if (!take_opts(&s, &given)) return NULL;
    cx_param_group g = cx_param_group_of(params, n, s.weight_decay);
    return sgd_new(&g, 1, s);
}

cx_optimizer *cx_optim_sgd_groups(const cx_param_group *groups, int ngroups, cx_sgd_opts given)
{
    cx_sgd_opts s;
    return take_opts(&s, &given) ? sgd_new(groups, ngroups, s) : NULL;
}
