/* The executable's serialized form, and the rules every field must meet.
 * The persistent cache (obs/disk_cache.c) stores this form and reads it back
 * from files it cannot trust: every slot, register, view, input/output index
 * and count is range-checked, and the element ranges each program and heavy
 * kernel reads are checked against their buffers, before the executor may
 * see it. Any change to a field's rules belongs here and in executable.h. */
#include "executable.h"
#include "backend.h"
#include "cx_hash.h"

#define CXE_MAX_COUNT (1 << 24)

/* the in-memory layout of what is written raw: a different compiler or
 * struct change must not reinterpret old bytes */
uint32_t cx_exec_layout_fingerprint(void)
{
    uint64_t v[] = { sizeof(cx_slot), sizeof(cx_kernel), sizeof(cx_pinstr), sizeof(cx_view), sizeof(cx_kin),
                     sizeof(cx_program), CX_MAX_DIMS, CX_MESH_MAX_DIMS, CX_BLK, OP_COUNT, K_COPY, P_MASK,
                     offsetof(cx_kernel, prog), offsetof(cx_kernel, in), offsetof(cx_kernel, wait_at),
                     offsetof(cx_kernel, attrs), CX_MAX_ATTRS };
    return (uint32_t)cx_hash64(v, sizeof v);
}

typedef cx_sbuf wbuf;

static void w_put(wbuf *w, const void *src, size_t n)
{
    if (n) cx_sb_append(w, src, n);
}

static void w_i64(wbuf *w, int64_t v) { w_put(w, &v, sizeof v); }

/* ---- what ties an executable to its process ----------------------------------------
 * A partitioned (SPMD) program's outputs carry shardings that point at a
 * mesh, and its collectives carry replica-group ids that the partitioner
 * interned while compiling: ids of this process, which a warm restart that
 * never compiles would not have. So a mesh is written as its hash (the
 * graph key holds it, so a process that finds the key has built that mesh)
 * and each collective's groups as their ranks, interned again on loading. */

#define SHARDING_BYTES (2 + CX_MAX_DIMS * (2 + CX_MESH_MAX_DIMS))

static void sharding_pack(uint8_t *b, const cx_sharding *s)
{
    int n = 0;
    b[n++] = s->ndim;
    b[n++] = s->partial;
    for (int d = 0; d < CX_MAX_DIMS; d++) {
        b[n++] = s->naxes[d];
        b[n++] = s->blocks[d];
        for (int a = 0; a < CX_MESH_MAX_DIMS; a++) b[n++] = s->axes[d][a];
    }
}

static void w_process_ties(wbuf *w, const cx_executable *e)
{
    w_i64(w, e->out_sharding ? 1 : 0);
    for (int o = 0; e->out_sharding && o < e->n_outputs; o++) {
        const cx_sharding *s = &e->out_sharding[o];
        uint8_t b[SHARDING_BYTES];
        w_i64(w, s->mesh ? (int64_t)s->mesh->hash : 0);
        w_i64(w, s->mesh ? s->mesh->ndim : 0);
        sharding_pack(b, s);
        w_put(w, b, sizeof b);
    }
    for (int k = 0; k < 4; k++) w_i64(w, e->spmd_inserted[k]);
    for (int k = 0; k < e->nkernels; k++) {
        if (e->kernels[k].kind != K_COLL) continue;
        int ng = 0, gs = 0;
        const int *ranks = NULL;
        cx_groups_describe(CX_ATTR(&e->kernels[k], CX_AT_COLL_GROUPS), &ng, &gs, &ranks);
        w_i64(w, ng);
        w_i64(w, gs);
        for (int i = 0; i < ng * gs; i++) { int32_t r = ranks[i]; w_put(w, &r, sizeof r); }
    }
}

