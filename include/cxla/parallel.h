/* cxla parallel: the MPI runtime (ranks and devices, as torch_xla.runtime),
 * eager host collectives, xm.optimizer_step, and DistributedDataParallel.
 *
 * One process is one rank with one device (xla:0, its CPU cores). Without a
 * launcher (no mpirun / xla-launch) the world has one rank and no MPI.
 *
 * Threads: with MPI, every collective (the graphs' and the eager ones
 * here) runs on the runtime's progress thread, in the order the training
 * thread queued it; a failure's message comes back to the caller's
 * cx_last_error. Call these functions on the training thread (core.h).
 * Ownership: cx_rendezvous's *out is the caller's, to release with free();
 * the DDP wrapper borrows its module (cx_ddp_module returns it). */
#ifndef CXLA_PARALLEL_H
#define CXLA_PARALLEL_H

#include <cxla/core.h>
#include <cxla/nn.h>
#include <cxla/optim.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime ---------------------------------------------------------------- */

/* Starts MPI (thread level MULTIPLE) when launched by mpirun / xla-launch and
 * registers the MPI comm backend; otherwise a world of one. Sets the compute
 * threads to cores / local ranks unless CX_NUM_THREADS says otherwise.
 * @return CX_OK, or CX_ERR_COMM with a message when MPI cannot start. */
CX_API cx_status cx_dist_init(int *argc, char ***argv);
/* Where this process sits in its job, before cx_dist_init and without MPI,
 * from the launcher's environment: mpirun's OMPI_COMM_WORLD_*, PMIx's
 * PMIX_RANK with Slurm's layout (srun --mpi=pmix), PMI's PMI_RANK/PMI_SIZE,
 * srun's SLURM_PROCID/SLURM_STEP_NUM_TASKS/SLURM_LOCALID/
 * SLURM_STEP_TASKS_PER_NODE, or torchrun's RANK/WORLD_SIZE/LOCAL_RANK/
 * LOCAL_WORLD_SIZE; without a launcher rank 0 of 1. cx_dist_init reads the
 * same. Any pointer may be NULL; *launcher gets "none", "mpirun", "pmix",
 * "pmi" or "torchrun"; a count the launcher does not give is -1.
 * @return true; false with one line in msg[cap] (no newline; msg may be
 * NULL when cap is 0) when the job cannot form one world: srun started
 * several tasks without PMIx (each would run alone; add --mpi=pmix), or a
 * variable is not a number. */
CX_API bool cx_job_place(int *rank, int *world_size, int *local_rank, int *local_world_size, const char **launcher,
                         char *msg, size_t cap);
/* Drains pending collectives and finalizes MPI. Safe to call twice. A
 * process that exits with status 0 (returns 0 from main) without calling
 * it is finalized at exit, as torch.distributed programs are; one that
 * exits non-zero is not (finalizing waits for the other ranks), and the
 * launcher stops the job naming its rank. */
CX_API void cx_dist_finalize(void);
CX_API bool cx_dist_is_initialized(void);

/* The world size and this process's rank in it are cx_world_size and
 * cx_global_ordinal (core.h). These: this process's rank among the ranks
 * of its host, and how many ranks the host runs. */
CX_API int cx_local_ordinal(void);
CX_API int cx_local_process_count(void);
CX_API int cx_addressable_device_count(void);  /* devices this process drives: 1 */
/* Rank 0 of the world (local = false) or of this host (local = true). */
CX_API bool cx_is_master_ordinal(bool local);

/* ---- eager host collectives ----------------------------------------------------- */

/* Every rank waits for every other. @return CX_OK or CX_ERR_COMM. */
CX_API cx_status cx_barrier(void);

/* Exchanges `n` bytes of payload with every rank under `tag` (which must be
 * the same on every rank: a mismatch is an error on every rank, not a hang).
 * On success *out holds world_size payloads back to back, each padded to
 * the largest size, and sizes[r] (caller-provided, world_size entries, may
 * be NULL) their sizes. Release *out with free().
 * @return CX_OK, CX_ERR_ARG on a tag mismatch, CX_ERR_COMM. */
CX_API cx_status cx_rendezvous(const char *tag, const void *payload, size_t n, void **out, size_t *sizes);

/* reduce(all, world, n, out): all holds world rows of n doubles. */
typedef void (*cx_mesh_reduce_fn)(const double *all, int world, int n, double *out);
/* Gathers `n` doubles from every rank and applies `reduce` (the same result
 * on every rank), as xm.mesh_reduce. NULL reduce = mean. */
CX_API cx_status cx_mesh_reduce(const char *tag, const double *data, int n, cx_mesh_reduce_fn reduce, double *out);

/* Copies rank 0's parameters and buffers into every rank's module, after
 * the same check as cx_ddp_wrap. @return CX_OK, CX_ERR_ARG when the modules
 * differ across ranks (or m is NULL), CX_ERR_COMM. */
CX_API cx_status cx_broadcast_master_params(cx_module *m);

/* ---- gradient all-reduce --------------------------------------------------------- */

