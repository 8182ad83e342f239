/* exp and erf in forms the compiler vectorizes: libm's expf and erff stay
 * one scalar call per element without -ffast-math, and the fused kernels
 * (softmax, cross entropy, GELU and their gradients) and attention spend
 * their time there. Straight-line code with selects: no branch, no table. */
#ifndef CX_KERNELS_VMATH_H
#define CX_KERNELS_VMATH_H

#include <math.h>
#include <stdint.h>

static inline float cx_vmath_pow2i(int32_t n)
{
    union { uint32_t u; float f; } e = { .u = (uint32_t)(n + 127) << 23 };
    return e.f;
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
    /* round to nearest by the 1.5 * 2^23 trick: an add, where roundf is a call */
    const float shifter = 12582912.0f;
    float n = (xc * 1.44269504088896341f + shifter) - shifter;
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t ni = (int32_t)n, half = ni / 2;
    float y = p * cx_vmath_pow2i(half) * cx_vmath_pow2i(ni - half);
    y = x > 88.72283935546875f ? INFINITY : y;
    y = x < -87.33654475f ? 0.0f : y;
    return x == x ? y : x;
}

/* erf(x) within 6 ulp: the Taylor series of x e^0 below |x| = 0.5,
 * where it is exact to 3e-8 relative, and Abramowitz and Stegun 7.1.26
 * (1.5e-7 absolute, so a few ulp of results >= 0.52) above. */
static inline float cx_verff(float x)
{
    float a = fabsf(x), x2 = x * x;
    /* 2/sqrt(pi) (x - x^3/3 + x^5/10 - x^7/42 + x^9/216 - x^11/1320) */
    float s = -1.0f / 1320.0f;
    s = s * x2 + 1.0f / 216.0f;
    s = s * x2 - 1.0f / 42.0f;
    s = s * x2 + 1.0f / 10.0f;
    s = s * x2 - 1.0f / 3.0f;
    s = s * x2 + 1.0f;
    float small = 1.1283791670955126f * x * s;
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float q = 1.061405429f;
    q = q * t - 1.453152027f;
    q = q * t + 1.421413741f;
    q = q * t - 0.284496736f;
    q = q * t + 0.254829592f;
    float large = 1.0f - q * t * cx_vexpf(-x2);
    large = x < 0.0f ? -large : large;
    float y = a < 0.5f ? small : large;
    return x == x ? y : x;
}

#endif
