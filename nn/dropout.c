/* Dropout: Bernoulli mask scaled by 1/(1-p) in training, identity in eval. */
#include "nn_internal.h"

typedef struct {
    double p;
} dropout;

static cx_tensor *dropout_forward(cx_module *m, cx_tensor *x)
{
    const dropout *d = cx_module_impl(m);
    if (!cx_module_is_training(m) || d->p == 0.0) return cx_alias(x);
    if (d->p >= 1.0) return cx_mul_scalar(x, 0.0);
    /* keep-mask from the counter-based RNG: seeds are runtime scalars, so a
     * new mask every step never recompiles. */
    cx_tensor *keep = cx_bernoulli(cx_shape(x), cx_ndim(x), 1.0 - d->p, cx_dtype_of(x));
    cx_tensor *scaled = cx_mul_scalar(keep, 1.0 / (1.0 - d->p));
    cx_drop(keep);
    cx_tensor *y = cx_mul(x, scaled);
    cx_drop(scaled);
    return y;
}

static const cx_module_type dropout_type = { CX_STRUCT_SIZE(cx_module_type), .name = "Dropout", .forward = dropout_forward, .free = free };

cx_module *cx_nn_dropout(double p)
{
    if (!(p >= 0.0 && p <= 1.0)) {
        cx_set_last_error("cx_nn_dropout: probability %g outside [0, 1]", p);
        return NULL;
    }
    dropout *d = malloc(sizeof *d);
    if (!d) { cx_set_last_error("cx_nn_dropout: out of memory"); return NULL; }
    d->p = p;
    return cx_module_new(&dropout_type, d);
}
