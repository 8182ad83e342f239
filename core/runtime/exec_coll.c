/* Collectives: a kernel's all-reduce, broadcast, all-gather,
 * reduce-scatter or all-to-all handed to the comm backend, started and
 * either completed here or left in flight for the executor to wait on where
 * the result is first read. */
#include "exec_internal.h"
#include "backend.h"

/* Collectives over contiguous buffers; non-leading axes go through a
 * rearrangement into (group, ...) blocks. */
static void block_permute(char *dst, const char *src, int64_t outer, int64_t g, int64_t piece, size_t es, bool to_group_major)
{
    /* src (outer, g, piece) <-> dst (g, outer, piece) */
    for (int64_t o = 0; o < outer; o++)
        for (int64_t q = 0; q < g; q++) {
            const char *s = to_group_major ? src + ((o * g + q) * piece) * (int64_t)es : src + ((q * outer + o) * piece) * (int64_t)es;
            char *d = to_group_major ? dst + ((q * outer + o) * piece) * (int64_t)es : dst + ((o * g + q) * piece) * (int64_t)es;
            memcpy(d, s, (size_t)piece * es);
        }
}

cx_status cx_run_coll(const run_ctx *rc, const cx_kernel *k, void **req_out, bool now)
{
    const cx_comm_backend *be = cx_comm_get();
    const cx_kin *x = &k->in[0];
    int op = k->coll_op;
    int rank = be->rank(be->ctx);
    int gsize = be->world_size(be->ctx);
    const int *group = NULL;
    int64_t groups = CX_ATTR(k, CX_AT_COLL_GROUPS);
    if (groups > 0) {
        group = cx_groups_lookup(groups, rank, &gsize);
        if (!group) { cx_set_last_error("%s: this rank (%d) is in no replica group", cx_op_table[op].name, rank); return CX_ERR_COMM; }
    }
    size_t es = cx_dtype_size((cx_dtype)x->dtype);
    cx_comm_op c = { .dtype = (cx_dtype)x->dtype, .scale = k->fval, .red = (cx_reduce_op)CX_ATTR(k, CX_AT_COLL_REDUCE),
                     .group = group, .group_size = group ? gsize : 0 };
    char *in = rc->slot_ptr[x->slot];
    char *out = rc->slot_ptr[k->out_slot];
    char *scratch = k->scratch_slot >= 0 ? rc->slot_ptr[k->scratch_slot] : NULL;
    int ax = (int)CX_ATTR(k, CX_AT_COLL_AXIS);
    int64_t outer = prod(x->shape, 0, ax);
    *req_out = NULL;
    switch (op) {
    case OP_ALL_REDUCE:
        c.kind = CX_COLL_ALL_REDUCE; c.in = in; c.out = out; c.count = x->numel;
        break;
    case OP_BROADCAST:
        c.kind = CX_COLL_BROADCAST; c.in = in; c.out = out; c.count = x->numel; c.root = (int)CX_ATTR(k, CX_AT_COLL_ROOT);
        break;
    case OP_ALL_GATHER:
        c.kind = CX_COLL_ALL_GATHER; c.in = in; c.count = x->numel;
        c.out = outer == 1 ? out : scratch;
        break;
    case OP_REDUCE_SCATTER:
        c.kind = CX_COLL_REDUCE_SCATTER; c.count = k->out_numel; c.out = out;
        if (outer == 1) c.in = in;
        else { block_permute(scratch, in, outer, gsize, x->numel / outer / gsize, es, true); c.in = scratch; }
        break;
    case OP_ALL_TO_ALL: {
        int sa = ax, ca = (int)CX_ATTR(k, CX_AT_COLL_CONCAT_AXIS);
        /* blocks along the split axis, group-major */
        int64_t so = prod(x->shape, 0, sa), spiece = x->numel / so / gsize;
        block_permute(scratch, in, so, gsize, spiece, es, true);
        char *recv = scratch + x->numel * (int64_t)es;
        c.kind = CX_COLL_ALL_TO_ALL; c.in = scratch; c.out = recv; c.count = x->numel;
        void *req = be->start(be->ctx, &c);
        if (!req) return CX_ERR_COMM;
        cx_status st = be->wait(be->ctx, req);
        if (st != CX_OK) return st;
        /* received block q holds the peer's split slice: shape = x with dim sa / g;
         * place it at position q along the concat axis */
        int64_t bshape[CX_MAX_DIMS];
        memcpy(bshape, x->shape, sizeof bshape);
        bshape[sa] /= gsize;
        int64_t co = prod(bshape, 0, ca), cpiece = (x->numel / gsize) / co;
        block_permute(out, recv, co, gsize, cpiece, es, false);
        return CX_OK;
    }
    default:
        cx_set_last_error("collective: unknown op %d", op);
        return CX_ERR_COMM;
    }
    bool permute_after = op == OP_ALL_GATHER && outer != 1;
    if ((now || permute_after) && be->run) {
        cx_status st = be->run(be->ctx, &c);
        if (st == CX_OK && permute_after) block_permute(out, scratch, outer, gsize, x->numel / outer, es, false);
        return st;
    }
    void *req = be->start(be->ctx, &c);
    if (!req) return CX_ERR_COMM;
    if (permute_after) {
        cx_status st = be->wait(be->ctx, req);
        if (st != CX_OK) return st;
        block_permute(out, scratch, outer, gsize, x->numel / outer, es, false);
        return CX_OK;
    }
    *req_out = req;
    return CX_OK;
}
