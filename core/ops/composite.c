/* Composite ops built from primitives: activations, softmax, layer norm,
 * losses. Their gradients come from the primitives' VJPs. */
#include "ops.h"

#include <math.h>

#define DROP(...) do { cx_tensor *_d[] = { __VA_ARGS__ }; for (size_t _i = 0; _i < sizeof _d / sizeof *_d; _i++) cx_drop(_d[_i]); } while (0)

cx_tensor *cx_relu(cx_tensor *a)
{
    /* where(x > 0, x, 0): gradient 0 at 0, as torch.relu */
    cx_tensor *z = cx_scalar_like(a, 0.0);
    cx_tensor *pos = cx_gt(a, z);
    cx_tensor *r = cx_where(pos, a, z);
    DROP(z, pos);
    return r;
}

cx_tensor *cx_sigmoid(cx_tensor *a)
{
    cx_tensor *n = cx_neg(a);
    cx_tensor *e = cx_exp(n);
    cx_tensor *d = cx_add_scalar(e, 1.0);
    cx_tensor *one = cx_scalar_like(d, 1.0);
    cx_tensor *r = cx_div(one, d);
    DROP(n, e, d, one);
    return r;
}

cx_tensor *cx_silu(cx_tensor *a)
{
    cx_tensor *s = cx_sigmoid(a);
    cx_tensor *r = cx_mul(a, s);
    DROP(s);
    return r;
}

cx_tensor *cx_gelu(cx_tensor *a, bool tanh_approx)
{
    if (!tanh_approx) return cx_gelu_erf(a);
    cx_tensor *x3 = cx_pow_scalar(a, 3.0);
    cx_tensor *c = cx_mul_scalar(x3, 0.044715);
    cx_tensor *s = cx_add(a, c);
    cx_tensor *inner = cx_mul_scalar(s, sqrt(2.0 / M_PI));
    cx_tensor *t = cx_tanh(inner);
    cx_tensor *one = cx_add_scalar(t, 1.0);
    cx_tensor *h = cx_mul_scalar(a, 0.5);
    cx_tensor *r = cx_mul(h, one);
    DROP(x3, c, s, inner, t, one, h);
    return r;
}

static cx_tensor *stable_shift(cx_tensor *a, int axis)
{
    cx_tensor *m = cx_max(a, &axis, 1, true);
    cx_tensor *md = cx_detach(m);
    cx_tensor *d = cx_sub(a, md);
    DROP(m, md);
    return d;
}

cx_tensor *cx_softmax(cx_tensor *a, int axis)
{
    cx_tensor *ac[1] = { a };
    if (cx_autocast_f32(ac, 1)) {
        cx_tensor *r = cx_softmax(ac[0], axis);
        cx_autocast_drop(ac, 1);
        return r;
    }
    if (!a || a->node->op == OP_ERROR) return a ? cx_alias(a) : cx_poisoned("softmax: input is NULL");
    if (cx_norm_axis(axis, a->node->ndim) < 0) return cx_poisoned("softmax: axis %d out of range for rank %d", axis, a->node->ndim);
    cx_tensor *d = stable_shift(a, axis);
    cx_tensor *e = cx_exp(d);
    cx_tensor *s = cx_sum(e, &axis, 1, true);
    cx_tensor *r = cx_div(e, s);
    DROP(d, e, s);
    return r;
}

cx_tensor *cx_log_softmax(cx_tensor *a, int axis)
{
    cx_tensor *ac[1] = { a };
    if (cx_autocast_f32(ac, 1)) {
        cx_tensor *r = cx_log_softmax(ac[0], axis);
        cx_autocast_drop(ac, 1);
        return r;
    }
    if (!a || a->node->op == OP_ERROR) return a ? cx_alias(a) : cx_poisoned("log_softmax: input is NULL");
    if (cx_norm_axis(axis, a->node->ndim) < 0) return cx_poisoned("log_softmax: axis %d out of range for rank %d", axis, a->node->ndim);
    cx_tensor *d = stable_shift(a, axis);
    cx_tensor *e = cx_exp(d);
    cx_tensor *s = cx_sum(e, &axis, 1, true);
    cx_tensor *l = cx_log(s);
    cx_tensor *r = cx_sub(d, l);
    DROP(d, e, s, l);
    return r;
}

