/* bf16 matmul with f32 sums. The output is cut into tasks (row chunks by
 * column blocks) dealt to the pool's threads; each task sums its f32 tile
 * over K in KC blocks and rounds it to bf16 once at the end (where K is one
 * block, each full micro-tile rounds straight into C), so the result does
 * not depend on the blocking or the thread count.
 *  - AVX512_BF16: B's block is packed into pairs of rows interleaved (the
 *    vdpbf16ps layout: lane j holds B[2q][j], B[2q+1][j]); A is read in
 *    place where its rows hold the pairs (else packed into MR-row panels
 *    of pairs); a 12x32 micro-kernel keeps its tile in 24 registers.
 *  - AVX2 + FMA or AVX-512F: the same tasks and blocks, the blocks
 *    widened to f32 as they are packed for gemm_fma.c's f32 micro-kernel
 *    (K blocks half as long, so the packed blocks take the same bytes);
 *  - otherwise: the blocks are widened to f32 and multiplied by the
 *    library cx_sgemm would pick for the whole product (oneDNN from about a
 *    million multiply-adds, else OpenBLAS).
 * Memory and the arena hold bf16 on every route; without AVX512_BF16 the
 * arithmetic is f32's. Where cx_bf16_gemm_on_dnnl() says (AMX), products
 * go to oneDNN's matmul first (gemm_bf16_dnnl.c), and come back here for
 * the shapes it has no brgemm kernel for; the plans keep these routes'
 * scratch, so every executable runs on either. */
#include "kernels.h"
#include "pool.h"
#include "cx_assert.h"
#include "cx_bf16.h"
#include "bf16_simd.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define CX_HAVE_BF16_KERNEL 1
#include <immintrin.h>
#endif

enum { MR = CX_BF16_TILE_ROWS, NR = CX_BF16_TILE_COLS, MC = 96, NC = 256, KC = 512, MCH = 768, KC_FMA = KC / 2 };
/* The f32 route's tasks are as large as cx_sgemm's parts: OpenBLAS packs
 * its own panels from every call's operands, so smaller tasks would pack
 * A and B again for each (measured: 0.92 of f32's rate with 768 x 256
 * tasks on the gpt's linear shapes). */
enum { MCH_F32 = 1020, NC_F32 = 1024 };

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The routes: vdpbf16ps on bf16 panels, the f32 micro-kernel on panels
 * widened from bf16, or widened blocks handed to the f32 library. */
typedef enum { ROUTE_BF16, ROUTE_FMA, ROUTE_LIB } bgemm_route;

static bgemm_route route_active(void)
{
#ifdef CX_HAVE_BF16_KERNEL
    if (cx_isa_active() >= CX_ISA_AVX512_BF16) return ROUTE_BF16;
#endif
    return cx_fma_route_available() ? ROUTE_FMA : ROUTE_LIB;
}

typedef struct {
    int64_t mch, nc, kc;   /* the task's rows and columns, the K block */
    bool wide;             /* FMA route, one K block straight into C: no task tile (wide_dims) */
} bgemm_dims;

static bgemm_dims dims_of(int64_t m, int64_t n, int64_t k, bgemm_route r)
{
    const bool lib = r == ROUTE_LIB;
    bgemm_dims d = { min64(lib ? MCH_F32 : MCH, round_up(m, MR)), min64(lib ? NC_F32 : NC, round_up(n, NR)),
                     min64(r == ROUTE_FMA ? KC_FMA : KC, round_up(k, 2)), false };
    return d;
}

/* The FMA route's product of one K block into C, not added to it, takes
 * all of a row chunk's columns (up to NC_WIDE) in one task: its sums go
 * straight into C, so the task needs no tile but a ragged micro-tile's,
 * and each row of A is widened once rather than once per NC columns (4
 * times for the gpt's 1024-wide products). Single-threaded, against the
 * NC-column tasks (Zen 4, CX_CPU_ISA=avx2, 9 alternated rounds): the gpt's
 * 2048x768x256 nt 1.08-1.12x, 2048x1024x256 nt 1.05-1.06x and nn
 * 1.05-1.06x; the 256-wide ones take the same blocks as before. */
enum { NC_WIDE = 1024 };
static bgemm_dims wide_dims(const bgemm_dims *d, int64_t n)
{
    bgemm_dims w = *d;
    w.nc = min64(NC_WIDE, round_up(n, NR));
    w.wide = true;
    return w;
}

/* the bytes of a task's f32 tile: a wide task's holds one micro-tile */
static int64_t tile_bytes(const bgemm_dims *d) { return d->wide ? CX_FMA_TILE_ROWS * NR * 4 : d->mch * d->nc * 4; }

/* the bytes of a packed B block */
static int64_t bblk_bytes(const bgemm_dims *d, bgemm_route r) { return d->kc * d->nc * (r == ROUTE_BF16 ? 2 : 4); }

/* f32 tile, B block and A block, each 64-byte aligned. The panel routes
 * pack B whole and A at most MC rows at a time (bf16 pairs, or widened to
 * f32); the library route widens B and all the task's rows of A at once
 * (one sgemm call per K block: OpenBLAS packs its B panel once per call). */
static size_t per_thread_bytes(const bgemm_dims *d, bgemm_route r)
{
    int64_t tile = tile_bytes(d), bblk = bblk_bytes(d, r);
    int64_t ablk = r == ROUTE_LIB ? d->mch * d->kc * 4 : min64(MC, d->mch) * d->kc * (r == ROUTE_BF16 ? 2 : 4);
    return (size_t)(round_up(tile, 64) + round_up(bblk, 64) + round_up(ablk, 64) + 64);
}

/* A widening route in a share of scratch smaller than its plan's: a plan
 * for another route's tiles (the persistent cache shares executables
 * between processes with another CX_CPU_ISA), or for fewer threads than
 * run. The library route takes the panel routes' column and K blocks and
 * as many rows as fit. The FMA route halves its K block while the blocks,
 * not the tile, are what is over (in the AVX512_BF16 route's plan for K
 * from 256 to 512: once; for more, its blocks take the same bytes), down
 * to FMA_KC_MIN, then takes fewer rows: halving on where the tile alone
 * was over went down to K blocks of 2 and cost a product 2.6x its time. */
enum { FMA_KC_MIN = 64 };
static bgemm_dims fit_route(int64_t m, int64_t n, int64_t k, bgemm_route r, size_t budget)
{
    bgemm_dims d = dims_of(m, n, k, r == ROUTE_LIB ? ROUTE_BF16 : r);
    while (r == ROUTE_FMA && d.kc > FMA_KC_MIN && per_thread_bytes(&d, r) > budget &&
           (size_t)(d.mch * d.nc * 4) < budget)
        d.kc = round_up(d.kc / 2, 2);
    while (d.mch > MR && per_thread_bytes(&d, r) > budget) d.mch -= MR;
    return d;
}

