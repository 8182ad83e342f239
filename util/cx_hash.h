/* Hashing for every checksum and key in the library: XXH3 from Debian's
 * libxxhash (64-bit checksums, 128-bit graph and cache keys). */
#ifndef CX_UTIL_HASH_H
#define CX_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

typedef struct { uint64_t hi, lo; } cx_key128;

static inline uint64_t cx_hash64(const void *data, size_t n) { return XXH3_64bits(data, n); }
/* Chained: hashes more data after a previous hash (its value as the seed). */
static inline uint64_t cx_hash64_more(const void *data, size_t n, uint64_t prev)
{
    return XXH3_64bits_withSeed(data, n, prev);
}

static inline cx_key128 cx_hash128(const void *data, size_t n)
{
    XXH128_hash_t h = XXH3_128bits(data, n);
    return (cx_key128){ h.high64, h.low64 };
}

#endif
