/* Pass 2, code generation: slots for every buffer and one kernel per root.
 * Reductions and fused roots get a program (program.c); heavy ops (matmul,
 * conv, pools, gather, collectives, ...) read their operands through views
 * that resolve to a buffer, transposed or batch-broadcast for matmul. */
#include "passes.h"

typedef struct {
    const cx_graph *g;
    const char *root;
    int *slot_of;
    cx_executable *e;
    int fail_node;
    bool oom;
} cgctx;

static int64_t bytes_of(const cx_gnode *n) { return n->numel * (int64_t)cx_dtype_size((cx_dtype)n->dtype); }

/* Walks x's chain of views down to a root: *cur = the root, *v = x's view of
 * its buffer. @return false when a link is not a view or not affine. */
static bool view_chain(const cgctx *c, int x, int *cur, cx_view *v)
{
    const cx_gnode *xn = &c->g->nodes[x];
    cx_mview m;
    cx_mview_identity(&m, xn->ndim);
    *cur = x;
    for (;;) {
        const cx_gnode *n = &c->g->nodes[*cur];
        if (c->root[*cur]) { cx_mview_to_view(&m, xn->ndim, n->shape, v); return true; }
        if (n->ninputs != 1) return false;   /* not a view: the caller makes it a root */
        const cx_gnode *in = &c->g->nodes[n->inputs[0]];
        if (n->op == OP_RESHAPE && c->root[n->inputs[0]]) {
            cx_mview_to_view(&m, xn->ndim, n->shape, v);
            *cur = n->inputs[0];
            return true;
        }
        cx_mview r = m;
        if (n->op == OP_PERMUTE) {
            for (int k = 0; k < n->ndim; k++) {
                int s = (int)CX_ATTR(n, CX_AT_PERM(k));
                r.off[s] = m.off[k];
                memcpy(r.A[s], m.A[k], sizeof r.A[s]);
            }
        } else if (n->op == OP_EXPAND) {
            for (int k = 0; k < n->ndim; k++)
                if (in->shape[k] == 1 && n->shape[k] != 1) { r.off[k] = 0; memset(r.A[k], 0, sizeof r.A[k]); }
        } else if (n->op == OP_SLICE) {
            int ax = (int)CX_ATTR(n, CX_AT_SLICE_AXIS);
            int64_t step = CX_ATTR(n, CX_AT_SLICE_STEP);
            r.off[ax] = CX_ATTR(n, CX_AT_SLICE_START) + step * m.off[ax];
            for (int d = 0; d < xn->ndim; d++) r.A[ax][d] = step * m.A[ax][d];
        } else if (n->op != OP_RESHAPE ||
                   !cx_mview_unravel(&m, xn->ndim, xn->shape, n->shape, in->shape, in->ndim, &r)) {
            return false;
        }
        m = r;
        *cur = n->inputs[0];
    }
}

/* A matmul operand in a non-contiguous view: plain or transposed rows, with
 * batch dims that collapse to one stride. */
static bool matmul_layout(const cx_gnode *xn, const cx_view *v, cx_kin *out)
{
    int nd = xn->ndim;
    if (nd < 2) return false;
    int64_t r0 = xn->shape[nd - 2], c0 = xn->shape[nd - 1];
    bool plain = (v->strides[nd - 1] == 1 || c0 == 1) && (v->strides[nd - 2] == c0 || r0 == 1);
    bool trans = (v->strides[nd - 2] == 1 || r0 == 1) && (v->strides[nd - 1] == r0 || c0 == 1);
    if (!plain && !trans) return false;
    int64_t bstride = -1, expect = -1;
    for (int d = nd - 3; d >= 0; d--) {
        if (xn->shape[d] == 1) continue;
        if (bstride < 0) { bstride = v->strides[d]; expect = bstride * xn->shape[d]; continue; }
        if (bstride == 0 ? v->strides[d] != 0 : v->strides[d] != expect) return false;
        expect *= xn->shape[d];
    }
    out->view = *v;
    out->offset = v->offset;
    out->trans = trans && !plain;
    out->batch_stride = bstride < 0 ? 0 : bstride;
    return true;
}