/* One thread's share of a plan for a panel route: its tiles, and room for
 * the library route's at MR rows, so every route runs in it. */
static size_t panel_plan_bytes(int64_t m, int64_t n, int64_t k, bgemm_route r)
{
    bgemm_dims d = dims_of(m, n, k, r), rows = dims_of(m, n, k, ROUTE_BF16);
    rows.mch = MR;
    size_t own = per_thread_bytes(&d, r), lib = per_thread_bytes(&rows, ROUTE_LIB);
    if (r == ROUTE_FMA && k <= d.kc) {
        /* room for the wide tasks where they take about the narrow ones'
         * bytes (tall products: their B block is at most the narrow tile
         * and B block, plus one micro-tile), not where M is short */
        const bgemm_dims w = wide_dims(&d, n);
        const size_t wide = per_thread_bytes(&w, r);
        if (wide > own && wide <= own + (size_t)tile_bytes(&w) + 64) own = wide;
    }
    return own > lib ? own : lib;
}

/* The threads a plan has tiles for: the pool's, or fewer when there are
 * fewer tasks (row chunks are never below MR rows). */
static int64_t threads_for(int64_t batch, int64_t m, int64_t n)
{
    return min64(cx_pool_threads(), batch * ((m + MR - 1) / MR) * ((n + NR - 1) / NR));
}

size_t cx_matmul_bf16_scratch_bytes(int64_t batch, int64_t m, int64_t n, int64_t k)
{
    /* the route this process runs (the library route's tasks are the
     * largest); an executable planned under another CX_CPU_ISA (the
     * persistent cache) runs on any route (fit_route) */
    return cx_matmul_bf16_route_scratch_bytes(batch, m, n, k, route_active() == ROUTE_BF16);
}

size_t cx_matmul_bf16_min_scratch_bytes(int64_t batch, int64_t m, int64_t n, int64_t k)
{
    if (batch <= 0 || m <= 0 || n <= 0 || k <= 0) return 0;
    /* the smallest route's plan for one thread, M folded or not */
    return panel_plan_bytes(m * batch, n, k, ROUTE_BF16);
}

size_t cx_matmul_bf16_route_scratch_bytes(int64_t batch, int64_t m, int64_t n, int64_t k, bool bf16_route)
{
    if (batch <= 0 || m <= 0 || n <= 0 || k <= 0) return 0;
    /* cx_matmul_bf16 may fold the batch into M: size for both */
    bgemm_route r = bf16_route ? ROUTE_BF16 : cx_fma_route_available() ? ROUTE_FMA : ROUTE_LIB;
    bgemm_dims d = dims_of(m * batch, n, k, r);
    size_t per = r == ROUTE_LIB ? per_thread_bytes(&d, r) : panel_plan_bytes(m * batch, n, k, r);
    return per * (size_t)threads_for(batch, m, n);
}

typedef struct {
    uint16_t *c;
    float *cf;            /* or the f32 sums, stored or added (acc) unrounded */
    bool acc;
    const uint16_t *a, *b;
    int64_t batch, m, n, k, sa, sb, mch, mt, nt, nthr;
    bgemm_dims d;
    bool ta, tb;
    bgemm_route route;
    const float *bias;    /* bf16 c only: c = round(round(sum) + bf16(bias[col])), then relu */
    bool relu;
    bool dnnl;            /* the f32 route's library, chosen on the whole product as cx_sgemm does */
    char *scratch;
    size_t per;
} bgemm_job;

/* ---- the f32 route --------------------------------------------------------------------- */

/* Each block is widened in its source's layout, row by contiguous row,
 * and the sgemm reads the transpose: widening a transposed operand into
 * op()'s layout went one scalar element at a time across rows (the
 * linear layer's weights, the weight gradient's activations), and cost
 * 0.15 of a bf16-mixed gpt step under CX_CPU_ISA=avx2. */
CX_HOT static void widen_rows(float *dst, int64_t ldd, const uint16_t *src, int64_t lds, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * ldd + c] = cx_bf16_to_f32_inline(src[r * lds + c]);
}

/* tile rows [0, mt) (ld nc) += op(A)[i0.., k0..] op(B)[k0.., j0..]; A's
 * block is (mt, kb) or transposed (kb, mt), B's (kb, nb) or (nb, kb) */
static void block_f32(const bgemm_job *j, float *tile, float *bblk, float *ablk, const uint16_t *a,
                      const uint16_t *b, int64_t i0, int64_t mt, int64_t j0, int64_t nb, int64_t k0, int64_t kb)
{
    if (j->tb) widen_rows(bblk, kb, b + j0 * j->k + k0, j->k, nb, kb);
    else widen_rows(bblk, nb, b + k0 * j->n + j0, j->n, kb, nb);
    if (j->ta) widen_rows(ablk, mt, a + k0 * j->m + i0, j->m, kb, mt);
    else widen_rows(ablk, kb, a + i0 * j->k + k0, j->k, mt, kb);
    cx_sgemm_serial_on(j->dnnl, j->ta, j->tb, mt, nb, kb, ablk, j->ta ? mt : kb, bblk, j->tb ? kb : nb,
                       k0 ? 1.0f : 0.0f, tile, j->d.nc);
}

/* c = the tile's sums rounded; with a bias (bias[0] is column 0's), each
 * then plus the bias rounded to bf16 and rounded again, and with relu
 * clamped at 0, as the folded program's steps would (NaN to 0) */
CX_HOT static void round_rows(uint16_t *c, int64_t ldc, const float *tile, int64_t ldt, int64_t mt, int64_t nb,
                              const float *bias, bool relu)
{
    for (int64_t r = 0; r < mt; r++) {
        uint16_t *cr = c + r * ldc;
        const float *t = tile + r * ldt;
        if (!bias) {
            for (int64_t q = 0; q < nb; q++) cr[q] = cx_f32_to_bf16_inline(t[q]);
            continue;
        }
        for (int64_t q = 0; q < nb; q++)
            cr[q] = cx_bf16_add_bias_inline(cx_f32_to_bf16_inline(t[q]),
                                            cx_bf16_to_f32_inline(cx_f32_to_bf16_inline(bias[q])), relu);
    }
}