void cx_exec_serialize(cx_sbuf *w, const cx_executable *e)
{
    int64_t hdr[] = { e->n_inputs, e->n_rts, e->n_outputs, e->nslots, e->nkernels, e->num_nodes, e->num_work_kernels,
                      e->num_aliased, e->arena_bytes, e->intermediate_bytes, (int64_t)e->shared_hi,
                      (int64_t)e->shared_lo };
    for (size_t i = 0; i < sizeof hdr / sizeof *hdr; i++) w_i64(w, hdr[i]);
    w_put(w, e->out_dtypes, (size_t)e->n_outputs);
    w_put(w, e->out_bytes, sizeof(int64_t) * (size_t)e->n_outputs);
    w_put(w, e->out_alias, sizeof(int) * (size_t)e->n_outputs);
    w_put(w, e->out_slot, sizeof(int) * (size_t)e->n_outputs);
    w_put(w, e->slots, sizeof(cx_slot) * (size_t)e->nslots);
    for (int k = 0; k < e->nkernels; k++) {
        cx_kernel kk = e->kernels[k];
        kk.prog.ins = NULL;   /* pointers never reach the file */
        kk.prog.views = NULL;
        kk.node = -1;         /* this compilation's graph and locations, meaningless elsewhere */
        kk.loc = 0;
        w_put(w, &kk, sizeof kk);
        w_put(w, e->kernels[k].prog.ins, sizeof(cx_pinstr) * (size_t)e->kernels[k].prog.n);
        w_put(w, e->kernels[k].prog.views, sizeof(cx_view) * (size_t)e->kernels[k].prog.nviews);
    }
    w_process_ties(w, e);
}

typedef struct {
    const unsigned char *p;
    size_t n, at;
    bool bad;
} rbuf;

static bool r_get(rbuf *r, void *dst, size_t n)
{
    if (r->bad || n > r->n - r->at) { r->bad = true; return false; }
    if (n) memcpy(dst, r->p + r->at, n);
    r->at += n;
    return true;
}

static void *r_array(rbuf *r, int64_t count, size_t es)
{
    if (r->bad || count < 0 || count > CXE_MAX_COUNT || (size_t)count * es > r->n - r->at) { r->bad = true; return NULL; }
    void *p = malloc((size_t)count * es + 1);
    if (!p) { r->bad = true; return NULL; }
    r_get(r, p, (size_t)count * es);
    return p;
}

static bool dtype_ok(int dt) { return dt >= 0 && dt < CX_DTYPE_COUNT; }

/* elements of `slot` viewed as `dt` */
static int64_t slot_elems(const cx_executable *e, int slot, int dt)
{
    size_t es = cx_dtype_size((cx_dtype)dt);
    return es ? e->slots[slot].bytes / (int64_t)es : 0;
}

/* every address view `v` can produce over iteration shape (shape, nd) lies
 * in [0, limit) */
static bool view_in_bounds(const cx_view *v, const int64_t *shape, int nd, int64_t limit)
{
    /* checked arithmetic: the values come from the file */
    int64_t lo = v->offset, hi = v->offset;
    for (int d = 0; d < nd; d++) {
        int64_t a = 0, b = shape[d];
        if (v->masked) {
            if (v->lo[d] > a) a = v->lo[d];
            if (v->hi[d] < b) b = v->hi[d];
        }
        if (b <= a) return true;   /* every lane is masked out: nothing is read */
        int64_t s = v->strides[d], x, y;
        if (__builtin_mul_overflow(a, s, &x) || __builtin_mul_overflow(b - 1, s, &y)) return false;
        if (s > 0) { if (__builtin_add_overflow(lo, x, &lo) || __builtin_add_overflow(hi, y, &hi)) return false; }
        else if (__builtin_add_overflow(lo, y, &lo) || __builtin_add_overflow(hi, x, &hi)) return false;
    }
    return lo >= 0 && hi < limit;
}

/* count elements of dtype dt fit in `bytes` (no overflow) */
static bool fits(int64_t count, int dt, int64_t bytes)
{
    int64_t need;
    return count >= 0 && !__builtin_mul_overflow(count, (int64_t)cx_dtype_size((cx_dtype)dt), &need) && need <= bytes;
}

