/* Elementwise primitives: broadcasting, type promotion, and their VJPs. */
#include "internal.h"
#include "obs.h"

#include <math.h>

cx_dtype cx_promote(cx_dtype a, cx_dtype b)
{
    if (a == b) return a;
    bool fa = cx_dtype_is_float(a), fb = cx_dtype_is_float(b);
    if (fa && fb) return CX_F32;
    if (fa) return a;
    if (fb) return b;
    static const int rank[CX_DTYPE_COUNT] = { [CX_BOOL] = 0, [CX_U8] = 1, [CX_I32] = 2, [CX_I64] = 3 };
    return rank[a] >= rank[b] ? a : b;
}

int cx_norm_axis(int axis, int ndim)
{
    if (axis < 0) axis += ndim;
    return (axis < 0 || axis >= (ndim ? ndim : 1)) ? -1 : axis;
}

cx_tensor *cx_make_op(cx_op op, cx_dtype dt, const int64_t *shape, int ndim,
                      cx_tensor *const *ins, int nin, const int64_t *attrs, int nattrs, double fval)
{
    cx_node *nodes_small[8];
    cx_node **nodes = nin <= 8 ? nodes_small : malloc((size_t)nin * sizeof *nodes);
    if (!nodes) return cx_poisoned("%s: out of memory", cx_op_table[op].name);
    uint32_t flags = 0;
    for (int i = 0; i < nin; i++) {
        if (!ins[i]) {
            if (nodes != nodes_small) free(nodes);
            return cx_poisoned("%s: input %d is NULL", cx_op_table[op].name, i);
        }
        if (ins[i]->node->op == OP_ERROR) {
            if (nodes != nodes_small) free(nodes);
            return cx_tensor_of(ins[i]->node); /* poison propagates */
        }
        nodes[i] = ins[i]->node;
        if (nodes[i]->flags & NF_REQUIRES_GRAD) flags |= NF_REQUIRES_GRAD;
    }
    if (cx_record()->no_grad) flags = 0;
    cx_node_desc d = { .op = op, .dtype = dt, .ndim = ndim, .shape = shape, .ninputs = nin,
                       .inputs = nodes, .nattrs = nattrs, .attrs = attrs, .fval = fval, .flags = flags };
    cx_node *n = cx_node_make(&d);
    if (nodes != nodes_small) free(nodes);
    if (!n) return cx_poisoned("%s: out of memory", cx_op_table[op].name);
    cx_tensor *t = cx_tensor_wrap(n);
    /* XLA_USE_EAGER_DEBUG_MODE (debug.c): run the op now; one branch otherwise */
    if (t && (cx_obs_get() & OBS_EAGER)) cx_eager_run(t);
    return t;
}

/* ---- broadcasting ----------------------------------------------------------- */

static bool broadcast_shapes(const cx_node *a, const cx_node *b, int64_t *out, int *nd)
{
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n; i++) {
        int ia = a->ndim - n + i, ib = b->ndim - n + i;
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) return false;
        out[i] = da == 1 ? db : da;
    }
    *nd = n;
    return true;
}

cx_tensor *cx_expand_to(cx_tensor *a, const int64_t *shape, int ndim)
{
    if (!a) return cx_poisoned("expand: NULL input");
    if (a->node->op == OP_ERROR) return cx_tensor_of(a->node);
    return cx_expand(a, shape, ndim);
}

cx_tensor *cx_scalar_like(cx_tensor *a, double v)
{
    return cx_scalar(v, a ? cx_dtype_of(a) : CX_F32);
}

static cx_tensor *poisoned_input(cx_tensor *const *ts, int n, const char *op)
{
    for (int i = 0; i < n; i++) {
        if (!ts[i]) return cx_poisoned("%s: input %d is NULL", op, i);
        if (ts[i]->node->op == OP_ERROR) return cx_tensor_of(ts[i]->node);
    }
    return NULL;
}

/* Promotes and broadcasts `n` operands (in place of ins[]); the caller owns
 * the returned handles in out[]. */
static bool prepare_operands(const char *op, cx_tensor *const *ins, int n, cx_dtype dt,
                             cx_tensor **out, int64_t *shape, int *nd, cx_tensor **err)
{
    *nd = ins[0]->node->ndim;
    memcpy(shape, ins[0]->node->shape, sizeof(int64_t) * (size_t)*nd);
    for (int i = 1; i < n; i++) {
        cx_node tmp = { .ndim = (uint8_t)*nd };
        memcpy(tmp.shape, shape, sizeof(int64_t) * (size_t)*nd);
        if (!broadcast_shapes(&tmp, ins[i]->node, shape, nd)) {
            char b0[160], b1[160];
            *err = cx_poisoned("%s: shapes %s and %s cannot broadcast", op,
                             cx_shape_str(b0, sizeof b0, ins[0]->node->shape, ins[0]->node->ndim),
                             cx_shape_str(b1, sizeof b1, ins[i]->node->shape, ins[i]->node->ndim));
            return false;
        }
    }
    for (int i = 0; i < n; i++) {
        cx_node *x = ins[i]->node;
        bool same = x->dtype == dt && x->ndim == *nd && !memcmp(x->shape, shape, sizeof(int64_t) * (size_t)*nd);
        if (same) { out[i] = NULL; continue; } /* use the input as is */
        cx_tensor *c = x->dtype == dt ? ins[i] : cx_cast(ins[i], dt);
        out[i] = cx_expand(c, shape, *nd);
        if (c != ins[i]) cx_drop(c);
    }
    return true;
}

