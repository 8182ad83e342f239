/* Shared helpers for the core unit tests: a small deterministic PRNG, host
 * <-> tensor helpers, shape/index arithmetic for naive references, and
 * relative-tolerance comparisons with informative messages.
 *
 * Header-only (static functions); every test file includes it. */
#ifndef CX_TEST_REF_H
#define CX_TEST_REF_H

#include <criterion/criterion.h>
#include <cxla/core.h>
#include <cxla/cache.h>
#include <cxla/metrics.h>

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define REF_UNUSED __attribute__((unused))
#else
#define REF_UNUSED
#endif

/* ---- PRNG (splitmix64) ------------------------------------------------ */

static uint64_t ref_rng_state = 0x9e3779b97f4a7c15ull;

static REF_UNUSED void rng_seed(uint64_t s) { ref_rng_state = s * 0x9e3779b97f4a7c15ull + 12345u; }

static REF_UNUSED uint64_t rng_u64(void)
{
    uint64_t z = (ref_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static REF_UNUSED double rng_u01(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }

static REF_UNUSED double rng_uniform(double lo, double hi) { return lo + (hi - lo) * rng_u01(); }

/* Integer in [0, n). */
static REF_UNUSED int64_t rng_int(int64_t n) { return (int64_t)(rng_u64() % (uint64_t)n); }

/* ---- shapes ------------------------------------------------------------- */

static REF_UNUSED int64_t ref_numel(const int64_t *shape, int nd)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    return n;
}

/* Row-major strides of `shape` (in elements). */
static REF_UNUSED void ref_strides(const int64_t *shape, int nd, int64_t *strides)
{
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i];
    }
}

static REF_UNUSED void ref_unravel(int64_t flat, const int64_t *shape, int nd, int64_t *idx)
{
    for (int i = nd - 1; i >= 0; i--) {
        idx[i] = shape[i] ? flat % shape[i] : 0;
        flat = shape[i] ? flat / shape[i] : 0;
    }
}

/* Flat offset into an input of shape `in` (nd_in dims, right-aligned,
 * numpy broadcasting) for the output multi-index `oidx` (nd_out dims). */
static REF_UNUSED int64_t ref_bcast_offset(const int64_t *oidx, int nd_out, const int64_t *in, int nd_in)
{
    int64_t off = 0, stride = 1;
    for (int i = nd_in - 1; i >= 0; i--) {
        int oi = nd_out - nd_in + i;
        int64_t ix = in[i] == 1 ? 0 : oidx[oi];
        off += ix * stride;
        stride *= in[i];
    }
    return off;
}

/* Broadcast shape of a and b (returns ndim, -1 if incompatible). */
static REF_UNUSED int ref_bcast_shape(const int64_t *a, int na, const int64_t *b, int nb, int64_t *out)
{
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = na - n + i, ib = nb - n + i;
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da != db && da != 1 && db != 1) return -1;
        out[i] = da == 1 ? db : da;
    }
    return n;
}

static REF_UNUSED const char *ref_shape_str(const int64_t *shape, int nd, char *buf, size_t cap)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "(");
    for (int i = 0; i < nd && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, ")");
    return buf;
}

/* ---- host data ---------------------------------------------------------- */

static REF_UNUSED float *rand_f32(int64_t n, double lo, double hi)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    cr_assert(p != NULL);
    for (int64_t i = 0; i < n; i++) p[i] = (float)rng_uniform(lo, hi);
    return p;
}

/* Random values with |x| in [mag_lo, mag_hi] and a random sign: keeps data
 * away from kinks (relu, abs) for gradient checks. */
static REF_UNUSED float *rand_f32_away0(int64_t n, double mag_lo, double mag_hi)
{
    float *p = rand_f32(n, mag_lo, mag_hi);
    for (int64_t i = 0; i < n; i++)
        if (rng_u64() & 1) p[i] = -p[i];
    return p;
}

/* A random permutation of distinct values lo, lo+gap, ...: no ties (max,
 * argmax, max pool). */
static REF_UNUSED float *distinct_f32(int64_t n, double lo, double gap)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    cr_assert(p != NULL);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(lo + gap * (double)i);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = rng_int(i + 1);
        float t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    return p;
}

static REF_UNUSED double *dalloc(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    cr_assert(p != NULL);
    return p;
}

/* ---- tensors ------------------------------------------------------------ */

static REF_UNUSED cx_tensor *tf32(const float *data, const int64_t *shape, int nd)
{
    static float dummy;
    cx_tensor *t = cx_from_host(data ? (const void *)data : (const void *)&dummy, shape, nd, CX_F32);
    cr_assert(t != NULL, "cx_from_host returned NULL");
    cr_assert(cx_tensor_error(t) == NULL, "cx_from_host poisoned: %s", cx_tensor_error(t));
    return t;
}

