/* Parameter initialization as torch.nn.init, from the core's seeded RNG. */
#include "nn_internal.h"

#include <math.h>

int64_t cx_init_fan_in(const int64_t *shape, int ndim)
{
    if (ndim < 2) return ndim == 1 ? shape[0] : 1;
    int64_t f = shape[1];
    for (int i = 2; i < ndim; i++) f *= shape[i];
    return f;
}

/* Persistent and materialized, so every step sees a device-data input
 * rather than an RNG node. */
static cx_tensor *finish(cx_tensor *t)
{
    if (t) cx_nn_persist(t);
    return t;
}

cx_tensor *cx_init_uniform(const int64_t *shape, int ndim, double lo, double hi)
{
    return finish(cx_rand(shape, ndim, lo, hi, CX_F32));
}

cx_tensor *cx_init_normal(const int64_t *shape, int ndim, double mean, double std)
{
    return finish(cx_randn(shape, ndim, mean, std, CX_F32));
}

cx_tensor *cx_init_kaiming_uniform(const int64_t *shape, int ndim, double a)
{
    double fan_in = (double)cx_init_fan_in(shape, ndim);
    double gain = sqrt(2.0 / (1.0 + a * a));
    double bound = fan_in > 0 ? gain * sqrt(3.0 / fan_in) : 0.0;
    return cx_init_uniform(shape, ndim, -bound, bound);
}
