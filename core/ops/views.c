/* Movement ops, views of their input: reshape, permute, expand, slice, pad,
 * concat. Trivial cases fold at record time. */
#include "ops.h"

#include <math.h>

static cx_tensor *check_in(cx_tensor *a, const char *op)
{
    if (!a) return cx_poisoned("%s: input is NULL", op);
    if (a->node->op == OP_ERROR) return cx_tensor_of(a->node);
    return NULL;
}

cx_tensor *cx_reshape(cx_tensor *a, const int64_t *shape_in, int ndim)
{
    cx_tensor *p = check_in(a, "reshape");
    if (p) return p;
    char b0[160], b1[160];
    if (ndim < 0 || ndim > CX_MAX_DIMS) return cx_poisoned("reshape: rank %d is outside 0..%d", ndim, CX_MAX_DIMS);
    int64_t shape[CX_MAX_DIMS];
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        shape[i] = shape_in[i];
        if (shape[i] == -1) {
            if (infer >= 0) return cx_poisoned("reshape: more than one -1 in %s", cx_shape_str(b0, sizeof b0, shape_in, ndim));
            infer = i;
        } else if (shape[i] < 0) {
            return cx_poisoned("reshape: negative dimension in %s", cx_shape_str(b0, sizeof b0, shape_in, ndim));
        } else {
            known *= shape[i];
        }
    }
    if (infer >= 0) {
        if (known == 0 || a->node->numel % known)
            return cx_poisoned("reshape: cannot infer -1 in %s for %lld elements of %s",
                             cx_shape_str(b0, sizeof b0, shape_in, ndim), (long long)a->node->numel,
                             cx_shape_str(b1, sizeof b1, a->node->shape, a->node->ndim));
        shape[infer] = a->node->numel / known;
    }
    if (cx_shape_numel(shape, ndim) != a->node->numel)
        return cx_poisoned("reshape: cannot reshape %s (%lld elements) to %s",
                         cx_shape_str(b0, sizeof b0, a->node->shape, a->node->ndim), (long long)a->node->numel,
                         cx_shape_str(b1, sizeof b1, shape, ndim));
    if (cx_same_shape(shape, ndim, a->node->shape, a->node->ndim)) return cx_alias(a);
    /* reshape of a reshape is one reshape */
    if (a->node->op == OP_RESHAPE && (a->node->flags & NF_REQUIRES_GRAD) == (a->node->inputs[0]->flags & NF_REQUIRES_GRAD)) {
        cx_tensor *inner = cx_tensor_of(a->node->inputs[0]);
        cx_tensor *r = cx_reshape(inner, shape, ndim);
        cx_drop(inner);
        return r;
    }
    return cx_make_op(OP_RESHAPE, (cx_dtype)a->node->dtype, shape, ndim, &a, 1, NULL, 0, 0);
}

cx_tensor *cx_permute(cx_tensor *a, const int *perm)
{
    cx_tensor *p = check_in(a, "permute");
    if (p) return p;
    int nd = a->node->ndim;
    int64_t attrs[CX_MAX_DIMS], shape[CX_MAX_DIMS];
    bool seen[CX_MAX_DIMS] = { 0 }, ident = true;
    for (int i = 0; i < nd; i++) {
        int ax = perm ? cx_norm_axis(perm[i], nd) : -1;
        if (ax < 0 || seen[ax]) {
            char b[160];
            return cx_poisoned("permute: invalid permutation for shape %s (axis %d at position %d)",
                             cx_shape_str(b, sizeof b, a->node->shape, nd), perm ? perm[i] : 0, i);
        }
        seen[ax] = true;
        attrs[CX_AT_PERM(i)] = ax;
        shape[i] = a->node->shape[ax];
        if (ax != i) ident = false;
    }
    if (ident) return cx_alias(a);
    if (a->node->op == OP_PERMUTE && (a->node->flags & NF_REQUIRES_GRAD) == (a->node->inputs[0]->flags & NF_REQUIRES_GRAD)) {
        int composed[CX_MAX_DIMS];
        for (int i = 0; i < nd; i++) composed[i] = (int)CX_ATTR(a->node, CX_AT_PERM(attrs[i]));
        cx_tensor *inner = cx_tensor_of(a->node->inputs[0]);
        cx_tensor *r = cx_permute(inner, composed);
        cx_drop(inner);
        return r;
    }
    return cx_make_op(OP_PERMUTE, (cx_dtype)a->node->dtype, shape, nd, &a, 1, attrs, nd, 0);
}

