/* Pass 1, grouping: every node is either a kernel root (materialized into a
 * buffer) or inlined into the one kernel that consumes it. Elementwise ops
 * and views fuse into their consumer, so a chain is one loop and a chain
 * feeding a reduction is its prologue; views never copy. A cheap
 * arithmetic op that several kernels read is computed again in each of
 * them rather than stored and read back (recompute_cheap). */
#include "passes.h"

enum { GRP_NONE = -1, GRP_MULTI = -3, GRP_HEAVY = -4 };

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

/* A root that is a cheap op over buffers (roots) and constants, read by
 * several fused kernels, is inlined into each: a transformer's GELU keeps
 * x/2 and x/sqrt(2) for its backward, and AdamW reads the clipped gradient
 * in three updates; each was a pass writing a tensor and more passes
 * reading it back. Recomputing reads the op's operands once per reader
 * instead, so it is done only where that moves no more memory: with n
 * buffer operands and k readers, n*k reads against n + 1 + k. An operand
 * that is itself recomputed would make chains; only roots count. An op
 * over a matmul or convolution output stays: it is that kernel's epilogue
 * (a conv's bias and ReLU run inside the conv, and its ReLU mask is read
 * by the backward's conv).
 * Forward order: operands are decided before their readers. */
static void recompute_cheap(const cx_graph *g, const cx_uses *u, const char *force_root, char *root)
{
    for (int i = 0; i < g->n; i++) {
        const cx_gnode *n = &g->nodes[i];
        if (!root[i] || !cheap_op(n->op) || intrinsic_root(n) || u->is_output[i] || (force_root && force_root[i]))
            continue;
        int bufs = 0, k = u->count[i];
        bool ok = k >= 2 && k <= 4;
        for (int a = 0; ok && a < n->ninputs; a++) {
            int o = n->inputs[a];
            while (is_view(g->nodes[o].op) && !root[o]) o = g->nodes[o].inputs[0];
            if (is_leaf_value(g->nodes[o].op)) continue;
            ok = root[o] && !cx_is_heavy_op(&g->nodes[o]);
            bufs++;
        }
        if (ok && bufs * k <= bufs + 1 + k && !read_by_heavy(g, u, root, i, 0)) root[i] = 0;
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
