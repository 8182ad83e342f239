/* Gradient rules of movement ops and reductions, and the sum that undoes
 * broadcasting. */
#include "autograd.h"

cx_tensor *cx_sum_to(cx_tensor *g, const int64_t *shape, int ndim)
{
    int gd = g->node->ndim;
    if (cx_same_shape(g->node->shape, gd, shape, ndim)) return cx_alias(g);
    int axes[CX_MAX_DIMS], n = 0;
    for (int i = 0; i < gd; i++) {
        int j = i - (gd - ndim);
        if (j < 0 || (shape[j] == 1 && g->node->shape[i] != 1)) axes[n++] = i;
    }
    cx_tensor *s = n ? cx_sum(g, axes, n, true) : cx_alias(g);
    cx_tensor *r = cx_reshape(s, shape, ndim);
    cx_drop(s);
    return r;
}

cx_tensor *cx_vjp_movement(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    (void)out;
    cx_node *x = in[0]->node;
    int nd = x->ndim;
    switch ((cx_op)n->op) {
    case OP_RESHAPE: return cx_reshape(g, x->shape, nd);
    case OP_PERMUTE: {
        int inv[CX_MAX_DIMS];
        bool swap_last = nd >= 2;
        for (int k = 0; k < nd; k++) {
            int64_t src = CX_ATTR(n, CX_AT_PERM(k));
            inv[src] = k;
            if (src != (k < nd - 2 ? k : k == nd - 2 ? nd - 1 : nd - 2)) swap_last = false;
        }
        /* The gradient of W in x @ W^T (every Linear) is a matmul seen
         * through this transpose: produce it in W's layout directly
         * instead of copying it strided afterwards. */
        if (swap_last && g->node->op == OP_MATMUL) return cx_matmul_transposed(g->node);
        return cx_permute(g, inv);
    }
    case OP_EXPAND: return cx_sum_to(g, x->shape, nd);
    case OP_SLICE: {
        int ax = (int)CX_ATTR(n, CX_AT_SLICE_AXIS);
        int64_t start = CX_ATTR(n, CX_AT_SLICE_START), step = CX_ATTR(n, CX_AT_SLICE_STEP);
        int64_t lo[CX_MAX_DIMS] = { 0 }, hi[CX_MAX_DIMS] = { 0 }, inner[CX_MAX_DIMS] = { 0 };
        int64_t cnt = n->shape[ax];
        lo[ax] = start;
        inner[ax] = step - 1;
        int64_t covered = cnt > 0 ? start + (cnt - 1) * step + 1 : start;
        hi[ax] = x->shape[ax] - covered;
        return cx_pad_interior(g, lo, hi, inner, 0.0);
    }
    case OP_PAD: {
        cx_tensor *cur = cx_alias(g);
        for (int d = 0; d < nd; d++) {
            int64_t lo = CX_ATTR(n, CX_AT_PAD_LO(nd, d)), in_ = CX_ATTR(n, CX_AT_PAD_INTERIOR(nd, d));
            if (lo == 0 && in_ == 0 && n->shape[d] == x->shape[d]) continue;
            int64_t end = lo + (x->shape[d] > 0 ? (x->shape[d] - 1) * (in_ + 1) + 1 : 0);
            cx_tensor *s = cx_slice(cur, d, lo, end, in_ + 1);
            cx_drop(cur);
            cur = s;
        }
        return cur;
    }
    case OP_CONCAT: {
        int ax = (int)CX_ATTR(n, CX_AT_AXIS);
        int64_t off = 0;
        for (int k = 0; k < i; k++) off += in[k]->node->shape[ax];
        return cx_slice(g, ax, off, off + in[i]->node->shape[ax], 1);
    }
    default: return NULL;
    }
}

cx_tensor *cx_vjp_reduce(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    (void)i;
    cx_node *x = in[0]->node;
    switch ((cx_op)n->op) {
    case OP_REDUCE_SUM: return cx_expand(g, x->shape, x->ndim);
    case OP_REDUCE_MAX: {
        /* ties share the gradient evenly (amax semantics) */
        cx_tensor *oe = cx_expand(out, x->shape, x->ndim);
        cx_tensor *mask = cx_eq(in[0], oe);
        cx_tensor *mf = cx_cast(mask, (cx_dtype)x->dtype);
        int axes[CX_MAX_DIMS], na = 0;
        for (int d = 0; d < x->ndim; d++) if (CX_ATTR(n, CX_AT_REDUCE_MASK) >> d & 1) axes[na++] = d;
        cx_tensor *cnt = cx_sum(mf, axes, na, true);
        cx_tensor *gs = cx_div(g, cnt);
        cx_tensor *ge = cx_expand(gs, x->shape, x->ndim);
        cx_tensor *r = cx_mul(ge, mf);
        cx_tensor *tmp[] = { oe, mask, mf, cnt, gs, ge };
        for (size_t k = 0; k < sizeof tmp / sizeof *tmp; k++) cx_drop(tmp[k]);
        return r;
    }
    default: return NULL;
    }
}