/* How gradients travel in their all-reduce (PyTorch DDP's comm hooks). */
typedef enum {
    CX_GRAD_COMM_F32 = 0,   /* as they are */
    /* bf16_compress_hook: each bucket is cast to bf16 (half the bytes on
     * the wire and in shared memory), summed in f32, scaled and rounded to
     * bf16 once, and cast back to the gradients' dtype */
    CX_GRAD_COMM_BF16,
} cx_grad_comm;

/* xm.optimizer_step: all-reduces (mean) the gradients of the optimizer's
 * parameters in reverse-order buckets, then records the optimizer step.
 * @return the optimizer step's status. */
CX_API cx_status cx_optimizer_step(cx_optimizer *opt);
/* cx_optimizer_step with the gradients sent as `how` says.
 * @return the optimizer step's status; CX_ERR_ARG for an unknown `how`. */
CX_API cx_status cx_optimizer_step_as(cx_optimizer *opt, cx_grad_comm how);

/* Records the bucketed all-reduce of the gradients of `params` (reverse
 * order; the first bucket holds up to first_bucket_bytes, the others up to
 * bucket_bytes; each bucket is one pinned all-reduce whose result is
 * multiplied by `scale`). Parameters without a gradient are skipped; a
 * tensor listed more than once is reduced once, at its first entry.
 * @return the number of buckets, or -1 (error set). */
CX_API int cx_allreduce_gradients(cx_tensor *const *params, int n, int64_t first_bucket_bytes, int64_t bucket_bytes,
                           double scale);
/* The same, each bucket sent as `how` says (bucket sizes count the
 * gradients' own bytes). @return the number of buckets, or -1 (error set;
 * an unknown `how` included). */
CX_API int cx_allreduce_gradients_as(cx_tensor *const *params, int n, int64_t first_bucket_bytes,
                                     int64_t bucket_bytes, double scale, cx_grad_comm how);

/* ---- DistributedDataParallel -------------------------------------------------------- */

/* A tied parameter is one tensor: it sits in one gradient bucket, and its
 * gradient (the sum of its uses) is all-reduced once. */

typedef struct cx_ddp cx_ddp;

/* Start from cx_ddp_default_opts() (it sets struct_size, core.h). */
typedef struct {
    size_t struct_size;
    int64_t first_bucket_bytes;   /* 1 MiB, as torch DDP */
    int64_t bucket_bytes;         /* 25 MiB */
    bool broadcast_buffers;       /* copy rank 0's buffers before each forward (true) */
    cx_grad_comm grad_comm;       /* CX_GRAD_COMM_F32; CX_GRAD_COMM_BF16 halves the bytes */
} cx_ddp_opts;
static inline cx_ddp_opts cx_ddp_default_opts(void)
{
    cx_ddp_opts o = CX_ZEROED_;
    o.struct_size = sizeof o;
    o.first_bucket_bytes = 1 << 20;
    o.bucket_bytes = 25 << 20;
    o.broadcast_buffers = true;
    o.grad_comm = CX_GRAD_COMM_F32;
    return o;
}

/* Wraps `m` (borrowed; it must outlive the wrapper): checks in one
 * rendezvous that every rank has the same cx_module_signature (parameter and
 * buffer names, dtypes, shapes, ties and order), then broadcasts rank 0's
 * parameters and buffers. @return the wrapper, or NULL with an error, the
 * same on every rank, naming the ranks that differ and the first difference,
 * or a communication failure; also for bad options (a struct_size below
 * the first version's included). */
CX_API cx_ddp *cx_ddp_wrap(cx_module *m, cx_ddp_opts opts);
CX_API void cx_ddp_free(cx_ddp *d);
CX_API cx_module *cx_ddp_module(cx_ddp *d);
/* The wrapped module's forward (cx_module_forward), after rank 0's buffers
 * are copied into every rank's (broadcast_buffers, training mode).
 * @return its output, or a poisoned tensor naming the failure. */
CX_API cx_tensor *cx_ddp_forward(cx_ddp *d, cx_tensor *x);
/* The same for many inputs and outputs (cx_module_forward_many): a model
 * taking (x, targets) and giving (logits, loss).
 * @return the number of outputs written, or -1 with cx_last_error set. */
CX_API int cx_ddp_forward_many(cx_ddp *d, cx_tensor *const *in, int n_in, cx_tensor **out, int max_out);
/* Backward, then (outside no_sync) the bucketed mean all-reduce of every
 * gradient, each bucket issued as soon as its gradients exist. */
CX_API cx_status cx_ddp_backward(cx_ddp *d, cx_tensor *loss);
/* Gradient accumulation: backward inside no_sync only accumulates locally;
 * the next backward outside it all-reduces the accumulated gradients. */
CX_API void cx_ddp_no_sync_begin(cx_ddp *d);
CX_API void cx_ddp_no_sync_end(cx_ddp *d);
/* Buckets of the last synchronized backward (what the policy predicts). */
CX_API int cx_ddp_num_buckets(const cx_ddp *d);
/* Buckets the policy makes for the current gradients' sizes (reverse order). */
CX_API int cx_ddp_predict_buckets(const cx_ddp *d);

#ifdef __cplusplus
}
#endif
#endif