cx_tensor *cx_transpose(cx_tensor *a, int axis0, int axis1)
{
    cx_tensor *p = check_in(a, "transpose");
    if (p) return p;
    int nd = a->node->ndim;
    int x = cx_norm_axis(axis0, nd), y = cx_norm_axis(axis1, nd);
    if (x < 0 || y < 0 || nd == 0) return cx_poisoned("transpose: axes %d, %d out of range for rank %d", axis0, axis1, nd);
    int perm[CX_MAX_DIMS];
    for (int i = 0; i < nd; i++) perm[i] = i;
    perm[x] = y;
    perm[y] = x;
    return cx_permute(a, perm);
}

cx_tensor *cx_expand(cx_tensor *a, const int64_t *shape, int ndim)
{
    cx_tensor *p = check_in(a, "expand");
    if (p) return p;
    char b0[160], b1[160];
    int nd = a->node->ndim;
    if (ndim < nd || ndim > CX_MAX_DIMS)
        return cx_poisoned("expand: cannot expand %s to %s", cx_shape_str(b0, sizeof b0, a->node->shape, nd),
                         cx_shape_str(b1, sizeof b1, shape, ndim));
    int64_t full[CX_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        int j = i - (ndim - nd);
        int64_t s = j >= 0 ? a->node->shape[j] : 1;
        int64_t want = shape[i] == -1 ? s : shape[i];
        if (s != want && s != 1)
            return cx_poisoned("expand: cannot expand %s to %s", cx_shape_str(b0, sizeof b0, a->node->shape, nd),
                             cx_shape_str(b1, sizeof b1, shape, ndim));
        full[i] = want;
    }
    if (cx_same_shape(full, ndim, a->node->shape, nd)) return cx_alias(a);
    cx_tensor *src = a;
    bool drop_src = false;
    if (ndim != nd) {
        int64_t lifted[CX_MAX_DIMS] = { 0 };
        for (int i = 0; i < ndim; i++) lifted[i] = i < ndim - nd ? 1 : a->node->shape[i - (ndim - nd)];
        src = cx_reshape(a, lifted, ndim);
        drop_src = true;
        if (cx_same_shape(full, ndim, lifted, ndim)) return src;
    }
    cx_tensor *r = cx_make_op(OP_EXPAND, (cx_dtype)a->node->dtype, full, ndim, &src, 1, NULL, 0, 0);
    if (drop_src) cx_drop(src);
    return r;
}

cx_tensor *cx_slice(cx_tensor *a, int axis, int64_t start, int64_t end, int64_t step)
{
    cx_tensor *p = check_in(a, "slice");
    if (p) return p;
    int nd = a->node->ndim;
    int ax = cx_norm_axis(axis, nd);
    char b[160];
    if (ax < 0 || nd == 0) return cx_poisoned("slice: axis %d out of range for shape %s", axis, cx_shape_str(b, sizeof b, a->node->shape, nd));
    int64_t dim = a->node->shape[ax];
    if (start < 0) start += dim;
    if (end < 0) end += dim;
    if (end > dim) end = dim;
    if (step <= 0 || start < 0 || start > dim || end < start)
        return cx_poisoned("slice: range [%lld:%lld:%lld] is invalid for axis %d of shape %s", (long long)start,
                         (long long)end, (long long)step, axis, cx_shape_str(b, sizeof b, a->node->shape, nd));
    int64_t shape[CX_MAX_DIMS];
    memcpy(shape, a->node->shape, sizeof(int64_t) * (size_t)nd);
    shape[ax] = (end - start + step - 1) / step;
    if (start == 0 && shape[ax] == dim && (step == 1 || dim <= 1)) return cx_alias(a);
    int64_t attrs[CX_AT_SLICE_COUNT] = { [CX_AT_SLICE_AXIS] = ax, [CX_AT_SLICE_START] = start, [CX_AT_SLICE_STEP] = step };
    return cx_make_op(OP_SLICE, (cx_dtype)a->node->dtype, shape, nd, &a, 1, attrs, CX_AT_SLICE_COUNT, 0);
}

