/* The data of shards: a rank's shard to and from host memory, the geometry
 * of a shard in the global value (boxes), gathering a sharded value. */
#include "internal.h"
#include "spmd_internal.h"

#include <stdlib.h>

/* Moves the rows of every shard between a global array and this rank's
 * padded shard (to_local: global -> shard, zeros in the padding). */
static void shard_copy_rows(const cx_sharding *s, const int64_t *global, int rank, size_t es, void *local_buf,
                            void *global_buf, bool to_local, int64_t row0)
{
    int nd = s->ndim;
    int64_t local[CX_MAX_DIMS] = { 0 }, start[CX_MAX_DIMS] = { 0 }, gstride[CX_MAX_DIMS] = { 0 }, idx[CX_MAX_DIMS] = { 0 };
    cx_sharding_local_shape(s, global, local);
    int64_t g = 1;
    for (int d = nd - 1; d >= 0; d--) { gstride[d] = g; g *= global[d]; start[d] = cx_sharding_index(s, d, rank) * local[d]; }
    int64_t inner = nd ? local[nd - 1] : 1, rows = cx_shape_numel(local, nd) / (inner ? inner : 1);
    int64_t valid_inner = nd ? global[nd - 1] - start[nd - 1] : 1;
    if (valid_inner > inner) valid_inner = inner;
    if (valid_inner < 0) valid_inner = 0;
    for (int64_t r = 0; r < rows && inner; r++) {
        char *lrow = (char *)local_buf + (size_t)(r * inner) * es;
        bool inside = true;
        int64_t off = 0;
        for (int d = 0; d < nd - 1; d++) {
            int64_t gi = start[d] + idx[d];
            if (gi >= global[d]) inside = false;
            off += gi * gstride[d];
        }
        if (nd) off += start[nd - 1];
        if (nd > 1) off -= row0 * gstride[0];
        else off -= row0;
        if (to_local) {
            if (inside && valid_inner) memcpy(lrow, (char *)global_buf + (size_t)off * es, (size_t)valid_inner * es);
            memset(lrow + (size_t)(inside ? valid_inner : 0) * es, 0, (size_t)(inner - (inside ? valid_inner : 0)) * es);
        } else if (inside && valid_inner) {
            memcpy((char *)global_buf + (size_t)off * es, lrow, (size_t)valid_inner * es);
        }
        for (int d = nd - 2; d >= 0; d--) { if (++idx[d] < local[d]) break; idx[d] = 0; }
    }
}

/* Blocked dimensions are copied as their plain two-dimensional view (the
 * same bytes in the same order). */
void cx_shard_copy(const cx_sharding *s, const int64_t *global, int rank, size_t es, void *local_buf,
                       void *global_buf, bool to_local)
{
    cx_sharding u;
    int64_t ushape[CX_MAX_DIMS];
    if (cx_sharding_has_blocks(s) && cx_sharding_unblocked(s, global, &u, ushape))
        shard_copy_rows(&u, ushape, rank, es, local_buf, global_buf, to_local, 0);
    else
        shard_copy_rows(s, global, rank, es, local_buf, global_buf, to_local, 0);
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

cx_status cx_shard_rows(const cx_mesh *mesh, const cx_spec_entry *spec, int nspec, int64_t dim0, int64_t *row0,
                        int64_t *nrows)
{
    cx_sharding s;
    if (!mesh) mesh = cx_get_global_mesh();
    cx_status st = cx_spec_to_sharding(mesh, spec, nspec, nspec, NULL, &s);
    if (st != CX_OK) return st;
    if (nspec && cx_sharding_blocks(&s, 0) > 1) {
        cx_set_last_error("shard_rows: dimension 0 is split in blocks; rows of a batch split contiguously");
        return CX_ERR_ARG;
    }
    if (nspec == 0) { *row0 = 0; *nrows = 1; return CX_OK; }
    int64_t k = cx_sharding_ways(&s, 0), local = (dim0 + k - 1) / k;
    *row0 = cx_sharding_index(&s, 0, cx_comm_rank()) * local;
    if (*row0 > dim0) *row0 = dim0;
    *nrows = dim0 - *row0 < local ? dim0 - *row0 : local;
    return CX_OK;
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
    size_t es = cx_dtype_size(dtype);
    cx_buffer *b = cx_buffer_new((size_t)cx_shape_numel(local, ndim) * es);
    if (!b) return cx_poisoned("from_host_sharded: %s", cx_last_error());
    shard_copy_rows(&s, global_shape, cx_comm_rank(), es, b->data, (void *)(uintptr_t)rows, true, row0);
    return shard_leaf(b, dtype, global_shape, ndim, &s, "from_host_sharded");
}

/* ---- reads ------------------------------------------------------------------------------------ */

cx_status cx_spmd_gather_value(const cx_node *x, void *out)
{
    const cx_sharding *s = x->sharding;
    int world = cx_comm_world_size();
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

/* ---- geometry ------------------------------------------------------------------------------- */

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

const char *cx_mesh_axis_name(const cx_mesh *mesh, int a)
{
    return mesh && a >= 0 && a < mesh->ndim ? mesh->names[a] : NULL;
}

cx_status cx_shard_local_shape(const cx_mesh *mesh, const cx_spec_entry *spec, int nspec, const int64_t *global_shape,
                               int ndim, int64_t *local)
{
    cx_sharding s;
    if (!mesh) mesh = cx_get_global_mesh();
    cx_status st = cx_spec_to_sharding(mesh, spec, nspec, ndim, global_shape, &s);
    if (st == CX_OK) cx_sharding_local_shape(&s, global_shape, local);
    return st;
}

/* Box k of rank's shard: the mixed-radix digits of k pick a block of each
 * blocked dimension. */
static void shard_box(const cx_sharding *s, const int64_t *global, int rank, int64_t k, cx_shard_box *box)
{
    memset(box, 0, sizeof *box);
    for (int d = s->ndim - 1; d >= 0; d--) {
        int64_t b = cx_sharding_blocks(s, d), part = global[d] / b, ways = cx_sharding_ways(s, d);
        int64_t piece = (part + ways - 1) / ways, blk = k % b;
        k /= b;
        int64_t start = cx_sharding_index(s, d, rank) * piece, count = part - start;
        if (count > piece) count = piece;
        if (count < 0) count = 0;
        box->start[d] = blk * part + (count ? start : 0);
        box->count[d] = count;
        box->local_start[d] = blk * piece;
    }
}

int cx_shard_boxes(const cx_mesh *mesh, const cx_spec_entry *spec, int nspec, const int64_t *global_shape, int ndim,
                   int rank, cx_shard_box *boxes, int cap)
{
    cx_sharding s;
    int coords[CX_MESH_MAX_DIMS];
    if (!mesh) mesh = cx_get_global_mesh();
    if (cx_spec_to_sharding(mesh, spec, nspec, ndim, global_shape, &s) != CX_OK) return -1;
    if (!cx_mesh_coords(mesh, rank, coords)) {
        cx_set_last_error("shard_boxes: rank %d is not a device of the mesh", rank);
        return -1;
    }
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= cx_sharding_blocks(&s, d);
    for (int64_t k = 0; k < n && k < cap; k++) shard_box(&s, global_shape, rank, k, &boxes[k]);
    return (int)n;
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
    cx_buffer *b = cx_buffer_new((size_t)n * cx_dtype_size(dtype));
    if (!b) return cx_poisoned("from_local_shard: %s", cx_last_error());
    if (n) memcpy(b->data, local, (size_t)n * cx_dtype_size(dtype));
    return shard_leaf(b, dtype, global_shape, ndim, &s, "from_local_shard");
}
