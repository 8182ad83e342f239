/* Lowering: captured graph -> executable.
 *
 * 1. Grouping: every node is either a kernel root (materialized into a
 *    buffer) or inlined into the one kernel that consumes it. Elementwise
 *    ops and views fuse into their consumer (a chain is one loop; a chain
 *    feeding a reduction is its prologue); views never copy.
 * 2. Programs: a fused kernel is a small SSA program evaluated block-wise;
 *    views are pushed down to the loads as affine index maps.
 * 3. Epilogues: an elementwise kernel that only post-processes a matmul or
 *    conv output runs in place right after it (bias, activation).
 * 4. Memory plan: intermediates get offsets in one arena by lifetime.
 * A view that cannot be expressed affinely makes its input a root, and the
 * lowering restarts (rare).
 */
#define _GNU_SOURCE
#include "exec.h"

#include <limits.h>

/* multi-index map: node dim k = off[k] + sum_d A[k][d] * it_d */
typedef struct {
    int nd;
    int64_t off[CX_MAX_DIMS];
    int64_t A[CX_MAX_DIMS][CX_MAX_DIMS];
    bool masked;
    int64_t lo[CX_MAX_DIMS], hi[CX_MAX_DIMS];
} mview;

typedef struct {
    int node;
    mview mv;
    int reg;
} memo_entry;

enum { GRP_NONE = -1, GRP_MULTI = -3, GRP_HEAVY = -4 };

typedef struct {
    const cx_graph *g;
    int *nconsumers;
    int **consumers;
    char *is_output;
    char *force_root;
    char *root;
    int *group;
    int *slot_of;
    int fail_node;
    /* program being generated */
    cx_program *prog;
    int it_nd;
    int64_t it_shape[CX_MAX_DIMS];
    memo_entry *memo;
    int nmemo, memo_cap;
    /* output */
    cx_executable *e;
    int kcap, scap;
} lctx;

static void contiguous_strides(const int64_t *shape, int nd, int64_t *s)
{
    int64_t acc = 1;
    for (int i = nd - 1; i >= 0; i--) { s[i] = acc; acc *= shape[i]; }
}

/* A view that reads its buffer in the iteration's own element order. */
static bool identity_view(const cx_view *v, const int64_t *shape, int nd)
{
    int64_t S[CX_MAX_DIMS];
    contiguous_strides(shape, nd, S);
    if (v->offset != 0 || v->masked) return false;
    for (int d = 0; d < nd; d++) if (shape[d] > 1 && v->strides[d] != S[d]) return false;
    return true;
}

static bool is_elementwise(int op)
{
    cx_op_group g = cx_op_table[op].group;
    return g == G_UNARY || g == G_BINARY || g == G_TERNARY;
}

static bool is_view(int op) { return op == OP_RESHAPE || op == OP_PERMUTE || op == OP_EXPAND || op == OP_SLICE || op == OP_PAD; }

static bool pad_interior(const cx_gnode *n)
{
    if (n->op != OP_PAD) return false;
    for (int i = 0; i < n->ndim; i++) if (n->attrs[2 * n->ndim + i]) return true;
    return false;
}

static bool intrinsic_root(const cx_gnode *n)
{
    if (n->op == OP_DATA) return true;
    cx_op_group g = cx_op_table[n->op].group;
    return g == G_REDUCE || g == G_CONTRACT || g == G_COLLECTIVE || n->op == OP_CONCAT || pad_interior(n);
}

static bool is_leaf_value(int op) { return op == OP_CONST || op == OP_RTSCALAR || op == OP_IOTA || op == OP_RNG; }

/* ---- grouping ------------------------------------------------------------------- */

static void compute_groups(lctx *c)
{
    const cx_graph *g = c->g;
    for (int i = g->n - 1; i >= 0; i--) {
        const cx_gnode *n = &g->nodes[i];
        c->root[i] = 0;
        c->group[i] = GRP_NONE;
        if (intrinsic_root(n) || c->is_output[i] || c->force_root[i]) {
            c->root[i] = 1;
            c->group[i] = i;
            continue;
        }
        if (is_leaf_value(n->op)) continue; /* inlined wherever used */
        int grp = GRP_NONE;
        for (int k = 0; k < c->nconsumers[i]; k++) {
            int cn = c->consumers[i][k];
            const cx_gnode *cnode = &g->nodes[cn];
            int cg;
            if (cx_op_table[cnode->op].group == G_CONTRACT || cx_op_table[cnode->op].group == G_COLLECTIVE ||
                cnode->op == OP_CONCAT || pad_interior(cnode))
                cg = GRP_HEAVY;
            else if (cx_op_table[cnode->op].group == G_REDUCE)
                cg = cn;
            else
                cg = c->group[cn];
            if (grp == GRP_NONE) grp = cg;
            else if (grp != cg) grp = GRP_MULTI;
        }
        if (is_view(n->op)) {
            c->group[i] = grp; /* views duplicate freely: never a root by themselves */
            continue;
        }
        if (grp >= 0) c->group[i] = grp;
        else { c->root[i] = 1; c->group[i] = i; }
    }
}

/* ---- programs ------------------------------------------------------------------- */

static int prog_push(cx_program *p, cx_pinstr in)
{
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 16;
        cx_pinstr *ni = realloc(p->ins, sizeof *ni * (size_t)cap);
        if (!ni) return -1;
        p->ins = ni;
        p->cap = cap;
    }
    p->ins[p->n] = in;
    return p->n++;
}

static int prog_view(cx_program *p, const cx_view *v)
{
    for (int i = 0; i < p->nviews; i++) if (!memcmp(&p->views[i], v, sizeof *v)) return i;
    if (p->nviews == p->vcap) {
        int cap = p->vcap ? p->vcap * 2 : 8;
        cx_view *nv = realloc(p->views, sizeof *nv * (size_t)cap);
        if (!nv) return -1;
        p->views = nv;
        p->vcap = cap;
    }
    p->views[p->nviews] = *v;
    return p->nviews++;
}

static void mview_identity(mview *m, int nd)
{
    memset(m, 0, sizeof *m);
    m->nd = nd;
    for (int k = 0; k < nd; k++) m->A[k][k] = 1;
}

/* address view of node-shaped multi-index map over a contiguous layout */
static void mview_to_view(const lctx *c, const mview *m, const int64_t *shape, cx_view *v)
{
    int64_t S[CX_MAX_DIMS];
    contiguous_strides(shape, m->nd, S);
    memset(v, 0, sizeof *v);
    for (int k = 0; k < m->nd; k++) {
        v->offset += m->off[k] * S[k];
        for (int d = 0; d < c->it_nd; d++) v->strides[d] += m->A[k][d] * S[k];
    }
    v->masked = m->masked;
    if (m->masked) {
        memcpy(v->lo, m->lo, sizeof v->lo);
        memcpy(v->hi, m->hi, sizeof v->hi);
    }
}

static int gen(lctx *c, int i, const mview *m);

static int emit_load(lctx *c, int i, const mview *m)
{
    const cx_gnode *n = &c->g->nodes[i];
    cx_view v;
    mview_to_view(c, m, n->shape, &v);
    int vi = prog_view(c->prog, &v);
    if (vi < 0) return -1;
    cx_pinstr in = { .kind = P_LOAD, .dtype = n->dtype, .src_dtype = n->dtype, .slot = c->slot_of[i], .view = vi };
    return prog_push(c->prog, in);
}

/* reshape: the node's multi-index -> linear offset -> input multi-index,
 * affine only when no digit carries across input dims. */
