/* Pre-norm Transformer block with causal multi-head self-attention. */
#include "nn_internal.h"


/* ---- causal self-attention --------------------------------------------------- */

typedef struct {
    int64_t d;
    int heads;
    int qkv, proj;    /* child slots */
} attention;

cx_tensor *cx_nn_head_view(cx_tensor *qkv, int64_t lo, int64_t d, int heads)
{
    int64_t shape[4] = { cx_dim(qkv, 0), cx_dim(qkv, 1), heads, d / heads };
    int perm[4] = { 0, 2, 1, 3 };
    cx_tensor *part = cx_slice(qkv, 2, lo, lo + d, 1);   // (B, T, d)
    cx_tensor *split = cx_reshape(part, shape, 4);       // (B, T, H, hd)
    cx_tensor *heads_first = cx_permute(split, perm);    // (B, H, T, hd)
    cx_drop(part);
    cx_drop(split);
    return heads_first;
}

static cx_tensor *attention_forward(cx_module *m, cx_tensor *x)
{
    const attention *a = cx_module_impl(m);
    if (cx_ndim(x) != 3 || cx_dim(x, 2) != a->d)
        return cx_poisoned("CausalSelfAttention(%lld): want (B, T, %lld), got %d dims", (long long)a->d,
                         (long long)a->d, cx_ndim(x));
    int64_t b = cx_dim(x, 0), t = cx_dim(x, 1), d = a->d;
    cx_tensor *qkv = cx_module_forward(cx_module_child(m, a->qkv), x);   // (B, T, 3d)
    cx_tensor *q = cx_nn_head_view(qkv, 0, d, a->heads);
    cx_tensor *k = cx_nn_head_view(qkv, d, d, a->heads);
    cx_tensor *v = cx_nn_head_view(qkv, 2 * d, d, a->heads);
    cx_drop(qkv);

    /* the fused kernel: scores, causal mask and softmax never written out */
    cx_tensor *y = cx_scaled_dot_product_attention(q, k, v, true, 0.0);   // (B, H, T, hd)
    cx_drop(q); cx_drop(k);
    int perm[4] = { 0, 2, 1, 3 };
    cx_tensor *yt = cx_permute(y, perm);                        // (B, T, H, hd)
    int64_t shape[3] = { b, t, d };
    cx_tensor *merged = cx_reshape(yt, shape, 3);               // (B, T, d)
    cx_drop(v); cx_drop(y); cx_drop(yt);
    cx_tensor *out = cx_module_forward(cx_module_child(m, a->proj), merged);
    cx_drop(merged);
    return out;
}

static const cx_module_type attention_type = { CX_STRUCT_SIZE(cx_module_type),
    .name = "CausalSelfAttention",
    .forward = attention_forward,
    .free = free,
};

/* Both constructors split d_model evenly over the heads. */
static bool heads_fit(const char *what, int64_t d, int heads)
{
    if (d > 0 && heads > 0 && d % heads == 0) return true;
    cx_set_last_error("%s: d_model %lld is not a positive multiple of %d heads", what, (long long)d, heads);
    return false;
}

cx_module *cx_nn_causal_self_attention(int64_t d, int heads)
{
    if (!heads_fit("cx_nn_causal_self_attention", d, heads)) return NULL;
    attention *a = malloc(sizeof *a);
    if (!a) { cx_set_last_error("cx_nn_causal_self_attention: out of memory"); return NULL; }
    *a = (attention){ d, heads, -1, -1 };
    cx_module *m = cx_module_new(&attention_type, a);
    if (!m) return NULL;
    a->qkv = cx_module_add_child(m, "qkv", cx_nn_linear(d, 3 * d, true));
    a->proj = cx_module_add_child(m, "proj", cx_nn_linear(d, d, true));
    if (a->qkv < 0 || a->proj < 0) { cx_module_free(m); return NULL; }
    return m;
}

/* ---- the block ----------------------------------------------------------------- */

typedef struct {
    int ln1, attn, ln2, mlp;   /* child slots */
} block;

cx_tensor *cx_nn_residual(cx_module *norm, cx_module *f, cx_tensor *x)
{
    cx_tensor *h = cx_module_forward(norm, x);
    cx_tensor *fh = cx_module_forward(f, h);
    cx_tensor *y = cx_add(x, fh);
    cx_drop(h);
    cx_drop(fh);
    return y;
}

static cx_tensor *block_forward(cx_module *m, cx_tensor *x)
{
    const block *b = cx_module_impl(m);
    cx_tensor *h = cx_nn_residual(cx_module_child(m, b->ln1), cx_module_child(m, b->attn), x);
    cx_tensor *y = cx_nn_residual(cx_module_child(m, b->ln2), cx_module_child(m, b->mlp), h);
    cx_drop(h);
    return y;
}

static const cx_module_type block_type = { CX_STRUCT_SIZE(cx_module_type), .name = "TransformerBlock", .forward = block_forward, .free = free };

cx_module *cx_nn_transformer_block(int64_t d, int heads)
{
    if (!heads_fit("cx_nn_transformer_block", d, heads)) return NULL;
    block *b = malloc(sizeof *b);
    if (!b) { cx_set_last_error("cx_nn_transformer_block: out of memory"); return NULL; }
    *b = (block){ -1, -1, -1, -1 };
    cx_module *m = cx_module_new(&block_type, b);
    if (!m) return NULL;
    b->ln1 = cx_module_add_child(m, "ln_1", cx_nn_layer_norm(d, 1e-5, true));
    b->attn = cx_module_add_child(m, "attn", cx_nn_causal_self_attention(d, heads));
    b->ln2 = cx_module_add_child(m, "ln_2", cx_nn_layer_norm(d, 1e-5, true));
    cx_module *mlp[3] = { cx_nn_linear(d, 4 * d, true), cx_nn_gelu(false), cx_nn_linear(4 * d, d, true) };
    b->mlp = cx_module_add_child(m, "mlp", cx_nn_sequential(mlp, 3));
    if (b->ln1 < 0 || b->attn < 0 || b->ln2 < 0 || b->mlp < 0) { cx_module_free(m); return NULL; }
    return m;
}
