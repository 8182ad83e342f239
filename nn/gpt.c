/* GPT: token and position embeddings, n_layer pre-norm blocks (fused causal
 * attention, exact-GELU MLP), a final LayerNorm and the lm_head tied to
 * the token embedding. Module and parameter names follow nanoGPT so a
 * state dict moves between the two unchanged. */
#include "nn_internal.h"

#include "cx_struct.h"

#include <cxla/gpt.h>

#include <math.h>

/* The caller's config over the defaults. @return false, error set, when its
 * struct_size is below the first version's. */
static bool take_config(cx_gpt_config *own, const cx_gpt_config *given, const char *fn)
{
    char serr[256];
    *own = cx_gpt_default_config();
    if (cx_struct_take(own, sizeof *own, given, given->struct_size, CX_SIZE_THROUGH(cx_gpt_config, n_embd),
                       "cx_gpt_config", serr, sizeof serr)) {
        /* the copy is whole, whatever the caller's size: the model keeps
         * it as the config it was built from */
        own->struct_size = sizeof *own;
        return true;
    }
    cx_set_last_error("%s: %s", fn, serr);
    return false;
}

double cx_gpt_flops_per_token(cx_gpt_config given, int64_t t)
{
    cx_gpt_config c;
    if (!take_config(&c, &given, "cx_gpt_flops_per_token")) return NAN;
    double C = (double)c.n_embd, L = (double)c.n_layer, V = (double)c.vocab_size;
    /* per block: c_attn 3C^2 + 3C, c_proj C^2 + C, c_fc 4C^2 + 4C, c_proj 4C^2 + C, two LayerNorms 4C */
    double block = 12.0 * C * C + 13.0 * C;
    double params = V * C + L * block + 2.0 * C;   /* wte (also lm_head) + blocks + ln_f */
    return 6.0 * params + 12.0 * L * C * ((double)t + 1.0) / 2.0;
}

/* ---- parameters ------------------------------------------------------------------ */

/* Takes a fresh persistent tensor for parameter `slot` of m: a slot set
 * by hand gets no requires_grad of its own. */
static void set_trainable(cx_module *m, int slot, cx_tensor *t)
{
    cx_requires_grad(t, true);
    cx_module_set_param(m, slot, t);
}

/* Linear(in, out) with weight ~ normal(0, std) and bias 0. NULL on failure. */
static cx_module *gpt_linear(int64_t in, int64_t out, double std)
{
    cx_module *l = cx_nn_linear(in, out, true);
    if (!l) return NULL;
    int64_t shape[2] = { out, in };
    set_trainable(l, cx_module_param_slot(l, "weight"), cx_init_normal(shape, 2, 0.0, std));
    set_trainable(l, cx_module_param_slot(l, "bias"), cx_init_constant(&out, 1, 0.0, CX_F32));
    return l;
}

static cx_module *gpt_embedding(int64_t n, int64_t dim)
{
    cx_module *e = cx_nn_embedding(n, dim);
    if (!e) return NULL;
    int64_t shape[2] = { n, dim };
    set_trainable(e, cx_module_param_slot(e, "weight"), cx_init_normal(shape, 2, 0.0, 0.02));
    return e;
}

/* Adds children in order; takes them (also on failure). @return false when
 * one is NULL or cannot be added. */
static bool add_children(cx_module *m, const char *const *names, cx_module **kids, int n, int *slots)
{
    bool ok = true;
    for (int i = 0; i < n; i++) {
        if (ok && kids[i]) {
            slots[i] = cx_module_add_child(m, names[i], kids[i]);
            ok = slots[i] >= 0;
        } else {
            cx_module_free(kids[i]);
            ok = false;
        }
    }
    return ok;
}

/* ---- attention and MLP ------------------------------------------------------------- */

typedef struct {
    int64_t d;
    int heads;
    int kid[2];   /* c_attn, c_proj */
} attn;

