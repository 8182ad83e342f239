/* Linear: y = x W^T + b. */
#include "nn_internal.h"

#include <math.h>

typedef struct {
    int w, b;   /* parameter slots; b = -1 without bias */
} linear;

/* x (..., in) is multiplied as one (N, in) matrix, not as a batch of
 * matrices: the weight's gradient is then one GEMM over all N rows instead
 * of a batched GEMM followed by a sum over the batch. */
/* Under autocast the bias joins in bf16, as torch's autocast linear takes
 * it: the output stays bf16 instead of promoting to f32. */
static cx_tensor *add_bias(cx_tensor *y, cx_tensor *b)
{
    if (cx_autocast_dtype() != CX_BF16 || cx_dtype_of(y) != CX_BF16 || cx_dtype_of(b) == CX_BF16) return cx_add(y, b);
    cx_tensor *bc = cx_cast(b, CX_BF16);
    cx_tensor *r = cx_add(y, bc);
    cx_drop(bc);
    return r;
}

static cx_tensor *linear_forward(cx_module *m, cx_tensor *x)
{
    const linear *l = cx_module_impl(m);
    cx_tensor *w = cx_module_param(m, l->w);
    int nd = cx_ndim(x);
    if (nd < 2 || cx_dim(x, nd - 1) != cx_dim(w, 1)) {
        cx_tensor *wt = cx_transpose(w, 0, 1);                       // (in, out): the matmul names the mismatch
        cx_tensor *y = cx_matmul(x, wt);
        cx_drop(wt);
        return y;
    }
    int64_t in = cx_dim(w, 1), out_f = cx_dim(w, 0), rows = cx_numel(x) / (in ? in : 1);
    int64_t flat_shape[2] = { rows, in }, out_shape[CX_MAX_DIMS];
    for (int d = 0; d < nd - 1; d++) out_shape[d] = cx_dim(x, d);
    out_shape[nd - 1] = out_f;
    cx_tensor *flat = nd == 2 ? x : cx_reshape(x, flat_shape, 2);   // (N, in)
    cx_tensor *wt = cx_transpose(w, 0, 1);                           // (in, out)
    cx_tensor *y = cx_matmul(flat, wt);                              // (N, out)
    cx_tensor *yb = l->b < 0 ? y : add_bias(y, cx_module_param(m, l->b));
    cx_tensor *out = nd == 2 ? yb : cx_reshape(yb, out_shape, nd);  // (..., out)
    if (flat != x) cx_drop(flat);
    cx_drop(wt);
    if (yb != y) cx_drop(y);
    if (out != yb) cx_drop(yb);
    return out;
}

static const cx_module_type linear_type = { CX_STRUCT_SIZE(cx_module_type), .name = "Linear", .forward = linear_forward, .free = free };

cx_module *cx_nn_linear(int64_t in_features, int64_t out_features, bool bias)
{
    if (in_features <= 0 || out_features <= 0) {
        cx_set_last_error("cx_nn_linear: bad sizes in %lld, out %lld", (long long)in_features, (long long)out_features);
        return NULL;
    }
    linear *l = calloc(1, sizeof *l);
    if (!l) { cx_set_last_error("cx_nn_linear: out of memory"); return NULL; }
    cx_module *m = cx_module_new(&linear_type, l);
    if (!m) return NULL;
    int64_t wshape[2] = { out_features, in_features };
    /* kaiming_uniform_(a=sqrt(5)) and U(+-1/sqrt(fan_in)) bias, as nn.Linear. */
    l->w = cx_module_register_parameter(m, "weight", cx_init_kaiming_uniform(wshape, 2, sqrt(5.0)));
    l->b = -1;
    if (bias) {
        double bound = 1.0 / sqrt((double)in_features);
        l->b = cx_module_register_parameter(m, "bias", cx_init_uniform(&out_features, 1, -bound, bound));
    }
    if (l->w < 0 || (bias && l->b < 0)) { cx_module_free(m); return NULL; }
    return m;
}