/* tile rows into an f32 C (ld ldc), or added to it with acc. The FMA
 * route's sums stay in the compact tile over K and are copied once:
 * summing whole micro-tiles straight into C over its K blocks saved the
 * copy (0.5 % of a bf16-mixed gpt step under CX_CPU_ISA=avx2) but lost
 * more where C's rows are 4 KiB apart (the gpt's 256 x 1024 weight
 * gradient: 209 -> 197 GFLOP/s on 2 Zen 4 threads at x86-64-v3, the
 * four weight-gradient shapes together 15.2 -> 15.6 ms). */
CX_HOT static void store_rows(float *c, int64_t ldc, const float *tile, int64_t ldt, int64_t mt, int64_t nb,
                              bool acc)
{
    for (int64_t r = 0; r < mt; r++) {
        if (acc) for (int64_t q = 0; q < nb; q++) c[r * ldc + q] += tile[r * ldt + q];
        else memcpy(c + r * ldc, tile + r * ldt, sizeof *c * (size_t)nb);
    }
}

/* ---- the AVX512_BF16 route --------------------------------------------------------------- */

#ifdef CX_HAVE_BF16_KERNEL
/* One pair of source rows into panel words: word r of the panel holding
 * element e = p + r (p a multiple of width) is lo[e] | hi[e] << 16 (hi
 * NULL past an odd K's end: 0). The packers walk K a pair of rows at a
 * time, each row read once and contiguously, with the rows a few pairs on
 * prefetched: walking one panel's width down all of K (one cache line
 * from each of 512 rows, n apart) stalled on the loads. Packing took 5 %
 * of a bf16-mixed gpt step's samples, about 4.4 % since (the prefetches
 * included). */
static inline __attribute__((always_inline)) void pair_panel(uint32_t *restrict d, const uint16_t *restrict l,
                                                             const uint16_t *restrict h, int64_t w)
{
    if (h)
        for (int64_t r = 0; r < w; r++) d[r] = (uint32_t)l[r] | (uint32_t)h[r] << 16;
    else
        for (int64_t r = 0; r < w; r++) d[r] = l[r];
}

static inline __attribute__((always_inline)) void pair_rows(uint32_t *dst, int64_t panel_words, int64_t width,
                                                            const uint16_t *lo, const uint16_t *hi, int64_t count)
{
    int64_t full = count / width * width;
    for (int64_t p = 0; p < full; p += width) pair_panel(dst + p / width * panel_words, lo + p, hi ? hi + p : NULL, width);
    if (full < count) pair_panel(dst + full / width * panel_words, lo + full, hi ? hi + full : NULL, count - full);
}

/* The width a constant in each copy, so a full panel's loop is whole
 * vectors (an MR = 12 panel was left to the scalar remainder loop). */
CX_HOT static void pair_rows_nr(uint32_t *dst, int64_t panel_words, const uint16_t *lo, const uint16_t *hi,
                                int64_t count)
{
    pair_rows(dst, panel_words, NR, lo, hi, count);
}

/* An MR = 12 panel's words from 12 elements of each row, widened and
 * merged in one vector with masked loads and store: the generic copy did
 * 8 in a vector, 4 a word at a time and a division per panel, and took 2
 * % of a bf16-mixed gpt step (the weight gradients' transposed A). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void pair_rows_mr(uint32_t *dst, int64_t panel_words,
                                                                            const uint16_t *lo, const uint16_t *hi,
                                                                            int64_t count)
{
    for (int64_t p = 0; p < count; p += MR, dst += panel_words) {
        const __mmask16 keep = (__mmask16)((1u << min64(MR, count - p)) - 1);
        __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(keep, lo + p));
        if (hi) {
            const __m512i high = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(keep, hi + p));
            w = _mm512_or_si512(w, _mm512_slli_epi32(high, 16));
        }
        _mm512_mask_storeu_epi32(dst, keep, w);
    }
}

/* The packers read a new pair of rows, ld apart, per step: ask for the
 * pair PREFETCH_PAIRS on (the hardware's stride prefetcher did not keep
 * up: the loads of each new row stalled the packing). */
enum { PREFETCH_PAIRS = 4 };
static void prefetch_pair(const uint16_t *row, int64_t ld, int64_t count)
{
    for (int64_t e = 0; e < count; e += 32) {
        __builtin_prefetch(row + e);
        __builtin_prefetch(row + ld + e);
    }
}

/* Only the last panel, when count is not a multiple of width, has lanes
 * no element lands in: zero it. (An odd K's missing high halves the
 * packers write as 0 themselves.) */
static void zero_ragged_panel(uint32_t *panels, int64_t pairs, int64_t width, int64_t count)
{
    int64_t tail = count % width;
    if (tail) memset(panels + count / width * pairs * width, 0, sizeof *panels * (size_t)(pairs * width));
}

/* One contiguous run s[0, kb) into a panel's lane, from pair q0 on: its
 * pairs, each one 32-bit word, at dst[q0 width], dst[(q0 + 1) width],
 * ...; an odd K's last word with a 0 high half. (A transposed B's
 * columns, an untransposed A's rows.) */
static void pair_lane(uint32_t *dst, int64_t width, const uint16_t *s, int64_t kb, int64_t q0)
{
    for (int64_t q = q0; q < kb / 2; q++) dst[q * width] = (uint32_t)s[2 * q] | (uint32_t)s[2 * q + 1] << 16;
    if (kb & 1) dst[kb / 2 * width] = s[kb - 1];
}

/* 16 pairs of `lanes` (at most 16) panel lanes from as many rows (lane c
 * at src + c ld, its pairs q0.. along it): the rows' 16 words each go
 * through a 16 x 16 transpose of 32-bit words, and word q of every lane
 * is one store at dst + q stride (NR-lane panels take 16 lanes a store,
 * MR-lane ones their 12). */
__attribute__((target("avx512f"), always_inline)) static inline void lanes_pairs16(uint32_t *dst, int64_t stride,
                                                                                   const uint16_t *src, int64_t ld,
                                                                                   const int lanes)
{
    const __mmask16 keep = (__mmask16)((1u << lanes) - 1);
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++)
        r[i] = i < lanes ? _mm512_loadu_si512((const void *)(src + i * ld)) : _mm512_setzero_si512();
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* r[4i + j], 128-bit lane L: rows 4i..4i+3 at word 4L + j */
    for (int i = 0; i < 4; i++) {
        r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        const __m512i x0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44), x1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xee);
        const __m512i y0 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
        const __m512i y1 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xee);
        _mm512_mask_storeu_epi32(dst + (0 + j) * stride, keep, _mm512_shuffle_i32x4(x0, y0, 0x88));
        _mm512_mask_storeu_epi32(dst + (4 + j) * stride, keep, _mm512_shuffle_i32x4(x0, y0, 0xdd));
        _mm512_mask_storeu_epi32(dst + (8 + j) * stride, keep, _mm512_shuffle_i32x4(x1, y1, 0x88));
        _mm512_mask_storeu_epi32(dst + (12 + j) * stride, keep, _mm512_shuffle_i32x4(x1, y1, 0xdd));
    }
}

