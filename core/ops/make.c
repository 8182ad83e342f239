/* Recording one op: the node made from its input tensors (poison and
 * requires-grad propagated, eager mode's hook called), and the shape and
 * dtype rules every op file shares. The bottom of the ops layer: it calls
 * no other op. */
#include "ops.h"
#include "obs.h"

int cx_norm_axis(int axis, int ndim)
{
    if (axis < 0) axis += ndim;
    return (axis < 0 || axis >= (ndim ? ndim : 1)) ? -1 : axis;
}

cx_tensor *cx_make_op(cx_op op, cx_dtype dt, const int64_t *shape, int ndim,
                      cx_tensor *const *ins, int nin, const int64_t *attrs, int nattrs, double fval)
{
    cx_node *nodes_small[8];
    cx_node **nodes = nin <= 8 ? nodes_small : malloc((size_t)nin * sizeof *nodes);
    if (!nodes) return cx_poisoned("%s: out of memory", cx_op_table[op].name);
    uint32_t flags = 0;
    for (int i = 0; i < nin; i++) {
        if (!ins[i]) {
            if (nodes != nodes_small) free(nodes);
            return cx_poisoned("%s: input %d is NULL", cx_op_table[op].name, i);
        }
        if (ins[i]->node->op == OP_ERROR) {
            if (nodes != nodes_small) free(nodes);
            return cx_tensor_of(ins[i]->node); /* poison propagates */
        }
        nodes[i] = ins[i]->node;
        if (nodes[i]->flags & NF_REQUIRES_GRAD) flags |= NF_REQUIRES_GRAD;
    }
    if (cx_record()->no_grad) flags = 0;
    cx_node_desc d = { .op = op, .dtype = dt, .ndim = ndim, .shape = shape, .ninputs = nin,
                       .inputs = nodes, .nattrs = nattrs, .attrs = attrs, .fval = fval, .flags = flags };
    cx_node *n = cx_node_make(&d);
    if (nodes != nodes_small) free(nodes);
    if (!n) return cx_poisoned("%s: out of memory", cx_op_table[op].name);
    cx_tensor *t = cx_tensor_wrap(n);
    /* XLA_USE_EAGER_DEBUG_MODE (debug.c): run the op now; one branch otherwise */
    if (t && (cx_obs_get() & OBS_EAGER) && cx_eager_hook) cx_eager_hook(t);
    return t;
}

/* A dtype conversion is part of the rules: promotion records casts. */
cx_tensor *cx_cast(cx_tensor *a, cx_dtype dtype)
{
    if (!a) return cx_poisoned("cast: input 0 is NULL");
    if (a->node->op == OP_ERROR) return cx_tensor_of(a->node);
    if ((unsigned)dtype >= CX_DTYPE_COUNT) return cx_poisoned("cast: unknown dtype %d", (int)dtype);
    if (a->node->dtype == dtype) return cx_alias(a);
    int64_t attr = dtype;
    return cx_make_op(OP_CAST, dtype, a->node->shape, a->node->ndim, &a, 1, &attr, 1, 0);
}
