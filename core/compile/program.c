/* Code generation for one fused kernel: the SSA program that computes a root
 * from the roots it reads. Views (reshape, permute, expand, slice, pad) are
 * pushed down to the loads as affine maps from the iteration index to each
 * buffer's elements, so a view never copies. */
#include "passes.h"

#include "cx_vec.h"

#include <limits.h>

typedef struct {
    int node;
    cx_mview mv;
    int reg;
} memo_entry;

typedef struct {
    const cx_graph *g;
    const char *root;
    const int *slot_of;
    int it_nd;
    const int64_t *it_shape;
    cx_program *prog;
    memo_entry *memo;       /* (node, map) -> register: a value used twice is computed once */
    int nmemo, memo_cap;
    int self;               /* the root being generated: its body, not a load of itself */
    int fail_node;          /* a view that is not affine: that node must become a root */
    bool oom;
} progctx;

static int push(progctx *c, cx_pinstr in)
{
    cx_program *p = c->prog;
    if (!CX_GROW(p->ins, p->cap, p->n + 1)) { c->oom = true; return -1; }
    p->ins[p->n] = in;
    return p->n++;
}

static int add_view(progctx *c, const cx_view *v)
{
    cx_program *p = c->prog;
    for (int i = 0; i < p->nviews; i++) if (!memcmp(&p->views[i], v, sizeof *v)) return i;
    if (!CX_GROW(p->views, p->vcap, p->nviews + 1)) { c->oom = true; return -1; }
    p->views[p->nviews] = *v;
    return p->nviews++;
}

void cx_mview_identity(cx_mview *m, int nd)
{
    memset(m, 0, sizeof *m);
    m->nd = nd;
    for (int k = 0; k < nd; k++) m->A[k][k] = 1;
}

void cx_mview_to_view(const cx_mview *m, int it_nd, const int64_t *shape, cx_view *v)
{
    int64_t S[CX_MAX_DIMS];
    cx_contiguous_strides(shape, m->nd, S);
    memset(v, 0, sizeof *v);
    for (int k = 0; k < m->nd; k++) {
        v->offset += m->off[k] * S[k];
        for (int d = 0; d < it_nd; d++) v->strides[d] += m->A[k][d] * S[k];
    }
    v->masked = m->masked;
    if (m->masked) {
        memcpy(v->lo, m->lo, sizeof v->lo);
        memcpy(v->hi, m->hi, sizeof v->hi);
    }
}

