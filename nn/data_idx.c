/* IDX file reader (the MNIST format), gzip or raw. */
#include "nn_internal.h"

#include <cxla/data.h>

#include <errno.h>
#include <zlib.h>

/* Reads exactly n bytes. @return true on success. */
static bool read_exact(gzFile f, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n > 0) {
        unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
        int got = gzread(f, p, chunk);
        if (got <= 0) return false;
        p += got;
        n -= (size_t)got;
    }
    return true;
}

/* The header after the magic: ndim big-endian dims into out. @return the
 * element count, or 0 with the error set (truncated, or more than 2^40
 * bytes claimed: a corrupt header must not make us allocate it). */
static size_t read_dims(gzFile f, const char *path, int ndim, cx_idx_array *out)
{
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        uint8_t d[4];
        if (!read_exact(f, d, 4)) {
            cx_set_last_error("cx_idx_read: %s is truncated (header)", path);
            return 0;
        }
        /* IDX stores dimensions big-endian. */
        uint32_t v = ((uint32_t)d[0] << 24) | ((uint32_t)d[1] << 16) | ((uint32_t)d[2] << 8) | d[3];
        out->dims[i] = v;
        if (__builtin_mul_overflow(numel, (uint64_t)v, &numel) || numel > ((uint64_t)1 << 40)) {
            cx_set_last_error("cx_idx_read: %s: the header claims more than 2^40 bytes of data", path);
            return 0;
        }
    }
    if (numel == 0) cx_set_last_error("cx_idx_read: %s: the header claims no data", path);
    return (size_t)numel;
}

/* Reads numel data bytes, growing the buffer as they arrive, so that a
 * header larger than its file fails as truncated, not as a huge allocation. */
static cx_status read_data(gzFile f, const char *path, size_t numel, cx_idx_array *out)
{
    size_t have = 0, cap = 0;
    while (have < numel) {
        if (have == cap) {
            size_t next = cap ? cap * 2 : 1 << 20;
            if (next > numel) next = numel;
            uint8_t *p = realloc(out->data, next);
            if (!p) {
                cx_set_last_error("cx_idx_read: %s: out of memory for %zu bytes", path, next);
                return CX_ERR_OOM;
            }
            out->data = p;
            cap = next;
        }
        unsigned chunk = cap - have > (1u << 30) ? (1u << 30) : (unsigned)(cap - have);
        int got = gzread(f, out->data + have, chunk);
        if (got <= 0) {
            cx_set_last_error("cx_idx_read: %s is truncated (want %zu data bytes, got %zu)", path, numel, have);
            return CX_ERR_IO;
        }
        have += (size_t)got;
    }
    return CX_OK;
}

cx_status cx_idx_read(const char *path, cx_idx_array *out)
{
    if (!out) { cx_set_last_error("cx_idx_read: out is NULL"); return CX_ERR_ARG; }
    memset(out, 0, sizeof *out);
    if (!path) { cx_set_last_error("cx_idx_read: path is NULL"); return CX_ERR_ARG; }
    /* gzopen reads plain files transparently, so one path serves both. */
    gzFile f = gzopen(path, "rb");
    if (!f) {
        cx_set_last_error("cx_idx_read: cannot open %s: %s", path, strerror(errno ? errno : ENOENT));
        return CX_ERR_IO;
    }
    uint8_t magic[4];
    cx_status st = CX_ERR_IO;
    if (!read_exact(f, magic, 4) || magic[0] != 0 || magic[1] != 0) {
        cx_set_last_error("cx_idx_read: %s is not an IDX file (bad magic)", path);
    } else if (magic[2] != 0x08 || magic[3] < 1 || magic[3] > 4) {
        cx_set_last_error("cx_idx_read: %s: unsupported IDX type 0x%02x with %d dims (want unsigned bytes, 1-4 dims)",
                     path, magic[2], magic[3]);
    } else {
        out->ndim = magic[3];
        size_t numel = read_dims(f, path, out->ndim, out);
        if (numel) st = read_data(f, path, numel, out);
    }
    gzclose(f);
    if (st != CX_OK) cx_idx_array_release(out);
    return st;
}

void cx_idx_array_release(cx_idx_array *a)
{
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}