static bool prog_ok(const cx_executable *e, const cx_kernel *k, const cx_program *p)
{
    if (p->n < 0 || p->nviews < 0 || p->n > CXE_MAX_COUNT || p->nviews > CXE_MAX_COUNT) return false;
    if (p->n > 0 && (p->result < 0 || p->result >= p->n)) return false;
    for (int i = 0; i < p->n; i++) {
        const cx_pinstr *in = &p->ins[i];
        if (!dtype_ok(in->dtype)) return false;
        bool uses_view = false;
        switch ((cx_pkind)in->kind) {
        case P_LOAD:
            if (in->slot < 0 || in->slot >= e->nslots || !dtype_ok(in->src_dtype)) return false;
            uses_view = true;
            break;
        case P_CONST: break;
        case P_RT: if (in->slot < 0 || in->slot >= e->n_rts) return false; break;
        case P_IOTA: uses_view = true; break;
        case P_RNG:
            if (in->slot < 0 || in->slot >= e->n_rts || in->a < 0 || in->a >= e->n_rts) return false;
            uses_view = true;
            break;
        case P_UN: case P_CAST: if (in->a < 0 || in->a >= i) return false; break;
        case P_BIN:
            if (in->a < 0 || in->a >= i || in->b < 0 || in->b >= i || in->op >= OP_COUNT) return false;
            if (!dtype_ok(in->src_dtype)) return false;
            break;
        case P_WHERE:
            if (in->a < 0 || in->a >= i || in->b < 0 || in->b >= i || in->c < 0 || in->c >= i) return false;
            break;
        case P_MASK: if (in->a < 0 || in->a >= i) return false; uses_view = true; break;
        case P_RELU: if (in->a < 0 || in->a >= i) return false; break;
        case P_POSMASK: if (in->a < 0 || in->a >= i || in->b < 0 || in->b >= i) return false; break;
        default: return false;
        }
        if (in->kind == P_UN && (in->op >= OP_COUNT || cx_op_table[in->op].group != G_UNARY || in->op == OP_CAST))
            return false;
        if (uses_view && (in->view < 0 || in->view >= p->nviews)) return false;
        if (in->kind == P_LOAD && !view_in_bounds(&p->views[in->view], k->shape, k->ndim, slot_elems(e, in->slot, in->src_dtype)))
            return false;
    }
    return true;
}

/* Whether input i is one a kernel reads only through its view, which can
 * repeat values (view_fits bounds it, not numel): a gather's or
 * scatter-add's row index, a scatter-add's broadcast base. */
static bool reads_fewer_than_numel(const cx_kernel *k, int i)
{
    if ((k->kind != K_GATHER && k->kind != K_SCATTER_ADD) || i > 1) return false;
    const cx_kin *x = &k->in[i];
    return !cx_view_is_identity(&x->view, x->shape, x->ndim) && (i == 1 || k->kind == K_SCATTER_ADD);
}

/* A heavy kernel's input view (strides over the input's own shape, from an
 * offset) stays inside its buffer. */
static bool view_fits(const cx_kin *x, int64_t slot_bytes)
{
    if (x->view.offset < 0) return false;
    int64_t last = x->view.offset, span;
    for (int d = 0; d < x->ndim; d++) {
        if (x->shape[d] <= 0) return true;   /* no element is read */
        /* checked: the values come from the file (fuzz_cache found the sum
         * overflowing) */
        if (x->view.strides[d] < 0 || __builtin_mul_overflow(x->shape[d] - 1, x->view.strides[d], &span) ||
            __builtin_add_overflow(last, span, &last))
            return false;
    }
    int64_t end;
    if (__builtin_add_overflow(last, 1, &end)) return false;   /* fuzz_cache: a view ending at INT64_MAX */
    return x->numel == 0 || fits(end, x->dtype, slot_bytes);
}

/* A pool reads its operands and writes its output whole from their
 * buffers' starts, by its geometry: n*c*h*w input values (the average
 * pool's gradient: n*c*oh*ow of dy) and the other side's count. The
 * geometry must be the buffers' (their sizes are checked against numel). */
static bool pool_ok(const cx_kernel *k)
{
    if (!cx_kernel_is_pool(k)) return true;
    if (k->nin != (k->kind == K_MAXPOOL_BWD ? 2 : 1)) return false;
    if (k->kind != K_AVGPOOL_BWD && k->in[0].ndim != 4) return false;
    cx_pool_geom g;
    cx_kernel_pool_geom(k, &g);
    if (g.h > INT32_MAX || g.w > INT32_MAX || !cx_pool_geom_finish(&g)) return false;
    int64_t planes, in_n, out_n;
    if (__builtin_mul_overflow(g.n, g.c, &planes) || __builtin_mul_overflow(planes, g.h * g.w, &in_n) ||
        __builtin_mul_overflow(planes, g.oh * g.ow, &out_n))
        return false;
    switch (k->kind) {
    case K_MAXPOOL: case K_AVGPOOL: return k->in[0].numel == in_n && k->out_numel == out_n;
    case K_MAXPOOL_BWD: return k->in[0].numel == in_n && k->in[1].numel == out_n && k->out_numel == in_n;
    default: return k->in[0].numel == out_n && k->out_numel == in_n;
    }
}

/* A concat copies its part (outer rows of piece values, read contiguously
 * from the part's view offset) to an axis offset of its output: the part
 * must be in the output's shape but on the axis, and land inside it. */
