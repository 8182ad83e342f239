/* Pass 0, SPMD partitioning: a captured graph with global shapes, some of
 * whose nodes carry a sharding (data leaves holding this rank's shard, and
 * annotations), becomes the graph this rank runs, with local shapes and the
 * collectives that move data between shardings.
 *
 * Shardings propagate forward in graph order (the graph holds forward and
 * backward together, so a gradient sees its forward's shardings). Each op's
 * rule says which sharding it wants of each input and which its output then
 * has; where an input's sharding differs from the wanted one, reshard()
 * inserts the collectives. An op without a rule wants every input
 * replicated, which is always correct. A contraction split over its reduced
 * dimension leaves a partial sum, finished by an all-reduce, or by a
 * reduce-scatter when the consumer wants that value sharded the same way.
 * Shards of a dimension that does not divide are padded; padding holds
 * garbage, so every rule keeps a padded dimension out of anything that
 * mixes elements along it (reductions, contractions, reshapes). */
#include "passes.h"
#include "capture.h"
#include "sharding.h"
#include "cx_vec.h"

typedef struct {
    uint64_t hash;
    int node;
} memo_entry;

typedef struct {
    const cx_graph *g;
    const cx_sharding *const *ann;
    int rank;
    /* the graph being built: inputs as offsets until the end */
    cx_gnode *nodes;
    int n, cap;
    int *ins, nins, ins_cap;
    int *in_off, off_cap;
    /* per node of g: its node in the new graph, its sharding, reshards made */
    int *nw;
    cx_sharding *sh;
    memo_entry (*memo)[4];
    int inserted[4];          /* all-reduce, all-gather, reduce-scatter, all-to-all */
    cx_spmd_notes *notes;     /* NULL unless an IR dump wants them */
    int moving;               /* the node of g whose value reshard() moves */
    bool failed;
    /* fused backward ops whose packed output may be computed locally (see
     * "packed gradients" below): per node of g */
    cx_uses uses;
    bool have_uses;
    char *packed_ok;
    struct packed_info **packed;
    int *flat_src, *flat_part;
} pctx;

/* ---- building the new graph ---------------------------------------------------------------- */

static int emit(pctx *c, const cx_gnode *proto, const int *ins, int nin, const int64_t *shape)
{
    /* shape may point into c->nodes, which may move as it grows; it holds
     * ndim entries only (a packed part's count is one int64) */
    int64_t dims[CX_MAX_DIMS] = { 0 };
    memcpy(dims, shape, sizeof(int64_t) * proto->ndim);
    if (c->failed) return 0;
    if (!CX_GROW(c->nodes, c->cap, c->n + 1) || !CX_GROW(c->in_off, c->off_cap, c->n + 1) ||
        !CX_GROW(c->ins, c->ins_cap, c->nins + nin + 1)) {
        c->failed = true;
        cx_set_last_error("spmd partition: out of memory");
        return 0;
    }
    cx_gnode *x = &c->nodes[c->n];
    *x = *proto;
    x->ninputs = nin;
    x->inputs = NULL;
    memcpy(x->shape, dims, sizeof x->shape);
    x->numel = cx_shape_numel(dims, x->ndim);
    c->in_off[c->n] = c->nins;
    for (int k = 0; k < nin; k++) c->ins[c->nins++] = ins[k];
    return c->n++;
}

static const int64_t *shape_of(const pctx *c, int x) { return c->nodes[x].shape; }

static int emit_op(pctx *c, cx_op op, int x, const int64_t *shape, const int64_t *attrs, int nattrs, double fval)
{
    cx_gnode p;
    memset(&p, 0, sizeof p);
    p.op = (uint16_t)op;
    p.dtype = c->nodes[x].dtype;
    p.ndim = c->nodes[x].ndim;
    p.nattrs = nattrs;
    if (nattrs) memcpy(p.attrs, attrs, sizeof(int64_t) * (size_t)nattrs);
    p.fval = fval;
    p.input_ordinal = -1;
    p.loc = c->nodes[x].loc;   /* a resharding of x: where x was made */
    return emit(c, &p, &x, 1, shape);
}

static void note_coll(pctx *c, int kind, unsigned axes)
{
    cx_spmd_notes *n = c->notes;
    if (!n) return;
    if (!CX_GROW(n->coll, n->coll_cap, n->ncoll + 1)) { c->failed = true; cx_set_last_error("spmd partition: out of memory"); return; }
    n->coll[n->ncoll++] = (cx_spmd_coll){ c->moving, (uint8_t)kind, (uint8_t)axes };
}

/* A collective over the mesh axes `axes` (a bit mask, for the notes). */
static int emit_coll(pctx *c, cx_op op, int x, const int64_t *shape, int64_t gid, unsigned axes, int64_t axis, int64_t axis2)
{
    int64_t at[CX_AT_COLL_COUNT] = { 0 };
    at[CX_AT_COLL_GROUPS] = gid;
    at[CX_AT_COLL_REDUCE] = CX_RED_SUM;
    at[CX_AT_COLL_AXIS] = axis;
    at[CX_AT_COLL_AXIS2] = axis2;
    int kind = op == OP_ALL_REDUCE ? 0 : op == OP_ALL_GATHER ? 1 : op == OP_REDUCE_SCATTER ? 2 : 3;
    c->inserted[kind]++;
    note_coll(c, kind, axes);
    return emit_op(c, op, x, shape, at, CX_AT_COLL_COUNT, 1.0);
}

static int emit_slice(pctx *c, int x, int d, int64_t start, int64_t count)
{
    int64_t shape[CX_MAX_DIMS], at[CX_AT_SLICE_COUNT];
    memcpy(shape, shape_of(c, x), sizeof shape);
    if (start == 0 && count == shape[d]) return x;
    shape[d] = count;
    at[CX_AT_SLICE_AXIS] = d;
    at[CX_AT_SLICE_START] = start;
    at[CX_AT_SLICE_STEP] = 1;
    return emit_op(c, OP_SLICE, x, shape, at, CX_AT_SLICE_COUNT, 0);
}

static int emit_pad_high(pctx *c, int x, int d, int64_t hi)
{
    if (hi == 0) return x;
    int nd = c->nodes[x].ndim;
    int64_t shape[CX_MAX_DIMS], at[CX_MAX_ATTRS] = { 0 };
    memcpy(shape, shape_of(c, x), sizeof shape);
    shape[d] += hi;
    at[CX_AT_PAD_HI(nd, d)] = hi;
    return emit_op(c, OP_PAD, x, shape, at, CX_AT_PAD_COUNT(nd), 0.0);
}

/* ---- resharding ------------------------------------------------------------------------------ */

static cx_sharding resolved(const cx_sharding *s)
{
    cx_sharding r = *s;
    r.partial = 0;
    return r;
}

static unsigned dim_mask(const cx_sharding *s, int d)
{
    unsigned m = 0;
    for (int i = 0; i < s->naxes[d]; i++) m |= 1u << s->axes[d][i];
    return m;
}

static bool same_dim(const cx_sharding *a, int da, const cx_sharding *b, int db)
{
    if (a->naxes[da] != b->naxes[db] || cx_sharding_blocks(a, da) != cx_sharding_blocks(b, db)) return false;
    for (int i = 0; i < a->naxes[da]; i++) if (a->axes[da][i] != b->axes[db][i]) return false;
    return true;
}

