/* Pooling layers: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d. */
#include "nn_internal.h"

typedef struct {
    int k, s, p;
} pool2d;

static cx_tensor *max_pool_forward(cx_module *m, cx_tensor *x)
{
    const pool2d *p = cx_module_impl(m);
    return cx_max_pool2d(x, p->k, p->k, p->s, p->s, p->p, p->p);
}

static cx_tensor *avg_pool_forward(cx_module *m, cx_tensor *x)
{
    const pool2d *p = cx_module_impl(m);
    return cx_avg_pool2d(x, p->k, p->k, p->s, p->s, p->p, p->p);
}

static const cx_module_type max_pool_type = { CX_STRUCT_SIZE(cx_module_type), .name = "MaxPool2d", .forward = max_pool_forward, .free = free };
static const cx_module_type avg_pool_type = { CX_STRUCT_SIZE(cx_module_type), .name = "AvgPool2d", .forward = avg_pool_forward, .free = free };

static cx_module *pool_new(const cx_module_type *type, int k, int s, int p)
{
    if (k <= 0 || s < 0 || p < 0 || p * 2 > k) {
        cx_set_last_error("%s: bad arguments: kernel %d, stride %d, padding %d (padding at most half the kernel)",
                     type->name, k, s, p);
        return NULL;
    }
    pool2d *impl = malloc(sizeof *impl);
    if (!impl) { cx_set_last_error("%s: out of memory", type->name); return NULL; }
    *impl = (pool2d){ k, s ? s : k, p };
    return cx_module_new(type, impl);
}

cx_module *cx_nn_max_pool2d(int k, int s, int p) { return pool_new(&max_pool_type, k, s, p); }
cx_module *cx_nn_avg_pool2d(int k, int s, int p) { return pool_new(&avg_pool_type, k, s, p); }

/* ---- adaptive average pooling ------------------------------------------ */

typedef struct {
    int oh, ow;
} adaptive;

/* Means over windows [floor(i*in/out), ceil((i+1)*in/out)) along `axis`, the
 * bounds of torch's adaptive pooling; one avg-pool when the sizes divide. */
static cx_tensor *adaptive_axis(cx_tensor *x, int axis, int64_t out)
{
    int64_t in = cx_dim(x, axis);
    if (in == out) return cx_alias(x);
    cx_tensor **parts = malloc((size_t)out * sizeof *parts);
    if (!parts) return cx_poisoned("AdaptiveAvgPool2d: out of memory for %lld windows", (long long)out);
    for (int64_t i = 0; i < out; i++) {
        int64_t lo = i * in / out, hi = ((i + 1) * in + out - 1) / out;
        cx_tensor *win = cx_slice(x, axis, lo, hi, 1);
        int ax = axis;
        parts[i] = cx_mean(win, &ax, 1, true);
        cx_drop(win);
    }
    cx_tensor *y = cx_concat(parts, (int)out, axis);
    for (int64_t i = 0; i < out; i++) cx_drop(parts[i]);
    free(parts);
    return y;
}

static cx_tensor *adaptive_forward(cx_module *m, cx_tensor *x)
{
    const adaptive *a = cx_module_impl(m);
    if (cx_ndim(x) != 4) return cx_poisoned("AdaptiveAvgPool2d: want (N, C, H, W), got %d dims", cx_ndim(x));
    int64_t h = cx_dim(x, 2), w = cx_dim(x, 3);
    if (h % a->oh == 0 && w % a->ow == 0) {
        int kh = (int)(h / a->oh), kw = (int)(w / a->ow);
        return cx_avg_pool2d(x, kh, kw, kh, kw, 0, 0);
    }
    cx_tensor *rows = adaptive_axis(x, 2, a->oh);    // (N, C, oh, W)
    cx_tensor *y = adaptive_axis(rows, 3, a->ow);    // (N, C, oh, ow)
    cx_drop(rows);
    return y;
}

static const cx_module_type adaptive_type = { CX_STRUCT_SIZE(cx_module_type),
    .name = "AdaptiveAvgPool2d",
    .forward = adaptive_forward,
    .free = free,
};

cx_module *cx_nn_adaptive_avg_pool2d(int out_h, int out_w)
{
    if (out_h <= 0 || out_w <= 0) {
        cx_set_last_error("cx_nn_adaptive_avg_pool2d: bad output size %dx%d", out_h, out_w);
        return NULL;
    }
    adaptive *a = malloc(sizeof *a);
    if (!a) { cx_set_last_error("cx_nn_adaptive_avg_pool2d: out of memory"); return NULL; }
    *a = (adaptive){ out_h, out_w };
    return cx_module_new(&adaptive_type, a);
}
