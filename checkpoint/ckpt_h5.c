/* HDF5 helpers: one-line errors, types, attributes, groups, element-range
 * selections and the tensor datasets of a checkpoint file. */
/* memfd_create */
#define _GNU_SOURCE
#include "ckpt_internal.h"
#include "cx_settings.h"

#include <sys/mman.h>
#include <unistd.h>

#include "cx_vec.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t g_h5_once = PTHREAD_ONCE_INIT;
static int g_h5_ok;

static void h5_init_once(void)
{
    /* one-line errors of our own instead of HDF5's stack dumps on stderr */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    g_h5_ok = ckpt_zstd_register() == 0;
}

int ckpt_h5_init(void)
{
    pthread_once(&g_h5_once, h5_init_once);
    /* the auto-print setting is per thread in a thread-safe HDF5 */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (!g_h5_ok) {
        cx_set_last_error("checkpoint: cannot register the zstd HDF5 filter %d", CX_CKPT_ZSTD_FILTER);
        return -1;
    }
    return 0;
}

static herr_t walk_first(unsigned n, const H5E_error2_t *e, void *ctx)
{
    (void)n;
    char *out = ctx;
    if (!out[0] && e->desc) snprintf(out, 256, "%s", e->desc);
    return 0;
}

/* HDF5's file drivers describe a failed system call over several lines
 * ("file write failed: time = ...\n, filename = ..., errno = 28, error
 * message = 'No space left on device', ..."): keep the system's words. */
static void one_line(char *msg, size_t cap)
{
    const char *em = strstr(msg, "error message = '");
    if (em) {
        char tmp[256];
        const char *what = em + strlen("error message = '"), *end = strchr(what, '\'');
        int n = end ? (int)(end - what) : (int)strlen(what);
        const char *colon = strchr(msg, ':');
        int head = colon && colon < em ? (int)(colon - msg) : 0;
        snprintf(tmp, sizeof tmp, "%.*s%s%.*s", head, msg, head ? ": " : "", n, what);
        snprintf(msg, cap, "%s", tmp);
    }
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
}

const char *ckpt_h5_msg(void)
{
    static _Thread_local char msg[256];
    msg[0] = '\0';
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_first, msg);
    H5Eclear2(H5E_DEFAULT);
    if (!msg[0]) snprintf(msg, sizeof msg, "HDF5 error");
    one_line(msg, sizeof msg);
    return msg;
}

/* Closes a file whose writes failed. HDF5 1.10 keeps a file whose close
 * could not flush, and its exit handler then crashes closing it again; so
 * the file's descriptor is first pointed at an anonymous memory file, where
 * the last flush succeeds and goes nowhere. (The caller removes the file.) */
void ckpt_h5_discard_close(hid_t fid)
{
    int *fdp = NULL;
    if (H5Fget_vfd_handle(fid, H5P_DEFAULT, (void **)&fdp) >= 0 && fdp && *fdp >= 0) {
        int mem = memfd_create("cxla-discarded-checkpoint", MFD_CLOEXEC);
        if (mem >= 0) {
            dup2(mem, *fdp);
            close(mem);
        }
    }
    H5Fclose(fid);
    H5Eclear2(H5E_DEFAULT);
}

cx_dtype ckpt_saved_dtype(const cx_tensor *t)
{
    cx_dtype dt = cx_dtype_of(t);
    bool held = cx_setting_enum("XLA_USE_BF16") == 1 || cx_setting_enum("XLA_DOWNCAST_BF16") == 1;
    return dt == CX_BF16 && held ? CX_F32 : dt;
}

hid_t ckpt_h5_type(cx_dtype dt)
{
    switch (dt) {
    case CX_F32: return H5T_IEEE_F32LE;
    case CX_BF16: return H5T_STD_U16LE;   /* raw bits; the "dtype" attribute says bf16 */
    case CX_I32: return H5T_STD_I32LE;
    case CX_I64: return H5T_STD_I64LE;
    case CX_U8:
    case CX_BOOL: return H5T_STD_U8LE;
    default: return -1;
    }
}

