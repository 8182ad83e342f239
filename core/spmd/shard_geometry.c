/* The geometry of shards: where a rank's shard lies in the global value
 * (rows, boxes) and copying it between the two layouts. Plain arrays, no
 * tensors: the tensors made from shards are ops/sharding_ops.c's, and
 * reading them back api/materialize.c's. */
#include "sharding.h"
#include "backend.h"

#include <stdlib.h>

/* Moves the rows of every shard between a global array and this rank's
 * padded shard (to_local: global -> shard, zeros in the padding). */
void cx_shard_copy_rows(const cx_sharding *s, const int64_t *global, int rank, size_t es, void *local_buf,
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
        cx_shard_copy_rows(&u, ushape, rank, es, local_buf, global_buf, to_local, 0);
    else
        cx_shard_copy_rows(s, global, rank, es, local_buf, global_buf, to_local, 0);
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
    *row0 = cx_sharding_index(&s, 0, cx_global_ordinal()) * local;
    if (*row0 > dim0) *row0 = dim0;
    *nrows = dim0 - *row0 < local ? dim0 - *row0 : local;
    return CX_OK;
}

/* ---- geometry ------------------------------------------------------------------------------- */

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