static bool unravel(const lctx *c, const mview *m, const int64_t *out_shape, const int64_t *in_shape, int in_nd, mview *r)
{
    int64_t S[CX_MAX_DIMS], Sx[CX_MAX_DIMS];
    contiguous_strides(out_shape, m->nd, S);
    contiguous_strides(in_shape, in_nd, Sx);
    int64_t l0 = 0, l[CX_MAX_DIMS] = { 0 };
    for (int k = 0; k < m->nd; k++) {
        l0 += m->off[k] * S[k];
        for (int d = 0; d < c->it_nd; d++) l[d] += m->A[k][d] * S[k];
    }
    if (l0 < 0) return false;
    memset(r, 0, sizeof *r);
    r->nd = in_nd;
    r->masked = m->masked;
    memcpy(r->lo, m->lo, sizeof r->lo);
    memcpy(r->hi, m->hi, sizeof r->hi);
    int64_t maxv[CX_MAX_DIMS];
    for (int k = 0; k < in_nd; k++) {
        r->off[k] = in_shape[k] ? (l0 / Sx[k]) % in_shape[k] : 0;
        maxv[k] = r->off[k];
    }
    for (int d = 0; d < c->it_nd; d++) {
        if (l[d] == 0 || c->it_shape[d] <= 1) continue;
        if (l[d] < 0) return false;
        int k = -1;
        for (int kk = 0; kk < in_nd; kk++)
            if (in_shape[kk] > 1 && l[d] % Sx[kk] == 0 && l[d] / Sx[kk] < in_shape[kk]) { k = kk; break; }
        if (k < 0) return false;
        int64_t coef = l[d] / Sx[k];
        r->A[k][d] = coef;
        maxv[k] += coef * (c->it_shape[d] - 1);
    }
    for (int k = 0; k < in_nd; k++) if (maxv[k] >= in_shape[k] && in_shape[k] > 0) return false;
    return true;
}

static int memo_find(lctx *c, int i, const mview *m)
{
    for (int k = 0; k < c->nmemo; k++)
        if (c->memo[k].node == i && !memcmp(&c->memo[k].mv, m, sizeof *m)) return c->memo[k].reg;
    return -1;
}

static void memo_add(lctx *c, int i, const mview *m, int reg)
{
    if (c->nmemo == c->memo_cap) {
        int cap = c->memo_cap ? c->memo_cap * 2 : 32;
        memo_entry *nm = realloc(c->memo, sizeof *nm * (size_t)cap);
        if (!nm) return;
        c->memo = nm;
        c->memo_cap = cap;
    }
    c->memo[c->nmemo++] = (memo_entry){ i, *m, reg };
}

static int gen_uncached(lctx *c, int i, const mview *m)
{
    const cx_gnode *n = &c->g->nodes[i];
    cx_program *p = c->prog;
    if (c->root[i]) return emit_load(c, i, m);
    switch (n->op) {
    case OP_CONST: {
        cx_pinstr in = { .kind = P_CONST, .dtype = n->dtype, .f = n->fval, .i = (int64_t)n->fval };
        return prog_push(p, in);
    }
    case OP_RTSCALAR: {
        cx_pinstr in = { .kind = P_RT, .dtype = n->dtype, .slot = n->input_ordinal };
        return prog_push(p, in);
    }
    case OP_IOTA:
    case OP_RNG: {
        cx_view v;
        mview_to_view(c, m, n->shape, &v);
        int vi = prog_view(p, &v);
        if (vi < 0) return -1;
        cx_pinstr in = { .kind = n->op == OP_IOTA ? P_IOTA : P_RNG, .dtype = n->dtype, .view = vi };
        if (n->op == OP_RNG) {
            in.slot = c->g->nodes[n->inputs[0]].input_ordinal;
            in.a = c->g->nodes[n->inputs[1]].input_ordinal;
            in.i = n->attrs[0];
        }
        return prog_push(p, in);
    }
    case OP_CAST: {
        int a = gen(c, n->inputs[0], m);
        if (a < 0) return -1;
        cx_pinstr in = { .kind = P_CAST, .dtype = n->dtype, .a = a };
        return prog_push(p, in);
    }
    case OP_RESHAPE: {
        int x = n->inputs[0];
        const cx_gnode *xn = &c->g->nodes[x];
        if (c->root[x]) {
            /* a buffer is linear: reshape is only a new way to count */
            cx_view v;
            mview_to_view(c, m, n->shape, &v);
            int vi = prog_view(p, &v);
            if (vi < 0) return -1;
            cx_pinstr in = { .kind = P_LOAD, .dtype = xn->dtype, .src_dtype = xn->dtype, .slot = c->slot_of[x], .view = vi };
            return prog_push(p, in);
        }
        mview r;
        if (!unravel(c, m, n->shape, xn->shape, xn->ndim, &r)) { c->fail_node = x; return -1; }
        return gen(c, x, &r);
    }
    case OP_PERMUTE: {
        mview r = *m;
        r.nd = n->ndim;
        for (int k = 0; k < n->ndim; k++) {
            int src = (int)n->attrs[k];
            r.off[src] = m->off[k];
            memcpy(r.A[src], m->A[k], sizeof r.A[src]);
        }
        return gen(c, n->inputs[0], &r);
    }
    case OP_EXPAND: {
        const cx_gnode *xn = &c->g->nodes[n->inputs[0]];
        mview r = *m;
        for (int k = 0; k < n->ndim; k++)
            if (xn->shape[k] == 1 && n->shape[k] != 1) { r.off[k] = 0; memset(r.A[k], 0, sizeof r.A[k]); }
        return gen(c, n->inputs[0], &r);
    }
    case OP_SLICE: {
        int ax = (int)n->attrs[0];
        int64_t start = n->attrs[1], step = n->attrs[2];
        mview r = *m;
        r.off[ax] = start + step * m->off[ax];
        for (int d = 0; d < c->it_nd; d++) r.A[ax][d] = step * m->A[ax][d];
        return gen(c, n->inputs[0], &r);
    }
    case OP_PAD: {
        const cx_gnode *xn = &c->g->nodes[n->inputs[0]];
        int nd = n->ndim;
        mview r = *m;
        mview own = { 0 };
        own.masked = true;
        for (int d = 0; d < c->it_nd; d++) { own.lo[d] = 0; own.hi[d] = c->it_shape[d]; }
        bool any = false;
        for (int k = 0; k < nd; k++) {
            int64_t lo = n->attrs[k], hi = n->attrs[nd + k];
            if (!lo && !hi) continue;
            any = true;
            r.off[k] = m->off[k] - lo;
            /* valid: 0 <= r.off[k] + sum A[k][d] it_d < xn->shape[k] */
            int dd = -1, nnz = 0;
            for (int d = 0; d < c->it_nd; d++) if (m->A[k][d]) { dd = d; nnz++; }
            if (nnz > 1) { c->fail_node = i; return -1; }
            int64_t lo_it, hi_it;
            if (nnz == 0) {
                bool inside = r.off[k] >= 0 && r.off[k] < xn->shape[k];
                lo_it = 0; hi_it = inside ? INT64_MAX : 0;
                dd = 0;
            } else {
                int64_t a = m->A[k][dd];
                if (a <= 0) { c->fail_node = i; return -1; }
                /* it >= ceil(-off / a), it < ceil((n - off) / a) */
                int64_t o = r.off[k], nx = xn->shape[k];
                lo_it = o >= 0 ? 0 : (-o + a - 1) / a;
                hi_it = nx - o <= 0 ? 0 : (nx - o + a - 1) / a;
            }
            if (c->it_nd == 0) { if (hi_it <= lo_it) { own.hi[0] = 0; } continue; }
            if (lo_it > own.lo[dd]) own.lo[dd] = lo_it;
            if (hi_it < own.hi[dd]) own.hi[dd] = hi_it;
        }
        if (!any) return gen(c, n->inputs[0], &r);
        for (int d = 0; d < c->it_nd; d++) {
            if (own.hi[d] < own.lo[d]) own.hi[d] = own.lo[d];
        }
        /* the input sees the intersection of every enclosing mask */
        if (r.masked) {
            for (int d = 0; d < c->it_nd; d++) {
                if (own.lo[d] > r.lo[d]) r.lo[d] = own.lo[d];
                if (own.hi[d] < r.hi[d]) r.hi[d] = own.hi[d];
            }
        } else {
            r.masked = true;
            memcpy(r.lo, own.lo, sizeof r.lo);
            memcpy(r.hi, own.hi, sizeof r.hi);
        }
        int a = gen(c, n->inputs[0], &r);
        if (a < 0) return -1;
        cx_view v = { 0 };
        v.masked = true;
        memcpy(v.lo, own.lo, sizeof v.lo);
        memcpy(v.hi, own.hi, sizeof v.hi);
        int vi = prog_view(p, &v);
        if (vi < 0) return -1;
        cx_pinstr in = { .kind = P_MASK, .dtype = n->dtype, .a = a, .view = vi, .f = n->fval };
        return prog_push(p, in);
    }
    default:
        break;
    }
    if (is_elementwise(n->op)) {
        int regs[3] = { 0, 0, 0 };
        for (int k = 0; k < n->ninputs && k < 3; k++) {
            regs[k] = gen(c, n->inputs[k], m);
            if (regs[k] < 0) return -1;
        }
        cx_pinstr in = { .dtype = n->dtype, .op = (uint8_t)n->op, .a = regs[0] };
        if (n->ninputs > 1) in.src_dtype = c->g->nodes[n->inputs[0]].dtype;
        if (n->op == OP_WHERE) { in.kind = P_WHERE; in.b = regs[1]; in.c = regs[2]; }
        else if (n->ninputs == 2) { in.kind = P_BIN; in.b = regs[1]; }
        else in.kind = P_UN;
        return prog_push(p, in);
    }
    /* anything else must have been a root */
    c->fail_node = i;
    return -1;
}

