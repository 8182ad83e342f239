/* SPMD saves: each rank writes the shards it holds of every tensor, with
 * the global shape, the global boxes each shard covers and its sharding,
 * so that a load needs neither the source mesh nor its world size. A shard
 * held by several ranks (the same boxes) is written by the lowest of them,
 * a replicated tensor by rank 0 alone. No data moves between ranks. */
#include "ckpt_internal.h"

#include <stdlib.h>
#include <string.h>

static bool same_boxes(const cx_shard_box *a, const cx_shard_box *b, int n, int nd)
{
    for (int k = 0; k < n; k++)
        for (int d = 0; d < nd; d++)
            if (a[k].start[d] != b[k].start[d] || a[k].count[d] != b[k].count[d]) return false;
    return true;
}

static int64_t boxes_volume(const cx_shard_box *b, int n, int nd)
{
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        int64_t v = 1;
        for (int d = 0; d < nd; d++) v *= b[k].count[d];
        total += v;
    }
    return total;
}

/* Whether a rank below `rank` holds the same boxes (it writes them then).
 * Every rank is a device of the mesh (a mesh has one device per rank). */
static bool lower_rank_holds(const cx_mesh *mesh, const cx_spec_entry *spec, int nd, const int64_t *shape, int rank,
                             const cx_shard_box *mine, int nb, cx_shard_box *tmp)
{
    for (int r = 0; r < rank; r++)
        if (cx_shard_boxes(mesh, spec, nd, shape, nd, r, tmp, nb) == nb && same_boxes(mine, tmp, nb, nd)) return true;
    return false;
}

/* Zeros every element of the padded shard that no box covers (padding
 * holds whatever the program left there). The covered set is a product of
 * one set per dimension, as the boxes are the blocks' combinations. */
static int zero_padding(char *buf, size_t es, const int64_t *local, int nd, const cx_shard_box *b, int nb)
{
    int64_t total = 0, off[CX_MAX_DIMS], idx[CX_MAX_DIMS] = { 0 };
    for (int d = 0; d < nd; d++) {
        off[d] = total;
        total += local[d];
    }
    unsigned char *mask = calloc((size_t)(total ? total : 1), 1);
    if (!mask) return -1;
    for (int k = 0; k < nb; k++)
        for (int d = 0; d < nd; d++)
            for (int64_t i = 0; i < b[k].count[d]; i++) mask[off[d] + b[k].local_start[d] + i] = 1;
    int64_t inner = local[nd - 1], rows = 1;
    for (int d = 0; d < nd - 1; d++) rows *= local[d];
    for (int64_t r = 0; r < rows && inner > 0; r++) {
        bool row_in = true;
        for (int d = 0; d < nd - 1; d++) row_in = row_in && mask[off[d] + idx[d]];
        char *row = buf + (size_t)(r * inner) * es;
        for (int64_t i = 0; i < inner; i++)
            if (!row_in || !mask[off[nd - 1] + i]) memset(row + (size_t)i * es, 0, es);
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < local[d]) break;
            idx[d] = 0;
        }
    }
    free(mask);
    return 0;
}

/* Creates parent/name holding buf (shape, dtype) with the tensor
 * attributes. @return the open dataset, or -1 with the error set. */
static hid_t put_dataset(hid_t parent, const char *name, cx_dtype dt, const int64_t *shape, int nd, const void *buf,
                         const char *kind, int level, const char *path)
{
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    hid_t d = ckpt_dataset_create(parent, name, dt, shape, nd, level);
    if (d < 0 || ckpt_dataset_write_all(d, dt, buf, n) < 0 ||
        ckpt_dataset_attrs(d, dt, kind, ckpt_hash_bytes(buf, (size_t)n * cx_dtype_size(dt))) < 0) {
        cx_set_last_error("%s: cannot write %s: %s", path, name, ckpt_h5_msg());
        if (d >= 0) H5Dclose(d);
        return -1;
    }
    return d;
}

/* The sharding in words and the mesh as numbers: what a reader needs to
 * understand the shard (a load needs only the boxes). */