static cx_tensor *attn_forward(cx_module *m, cx_tensor *x)
{
    const attn *a = cx_module_impl(m);
    int64_t shape[3] = { cx_dim(x, 0), cx_dim(x, 1), a->d };
    int perm[4] = { 0, 2, 1, 3 };
    cx_tensor *qkv = cx_module_forward(cx_module_child(m, a->kid[0]), x);   // (B, T, 3C)
    cx_tensor *q = cx_nn_head_view(qkv, 0, a->d, a->heads);
    cx_tensor *k = cx_nn_head_view(qkv, a->d, a->d, a->heads);
    cx_tensor *v = cx_nn_head_view(qkv, 2 * a->d, a->d, a->heads);
    cx_tensor *y = cx_scaled_dot_product_attention(q, k, v, true, 0.0);      // (B, H, T, hd)
    cx_tensor *yt = cx_permute(y, perm);                                     // (B, T, H, hd)
    cx_tensor *merged = cx_reshape(yt, shape, 3);                            // (B, T, C)
    cx_tensor *out = cx_module_forward(cx_module_child(m, a->kid[1]), merged);
    cx_drop(qkv); cx_drop(q); cx_drop(k); cx_drop(v); cx_drop(y); cx_drop(yt); cx_drop(merged);
    return out;
}

static const cx_module_type attn_type = { CX_STRUCT_SIZE(cx_module_type), .name = "CausalSelfAttention", .forward = attn_forward, .free = free };

typedef struct {
    int kid[2];   /* c_fc, c_proj */
} mlp;

static cx_tensor *mlp_forward(cx_module *m, cx_tensor *x)
{
    const mlp *p = cx_module_impl(m);
    cx_tensor *h = cx_module_forward(cx_module_child(m, p->kid[0]), x);   // (B, T, 4C)
    cx_tensor *g = cx_gelu(h, false);
    cx_tensor *out = cx_module_forward(cx_module_child(m, p->kid[1]), g);  // (B, T, C)
    cx_drop(h);
    cx_drop(g);
    return out;
}

static const cx_module_type mlp_type = { CX_STRUCT_SIZE(cx_module_type), .name = "MLP", .forward = mlp_forward, .free = free };

/* Makes a module of `type` over impl (taken) with the named children. */
static cx_module *with_children(const cx_module_type *type, void *impl, const char *const *names, cx_module **kids,
                                int n, int *slots)
{
    cx_module *m = impl ? cx_module_new(type, impl) : NULL;
    if (!m) {
        if (!impl) cx_set_last_error("cx_nn_gpt: out of memory");
        for (int i = 0; i < n; i++) cx_module_free(kids[i]);
        return NULL;
    }
    if (!add_children(m, names, kids, n, slots)) { cx_module_free(m); return NULL; }
    return m;
}

static cx_module *gpt_attn(const cx_gpt_config *c, double proj_std)
{
    attn *a = malloc(sizeof *a);
    if (a) *a = (attn){ .d = c->n_embd, .heads = c->n_head };
    static const char *const names[2] = { "c_attn", "c_proj" };
    cx_module *kids[2] = { gpt_linear(c->n_embd, 3 * c->n_embd, 0.02), gpt_linear(c->n_embd, c->n_embd, proj_std) };
    return with_children(&attn_type, a, names, kids, 2, a ? a->kid : (int[2]){ 0 });
}

static cx_module *gpt_mlp(const cx_gpt_config *c, double proj_std)
{
    mlp *p = malloc(sizeof *p);
    static const char *const names[2] = { "c_fc", "c_proj" };
    cx_module *kids[2] = { gpt_linear(c->n_embd, 4 * c->n_embd, 0.02), gpt_linear(4 * c->n_embd, c->n_embd, proj_std) };
    return with_children(&mlp_type, p, names, kids, 2, p ? p->kid : (int[2]){ 0 });
}

/* ---- block ----------------------------------------------------------------------------- */

typedef struct {
    int kid[4];   /* ln_1, attn, ln_2, mlp */
} gblock;