/* NR-lane panels whose lanes run along src's rows (a transposed B):
 * whole groups of 16 lanes by 16 pairs through lanes_pairs16, the rest
 * (a ragged group's lanes, the pairs past the last 16, an odd K's last
 * word) a word at a time. Word at a time, all of it had taken 3 % of a
 * bf16-mixed cnn step (fc1's weights, K = 9216, packed by both
 * threads). */
__attribute__((target("avx512f"))) static void pack_lanes_nr(uint32_t *dst, const uint16_t *src, int64_t ld,
                                                             int64_t count, int64_t kb, bool prefetch_lanes)
{
    const int64_t pairs = (kb + 1) / 2, whole = kb / 32 * 16;
    for (int64_t p = 0; p < count; p += NR) {
        uint32_t *panel = dst + p * pairs;
        for (int64_t c = 0; c < min64(NR, count - p); c += 16) {
            const int64_t lanes = min64(16, count - p - c);
            if (prefetch_lanes && p + c + 16 < count)
                for (int64_t l = 0; l < min64(16, count - p - c - 16); l++)
                    for (int64_t e = 0; e < kb; e += 32) __builtin_prefetch(src + (p + c + 16 + l) * ld + e);
            if (lanes == 16)
                for (int64_t q0 = 0; q0 < whole; q0 += 16)
                    lanes_pairs16(panel + q0 * NR + c, NR, src + (p + c) * ld + 2 * q0, ld, 16);
            for (int64_t l = 0; l < lanes; l++)
                pair_lane(panel + c + l, NR, src + (p + c + l) * ld, kb, lanes == 16 ? whole : 0);
        }
    }
}

/* MR-lane panels whose lanes run along src's rows (an untransposed A):
 * a full panel 16 pairs at a time through lanes_pairs16, the rest (the
 * pairs past the last 16, an odd K's last word, a ragged panel) a word at
 * a time. Word at a time, all of it, packing took a fifth of a 2048^3
 * product's time (its rows 4 KiB apart are packed, not read in place). */
__attribute__((target("avx512f"))) static void pack_lanes_mr(uint32_t *dst, const uint16_t *src, int64_t ld,
                                                             int64_t count, int64_t kb, bool prefetch_lanes)
{
    const int64_t pairs = (kb + 1) / 2, whole = kb / 32 * 16;
    for (int64_t p = 0; p < count; p += MR) {
        uint32_t *panel = dst + p * pairs;
        const int64_t lanes = min64(MR, count - p);
        if (prefetch_lanes)
            for (int64_t l = p + MR; l < min64(p + 2 * MR, count); l++)
                for (int64_t e = 0; e < kb; e += 32) __builtin_prefetch(src + l * ld + e);
        if (lanes == MR)
            for (int64_t q0 = 0; q0 < whole; q0 += 16)
                lanes_pairs16(panel + q0 * MR, MR, src + p * ld + 2 * q0, ld, MR);
        for (int64_t l = 0; l < lanes; l++) pair_lane(panel + l, MR, src + (p + l) * ld, kb, lanes == MR ? whole : 0);
    }
}

/* Panels of `width` lanes x (kb/2) pairs, each pair one 32-bit word, from
 * a block whose first element is src: with k_major, K runs down src's
 * rows (row q at src + q ld, the count lanes along it: B, a transposed A)
 * and each pair of rows is read once; else each lane is a row (lane c at
 * src + c ld, K along it: a transposed B, A), and with prefetch_lanes the
 * lanes a few on are prefetched. The ragged last panel's empty lanes are
 * 0. */
static void pack_panels_as(uint32_t *dst, int64_t width, bool k_major, const uint16_t *src, int64_t ld, int64_t count,
                           int64_t kb, bool prefetch_lanes)
{
    int64_t pairs = (kb + 1) / 2;
    zero_ragged_panel(dst, pairs, width, count);
    if (k_major) {
        for (int64_t q = 0; q < pairs; q++) {
            const uint16_t *lo = src + 2 * q * ld;
            if (2 * (q + PREFETCH_PAIRS) + 1 < kb) prefetch_pair(lo + 2 * PREFETCH_PAIRS * ld, ld, count);
            const uint16_t *hi = 2 * q + 1 < kb ? lo + ld : NULL;
            if (width == NR) pair_rows_nr(dst + q * NR, pairs * NR, lo, hi, count);
            else pair_rows_mr(dst + q * MR, pairs * MR, lo, hi, count);
        }
        return;
    }
    if (width == NR) {
        pack_lanes_nr(dst, src, ld, count, kb, prefetch_lanes);
        return;
    }
    pack_lanes_mr(dst, src, ld, count, kb, prefetch_lanes);
}

/* The GEMM's own blocks: their lanes are rows of one operand, read in
 * order, which the hardware prefetchers follow. */
static void pack_panels(uint32_t *dst, int64_t width, bool k_major, const uint16_t *src, int64_t ld, int64_t count,
                        int64_t kb)
{
    pack_panels_as(dst, width, k_major, src, ld, count, kb, false);
}

/* bp: op(B)[k0.., j0..] as NR-column panels (the vdpbf16ps layout) */
static void pack_b(uint16_t *bp, const bgemm_job *j, const uint16_t *b, int64_t k0, int64_t kb, int64_t j0,
                   int64_t nb)
{
    if (j->tb) pack_panels((uint32_t *)bp, NR, false, b + j0 * j->k + k0, j->k, nb, kb);
    else pack_panels((uint32_t *)bp, NR, true, b + k0 * j->n + j0, j->n, nb, kb);
}

/* ap: op(A)[i0.., k0..] as MR-row panels */
static void pack_a(uint32_t *ap, const bgemm_job *j, const uint16_t *a, int64_t i0, int64_t mb, int64_t k0,
                   int64_t kb)
{
    if (j->ta) pack_panels(ap, MR, true, a + k0 * j->m + i0, j->m, mb, kb);
    else pack_panels(ap, MR, false, a + i0 * j->k + k0, j->k, mb, kb);
}

/* acc = (first ? 0 : c (mr, 16 nh), ld ldc) + A . bp panel over `pairs`,
 * pair q of A's row r being the 32-bit word at a + r * rs + q * qs (bytes);
 * mr and nh (constants where inlined) are MR and 2, or fewer for a ragged
 * panel's rows, or the first 16 columns only */
