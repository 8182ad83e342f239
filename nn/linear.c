/* Linear: y = x W^T + b. */
#include "nn_internal.h"

#include <math.h>

typedef struct {
    int w, b;   /* parameter slots; b = -1 without bias */
} linear;

static cx_tensor *linear_forward(cx_module *m, cx_tensor *x)
{
    const linear *l = cx_module_impl(m);
    cx_tensor *wt = cx_transpose(cx_module_param(m, l->w), 0, 1);   // (in, out)
    cx_tensor *y = cx_matmul(x, wt);                                 // (..., out)
    cx_drop(wt);
    if (l->b < 0) return y;
    cx_tensor *out = cx_add(y, cx_module_param(m, l->b));
    cx_drop(y);
    return out;
}

static const cx_module_type linear_type = { .name = "Linear", .forward = linear_forward, .free = free };

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
