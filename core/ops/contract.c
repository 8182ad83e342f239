/* Contractions and friends: matmul, conv2d, pools, gather / scatter-add,
 * with their VJPs. A matmul or conv of two bf16 operands runs in bf16
 * (products summed in f32, the result rounded once: PyTorch's bf16 matmul
 * and conv); any other mix, and the other ops here, compute in f32 and
 * cast back. */
#include "ops.h"
#include "kernels.h"

static cx_tensor *check_in(cx_tensor *a, const char *op)
{
    if (!a) return cx_poisoned("%s: input is NULL", op);
    if (a->node->op == OP_ERROR) return cx_tensor_of(a->node);
    return NULL;
}

static bool float_operands(cx_tensor **ts, int n, const char *op, cx_tensor **err)
{
    for (int i = 0; i < n; i++)
        if (ts[i] && !cx_dtype_is_float(cx_dtype_of(ts[i]))) {
            *err = cx_poisoned("%s: operand %d has dtype %s; a float dtype is required", op, i,
                             cx_dtype_name(cx_dtype_of(ts[i])));
            return false;
        }
    return true;
}

/* ---- matmul ----------------------------------------------------------------------- */

cx_tensor *cx_matmul_prim(cx_tensor *a, cx_tensor *b)
{
    /* a (*batch, M, K), b (*batch, K, N): batch dims already equal; both
     * f32, or both bf16 */
    int nd = a->node->ndim;
    int64_t shape[CX_MAX_DIMS];
    memcpy(shape, a->node->shape, sizeof(int64_t) * (size_t)nd);
    shape[nd - 1] = b->node->shape[nd - 1];
    cx_tensor *ins[2] = { a, b };
    cx_dtype dt = cx_dtype_of(a) == CX_BF16 && cx_dtype_of(b) == CX_BF16 ? CX_BF16 : CX_F32;
    CX_ASSERT(cx_dtype_of(a) == dt && cx_dtype_of(b) == dt);
    return cx_make_op(OP_MATMUL, dt, shape, nd, ins, 2, NULL, 0, 0);
}

cx_tensor *cx_matmul(cx_tensor *a, cx_tensor *b)
{
    cx_tensor *ac[2] = { a, b };
    if (cx_autocast_low(ac, 2)) {
        cx_tensor *r = cx_matmul(ac[0], ac[1]);
        cx_autocast_drop(ac, 2);
        return r;
    }
    cx_tensor *p = check_in(a, "matmul");
    if (!p) p = check_in(b, "matmul");
    if (p) return p;
    cx_tensor *ts[2] = { a, b }, *err;
    if (!float_operands(ts, 2, "matmul", &err)) return err;
    int na = a->node->ndim, nb = b->node->ndim;
    char b0[160], b1[160];
    if (na == 0 || nb == 0) return cx_poisoned("matmul: operands must have rank >= 1, got %s and %s",
                                             cx_shape_str(b0, sizeof b0, a->node->shape, na),
                                             cx_shape_str(b1, sizeof b1, b->node->shape, nb));
    cx_tensor *A = na == 1 ? cx_unsqueeze(a, 0) : cx_alias(a);
    cx_tensor *B = nb == 1 ? cx_unsqueeze(b, 1) : cx_alias(b);
    int ra = A->node->ndim, rb = B->node->ndim;
    int64_t K = A->node->shape[ra - 1], M = A->node->shape[ra - 2], N = B->node->shape[rb - 1];
    if (B->node->shape[rb - 2] != K) {
        cx_drop(A); cx_drop(B);
        return cx_poisoned("matmul: inner dimensions differ: %s @ %s",
                         cx_shape_str(b0, sizeof b0, a->node->shape, na), cx_shape_str(b1, sizeof b1, b->node->shape, nb));
    }
    int nbatch = (ra > rb ? ra : rb) - 2;
    int64_t batch[CX_MAX_DIMS];
    for (int i = 0; i < nbatch; i++) {
        int ia = i - (nbatch - (ra - 2)), ib = i - (nbatch - (rb - 2));
        int64_t da = ia >= 0 ? A->node->shape[ia] : 1, db = ib >= 0 ? B->node->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            cx_drop(A); cx_drop(B);
            return cx_poisoned("matmul: batch dimensions of %s and %s cannot broadcast",
                             cx_shape_str(b0, sizeof b0, a->node->shape, na), cx_shape_str(b1, sizeof b1, b->node->shape, nb));
        }
        batch[i] = da == 1 ? db : da;
    }
    int64_t sa[CX_MAX_DIMS], sb[CX_MAX_DIMS];
    memcpy(sa, batch, sizeof(int64_t) * (size_t)nbatch);
    memcpy(sb, batch, sizeof(int64_t) * (size_t)nbatch);
    sa[nbatch] = M; sa[nbatch + 1] = K;
    sb[nbatch] = K; sb[nbatch + 1] = N;
    cx_tensor *Ae = cx_expand(A, sa, nbatch + 2), *Be = cx_expand(B, sb, nbatch + 2);
    cx_dtype odt = cx_promote(cx_dtype_of(a), cx_dtype_of(b));
    cx_dtype kdt = odt == CX_BF16 ? CX_BF16 : CX_F32;
    cx_tensor *Af = cx_cast(Ae, kdt), *Bf = cx_cast(Be, kdt);
    cx_tensor *r = cx_matmul_prim(Af, Bf);
    cx_tensor *rc = cx_cast(r, odt);
    cx_tensor *tmp[] = { A, B, Ae, Be, Af, Bf, r };
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) cx_drop(tmp[i]);
    cx_tensor *out = rc;
    if (na == 1) { out = cx_squeeze(rc, -2); cx_drop(rc); rc = out; }
    if (nb == 1) { out = cx_squeeze(rc, -1); cx_drop(rc); }
    return out;
}

