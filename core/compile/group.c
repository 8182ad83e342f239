/* Pass 1, grouping: every node is either a kernel root (materialized into a
 * buffer) or inlined into the one kernel that consumes it. Elementwise ops
 * and views fuse into their consumer, so a chain is one loop and a chain
 * feeding a reduction is its prologue; views never copy. A cheap
 * arithmetic op that several kernels read is computed again in each of
 * them rather than stored and read back (recompute_cheap). */
#include "passes.h"

enum { GRP_NONE = -1, GRP_MULTI = -3, GRP_HEAVY = -4 };

/* the most ops a recomputed expression may hold */
#define RECOMPUTE_MAX_OPS 8

static bool is_view(int op)
{
    return op == OP_RESHAPE || op == OP_PERMUTE || op == OP_EXPAND || op == OP_SLICE || op == OP_PAD;
}

static bool is_leaf_value(int op) { return op == OP_CONST || op == OP_RTSCALAR || op == OP_IOTA || op == OP_RNG; }

static bool pad_interior(const cx_gnode *n)
{
    if (n->op != OP_PAD) return false;
    for (int i = 0; i < n->ndim; i++) if (CX_ATTR(n, CX_AT_PAD_INTERIOR(n->ndim, i))) return true;
    return false;
}

bool cx_is_heavy_op(const cx_gnode *n)
{
    cx_op_group g = cx_op_table[n->op].group;
    return g == G_CONTRACT || g == G_COLLECTIVE || n->op == OP_CONCAT || pad_interior(n);
}

static bool intrinsic_root(const cx_gnode *n)
{
    return n->op == OP_DATA || cx_op_table[n->op].group == G_REDUCE || cx_is_heavy_op(n);
}

/* The kernel a node joins through its consumers: one group, GRP_MULTI when
 * they disagree, GRP_HEAVY when one is a heavy op (which reads buffers). */
static int consumer_group(const cx_graph *g, const cx_uses *u, const int *group, int i)
{
    int grp = GRP_NONE;
    for (int k = 0; k < u->count[i]; k++) {
        int cn = u->list[i][k];
        const cx_gnode *c = &g->nodes[cn];
        int cg = cx_is_heavy_op(c) ? GRP_HEAVY : cx_op_table[c->op].group == G_REDUCE ? cn : group[cn];
        if (grp == GRP_NONE) grp = cg;
        else if (grp != cg) grp = GRP_MULTI;
    }
    return grp;
}

/* Whether a reader of node i, directly or through views inlined into it, is
 * a heavy op, which reads a buffer and so needs i materialized. */
static bool read_by_heavy(const cx_graph *g, const cx_uses *u, const char *root, int i, int depth)
{
    for (int k = 0; k < u->count[i]; k++) {
        int c = u->list[i][k];
        if (cx_is_heavy_op(&g->nodes[c])) return true;
        if (is_view(g->nodes[c].op) && !root[c] && (depth > 8 || read_by_heavy(g, u, root, c, depth + 1))) return true;
    }
    return false;
}

static bool cheap_op(int op)
{
    return op == OP_ADD || op == OP_SUB || op == OP_MUL || op == OP_DIV || op == OP_NEG || op == OP_MAX || op == OP_MIN;
}

/* Ops a reader may compute again: the cheap ones, and the unary ones the
 * executor runs in vector lanes (exp, log and erf through vmath.h, sqrt).
 * tanh and pow stay one libm call per element: computed once. */
static bool recompute_op(int op)
{
    return cheap_op(op) || op == OP_EXP || op == OP_LOG || op == OP_ERF || op == OP_ABS || op == OP_SQRT ||
           op == OP_RSQRT || op == OP_GELU || op == OP_GELU_GRAD;
}

/* A root's expression, down to the roots and leaf values it reads */
typedef struct {
    int ops;
    int nbufs;
    int bufs[RECOMPUTE_MAX_OPS + 1];
} rc_tree;

/* Walks what node x computes (x == top: the root itself; otherwise a node
 * inlined into it) and collects the distinct roots it reads.
 * @return false when it holds an op not worth computing again, more than
 * RECOMPUTE_MAX_OPS ops, or reads a heavy op's own output. */
static bool recompute_tree(const cx_graph *g, const char *root, int x, int top, rc_tree *t)
{
    const cx_gnode *n = &g->nodes[x];
    if (x != top && root[x]) {
        if (cx_is_heavy_op(n)) return false;
        for (int b = 0; b < t->nbufs; b++) if (t->bufs[b] == x) return true;
        if (t->nbufs > RECOMPUTE_MAX_OPS) return false;
        t->bufs[t->nbufs++] = x;
        return true;
    }
    if (is_leaf_value(n->op)) return true;
    if (is_view(n->op)) return x != top && recompute_tree(g, root, n->inputs[0], top, t);
    if (!recompute_op(n->op) || ++t->ops > RECOMPUTE_MAX_OPS) return false;
    for (int a = 0; a < n->ninputs; a++)
        if (!recompute_tree(g, root, n->inputs[a], top, t)) return false;
    return true;
}

/* A root that is a short elementwise expression over buffers (roots) and
 * constants, read by several fused kernels, is inlined into each: a
 * transformer's GELU keeps x/2, x/sqrt(2) and 1 + erf(x/sqrt(2)) for its
 * backward, and AdamW reads the clipped gradient in three updates; each was
 * a pass writing a tensor and more passes reading it back. Recomputing reads
 * the expression's buffers once per reader instead, so it is done only where
 * that moves no more memory: with n buffers and k readers, n*k reads against
 * n + 1 + k. Forward order: a recomputed root's readers are decided after
 * it, and see its expression (through the roots it reads) as their own. An
 * expression over a matmul or convolution output stays: it is that
 * kernel's epilogue (a conv's bias and ReLU run inside the conv, and its
 * ReLU mask is read by the backward's conv). */
static void recompute_cheap(const cx_graph *g, const cx_uses *u, const char *force_root, char *root)
{
    for (int i = 0; i < g->n; i++) {
        const cx_gnode *n = &g->nodes[i];
        int k = u->count[i];
        if (!root[i] || !recompute_op(n->op) || intrinsic_root(n) || u->is_output[i] || (force_root && force_root[i]) ||
            k < 2 || k > 4)
            continue;
        rc_tree t = { 0 };
        if (recompute_tree(g, root, i, i, &t) && t.nbufs * k <= t.nbufs + 1 + k && !read_by_heavy(g, u, root, i, 0))
            root[i] = 0;
    }
}

bool cx_pass_group(const cx_graph *g, const cx_uses *u, const char *force_root, char *root)
{
    int *group = malloc(sizeof(int) * (size_t)(g->n + 1));
    if (!group) return false;
    /* consumers come later in topological order: walk backwards */
    for (int i = g->n - 1; i >= 0; i--) {
        const cx_gnode *n = &g->nodes[i];
        root[i] = 0;
        group[i] = GRP_NONE;
        if (intrinsic_root(n) || u->is_output[i] || (force_root && force_root[i])) {
            root[i] = 1;
            group[i] = i;
            continue;
        }
        if (is_leaf_value(n->op)) continue; /* inlined wherever used */
        int grp = consumer_group(g, u, group, i);
        if (is_view(n->op)) {
            group[i] = grp; /* views duplicate freely: never a root by themselves */
            continue;
        }
        if (grp >= 0) group[i] = grp;
        else { root[i] = 1; group[i] = i; }
    }
    free(group);
    recompute_cheap(g, u, force_root, root);
    return true;
}