static bool concat_ok(const cx_executable *e, const cx_kernel *k)
{
    if (k->kind != K_CONCAT) return true;
    const cx_kin *x = &k->in[0];
    const int64_t ax = CX_ATTR(k, CX_AT_AXIS), at = CX_ATTR(k, CX_AT_CONCAT_OFFSET);
    if (k->nin != 1 || x->ndim != k->ndim || ax < 0 || ax >= k->ndim || x->dtype != k->out_dtype) return false;
    int64_t n = 1, out = 1;
    for (int d = 0; d < k->ndim; d++) {
        if (d != ax && x->shape[d] != k->shape[d]) return false;
        if (__builtin_mul_overflow(n, x->shape[d], &n) || __builtin_mul_overflow(out, k->shape[d], &out)) return false;
    }
    int64_t end;
    if (at < 0 || __builtin_add_overflow(at, x->shape[ax], &end) || end > k->shape[ax]) return false;
    if (x->numel != n || out != k->out_numel || __builtin_add_overflow(x->view.offset, n, &end)) return false;
    return x->view.offset >= 0 && fits(end, x->dtype, e->slots[x->slot].bytes);
}

/* Every attribute the executor reads (CX_ATTR) exists. */
static bool attrs_ok(const cx_kernel *k)
{
    if (k->nattrs < 0 || k->nattrs > CX_MAX_ATTRS) return false;
    switch (k->kind) {
    case K_CONV: return k->nattrs >= CX_AT_CONV_COUNT;
    case K_CONV_BI: case K_CONV_BW: return k->nattrs == CX_AT_CONV_BWD_COUNT;
    case K_MAXPOOL: case K_AVGPOOL: case K_MAXPOOL_BWD: return k->nattrs >= CX_AT_POOL_COUNT;
    case K_AVGPOOL_BWD: return k->nattrs == CX_AT_POOL_BWD_COUNT;
    case K_GATHER: case K_SCATTER_ADD: {
        /* the index contiguous or one value per row, a scatter-add's base
         * contiguous or one value (run_indexed reads no other) */
        int64_t so, sd;
        const cx_kin *b = &k->in[0];
        return k->nattrs >= 1 && k->nin >= 2 && CX_ATTR(k, CX_AT_AXIS) >= 0 && CX_ATTR(k, CX_AT_AXIS) < k->in[1].ndim &&
               (cx_view_is_identity(&k->in[1].view, k->in[1].shape, k->in[1].ndim) ||
                cx_index_is_rows(&k->in[1], (int)CX_ATTR(k, CX_AT_AXIS), &so, &sd)) &&
               (k->kind == K_GATHER || cx_view_is_identity(&b->view, b->shape, b->ndim) ||
                cx_view_is_broadcast(&b->view, b->shape, b->ndim));
    }
    case K_CONCAT: return k->nattrs >= CX_AT_CONCAT_COUNT;
    case K_COLL: return k->nattrs >= CX_AT_COLL_COUNT;
    case K_PAD: return k->nin >= 1 && k->nattrs >= CX_AT_PAD_COUNT(k->in[0].ndim);
    case K_ATTENTION: return k->nin == 3 && k->nattrs >= CX_AT_ATTN_COUNT && k->in[0].ndim == 4 && k->in[1].ndim == 4;
    case K_ATTENTION_BWD:
        /* interleaved: rows of dq, dk, dv side by side, so as many keys as queries */
        return k->nin == 5 && k->nattrs >= CX_AT_ATTN_COUNT && k->in[0].ndim == 4 && k->in[1].ndim == 4 &&
               (k->nattrs <= CX_AT_ATTN_INTERLEAVED || !k->attrs[CX_AT_ATTN_INTERLEAVED] ||
                k->in[0].shape[1] == k->in[1].shape[1]);
    case K_LAYER_NORM: case K_LAYER_NORM_BWD:
        /* f32 in; out f32, or bf16 where the forward took its cast */
        return k->nin == 3 && k->in[0].ndim >= 1 && k->in[0].dtype == CX_F32 && k->in[1].dtype == CX_F32 &&
               k->in[2].dtype == CX_F32 &&
               (k->out_dtype == CX_F32 || (k->kind == K_LAYER_NORM && k->out_dtype == CX_BF16));
    default: return true;
    }
}

/* A matmul writes batch x m x n values, batch A's leading dims, (m, k) A's
 * last two and n B's last: its output must hold them, and B must have A's
 * k rows (the executor reads both by those shapes). */
