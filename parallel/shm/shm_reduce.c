/* The element loops of the shared-memory collectives. They go through a
 * block at a time so the accumulator stays in L1 while each source streams
 * past it; the compiler vectorizes the inner loops, once per ISA. */
#include "shm.h"

#include "cx_bf16.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Same policy as the kernels' CX_HOT (core/kernels/kernels.h, which this
 * layer may not include): one clone per ISA level, chosen at load time. */
#if defined(CX_NATIVE_BUILD) || !defined(__x86_64__) || !defined(__GNUC__)
#define SHM_HOT
#else
#define SHM_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

#define BLOCK 1024

#define ID(x) (x)
#define BF(x) cx_bf16_to_f32_inline(x)
#define ADD(a, b) ((a) + (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define MIN(a, b) ((a) < (b) ? (a) : (b))

#define DEF_REDUCE(name, T, S, LOAD, COMBINE)                                                  \
    static SHM_HOT void name(void *dst_, const void *const *src, int n, int64_t m)             \
    {                                                                                          \
        T *dst = dst_;                                                                         \
        for (int64_t b = 0; b < m; b += BLOCK) {                                               \
            int64_t e = m - b < BLOCK ? m - b : BLOCK;                                         \
            T *restrict d = dst + b;                                                           \
            const S *restrict s0 = (const S *)src[0] + b;                                      \
            for (int64_t i = 0; i < e; i++) d[i] = LOAD(s0[i]);                                \
            for (int r = 1; r < n; r++) {                                                      \
                const S *restrict sr = (const S *)src[r] + b;                                  \
                for (int64_t i = 0; i < e; i++) d[i] = COMBINE(d[i], LOAD(sr[i]));             \
            }                                                                                  \
        }                                                                                      \
    }

DEF_REDUCE(sum_f32, float, float, ID, ADD)
DEF_REDUCE(max_f32, float, float, ID, MAX)
DEF_REDUCE(min_f32, float, float, ID, MIN)
DEF_REDUCE(sum_bf16, float, uint16_t, BF, ADD)
DEF_REDUCE(max_bf16, float, uint16_t, BF, MAX)
DEF_REDUCE(min_bf16, float, uint16_t, BF, MIN)
/* integers wrap as MPI's do: sum in unsigned arithmetic */
DEF_REDUCE(sum_i32, uint32_t, uint32_t, ID, ADD)
DEF_REDUCE(max_i32, int32_t, int32_t, ID, MAX)
DEF_REDUCE(min_i32, int32_t, int32_t, ID, MIN)
DEF_REDUCE(sum_i64, uint64_t, uint64_t, ID, ADD)
DEF_REDUCE(max_i64, int64_t, int64_t, ID, MAX)
DEF_REDUCE(min_i64, int64_t, int64_t, ID, MIN)
DEF_REDUCE(sum_u8, uint8_t, uint8_t, ID, ADD)
DEF_REDUCE(max_u8, uint8_t, uint8_t, ID, MAX)
DEF_REDUCE(min_u8, uint8_t, uint8_t, ID, MIN)

typedef void (*reduce_fn)(void *dst, const void *const *src, int n, int64_t m);

/* [dtype][SUM, MAX, MIN] */
static reduce_fn pick(cx_dtype dt, cx_reduce_op red)
{
    int k = red == CX_RED_MAX ? 1 : red == CX_RED_MIN ? 2 : 0;
#define ROW(a, b, c) { a, b, c }
    static const reduce_fn f32[3] = ROW(sum_f32, max_f32, min_f32), bf16[3] = ROW(sum_bf16, max_bf16, min_bf16),
                           i32[3] = ROW(sum_i32, max_i32, min_i32), i64[3] = ROW(sum_i64, max_i64, min_i64),
                           u8[3] = ROW(sum_u8, max_u8, min_u8);
#undef ROW
    switch (dt) {
    case CX_F32: return f32[k];
    case CX_BF16: return bf16[k];
    case CX_I32: return i32[k];
    case CX_I64: return i64[k];
    case CX_U8:
    case CX_BOOL: return u8[k];
    default: return NULL;
    }
}

bool cx_shm_reduces(cx_dtype dt) { return pick(dt, CX_RED_SUM) != NULL; }

size_t cx_shm_result_size(cx_dtype dt) { return dt == CX_BF16 ? sizeof(float) : cx_dtype_size(dt); }

void cx_shm_reduce(void *dst, const void *const *src, int n, int64_t m, cx_dtype dt, cx_reduce_op red)
{
    reduce_fn f = pick(dt, red);
    if (f && m > 0) f(dst, src, n, m);
}

/* out may be res (the hierarchical path scales in place) */
static SHM_HOT void scale_f32(float *out, const float *res, int64_t m, float s)
{
    for (int64_t i = 0; i < m; i++) out[i] = res[i] * s;
}

/* the scale in double, as the MPI path rounds it */
static SHM_HOT void to_bf16(uint16_t *restrict out, const float *restrict res, int64_t m, double s, bool scaled)
{
    if (scaled)
        for (int64_t i = 0; i < m; i++) out[i] = cx_f32_to_bf16_inline((float)(res[i] * s));
    else
        for (int64_t i = 0; i < m; i++) out[i] = cx_f32_to_bf16_inline(res[i]);
}

