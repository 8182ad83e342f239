/* The IR: interned nodes over the op set, and the tensor handles that own
 * them (the live list, step ownership). Recording an op is the ops layer's
 * (ops/ops.h); this layer only makes, counts and walks nodes and handles. */
#ifndef CX_IR_H
#define CX_IR_H

#include "base.h"
#include "buffer.h"
#include "op_set.h"

enum {
    NF_REQUIRES_GRAD = 1u << 0,   /* some gradient flows through this node */
    NF_PINNED = 1u << 1,          /* never interned (pinned collectives) */
    NF_REMAT = 1u << 2,           /* recorded in a rematerialization region */
    NF_INTERNED = 1u << 3,
};

struct cx_sharding;

typedef struct cx_node cx_node;
struct cx_node {
    uint16_t op;
    uint8_t dtype;
    uint8_t ndim;
    uint32_t flags;
    int64_t shape[CX_MAX_DIMS];
    int64_t numel;
    int ninputs;
    uint32_t loc;                /* XLA_IR_DEBUG: the user's line that made it (obs/site.c), 0: none;
                                    in the padding before inputs, so nodes do not grow */
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

enum {
    TF_PERSISTENT = 1u << 0,
    TF_KEPT = 1u << 1,
    TF_REQUIRES_GRAD = 1u << 2,
    TF_ASSIGNED = 1u << 3,   /* pending value came from cx_assign */
    TF_RELEASED = 1u << 4,   /* freed or released by its step: node says how (tensor.c) */
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

/* ---- nodes (node.c) ---- */

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

/* @return the node with one reference for the caller, or NULL when out of memory. */
cx_node *cx_node_make(const cx_node_desc *d);
void cx_node_ref(cx_node *n);
void cx_node_unref(cx_node *n);
/* A data leaf over buf (takes over the caller's reference on buf). */
cx_node *cx_node_data(cx_buffer *buf, cx_dtype dt, const int64_t *shape, int ndim);
cx_node *cx_node_error(const char *msg);
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

/* ---- handles (tensor.c) ---- */

/* A handle whose value went (cx_free, its step's end) keeps pointing at a
 * poisoned node that says so. @return true, with the error set as "op:
 * how it went", when t is such a handle; false for NULL or a live one. */
bool cx_tensor_released(const cx_tensor *t, const char *op);
/* Wraps a node in a new handle (takes over the caller's reference). */
cx_tensor *cx_tensor_wrap(cx_node *n);
/* Wraps with a fresh reference. */
cx_tensor *cx_tensor_of(cx_node *n);
/* The live tensor list's ends (creation order), read under its lock. A
 * walk from first that stops at last never reads the link another thread
 * (the loader, making leaves) writes when it appends. */
void cx_live_range(cx_tensor **first, cx_tensor **last);
void cx_set_node(cx_tensor *t, cx_node *n); /* takes a new reference on n */
/* Closes the innermost step: its handles are released, kept ones carried
 * to the next step at the same depth. @return false (error set) when no
 * step is open. */
bool cx_step_close(void);
/* Checks a shape given to a creation function (op names it in the error).
 * @return false with the error set. */
bool cx_check_shape(const char *op, const int64_t *shape, int ndim);

/* Eager debug mode (XLA_USE_EAGER_DEBUG_MODE): the ops layer hands each
 * recorded op to this hook, which the API layer (api/eager.c) fills, so
 * recording never calls up into sync. NULL: eager mode has nobody to run. */
extern void (*cx_eager_hook)(cx_tensor *t);

#endif