static cx_tensor *unary(cx_op op, cx_tensor *a)
{
    cx_tensor *p = poisoned_input(&a, 1, cx_op_table[op].name);
    if (p) return p;
    cx_dtype dt = (cx_dtype)a->node->dtype;
    bool needs_float = op != OP_NEG && op != OP_ABS && op != OP_SIGN;
    if (needs_float && !cx_dtype_is_float(dt)) {
        cx_tensor *f = cx_cast(a, CX_F32);
        cx_tensor *r = unary(op, f);
        cx_drop(f);
        return r;
    }
    return cx_make_op(op, dt, a->node->shape, a->node->ndim, &a, 1, NULL, 0, 0);
}

cx_tensor *cx_neg(cx_tensor *a) { return unary(OP_NEG, a); }
cx_tensor *cx_exp(cx_tensor *a) { return unary(OP_EXP, a); }
cx_tensor *cx_log(cx_tensor *a) { return unary(OP_LOG, a); }
cx_tensor *cx_sqrt(cx_tensor *a) { return unary(OP_SQRT, a); }
cx_tensor *cx_rsqrt(cx_tensor *a) { return unary(OP_RSQRT, a); }
cx_tensor *cx_tanh(cx_tensor *a) { return unary(OP_TANH, a); }
cx_tensor *cx_erf(cx_tensor *a) { return unary(OP_ERF, a); }
cx_tensor *cx_abs(cx_tensor *a) { return unary(OP_ABS, a); }
cx_tensor *cx_sign(cx_tensor *a) { return unary(OP_SIGN, a); }

cx_tensor *cx_cast(cx_tensor *a, cx_dtype dtype)
{
    cx_tensor *p = poisoned_input(&a, 1, "cast");
    if (p) return p;
    if ((unsigned)dtype >= CX_DTYPE_COUNT) return cx_poisoned("cast: unknown dtype %d", (int)dtype);
    if (a->node->dtype == dtype) return cx_alias(a);
    int64_t attr = dtype;
    return cx_make_op(OP_CAST, dtype, a->node->shape, a->node->ndim, &a, 1, &attr, 1, 0);
}

/* A constant `v`, possibly broadcast (expand / reshape of a 0-d constant). */
static bool is_constant(const cx_node *n, double v)
{
    while ((n->op == OP_EXPAND || n->op == OP_RESHAPE) && n->ninputs == 1) n = n->inputs[0];
    return n->op == OP_CONST && n->fval == v;
}

static cx_tensor *binary(cx_op op, cx_tensor *a, cx_tensor *b)
{
    cx_tensor *ins[2] = { a, b };
    cx_tensor *p = poisoned_input(ins, 2, cx_op_table[op].name);
    if (p) return p;
    cx_dtype dt = cx_promote((cx_dtype)a->node->dtype, (cx_dtype)b->node->dtype);
    if (op == OP_POW && !cx_dtype_is_float(dt)) dt = CX_F32;
    if (op == OP_DIV && !cx_dtype_is_float(dt)) dt = CX_F32; /* true division, as torch */
    cx_tensor *ops[2], *err = NULL;
    int64_t shape[CX_MAX_DIMS];
    int nd;
    if (!prepare_operands(cx_op_table[op].name, ins, 2, dt, ops, shape, &nd, &err)) return err;
    bool cmp = op == OP_LT || op == OP_LE || op == OP_EQ;
    cx_tensor *use[2] = { ops[0] ? ops[0] : a, ops[1] ? ops[1] : b };
    /* algebraic identities: x * 1, 1 * x, x / 1, x + 0, 0 + x, x - 0 are x
     * (as long as x already has the result's shape, dtype and grad flag) */
    for (int side = 0; side < 2 && !cmp; side++) {
        double ident = (op == OP_MUL || (op == OP_DIV && side == 1)) ? 1.0
                     : (op == OP_ADD || (op == OP_SUB && side == 1)) ? 0.0 : -1.0;
        if (ident < 0) continue;
        cx_tensor *k = side ? b : a, *x = side ? a : b;
        if (!is_constant(k->node, ident) || (side ? ops[0] : ops[1])) continue;
        if ((x->node->flags & NF_REQUIRES_GRAD) && !cx_grad_enabled()) continue;
        if (ops[0]) cx_drop(ops[0]);
        if (ops[1]) cx_drop(ops[1]);
        return cx_alias(x);
    }
    cx_tensor *r = cx_make_op(op, cmp ? CX_BOOL : dt, shape, nd, use, 2, NULL, 0, 0);
    if (ops[0]) cx_drop(ops[0]);
    if (ops[1]) cx_drop(ops[1]);
    return r;
}