int ckpt_attr_write_str(hid_t obj, const char *name, const char *v)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0) return -1;
    int rc = -1;
    hid_t s = -1, a = -1;
    if (H5Tset_size(t, strlen(v) ? strlen(v) : 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLPAD) < 0) goto out;
    if ((s = H5Screate(H5S_SCALAR)) < 0) goto out;
    if ((a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT)) < 0) goto out;
    char one[2] = { 0, 0 };
    rc = H5Awrite(a, t, strlen(v) ? v : one) < 0 ? -1 : 0;
out:
    if (a >= 0) H5Aclose(a);
    if (s >= 0) H5Sclose(s);
    H5Tclose(t);
    return rc;
}

static int attr_write_num(hid_t obj, const char *name, hid_t type, const void *v)
{
    hid_t s = H5Screate(H5S_SCALAR);
    if (s < 0) return -1;
    hid_t a = H5Acreate2(obj, name, type, s, H5P_DEFAULT, H5P_DEFAULT);
    int rc = a >= 0 && H5Awrite(a, type, v) >= 0 ? 0 : -1;
    if (a >= 0) H5Aclose(a);
    H5Sclose(s);
    return rc;
}

int ckpt_attr_write_i64(hid_t obj, const char *name, int64_t v) { return attr_write_num(obj, name, H5T_NATIVE_INT64, &v); }
int ckpt_attr_write_u64(hid_t obj, const char *name, uint64_t v) { return attr_write_num(obj, name, H5T_NATIVE_UINT64, &v); }

int ckpt_attr_write_i64s(hid_t obj, const char *name, const int64_t *v, int64_t n)
{
    return ckpt_attr_write_i64_array(obj, name, v, 1, &n);
}

int ckpt_attr_write_i64_array(hid_t obj, const char *name, const int64_t *v, int rank, const int64_t *dims)
{
    hsize_t d[CX_MAX_DIMS];
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        d[i] = (hsize_t)dims[i];
        n *= dims[i];
    }
    hid_t s = n > 0 ? H5Screate_simple(rank, d, NULL) : H5Screate(H5S_NULL);
    if (s < 0) return -1;
    hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    int rc = a >= 0 && (n == 0 || H5Awrite(a, H5T_NATIVE_INT64, v) >= 0) ? 0 : -1;
    if (a >= 0) H5Aclose(a);
    H5Sclose(s);
    return rc;
}

int ckpt_attr_read_i64s(hid_t obj, const char *name, int64_t *v, int64_t cap, int64_t *n)
{
    if (H5Aexists(obj, name) <= 0) return -1;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) return -1;
    hid_t ft = H5Aget_type(a), sp = H5Aget_space(a);
    hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    H5S_class_t cls = sp >= 0 ? H5Sget_simple_extent_type(sp) : H5S_NO_CLASS;
    int rc = -1;
    if (ft >= 0 && H5Tget_class(ft) == H5T_INTEGER && np >= 0 && np <= cap) {
        *n = cls == H5S_NULL ? 0 : (int64_t)np;
        rc = *n == 0 || H5Aread(a, H5T_NATIVE_INT64, v) >= 0 ? 0 : -1;
    }
    if (sp >= 0) H5Sclose(sp);
    if (ft >= 0) H5Tclose(ft);
    H5Aclose(a);
    return rc;
}