static int gen(lctx *c, int i, const mview *m)
{
    int r = memo_find(c, i, m);
    if (r >= 0) return r;
    r = gen_uncached(c, i, m);
    if (r >= 0) memo_add(c, i, m, r);
    return r;
}

/* ---- peephole -------------------------------------------------------------------- */

static bool zero_const(const cx_pinstr *in)
{
    return in->kind == P_CONST && in->f == 0.0 && (in->dtype == CX_F32 || in->dtype == CX_BF16);
}

void cx_prog_peephole(cx_program *p)
{
    for (int i = 0; i < p->n; i++) {
        cx_pinstr *w = &p->ins[i];
        if (w->kind != P_WHERE || (w->dtype != CX_F32 && w->dtype != CX_BF16)) continue;
        const cx_pinstr *c = &p->ins[w->a];
        if (c->kind != P_BIN || c->op != OP_LT || !zero_const(&p->ins[c->a]) || !zero_const(&p->ins[w->c])) continue;
        int x = c->b;
        if (p->ins[x].dtype != w->dtype) continue;
        cx_pinstr r = { .kind = w->b == x ? P_RELU : P_POSMASK, .dtype = w->dtype, .a = x, .b = w->b };
        *w = r;
    }
    /* dead-code elimination, then compact the registers */
    char *live = calloc((size_t)p->n + 1, 1);
    int *map = malloc(sizeof(int) * (size_t)(p->n + 1));
    if (!live || !map) { free(live); free(map); return; }   /* the unoptimized program is still correct */
    live[p->result] = 1;
    for (int i = p->n - 1; i >= 0; i--) {
        if (!live[i]) continue;
        const cx_pinstr *in = &p->ins[i];
        switch ((cx_pkind)in->kind) {
        case P_UN: case P_CAST: case P_MASK: case P_RELU: live[in->a] = 1; break;
        case P_BIN: case P_POSMASK: live[in->a] = 1; live[in->b] = 1; break;
        case P_WHERE: live[in->a] = 1; live[in->b] = 1; live[in->c] = 1; break;
        default: break;
        }
    }
    int k = 0;
    for (int i = 0; i < p->n; i++) {
        if (!live[i]) continue;
        cx_pinstr in = p->ins[i];
        switch ((cx_pkind)in.kind) {
        case P_UN: case P_CAST: case P_MASK: case P_RELU: in.a = map[in.a]; break;
        case P_BIN: case P_POSMASK: in.a = map[in.a]; in.b = map[in.b]; break;
        case P_WHERE: in.a = map[in.a]; in.b = map[in.b]; in.c = map[in.c]; break;
        default: break;
        }
        map[i] = k;
        p->ins[k++] = in;
    }
    p->result = map[p->result];
    p->n = k;
    free(live);
    free(map);
}

/* ---- coalescing ----------------------------------------------------------------- */

static bool view_full(const cx_view *v, int d, const int64_t *shape)
{
    return !v->masked || (v->lo[d] <= 0 && v->hi[d] >= shape[d]);
}

/* Drops size-1 iteration dims and merges adjacent dims where every view
 * is linear across them; dims before *split never merge with dims after it
 * (reduce: kept | reduced). @return the new rank; *split is updated. */
static int coalesce(cx_program *p, int64_t *shape, int nd, int *split)
{
    for (int d = nd - 1; d >= 0; d--) {
        if (shape[d] != 1) continue;
        bool full = true;
        for (int v = 0; v < p->nviews; v++) if (!view_full(&p->views[v], d, shape)) full = false;
        if (!full) continue;
        for (int v = 0; v < p->nviews; v++) {
            cx_view *w = &p->views[v];
            for (int e = d; e < nd - 1; e++) { w->strides[e] = w->strides[e + 1]; w->lo[e] = w->lo[e + 1]; w->hi[e] = w->hi[e + 1]; }
            w->strides[nd - 1] = 0;
        }
        for (int e = d; e < nd - 1; e++) shape[e] = shape[e + 1];
        nd--;
        if (d < *split) (*split)--;
    }
    for (int d = nd - 2; d >= 0; d--) {
        if (d == *split - 1) continue;
        bool ok = true;
        for (int v = 0; ok && v < p->nviews; v++) {
            cx_view *w = &p->views[v];
            if (w->strides[d] != w->strides[d + 1] * shape[d + 1]) ok = false;
            if (!view_full(w, d, shape) || !view_full(w, d + 1, shape)) ok = false;
        }
        if (!ok) continue;
        for (int v = 0; v < p->nviews; v++) {
            cx_view *w = &p->views[v];
            w->strides[d] = w->strides[d + 1];
            if (w->masked) { w->lo[d] = 0; w->hi[d] = shape[d] * shape[d + 1]; }
            for (int e = d + 1; e < nd - 1; e++) { w->strides[e] = w->strides[e + 1]; w->lo[e] = w->lo[e + 1]; w->hi[e] = w->hi[e + 1]; }
            w->strides[nd - 1] = 0;
        }
        shape[d] *= shape[d + 1];
        for (int e = d + 1; e < nd - 1; e++) shape[e] = shape[e + 1];
        nd--;
        if (*split > d + 1) (*split)--;
    }
    return nd;
}

/* ---- executable building ------------------------------------------------------------ */

static int add_slot(lctx *c, cx_slot_kind kind, int index, int64_t bytes)
{
    cx_executable *e = c->e;
    if (e->nslots == c->scap) {
        int cap = c->scap ? c->scap * 2 : 64;
        cx_slot *ns = realloc(e->slots, sizeof *ns * (size_t)cap);
        if (!ns) return -1;
        e->slots = ns;
        c->scap = cap;
    }
    e->slots[e->nslots] = (cx_slot){ kind, index, bytes, 0, INT_MAX, -1 };
    return e->nslots++;
}