static void set_dim(cx_sharding *dst, int d, const cx_sharding *src, int ds)
{
    dst->naxes[d] = src->naxes[ds];
    memcpy(dst->axes[d], src->axes[ds], sizeof dst->axes[d]);
    dst->blocks[d] = src->naxes[ds] ? src->blocks[ds] : 0;
}

static void clear_dim(cx_sharding *s, int d) { s->naxes[d] = 0; s->blocks[d] = 0; }

/* Dimension d (of global size g) splits without padding: every shard of
 * every block is full, so sums and contractions along it see no garbage. */
static bool even_dim(const cx_sharding *s, int d, int64_t g)
{
    int64_t b = cx_sharding_blocks(s, d);
    return g % b == 0 && (g / b) % cx_sharding_ways(s, d) == 0;
}

static bool blocked(const cx_sharding *s, int d) { return cx_sharding_blocks(s, d) > 1; }

static int emit_reshape(pctx *c, int x, const int64_t *shape, int nd)
{
    cx_gnode p;
    memset(&p, 0, sizeof p);
    p.op = OP_RESHAPE;
    p.dtype = c->nodes[x].dtype;
    p.ndim = (uint8_t)nd;
    p.input_ordinal = -1;
    p.loc = c->nodes[x].loc;
    return emit(c, &p, &x, 1, shape);
}

/* A blocked dimension d of x seen as two, (b, size / b), or merged back. */
static int emit_split_dim(pctx *c, int x, int d, int64_t b)
{
    const cx_gnode *n = &c->nodes[x];
    int64_t shape[CX_MAX_DIMS] = { 0 };
    if (n->ndim + 1 > CX_MAX_DIMS) {
        c->failed = true;
        cx_set_last_error("spmd partition: resharding a blocked split of a rank-%d tensor needs more than %d dimensions",
                          n->ndim, CX_MAX_DIMS);
        return x;
    }
    int e = 0;
    for (int k = 0; k < n->ndim; k++) {
        if (k == d) shape[e++] = b;
        shape[e++] = k == d ? n->shape[k] / b : n->shape[k];
    }
    return emit_reshape(c, x, shape, e);
}

static int emit_merge_dim(pctx *c, int x, int d)
{
    const cx_gnode *n = &c->nodes[x];
    int64_t shape[CX_MAX_DIMS] = { 0 };
    int e = 0;
    for (int k = 0; k < n->ndim; k++) {
        if (k == d + 1) shape[e - 1] *= n->shape[k];
        else shape[e++] = n->shape[k];
    }
    return emit_reshape(c, x, shape, e);
}

/* A blocked dimension is gathered and sliced as its (blocks, part) view,
 * along the part. */
static int gather_dim(pctx *c, int x, cx_sharding *cur, int d, int64_t global)
{
    int gs;
    int64_t gid = cx_mesh_axes_group(cur->mesh, cur->axes[d], cur->naxes[d], &gs);
    if (gid < 0) { c->failed = true; return x; }
    int64_t b = cx_sharding_blocks(cur, d), shape[CX_MAX_DIMS];
    int e = b > 1 ? d + 1 : d;
    if (b > 1) x = emit_split_dim(c, x, d, b);
    memcpy(shape, shape_of(c, x), sizeof shape);
    shape[e] *= gs;
    x = emit_coll(c, OP_ALL_GATHER, x, shape, gid, dim_mask(cur, d), e, 0);
    clear_dim(cur, d);
    x = emit_slice(c, x, e, 0, global / b);   /* the padding of the last shards */
    return b > 1 ? emit_merge_dim(c, x, d) : x;
}

static int slice_dim(pctx *c, int x, const cx_sharding *want, int d, int64_t global)
{
    int64_t b = cx_sharding_blocks(want, d), part = global / b, k = cx_sharding_ways(want, d), local = (part + k - 1) / k;
    int e = b > 1 ? d + 1 : d;
    if (b > 1) x = emit_split_dim(c, x, d, b);
    x = emit_pad_high(c, x, e, local * k - part);
    x = emit_slice(c, x, e, cx_sharding_index(want, d, c->rank) * local, local);
    return b > 1 ? emit_merge_dim(c, x, d) : x;
}

/* Finishes a partial sum: a reduce-scatter into a dimension `want` splits
 * over exactly the partial axes, else an all-reduce. */
static int finish_partial(pctx *c, int x, cx_sharding *cur, const cx_sharding *want, const int64_t *global)
{
    for (int d = 0; d < cur->ndim; d++) {
        if (cur->naxes[d] || dim_mask(want, d) != cur->partial || want->mesh != cur->mesh || blocked(want, d)) continue;
        int gs;
        int64_t gid = cx_mesh_axes_group(cur->mesh, want->axes[d], want->naxes[d], &gs);
        if (gid < 0) { c->failed = true; return x; }
        int64_t local = (global[d] + gs - 1) / gs, shape[CX_MAX_DIMS];
        x = emit_pad_high(c, x, d, local * gs - shape_of(c, x)[d]);
        memcpy(shape, shape_of(c, x), sizeof shape);
        shape[d] = local;
        x = emit_coll(c, OP_REDUCE_SCATTER, x, shape, gid, cur->partial, d, 0);
        set_dim(cur, d, want, d);
        cur->partial = 0;
        return x;
    }
    uint8_t axes[CX_MESH_MAX_DIMS];
    int n = cx_axes_of_mask(cur->partial, axes), gs;
    int64_t gid = cx_mesh_axes_group(cur->mesh, axes, n, &gs);
    if (gid < 0) { c->failed = true; return x; }
    unsigned mask = cur->partial;
    cur->partial = 0;
    return emit_coll(c, OP_ALL_REDUCE, x, shape_of(c, x), gid, mask, 0, 0);
}

/* One dimension's split moves to another over the same axes: an all-to-all,
 * when both divide evenly. */
static int try_all_to_all(pctx *c, int x, cx_sharding *cur, const cx_sharding *want, const int64_t *global)
{
    for (int from = 0; from < cur->ndim; from++) {
        if (!cur->naxes[from] || want->naxes[from] || blocked(cur, from)) continue;
        for (int to = 0; to < cur->ndim; to++) {
            if (to == from || cur->naxes[to] || !same_dim(cur, from, want, to)) continue;
            int64_t k = cx_sharding_ways(cur, from);
            if (global[from] % k || global[to] % k) continue;
            int gs;
            int64_t gid = cx_mesh_axes_group(cur->mesh, cur->axes[from], cur->naxes[from], &gs);
            if (gid < 0) { c->failed = true; return x; }
            int64_t shape[CX_MAX_DIMS];
            memcpy(shape, shape_of(c, x), sizeof shape);
            shape[to] /= gs;
            shape[from] *= gs;
            x = emit_coll(c, OP_ALL_TO_ALL, x, shape, gid, dim_mask(cur, from), to, from);
            set_dim(cur, to, cur, from);
            clear_dim(cur, from);
        }
    }
    return x;
}

