/* Random ops. A random op is a leaf whose seed and counter offset are
 * runtime scalars: the value at flat position p is a pure function of
 * (seed, offset + p) (base/philox.c), so graphs never bake in randomness
 * and a new seed never recompiles. */
#include "ops.h"
#include "philox.h"

#include <math.h>

/* The value at flat position p is drawn at counter offset + p of `seed`. */
static cx_tensor *rng_leaf(int kind, const int64_t *shape, int ndim, uint64_t seed_v, uint64_t off)
{
    cx_tensor *seed = cx_runtime_scalar(0, CX_I64), *offset = cx_runtime_scalar(0, CX_I64);
    seed->node->rt_i = (int64_t)seed_v;
    seed->node->rt_f = (double)seed_v;
    offset->node->rt_i = (int64_t)off;
    offset->node->rt_f = (double)off;
    cx_tensor *ins[2] = { seed, offset };
    int64_t attr = kind;
    cx_tensor *r = cx_make_op(OP_RNG, CX_F32, shape, ndim, ins, 2, &attr, 1, 0);
    cx_drop(seed);
    cx_drop(offset);
    return r;
}

static bool check_rng_shape(const int64_t *shape, int ndim, const char *op, cx_tensor **err)
{
    *err = NULL;
    if (ndim < 0 || ndim > CX_MAX_DIMS || (ndim && !shape)) *err = cx_poisoned("%s: bad rank %d", op, ndim);
    for (int i = 0; !*err && i < ndim; i++)
        if (shape[i] < 0) *err = cx_poisoned("%s: negative dimension", op);
    return !*err;
}

/* lo + u * (hi - lo), u uniform in [0, 1) */
cx_tensor *cx_rng_uniform_at(const int64_t *shape, int ndim, double lo, double hi, cx_dtype dtype, uint64_t seed,
                             uint64_t offset)
{
    cx_tensor *u = rng_leaf(0, shape, ndim, seed, offset);
    cx_tensor *s = cx_mul_scalar(u, hi - lo);
    cx_tensor *r = cx_add_scalar(s, lo);
    cx_tensor *c = cx_cast(r, dtype);
    cx_drop(u); cx_drop(s); cx_drop(r);
    return c;
}

/* mean + z * std, z standard normal */
cx_tensor *cx_rng_normal_at(const int64_t *shape, int ndim, double mean, double std, cx_dtype dtype, uint64_t seed,
                            uint64_t offset)
{
    cx_tensor *z = rng_leaf(1, shape, ndim, seed, offset);
    cx_tensor *s = cx_mul_scalar(z, std);
    cx_tensor *r = cx_add_scalar(s, mean);
    cx_tensor *c = cx_cast(r, dtype);
    cx_drop(z); cx_drop(s); cx_drop(r);
    return c;
}

cx_tensor *cx_rand(const int64_t *shape, int ndim, double lo, double hi, cx_dtype dtype)
{
    cx_tensor *err;
    if (!check_rng_shape(shape, ndim, "rand", &err)) return err;
    uint64_t off = cx_rng_reserve((uint64_t)cx_shape_numel(shape, ndim));
    return cx_rng_uniform_at(shape, ndim, lo, hi, cx_held_dtype(dtype), cx_rng_seed(), off);
}

cx_tensor *cx_randn(const int64_t *shape, int ndim, double mean, double std, cx_dtype dtype)
{
    cx_tensor *err;
    if (!check_rng_shape(shape, ndim, "randn", &err)) return err;
    uint64_t off = cx_rng_reserve((uint64_t)cx_shape_numel(shape, ndim));
    return cx_rng_normal_at(shape, ndim, mean, std, cx_held_dtype(dtype), cx_rng_seed(), off);
}

cx_tensor *cx_bernoulli(const int64_t *shape, int ndim, double p, cx_dtype dtype)
{
    if (!(p >= 0 && p <= 1)) return cx_poisoned("bernoulli: probability %g is outside [0, 1]", p);
    cx_tensor *err;
    if (!check_rng_shape(shape, ndim, "bernoulli", &err)) return err;
    uint64_t off = cx_rng_reserve((uint64_t)cx_shape_numel(shape, ndim));
    cx_tensor *u = rng_leaf(0, shape, ndim, cx_rng_seed(), off);
    cx_tensor *pt = cx_full_exact(NULL, 0, p, CX_F32); /* p itself, also under XLA_USE_BF16 */
    cx_tensor *m = cx_lt(u, pt);
    cx_tensor *c = cx_cast(m, cx_held_dtype(dtype));
    cx_drop(u); cx_drop(pt); cx_drop(m);
    return c;
}