typedef enum {
    LAYOUT_CONTIGUOUS,   /* the input's own row-major layout */
    LAYOUT_MATMUL,       /* also transposed or batch-broadcast rows */
    LAYOUT_STRIDED,      /* any affine view whose last dim is contiguous (attention) */
    LAYOUT_SHIFTED,      /* the own row-major layout at an offset (a concat's part sliced out of a packed buffer) */
    LAYOUT_ROW_INDEX,    /* a gather's index expanded over its rows (the caller checks cx_index_is_rows) */
    LAYOUT_BROADCAST,    /* one value read everywhere (a scatter-add's zero base) */
} layout;

/* Any unmasked view with non-negative strides whose innermost dim is
 * contiguous: each row is one run of memory. */
static bool strided_layout(const cx_gnode *xn, const cx_view *v, cx_kin *out)
{
    int nd = xn->ndim;
    if (nd < 1 || v->masked || v->offset < 0) return false;
    if (xn->shape[nd - 1] > 1 && v->strides[nd - 1] != 1) return false;
    for (int d = 0; d < nd; d++) if (v->strides[d] < 0) return false;
    out->view = *v;
    out->view.strides[nd - 1] = 1;
    out->offset = v->offset;
    return true;
}

/* The input's own row-major layout, starting `offset` elements into the
 * buffer (unmasked): one run of memory. */
static bool shifted_layout(const cx_gnode *xn, const cx_view *v, const int64_t *S, cx_kin *out)
{
    if (v->masked || v->offset < 0) return false;
    for (int d = 0; d < xn->ndim; d++) if (xn->shape[d] > 1 && v->strides[d] != S[d]) return false;
    out->view = *v;
    memcpy(out->view.strides, S, sizeof(int64_t) * (size_t)xn->ndim);
    out->offset = v->offset;
    return true;
}

/* Resolves a heavy op's input to a buffer slot with a view over the input's
 * own shape, in the layouts the kernel accepts. */
static bool resolve_input(const cgctx *c, int x, layout lay, cx_kin *out)
{
    const cx_gnode *xn = &c->g->nodes[x];
    memset(out, 0, sizeof *out);
    out->dtype = xn->dtype;
    out->numel = xn->numel;
    out->ndim = xn->ndim;
    memcpy(out->shape, xn->shape, sizeof out->shape);
    int64_t S[CX_MAX_DIMS];
    cx_contiguous_strides(xn->shape, xn->ndim, S);
    int64_t rows = xn->ndim >= 2 ? xn->shape[xn->ndim - 2] : 1, cols = xn->ndim >= 1 ? xn->shape[xn->ndim - 1] : 1;
    out->batch_stride = rows * cols;
    int cur;
    cx_view v;
    if (!view_chain(c, x, &cur, &v)) return false;
    out->slot = c->slot_of[cur];
    if (cx_view_is_identity(&v, xn->shape, xn->ndim)) {
        memcpy(out->view.strides, S, sizeof S);
        return true;
    }
    if (lay == LAYOUT_STRIDED) return strided_layout(xn, &v, out);
    if (lay == LAYOUT_SHIFTED) return shifted_layout(xn, &v, S, out);
    if (lay == LAYOUT_ROW_INDEX || lay == LAYOUT_BROADCAST) {
        out->view = v;
        out->offset = v.offset;
        return lay == LAYOUT_ROW_INDEX || cx_view_is_broadcast(&v, xn->shape, xn->ndim);
    }
    return lay == LAYOUT_MATMUL && matmul_layout(xn, &v, out);
}

static cx_kkind heavy_kind(int op)
{
    switch (op) {
    case OP_MATMUL: return K_MATMUL;
    case OP_CONV2D: return K_CONV;
    case OP_CONV2D_BWD_INPUT: return K_CONV_BI;
    case OP_CONV2D_BWD_WEIGHT: return K_CONV_BW;
    case OP_MAXPOOL: return K_MAXPOOL;
    case OP_MAXPOOL_BWD: return K_MAXPOOL_BWD;
    case OP_AVGPOOL: return K_AVGPOOL;
    case OP_AVGPOOL_BWD: return K_AVGPOOL_BWD;
    case OP_GATHER: return K_GATHER;
    case OP_SCATTER_ADD: return K_SCATTER_ADD;
    case OP_PAD: return K_PAD;
    case OP_ATTENTION: return K_ATTENTION;
    case OP_ATTENTION_BWD: return K_ATTENTION_BWD;
    case OP_LAYER_NORM: return K_LAYER_NORM;
    case OP_LAYER_NORM_BWD: return K_LAYER_NORM_BWD;
    case OP_CONCAT: return K_CONCAT;
    default: return K_COLL;
    }
}

