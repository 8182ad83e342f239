/* Rows of bf16 widened to f32 and of f32 rounded to bf16, in vectors (the
 * kernels that widen a plane, or round a block, call these rather than
 * loop on the scalar conversions). The loops are static: a target_clones
 * function that is not gets an ifunc exported from the library whatever
 * -fvisibility says. */
#include "kernels.h"
#include "cx_bf16.h"

CX_HOT static void widen(float *dst, const uint16_t *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = cx_bf16_to_f32_inline(src[i]);
}

CX_HOT static void round_to_bf16(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = cx_f32_to_bf16_inline(src[i]);
}

void cx_bf16_widen_row(float *dst, const uint16_t *src, int64_t n) { widen(dst, src, n); }

void cx_bf16_round_row(uint16_t *dst, const float *src, int64_t n) { round_to_bf16(dst, src, n); }