static bool matmul_shapes_ok(const cx_kernel *k)
{
    if (k->nin != 2 || k->in[0].ndim < 2 || k->in[0].ndim != k->in[1].ndim) return false;
    const cx_kin *a = &k->in[0], *b = &k->in[1];
    const int nd = a->ndim;
    if (a->shape[nd - 1] != b->shape[nd - 2]) return false;
    int64_t out = 1;
    for (int d = 0; d < nd - 1; d++)
        if (a->shape[d] < 0 || __builtin_mul_overflow(out, a->shape[d], &out)) return false;
    return b->shape[nd - 1] >= 0 && !__builtin_mul_overflow(out, b->shape[nd - 1], &out) && out == k->out_numel;
}

/* The dense kernels and pools run in their output's dtype, f32 or bf16,
 * and read every operand in it (the executor picks the kernel by dtype),
 * but for a bf16 matmul with its f32 cast folded in (f32 output, bf16
 * operands, no epilogue); a bf16 matmul needs at least one thread's tiles
 * of scratch, a bf16 pool one thread's planes, an attention (f32 or bf16)
 * what its route needs at the least. */
static bool dense_ok(const cx_executable *e, const cx_kernel *k)
{
    switch (k->kind) {
    case K_MATMUL: case K_CONV: case K_CONV_BI: case K_CONV_BW: case K_ATTENTION: case K_ATTENTION_BWD: break;
    case K_MAXPOOL: case K_AVGPOOL: case K_MAXPOOL_BWD: case K_AVGPOOL_BWD: break;
    default: return true;
    }
    if (k->out_dtype != CX_F32 && k->out_dtype != CX_BF16) return false;
    if (k->kind == K_MATMUL && !matmul_shapes_ok(k)) return false;
    const bool f32_sums = cx_kernel_is_matmul_f32_sums(k);
    if (f32_sums && k->has_epilogue) return false;
    const int in_dtype = f32_sums ? CX_BF16 : k->out_dtype;
    for (int i = 0; i < k->nin; i++)
        if (k->in[i].dtype != in_dtype) return false;
    if (k->scratch_slot >= 0 && k->scratch_bytes > e->slots[k->scratch_slot].bytes) return false;
    if (k->kind == K_ATTENTION || k->kind == K_ATTENTION_BWD) {
        cx_attn_geom g;
        cx_kernel_attn_geom(k, &g);
        bool bwd = k->kind == K_ATTENTION_BWD;
        size_t need = k->out_dtype == CX_F32 ? cx_attention_min_scratch_bytes(&g, bwd)
                                             : cx_attention_bf16_min_scratch_bytes(&g, bwd);
        return need == 0 || (k->scratch_slot >= 0 && (size_t)k->scratch_bytes >= need);
    }
    if (in_dtype == CX_F32) return true;
    if (cx_kernel_is_pool(k)) {
        cx_pool_geom g;
        cx_kernel_pool_geom(k, &g);
        return cx_pool_geom_finish(&g) && k->scratch_slot >= 0 &&
               (size_t)k->scratch_bytes >= cx_pool2d_bf16_min_scratch_bytes(&g);
    }
    if (k->kind != K_MATMUL) return k->scratch_slot >= 0 && k->scratch_bytes > 0;
    if (k->nin != 2 || k->in[0].ndim < 2 || k->in[0].ndim != k->in[1].ndim) return false;
    const cx_kin *a = &k->in[0], *b = &k->in[1];
    int nd = a->ndim;
    int64_t batch = 1;
    for (int d = 0; d < nd - 2; d++) if (__builtin_mul_overflow(batch, a->shape[d], &batch)) return false;
    if (__builtin_mul_overflow(batch, a->shape[nd - 2], &(int64_t){ 0 })) return false; /* the kernel folds them */
    size_t need = cx_matmul_bf16_min_scratch_bytes(batch, a->shape[nd - 2], b->shape[nd - 1], a->shape[nd - 1]);
    return need == 0 || (k->scratch_slot >= 0 && (size_t)k->scratch_bytes >= need);
}

