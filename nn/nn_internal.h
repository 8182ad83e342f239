/* Shared by nn/ and optim/ sources: small helpers on top of the public core
 * API (errors go through cx_set_last_error / cx_poisoned). Not installed. */
#ifndef CX_NN_INTERNAL_H
#define CX_NN_INTERNAL_H

#include <cxla/core.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cx_assert.h"

#include <cxla/nn.h>

/* Materializes freshly created persistent tensors (parameters, buffers,
 * optimizer state) so that every step sees them as device-data inputs.
 * @return CX_OK or the sync error. */
cx_status cx_nn_materialize(cx_tensor **ts, int n);

#endif
