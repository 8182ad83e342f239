/* Gradient rules of the collectives: each is the transpose collective. */
#include "autograd.h"
#include "backend.h"

cx_tensor *cx_vjp_collective(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i)
{
    (void)in; (void)out; (void)i;
    int64_t gid = CX_ATTR(n, CX_AT_COLL_GROUPS);
    cx_reduce_op red = (cx_reduce_op)CX_ATTR(n, CX_AT_COLL_REDUCE);
    int axis = (int)CX_ATTR(n, CX_AT_COLL_AXIS);
    cx_replica_groups rg, *rgp = NULL;
    int ng, gs;
    const int *ranks;
    if (cx_groups_describe(gid, &ng, &gs, &ranks)) { rg = (cx_replica_groups){ ng, gs, ranks }; rgp = &rg; }
    switch ((cx_op)n->op) {
    case OP_ALL_REDUCE:
        if (red == CX_RED_MAX || red == CX_RED_MIN) return NULL;
        return cx_all_reduce(g, red, n->fval, rgp, true);
    case OP_ALL_GATHER: return cx_reduce_scatter(g, CX_RED_SUM, n->fval, axis, rgp, true);
    case OP_REDUCE_SCATTER: {
        cx_tensor *a = cx_all_gather(g, axis, rgp, true);
        if (red == CX_RED_MEAN || n->fval != 1.0) {
            int size = rgp ? gs : cx_world_size();
            double s = n->fval * (red == CX_RED_MEAN ? 1.0 / size : 1.0);
            cx_tensor *r = cx_mul_scalar(a, s);
            cx_drop(a);
            return r;
        }
        return a;
    }
    case OP_ALL_TO_ALL: return cx_all_to_all(g, (int)CX_ATTR(n, CX_AT_COLL_CONCAT_AXIS), axis, rgp, true);
    default: return NULL;
    }
}
