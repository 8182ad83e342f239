/* Reverse mode over the recorded IR: walk from the loss to the leaves that
 * require grad, apply each op's VJP (which records more lazy ops), and
 * accumulate into each leaf's persistent grad with cx_assign. Forward,
 * backward and the optimizer update therefore land in one graph. */
#include "autograd.h"
#include "sharding.h"
#include "cx_vec.h"


cx_tensor *cx_autograd_mark_leaf(cx_tensor *t, bool on)
{
    if (on) {
        t->flags |= TF_REQUIRES_GRAD;
        if (t->node->op == OP_DATA) {
            t->node->flags |= NF_REQUIRES_GRAD;
            t->node->grad_leaf = t;
        }
    } else {
        t->flags &= ~(uint32_t)TF_REQUIRES_GRAD;
        if (t->node->op == OP_DATA) { t->node->flags &= ~(uint32_t)NF_REQUIRES_GRAD; t->node->grad_leaf = NULL; }
    }
    return t;
}

cx_tensor *cx_grad_tap(cx_tensor *value, cx_tensor *sink)
{
    if (!value || !sink) return cx_poisoned("grad_tap: NULL argument");
    if (value->node->op == OP_ERROR) return cx_tensor_of(value->node);
    cx_node *v = value->node;
    /* the dtypes may differ (FSDP gathers bf16 into an f32 sink): accumulation casts to the sink's */
    bool same = v->ndim == sink->node->ndim && cx_dtype_is_float((cx_dtype)sink->node->dtype) &&
                cx_dtype_is_float((cx_dtype)v->dtype);
    for (int i = 0; same && i < v->ndim; i++) same = v->shape[i] == sink->node->shape[i];
    if (!same) {
        char a[160], b[160];
        return cx_poisoned("grad_tap: value %s and sink %s differ (shape or float dtype)",
                         cx_shape_str(a, sizeof a, v->shape, v->ndim),
                         cx_shape_str(b, sizeof b, sink->node->shape, sink->node->ndim));
    }
    /* value * 1 as a unique (never interned) node that owns the gradient */
    cx_no_grad_begin();
    cx_tensor *one = cx_scalar_like(value, 1.0);
    cx_tensor *ones = cx_expand(one, v->shape, v->ndim);
    cx_no_grad_end();
    cx_node *ins[2] = { v, ones->node };
    cx_node_desc d = { .op = OP_MUL, .dtype = (cx_dtype)v->dtype, .ndim = v->ndim, .shape = v->shape, .ninputs = 2,
                       .inputs = ins, .flags = NF_PINNED | (cx_grad_enabled() ? NF_REQUIRES_GRAD : 0) };
    cx_node *n = cx_node_make(&d);
    cx_drop(one);
    cx_drop(ones);
    if (!n) return cx_poisoned("grad_tap: out of memory");
    n->grad_leaf = cx_grad_enabled() ? sink : NULL;
    return cx_tensor_wrap(n);
}

bool cx_get_requires_grad(const cx_tensor *t) { return t && (t->flags & TF_REQUIRES_GRAD); }
cx_tensor *cx_grad(cx_tensor *t) { return t && !(t->flags & TF_RELEASED) ? t->grad : NULL; }

void cx_zero_grad(cx_tensor *t)
{
    if (!t || !t->grad || cx_tensor_released(t, "zero_grad")) return;
    cx_tensor *g = t->grad;
    t->grad = NULL;
    cx_free(g);
}

void cx_set_grad(cx_tensor *t, cx_tensor *g)
{
    if (!t || cx_tensor_released(t, "set_grad")) return;
    cx_zero_grad(t);
    if (g) t->grad = cx_persist(cx_alias(g));
}

/* ---- rematerialization ----------------------------------------------------------- */

/* Backward reads forward values of remat-region nodes through fresh clones
 * (tagged so interning never merges them with the originals), so the
 * forward activations can die after their forward use. */
typedef struct { cx_node *from, *to; } remat_pair;
typedef struct { remat_pair *v; int n, cap; uint64_t tag; } remat_map;

static cx_node *remat_lookup(const remat_map *m, const cx_node *x)
{
    for (int i = 0; i < m->n; i++) if (m->v[i].from == x) return m->v[i].to;
    return NULL;
}

static bool cheap_view(const cx_node *x)
{
    return x->ninputs == 1 && (cx_op_table[x->op].group == G_MOVEMENT || x->op == OP_CAST);
}

