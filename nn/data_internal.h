/* Shared by the data sets of nn/ only. Not installed. */
#ifndef CX_NN_DATA_INTERNAL_H
#define CX_NN_DATA_INTERNAL_H

#include <cxla/data.h>

/* @return the ctx of ds when its get callback is `get` (a data set of the
 * kind whose callback that is), else NULL: how a kind's own API functions
 * find their state behind the opaque cx_dataset. */
void *cx_dataset_ctx_of(const cx_dataset *ds, cx_dataset_get_fn get);

#endif
