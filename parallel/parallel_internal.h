/* Shared inside parallel/ only. */
#ifndef CX_PARALLEL_INTERNAL_H
#define CX_PARALLEL_INTERNAL_H

#include <cxla/cxla.h>
#include <cxla/parallel.h>
#include <mpi.h>

/* Runs fn(arg) on the progress thread, in order with queued collectives
 * (directly when there is no MPI). */
cx_status cx_dist_run_on_progress(cx_status (*fn)(void *), void *arg);
MPI_Comm cx_dist_world_comm(void);
bool cx_dist_uses_mpi(void);

/* "name:dtype:shape;" for every parameter then buffer of m; malloc'd. */
char *cx_module_signature(const cx_module *m);
/* Checks that every rank's module has rank 0's signature.
 * @return CX_OK, CX_ERR_ARG naming the first difference (on every rank), CX_ERR_COMM. */
cx_status cx_check_same_module(const cx_module *m, const char *what);

#endif
