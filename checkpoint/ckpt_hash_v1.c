/* cxh64, the checksum of format version 1, kept only to verify files of
 * that version (the marker's file checksums and the datasets' "cxh64"
 * attributes). Nothing new is written with it: see ckpt_hash.c. */
#include "ckpt_internal.h"

#include <string.h>

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

void ckpt_cxh64_v1_init(ckpt_cxh64_v1 *h)
{
    memset(h, 0, sizeof *h);
    h->v[0] = P1 + P2;
    h->v[1] = P2;
    h->v[2] = 0;
    h->v[3] = (uint64_t)0 - P1;
}

static void blocks(ckpt_cxh64_v1 *h, const unsigned char *p, size_t nblocks)
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

void ckpt_cxh64_v1_update(ckpt_cxh64_v1 *h, const void *data, size_t n)
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

uint64_t ckpt_cxh64_v1_final(const ckpt_cxh64_v1 *h)
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