/* Integers scale as runtime.c's MPI path does: through the same casts. */
static void scale_ints(void *out, const void *res, int64_t m, cx_dtype dt, double s)
{
    if (dt == CX_I32)
        for (int64_t i = 0; i < m; i++) ((int32_t *)out)[i] = (int32_t)(((const int32_t *)res)[i] * s);
    else if (dt == CX_I64)
        for (int64_t i = 0; i < m; i++) ((int64_t *)out)[i] = (int64_t)((double)((const int64_t *)res)[i] * s);
    else
        memmove(out, res, (size_t)m * cx_dtype_size(dt));
}

/* Copies n bytes past the caches: the destination is the caller's buffer,
 * usually larger than the caches and not read again soon, or a part of the
 * segment that another core will read, and a normal store would first read
 * every line it writes. SSE2's streaming stores are in every x86-64; the
 * store width matters little once they combine. */
void cx_shm_copy_stream_unfenced(void *dst, const void *src, size_t n)
{
#if defined(__x86_64__)
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (n < 4096 || (d < s + n && s < d + n)) { memmove(dst, src, n); return; }
    memcpy(d, s, head);
    d += head; s += head; n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i)), b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32)), e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + body, s + body, n - body);
#else
    memmove(dst, src, n);
#endif
}

void cx_shm_stream_fence(void)
{
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

void cx_shm_copy_stream(void *dst, const void *src, size_t n)
{
    cx_shm_copy_stream_unfenced(dst, src, n);
    cx_shm_stream_fence();   /* the stores are weakly ordered: done before the caller's barrier */
}

/* One pass: each vector of floats is summed from every source (in source
 * order, as cx_shm_reduce sums) and stored past the caches into every
 * destination. Written with intrinsics per ISA: the compiler has no
 * portable streaming store to vectorize into. */
#if defined(__x86_64__) && defined(__GNUC__)
#define SUM_STREAM(name, attr, W, VT, LOAD, ADD, MUL, SET1, STREAM)                                        \
    static attr int64_t name(float *const *dst, int ndst, const float *const *src, int nsrc, int64_t m,   \
                             float scale)                                                              \
    {                                                                                                  \
        int64_t i = 0;                                                                                 \
        VT s = SET1(scale);                                                                            \
        for (; i + W <= m; i += W) {                                                                   \
            VT acc = LOAD(src[0] + i);                                                                 \
            for (int r = 1; r < nsrc; r++) acc = ADD(acc, LOAD(src[r] + i));                           \
            if (scale != 1.0f) acc = MUL(acc, s);                                                      \
            for (int d = 0; d < ndst; d++) STREAM(dst[d] + i, acc);                                    \
        }                                                                                              \
        return i;                                                                                      \
    }
SUM_STREAM(sum_stream_avx512, __attribute__((target("avx512f"))), 16, __m512, _mm512_loadu_ps, _mm512_add_ps,
           _mm512_mul_ps, _mm512_set1_ps, _mm512_stream_ps)
SUM_STREAM(sum_stream_avx, __attribute__((target("avx"))), 8, __m256, _mm256_loadu_ps, _mm256_add_ps, _mm256_mul_ps,
           _mm256_set1_ps, _mm256_stream_ps)
SUM_STREAM(sum_stream_sse2, , 4, __m128, _mm_loadu_ps, _mm_add_ps, _mm_mul_ps, _mm_set1_ps, _mm_stream_ps)
#undef SUM_STREAM
#endif

void cx_shm_sum_f32_stream(float *const *dst, int ndst, const float *const *src, int nsrc, int64_t m, float scale)
{
    int64_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    /* streaming stores need destinations aligned to their width */
    uintptr_t any = 0;
    for (int d = 0; d < ndst; d++) any |= (uintptr_t)dst[d];
    if (!(any & 63) && __builtin_cpu_supports("avx512f")) i = sum_stream_avx512(dst, ndst, src, nsrc, m, scale);
    else if (!(any & 31) && __builtin_cpu_supports("avx")) i = sum_stream_avx(dst, ndst, src, nsrc, m, scale);
    else if (!(any & 15)) i = sum_stream_sse2(dst, ndst, src, nsrc, m, scale);
#endif
    for (; i < m; i++) {
        float acc = src[0][i];
        for (int r = 1; r < nsrc; r++) acc += src[r][i];
        if (scale != 1.0f) acc *= scale;
        for (int d = 0; d < ndst; d++) dst[d][i] = acc;
    }
}

void cx_shm_copy_out(void *out, const void *res, int64_t m, cx_dtype dt, double scale, bool stream)
{
    if (m <= 0) return;
    if (dt == CX_BF16) to_bf16(out, res, m, scale, scale != 1.0);
    else if (scale == 1.0 && stream) cx_shm_copy_stream(out, res, (size_t)m * cx_dtype_size(dt));
    else if (scale == 1.0) memmove(out, res, (size_t)m * cx_dtype_size(dt));
    else if (dt == CX_F32) scale_f32(out, res, m, (float)scale);
    else scale_ints(out, res, m, dt, scale);
}
