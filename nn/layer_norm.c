/* LayerNorm over the last dim. */
#include "nn_internal.h"

typedef struct {
    double eps;
    int w, b;   /* parameter slots, -1 without elementwise affine */
} layer_norm;

static cx_tensor *layer_norm_forward(cx_module *m, cx_tensor *x)
{
    const layer_norm *ln = cx_module_impl(m);
    return cx_layer_norm(x, 1, ln->w < 0 ? NULL : cx_module_param(m, ln->w),
                         ln->b < 0 ? NULL : cx_module_param(m, ln->b), ln->eps);
}

static const cx_module_type layer_norm_type = { CX_STRUCT_SIZE(cx_module_type), .name = "LayerNorm", .forward = layer_norm_forward, .free = free };

cx_module *cx_nn_layer_norm(int64_t dim, double eps, bool affine)
{
    if (dim <= 0 || !(eps > 0)) {
        cx_set_last_error("cx_nn_layer_norm: bad arguments: dim %lld, eps %g", (long long)dim, eps);
        return NULL;
    }
    layer_norm *ln = malloc(sizeof *ln);
    if (!ln) { cx_set_last_error("cx_nn_layer_norm: out of memory"); return NULL; }
    *ln = (layer_norm){ eps, -1, -1 };
    cx_module *m = cx_module_new(&layer_norm_type, ln);
    if (!m) return NULL;
    if (affine) {
        ln->w = cx_module_register_parameter(m, "weight", cx_init_constant(&dim, 1, 1.0, CX_F32));
        ln->b = cx_module_register_parameter(m, "bias", cx_init_constant(&dim, 1, 0.0, CX_F32));
        if (ln->w < 0 || ln->b < 0) { cx_module_free(m); return NULL; }
    }
    return m;
}
