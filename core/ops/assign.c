/* cx_assign: a persistent tensor takes a new value. A pending value keeps
 * the old one as a donor whose buffer the result may take; a sharded
 * destination keeps its sharding (an annotation the partitioner meets). */
#include "ops.h"
#include "sharding.h"

cx_status cx_assign(cx_tensor *dst, cx_tensor *value)
{
    if (!dst || !value) { cx_set_last_error("assign: NULL tensor"); return CX_ERR_ARG; }
    if (cx_tensor_released(dst, "assign")) return CX_ERR_STATE;
    if (dst->step_depth != 0) {
        cx_set_last_error("assign: destination is not persistent (create it outside a step or cx_persist it)");
        return CX_ERR_STATE;
    }
    if (value->node->op == OP_ERROR) {
        cx_set_last_error("assign: value is poisoned: %s", value->node->err);
        return CX_ERR_SHAPE;
    }
    cx_node *d = dst->node, *v = value->node;
    if (d->op != OP_ERROR) {
        bool same = d->ndim == v->ndim && d->dtype == v->dtype;
        for (int i = 0; same && i < d->ndim; i++) same = d->shape[i] == v->shape[i];
        if (!same) {
            char a[160], b[160];
            cx_set_last_error("assign: value %s %s does not match destination %s %s",
                         cx_shape_str(a, sizeof a, v->shape, v->ndim), cx_dtype_name((cx_dtype)v->dtype),
                         cx_shape_str(b, sizeof b, d->shape, d->ndim), cx_dtype_name((cx_dtype)d->dtype));
            return CX_ERR_SHAPE;
        }
    }
    if (d == v) return CX_OK;
    if (v->op == OP_DATA) {
        /* already a value: nothing will be computed, so no buffer can be
         * donated, and the old value is released now rather than held */
        if (dst->donor) { cx_node_unref(dst->donor); dst->donor = NULL; }
        dst->flags &= ~(uint32_t)TF_ASSIGNED;
        if (dst->flags & TF_REQUIRES_GRAD) {
            /* a gradient leaf needs its own node over the shared buffer */
            cx_buffer_ref(v->buf);
            cx_node *own = cx_node_data(v->buf, (cx_dtype)v->dtype, v->shape, v->ndim);
            if (!own) { cx_buffer_unref(v->buf); cx_set_last_error("assign: out of memory"); return CX_ERR_OOM; }
            own->flags |= NF_REQUIRES_GRAD;
            own->grad_leaf = dst;
            if (v->sharding && !(own->sharding = malloc(sizeof *own->sharding))) {
                cx_node_unref(own);
                cx_set_last_error("assign: out of memory");
                return CX_ERR_OOM;
            }
            if (v->sharding) *own->sharding = *v->sharding;
            cx_set_node(dst, own);
            cx_node_unref(own);
        } else {
            cx_set_node(dst, v);
        }
        return CX_OK;
    }
    /* remember the last materialized value: its buffer may take the result */
    if (d->op == OP_DATA && !dst->donor) {
        cx_node_ref(d);
        dst->donor = d;
    }
    /* SPMD: a sharded destination (a parameter, an optimizer state) keeps
     * its sharding whatever the value's rules gave */
    cx_sharding keep;
    bool reshard = d->sharding && !cx_sharding_equal(d->sharding, v->sharding);
    if (reshard) keep = *d->sharding;
    cx_set_node(dst, v);
    dst->flags |= TF_ASSIGNED;
    return reshard ? cx_spmd_annotate(dst, &keep) : CX_OK;
}
