/* Counter-based RNG (Philox-4x32-10) and the global stream's state. The
 * ops that draw from it are ops/rng.c. */
#include "philox.h"

#include <cxla/core.h>

#include <math.h>

static uint64_t g_seed = 0x5eed;
static uint64_t g_offset;

void cx_manual_seed(uint64_t seed) { g_seed = seed; g_offset = 0; }
cx_rng_state cx_get_rng_state(void) { return (cx_rng_state){ g_seed, g_offset }; }
void cx_set_rng_state(cx_rng_state s) { g_seed = s.seed; g_offset = s.offset; }
uint64_t cx_rng_seed(void) { return g_seed; }

uint64_t cx_rng_reserve(uint64_t n)
{
    uint64_t off = g_offset;
    g_offset += n;
    return off;
}

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

void cx_philox(uint64_t seed, uint64_t ctr, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

float cx_rng_uniform01(uint64_t seed, uint64_t ctr)
{
    uint32_t r[4];
    cx_philox(seed, ctr, r);
    return (float)(r[0] >> 8) * (1.0f / 16777216.0f);
}

float cx_rng_normal01(uint64_t seed, uint64_t ctr)
{
    uint32_t r[4];
    cx_philox(seed, ctr, r);
    /* Box-Muller on two 32-bit words; u1 in (0, 1] keeps the log finite */
    double u1 = ((double)r[0] + 1.0) * (1.0 / 4294967296.0);
    double u2 = (double)r[1] * (1.0 / 4294967296.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