cx_tensor *cx_matmul_transposed(cx_node *mm)
{
    cx_tensor *a = cx_tensor_of(mm->inputs[0]), *b = cx_tensor_of(mm->inputs[1]);
    cx_tensor *at = cx_transpose(a, -1, -2), *bt = cx_transpose(b, -1, -2);
    cx_tensor *r = cx_matmul_prim(bt, at);
    cx_drop(a); cx_drop(b); cx_drop(at); cx_drop(bt);
    return r;
}

/* ---- conv2d --------------------------------------------------------------------------- */

cx_tensor *cx_conv2d(cx_tensor *x, cx_tensor *w, cx_tensor *bias, int stride_h, int stride_w, int pad_h,
                     int pad_w, int dil_h, int dil_w, int groups)
{
    cx_tensor *ac[3] = { x, w, bias };
    if (cx_autocast_low(ac, 3)) {
        cx_tensor *r = cx_conv2d(ac[0], ac[1], ac[2], stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups);
        cx_autocast_drop(ac, 3);
        return r;
    }
    cx_tensor *p = check_in(x, "conv2d");
    if (!p) p = check_in(w, "conv2d");
    if (!p && bias) p = check_in(bias, "conv2d");
    if (p) return p;
    cx_tensor *ts[3] = { x, w, bias }, *err;
    if (!float_operands(ts, 3, "conv2d", &err)) return err;
    char b0[160], b1[160];
    if (x->node->ndim != 4 || w->node->ndim != 4)
        return cx_poisoned("conv2d: input %s must be (N, C, H, W) and weight %s (O, C/groups, KH, KW)",
                         cx_shape_str(b0, sizeof b0, x->node->shape, x->node->ndim),
                         cx_shape_str(b1, sizeof b1, w->node->shape, w->node->ndim));
    cx_conv_geom g = { .n = x->node->shape[0], .c = x->node->shape[1], .h = x->node->shape[2], .w = x->node->shape[3],
                       .o = w->node->shape[0], .kh = w->node->shape[2], .kw = w->node->shape[3],
                       .stride_h = stride_h, .stride_w = stride_w, .pad_h = pad_h, .pad_w = pad_w,
                       .dil_h = dil_h, .dil_w = dil_w, .groups = groups };
    if (groups <= 0 || g.c % groups || g.o % groups || w->node->shape[1] * groups != g.c || !cx_conv_geom_finish(&g))
        return cx_poisoned("conv2d: input %s and weight %s do not fit (stride %d,%d padding %d,%d dilation %d,%d groups %d)",
                         cx_shape_str(b0, sizeof b0, x->node->shape, 4), cx_shape_str(b1, sizeof b1, w->node->shape, 4),
                         stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups);
    if (bias && (bias->node->ndim != 1 || bias->node->shape[0] != g.o))
        return cx_poisoned("conv2d: bias %s must be (%lld,)", cx_shape_str(b0, sizeof b0, bias->node->shape, bias->node->ndim),
                         (long long)g.o);
    int64_t attrs[CX_AT_CONV_COUNT] = { [CX_AT_CONV_STRIDE_H] = stride_h, [CX_AT_CONV_STRIDE_W] = stride_w,
                                        [CX_AT_CONV_PAD_H] = pad_h, [CX_AT_CONV_PAD_W] = pad_w,
                                        [CX_AT_CONV_DIL_H] = dil_h, [CX_AT_CONV_DIL_W] = dil_w,
                                        [CX_AT_CONV_GROUPS] = groups };
    int64_t shape[4] = { g.n, g.o, g.oh, g.ow };
    /* bf16 x and w: a bf16 conv (f32 sums, rounded once) and a bias in
     * bf16, as PyTorch's bf16 conv; any other mix computes in f32 */
    cx_dtype odt = cx_promote(cx_dtype_of(x), cx_dtype_of(w));
    cx_dtype kdt = odt == CX_BF16 ? CX_BF16 : CX_F32;
    cx_tensor *xf = cx_cast(x, kdt), *wf = cx_cast(w, kdt);
    cx_tensor *ins[2] = { xf, wf };
    cx_tensor *y = cx_make_op(OP_CONV2D, kdt, shape, 4, ins, 2, attrs, CX_AT_CONV_COUNT, 0);
    cx_drop(xf); cx_drop(wf);
    if (bias) {
        int64_t bs[4] = { 1, g.o, 1, 1 };
        cx_tensor *br = cx_reshape(bias, bs, 4), *bc = cx_cast(br, kdt);
        cx_tensor *yb = cx_add(y, bc);
        cx_drop(br); cx_drop(bc); cx_drop(y);
        y = yb;
    }
    if (odt != kdt) { cx_tensor *c = cx_cast(y, odt); cx_drop(y); y = c; }
    return y;
}

