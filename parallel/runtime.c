/* The MPI runtime: rank queries and the comm backend.
 *
 * Collectives run on one progress thread, fed by a FIFO: Open MPI 4.1 does
 * not progress non-blocking collectives by itself, so a dedicated thread
 * that runs each collective to completion lets the executor keep computing
 * until it needs a result. A collective needed at once runs on the caller
 * instead, but only when nothing is queued, so every rank's MPI call order
 * stays its program order. */
#include <cxla/comm.h>
#include <cxla/metrics.h>
#include <cxla/parallel.h>

#include "cx_bf16.h"
#include "cx_job.h"
#include "cx_log.h"
#include "cx_settings.h"
#include "parallel_internal.h"
#include "shm/hier.h"
#include "shm/shm.h"
#include "shm/shm_heap.h"

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* core internals this module may use: none. Only <cxla/comm.h>. */

typedef struct comm_req {
    cx_comm_op op;
    /* eager host work: a function run on the progress thread */
    cx_status (*fn)(void *arg);
    void *arg;
    cx_status status;
    char err[512];
    MPI_Comm comm;
    int gsize, grank;
    void *tmp;
    bool done_in_shm;    /* the result is final: finish_op has nothing to do */
    double t_start;
    atomic_int done;
    double seconds;
    char label[96];      /* op.label's text (the caller's may not outlive start) */
    struct comm_req *next;
} comm_req;

typedef struct group_comm {
    int size;
    int *ranks;
    MPI_Comm comm;
    cx_shm *shm;         /* NULL: the group spans nodes, or shared memory is off */
    cx_hier *hier;       /* the group spans nodes: its all-reduces go node by node */
    struct group_comm *next;
} group_comm;

static struct {
    bool initialized, mpi;
    int rank, size, local_rank, local_size;
    MPI_Comm world;
    cx_shm *world_shm;
    cx_hier *world_hier;
    cx_shm_heap *heap;    /* this node's mutually mapped heaps, or NULL */
    MPI_Op byte_sum;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv, done_cv;
    comm_req *head, *tail;
    int pending;          /* enqueued and not yet completed */
    bool stop;
    group_comm *groups;
    bool exit_hook;       /* finalize_at_exit is registered (once a process) */
    pid_t hook_pid;       /* by this process: a child forked after inherits it */
} R = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .done_cv = PTHREAD_COND_INITIALIZER,
        .size = 1, .local_size = 1 };

static MPI_Datatype mpi_type(cx_dtype dt)
{
    switch (dt) {
    case CX_F32: return MPI_FLOAT;
    case CX_I32: return MPI_INT32_T;
    case CX_I64: return MPI_INT64_T;
    case CX_BF16: return MPI_UINT16_T;
    default: return MPI_UINT8_T;
    }
}

/* Byte sums that wrap, as C and PyTorch add uint8. Open MPI 4.1's AVX
 * reductions saturate 8- and 16-bit sums instead (open-mpi/ompi#8045,
 * closed as wontfix), so the answer would depend on the CPU. */
static void wrapping_byte_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    const uint8_t *a = in;
    uint8_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = (uint8_t)(a[i] + b[i]);
}

static MPI_Op mpi_op(cx_reduce_op r, cx_dtype dt)
{
    if (r == CX_RED_SUM && (dt == CX_U8 || dt == CX_BOOL)) return R.byte_sum;
    switch (r) {
    case CX_RED_MAX: return MPI_MAX;
    case CX_RED_MIN: return MPI_MIN;
    default: return MPI_SUM;
    }
}

/* The shared-memory context of a new communicator (collective over c); a
 * segment that could not be made is said once, and MPI carries on. */
static void notice_once(bool *told, const char *why)
{
    if (why[0] && !*told && R.rank == 0) cx_logf(CX_LOG_INFO, "shm", "%s", why);
    *told = *told || why[0];
}

/* The shared-memory contexts of a communicator (collective over c): the
 * flat one when c lies on one node, else the hierarchical one. */
static void shm_for(MPI_Comm c, cx_shm **shm, cx_hier **hier)
{
    static bool told;
    char why[256];
    *shm = cx_shm_open(c, why, sizeof why);
    notice_once(&told, why);
    *hier = NULL;
    if (*shm || why[0]) return;
    *hier = cx_hier_open(c, why, sizeof why);
    notice_once(&told, why);
}

/* The node's heaps (collective over the world), before any shared-memory
 * context is opened: those find their ranks' heaps as they open. */
