/* Reductions: sum and max over axes (primitives), and the composites made
 * of them (mean, var, argmax, logsumexp). */
#include "ops.h"

#include <math.h>

static cx_tensor *check_in(cx_tensor *a, const char *op)
{
    if (!a) return cx_poisoned("%s: input is NULL", op);
    if (a->node->op == OP_ERROR) return cx_tensor_of(a->node);
    return NULL;
}

static bool axes_mask(cx_tensor *a, const int *axes, int naxes, const char *op, uint64_t *mask, cx_tensor **err)
{
    int nd = a->node->ndim;
    *mask = 0;
    if (naxes == 0) { *mask = nd ? (1ull << nd) - 1 : 0; return true; }
    for (int i = 0; i < naxes; i++) {
        int ax = cx_norm_axis(axes[i], nd);
        if (ax < 0 || nd == 0) {
            char b[160];
            *err = cx_poisoned("%s: axis %d out of range for shape %s", op, axes[i], cx_shape_str(b, sizeof b, a->node->shape, nd));
            return false;
        }
        if (*mask >> ax & 1) {
            *err = cx_poisoned("%s: axis %d is repeated", op, axes[i]);
            return false;
        }
        *mask |= 1ull << ax;
    }
    return true;
}

static cx_tensor *finish_keepdim(cx_tensor *r, cx_tensor *a, uint64_t mask, bool keepdim)
{
    if (keepdim) return r;
    int64_t shape[CX_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < a->node->ndim; i++) if (!(mask >> i & 1)) shape[k++] = a->node->shape[i];
    cx_tensor *s = cx_reshape(r, shape, k);
    cx_drop(r);
    return s;
}

/* The primitive keeps reduced dims as size 1. */
static cx_tensor *reduce_prim(cx_op op, cx_tensor *a, uint64_t mask, cx_dtype dt)
{
    int64_t shape[CX_MAX_DIMS];
    int nd = a->node->ndim;
    for (int i = 0; i < nd; i++) shape[i] = (mask >> i & 1) ? 1 : a->node->shape[i];
    if (mask == 0) return cx_cast(a, dt);
    int64_t attr = (int64_t)mask;
    return cx_make_op(op, dt, shape, nd, &a, 1, &attr, 1, 0);
}

static cx_tensor *reduce(cx_op op, cx_tensor *a, const int *axes, int naxes, bool keepdim, const char *name)
{
    cx_tensor *p = check_in(a, name);
    if (p) return p;
    uint64_t mask;
    cx_tensor *err;
    if (!axes_mask(a, axes, naxes, name, &mask, &err)) return err;
    cx_dtype dt = (cx_dtype)a->node->dtype;
    if (op == OP_REDUCE_SUM && !cx_dtype_is_float(dt)) dt = CX_I64; /* as torch.sum */
    if (op == OP_REDUCE_MAX) {
        for (int i = 0; i < a->node->ndim; i++)
            if ((mask >> i & 1) && a->node->shape[i] == 0)
                return cx_poisoned("max: reducing an empty axis %d has no identity", i);
    }
    cx_tensor *src = a;
    if (dt != a->node->dtype) src = cx_cast(a, dt);
    cx_tensor *r = reduce_prim(op, src, mask, dt);
    if (src != a) cx_drop(src);
    return finish_keepdim(r, a, mask, keepdim);
}

cx_tensor *cx_sum(cx_tensor *a, const int *axes, int naxes, bool keepdim)
{
    cx_tensor *ac[1] = { a };
    if (cx_autocast_f32(ac, 1)) {
        cx_tensor *r = cx_sum(ac[0], axes, naxes, keepdim);
        cx_autocast_drop(ac, 1);
        return r;
    }
    return reduce(OP_REDUCE_SUM, a, axes, naxes, keepdim, "sum");
}

cx_tensor *cx_max(cx_tensor *a, const int *axes, int naxes, bool keepdim) { return reduce(OP_REDUCE_MAX, a, axes, naxes, keepdim, "max"); }

