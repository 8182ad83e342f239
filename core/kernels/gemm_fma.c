/* The bf16 matmul's route on CPUs without AVX512_BF16 but with AVX2 and
 * FMA (or AVX-512F): bf16 blocks widened to f32 as they are packed into
 * panels, and an f32 micro-kernel of CX_FMA_TILE_ROWS rows by 2 vectors.
 *
 * Widening each block into a plain f32 copy for the f32 library made the
 * library pack it once more: a pass over every operand the f32 product
 * does not make, and on the gpt's linear shapes the route ran at 0.92-0.95
 * of f32's rate. Here the widening is the packing, so the memory traffic
 * is bf16's and the arithmetic is f32's.
 *
 * Sums run down K in order, one fused multiply-add per term, so the bits
 * depend neither on the blocking of M and N nor on the thread count. */
#include "kernels.h"
#include "cx_assert.h"
#include "cx_bf16.h"
#include "bf16_simd.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CX_HAVE_FMA_KERNEL 1
#endif

enum { MR = CX_FMA_TILE_ROWS };

bool cx_fma_route_available(void)
{
#ifdef CX_HAVE_FMA_KERNEL
    return cx_isa_active() >= CX_ISA_AVX2;
#else
    return false;
#endif
}

int64_t cx_fma_tile_cols(void) { return cx_isa_active() >= CX_ISA_AVX512 ? 32 : 16; }

#ifdef CX_HAVE_FMA_KERNEL
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- packing: the widening ---------------------------------------------------------------- */

/* One lane (a row of A, a column of a transposed B: K contiguous at s)
 * into a panel of `width` lanes: dst[q * width] for q in [0, kb). */
CX_HOT static void widen_lane(float *restrict dst, int64_t width, const uint16_t *restrict s, int64_t kb)
{
    for (int64_t q = 0; q < kb; q++) dst[q * width] = cx_bf16_to_f32_inline(s[q]);
}

/* 8 bf16 of a row widened: the lanes of one row of an 8 x 8 block */
__attribute__((target("avx2"), always_inline)) static inline __m256 widen8(const uint16_t *s)
{
    __m128i h = _mm_loadu_si128((const __m128i *)s);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* r[i] = column i of the 8 x 8 block whose rows are r[0..7] */
__attribute__((target("avx2"), always_inline)) static inline void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

/* Lanes along K (A's rows, a transposed B's columns) into one panel, 8
 * lanes by 8 terms at a time through a transpose: the scalar loop's
 * strided stores took 9 % of the route's time on the gpt's shapes. A
 * group that fills a panel of fewer than 8 lanes (the A panel's 6)
 * stores each term's 8 values over the next term's start, which the next
 * store overwrites; the block's last term is stored by lanes (a masked
 * store: AMD's are slow, so only there). */
__attribute__((target("avx2"))) static int64_t pack_lanes_avx2(float *panel, int64_t width, const uint16_t *src,
                                                                  int64_t ld, int64_t lanes, int64_t kb)
{
    const int64_t body = kb / 8 * 8;
    for (int64_t c0 = 0; c0 < lanes; c0 += 8) {
        const int64_t g = lanes - c0 < 8 ? lanes - c0 : 8;
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)g), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int64_t q = 0; q < body; q += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = i < g ? widen8(src + (c0 + i) * ld + q) : _mm256_setzero_ps();
            transpose8(r);
            float *d = panel + q * width + c0;
            if (g == 8 && width - c0 >= 8) {
                for (int i = 0; i < 8; i++) _mm256_storeu_ps(d + i * width, r[i]);
                continue;
            }
            /* the last term's spill too, where more terms follow */
            const int spill = g != width ? 0 : q + 8 < kb ? 8 : 7;
            for (int i = 0; i < spill; i++) _mm256_storeu_ps(d + i * width, r[i]);
            for (int i = spill; i < 8; i++) _mm256_maskstore_ps(d + i * width, keep, r[i]);
        }
    }
    return body;
}

/* Lanes across K's rows (B, a transposed A) into one panel, a row's run
 * of lanes at a time: the A panel's runs are 6 lanes long, and the
 * compiled loop's call per run took 15 % of a weight gradient's time. A
 * full panel's short run is read and stored 8 lanes wide while another
 * row follows in the block: the 2 lanes read past it lie in the next row
 * (ld >= 8), and the 2 stored past it are the next row's, stored next. */