cx_tensor *cx_layer_norm(cx_tensor *a, int nnorm, cx_tensor *weight, cx_tensor *bias, double eps)
{
    cx_tensor *ac[3] = { a, weight, bias };
    if (cx_autocast_f32(ac, 3)) {
        cx_tensor *r = cx_layer_norm(ac[0], nnorm, ac[1], ac[2], eps);
        cx_autocast_drop(ac, 3);
        return r;
    }
    if (!a || a->node->op == OP_ERROR) return a ? cx_alias(a) : cx_poisoned("layer_norm: input is NULL");
    int nd = a->node->ndim;
    if (nnorm <= 0 || nnorm > nd) return cx_poisoned("layer_norm: cannot normalize the last %d dims of rank %d", nnorm, nd);
    char b0[160], b1[160];
    for (int k = 0; k < 2; k++) {
        cx_tensor *p = k ? bias : weight;
        if (!p) continue;
        bool ok = p->node->ndim == nnorm;
        for (int i = 0; ok && i < nnorm; i++) ok = p->node->shape[i] == a->node->shape[nd - nnorm + i];
        if (!ok) return cx_poisoned("layer_norm: %s %s does not match the normalized shape of %s", k ? "bias" : "weight",
                                  cx_shape_str(b0, sizeof b0, p->node->shape, p->node->ndim),
                                  cx_shape_str(b1, sizeof b1, a->node->shape, nd));
    }
    /* the common case, one kernel each way */
    if (nnorm == 1 && weight && bias && cx_dtype_of(a) == CX_F32 && cx_dtype_of(weight) == CX_F32 &&
        cx_dtype_of(bias) == CX_F32)
        return cx_layer_norm_fused(a, weight, bias, eps);
    int axes[CX_MAX_DIMS];
    for (int i = 0; i < nnorm; i++) axes[i] = nd - nnorm + i;
    cx_tensor *m = cx_mean(a, axes, nnorm, true);
    cx_tensor *d = cx_sub(a, m);
    cx_tensor *d2 = cx_mul(d, d);
    cx_tensor *v = cx_mean(d2, axes, nnorm, true);
    cx_tensor *ve = cx_add_scalar(v, eps);
    cx_tensor *rs = cx_rsqrt(ve);
    cx_tensor *y = cx_mul(d, rs);
    DROP(m, d, d2, v, ve, rs);
    if (weight) { cx_tensor *t = cx_mul(y, weight); cx_drop(y); y = t; }
    if (bias) { cx_tensor *t = cx_add(y, bias); cx_drop(y); y = t; }
    return y;
}

/* Per-sample negative log-likelihood and the mask of counted samples. */
static cx_tensor *nll_terms(cx_tensor *logp, cx_tensor *target, int64_t ignore_index, cx_tensor **mask_out)
{
    int64_t n = logp->node->shape[0];
    int64_t s2[2] = { n, 1 };
    cx_tensor *tgt = cx_cast(target, CX_I64);
    cx_tensor *ign = cx_scalar((double)ignore_index, CX_I64);
    cx_tensor *is_ign = cx_eq(tgt, ign);
    cx_tensor *zero_i = cx_scalar(0.0, CX_I64);
    cx_tensor *safe = cx_where(is_ign, zero_i, tgt);    /* keep gather in range */
    cx_tensor *col = cx_reshape(safe, s2, 2);
    cx_tensor *picked = cx_gather(logp, 1, col);        /* (N, 1) */
    cx_tensor *flat = cx_reshape(picked, &n, 1);
    cx_tensor *one = cx_scalar_like(flat, 1.0), *zero = cx_scalar_like(flat, 0.0);
    cx_tensor *mask = cx_where(is_ign, zero, one);      /* (N,) */
    cx_tensor *neg = cx_neg(flat);
    cx_tensor *terms = cx_mul(neg, mask);
    DROP(tgt, ign, is_ign, zero_i, safe, col, picked, flat, one, zero, neg);
    *mask_out = mask;
    return terms;
}

static cx_tensor *reduce_loss(cx_tensor *terms, cx_tensor *mask, cx_reduction red)
{
    if (red == CX_REDUCE_NONE) return cx_alias(terms);
    cx_tensor *s = cx_sum(terms, NULL, 0, false);
    if (red == CX_REDUCE_SUM) return s;
    cx_tensor *cnt = cx_sum(mask, NULL, 0, false);
    cx_tensor *r = cx_div(s, cnt);
    DROP(s, cnt);
    return r;
}

/* The two reduction enums once shared values, so a collective's op passed
 * to a loss silently meant another reduction: name the mix-up. */
static cx_tensor *check_reduction(const char *op, cx_reduction red)
{
    static const char *const coll[] = { "CX_RED_SUM", "CX_RED_MEAN", "CX_RED_MAX", "CX_RED_MIN" };
    if ((unsigned)red <= CX_REDUCE_NONE) return NULL;
    unsigned k = (unsigned)red - CX_RED_SUM;
    if (k < 4)
        return cx_poisoned("%s: reduction %s (%d) is a cx_reduce_op, for collectives; a loss takes a cx_reduction "
                           "(CX_REDUCE_MEAN, CX_REDUCE_SUM or CX_REDUCE_NONE)", op, coll[k], (int)red);
    return cx_poisoned("%s: reduction %d is not a cx_reduction (CX_REDUCE_MEAN, CX_REDUCE_SUM or CX_REDUCE_NONE)", op,
                       (int)red);
}