/* Scratch bytes of a heavy kernel: conv tiles, bf16 matmul tiles, or a collective's
 * rearrangement buffer (a non-leading axis, or all_to_all). */
static int64_t heavy_scratch(const cgctx *c, const cx_gnode *n, const cx_kernel *k)
{
    if (k->kind == K_CONV || k->kind == K_CONV_BI || k->kind == K_CONV_BW) {
        cx_conv_geom g;
        cx_kernel_conv_geom(k, &g);
        if (k->in[0].dtype == CX_BF16)
            return (int64_t)cx_conv2d_bf16_scratch_bytes(&g, k->kind == K_CONV ? 0 : k->kind == K_CONV_BI ? 1 : 2);
        return (int64_t)(k->kind == K_CONV ? cx_conv2d_scratch_bytes(&g)
                         : k->kind == K_CONV_BI ? cx_conv2d_bwd_input_scratch_bytes(&g)
                         : cx_conv2d_bwd_weight_scratch_bytes(&g));
    }
    if (k->kind == K_ATTENTION || k->kind == K_ATTENTION_BWD) {
        cx_attn_geom g;
        cx_kernel_attn_geom(k, &g);
        if (k->in[0].dtype == CX_BF16)
            return (int64_t)(k->kind == K_ATTENTION ? cx_attention_bf16_scratch_bytes(&g)
                                                    : cx_attention_bf16_bwd_scratch_bytes(&g));
        return (int64_t)(k->kind == K_ATTENTION ? cx_attention_scratch_bytes(&g) : cx_attention_bwd_scratch_bytes(&g));
    }
    if (k->kind == K_MATMUL && k->in[0].dtype == CX_BF16) {
        const cx_kin *a = &k->in[0], *b = &k->in[1];
        int nd = a->ndim;
        int64_t batch = 1;
        for (int d = 0; d < nd - 2; d++) batch *= a->shape[d];
        return (int64_t)cx_matmul_bf16_scratch_bytes(batch, a->shape[nd - 2], b->shape[nd - 1], a->shape[nd - 1]);
    }
    if (cx_kernel_is_pool(k) && k->out_dtype == CX_BF16) {
        cx_pool_geom g;
        cx_kernel_pool_geom(k, &g);
        return (int64_t)cx_pool2d_bf16_scratch_bytes(&g);
    }
    if (k->kind == K_LAYER_NORM_BWD) {
        const cx_kin *x = &k->in[0];
        int64_t cols = x->shape[x->ndim - 1];
        return (int64_t)cx_layer_norm_bwd_scratch_bytes(cols ? x->numel / cols : 0, cols);
    }
    if (k->kind != K_COLL) return 0;
    const cx_gnode *x = &c->g->nodes[n->inputs[0]];
    int64_t outer = 1;
    int ax = (int)CX_ATTR(n, CX_AT_COLL_AXIS);
    for (int d = 0; d < ax && d < x->ndim; d++) outer *= x->shape[d];
    if (n->op == OP_ALL_TO_ALL) return 2 * bytes_of(x);
    if (n->op == OP_ALL_GATHER && outer > 1) return bytes_of(n);
    if (n->op == OP_REDUCE_SCATTER && outer > 1) return bytes_of(x);
    return 0;
}

