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

/* Deferred construction nests; a thread builds its own models. */
static _Thread_local int t_deferred;

void cx_deferred_init_begin(void) { t_deferred++; }
void cx_deferred_init_end(void) { if (t_deferred > 0) t_deferred--; }
bool cx_deferred_init_enabled(void) { return t_deferred > 0; }

/* Persistent and materialized, so every step sees a device-data input
 * rather than an RNG node. */
static cx_tensor *finish(cx_tensor *t)
{
    if (t) cx_nn_persist(t);
    return t;
}

static bool valid_shape(const int64_t *shape, int ndim)
{
    if (ndim < 0 || ndim > CX_MAX_DIMS || (ndim && !shape)) return false;
    for (int i = 0; i < ndim; i++) if (shape[i] < 0) return false;
    return true;
}

/* The recipe of the draw the eager call would make now, and the RNG moved
 * past it as that draw would: a model built deferred consumes the stream
 * exactly as one built eagerly, so every later draw matches too. */
static cx_tensor *deferred_draw(cx_init_kind kind, const int64_t *shape, int ndim, double a, double b)
{
    cx_rng_state s = cx_get_rng_state();
    cx_init_recipe r = { .kind = kind, .a = a, .b = b, .seed = s.seed, .offset = s.offset };
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    s.offset += (uint64_t)n;
    cx_set_rng_state(s);
    return cx_deferred(shape, ndim, CX_F32, &r);
}

cx_tensor *cx_init_uniform(const int64_t *shape, int ndim, double lo, double hi)
{
    if (t_deferred && valid_shape(shape, ndim)) return deferred_draw(CX_INIT_UNIFORM, shape, ndim, lo, hi);
    return finish(cx_rand(shape, ndim, lo, hi, CX_F32));
}

cx_tensor *cx_init_normal(const int64_t *shape, int ndim, double mean, double std)
{
    if (t_deferred && valid_shape(shape, ndim)) return deferred_draw(CX_INIT_NORMAL, shape, ndim, mean, std);
    return finish(cx_randn(shape, ndim, mean, std, CX_F32));
}

cx_tensor *cx_init_kaiming_uniform(const int64_t *shape, int ndim, double a)
{
    double fan_in = (double)cx_init_fan_in(shape, ndim);
    double gain = sqrt(2.0 / (1.0 + a * a));
    double bound = fan_in > 0 ? gain * sqrt(3.0 / fan_in) : 0.0;
    return cx_init_uniform(shape, ndim, -bound, bound);
}

cx_tensor *cx_init_constant(const int64_t *shape, int ndim, double value, cx_dtype dtype)
{
    if (t_deferred && valid_shape(shape, ndim)) {
        cx_init_recipe r = { .kind = CX_INIT_CONSTANT, .a = value };
        return cx_deferred(shape, ndim, dtype, &r);
    }
    return finish(cx_full(shape, ndim, value, dtype));
}
