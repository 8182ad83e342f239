/* Autograd: the gradient rule of every differentiable op (one column,
 * vjp_table.c, guarded like the op table) and the backward walk
 * (autograd.c). Rules record with the public ops and ops/ops.h. */
#ifndef CX_AUTOGRAD_H
#define CX_AUTOGRAD_H

#include "ops.h"

/* VJP rule: given the node and the gradient of its output, return the
 * gradient of input `i` (a new lazy tensor, or NULL when not
 * differentiable w.r.t. that input). */
typedef cx_tensor *(*cx_vjp_fn)(cx_node *n, cx_tensor *const *in, cx_tensor *out, cx_tensor *g, int i);

/* The rule per op, NULL where the op is not differentiable. */
extern const cx_vjp_fn cx_vjp_table[OP_COUNT];

/* cx_requires_grad's flags, for a float tensor whose node is its value
 * (OP_DATA, a placeholder or deferred init included) or turning off: the
 * node is then the leaf backward accumulates into t's grad. @return t. */
cx_tensor *cx_autograd_mark_leaf(cx_tensor *t, bool on);

/* Sums `g` down to `shape` (the reverse of broadcasting). */
cx_tensor *cx_sum_to(cx_tensor *g, const int64_t *shape, int ndim);

cx_tensor *cx_vjp_unary(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_binary(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_where(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_movement(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_reduce(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_matmul(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_conv(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_pool(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_gather(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_attention(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_layer_norm(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);
cx_tensor *cx_vjp_collective(cx_node *, cx_tensor *const *, cx_tensor *, cx_tensor *, int);

#endif