/* A kernel writing root i's slot, with i's shape and attributes. */
static cx_kernel *root_kernel(cgctx *c, int i, cx_kkind kind)
{
    const cx_gnode *n = &c->g->nodes[i];
    cx_kernel *k = cx_exec_add_kernel(c->e);
    if (!k) { c->oom = true; return NULL; }
    k->kind = kind;
    k->out_slot = c->slot_of[i];
    k->out_dtype = n->dtype;
    k->out_numel = n->numel;
    k->ndim = n->ndim;
    memcpy(k->shape, n->shape, sizeof k->shape);
    k->nattrs = n->nattrs;
    memcpy(k->attrs, n->attrs, sizeof(int64_t) * (size_t)n->nattrs);
    k->fval = n->fval;
    k->node = i;
    k->loc = n->loc;
    return k;
}

/* readers of node x in the graph (an output counts as one more) */
static int readers(const cx_graph *g, int x)
{
    int r = 0;
    for (int j = 0; j < g->n; j++)
        for (int a = 0; a < g->nodes[j].ninputs; a++) r += g->nodes[j].inputs[a] == x;
    for (int o = 0; o < g->n_outputs; o++) r += g->outputs[o] == x;
    return r;
}

/* Whether concat i's parts are views read by nothing else down to one node
 * that only these parts read. */
static bool parts_read_alone(const cgctx *c, int i, int packed)
{
    const cx_gnode *n = &c->g->nodes[i];
    for (int j = 0; j < n->ninputs; j++)
        for (int x = n->inputs[j]; x != packed; x = c->g->nodes[x].inputs[0])
            if (c->root[x] || c->g->nodes[x].ninputs != 1 || readers(c->g, x) != 1) return false;
    return readers(c->g, packed) == n->ninputs;
}

/* A concat along the last axis of the three parts of an attention
 * backward's packed output (f32 or bf16, the concat's dtype), in order, each (.., H * D) over as many rows
 * as the backward has queries and keys, nothing else reading them: the
 * gradient of q, k and v sliced from one projection. The backward writes
 * its rows interleaved straight into the concat's buffer, and the concat
 * is no kernel (it was a copy per part). */
static bool concat_attention_in_place(cgctx *c, int i)
{
    const cx_gnode *n = &c->g->nodes[i];
    const int nd = n->ndim;
    if (n->ninputs != 3 || nd < 2 || CX_ATTR(n, CX_AT_AXIS) != nd - 1 || (n->dtype != CX_F32 && n->dtype != CX_BF16))
        return false;
    cx_kin part[3];
    for (int j = 0; j < 3; j++)
        if (!resolve_input(c, n->inputs[j], LAYOUT_SHIFTED, &part[j]) || part[j].slot != part[0].slot) return false;
    cx_kernel *k = NULL;
    for (int q = c->e->nkernels - 1; q >= 0 && !k; q--)
        if (c->e->kernels[q].out_slot == part[0].slot) k = &c->e->kernels[q];
    if (!k || k->kind != K_ATTENTION_BWD || k->out_dtype != n->dtype || k->nattrs != CX_AT_ATTN_COUNT) return false;
    const int64_t *qs = k->in[0].shape, per = qs[0] * qs[1] * qs[2] * qs[3];
    if (k->in[1].shape[1] != qs[1] || n->shape[nd - 1] != 3 * qs[2] * qs[3]) return false;
    for (int j = 0; j < 3; j++)
        if (part[j].view.offset != j * per || part[j].numel != per || part[j].shape[nd - 1] != qs[2] * qs[3]) return false;
    if (!parts_read_alone(c, i, k->node)) return false;
    k->out_slot = c->slot_of[i];
    k->attrs[CX_AT_ATTN_INTERLEAVED] = 1;
    k->nattrs = CX_AT_ATTN_INTERLEAVED + 1;
    return true;
}

/* concat: one copy kernel per input into its place in the output */
static bool lower_concat(cgctx *c, int i)
{
    const cx_gnode *n = &c->g->nodes[i];
    if (concat_attention_in_place(c, i)) return true;
    int ax = (int)CX_ATTR(n, CX_AT_AXIS);
    int64_t off = 0;
    for (int j = 0; j < n->ninputs; j++) {
        cx_kernel *k = root_kernel(c, i, K_CONCAT);
        if (!k) return false;
        k->nattrs = CX_AT_CONCAT_COUNT;
        k->attrs[CX_AT_AXIS] = ax;
        k->attrs[CX_AT_CONCAT_OFFSET] = off;
        k->nin = 1;
        if (!resolve_input(c, n->inputs[j], LAYOUT_SHIFTED, &k->in[0])) { c->fail_node = n->inputs[j]; return false; }
        off += c->g->nodes[n->inputs[j]].shape[ax];
    }
    return true;
}

