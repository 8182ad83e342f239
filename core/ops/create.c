/* Tensors made from a value: constants (a 0-d constant expanded, so one
 * node whatever the shape), runtime scalars and iotas. They record ops
 * (cx_full expands), so they live in the ops layer; tensors over host data
 * are the IR's (ir/tensor.c). */
#include "ops.h"

cx_tensor *cx_full(const int64_t *shape, int ndim, double value, cx_dtype dtype)
{
    return cx_full_exact(shape, ndim, value, (unsigned)dtype < CX_DTYPE_COUNT ? cx_held_dtype(dtype) : dtype);
}

cx_tensor *cx_full_exact(const int64_t *shape, int ndim, double value, cx_dtype dtype)
{
    if (!cx_check_shape("full", shape, ndim)) return cx_poisoned("%s", cx_last_error());
    if ((unsigned)dtype >= CX_DTYPE_COUNT) return cx_poisoned("full: unknown dtype %d", (int)dtype);
    /* a 0-d constant expanded: the constant is one node whatever the shape */
    cx_node_desc d = { .op = OP_CONST, .dtype = dtype, .ndim = 0, .fval = value };
    cx_tensor *c = cx_tensor_wrap(cx_node_make(&d));
    if (ndim == 0) return c;
    cx_tensor *r = cx_expand_to(c, shape, ndim);
    cx_drop(c);
    return r;
}

cx_tensor *cx_zeros(const int64_t *shape, int ndim, cx_dtype dtype) { return cx_full(shape, ndim, 0.0, dtype); }

cx_tensor *cx_ones(const int64_t *shape, int ndim, cx_dtype dtype) { return cx_full(shape, ndim, 1.0, dtype); }

cx_tensor *cx_scalar(double value, cx_dtype dtype) { return cx_full(NULL, 0, value, dtype); }

cx_tensor *cx_runtime_scalar(double value, cx_dtype dtype)
{
    if ((unsigned)dtype >= CX_DTYPE_COUNT) return cx_poisoned("runtime_scalar: unknown dtype %d", (int)dtype);
    cx_node_desc d = { .op = OP_RTSCALAR, .dtype = cx_held_dtype(dtype), .ndim = 0 };
    cx_node *n = cx_node_make(&d);
    if (!n) return cx_poisoned("runtime_scalar: out of memory");
    n->rt_f = value;
    n->rt_i = (int64_t)value;
    return cx_tensor_wrap(n);
}

cx_tensor *cx_arange(int64_t n, cx_dtype dtype)
{
    if (n < 0) return cx_poisoned("arange: negative length %lld", (long long)n);
    cx_node_desc d = { .op = OP_IOTA, .dtype = cx_held_dtype(dtype), .ndim = 1, .shape = &n };
    return cx_tensor_wrap(cx_node_make(&d));
}

cx_tensor *cx_scalar_like(cx_tensor *a, double v)
{
    return cx_full_exact(NULL, 0, v, a ? cx_dtype_of(a) : CX_F32); /* a's dtype, already the held one */
}
