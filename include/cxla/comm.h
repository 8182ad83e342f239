/* The communication backend interface. Collectives are IR ops in the core;
 * they execute through the backend registered here (parallel/ registers
 * MPI). Without one, the core uses a world of one. The world size and rank
 * are cx_world_size and cx_global_ordinal (core.h), asked of the backend.
 *
 * cx_comm_register swaps the backend without a lock: register before any
 * thread runs a collective or calls cx_comm_alloc. Memory from
 * cx_comm_alloc is released with cx_comm_free only, never free(). */
#ifndef CXLA_COMM_H
#define CXLA_COMM_H

#include <cxla/core.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CX_COLL_ALL_REDUCE = 0,
    CX_COLL_ALL_GATHER,      /* out = concat of every member's `in` in group order */
    CX_COLL_REDUCE_SCATTER,  /* out = member's block of reduce(in); count = out elements */
    CX_COLL_ALL_TO_ALL,      /* in/out: group_size blocks of count/group_size */
    CX_COLL_BROADCAST,       /* out = in of group member `root` */
} cx_coll_kind;

/* One collective over contiguous buffers. `count` is the element count of
 * `in` (for reduce-scatter: of `out`). The reduction result is multiplied by
 * `scale` (1 = none); CX_RED_MEAN divides by the group size. */
typedef struct {
    cx_coll_kind kind;
    cx_reduce_op red;    /* all-reduce and reduce-scatter only */
    double scale;
    cx_dtype dtype;
    const void *in;
    void *out;
    int64_t count;
    /* the replica group this rank belongs to, as global ranks, in order;
     * NULL means every rank */
    const int *group;
    int group_size;
    int root;            /* index within the group (broadcast) */
    /* What the collective is for, when that is not the data it moves (the
     * desync check names the collective it guards); NULL: nothing. Shown by
     * xla-launch's watchdog. The backend copies it before start returns. */
    const char *label;
} cx_comm_op;

typedef struct cx_comm_backend {
    size_t struct_size;   /* CX_STRUCT_SIZE(cx_comm_backend) */
    const char *name;
    void *ctx;
    int (*world_size)(void *ctx);
    int (*rank)(void *ctx);
    /* Starts a collective (it may run asynchronously).
     * @return a request handle, or NULL on failure (message via cx_last_error). */
    void *(*start)(void *ctx, const cx_comm_op *op);
    /* Waits for a request and releases it. @return CX_OK or CX_ERR_COMM. */
    cx_status (*wait)(void *ctx, void *req);
    /* Optional: runs a collective to completion on the calling thread, used
     * when the very next instruction needs its result (no overlap to win,
     * and a thread hand-off to save). NULL: start + wait. */
    cx_status (*run)(void *ctx, const cx_comm_op *op);
    /* Optional: memory the other ranks of this node can write in place, for
     * collective outputs (cx_comm_alloc). @return NULL when there is none
     * to give; the caller then takes ordinary memory. */
    void *(*alloc_shared)(void *ctx, size_t bytes);
    /* Takes back what alloc_shared gave, even after the backend is
     * unregistered. @return false when p is not its memory. */
    bool (*free_shared)(void *ctx, void *p);
    /* Optional: this rank's index among the ranks of its node, and how many
     * ranks share the node (the node layout the backend found, e.g. MPI's
     * shared-memory split). The core asks these, never the launcher's
     * environment. NULL (or a struct_size that stops before them): one
     * node, local rank = rank. */
    int (*local_rank)(void *ctx);
    int (*local_size)(void *ctx);
} cx_comm_backend;

/* all_gather whose gradient (a sum reduce-scatter) is multiplied by
 * grad_scale: FSDP's gather, where the gradient is the mean over ranks. */
CX_API cx_tensor *cx_all_gather_grad_scaled(cx_tensor *a, int axis, const cx_replica_groups *groups, bool pin,
                                     double grad_scale);

/* Memory for a collective's output that the backend can write from every
 * rank of the node in place: an all-reduce into it moves each byte fewer
 * times (the MPI backend's shared-memory heaps, CX_SHM_HEAP_MIB). Ordinary
 * memory when the backend has none to give, so it is always usable.
 * @return 64-byte-aligned memory of at least `bytes`; NULL when out of
 * memory (cx_last_error says so). Free it with cx_comm_free only. */
CX_API void *cx_comm_alloc(size_t bytes);
/* Frees what cx_comm_alloc gave, also after cx_dist_finalize. NULL is a no-op. */
CX_API void cx_comm_free(void *p);

/* Registers a backend (the struct is copied). NULL restores the world of one.
 * @return CX_OK; CX_ERR_ARG (cx_last_error set, the backend in use kept)
 * for a struct_size below the first version's or a missing world_size,
 * rank, start or wait. */
CX_API cx_status cx_comm_register(const cx_comm_backend *backend);
/* Runs one collective synchronously through the registered backend.
 * @return CX_OK; CX_ERR_ARG (cx_last_error set) for a NULL op or, for a
 * reducing kind, a `red` that is not a cx_reduce_op; the backend's
 * CX_ERR_COMM. */
CX_API cx_status cx_comm_run(const cx_comm_op *op);

/* Desync detection for a collective outside a graph (a barrier, a
 * rendezvous, a mesh reduction): every rank calls it with a description of
 * what it is about to run ("barrier 'save'") before running it; graphs do
 * the same before their first collective by themselves. The ranks compare
 * the descriptions' fingerprints and their collective sequence numbers in
 * one small all-gather. Off with CX_DESYNC_CHECK=0.
 * @return CX_OK, or CX_ERR_COMM on every rank with one message naming the
 * ranks that differ and what each was about to run. */
CX_API cx_status cx_comm_check(const char *what);
/* Collectives this process has passed through the check (the sequence
 * number in desync messages). */
CX_API int64_t cx_comm_sequence(void);

#ifdef __cplusplus
}
#endif
#endif
