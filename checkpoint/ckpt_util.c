/* Checkpoint plumbing: checksum, HDF5 helpers, the zstd filter, file names
 * and the commit marker. */
#include "ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

void (*ckpt_test_hook)(const char *phase);

/* ---- checksum ---------------------------------------------------------------- */

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);   /* little-endian hosts only, as the rest of the format */
    return v;
}
static inline uint64_t lane(uint64_t acc, uint64_t w) { return rotl(acc + w * P2, 31) * P1; }

void ckpt_hash_init(ckpt_hash *h)
{
    memset(h, 0, sizeof *h);
    h->v[0] = P1 + P2;
    h->v[1] = P2;
    h->v[2] = 0;
    h->v[3] = (uint64_t)0 - P1;
}

static void blocks(ckpt_hash *h, const unsigned char *p, size_t nblocks)
{
    uint64_t a = h->v[0], b = h->v[1], c = h->v[2], d = h->v[3];
    for (size_t i = 0; i < nblocks; i++, p += 32) {
        a = lane(a, load64(p));
        b = lane(b, load64(p + 8));
        c = lane(c, load64(p + 16));
        d = lane(d, load64(p + 24));
    }
    h->v[0] = a; h->v[1] = b; h->v[2] = c; h->v[3] = d;
}

void ckpt_hash_update(ckpt_hash *h, const void *data, size_t n)
{
    const unsigned char *p = data;
    h->total += n;
    if (h->nbuf) {
        size_t take = 32 - h->nbuf < n ? 32 - h->nbuf : n;
        memcpy(h->buf + h->nbuf, p, take);
        h->nbuf += take;
        p += take;
        n -= take;
        if (h->nbuf < 32) return;
        blocks(h, h->buf, 1);
        h->nbuf = 0;
    }
    blocks(h, p, n / 32);
    p += n / 32 * 32;
    n %= 32;
    memcpy(h->buf, p, n);
    h->nbuf = n;
}

uint64_t ckpt_hash_final(const ckpt_hash *h)
{
    uint64_t x = rotl(h->v[0], 1) + rotl(h->v[1], 7) + rotl(h->v[2], 12) + rotl(h->v[3], 18);
    for (int i = 0; i < 4; i++) x = (x ^ lane(0, h->v[i])) * P1 + P4;
    x += h->total;
    const unsigned char *p = h->buf;
    size_t n = h->nbuf;
    for (; n >= 8; n -= 8, p += 8) x = rotl(x ^ lane(0, load64(p)), 27) * P1 + P4;
    for (; n; n--, p++) x = rotl(x ^ (*p * P3), 11) * P1;
    x ^= x >> 33;
    x *= P2;
    x ^= x >> 29;
    x *= P3;
    x ^= x >> 32;
    return x;
}

uint64_t ckpt_hash_bytes(const void *data, size_t n)
{
    ckpt_hash h;
    ckpt_hash_init(&h);
    ckpt_hash_update(&h, data, n);
    return ckpt_hash_final(&h);
}

cx_status ckpt_hash_file(const char *path, bool fsync_first, uint64_t *hash, int64_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        cx_set_last_error("checkpoint: cannot open %s: %s", path, strerror(errno));
        return CX_ERR_IO;
    }
    if (fsync_first && fsync(fd) != 0) {
        cx_set_last_error("checkpoint: fsync %s: %s", path, strerror(errno));
        close(fd);
        return CX_ERR_IO;
    }
    /* the file is read back right after it is written, so this is normally a
     * page-cache read; tell the kernel we go front to back */
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        cx_set_last_error("checkpoint: out of memory hashing %s", path);
        return CX_ERR_OOM;
    }
    ckpt_hash h;
    ckpt_hash_init(&h);
    int64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            cx_set_last_error("checkpoint: read %s: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return CX_ERR_IO;
        }
        if (r == 0) break;
        ckpt_hash_update(&h, buf, (size_t)r);
        total += r;
    }
    free(buf);
    close(fd);
    *hash = ckpt_hash_final(&h);
    if (size) *size = total;
    return CX_OK;
}

/* ---- zstd as HDF5 filter 32015 ---------------------------------------------------- */