static cx_tensor *block_forward(cx_module *m, cx_tensor *x)
{
    const gblock *b = cx_module_impl(m);
    cx_tensor *h = cx_nn_residual(cx_module_child(m, b->kid[0]), cx_module_child(m, b->kid[1]), x);
    cx_tensor *y = cx_nn_residual(cx_module_child(m, b->kid[2]), cx_module_child(m, b->kid[3]), h);
    cx_drop(h);
    return y;
}

static const cx_module_type block_type = { CX_STRUCT_SIZE(cx_module_type), .name = "Block", .forward = block_forward, .free = free };

static cx_module *gpt_block(const cx_gpt_config *c)
{
    double proj_std = 0.02 / sqrt(2.0 * c->n_layer);
    gblock *b = malloc(sizeof *b);
    static const char *const names[4] = { "ln_1", "attn", "ln_2", "mlp" };
    cx_module *kids[4] = { cx_nn_layer_norm(c->n_embd, 1e-5, true), gpt_attn(c, proj_std),
                           cx_nn_layer_norm(c->n_embd, 1e-5, true), gpt_mlp(c, proj_std) };
    return with_children(&block_type, b, names, kids, 4, b ? b->kid : (int[4]){ 0 });
}

/* ---- the transformer trunk ------------------------------------------------------------- */

typedef struct {
    int64_t block_size;
    int kid[4];   /* wte, wpe, h, ln_f */
} trunk;

/* idx (B, T) -> ln_f(blocks(wte[idx] + wpe[0..T))) (B, T, C) */
static cx_tensor *trunk_forward(cx_module *m, cx_tensor *idx)
{
    const trunk *tr = cx_module_impl(m);
    int64_t t = cx_ndim(idx) == 2 ? cx_dim(idx, 1) : 0;
    if (t < 1 || t > tr->block_size || cx_dtype_is_float(cx_dtype_of(idx)))
        return cx_poisoned("GPT: want integer tokens (B, T) with 1 <= T <= block %lld, got %d dims%s",
                           (long long)tr->block_size, cx_ndim(idx),
                           cx_dtype_is_float(cx_dtype_of(idx)) ? " of floats" : "");
    cx_tensor *tok = cx_module_forward(cx_module_child(m, tr->kid[0]), idx);   // (B, T, C)
    cx_tensor *positions = cx_arange(t, CX_I64);
    cx_tensor *pos = cx_module_forward(cx_module_child(m, tr->kid[1]), positions);   // (T, C)
    cx_tensor *x = cx_add(tok, pos);
    cx_tensor *h = cx_module_forward(cx_module_child(m, tr->kid[2]), x);
    cx_tensor *out = cx_module_forward(cx_module_child(m, tr->kid[3]), h);
    cx_drop(tok); cx_drop(positions); cx_drop(pos); cx_drop(x); cx_drop(h);
    return out;
}

static const cx_module_type trunk_type = { CX_STRUCT_SIZE(cx_module_type), .name = "GPTTransformer", .forward = trunk_forward, .free = free };

static cx_module *gpt_blocks(const cx_gpt_config *c)
{
    cx_module **blocks = calloc((size_t)c->n_layer, sizeof *blocks);
    if (!blocks) { cx_set_last_error("cx_nn_gpt: out of memory"); return NULL; }
    bool ok = true;
    for (int i = 0; i < c->n_layer && ok; i++) ok = (blocks[i] = gpt_block(c)) != NULL;
    cx_module *seq = NULL;
    if (ok) seq = cx_nn_sequential(blocks, c->n_layer);   /* children "0", "1", ...: h.<i> */
    else for (int i = 0; i < c->n_layer; i++) cx_module_free(blocks[i]);
    free(blocks);
    return seq;
}

static cx_module *gpt_trunk(const cx_gpt_config *c)
{
    trunk *tr = malloc(sizeof *tr);
    if (tr) tr->block_size = c->block_size;
    static const char *const names[4] = { "wte", "wpe", "h", "ln_f" };
    cx_module *kids[4] = { gpt_embedding(c->vocab_size, c->n_embd), gpt_embedding(c->block_size, c->n_embd),
                           gpt_blocks(c), cx_nn_layer_norm(c->n_embd, 1e-5, true) };
    return with_children(&trunk_type, tr, names, kids, 4, tr ? tr->kid : (int[4]){ 0 });
}