static cx_kernel *add_kernel(lctx *c)
{
    cx_executable *e = c->e;
    if (e->nkernels == c->kcap) {
        int cap = c->kcap ? c->kcap * 2 : 64;
        cx_kernel *nk = realloc(e->kernels, sizeof *nk * (size_t)cap);
        if (!nk) return NULL;
        e->kernels = nk;
        c->kcap = cap;
    }
    cx_kernel *k = &e->kernels[e->nkernels++];
    memset(k, 0, sizeof *k);
    k->scratch_slot = -1;
    k->wait_at = -1;
    return k;
}

/* Resolves a heavy op's input to a buffer slot with a view over the input's
 * own shape. With `matmul`, transposed and batch-broadcast layouts pass;
 * otherwise only a contiguous layout does. */
static bool resolve_input(lctx *c, int x, bool matmul, cx_kin *out)
{
    const cx_gnode *xn = &c->g->nodes[x];
    memset(out, 0, sizeof *out);
    out->dtype = xn->dtype;
    out->numel = xn->numel;
    out->ndim = xn->ndim;
    memcpy(out->shape, xn->shape, sizeof out->shape);
    int64_t S[CX_MAX_DIMS];
    contiguous_strides(xn->shape, xn->ndim, S);
    int64_t rows = xn->ndim >= 2 ? xn->shape[xn->ndim - 2] : 1, cols = xn->ndim >= 1 ? xn->shape[xn->ndim - 1] : 1;
    out->batch_stride = rows * cols;
    if (c->root[x]) {
        out->slot = c->slot_of[x];
        memcpy(out->view.strides, S, sizeof S);
        return true;
    }
    /* walk the view chain down to a root */
    c->it_nd = xn->ndim;
    memcpy(c->it_shape, xn->shape, sizeof c->it_shape);
    mview m;
    mview_identity(&m, xn->ndim);
    int cur = x;
    cx_view v;
    for (;;) {
        const cx_gnode *n = &c->g->nodes[cur];
        if (c->root[cur]) { mview_to_view(c, &m, n->shape, &v); break; }
        if (n->op == OP_RESHAPE && c->root[n->inputs[0]]) {
            mview_to_view(c, &m, n->shape, &v);
            cur = n->inputs[0];
            break;
        }
        mview r = m;
        if (n->op == OP_PERMUTE) {
            for (int k = 0; k < n->ndim; k++) { int s = (int)n->attrs[k]; r.off[s] = m.off[k]; memcpy(r.A[s], m.A[k], sizeof r.A[s]); }
        } else if (n->op == OP_EXPAND) {
            const cx_gnode *in = &c->g->nodes[n->inputs[0]];
            for (int k = 0; k < n->ndim; k++) if (in->shape[k] == 1 && n->shape[k] != 1) { r.off[k] = 0; memset(r.A[k], 0, sizeof r.A[k]); }
        } else if (n->op == OP_SLICE) {
            int ax = (int)n->attrs[0];
            r.off[ax] = n->attrs[1] + n->attrs[2] * m.off[ax];
            for (int d = 0; d < c->it_nd; d++) r.A[ax][d] = n->attrs[2] * m.A[ax][d];
        } else if (n->op == OP_RESHAPE) {
            const cx_gnode *in = &c->g->nodes[n->inputs[0]];
            if (!unravel(c, &m, n->shape, in->shape, in->ndim, &r)) return false;
        } else {
            return false;
        }
        m = r;
        cur = n->inputs[0];
    }
    out->slot = c->slot_of[cur];
    bool contiguous = v.offset == 0;
    for (int d = 0; d < xn->ndim && contiguous; d++) if (xn->shape[d] > 1 && v.strides[d] != S[d]) contiguous = false;
    if (contiguous) {
        memcpy(out->view.strides, S, sizeof S);
        return true;
    }
    if (!matmul || xn->ndim < 2) return false;
    int nd = xn->ndim;
    int64_t r0 = xn->shape[nd - 2], c0 = xn->shape[nd - 1];
    bool plain = (v.strides[nd - 1] == 1 || c0 == 1) && (v.strides[nd - 2] == c0 || r0 == 1);
    bool trans = (v.strides[nd - 2] == 1 || r0 == 1) && (v.strides[nd - 1] == r0 || c0 == 1);
    if (!plain && !trans) return false;
    /* batch dims must collapse to one stride */
    int64_t bstride = -1, expect = -1;
    for (int d = nd - 3; d >= 0; d--) {
        if (xn->shape[d] == 1) continue;
        if (bstride < 0) { bstride = v.strides[d]; expect = bstride * xn->shape[d]; continue; }
        if (bstride == 0 ? v.strides[d] != 0 : v.strides[d] != expect) return false;
        expect *= xn->shape[d];
    }
    out->view = v;
    out->offset = v.offset;
    out->trans = trans && !plain;
    out->batch_stride = bstride < 0 ? 0 : bstride;
    return true;
}

static int64_t bytes_of(const cx_gnode *n) { return n->numel * (int64_t)cx_dtype_size((cx_dtype)n->dtype); }