static void open_heaps(void)
{
    int want = cx_shm_wanted();
    MPI_Bcast(&want, 1, MPI_INT, 0, R.world);
    MPI_Comm node;
    if (!want || cx_shm_split_node(R.world, &node) != MPI_SUCCESS) return;
    static bool told;
    char why[256];
    R.heap = cx_shm_heap_open(node, why, sizeof why);
    notice_once(&told, why);
    MPI_Comm_free(&node);
}

static MPI_Comm comm_for(const cx_comm_op *op, cx_shm **shm, cx_hier **hier, char *err, size_t errn)
{
    *shm = R.world_shm;
    *hier = R.world_hier;
    if (!op->group || op->group_size == R.size) return R.world;
    for (group_comm *g = R.groups; g; g = g->next)
        if (g->size == op->group_size && !memcmp(g->ranks, op->group, sizeof(int) * (size_t)g->size)) {
            *shm = g->shm;
            *hier = g->hier;
            return g->comm;
        }
    /* new group: every rank reaches this split in the same order (the same
     * kernel sequence), so the collective split is safe */
    int color = op->group[0], key = 0;
    for (int i = 0; i < op->group_size; i++) if (op->group[i] == R.rank) key = i;
    MPI_Comm c;
    if (MPI_Comm_split(R.world, color, key, &c) != MPI_SUCCESS) {
        snprintf(err, errn, "collective: MPI_Comm_split for a replica group failed");
        return MPI_COMM_NULL;
    }
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    shm_for(c, shm, hier);
    group_comm *g = calloc(1, sizeof *g);
    if (!g) return c;
    g->size = op->group_size;
    g->ranks = malloc(sizeof(int) * (size_t)g->size);
    if (g->ranks) memcpy(g->ranks, op->group, sizeof(int) * (size_t)g->size);
    g->comm = c;
    g->shm = *shm;
    g->hier = *hier;
    g->next = R.groups;
    R.groups = g;
    return c;
}

static void scale_buffer(void *buf, cx_dtype dt, int64_t n, double s)
{
    if (s == 1.0) return;
    if (dt == CX_F32) { float *p = buf; float f = (float)s; for (int64_t i = 0; i < n; i++) p[i] *= f; }
    else if (dt == CX_BF16) { uint16_t *p = buf; for (int64_t i = 0; i < n; i++) p[i] = cx_f32_to_bf16_inline((float)(cx_bf16_to_f32_inline(p[i]) * s)); }
    else if (dt == CX_I32) { int32_t *p = buf; for (int64_t i = 0; i < n; i++) p[i] = (int32_t)(p[i] * s); }
    else if (dt == CX_I64) { int64_t *p = buf; for (int64_t i = 0; i < n; i++) p[i] = (int64_t)((double)p[i] * s); }
}

/* What the shared-memory path does: reductions of the dtypes its kernels
 * know; all-gathers and broadcasts when asked (cx_shm_takes_gathers says
 * why not by default); never all-to-all. */
static bool shm_takes(const cx_shm *shm, const cx_comm_op *op)
{
    switch (op->kind) {
    case CX_COLL_ALL_REDUCE:
    case CX_COLL_REDUCE_SCATTER: return cx_shm_reduces(op->dtype);
    case CX_COLL_ALL_GATHER:
    case CX_COLL_BROADCAST: return cx_shm_takes_gathers(shm);
    default: return false;
    }
}

static cx_status run_shm(cx_shm *shm, comm_req *q)
{
    const cx_comm_op *op = &q->op;
    size_t es = cx_dtype_size(op->dtype);
    double scale = op->scale * ((op->red == CX_RED_MEAN) ? 1.0 / q->gsize : 1.0);
    cx_reduce_op red = op->red == CX_RED_MEAN ? CX_RED_SUM : op->red;
    cx_counter_add("ShmCollectiveCount", 1);
    switch (op->kind) {
    case CX_COLL_ALL_REDUCE:
        return cx_shm_all_reduce(shm, op->out, op->in, op->count, op->dtype, red, scale, q->err, sizeof q->err);
    case CX_COLL_REDUCE_SCATTER:
        return cx_shm_reduce_scatter(shm, op->out, op->in, op->count, op->dtype, red, scale, q->err, sizeof q->err);
    case CX_COLL_ALL_GATHER:
        return cx_shm_all_gather(shm, op->out, op->in, op->count * (int64_t)es, q->err, sizeof q->err);
    default:
        if (op->out != op->in) memcpy(op->out, op->in, es * (size_t)op->count);
        return cx_shm_broadcast(shm, op->out, op->count * (int64_t)es, op->root, q->err, sizeof q->err);
    }
}