static int reshard_uncached(pctx *c, int x, const int64_t *global, cx_sharding cur, const cx_sharding *want)
{
    int nd = cur.ndim;
    if (cur.partial && !(want->partial == cur.partial && want->mesh == cur.mesh))
        x = finish_partial(c, x, &cur, want, global);
    if (cur.mesh != want->mesh && !cx_sharding_is_replicated(&cur)) {
        for (int d = 0; d < nd; d++) if (cur.naxes[d]) x = gather_dim(c, x, &cur, d, global[d]);
    }
    if (cur.mesh == want->mesh) x = try_all_to_all(c, x, &cur, want, global);
    for (int d = 0; d < nd; d++)
        if (cur.naxes[d] && !same_dim(&cur, d, want, d)) x = gather_dim(c, x, &cur, d, global[d]);
    for (int d = 0; d < nd; d++)
        if (want->naxes[d] && !cur.naxes[d]) x = slice_dim(c, x, want, d, global[d]);
    return x;
}

static bool reduce_scatters(const cx_sharding *cur, const cx_sharding *want)
{
    for (int d = 0; d < cur->ndim; d++)
        if (!cur->naxes[d] && dim_mask(want, d) == cur->partial && want->mesh == cur->mesh && !blocked(want, d)) return true;
    return false;
}

static int reshard(pctx *c, int i, const cx_sharding *want);

/* A partial sum moved by a reshape or permute and needed whole: finish it
 * where it was made (one all-reduce, shared by every reader of either
 * form) and repeat the move. */
static int finish_before_move(pctx *c, int i, cx_sharding *cur)
{
    const cx_gnode *x = &c->g->nodes[i];
    int src = x->inputs[0];
    cx_sharding whole = resolved(&c->sh[src]);
    int y = reshard(c, src, &whole);
    cx_gnode p = *x;
    cur->partial = 0;
    return emit(c, &p, &y, 1, c->nodes[c->nw[i]].shape);
}

/* The value of node i (of g) in sharding want: its node in the new graph. */
static int reshard(pctx *c, int i, const cx_sharding *want)
{
    const cx_sharding *cur = &c->sh[i];
    if (cx_sharding_equal(cur, want)) return c->nw[i];
    uint64_t h = cx_sharding_hash(want);
    for (int m = 0; m < 4; m++) if (c->memo[i][m].node >= 0 && c->memo[i][m].hash == h) return c->memo[i][m].node;
    cx_sharding from = *cur;
    int x = c->nw[i], outer = c->moving;
    c->moving = i;
    const cx_gnode *g = &c->g->nodes[i];
    if (from.partial && !want->partial && !reduce_scatters(&from, want) &&
        (g->op == OP_RESHAPE || g->op == OP_PERMUTE) && c->sh[g->inputs[0]].partial == from.partial)
        x = finish_before_move(c, i, &from);
    x = reshard_uncached(c, x, g->shape, from, want);
    c->moving = outer;
    for (int m = 0; m < 4; m++)
        if (c->memo[i][m].node < 0) { c->memo[i][m] = (memo_entry){ h, x }; break; }
    return x;
}

/* ---- the rules ------------------------------------------------------------------------------------ */

static int sharded_dims(const cx_sharding *s)
{
    int n = 0;
    for (int d = 0; d < s->ndim; d++) n += s->naxes[d] > 0;
    return n;
}

/* The mesh the op's output lives on: the first sharded input's. */
static const cx_mesh *op_mesh(const pctx *c, const cx_gnode *x)
{
    for (int k = 0; k < x->ninputs; k++)
        if (!cx_sharding_is_replicated(&c->sh[x->inputs[k]])) return c->sh[x->inputs[k]].mesh;
    return NULL;
}

/* Inputs on another mesh than the op's are taken replicated. */
static cx_sharding on_mesh(const pctx *c, int in, const cx_mesh *mesh)
{
    const cx_sharding *s = &c->sh[in];
    if (s->mesh == mesh || cx_sharding_is_replicated(s)) { cx_sharding r = *s; r.mesh = mesh; return r; }
    return cx_sharding_replicated(mesh, s->ndim);
}

static void rule_fallback(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    for (int k = 0; k < x->ninputs; k++) want[k] = cx_sharding_replicated(NULL, c->g->nodes[x->inputs[k]].ndim);
    *out = cx_sharding_replicated(NULL, x->ndim);
}

/* The partial axes an add or sub may keep: its inputs' partial sums all
 * over the same axes (a whole input joins them on one member of each
 * group, join_partial), every input of the output's rank, and no other
 * reader of a partial input (one that needs it whole would finish it
 * anyway, and the sum would then be finished twice). 0: none. */
static uint8_t linear_partial(const pctx *c, const cx_gnode *x, const cx_mesh *mesh)
{
    if ((x->op != OP_ADD && x->op != OP_SUB) || !mesh || !c->have_uses) return 0;
    uint8_t mask = 0;
    for (int k = 0; k < x->ninputs; k++) {
        int in = x->inputs[k];
        const cx_sharding *s = &c->sh[in];
        if (c->g->nodes[in].ndim != x->ndim) return 0;
        if (!s->partial) continue;
        if (s->mesh != mesh || (mask && s->partial != mask) || c->uses.count[in] != 1 || c->uses.is_output[in]) return 0;
        mask = s->partial;
    }
    return mask;
}

static void rule_elementwise(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    const cx_mesh *mesh = op_mesh(c, x);
    *out = cx_sharding_replicated(mesh, x->ndim);
    for (int k = 0; k < x->ninputs; k++) {
        cx_sharding s = resolved(&c->sh[x->inputs[k]]);
        if (s.ndim == x->ndim && s.mesh == mesh && sharded_dims(&s) > sharded_dims(out)) *out = s;
    }
    uint8_t partial = linear_partial(c, x, mesh);
    for (int k = 0; k < x->ninputs; k++) {
        want[k] = c->g->nodes[x->inputs[k]].ndim == x->ndim ? *out : cx_sharding_replicated(mesh, c->g->nodes[x->inputs[k]].ndim);
        if (c->sh[x->inputs[k]].partial) want[k].partial = partial;
    }
    out->partial = partial;
}

/* A whole input of an add or sub that keeps a partial sum: only the first
 * member of each partial group adds it, the others add it times zero, so
 * the sum over the group counts it once. Times one or zero, not zeros in
 * its place: every rank's graph keeps the input's subgraph as a reader
 * would, so the schedule (which places collectives by their readers)
 * issues the same collectives in the same order on every rank. */