static bool lower_root(lctx *c, int i)
{
    const cx_gnode *n = &c->g->nodes[i];
    cx_executable *e = c->e;
    int out_slot = c->slot_of[i];
    if (n->op == OP_DATA) return true;
    cx_kernel *k = add_kernel(c);
    if (!k) return false;
    int kidx = e->nkernels - 1;
    k->out_slot = out_slot;
    k->out_dtype = n->dtype;
    k->out_numel = n->numel;
    k->ndim = n->ndim;
    memcpy(k->shape, n->shape, sizeof k->shape);
    memcpy(k->attrs, n->attrs, sizeof(int64_t) * (size_t)(n->nattrs < 16 ? n->nattrs : 16));
    k->fval = n->fval;
    cx_op_group grp = cx_op_table[n->op].group;
    if (grp == G_REDUCE) {
        const cx_gnode *x = &c->g->nodes[n->inputs[0]];
        uint64_t mask = 0;
        if (n->op == OP_ARGMAX) mask = 1ull << n->attrs[0];
        else mask = (uint64_t)n->attrs[0];
        int perm[CX_MAX_DIMS], np = 0;
        for (int d = 0; d < x->ndim; d++) if (!(mask >> d & 1)) perm[np++] = d;
        int nkeep = np;
        for (int d = 0; d < x->ndim; d++) if (mask >> d & 1) perm[np++] = d;
        k->kind = K_REDUCE;
        k->red_op = n->op;
        k->nkeep = nkeep;
        k->ndim = x->ndim;
        c->it_nd = x->ndim;
        for (int d = 0; d < x->ndim; d++) { k->shape[d] = x->shape[perm[d]]; c->it_shape[d] = k->shape[d]; }
        mview m;
        memset(&m, 0, sizeof m);
        m.nd = x->ndim;
        for (int d = 0; d < x->ndim; d++) m.A[perm[d]][d] = 1;
        c->prog = &k->prog;
        c->nmemo = 0;
        int r = gen(c, n->inputs[0], &m);
        if (r < 0) return false;
        k->prog.result = r;
        cx_prog_peephole(&k->prog);
        if (n->op != OP_ARGMAX) {
            int split = nkeep;
            k->ndim = coalesce(&k->prog, k->shape, k->ndim, &split);
            k->nkeep = split;
            /* only size-1 dims were reduced: it is an elementwise copy */
            if (k->nkeep == k->ndim) k->kind = K_FUSED;
        }
        return true;
    }
    if (grp == G_CONTRACT || grp == G_COLLECTIVE || n->op == OP_CONCAT || pad_interior(n)) {
        k->nin = n->ninputs;
        if (k->nin > 4 && n->op != OP_CONCAT) return false;
        if (n->op == OP_CONCAT) k->nin = 0; /* inputs go in prog-free list below */
        for (int j = 0; j < n->ninputs && n->op != OP_CONCAT; j++) {
            if (!resolve_input(c, n->inputs[j], n->op == OP_MATMUL, &k->in[j])) { c->fail_node = n->inputs[j]; return false; }
        }
        switch (n->op) {
        case OP_MATMUL: k->kind = K_MATMUL; break;
        case OP_CONV2D: k->kind = K_CONV; break;
        case OP_CONV2D_BWD_INPUT: k->kind = K_CONV_BI; break;
        case OP_CONV2D_BWD_WEIGHT: k->kind = K_CONV_BW; break;
        case OP_MAXPOOL: k->kind = K_MAXPOOL; break;
        case OP_MAXPOOL_BWD: k->kind = K_MAXPOOL_BWD; break;
        case OP_AVGPOOL: k->kind = K_AVGPOOL; break;
        case OP_AVGPOOL_BWD: k->kind = K_AVGPOOL_BWD; break;
        case OP_GATHER: k->kind = K_GATHER; break;
        case OP_SCATTER_ADD: k->kind = K_SCATTER_ADD; break;
        case OP_PAD: k->kind = K_PAD; break;
        case OP_CONCAT: k->kind = K_CONCAT; break;
        default: k->kind = K_COLL; k->attrs[15] = n->op; break;
        }
        if (n->op == OP_CONCAT) {
            /* concat: one copy kernel per input into the output's slice */
            e->nkernels--;
            int64_t off = 0;
            int ax = (int)n->attrs[0];
            for (int j = 0; j < n->ninputs; j++) {
                cx_kernel *kc = add_kernel(c);
                if (!kc) return false;
                kc->kind = K_CONCAT;
                kc->out_slot = out_slot;
                kc->out_dtype = n->dtype;
                kc->out_numel = n->numel;
                kc->ndim = n->ndim;
                memcpy(kc->shape, n->shape, sizeof kc->shape);
                kc->attrs[0] = ax;
                kc->attrs[1] = off;
                kc->nin = 1;
                if (!resolve_input(c, n->inputs[j], false, &kc->in[0])) { c->fail_node = n->inputs[j]; return false; }
                off += c->g->nodes[n->inputs[j]].shape[ax];
            }
            return true;
        }
        /* scratch for the dense kernels */
        int64_t scratch = 0;
        if (k->kind == K_CONV || k->kind == K_CONV_BI || k->kind == K_CONV_BW) {
            const int64_t *xs = k->kind == K_CONV ? c->g->nodes[n->inputs[0]].shape : n->attrs + 7;
            const int64_t *ws = k->kind == K_CONV ? c->g->nodes[n->inputs[1]].shape
                              : k->kind == K_CONV_BI ? c->g->nodes[n->inputs[1]].shape : n->attrs + 7;
            if (k->kind == K_CONV_BI) xs = n->attrs + 7;
            if (k->kind == K_CONV_BW) xs = c->g->nodes[n->inputs[0]].shape;
            cx_conv_geom g = { .n = xs[0], .c = xs[1], .h = xs[2], .w = xs[3], .o = ws[0], .kh = ws[2], .kw = ws[3],
                               .stride_h = (int)n->attrs[0], .stride_w = (int)n->attrs[1], .pad_h = (int)n->attrs[2],
                               .pad_w = (int)n->attrs[3], .dil_h = (int)n->attrs[4], .dil_w = (int)n->attrs[5],
                               .groups = (int)n->attrs[6] };
            cx_conv_geom_finish(&g);
            scratch = (int64_t)(k->kind == K_CONV ? cx_conv2d_scratch_bytes(&g)
                                : k->kind == K_CONV_BI ? cx_conv2d_bwd_input_scratch_bytes(&g)
                                : cx_conv2d_bwd_weight_scratch_bytes(&g));
        } else if (k->kind == K_COLL) {
            /* only a non-leading axis or all_to_all needs a rearrangement buffer */
            const cx_gnode *x = &c->g->nodes[n->inputs[0]];
            int64_t outer = 1;
            for (int d = 0; d < (int)n->attrs[2] && d < x->ndim; d++) outer *= x->shape[d];
            if (n->op == OP_ALL_TO_ALL) scratch = 2 * bytes_of(x);
            else if (n->op == OP_ALL_GATHER && outer > 1) scratch = bytes_of(n);
            else if (n->op == OP_REDUCE_SCATTER && outer > 1) scratch = bytes_of(x);
        }
        if (scratch > 0) {
            int s = add_slot(c, SLOT_ARENA, -1, scratch);
            if (s < 0) return false;
            k = &e->kernels[kidx];
            k->scratch_slot = s;
            k->scratch_bytes = scratch;
        }
        return true;
    }
    /* fused elementwise root */
    k->kind = K_FUSED;
    c->it_nd = n->ndim;
    memcpy(c->it_shape, n->shape, sizeof c->it_shape);
    mview m;
    mview_identity(&m, n->ndim);
    c->prog = &k->prog;
    c->nmemo = 0;
    /* the root itself is a root: generate its body, not a load of itself */
    c->root[i] = 0;
    int r = gen(c, i, &m);
    c->root[i] = 1;
    if (r < 0) return false;
    k->prog.result = r;
    cx_prog_peephole(&k->prog);
    int split = 0;
    k->ndim = coalesce(&k->prog, k->shape, k->ndim, &split);
    return true;
}

/* ---- liveness and memory plan ----------------------------------------------------------- */

typedef void (*slot_cb)(void *ctx, int slot);

static void kernel_reads(const cx_kernel *k, slot_cb cb, void *ctx)
{
    for (int i = 0; i < k->prog.n; i++)
        if (k->prog.ins[i].kind == P_LOAD) cb(ctx, k->prog.ins[i].slot);
    for (int i = 0; i < k->nin; i++) cb(ctx, k->in[i].slot);
    if (k->scratch_slot >= 0) cb(ctx, k->scratch_slot);
}

typedef struct { cx_executable *e; int k; } live_ctx;
static void mark_read(void *p, int slot)
{
    live_ctx *l = p;
    cx_slot *s = &l->e->slots[slot];
    if (l->k > s->last) s->last = l->k;
    if (l->k < s->def) s->def = l->k;
}

static void compute_liveness(cx_executable *e)
{
    for (int s = 0; s < e->nslots; s++) { e->slots[s].def = INT_MAX; e->slots[s].last = -1; }
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel *kn = &e->kernels[k];
        cx_slot *o = &e->slots[kn->out_slot];
        if (k < o->def) o->def = k;
        if (k > o->last) o->last = k;
        live_ctx l = { e, k };
        kernel_reads(kn, mark_read, &l);
        if (kn->kind == K_COLL && kn->wait_at > k) {
            /* async: the input, output and scratch stay alive until the wait */
            live_ctx w = { e, kn->wait_at };
            mark_read(&w, kn->out_slot);
            kernel_reads(kn, mark_read, &w);
        }
    }
}

static int cmp_size_desc(const void *a, const void *b, void *ctx)
{
    const cx_slot *s = ctx;
    int64_t x = s[*(const int *)a].bytes, y = s[*(const int *)b].bytes;
    return x < y ? 1 : x > y ? -1 : (*(const int *)a - *(const int *)b);
}