int ckpt_attr_read_str(hid_t obj, const char *name, char *out, size_t cap)
{
    out[0] = '\0';
    if (H5Aexists(obj, name) <= 0) return -1;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) return -1;
    int rc = -1;
    hid_t ft = H5Aget_type(a), mt = -1;
    if (ft < 0 || H5Tget_class(ft) != H5T_STRING || H5Tis_variable_str(ft) > 0) goto out;
    size_t n = H5Tget_size(ft);
    char *tmp = calloc(1, n + 1);
    if (!tmp) goto out;
    mt = H5Tcopy(H5T_C_S1);
    if (mt >= 0 && H5Tset_size(mt, n) >= 0 && H5Tset_strpad(mt, H5T_STR_NULLPAD) >= 0 && H5Aread(a, mt, tmp) >= 0) {
        snprintf(out, cap, "%s", tmp);
        rc = 0;
    }
    free(tmp);
out:
    if (mt >= 0) H5Tclose(mt);
    if (ft >= 0) H5Tclose(ft);
    H5Aclose(a);
    return rc;
}

static int attr_read_num(hid_t obj, const char *name, hid_t type, void *v)
{
    if (H5Aexists(obj, name) <= 0) return -1;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) return -1;
    hid_t ft = H5Aget_type(a);
    hid_t sp = H5Aget_space(a);
    int rc = ft >= 0 && sp >= 0 && H5Tget_class(ft) == H5T_INTEGER && H5Sget_simple_extent_npoints(sp) == 1 &&
                     H5Aread(a, type, v) >= 0
                 ? 0
                 : -1;
    if (sp >= 0) H5Sclose(sp);
    if (ft >= 0) H5Tclose(ft);
    H5Aclose(a);
    return rc;
}

int ckpt_attr_read_i64(hid_t obj, const char *name, int64_t *v) { return attr_read_num(obj, name, H5T_NATIVE_INT64, v); }
int ckpt_attr_read_u64(hid_t obj, const char *name, uint64_t *v) { return attr_read_num(obj, name, H5T_NATIVE_UINT64, v); }

hid_t ckpt_group_create(hid_t parent, const char *name)
{
    hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
    if (gcpl < 0) return -1;
    hid_t g = -1;
    if (H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED) >= 0)
        g = H5Gcreate2(parent, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
    H5Pclose(gcpl);
    return g;
}

hid_t ckpt_group_at(hid_t parent, const char *name, const char *file, const char *what)
{
    hid_t g = H5Lexists(parent, name, H5P_DEFAULT) > 0 ? H5Gopen2(parent, name, H5P_DEFAULT)
                                                         : ckpt_group_create(parent, name);
    if (g < 0) cx_set_last_error("%s: cannot create %s: %s", file, what, ckpt_h5_msg());
    return g;
}

typedef struct {
    ckpt_name_list *l;
    bool oom;
} collect_ctx;

static herr_t collect(hid_t g, const char *name, const H5L_info_t *info, void *ctx)
{
    (void)g;
    (void)info;
    collect_ctx *c = ctx;
    ckpt_name_list *l = c->l;
    if (!CX_GROW(l->names, l->cap, l->n + 1) || !(l->names[l->n] = strdup(name))) {
        c->oom = true;
        return -1;
    }
    l->n++;
    return 0;
}

void ckpt_name_list_free(ckpt_name_list *l)
{
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof *l);
}

int ckpt_list_group(hid_t parent, const char *path, ckpt_name_list *l)
{
    memset(l, 0, sizeof *l);
    if (H5Lexists(parent, path, H5P_DEFAULT) <= 0) return 0;
    hid_t g = H5Gopen2(parent, path, H5P_DEFAULT);
    if (g < 0) return -1;
    collect_ctx c = { l, false };
    hsize_t idx = 0;
    herr_t rc = H5Literate(g, H5_INDEX_CRT_ORDER, H5_ITER_INC, &idx, collect, &c);
    if (rc < 0 && !c.oom) {
        /* written without a creation-order index (another tool): name order */
        ckpt_name_list_free(l);
        idx = 0;
        rc = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &c);
    }
    H5Gclose(g);
    if (rc < 0) ckpt_name_list_free(l);
    return rc < 0 ? -1 : 0;
}

/* Creation-order tracking at the root and the 1.8 object format
 * (checksummed metadata), which h5py and h5dump read. */
