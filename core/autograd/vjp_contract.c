/* Gradient rules of matmul, convolution, pooling and gather. */
#include "autograd.h"

cx_tensor *cx_vjp_matmul(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    (void)out;
    /* dA = g @ B^T, dB = A^T @ g; batch dims are equal (views did the
     * broadcast). A bf16 matmul's gradients are bf16 matmuls too (as
     * PyTorch's under autocast); a gradient arriving in f32 is rounded to
     * the op's dtype first, so the two products run in the forward's. */
    cx_dtype dt = (cx_dtype)n->dtype;
    cx_tensor *gd = cx_dtype_of(g) == dt ? cx_alias(g) : cx_cast(g, dt);
    cx_tensor *other = cx_transpose(in[1 - i], -1, -2);
    cx_tensor *r = i == 0 ? cx_matmul_prim(gd, other) : cx_matmul_prim(other, gd);
    cx_drop(other);
    cx_drop(gd);
    return r;
}

cx_tensor *cx_vjp_conv(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    (void)out;
    /* the backward ops also carry the shape they cannot see from their
     * inputs; a bf16 conv's gradients are bf16 convs (the gradient rounded
     * to bf16 first), as matmul's */
    int64_t attrs[CX_AT_CONV_BWD_COUNT];
    CX_ASSERT(n->nattrs == CX_AT_CONV_COUNT);
    memcpy(attrs, n->attrs, CX_AT_CONV_COUNT * sizeof(int64_t));
    cx_dtype dt = (cx_dtype)n->dtype;
    cx_tensor *gd = cx_dtype_of(g) == dt ? cx_alias(g) : cx_cast(g, dt), *r;
    if (i == 0) {
        cx_node *x = in[0]->node;
        memcpy(attrs + CX_AT_CONV_SHAPE, x->shape, 4 * sizeof(int64_t));
        cx_tensor *ins[2] = { gd, in[1] };
        r = cx_make_op(OP_CONV2D_BWD_INPUT, dt, x->shape, 4, ins, 2, attrs, CX_AT_CONV_BWD_COUNT, 0);
    } else {
        cx_node *w = in[1]->node;
        memcpy(attrs + CX_AT_CONV_SHAPE, w->shape, 4 * sizeof(int64_t));
        cx_tensor *ins[2] = { in[0], gd };
        r = cx_make_op(OP_CONV2D_BWD_WEIGHT, dt, w->shape, 4, ins, 2, attrs, CX_AT_CONV_BWD_COUNT, 0);
    }
    cx_drop(gd);
    return r;
}

cx_tensor *cx_vjp_pool(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    (void)out; (void)i;
    cx_node *x = in[0]->node;
    /* the gradient runs in the forward's dtype (f32 or bf16) */
    const cx_dtype dt = (cx_dtype)n->dtype;
    cx_tensor *gd = cx_cast(g, dt), *r;
    if (n->op == OP_MAXPOOL) {
        cx_tensor *ins[2] = { in[0], gd };
        r = cx_make_op(OP_MAXPOOL_BWD, dt, x->shape, 4, ins, 2, n->attrs, CX_AT_POOL_COUNT, 0);
    } else {
        /* dy is the gradient's only input: the input shape rides along */
        int64_t attrs[CX_AT_POOL_BWD_COUNT];
        memcpy(attrs, n->attrs, CX_AT_POOL_COUNT * sizeof(int64_t));
        memcpy(attrs + CX_AT_POOL_SHAPE, x->shape, 4 * sizeof(int64_t));
        r = cx_make_op(OP_AVGPOOL_BWD, dt, x->shape, 4, &gd, 1, attrs, CX_AT_POOL_BWD_COUNT, 0);
    }
    cx_drop(gd);
    return r;
}

cx_tensor *cx_vjp_gather(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    (void)out;
    int ax = (int)CX_ATTR(n, CX_AT_AXIS);
    if (n->op == OP_GATHER) {
        if (i != 0) return NULL;
        cx_tensor *z = cx_zeros(in[0]->node->shape, in[0]->node->ndim, CX_F32);
        cx_tensor *r = cx_scatter_add(z, ax, in[1], g);
        cx_drop(z);
        return r;
    }
    /* scatter_add(base, index, src) */
    if (i == 0) return cx_alias(g);
    if (i == 2) return cx_gather(g, ax, in[1]);
    return NULL;
}