static int join_partial(pctx *c, int x, const cx_sharding *out)
{
    uint8_t axes[CX_MESH_MAX_DIMS];
    int coords[CX_MESH_MAX_DIMS], n = cx_axes_of_mask(out->partial, axes);
    if (!cx_mesh_coords(out->mesh, c->rank, coords)) return x;
    bool first = true;
    for (int i = 0; i < n; i++) first = first && coords[axes[i]] == 0;
    const cx_gnode *v = &c->nodes[x];
    int64_t shape[CX_MAX_DIMS], ones[CX_MAX_DIMS];
    int nd = v->ndim;
    memcpy(shape, v->shape, sizeof shape);
    for (int d = 0; d < CX_MAX_DIMS; d++) ones[d] = 1;
    cx_gnode z;
    memset(&z, 0, sizeof z);
    z.op = OP_CONST;
    z.dtype = v->dtype;
    z.fval = first ? 1.0 : 0.0;
    z.input_ordinal = -1;
    z.loc = v->loc; /* the value it keeps: where that was made */
    int k = emit(c, &z, NULL, 0, shape);
    if (nd) {
        k = emit_reshape(c, k, ones, nd);
        z.op = OP_EXPAND;
        z.ndim = (uint8_t)nd;
        k = emit(c, &z, &k, 1, shape);
    }
    z.op = OP_MUL;
    z.ndim = (uint8_t)nd;
    int ins[2] = { x, k };
    return emit(c, &z, ins, 2, shape);
}

/* Sums keep a split reduced dimension as a partial sum; maxima and padded
 * dimensions gather it first. */
static void rule_reduce(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    int in = x->inputs[0];
    const int64_t *g = c->g->nodes[in].shape;
    uint64_t mask = (uint64_t)CX_ATTR(x, CX_AT_REDUCE_MASK);
    want[0] = x->op == OP_REDUCE_SUM ? c->sh[in] : resolved(&c->sh[in]);
    *out = want[0];
    for (int d = 0; d < x->ndim; d++) {
        if (!(mask >> d & 1) || !want[0].naxes[d]) continue;
        if (x->op == OP_REDUCE_SUM && even_dim(&want[0], d, g[d])) out->partial |= (uint8_t)dim_mask(&want[0], d);
        else clear_dim(&want[0], d);
        clear_dim(out, d);
    }
}

/* The output dimension a split input dimension d (k ways) becomes under a
 * reshape, or -1 when the split does not survive it. It survives when an
 * output dimension starts at the same element and both divide by the
 * split: then every shard is the same contiguous run of each block on
 * both sides. */
static int reshape_target_dim(const int64_t *in, int d, int64_t k, const int64_t *out, int out_nd)
{
    if (in[d] % k) return -1;
    int64_t before = 1, prefix = 1;
    for (int j = 0; j < d; j++) before *= in[j];
    for (int j = 0; j < out_nd && prefix <= before; j++) {
        if (prefix == before && out[j] % k == 0 && out[j] > 1) return j;
        prefix *= out[j];
    }
    return -1;
}

/* The same for any split of s's dimension d: a blocked one survives only
 * into an output dimension of the same size starting at the same element
 * (every block then lands where it was). */
static int reshape_target(const cx_sharding *s, const int64_t *in, int d, const int64_t *out, int out_nd)
{
    int e = reshape_target_dim(in, d, cx_sharding_ways(s, d), out, out_nd);
    if (e < 0 || !blocked(s, d)) return e;
    return out[e] == in[d] && even_dim(s, d, in[d]) ? e : -1;
}

static void rule_reshape(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    int in = x->inputs[0];
    const cx_gnode *src = &c->g->nodes[in];
    want[0] = c->sh[in];
    *out = cx_sharding_replicated(want[0].mesh, x->ndim);
    out->partial = want[0].partial;
    for (int d = 0; d < src->ndim; d++) {
        if (!want[0].naxes[d]) continue;
        int e = reshape_target(&want[0], src->shape, d, x->shape, x->ndim);
        if (e < 0) clear_dim(&want[0], d);
        else set_dim(out, e, &want[0], d);
    }
}

static void rule_permute(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    want[0] = c->sh[x->inputs[0]];
    *out = want[0];
    for (int e = 0; e < x->ndim; e++) set_dim(out, e, &want[0], (int)CX_ATTR(x, CX_AT_PERM(e)));
}

static void rule_expand(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    int in = x->inputs[0];
    want[0] = resolved(&c->sh[in]);
    for (int d = 0; d < x->ndim; d++) if (c->g->nodes[in].shape[d] != x->shape[d]) clear_dim(&want[0], d);
    *out = want[0];
}

/* Slice, pad and concat need their axis whole, except where blocks meet
 * whole parts: a slice of one whole block of a blocked split is that
 * block's plain split (at a rank-local offset, localize_attrs), and a pad
 * by whole parts around an even split, or a concat of equal evenly split
 * parts, is a blocked split (the backward of the slice, and q|k|v joined). */
static bool slice_takes_block(const pctx *c, const cx_gnode *x, const cx_sharding *s)
{
    int ax = (int)CX_ATTR(x, CX_AT_SLICE_AXIS);
    int64_t g = c->g->nodes[x->inputs[0]].shape[ax], part = g / cx_sharding_blocks(s, ax);
    return blocked(s, ax) && even_dim(s, ax, g) && CX_ATTR(x, CX_AT_SLICE_STEP) == 1 &&
           CX_ATTR(x, CX_AT_SLICE_START) % part == 0 && x->shape[ax] == part;
}

/* The blocks a pad of dimension d makes of an even plain split, or 0. */
static int pad_blocks(const pctx *c, const cx_gnode *x, const cx_sharding *s, int d)
{
    int nd = x->ndim;
    int64_t n = c->g->nodes[x->inputs[0]].shape[d], lo = CX_ATTR(x, CX_AT_PAD_LO(nd, d)), hi = CX_ATTR(x, CX_AT_PAD_HI(nd, d));
    if (!s->naxes[d] || blocked(s, d) || !even_dim(s, d, n) || CX_ATTR(x, CX_AT_PAD_INTERIOR(nd, d)) || lo < 0 || hi < 0 ||
        lo % n || hi % n)
        return 0;
    int64_t b = x->shape[d] / n;
    return b > 1 && b <= 255 ? (int)b : 0;
}

static int concat_blocks(const pctx *c, const cx_gnode *x, const cx_sharding *s, int ax)
{
    int64_t n = c->g->nodes[x->inputs[0]].shape[ax];
    if (!s->naxes[ax] || blocked(s, ax) || !even_dim(s, ax, n) || x->ninputs > 255) return 0;
    for (int k = 1; k < x->ninputs; k++) {
        const cx_sharding *t = &c->sh[x->inputs[k]];
        if (c->g->nodes[x->inputs[k]].shape[ax] != n || t->mesh != s->mesh || !same_dim(t, ax, s, ax)) return 0;
    }
    return x->ninputs;
}

static void rule_slice_pad_concat(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    cx_sharding s = resolved(&c->sh[x->inputs[0]]);
    *out = s;
    if (x->op == OP_SLICE) {
        int ax = (int)CX_ATTR(x, CX_AT_SLICE_AXIS);
        if (slice_takes_block(c, x, &s)) out->blocks[ax] = 0;
        else { clear_dim(&s, ax); *out = s; }
    }
    if (x->op == OP_CONCAT) {
        int ax = (int)CX_ATTR(x, CX_AT_AXIS), b = concat_blocks(c, x, &s, ax);
        if (b) out->blocks[ax] = (uint8_t)b;
        else { clear_dim(&s, ax); *out = s; }
    }
    for (int d = 0; x->op == OP_PAD && d < x->ndim; d++) {
        if (!CX_ATTR(x, CX_AT_PAD_LO(x->ndim, d)) && !CX_ATTR(x, CX_AT_PAD_HI(x->ndim, d)) &&
            !CX_ATTR(x, CX_AT_PAD_INTERIOR(x->ndim, d)))
            continue;
        int b = pad_blocks(c, x, &s, d);
        if (b) out->blocks[d] = (uint8_t)b;
        else { clear_dim(&s, d); clear_dim(out, d); }
    }
    for (int k = 0; k < x->ninputs; k++) want[k] = s;
}