__attribute__((target("avx2"))) static void pack_runs_avx2(float *panel, int64_t width, const uint16_t *src, int64_t ld,
                                                           int64_t lanes, int64_t kb)
{
    const int64_t body = lanes / 8 * 8;
    const bool wide_tail = lanes > body && lanes == width && ld >= 8;
    for (int64_t q = 0; q < kb; q++) {
        const uint16_t *s = src + q * ld;
        float *d = panel + q * width;
        for (int64_t c = 0; c < body; c += 8) _mm256_storeu_ps(d + c, widen8(s + c));
        if (wide_tail && q + 1 < kb) {
            _mm256_storeu_ps(d + body, widen8(s + body));
            continue;
        }
        for (int64_t c = body; c < lanes; c++) d[c] = cx_bf16_to_f32_inline(s[c]);
    }
}
#endif

#ifdef CX_HAVE_FMA_KERNEL
/* Called only where the route runs (cx_fma_route_available: AVX2). */
void cx_fma_pack(float *dst, int64_t width, bool k_major, const uint16_t *src, int64_t ld, int64_t count,
                 int64_t kb)
{
    for (int64_t p = 0; p < count; p += width) {
        const int64_t lanes = min64(width, count - p);
        float *panel = dst + p * kb;
        if (lanes < width)
            for (int64_t q = 0; q < kb; q++) memset(panel + q * width + lanes, 0, sizeof *panel * (size_t)(width - lanes));
        if (k_major) {
            pack_runs_avx2(panel, width, src + p, ld, lanes, kb);
            continue;
        }
        const int64_t done = pack_lanes_avx2(panel, width, src + p * ld, ld, lanes, kb);
        for (int64_t c = 0; c < lanes && done < kb; c++)
            widen_lane(panel + done * width + c, width, src + (p + c) * ld + done, kb - done);
    }
}
#else
void cx_fma_pack(float *dst, int64_t width, bool k_major, const uint16_t *src, int64_t ld, int64_t count,
                 int64_t kb)
{
    (void)dst; (void)width; (void)k_major; (void)src; (void)ld; (void)count; (void)kb;
    CX_ASSERT(!"no FMA micro-kernel in this build");
}
#endif

/* ---- micro-kernels ------------------------------------------------------------------------ */

#ifdef CX_HAVE_FMA_KERNEL
/* Sums rounded to bf16 as cx_f32_to_bf16_inline does (to nearest even,
 * NaN kept quiet), and widened back: the AVX2 kernel's 8 lanes here,
 * AVX-512's 16 from bf16_simd.h. */
__attribute__((target("avx2"), always_inline)) static inline __m256i round8(__m256 x)
{
    __m256i u = _mm256_castps_si256(x), hi = _mm256_srli_epi32(u, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

__attribute__((target("avx2"), always_inline)) static inline __m256 widen_round8(__m256 x)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(round8(x), 16));
}

__attribute__((target("avx2"), always_inline)) static inline void store_round8(uint16_t *d, __m256 x)
{
    __m256i r = round8(x);
    _mm_storeu_si128((__m128i *)d, _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08)));
}

__attribute__((target("avx512f"), always_inline)) static inline __m512 widen_round16(__m512 x)
{
    return cx_widen_bf16x16(cx_round_bf16x16(x));
}

__attribute__((target("avx512f"), always_inline)) static inline void store_round16(uint16_t *d, __m512 x)
{
    _mm256_storeu_si256((__m256i *)d, cx_round_bf16x16(x));
}

/* For each width: sums_*: acc = (first ? 0 : c (MR, 2 W), ld ldc) + A
 * panel . B panel over kb; micro_*: acc stored to c; micro_out_*: acc
 * rounded into cb, with a bias (bias[0] the tile's first column's) the
 * bf16 program's steps: round, + the bias rounded, round, relu (NaN to 0). */
