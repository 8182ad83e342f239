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
    if (!read_exact(f, magic, 4) || magic[0] != 0 || magic[1] != 0) {
        gzclose(f);
        cx_set_last_error("cx_idx_read: %s is not an IDX file (bad magic)", path);
        return CX_ERR_IO;
    }
    if (magic[2] != 0x08 || magic[3] < 1 || magic[3] > 4) {
        gzclose(f);
        cx_set_last_error("cx_idx_read: %s: unsupported IDX type 0x%02x with %d dims (want unsigned bytes, 1-4 dims)",
                     path, magic[2], magic[3]);
        return CX_ERR_IO;
    }
    int ndim = magic[3];
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        uint8_t d[4];
        if (!read_exact(f, d, 4)) {
            gzclose(f);
            cx_set_last_error("cx_idx_read: %s is truncated (header)", path);
            return CX_ERR_IO;
        }
        /* IDX stores dimensions big-endian. */
        uint32_t v = ((uint32_t)d[0] << 24) | ((uint32_t)d[1] << 16) | ((uint32_t)d[2] << 8) | d[3];
        out->dims[i] = v;
        numel *= v;
    }
    out->ndim = ndim;
    out->data = malloc(numel ? numel : 1);
    if (!out->data) {
        gzclose(f);
        cx_set_last_error("cx_idx_read: %s: out of memory for %zu bytes", path, numel);
        return CX_ERR_OOM;
    }
    if (!read_exact(f, out->data, numel)) {
        gzclose(f);
        cx_idx_array_release(out);
        cx_set_last_error("cx_idx_read: %s is truncated (want %zu data bytes)", path, numel);
        return CX_ERR_IO;
    }
    gzclose(f);
    return CX_OK;
}

void cx_idx_array_release(cx_idx_array *a)
{
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}