/* Internal pad with interior padding (used by the slice VJP). */
cx_tensor *cx_pad_interior(cx_tensor *a, const int64_t *lo, const int64_t *hi, const int64_t *interior, double value)
{
    int nd = a->node->ndim;
    int64_t shape[CX_MAX_DIMS], attrs[CX_AT_PAD_COUNT(CX_MAX_DIMS)];
    bool trivial = true;
    for (int i = 0; i < nd; i++) {
        int64_t in = interior ? interior[i] : 0;
        int64_t s = a->node->shape[i];
        shape[i] = lo[i] + hi[i] + (s > 0 ? s + (s - 1) * in : 0);
        attrs[CX_AT_PAD_LO(nd, i)] = lo[i];
        attrs[CX_AT_PAD_HI(nd, i)] = hi[i];
        attrs[CX_AT_PAD_INTERIOR(nd, i)] = in;
        if (lo[i] || hi[i] || (in && s > 1)) trivial = false;
    }
    if (trivial) return cx_alias(a);
    return cx_make_op(OP_PAD, (cx_dtype)a->node->dtype, shape, nd, &a, 1, attrs, CX_AT_PAD_COUNT(nd), value);
}

cx_tensor *cx_pad(cx_tensor *a, const int64_t *lo, const int64_t *hi, double value)
{
    cx_tensor *p = check_in(a, "pad");
    if (p) return p;
    int nd = a->node->ndim;
    for (int i = 0; i < nd; i++)
        if (!lo || !hi || lo[i] < 0 || hi[i] < 0) return cx_poisoned("pad: padding of axis %d must be >= 0", i);
    return cx_pad_interior(a, lo, hi, NULL, value);
}

static bool concat_on(const cx_node *x, int ax, cx_dtype dt)
{
    return x->op == OP_CONCAT && CX_ATTR(x, CX_AT_AXIS) == ax && x->dtype == dt;
}