/* (..., M, K) @ (..., K, N): batch, row and column splits carry over; a
 * split K (evenly) leaves a partial sum. Each mesh axis splits one
 * dimension of the output at most. */
static void rule_matmul(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    const cx_mesh *mesh = op_mesh(c, x);
    cx_sharding a = on_mesh(c, x->inputs[0], mesh), b = on_mesh(c, x->inputs[1], mesh);
    a.partial = b.partial = 0;
    int nd = x->ndim, M = nd - 2, KA = nd - 1, KB = nd - 2, NB = nd - 1;
    cx_sharding wa = cx_sharding_replicated(mesh, nd), wb = wa;
    *out = wa;
    unsigned used = 0;
    for (int d = 0; d < M; d++) {
        const cx_sharding *src = a.naxes[d] ? &a : &b;
        if (dim_mask(src, d) & used) continue;
        set_dim(&wa, d, src, d); set_dim(&wb, d, src, d); set_dim(out, d, src, d);
        used |= dim_mask(src, d);
    }
    if (!(dim_mask(&a, M) & used)) { set_dim(&wa, M, &a, M); set_dim(out, M, &a, M); used |= dim_mask(&a, M); }
    if (!(dim_mask(&b, NB) & used)) { set_dim(&wb, NB, &b, NB); set_dim(out, NB, &b, NB); used |= dim_mask(&b, NB); }
    const cx_sharding *ks = a.naxes[KA] ? &a : &b;
    int kd = a.naxes[KA] ? KA : KB;
    int64_t K = c->g->nodes[x->inputs[0]].shape[KA];
    if (ks->naxes[kd] && !(dim_mask(ks, kd) & used) && even_dim(ks, kd, K)) {
        set_dim(&wa, KA, ks, kd);
        set_dim(&wb, KB, ks, kd);
        out->partial = (uint8_t)dim_mask(ks, kd);
    }
    want[0] = wa;
    want[1] = wb;
}

/* conv2d: batch and output-channel splits; its gradients follow (a split
 * output channel is the input gradient's reduced dimension, the batch the
 * weight gradient's). */
static void rule_conv(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    const cx_mesh *mesh = op_mesh(c, x);
    cx_sharding p = on_mesh(c, x->inputs[0], mesh), q = on_mesh(c, x->inputs[1], mesh);
    p.partial = q.partial = 0;
    cx_sharding wp = cx_sharding_replicated(mesh, 4), wq = wp;
    *out = wp;
    bool groups1 = x->op != OP_CONV2D || CX_ATTR(x, CX_AT_CONV_GROUPS) == 1;
    if (x->op == OP_CONV2D) {            /* x (N, C, H, W), w (O, C, KH, KW) */
        set_dim(&wp, 0, &p, 0); set_dim(out, 0, &p, 0);
        if (groups1 && !(dim_mask(&q, 0) & dim_mask(&p, 0))) { set_dim(&wq, 0, &q, 0); set_dim(out, 1, &q, 0); }
    } else if (x->op == OP_CONV2D_BWD_INPUT) {   /* g (N, O, H', W'), w (O, C, KH, KW) -> (N, C, H, W) */
        set_dim(&wp, 0, &p, 0); set_dim(out, 0, &p, 0);
        const cx_sharding *os = p.naxes[1] ? &p : &q;
        int od = p.naxes[1] ? 1 : 0;
        int64_t O = c->g->nodes[x->inputs[1]].shape[0];
        if (groups1 && os->naxes[od] && !(dim_mask(os, od) & dim_mask(&p, 0)) && even_dim(os, od, O)) {
            set_dim(&wp, 1, os, od); set_dim(&wq, 0, os, od);
            out->partial = (uint8_t)dim_mask(os, od);
        }
    } else {                             /* x (N, C, H, W), g (N, O, H', W') -> (O, C, KH, KW) */
        const cx_sharding *bs = p.naxes[0] ? &p : &q;
        int64_t N = c->g->nodes[x->inputs[0]].shape[0];
        if (bs->naxes[0] && even_dim(bs, 0, N)) {
            set_dim(&wp, 0, bs, 0); set_dim(&wq, 0, bs, 0);
            out->partial = (uint8_t)dim_mask(bs, 0);
        }
        if (groups1 && q.naxes[1] && !(dim_mask(&q, 1) & out->partial)) { set_dim(&wq, 1, &q, 1); set_dim(out, 0, &q, 1); }
    }
    want[0] = wp;
    want[1] = wq;
}

/* Pools and their gradients work per (N, C) plane. */
static void rule_pool(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    cx_sharding s = resolved(&c->sh[x->inputs[0]]);
    for (int k = 1; k < x->ninputs; k++)
        if (sharded_dims(&c->sh[x->inputs[k]]) > sharded_dims(&s)) s = resolved(&c->sh[x->inputs[k]]);
    clear_dim(&s, 2);
    clear_dim(&s, 3);
    for (int k = 0; k < x->ninputs; k++) want[k] = s;
    *out = s;
}

/* layer_norm(x, weight, bias) normalizes the last dimension. */
static void rule_layer_norm(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    cx_sharding s = resolved(&c->sh[x->inputs[0]]);
    clear_dim(&s, x->ndim - 1);
    want[0] = s;
    for (int k = 1; k < x->ninputs; k++) want[k] = cx_sharding_replicated(s.mesh, c->g->nodes[x->inputs[k]].ndim);
    *out = s;
}

/* attention (q (N, T, H, D), k and v (N, S, H, D)): batches and heads are
 * independent, so their splits carry over; T, S and D are not split. */
static void rule_attention(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    cx_sharding s = resolved(&c->sh[x->inputs[0]]);
    clear_dim(&s, 1);
    clear_dim(&s, 3);
    for (int k = 0; k < x->ninputs; k++) want[k] = s;
    *out = s;
}

/* gather(src, axis, index): out[.., i, ..] = src[.., index[.., i, ..], ..]
 * along axis: every other dimension goes with the index's, and src's axis
 * stays whole; the index's own split (the axis included) carries over. */
static void rule_gather(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    int ax = (int)CX_ATTR(x, CX_AT_AXIS), src = x->inputs[0], idx = x->inputs[1];
    cx_sharding s = resolved(&c->sh[idx]);
    if (cx_sharding_is_replicated(&s)) { s = on_mesh(c, src, c->sh[src].mesh); s.partial = 0; clear_dim(&s, ax); }
    const int64_t *g = c->g->nodes[idx].shape;
    for (int d = 0; d < s.ndim; d++)
        if (s.naxes[d] && !even_dim(&s, d, g[d])) clear_dim(&s, d);
    want[1] = s;
    want[0] = s;
    clear_dim(&want[0], ax);
    *out = s;
}

