/* Checksums of checkpoint files and datasets, by format version: XXH3-64
 * (util/cx_hash.h) since version 2, cxh64 for reading version-1 files. */
#include "ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int ckpt_hasher_begin(ckpt_hasher *h, int version)
{
    h->version = version;
    h->xxh3.state = NULL;
    if (version == 1) {
        ckpt_cxh64_v1_init(&h->v1);
        return 0;
    }
    if (cx_hash64_begin(&h->xxh3)) return 0;
    cx_set_last_error("checkpoint: out of memory for a checksum state");
    return -1;
}

void ckpt_hasher_update(ckpt_hasher *h, const void *data, size_t n)
{
    if (h->version == 1) ckpt_cxh64_v1_update(&h->v1, data, n);
    else cx_hash64_update(&h->xxh3, data, n);
}

uint64_t ckpt_hasher_end(ckpt_hasher *h)
{
    return h->version == 1 ? ckpt_cxh64_v1_final(&h->v1) : cx_hash64_end(&h->xxh3);
}

void ckpt_hasher_drop(ckpt_hasher *h) { cx_hash64_drop(&h->xxh3); }

uint64_t ckpt_hash_bytes(const void *data, size_t n) { return cx_hash64(data, n); }

const char *ckpt_hash_attr(int version) { return version == 1 ? "cxh64" : "xxh3_64"; }

static cx_status hash_fd(int fd, const char *path, ckpt_hasher *h, int64_t *total)
{
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        cx_set_last_error("checkpoint: out of memory hashing %s", path);
        return CX_ERR_OOM;
    }
    *total = 0;
    cx_status st = CX_OK;
    for (;;) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            cx_set_last_error("checkpoint: read %s: %s", path, strerror(errno));
            st = CX_ERR_IO;
        }
        if (r <= 0) break;
        ckpt_hasher_update(h, buf, (size_t)r);
        *total += r;
    }
    free(buf);
    return st;
}

cx_status ckpt_hash_file(const char *path, int version, bool fsync_first, uint64_t *hash, int64_t *size)
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
    ckpt_hasher h;
    int64_t total = 0;
    cx_status st = ckpt_hasher_begin(&h, version) == 0 ? CX_OK : CX_ERR_OOM;
    if (st == CX_OK) st = hash_fd(fd, path, &h, &total);
    close(fd);
    if (st != CX_OK) {
        ckpt_hasher_drop(&h);
        return st;
    }
    *hash = ckpt_hasher_end(&h);
    if (size) *size = total;
    return CX_OK;
}
