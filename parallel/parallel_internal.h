/* Shared inside parallel/ only. */
#ifndef CX_PARALLEL_INTERNAL_H
#define CX_PARALLEL_INTERNAL_H

#include <cxla/comm.h>
#include <cxla/parallel.h>
#include <mpi.h>

/* Runs fn(arg) on the progress thread, in order with queued collectives
 * (directly when there is no MPI). */
cx_status cx_dist_run_on_progress(cx_status (*fn)(void *), void *arg);
MPI_Comm cx_dist_world_comm(void);

/* The collective status page for xla-launch's watchdog (watch_page.c; inert
 * unless CX_STATUS_DIR is set): opened at init, each collective entered
 * (op NULL: a host exchange run on the progress thread) and left. */
void cx_watch_page_open(int rank);
void cx_watch_page_close(void);
void cx_watch_enter(const cx_comm_op *op);
void cx_watch_leave(cx_status st);
bool cx_dist_uses_mpi(void);

/* The gradient bucket policy (DDP and xm.optimizer_step): from index *i
 * down (reverse registration order: the last layers' gradients exist
 * first), the indices of the next bucket's tensors into members; a bucket
 * closes when the next tensor would overflow its cap (bucket 0:
 * first_bucket_bytes, then bucket_bytes) or has another dtype. NULL
 * entries are skipped. @return the bucket's size, 0 when none is left. */
int cx_bucket_next(cx_tensor *const *ts, int *i, int bucket, int64_t first_bucket_bytes, int64_t bucket_bytes,
                   int *members);

/* The wrap-time check of DDP, FSDP and broadcast_master_params, in one
 * rendezvous under tag `what`: every rank's cx_module_signature of m,
 * followed by the wrapper's own `extra` entries in the same "entry;" form
 * (may be NULL), must equal rank 0's. Nothing to check in a world of one.
 * @return CX_OK; CX_ERR_ARG with one message, the same on every rank,
 * naming the ranks that differ and the first entry where the first of them
 * does; CX_ERR_OOM; CX_ERR_COMM. */
cx_status cx_agree_on_module(const cx_module *m, const char *extra, const char *what);
/* Records rank 0's value into each tensor of ts (broadcast, then assign);
 * the caller runs them all in one cx_sync. Nothing in a world of one.
 * @return CX_OK or the first error recording them. */
cx_status cx_record_master_values(const cx_named_tensor *ts, int n);
/* One "deferred NAME: kind(a, b) at seed S offset O;" entry per deferred
 * tensor of m, in state-dict order, for cx_agree_on_module's `extra`: the
 * ranks that build their shards from recipes must hold the same recipes.
 * @return the text (free() it; "" when none is deferred), NULL when out
 * of memory. */
char *cx_deferred_entries(const cx_module *m);
/* Rank 0's parameters and buffers of m into every rank's, in one
 * execution, after cx_agree_on_module; deferred ones are skipped (their
 * recipes were agreed). @return CX_OK or the error. */
cx_status cx_take_master_state(cx_module *m, const char *what);

#endif