__attribute__((target("avx512f,avx512bw,avx512bf16"), always_inline))
static inline void micro_sums(__m512 acc[MR][2], const float *c, int64_t ldc, const char *a, int64_t rs,
                              int64_t qs, const uint16_t *bp, int64_t pairs, bool first, const int mr, const int nh)
{
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++)
        for (int h = 0; h < nh; h++) acc[r][h] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + 16 * h);
    for (int64_t q = 0; q < pairs; q++, a += qs) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + q * 2 * NR);
        __m512bh b1 = nh > 1 ? (__m512bh)_mm512_loadu_si512(bp + q * 2 * NR + NR) : b0;
#pragma GCC unroll 12
        for (int r = 0; r < mr; r++) {
            int32_t w;
            memcpy(&w, a + r * rs, sizeof w);
            __m512bh av = (__m512bh)_mm512_set1_epi32(w);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            if (nh > 1) acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512bf16"), always_inline))
static inline void micro_store(float *c, int64_t ldc, __m512 acc[MR][2], const int mr, const int nh)
{
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++)
        for (int h = 0; h < nh; h++) _mm512_storeu_ps(c + r * ldc + 16 * h, acc[r][h]);
}

/* the sums rounded into cb (ld ldc); with a bias (bias[0] is the tile's
 * first column's), round_rows's epilogue */
__attribute__((target("avx512f,avx512bw,avx512bf16"), always_inline))
static inline void micro_store_bf16(uint16_t *cb, int64_t ldc, __m512 acc[MR][2], const float *bias, bool relu)
{
    if (!bias) {
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            _mm256_storeu_si256((__m256i *)(cb + r * ldc), cx_round_bf16x16(acc[r][0]));
            _mm256_storeu_si256((__m256i *)(cb + r * ldc + 16), cx_round_bf16x16(acc[r][1]));
        }
        return;
    }
    const __m512 b[2] = { cx_widen_bf16x16(cx_round_bf16x16(_mm512_loadu_ps(bias))),
                          cx_widen_bf16x16(cx_round_bf16x16(_mm512_loadu_ps(bias + 16))) };
    for (int r = 0; r < MR; r++)
        for (int h = 0; h < 2; h++) {
            const __m512 sum = cx_widen_bf16x16(cx_round_bf16x16(acc[r][h]));
            /* rounding is idempotent: the store's rounds the biased sum once */
            __m512 v = _mm512_add_ps(sum, b[h]);
            if (relu) v = cx_relu_ps16(cx_widen_bf16x16(cx_round_bf16x16(v)));
            _mm256_storeu_si256((__m256i *)(cb + r * ldc + 16 * h), cx_round_bf16x16(v));
        }
}

#define MICRO_CASE(mr, nh)                                                                          \
    do {                                                                                            \
        micro_sums(acc, c, ldc, a, rs, qs, bp, pairs, first, mr, nh);                               \
        micro_store(c, ldc, acc, mr, nh);                                                           \
    } while (0)

/* c (rows, cols) (ld ldc) = (first ? 0 : c) + A . B, A's pair q of row r
 * at a + r * rs + q * qs: 12, 8 or 4 rows by 32 or 16 columns, the fewest
 * that hold rows x cols, so a ragged panel does not multiply its padding
 * (64 rows on 12-row tiles, as the seed cnn's conv2 and fc1 have, spent a
 * ninth of the products on zeros; conv2's 144 tiles on 32-column panels
 * another tenth); c has room for those rows and columns. */
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static void micro_tile(float *c, int64_t ldc, const char *a, int64_t rs, int64_t qs, const uint16_t *bp,
                       int64_t pairs, bool first, int64_t rows, int64_t cols)
{
    __m512 acc[MR][2];
    if (cols > 16) {
        if (rows > 8) MICRO_CASE(MR, 2);
        else if (rows > 4) MICRO_CASE(8, 2);
        else MICRO_CASE(4, 2);
    } else {
        if (rows > 8) MICRO_CASE(MR, 1);
        else if (rows > 4) MICRO_CASE(8, 1);
        else MICRO_CASE(4, 1);
    }
}
#undef MICRO_CASE

/* from a packed panel */
static void micro_packed(float *c, int64_t ldc, const uint32_t *ap, const uint16_t *bp, int64_t pairs, bool first,
                         int64_t rows, int64_t cols)
{
    micro_tile(c, ldc, (const char *)ap, 4, 4 * MR, bp, pairs, first, rows, cols);
}

/* the same straight from rows of A (row stride rs bytes): no packing */
static void micro_rows(float *c, int64_t ldc, const uint16_t *a, int64_t rs, const uint16_t *bp, int64_t pairs,
                       bool first, int64_t rows, int64_t cols)
{
    micro_tile(c, ldc, (const char *)a, rs, 4, bp, pairs, first, rows, cols);
}

/* cb (MR, NR) (ld ldc) = A . B over all of K, rounded */
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static void micro_packed_out(uint16_t *cb, int64_t ldc, const uint32_t *ap, const uint16_t *bp, int64_t pairs,
                             const float *bias, bool relu)
{
    __m512 acc[MR][2];
    micro_sums(acc, NULL, 0, (const char *)ap, 4, 4 * MR, bp, pairs, true, MR, 2);
    micro_store_bf16(cb, ldc, acc, bias, relu);
}

__attribute__((target("avx512f,avx512bw,avx512bf16")))
static void micro_rows_out(uint16_t *cb, int64_t ldc, const uint16_t *a, int64_t rs, const uint16_t *bp,
                           int64_t pairs, const float *bias, bool relu)
{
    __m512 acc[MR][2];
    micro_sums(acc, NULL, 0, (const char *)a, rs, 4, bp, pairs, true, MR, 2);
    micro_store_bf16(cb, ldc, acc, bias, relu);
}

/* A is read in place where its rows hold whole pairs (not transposed, an
 * even K block, a full MR-row panel): packing it cost a fifth of the time,
 * and its MC x KC block stays in L2 either way. With out (the task's
 * corner of C, ld n; only when K is one block) each full micro-tile is
 * rounded straight into C and each ragged one through the tile: the f32
 * tile's round trip cost a K = 256 product 0.1-0.2 of its time. outf is
 * the same for an f32 C that is not added to: its sums are the tile's, so
 * a full micro-tile is stored there directly (the tile's copy into C had
 * cost a K = 64 weight gradient 0.3 of its time). */
