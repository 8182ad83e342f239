/* The ops layer: what records nodes. Every public op (core.h) lives here,
 * with the helpers the op files share and creation and assignment, which
 * record too. Gradient rules are one layer up (autograd/). */
#ifndef CX_OPS_H
#define CX_OPS_H

#include "ir.h"
#include "obs.h"

cx_tensor *cx_expand_to(cx_tensor *a, const int64_t *shape, int ndim);
/* (A @ B)^T recorded as B^T @ A^T for a matmul node `mm`: the product
 * comes out in the transposed layout, with no copy afterwards. */
cx_tensor *cx_matmul_transposed(cx_node *mm);
/* The matmul primitive without broadcasting or checks (batch dims equal). */
cx_tensor *cx_matmul_prim(cx_tensor *a, cx_tensor *b);
/* Pad with interior padding (the slice's gradient). */
cx_tensor *cx_pad_interior(cx_tensor *a, const int64_t *lo, const int64_t *hi, const int64_t *interior, double value);
cx_tensor *cx_scalar_like(cx_tensor *a, double v);
/* The erf GELU, x Phi(x), as one op (its derivative one more): the
 * executor computes each in vector lanes, nothing stored between steps. */
cx_tensor *cx_gelu_erf(cx_tensor *a);
/* gelu'(x) = Phi(x) + x phi(x) (the erf GELU's derivative), elementwise:
 * the gradient rule of cx_gelu's op. */
cx_tensor *cx_gelu_grad(cx_tensor *x);
/* cx_full in `dtype` itself, never the held dtype (XLA_USE_BF16): for
 * values the ops compute with in f32. */
cx_tensor *cx_full_exact(const int64_t *shape, int ndim, double value, cx_dtype dtype);
/* Layer norm over the last dim with weight and bias, all f32, as one kernel
 * (ops_fused.c; cx_layer_norm picks it). */
cx_tensor *cx_layer_norm_fused(cx_tensor *x, cx_tensor *w, cx_tensor *b, double eps);
int cx_norm_axis(int axis, int ndim);

/* Creates an op node from tensors, propagating poison and requires-grad.
 * Inline: every op records through it, and a call per op is a measurable
 * share of tracing a step. */
static inline cx_tensor *cx_make_op(cx_op op, cx_dtype dt, const int64_t *shape, int ndim,
                      cx_tensor *const *ins, int nin, const int64_t *attrs, int nattrs, double fval)
{
    cx_node *nodes_small[8];
    cx_node **nodes = nin <= 8 ? nodes_small : malloc((size_t)nin * sizeof *nodes);
    if (!nodes) return cx_poisoned("%s: out of memory", cx_op_table[op].name);
    uint32_t flags = 0;
    for (int i = 0; i < nin; i++) {
        if (!ins[i]) {
            if (nodes != nodes_small) free(nodes);
            return cx_poisoned("%s: input %d is NULL", cx_op_table[op].name, i);
        }
        if (ins[i]->node->op == OP_ERROR) {
            if (nodes != nodes_small) free(nodes);
            return cx_tensor_of(ins[i]->node); /* poison propagates */
        }
        nodes[i] = ins[i]->node;
        if (nodes[i]->flags & NF_REQUIRES_GRAD) flags |= NF_REQUIRES_GRAD;
    }
    if (cx_record()->no_grad) flags = 0;
    cx_node_desc d = { .op = op, .dtype = dt, .ndim = ndim, .shape = shape, .ninputs = nin,
                       .inputs = nodes, .nattrs = nattrs, .attrs = attrs, .fval = fval, .flags = flags };
    cx_node *n = cx_node_make(&d);
    if (nodes != nodes_small) free(nodes);
    if (!n) return cx_poisoned("%s: out of memory", cx_op_table[op].name);
    cx_tensor *t = cx_tensor_wrap(n);
    /* XLA_USE_EAGER_DEBUG_MODE: run the op now (api/eager.c fills the hook); one branch otherwise */
    if (t && (cx_obs_get() & OBS_EAGER) && cx_eager_hook) cx_eager_hook(t);
    return t;
}