/* The root a broadcast of one value stands on: through reshapes and
 * expands to a one-element node (a constant) made its own root, so the
 * value is stored once and not expanded into a buffer; else x itself. */
static int broadcast_source(const cgctx *c, int x)
{
    int cur = x;
    while (!c->root[cur] && (c->g->nodes[cur].op == OP_RESHAPE || c->g->nodes[cur].op == OP_EXPAND))
        cur = c->g->nodes[cur].inputs[0];
    return !c->root[cur] && c->g->nodes[cur].numel == 1 ? cur : x;
}

/* Input j of heavy node n in the layout its kernel reads. A gather's or
 * scatter-add's index may be one value per row, read in place; a
 * scatter-add's base may be one value broadcast (the zeros a gather's
 * gradient starts from). On failure the node to make a root is set. */
static bool resolve_heavy_input(cgctx *c, const cx_gnode *n, int j, layout lay, cx_kin *in)
{
    const bool index = (n->op == OP_GATHER || n->op == OP_SCATTER_ADD) && j == 1;
    const bool base = n->op == OP_SCATTER_ADD && j == 0;
    int64_t so, sd;
    if (index) {
        if (resolve_input(c, n->inputs[j], LAYOUT_ROW_INDEX, in) &&
            (cx_view_is_identity(&in->view, in->shape, in->ndim) || cx_index_is_rows(in, (int)CX_ATTR(n, CX_AT_AXIS), &so, &sd)))
            return true;
    } else if (base) {
        if (resolve_input(c, n->inputs[j], LAYOUT_BROADCAST, in)) return true;
        int src = broadcast_source(c, n->inputs[j]);
        if (src != n->inputs[j]) { c->fail_node = src; return false; }
    } else if (resolve_input(c, n->inputs[j], lay, in)) {
        return true;
    }
    c->fail_node = n->inputs[j];
    return false;
}

static bool lower_heavy(cgctx *c, int i)
{
    const cx_gnode *n = &c->g->nodes[i];
    if (n->op == OP_CONCAT) return lower_concat(c, i);
    if (n->ninputs > CX_MAX_KERNEL_INPUTS) { c->fail_node = i; return false; }
    cx_kernel *k = root_kernel(c, i, heavy_kind(n->op));
    if (!k) return false;
    int kidx = c->e->nkernels - 1;
    if (k->kind == K_COLL) k->coll_op = (uint8_t)n->op;
    k->nin = n->ninputs;
    layout lay = n->op == OP_MATMUL ? LAYOUT_MATMUL
                 : n->op == OP_ATTENTION || n->op == OP_ATTENTION_BWD ? LAYOUT_STRIDED : LAYOUT_CONTIGUOUS;
    for (int j = 0; j < n->ninputs; j++)
        if (!resolve_heavy_input(c, n, j, lay, &k->in[j])) return false;
    int64_t scratch = heavy_scratch(c, n, k);
    if (scratch <= 0) return true;
    int s = cx_exec_add_slot(c->e, SLOT_ARENA, -1, scratch);
    if (s < 0) { c->oom = true; return false; }
    k = &c->e->kernels[kidx];
    k->scratch_slot = s;
    k->scratch_bytes = scratch;
    return true;
}

