/* /shard_metadata: the FSDP layout of each unit, as plain HDF5 attributes
 * and arrays (readable with h5py without cxla). */
#include "ckpt_internal.h"

#include <stdlib.h>
#include <string.h>

void ckpt_units_free(ckpt_unit *u, int n)
{
    if (!u) return;
    for (int i = 0; i < n; i++) {
        free(u[i].path);
        free(u[i].flat_name);
        for (int p = 0; p < u[i].nparams && u[i].params; p++) free(u[i].params[p].name);
        free(u[i].params);
    }
    free(u);
}

static int write_i64_array(hid_t g, const char *name, const int64_t *v, hsize_t rows, hsize_t cols)
{
    hsize_t dims[2] = { rows, cols };
    hid_t s = H5Screate_simple(cols ? 2 : 1, dims, NULL);
    if (s < 0) return -1;
    hid_t d = H5Dcreate2(g, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = d >= 0 && H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0 ? 0 : -1;
    if (d >= 0) H5Dclose(d);
    H5Sclose(s);
    return rc;
}

static int write_names(hid_t g, const ckpt_unit *u)
{
    size_t w = 1;
    for (int p = 0; p < u->nparams; p++)
        if (strlen(u->params[p].name) > w) w = strlen(u->params[p].name);
    char *buf = calloc((size_t)u->nparams, w);
    if (!buf) return -1;
    for (int p = 0; p < u->nparams; p++) memcpy(buf + (size_t)p * w, u->params[p].name, strlen(u->params[p].name));
    hsize_t n = (hsize_t)u->nparams;
    hid_t t = H5Tcopy(H5T_C_S1), s = H5Screate_simple(1, &n, NULL), d = -1;
    int rc = -1;
    if (t >= 0 && s >= 0 && H5Tset_size(t, w) >= 0 && H5Tset_strpad(t, H5T_STR_NULLPAD) >= 0 &&
        (d = H5Dcreate2(g, "param_names", t, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) >= 0)
        rc = H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0 ? -1 : 0;
    if (d >= 0) H5Dclose(d);
    if (s >= 0) H5Sclose(s);
    if (t >= 0) H5Tclose(t);
    free(buf);
    return rc;
}

cx_status ckpt_units_write(hid_t file, const ckpt_unit *u, int n)
{
    hid_t root = ckpt_group_create(file, "shard_metadata");
    if (root < 0) goto fail;
    if (ckpt_attr_write_i64(root, "num_units", n) < 0) goto fail_root;
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "unit_%d", i);
        hid_t g = ckpt_group_create(root, name);
        if (g < 0) goto fail_root;
        const ckpt_unit *x = &u[i];
        int ok = ckpt_attr_write_str(g, "path", x->path) == 0 && ckpt_attr_write_str(g, "flat_name", x->flat_name) == 0 &&
                 ckpt_attr_write_i64(g, "num_params", x->nparams) == 0 &&
                 ckpt_attr_write_i64(g, "flat_numel", x->flat_numel) == 0 &&
                 ckpt_attr_write_i64(g, "padded_numel", x->padded_numel) == 0 &&
                 ckpt_attr_write_i64(g, "shard_numel", x->shard_numel) == 0 &&
                 ckpt_attr_write_i64(g, "padding", x->padding) == 0 &&
                 ckpt_attr_write_i64(g, "world_size", x->world) == 0 && ckpt_attr_write_i64(g, "rank", x->rank) == 0 &&
                 ckpt_attr_write_i64(g, "shard_offset", x->shard_offset) == 0;
        if (ok && x->nparams > 0) {
            int64_t *tab = calloc((size_t)x->nparams * (CX_MAX_DIMS + 3), sizeof *tab);
            if (!tab) ok = 0;
            if (ok) {
                int64_t *shapes = tab, *nd = tab + (size_t)x->nparams * CX_MAX_DIMS, *numel = nd + x->nparams,
                        *off = numel + x->nparams;
                for (int p = 0; p < x->nparams; p++) {
                    for (int d = 0; d < x->params[p].ndim; d++) shapes[p * CX_MAX_DIMS + d] = x->params[p].shape[d];
                    nd[p] = x->params[p].ndim;
                    numel[p] = x->params[p].numel;
                    off[p] = x->params[p].offset;
                }
                ok = write_names(g, x) == 0 &&
                     write_i64_array(g, "param_shapes", shapes, (hsize_t)x->nparams, CX_MAX_DIMS) == 0 &&
                     write_i64_array(g, "param_ndims", nd, (hsize_t)x->nparams, 0) == 0 &&
                     write_i64_array(g, "param_numels", numel, (hsize_t)x->nparams, 0) == 0 &&
                     write_i64_array(g, "param_offsets", off, (hsize_t)x->nparams, 0) == 0;
                free(tab);
            }
        }
        H5Gclose(g);
        if (!ok) goto fail_root;
    }
    H5Gclose(root);
    return CX_OK;
fail_root:
    H5Gclose(root);
fail:
    cx_set_last_error("checkpoint: cannot write /shard_metadata: %s", ckpt_h5_msg());
    return CX_ERR_IO;
}