cx_tensor *cx_mean(cx_tensor *a, const int *axes, int naxes, bool keepdim)
{
    cx_tensor *ac[1] = { a };
    if (cx_autocast_f32(ac, 1)) {
        cx_tensor *r = cx_mean(ac[0], axes, naxes, keepdim);
        cx_autocast_drop(ac, 1);
        return r;
    }
    cx_tensor *p = check_in(a, "mean");
    if (p) return p;
    uint64_t mask;
    cx_tensor *err;
    if (!axes_mask(a, axes, naxes, "mean", &mask, &err)) return err;
    int64_t count = 1;
    for (int i = 0; i < a->node->ndim; i++) if (mask >> i & 1) count *= a->node->shape[i];
    cx_tensor *f = cx_dtype_is_float(cx_dtype_of(a)) ? cx_alias(a) : cx_cast(a, CX_F32);
    cx_tensor *s = cx_sum(f, axes, naxes, keepdim);
    cx_tensor *r = cx_mul_scalar(s, count ? 1.0 / (double)count : NAN);
    cx_drop(f);
    cx_drop(s);
    return r;
}

cx_tensor *cx_var(cx_tensor *a, const int *axes, int naxes, int correction, bool keepdim)
{
    cx_tensor *p = check_in(a, "var");
    if (p) return p;
    uint64_t mask;
    cx_tensor *err;
    if (!axes_mask(a, axes, naxes, "var", &mask, &err)) return err;
    int64_t count = 1;
    for (int i = 0; i < a->node->ndim; i++) if (mask >> i & 1) count *= a->node->shape[i];
    cx_tensor *m = cx_mean(a, axes, naxes, true);
    cx_tensor *d = cx_sub(a, m);
    cx_tensor *d2 = cx_mul(d, d);
    cx_tensor *s = cx_sum(d2, axes, naxes, keepdim);
    double denom = (double)(count - correction);
    cx_tensor *r = cx_mul_scalar(s, denom > 0 ? 1.0 / denom : NAN);
    cx_drop(m); cx_drop(d); cx_drop(d2); cx_drop(s);
    return r;
}

cx_tensor *cx_argmax(cx_tensor *a, int axis, bool keepdim)
{
    cx_tensor *p = check_in(a, "argmax");
    if (p) return p;
    int nd = a->node->ndim;
    int ax = cx_norm_axis(axis, nd);
    if (ax < 0 || nd == 0) return cx_poisoned("argmax: axis %d out of range for rank %d", axis, nd);
    if (a->node->shape[ax] == 0) return cx_poisoned("argmax: axis %d is empty", ax);
    int64_t shape[CX_MAX_DIMS];
    memcpy(shape, a->node->shape, sizeof(int64_t) * (size_t)nd);
    shape[ax] = 1;
    int64_t attr = ax;
    cx_tensor *r = cx_make_op(OP_ARGMAX, CX_I64, shape, nd, &a, 1, &attr, 1, 0);
    return finish_keepdim(r, a, 1ull << ax, keepdim);
}

cx_tensor *cx_logsumexp(cx_tensor *a, int axis, bool keepdim)
{
    cx_tensor *ac[1] = { a };
    if (cx_autocast_f32(ac, 1)) {
        cx_tensor *r = cx_logsumexp(ac[0], axis, keepdim);
        cx_autocast_drop(ac, 1);
        return r;
    }
    cx_tensor *p = check_in(a, "logsumexp");
    if (p) return p;
    if (cx_norm_axis(axis, a->node->ndim) < 0 || a->node->ndim == 0) {
        char b[160];
        return cx_poisoned("logsumexp: axis %d out of range for shape %s", axis,
                         cx_shape_str(b, sizeof b, a->node->shape, a->node->ndim));
    }
    cx_tensor *m = cx_max(a, &axis, 1, true);
    cx_tensor *md = cx_detach(m);
    /* an all -inf row has max -inf: shift by 0 there so the result is -inf, not NaN */
    cx_tensor *fin = cx_abs(md);
    cx_tensor *inf = cx_scalar_like(md, INFINITY);
    cx_tensor *isinf = cx_eq(fin, inf);
    cx_tensor *zero = cx_scalar_like(md, 0.0);
    cx_tensor *shift = cx_where(isinf, zero, md);
    cx_tensor *d = cx_sub(a, shift);
    cx_tensor *e = cx_exp(d);
    cx_tensor *s = cx_sum(e, &axis, 1, true);
    cx_tensor *l = cx_log(s);
    cx_tensor *r = cx_add(l, shift);
    cx_tensor *out = keepdim ? cx_alias(r) : cx_squeeze(r, axis);
    cx_tensor *tmp[] = { m, md, fin, inf, isinf, zero, shift, d, e, s, l, r };
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) cx_drop(tmp[i]);
    return out;
}
