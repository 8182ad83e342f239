/* bfloat16 <-> float32, inline for the kernels and checkpoint code; the
 * public cx_bf16_to_f32 / cx_f32_to_bf16 (core.h) are these. */
#ifndef CX_UTIL_BF16_H
#define CX_UTIL_BF16_H

#include <stdbool.h>
#include <stdint.h>

static inline float cx_bf16_to_f32_inline(uint16_t h)
{
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}

/* Round to nearest even; NaN stays a (quiet) NaN. */
static inline uint16_t cx_f32_to_bf16_inline(float f)
{
    union { uint32_t u; float f; } v = { .f = f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}

/* f rounded to bf16 as cx_f32_to_bf16_inline rounds it, kept as a float
 * (the low 16 bits 0): every step stays in a 32-bit lane, so a loop of it
 * vectorizes without packing to 16 bits and widening back. */
static inline float cx_bf16_round_inline(float f)
{
    union { uint32_t u; float f; } v = { .f = f };
    uint32_t rounded = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) & 0xffff0000u;
    uint32_t quiet_nan = (v.u | 0x400000u) & 0xffff0000u;
    v.u = (v.u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
    return v.f;
}

/* y + b rounded, then relu if asked (NaN to 0): the steps of autocast's
 * bias (b the f32 bias cast to bf16, as a float) after a bf16 product, as
 * the bf16 program computes them; the kernels that fold them use this. */
static inline uint16_t cx_bf16_add_bias_inline(uint16_t y, float b, bool relu)
{
    uint16_t r = cx_f32_to_bf16_inline(cx_bf16_to_f32_inline(y) + b);
    return relu && !(cx_bf16_to_f32_inline(r) > 0.0f) ? 0 : r;
}

#endif