static void block_bf16(const bgemm_job *j, float *tile, uint16_t *bp, uint32_t *ap, const uint16_t *a,
                       const uint16_t *b, int64_t i0, int64_t mt, int64_t j0, int64_t nb, int64_t k0, int64_t kb,
                       uint16_t *out, float *outf)
{
    int64_t pairs = (kb + 1) / 2;
    pack_b(bp, j, b, k0, kb, j0, nb);
    /* A's rows are read in place unless their stride is a multiple of 4
     * KiB: then a micro-tile's 12 row streams all map to one L1 set (8 or
     * 12 ways) and evict each other and B's panel (2048^3: 270 -> 315
     * GFLOP/s packed, Zen 4) */
    bool in_place = !j->ta && !(kb & 1) && (j->k * (int64_t)sizeof(uint16_t)) % 4096 != 0;
    for (int64_t r0 = 0; r0 < mt; r0 += MC) {
        int64_t mb = min64(MC, mt - r0);
        bool packed = !in_place || mb % MR;
        if (packed) pack_a(ap, j, a, i0 + r0, mb, k0, kb);
        for (int64_t cp = 0; cp < nb; cp += NR)
            for (int64_t rp = 0; rp < mb; rp += MR) {
                float *ct = tile + (r0 + rp) * j->d.nc + cp;
                const uint16_t *bpp = bp + cp * 2 * pairs, *arow = a + (i0 + r0 + rp) * j->k + k0;
                uint16_t *co = out ? out + (r0 + rp) * j->n + cp : NULL;
                int64_t rows = min64(MR, mb - rp), cols = min64(NR, nb - cp);
                if (co && rows == MR && cols == NR) {
                    const float *bias = j->bias ? j->bias + j0 + cp : NULL;
                    if (packed) micro_packed_out(co, j->n, ap + rp * pairs, bpp, pairs, bias, j->relu);
                    else micro_rows_out(co, j->n, arow, 2 * j->k, bpp, pairs, bias, j->relu);
                    continue;
                }
                float *cf = outf ? outf + (r0 + rp) * j->n + cp : NULL;
                const bool whole = cf && rows == MR && cols == NR;
                float *dst = whole ? cf : ct;
                const int64_t ld = whole ? j->n : j->d.nc;
                if (packed) micro_packed(dst, ld, ap + rp * pairs, bpp, pairs, k0 == 0, rows, cols);
                else micro_rows(dst, ld, arow, 2 * j->k, bpp, pairs, k0 == 0, rows, cols);
                if (co) round_rows(co, j->n, ct, j->d.nc, rows, cols, j->bias ? j->bias + j0 + cp : NULL, j->relu);
                if (cf && !whole) store_rows(cf, j->n, ct, j->d.nc, rows, cols, false);
            }
    }
}
#endif

/* ---- the FMA route ----------------------------------------------------------------------- */

/* tile rows [0, mt) (ld nc) += op(A)[i0.., k0..] op(B)[k0.., j0..], the
 * blocks widened as they are packed (B once, A MC rows at a time). With
 * out or outf (K is one block), as the AVX512_BF16 route: each whole
 * micro-tile rounds, or is stored, straight into C, each ragged one goes
 * through the tile. */
static void block_fma(const bgemm_job *j, float *tile, float *bp, float *ap, const uint16_t *a, const uint16_t *b,
                      int64_t i0, int64_t mt, int64_t j0, int64_t nb, int64_t k0, int64_t kb, uint16_t *out,
                      float *outf)
{
    const int64_t nr = cx_fma_tile_cols();
    if (j->tb) cx_fma_pack(bp, nr, false, b + j0 * j->k + k0, j->k, nb, kb);
    else cx_fma_pack(bp, nr, true, b + k0 * j->n + j0, j->n, nb, kb);
    for (int64_t r0 = 0; r0 < mt; r0 += MC) {
        const int64_t mb = min64(MC, mt - r0);
        if (j->ta) cx_fma_pack(ap, CX_FMA_TILE_ROWS, true, a + k0 * j->m + i0 + r0, j->m, mb, kb);
        else cx_fma_pack(ap, CX_FMA_TILE_ROWS, false, a + (i0 + r0) * j->k + k0, j->k, mb, kb);
        if (!out && !outf) {
            cx_fma_gemm_panels(tile + r0 * j->d.nc, j->d.nc, k0 == 0, ap, bp, mb, nb, kb);
            continue;
        }
        for (int64_t cp = 0; cp < nb; cp += nr)
            for (int64_t rp = 0; rp < mb; rp += CX_FMA_TILE_ROWS) {
                const int64_t rows = min64(CX_FMA_TILE_ROWS, mb - rp), cols = min64(nr, nb - cp);
                const float *apr = ap + rp * kb, *bpc = bp + cp * kb, *bias = j->bias ? j->bias + j0 + cp : NULL;
                const bool whole = rows == CX_FMA_TILE_ROWS && cols == nr;
                const int64_t at = (r0 + rp) * j->n + cp;
                if (whole && out) {
                    cx_fma_tile_bf16(out + at, j->n, apr, bpc, kb, bias, j->relu);
                    continue;
                }
                if (whole) {
                    cx_fma_gemm_panels(outf + at, j->n, true, apr, bpc, rows, cols, kb);
                    continue;
                }
                /* a wide task's tile holds one micro-tile */
                const int64_t ldt = j->d.wide ? nr : j->d.nc;
                float *ct = j->d.wide ? tile : tile + (r0 + rp) * j->d.nc + cp;
                cx_fma_gemm_panels(ct, ldt, true, apr, bpc, rows, cols, kb);
                if (out) round_rows(out + at, j->n, ct, ldt, rows, cols, bias, j->relu);
                else store_rows(outf + at, j->n, ct, ldt, rows, cols, false);
            }
    }
}

/* ---- tasks ------------------------------------------------------------------------------- */