cx_tensor *cx_concat(cx_tensor **ts, int n, int axis)
{
    if (n <= 0 || !ts) return cx_poisoned("concat: no inputs");
    for (int i = 0; i < n; i++) {
        cx_tensor *p = check_in(ts[i], "concat");
        if (p) return p;
    }
    int nd = ts[0]->node->ndim;
    int ax = cx_norm_axis(axis, nd);
    char b0[160], b1[160];
    if (ax < 0 || nd == 0) return cx_poisoned("concat: axis %d out of range for rank %d", axis, nd);
    int64_t shape[CX_MAX_DIMS];
    memcpy(shape, ts[0]->node->shape, sizeof(int64_t) * (size_t)nd);
    cx_dtype dt = (cx_dtype)ts[0]->node->dtype;
    for (int i = 1; i < n; i++) {
        cx_node *x = ts[i]->node;
        bool ok = x->ndim == nd;
        for (int d = 0; ok && d < nd; d++) if (d != ax && x->shape[d] != shape[d]) ok = false;
        if (!ok) return cx_poisoned("concat: shapes %s and %s differ outside axis %d",
                                  cx_shape_str(b0, sizeof b0, ts[0]->node->shape, nd),
                                  cx_shape_str(b1, sizeof b1, x->shape, x->ndim), ax);
        shape[ax] += x->shape[ax];
        dt = cx_promote(dt, (cx_dtype)x->dtype);
    }
    if (n == 1) return cx_alias(ts[0]);
    /* a concat along the same axis among the inputs gives its own inputs
     * (cast to its dtype already): one copy of each part, not two */
    int parts = 0;
    for (int i = 0; i < n; i++) parts += concat_on(ts[i]->node, ax, dt) ? ts[i]->node->ninputs : 1;
    cx_tensor **cast = malloc((size_t)parts * sizeof *cast);
    if (!cast) return cx_poisoned("concat: out of memory");
    int k = 0;
    for (int i = 0; i < n; i++) {
        cx_node *x = ts[i]->node;
        if (!concat_on(x, ax, dt)) { cast[k++] = cx_cast(ts[i], dt); continue; }
        for (int j = 0; j < x->ninputs; j++) cast[k++] = cx_tensor_of(x->inputs[j]);
    }
    int64_t attr = ax;
    cx_tensor *r = cx_make_op(OP_CONCAT, dt, shape, nd, cast, parts, &attr, 1, 0);
    for (int i = 0; i < parts; i++) cx_drop(cast[i]);
    free(cast);
    return r;
}

cx_tensor *cx_flatten(cx_tensor *a, int start_axis, int end_axis)
{
    cx_tensor *p = check_in(a, "flatten");
    if (p) return p;
    int nd = a->node->ndim;
    if (nd == 0) { int64_t one = 1; return cx_reshape(a, &one, 1); }
    int s = cx_norm_axis(start_axis, nd), e = cx_norm_axis(end_axis, nd);
    if (s < 0 || e < 0 || s > e) return cx_poisoned("flatten: axes %d..%d invalid for rank %d", start_axis, end_axis, nd);
    int64_t shape[CX_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < s; i++) shape[k++] = a->node->shape[i];
    int64_t m = 1;
    for (int i = s; i <= e; i++) m *= a->node->shape[i];
    shape[k++] = m;
    for (int i = e + 1; i < nd; i++) shape[k++] = a->node->shape[i];
    return cx_reshape(a, shape, k);
}

cx_tensor *cx_unsqueeze(cx_tensor *a, int axis)
{
    cx_tensor *p = check_in(a, "unsqueeze");
    if (p) return p;
    int nd = a->node->ndim;
    if (axis < 0) axis += nd + 1;
    if (axis < 0 || axis > nd || nd >= CX_MAX_DIMS) return cx_poisoned("unsqueeze: axis out of range for rank %d", nd);
    int64_t shape[CX_MAX_DIMS];
    for (int i = 0, k = 0; i <= nd; i++) shape[i] = i == axis ? 1 : a->node->shape[k++];
    return cx_reshape(a, shape, nd + 1);
}

cx_tensor *cx_squeeze(cx_tensor *a, int axis)
{
    cx_tensor *p = check_in(a, "squeeze");
    if (p) return p;
    int nd = a->node->ndim;
    int ax = cx_norm_axis(axis, nd);
    if (ax < 0 || nd == 0) return cx_poisoned("squeeze: axis %d out of range for rank %d", axis, nd);
    if (a->node->shape[ax] != 1) return cx_alias(a);
    int64_t shape[CX_MAX_DIMS];
    for (int i = 0, k = 0; i < nd; i++) if (i != ax) shape[k++] = a->node->shape[i];
    return cx_reshape(a, shape, nd - 1);
}

cx_tensor *cx_expand_to(cx_tensor *a, const int64_t *shape, int ndim)
{
    if (!a) return cx_poisoned("expand: NULL input");
    if (a->node->op == OP_ERROR) return cx_tensor_of(a->node);
    return cx_expand(a, shape, ndim);
}
