/* Shared by nn/ sources only (optim/ has its own): the headers every layer
 * file uses and the one helper more than one file needs. Errors go through
 * cx_set_last_error / cx_poisoned. Not installed. */
#ifndef CX_NN_INTERNAL_H
#define CX_NN_INTERNAL_H

#include <cxla/core.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cx_assert.h"

#include <cxla/nn.h>

#include <stdint.h>

/* Makes a freshly created tensor (a parameter, buffer or init result)
 * persistent and materializes it, so that every step sees it as a
 * device-data input rather than the ops that made it.
 * @return CX_OK or the sync error. */
cx_status cx_nn_persist(cx_tensor *t);

/* Transformer pieces shared by transformer.c and gpt.c. */
/* Columns [lo, lo + d) of qkv (B, T, 3d) as (B, H, T, d/H): views, which the
 * fused attention reads strided. */
cx_tensor *cx_nn_head_view(cx_tensor *qkv, int64_t lo, int64_t d, int heads);
/* x + f(norm(x)) */
cx_tensor *cx_nn_residual(cx_module *norm, cx_module *f, cx_tensor *x);

/* SplitMix64: the host-side generator of the data files (fake data sets,
 * the sampler's shuffle), seeded by the caller, so that every rank derives
 * the same sequence from the same seed. Advances *s. */
static inline uint64_t cx_splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif
