/* The counter RNG: element p of a draw is a function of (seed, offset + p)
 * alone, so the executor, eager draws and deferred ranges give the same
 * bits for the same element whoever computes it. */
#ifndef CX_PHILOX_H
#define CX_PHILOX_H

#include <stdint.h>

/* Philox-4x32-10 counter: 4 words for counter value `ctr` under `seed`. */
void cx_philox(uint64_t seed, uint64_t ctr, uint32_t out[4]);
float cx_rng_uniform01(uint64_t seed, uint64_t ctr);
float cx_rng_normal01(uint64_t seed, uint64_t ctr);
/* Reserves `n` counter values of the global stream. @return the offset to use. */
uint64_t cx_rng_reserve(uint64_t n);
uint64_t cx_rng_seed(void);

#endif