static bool exec_ok(const cx_executable *e)
{
    if (e->n_inputs < 0 || e->n_rts < 0 || e->n_outputs < 0 || e->nslots < 0 || e->nkernels < 0) return false;
    if (e->arena_bytes < 0 || e->intermediate_bytes < 0) return false;
    for (int o = 0; o < e->n_outputs; o++) {
        if (!dtype_ok(e->out_dtypes[o]) || e->out_bytes[o] < 0) return false;
        if (e->out_alias[o] < -1 || e->out_alias[o] >= e->n_inputs) return false;
        if (e->out_slot[o] < -1 || e->out_slot[o] >= e->nslots) return false;
    }
    for (int s = 0; s < e->nslots; s++) {
        const cx_slot *sl = &e->slots[s];
        if (sl->bytes < 0) return false;
        switch (sl->kind) {
        case SLOT_INPUT: if (sl->index < 0 || sl->index >= e->n_inputs) return false; break;
        case SLOT_OUTPUT:
            if (sl->index < 0 || sl->index >= e->n_outputs || sl->bytes > e->out_bytes[sl->index]) return false;
            break;
        case SLOT_ARENA: if (sl->offset < 0 || sl->offset > e->arena_bytes - sl->bytes) return false; break;
        default: return false;
        }
    }
    for (int ki = 0; ki < e->nkernels; ki++) {
        const cx_kernel *k = &e->kernels[ki];
        if ((int)k->kind < 0 || k->kind > K_COPY) return false;
        if (k->out_slot < 0 || k->out_slot >= e->nslots || !dtype_ok(k->out_dtype) || k->out_numel < 0) return false;
        if (k->ndim < 0 || k->ndim > CX_MAX_DIMS || k->nin < 0 || k->nin > CX_MAX_KERNEL_INPUTS) return false;
        if (k->scratch_slot < -1 || k->scratch_slot >= e->nslots || k->wait_at < -1 || k->wait_at > e->nkernels) return false;
        if (k->scratch_bytes < 0) return false;
        int64_t iter = 1;
        for (int d = 0; d < k->ndim; d++) {
            if (k->shape[d] < 0 || (k->shape[d] > 0 && iter > INT64_MAX / k->shape[d])) return false;
            iter *= k->shape[d];
        }
        /* the output store: fused kernels write out_numel elements, copies out_numel bytes */
        if (k->kind == K_COPY ? k->out_numel > e->slots[k->out_slot].bytes
                              : !fits(k->out_numel, k->out_dtype, e->slots[k->out_slot].bytes))
            return false;
        if (k->kind == K_FUSED && iter != k->out_numel) return false;
        for (int i = 0; i < k->nin; i++) {
            const cx_kin *x = &k->in[i];
            if (x->slot < 0 || x->slot >= e->nslots || !dtype_ok(x->dtype) || x->ndim < 0 || x->ndim > CX_MAX_DIMS) return false;
            if (!reads_fewer_than_numel(k, i) && !fits(x->numel, x->dtype, e->slots[x->slot].bytes)) return false;
            if (!view_fits(x, e->slots[x->slot].bytes)) return false;
        }
        if (k->kind == K_REDUCE && (k->nkeep < 0 || k->nkeep > k->ndim || k->prog.n == 0)) return false;
        if (k->kind == K_REDUCE && k->red_op != OP_REDUCE_SUM && k->red_op != OP_REDUCE_MAX && k->red_op != OP_ARGMAX) return false;
        if (k->kind == K_COLL && (k->coll_op < OP_ALL_REDUCE || k->coll_op > OP_BROADCAST || k->nin < 1)) return false;
        if (!attrs_ok(k) || !pool_ok(k) || !concat_ok(e, k) || !dense_ok(e, k)) return false;
        /* every kernel's scratch is a slot of at least its size */
        if (k->scratch_bytes > 0 && (k->scratch_slot < 0 || k->scratch_bytes > e->slots[k->scratch_slot].bytes)) return false;
        if ((k->kind == K_FUSED || k->has_epilogue) && k->prog.n == 0) return false;
        if (k->epi > EPI_BIAS_ADD) return false;
        if (k->epi != EPI_PROG) {
            if (!k->has_epilogue || k->epi_load < 0 || k->epi_load >= k->prog.n || k->prog.ins[k->epi_load].kind != P_LOAD)
                return false;
            /* dense_ok has checked a matmul's operands: two, of its dtype, rank >= 2 */
            if (k->epi == EPI_POSMASK ? k->kind != K_CONV_BI && k->kind != K_MAXPOOL_BWD
                : k->epi == EPI_BIAS_ADD ? k->kind != K_MATMUL || k->out_dtype != CX_F32
                                         : k->kind != K_CONV && k->kind != K_MATMUL)
                return false;
            /* what the kernel reads: a mask in its own dtype, a bias in f32,
             * one per output channel or column */
            const cx_pinstr *ld = &k->prog.ins[k->epi_load];
            if (k->out_dtype != CX_F32 && k->out_dtype != CX_BF16) return false;
            if (ld->src_dtype != (k->epi == EPI_POSMASK ? k->out_dtype : CX_F32)) return false;
            if (ld->slot < 0 || ld->slot >= e->nslots) return false;
            if (k->epi != EPI_POSMASK) {
                if (k->nin < 2 || k->in[1].ndim < 1) return false;
                int64_t per = k->kind == K_CONV ? k->in[1].shape[0] : k->in[1].shape[k->in[1].ndim - 1];
                if (!fits(per, CX_F32, e->slots[ld->slot].bytes)) return false;
            }
            if (k->epi == EPI_BIAS_ADD) {
                /* and an f32 addend of the output's elements */
                const int a = cx_kernel_epi_addend(k);
                if (a < 0 || k->prog.ins[a].src_dtype != CX_F32 || k->prog.ins[a].slot < 0 ||
                    k->prog.ins[a].slot >= e->nslots || !fits(k->out_numel, CX_F32, e->slots[k->prog.ins[a].slot].bytes))
                    return false;
            }
        }
        if (!prog_ok(e, k, &k->prog)) return false;
    }
    return true;
}