/* ---- the model --------------------------------------------------------------------------- */

typedef struct {
    cx_gpt_config cfg;
    int kid[2];   /* transformer, lm_head */
} gpt;

/* in: idx [, targets] -> out: logits [, loss] */
static int gpt_forward_many(cx_module *m, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out)
{
    const gpt *g = cx_module_impl(m);
    if (n_in < 1 || n_in > 2 || max_out < n_in) {
        cx_set_last_error("GPT: takes idx or (idx, targets) and gives as many outputs; got %d inputs, room for %d",
                          n_in, max_out);
        return -1;
    }
    cx_tensor *h = cx_module_forward(cx_module_child(m, g->kid[0]), in[0]);   // (B, T, C)
    out[0] = cx_module_forward(cx_module_child(m, g->kid[1]), h);              // (B, T, V)
    cx_drop(h);
    if (n_in == 1) return 1;
    cx_tensor *tgt = in[1];
    if (cx_ndim(tgt) != 2 || cx_ndim(in[0]) != 2 || cx_dim(tgt, 0) != cx_dim(in[0], 0) ||
        cx_dim(tgt, 1) != cx_dim(in[0], 1)) {
        out[1] = cx_poisoned("GPT: targets must have idx's shape (B, T)");
        return 2;
    }
    int64_t rows = cx_numel(tgt), flat_shape[2] = { rows, g->cfg.vocab_size };
    cx_tensor *flat = cx_reshape(out[0], flat_shape, 2);    // (B*T, V)
    cx_tensor *flat_tgt = cx_reshape(tgt, &rows, 1);        // (B*T)
    out[1] = cx_cross_entropy(flat, flat_tgt, CX_REDUCE_MEAN, -1, 0.0);
    cx_drop(flat);
    cx_drop(flat_tgt);
    return 2;
}

static cx_tensor *gpt_forward(cx_module *m, cx_tensor *idx)
{
    cx_tensor *logits = NULL;
    if (gpt_forward_many(m, &idx, 1, &logits, 1) < 0) return cx_poisoned("%s", cx_last_error());
    return logits;
}

static const cx_module_type gpt_type = { CX_STRUCT_SIZE(cx_module_type),
    .name = "GPT", .forward = gpt_forward, .free = free, .forward_many = gpt_forward_many,
};

static bool config_ok(const cx_gpt_config *c)
{
    if (c->vocab_size > 0 && c->block_size > 0 && c->n_layer > 0 && c->n_head > 0 && c->n_embd > 0 &&
        c->n_embd % c->n_head == 0)
        return true;
    cx_set_last_error("cx_nn_gpt: bad config: vocab %lld, block %lld, n_layer %d, n_head %d, n_embd %lld (each "
                      "positive, n_embd a multiple of n_head)", (long long)c->vocab_size, (long long)c->block_size,
                      c->n_layer, c->n_head, (long long)c->n_embd);
    return false;
}

cx_module *cx_nn_gpt(cx_gpt_config given)
{
    cx_gpt_config cfg;
    if (!take_config(&cfg, &given, "cx_nn_gpt") || !config_ok(&cfg)) return NULL;
    gpt *g = malloc(sizeof *g);
    if (g) g->cfg = cfg;
    static const char *const names[2] = { "transformer", "lm_head" };
    cx_module *kids[2] = { gpt_trunk(&cfg), cx_nn_linear(cfg.n_embd, cfg.vocab_size, false) };
    cx_module *m = with_children(&gpt_type, g, names, kids, 2, g ? g->kid : (int[2]){ 0 });
    if (m && cx_module_tie(m, "lm_head.weight", "transformer.wte.weight") != CX_OK) {
        cx_module_free(m);
        return NULL;
    }
    return m;
}