/* Runs one collective (on the progress thread, or on the caller through
 * be_run). Open MPI's non-blocking collectives (libnbc) measured up to 2x
 * slower than the tuned blocking ones here, so this makes blocking calls
 * (the compute threads go on meanwhile), and MPI is told to yield when idle
 * so its polling does not starve compute on an oversubscribed host.
 * finish_op post-processes (scale, reduce-scatter block, bf16). */
static cx_status run_op(comm_req *q)
{
    const cx_comm_op *op = &q->op;
    char *err = q->err;
    size_t errn = sizeof q->err;
    cx_shm *shm = NULL;
    cx_hier *hier = NULL;
    MPI_Comm c = comm_for(op, &shm, &hier, err, errn);
    if (c == MPI_COMM_NULL) return CX_ERR_COMM;
    q->comm = c;
    MPI_Comm_size(c, &q->gsize);
    MPI_Comm_rank(c, &q->grank);
    if (shm && shm_takes(shm, op)) {
        q->done_in_shm = true;
        return run_shm(shm, q);
    }
    if (hier && op->kind == CX_COLL_ALL_REDUCE && cx_hier_takes(op->dtype)) {
        q->done_in_shm = true;
        cx_counter_add("HierarchicalAllReduceCount", 1);
        double scale = op->scale * ((op->red == CX_RED_MEAN) ? 1.0 / q->gsize : 1.0);
        cx_reduce_op red = op->red == CX_RED_MEAN ? CX_RED_SUM : op->red;
        return cx_hier_all_reduce(hier, op->out, op->in, op->count, op->dtype, red, scale, mpi_op(red, op->dtype),
                                  mpi_type(op->dtype), err, errn);
    }
    MPI_Datatype t = mpi_type(op->dtype);
    size_t es = cx_dtype_size(op->dtype);
    int64_t full = op->kind == CX_COLL_REDUCE_SCATTER ? op->count * q->gsize : op->count;
    if (full > INT32_MAX) { snprintf(err, errn, "collective: %lld elements exceed MPI's count limit", (long long)full); return CX_ERR_COMM; }
    int rc = MPI_SUCCESS;
    switch (op->kind) {
    case CX_COLL_ALL_REDUCE:
    case CX_COLL_REDUCE_SCATTER:
        if (op->dtype == CX_BF16) {
            /* MPI has no bf16: reduce in f32 */
            float *f = malloc(sizeof(float) * (size_t)(full ? full : 1));
            if (!f) { snprintf(err, errn, "collective: out of memory"); return CX_ERR_OOM; }
            for (int64_t i = 0; i < full; i++) f[i] = cx_bf16_to_f32_inline(((const uint16_t *)op->in)[i]);
            q->tmp = f;
            rc = MPI_Allreduce(MPI_IN_PLACE, f, (int)full, MPI_FLOAT, mpi_op(op->red, CX_F32), c);
        } else if (op->kind == CX_COLL_ALL_REDUCE) {
            const void *src = op->in == op->out ? MPI_IN_PLACE : op->in;
            rc = MPI_Allreduce(src, op->out, (int)full, t, mpi_op(op->red, op->dtype), c);
        } else {
            /* reduce-scatter as a whole all-reduce: measured faster than
             * MPI_Reduce_scatter_block with Open MPI 4.1 on shared memory */
            q->tmp = malloc(es * (size_t)(full ? full : 1));
            if (!q->tmp) { snprintf(err, errn, "collective: out of memory"); return CX_ERR_OOM; }
            rc = MPI_Allreduce(op->in, q->tmp, (int)full, t, mpi_op(op->red, op->dtype), c);
        }
        break;
    case CX_COLL_ALL_GATHER:
        rc = MPI_Allgather(op->in, (int)op->count, t, op->out, (int)op->count, t, c);
        break;
    case CX_COLL_ALL_TO_ALL:
        rc = MPI_Alltoall(op->in, (int)op->count / q->gsize, t, op->out, (int)op->count / q->gsize, t, c);
        break;
    case CX_COLL_BROADCAST:
        if (op->out != op->in) memcpy(op->out, op->in, es * (size_t)op->count);
        rc = MPI_Bcast(op->out, (int)op->count, t, op->root, c);
        break;
    }
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        snprintf(err, errn, "collective failed on rank %d: %.200s", R.rank, msg);
        free(q->tmp);
        q->tmp = NULL;
        return CX_ERR_COMM;
    }
    return CX_OK;
}