/* A bool read from raw bytes may hold any byte: check it without loading
 * it as a bool (which would be undefined behaviour). */
static bool bool_ok(const bool *b)
{
    unsigned char v;
    memcpy(&v, b, 1);
    return v <= 1;
}

static bool kernel_bools_ok(const cx_kernel *k)
{
    if (!bool_ok(&k->has_epilogue)) return false;
    for (int i = 0; i < CX_MAX_KERNEL_INPUTS; i++)
        if (!bool_ok(&k->in[i].trans) || !bool_ok(&k->in[i].view.masked)) return false;
    for (int v = 0; v < k->prog.nviews; v++)
        if (!bool_ok(&k->prog.views[v].masked)) return false;
    return true;
}

static bool sharding_unpack(cx_sharding *s, const int64_t *mesh, const uint8_t *b)
{
    int n = 0;
    memset(s, 0, sizeof *s);
    s->ndim = b[n++];
    s->partial = b[n++];
    for (int d = 0; d < CX_MAX_DIMS; d++) {
        s->naxes[d] = b[n++];
        s->blocks[d] = b[n++];
        for (int a = 0; a < CX_MESH_MAX_DIMS; a++) s->axes[d][a] = b[n++];
    }
    if (s->ndim > CX_MAX_DIMS) return false;
    if (mesh[0] == 0 && mesh[1] == 0) return cx_sharding_is_replicated(s);
    if (mesh[1] < 1 || mesh[1] > CX_MESH_MAX_DIMS || !(s->mesh = cx_mesh_find((uint64_t)mesh[0], (int)mesh[1])))
        return false;
    int mn = s->mesh->ndim;
    if (s->partial >> mn) return false;
    for (int d = 0; d < CX_MAX_DIMS; d++) {
        if (s->naxes[d] > (d < s->ndim ? mn : 0)) return false;
        for (int a = 0; a < s->naxes[d]; a++) if (s->axes[d][a] >= mn) return false;
    }
    return true;
}

/* One collective's replica groups as read: ngroups 0 is every rank. */
typedef struct { int64_t ngroups, group_size; int *ranks; } groups_rec;

static void r_process_ties(rbuf *r, cx_executable *e, groups_rec *g)
{
    int64_t has = -1;
    r_get(r, &has, sizeof has);
    if (has == 1) {
        e->out_sharding = calloc((size_t)e->n_outputs + 1, sizeof *e->out_sharding);
        if (!e->out_sharding) r->bad = true;
        for (int o = 0; o < e->n_outputs && !r->bad; o++) {
            int64_t mesh[2];
            uint8_t b[SHARDING_BYTES];
            if (r_get(r, mesh, sizeof mesh) && r_get(r, b, sizeof b) && !sharding_unpack(&e->out_sharding[o], mesh, b))
                r->bad = true;
        }
    } else if (has != 0) {
        r->bad = true;
    }
    int64_t ins[4] = { 0 };
    r_get(r, ins, sizeof ins);
    for (int k = 0; k < 4 && !r->bad; k++) {
        if (ins[k] < 0 || ins[k] > CXE_MAX_COUNT) r->bad = true;
        else e->spmd_inserted[k] = (int)ins[k];
    }
    int world = cx_world_size();
    for (int k = 0; k < e->nkernels && !r->bad; k++) {
        if (e->kernels[k].kind != K_COLL) continue;
        int64_t h[2];
        if (!r_get(r, h, sizeof h)) break;
        bool all = h[0] == 0 && h[1] == 0;
        if (!all && (h[0] < 1 || h[1] < 1 || h[0] > world || h[1] > world || h[0] * h[1] != world)) { r->bad = true; break; }
        g[k] = (groups_rec){ h[0], h[1], all ? NULL : r_array(r, h[0] * h[1], sizeof(int)) };
    }
}

