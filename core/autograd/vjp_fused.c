/* Gradient rules of the fused ops: their backward ops produce every
 * input gradient in one packed output, which these rules cut into views. */
#include "autograd.h"

static cx_tensor *packed_part(cx_tensor *packed, int64_t off, const int64_t *shape, int nd)
{
    int64_t n = cx_shape_numel(shape, nd);
    cx_tensor *s = cx_slice(packed, 0, off, off + n, 1);
    cx_tensor *r = cx_reshape(s, shape, nd);
    cx_drop(s);
    return r;
}

cx_tensor *cx_vjp_attention(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    const int64_t *qs = in[0]->node->shape, *ks = in[1]->node->shape;
    int64_t total = qs[0] * qs[2] * qs[3] * (qs[1] + 2 * ks[1]);
    /* a bf16 attention's backward is bf16 too: the gradient is rounded to
     * the op's dtype first (the same rounded value for all three calls) */
    cx_dtype dt = (cx_dtype)n->dtype;
    cx_tensor *gd = cx_dtype_of(g) == dt ? cx_alias(g) : cx_cast(g, dt);
    cx_tensor *ins[5] = { in[0], in[1], in[2], out, gd };
    /* interned: the three VJP calls share one backward op */
    cx_tensor *packed = cx_make_op(OP_ATTENTION_BWD, dt, &total, 1, ins, 5, n->attrs, n->nattrs, n->fval);
    cx_drop(gd);
    int64_t dq = qs[0] * qs[1] * qs[2] * qs[3], dk = ks[0] * ks[1] * ks[2] * ks[3];
    cx_tensor *r = packed_part(packed, i == 0 ? 0 : i == 1 ? dq : dq + dk, i == 0 ? qs : ks, 4);
    cx_drop(packed);
    return r;
}

cx_tensor *cx_vjp_layer_norm(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    (void)out;
    const cx_node *x = in[0]->node;
    int64_t c = x->shape[x->ndim - 1], total = x->numel + 2 * c;
    cx_tensor *ins[3] = { in[0], in[1], g };
    cx_tensor *packed = cx_make_op(OP_LAYER_NORM_BWD, CX_F32, &total, 1, ins, 3, NULL, 0, n->fval);
    cx_tensor *r = i == 0 ? packed_part(packed, 0, x->shape, x->ndim) : packed_part(packed, x->numel + (i - 1) * c, &c, 1);
    cx_drop(packed);
    return r;
}
