/* Counter-based RNG (Philox-4x32-10). A random op is a leaf whose seed and
 * counter offset are runtime scalars: the value at flat position p is a
 * pure function of (seed, offset + p), so graphs never bake in randomness
 * and a new seed never recompiles. */
#include "internal.h"

#include <math.h>

static uint64_t g_seed = 0x5eed;
static uint64_t g_offset;

void cx_manual_seed(uint64_t seed) { g_seed = seed; g_offset = 0; }
cx_rng_state cx_get_rng_state(void) { return (cx_rng_state){ g_seed, g_offset }; }
void cx_set_rng_state(cx_rng_state s) { g_seed = s.seed; g_offset = s.offset; }
uint64_t cx_rng_seed(void) { return g_seed; }

uint64_t cx_rng_reserve(uint64_t n)
{
    uint64_t off = g_offset;
    g_offset += n;
    return off;
}

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

void cx_philox(uint64_t seed, uint64_t ctr, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

float cx_rng_uniform01(uint64_t seed, uint64_t ctr)
{
    uint32_t r[4];
    cx_philox(seed, ctr, r);
    return (float)(r[0] >> 8) * (1.0f / 16777216.0f);
}

float cx_rng_normal01(uint64_t seed, uint64_t ctr)
{
    uint32_t r[4];
    cx_philox(seed, ctr, r);
    /* Box-Muller on two 32-bit words; u1 in (0, 1] keeps the log finite */
    double u1 = ((double)r[0] + 1.0) * (1.0 / 4294967296.0);
    double u2 = (double)r[1] * (1.0 / 4294967296.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

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
    return cx_rng_uniform_at(shape, ndim, lo, hi, dtype, g_seed, off);
}

cx_tensor *cx_randn(const int64_t *shape, int ndim, double mean, double std, cx_dtype dtype)
{
    cx_tensor *err;
    if (!check_rng_shape(shape, ndim, "randn", &err)) return err;
    uint64_t off = cx_rng_reserve((uint64_t)cx_shape_numel(shape, ndim));
    return cx_rng_normal_at(shape, ndim, mean, std, dtype, g_seed, off);
}

cx_tensor *cx_bernoulli(const int64_t *shape, int ndim, double p, cx_dtype dtype)
{
    if (!(p >= 0 && p <= 1)) return cx_poisoned("bernoulli: probability %g is outside [0, 1]", p);
    cx_tensor *err;
    if (!check_rng_shape(shape, ndim, "bernoulli", &err)) return err;
    uint64_t off = cx_rng_reserve((uint64_t)cx_shape_numel(shape, ndim));
    cx_tensor *u = rng_leaf(0, shape, ndim, g_seed, off);
    cx_tensor *pt = cx_scalar(p, CX_F32);
    cx_tensor *m = cx_lt(u, pt);
    cx_tensor *c = cx_cast(m, dtype);
    cx_drop(u); cx_drop(pt); cx_drop(m);
    return c;
}
