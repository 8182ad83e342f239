/* Ops with a kernel of their own where the composite would write and re-read
 * a large intermediate: scaled dot-product attention (the (T, S) scores)
 * and layer norm over the last dim (mean, variance, the normalized input).
 * Their backward ops produce every input's gradient in one packed output,
 * which the VJPs cut into views. */
#include "internal.h"

#include <math.h>

static cx_tensor *packed_part(cx_tensor *packed, int64_t off, const int64_t *shape, int nd)
{
    int64_t n = cx_shape_numel(shape, nd);
    cx_tensor *s = cx_slice(packed, 0, off, off + n, 1);
    cx_tensor *r = cx_reshape(s, shape, nd);
    cx_drop(s);
    return r;
}

/* ---- attention --------------------------------------------------------------------- */

static bool f32_rank4(cx_tensor *t) { return t && t->node->ndim == 4 && t->node->dtype == CX_F32; }

/* q (N, T, H, D), k and v (N, S, H, D): the kernel's heads-inside layout. */
static cx_tensor *attention_prim(cx_tensor *q, cx_tensor *k, cx_tensor *v, bool causal, double scale)
{
    int64_t attrs[CX_AT_ATTN_COUNT] = { [CX_AT_ATTN_CAUSAL] = causal };
    cx_tensor *ins[3] = { q, k, v };
    return cx_make_op(OP_ATTENTION, CX_F32, q->node->shape, 4, ins, 3, attrs, CX_AT_ATTN_COUNT, scale);
}

cx_tensor *cx_scaled_dot_product_attention(cx_tensor *q, cx_tensor *k, cx_tensor *v, bool is_causal, double scale)
{
    cx_tensor *in[3] = { q, k, v };
    for (int i = 0; i < 3; i++) {
        if (!in[i]) return cx_poisoned("scaled_dot_product_attention: input %d is NULL", i);
        if (in[i]->node->op == OP_ERROR) return cx_tensor_of(in[i]->node);
        if (!f32_rank4(in[i])) {
            char b[160];
            return cx_poisoned("scaled_dot_product_attention: input %d %s %s must be f32 (B, H, T, D)", i,
                               cx_shape_str(b, sizeof b, in[i]->node->shape, in[i]->node->ndim),
                               cx_dtype_name(cx_dtype_of(in[i])));
        }
    }
    const int64_t *qs = q->node->shape, *ks = k->node->shape, *vs = v->node->shape;
    bool ok = qs[0] == ks[0] && qs[1] == ks[1] && qs[3] == ks[3] && ks[0] == vs[0] && ks[1] == vs[1] &&
              ks[2] == vs[2] && ks[3] == vs[3];
    if (!ok) {
        char a[160], b[160], c[160];
        return cx_poisoned("scaled_dot_product_attention: q %s, k %s, v %s disagree on batch, heads, keys or head dim",
                           cx_shape_str(a, sizeof a, qs, 4), cx_shape_str(b, sizeof b, ks, 4), cx_shape_str(c, sizeof c, vs, 4));
    }
    if (!(scale > 0)) scale = 1.0 / sqrt((double)qs[3]);
    /* (B, H, T, D) -> (B, T, H, D) views, and the output back */
    int perm[4] = { 0, 2, 1, 3 };
    cx_tensor *qt = cx_permute(q, perm), *kt = cx_permute(k, perm), *vt = cx_permute(v, perm);
    cx_tensor *o = attention_prim(qt, kt, vt, is_causal, scale);
    cx_tensor *r = cx_permute(o, perm);
    cx_drop(qt); cx_drop(kt); cx_drop(vt); cx_drop(o);
    return r;
}

cx_tensor *cx_vjp_attention(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    const int64_t *qs = in[0]->node->shape, *ks = in[1]->node->shape;
    int64_t total = qs[0] * qs[2] * qs[3] * (qs[1] + 2 * ks[1]);
    cx_tensor *ins[5] = { in[0], in[1], in[2], out, g };
    /* interned: the three VJP calls share one backward op */
    cx_tensor *packed = cx_make_op(OP_ATTENTION_BWD, CX_F32, &total, 1, ins, 5, n->attrs, n->nattrs, n->fval);
    int64_t dq = qs[0] * qs[1] * qs[2] * qs[3], dk = ks[0] * ks[1] * ks[2] * ks[3];
    cx_tensor *r = packed_part(packed, i == 0 ? 0 : i == 1 ? dq : dq + dk, i == 0 ? qs : ks, 4);
    cx_drop(packed);
    return r;
}

/* ---- layer norm ---------------------------------------------------------------------- */

/* y = layer_norm(x) * w + b over the last dim, all f32: one kernel. */
cx_tensor *cx_layer_norm_fused(cx_tensor *x, cx_tensor *w, cx_tensor *b, double eps)
{
    cx_tensor *ins[3] = { x, w, b };
    return cx_make_op(OP_LAYER_NORM, CX_F32, x->node->shape, x->node->ndim, ins, 3, NULL, 0, eps);
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