static int read_i64_array(hid_t g, const char *name, int64_t *out, hsize_t expect)
{
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    if (d < 0) return -1;
    hid_t s = H5Dget_space(d);
    int rc = s >= 0 && (hsize_t)H5Sget_simple_extent_npoints(s) == expect &&
                     H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) >= 0
                 ? 0
                 : -1;
    if (s >= 0) H5Sclose(s);
    H5Dclose(d);
    return rc;
}

static int read_names(hid_t g, ckpt_unit *u)
{
    hid_t d = H5Dopen2(g, "param_names", H5P_DEFAULT);
    if (d < 0) return -1;
    int rc = -1;
    hid_t ft = H5Dget_type(d), s = H5Dget_space(d), mt = -1;
    char *buf = NULL;
    if (ft < 0 || s < 0 || H5Tget_class(ft) != H5T_STRING || H5Tis_variable_str(ft) > 0 ||
        H5Sget_simple_extent_npoints(s) != u->nparams)
        goto out;
    size_t w = H5Tget_size(ft);
    buf = calloc((size_t)u->nparams, w);
    mt = H5Tcopy(H5T_C_S1);
    if (!buf || mt < 0 || H5Tset_size(mt, w) < 0 || H5Tset_strpad(mt, H5T_STR_NULLPAD) < 0 ||
        H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
        goto out;
    rc = 0;
    for (int p = 0; p < u->nparams && rc == 0; p++) {
        u->params[p].name = strndup(buf + (size_t)p * w, w);
        if (!u->params[p].name) rc = -1;
    }
out:
    free(buf);
    if (mt >= 0) H5Tclose(mt);
    if (s >= 0) H5Sclose(s);
    if (ft >= 0) H5Tclose(ft);
    H5Dclose(d);
    return rc;
}

cx_status ckpt_units_read(hid_t file, const char *path, ckpt_unit **out, int *n)
{
    *out = NULL;
    *n = 0;
    hid_t root = H5Gopen2(file, "shard_metadata", H5P_DEFAULT);
    int64_t nu = -1;
    if (root < 0 || ckpt_attr_read_i64(root, "num_units", &nu) < 0 || nu < 0 || nu > 1 << 20) {
        if (root >= 0) H5Gclose(root);
        cx_set_last_error("%s: missing or bad /shard_metadata", path);
        return CX_ERR_IO;
    }
    ckpt_unit *u = calloc((size_t)(nu ? nu : 1), sizeof *u);
    if (!u) {
        H5Gclose(root);
        cx_set_last_error("%s: out of memory reading /shard_metadata", path);
        return CX_ERR_OOM;
    }
    const char *bad = NULL;
    char name[32];
    for (int i = 0; i < nu && !bad; i++) {
        snprintf(name, sizeof name, "unit_%d", i);
        hid_t g = H5Gopen2(root, name, H5P_DEFAULT);
        if (g < 0) { bad = "missing unit group"; break; }
        ckpt_unit *x = &u[i];
        char s1[1024], s2[1024];
        int64_t np = -1, world = 0, rank = 0;
        if (ckpt_attr_read_str(g, "path", s1, sizeof s1) < 0 || ckpt_attr_read_str(g, "flat_name", s2, sizeof s2) < 0 ||
            ckpt_attr_read_i64(g, "num_params", &np) < 0 || ckpt_attr_read_i64(g, "flat_numel", &x->flat_numel) < 0 ||
            ckpt_attr_read_i64(g, "padded_numel", &x->padded_numel) < 0 ||
            ckpt_attr_read_i64(g, "shard_numel", &x->shard_numel) < 0 ||
            ckpt_attr_read_i64(g, "padding", &x->padding) < 0 || ckpt_attr_read_i64(g, "world_size", &world) < 0 ||
            ckpt_attr_read_i64(g, "rank", &rank) < 0 || ckpt_attr_read_i64(g, "shard_offset", &x->shard_offset) < 0 ||
            np < 0 || np > 1 << 24) {
            bad = "missing unit attributes";
            H5Gclose(g);
            break;
        }
        x->world = (int)world;
        x->rank = (int)rank;
        x->path = strdup(s1);
        x->flat_name = strdup(s2);
        x->params = calloc((size_t)(np ? np : 1), sizeof *x->params);
        if (!x->path || !x->flat_name || !x->params) { bad = "out of memory"; H5Gclose(g); break; }
        x->nparams = (int)np;
        if (np > 0) {
            int64_t *tab = calloc((size_t)np * (CX_MAX_DIMS + 3), sizeof *tab);
            if (!tab) { bad = "out of memory"; H5Gclose(g); break; }
            int64_t *shapes = tab, *nd = tab + (size_t)np * CX_MAX_DIMS, *numel = nd + np, *off = numel + np;
            if (read_names(g, x) < 0 || read_i64_array(g, "param_shapes", shapes, (hsize_t)np * CX_MAX_DIMS) < 0 ||
                read_i64_array(g, "param_ndims", nd, (hsize_t)np) < 0 ||
                read_i64_array(g, "param_numels", numel, (hsize_t)np) < 0 ||
                read_i64_array(g, "param_offsets", off, (hsize_t)np) < 0)
                bad = "missing or malformed parameter tables";
            for (int p = 0; p < np && !bad; p++) {
                ckpt_pinfo *pi = &x->params[p];
                pi->ndim = (int)nd[p];
                if (pi->ndim < 0 || pi->ndim > CX_MAX_DIMS) { bad = "bad parameter rank"; break; }
                int64_t e = 1;
                for (int d = 0; d < pi->ndim; d++) {
                    pi->shape[d] = shapes[p * CX_MAX_DIMS + d];
                    if (pi->shape[d] < 0) e = -1;
                    else e *= pi->shape[d];
                }
                pi->numel = numel[p];
                pi->offset = off[p];
                if (e != pi->numel) { bad = "a parameter's shape does not match its numel"; break; }
            }
            free(tab);
        }
        H5Gclose(g);
    }
    H5Gclose(root);
    if (bad) {
        ckpt_units_free(u, (int)nu);
        cx_set_last_error("%s: /shard_metadata: %s", path, bad);
        return CX_ERR_IO;
    }
    *out = u;
    *n = (int)nu;
    return CX_OK;
}

cx_status ckpt_units_relayout(const ckpt_unit *src, int n, int world, int rank, int multiple, ckpt_unit **out)
{
    *out = NULL;
    if (multiple < 1) multiple = 1;
    ckpt_unit *u = calloc((size_t)(n ? n : 1), sizeof *u);
    if (!u) goto oom;
    for (int i = 0; i < n; i++) {
        const ckpt_unit *s = &src[i];
        ckpt_unit *x = &u[i];
        x->path = strdup(s->path);
        x->flat_name = strdup(s->flat_name);
        x->params = calloc((size_t)(s->nparams ? s->nparams : 1), sizeof *x->params);
        if (!x->path || !x->flat_name || !x->params) goto oom_free;
        x->nparams = s->nparams;
        for (int p = 0; p < s->nparams; p++) {
            x->params[p] = s->params[p];
            x->params[p].name = strdup(s->params[p].name);
            if (!x->params[p].name) goto oom_free;
        }
        int64_t q = (int64_t)world * multiple;
        x->flat_numel = s->flat_numel;
        x->padded_numel = (s->flat_numel + q - 1) / q * q;
        if (x->padded_numel == 0) x->padded_numel = q;   /* every rank holds a (padding) shard */
        x->padding = x->padded_numel - x->flat_numel;
        x->shard_numel = x->padded_numel / world;
        x->world = world;
        x->rank = rank;
        x->shard_offset = (int64_t)rank * x->shard_numel;
    }
    *out = u;
    return CX_OK;
oom_free:
    ckpt_units_free(u, n);
oom:
    cx_set_last_error("checkpoint: out of memory for the shard metadata");
    return CX_ERR_OOM;
}
