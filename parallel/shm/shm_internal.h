/* The segment's layout, shared by shm_segment.c and shm_coll.c only. */
#ifndef CX_PARALLEL_SHM_INTERNAL_H
#define CX_PARALLEL_SHM_INTERNAL_H

#include "shm.h"
#include "shm_heap.h"
#include "shm_tune.h"

#include <stdatomic.h>

/* One cache line per rank: its arrival count, and where its all-reduce
 * input and output lie in its heap (-1: elsewhere), published by the
 * release of an arrival; ranks never share a line they write. */
typedef struct {
    _Atomic uint64_t arrived;
    _Atomic int64_t in_at, out_at;
    char pad[64 - 3 * sizeof(uint64_t)];
} shm_flag;

/* The collectives and message sizes that keep tuners of their own: the
 * cost of a byte differs between them. */
enum { SHM_ALL_REDUCE, SHM_REDUCE_SCATTER, SHM_ALL_GATHER, SHM_BROADCAST, SHM_ALL_REDUCE_IN_HEAPS, SHM_KINDS };
#define SHM_SIZE_CLASSES 3

struct cx_shm {
    int rank, size;
    bool gathers;         /* all-gathers and broadcasts come here too (rank 0's CX_SHM_COLLECTIVES=all) */
    uint8_t *base;
    size_t bytes;
    shm_flag *flags;      /* [size] */
    uint8_t *slots[2];    /* per set: size slots of `chunk` bytes */
    uint8_t *result[2];   /* per set: 2 * chunk bytes (f32 sums of bf16 take twice the room) */
    size_t chunk;
    uint64_t arrivals;    /* this rank's barriers so far */
    uint64_t chunks;      /* chunks so far: picks the set */
    double timeout;       /* seconds, 0: none */
    size_t stream_min;    /* results of at least this many bytes are written past the caches */
    int slot_writes;      /* CX_SHM_SLOT_WRITES: a cx_shm_way, or -1 to time both (shm_tune.h) */
    cx_shm_tuner tune[SHM_KINDS][SHM_SIZE_CLASSES];
    cx_shm_heap *heap;    /* the node's heaps, or NULL */
    int *heap_rank;       /* [size]: each rank's rank among the heap's; NULL without heaps */
};

/* Slot r of buffer set `set`. */
static inline uint8_t *shm_slot(const cx_shm *s, int set, int r) { return s->slots[set] + (size_t)r * s->chunk; }

/* CLOCK_MONOTONIC in seconds. */
double cx_shm_now(void);

/* Waits until every rank has arrived as often as this one.
 * @return CX_OK; CX_ERR_COMM naming the missing rank after the timeout. */
cx_status cx_shm_barrier(cx_shm *s, const char *what, char *err, size_t errn);

#endif