/* The small rules every op checks on its hot path, inline so that recording
 * an op pays no call for them. */
static inline bool cx_same_shape(const int64_t *a, int na, const int64_t *b, int nb)
{
    if (na != nb) return false;
    for (int i = 0; i < na; i++) if (a[i] != b[i]) return false;
    return true;
}

/* n is the constant v, seen through expands and reshapes. */
static inline bool cx_is_constant(const cx_node *n, double v)
{
    while ((n->op == OP_EXPAND || n->op == OP_RESHAPE) && n->ninputs == 1) n = n->inputs[0];
    return n->op == OP_CONST && n->fval == v;
}

/* The dtype two operands meet in: floats win (f32 when both are), else the
 * wider integer. */
static inline cx_dtype cx_promote(cx_dtype a, cx_dtype b)
{
    if (a == b) return a;
    bool fa = cx_dtype_is_float(a), fb = cx_dtype_is_float(b);
    if (fa && fb) return CX_F32;
    if (fa) return a;
    if (fb) return b;
    static const int rank[CX_DTYPE_COUNT] = { [CX_BOOL] = 0, [CX_U8] = 1, [CX_I32] = 2, [CX_I64] = 3 };
    return rank[a] >= rank[b] ? a : b;
}

/* ---- autocast (autocast.c) ---- */

/* A bf16 autocast region is open on this thread. Inline: the f32-list ops
 * ask on every call. */
static inline bool cx_autocast_on(void)
{
    const cx_record_ctx *r = cx_record();
    return r->autocast_depth > 0 && r->autocast_dtype[r->autocast_depth - 1] == CX_BF16;
}
/* In a bf16 region with an operand to cast: replaces ts[0..n) by new
 * handles (bf16 casts of the float operands for the bf16-list ops, f32
 * casts of the bf16 ones for the f32 list; aliases of the rest, NULLs
 * kept), for the op to record itself on and cx_autocast_drop to release.
 * @return whether it did; ts is untouched when not. */
bool cx_autocast_cast_low(cx_tensor **ts, int n);
bool cx_autocast_cast_f32(cx_tensor **ts, int n);
void cx_autocast_drop(cx_tensor **ts, int n);
/* Inline: outside a region an op pays one branch, not a call. */
static inline bool cx_autocast_low(cx_tensor **ts, int n) { return cx_autocast_on() && cx_autocast_cast_low(ts, n); }
static inline bool cx_autocast_f32(cx_tensor **ts, int n) { return cx_autocast_on() && cx_autocast_cast_f32(ts, n); }

/* The RNG op chains cx_rand/cx_randn record, drawn at counter `offset` of
 * stream `seed`: one definition for the eager draws and deferred ranges,
 * so both give the same bits. */
cx_tensor *cx_rng_uniform_at(const int64_t *shape, int ndim, double lo, double hi, cx_dtype dtype, uint64_t seed,
                             uint64_t offset);
cx_tensor *cx_rng_normal_at(const int64_t *shape, int ndim, double mean, double std, cx_dtype dtype, uint64_t seed,
                            uint64_t offset);
/* The lazy whole value of a deferred tensor (its recipe as a graph), or
 * NULL when t is not deferred (deferred.c). */
cx_tensor *cx_deferred_values(const cx_tensor *t);

/* ---- shardings on tensors (sharding_ops.c) ---- */

struct cx_sharding;
/* Replaces t's node by an identity carrying the annotation s (the
 * gradient of a sharded leaf, the value assigned to one, mark_sharding of
 * a pending value). @return CX_OK (also for a poisoned t) or CX_ERR_OOM. */
cx_status cx_spmd_annotate(cx_tensor *t, const struct cx_sharding *s);
/* A host value keeps only this rank's shard: t gets a new data leaf.
 * @return CX_OK or CX_ERR_OOM. */
cx_status cx_shard_data_leaf(cx_tensor *t, const struct cx_sharding *s);
/* Copies a sharded data node's shards from every rank into the global
 * value at out (the node's dtype). Collective. @return CX_OK or an error. */
cx_status cx_spmd_gather_value(const cx_node *x, void *out);

#endif