bool cx_mview_unravel(const cx_mview *m, int it_nd, const int64_t *it_shape, const int64_t *out_shape,
                      const int64_t *in_shape, int in_nd, cx_mview *r)
{
    int64_t S[CX_MAX_DIMS], Sx[CX_MAX_DIMS];
    cx_contiguous_strides(out_shape, m->nd, S);
    cx_contiguous_strides(in_shape, in_nd, Sx);
    int64_t l0 = 0, l[CX_MAX_DIMS] = { 0 };
    for (int k = 0; k < m->nd; k++) {
        l0 += m->off[k] * S[k];
        for (int d = 0; d < it_nd; d++) l[d] += m->A[k][d] * S[k];
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
    for (int d = 0; d < it_nd; d++) {
        if (l[d] == 0 || it_shape[d] <= 1) continue;
        if (l[d] < 0) return false;
        int k = -1;
        for (int kk = 0; kk < in_nd; kk++)
            if (in_shape[kk] > 1 && l[d] % Sx[kk] == 0 && l[d] / Sx[kk] < in_shape[kk]) { k = kk; break; }
        if (k < 0) return false;
        int64_t coef = l[d] / Sx[k];
        r->A[k][d] = coef;
        maxv[k] += coef * (it_shape[d] - 1);
    }
    for (int k = 0; k < in_nd; k++) if (maxv[k] >= in_shape[k] && in_shape[k] > 0) return false;
    return true;
}

static int gen(progctx *c, int i, const cx_mview *m);

/* A load of root x's buffer through map m over a buffer of `shape`. */
static int emit_load(progctx *c, int x, const cx_mview *m, const int64_t *shape)
{
    const cx_gnode *n = &c->g->nodes[x];
    cx_view v;
    cx_mview_to_view(m, c->it_nd, shape, &v);
    int vi = add_view(c, &v);
    if (vi < 0) return -1;
    cx_pinstr in = { .kind = P_LOAD, .dtype = n->dtype, .src_dtype = n->dtype, .slot = c->slot_of[x], .view = vi };
    return push(c, in);
}

static int gen_leaf(progctx *c, const cx_gnode *n, const cx_mview *m)
{
    if (n->op == OP_CONST) return push(c, (cx_pinstr){ .kind = P_CONST, .dtype = n->dtype, .f = n->fval, .i = (int64_t)n->fval });
    if (n->op == OP_RTSCALAR) return push(c, (cx_pinstr){ .kind = P_RT, .dtype = n->dtype, .slot = n->input_ordinal });
    /* iota and rng are functions of the element address */
    cx_view v;
    cx_mview_to_view(m, c->it_nd, n->shape, &v);
    int vi = add_view(c, &v);
    if (vi < 0) return -1;
    cx_pinstr in = { .kind = n->op == OP_IOTA ? P_IOTA : P_RNG, .dtype = n->dtype, .view = vi };
    if (n->op == OP_RNG) {
        in.slot = c->g->nodes[n->inputs[0]].input_ordinal;
        in.a = c->g->nodes[n->inputs[1]].input_ordinal;
        in.i = CX_ATTR(n, CX_AT_RNG_KIND);
    }
    return push(c, in);
}

/* Whether a program reads node x from its buffer. A constant made a root
 * (a scatter-add's broadcast base stores it once) stays an immediate for
 * every other reader: loaded, it would hide relu's zero from the epilogue
 * matcher and cost each fused loop a load. */
static bool loads_root(const progctx *c, int x)
{
    return c->root[x] && c->g->nodes[x].op != OP_CONST;
}

static int gen_reshape(progctx *c, const cx_gnode *n, const cx_mview *m)
{
    int x = n->inputs[0];
    const cx_gnode *xn = &c->g->nodes[x];
    /* a buffer is linear: reshaping a root is only a new way to count */
    if (loads_root(c, x)) return emit_load(c, x, m, n->shape);
    cx_mview r;
    if (!cx_mview_unravel(m, c->it_nd, c->it_shape, n->shape, xn->shape, xn->ndim, &r)) { c->fail_node = x; return -1; }
    return gen(c, x, &r);
}

/* The input's map through a permute, expand or slice: no masking needed. */
static void move_map(const progctx *c, const cx_gnode *n, const cx_mview *m, cx_mview *r)
{
    *r = *m;
    if (n->op == OP_PERMUTE) {
        r->nd = n->ndim;
        for (int k = 0; k < n->ndim; k++) {
            int src = (int)CX_ATTR(n, CX_AT_PERM(k));
            r->off[src] = m->off[k];
            memcpy(r->A[src], m->A[k], sizeof r->A[src]);
        }
    } else if (n->op == OP_EXPAND) {
        const cx_gnode *xn = &c->g->nodes[n->inputs[0]];
        for (int k = 0; k < n->ndim; k++)
            if (xn->shape[k] == 1 && n->shape[k] != 1) { r->off[k] = 0; memset(r->A[k], 0, sizeof r->A[k]); }
    } else {
        int ax = (int)CX_ATTR(n, CX_AT_SLICE_AXIS);
        int64_t start = CX_ATTR(n, CX_AT_SLICE_START), step = CX_ATTR(n, CX_AT_SLICE_STEP);
        r->off[ax] = start + step * m->off[ax];
        for (int d = 0; d < c->it_nd; d++) r->A[ax][d] = step * m->A[ax][d];
    }
}

/* Pad, one dim k: the iteration range [*lo_it, *hi_it) along *dd where the
 * input exists. @return false when the map is not expressible. */
static bool pad_range(const progctx *c, const cx_mview *m, int k, int64_t off, int64_t nx, int *dd, int64_t *lo_it,
                      int64_t *hi_it)
{
    int nnz = 0;
    *dd = 0;
    for (int d = 0; d < c->it_nd; d++) if (m->A[k][d]) { *dd = d; nnz++; }
    if (nnz > 1) return false;
    if (nnz == 0) {
        *lo_it = 0;
        *hi_it = off >= 0 && off < nx ? INT64_MAX : 0;
        return true;
    }
    int64_t a = m->A[k][*dd];
    if (a <= 0) return false;
    /* valid: 0 <= off + a * it < nx, i.e. it >= ceil(-off / a), it < ceil((nx - off) / a) */
    *lo_it = off >= 0 ? 0 : (-off + a - 1) / a;
    *hi_it = nx - off <= 0 ? 0 : (nx - off + a - 1) / a;
    return true;
}

static int gen_pad(progctx *c, int i, const cx_gnode *n, const cx_mview *m)
{
    const cx_gnode *xn = &c->g->nodes[n->inputs[0]];
    int nd = n->ndim;
    cx_mview r = *m, own = { 0 };
    own.masked = true;
    for (int d = 0; d < c->it_nd; d++) { own.lo[d] = 0; own.hi[d] = c->it_shape[d]; }
    bool any = false;
    for (int k = 0; k < nd; k++) {
        int64_t lo = CX_ATTR(n, CX_AT_PAD_LO(nd, k)), hi = CX_ATTR(n, CX_AT_PAD_HI(nd, k));
        if (!lo && !hi) continue;
        any = true;
        r.off[k] = m->off[k] - lo;
        int dd;
        int64_t lo_it, hi_it;
        if (!pad_range(c, m, k, r.off[k], xn->shape[k], &dd, &lo_it, &hi_it)) { c->fail_node = i; return -1; }
        if (c->it_nd == 0) { if (hi_it <= lo_it) own.hi[0] = 0; continue; }
        if (lo_it > own.lo[dd]) own.lo[dd] = lo_it;
        if (hi_it < own.hi[dd]) own.hi[dd] = hi_it;
    }
    if (!any) return gen(c, n->inputs[0], &r);
    for (int d = 0; d < c->it_nd; d++) if (own.hi[d] < own.lo[d]) own.hi[d] = own.lo[d];
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
    cx_view v = { .masked = true };
    memcpy(v.lo, own.lo, sizeof v.lo);
    memcpy(v.hi, own.hi, sizeof v.hi);
    int vi = add_view(c, &v);
    if (vi < 0) return -1;
    return push(c, (cx_pinstr){ .kind = P_MASK, .dtype = n->dtype, .a = a, .view = vi, .f = n->fval });
}

static int gen_elementwise(progctx *c, const cx_gnode *n, const cx_mview *m)
{
    int regs[3] = { 0, 0, 0 };
    for (int k = 0; k < n->ninputs && k < 3; k++) {
        regs[k] = gen(c, n->inputs[k], m);
        if (regs[k] < 0) return -1;
    }
    if (n->op == OP_CAST) return push(c, (cx_pinstr){ .kind = P_CAST, .dtype = n->dtype, .a = regs[0] });
    cx_pinstr in = { .dtype = n->dtype, .op = (uint8_t)n->op, .a = regs[0] };
    if (n->ninputs > 1) in.src_dtype = c->g->nodes[n->inputs[0]].dtype;
    if (n->op == OP_WHERE) { in.kind = P_WHERE; in.b = regs[1]; in.c = regs[2]; }
    else if (n->ninputs == 2) { in.kind = P_BIN; in.b = regs[1]; }
    else in.kind = P_UN;
    return push(c, in);
}

static int gen_uncached(progctx *c, int i, const cx_mview *m)
{
    const cx_gnode *n = &c->g->nodes[i];
    if (loads_root(c, i) && i != c->self) return emit_load(c, i, m, n->shape);
    cx_op_group grp = cx_op_table[n->op].group;
    switch (n->op) {
    case OP_CONST: case OP_RTSCALAR: case OP_IOTA: case OP_RNG: return gen_leaf(c, n, m);
    case OP_RESHAPE: return gen_reshape(c, n, m);
    case OP_PERMUTE: case OP_EXPAND: case OP_SLICE: {
        cx_mview r;
        move_map(c, n, m, &r);
        return gen(c, n->inputs[0], &r);
    }
    case OP_PAD: return gen_pad(c, i, n, m);
    default:
        if (grp == G_UNARY || grp == G_BINARY || grp == G_TERNARY) return gen_elementwise(c, n, m);
        c->fail_node = i;   /* anything else must have been a root */
        return -1;
    }
}

static int gen(progctx *c, int i, const cx_mview *m)
{
    for (int k = 0; k < c->nmemo; k++)
        if (c->memo[k].node == i && !memcmp(&c->memo[k].mv, m, sizeof *m)) return c->memo[k].reg;
    int r = gen_uncached(c, i, m);
    /* a full memo only costs recomputation */
    if (r >= 0 && CX_GROW(c->memo, c->memo_cap, c->nmemo + 1)) c->memo[c->nmemo++] = (memo_entry){ i, *m, r };
    return r;
}

int cx_program_build(const cx_graph *g, const char *root, const int *slot_of, int i, bool body, const cx_mview *m,
                     int it_nd, const int64_t *it_shape, cx_program *prog)
{
    progctx c = { .g = g, .root = root, .slot_of = slot_of, .it_nd = it_nd, .it_shape = it_shape, .prog = prog,
                  .self = body ? i : -1, .fail_node = -1 };
    int reg = gen(&c, i, m);
    free(c.memo);
    if (c.oom) return -2;
    if (reg < 0) return c.fail_node >= 0 ? c.fail_node : i;
    prog->result = reg;
    return -1;
}