static cx_node *remat_clone(remat_map *m, cx_node *x)
{
    if (x->remat_tag == m->tag) return x;
    if (!(x->flags & NF_REMAT)) {
        /* views and casts of a rematerialized value (a transpose of an FSDP
         * parameter view, say) follow it; anything heavier is kept */
        if (!cheap_view(x)) return x;
        cx_node *known = remat_lookup(m, x);
        if (known) return known;
        cx_node *in = remat_clone(m, x->inputs[0]);
        if (in == x->inputs[0]) return x;
    }
    cx_node *known = remat_lookup(m, x);
    if (known) return known;
    cx_node *ins_small[8];
    cx_node **ins = x->ninputs <= 8 ? ins_small : malloc(sizeof *ins * (size_t)x->ninputs);
    if (!ins) return x;
    for (int i = 0; i < x->ninputs; i++) ins[i] = remat_clone(m, x->inputs[i]);
    cx_node_desc d = { .op = (cx_op)x->op, .dtype = (cx_dtype)x->dtype, .ndim = x->ndim, .shape = x->shape,
                       .ninputs = x->ninputs, .inputs = ins, .nattrs = x->nattrs, .attrs = x->attrs,
                       .fval = x->fval, .flags = x->flags & ~(uint32_t)(NF_INTERNED | NF_REMAT) };
    /* the clone is interned under the backward's tag */
    cx_record_ctx *rec = cx_record(), saved = *rec;
    rec->remat_region = m->tag;
    rec->remat_depth = 1;
    cx_node *c = cx_node_make(&d);
    *rec = saved;
    if (ins != ins_small) free(ins);
    if (!c) return x;
    if (!CX_GROW(m->v, m->cap, m->n + 1)) { cx_node_unref(c); return x; }
    m->v[m->n++] = (remat_pair){ x, c };
    return c;
}

/* ---- backward ------------------------------------------------------------------------- */

static void accumulate_leaf(cx_tensor *leaf, cx_tensor *g)
{
    cx_tensor *gc = cx_dtype_of(g) == cx_dtype_of(leaf) ? cx_alias(g) : cx_cast(g, cx_dtype_of(leaf));
    if (leaf->node->sharding) cx_spmd_annotate(gc, leaf->node->sharding);   /* sharded like its parameter */
    cx_no_grad_begin();
    if (!leaf->grad) {
        leaf->grad = cx_persist(cx_alias(gc));
    } else {
        cx_tensor *s = cx_add(leaf->grad, gc);
        cx_assign(leaf->grad, s);
        cx_drop(s);
    }
    cx_no_grad_end();
    cx_drop(gc);
}

static cx_status check_loss(const cx_node *root)
{
    if (root->op == OP_ERROR) { cx_set_last_error("backward: loss is poisoned: %s", root->err); return CX_ERR_SHAPE; }
    if (root->numel != 1) {
        char b[160];
        cx_set_last_error("backward: loss of shape %s is not a scalar", cx_shape_str(b, sizeof b, root->shape, root->ndim));
        return CX_ERR_SHAPE;
    }
    if (!cx_dtype_is_float((cx_dtype)root->dtype)) {
        cx_set_last_error("backward: loss dtype %s is not float", cx_dtype_name((cx_dtype)root->dtype));
        return CX_ERR_ARG;
    }
    if (!(root->flags & NF_REQUIRES_GRAD)) {
        cx_set_last_error("backward: loss does not depend on any tensor that requires grad");
        return CX_ERR_ARG;
    }
    return CX_OK;
}

/* the grad-carrying subgraph: inputs that carry a gradient */
static bool grad_follow(const cx_node *x, const cx_node *input)
{
    (void)x;
    return (input->flags & NF_REQUIRES_GRAD) != 0;
}

typedef struct { cx_node **order; int n, cap; } node_list;

static bool grad_visit(void *ctx, cx_node *x)
{
    node_list *l = ctx;
    if (!CX_GROW(l->order, l->cap, l->n + 1)) return false;
    l->order[l->n++] = x;
    return true;
}

typedef struct {
    cx_node **order;          /* the grad-carrying subgraph, topological */
    int n;
    cx_tensor **grads;        /* gradient per node of order (node->index) */
    remat_map rm;
} backward_walk;