static REF_UNUSED cx_tensor *ti64(const int64_t *data, const int64_t *shape, int nd)
{
    static int64_t dummy;
    cx_tensor *t = cx_from_host(data ? (const void *)data : (const void *)&dummy, shape, nd, CX_I64);
    cr_assert(t != NULL && cx_tensor_error(t) == NULL, "cx_from_host(i64) failed");
    return t;
}

static REF_UNUSED cx_tensor *ti32(const int32_t *data, const int64_t *shape, int nd)
{
    static int32_t dummy;
    cx_tensor *t = cx_from_host(data ? (const void *)data : (const void *)&dummy, shape, nd, CX_I32);
    cr_assert(t != NULL && cx_tensor_error(t) == NULL, "cx_from_host(i32) failed");
    return t;
}

/* Asserts t is healthy with the given shape. */
static REF_UNUSED void check_shape(const char *what, const cx_tensor *t, const int64_t *shape, int nd)
{
    char b1[128], b2[128];
    cr_assert(t != NULL, "%s: NULL tensor", what);
    cr_assert(cx_tensor_error(t) == NULL, "%s: poisoned: %s", what, cx_tensor_error(t));
    int tn = cx_ndim(t);
    const int64_t *ts = cx_shape(t);
    bool ok = tn == nd;
    for (int i = 0; ok && i < nd; i++) ok = ts[i] == shape[i];
    cr_assert(ok, "%s: shape %s, expected %s", what, ref_shape_str(ts, tn, b1, sizeof b1),
              ref_shape_str(shape, nd, b2, sizeof b2));
    cr_assert_eq(cx_numel(t), ref_numel(shape, nd), "%s: numel %lld, expected %lld", what,
                 (long long)cx_numel(t), (long long)ref_numel(shape, nd));
}

/* Reads t as f32 (malloc'd; at least one element allocated). */
static REF_UNUSED float *fetch_f32(const char *what, cx_tensor *t)
{
    cr_assert(t != NULL, "%s: NULL tensor", what);
    cr_assert(cx_tensor_error(t) == NULL, "%s: poisoned: %s", what, cx_tensor_error(t));
    int64_t n = cx_numel(t);
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    cr_assert(out != NULL);
    cx_status st = cx_to_host(t, out, CX_F32);
    cr_assert_eq(st, CX_OK, "%s: cx_to_host -> %d (%s)", what, (int)st, cx_last_error());
    return out;
}

static REF_UNUSED int64_t *fetch_i64(const char *what, cx_tensor *t)
{
    cr_assert(t != NULL && cx_tensor_error(t) == NULL, "%s: bad tensor (%s)", what,
              t ? cx_tensor_error(t) : "NULL");
    int64_t n = cx_numel(t);
    int64_t *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    cr_assert(out != NULL);
    cx_status st = cx_to_host(t, out, CX_I64);
    cr_assert_eq(st, CX_OK, "%s: cx_to_host(i64) -> %d (%s)", what, (int)st, cx_last_error());
    return out;
}

/* ---- comparisons ---------------------------------------------------------- */

/* |got - ref| <= tol * max(1, |ref|) for every element. */
static REF_UNUSED void check_close_d(const char *what, const float *got, const double *ref, int64_t n,
                                     double tol)
{
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (!isfinite(r)) {
            cr_assert(isnan(r) ? isnan(g) : g == r, "%s: element %lld: got %.9g, expected %.9g", what, (long long)i, g,
                      r);
            continue;
        }
        double err = fabs(g - r); /* NaN when g is NaN: fails below */
        double lim = tol * (fabs(r) > 1.0 ? fabs(r) : 1.0);
        cr_assert(err <= lim, "%s: element %lld: got %.9g, expected %.9g (|err| %.3g > %.3g)", what,
                  (long long)i, g, r, err, lim);
    }
}

/* Fetches t, checks its shape and compares against ref. */
static REF_UNUSED void expect_tensor(const char *what, cx_tensor *t, const int64_t *shape, int nd,
                                     const double *ref, double tol)
{
    check_shape(what, t, shape, nd);
    cr_assert_eq(cx_dtype_of(t), CX_F32, "%s: dtype %s, expected f32", what, cx_dtype_name(cx_dtype_of(t)));
    float *got = fetch_f32(what, t);
    check_close_d(what, got, ref, ref_numel(shape, nd), tol);
    free(got);
}

/* ---- bf16 reference -------------------------------------------------------- */

static REF_UNUSED uint16_t ref_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return (uint16_t)(u >> 16);
}

static REF_UNUSED float ref_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static REF_UNUSED float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
