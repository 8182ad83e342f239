/* Hierarchical all-reduce for a communicator that spans several nodes:
 * the ranks of each node reduce through shared memory, one leader per node
 * all-reduces the node sums through MPI, and each leader broadcasts the
 * result through shared memory. MPI then moves 1/(ranks per node) of the
 * data a flat all-reduce sends, and only between nodes. */
#ifndef CX_PARALLEL_HIER_H
#define CX_PARALLEL_HIER_H

#include "shm.h"

typedef struct cx_hier cx_hier;

/* Collective over c; only when rank 0 has CX_SHM_HIERARCHICAL=1.
 * @return the context; NULL with err empty when c lies on one node (the
 * flat shared-memory path serves it), shared memory is off or the path was
 * not asked for; NULL with a reason in err when a node's segment could not be made
 * (every rank then gets NULL and keeps to flat MPI). */
cx_hier *cx_hier_open(MPI_Comm c, char *err, size_t errn);
/* Frees the node and leader communicators and the segment (collective, as
 * MPI_Comm_free is). NULL is a no-op. */
void cx_hier_close(cx_hier *h);

/* Whether the hierarchical path takes this all-reduce: the shared-memory
 * kernels' dtypes except bf16, whose node sums would be rounded to bf16
 * before the leaders add them (the flat path sums once, in f32). */
bool cx_hier_takes(cx_dtype dt);

/* out[count] = red over every rank of c of in[count], times scale (applied
 * once, at the end, as the flat paths do). mpi_op/mpi_dt: the leaders'
 * reduction (the caller's, so bytes wrap as on the flat path).
 * @return CX_OK; CX_ERR_COMM with a message in err. */
cx_status cx_hier_all_reduce(cx_hier *h, void *out, const void *in, int64_t count, cx_dtype dt, cx_reduce_op red,
                             double scale, MPI_Op mpi_op, MPI_Datatype mpi_dt, char *err, size_t errn);

#endif
