/* Internals of the lazy tensor core: IR nodes, tensor handles, op table.
 * Only core/ includes this file. */
#ifndef CX_INTERNAL_H
#define CX_INTERNAL_H

#include <cxla/core.h>
#include <cxla/comm.h>
#include <cxla/metrics.h>

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cx_assert.h"
#include "op_attrs.h"


/* ---- the op set ------------------------------------------------------- */

typedef enum {
    /* leaves */
    OP_DATA = 0, OP_CONST, OP_RTSCALAR, OP_IOTA, OP_RNG,
    /* elementwise unary */
    OP_NEG, OP_EXP, OP_LOG, OP_SQRT, OP_RSQRT, OP_TANH, OP_ERF, OP_ABS, OP_SIGN, OP_CAST,
    /* elementwise binary / ternary */
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN, OP_POW, OP_LT, OP_LE, OP_EQ, OP_WHERE,
    /* reductions */
    OP_REDUCE_SUM, OP_REDUCE_MAX, OP_ARGMAX,
    /* movement */
    OP_RESHAPE, OP_PERMUTE, OP_EXPAND, OP_SLICE, OP_PAD, OP_CONCAT,
    /* contraction and friends */
    OP_MATMUL, OP_CONV2D, OP_CONV2D_BWD_INPUT, OP_CONV2D_BWD_WEIGHT,
    OP_MAXPOOL, OP_MAXPOOL_BWD, OP_AVGPOOL, OP_AVGPOOL_BWD, OP_GATHER, OP_SCATTER_ADD,
    /* fused: one kernel each, where the composite would write and re-read */
    OP_ATTENTION, OP_ATTENTION_BWD, OP_LAYER_NORM, OP_LAYER_NORM_BWD,
    /* collectives */
    OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_TO_ALL, OP_BROADCAST,
    /* a poisoned value (bad arguments somewhere upstream) */
    OP_ERROR,
    OP_COUNT
} cx_op;

typedef enum {
    G_LEAF, G_UNARY, G_BINARY, G_TERNARY, G_REDUCE, G_MOVEMENT, G_CONTRACT, G_COLLECTIVE, G_ERROR
} cx_op_group;

struct cx_node;
typedef struct cx_node cx_node;
struct cx_vjp_ctx;

/* VJP rule: given the node and the gradient of its output, return the
 * gradient of input `i` (a new lazy tensor, or NULL when not
 * differentiable w.r.t. that input). Rules use the public lazy ops. */
typedef cx_tensor *(*cx_vjp_fn)(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i);

typedef struct {
    const char *name;
    int arity;           /* -1: variadic */
    cx_op_group group;
    cx_vjp_fn vjp;       /* NULL: not differentiable */
} cx_op_info;

extern const cx_op_info cx_op_table[OP_COUNT];

/* ---- nodes -------------------------------------------------------------- */


enum {
    NF_REQUIRES_GRAD = 1u << 0,   /* some gradient flows through this node */
    NF_PINNED = 1u << 1,          /* never interned (pinned collectives) */
    NF_REMAT = 1u << 2,           /* recorded in a rematerialization region */
    NF_INTERNED = 1u << 3,
};

typedef struct cx_buffer {
    void *data;
    size_t bytes;
    int refs;
    bool shared;    /* from cx_comm_alloc: a collective's output */
} cx_buffer;

struct cx_node {
    uint16_t op;
    uint8_t dtype;
    uint8_t ndim;
    uint32_t flags;
    int64_t shape[CX_MAX_DIMS];
    int64_t numel;
    int ninputs;
    cx_node **inputs;            /* owned array of counted references */
    cx_node *inline_inputs[3];
    int nattrs;
    int64_t attrs[CX_MAX_ATTRS];
    double fval;                 /* constant value, scale, pad value, ... */
    uint64_t remat_tag;          /* non-zero on rematerialized clones */
    uint64_t hash;               /* intern hash */
    uint64_t id;                 /* creation order */
    int refs;                    /* tensors + consumer nodes */
    int hrefs;                   /* tensor handles only */
    cx_node *intern_next;
    /* leaves */
    cx_buffer *buf;              /* OP_DATA */
    double rt_f;                 /* OP_RTSCALAR value */
    int64_t rt_i;
    struct cx_tensor *grad_leaf; /* OP_DATA of a tensor that requires grad */
    char *err;                   /* OP_ERROR message */
    cx_init_recipe *init;        /* OP_DATA without buffer: the deferred values' recipe */
    struct cx_sharding *sharding; /* SPMD: OP_DATA whose buffer holds this rank's shard, or an
                                     annotation the partitioner must meet (owned) */
    /* scratch for graph walks */
    int mark;
    int index;
};