cx_status cx_gpt_config_of(const cx_module *m, cx_gpt_config *out)
{
    if (!out || !m || cx_module_type_name(m) != gpt_type.name) {
        cx_set_last_error("cx_gpt_config_of: %s", out ? "the module is not a GPT" : "no config to fill");
        return CX_ERR_ARG;
    }
    const cx_gpt_config *own = &((const gpt *)cx_module_impl(m))->cfg;
    char serr[256];
    if (!cx_struct_give(out, own, sizeof *own, CX_SIZE_THROUGH(cx_gpt_config, n_embd), "cx_gpt_config", serr,
                        sizeof serr)) {
        cx_set_last_error("cx_gpt_config_of: %s", serr);
        return CX_ERR_ARG;
    }
    return CX_OK;
}

/* ---- tensor parallelism ------------------------------------------------------------ */

/* Megatron's split of a block: column-parallel c_attn (q, k and v as three
 * blocks, so each rank holds whole heads of each) and c_fc, row-parallel
 * c_proj; the row-parallel outputs are partial sums the partitioner
 * finishes with one all-reduce each. */
typedef struct {
    const char *suffix;
    int nd, dim, blocks;   /* the split dimension; blocks 0: contiguous */
} tp_split;

static const tp_split k_tp_splits[] = {
    { ".attn.c_attn.weight", 2, 0, 3 }, { ".attn.c_attn.bias", 1, 0, 3 }, { ".attn.c_proj.weight", 2, 1, 0 },
    { ".mlp.c_fc.weight", 2, 0, 0 },    { ".mlp.c_fc.bias", 1, 0, 0 },    { ".mlp.c_proj.weight", 2, 1, 0 },
};

static bool has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static cx_status tp_mark(cx_named_tensor *p, const cx_mesh *mesh, const char *axis)
{
    for (size_t k = 0; k < sizeof k_tp_splits / sizeof *k_tp_splits; k++) {
        const tp_split *t = &k_tp_splits[k];
        if (!has_suffix(p->name, t->suffix)) continue;
        cx_spec_entry spec[2] = { CX_SPEC_NONE, CX_SPEC_NONE };
        spec[t->dim] = (cx_spec_entry){ 1, { 0 }, { axis }, t->blocks };
        cx_status st = cx_mark_sharding(p->tensor, mesh, spec, t->nd);
        if (st != CX_OK) cx_set_last_error("gpt tensor parallel: %s: %s", p->name, cx_last_error());
        return st;
    }
    return CX_OK;
}

cx_status cx_gpt_tensor_parallel(cx_module *m, const cx_mesh *mesh, const char *axis)
{
    cx_gpt_config cfg = cx_gpt_default_config();
    if (cx_gpt_config_of(m, &cfg) != CX_OK) {
        cx_set_last_error("gpt tensor parallel: the module is not a GPT");
        return CX_ERR_ARG;
    }
    if (!mesh) mesh = cx_get_global_mesh();
    int a = cx_mesh_axis_index(mesh, axis), shape[CX_MESH_MAX_DIMS];
    if (!mesh || a < 0) {
        cx_set_last_error("gpt tensor parallel: %s has no axis '%s'", mesh ? "the mesh" : "no mesh is given and none is global",
                          axis ? axis : "(null)");
        return CX_ERR_ARG;
    }
    cx_mesh_shape(mesh, shape);
    if (cfg.n_head % shape[a]) {
        cx_set_last_error("gpt tensor parallel: %d heads do not split over the %d devices of axis '%s'", cfg.n_head, shape[a], axis);
        return CX_ERR_ARG;
    }
    int n;
    cx_named_tensor *ps = cx_module_parameters(m, &n);
    if (!ps) { cx_set_last_error("gpt tensor parallel: out of memory"); return CX_ERR_OOM; }
    cx_status st = CX_OK;
    for (int i = 0; i < n && st == CX_OK; i++) st = tp_mark(&ps[i], mesh, axis);
    free(ps);
    return st;
}