/* cd_values[0] is the compression level. On read the frame carries its own
 * content size, so the level is not needed. HDF5 owns *buf (H5allocate_memory). */
static size_t zstd_filter(unsigned int flags, size_t cd_nelmts, const unsigned int cd_values[], size_t nbytes,
                          size_t *buf_size, void **buf)
{
    if (flags & H5Z_FLAG_REVERSE) {
        unsigned long long n = ZSTD_getFrameContentSize(*buf, nbytes);
        if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN) return 0;
        void *out = H5allocate_memory(n ? (size_t)n : 1, false);
        if (!out) return 0;
        size_t got = ZSTD_decompress(out, (size_t)n, *buf, nbytes);
        if (ZSTD_isError(got) || got != n) {
            H5free_memory(out);
            return 0;
        }
        H5free_memory(*buf);
        *buf = out;
        *buf_size = (size_t)n;
        return (size_t)n;
    }
    int level = cd_nelmts > 0 ? (int)cd_values[0] : 3;
    size_t cap = ZSTD_compressBound(nbytes);
    void *out = H5allocate_memory(cap, false);
    if (!out) return 0;
    size_t got = ZSTD_compress(out, cap, *buf, nbytes, level);
    if (ZSTD_isError(got)) {
        H5free_memory(out);
        return 0;
    }
    H5free_memory(*buf);
    *buf = out;
    *buf_size = cap;
    return got;
}

static const H5Z_class2_t g_zstd_class = {
    .version = H5Z_CLASS_T_VERS,
    .id = CX_CKPT_ZSTD_FILTER,
    .encoder_present = 1,
    .decoder_present = 1,
    .name = "zstd (cxla)",
    .can_apply = NULL,
    .set_local = NULL,
    .filter = zstd_filter,
};

int ckpt_zstd_register(void)
{
    if (H5Zfilter_avail(CX_CKPT_ZSTD_FILTER) > 0) return 0;   /* a plugin or an earlier call */
    return H5Zregister(&g_zstd_class) < 0 ? -1 : 0;
}

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

const char *ckpt_h5_msg(void)
{
    static _Thread_local char msg[256];
    msg[0] = '\0';
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_first, msg);
    H5Eclear2(H5E_DEFAULT);
    if (!msg[0]) snprintf(msg, sizeof msg, "HDF5 error");
    return msg;
}

/* ---- HDF5 helpers ------------------------------------------------------------------ */

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
    return ckpt_attr_write_u64(d, "cxh64", hash);
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

void ckpt_strlcpy(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

int ckpt_split_state(const char *full, char *param, size_t cap, const char **state)
{
    const char *dot = strrchr(full, '.');
    if (!dot || dot == full || !dot[1] || (size_t)(dot - full) >= cap) return -1;
    memcpy(param, full, (size_t)(dot - full));
    param[dot - full] = '\0';
    *state = dot + 1;
    return 0;
}

/* ---- names, directories, the commit marker ------------------------------------------- */

void ckpt_file_name(char *out, size_t cap, const char *prefix, int r, int w)
{
    snprintf(out, cap, "%s_rank-%d-of-%d.h5", prefix, r, w);
}

void ckpt_marker_name(char *out, size_t cap, const char *prefix) { snprintf(out, cap, "%s.commit", prefix); }

void ckpt_dir_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == path) snprintf(out, cap, "/");
    else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

int ckpt_fsync_dir(const char *path)
{
    char dir[4096];
    ckpt_dir_of(path, dir, sizeof dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

cx_status ckpt_marker_write(const char *prefix, const ckpt_marker *m)
{
    char path[4096], tmp[4200];
    ckpt_marker_name(path, sizeof path, prefix);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        cx_set_last_error("checkpoint: cannot write %s: %s", tmp, strerror(errno));
        return CX_ERR_IO;
    }
    fprintf(f, "%s %d\nprefix %s\nworld_size %d\nstrategy %s\nstep %lld\nfiles %d\n", CKPT_MARKER_MAGIC, m->version,
            base_name(prefix), m->world, m->strategy, (long long)m->step, m->nfiles);
    for (int i = 0; i < m->nfiles; i++)
        fprintf(f, "file %s %lld %016llx\n", m->files[i].name, (long long)m->files[i].size,
                (unsigned long long)m->files[i].hash);
    fprintf(f, "end\n");
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        cx_set_last_error("checkpoint: cannot commit %s: %s", path, strerror(errno));
        unlink(tmp);
        return CX_ERR_IO;
    }
    ckpt_fsync_dir(path);
    return CX_OK;
}