static int put_sharding(hid_t d, cx_tensor *t, const cx_mesh *mesh, const cx_shard_box *b, int nb, int nd)
{
    char desc[512], names[CX_MESH_MAX_DIMS * (CX_MESH_AXIS_NAME_MAX + 1) + 1] = "";
    int mshape[CX_MESH_MAX_DIMS], mnd = cx_mesh_shape(mesh, mshape), ndev = cx_mesh_device_ids(mesh, NULL, 0);
    int64_t m64[CX_MESH_MAX_DIMS];
    for (int a = 0; a < mnd; a++) {
        m64[a] = mshape[a];
        const char *nm = cx_mesh_axis_name(mesh, a);
        strcat(names, a ? "," : "");
        strcat(names, nm ? nm : "");
    }
    int *ids = malloc(sizeof(int) * (size_t)ndev);
    int64_t *ids64 = malloc(sizeof(int64_t) * (size_t)ndev), *flat = malloc(sizeof(int64_t) * (size_t)(3 * nd * nb));
    int rc = -1;
    int64_t bdims[3] = { nb, 3, nd };   /* box, {start, count, local_start}, dimension */
    if (ids && ids64 && flat) {
        cx_mesh_device_ids(mesh, ids, ndev);
        for (int i = 0; i < ndev; i++) ids64[i] = ids[i];
        for (int k = 0; k < nb; k++)
            for (int x = 0; x < nd; x++) {
                flat[(3 * k + 0) * nd + x] = b[k].start[x];
                flat[(3 * k + 1) * nd + x] = b[k].count[x];
                flat[(3 * k + 2) * nd + x] = b[k].local_start[x];
            }
        rc = ckpt_attr_write_i64s(d, "global_shape", cx_shape(t), nd) < 0 ||
                     ckpt_attr_write_i64_array(d, "shard_boxes", flat, 3, bdims) < 0 ||
                     ckpt_attr_write_str(d, "sharding", cx_sharding_spec(t, desc, sizeof desc)) < 0 ||
                     ckpt_attr_write_i64s(d, "mesh_shape", m64, mnd) < 0 ||
                     ckpt_attr_write_i64s(d, "mesh_device_ids", ids64, ndev) < 0 ||
                     ckpt_attr_write_str(d, "mesh_axis_names", names) < 0
                 ? -1
                 : 0;
    }
    free(ids);
    free(ids64);
    free(flat);
    return rc;
}

/* This rank's shard of t (numel elements) into buf (allocated), its shape
 * into local; with boxes, the padding is zeroed. */
static cx_status local_shard(cx_tensor *t, const cx_shard_box *b, int nb, int64_t numel, int64_t *local, void **out,
                             const char *path, const char *name)
{
    cx_dtype dt = ckpt_saved_dtype(t);
    size_t bytes = (size_t)numel * cx_dtype_size(dt);
    char *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        cx_set_last_error("%s: out of memory for the shard of %s (%zu bytes)", path, name, bytes);
        return CX_ERR_OOM;
    }
    cx_status st = cx_local_shard_to_host(t, buf, bytes, dt, local);
    if (st != CX_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cx_last_error());
        cx_set_last_error("%s: cannot read the shard of %s: %s", path, name, msg);
    } else if (b && zero_padding(buf, cx_dtype_size(dt), local, cx_ndim(t), b, nb) < 0) {
        cx_set_last_error("%s: out of memory for the shard of %s", path, name);
        st = CX_ERR_OOM;
    }
    if (st != CX_OK) free(buf);
    else *out = buf;
    return st;
}

static cx_status write_whole(hid_t parent, const char *name, cx_tensor *t, const char *kind, int level, const char *path)
{
    int64_t shape[CX_MAX_DIMS];
    void *buf = NULL;
    cx_status st = local_shard(t, NULL, 0, cx_numel(t), shape, &buf, path, name);
    if (st != CX_OK) return st;
    hid_t d = put_dataset(parent, name, ckpt_saved_dtype(t), cx_shape(t), cx_ndim(t), buf, kind, level, path);
    free(buf);
    if (d < 0) return CX_ERR_IO;
    H5Dclose(d);
    return CX_OK;
}

