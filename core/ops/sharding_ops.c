/* Shardings on tensors: a host value cut to this rank's shard, and the
 * identity node that carries an annotation for the partitioner
 * (cx_mark_sharding is the API's, api/materialize.c, since a deferred
 * tensor is materialized there). */
#include "ops.h"
#include "sharding.h"
#include "backend.h"

/* A host value keeps only this rank's shard: a new data leaf. */
cx_status cx_shard_data_leaf(cx_tensor *t, const cx_sharding *s)
{
    cx_node *x = t->node;
    int64_t local[CX_MAX_DIMS];
    cx_sharding_local_shape(s, x->shape, local);
    size_t es = cx_dtype_size((cx_dtype)x->dtype);
    cx_buffer *b = cx_buffer_new((size_t)cx_shape_numel(local, x->ndim) * es);
    if (!b) return CX_ERR_OOM;
    cx_shard_copy(s, x->shape, cx_global_ordinal(), es, b->data, x->buf->data, true);
    cx_node *d = cx_node_data(b, (cx_dtype)x->dtype, x->shape, x->ndim);
    if (!d || !(d->sharding = cx_sharding_dup(s))) {
        if (d) cx_node_unref(d); else cx_buffer_unref(b);
        cx_set_last_error("mark_sharding: out of memory");
        return CX_ERR_OOM;
    }
    if (x->flags & NF_REQUIRES_GRAD) { d->flags |= NF_REQUIRES_GRAD; d->grad_leaf = x->grad_leaf; }
    cx_set_node(t, d);
    cx_node_unref(d);
    return CX_OK;
}

/* Anything else gets an identity node carrying the annotation: the
 * partitioner reshards the value there. */
static cx_status annotate(cx_tensor *t, const cx_sharding *s)
{
    cx_node *x = t->node;
    cx_node_desc d = { .op = OP_RESHAPE, .dtype = (cx_dtype)x->dtype, .ndim = x->ndim, .shape = x->shape,
                       .ninputs = 1, .inputs = &x, .flags = NF_PINNED | (x->flags & NF_REQUIRES_GRAD) };
    cx_node *n = cx_node_make(&d);
    if (n) n->sharding = malloc(sizeof *n->sharding);
    if (!n || !n->sharding) {
        if (n) cx_node_unref(n);
        cx_set_last_error("mark_sharding: out of memory");
        return CX_ERR_OOM;
    }
    *n->sharding = *s;
    cx_set_node(t, n);
    cx_node_unref(n);
    return CX_OK;
}

cx_status cx_spmd_annotate(cx_tensor *t, const cx_sharding *s)
{
    if (!t || t->node->op == OP_ERROR) return CX_OK;
    return annotate(t, s);
}

const char *cx_sharding_spec(cx_tensor *t, char *buf, size_t cap)
{
    if (!buf || !cap) return buf;
    return cx_sharding_describe(t ? t->node->sharding : NULL, buf, cap);
}
/* A data leaf over b (this rank's shard under s; taken). @return the
 * tensor, or a poisoned one naming `who`. */
static cx_tensor *shard_leaf(cx_buffer *b, cx_dtype dtype, const int64_t *global_shape, int ndim, const cx_sharding *s,
                             const char *who)
{
    cx_node *d = cx_node_data(b, dtype, global_shape, ndim);
    if (d && !cx_sharding_is_replicated(s) && !(d->sharding = cx_sharding_dup(s))) { cx_node_unref(d); d = NULL; b = NULL; }
    if (!d) {
        if (b) cx_buffer_unref(b);
        return cx_poisoned("%s: out of memory", who);
    }
    cx_counter_add("CreateDataHandles", 1);
    return cx_tensor_wrap(d);
}

cx_tensor *cx_from_host_sharded(const void *rows, int64_t row0, const int64_t *global_shape, int ndim, cx_dtype dtype,
                                const cx_mesh *mesh, const cx_spec_entry *spec, int nspec)
{
    if (!mesh) mesh = cx_get_global_mesh();
    if ((unsigned)dtype >= CX_DTYPE_COUNT) return cx_poisoned("from_host_sharded: unknown dtype %d", (int)dtype);
    if (ndim < 1 || ndim > CX_MAX_DIMS || !global_shape) return cx_poisoned("from_host_sharded: rank %d (1 to %d)", ndim, CX_MAX_DIMS);
    for (int d = 0; d < ndim; d++)
        if (global_shape[d] < 0) return cx_poisoned("from_host_sharded: dimension %d has size %lld", d, (long long)global_shape[d]);
    cx_sharding s;
    if (cx_spec_to_sharding(mesh, spec, nspec, ndim, global_shape, &s) != CX_OK) return cx_poisoned("from_host_sharded: %s", cx_last_error());
    if (cx_sharding_has_blocks(&s)) return cx_poisoned("from_host_sharded: a blocked split (use cx_from_local_shard)");
    int64_t mine0, mine_n;
    cx_shard_rows(mesh, spec, nspec, global_shape[0], &mine0, &mine_n);
    if (mine_n > 0 && (!rows || row0 < 0 || row0 > mine0))
        return cx_poisoned("from_host_sharded: the rows given start at %lld, but this rank's shard starts at row %lld",
                           (long long)row0, (long long)mine0);
    int64_t local[CX_MAX_DIMS];
    cx_sharding_local_shape(&s, global_shape, local);
    const int64_t n = cx_shape_numel(local, ndim);
    const size_t es = cx_dtype_size(dtype);
    /* held as cx_from_host holds it (XLA_USE_BF16: f32 as bf16), the rows
     * copied in `dtype` first */
    const cx_dtype held = cx_held_dtype(dtype);
    cx_buffer *b = cx_buffer_new((size_t)n * cx_dtype_size(held));
    if (!b) return cx_poisoned("from_host_sharded: %s", cx_last_error());
    void *copy = held == dtype ? b->data : malloc(n ? (size_t)n * es : 1);
    if (!copy) {
        cx_buffer_unref(b);
        return cx_poisoned("from_host_sharded: out of memory");
    }
    cx_shard_copy_rows(&s, global_shape, cx_global_ordinal(), es, copy, (void *)(uintptr_t)rows, true, row0);
    if (held != dtype) {
        cx_f32_to_bf16_row(b->data, copy, n); /* only f32 is held otherwise */
        free(copy);
    }
    return shard_leaf(b, held, global_shape, ndim, &s, "from_host_sharded");
}

