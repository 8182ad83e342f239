/* Gradient clipping by total 2-norm, on the device. */
#include "optim_internal.h"

cx_tensor *cx_clip_grad_norm(cx_tensor *const *params, int n, double max_norm)
{
    if (!(max_norm > 0)) return cx_poisoned("cx_clip_grad_norm: max_norm %g is not positive", max_norm);
    cx_no_grad_begin();
    cx_tensor *total = NULL;                       // sum of squares, 0-d
    for (int i = 0; i < n; i++) {
        cx_tensor *g = params[i] ? cx_grad(params[i]) : NULL;
        if (!g) continue;
        cx_tensor *sq = cx_mul(g, g);
        cx_tensor *s = cx_sum(sq, NULL, 0, false);
        cx_drop(sq);
        if (!total) { total = s; continue; }
        cx_tensor *acc = cx_add(total, s);
        cx_drop(total); cx_drop(s);
        total = acc;
    }
    if (!total) total = cx_scalar(0.0, CX_F32);
    cx_tensor *norm = cx_sqrt(total);
    cx_drop(total);
    /* coef = min(max_norm / (norm + 1e-6), 1): max_norm is a runtime scalar,
     * so changing it never recompiles. */
    cx_tensor *mx = cx_runtime_scalar(max_norm, CX_F32);
    cx_tensor *den = cx_add_scalar(norm, 1e-6);
    cx_tensor *coef = cx_div(mx, den);
    cx_tensor *one = cx_scalar(1.0, CX_F32);
    cx_tensor *clamped = cx_minimum(coef, one);
    cx_drop(mx); cx_drop(den); cx_drop(coef); cx_drop(one);
    for (int i = 0; i < n; i++) {
        cx_tensor *g = params[i] ? cx_grad(params[i]) : NULL;
        if (!g) continue;
        cx_tensor *scaled = cx_mul(g, clamped);
        cx_assign(g, scaled);
        cx_drop(scaled);
    }
    cx_drop(clamped);
    cx_no_grad_end();
    return norm;
}

cx_tensor *cx_optim_clip_grad_norm(cx_optimizer *o, double max_norm)
{
    cx_tensor **ps = malloc((size_t)(o->n ? o->n : 1) * sizeof *ps);
    if (!ps) return cx_poisoned("cx_optim_clip_grad_norm: out of memory");
    for (int i = 0; i < o->n; i++) ps[i] = o->ps[i].p;
    cx_tensor *norm = cx_clip_grad_norm(ps, o->n, max_norm);
    free(ps);
    return norm;
}
