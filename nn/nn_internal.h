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

/* Makes a freshly created tensor (a parameter, buffer or init result)
 * persistent and materializes it, so that every step sees it as a
 * device-data input rather than the ops that made it.
 * @return CX_OK or the sync error. */
cx_status cx_nn_persist(cx_tensor *t);

#endif