/* ---- pools ------------------------------------------------------------------------------- */

static cx_tensor *pool(cx_op op, const char *name, cx_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw)
{
    cx_tensor *p = check_in(x, name);
    if (p) return p;
    cx_tensor *ts[1] = { x }, *err;
    if (!float_operands(ts, 1, name, &err)) return err;
    char b[160];
    if (x->node->ndim != 4) return cx_poisoned("%s: input %s must be (N, C, H, W)", name, cx_shape_str(b, sizeof b, x->node->shape, x->node->ndim));
    cx_pool_geom g = { .n = x->node->shape[0], .c = x->node->shape[1], .h = x->node->shape[2], .w = x->node->shape[3],
                       .kh = kh, .kw = kw, .sh = sh, .sw = sw, .ph = ph, .pw = pw };
    if (!cx_pool_geom_finish(&g))
        return cx_poisoned("%s: kernel %dx%d stride %d,%d padding %d,%d does not fit input %s", name, kh, kw, sh, sw, ph, pw,
                         cx_shape_str(b, sizeof b, x->node->shape, 4));
    int64_t attrs[CX_AT_POOL_COUNT] = { [CX_AT_POOL_KH] = kh, [CX_AT_POOL_KW] = kw, [CX_AT_POOL_SH] = sh,
                                        [CX_AT_POOL_SW] = sw, [CX_AT_POOL_PH] = ph, [CX_AT_POOL_PW] = pw };
    int64_t shape[4] = { g.n, g.c, g.oh, g.ow };
    /* bf16 pools in bf16 (the kernel widens each plane); other floats in f32 */
    cx_dtype kdt = cx_dtype_of(x) == CX_BF16 ? CX_BF16 : CX_F32;
    cx_tensor *xf = cx_cast(x, kdt);
    cx_tensor *y = cx_make_op(op, kdt, shape, 4, &xf, 1, attrs, CX_AT_POOL_COUNT, 0);
    cx_drop(xf);
    if (cx_dtype_of(x) != kdt) { cx_tensor *c = cx_cast(y, cx_dtype_of(x)); cx_drop(y); y = c; }
    return y;
}

cx_tensor *cx_max_pool2d(cx_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw)
{
    return pool(OP_MAXPOOL, "max_pool2d", x, kh, kw, sh, sw, ph, pw);
}

cx_tensor *cx_avg_pool2d(cx_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw)
{
    return pool(OP_AVGPOOL, "avg_pool2d", x, kh, kw, sh, sw, ph, pw);
}

/* ---- gather / scatter-add ----------------------------------------------------------------- */

static bool index_dtype(cx_tensor *t) { cx_dtype d = cx_dtype_of(t); return d == CX_I64 || d == CX_I32 || d == CX_U8; }

cx_tensor *cx_gather(cx_tensor *src, int axis, cx_tensor *index)
{
    cx_tensor *p = check_in(src, "gather");
    if (!p) p = check_in(index, "gather");
    if (p) return p;
    char b0[160], b1[160];
    int nd = src->node->ndim;
    int ax = cx_norm_axis(axis, nd);
    if (ax < 0 || nd == 0 || index->node->ndim != nd || !index_dtype(index))
        return cx_poisoned("gather: index %s %s does not fit source %s on axis %d",
                         cx_shape_str(b0, sizeof b0, index->node->shape, index->node->ndim), cx_dtype_name(cx_dtype_of(index)),
                         cx_shape_str(b1, sizeof b1, src->node->shape, nd), axis);
    for (int d = 0; d < nd; d++)
        if (d != ax && index->node->shape[d] != src->node->shape[d])
            return cx_poisoned("gather: index %s and source %s differ outside axis %d",
                             cx_shape_str(b0, sizeof b0, index->node->shape, nd), cx_shape_str(b1, sizeof b1, src->node->shape, nd), ax);
    cx_tensor *sf = cx_cast(src, CX_F32), *ix = cx_cast(index, CX_I64);
    cx_tensor *ins[2] = { sf, ix };
    int64_t attr = ax;
    cx_tensor *r = cx_make_op(OP_GATHER, CX_F32, index->node->shape, nd, ins, 2, &attr, 1, 0);
    cx_drop(sf); cx_drop(ix);
    if (cx_dtype_of(src) != CX_F32) { cx_tensor *c = cx_cast(r, cx_dtype_of(src)); cx_drop(r); r = c; }
    return r;
}