hid_t ckpt_file_create(const char *path)
{
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), fapl = H5Pcreate(H5P_FILE_ACCESS), f = -1;
    if (fcpl >= 0 && fapl >= 0 &&
        H5Pset_link_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED) >= 0 &&
        H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) >= 0)
        f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, fapl);
    if (fcpl >= 0) H5Pclose(fcpl);
    if (fapl >= 0) H5Pclose(fapl);
    return f;
}

/* Boxes of the row-major range [a, b) within the block at `start` (leading
 * coordinates fixed up to dim d). */
static int select_rec(hid_t space, const hsize_t *dims, int ndim, int d, hsize_t *start, int64_t a, int64_t b,
                      bool *first)
{
    if (a >= b) return 0;
    int64_t inner = 1;
    for (int k = d + 1; k < ndim; k++) inner *= (int64_t)dims[k];
    int64_t i0 = a / inner, i1 = (b - 1) / inner;
    if (i0 == i1 && !(a % inner == 0 && b - a == inner)) {
        start[d] = (hsize_t)i0;
        return select_rec(space, dims, ndim, d + 1, start, a - i0 * inner, b - i0 * inner, first);
    }
    /* partial head row, whole rows, partial tail row */
    int64_t full0 = a % inner ? i0 + 1 : i0, full1 = b % inner ? i1 : i1 + 1;   /* [full0, full1) */
    if (a % inner) {
        start[d] = (hsize_t)i0;
        if (select_rec(space, dims, ndim, d + 1, start, a % inner, inner, first) < 0) return -1;
    }
    if (full1 > full0) {
        hsize_t st[CX_MAX_DIMS], cnt[CX_MAX_DIMS];
        for (int k = 0; k < ndim; k++) {
            if (k < d) { st[k] = start[k]; cnt[k] = 1; }
            else if (k == d) { st[k] = (hsize_t)full0; cnt[k] = (hsize_t)(full1 - full0); }
            else { st[k] = 0; cnt[k] = dims[k]; }
        }
        if (H5Sselect_hyperslab(space, *first ? H5S_SELECT_SET : H5S_SELECT_OR, st, NULL, cnt, NULL) < 0) return -1;
        *first = false;
    }
    if (b % inner && i1 >= full1) {
        start[d] = (hsize_t)i1;
        if (select_rec(space, dims, ndim, d + 1, start, 0, b % inner, first) < 0) return -1;
    }
    return 0;
}

int ckpt_select_range(hid_t space, const hsize_t *dims, int ndim, int64_t a, int64_t b)
{
    if (ndim == 0) return H5Sselect_all(space) < 0 ? -1 : 0;
    if (a >= b) return H5Sselect_none(space) < 0 ? -1 : 0;
    hsize_t start[CX_MAX_DIMS] = { 0 };
    bool first = true;
    return select_rec(space, dims, ndim, 0, start, a, b, &first);
}

