/* Gradient rules of the elementwise ops. */
#include "autograd.h"

#include <math.h>

/* helpers that free their temporaries: g*x etc. */
static cx_tensor *mul_d(cx_tensor *a, cx_tensor *b, bool da, bool db)
{
    cx_tensor *r = cx_mul(a, b);
    if (da) cx_drop(a);
    if (db) cx_drop(b);
    return r;
}

cx_tensor *cx_vjp_unary(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    (void)i;
    cx_tensor *x = in[0];
    switch ((cx_op)n->op) {
    case OP_NEG: return cx_neg(g);
    case OP_EXP: return cx_mul(g, out);
    case OP_LOG: return cx_div(g, x);
    case OP_SQRT: { cx_tensor *d = cx_mul_scalar(out, 2.0); return mul_d(g, cx_div(cx_scalar_like(d, 1.0), d), false, true); }
    case OP_RSQRT: { /* d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 out^3, as products: a pow would
                       * run powf per element wherever out is broadcast (BatchNorm's
                       * per-channel 1/sigma over (N, C, H, W)) */
        cx_tensor *o2 = cx_mul(out, out);
        cx_tensor *o3 = mul_d(o2, out, true, false);
        cx_tensor *d = cx_mul_scalar(o3, -0.5);
        cx_drop(o3);
        return mul_d(g, d, false, true);
    }
    case OP_TANH: {
        cx_tensor *o2 = cx_mul(out, out);
        cx_tensor *one = cx_scalar_like(out, 1.0);
        cx_tensor *d = cx_sub(one, o2);
        cx_drop(o2); cx_drop(one);
        return mul_d(g, d, false, true);
    }
    case OP_ERF: { /* 2/sqrt(pi) exp(-x^2) */
        cx_tensor *x2 = cx_mul(x, x);
        cx_tensor *nx2 = cx_neg(x2);
        cx_tensor *e = cx_exp(nx2);
        cx_tensor *d = cx_mul_scalar(e, 2.0 / sqrt(M_PI));
        cx_drop(x2); cx_drop(nx2); cx_drop(e);
        return mul_d(g, d, false, true);
    }
    case OP_GELU: return mul_d(g, cx_gelu_grad(x), false, true);
    case OP_ABS: return mul_d(g, cx_sign(x), false, true);
    case OP_SIGN: return cx_mul_scalar(g, 0.0);
    case OP_CAST:
        if (!cx_dtype_is_float((cx_dtype)n->dtype) || !cx_dtype_is_float((cx_dtype)x->node->dtype)) return NULL;
        return cx_cast(g, (cx_dtype)x->node->dtype);
    default: return NULL;
    }
}

cx_tensor *cx_vjp_binary(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    cx_tensor *a = in[0], *b = in[1];
    switch ((cx_op)n->op) {
    case OP_ADD: return cx_alias(g);
    case OP_SUB: return i == 0 ? cx_alias(g) : cx_neg(g);
    case OP_MUL: return cx_mul(g, i == 0 ? b : a);
    case OP_DIV:
        if (i == 0) return cx_div(g, b);
        else { /* -g * out / b */
            cx_tensor *t = cx_div(out, b);
            cx_tensor *u = cx_mul(g, t);
            cx_drop(t);
            cx_tensor *r = cx_neg(u);
            cx_drop(u);
            return r;
        }
    case OP_MAX:
    case OP_MIN: {
        /* ties split the gradient evenly, as torch.maximum does */
        cx_tensor *mine = i == 0 ? a : b, *other = i == 0 ? b : a;
        cx_tensor *win = n->op == OP_MAX ? cx_gt(mine, other) : cx_lt(mine, other);
        cx_tensor *tie = cx_eq(mine, other);
        cx_tensor *half = cx_mul_scalar(g, 0.5);
        cx_tensor *zero = cx_scalar_like(g, 0.0);
        cx_tensor *t1 = cx_where(tie, half, zero);
        cx_tensor *r = cx_where(win, g, t1);
        cx_drop(win); cx_drop(tie); cx_drop(half); cx_drop(zero); cx_drop(t1);
        return r;
    }
    case OP_POW:
        if (i == 0) { /* g * b * a^(b-1) */
            cx_tensor *bm1 = cx_add_scalar(b, -1.0);
            cx_tensor *p = cx_pow(a, bm1);
            cx_tensor *t = cx_mul(b, p);
            cx_drop(bm1); cx_drop(p);
            return mul_d(g, t, false, true);
        } else { /* g * out * log(a), 0 where a == 0 */
            cx_tensor *la = cx_log(a);
            cx_tensor *t = cx_mul(out, la);
            cx_tensor *z = cx_scalar_like(a, 0.0);
            cx_tensor *isz = cx_eq(a, z);
            cx_tensor *t2 = cx_where(isz, z, t);
            cx_drop(la); cx_drop(t); cx_drop(isz); cx_drop(z);
            return mul_d(g, t2, false, true);
        }
    default: return NULL;
    }
}

/* where(0 < x, x, 0), the way cx_relu records itself. */
static bool is_relu(const cx_node *n)
{
    const cx_node *c = n->inputs[0];
    return n->op == OP_WHERE && c->op == OP_LT && c->inputs[1] == n->inputs[1] && cx_is_constant(c->inputs[0], 0.0) &&
           cx_is_constant(n->inputs[2], 0.0);
}

cx_tensor *cx_vjp_where(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    if (i == 0) return NULL;
    if (i == 1 && is_relu(n)) {
        /* relu(x) > 0 exactly where x > 0 (NaN included: both false). Taking
         * the mask from the output leaves x with the forward as its only
         * consumer, so bias + relu fuse into the producer's epilogue and
         * neither x nor a bool mask is kept for backward. */
        cx_tensor *z = cx_scalar_like(out, 0.0);
        cx_tensor *pos = cx_gt(out, z);
        cx_tensor *gz = cx_scalar_like(g, 0.0);
        cx_tensor *r = cx_where(pos, g, gz);
        cx_drop(z); cx_drop(pos); cx_drop(gz);
        return r;
    }
    cx_tensor *z = cx_scalar_like(g, 0.0);
    cx_tensor *r = i == 1 ? cx_where(in[0], g, z) : cx_where(in[0], z, g);
    cx_drop(z);
    return r;
}
