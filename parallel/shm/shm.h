/* Collectives through shared memory, for the ranks of a communicator that
 * all run on one node (parallel/ only; runtime.c routes to it).
 *
 * Open MPI 4.1 moves an all-reduce between two processes of one host at
 * 1-3 GB/s; a memory copy runs several times faster. Here every rank maps
 * one segment: each copies its input into its own slot, each reduces one
 * slice of every slot (the ranks work in parallel), and each copies the
 * result out. Buffers go through in chunks that stay in cache (large
 * messages may write their slots past the caches: shm_tune.h), and two
 * sets of slots alternate, so one barrier (two for an all-reduce) orders a
 * chunk: a slot is rewritten only after every rank has passed the barrier
 * that follows its last read. An all-reduce whose outputs (and inputs)
 * lie in the node's heaps (shm_heap.h) writes each rank's share of the
 * result straight into every output instead (and reads the inputs where
 * they lie).
 *
 * Every rank of the communicator must make the same calls with the same
 * sizes in the same order (the desync check holds them to it). */
#ifndef CX_PARALLEL_SHM_H
#define CX_PARALLEL_SHM_H

#include <cxla/core.h>
#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cx_shm cx_shm;

/* Collective over c. When all of c's ranks share one node (found with
 * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)) and CX_SHM_COLLECTIVES is not
 * 0, maps a segment named for the job and unlinks it once every rank has
 * mapped it, so a crash leaves nothing in /dev/shm.
 * @return the context; NULL with err empty when c spans nodes or shared
 * memory is turned off; NULL with a reason in err when some rank could not
 * map the segment (every rank of c then gets NULL and keeps to MPI). */
cx_shm *cx_shm_open(MPI_Comm c, char *err, size_t errn);
/* Whether CX_SHM_COLLECTIVES leaves shared memory on (not "0"); the
 * collective openers follow rank 0's answer. */
bool cx_shm_wanted(void);
/* Splits c into its nodes (collective): MPI_Comm_split_type(SHARED), or,
 * with CX_SHM_NODE_RANKS=N set, blocks of N consecutive world ranks taken
 * for nodes (to run the multi-node paths on one machine).
 * @return MPI_SUCCESS or MPI's error code. */
int cx_shm_split_node(MPI_Comm c, MPI_Comm *node);
/* Whether the backend should send all-gathers and broadcasts here too:
 * rank 0 had CX_SHM_COLLECTIVES=all. By default they go through MPI,
 * whose shared-memory transport copies each byte once (CMA) where this
 * path copies it twice (in, then out): measured 0.46-0.83x of MPI's
 * all-gather on 2 ranks. Where CMA is not allowed (containers that block
 * process_vm_readv) MPI copies twice as well. */
bool cx_shm_takes_gathers(const cx_shm *s);
/* Unmaps the segment (no communication). NULL is a no-op. */
void cx_shm_close(cx_shm *s);

/* Whether the reductions take this dtype (f32, bf16 summed in f32, i32,
 * i64, u8, bool); gathers and broadcasts take any. */
bool cx_shm_reduces(cx_dtype dt);

/* The collectives. red is SUM, MAX or MIN (MEAN is SUM with a scale);
 * every result is multiplied by scale (1: untouched), rounding as
 * MPI's path does (bf16: once, after the f32 sum and the scale). `in` may
 * equal `out`. A rank that does not arrive within CX_COLLECTIVE_TIMEOUT
 * seconds (default 300, 0: wait for ever) fails the call.
 * @return CX_OK; CX_ERR_COMM with a message in err on a timeout. */
/* out[count] = red over ranks of in[count] */
cx_status cx_shm_all_reduce(cx_shm *s, void *out, const void *in, int64_t count, cx_dtype dt, cx_reduce_op red,
                            double scale, char *err, size_t errn);
/* out[count] = this rank's block of red over ranks of in[size * count] */
cx_status cx_shm_reduce_scatter(cx_shm *s, void *out, const void *in, int64_t count, cx_dtype dt,
                                cx_reduce_op red, double scale, char *err, size_t errn);
/* out[size * bytes] = every rank's in[bytes], in rank order */
cx_status cx_shm_all_gather(cx_shm *s, void *out, const void *in, int64_t bytes, char *err, size_t errn);
/* buf[bytes] of rank root into every rank's buf */
cx_status cx_shm_broadcast(cx_shm *s, void *buf, int64_t bytes, int root, char *err, size_t errn);

/* The reduction kernels (shm_reduce.c), each compiled for AVX-512, AVX2
 * and baseline x86-64 with the variant picked at load time.
 * dst[m] = red over src[0..n)[m]; dst is f32 when dt is bf16. */
void cx_shm_reduce(void *dst, const void *const *src, int n, int64_t m, cx_dtype dt, cx_reduce_op red);
/* out[m] = res[m] * scale, in dt (res is f32 for bf16); stream: past the
 * caches (a large message, whose result would not stay in them). */
void cx_shm_copy_out(void *out, const void *res, int64_t m, cx_dtype dt, double scale, bool stream);
/* memmove, with streaming stores past the caches when n is large and the
 * buffers do not overlap; fenced, so the bytes are visible before any
 * store that follows (a barrier's arrival). */
void cx_shm_copy_stream(void *dst, const void *src, size_t n);
/* The same without the fence, for many small copies that end in one
 * cx_shm_stream_fence() (each fence waits for the stores to drain). */
void cx_shm_copy_stream_unfenced(void *dst, const void *src, size_t n);
void cx_shm_stream_fence(void);
/* dst[d][m] = scale * sum over src[0..nsrc)[m] for every d, in one pass,
 * stored past the caches (unfenced: the caller fences); summed and scaled
 * as cx_shm_reduce and cx_shm_copy_out do, so the results are the same bits. */
void cx_shm_sum_f32_stream(float *const *dst, int ndst, const float *const *src, int nsrc, int64_t m, float scale);
/* Bytes of one reduced element as the kernels keep it (f32 for bf16). */
size_t cx_shm_result_size(cx_dtype dt);

#endif