/* ---- tensors -------------------------------------------------------------- */

enum {
    TF_PERSISTENT = 1u << 0,
    TF_KEPT = 1u << 1,
    TF_REQUIRES_GRAD = 1u << 2,
    TF_ASSIGNED = 1u << 3,   /* pending value came from cx_assign */
};

struct cx_tensor {
    cx_node *node;
    uint32_t flags;
    int step_depth;          /* step that owns it (0 = none) */
    uint64_t id;
    cx_tensor *prev, *next;  /* live list, creation order */
    cx_tensor *step_next;    /* owning step's list */
    cx_tensor *grad;         /* persistent gradient */
    cx_node *donor;          /* old value (OP_DATA) a cx_assign may overwrite */
    int step_slot;           /* index in the owning step's list */
    char *name;
};

/* ---- node API ------------------------------------------------------------ */

/* Creates (or finds, when interned) a node. `inputs` are borrowed; the node
 * takes its own references. Shape/dtype must already be valid. */
typedef struct {
    cx_op op;
    cx_dtype dtype;
    int ndim;
    const int64_t *shape;
    int ninputs;
    cx_node *const *inputs;
    int nattrs;
    const int64_t *attrs;
    double fval;
    uint32_t flags;
} cx_node_desc;

cx_node *cx_node_make(const cx_node_desc *d);
void cx_node_ref(cx_node *n);
void cx_node_unref(cx_node *n);
cx_node *cx_node_data(cx_buffer *buf, cx_dtype dt, const int64_t *shape, int ndim);
cx_node *cx_node_error(const char *msg);
int64_t cx_shape_numel(const int64_t *shape, int ndim);
uint64_t cx_next_id(void);
/* Two fresh values for node->mark in a graph walk (visited, done). */
int cx_mark_epoch(void);
/* Post-order walk from roots (inputs before their users, each node once):
 * follow(x, input) says whether the walk goes from x into that input; visit
 * is called as each node finishes. Uses node marks (a fresh epoch); NULL
 * roots are skipped. @return false when out of memory or a visit returned
 * false. */
bool cx_node_postorder(cx_node *const *roots, int nroots, bool (*follow)(const cx_node *x, const cx_node *input),
                       bool (*visit)(void *ctx, cx_node *x), void *ctx);

cx_buffer *cx_buffer_new(size_t bytes);
/* The same for a collective's output: from the backend's shared memory
 * when it is large enough for in-place writes to pay and the backend has
 * some to give, else as cx_buffer_new. */
cx_buffer *cx_buffer_new_collective(size_t bytes);
void cx_buffer_ref(cx_buffer *b);
void cx_buffer_unref(cx_buffer *b);
/* Device memory accounting (live buffers + arena). */
void cx_mem_account(int64_t delta);
/* Checks a request against CX_MEMORY_LIMIT. @return CX_OK or CX_ERR_OOM. */
cx_status cx_mem_check(int64_t request, const char *what);

/* Wraps a node in a new handle (takes over the caller's reference). */
cx_tensor *cx_tensor_wrap(cx_node *n);
/* Wraps with a fresh reference. */
cx_tensor *cx_tensor_of(cx_node *n);
/* Errors: cx_set_last_error and cx_poisoned (core.h) are the only ways to
 * report one, inside the core as outside. */
/* The lazy whole value of a deferred tensor (its recipe as a graph), or
 * NULL when t is not deferred. */
cx_tensor *cx_deferred_values(const cx_tensor *t);
/* Converts n values between dtypes (a copy when equal). */
void cx_convert_values(void *out, cx_dtype odt, const void *in, cx_dtype idt, int64_t n);
/* Formats a shape as "(2, 3)" into buf. */
const char *cx_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim);

/* Iterates the live tensor list (creation order). */
cx_tensor *cx_live_first(void);
void cx_set_node(cx_tensor *t, cx_node *n); /* takes a new reference on n */

/* ---- op helpers shared across op files -------------------------------------- */

/* Creates an op node from tensors, propagating poison and requires-grad. */
cx_tensor *cx_make_op(cx_op op, cx_dtype dt, const int64_t *shape, int ndim,
                      cx_tensor *const *ins, int nin, const int64_t *attrs, int nattrs,
                      double fval);
cx_tensor *cx_expand_to(cx_tensor *a, const int64_t *shape, int ndim);
/* (A @ B)^T recorded as B^T @ A^T for a matmul node `mm`: the product
 * comes out in the transposed layout, with no copy afterwards. */
