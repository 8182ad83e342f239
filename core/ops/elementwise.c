/* Elementwise primitives: broadcasting, type promotion, and their VJPs. */
#include "ops.h"
#include "obs.h"

#include <math.h>

/* ---- broadcasting ----------------------------------------------------------- */

/* The broadcast of shapes a (na dims) and b into out (which must not alias
 * a or b). @return false when they do not broadcast. */
static bool broadcast_shapes(const int64_t *a, int na, const int64_t *b, int nb, int64_t *out, int *nd)
{
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = na - n + i, ib = nb - n + i;
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da != db && da != 1 && db != 1) return false;
        out[i] = da == 1 ? db : da;
    }
    *nd = n;
    return true;
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
        int64_t so_far[CX_MAX_DIMS];
        memcpy(so_far, shape, sizeof so_far);   /* a fixed size: inline moves, no call */
        if (!broadcast_shapes(so_far, *nd, ins[i]->node->shape, ins[i]->node->ndim, shape, nd)) {
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
/* exp and log are on autocast's f32 list */
static cx_tensor *unary_f32(cx_op op, cx_tensor *a)
{
    cx_tensor *ac[1] = { a };
    if (!cx_autocast_f32(ac, 1)) return unary(op, a);
    cx_tensor *r = unary(op, ac[0]);
    cx_autocast_drop(ac, 1);
    return r;
}

cx_tensor *cx_exp(cx_tensor *a) { return unary_f32(OP_EXP, a); }
cx_tensor *cx_log(cx_tensor *a) { return unary_f32(OP_LOG, a); }
cx_tensor *cx_sqrt(cx_tensor *a) { return unary(OP_SQRT, a); }
cx_tensor *cx_rsqrt(cx_tensor *a) { return unary(OP_RSQRT, a); }
cx_tensor *cx_tanh(cx_tensor *a) { return unary(OP_TANH, a); }
cx_tensor *cx_erf(cx_tensor *a) { return unary(OP_ERF, a); }
cx_tensor *cx_gelu_erf(cx_tensor *a) { return unary(OP_GELU, a); }
cx_tensor *cx_gelu_grad(cx_tensor *x) { return unary(OP_GELU_GRAD, x); }
cx_tensor *cx_abs(cx_tensor *a) { return unary(OP_ABS, a); }
cx_tensor *cx_sign(cx_tensor *a) { return unary(OP_SIGN, a); }

/* The one axis pad node n fills with zeros around its input (no interior
 * padding, no other axis), the input at [*lo, *lo + *len) of it: -1 when n
 * pads another way or is no pad. */
static int zero_pad_axis(const cx_node *n, int64_t *lo, int64_t *len)
{
    if (n->op != OP_PAD || n->fval != 0.0) return -1;
    const int nd = n->ndim;
    int ax = -1;
    for (int i = 0; i < nd; i++) {
        if (CX_ATTR(n, CX_AT_PAD_INTERIOR(nd, i))) return -1;
        if (!CX_ATTR(n, CX_AT_PAD_LO(nd, i)) && !CX_ATTR(n, CX_AT_PAD_HI(nd, i))) continue;
        if (ax >= 0) return -1;
        ax = i;
    }
    if (ax < 0) return -1;
    *lo = CX_ATTR(n, CX_AT_PAD_LO(nd, ax));
    *len = n->inputs[0]->shape[ax];
    return ax;
}

/* a + b where both are zero pads along one axis, of the same shape and
 * dtype, and the data of one ends where the other's starts: the concat of
 * the two data, padded. The gradient of slices of one tensor adds up this
 * way (q, k and v of one projection), and the concat is a copy per part
 * where the sum read every part over the whole padded shape. NULL when
 * the operands are not such pads. */
static cx_tensor *adjacent_pads(cx_tensor *a, cx_tensor *b)
{
    int64_t la, na, lb, nb;
    const int ax = zero_pad_axis(a->node, &la, &na), bx = zero_pad_axis(b->node, &lb, &nb);
    if (ax < 0 || ax != bx || a->node->dtype != b->node->dtype) return NULL;
    if (la + na != lb) {
        if (lb + nb != la) return NULL;
        cx_tensor *t = a; a = b; b = t;
        int64_t l = la; la = lb; lb = l;
    }
    const cx_node *n = a->node;
    cx_tensor *parts[2] = { cx_tensor_of(n->inputs[0]), cx_tensor_of(b->node->inputs[0]) };
    cx_tensor *cat = cx_concat(parts, 2, ax);
    int64_t lo[CX_MAX_DIMS] = { 0 }, hi[CX_MAX_DIMS] = { 0 };
    lo[ax] = la;
    hi[ax] = n->shape[ax] - (lb + b->node->inputs[0]->shape[ax]);
    cx_tensor *r = cx_pad(cat, lo, hi, 0.0);
    cx_drop(parts[0]);
    cx_drop(parts[1]);
    cx_drop(cat);
    return r;
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
        if (!cx_is_constant(k->node, ident) || (side ? ops[0] : ops[1])) continue;
        if ((x->node->flags & NF_REQUIRES_GRAD) && !cx_grad_enabled()) continue;
        if (ops[0]) cx_drop(ops[0]);
        if (ops[1]) cx_drop(ops[1]);
        return cx_alias(x);
    }
    cx_tensor *r = op == OP_ADD && !ops[0] && !ops[1] ? adjacent_pads(a, b) : NULL;
    if (!r) r = cx_make_op(op, cmp ? CX_BOOL : dt, shape, nd, use, 2, NULL, 0, 0);
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
        int64_t s2[CX_MAX_DIMS];
        int nd2;
        if (!broadcast_shapes(shape, nd, c->node->shape, c->node->ndim, s2, &nd2)) {
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

cx_tensor *cx_detach(cx_tensor *t)
{
    if (!t) return cx_poisoned("detach: input is NULL");
    if (t->node->op == OP_ERROR || !(t->node->flags & NF_REQUIRES_GRAD)) return cx_alias(t);
    /* its own no-grad node with the same value: x * 1, recorded as is (the
     * identity x * 1 = x is not applied to a value that carries grad) */
    cx_no_grad_begin();
    cx_tensor *one = cx_scalar_like(t, 1.0);
    cx_tensor *ones = cx_expand(one, t->node->shape, t->node->ndim);
    cx_tensor *ins[2] = { t, ones };
    cx_tensor *r = cx_make_op(OP_MUL, (cx_dtype)t->node->dtype, t->node->shape, t->node->ndim, ins, 2, NULL, 0, 0);
    cx_drop(one);
    cx_drop(ones);
    cx_no_grad_end();
    return r;
}