static bool plan_memory(cx_executable *e)
{
    int *order = malloc(sizeof(int) * (size_t)(e->nslots + 1));
    int *placed = malloc(sizeof(int) * (size_t)(e->nslots + 1));
    if (!order || !placed) { free(order); free(placed); return false; }
    int n = 0;
    e->intermediate_bytes = 0;
    for (int s = 0; s < e->nslots; s++)
        if (e->slots[s].kind == SLOT_ARENA && e->slots[s].last >= 0) {
            order[n++] = s;
            e->intermediate_bytes += e->slots[s].bytes;
        }
    qsort_r(order, (size_t)n, sizeof(int), cmp_size_desc, e->slots);
    int np = 0;
    int64_t top = 0;
    for (int i = 0; i < n; i++) {
        cx_slot *s = &e->slots[order[i]];
        int64_t size = (s->bytes + 63) & ~(int64_t)63;
        /* lowest offset that does not overlap a placed slot alive at the same time */
        int64_t off = 0;
        bool moved = true;
        while (moved) {
            moved = false;
            for (int j = 0; j < np; j++) {
                cx_slot *t = &e->slots[placed[j]];
                int64_t tsize = (t->bytes + 63) & ~(int64_t)63;
                bool live_overlap = !(s->last < t->def || t->last < s->def);
                if (!live_overlap) continue;
                if (off < t->offset + tsize && t->offset < off + size) { off = t->offset + tsize; moved = true; }
            }
        }
        s->offset = off;
        placed[np++] = order[i];
        if (off + size > top) top = off + size;
    }
    e->arena_bytes = top;
    free(order);
    free(placed);
    return true;
}

/* ---- epilogue fusion ---------------------------------------------------------------------- */

static int count_readers(cx_executable *e, int slot, int *only)
{
    int cnt = 0;
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel *kn = &e->kernels[k];
        bool reads = false;
        for (int i = 0; i < kn->prog.n; i++) if (kn->prog.ins[i].kind == P_LOAD && kn->prog.ins[i].slot == slot) reads = true;
        for (int i = 0; i < kn->nin; i++) if (kn->in[i].slot == slot) reads = true;
        if (reads) { cnt++; *only = k; }
    }
    return cnt;
}

/* An all-reduce or broadcast whose input is an intermediate nothing else
 * reads (DDP's bucket: a concat of gradients) writes its result over that
 * input, as MPI_IN_PLACE: the bucket then costs its bytes once, not twice
 * for the whole time the collective is in flight. */
static void collectives_in_place(cx_executable *e)
{
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel *h = &e->kernels[k];
        if (h->kind != K_COLL || h->nin != 1 || h->scratch_slot >= 0) continue;
        if (h->attrs[15] != OP_ALL_REDUCE && h->attrs[15] != OP_BROADCAST) continue;
        const int in = h->in[0].slot, out = h->out_slot;
        if (in == out || e->slots[in].kind != SLOT_ARENA || e->slots[out].kind != SLOT_ARENA) continue;
        if (e->slots[in].bytes != e->slots[out].bytes) continue;
        int only = -1;
        if (count_readers(e, in, &only) != 1 || only != k) continue;
        for (int j = 0; j < e->nkernels; j++) {
            cx_kernel *kn = &e->kernels[j];
            if (kn->out_slot == out) kn->out_slot = in;
            for (int i = 0; i < kn->prog.n; i++)
                if (kn->prog.ins[i].kind == P_LOAD && kn->prog.ins[i].slot == out) kn->prog.ins[i].slot = in;
            for (int i = 0; i < kn->nin; i++) if (kn->in[i].slot == out) kn->in[i].slot = in;
        }
    }
}

/* Whether an epilogue the heavy kernel h took over (merged: its program
 * now loads the output from merged->out_slot) is one the kernel applies
 * itself while the output is in cache:
 *  - after a conv, out + bias[channel], optionally then relu (Conv2d and
 *    ReLU), over the conv's own (N, O, OH*OW) element split;
 *  - after a conv input gradient or max-pool backward, where(m > 0, out, 0)
 *    with m in the output's layout (relu's gradient, as P_POSMASK).
 * @return the cx_epi, with the index of the load of the bias or mask in
 * *load. */
static cx_epi fold_epilogue(const cx_kernel *h, const cx_kernel *merged, int *load)
{
    const cx_program *p = &merged->prog;
    const cx_pinstr *in = p->ins;
    if (p->n < 3 || p->result != p->n - 1 || in[0].kind != P_LOAD || in[1].kind != P_LOAD) return EPI_PROG;
    for (int i = 0; i < p->n; i++)
        if (in[i].dtype != CX_F32 || (in[i].kind == P_LOAD && in[i].src_dtype != CX_F32)) return EPI_PROG;
    const int o = in[0].slot == merged->out_slot ? 0 : 1, x = 1 - o;
    if (in[o].slot != merged->out_slot || in[x].slot == merged->out_slot) return EPI_PROG;
    const cx_view *v = &p->views[in[x].view];
    const int nd = merged->ndim;
    const int64_t *shape = merged->shape;
    if (h->kind == K_CONV && in[2].kind == P_BIN && in[2].op == OP_ADD && in[2].a + in[2].b == 1 &&
        (p->n == 3 || (in[3].kind == P_RELU && in[3].a == 2))) {
        if (nd < 3 || nd > 4 || h->ndim != 4 || shape[0] != h->shape[0] || shape[1] != h->shape[1]) return EPI_PROG;
        int64_t plane = 1;
        for (int d = 2; d < nd; d++) plane *= shape[d];
        if (plane != h->shape[2] * h->shape[3] || v->offset != 0 || v->masked) return EPI_PROG;
        for (int d = 0; d < nd; d++)
            if (shape[d] > 1 && v->strides[d] != (d == 1 ? 1 : 0)) return EPI_PROG;
        *load = x;
        return p->n == 4 ? EPI_BIAS_RELU : EPI_BIAS;
    }
    if ((h->kind == K_CONV_BI || h->kind == K_MAXPOOL_BWD) && p->n == 3 && in[2].kind == P_POSMASK &&
        in[2].a == x && in[2].b == o && identity_view(v, shape, nd)) {
        *load = x;
        return EPI_POSMASK;
    }
    return EPI_PROG;
}

static void fuse_epilogues(cx_executable *e)
{
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel *h = &e->kernels[k];
        if (h->kind != K_MATMUL && h->kind != K_CONV && h->kind != K_CONV_BI && h->kind != K_MAXPOOL_BWD) continue;
        if (e->slots[h->out_slot].kind != SLOT_ARENA) continue;
        int reader = -1;
        if (count_readers(e, h->out_slot, &reader) != 1 || reader <= k) continue;
        cx_kernel *f = &e->kernels[reader];
        if (f->kind != K_FUSED || f->out_numel != h->out_numel || f->out_dtype != CX_F32) continue;
        if (e->slots[f->out_slot].kind == SLOT_OUTPUT && e->out_alias[e->slots[f->out_slot].index] >= 0) continue;
        /* every load of the heavy result must be the identity over the same element order */
        bool ok = true;
        for (int i = 0; i < f->prog.n && ok; i++) {
            cx_pinstr *in = &f->prog.ins[i];
            if (in->kind != P_LOAD) continue;
            if (in->slot == f->out_slot) ok = false;
            if (in->slot == h->out_slot && !identity_view(&f->prog.views[in->view], f->shape, f->ndim)) ok = false;
        }
        if (!ok) continue;
        /* the heavy op moves to the reader's position and writes the reader's
         * output; the program then runs in place over it */
        cx_kernel merged = *h;
        merged.has_epilogue = true;
        merged.prog = f->prog;
        merged.out_slot = f->out_slot;
        merged.ndim = f->ndim;
        memcpy(merged.shape, f->shape, sizeof merged.shape);
        for (int i = 0; i < merged.prog.n; i++)
            if (merged.prog.ins[i].kind == P_LOAD && merged.prog.ins[i].slot == h->out_slot) merged.prog.ins[i].slot = f->out_slot;
        merged.epi = (uint8_t)fold_epilogue(h, &merged, &merged.epi_load);
        e->slots[h->out_slot].last = -1; /* dead: no arena space */
        /* the heavy op's own geometry comes from its inputs and attrs */
        e->kernels[reader] = merged;
        memmove(&e->kernels[k], &e->kernels[k + 1], sizeof *e->kernels * (size_t)(e->nkernels - k - 1));
        e->nkernels--;
        k--;
    }
}