/* This rank's boxes of t: *out (allocated with room for as many more),
 * *nb of them. */
static cx_status rank_boxes(cx_tensor *t, const cx_mesh *mesh, const cx_spec_entry *spec, int nd, cx_shard_box **out,
                            int *nb, const char *path, const char *name)
{
    int n = cx_shard_boxes(mesh, spec, nd, cx_shape(t), nd, cx_global_ordinal(), NULL, 0);
    if (n <= 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cx_last_error());
        cx_set_last_error("%s: %s: %s", path, name, msg);
        return CX_ERR_ARG;
    }
    *out = calloc((size_t)n * 2, sizeof **out);
    if (!*out) {
        cx_set_last_error("%s: %s: out of memory for its %d boxes", path, name, n);
        return CX_ERR_OOM;
    }
    *nb = cx_shard_boxes(mesh, spec, nd, cx_shape(t), nd, cx_global_ordinal(), *out, n);
    return CX_OK;
}

static cx_status write_shard(hid_t parent, const char *name, cx_tensor *t, const cx_mesh *mesh,
                             const cx_spec_entry *spec, int nd, const char *kind, int level, const char *path,
                             int64_t *written)
{
    cx_shard_box *b = NULL;
    int nb = 0;
    cx_status st = rank_boxes(t, mesh, spec, nd, &b, &nb, path, name);
    if (st != CX_OK) return st;
    int64_t local[CX_MAX_DIMS], numel = 1;
    st = cx_shard_local_shape(mesh, spec, nd, cx_shape(t), nd, local);
    for (int d = 0; d < nd; d++) numel *= local[d];
    if (st == CX_OK && boxes_volume(b, nb, nd) > 0 &&
        !lower_rank_holds(mesh, spec, nd, cx_shape(t), cx_global_ordinal(), b, nb, b + nb)) {
        void *buf = NULL;
        st = local_shard(t, b, nb, numel, local, &buf, path, name);
        hid_t d = st == CX_OK ? put_dataset(parent, name, ckpt_saved_dtype(t), local, nd, buf, kind, level, path) : -1;
        if (st == CX_OK && d < 0) st = CX_ERR_IO;
        if (d >= 0 && put_sharding(d, t, mesh, b, nb, nd) < 0) {
            cx_set_last_error("%s: cannot write the sharding of %s: %s", path, name, ckpt_h5_msg());
            st = CX_ERR_IO;
        }
        if (d >= 0) H5Dclose(d);
        free(buf);
        if (st == CX_OK) (*written)++;
    }
    free(b);
    return st;
}

cx_status ckpt_spmd_write_tensor(hid_t parent, const char *name, cx_tensor *t, const char *kind, int level,
                                 const char *path, int64_t *written)
{
    const cx_mesh *mesh = NULL;
    cx_spec_entry spec[CX_MAX_DIMS];
    int nd = cx_get_sharding(t, &mesh, spec, CX_MAX_DIMS);
    if (mesh) return write_shard(parent, name, t, mesh, spec, nd, kind, level, path, written);
    if (cx_global_ordinal() != 0) return CX_OK;
    cx_status st = write_whole(parent, name, t, kind, level, path);
    if (st == CX_OK) (*written)++;
    return st;
}

cx_status ckpt_spmd_write_meta(hid_t fid, const char *path, int rank, int world, int64_t datasets)
{
    hid_t g = ckpt_group_create(fid, "spmd_metadata");
    bool ok = g >= 0 && ckpt_attr_write_i64(g, "world_size", world) == 0 && ckpt_attr_write_i64(g, "rank", rank) == 0 &&
              ckpt_attr_write_i64(g, "datasets", datasets) == 0;
    if (g >= 0) H5Gclose(g);
    if (ok) return CX_OK;
    cx_set_last_error("%s: cannot write /spmd_metadata: %s", path, ckpt_h5_msg());
    return CX_ERR_IO;
}