cx_tensor *cx_scatter_add(cx_tensor *base, int axis, cx_tensor *index, cx_tensor *src)
{
    cx_tensor *p = check_in(base, "scatter_add");
    if (!p) p = check_in(index, "scatter_add");
    if (!p) p = check_in(src, "scatter_add");
    if (p) return p;
    char b0[160], b1[160], b2[160];
    int nd = base->node->ndim;
    int ax = cx_norm_axis(axis, nd);
    bool ok = ax >= 0 && nd > 0 && index->node->ndim == nd && src->node->ndim == nd && index_dtype(index);
    for (int d = 0; ok && d < nd; d++) {
        if (index->node->shape[d] != src->node->shape[d]) ok = false;
        if (d != ax && index->node->shape[d] != base->node->shape[d]) ok = false;
    }
    if (!ok) return cx_poisoned("scatter_add: base %s, index %s and source %s do not fit on axis %d",
                              cx_shape_str(b0, sizeof b0, base->node->shape, nd),
                              cx_shape_str(b1, sizeof b1, index->node->shape, index->node->ndim),
                              cx_shape_str(b2, sizeof b2, src->node->shape, src->node->ndim), axis);
    cx_tensor *bf = cx_cast(base, CX_F32), *ix = cx_cast(index, CX_I64), *sf = cx_cast(src, CX_F32);
    cx_tensor *ins[3] = { bf, ix, sf };
    int64_t attr = ax;
    cx_tensor *r = cx_make_op(OP_SCATTER_ADD, CX_F32, base->node->shape, nd, ins, 3, &attr, 1, 0);
    cx_drop(bf); cx_drop(ix); cx_drop(sf);
    if (cx_dtype_of(base) != CX_F32) { cx_tensor *c = cx_cast(r, cx_dtype_of(base)); cx_drop(r); r = c; }
    return r;
}

cx_tensor *cx_embedding(cx_tensor *weight, cx_tensor *index)
{
    cx_tensor *p = check_in(weight, "embedding");
    if (!p) p = check_in(index, "embedding");
    if (p) return p;
    char b[160];
    if (weight->node->ndim != 2) return cx_poisoned("embedding: weight %s must be (V, D)", cx_shape_str(b, sizeof b, weight->node->shape, weight->node->ndim));
    if (!index_dtype(index)) return cx_poisoned("embedding: index dtype %s is not an integer", cx_dtype_name(cx_dtype_of(index)));
    int64_t n = index->node->numel, D = weight->node->shape[1];
    int64_t s2[2] = { n, 1 }, se[2] = { n, D };
    cx_tensor *flat = cx_reshape(index, s2, 2);
    cx_tensor *ex = cx_expand(flat, se, 2);
    cx_tensor *rows = cx_gather(weight, 0, ex);
    int64_t shape[CX_MAX_DIMS];
    int nd = index->node->ndim;
    if (nd + 1 > CX_MAX_DIMS) { cx_drop(flat); cx_drop(ex); cx_drop(rows); return cx_poisoned("embedding: index rank too large"); }
    memcpy(shape, index->node->shape, sizeof(int64_t) * (size_t)nd);
    shape[nd] = D;
    cx_tensor *r = cx_reshape(rows, shape, nd + 1);
    cx_drop(flat); cx_drop(ex); cx_drop(rows);
    return r;
}

cx_tensor *cx_one_hot(cx_tensor *index, int64_t num_classes, cx_dtype dtype)
{
    cx_tensor *p = check_in(index, "one_hot");
    if (p) return p;
    if (!index_dtype(index)) return cx_poisoned("one_hot: index dtype %s is not an integer", cx_dtype_name(cx_dtype_of(index)));
    if (num_classes <= 0) return cx_poisoned("one_hot: num_classes %lld must be positive", (long long)num_classes);
    cx_tensor *u = cx_unsqueeze(index, -1);
    cx_tensor *ar = cx_arange(num_classes, CX_I64);
    cx_tensor *eq = cx_eq(u, ar);
    cx_tensor *r = cx_cast(eq, dtype);
    cx_drop(u); cx_drop(ar); cx_drop(eq);
    return r;
}