static void run_task(const bgemm_job *j, char *ws, int64_t t)
{
    int64_t ni = t % j->nt, mi = t / j->nt % j->mt, bi = t / (j->nt * j->mt);
    int64_t i0 = mi * j->mch, mt = min64(j->mch, j->m - i0), j0 = ni * j->d.nc, nb = min64(j->d.nc, j->n - j0);
    const uint16_t *a = j->a + bi * j->sa, *b = j->b + bi * j->sb;
    /* the tile's rows are padded to MR so the micro-kernel's last panel fits */
    float *tile = (float *)ws;
    char *bblk = ws + round_up(tile_bytes(&j->d), 64);
    char *ablk = bblk + round_up(bblk_bytes(&j->d, j->route), 64);
    /* one K block into a bf16 C: the micro-tiles round into C themselves */
    uint16_t *direct = j->route != ROUTE_LIB && j->c && j->k <= j->d.kc ? j->c + bi * j->m * j->n + i0 * j->n + j0
                                                                         : NULL;
    float *direct_f = j->route != ROUTE_LIB && j->cf && !j->acc && j->k <= j->d.kc
                          ? j->cf + bi * j->m * j->n + i0 * j->n + j0 : NULL;
    for (int64_t k0 = 0; k0 < j->k; k0 += j->d.kc) {
        int64_t kb = min64(j->d.kc, j->k - k0);
#ifdef CX_HAVE_BF16_KERNEL
        if (j->route == ROUTE_BF16) {
            block_bf16(j, tile, (uint16_t *)bblk, (uint32_t *)ablk, a, b, i0, mt, j0, nb, k0, kb, direct, direct_f);
            continue;
        }
#endif
        if (j->route == ROUTE_FMA)
            block_fma(j, tile, (float *)bblk, (float *)ablk, a, b, i0, mt, j0, nb, k0, kb, direct, direct_f);
        else block_f32(j, tile, (float *)bblk, (float *)ablk, a, b, i0, mt, j0, nb, k0, kb);
    }
    if (direct || direct_f) return;
    if (j->cf) store_rows(j->cf + bi * j->m * j->n + i0 * j->n + j0, j->n, tile, j->d.nc, mt, nb, j->acc);
    else round_rows(j->c + bi * j->m * j->n + i0 * j->n + j0, j->n, tile, j->d.nc, mt, nb, j->bias ? j->bias + j0 : NULL,
                    j->relu);
}

static void bgemm_each(void *ctx, int64_t tid, int64_t nthreads)
{
    const bgemm_job *j = ctx;
    /* the tasks are dealt over the threads that run, which may be fewer
     * than the scratch was planned for (a pool that could not start one) */
    const int64_t lanes = min64(j->nthr, nthreads);
    if (tid >= lanes) return;
    char *ws = (char *)(((uintptr_t)j->scratch + (size_t)tid * j->per + 63) & ~(uintptr_t)63);
    int64_t total = j->batch * j->mt * j->nt;
    for (int64_t t = tid; t < total; t += lanes) run_task(j, ws, t);
}

static void bgemm_run(uint16_t *c, float *cf, bool acc, const cx_bf16_epi *epi, const uint16_t *a, const uint16_t *b,
                      int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, int64_t stride_a,
                      int64_t stride_b, void *scratch, size_t scratch_bytes, bool may_dnnl)
{
    if (batch <= 0 || m <= 0 || n <= 0) return;
    const float *bias = c && epi ? epi->bias : NULL;
    if (k <= 0) {
        /* an empty sum: zeros, or nothing to add; then the epilogue */
        void *out = cf ? (void *)cf : (void *)c;
        if (!acc) memset(out, 0, (cf ? sizeof *cf : sizeof *c) * (size_t)(batch * m * n));
        if (bias)
            for (int64_t r = 0; r < batch * m; r++)
                for (int64_t q = 0; q < n; q++)
                    c[r * n + q] = cx_bf16_add_bias_inline(0, cx_bf16_to_f32_inline(cx_f32_to_bf16_inline(bias[q])),
                                                           epi->relu);
        return;
    }
    if (batch > 1 && stride_b == 0 && !trans_a && stride_a == m * k) {
        /* a shared B under back-to-back A blocks (a linear layer over a
         * batch of sequences): one tall product, whose B panels are packed
         * once per 768 rows instead of once per batch entry */
        m *= batch;
        batch = 1;
    }
    if (may_dnnl && !acc && cx_bf16_gemm_on_dnnl() &&
        cx_matmul_bf16_dnnl(c, cf, bias, bias && epi->relu, a, b, batch, m, n, k, trans_a, trans_b, stride_a,
                            stride_b))
        return;
    bgemm_job j = { .c = c, .cf = cf, .acc = acc, .a = a, .b = b, .batch = batch, .m = m, .n = n, .k = k, .sa = stride_a, .sb = stride_b,
                    .ta = trans_a, .tb = trans_b, .scratch = scratch, .bias = bias, .relu = bias && epi->relu };
    j.route = route_active();
    j.dnnl = cx_sgemm_prefers_dnnl(m, n, k);
    j.d = dims_of(m, n, k, j.route);
    if (j.route != ROUTE_BF16) {
        /* a plan for another route may hold less for each thread's share:
         * fit the blocks to that share */
        size_t share = scratch_bytes / (size_t)threads_for(batch, m, n);
        if (share < per_thread_bytes(&j.d, j.route)) j.d = fit_route(m, n, k, j.route, share);
        /* within the plan's share only: the plan is the narrow tasks' */
        const bgemm_dims w = wide_dims(&j.d, n);
        if (j.route == ROUTE_FMA && !acc && k <= j.d.kc && w.nc > j.d.nc && per_thread_bytes(&w, j.route) <= share)
            j.d = w;
    }
    j.per = per_thread_bytes(&j.d, j.route);
    j.nt = (n + j.d.nc - 1) / j.d.nc;
    int64_t thr = min64(cx_pool_threads(), (int64_t)(scratch_bytes / j.per));
    CX_ASSERT(thr >= 1);
    /* Row chunks of even size, as few as fit; when there are few tasks and
     * the threads cannot share them evenly (9 on 2 threads: one waits a
     * ninth of the time), as few more as make the count a multiple of the
     * threads, down to MR rows. */
    int64_t per_mt = batch * j.nt, chunks = (m + j.d.mch - 1) / j.d.mch, most = (m + MR - 1) / MR;
    if (per_mt * chunks < 8 * thr) {
        int64_t want = chunks;
        while (want < most && (per_mt * want) % thr) want++;
        if ((per_mt * want) % thr == 0) chunks = want;
    }
    j.mch = round_up((m + chunks - 1) / chunks, MR);
    j.mt = (m + j.mch - 1) / j.mch;
    j.nthr = min64(thr, batch * j.mt * j.nt);
    cx_pool_run_each(bgemm_each, &j);
}

void cx_matmul_bf16(uint16_t *c, const uint16_t *a, const uint16_t *b,
                    int64_t batch, int64_t m, int64_t n, int64_t k,
                    bool trans_a, bool trans_b,
                    int64_t stride_a, int64_t stride_b, void *scratch, size_t scratch_bytes)
{
    bgemm_run(c, NULL, false, NULL, a, b, batch, m, n, k, trans_a, trans_b, stride_a, stride_b, scratch, scratch_bytes,
              true);
}

void cx_matmul_bf16_epi(uint16_t *c, const cx_bf16_epi *epi, const uint16_t *a, const uint16_t *b, int64_t batch,
                        int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, int64_t stride_a, int64_t stride_b,
                        void *scratch, size_t scratch_bytes)
{
    bgemm_run(c, NULL, false, epi, a, b, batch, m, n, k, trans_a, trans_b, stride_a, stride_b, scratch, scratch_bytes,
              true);
}

