/* bfloat16 <-> float32, inline for the kernels and checkpoint code; the
 * public cx_bf16_to_f32 / cx_f32_to_bf16 (core.h) are these. */
#ifndef CX_UTIL_BF16_H
#define CX_UTIL_BF16_H

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

#endif
