/* The comm backend registry: the world of one until parallel/ registers a
 * backend (cx_comm_register), where a backend's shared memory comes from,
 * and the table of interned replica groups. It calls nothing above base/, so
 * buffers and the executor can use it without reaching the ops that record
 * collectives. */
#ifndef CX_BACKEND_H
#define CX_BACKEND_H

#include "base.h"

const cx_comm_backend *cx_comm_get(void);
/* This rank among the ranks of its node, and how many share it, as the
 * backend found them (one node when it does not say). The core's one
 * source of node topology. */
int cx_comm_local_rank(void);
int cx_comm_local_size(void);
/* Counts cx_comm_register calls: memory taken from one backend is given
 * back and taken again from the next when this changes (the executor's
 * arena checks it before each run). */
uint64_t cx_comm_generation(void);
/* Memory from the backend's alloc_shared only (cx_comm_alloc without the
 * fallback). @return NULL when the backend has none to give; free it with
 * cx_comm_free. */
void *cx_comm_alloc_shared(size_t bytes);
/* The replica group `rank` is in, for interned group id `id` (0: all
 * ranks): its ranks in order (*size of them), or NULL. */
const int *cx_groups_lookup(int64_t id, int rank, int *size);
/* The whole group list of `id`. @return 0 when id is 0 or unknown. */
int cx_groups_describe(int64_t id, int *ngroups, int *group_size, const int **ranks);
/* Interns a replica group list; op names the caller in errors.
 * @return the group id, 0 for all ranks (rg NULL), -1 with the error set. */
int64_t cx_groups_intern(const cx_replica_groups *rg, const char *op, int *group_size);

/* The message for a reduction outside cx_reduce_op, naming a cx_reduction
 * passed by mistake (the two enums once shared values); op names the
 * caller. @return true (error set) when red is not a cx_reduce_op. */
bool cx_bad_reduce_op(const char *op, cx_reduce_op red);

/* ---- the ranks agree (agree.c) ---- */

/* CX_DESYNC_CHECK: false when the user turned the checks off. */
bool cx_desync_enabled(void);
/* Every rank's (fingerprint, sequence) pair disagreed somewhere in `all`
 * (world pairs): gathers each rank's description and sets the one-line
 * error naming who differs. @return CX_ERR_COMM (or the gather's error). */
cx_status cx_desync_report(const int64_t *all, int world, const char *desc);
/* The collectives this process has passed through a check advance by n. */
void cx_desync_seq_advance(int64_t n);

#endif
