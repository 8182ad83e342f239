/* The API entry points that sync to give a tensor its value: a leaf that
 * requires grad computed before it is marked, a deferred
 * tensor materialized whole, a deferred tensor sharded by mark_sharding
 * (each rank computes only its shard), and reads of a rank's shard. They
 * sit above the ops, autograd and sync, so nothing below them syncs. */
#include "api.h"

/* A tensor still to be computed is computed first, as a parameter is:
 * backward finds its leaves by their nodes, so marking the pending op
 * would leave the tensor without a gradient, and nothing would say so. */
cx_tensor *cx_requires_grad(cx_tensor *t, bool on)
{
    if (!t || t->node->op == OP_ERROR) return t;
    const cx_node *x = t->node;
    if (on && !cx_dtype_is_float((cx_dtype)x->dtype)) {
        cx_set_last_error("requires_grad: dtype %s cannot require grad", cx_dtype_name((cx_dtype)x->dtype));
        return t;
    }
    if (on && x->op != OP_DATA && (x->flags & NF_REQUIRES_GRAD)) {
        cx_set_last_error("requires_grad: the tensor is the result of an op on tensors that require grad, not a "
                          "leaf: backward already takes its gradient to them");
        return t;
    }
    if (on && x->op != OP_DATA && cx_materialize(&t, 1, "requires_grad") != CX_OK) return t;
    return cx_autograd_mark_leaf(t, on);
}

cx_status cx_deferred_materialize(cx_tensor *t)
{
    cx_tensor *v = cx_deferred_values(t);
    if (!v) return CX_OK;   /* not deferred */
    cx_persist(v);
    cx_status st = cx_tensor_error(v) ? (cx_set_last_error("%s", cx_tensor_error(v)), CX_ERR_ARG) : cx_sync_tensors(&v, 1);
    /* v is a value now: the assignment shares its buffer, nothing runs */
    if (st == CX_OK) st = cx_assign(t, v);
    cx_free(v);
    return st;
}
/* A deferred tensor materializes straight into its shard: the recipe's
 * generator is fused into the slice, so only this rank's elements are ever
 * computed, each equal to the whole init's. */
static cx_status shard_deferred(cx_tensor *t, const cx_sharding *s)
{
    cx_tensor *v = cx_deferred_values(t);
    if (!v) { cx_set_last_error("mark_sharding: out of memory"); return CX_ERR_OOM; }
    cx_persist(v);
    cx_status st = cx_tensor_error(v) ? (cx_set_last_error("%s", cx_tensor_error(v)), CX_ERR_ARG) : cx_spmd_annotate(v, s);
    if (st == CX_OK) st = cx_sync_tensors(&v, 1);
    if (st == CX_OK) st = cx_assign(t, v);   /* a value: t shares its buffer, nothing runs */
    cx_free(v);
    return st;
}

cx_status cx_mark_sharding(cx_tensor *t, const cx_mesh *mesh, const cx_spec_entry *spec, int nspec)
{
    if (!t) { cx_set_last_error("mark_sharding: tensor is NULL"); return CX_ERR_ARG; }
    if (t->node->op == OP_ERROR) { cx_set_last_error("%s", t->node->err); return CX_ERR_SHAPE; }
    if (!mesh) mesh = cx_get_global_mesh();
    cx_sharding s;
    cx_status st = cx_spec_to_sharding(mesh, spec, nspec, t->node->ndim, t->node->shape, &s);
    if (st == CX_OK && cx_sharding_has_blocks(&s)) {
        cx_sharding u;
        int64_t ushape[CX_MAX_DIMS];
        if (!cx_sharding_unblocked(&s, t->node->shape, &u, ushape)) st = CX_ERR_ARG;
    }
    if (st != CX_OK) return st;
    cx_node *x = t->node;
    if (x->op == OP_DATA && !x->buf && x->init) return shard_deferred(t, &s);
    if (x->op == OP_DATA && !x->buf) {
        cx_set_last_error("mark_sharding: the tensor is a value-less placeholder");
        return CX_ERR_ARG;
    }
    if (x->op == OP_DATA && cx_sharding_equal(x->sharding, &s)) return CX_OK;
    if (x->op == OP_DATA && !x->sharding) return cx_sharding_is_replicated(&s) ? CX_OK : cx_shard_data_leaf(t, &s);
    if (t->flags & TF_REQUIRES_GRAD && x->op == OP_DATA) {
        cx_set_last_error("mark_sharding: a leaf that requires grad is already sharded as %s; it cannot be resharded",
                          cx_sharding_describe(x->sharding, (char[256]){ 0 }, 256));
        return CX_ERR_ARG;
    }
    return cx_spmd_annotate(t, &s);
}

cx_status cx_clear_sharding(cx_tensor *t)
{
    if (!t) { cx_set_last_error("clear_sharding: tensor is NULL"); return CX_ERR_ARG; }
    const cx_sharding *cur = t->node->sharding;
    if (!cur) return CX_OK;
    cx_spec_entry none[CX_MAX_DIMS] = { 0 };
    return cx_mark_sharding(t, cur->mesh, none, t->node->ndim);
}
cx_status cx_local_shard_to_host(cx_tensor *t, void *out, size_t cap_bytes, cx_dtype dtype, int64_t *shape)
{
    if (!t || !out) { cx_set_last_error("local_shard_to_host: NULL argument"); return CX_ERR_ARG; }
    if (t->node->op != OP_DATA) {
        cx_status st = cx_materialize(&t, 1, "value read");
        if (st != CX_OK) return st;
    }
    cx_node *x = t->node;
    if (!x->buf) { cx_set_last_error("local_shard_to_host: the tensor holds no value"); return CX_ERR_STATE; }
    int64_t local[CX_MAX_DIMS];
    memcpy(local, x->shape, sizeof local);
    if (x->sharding) cx_sharding_local_shape(x->sharding, x->shape, local);
    int64_t n = cx_shape_numel(local, x->ndim);
    if ((size_t)n * cx_dtype_size(dtype) > cap_bytes) {
        cx_set_last_error("local_shard_to_host: the shard has %lld elements; the buffer holds %zu bytes", (long long)n, cap_bytes);
        return CX_ERR_ARG;
    }
    if (shape) memcpy(shape, local, sizeof(int64_t) * (size_t)x->ndim);
    cx_convert_values(out, dtype, x->buf->data, (cx_dtype)x->dtype, n);
    return CX_OK;
}