static void finish_op(comm_req *q)
{
    if (q->done_in_shm) return;
    const cx_comm_op *op = &q->op;
    double scale = op->scale * ((op->red == CX_RED_MEAN) ? 1.0 / q->gsize : 1.0);
    size_t es = cx_dtype_size(op->dtype);
    if (op->kind == CX_COLL_ALL_REDUCE || op->kind == CX_COLL_REDUCE_SCATTER) {
        int64_t off = op->kind == CX_COLL_REDUCE_SCATTER ? op->count * q->grank : 0;
        if (op->dtype == CX_BF16) {
            const float *f = q->tmp;
            for (int64_t i = 0; i < op->count; i++) ((uint16_t *)op->out)[i] = cx_f32_to_bf16_inline((float)(f[off + i] * scale));
        } else {
            if (op->kind == CX_COLL_REDUCE_SCATTER) memcpy(op->out, (char *)q->tmp + es * (size_t)off, es * (size_t)op->count);
            scale_buffer(op->out, op->dtype, op->count, scale);
        }
    }
    free(q->tmp);
    q->tmp = NULL;
}

static void complete(comm_req *q)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    q->seconds = (double)t1.tv_sec + 1e-9 * (double)t1.tv_nsec - q->t_start;
    pthread_mutex_lock(&R.mu);
    atomic_store(&q->done, 1);
    R.pending--;
    pthread_cond_broadcast(&R.done_cv);
    pthread_mutex_unlock(&R.mu);
}

static void *progress_main(void *arg)
{
    (void)arg;
    for (;;) {
        /* collectives of a step come back to back: a short spin catches the
         * next one without a futex wake-up on its critical path */
        for (int spin = 0; spin < 20000 && !__atomic_load_n(&R.head, __ATOMIC_ACQUIRE); spin++) {}
        pthread_mutex_lock(&R.mu);
        while (!R.head && !R.stop) pthread_cond_wait(&R.cv, &R.mu);
        if (!R.head) { pthread_mutex_unlock(&R.mu); return NULL; }
        /* everything queued, in order (every rank runs the same collectives
         * in the same order) */
        comm_req *batch = R.head;
        R.head = R.tail = NULL;
        pthread_mutex_unlock(&R.mu);
        while (batch) {
            comm_req *q = batch;
            batch = q->next;
            struct timespec t0;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            q->t_start = (double)t0.tv_sec + 1e-9 * (double)t0.tv_nsec;
            cx_watch_enter(q->fn ? NULL : &q->op);
            if (q->fn) {
                q->status = q->fn(q->arg);
                /* the message lives in this thread's error slot: carry it back */
                if (q->status != CX_OK) snprintf(q->err, sizeof q->err, "%s", cx_last_error());
            } else {
                q->status = run_op(q);
                if (q->status == CX_OK) finish_op(q);
            }
            cx_watch_leave(q->status);
            complete(q);
        }
    }
}

static comm_req *enqueue(comm_req *q)
{
    atomic_store(&q->done, 0);
    q->next = NULL;
    pthread_mutex_lock(&R.mu);
    R.pending++;
    if (R.tail) R.tail->next = q; else R.head = q;
    R.tail = q;
    pthread_cond_signal(&R.cv);
    pthread_mutex_unlock(&R.mu);
    return q;
}

static cx_status wait_req(comm_req *q)
{
    if (!atomic_load(&q->done)) {
        pthread_mutex_lock(&R.mu);
        while (!atomic_load(&q->done)) pthread_cond_wait(&R.done_cv, &R.mu);
        pthread_mutex_unlock(&R.mu);
    }
    cx_metric_add("CollectiveTime", q->seconds);
    cx_status st = q->status;
    if (st != CX_OK && q->err[0]) cx_set_last_error("%s", q->err);
    return st;
}

/* ---- the backend the core calls ----------------------------------------------- */

static int be_size(void *ctx) { (void)ctx; return R.size; }
static int be_rank(void *ctx) { (void)ctx; return R.rank; }
static int be_local_rank(void *ctx) { (void)ctx; return R.local_rank; }
static int be_local_size(void *ctx) { (void)ctx; return R.local_size; }