#define FMA_KERNELS(SFX, TGT, V, W, LOAD, STORE, SET1, FMA, ZERO, ADD, MAX0, WIDEN_ROUND, STORE_ROUND)          \
    __attribute__((target(TGT), always_inline)) static inline void sums_##SFX(                                    \
        V acc[MR][2], const float *c, int64_t ldc, const float *ap, const float *bp, int64_t kb, bool first)       \
    {                                                                                                           \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)                                                    \
        {                                                                                                       \
            acc[r][0] = first ? ZERO() : LOAD(c + r * ldc);                                                     \
            acc[r][1] = first ? ZERO() : LOAD(c + r * ldc + W);                                                 \
        }                                                                                                       \
        _Pragma("GCC unroll 4") for (int64_t q = 0; q < kb; q++, ap += MR, bp += 2 * W)                         \
        {                                                                                                       \
            const V b0 = LOAD(bp), b1 = LOAD(bp + W);                                                           \
            _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)                                                \
            {                                                                                                   \
                const V a = SET1(ap[r]);                                                                        \
                acc[r][0] = FMA(a, b0, acc[r][0]);                                                              \
                acc[r][1] = FMA(a, b1, acc[r][1]);                                                              \
            }                                                                                                   \
        }                                                                                                       \
    }                                                                                                           \
    __attribute__((target(TGT))) static void micro_##SFX(float *c, int64_t ldc, const float *ap, const float *bp, \
                                                         int64_t kb, bool first)                                  \
    {                                                                                                           \
        V acc[MR][2];                                                                                           \
        sums_##SFX(acc, c, ldc, ap, bp, kb, first);                                                             \
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)                                                    \
        {                                                                                                       \
            STORE(c + r * ldc, acc[r][0]);                                                                      \
            STORE(c + r * ldc + W, acc[r][1]);                                                                  \
        }                                                                                                       \
    }                                                                                                           \
    __attribute__((target(TGT))) static void micro_out_##SFX(uint16_t *cb, int64_t ldc, const float *ap,          \
                                                             const float *bp, int64_t kb, const float *bias,     \
                                                             bool relu)                                          \
    {                                                                                                           \
        V acc[MR][2];                                                                                           \
        sums_##SFX(acc, NULL, 0, ap, bp, kb, true);                                                             \
        if (!bias) {                                                                                            \
            _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)                                                \
            {                                                                                                   \
                STORE_ROUND(cb + r * ldc, acc[r][0]);                                                           \
                STORE_ROUND(cb + r * ldc + W, acc[r][1]);                                                       \
            }                                                                                                   \
            return;                                                                                             \
        }                                                                                                       \
        const V bh[2] = { WIDEN_ROUND(LOAD(bias)), WIDEN_ROUND(LOAD(bias + W)) };                               \
        for (int r = 0; r < MR; r++)                                                                            \
            for (int h = 0; h < 2; h++) {                                                                       \
                /* rounding is idempotent: the store's rounds the biased sum once */                       \
                V v = ADD(WIDEN_ROUND(acc[r][h]), bh[h]);                                                       \
                if (relu) v = MAX0(WIDEN_ROUND(v));                                                             \
                STORE_ROUND(cb + r * ldc + h * W, v);                                                           \
            }                                                                                                   \
    }

/* relu as the program's (x > 0 ? x : 0, so NaN gives 0) */
__attribute__((target("avx2"), always_inline)) static inline __m256 relu8(__m256 v)
{
    return _mm256_and_ps(v, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ));
}

FMA_KERNELS(avx2, "avx2,fma", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps,
            _mm256_setzero_ps, _mm256_add_ps, relu8, widen_round8, store_round8)
FMA_KERNELS(avx512, "avx512f", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps,
            _mm512_setzero_ps, _mm512_add_ps, cx_relu_ps16, widen_round16, store_round16)

void cx_fma_gemm_panels(float *c, int64_t ldc, bool first, const float *ap, const float *bp, int64_t mb, int64_t nb,
                        int64_t kb)
{
    const bool wide = cx_isa_active() >= CX_ISA_AVX512;
    const int64_t nr = wide ? 32 : 16;
    for (int64_t cp = 0; cp < nb; cp += nr)
        for (int64_t rp = 0; rp < mb; rp += MR) {
            if (wide) micro_avx512(c + rp * ldc + cp, ldc, ap + rp * kb, bp + cp * kb, kb, first);
            else micro_avx2(c + rp * ldc + cp, ldc, ap + rp * kb, bp + cp * kb, kb, first);
        }
}

void cx_fma_tile_bf16(uint16_t *cb, int64_t ldc, const float *ap, const float *bp, int64_t kb, const float *bias,
                      bool relu)
{
    if (cx_isa_active() >= CX_ISA_AVX512) micro_out_avx512(cb, ldc, ap, bp, kb, bias, relu);
    else micro_out_avx2(cb, ldc, ap, bp, kb, bias, relu);
}
#else
/* without the micro-kernels no caller asks (cx_fma_route_available() is false) */
void cx_fma_gemm_panels(float *c, int64_t ldc, bool first, const float *ap, const float *bp, int64_t mb, int64_t nb,
                        int64_t kb)
{
    (void)c; (void)ldc; (void)first; (void)ap; (void)bp; (void)mb; (void)nb; (void)kb;
    CX_ASSERT(!"no FMA micro-kernel in this build");
}

void cx_fma_tile_bf16(uint16_t *cb, int64_t ldc, const float *ap, const float *bp, int64_t kb, const float *bias,
                      bool relu)
{
    (void)cb; (void)ldc; (void)ap; (void)bp; (void)kb; (void)bias; (void)relu;
    CX_ASSERT(!"no FMA micro-kernel in this build");
}
#endif
