/* The geometry of the heavy kernels (conv, pool, attention) from a kernel's
 * inputs and attributes: the compiler sizes their scratch with it and the
 * runtime calls the kernels with it, so both read the same numbers. */
#include "executable.h"

/* Conv: the input and weight shapes come from the kernel's inputs, except
 * the one a backward op only has as attributes. */
void cx_kernel_conv_geom(const cx_kernel *k, cx_conv_geom *g)
{
    const int64_t *xs = k->kind == K_CONV_BI ? k->attrs + CX_AT_CONV_SHAPE : k->in[0].shape;
    const int64_t *ws = k->kind == K_CONV_BW ? k->attrs + CX_AT_CONV_SHAPE : k->in[1].shape;
    if (k->kind != K_CONV) CX_ASSERT(k->nattrs == CX_AT_CONV_BWD_COUNT);
    *g = (cx_conv_geom){ .n = xs[0], .c = xs[1], .h = xs[2], .w = xs[3], .o = ws[0], .kh = ws[2], .kw = ws[3],
                         .stride_h = (int)CX_ATTR(k, CX_AT_CONV_STRIDE_H), .stride_w = (int)CX_ATTR(k, CX_AT_CONV_STRIDE_W),
                         .pad_h = (int)CX_ATTR(k, CX_AT_CONV_PAD_H), .pad_w = (int)CX_ATTR(k, CX_AT_CONV_PAD_W),
                         .dil_h = (int)CX_ATTR(k, CX_AT_CONV_DIL_H), .dil_w = (int)CX_ATTR(k, CX_AT_CONV_DIL_W),
                         .groups = (int)CX_ATTR(k, CX_AT_CONV_GROUPS) };
    cx_conv_geom_finish(g);
}

/* Pool: the input shape is the first input's, or an attribute for the
 * average pool's gradient (its only input is dy). */
void cx_kernel_pool_geom(const cx_kernel *k, cx_pool_geom *g)
{
    const int64_t *xs = k->kind == K_AVGPOOL_BWD ? k->attrs + CX_AT_POOL_SHAPE : k->in[0].shape;
    if (k->kind == K_AVGPOOL_BWD) CX_ASSERT(k->nattrs == CX_AT_POOL_BWD_COUNT);
    *g = (cx_pool_geom){ .n = xs[0], .c = xs[1], .h = xs[2], .w = xs[3],
                         .kh = (int)CX_ATTR(k, CX_AT_POOL_KH), .kw = (int)CX_ATTR(k, CX_AT_POOL_KW),
                         .sh = (int)CX_ATTR(k, CX_AT_POOL_SH), .sw = (int)CX_ATTR(k, CX_AT_POOL_SW),
                         .ph = (int)CX_ATTR(k, CX_AT_POOL_PH), .pw = (int)CX_ATTR(k, CX_AT_POOL_PW) };
    cx_pool_geom_finish(g);
}

/* Attention: q (N, T, H, D), k and v (N, S, H, D) as strided views; the
 * backward's forward output and its gradient are strided like q, its
 * output packed or interleaved. */
void cx_kernel_attn_geom(const cx_kernel *k, cx_attn_geom *g)
{
    const cx_kin *q = &k->in[0], *kk = &k->in[1];
    *g = (cx_attn_geom){ .n = q->shape[0], .t = q->shape[1], .h = q->shape[2], .d = q->shape[3], .s = kk->shape[1],
                         .causal = CX_ATTR(k, CX_AT_ATTN_CAUSAL) != 0, .scale = (float)k->fval,
                         .interleaved = k->nattrs > CX_AT_ATTN_INTERLEAVED && CX_ATTR(k, CX_AT_ATTN_INTERLEAVED) != 0 };
    int64_t *st[5] = { g->q_strides, g->k_strides, g->v_strides, g->o_strides, g->do_strides };
    for (int i = 0; i < k->nin && i < 5; i++)
        for (int d = 0; d < 3; d++) st[i][d] = k->in[i].view.strides[d];
}
