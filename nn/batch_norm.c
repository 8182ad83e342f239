/* BatchNorm2d over (N, C, H, W) with running statistics as buffers. */
#include "nn_internal.h"

#include "cx_struct.h"

typedef struct {
    cx_batch_norm_opts o;
    int64_t c;
    int w, b;                       /* parameter slots (-1 without affine) */
    int mean, var, count;           /* buffer slots (-1 without tracking) */
} batch_norm;

/* (C) -> (1, C, 1, 1) so it broadcasts over (N, C, H, W). */
static cx_tensor *per_channel(cx_tensor *v, int64_t c)
{
    int64_t shape[4] = { 1, c, 1, 1 };
    return cx_reshape(v, shape, 4);
}

/* running = (1 - momentum) * running + momentum * batch, recorded without
 * gradient and assigned in place. */
static void update_running(cx_tensor *running, cx_tensor *batch, double momentum)
{
    cx_tensor *a = cx_mul_scalar(running, 1.0 - momentum);
    cx_tensor *b = cx_mul_scalar(batch, momentum);
    cx_tensor *n = cx_add(a, b);
    cx_assign(running, n);
    cx_drop(a); cx_drop(b); cx_drop(n);
}

static cx_tensor *batch_norm_forward(cx_module *m, cx_tensor *x)
{
    const batch_norm *bn = cx_module_impl(m);
    if (cx_ndim(x) != 4 || cx_dim(x, 1) != bn->c)
        return cx_poisoned("BatchNorm2d(%lld): want (N, %lld, H, W), got %d dims with %lld channels",
                         (long long)bn->c, (long long)bn->c, cx_ndim(x), cx_ndim(x) > 1 ? (long long)cx_dim(x, 1) : 0LL);
    bool batch_stats = cx_module_is_training(m) || bn->mean < 0;
    cx_tensor *mean, *var;                             // (C)
    if (batch_stats) {
        int axes[3] = { 0, 2, 3 };
        mean = cx_mean(x, axes, 3, false);
        var = cx_var(x, axes, 3, 0, false);            // biased, for normalizing
        if (cx_module_is_training(m) && bn->mean >= 0) {
            int64_t n = cx_numel(x) / bn->c;
            cx_no_grad_begin();
            cx_tensor *md = cx_detach(mean), *vd = cx_detach(var);
            /* The running variance is the unbiased estimate, as PyTorch. */
            cx_tensor *vu = cx_mul_scalar(vd, n > 1 ? (double)n / (double)(n - 1) : 1.0);
            update_running(cx_module_buffer(m, bn->mean), md, bn->o.momentum);
            update_running(cx_module_buffer(m, bn->var), vu, bn->o.momentum);
            cx_tensor *cnt = cx_module_buffer(m, bn->count);
            cx_tensor *inc = cx_add_scalar(cnt, 1.0);
            cx_assign(cnt, inc);
            cx_drop(inc); cx_drop(md); cx_drop(vd); cx_drop(vu);
            cx_no_grad_end();
        }
    } else {
        mean = cx_alias(cx_module_buffer(m, bn->mean));
        var = cx_alias(cx_module_buffer(m, bn->var));
    }
    cx_tensor *mean4 = per_channel(mean, bn->c), *var4 = per_channel(var, bn->c);
    cx_tensor *centered = cx_sub(x, mean4);            // (N, C, H, W)
    cx_tensor *ve = cx_add_scalar(var4, bn->o.eps);
    cx_tensor *inv = cx_rsqrt(ve);                     // (1, C, 1, 1)
    cx_tensor *y = cx_mul(centered, inv);
    cx_drop(mean); cx_drop(var); cx_drop(mean4); cx_drop(var4);
    cx_drop(centered); cx_drop(ve); cx_drop(inv);
    if (bn->w >= 0) {
        cx_tensor *w4 = per_channel(cx_module_param(m, bn->w), bn->c);
        cx_tensor *b4 = per_channel(cx_module_param(m, bn->b), bn->c);
        cx_tensor *yw = cx_mul(y, w4);
        cx_tensor *out = cx_add(yw, b4);
        cx_drop(w4); cx_drop(b4); cx_drop(yw); cx_drop(y);
        y = out;
    }
    return y;
}

static const cx_module_type batch_norm_type = { CX_STRUCT_SIZE(cx_module_type), .name = "BatchNorm2d", .forward = batch_norm_forward, .free = free };

cx_module *cx_nn_batch_norm2d(int64_t c, cx_batch_norm_opts given)
{
    cx_batch_norm_opts o = cx_batch_norm_default_opts();
    if (!CX_TAKE_STRUCT("cx_nn_batch_norm2d", cx_batch_norm_opts, o, &given, track_running_stats)) return NULL;
    if (c <= 0 || !(o.eps > 0) || !(o.momentum >= 0 && o.momentum <= 1)) {
        cx_set_last_error("cx_nn_batch_norm2d: bad arguments: %lld features, eps %g, momentum %g", (long long)c, o.eps,
                     o.momentum);
        return NULL;
    }
    batch_norm *bn = calloc(1, sizeof *bn);
    if (!bn) { cx_set_last_error("cx_nn_batch_norm2d: out of memory"); return NULL; }
    bn->o = o;
    bn->c = c;
    bn->w = bn->b = bn->mean = bn->var = bn->count = -1;
    cx_module *m = cx_module_new(&batch_norm_type, bn);
    if (!m) return NULL;
    bool ok = true;
    if (o.affine) {
        bn->w = cx_module_register_parameter(m, "weight", cx_init_constant(&c, 1, 1.0, CX_F32));
        bn->b = cx_module_register_parameter(m, "bias", cx_init_constant(&c, 1, 0.0, CX_F32));
        ok = bn->w >= 0 && bn->b >= 0;
    }
    if (ok && o.track_running_stats) {
        bn->mean = cx_module_register_buffer(m, "running_mean", cx_init_constant(&c, 1, 0.0, CX_F32));
        bn->var = cx_module_register_buffer(m, "running_var", cx_init_constant(&c, 1, 1.0, CX_F32));
        bn->count = cx_module_register_buffer(m, "num_batches_tracked", cx_init_constant(NULL, 0, 0.0, CX_I64));
        ok = bn->mean >= 0 && bn->var >= 0 && bn->count >= 0;
    }
    if (!ok) { cx_module_free(m); return NULL; }
    return m;
}