static void *be_start(void *ctx, const cx_comm_op *op)
{
    (void)ctx;
    comm_req *q = calloc(1, sizeof *q);
    if (!q) { cx_set_last_error("collective: out of memory"); return NULL; }
    q->op = *op;
    if (op->label) {
        snprintf(q->label, sizeof q->label, "%s", op->label);
        q->op.label = q->label;
    }
    cx_counter_add("CollectiveCount", 1);
    return enqueue(q);
}

static cx_status be_wait(void *ctx, void *req)
{
    (void)ctx;
    comm_req *q = req;
    double t0 = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t0 = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    cx_status st = wait_req(q);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    cx_metric_add("CollectiveWaitTime", (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - t0);
    free(q);
    return st;
}

/* Memory the node's other ranks write in place (shm_heap.h); NULL: the
 * caller takes ordinary memory. */
static void *be_alloc_shared(void *ctx, size_t bytes)
{
    (void)ctx;
    return cx_shm_heap_alloc(bytes);
}

static bool be_free_shared(void *ctx, void *p)
{
    (void)ctx;
    return cx_shm_heap_free(p);
}

/* A collective whose result is needed at once: with nothing queued, run it
 * right here (only this thread queues work, so the order every rank shares
 * is kept); otherwise queue it behind the others and wait. */
static cx_status be_run(void *ctx, const cx_comm_op *op)
{
    pthread_mutex_lock(&R.mu);
    bool idle = R.pending == 0;
    pthread_mutex_unlock(&R.mu);
    if (!idle) {
        void *req = be_start(ctx, op);
        return req ? be_wait(ctx, req) : CX_ERR_COMM;
    }
    comm_req q = { .op = *op };
    cx_counter_add("CollectiveCount", 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cx_watch_enter(&q.op);
    q.status = run_op(&q);
    if (q.status == CX_OK) finish_op(&q);
    cx_watch_leave(q.status);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cx_metric_add("CollectiveTime", dt);
    cx_metric_add("CollectiveWaitTime", dt);
    if (q.status != CX_OK && q.err[0]) cx_set_last_error("%s", q.err);
    return q.status;
}

/* Runs fn(arg) on the progress thread, in order with the collectives. */
cx_status cx_dist_run_on_progress(cx_status (*fn)(void *), void *arg)
{
    if (!R.mpi) return fn(arg);
    comm_req q = { .fn = fn, .arg = arg };
    enqueue(&q);
    return wait_req(&q);
}

MPI_Comm cx_dist_world_comm(void) { return R.world; }

/* ---- init / finalize --------------------------------------------------------------- */

/* Who started us, from the one reader of the launchers' variables
 * (util/cx_job.c). Several processes without a world to share would each
 * train alone: torchrun's (RANK/WORLD_SIZE, no MPI), or srun's tasks
 * without PMIx. */
static cx_status read_place(cx_job_info *j)
{
    char msg[512];
    if (!cx_job_read(j, msg, sizeof msg)) {
        cx_set_last_error("dist_init: %s", msg);
        return CX_ERR_COMM;
    }
    if (j->source == CX_JOB_TORCHRUN && j->world > 1) {
        cx_set_last_error("dist_init: WORLD_SIZE=%d but this process is in no MPI world (torchrun's processes share "
                          "none): start the program with `xla-launch --nproc-per-node N PROGRAM ...` instead", j->world);
        return CX_ERR_COMM;
    }
    return CX_OK;
}

/* A program that ends with status 0 without cx_dist_finalize is finalized
 * here, as a torch.distributed or PyTorch/XLA program never calls one:
 * otherwise mpirun counts the rank as failed and prints a screen of its
 * own lines. A rank that exits non-zero is left alone: MPI_Finalize waits
 * for the other ranks, which may be waiting for it, and the launcher
 * stops the job and names the rank. The output is flushed first, since
 * the launcher may stop this rank while it waits (another rank failed).
 * A child the program forked inherits the handler, and must not finalize
 * its parent's MPI. */
static void finalize_at_exit(int status, void *unused)
{
    (void)unused;
    if (status != 0 || !R.initialized || getpid() != R.hook_pid) return;
    fflush(NULL);
    cx_dist_finalize();
}

cx_status cx_dist_init(int *argc, char ***argv)
{
    if (R.initialized) return CX_OK;
    cx_job_info place;
    if (read_place(&place) != CX_OK) return CX_ERR_COMM;
    R.rank = 0;
    R.size = 1;
    R.local_rank = 0;
    R.local_size = 1;
    if (cx_job_has_mpi(&place)) {
        int provided = 0;
        /* blocking collectives run on the progress thread: let MPI's wait
         * loops yield the core (the user's own setting wins) */
        setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
        if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
            cx_set_last_error("dist_init: MPI_Init_thread failed");
            return CX_ERR_COMM;
        }
        if (provided < MPI_THREAD_SERIALIZED) {
            cx_set_last_error("dist_init: this MPI provides thread level %d; cxla needs at least MPI_THREAD_SERIALIZED", provided);
            MPI_Finalize();
            return CX_ERR_COMM;
        }
        if (!R.exit_hook && on_exit(finalize_at_exit, NULL) == 0) {
            R.exit_hook = true;
            R.hook_pid = getpid();
        }
        MPI_Comm_dup(MPI_COMM_WORLD, &R.world);
        MPI_Comm_set_errhandler(R.world, MPI_ERRORS_RETURN);
        MPI_Comm_rank(R.world, &R.rank);
        MPI_Comm_size(R.world, &R.size);
        /* the node layout the shared-memory collectives use too
         * (CX_SHM_NODE_RANKS can pretend several nodes on one machine);
         * the core asks it through the backend, never the environment */
        MPI_Comm local;
        cx_shm_split_node(R.world, &local);
        MPI_Comm_rank(local, &R.local_rank);
        MPI_Comm_size(local, &R.local_size);
        MPI_Comm_free(&local);
        open_heaps();
        shm_for(R.world, &R.world_shm, &R.world_hier);
        MPI_Op_create(wrapping_byte_sum, 1, &R.byte_sum);
        R.mpi = true;
        R.stop = false;
        if (pthread_create(&R.thread, NULL, progress_main, NULL) != 0) {
            cx_set_last_error("dist_init: cannot start the progress thread");
            cx_shm_heap_detach(R.heap);
            R.heap = NULL;
            MPI_Finalize();
            R.mpi = false;
            return CX_ERR_COMM;
        }
        cx_comm_backend be = { CX_STRUCT_SIZE(cx_comm_backend), .name = "mpi", .world_size = be_size, .rank = be_rank,
                               .start = be_start, .wait = be_wait, .run = be_run, .alloc_shared = be_alloc_shared,
                               .free_shared = be_free_shared, .local_rank = be_local_rank,
                               .local_size = be_local_size };
        if (cx_comm_register(&be) != CX_OK) return CX_ERR_COMM;
    }
    /* ranks on one host share its cores */
    if (cx_setting_int("CX_NUM_THREADS") == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int t = (int)(cores / R.local_size);
        cx_set_num_threads(t > 0 ? t : 1);
    }
    if (R.mpi) cx_watch_page_open(R.rank);
    R.initialized = true;
    return CX_OK;
}

void cx_dist_finalize(void)
{
    if (!R.initialized) return;
    if (R.mpi) {
        pthread_mutex_lock(&R.mu);
        R.stop = true;
        pthread_cond_signal(&R.cv);
        pthread_mutex_unlock(&R.mu);
        pthread_join(R.thread, NULL);
        cx_comm_register(NULL);
        for (group_comm *g = R.groups, *n; g; g = n) {
            n = g->next;
            cx_shm_close(g->shm);
            cx_hier_close(g->hier);
            MPI_Comm_free(&g->comm);
            free(g->ranks);
            free(g);
        }
        R.groups = NULL;
        cx_shm_close(R.world_shm);
        cx_hier_close(R.world_hier);
        R.world_shm = NULL;
        R.world_hier = NULL;
        cx_shm_heap_detach(R.heap);
        R.heap = NULL;
        MPI_Op_free(&R.byte_sum);
        cx_watch_page_close();
        MPI_Comm_free(&R.world);
        MPI_Finalize();
        R.mpi = false;
    }
    R.initialized = false;
    R.size = 1;
    R.rank = 0;
}

bool cx_dist_is_initialized(void) { return R.initialized; }
int cx_local_ordinal(void) { return R.local_rank; }
int cx_local_process_count(void) { return R.local_size; }
int cx_addressable_device_count(void) { return 1; }
bool cx_is_master_ordinal(bool local) { return local ? R.local_rank == 0 : cx_global_ordinal() == 0; }
bool cx_dist_uses_mpi(void) { return R.mpi; }
