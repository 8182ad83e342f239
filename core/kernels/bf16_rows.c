/* Rows of bf16 widened to f32 and of f32 rounded to bf16, in vectors (the
 * kernels that widen a plane, or round a block, call these rather than
 * loop on the scalar conversions). */
#include "kernels.h"
#include "cx_bf16.h"

CX_HOT void cx_bf16_widen_row(float *dst, const uint16_t *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = cx_bf16_to_f32_inline(src[i]);
}

CX_HOT void cx_bf16_round_row(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = cx_f32_to_bf16_inline(src[i]);
}