/* ---- overlap schedule ------------------------------------------------------------------ */

static bool is_grad_collective(const cx_kernel *k)
{
    return k->kind == K_COLL && (k->attrs[15] == OP_ALL_REDUCE || k->attrs[15] == OP_REDUCE_SCATTER);
}

typedef struct { int *slots; int n, cap; } slot_set;

static void collect_read(void *p, int slot)
{
    slot_set *s = p;
    if (s->n < s->cap) s->slots[s->n++] = slot;
}

/* Gradient collectives overlap the rest of backward: a list schedule that
 * issues each all-reduce / reduce-scatter as soon as its inputs exist and
 * runs whatever waits on one only when nothing else is ready. The order is
 * a function of the graph alone, so every rank issues the same sequence.
 * @return false when out of memory. */
static bool schedule_for_overlap(cx_executable *e)
{
    int n = e->nkernels, ncoll = 0, ngather = 0;
    for (int k = 0; k < n; k++) {
        ncoll += is_grad_collective(&e->kernels[k]);
        ngather += e->kernels[k].kind == K_COLL && e->kernels[k].attrs[15] == OP_ALL_GATHER;
    }
    /* FSDP graphs keep the memory-minded depth-first order (with prefetch):
     * pulling independent work forward there would hold gathered units longer */
    if (ncoll == 0 || ngather > 0 || n < 3) return true;
    int maxr = 8;
    for (int k = 0; k < n; k++) if (e->kernels[k].prog.n + 6 > maxr) maxr = e->kernels[k].prog.n + 6;
    int *reads = malloc(sizeof(int) * (size_t)n * (size_t)maxr), *nreads = calloc((size_t)n, sizeof(int));
    char *dep = calloc((size_t)n * (size_t)n, 1);
    int *indeg = calloc((size_t)n, sizeof(int)), *order = malloc(sizeof(int) * (size_t)n);
    char *waits = calloc((size_t)n, 1), *done = calloc((size_t)n, 1);
    if (!reads || !nreads || !dep || !indeg || !order || !waits || !done) {
        free(reads); free(nreads); free(dep); free(indeg); free(order); free(waits); free(done);
        cx_set_error("compile: out of memory");
        return false;
    }
    for (int k = 0; k < n; k++) {
        slot_set ss = { reads + (size_t)k * (size_t)maxr, 0, maxr };
        kernel_reads(&e->kernels[k], collect_read, &ss);
        nreads[k] = ss.n;
    }
    /* j after i when j reads what i writes, writes what i reads, or both write */
    for (int j = 0; j < n; j++)
        for (int i = 0; i < j; i++) {
            int wi = e->kernels[i].out_slot, wj = e->kernels[j].out_slot;
            bool raw = false, war = false;
            for (int r = 0; !raw && r < nreads[j]; r++) raw = reads[(size_t)j * (size_t)maxr + (size_t)r] == wi;
            for (int r = 0; !war && r < nreads[i]; r++) war = reads[(size_t)i * (size_t)maxr + (size_t)r] == wj;
            if (raw || war || wi == wj) { dep[(size_t)j * (size_t)n + (size_t)i] = 1; indeg[j]++; }
            if (raw && is_grad_collective(&e->kernels[i])) waits[j] = 1;
        }
    for (int t = 0; t < n; t++) {
        int pick = -1;
        /* first a gradient collective; then a concat piece, which copies a
         * gradient into its bucket and frees it (otherwise every gradient
         * of a bucket waits until the last one is computed); then work that
         * waits on no collective; then anything */
        for (int pass = 0; pass < 4 && pick < 0; pass++)
            for (int k = 0; k < n && pick < 0; k++) {
                if (done[k] || indeg[k]) continue;
                if (pass == 0 && !is_grad_collective(&e->kernels[k])) continue;
                if (pass == 1 && (e->kernels[k].kind != K_CONCAT || waits[k])) continue;
                if (pass == 2 && waits[k]) continue;
                pick = k;
            }
        CX_ASSERT(pick >= 0);
        done[pick] = 1;
        order[t] = pick;
        for (int j = 0; j < n; j++) if (dep[(size_t)j * (size_t)n + (size_t)pick]) indeg[j]--;
    }
    cx_kernel *nk = malloc(sizeof *nk * (size_t)n);
    if (!nk) {
        free(reads); free(nreads); free(dep); free(indeg); free(order); free(waits); free(done);
        cx_set_error("compile: out of memory");
        return false;
    }
    for (int t = 0; t < n; t++) nk[t] = e->kernels[order[t]];
    memcpy(e->kernels, nk, sizeof *nk * (size_t)n);
    free(nk); free(reads); free(nreads); free(dep); free(indeg); free(order); free(waits); free(done);
    return true;
}

/* ---- prefetch -------------------------------------------------------------------------- */

static int first_writer(const cx_executable *e, int slot)
{
    for (int k = 0; k < e->nkernels; k++) if (e->kernels[k].out_slot == slot) return k;
    return -1;
}

static int first_reader(const cx_executable *e, int slot, int after)
{
    for (int k = after + 1; k < e->nkernels; k++) {
        const cx_kernel *r = &e->kernels[k];
        for (int i = 0; i < r->prog.n; i++) if (r->prog.ins[i].kind == P_LOAD && r->prog.ins[i].slot == slot) return k;
        for (int i = 0; i < r->nin; i++) if (r->in[i].slot == slot) return k;
    }
    return e->nkernels;
}

/* FSDP prefetch: each all-gather moves up to where the previous gather's
 * result is first used, so it runs while the previous unit computes. It
 * stays after that previous collective (the issue order every rank shares
 * is unchanged) and holds at most one unit ahead of its use. */
static void prefetch_gathers(cx_executable *e)
{
    int prev = -1;
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel *kn = &e->kernels[k];
        if (kn->kind != K_COLL) continue;
        if (kn->attrs[15] != OP_ALL_GATHER || prev < 0) { prev = k; continue; }
        int target = first_reader(e, e->kernels[prev].out_slot, prev);
        /* inputs must exist by then */
        for (int i = 0; i < kn->nin; i++) {
            int w = first_writer(e, kn->in[i].slot);
            if (w >= target) target = w + 1;
        }
        if (target < k && target > prev) {
            cx_kernel moved = *kn;
            memmove(&e->kernels[target + 1], &e->kernels[target], sizeof *e->kernels * (size_t)(k - target));
            e->kernels[target] = moved;
            k = target;
        }
        prev = k;
    }
}

/* ---- output aliasing ------------------------------------------------------------------------- */

/* An output may take its donor input's buffer only if every read of that
 * input happens before the output is written, or in the very kernel that
 * writes it with the identical element order. Otherwise it is computed into
 * the arena and copied over the input at the end. */
static bool alias_safe(cx_executable *e, int out_slot, int in_slot)
{
    int writer = -1;
    for (int k = 0; k < e->nkernels; k++) if (e->kernels[k].out_slot == out_slot) { writer = k; break; }
    if (writer < 0) return false;
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel *kn = &e->kernels[k];
        bool reads = false, identity_only = true;
        for (int i = 0; i < kn->prog.n; i++) {
            cx_pinstr *in = &kn->prog.ins[i];
            if (in->kind != P_LOAD || in->slot != in_slot) continue;
            reads = true;
            if (!identity_view(&kn->prog.views[in->view], kn->shape, kn->ndim)) identity_only = false;
        }
        for (int i = 0; i < kn->nin; i++) if (kn->in[i].slot == in_slot) { reads = true; identity_only = false; }
        if (kn->scratch_slot == in_slot) reads = true;
        if (!reads) continue;
        if (k < writer) continue;
        if (k == writer && kn->kind == K_FUSED && identity_only && !kn->has_epilogue) continue;
        /* all-reduce and broadcast run in place over their own input */
        if (k == writer && kn->kind == K_COLL && kn->nin == 1 && kn->in[0].slot == in_slot &&
            (kn->attrs[15] == OP_ALL_REDUCE || kn->attrs[15] == OP_BROADCAST))
            continue;
        return false;
    }
    return true;
}