static cx_tensor *check_loss_args(const char *op, cx_tensor *x, cx_tensor *target, cx_reduction red)
{
    if (!x || !target) return cx_poisoned("%s: input is NULL", op);
    if (x->node->op == OP_ERROR) return cx_tensor_of(x->node);
    if (target->node->op == OP_ERROR) return cx_tensor_of(target->node);
    cx_tensor *bad = check_reduction(op, red);
    if (bad) return bad;
    char b0[160], b1[160];
    if (x->node->ndim != 2 || target->node->ndim != 1 || target->node->shape[0] != x->node->shape[0] ||
        cx_dtype_is_float(cx_dtype_of(target)))
        return cx_poisoned("%s: input %s must be (N, C) and target %s integer (N,)", op,
                         cx_shape_str(b0, sizeof b0, x->node->shape, x->node->ndim),
                         cx_shape_str(b1, sizeof b1, target->node->shape, target->node->ndim));
    return NULL;
}

cx_tensor *cx_nll_loss(cx_tensor *logp, cx_tensor *target, cx_reduction red, int64_t ignore_index)
{
    cx_tensor *ac[1] = { logp };
    if (cx_autocast_f32(ac, 1)) {
        cx_tensor *r = cx_nll_loss(ac[0], target, red, ignore_index);
        cx_autocast_drop(ac, 1);
        return r;
    }
    cx_tensor *err = check_loss_args("nll_loss", logp, target, red);
    if (err) return err;
    cx_tensor *mask;
    cx_tensor *terms = nll_terms(logp, target, ignore_index, &mask);
    cx_tensor *r = reduce_loss(terms, mask, red);
    DROP(terms, mask);
    return r;
}

cx_tensor *cx_cross_entropy(cx_tensor *logits, cx_tensor *target, cx_reduction red, int64_t ignore_index,
                            double label_smoothing)
{
    cx_tensor *ac[1] = { logits };
    if (cx_autocast_f32(ac, 1)) {
        cx_tensor *r = cx_cross_entropy(ac[0], target, red, ignore_index, label_smoothing);
        cx_autocast_drop(ac, 1);
        return r;
    }
    cx_tensor *err = check_loss_args("cross_entropy", logits, target, red);
    if (err) return err;
    if (label_smoothing < 0 || label_smoothing > 1)
        return cx_poisoned("cross_entropy: label_smoothing %g is outside [0, 1]", label_smoothing);
    cx_tensor *lsm = cx_log_softmax(logits, 1);
    cx_tensor *mask;
    cx_tensor *terms = nll_terms(lsm, target, ignore_index, &mask);
    if (label_smoothing > 0) {
        /* (1-e) nll + e * mean_c(-logp_c), ignored samples masked out */
        int64_t C = logits->node->shape[1];
        int ax = 1;
        cx_tensor *s = cx_sum(lsm, &ax, 1, false);
        cx_tensor *smooth = cx_mul_scalar(s, -1.0 / (double)C);
        cx_tensor *sm = cx_mul(smooth, mask);
        cx_tensor *a = cx_mul_scalar(terms, 1.0 - label_smoothing);
        cx_tensor *b = cx_mul_scalar(sm, label_smoothing);
        cx_tensor *t = cx_add(a, b);
        DROP(s, smooth, sm, a, b, terms);
        terms = t;
    }
    cx_tensor *r = reduce_loss(terms, mask, red);
    DROP(lsm, terms, mask);
    return r;
}

cx_tensor *cx_mse_loss(cx_tensor *a, cx_tensor *b, cx_reduction red)
{
    cx_tensor *ac[2] = { a, b };
    if (cx_autocast_f32(ac, 2)) {
        cx_tensor *r = cx_mse_loss(ac[0], ac[1], red);
        cx_autocast_drop(ac, 2);
        return r;
    }
    if (!a || !b) return cx_poisoned("mse_loss: input is NULL");
    if (a->node->op == OP_ERROR) return cx_tensor_of(a->node);
    if (b->node->op == OP_ERROR) return cx_tensor_of(b->node);
    cx_tensor *bad = check_reduction("mse_loss", red);
    if (bad) return bad;
    bool same = a->node->ndim == b->node->ndim;
    for (int i = 0; same && i < a->node->ndim; i++) same = a->node->shape[i] == b->node->shape[i];
    if (!same) {
        char b0[160], b1[160];
        return cx_poisoned("mse_loss: input %s and target %s differ in shape",
                         cx_shape_str(b0, sizeof b0, a->node->shape, a->node->ndim),
                         cx_shape_str(b1, sizeof b1, b->node->shape, b->node->ndim));
    }
    cx_tensor *d = cx_sub(a, b);
    cx_tensor *d2 = cx_mul(d, d);
    cx_tensor *r;
    if (red == CX_REDUCE_NONE) r = cx_alias(d2);
    else if (red == CX_REDUCE_SUM) r = cx_sum(d2, NULL, 0, false);
    else r = cx_mean(d2, NULL, 0, false);
    DROP(d, d2);
    return r;
}