static int64_t numel_of(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

hid_t ckpt_dataset_create(hid_t parent, const char *name, cx_dtype dt, const int64_t *shape, int ndim, int level)
{
    hsize_t dims[CX_MAX_DIMS];
    for (int i = 0; i < ndim; i++) dims[i] = (hsize_t)shape[i];
    hid_t space = ndim ? H5Screate_simple(ndim, dims, NULL) : H5Screate(H5S_SCALAR);
    if (space < 0) return -1;
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t d = -1;
    if (dcpl < 0) goto out;
    int64_t n = numel_of(shape, ndim);
    if (level > 0 && ndim > 0 && n > 0) {
        /* chunks of whole trailing rows, about 1 MiB each */
        hsize_t chunk[CX_MAX_DIMS];
        int64_t elems = ((int64_t)1 << 20) / (int64_t)cx_dtype_size(dt);
        for (int i = ndim - 1; i >= 0; i--) {
            int64_t c = dims[i] ? (int64_t)dims[i] : 1;
            if (c > elems) c = elems;
            if (c < 1) c = 1;
            chunk[i] = (hsize_t)c;
            elems /= c;
        }
        unsigned int cd = (unsigned int)level;
        if (H5Pset_chunk(dcpl, ndim, chunk) < 0 ||
            H5Pset_filter(dcpl, CX_CKPT_ZSTD_FILTER, H5Z_FLAG_MANDATORY, 1, &cd) < 0)
            goto out;
    }
    d = H5Dcreate2(parent, name, ckpt_h5_type(dt), space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
out:
    if (dcpl >= 0) H5Pclose(dcpl);
    H5Sclose(space);
    return d;
}

int ckpt_dataset_attrs(hid_t d, cx_dtype dt, const char *kind, uint64_t hash)
{
    if (ckpt_attr_write_str(d, "dtype", cx_dtype_name(dt)) < 0) return -1;
    if (kind && ckpt_attr_write_str(d, "kind", kind) < 0) return -1;
    return ckpt_attr_write_u64(d, ckpt_hash_attr(CX_CKPT_FORMAT_VERSION), hash);
}

int ckpt_dataset_write_all(hid_t d, cx_dtype dt, const void *buf, int64_t numel)
{
    if (numel == 0) return 0;
    return H5Dwrite(d, ckpt_h5_type(dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0 ? -1 : 0;
}

int ckpt_dataset_write_range(hid_t d, cx_dtype dt, const int64_t *shape, int ndim, int64_t a, int64_t b,
                             const void *buf)
{
    if (b <= a) return 0;
    hsize_t dims[CX_MAX_DIMS], n = (hsize_t)(b - a);
    for (int i = 0; i < ndim; i++) dims[i] = (hsize_t)shape[i];
    hid_t fs = H5Dget_space(d);
    hid_t ms = H5Screate_simple(1, &n, NULL);
    int rc = -1;
    if (fs >= 0 && ms >= 0 && ckpt_select_range(fs, dims, ndim, a, b) == 0)
        rc = H5Dwrite(d, ckpt_h5_type(dt), ndim ? ms : H5S_ALL, ndim ? fs : H5S_ALL, H5P_DEFAULT, buf) < 0 ? -1 : 0;
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    return rc;
}

int ckpt_dataset_shape(hid_t d, int *ndim, int64_t *shape, int64_t *numel)
{
    hid_t sp = H5Dget_space(d);
    if (sp < 0) return -1;
    int nd = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[CX_MAX_DIMS];
    int rc = -1;
    if (nd >= 0 && nd <= CX_MAX_DIMS && H5Sget_simple_extent_dims(sp, dims, NULL) >= 0) {
        *ndim = nd;
        *numel = 1;
        for (int i = 0; i < nd; i++) {
            shape[i] = (int64_t)dims[i];
            *numel *= shape[i];
        }
        rc = 0;
    }
    H5Sclose(sp);
    return rc;
}

int ckpt_dataset_dtype(hid_t d, cx_dtype *dt)
{
    char name[32];
    if (ckpt_attr_read_str(d, "dtype", name, sizeof name) == 0)
        for (int t = 0; t < CX_DTYPE_COUNT; t++)
            if (!strcmp(name, cx_dtype_name((cx_dtype)t))) {
                *dt = (cx_dtype)t;
                return 0;
            }
    hid_t ft = H5Dget_type(d);
    if (ft < 0) return -1;
    H5T_class_t c = H5Tget_class(ft);
    size_t sz = H5Tget_size(ft);
    H5Tclose(ft);
    if (c == H5T_FLOAT && sz == 4) *dt = CX_F32;
    else if (c == H5T_INTEGER && sz == 8) *dt = CX_I64;
    else if (c == H5T_INTEGER && sz == 4) *dt = CX_I32;
    else if (c == H5T_INTEGER && sz == 1) *dt = CX_U8;
    else return -1;
    return 0;
}