/* ---- driver ------------------------------------------------------------------------------------ */

void cx_executable_free(cx_executable *e)
{
    if (!e) return;
    for (int k = 0; k < e->nkernels; k++) {
        free(e->kernels[k].prog.ins);
        free(e->kernels[k].prog.views);
    }
    free(e->kernels);
    free(e->slots);
    free(e->out_dtypes);
    free(e->out_bytes);
    free(e->out_alias);
    free(e->out_slot);
    free(e);
}

static void reset_exec(cx_executable *e)
{
    for (int k = 0; k < e->nkernels; k++) {
        free(e->kernels[k].prog.ins);
        free(e->kernels[k].prog.views);
    }
    free(e->kernels);
    free(e->slots);
    e->kernels = NULL;
    e->slots = NULL;
    e->nkernels = 0;
    e->nslots = 0;
}

static bool try_lower(lctx *c)
{
    const cx_graph *g = c->g;
    cx_executable *e = c->e;
    reset_exec(e);
    c->kcap = c->scap = 0;
    c->fail_node = -1;
    compute_groups(c);
    /* slots: inputs first (ordinal order), outputs, then intermediates */
    for (int i = 0; i < g->n; i++) c->slot_of[i] = -1;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == OP_DATA)
            c->slot_of[i] = add_slot(c, SLOT_INPUT, g->nodes[i].input_ordinal, bytes_of(&g->nodes[i]));
    for (int o = 0; o < g->n_outputs; o++) {
        int i = g->outputs[o];
        c->slot_of[i] = add_slot(c, SLOT_OUTPUT, o, bytes_of(&g->nodes[i]));
        e->out_slot[o] = c->slot_of[i];
    }
    for (int i = 0; i < g->n; i++)
        if (c->root[i] && c->slot_of[i] < 0) c->slot_of[i] = add_slot(c, SLOT_ARENA, -1, bytes_of(&g->nodes[i]));
    for (int i = 0; i < g->n; i++) {
        if (!c->root[i]) continue;
        if (!lower_root(c, i)) {
            if (c->fail_node < 0) c->fail_node = i;
            return false;
        }
    }
    fuse_epilogues(e);
    collectives_in_place(e);
    if (!schedule_for_overlap(e)) return false;
    prefetch_gathers(e);
    /* collectives: wait just before the first reader of their result */
    for (int k = 0; k < e->nkernels; k++)
        if (e->kernels[k].kind == K_COLL) e->kernels[k].wait_at = first_reader(e, e->kernels[k].out_slot, k);
    /* aliasing: safe in place, or compute into the arena and copy at the end */
    e->num_aliased = 0;
    for (int o = 0; o < g->n_outputs; o++) {
        int a = g->out_alias[o];
        if (a < 0) continue;
        int in_slot = -1;
        for (int s = 0; s < e->nslots; s++) if (e->slots[s].kind == SLOT_INPUT && e->slots[s].index == a) in_slot = s;
        int os = e->out_slot[o];
        e->num_aliased++;
        if (in_slot < 0 || alias_safe(e, os, in_slot)) continue;
        /* redirect the writer into a fresh arena slot, then copy */
        int tmp = add_slot(c, SLOT_ARENA, -1, e->slots[os].bytes);
        if (tmp < 0) return false;
        for (int k = 0; k < e->nkernels; k++) {
            cx_kernel *kn = &e->kernels[k];
            if (kn->out_slot == os) kn->out_slot = tmp;
            for (int i = 0; i < kn->prog.n; i++) if (kn->prog.ins[i].kind == P_LOAD && kn->prog.ins[i].slot == os) kn->prog.ins[i].slot = tmp;
            for (int i = 0; i < kn->nin; i++) if (kn->in[i].slot == os) kn->in[i].slot = tmp;
        }
        cx_kernel *cp = add_kernel(c);
        if (!cp) return false;
        cp->kind = K_COPY;
        cp->out_slot = os;
        cp->out_numel = e->slots[os].bytes;
        cp->nin = 1;
        cp->in[0].slot = tmp;
    }
    compute_liveness(e);
    return plan_memory(e);
}

cx_executable *cx_lower(const cx_graph *g)
{
    cx_executable *e = calloc(1, sizeof *e);
    lctx c = { .g = g };
    size_t n = (size_t)g->n + 1;
    c.nconsumers = calloc(n, sizeof(int));
    c.consumers = calloc(n, sizeof(int *));
    c.is_output = calloc(n, 1);
    c.force_root = calloc(n, 1);
    c.root = calloc(n, 1);
    c.group = calloc(n, sizeof(int));
    c.slot_of = calloc(n, sizeof(int));
    bool ok = e && c.nconsumers && c.consumers && c.is_output && c.force_root && c.root && c.group && c.slot_of;
    if (ok) {
        e->n_inputs = g->n_inputs;
        e->n_rts = g->n_rts;
        e->n_outputs = g->n_outputs;
        e->out_dtypes = calloc((size_t)g->n_outputs + 1, 1);
        e->out_bytes = calloc((size_t)g->n_outputs + 1, sizeof(int64_t));
        e->out_alias = calloc((size_t)g->n_outputs + 1, sizeof(int));
        e->out_slot = calloc((size_t)g->n_outputs + 1, sizeof(int));
        ok = e->out_dtypes && e->out_bytes && e->out_alias && e->out_slot;
    }
    if (ok) {
        for (int o = 0; o < g->n_outputs; o++) {
            const cx_gnode *on = &g->nodes[g->outputs[o]];
            c.is_output[g->outputs[o]] = 1;
            e->out_dtypes[o] = on->dtype;
            e->out_bytes[o] = bytes_of(on);
            e->out_alias[o] = g->out_alias[o];
        }
        for (int i = 0; i < g->n && ok; i++)
            for (int k = 0; k < g->nodes[i].ninputs; k++) c.nconsumers[g->nodes[i].inputs[k]]++;
        for (int i = 0; i < g->n && ok; i++) {
            c.consumers[i] = malloc(sizeof(int) * (size_t)(c.nconsumers[i] + 1));
            if (!c.consumers[i]) ok = false;
            c.nconsumers[i] = 0;
        }
        for (int i = 0; i < g->n && ok; i++)
            for (int k = 0; k < g->nodes[i].ninputs; k++) {
                int x = g->nodes[i].inputs[k];
                c.consumers[x][c.nconsumers[x]++] = i;
            }
    }
    c.e = e;
    int attempts = 0;
    while (ok) {
        if (try_lower(&c)) break;
        if (c.fail_node < 0 || c.force_root[c.fail_node] || ++attempts > g->n + 1) {
            ok = false;
            cx_set_error("compile: cannot lower %s (node %d)", c.fail_node >= 0 ? cx_op_table[g->nodes[c.fail_node].op].name : "graph",
                         c.fail_node);
            break;
        }
        c.force_root[c.fail_node] = 1;
    }
    if (ok) {
        e->num_nodes = g->n;
        e->num_work_kernels = e->nkernels;
        e->max_prog = 1;
        for (int k = 0; k < e->nkernels; k++) if (e->kernels[k].prog.n > e->max_prog) e->max_prog = e->kernels[k].prog.n;
    }
    for (int i = 0; i < g->n && c.consumers; i++) free(c.consumers[i]);
    free(c.consumers); free(c.nconsumers); free(c.is_output); free(c.force_root); free(c.root); free(c.group);
    free(c.slot_of); free(c.memo);
    if (!ok) { cx_executable_free(e); return NULL; }
    return e;
}