static bool is_zero_const(const pctx *c, int i)
{
    const cx_gnode *x = &c->g->nodes[i];
    while (x->op == OP_EXPAND || x->op == OP_RESHAPE) x = &c->g->nodes[x->inputs[0]];
    return x->op == OP_CONST && x->fval == 0.0;
}

/* scatter_add(zeros, axis, index, src) (gather's gradient): each rank adds
 * its own updates into zeros, so an index split along the axis leaves a
 * partial sum; the other dimensions go with the index's. Any other base
 * is added whole. */
static void rule_scatter_add(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    int ax = (int)CX_ATTR(x, CX_AT_AXIS), base = x->inputs[0], idx = x->inputs[1];
    const cx_gnode *gi = &c->g->nodes[idx];
    bool same_outside = gi->ndim == x->ndim;
    for (int d = 0; same_outside && d < x->ndim; d++) same_outside = d == ax || gi->shape[d] == x->shape[d];
    if (!is_zero_const(c, base) || !same_outside) { rule_fallback(c, x, want, out); return; }
    cx_sharding s = resolved(&c->sh[idx]);
    for (int d = 0; d < s.ndim; d++)
        if (s.naxes[d] && !even_dim(&s, d, gi->shape[d])) clear_dim(&s, d);
    want[1] = want[2] = s;
    *out = s;
    clear_dim(out, ax);
    out->partial = (uint8_t)dim_mask(&s, ax);
    want[0] = *out;
    want[0].partial = 0;
}

static void apply_rule(const pctx *c, const cx_gnode *x, cx_sharding *want, cx_sharding *out)
{
    switch (cx_op_table[x->op].group) {
    case G_UNARY: case G_BINARY: case G_TERNARY: rule_elementwise(c, x, want, out); return;
    default: break;
    }
    switch ((cx_op)x->op) {
    case OP_REDUCE_SUM: case OP_REDUCE_MAX: rule_reduce(c, x, want, out); return;
    case OP_RESHAPE: rule_reshape(c, x, want, out); return;
    case OP_PERMUTE: rule_permute(c, x, want, out); return;
    case OP_EXPAND: rule_expand(c, x, want, out); return;
    case OP_SLICE: case OP_PAD: case OP_CONCAT: rule_slice_pad_concat(c, x, want, out); return;
    case OP_MATMUL: rule_matmul(c, x, want, out); return;
    case OP_CONV2D: case OP_CONV2D_BWD_INPUT: case OP_CONV2D_BWD_WEIGHT: rule_conv(c, x, want, out); return;
    case OP_MAXPOOL: case OP_AVGPOOL: case OP_MAXPOOL_BWD: case OP_AVGPOOL_BWD: rule_pool(c, x, want, out); return;
    case OP_LAYER_NORM: rule_layer_norm(c, x, want, out); return;
    case OP_ATTENTION: rule_attention(c, x, want, out); return;
    case OP_GATHER: rule_gather(c, x, want, out); return;
    case OP_SCATTER_ADD: rule_scatter_add(c, x, want, out); return;
    default: rule_fallback(c, x, want, out); return;
    }
}


/* ---- packed gradients ---------------------------------------------------------------------------
 * attention's and layer_norm's backward ops write every input's gradient
 * into one flat output that the VJPs cut apart with slices (and reshape).
 * Split over batches (and heads), each rank can compute its own packed
 * output, whose parts are its local gradients: the slices then take local
 * offsets, and each part gets its gradient's sharding (layer_norm's weight
 * and bias gradients: partial sums). Used only when every reader of the
 * packed value is a slice of one whole part and every reader of a
 * multi-dimensional part is a reshape that keeps the split. */

typedef struct packed_info {
    int nparts;
    int64_t gstart[3], gcount[3], lstart[3], lcount[3];
    int nd[3];
    int64_t gshape[3][CX_MAX_DIMS];
    cx_sharding sh[3];
} packed_info;

static bool is_packed_op(int op) { return op == OP_ATTENTION_BWD || op == OP_LAYER_NORM_BWD; }

/* The global parts of packed node i: offsets, counts and shapes. */
static void packed_parts(const pctx *c, int i, packed_info *pk)
{
    const cx_gnode *x = &c->g->nodes[i];
    const cx_gnode *a = &c->g->nodes[x->inputs[0]], *b = &c->g->nodes[x->inputs[1]];
    memset(pk, 0, sizeof *pk);
    pk->nparts = 3;
    for (int p = 0; p < 3; p++) {
        /* attention: dq like q, dk and dv like k; layer_norm: dx like x, dw and db like its last dimension */
        const cx_gnode *src = p == 0 || x->op == OP_LAYER_NORM_BWD ? a : b;
        bool vec = x->op == OP_LAYER_NORM_BWD && p > 0;
        pk->nd[p] = vec ? 1 : src->ndim;
        if (vec) pk->gshape[p][0] = src->shape[src->ndim - 1];
        else memcpy(pk->gshape[p], src->shape, sizeof pk->gshape[p]);
        pk->gcount[p] = cx_shape_numel(pk->gshape[p], pk->nd[p]);
        if (p) pk->gstart[p] = pk->gstart[p - 1] + pk->gcount[p - 1];
    }
}

static int part_of_slice(const packed_info *pk, const cx_gnode *sl)
{
    for (int q = 0; sl->op == OP_SLICE && q < pk->nparts; q++)
        if (CX_ATTR(sl, CX_AT_SLICE_START) == pk->gstart[q] && sl->shape[0] == pk->gcount[q] &&
            CX_ATTR(sl, CX_AT_SLICE_STEP) == 1)
            return q;
    return -1;
}

/* Which packed nodes are read only through whole-part slices (a
 * multi-dimensional part only through reshapes, and not as an output).
 * @return false when out of memory. */
static bool plan_packed(pctx *c)
{
    const cx_uses *u = &c->uses;
    for (int i = 0; i < c->g->n; i++) {
        if (!is_packed_op(c->g->nodes[i].op) || u->is_output[i]) continue;
        packed_info pk;
        packed_parts(c, i, &pk);
        bool ok = true;
        for (int r = 0; ok && r < u->count[i]; r++) {
            int sl = u->list[i][r], p = part_of_slice(&pk, &c->g->nodes[sl]);
            ok = p >= 0 && (pk.nd[p] == 1 || !u->is_output[sl]);
            for (int r2 = 0; ok && pk.nd[p] > 1 && r2 < u->count[sl]; r2++)
                ok = c->g->nodes[u->list[sl][r2]].op == OP_RESHAPE;
        }
        c->packed_ok[i] = ok;
    }
    return true;
}

/* The sharding of the packed op's inputs, or false when the op should run
 * whole: nothing split; layer_norm with a padded split (its weight
 * gradients would sum the padding); a reshape of a part that loses a split. */
