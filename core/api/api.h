/* The API layer: the entry points that sync (cx_step_end, cx_sync,
 * cx_to_host, cx_item and the reads and materializations that need a
 * value), eager mode and step closures. It is the only part of the core
 * that drives capture, compile and run together; nothing below it syncs. */
#ifndef CX_API_INTERNAL_H
#define CX_API_INTERNAL_H

#include "autograd.h"
#include "capture.h"
#include "passes.h"
#include "runtime.h"
#include "sharding.h"
#include "obs.h"

/* Materializes the pending values of `ts` in one graph (compile or cache
 * hit, run); ts NULL: every live tensor. Poisoned tensors are skipped and
 * reported. cause: who asked, for the debug analysis ("step end",
 * "loader", "user sync", "value read", "eager"). (sync.c)
 * @return CX_OK or the first error. */
cx_status cx_materialize(cx_tensor **ts, int n, const char *cause);
/* Runs the step closures added during the step that just ended (closures.c). */
void cx_closures_run(void);

#endif