/* The read groups interned in this process, their ids in the kernels. */
static bool intern_groups(cx_executable *e, const groups_rec *g)
{
    for (int k = 0; k < e->nkernels; k++) {
        if (e->kernels[k].kind != K_COLL) continue;
        int64_t id = 0;
        int gs;
        if (g[k].ngroups) {
            cx_replica_groups rg = { (int)g[k].ngroups, (int)g[k].group_size, g[k].ranks };
            if ((id = cx_groups_intern(&rg, "persistent cache", &gs)) < 0) return false;
        }
        e->kernels[k].attrs[CX_AT_COLL_GROUPS] = id;
    }
    return true;
}

cx_executable *cx_exec_deserialize(const unsigned char *p, size_t n)
{
    rbuf r = { p, n, 0, false };
    cx_executable *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    int64_t h[12] = { 0 };
    r_get(&r, h, sizeof h);
    for (int i = 0; i < 8 && !r.bad; i++) if (h[i] < 0 || h[i] > CXE_MAX_COUNT) r.bad = true;
    if (!r.bad) {
        e->n_inputs = (int)h[0]; e->n_rts = (int)h[1]; e->n_outputs = (int)h[2]; e->nslots = (int)h[3];
        e->num_nodes = (int)h[5]; e->num_work_kernels = (int)h[6]; e->num_aliased = (int)h[7];
        e->arena_bytes = h[8]; e->intermediate_bytes = h[9];
        e->shared_hi = (uint64_t)h[10]; e->shared_lo = (uint64_t)h[11];
        e->out_dtypes = r_array(&r, h[2], 1);
        e->out_bytes = r_array(&r, h[2], sizeof(int64_t));
        e->out_alias = r_array(&r, h[2], sizeof(int));
        e->out_slot = r_array(&r, h[2], sizeof(int));
        e->slots = r_array(&r, h[3], sizeof(cx_slot));
        /* kernels are read one by one; nkernels counts the ones whose
         * programs are owned, so cx_executable_free stays correct on failure */
        /* each kernel takes at least its struct's bytes of the payload: a
         * count beyond that is a lie (found by fuzz_cache: 16M kernels
         * asked for 8.5 GB before the first one was read) */
        if ((uint64_t)h[4] > (r.n - r.at) / sizeof(cx_kernel)) r.bad = true;
        e->kernels = r.bad ? NULL : calloc((size_t)h[4] + 1, sizeof(cx_kernel));
        if (!e->kernels) r.bad = true;
        for (int64_t k = 0; k < h[4] && !r.bad; k++) {
            cx_kernel *kk = &e->kernels[k];
            if (!r_get(&r, kk, sizeof *kk)) break;
            int np = kk->prog.n, nv = kk->prog.nviews;
            kk->prog.ins = NULL;
            kk->prog.views = NULL;
            kk->node = -1;
            kk->loc = 0;
            e->nkernels = (int)k + 1;
            kk->prog.ins = r_array(&r, np, sizeof(cx_pinstr));
            kk->prog.views = r_array(&r, nv, sizeof(cx_view));
            kk->prog.cap = np;
            kk->prog.vcap = nv;
            if (!r.bad && !kernel_bools_ok(kk)) r.bad = true;
        }
    }
    groups_rec *g = r.bad ? NULL : calloc((size_t)e->nkernels + 1, sizeof *g);
    if (!g) r.bad = true;
    if (!r.bad && e->nkernels != (int)h[4]) r.bad = true;
    if (!r.bad) r_process_ties(&r, e, g);
    if (!r.bad && r.at != r.n) r.bad = true;   /* trailing bytes: not what we wrote */
    if (!r.bad && !exec_ok(e)) r.bad = true;
    /* interned only once the whole executable is known good */
    if (!r.bad && !intern_groups(e, g)) r.bad = true;
    for (int k = 0; g && k < e->nkernels; k++) free(g[k].ranks);
    free(g);
    if (r.bad) { cx_executable_free(e); return NULL; }
    e->max_prog = 1;
    for (int k = 0; k < e->nkernels; k++) if (e->kernels[k].prog.n > e->max_prog) e->max_prog = e->kernels[k].prog.n;
    return e;
}

