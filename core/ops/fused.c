/* Ops with a kernel of their own where the composite would write and re-read
 * a large intermediate: scaled dot-product attention (the (T, S) scores)
 * and layer norm over the last dim (mean, variance, the normalized input).
 * Their backward ops produce every input's gradient in one packed output,
 * which the VJPs cut into views. */
#include "ops.h"

#include <math.h>

/* ---- attention --------------------------------------------------------------------- */

static bool float_rank4(cx_tensor *t)
{
    return t && t->node->ndim == 4 && (t->node->dtype == CX_F32 || t->node->dtype == CX_BF16);
}

/* q (N, T, H, D), k and v (N, S, H, D): the kernel's heads-inside layout.
 * All bf16 runs in bf16 (f32 inside the kernel, rounded once, as PyTorch's
 * bf16 attention); any f32 operand makes it f32. */
static cx_tensor *attention_prim(cx_tensor *q, cx_tensor *k, cx_tensor *v, bool causal, double scale)
{
    int64_t attrs[CX_AT_ATTN_COUNT] = { [CX_AT_ATTN_CAUSAL] = causal };
    cx_dtype dt = cx_dtype_of(q) == CX_BF16 && cx_dtype_of(k) == CX_BF16 && cx_dtype_of(v) == CX_BF16 ? CX_BF16 : CX_F32;
    cx_tensor *ins[3];
    for (int i = 0; i < 3; i++) ins[i] = cx_cast((cx_tensor *[]){ q, k, v }[i], dt);
    cx_tensor *r = cx_make_op(OP_ATTENTION, dt, q->node->shape, 4, ins, 3, attrs, CX_AT_ATTN_COUNT, scale);
    for (int i = 0; i < 3; i++) cx_drop(ins[i]);
    return r;
}

cx_tensor *cx_scaled_dot_product_attention(cx_tensor *q, cx_tensor *k, cx_tensor *v, bool is_causal, double scale)
{
    cx_tensor *in[3] = { q, k, v };
    if (cx_autocast_low(in, 3)) {
        cx_tensor *r = cx_scaled_dot_product_attention(in[0], in[1], in[2], is_causal, scale);
        cx_autocast_drop(in, 3);
        return r;
    }
    for (int i = 0; i < 3; i++) {
        if (!in[i]) return cx_poisoned("scaled_dot_product_attention: input %d is NULL", i);
        if (in[i]->node->op == OP_ERROR) return cx_tensor_of(in[i]->node);
        if (!float_rank4(in[i])) {
            char b[160];
            return cx_poisoned("scaled_dot_product_attention: input %d %s %s must be f32 or bf16 (B, H, T, D)", i,
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

/* ---- layer norm ---------------------------------------------------------------------- */

/* y = layer_norm(x) * w + b over the last dim, all f32: one kernel. */
cx_tensor *cx_layer_norm_fused(cx_tensor *x, cx_tensor *w, cx_tensor *b, double eps)
{
    cx_tensor *ins[3] = { x, w, b };
    return cx_make_op(OP_LAYER_NORM, CX_F32, x->node->shape, x->node->ndim, ins, 3, NULL, 0, eps);
}