static bool packed_sharding(const pctx *c, int i, cx_sharding *s)
{
    const cx_gnode *x = &c->g->nodes[i];
    *s = resolved(&c->sh[x->inputs[0]]);
    if (x->op == OP_ATTENTION_BWD) { clear_dim(s, 1); clear_dim(s, 3); }
    else clear_dim(s, s->ndim - 1);
    if (cx_sharding_is_replicated(s)) return false;
    const int64_t *g = c->g->nodes[x->inputs[0]].shape;
    for (int d = 0; x->op == OP_LAYER_NORM_BWD && d < s->ndim; d++)
        if (s->naxes[d] && g[d] % cx_sharding_ways(s, d)) return false;
    packed_info pk;
    packed_parts(c, i, &pk);
    const cx_uses *u = &c->uses;
    for (int r = 0; r < u->count[i]; r++) {
        int sl = u->list[i][r], p = part_of_slice(&pk, &c->g->nodes[sl]);
        for (int r2 = 0; pk.nd[p] > 1 && r2 < u->count[sl]; r2++) {
            const cx_gnode *rs = &c->g->nodes[u->list[sl][r2]];
            for (int d = 0; d < s->ndim; d++)
                if (s->naxes[d] && reshape_target_dim(pk.gshape[p], d, cx_sharding_ways(s, d), rs->shape, rs->ndim) < 0)
                    return false;
        }
    }
    return true;
}

static bool partition_packed(pctx *c, int i)
{
    const cx_gnode *x = &c->g->nodes[i];
    cx_sharding s;
    if (!packed_sharding(c, i, &s)) return false;
    packed_info *pk = calloc(1, sizeof *pk);
    if (!pk) { c->failed = true; cx_set_last_error("spmd partition: out of memory"); return true; }
    packed_parts(c, i, pk);
    unsigned summed = 0;
    for (int d = 0; d < s.ndim; d++) summed |= dim_mask(&s, d);
    int ins[5];
    for (int k = 0; k < x->ninputs && k < 5; k++) {
        const cx_gnode *in = &c->g->nodes[x->inputs[k]];
        cx_sharding w = in->ndim == s.ndim ? s : cx_sharding_replicated(s.mesh, in->ndim);   /* layer_norm's weight */
        ins[k] = reshard(c, x->inputs[k], &w);
    }
    int64_t total = 0;
    for (int p = 0; p < pk->nparts; p++) {
        bool whole_grad = pk->nd[p] == s.ndim;
        pk->sh[p] = whole_grad ? s : cx_sharding_replicated(s.mesh, pk->nd[p]);
        if (!whole_grad) pk->sh[p].partial = (uint8_t)summed;
        int64_t local[CX_MAX_DIMS];
        memcpy(local, pk->gshape[p], sizeof local);
        cx_sharding_local_shape(&pk->sh[p], pk->gshape[p], local);
        pk->lstart[p] = total;
        pk->lcount[p] = cx_shape_numel(local, pk->nd[p]);
        total += pk->lcount[p];
    }
    c->nw[i] = emit(c, x, ins, x->ninputs, &total);
    c->sh[i] = cx_sharding_replicated(NULL, 1);   /* a local layout only its slices read */
    c->packed[i] = pk;
    return true;
}

/* A slice of a locally packed value: the local part. A multi-dimensional
 * part is only reshaped next (partition_flat). */
static void partition_part(pctx *c, int i)
{
    const cx_gnode *x = &c->g->nodes[i];
    const packed_info *pk = c->packed[x->inputs[0]];
    int p = part_of_slice(pk, x);
    cx_gnode q = *x;
    q.attrs[CX_AT_SLICE_START] = pk->lstart[p];
    c->nw[i] = emit(c, &q, &c->nw[x->inputs[0]], 1, &pk->lcount[p]);
    if (pk->nd[p] > 1) {
        c->sh[i] = cx_sharding_replicated(NULL, 1);
        c->flat_src[i] = x->inputs[0];
        c->flat_part[i] = p;
    } else {
        c->sh[i] = pk->sh[p];
    }
}

/* The reshape of a local multi-dimensional part: the part's sharding
 * carried through the reshape (packed_sharding checked that it survives). */
static void partition_flat(pctx *c, int i)
{
    const cx_gnode *x = &c->g->nodes[i];
    int src = c->flat_src[x->inputs[0]], p = c->flat_part[x->inputs[0]];
    const packed_info *pk = c->packed[src];
    cx_sharding out = cx_sharding_replicated(pk->sh[p].mesh, x->ndim);
    for (int d = 0; d < pk->nd[p]; d++)
        if (pk->sh[p].naxes[d])
            set_dim(&out, reshape_target_dim(pk->gshape[p], d, cx_sharding_ways(&pk->sh[p], d), x->shape, x->ndim),
                    &pk->sh[p], d);
    int64_t local[CX_MAX_DIMS];
    memcpy(local, x->shape, sizeof local);
    cx_sharding_local_shape(&out, x->shape, local);
    c->nw[i] = emit(c, x, &c->nw[x->inputs[0]], 1, local);
    c->sh[i] = out;
}

/* @return true when node i was one of the packed forms above (done). */
static bool partition_packed_forms(pctx *c, int i)
{
    const cx_gnode *x = &c->g->nodes[i];
    if (c->packed_ok[i] && partition_packed(c, i)) return true;
    if (x->op == OP_SLICE && c->packed[x->inputs[0]]) { partition_part(c, i); return true; }
    if (x->op == OP_RESHAPE && c->flat_src[x->inputs[0]] >= 0) { partition_flat(c, i); return true; }
    return false;
}

/* ---- the pass ------------------------------------------------------------------------------------- */

/* Attributes that carry a shape the op cannot see from its inputs, and the
 * offsets of slices and pads that meet blocks (rule_slice_pad_concat):
 * whole parts of the global value are whole pieces of the local one. */
static void localize_attrs(cx_gnode *p, const int64_t *local, const cx_sharding *in, const cx_sharding *out)
{
    if (p->op == OP_CONV2D_BWD_INPUT || p->op == OP_CONV2D_BWD_WEIGHT)
        for (int d = 0; d < 4; d++) p->attrs[CX_AT_CONV_SHAPE + d] = local[d];
    if (p->op == OP_AVGPOOL_BWD)
        for (int d = 0; d < 4; d++) p->attrs[CX_AT_POOL_SHAPE + d] = local[d];
    if (p->op == OP_SLICE) {
        int ax = (int)p->attrs[CX_AT_SLICE_AXIS];
        if (blocked(in, ax) && !blocked(out, ax)) p->attrs[CX_AT_SLICE_START] = p->attrs[CX_AT_SLICE_START] / p->shape[ax] * local[ax];
    }
    for (int d = 0; p->op == OP_PAD && d < p->ndim; d++) {
        if (!blocked(out, d) || blocked(in, d)) continue;
        int64_t part = p->shape[d] / out->blocks[d], piece = local[d] / out->blocks[d];
        p->attrs[CX_AT_PAD_LO(p->ndim, d)] = p->attrs[CX_AT_PAD_LO(p->ndim, d)] / part * piece;
        p->attrs[CX_AT_PAD_HI(p->ndim, d)] = p->attrs[CX_AT_PAD_HI(p->ndim, d)] / part * piece;
    }
}

