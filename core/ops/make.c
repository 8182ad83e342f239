/* The rules every op file shares that are too large to inline (axes,
 * casts); recording itself, cx_make_op, is inline in ops.h. The bottom of
 * the ops layer: it calls no other op file. */
#include "ops.h"
#include "obs.h"

int cx_norm_axis(int axis, int ndim)
{
    if (axis < 0) axis += ndim;
    return (axis < 0 || axis >= (ndim ? ndim : 1)) ? -1 : axis;
}

/* A dtype conversion is part of the rules: promotion records casts. */
cx_tensor *cx_cast(cx_tensor *a, cx_dtype dtype)
{
    if (!a) return cx_poisoned("cast: input 0 is NULL");
    if (a->node->op == OP_ERROR) return cx_tensor_of(a->node);
    if ((unsigned)dtype >= CX_DTYPE_COUNT) return cx_poisoned("cast: unknown dtype %d", (int)dtype);
    if (a->node->dtype == dtype) return cx_alias(a);
    int64_t attr = dtype;
    return cx_make_op(OP_CAST, dtype, a->node->shape, a->node->ndim, &a, 1, &attr, 1, 0);
}
