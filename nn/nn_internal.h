/* Shared by nn/ and optim/ sources: the core's error reporting (one-line
 * messages through cx_last_error) and small helpers. Not installed. */
#ifndef CX_NN_INTERNAL_H
#define CX_NN_INTERNAL_H

#include "internal.h"

#include <cxla/nn.h>

/* Materializes freshly created persistent tensors (parameters, buffers,
 * optimizer state) so that every step sees them as device-data inputs.
 * @return CX_OK or the sync error. */
cx_status cx_nn_materialize(cx_tensor **ts, int n);

#endif
