/* zstd as HDF5 filter 32015, registered at first use, so compressed
 * checkpoints need no plugin (other HDF5 tools read them with any zstd
 * filter plugin for that id). */
#include "ckpt_internal.h"

#include <zstd.h>

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

cx_status ckpt_zstd_check_level(const char *who, int level)
{
    if (level >= 0 && level <= 22) return CX_OK;
    cx_set_last_error("%s: compression level %d outside 0..22", who, level);
    return CX_ERR_ARG;
}