cx_tensor *cx_add(cx_tensor *a, cx_tensor *b) { return binary(OP_ADD, a, b); }
cx_tensor *cx_sub(cx_tensor *a, cx_tensor *b) { return binary(OP_SUB, a, b); }
cx_tensor *cx_mul(cx_tensor *a, cx_tensor *b) { return binary(OP_MUL, a, b); }
cx_tensor *cx_div(cx_tensor *a, cx_tensor *b) { return binary(OP_DIV, a, b); }
cx_tensor *cx_maximum(cx_tensor *a, cx_tensor *b) { return binary(OP_MAX, a, b); }
cx_tensor *cx_minimum(cx_tensor *a, cx_tensor *b) { return binary(OP_MIN, a, b); }
cx_tensor *cx_pow(cx_tensor *a, cx_tensor *b) { return binary(OP_POW, a, b); }
cx_tensor *cx_lt(cx_tensor *a, cx_tensor *b) { return binary(OP_LT, a, b); }
cx_tensor *cx_le(cx_tensor *a, cx_tensor *b) { return binary(OP_LE, a, b); }
cx_tensor *cx_eq(cx_tensor *a, cx_tensor *b) { return binary(OP_EQ, a, b); }
cx_tensor *cx_gt(cx_tensor *a, cx_tensor *b) { return binary(OP_LT, b, a); }
cx_tensor *cx_ge(cx_tensor *a, cx_tensor *b) { return binary(OP_LE, b, a); }

cx_tensor *cx_where(cx_tensor *cond, cx_tensor *a, cx_tensor *b)
{
    cx_tensor *ins[3] = { cond, a, b };
    cx_tensor *p = poisoned_input(ins, 3, "where");
    if (p) return p;
    cx_dtype dt = cx_promote((cx_dtype)a->node->dtype, (cx_dtype)b->node->dtype);
    cx_tensor *c = cx_cast(cond, CX_BOOL);
    cx_tensor *ins2[3] = { c, a, b };
    int64_t shape[CX_MAX_DIMS];
    int nd;
    cx_tensor *ops[3], *err = NULL;
    {
        /* broadcast all three */
        if (!prepare_operands("where", ins2 + 1, 2, dt, ops + 1, shape, &nd, &err)) { cx_drop(c); return err; }
        cx_node tmpn = { .ndim = (uint8_t)nd };
        memcpy(tmpn.shape, shape, sizeof(int64_t) * (size_t)nd);
        int64_t s2[CX_MAX_DIMS];
        int nd2;
        if (!broadcast_shapes(&tmpn, c->node, s2, &nd2)) {
            char b0[160], b1[160];
            cx_drop(ops[1]); cx_drop(ops[2]); cx_drop(c);
            return cx_poisoned("where: condition %s cannot broadcast with %s",
                             cx_shape_str(b0, sizeof b0, cond->node->shape, cond->node->ndim),
                             cx_shape_str(b1, sizeof b1, shape, nd));
        }
        if (!ops[1]) ops[1] = cx_alias(a);
        if (!ops[2]) ops[2] = cx_alias(b);
        if (nd2 != nd || memcmp(s2, shape, sizeof(int64_t) * (size_t)nd)) {
            cx_tensor *o1 = cx_expand(ops[1], s2, nd2), *o2 = cx_expand(ops[2], s2, nd2);
            cx_drop(ops[1]); cx_drop(ops[2]);
            ops[1] = o1; ops[2] = o2;
            memcpy(shape, s2, sizeof s2);
            nd = nd2;
        }
        ops[0] = cx_expand(c, shape, nd);
    }
    cx_drop(c);
    cx_tensor *r = cx_make_op(OP_WHERE, dt, shape, nd, ops, 3, NULL, 0, 0);
    for (int i = 0; i < 3; i++) cx_drop(ops[i]);
    return r;
}

static cx_tensor *with_scalar(cx_tensor *(*f)(cx_tensor *, cx_tensor *), cx_tensor *a, double s)
{
    cx_tensor *c = cx_scalar(s, a && cx_dtype_is_float(cx_dtype_of(a)) ? cx_dtype_of(a)
                                : (s == floor(s) && a ? cx_dtype_of(a) : CX_F32));
    cx_tensor *r = f(a, c);
    cx_drop(c);
    return r;
}

cx_tensor *cx_add_scalar(cx_tensor *a, double s) { return with_scalar(cx_add, a, s); }
cx_tensor *cx_mul_scalar(cx_tensor *a, double s) { return with_scalar(cx_mul, a, s); }
cx_tensor *cx_pow_scalar(cx_tensor *a, double s) { return with_scalar(cx_pow, a, s); }

/* ---- VJPs ---------------------------------------------------------------------- */

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
    case OP_RSQRT: { /* d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 out^3 */
        cx_tensor *o3 = cx_pow_scalar(out, 3.0);
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
    return n->op == OP_WHERE && c->op == OP_LT && c->inputs[1] == n->inputs[1] && is_constant(c->inputs[0], 0.0) &&
           is_constant(n->inputs[2], 0.0);
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