void ckpt_marker_release(ckpt_marker *m)
{
    if (!m) return;
    free(m->files);
    m->files = NULL;
    m->nfiles = 0;
}

cx_status ckpt_marker_read(const char *prefix, ckpt_marker *m)
{
    char path[4096];
    ckpt_marker_name(path, sizeof path, prefix);
    memset(m, 0, sizeof *m);
    FILE *f = fopen(path, "r");
    if (!f) {
        cx_set_last_error("checkpoint %s is not committed: no commit marker %s", prefix, path);
        return CX_ERR_IO;
    }
    char line[1024], word[64], str[600];
    long long ll;
    int nfiles = -1, got = 0;
    bool ended = false, bad = false;
    while (!bad && fgets(line, sizeof line, f)) {
        if (!strchr(line, '\n')) { bad = true; break; }
        if (got == 0) {
            if (sscanf(line, "%63s %d", word, &m->version) != 2 || strcmp(word, CKPT_MARKER_MAGIC)) bad = true;
            got = 1;
            continue;
        }
        if (sscanf(line, "%63s", word) != 1) { bad = true; break; }
        if (!strcmp(word, "world_size")) { if (sscanf(line, "%*s %d", &m->world) != 1) bad = true; }
        else if (!strcmp(word, "strategy")) { if (sscanf(line, "%*s %31s", m->strategy) != 1) bad = true; }
        else if (!strcmp(word, "step")) { if (sscanf(line, "%*s %lld", &ll) != 1) bad = true; else m->step = ll; }
        else if (!strcmp(word, "prefix")) { /* informational */ }
        else if (!strcmp(word, "files")) {
            if (sscanf(line, "%*s %d", &nfiles) != 1 || nfiles < 1 || nfiles > 1 << 20 || m->files) { bad = true; break; }
            m->files = calloc((size_t)nfiles, sizeof *m->files);
            if (!m->files) { bad = true; break; }
        } else if (!strcmp(word, "file")) {
            unsigned long long h;
            if (!m->files || m->nfiles >= nfiles || sscanf(line, "%*s %511s %lld %llx", str, &ll, &h) != 3) { bad = true; break; }
            ckpt_marker_file *mf = &m->files[m->nfiles++];
            ckpt_strlcpy(mf->name, sizeof mf->name, str);
            mf->size = ll;
            mf->hash = h;
        } else if (!strcmp(word, "end")) { ended = true; break; }
        else bad = true;
    }
    fclose(f);
    if (bad || !ended || m->version != CX_CKPT_FORMAT_VERSION || m->nfiles != nfiles || m->world < 1) {
        cx_set_last_error("checkpoint %s: commit marker %s is malformed or of an unsupported version", prefix, path);
        ckpt_marker_release(m);
        return CX_ERR_IO;
    }
    return CX_OK;
}

const char *cx_ckpt_strategy_name(cx_ckpt_strategy s)
{
    switch (s) {
    case CX_CKPT_SINGLE: return "none";
    case CX_CKPT_DDP: return "ddp";
    case CX_CKPT_FSDP_ZERO2: return "fsdp-zero2";
    case CX_CKPT_FSDP_ZERO3: return "fsdp-zero3";
    }
    return "unknown";
}

bool cx_ckpt_is_committed(const char *prefix)
{
    ckpt_marker m;
    if (!prefix || ckpt_marker_read(prefix, &m) != CX_OK) return false;
    char dir[4096], path[5000];
    ckpt_dir_of(prefix, dir, sizeof dir);
    bool ok = true;
    for (int i = 0; i < m.nfiles && ok; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, m.files[i].name);
        ok = stat(path, &st) == 0 && st.st_size == m.files[i].size;
    }
    ckpt_marker_release(&m);
    return ok;
}