cx_tensor *cx_matmul_transposed(cx_node *mm);
/* Sums `g` down to `shape` (the reverse of broadcasting). */
cx_tensor *cx_sum_to(cx_tensor *g, const int64_t *shape, int ndim);
cx_tensor *cx_scalar_like(cx_tensor *a, double v);
/* Layer norm over the last dim with weight and bias, all f32, as one kernel
 * (ops_fused.c; cx_layer_norm picks it). */
cx_tensor *cx_layer_norm_fused(cx_tensor *x, cx_tensor *w, cx_tensor *b, double eps);
cx_dtype cx_promote(cx_dtype a, cx_dtype b);
int cx_norm_axis(int axis, int ndim);

/* ---- RNG --------------------------------------------------------------------- */

/* Philox-4x32-10 counter: 4 words for counter value `ctr` under `seed`. */
void cx_philox(uint64_t seed, uint64_t ctr, uint32_t out[4]);
float cx_rng_uniform01(uint64_t seed, uint64_t ctr);
float cx_rng_normal01(uint64_t seed, uint64_t ctr);
/* Reserves `n` counter values. @return the offset to use. */
uint64_t cx_rng_reserve(uint64_t n);
uint64_t cx_rng_seed(void);
/* The RNG op chains cx_rand/cx_randn record, drawn at counter `offset` of
 * stream `seed`: one definition for the eager draws and deferred ranges,
 * so both give the same bits. */
cx_tensor *cx_rng_uniform_at(const int64_t *shape, int ndim, double lo, double hi, cx_dtype dtype, uint64_t seed,
                             uint64_t offset);
cx_tensor *cx_rng_normal_at(const int64_t *shape, int ndim, double mean, double std, cx_dtype dtype, uint64_t seed,
                            uint64_t offset);

/* ---- graph execution (compile.c / exec.c) ------------------------------------ */

/* Materializes the pending values of `ts` in one graph (compile or cache
 * hit, run); ts NULL: every live tensor. Poisoned tensors are skipped and
 * reported. cause: who asked, for the debug analysis ("step end",
 * "loader", "user sync", "value read", "eager"). (sync.c)
 * @return CX_OK or the first error. */
cx_status cx_materialize(cx_tensor **ts, int n, const char *cause);
/* Closes the innermost step: its handles are released, kept ones carried
 * to the next step at the same depth (tensor.c). @return false (error set)
 * when no step is open. */
bool cx_step_close(void);
/* Runs the step closures added during the step that just ended (closures.c). */
void cx_closures_run(void);
/* Eager debug mode: computes t's node now and keeps the value on the node
 * (eager.c). */
void cx_eager_run(cx_tensor *t);

/* ---- what this thread records into (record.c) ------------------------------------ */

typedef struct {
    int step_depth;          /* open steps: new handles belong to the innermost */
    int no_grad;             /* open no_grad regions */
    int remat_depth;         /* open remat regions ... */
    uint64_t remat_region;   /* ... and the tag their nodes carry */
    const char *site_file;   /* the user's line that syncs (cx_sync_at & co.), or NULL */
    int site_line;
} cx_record_ctx;

cx_record_ctx *cx_record(void);
/* The tag of the open rematerialization region, 0 outside one. */
uint64_t cx_remat_region(void);

/* ---- comm backend (registered by parallel/) --------------------------------------- */

const cx_comm_backend *cx_comm_get(void);
/* Memory from the backend's alloc_shared only (cx_comm_alloc without the
 * fallback). @return NULL when the backend has none to give; free it with
 * cx_comm_free. */
void *cx_comm_alloc_shared(size_t bytes);
/* The replica group `rank` is in, for interned group id `id` (0: all
 * ranks): its ranks in order (*size of them), or NULL. */
const int *cx_groups_lookup(int64_t id, int rank, int *size);
/* The whole group list of `id`. @return 0 when id is 0 or unknown. */
int cx_groups_describe(int64_t id, int *ngroups, int *group_size, const int **ranks);

/* ---- bf16: util/cx_bf16.h (the public cx_bf16_to_f32 & co. wrap it) ---- */
#include "cx_bf16.h"

/* ---- a tiny lock for the core's shared lists (uncontended almost always) ---- */
#include <stdatomic.h>
typedef atomic_flag cx_spinlock;
#define CX_SPINLOCK_INIT ATOMIC_FLAG_INIT
static inline void cx_spin_lock(cx_spinlock *l) { while (atomic_flag_test_and_set_explicit(l, memory_order_acquire)) {} }
static inline void cx_spin_unlock(cx_spinlock *l) { atomic_flag_clear_explicit(l, memory_order_release); }

/* ---- timing ------------------------------------------------------------------------ */
#include "cx_time.h"

#endif