int cx_get_sharding(cx_tensor *t, const cx_mesh **mesh, cx_spec_entry *spec, int cap)
{
    *mesh = NULL;
    const cx_sharding *s = t ? t->node->sharding : NULL;
    if (cx_sharding_is_replicated(s) || cap < s->ndim) return 0;
    for (int d = 0; d < s->ndim; d++) {
        memset(&spec[d], 0, sizeof spec[d]);
        spec[d].naxes = s->naxes[d];
        for (int i = 0; i < s->naxes[d]; i++) spec[d].axes[i] = s->axes[d][i];
        spec[d].blocks = cx_sharding_blocks(s, d) > 1 ? s->blocks[d] : 0;
    }
    *mesh = s->mesh;
    return s->ndim;
}

cx_tensor *cx_from_local_shard(const void *local, const int64_t *global_shape, int ndim, cx_dtype dtype,
                               const cx_mesh *mesh, const cx_spec_entry *spec, int nspec)
{
    if (!mesh) mesh = cx_get_global_mesh();
    if ((unsigned)dtype >= CX_DTYPE_COUNT) return cx_poisoned("from_local_shard: unknown dtype %d", (int)dtype);
    if (ndim < 0 || ndim > CX_MAX_DIMS || (ndim && !global_shape))
        return cx_poisoned("from_local_shard: rank %d (0 to %d)", ndim, CX_MAX_DIMS);
    for (int d = 0; d < ndim; d++)
        if (global_shape[d] < 0) return cx_poisoned("from_local_shard: dimension %d has size %lld", d, (long long)global_shape[d]);
    cx_sharding s;
    if (cx_spec_to_sharding(mesh, spec, nspec, ndim, global_shape, &s) != CX_OK)
        return cx_poisoned("from_local_shard: %s", cx_last_error());
    int64_t lshape[CX_MAX_DIMS];
    memcpy(lshape, global_shape, sizeof(int64_t) * (size_t)ndim);
    cx_sharding_local_shape(&s, global_shape, lshape);
    int64_t n = cx_shape_numel(lshape, ndim);
    if (n && !local) return cx_poisoned("from_local_shard: local is NULL");
    const cx_dtype held = cx_held_dtype(dtype); /* as cx_from_host holds it */
    cx_buffer *b = cx_buffer_new((size_t)n * cx_dtype_size(held));
    if (!b) return cx_poisoned("from_local_shard: %s", cx_last_error());
    if (n && held != dtype) cx_f32_to_bf16_row(b->data, local, n); /* only f32 is held otherwise */
    else if (n) memcpy(b->data, local, (size_t)n * cx_dtype_size(dtype));
    return shard_leaf(b, held, global_shape, ndim, &s, "from_local_shard");
}

cx_status cx_spmd_gather_value(const cx_node *x, void *out)
{
    const cx_sharding *s = x->sharding;
    int world = cx_world_size();
    size_t local_bytes = x->buf->bytes, es = cx_dtype_size((cx_dtype)x->dtype);
    char *all = malloc(local_bytes * (size_t)world + 1);
    if (!all) { cx_set_last_error("to_host: out of memory gathering a sharded tensor"); return CX_ERR_OOM; }
    cx_comm_op op = { .kind = CX_COLL_ALL_GATHER, .red = CX_RED_SUM, .scale = 1.0, .dtype = CX_U8, .in = x->buf->data,
                      .out = all, .count = (int64_t)local_bytes, .label = "gather a sharded tensor to host" };
    cx_status st = cx_comm_run(&op);
    for (int r = 0; st == CX_OK && r < world; r++)
        cx_shard_copy(s, x->shape, r, es, all + (size_t)r * local_bytes, out, false);
    free(all);
    return st;
}
