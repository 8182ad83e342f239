/* Collectives as IR ops: the builders and their shape rules. The backend
 * that runs them is registered in base/backend.c. */
#include "ops.h"
#include "backend.h"

/* ---- IR builders ---------------------------------------------------------------------- */

/* attributes: op_attrs.h, CX_AT_COLL_* */
static cx_tensor *coll(cx_op op, cx_tensor *a, const int64_t *shape, int64_t gid, int64_t red, int64_t ax0,
                       int64_t ax1, double scale, bool pin)
{
    int64_t attrs[CX_AT_COLL_COUNT];
    attrs[CX_AT_COLL_GROUPS] = gid;
    attrs[CX_AT_COLL_REDUCE] = red;
    attrs[CX_AT_COLL_AXIS] = ax0;
    attrs[CX_AT_COLL_AXIS2] = ax1;
    cx_tensor *r;
    if (pin) {
        /* pinned: a unique node CSE can never merge */
        cx_tensor *ins[1] = { a };
        cx_node *n;
        uint32_t flags = NF_PINNED | ((a->node->flags & NF_REQUIRES_GRAD) && cx_grad_enabled() ? NF_REQUIRES_GRAD : 0);
        cx_node *in = ins[0]->node;
        cx_node_desc d = { .op = op, .dtype = (cx_dtype)a->node->dtype, .ndim = a->node->ndim, .shape = shape,
                           .ninputs = 1, .inputs = &in, .nattrs = CX_AT_COLL_COUNT, .attrs = attrs, .fval = scale, .flags = flags };
        n = cx_node_make(&d);
        if (!n) return cx_poisoned("%s: out of memory", cx_op_table[op].name);
        r = cx_tensor_wrap(n);
    } else {
        r = cx_make_op(op, (cx_dtype)a->node->dtype, shape, a->node->ndim, &a, 1, attrs, CX_AT_COLL_COUNT, scale);
    }
    return r;
}

static cx_tensor *check_coll(cx_tensor *a, const char *op)
{
    if (!a) return cx_poisoned("%s: input is NULL", op);
    if (a->node->op == OP_ERROR) return cx_tensor_of(a->node);
    return NULL;
}

cx_tensor *cx_all_reduce(cx_tensor *a, cx_reduce_op red, double scale, const cx_replica_groups *groups, bool pin)
{
    cx_tensor *p = check_coll(a, "all_reduce");
    if (p) return p;
    int gs;
    int64_t gid = cx_groups_intern(groups, "all_reduce", &gs);
    if (gid < 0) return cx_poisoned("%s", cx_last_error());
    if (cx_bad_reduce_op("all_reduce", red)) return cx_poisoned("%s", cx_last_error());
    return coll(OP_ALL_REDUCE, a, a->node->shape, gid, red, 0, 0, scale, pin);
}

cx_tensor *cx_all_gather(cx_tensor *a, int axis, const cx_replica_groups *groups, bool pin)
{
    return cx_all_gather_grad_scaled(a, axis, groups, pin, 1.0);
}

cx_tensor *cx_all_gather_grad_scaled(cx_tensor *a, int axis, const cx_replica_groups *groups, bool pin, double grad_scale)
{
    cx_tensor *p = check_coll(a, "all_gather");
    if (p) return p;
    int gs;
    int64_t gid = cx_groups_intern(groups, "all_gather", &gs);
    if (gid < 0) return cx_poisoned("%s", cx_last_error());
    int ax = cx_norm_axis(axis, a->node->ndim);
    if (ax < 0 || a->node->ndim == 0) return cx_poisoned("all_gather: axis %d out of range for rank %d", axis, a->node->ndim);
    int64_t shape[CX_MAX_DIMS];
    memcpy(shape, a->node->shape, sizeof shape);
    shape[ax] *= gs;
    return coll(OP_ALL_GATHER, a, shape, gid, 0, ax, 0, grad_scale, pin);
}

cx_tensor *cx_reduce_scatter(cx_tensor *a, cx_reduce_op red, double scale, int axis, const cx_replica_groups *groups, bool pin)
{
    cx_tensor *p = check_coll(a, "reduce_scatter");
    if (p) return p;
    int gs;
    int64_t gid = cx_groups_intern(groups, "reduce_scatter", &gs);
    if (gid < 0) return cx_poisoned("%s", cx_last_error());
    int ax = cx_norm_axis(axis, a->node->ndim);
    if (ax < 0 || a->node->ndim == 0) return cx_poisoned("reduce_scatter: axis %d out of range for rank %d", axis, a->node->ndim);
    if (a->node->shape[ax] % gs)
        return cx_poisoned("reduce_scatter: axis %d of size %lld is not divisible by the group size %d", ax,
                         (long long)a->node->shape[ax], gs);
    if (cx_bad_reduce_op("reduce_scatter", red)) return cx_poisoned("%s", cx_last_error());
    if (red == CX_RED_MAX || red == CX_RED_MIN)
        return cx_poisoned("reduce_scatter: only sum and mean reductions are supported");
    int64_t shape[CX_MAX_DIMS];
    memcpy(shape, a->node->shape, sizeof shape);
    shape[ax] /= gs;
    return coll(OP_REDUCE_SCATTER, a, shape, gid, red, ax, 0, scale, pin);
}

cx_tensor *cx_all_to_all(cx_tensor *a, int split_axis, int concat_axis, const cx_replica_groups *groups, bool pin)
{
    cx_tensor *p = check_coll(a, "all_to_all");
    if (p) return p;
    int gs;
    int64_t gid = cx_groups_intern(groups, "all_to_all", &gs);
    if (gid < 0) return cx_poisoned("%s", cx_last_error());
    int nd = a->node->ndim;
    int sa = cx_norm_axis(split_axis, nd), ca = cx_norm_axis(concat_axis, nd);
    if (sa < 0 || ca < 0 || nd == 0) return cx_poisoned("all_to_all: axes %d, %d out of range for rank %d", split_axis, concat_axis, nd);
    if (a->node->shape[sa] % gs)
        return cx_poisoned("all_to_all: split axis %d of size %lld is not divisible by the group size %d", sa,
                         (long long)a->node->shape[sa], gs);
    int64_t shape[CX_MAX_DIMS];
    memcpy(shape, a->node->shape, sizeof shape);
    shape[sa] /= gs;
    shape[ca] *= gs;
    return coll(OP_ALL_TO_ALL, a, shape, gid, 0, sa, ca, 1.0, pin);
}

cx_tensor *cx_broadcast(cx_tensor *a, int root, const cx_replica_groups *groups, bool pin)
{
    cx_tensor *p = check_coll(a, "broadcast");
    if (p) return p;
    int gs;
    int64_t gid = cx_groups_intern(groups, "broadcast", &gs);
    if (gid < 0) return cx_poisoned("%s", cx_last_error());
    if (root < 0 || root >= gs) return cx_poisoned("broadcast: root %d is outside the group of %d", root, gs);
    return coll(OP_BROADCAST, a, a->node->shape, gid, 0, 0, root, 1.0, pin);
}