static bool in_walk(const backward_walk *w, const cx_node *c)
{
    return c->index >= 0 && c->index < w->n && w->order[c->index] == c;
}

/* Applies x's VJP rule to its gradient g and adds what flows to each input
 * of the subgraph into its gradient. @return CX_OK, or the first bad
 * rule's error. */
static cx_status propagate(backward_walk *w, cx_node *x, cx_tensor *g)
{
    const cx_op_info *info = &cx_op_table[x->op];
    cx_vjp_fn vjp = cx_vjp_table[x->op];
    if (!vjp) return CX_OK;
    cx_tensor *ins_small[8];
    cx_tensor **ins = x->ninputs <= 8 ? ins_small : malloc(sizeof *ins * (size_t)x->ninputs);
    if (!ins) { cx_set_last_error("backward: out of memory"); return CX_ERR_OOM; }
    cx_status st = CX_OK;
    for (int k = 0; k < x->ninputs; k++) ins[k] = cx_tensor_of(remat_clone(&w->rm, x->inputs[k]));
    cx_tensor *out = cx_tensor_of(remat_clone(&w->rm, x));
    for (int k = 0; k < x->ninputs; k++) {
        cx_node *c = x->inputs[k];
        if (!(c->flags & NF_REQUIRES_GRAD) || !in_walk(w, c)) continue;
        cx_tensor *gk = vjp(x, ins, out, g, k);
        if (!gk) continue;
        if (gk->node->op == OP_ERROR) {
            cx_set_last_error("backward: %s: %s", info->name, gk->node->err);
            st = CX_ERR_SHAPE;
            cx_drop(gk);
            continue;
        }
        cx_tensor **gj = &w->grads[c->index];
        if (!*gj) { *gj = gk; continue; }
        cx_tensor *sum = cx_add(*gj, gk);
        cx_drop(*gj);
        cx_drop(gk);
        *gj = sum;
    }
    for (int k = 0; k < x->ninputs; k++) cx_drop(ins[k]);
    if (ins != ins_small) free(ins);
    cx_drop(out);
    return st;
}

cx_status cx_backward(cx_tensor *loss)
{
    if (!loss) { cx_set_last_error("backward: loss is NULL"); return CX_ERR_ARG; }
    cx_node *root = loss->node;
    cx_status st = check_loss(root);
    if (st != CX_OK) return st;
    node_list l = { 0 };
    backward_walk w = { 0 };
    if (!cx_node_postorder(&root, 1, grad_follow, grad_visit, &l) || !(w.grads = calloc((size_t)l.n, sizeof *w.grads))) {
        free(l.order);
        cx_set_last_error("backward: out of memory");
        return CX_ERR_OOM;
    }
    w.order = l.order;
    w.n = l.n;
    /* clones of this backward never intern with another region's */
    w.rm.tag = ~0ull - (uint64_t)cx_mark_epoch();
    for (int i = 0; i < w.n; i++) { w.order[i]->index = i; cx_node_ref(w.order[i]); }
    cx_no_grad_begin(); /* the backward graph itself carries no gradient */
    /* gradients take their forward's dtypes, as torch's backward runs outside autocast */
    int autocast = cx_record()->autocast_depth;
    cx_record()->autocast_depth = 0;
    w.grads[w.n - 1] = cx_ones(root->shape, root->ndim, (cx_dtype)root->dtype);
    for (int i = w.n - 1; i >= 0 && st != CX_ERR_OOM; i--) {
        cx_node *x = w.order[i];
        cx_tensor *g = w.grads[i];
        w.grads[i] = NULL;
        if (!g) continue;
        /* a leaf, or a gradient tap: the gradient stops here */
        if (x->grad_leaf) accumulate_leaf(x->grad_leaf, g);
        else if (x->op != OP_DATA) {
            cx_status s = propagate(&w, x, g);
            if (s != CX_OK && st == CX_OK) st = s;
        }
        cx_drop(g);
    }
    cx_no_grad_end();
    cx_record()->autocast_depth = autocast;
    for (int i = 0; i < w.n; i++) if (w.grads[i]) cx_drop(w.grads[i]);
    for (int i = 0; i < w.rm.n; i++) cx_node_unref(w.rm.v[i].to);
    free(w.rm.v);
    for (int i = 0; i < w.n; i++) cx_node_unref(w.order[i]);
    free(w.grads);
    free(w.order);
    return st;
}
