/* Conv2d with a square kernel. */
#include "nn_internal.h"

#include "cx_struct.h"

#include <math.h>

typedef struct {
    int w, b;     /* parameter slots; b = -1 without bias */
    cx_conv2d_opts o;
} conv2d;

static cx_tensor *conv2d_forward(cx_module *m, cx_tensor *x)
{
    const conv2d *c = cx_module_impl(m);
    const cx_conv2d_opts *o = &c->o;
    return cx_conv2d(x, cx_module_param(m, c->w), c->b < 0 ? NULL : cx_module_param(m, c->b),
                     o->stride, o->stride, o->padding, o->padding, o->dilation, o->dilation, o->groups);
}

static const cx_module_type conv2d_type = { CX_STRUCT_SIZE(cx_module_type), .name = "Conv2d", .forward = conv2d_forward, .free = free };

cx_module *cx_nn_conv2d(int64_t in_channels, int64_t out_channels, int k, cx_conv2d_opts given)
{
    cx_conv2d_opts o = cx_conv2d_default_opts();
    if (!CX_TAKE_STRUCT("cx_nn_conv2d", cx_conv2d_opts, o, &given, bias)) return NULL;
    if (in_channels <= 0 || out_channels <= 0 || k <= 0 || o.stride <= 0 || o.padding < 0 ||
        o.dilation <= 0 || o.groups <= 0 || in_channels % o.groups || out_channels % o.groups) {
        cx_set_last_error("cx_nn_conv2d: bad arguments: in %lld, out %lld, kernel %d, stride %d, padding %d, "
                     "dilation %d, groups %d", (long long)in_channels, (long long)out_channels, k, o.stride,
                     o.padding, o.dilation, o.groups);
        return NULL;
    }
    conv2d *c = calloc(1, sizeof *c);
    if (!c) { cx_set_last_error("cx_nn_conv2d: out of memory"); return NULL; }
    c->o = o;
    cx_module *m = cx_module_new(&conv2d_type, c);
    if (!m) return NULL;
    int64_t wshape[4] = { out_channels, in_channels / o.groups, k, k };
    c->w = cx_module_register_parameter(m, "weight", cx_init_kaiming_uniform(wshape, 4, sqrt(5.0)));
    c->b = -1;
    if (o.bias) {
        double bound = 1.0 / sqrt((double)cx_init_fan_in(wshape, 4));
        c->b = cx_module_register_parameter(m, "bias", cx_init_uniform(&out_channels, 1, -bound, bound));
    }
    if (c->w < 0 || (o.bias && c->b < 0)) { cx_module_free(m); return NULL; }
    return m;
}