void cx_matmul_bf16_f32(float *c, bool accumulate, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t m,
                        int64_t n, int64_t k, bool trans_a, bool trans_b, int64_t stride_a, int64_t stride_b,
                        void *scratch, size_t scratch_bytes)
{
    bgemm_run(NULL, c, accumulate, NULL, a, b, batch, m, n, k, trans_a, trans_b, stride_a, stride_b, scratch,
              scratch_bytes, true);
}

void cx_matmul_bf16_cxla(uint16_t *c, float *cf, const cx_bf16_epi *epi, const uint16_t *a, const uint16_t *b,
                         int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, int64_t stride_a,
                         int64_t stride_b, void *scratch, size_t scratch_bytes)
{
    bgemm_run(cf ? NULL : c, cf, false, cf ? NULL : epi, a, b, batch, m, n, k, trans_a, trans_b, stride_a, stride_b,
              scratch, scratch_bytes, false);
}

/* ---- products on panels, for kernels that make their own operands -------------------------
 * Winograd's bf16 products: its transforms write the B panels
 * themselves, its weights are rounded and packed here, and a pool task
 * runs all 16 products of its block itself. The rounding is
 * vcvtneps2bf16's: to nearest even, with denormals flushed to zero (the
 * operands of a product, not a result). */

size_t cx_bf16_panel_words(int64_t lanes, int64_t k, bool a_side)
{
    return (size_t)(round_up(lanes, a_side ? MR : NR) * ((k + 1) / 2));
}

#ifdef CX_HAVE_BF16_KERNEL
#define CX_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

CX_BF16_TARGET void cx_bf16_round_rows(uint16_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                                       int64_t cols, int64_t height, int64_t width)
{
    for (int64_t r = 0; r < height; r++) {
        uint16_t *d = dst + r * ldd;
        const float *f = src + r * lds;
        for (int64_t c = 0; c < cols && r < rows; c += 16) {
            __mmask16 keep = cols - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - c)) - 1);
            _mm256_mask_storeu_epi16(d + c, keep, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(keep, f + c)));
        }
        for (int64_t c = r < rows ? cols : 0; c < width; c++) d[c] = 0;
    }
}

void cx_bf16_pack_a(uint32_t *ap, const uint16_t *a, int64_t lda, int64_t m, int64_t k)
{
    pack_panels(ap, MR, false, a, lda, m, k);
}

/* The attention's heads route packs K^T and V^T a head at a time: the
 * head's rows are 3 H D apart in the qkv projection's output, and the
 * packing stalled on each row's load until the lanes a few on were
 * prefetched (its share of a bf16-mixed gpt step's samples: 2.6 % ->
 * 1.0 %). */
void cx_bf16_pack_panels(uint32_t *dst, bool a_side, bool k_major, const uint16_t *src, int64_t ld, int64_t count,
                         int64_t k)
{
    pack_panels_as(dst, a_side ? MR : NR, k_major, src, ld, count, k, true);
}

/* one MR x NR tile of c: whole (c has the room), or through a tile */
CX_BF16_TARGET static void tile_product(float *ct, int64_t ldc, bool accumulate, const char *a, int64_t rs,
                                        int64_t qs, const uint16_t *bpp, int64_t pairs, int64_t rows, int64_t cols,
                                        bool whole)
{
    if (whole || (rows == MR && cols == NR)) {
        micro_tile(ct, ldc, a, rs, qs, bpp, pairs, !accumulate, rows, cols);
        return;
    }
    float tile[MR * NR] = { 0 };
    if (accumulate)
        for (int64_t r = 0; r < rows; r++) memcpy(tile + r * NR, ct + r * ldc, sizeof *tile * (size_t)cols);
    micro_tile(tile, NR, a, rs, qs, bpp, pairs, !accumulate, rows, cols);
    for (int64_t r = 0; r < rows; r++) memcpy(ct + r * ldc, tile + r * NR, sizeof *tile * (size_t)cols);
}

CX_BF16_TARGET void cx_bf16_gemm_panels(float *c, int64_t ldc, bool accumulate, const uint32_t *ap, const uint16_t *a,
                                        int64_t lda, const uint32_t *bp, int64_t m, int64_t n, int64_t k, bool room)
{
    const int64_t pairs = (k + 1) / 2;
    for (int64_t cp = 0; cp < n; cp += NR) {
        const uint16_t *bpp = (const uint16_t *)(bp + cp * pairs);
        for (int64_t rp = 0; rp < m; rp += MR) {
            const int64_t rows = min64(MR, m - rp), cols = min64(NR, n - cp);
            if (ap) tile_product(c + rp * ldc + cp, ldc, accumulate, (const char *)(ap + rp * pairs), 4, 4 * MR, bpp,
                                 pairs, rows, cols, room);
            else tile_product(c + rp * ldc + cp, ldc, accumulate, (const char *)(a + rp * lda), 2 * lda, 4, bpp,
                              pairs, rows, cols, room);
        }
    }
}
#else
/* without the micro-kernel no caller asks for these (cx_isa_active() is
 * below CX_ISA_AVX512_BF16) */
void cx_bf16_round_rows(uint16_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t cols,
                        int64_t height, int64_t width)
{
    (void)dst; (void)ldd; (void)src; (void)lds; (void)rows; (void)cols; (void)height; (void)width;
    CX_ASSERT(!"no AVX512_BF16 micro-kernel in this build");
}

void cx_bf16_pack_a(uint32_t *ap, const uint16_t *a, int64_t lda, int64_t m, int64_t k)
{
    (void)ap; (void)a; (void)lda; (void)m; (void)k;
    CX_ASSERT(!"no AVX512_BF16 micro-kernel in this build");
}

void cx_bf16_pack_panels(uint32_t *dst, bool a_side, bool k_major, const uint16_t *src, int64_t ld, int64_t count,
                         int64_t k)
{
    (void)dst; (void)a_side; (void)k_major; (void)src; (void)ld; (void)count; (void)k;
    CX_ASSERT(!"no AVX512_BF16 micro-kernel in this build");
}

void cx_bf16_gemm_panels(float *c, int64_t ldc, bool accumulate, const uint32_t *ap, const uint16_t *a, int64_t lda,
                         const uint32_t *bp, int64_t m, int64_t n, int64_t k, bool room)
{
    (void)c; (void)ldc; (void)accumulate; (void)ap; (void)a; (void)lda; (void)bp; (void)m; (void)n; (void)k;
    (void)room;
    CX_ASSERT(!"no AVX512_BF16 micro-kernel in this build");
}
#endif
