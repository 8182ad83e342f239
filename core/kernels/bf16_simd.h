/* bf16 rounding in AVX-512 registers, shared by the bf16 GEMM's
 * micro-kernels (gemm_bf16.c's vdpbf16ps one, gemm_fma.c's AVX-512F one):
 * sums rounded as cx_f32_to_bf16_inline does, to the bit (to nearest
 * even, NaN kept quiet; vcvtneps2bf16 would flush denormal sums to zero),
 * and the folded bias epilogue's relu. Only AVX-512F is needed, so they
 * inline into either kernel's target. */
#ifndef CX_BF16_SIMD_H
#define CX_BF16_SIMD_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* 16 sums rounded to bf16 */
__attribute__((target("avx512f"), always_inline)) static inline __m256i cx_round_bf16x16(__m512 x)
{
    __m512i u = _mm512_castps_si512(x), hi = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* 16 bf16 widened back to f32 */
__attribute__((target("avx512f"), always_inline)) static inline __m512 cx_widen_bf16x16(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* relu as the program's: x > 0 ? x : 0, so NaN gives 0 */
__attribute__((target("avx512f"), always_inline)) static inline __m512 cx_relu_ps16(__m512 v)
{
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ), v);
}
#endif

#endif
