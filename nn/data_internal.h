/* Shared by the data sets of nn/ only. Not installed. */
#ifndef CX_NN_DATA_INTERNAL_H
#define CX_NN_DATA_INTERNAL_H

#include <cxla/data.h>

/* @return the ctx of ds when its get callback is `get` (a data set of the
 * kind whose callback that is), else NULL: how a kind's own API functions
 * find their state behind the opaque cx_dataset. */
void *cx_dataset_ctx_of(const cx_dataset *ds, cx_dataset_get_fn get);

/* @return the bytes of one item of field f (0 <= f < its number of fields,
 * unchecked) of ds: the loader sizes its staging and chunk offsets by it. */
size_t cx_dataset_item_bytes(const cx_dataset *ds, int f);

/* lut[p] = (p / 255 - mean) / std for each pixel byte p: ToTensor +
 * Normalize in their own float32 arithmetic, so batches match torch's. */
static inline void cx_normalize_lut(float lut[256], float mean, float std)
{
    for (int p = 0; p < 256; p++) lut[p] = ((float)p / 255.0f - mean) / std;
}

#endif
