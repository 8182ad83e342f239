/* Hashing for every checksum and key in the library: XXH3 from Debian's
 * libxxhash (64-bit checksums, 128-bit graph and cache keys). */
#ifndef CX_UTIL_HASH_H
#define CX_UTIL_HASH_H

#include <stdbool.h>
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

/* XXH3-64 of data that arrives in pieces: the same value as cx_hash64 over
 * the whole. The state is libxxhash's own allocation, since its layout is
 * only public to programs linked statically against one xxhash version. */
typedef struct { XXH3_state_t *state; } cx_hash64_stream;

/* @return false when out of memory. */
static inline bool cx_hash64_begin(cx_hash64_stream *h)
{
    h->state = XXH3_createState();
    if (h->state && XXH3_64bits_reset(h->state) == XXH_OK) return true;
    XXH3_freeState(h->state);
    h->state = NULL;
    return false;
}

static inline void cx_hash64_update(cx_hash64_stream *h, const void *data, size_t n)
{
    XXH3_64bits_update(h->state, data, n);
}

/* The hash of everything fed in; releases the state. */
static inline uint64_t cx_hash64_end(cx_hash64_stream *h)
{
    uint64_t v = XXH3_64bits_digest(h->state);
    XXH3_freeState(h->state);
    h->state = NULL;
    return v;
}

/* Releases the state of a hash whose value is not wanted (NULL-safe). */
static inline void cx_hash64_drop(cx_hash64_stream *h)
{
    XXH3_freeState(h->state);
    h->state = NULL;
}

#endif
