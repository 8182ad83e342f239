/* The checksum of checkpoint files and datasets, cxh64: a 64-bit, 4-lane
 * multiply-rotate hash, fast enough to run at memory speed, so verifying a
 * file costs about one page-cache read. */
#include "ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
