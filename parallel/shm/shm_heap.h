/* Memory that every rank of a node maps: each rank's heap is a shared file
 * that the node's other ranks map too, so a collective can write a rank's
 * result straight into that rank's buffer, where the slot path has each
 * rank copy its result out of the segment (parallel/ only).
 *
 * Each heap reserves address space for CX_SHM_HEAP_MIB (default 4096) and
 * takes pages only as blocks are handed out, each reserved on the spot
 * (posix_fallocate), so a full /dev/shm refuses a block instead of killing
 * a rank with SIGBUS later. Freed blocks are kept, with their pages, for
 * buffers of about their size (a training step asks for the same ones each
 * time), up to as many bytes as the heap has had in use at once (64 MiB at
 * least); beyond that the pages of those freed longest ago go back to the
 * system. A request the heap cannot serve gets NULL and the caller takes
 * ordinary memory.
 *
 * The heap outlives cx_dist_finalize: tensors made before it may still hold
 * blocks. Finalize only unmaps the other ranks' heaps. */
#ifndef CX_PARALLEL_SHM_HEAP_H
#define CX_PARALLEL_SHM_HEAP_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cx_shm_heap cx_shm_heap;

/* Collective over node (ranks of one node; MPI_COMM_NULL or a node of one:
 * no heap). Files are named for the job and unlinked once every rank has
 * mapped them. CX_SHM_HEAP_MIB=0 turns the heaps off.
 * @return the heap, also kept as the process's heap (cx_shm_heap_get);
 * NULL with err empty when turned off; NULL with the reason in err when
 * some rank could not make or map one (every rank then gets NULL). */
cx_shm_heap *cx_shm_heap_open(MPI_Comm node, char *err, size_t errn);
/* The heap cx_shm_heap_open made, while its peers are mapped; NULL before,
 * after cx_shm_heap_detach, or when there is none. */
cx_shm_heap *cx_shm_heap_get(void);
/* Unmaps the other ranks' heaps (no communication); this rank's blocks stay
 * valid. */
void cx_shm_heap_detach(cx_shm_heap *h);

/* A block of at least `bytes` (4 KiB aligned) in this rank's heap.
 * @return the block, or NULL when the heap is full, detached, or /dev/shm
 * has no room. Thread-safe. */
void *cx_shm_heap_alloc(size_t bytes);
/* Takes back a block of this rank's heap.
 * @return true; false (nothing done) when p is not one of its blocks. */
bool cx_shm_heap_free(void *p);

/* This rank's rank in the heap's node communicator. */
int cx_shm_heap_rank(const cx_shm_heap *h);
/* Where [p, p + n) lies in this rank's heap: its offset, or -1 if it does
 * not lie wholly inside. */
int64_t cx_shm_heap_offset(const cx_shm_heap *h, const void *p, size_t n);
/* Node rank r's heap as mapped in this process (r may be this rank). */
uint8_t *cx_shm_heap_base(const cx_shm_heap *h, int node_rank);
/* Bytes of /dev/shm this rank's heap holds pages for (blocks in use and
 * the spares that kept theirs), as the file system counts them. */
size_t cx_shm_heap_resident(const cx_shm_heap *h);

#endif
