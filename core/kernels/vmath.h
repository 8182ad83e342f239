/* exp, log and erf in forms the compiler vectorizes: libm's expf, logf and
 * erff stay one scalar call per element without -ffast-math, and the fused kernels
 * (softmax, cross entropy, GELU and their gradients) and attention spend
 * their time there. Straight-line code with selects: no branch, no table. */
#ifndef CX_KERNELS_VMATH_H
#define CX_KERNELS_VMATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

static inline float cx_vmath_pow2i(int32_t n)
{
    union { uint32_t u; float f; } e = { .u = (uint32_t)(n + 127) << 23 };
    return e.f;
}

/* e^r for x = n ln2 + r, n the nearest integer to x / ln2 (*n), x finite
 * and clamped by the caller: Cephes' polynomial. */
static inline float cx_vexpf_reduced(float x, float *n)
{
    /* round to nearest by the 1.5 * 2^23 trick: an add, where roundf is a call */
    const float shifter = 12582912.0f;
    *n = (x * 1.44269504088896341f + shifter) - shifter;
    float r = x - *n * 0.693359375f + *n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

/* exp(x) within 2 ulp wherever the result is a normal float: Cephes'
 * polynomial after the reduction x = n ln2 + r, 2^n applied as two powers
 * so every n in [-126, 128] stays in range. Results below FLT_MIN flush to
 * 0; above FLT_MAX +inf; NaN stays NaN. */
static inline float cx_vexpf(float x)
{
    float xc = x > 88.7228f ? 88.7228f : x;
    xc = xc < -87.3365f ? -87.3365f : xc;
    xc = xc == xc ? xc : 0.0f;   /* NaN: computed on 0, restored below */
    float n, p = cx_vexpf_reduced(xc, &n);
    int32_t ni = (int32_t)n, half = ni / 2;
    float y = p * cx_vmath_pow2i(half) * cx_vmath_pow2i(ni - half);
    y = x > 88.72283935546875f ? INFINITY : y;
    y = x < -87.33654475f ? 0.0f : y;
    return x == x ? y : x;
}

/* cx_vexpf(x) to the bit for x <= 0 (and NaN), for callers whose argument
 * cannot be positive (the GELU gradient's exp(-x^2 / 2)): with n in
 * [-126, 0], 2^n is one normal power, so the upper clamp, the split of
 * 2^n in two and the overflow select go; p 2^n rounds once, as p 2^h
 * 2^(n-h) did. Checked against cx_vexpf on every such float. The GELU
 * gradient took 0.51 ns per value, now 0.39 (one Zen 5 thread). */
static inline float cx_vexpf_nonpos(float x)
{
    float xc = x < -87.3365f ? -87.3365f : x;
    xc = xc == xc ? xc : 0.0f;
    float n, p = cx_vexpf_reduced(xc, &n);
    float y = p * cx_vmath_pow2i((int32_t)n);
    y = x < -87.33654475f ? 0.0f : y;
    return x == x ? y : x;
}

static inline float cx_vmath_from_bits(uint32_t u)
{
    union { uint32_t u; float f; } v = { .u = u };
    return v.f;
}

static inline uint32_t cx_vmath_bits(float x)
{
    union { float f; uint32_t u; } v = { .f = x };
    return v.u;
}

/* log(x) within 2 ulp: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) =
 * f - f^2/2 + f^3 P(f) in f = m - 1 (Cephes' logf polynomial), e ln 2
 * added in two parts. Subnormals are scaled by 2^23 first; 0 gives -inf,
 * a negative x NaN, +inf +inf, NaN NaN. The loss's log-softmax calls it
 * on every logit. Its selects vectorize under -fno-trapping-math only
 * (exec_program.c has it): otherwise GCC keeps some of them as branches. */
static inline float cx_vlogf(float x)
{
    /* both arms of every select computed first: with -ftrapping-math the
     * compiler does not speculate a float op, and a branch is not vectorized */
    bool tiny = x < 1.17549435e-38f;
    float scaled = x * 8388608.0f;   /* a subnormal * 2^23 */
    uint32_t u = cx_vmath_bits(tiny ? scaled : x);
    int32_t e = (int32_t)((u >> 23) & 0xff) - (tiny ? 150 : 127);
    float m = cx_vmath_from_bits((u & 0x007fffffu) | 0x3f800000u);   /* [1, 2) */
    float half = m * 0.5f;
    bool big = m > 1.41421356f;
    m = big ? half : m;
    e = big ? e + 1 : e;
    float f = m - 1.0f, z = f * f;
    float p = 7.0376836292e-2f;
    p = p * f - 1.1514610310e-1f;
    p = p * f + 1.1676998740e-1f;
    p = p * f - 1.2420140846e-1f;
    p = p * f + 1.4249322787e-1f;
    p = p * f - 1.6668057665e-1f;
    p = p * f + 2.0000714765e-1f;
    p = p * f - 2.4999993993e-1f;
    p = p * f + 3.3333331174e-1f;
    float fe = (float)e;
    float y = f * z * p + fe * -2.12194440e-4f - 0.5f * z;
    y = f + y + fe * 0.693359375f;
    y = x == INFINITY ? x : y;
    y = x == 0.0f ? -INFINITY : y;
    y = x < 0.0f ? NAN : y;
    return x == x ? y : x;
}

/* erf(x) within 6 ulp (5.98 at worst, checked on every float): x P(t)/Q(t)
 * in t = x^2, a rational fit of erf(x)/x on [0, 3.9] (2e-8 relative;
 * scripts/fit_erf.py made the coefficients), t held at 3.9^2 beyond, where
 * erf rounds to 1 within an ulp, and the result held to [-1, 1]. One
 * division and ten FMAs: a GPT step's GELU and its gradient evaluate it on
 * every activation, and the former form (a series below 0.5, Abramowitz
 * and Stegun 7.1.26 with an exp above, both computed for every lane) took
 * twice as long. NaN propagates through the arithmetic. */
static inline float cx_verff(float x)
{
    float t = x * x;
    t = t < 15.21f ? t : 15.21f;
    float p = 2.06638783e-06f;
    p = p * t + 2.85056307e-04f;
    p = p * t + 3.73834467e-03f;
    p = p * t + 5.26680431e-02f;
    p = p * t + 1.89667579e-01f;
    p = p * t + 1.12837915f;
    float q = 3.82688333e-05f;
    q = q * t + 1.15736525e-03f;
    q = q * t + 1.49142732e-02f;
    q = q * t + 1.13819145e-01f;
    q = q * t + 5.01421297e-01f;
    q = q * t + 1.0f;
    float y = x * p / q;
    y = y > 1.0f ? 1.0f : y;
    return y < -1.0f ? -1.0f : y;
}

#endif