/* Reductions iterate (kept dims | reduced dims) of the input. */
static bool lower_reduce(cgctx *c, int i)
{
    const cx_gnode *n = &c->g->nodes[i];
    const cx_gnode *x = &c->g->nodes[n->inputs[0]];
    uint64_t mask = n->op == OP_ARGMAX ? 1ull << CX_ATTR(n, CX_AT_AXIS) : (uint64_t)CX_ATTR(n, CX_AT_REDUCE_MASK);
    int perm[CX_MAX_DIMS], np = 0;
    for (int d = 0; d < x->ndim; d++) if (!(mask >> d & 1)) perm[np++] = d;
    int nkeep = np;
    for (int d = 0; d < x->ndim; d++) if (mask >> d & 1) perm[np++] = d;
    cx_kernel *k = root_kernel(c, i, K_REDUCE);
    if (!k) return false;
    k->red_op = n->op;
    k->nkeep = nkeep;
    k->ndim = x->ndim;
    cx_mview m = { .nd = x->ndim };
    for (int d = 0; d < x->ndim; d++) { k->shape[d] = x->shape[perm[d]]; m.A[perm[d]][d] = 1; }
    int r = cx_program_build(c->g, c->root, c->slot_of, n->inputs[0], false, &m, k->ndim, k->shape, &k->prog);
    if (r != -1) { c->oom = r == -2; c->fail_node = r >= 0 ? r : -1; return false; }
    cx_prog_peephole(&k->prog);
    if (n->op != OP_ARGMAX) {
        int split = nkeep;
        k->ndim = cx_prog_coalesce(&k->prog, k->shape, k->ndim, &split);
        k->nkeep = split;
        /* only size-1 dims were reduced: it is an elementwise copy */
        if (k->nkeep == k->ndim) k->kind = K_FUSED;
    }
    return true;
}

static bool lower_fused(cgctx *c, int i)
{
    const cx_gnode *n = &c->g->nodes[i];
    cx_kernel *k = root_kernel(c, i, K_FUSED);
    if (!k) return false;
    cx_mview m;
    cx_mview_identity(&m, n->ndim);
    int r = cx_program_build(c->g, c->root, c->slot_of, i, true, &m, n->ndim, n->shape, &k->prog);
    if (r != -1) { c->oom = r == -2; c->fail_node = r >= 0 ? r : -1; return false; }
    cx_prog_peephole(&k->prog);
    int split = 0;
    k->ndim = cx_prog_coalesce(&k->prog, k->shape, k->ndim, &split);
    return true;
}

static bool lower_root(cgctx *c, int i)
{
    const cx_gnode *n = &c->g->nodes[i];
    if (n->op == OP_DATA) return true;
    if (cx_op_table[n->op].group == G_REDUCE) return lower_reduce(c, i);
    if (cx_is_heavy_op(n)) return lower_heavy(c, i);
    return lower_fused(c, i);
}

/* Inputs first (ordinal order), then outputs, then intermediates. */
static bool make_slots(cgctx *c)
{
    const cx_graph *g = c->g;
    for (int i = 0; i < g->n; i++) c->slot_of[i] = -1;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == OP_DATA &&
            (c->slot_of[i] = cx_exec_add_slot(c->e, SLOT_INPUT, g->nodes[i].input_ordinal, bytes_of(&g->nodes[i]))) < 0)
            return false;
    for (int o = 0; o < g->n_outputs; o++) {
        int i = g->outputs[o];
        if ((c->slot_of[i] = cx_exec_add_slot(c->e, SLOT_OUTPUT, o, bytes_of(&g->nodes[i]))) < 0) return false;
        c->e->out_slot[o] = c->slot_of[i];
    }
    for (int i = 0; i < g->n; i++)
        if (c->root[i] && c->slot_of[i] < 0 &&
            (c->slot_of[i] = cx_exec_add_slot(c->e, SLOT_ARENA, -1, bytes_of(&g->nodes[i]))) < 0)
            return false;
    return true;
}

int cx_pass_codegen(const cx_graph *g, const char *root, cx_executable *e, bool *oom)
{
    cgctx c = { .g = g, .root = root, .e = e, .fail_node = -1 };
    *oom = false;
    c.slot_of = malloc(sizeof(int) * (size_t)(g->n + 1));
    if (!c.slot_of || !make_slots(&c)) { free(c.slot_of); *oom = true; return -1; }
    int fail = -1;
    for (int i = 0; i < g->n; i++) {
        if (!root[i] || lower_root(&c, i)) continue;
        *oom = c.oom;
        fail = c.oom ? -1 : c.fail_node >= 0 ? c.fail_node : i;
        break;
    }
    free(c.slot_of);
    return fail;
}