static bool partition_node(pctx *c, int i)
{
    const cx_gnode *x = &c->g->nodes[i];
    int64_t local[CX_MAX_DIMS];
    if (cx_op_table[x->op].group == G_COLLECTIVE) {
        cx_set_last_error("spmd partition: a graph with sharded tensors cannot also hold an explicit %s",
                          cx_op_table[x->op].name);
        return false;
    }
    if (partition_packed_forms(c, i)) return !c->failed;
    if (x->ninputs == 0) {
        const cx_sharding *a = x->op == OP_DATA ? c->ann[i] : NULL;
        c->sh[i] = a ? *a : cx_sharding_replicated(NULL, x->ndim);
        memcpy(local, x->shape, sizeof local);
        if (a) cx_sharding_local_shape(a, x->shape, local);
        c->nw[i] = emit(c, x, NULL, 0, local);
        return !c->failed;
    }
    cx_sharding want_small[4], *want = x->ninputs <= 4 ? want_small : malloc(sizeof *want * (size_t)x->ninputs);
    int ins_small[4], *ins = x->ninputs <= 4 ? ins_small : malloc(sizeof(int) * (size_t)x->ninputs);
    if (!want || !ins) {
        if (want != want_small) free(want);
        if (ins != ins_small) free(ins);
        cx_set_last_error("spmd partition: out of memory");
        return false;
    }
    cx_sharding out;
    apply_rule(c, x, want, &out);
    for (int k = 0; k < x->ninputs; k++) ins[k] = reshard(c, x->inputs[k], &want[k]);
    for (int k = 0; out.partial && (x->op == OP_ADD || x->op == OP_SUB) && k < x->ninputs; k++)
        if (!want[k].partial) ins[k] = join_partial(c, ins[k], &out);
    memcpy(local, x->shape, sizeof local);
    cx_sharding_local_shape(&out, x->shape, local);
    cx_gnode p = *x;
    localize_attrs(&p, local, &want[0], &out);
    c->nw[i] = emit(c, &p, ins, x->ninputs, local);
    c->sh[i] = out;
    if (want != want_small) free(want);
    if (ins != ins_small) free(ins);
    if (c->ann[i] && !c->failed) {   /* an annotation: the value is resharded here */
        int x2 = reshard(c, i, c->ann[i]);
        c->nw[i] = x2;
        c->sh[i] = *c->ann[i];
        for (int m = 0; m < 4; m++) c->memo[i][m].node = -1;
    }
    return !c->failed;
}

static void pctx_free(pctx *c)
{
    free(c->nodes); free(c->ins); free(c->in_off); free(c->nw); free(c->sh); free(c->memo);
    for (int i = 0; c->packed && i < c->g->n; i++) free(c->packed[i]);
    free(c->packed); free(c->packed_ok); free(c->flat_src); free(c->flat_part);
    if (c->have_uses) cx_uses_free(c->g, &c->uses);
}

/* The notes keep every node's sharding (the collectives were noted as
 * they were made). */
static bool keep_notes(pctx *c)
{
    if (!c->notes) return true;
    c->notes->n = c->g->n;
    c->notes->sh = malloc(sizeof *c->notes->sh * (size_t)(c->g->n + 1));
    if (!c->notes->sh) { cx_set_last_error("spmd partition: out of memory"); return false; }
    memcpy(c->notes->sh, c->sh, sizeof *c->sh * (size_t)c->g->n);
    return true;
}

/* Each input ordinal's data node (-1: none), for the outputs' donors. @return NULL when out of memory. */
static int *data_nodes(const cx_graph *g)
{
    int *at = malloc(sizeof(int) * (size_t)(g->n_inputs + 1));
    for (int k = 0; at && k < g->n_inputs; k++) at[k] = -1;
    for (int i = 0; at && i < g->n; i++)
        if (g->nodes[i].op == OP_DATA && g->nodes[i].input_ordinal >= 0 && g->nodes[i].input_ordinal < g->n_inputs)
            at[g->nodes[i].input_ordinal] = i;
    return at;
}

bool cx_pass_partition(const cx_graph *g, const cx_sharding *const *ann, int rank, cx_graph *out,
                       cx_sharding *out_sharding, int *inserted, cx_spmd_notes *notes)
{
    pctx c = { .g = g, .ann = ann, .rank = rank, .notes = notes, .moving = -1 };
    if (notes) memset(notes, 0, sizeof *notes);
    memset(out, 0, sizeof *out);
    c.nw = malloc(sizeof(int) * (size_t)(g->n + 1));
    c.sh = malloc(sizeof *c.sh * (size_t)(g->n + 1));
    c.memo = malloc(sizeof *c.memo * (size_t)(g->n + 1));
    c.packed_ok = calloc((size_t)g->n + 1, 1);
    c.packed = calloc((size_t)g->n + 1, sizeof *c.packed);
    c.flat_src = malloc(sizeof(int) * (size_t)(g->n + 1));
    c.flat_part = malloc(sizeof(int) * (size_t)(g->n + 1));
    c.have_uses = cx_uses_build(g, &c.uses);
    out->outputs = malloc(sizeof(int) * (size_t)(g->n_outputs + 1));
    out->out_alias = malloc(sizeof(int) * (size_t)(g->n_outputs + 1));
    if (!c.nw || !c.sh || !c.memo || !c.packed_ok || !c.packed || !c.flat_src || !c.flat_part || !c.have_uses ||
        !out->outputs || !out->out_alias || !plan_packed(&c)) {
        pctx_free(&c); cx_graph_release(out);
        cx_set_last_error("spmd partition: out of memory");
        return false;
    }
    for (int i = 0; i < g->n; i++) {
        for (int m = 0; m < 4; m++) c.memo[i][m].node = -1;
        c.flat_src[i] = -1;
    }
    bool ok = true;
    for (int i = 0; ok && i < g->n; i++) ok = partition_node(&c, i);
    /* outputs: partial sums finished; a sharded output keeps its shard */
    int *donor = ok ? data_nodes(g) : NULL;
    if (ok && !donor) { cx_set_last_error("spmd partition: out of memory"); ok = false; }
    for (int o = 0; ok && o < g->n_outputs; o++) {
        int i = g->outputs[o];
        cx_sharding s = resolved(&c.sh[i]);
        out->outputs[o] = reshard(&c, i, &s);
        out_sharding[o] = s;
        /* a donor's buffer holds its own shard: only the same shard may take it */
        int dn = g->out_alias[o] >= 0 ? donor[g->out_alias[o]] : -1;
        bool same = dn >= 0 && cx_sharding_equal(&c.sh[dn], &s);   /* replicated equals replicated only */
        out->out_alias[o] = same ? g->out_alias[o] : -1;
        ok = !c.failed;
    }
    free(donor);
    if (ok) ok = keep_notes(&c);
    if (!ok) {
        pctx_free(&c);
        cx_graph_release(out);
        /* the caller owns the notes themselves (and frees them) */
        if (notes) { free(notes->sh); free(notes->coll); memset(notes, 0, sizeof *notes); }
        return false;
    }
    out->n = c.n;
    out->nodes = c.nodes;
    out->input_storage = c.ins;
    for (int k = 0; k < c.n; k++) out->nodes[k].inputs = c.ins + c.in_off[k];
    out->n_inputs = g->n_inputs;
    out->n_rts = g->n_rts;
    out->n_outputs = g->n_outputs;
    memcpy(inserted, c.inserted, sizeof c.inserted);
    c.nodes = NULL;
    c.ins = NULL;
    pctx_free(&c);
    return true;
}
