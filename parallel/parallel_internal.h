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

/* The gradient bucket policy (DDP and xm.optimizer_step): from index *i
 * down (reverse registration order: the last layers' gradients exist
 * first), the indices of the next bucket's tensors into members; a bucket
 * closes when the next tensor would overflow its cap (bucket 0:
 * first_bucket_bytes, then bucket_bytes) or has another dtype. NULL
 * entries are skipped. @return the bucket's size, 0 when none is left. */
int cx_bucket_next(cx_tensor *const *ts, int *i, int bucket, int64_t first_bucket_bytes, int64_t bucket_bytes,
                   int *members);

/* "name:dtype:shape;" for every parameter then buffer of m; malloc'd. */
char *cx_module_signature(const cx_module *m);
/* Checks that every rank's module has rank 0's signature.
 * @return CX_OK, CX_ERR_ARG naming the first difference (on every rank), CX_ERR_COMM. */
cx_status cx_check_same_module(const cx_module *m, const char *what);

#endif
