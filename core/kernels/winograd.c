/* Winograd F(2x2, 3x3) for 3x3 convolutions with stride 1, dilation 1 and
 * one group, in all three directions (Lavin & Gray, 2015).
 *
 * Each 2x2 block of outputs comes from a 4x4 input tile: transformed
 * tiles V = B^T d B and weights U = G g G^T meet in 16 independent
 * products M[xi] (O, T) = U[xi] (O, C) @ V[xi] (C, T), one per point xi of
 * the 4x4 transform, and A^T M A gives the outputs. That is 16 multiplies
 * per 4 outputs instead of 36: 2.25x fewer flops than im2col + sgemm.
 *
 *  - forward: as above, per image (or block of tile rows) on the pool;
 *  - input gradient: the same forward on dy with the weights flipped and
 *    transposed (O <-> C) and padding 2 - pad: a full correlation;
 *  - weight gradient: dU[xi] (O, C) = sum over tiles of (A dy A^T)[xi] times
 *    V[xi] (V built channels-last, so the products need no transposed
 *    operand), then dw = G^T dU G; each pool thread sums over a fixed
 *    split of the images, and the partial sums are added in thread order.
 *
 * The transforms use only additions and halvings, so the results differ
 * from im2col's by rounding only (a few ulps of the sums involved).
 *
 * The bf16 entry points run the same f32 transforms on bf16 tensors: the
 * transforms widen what they read as they load it (a row's column pairs
 * are 32-bit words: even columns shifted up, odd ones masked; the input
 * transform copies rows, in bf16, only for the padding) and the output
 * transform rounds a channel's block of rows from an f32 stage, so the
 * bf16 conv needs no widened copy of its operands and no rounding pass
 * over its output. Without AVX512_BF16 the products are the f32
 * kernel's too, and so are the sums, bit for bit. With it the 16
 * products run on vdpbf16ps (gemm_bf16.c's micro-kernel): their operands
 * are rounded to bf16 by vcvtneps2bf16, U as it is packed, V, Vt and Z
 * as their transforms compute them (V and Vt straight into the
 * micro-kernel's panels), and M (forward-like) is padded to whole 12 x 32
 * tiles so the micro-kernel stores it directly.
 */
#include "kernels.h"
#include "pool.h"
#include "cx_bf16.h"
#include "cx_assert.h"

#include <cxla/core.h>
#include <stdatomic.h>
#include <string.h>

/* With AVX512_BF16 the products' operands V and Z are rounded by
 * vcvtneps2bf16 as their transforms compute them (x86 only: the bf16
 * products run nowhere else). */
#if defined(__x86_64__) && defined(__GNUC__)
#define WINO_BF16_OPERANDS 1
#define WINO_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#include <immintrin.h>
#endif

/* Bound on one task's transformed tiles (V and M): they stay in L2
 * between the transforms and the 16 products. */
#define WINO_BLOCK_BYTES ((size_t)3 << 19)
#define WINO_ALIGN 64

typedef enum { WINO_FWD, WINO_BWD_INPUT, WINO_BWD_WEIGHT } wino_dir;

/* The convolution actually run: for the input gradient, dy -> dx. */
typedef struct {
    int64_t n, cin, cout;
    int64_t h, w;            /* input plane */
    int64_t oh, ow;          /* output plane */
    int64_t pad_h, pad_w;
    int64_t th, tw;          /* 2x2 output tiles */
    int64_t rows;            /* tile rows per task */
} wino_shape;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static size_t round16(int64_t n) { return (size_t)ceil_div(n, 16) * 16; }

/* Distance between the 16 matrices of one transformed operand: a multiple
 * of 4 KiB would put the 16 streams the transforms write (and read) in
 * one L1 set, evicting each other on every store. */
static int64_t xi_stride(int64_t n) { return (int64_t)round16(n) + 16; }

bool cx_wino_applies(const cx_conv_geom *g)
{
    /* The input gradient runs with padding 2 - pad, so pad <= 2. Few input
     * channels leave the 16 products too thin to beat one sgemm. A 1x1
     * output uses one value of its 2x2 tile: 16 products where the
     * direct sum has at most 9 taps. */
    return g->kh == 3 && g->kw == 3 && g->stride_h == 1 && g->stride_w == 1 && g->dil_h == 1 &&
           g->dil_w == 1 && g->groups == 1 && g->pad_h <= 2 && g->pad_w <= 2 && g->c >= 8 && g->o >= 8 &&
           g->n >= 2 && g->oh >= 2 && g->ow >= 2;
}

static wino_shape shape_of(const cx_conv_geom *g, wino_dir dir)
{
    wino_shape s = { .n = g->n };
    if (dir == WINO_BWD_INPUT) {
        s.cin = g->o; s.cout = g->c;
        s.h = g->oh; s.w = g->ow; s.oh = g->h; s.ow = g->w;
        s.pad_h = 2 - g->pad_h; s.pad_w = 2 - g->pad_w;
    } else {
        s.cin = g->c; s.cout = g->o;
        s.h = g->h; s.w = g->w; s.oh = g->oh; s.ow = g->ow;
        s.pad_h = g->pad_h; s.pad_w = g->pad_w;
    }
    s.th = ceil_div(s.oh, 2);
    s.tw = ceil_div(s.ow, 2);
    int64_t per_row = 16 * (s.cin + s.cout) * s.tw * (int64_t)sizeof(float);
    s.rows = max64(1, min64(s.th, (int64_t)WINO_BLOCK_BYTES / per_row));
    return s;
}

/* Per-thread scratch, in floats: V, M (or the transformed dy), a block's
 * zero-padded input rows (in bf16, two channels' worth), its output rows (a bf16 output's sums before
 * rounding), and for the weight gradient the thread's dU and the block's
 * input rows in channels-last order. */
typedef struct {
    size_t v, m, rows, stage, du, xt, zh, bp, total;
} lane_layout;

static int64_t round_to(int64_t x, int64_t to) { return ceil_div(x, to) * to; }

/* M's row length: tb, or with the bf16 products whole tiles' worth */
static int64_t m_ld(int64_t tb, bool products_bf16) { return products_bf16 ? round_to(tb, CX_BF16_TILE_COLS) : tb; }

/* the distance between M's 16 matrices of a block of tb tiles */
static int64_t m_stride(const wino_shape *s, int64_t tb, bool products_bf16)
{
    return products_bf16 ? xi_stride(round_to(s->cout, CX_BF16_TILE_ROWS) * m_ld(tb, true)) : xi_stride(s->cout * tb);
}

/* Z rounded for the weight gradient's bf16 products: rows of an even
 * length (pairs read in place), whole tiles' worth of rows */
static int64_t zh_ld(int64_t tb) { return round_to(tb, 2); }
static int64_t zh_rows(const wino_shape *s) { return round_to(s->cout, CX_BF16_TILE_ROWS); }
static int64_t zh_stride(const wino_shape *s, int64_t tb) { return xi_stride(zh_rows(s) * zh_ld(tb)); }

/* the distance between the 16 products' B panels (the weight gradient's:
 * K = tb, N = cin; the others': K = cin, N = tb) */
static int64_t bp_stride(const wino_shape *s, int64_t tb, bool weight)
{
    return xi_stride((int64_t)(weight ? cx_bf16_panel_words(s->cin, tb, false)
                                      : cx_bf16_panel_words(tb, s->cin, false)));
}

/* With bf16 tensors, also room for the bf16 products (which of the
 * routes runs is the CPU's: the plan holds either): M's padding, the 16
 * products' B panels, and for the weight gradient Z rounded. */
static lane_layout lane_of(const wino_shape *s, wino_dir dir, bool bf16)
{
    lane_layout l;
    const int64_t tb = s->rows * s->tw;
    const bool weight = dir == WINO_BWD_WEIGHT;
    l.v = 0;
    l.m = l.v + (size_t)(16 * xi_stride(s->cin * tb));
    l.rows = l.m + (size_t)(16 * (bf16 && !weight ? m_stride(s, tb, true) : xi_stride(s->cout * tb)));
    l.stage = l.rows + round16((2 * s->rows + 2) * (2 * s->tw + 2));
    l.du = l.stage + (bf16 && !weight ? round16(2 * s->rows * s->ow) : 0);
    l.xt = l.du + (dir == WINO_BWD_WEIGHT ? (size_t)(16 * xi_stride(s->cout * s->cin)) : 0);
    l.zh = l.xt + (weight ? round16((2 * s->rows + 2) * (2 * s->tw + 2) * s->cin) : 0);
    l.bp = l.zh + (bf16 && weight ? round16(16 * zh_stride(s, tb) / 2 + 8) : 0);
    l.total = l.bp + (bf16 ? (size_t)(16 * bp_stride(s, tb, weight)) : 0);
    return l;
}

/* The transformed weights, shared by all threads (forward-like): U in
 * f32, and with bf16 tensors U rounded to bf16 and its 16 products' A
 * panels (up_words() words each). */
static size_t u_floats(const wino_shape *s) { return (size_t)(16 * xi_stride(s->cout * s->cin)); }
static size_t uh_floats(const wino_shape *s) { return round16(8 * xi_stride(s->cout * s->cin) + 8); }
static int64_t up_words(const wino_shape *s) { return (int64_t)round16((int64_t)cx_bf16_panel_words(s->cout, s->cin, true)); }

static size_t shared_floats(const wino_shape *s, wino_dir dir, bool bf16)
{
    if (dir == WINO_BWD_WEIGHT) return 0;
    return u_floats(s) + (bf16 ? uh_floats(s) + 16 * (size_t)up_words(s) : 0);
}

static size_t scratch_bytes(const cx_conv_geom *g, int dir, bool bf16, int64_t lanes)
{
    wino_shape s = shape_of(g, (wino_dir)dir);
    return (shared_floats(&s, (wino_dir)dir, bf16) + (size_t)lanes * lane_of(&s, (wino_dir)dir, bf16).total) *
               sizeof(float) +
           WINO_ALIGN;
}

static int64_t planned_lanes(const cx_conv_geom *g) { return min64(g->n, max64(1, cx_get_num_threads())); }
size_t cx_wino_scratch_bytes(const cx_conv_geom *g, int dir) { return scratch_bytes(g, dir, false, planned_lanes(g)); }
size_t cx_wino_bf16_scratch_bytes(const cx_conv_geom *g, int dir)
{
    return scratch_bytes(g, dir, true, planned_lanes(g));
}
size_t cx_wino_bf16_min_scratch_bytes(const cx_conv_geom *g, int dir) { return scratch_bytes(g, dir, true, 1); }

/* ---- transforms ----------------------------------------------------------- */

/* U[xi][o][c] = (G g G^T)[xi] for the 3x3 kernel g of (o, c); for the
 * input gradient the kernel is w[o][c] rotated by 180 degrees and stored
 * at (c, o). */
CX_HOT static void transform_weights(float *u, const float *w, int64_t o_n, int64_t c_n, bool flip)
{
    const int64_t plane = xi_stride(o_n * c_n);
    for (int64_t o = 0; o < o_n; o++)
        for (int64_t c = 0; c < c_n; c++) {
            const float *k = w + (o * c_n + c) * 9;
            float g[3][3];
            for (int a = 0; a < 3; a++)
                for (int b = 0; b < 3; b++) g[a][b] = flip ? k[(2 - a) * 3 + (2 - b)] : k[a * 3 + b];
            float t[4][3];
            for (int b = 0; b < 3; b++) {
                t[0][b] = g[0][b];
                t[1][b] = 0.5f * (g[0][b] + g[1][b] + g[2][b]);
                t[2][b] = 0.5f * (g[0][b] - g[1][b] + g[2][b]);
                t[3][b] = g[2][b];
            }
            const int64_t at = flip ? c * o_n + o : o * c_n + c;
            for (int a = 0; a < 4; a++) {
                float r[4] = { t[a][0], 0.5f * (t[a][0] + t[a][1] + t[a][2]), 0.5f * (t[a][0] - t[a][1] + t[a][2]),
                               t[a][2] };
                for (int b = 0; b < 4; b++) u[(a * 4 + b) * plane + at] = r[b];
            }
        }
}

/* The transforms run along a row of tiles, several tiles per vector: in
 * the layouts below every operand of a tile row is contiguous in j. */
typedef float v8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef float v4 __attribute__((vector_size(16), aligned(4), may_alias));
typedef int32_t i8v __attribute__((vector_size(32)));
typedef int32_t i4v __attribute__((vector_size(16)));
#define LD(T, p) (*(const T *)(const void *)(p))
#define ST(T, p) (*(T *)(void *)(p))
/* even / odd lanes of two vectors, and their interleaving */
#define EV8() CX_MASK(i8v, 0, 2, 4, 6, 8, 10, 12, 14)
#define OD8() CX_MASK(i8v, 1, 3, 5, 7, 9, 11, 13, 15)
#define LO8() CX_MASK(i8v, 0, 8, 1, 9, 2, 10, 3, 11)
#define HI8() CX_MASK(i8v, 4, 12, 5, 13, 6, 14, 7, 15)
#define EV4() CX_MASK(i4v, 0, 2, 4, 6)
#define OD4() CX_MASK(i4v, 1, 3, 5, 7)
#define LO4() CX_MASK(i4v, 0, 4, 1, 5)
#define HI4() CX_MASK(i4v, 2, 6, 3, 7)

/* B^T d B for tiles j..j+W-1 of one tile row, given d[r][k] as vectors
 * over the tiles; the 16 results stored by PUT(T, xi, value, p, q, r)
 * (p, q, r: where), INPUT_CORE's at dst + xi * stride + j. */
#define INPUT_CORE_PUT(T, d_, PUT, p, q, r)                                                         \
    do {                                                                                            \
        for (int k_ = 0; k_ < 4; k_++) {                                                           \
            T a0 = d_[0][k_] - d_[2][k_], a1 = d_[1][k_] + d_[2][k_];                               \
            T a2 = d_[2][k_] - d_[1][k_], a3 = d_[1][k_] - d_[3][k_];                               \
            d_[0][k_] = a0; d_[1][k_] = a1; d_[2][k_] = a2; d_[3][k_] = a3;                         \
        }                                                                                           \
        for (int a_ = 0; a_ < 4; a_++) {                                                           \
            PUT(T, a_ * 4 + 0, d_[a_][0] - d_[a_][2], p, q, r);                                    \
            PUT(T, a_ * 4 + 1, d_[a_][1] + d_[a_][2], p, q, r);                                    \
            PUT(T, a_ * 4 + 2, d_[a_][2] - d_[a_][1], p, q, r);                                    \
            PUT(T, a_ * 4 + 3, d_[a_][1] - d_[a_][3], p, q, r);                                    \
        }                                                                                           \
    } while (0)
#define STORE_F32(T, x, v, dst, stride, j) ST(T, (dst) + (x) * (stride) + (j)) = (v)
#define INPUT_CORE(T, d_, dst, stride, j) INPUT_CORE_PUT(T, d_, STORE_F32, dst, stride, j)

/* W tiles at once: d[r][k] = row_r[2j + k] for the W tiles, from 2W-float
 * loads split into even and odd columns. Reads row_r[2j .. 2j + 2W + 2). */
#define INPUT_TILES_PUT(T, W, EV, OD, row, PUT, dst, stride, j)                                     \
    do {                                                                                            \
        T d_[4][4];                                                                                 \
        for (int r_ = 0; r_ < 4; r_++) {                                                           \
            const float *p_ = (row)[r_] + 2 * (j);                                                  \
            const T l_ = LD(T, p_), h_ = LD(T, p_ + (W)), l2_ = LD(T, p_ + 2), h2_ = LD(T, p_ + 2 + (W)); \
            d_[r_][0] = CX_SHUFFLE(l_, h_, EV());                                              \
            d_[r_][1] = CX_SHUFFLE(l_, h_, OD());                                              \
            d_[r_][2] = CX_SHUFFLE(l2_, h2_, EV());                                            \
            d_[r_][3] = CX_SHUFFLE(l2_, h2_, OD());                                            \
        }                                                                                           \
        INPUT_CORE_PUT(T, d_, PUT, dst, stride, j);                                                 \
    } while (0)
/* the same from f32 rows (EV and OD by W) */
#define F32_TILES_PUT(T, W, row, PUT, dst, stride, j) INPUT_TILES_PUT(T, W, EV##W, OD##W, row, PUT, dst, stride, j)

/* The same from bf16 rows: a row's 2W values at 2j are W 32-bit words,
 * each an (even, odd) column pair, so the even columns are the words
 * shifted up and the odd ones their high halves: widened as they are
 * split, no shuffles, and no widened copy of the rows. */
typedef uint32_t u8v __attribute__((vector_size(32)));
typedef uint32_t u4v __attribute__((vector_size(16)));
typedef uint32_t u8p __attribute__((vector_size(32), aligned(2), may_alias));
typedef uint32_t u4p __attribute__((vector_size(16), aligned(2), may_alias));
#define BF16_TILES_PUT(T, W, row, PUT, dst, stride, j)                                              \
    do {                                                                                            \
        T d_[4][4];                                                                                 \
        for (int r_ = 0; r_ < 4; r_++) {                                                           \
            const uint16_t *p_ = (row)[r_] + 2 * (j);                                               \
            const u##W##v a_ = *(const u##W##p *)(const void *)p_;                                  \
            const u##W##v b_ = *(const u##W##p *)(const void *)(p_ + 2);                            \
            d_[r_][0] = (T)(a_ << 16);                                                              \
            d_[r_][1] = (T)(a_ & 0xffff0000u);                                                      \
            d_[r_][2] = (T)(b_ << 16);                                                              \
            d_[r_][3] = (T)(b_ & 0xffff0000u);                                                      \
        }                                                                                           \
        INPUT_CORE_PUT(T, d_, PUT, dst, stride, j);                                                 \
    } while (0)

/* n bytes from src to dst, n small (a row): whole 32-byte vectors, the
 * last one overlapping, with no call (the asm keeps the compiler from
 * making the loop a memcpy); a row under 32 bytes by memcpy */
typedef uint8_t row_bytes32 __attribute__((vector_size(32), aligned(1), may_alias));
static inline __attribute__((always_inline)) void copy_row_bytes(void *restrict dst, const void *restrict src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *sb = src;
    if (n >= 32) {
        for (size_t q = 0; q + 32 < n; q += 32) {
            __asm__("" : "+r"(q));
            *(row_bytes32 *)(void *)(d + q) = *(const row_bytes32 *)(const void *)(sb + q);
        }
        *(row_bytes32 *)(void *)(d + n - 32) = *(const row_bytes32 *)(const void *)(sb + n - 32);
        return;
    }
    memcpy(d, sb, n);
}

/* The input rows of tile rows [i0, i1) of channel c of one image, in its
 * own dtype (T: float for x, uint16_t for bf16): read in place when no
 * padding is involved, else copied into `rows` ((2 (i1 - i0) + 2) x
 * (2 tw + 2) values) with the padding's zeros. The zeros are the same for
 * every channel of a block: with zeros_set (an earlier channel of this
 * block wrote them) only the values are copied. @return the block's
 * first row; *rs its stride. */
#define DEFINE_CHANNEL_ROWS(NAME, T)                                                                \
    static inline __attribute__((always_inline)) const T *NAME(T *rows, const T *x, const wino_shape *s, int64_t c, \
                                                               int64_t i0, int64_t i1, bool zeros_set, int64_t *rs) \
    {                                                                                               \
        const int64_t wp = 2 * s->tw + 2, nrows = 2 * (i1 - i0) + 2, r0 = 2 * i0 - s->pad_h;       \
        const int64_t at = c * s->h * s->w, copy = min64(s->w, wp - s->pad_w);                      \
        *rs = s->w;                                                                                 \
        /* no padding involved: the block is nrows whole rows of the plane */                      \
        if (s->pad_w == 0 && s->w == wp && r0 >= 0 && r0 + nrows <= s->h) return x + at + r0 * s->w; \
        if (!zeros_set) memset(rows, 0, sizeof(T) * (size_t)(nrows * wp));                          \
        for (int64_t r = 0; r < nrows; r++)                                                         \
            if (r0 + r >= 0 && r0 + r < s->h)                                                       \
                copy_row_bytes(rows + r * wp + s->pad_w, x + at + (r0 + r) * s->w, sizeof(T) * (size_t)copy); \
        *rs = wp;                                                                                   \
        return rows;                                                                                \
    }
DEFINE_CHANNEL_ROWS(channel_rows, float)
DEFINE_CHANNEL_ROWS(channel_rows_bf16, uint16_t)

/* The steps along a row of tw tiles: STEP(T, W, j) for W = 8 and 4 tiles
 * (T v8 or v4), STEP1(j) for one. A ragged row's last 8 tiles run again,
 * overlapping: the same values stored twice beat a scalar tail (13 tiles
 * a row). */
#define TILE_STEPS(tw, STEP, STEP1)                                                                 \
    do {                                                                                            \
        int64_t j_ = 0;                                                                             \
        for (; j_ + 8 <= (tw); j_ += 8) STEP(v8, 8, j_);                                            \
        if (((tw) - j_) % 4 != 0 && (tw) >= 8) {                                                    \
            STEP(v8, 8, (tw) - 8);                                                                  \
            j_ = (tw);                                                                              \
        }                                                                                           \
        for (; j_ + 4 <= (tw); j_ += 4) STEP(v4, 4, j_);                                            \
        for (; j_ < (tw); j_++) STEP1(j_);                                                          \
    } while (0)

/* V[xi][c][t] = (B^T d B)[xi] for the tiles of tile rows [i0, i1) of one
 * image (cin, h, w) in, f32 or bf16 (ROW_T; its rows by ROWS_OF, its
 * vector steps by STEP, which find the rows in row_ and the output at
 * dst_, stride_), into out, the 16 xi_stride(cin tb) apart; t counts
 * tiles from the block's first. Tile row i reads input rows 2i - pad ..
 * 2i - pad + 3 and columns 2j - pad .. (channel_rows). */
#define TRANSFORM_INPUT(out, ROW_T, ROWS_OF, STEP, rows, in, s, i0, i1)                             \
    do {                                                                                            \
        const int64_t tb_ = ((i1) - (i0)) * (s)->tw, stride_ = xi_stride((s)->cin * tb_), tw_ = (s)->tw; \
        for (int64_t c_ = 0; c_ < (s)->cin; c_++) {                                                \
            int64_t rs_;                                                                            \
            const ROW_T *blk_ = ROWS_OF(rows, in, s, c_, i0, i1, c_ > 0, &rs_);                     \
            for (int64_t i_ = (i0); i_ < (i1); i_++) {                                             \
                const ROW_T *b_ = blk_ + 2 * (i_ - (i0)) * rs_;                                     \
                const ROW_T *row_[4] = { b_, b_ + rs_, b_ + 2 * rs_, b_ + 3 * rs_ };                \
                float *dst_ = (out) + c_ * tb_ + (i_ - (i0)) * tw_;                                 \
                TILE_STEPS(tw_, STEP, INPUT_STEP1);                                                 \
            }                                                                                       \
        }                                                                                           \
    } while (0)
#define F32_INPUT_STEP(T, W, j) F32_TILES_PUT(T, W, row_, STORE_F32, dst_, stride_, j)
#define BF16_INPUT_STEP(T, W, j) BF16_TILES_PUT(T, W, row_, STORE_F32, dst_, stride_, j)
#define INPUT_STEP1(j)                                                                              \
    do {                                                                                            \
        float d_[4][4];                                                                             \
        for (int r_ = 0; r_ < 4; r_++)                                                             \
            for (int k_ = 0; k_ < 4; k_++) d_[r_][k_] = AS_F32(row_[r_][2 * (j) + k_]);            \
        INPUT_CORE_PUT(float, d_, STORE_F32, dst_, stride_, j);                                     \
    } while (0)
/* one value of a row: a float, or bf16 bits widened */
#define AS_F32(v) _Generic((v), float: (v), uint16_t: cx_bf16_to_f32_inline((uint16_t)(v)))

/* from x (f32), or from xh (bf16), widened as its tiles are loaded */
CX_HOT static void transform_input(float *v, float *rows, const float *x, const uint16_t *xh, const wino_shape *s,
                                   int64_t i0, int64_t i1)
{
    if (xh) TRANSFORM_INPUT(v, uint16_t, channel_rows_bf16, BF16_INPUT_STEP, (uint16_t *)(void *)rows, xh, s, i0, i1);
    else TRANSFORM_INPUT(v, float, channel_rows, F32_INPUT_STEP, rows, x, s, i0, i1);
}

#ifdef WINO_BF16_OPERANDS
enum { PANEL_COLS = CX_BF16_TILE_COLS };

/* one value rounded by vcvtneps2bf16 */
WINO_BF16_TARGET static inline uint16_t round1(float v)
{
    return (uint16_t)_mm_extract_epi16((__m128i)_mm_cvtneps_pbh(_mm_set_ss(v)), 0);
}

/* W words lo[e] | hi[e] << 16 of two lanes' values rounded by
 * vcvtneps2bf16, stored at d: one conversion of both vectors, then their
 * halves interleaved */
#define WORDS8_ORDER _mm256_setr_epi16(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15)
#define WORDS4_ORDER _mm_setr_epi16(0, 4, 1, 5, 2, 6, 3, 7)
#define STORE_WORDS8(d, lo, hi)                                                                     \
    _mm256_storeu_si256((__m256i *)(void *)(d),                                                      \
                        _mm256_permutexvar_epi16(WORDS8_ORDER, (__m256i)_mm256_cvtne2ps_pbh((__m256)(hi), (__m256)(lo))))
#define STORE_WORDS4(d, lo, hi)                                                                     \
    _mm_storeu_si128((__m128i *)(void *)(d),                                                         \
                     _mm_permutexvar_epi16(WORDS4_ORDER, (__m128i)_mm_cvtne2ps_pbh((__m128)(hi), (__m128)(lo))))
#define STORE_WORDS1(d, lo, hi) *(d) = (uint32_t)round1((lo)[0]) | (uint32_t)round1((hi)[0]) << 16
typedef float v1 __attribute__((vector_size(4), aligned(4), may_alias));

/* Where n words for columns col.. of pair q of B's panels (PANEL_COLS
 * columns a panel, `pairs` pairs deep) go: *off words into them.
 * @return whether they are one run, else they cross into the next panel
 * (put_split) */
static inline bool panel_run(int64_t *off, int64_t pairs, int64_t q, int64_t col, int64_t n)
{
    const int64_t at = col % PANEL_COLS;
    *off = (col / PANEL_COLS * pairs + q) * PANEL_COLS + at;
    return at + n <= PANEL_COLS;
}

/* n words w for columns col.. at d (panel_run's offset), a run that
 * crosses into the next panel: the rest go to that panel's first columns */
static void put_split(uint32_t *d, int64_t pairs, int64_t col, const uint32_t *w, int64_t n)
{
    const int64_t at = col % PANEL_COLS, first = PANEL_COLS - at;
    memcpy(d, w, sizeof *w * (size_t)first);
    memcpy(d + pairs * PANEL_COLS - at, w + first, sizeof *w * (size_t)(n - first));
}

/* A pair of channels' W tiles (8 or 4) in one vector of 2W lanes:
 * channel c in the low half, c + 1 in the high one. */
typedef float v16 __attribute__((vector_size(64)));
typedef uint32_t u16v __attribute__((vector_size(64)));

/* W words of row p in the low half, W of row q in the high one */
WINO_BF16_TARGET static inline u16v join_rows8(const uint16_t *p, const uint16_t *q)
{
    const __m512i lo = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)p));
    return (u16v)_mm512_inserti64x4(lo, _mm256_loadu_si256((const __m256i *)(const void *)q), 1);
}
WINO_BF16_TARGET static inline u8v join_rows4(const uint16_t *p, const uint16_t *q)
{
    return (u8v)_mm256_loadu2_m128i((const __m128i *)(const void *)q, (const __m128i *)(const void *)p);
}

/* v's two halves rounded and interleaved into W pair words at d (one
 * vcvtneps2bf16, one permute). at: 0 when the W columns lie in one panel,
 * else the first one's column in its panel; then the words past that
 * panel go to the next panel's columns 0.. (as put_split) by a second,
 * masked store whose first words fall before them, on the words of the
 * panels' previous pair. */
WINO_BF16_TARGET static inline void put_pair8(uint32_t *d, v16 v, int64_t pairs, int64_t at)
{
    const __m256i w = _mm256_permutexvar_epi16(WORDS8_ORDER, (__m256i)_mm512_cvtneps_pbh((__m512)v));
    if (at == 0) {
        _mm256_storeu_si256((__m256i *)(void *)d, w);
        return;
    }
    const int64_t first = PANEL_COLS - at;
    const __mmask8 head = (__mmask8)((1u << first) - 1);
    _mm256_mask_storeu_epi32(d, head, w);
    _mm256_mask_storeu_epi32(d + pairs * PANEL_COLS - at - first, (__mmask8)~head, w);
}
WINO_BF16_TARGET static inline void put_pair4(uint32_t *d, v8 v, int64_t pairs, int64_t at)
{
    const __m128i w = _mm_permutexvar_epi16(WORDS4_ORDER, (__m128i)_mm256_cvtneps_pbh((__m256)v));
    if (at == 0) {
        _mm_storeu_si128((__m128i *)(void *)d, w);
        return;
    }
    const int64_t first = PANEL_COLS - at;
    const __mmask8 head = (__mmask8)((1u << first) - 1);
    _mm_mask_storeu_epi32(d, head, w);
    _mm_mask_storeu_epi32(d + pairs * PANEL_COLS - at - first, (__mmask8)(~head & 0xf), w);
}

/* the 16 products' B panels, bps words apart: the ragged last panel's
 * columns past n are 0 */
static void zero_ragged_panels(uint32_t *bp, int64_t bps, int64_t pairs, int64_t n)
{
    if (n % PANEL_COLS == 0) return;
    for (int x = 0; x < 16; x++)
        memset(bp + x * bps + n / PANEL_COLS * pairs * PANEL_COLS, 0, sizeof *bp * (size_t)(pairs * PANEL_COLS));
}

/* the B panels' words between transform results (PUT's target) */
#define PUT_ARRAY(T, x, v, arr, unused_stride, unused_j) (arr)[x] = (v)

/* The forward-like products' B operands V[xi] (K = cin, N = tb), straight
 * from the input transform of xh (the rows of tile rows [i0, i1)) into
 * their panels, bps words apart: channels c and c + 1 are transformed
 * together, rounded by vcvtneps2bf16 and interleaved into the panels'
 * pair words. Storing V and packing it had cost the pack's pass over V
 * (2.7 % of a bf16-mixed cnn step). rows holds two channels' padded rows. */
WINO_BF16_TARGET static void transform_input_panels(uint32_t *bp, int64_t bps, uint16_t *rows, const uint16_t *xh,
                                                    const wino_shape *s, int64_t i0, int64_t i1)
{
    const int64_t tw = s->tw, tb = (i1 - i0) * tw, pairs = (s->cin + 1) / 2;
    uint16_t *rows_odd = rows + (2 * (i1 - i0) + 2) * (2 * tw + 2);
    zero_ragged_panels(bp, bps, pairs, tb);
    for (int64_t c = 0; c < s->cin; c += 2) {
        const bool odd = c + 1 < s->cin;
        int64_t rs0, rs1 = 0;
        const uint16_t *blk0 = channel_rows_bf16(rows, xh, s, c, i0, i1, c > 0, &rs0);
        const uint16_t *blk1 = odd ? channel_rows_bf16(rows_odd, xh, s, c + 1, i0, i1, c > 0, &rs1) : NULL;
        for (int64_t i = i0; i < i1; i++) {
            /* without an odd channel, row1 is row0 and never read */
            const uint16_t *b0 = blk0 + 2 * (i - i0) * rs0, *b1 = odd ? blk1 + 2 * (i - i0) * rs1 : b0;
            const uint16_t *row0[4] = { b0, b0 + rs0, b0 + 2 * rs0, b0 + 3 * rs0 };
            const uint16_t *row1[4] = { b1, b1 + rs1, b1 + 2 * rs1, b1 + 3 * rs1 };
            const int64_t t0 = (i - i0) * tw;
#define PANEL_TILES(T, W, j)                                                                        \
    do {                                                                                            \
        T e_[16], o_[16];                                                                           \
        BF16_TILES_PUT(T, W, row0, PUT_ARRAY, e_, 0, j);                                            \
        if (odd) BF16_TILES_PUT(T, W, row1, PUT_ARRAY, o_, 0, j);                                   \
        else for (int x_ = 0; x_ < 16; x_++) o_[x_] = (T){ 0 };                                     \
        int64_t off_;                                                                               \
        if (panel_run(&off_, pairs, c / 2, t0 + (j), W)) {                                          \
            for (int x_ = 0; x_ < 16; x_++) STORE_WORDS##W(bp + x_ * bps + off_, e_[x_], o_[x_]);   \
        } else {                                                                                    \
            for (int x_ = 0; x_ < 16; x_++) {                                                      \
                uint32_t w_[W];                                                                     \
                STORE_WORDS##W(w_, e_[x_], o_[x_]);                                                 \
                put_split(bp + x_ * bps + off_, pairs, t0 + (j), w_, W);                            \
            }                                                                                       \
        }                                                                                           \
    } while (0)
/* W tiles of both channels at once (v16 or v8), so each step of the
 * transform is one instruction for both, and each result is stored as
 * it is made. PANEL_TILES's two arrays of 16 results spilled: a quarter
 * of its samples were on stack slots, and this form takes 0.48 of the
 * products' time where that took 0.63-0.66 (seed cnn, bf16-mixed, Zen 4). */
#define PANEL_PAIR(VT, UT, JOIN, PUT, W, j)                                                         \
    do {                                                                                            \
        VT d_[4][4];                                                                                \
        for (int r_ = 0; r_ < 4; r_++) {                                                           \
            const UT a_ = JOIN(row0[r_] + 2 * (j), row1[r_] + 2 * (j));                             \
            const UT b_ = JOIN(row0[r_] + 2 * (j) + 2, row1[r_] + 2 * (j) + 2);                     \
            d_[r_][0] = (VT)(a_ << 16);                                                             \
            d_[r_][1] = (VT)(a_ & 0xffff0000u);                                                     \
            d_[r_][2] = (VT)(b_ << 16);                                                             \
            d_[r_][3] = (VT)(b_ & 0xffff0000u);                                                     \
        }                                                                                           \
        int64_t off_;                                                                               \
        /* put_pair's at: 0, or where a run that crosses panels starts */                           \
        const int64_t at_ = panel_run(&off_, pairs, c / 2, t0 + (j), W) ? 0 : (t0 + (j)) % PANEL_COLS; \
        INPUT_CORE_PUT(VT, d_, PUT, bp, off_, at_);                                                 \
    } while (0)
/* the step of W tiles (8 or 4) for a pair of channels */
#define PANEL_PAIR_STEP(T, W, j)                                                                    \
    do {                                                                                            \
        if ((W) == 8) PANEL_PAIR(v16, u16v, join_rows8, PUT_PAIR8, 8, j);                           \
        else PANEL_PAIR(v8, u8v, join_rows4, PUT_PAIR4, 4, j);                                      \
    } while (0)
#define PUT_PAIR8(T, x, v, d, off, at) put_pair8(d + (x) * bps + (off), v, pairs, at)
#define PUT_PAIR4(T, x, v, d, off, at) put_pair4(d + (x) * bps + (off), v, pairs, at)
#define PANEL_TILE1(j)                                                                              \
    do {                                                                                            \
        float d0_[4][4], d1_[4][4] = { { 0 } }, e_[16], o_[16];                                     \
        for (int r_ = 0; r_ < 4; r_++)                                                             \
            for (int k_ = 0; k_ < 4; k_++) {                                                       \
                d0_[r_][k_] = cx_bf16_to_f32_inline(row0[r_][2 * (j) + k_]);                        \
                if (odd) d1_[r_][k_] = cx_bf16_to_f32_inline(row1[r_][2 * (j) + k_]);               \
            }                                                                                       \
        INPUT_CORE_PUT(float, d0_, PUT_ARRAY, e_, 0, 0);                                            \
        INPUT_CORE_PUT(float, d1_, PUT_ARRAY, o_, 0, 0);                                            \
        int64_t off_;                                                                               \
        panel_run(&off_, pairs, c / 2, t0 + (j), 1);                                                \
        for (int x_ = 0; x_ < 16; x_++) bp[x_ * bps + off_] = (uint32_t)round1(e_[x_]) | (uint32_t)round1(o_[x_]) << 16; \
    } while (0)
            if (odd) TILE_STEPS(tw, PANEL_PAIR_STEP, PANEL_TILE1);
            else TILE_STEPS(tw, PANEL_TILES, PANEL_TILE1);
#undef PANEL_PAIR_STEP
#undef PANEL_PAIR
#undef PANEL_TILES
#undef PANEL_TILE1
        }
    }
}
#endif

/* A^T M A for tiles j..j+W-1: E0/O0 are output row 2i at columns 2j / 2j+1
 * of each tile, E1/O1 row 2i + 1. */
#define OUTPUT_CORE(T, src, stride, j, E0, O0, E1, O1)                                              \
    do {                                                                                            \
        T m_[16];                                                                                   \
        for (int x_ = 0; x_ < 16; x_++) m_[x_] = LD(T, (src) + x_ * (stride) + (j));               \
        T t_[2][4];                                                                                 \
        for (int k_ = 0; k_ < 4; k_++) {                                                           \
            t_[0][k_] = m_[k_] + m_[4 + k_] + m_[8 + k_];                                           \
            t_[1][k_] = m_[4 + k_] - m_[8 + k_] - m_[12 + k_];                                      \
        }                                                                                           \
        E0 = t_[0][0] + t_[0][1] + t_[0][2];                                                        \
        O0 = t_[0][1] - t_[0][2] - t_[0][3];                                                        \
        E1 = t_[1][0] + t_[1][1] + t_[1][2];                                                        \
        O1 = t_[1][1] - t_[1][2] - t_[1][3];                                                        \
    } while (0)

/* The epilogue on a vector of even or odd outputs: + b, relu, then the
 * mask (its even or odd columns, loaded like the input rows). */
#define EPILOGUE(T, I, v, b, relu)                                                                  \
    do {                                                                                            \
        v += b;                                                                                     \
        if (relu) v = (T)((I)v & (I)(v > 0));                                                       \
    } while (0)

/* Stores W tiles' two outputs of one row (even E, odd O) interleaved at
 * y + 2j, after the epilogue; pm is the posmask row or NULL. */
#define STORE_ROW(T, I, W, EV, OD, LO, HI, y, pm, j, E, O, b, relu)                                 \
    do {                                                                                            \
        T e_ = E, o_ = O;                                                                           \
        EPILOGUE(T, I, e_, b, relu);                                                                \
        EPILOGUE(T, I, o_, b, relu);                                                                \
        if (pm) {                                                                                   \
            const T ml_ = LD(T, (pm) + 2 * (j)), mh_ = LD(T, (pm) + 2 * (j) + (W));                 \
            e_ = (T)((I)e_ & (I)(CX_SHUFFLE(ml_, mh_, EV()) > 0));                             \
            o_ = (T)((I)o_ & (I)(CX_SHUFFLE(ml_, mh_, OD()) > 0));                             \
        }                                                                                           \
        ST(T, (y) + 2 * (j)) = CX_SHUFFLE(e_, o_, LO());                                       \
        ST(T, (y) + 2 * (j) + (W)) = CX_SHUFFLE(e_, o_, HI());                                 \
    } while (0)

#define OUTPUT_TILES(T, I, W, EV, OD, LO, HI, src, stride, j, y0, y1, pm0, pm1, b, relu)            \
    do {                                                                                            \
        T e0_, o0_, e1_, o1_;                                                                       \
        OUTPUT_CORE(T, src, stride, j, e0_, o0_, e1_, o1_);                                         \
        STORE_ROW(T, I, W, EV, OD, LO, HI, y0, pm0, j, e0_, o0_, b, relu);                          \
        if (y1) STORE_ROW(T, I, W, EV, OD, LO, HI, y1, pm1, j, e1_, o1_, b, relu);                  \
    } while (0)

static inline float epilogue1(float v, float b, bool relu, const float *pm, int64_t q)
{
    v += b;
    if (relu) v = v > 0 ? v : 0.0f;
    if (pm) v = pm[q] > 0 ? v : 0.0f;
    return v;
}

/* A bf16 output's n values from their f32 sums, with the steps the
 * unfolded bf16 program would take: round; then + the bias rounded to
 * bf16 (bh), rounded again, and relu; or else the input gradient's
 * posmask (a forward has no mask, an input gradient no bias). */
static inline void round_out(uint16_t *restrict dst, const float *restrict sums, int64_t n, const float *bh, bool relu,
                             const uint16_t *restrict pm)
{
    /* one loop per case, each of which the compiler vectorizes */
    if (bh) {
        const float b = *bh;
        for (int64_t q = 0; q < n; q++) dst[q] = cx_bf16_add_bias_inline(cx_f32_to_bf16_inline(sums[q]), b, relu);
    } else if (pm) {
        for (int64_t q = 0; q < n; q++)
            dst[q] = cx_bf16_to_f32_inline(pm[q]) > 0.0f ? cx_f32_to_bf16_inline(sums[q]) : 0;
    } else {
        for (int64_t q = 0; q < n; q++) dst[q] = cx_f32_to_bf16_inline(sums[q]);
    }
}

/* y[o][2i + a][2j + b] = (A^T M A)[a][b] (+ bias[o], relu, posmask) for
 * the block's tiles, clipped to the output plane. With yh (bf16), the
 * block's output rows of a channel go to `stage` as plain sums and
 * round_out applies the epilogue (posmask: pmh) rounding them into yh in
 * one run (a tile row's two rows alone were too short a run to vectorize
 * well). */
CX_HOT static void transform_output(float *y, uint16_t *yh, float *stage, const float *m, int64_t ldm, int64_t stride,
                                    const wino_shape *s, int64_t i0, int64_t i1, const float *bias, bool relu,
                                    const float *posmask, const uint16_t *pmh)
{
    const int64_t tw = s->tw, ow = s->ow;
    const bool f32_epi = !yh;
    for (int64_t o = 0; o < s->cout; o++) {
        float *plane = f32_epi ? y + o * s->oh * ow : NULL;
        const float *mplane = f32_epi && posmask ? posmask + o * s->oh * ow : NULL;
        /* adding 0 would turn -0 into +0: without a bias, add nothing */
        const float b = f32_epi && bias ? bias[o] : -0.0f;
        const bool frelu = f32_epi && relu;
        const float bh = !f32_epi && bias ? cx_bf16_to_f32_inline(cx_f32_to_bf16_inline(bias[o])) : 0.0f;
        for (int64_t i = i0; i < i1; i++) {
            const float *src = m + o * ldm + (i - i0) * tw;
            float *y0 = f32_epi ? plane + 2 * i * ow : stage + 2 * (i - i0) * ow;
            float *y1 = 2 * i + 1 < s->oh ? y0 + ow : NULL;
            const float *pm0 = mplane ? mplane + 2 * i * ow : NULL, *pm1 = pm0 && y1 ? pm0 + ow : NULL;
            int64_t j = 0;
            for (; 2 * j + 16 <= ow; j += 8)
                OUTPUT_TILES(v8, i8v, 8, EV8, OD8, LO8, HI8, src, stride, j, y0, y1, pm0, pm1, b, frelu);
            /* whole tiles left that 4-wide vectors would not cover (ow
             * even): the last 8 again, overlapping, each output computed
             * afresh from M, so stored twice alike */
            if ((tw - j) % 4 != 0 && tw >= 8 && 2 * tw <= ow) {
                OUTPUT_TILES(v8, i8v, 8, EV8, OD8, LO8, HI8, src, stride, tw - 8, y0, y1, pm0, pm1, b, frelu);
                j = tw;
            }
            for (; 2 * j + 8 <= ow; j += 4)
                OUTPUT_TILES(v4, i4v, 4, EV4, OD4, LO4, HI4, src, stride, j, y0, y1, pm0, pm1, b, frelu);
            for (; j < tw; j++) {
                float e0, o0, e1, o1;
                OUTPUT_CORE(float, src, stride, j, e0, o0, e1, o1);
                y0[2 * j] = epilogue1(e0, b, frelu, pm0, 2 * j);
                if (2 * j + 1 < ow) y0[2 * j + 1] = epilogue1(o0, b, frelu, pm0, 2 * j + 1);
                if (y1) {
                    y1[2 * j] = epilogue1(e1, b, frelu, pm1, 2 * j);
                    if (2 * j + 1 < ow) y1[2 * j + 1] = epilogue1(o1, b, frelu, pm1, 2 * j + 1);
                }
            }
        }
        if (!f32_epi) {
            /* the block's rows lie back to back in the plane as in the stage */
            const int64_t at = (o * s->oh + 2 * i0) * ow, n = (min64(2 * i1, s->oh) - 2 * i0) * ow;
            round_out(yh + at, stage, n, bias ? &bh : NULL, relu, pmh ? pmh + at : NULL);
        }
    }
}

/* A dy A^T for tiles j..j+W-1 of dy rows ra (2i) and rb (2i + 1): each
 * row's 2W floats are loaded and split into even and odd columns with
 * shuffles. Rows of A dy: a, a + b, a - b, -b. */
#define GRAD_TILES(T, W, EV, OD, ra, rb, j, PUT)                                                    \
    do {                                                                                            \
        const T la_ = LD(T, (ra) + 2 * (j)), ha_ = LD(T, (ra) + 2 * (j) + (W));                     \
        const T lb_ = LD(T, (rb) + 2 * (j)), hb_ = LD(T, (rb) + 2 * (j) + (W));                     \
        GRAD_CORE(T, CX_SHUFFLE(la_, ha_, EV()), CX_SHUFFLE(la_, ha_, OD()), CX_SHUFFLE(lb_, hb_, EV()), \
                  CX_SHUFFLE(lb_, hb_, OD()), PUT);                                                 \
    } while (0)
/* the same from bf16 rows, a row's 2W values at 2j W (even, odd) words
 * (as BF16_TILES_PUT reads them) */
#define GRAD_TILES_BF16(T, W, ra, rb, j, PUT)                                                       \
    do {                                                                                            \
        const u##W##v a_ = *(const u##W##p *)(const void *)((ra) + 2 * (j));                        \
        const u##W##v b_ = *(const u##W##p *)(const void *)((rb) + 2 * (j));                        \
        GRAD_CORE(T, (T)(a_ << 16), (T)(a_ & 0xffff0000u), (T)(b_ << 16), (T)(b_ & 0xffff0000u), PUT); \
    } while (0)
/* the 16 values from row 2i's even and odd columns (a0, a1) and row
 * 2i + 1's (b0, b1) */
#define GRAD_CORE(T, a0, a1, b0, b1, PUT)                                                           \
    do {                                                                                            \
        const T a0_ = (a0), a1_ = (a1), b0_ = (b0), b1_ = (b1);                                     \
        const T t_[4][2] = { { a0_, a1_ }, { a0_ + b0_, a1_ + b1_ }, { a0_ - b0_, a1_ - b1_ },      \
                             { -b0_, -b1_ } };                                                      \
        for (int a_ = 0; a_ < 4; a_++) {                                                           \
            PUT(T, a_ * 4 + 0, t_[a_][0]);                                                          \
            PUT(T, a_ * 4 + 1, t_[a_][0] + t_[a_][1]);                                              \
            PUT(T, a_ * 4 + 2, t_[a_][0] - t_[a_][1]);                                              \
            PUT(T, a_ * 4 + 3, -t_[a_][1]);                                                         \
        }                                                                                           \
    } while (0)

/* the scalar tail's four values of tile j of rows ra and rb (2 x 2, zero
 * past ow): t[a][0] and t[a][1], a the row of A dy */
#define DEFINE_GRAD_TILE1(NAME, R)                                                                  \
    static inline void NAME(float t[4][2], const R *ra, const R *rb, int64_t j, int64_t ow)         \
    {                                                                                               \
        const float a0 = AS_F32(ra[2 * j]), a1 = 2 * j + 1 < ow ? AS_F32(ra[2 * j + 1]) : 0.0f;     \
        const float b0 = AS_F32(rb[2 * j]), b1 = 2 * j + 1 < ow ? AS_F32(rb[2 * j + 1]) : 0.0f;     \
        const float v[4][2] = { { a0, a1 }, { a0 + b0, a1 + b1 }, { a0 - b0, a1 - b1 }, { -b0, -b1 } }; \
        memcpy(t, v, sizeof v);                                                                     \
    }
DEFINE_GRAD_TILE1(grad_tile1, float)
DEFINE_GRAD_TILE1(grad_tile1_bf16, uint16_t)

/* One tile row of Z from dy rows ra and rb, 8 and 4 tiles at a time by
 * TILES (PUT8, PUT4 storing), the rest one at a time by TILE1 and
 * STORE1(xi, value); the stores find dst and j by name. */
#define GRAD_ROW(TILES, TILE1, ra, rb, ow, tw, PUT8, PUT4, STORE1)                                  \
    do {                                                                                            \
        int64_t j = 0;                                                                              \
        for (; 2 * j + 16 <= (ow); j += 8) TILES(v8, 8, ra, rb, j, PUT8);                          \
        for (; 2 * j + 8 <= (ow); j += 4) TILES(v4, 4, ra, rb, j, PUT4);                           \
        for (; j < (tw); j++) {                                                                     \
            float t_[4][2];                                                                         \
            TILE1(t_, ra, rb, j, ow);                                                               \
            for (int a_ = 0; a_ < 4; a_++) {                                                       \
                STORE1(a_ * 4 + 0, t_[a_][0]);                                                      \
                STORE1(a_ * 4 + 1, t_[a_][0] + t_[a_][1]);                                          \
                STORE1(a_ * 4 + 2, t_[a_][0] - t_[a_][1]);                                          \
                STORE1(a_ * 4 + 3, -t_[a_][1]);                                                     \
            }                                                                                       \
        }                                                                                           \
    } while (0)
#define F32_GRAD_TILES(T, W, ra, rb, j, PUT) GRAD_TILES(T, W, EV##W, OD##W, ra, rb, j, PUT)

/* Z[xi][o][t] = (A dy A^T)[xi] for the 2x2 blocks of dy (cout, oh, ow),
 * or of dyh (its rows read in bf16 and widened as they are split), in
 * tile rows [i0, i1); outputs past the plane count as 0 (`zero` holds ow
 * zeros for a missing second row). */
CX_HOT static void transform_grad(float *z, const float *zero, const float *dy, const uint16_t *dyh,
                                  const wino_shape *s, int64_t i0, int64_t i1)
{
    const int64_t tb = (i1 - i0) * s->tw, stride = xi_stride(s->cout * tb), tw = s->tw, ow = s->ow;
#define PUT_F32(T, x, v) ST(T, dst + (x) * stride + j) = (v)
#define STORE1_F32(x, v) dst[(x) * stride + j] = (v)
    for (int64_t o = 0; o < s->cout; o++) {
        const int64_t at = (o * s->oh + 2 * i0) * ow;
        for (int64_t i = i0; i < i1; i++) {
            const int64_t row = at + 2 * (i - i0) * ow;
            const bool second = 2 * i + 1 < s->oh;
            float *dst = z + o * tb + (i - i0) * tw;
            if (dyh) {
                const uint16_t *ra = dyh + row, *rb = second ? ra + ow : (const uint16_t *)(const void *)zero;
                GRAD_ROW(GRAD_TILES_BF16, grad_tile1_bf16, ra, rb, ow, tw, PUT_F32, PUT_F32, STORE1_F32);
            } else {
                const float *ra = dy + row, *rb = second ? ra + ow : zero;
                GRAD_ROW(F32_GRAD_TILES, grad_tile1, ra, rb, ow, tw, PUT_F32, PUT_F32, STORE1_F32);
            }
        }
    }
#undef PUT_F32
#undef STORE1_F32
}

#ifdef WINO_BF16_OPERANDS
/* transform_grad of dyh for the bf16 products: Z rounded by
 * vcvtneps2bf16 as it is computed, into rows of zh (zh_ld(tb) apart, the
 * 16 products zh_stride() apart) that the micro-kernel reads in place,
 * with zeros past cout's rows and tb's columns. Z in f32 and its rounding
 * pass (cx_bf16_round_rows: 1.7 % of a bf16-mixed cnn step) are gone. */
WINO_BF16_TARGET static void transform_grad_bf16(uint16_t *zh, const float *zero, const uint16_t *dyh,
                                                 const wino_shape *s, int64_t i0, int64_t i1)
{
    const int64_t tb = (i1 - i0) * s->tw, tw = s->tw, ow = s->ow, ld = zh_ld(tb), zs = zh_stride(s, tb);
    for (int x = 0; x < 16; x++) {
        uint16_t *zx = zh + x * zs;
        memset(zx + s->cout * ld, 0, sizeof *zx * (size_t)((zh_rows(s) - s->cout) * ld));
        if (ld > tb)
            for (int64_t o = 0; o < s->cout; o++) zx[o * ld + tb] = 0;
    }
#define PUT_H8(T, x, v) _mm_storeu_si128((__m128i *)(void *)(dst + (x) * zs + j), (__m128i)_mm256_cvtneps_pbh((__m256)(v)))
#define PUT_H4(T, x, v) _mm_storel_epi64((__m128i *)(void *)(dst + (x) * zs + j), (__m128i)_mm_cvtneps_pbh((__m128)(v)))
#define STORE1_H(x, v) dst[(x) * zs + j] = round1(v)
    for (int64_t o = 0; o < s->cout; o++) {
        const int64_t at = (o * s->oh + 2 * i0) * ow;
        for (int64_t i = i0; i < i1; i++) {
            const uint16_t *ra = dyh + at + 2 * (i - i0) * ow;
            const uint16_t *rb = 2 * i + 1 < s->oh ? ra + ow : (const uint16_t *)(const void *)zero;
            uint16_t *dst = zh + o * ld + (i - i0) * tw;
            GRAD_ROW(GRAD_TILES_BF16, grad_tile1_bf16, ra, rb, ow, tw, PUT_H8, PUT_H4, STORE1_H);
        }
    }
#undef PUT_H8
#undef PUT_H4
#undef STORE1_H
}
#endif

/* r[k] = column k of the 8 x 8 block whose rows are r[0..7]: three
 * rounds of swapping the off-diagonal halves of 2x2, 4x4 and 8x8 blocks */
static inline __attribute__((always_inline)) void transpose8x8(v8 r[8])
{
    for (int i = 0; i < 8; i += 2) {
        const v8 a = r[i], b = r[i + 1];
        r[i] = CX_SHUFFLE(a, b, CX_MASK(i8v, 0, 8, 2, 10, 4, 12, 6, 14));
        r[i + 1] = CX_SHUFFLE(a, b, CX_MASK(i8v, 1, 9, 3, 11, 5, 13, 7, 15));
    }
    for (int i = 0; i < 8; i += (i & 1) ? 3 : 1) {   /* 0, 1, 4, 5 */
        const v8 a = r[i], b = r[i + 2];
        r[i] = CX_SHUFFLE(a, b, CX_MASK(i8v, 0, 1, 8, 9, 4, 5, 12, 13));
        r[i + 2] = CX_SHUFFLE(a, b, CX_MASK(i8v, 2, 3, 10, 11, 6, 7, 14, 15));
    }
    for (int i = 0; i < 4; i++) {
        const v8 a = r[i], b = r[i + 4];
        r[i] = CX_SHUFFLE(a, b, CX_MASK(i8v, 0, 1, 2, 3, 8, 9, 10, 11));
        r[i + 4] = CX_SHUFFLE(a, b, CX_MASK(i8v, 4, 5, 6, 7, 12, 13, 14, 15));
    }
}

typedef uint16_t h8v __attribute__((vector_size(16), aligned(2), may_alias));

/* 8 values of x, or of xh widened, from at */
#define LOAD8(x, xh, at)                                                                            \
    ((xh) ? (v8)(__builtin_convertvector(*(const h8v *)(const void *)((xh) + (at)), u8v) << 16) : LD(v8, (x) + (at)))

/* xt (2 (i1 - i0) + 2 rows, wp = 2 tw + 2 columns, cin): the input rows of
 * tile rows [i0, i1) of one image, x or xh widened, in channels-last
 * order, shifted by the padding and zero outside the plane. 8 channels
 * by 8 columns at a time through an 8x8 transpose: one value at a time,
 * each store cin floats from the last, had been a seventh of a bf16
 * weight gradient's time. */
CX_HOT static void block_channels_last(float *restrict xt, const float *restrict x, const uint16_t *restrict xh,
                                       const wino_shape *s, int64_t i0, int64_t i1)
{
    const int64_t nrows = 2 * (i1 - i0) + 2, r0 = 2 * i0 - s->pad_h, wp = 2 * s->tw + 2, cin = s->cin;
    const int64_t plane = s->h * s->w, c8 = cin / 8 * 8, q8 = s->w / 8 * 8;
    memset(xt, 0, sizeof(float) * (size_t)(nrows * wp * cin));
    for (int64_t r = 0; r < nrows; r++) {
        if (r0 + r < 0 || r0 + r >= s->h) continue;
        const int64_t row = (r0 + r) * s->w;
        float *restrict dst = xt + (r * wp + s->pad_w) * cin;
        for (int64_t c = 0; c < c8; c += 8)
            for (int64_t q = 0; q < q8; q += 8) {
                v8 t[8];
                for (int i = 0; i < 8; i++) t[i] = LOAD8(x, xh, (c + i) * plane + row + q);
                transpose8x8(t);
                for (int k = 0; k < 8; k++) ST(v8, dst + (q + k) * cin + c) = t[k];
            }
        /* the channels past the last 8, and the columns past the last 8 */
        for (int64_t c = 0; c < cin; c++)
            for (int64_t q = c < c8 ? q8 : 0; q < s->w; q++)
                dst[q * cin + c] = xh ? cx_bf16_to_f32_inline(xh[c * plane + row + q]) : x[c * plane + row + q];
    }
}

/* B^T d B with every operand a vector of channels [c, c + W): d[r][k] at
 * base + r * rs + k * cin; the 16 results at dst + xi * xs. */
#define INPUT_CL(T, base, rs, cin, dst, xs, c)                                                      \
    do {                                                                                            \
        T d_[4][4];                                                                                 \
        for (int r_ = 0; r_ < 4; r_++)                                                             \
            for (int k_ = 0; k_ < 4; k_++) d_[r_][k_] = LD(T, (base) + r_ * (rs) + k_ * (cin) + (c)); \
        INPUT_CORE(T, d_, dst, xs, c);                                                              \
    } while (0)

/* Vt[xi][t][c] = (B^T d B)[xi]: the transposed layout, so that the weight
 * gradient's products are plain (O, T) @ (T, C) ones (a transposed
 * operand costs OpenBLAS twice the time at these sizes). */
CX_HOT static void transform_input_cl(float *vt, const float *xt, const wino_shape *s, int64_t i0, int64_t i1)
{
    const int64_t tw = s->tw, cin = s->cin, wp = 2 * tw + 2, tb = (i1 - i0) * tw, xs = xi_stride(tb * cin);
    const int64_t rs = wp * cin;
    for (int64_t ii = 0; ii < i1 - i0; ii++)
        for (int64_t j = 0; j < tw; j++) {
            const float *base = xt + (2 * ii * wp + 2 * j) * cin;
            float *dst = vt + (ii * tw + j) * cin;
            int64_t c = 0;
            for (; c + 8 <= cin; c += 8) INPUT_CL(v8, base, rs, cin, dst, xs, c);
            for (; c + 4 <= cin; c += 4) INPUT_CL(v4, base, rs, cin, dst, xs, c);
            for (; c < cin; c++) INPUT_CL(float, base, rs, cin, dst, xs, c);
        }
}

#ifdef WINO_BF16_OPERANDS
/* transform_input_cl for the weight gradient's bf16 products: their B
 * operands Vt[xi] (K = tb, N = cin) straight into panels, bps words
 * apart, tiles t and t + 1 transformed together, rounded by
 * vcvtneps2bf16 and interleaved into the panels' pair words. Storing Vt
 * in f32 and packing it (a rounding pack of its own) had taken more of a bf16
 * step than the whole f32 route's Vt. */
WINO_BF16_TARGET static void transform_input_cl_panels(uint32_t *bp, int64_t bps, const float *xt,
                                                       const wino_shape *s, int64_t i0, int64_t i1)
{
    const int64_t tw = s->tw, cin = s->cin, wp = 2 * tw + 2, tb = (i1 - i0) * tw, rs = wp * cin;
    const int64_t pairs = (tb + 1) / 2;
    zero_ragged_panels(bp, bps, pairs, cin);
    for (int64_t t = 0; t < tb; t += 2) {
        const float *base0 = xt + (2 * (t / tw) * wp + 2 * (t % tw)) * cin;
        const bool odd = t + 1 < tb;
        /* without a second tile, base1 is base0 and never read */
        const float *base1 = odd ? xt + (2 * ((t + 1) / tw) * wp + 2 * ((t + 1) % tw)) * cin : base0;
#define CL_PANEL(T, W, c)                                                                           \
    do {                                                                                            \
        T e_[16], o_[16], d_[4][4];                                                                 \
        for (int r_ = 0; r_ < 4; r_++)                                                             \
            for (int k_ = 0; k_ < 4; k_++) d_[r_][k_] = LD(T, base0 + r_ * rs + k_ * cin + (c));    \
        INPUT_CORE_PUT(T, d_, PUT_ARRAY, e_, 0, 0);                                                 \
        if (odd) {                                                                                  \
            for (int r_ = 0; r_ < 4; r_++)                                                         \
                for (int k_ = 0; k_ < 4; k_++) d_[r_][k_] = LD(T, base1 + r_ * rs + k_ * cin + (c)); \
            INPUT_CORE_PUT(T, d_, PUT_ARRAY, o_, 0, 0);                                             \
        } else {                                                                                    \
            for (int x_ = 0; x_ < 16; x_++) o_[x_] = (T){ 0 };                                      \
        }                                                                                           \
        /* c is a multiple of W: its words are one run */                                          \
        int64_t off_;                                                                               \
        panel_run(&off_, pairs, t / 2, c, W);                                                       \
        for (int x_ = 0; x_ < 16; x_++) STORE_WORDS##W(bp + x_ * bps + off_, e_[x_], o_[x_]);       \
    } while (0)
        int64_t c = 0;
        for (; c + 8 <= cin; c += 8) CL_PANEL(v8, 8, c);
        for (; c + 4 <= cin; c += 4) CL_PANEL(v4, 4, c);
        for (; c < cin; c++) CL_PANEL(v1, 1, c);
#undef CL_PANEL
    }
}
#endif

/* dw[o][c] = G^T dU[o][c] G. */
CX_HOT static void finish_weight_grad(float *dw, const float *du, int64_t o_n, int64_t c_n)
{
    const int64_t plane = o_n * c_n, xs = xi_stride(plane);
    for (int64_t p = 0; p < plane; p++) {
        float d[4][4];
        for (int x = 0; x < 16; x++) d[x / 4][x % 4] = du[x * xs + p];
        float t[3][4];
        for (int k = 0; k < 4; k++) {
            t[0][k] = d[0][k] + 0.5f * (d[1][k] + d[2][k]);
            t[1][k] = 0.5f * (d[1][k] - d[2][k]);
            t[2][k] = 0.5f * (d[1][k] + d[2][k]) + d[3][k];
        }
        float *out = dw + p * 9;
        for (int a = 0; a < 3; a++) {
            out[a * 3 + 0] = t[a][0] + 0.5f * (t[a][1] + t[a][2]);
            out[a * 3 + 1] = 0.5f * (t[a][1] - t[a][2]);
            out[a * 3 + 2] = 0.5f * (t[a][1] + t[a][2]) + t[a][3];
        }
    }
}

/* ---- tasks on the pool ------------------------------------------------------ */

typedef struct {
    wino_shape s;
    wino_dir dir;
    lane_layout lane;
    float *lanes_base;       /* lanes * lane.total floats */
    int64_t lanes;
    const float *u;          /* transformed weights (forward-like) */
    bool products_bf16;      /* bf16 tensors with AVX512_BF16: the products on vdpbf16ps */
    const uint32_t *up;      /* then U's A panels, up_words() each */
    const float *in;         /* x, or dy for the input gradient */
    const float *dy;         /* weight gradient */
    float *out;              /* y or dx */
    const uint16_t *in_h, *dy_h;   /* bf16 in place of in and dy */
    uint16_t *out_h;               /* bf16 in place of out */
    const float *bias;       /* forward epilogue, or NULL */
    bool relu;
    const float *posmask;    /* input gradient: keep dx where posmask > 0, or NULL */
    const uint16_t *posmask_h;     /* the same for a bf16 dx */
    cx_claims claims;   /* the forward-like tasks: (image, block of tile rows) */
    atomic_int_fast64_t used;
} wino_job;


CX_HOT static void fwd_task(const wino_job *j, float *lane, int64_t n, int64_t i0, int64_t i1)
{
    const wino_shape *s = &j->s;
    const int64_t tb = (i1 - i0) * s->tw;
    float *v = lane + j->lane.v, *m = lane + j->lane.m;
    const int64_t in_at = n * s->cin * s->h * s->w;
    const bool half = j->products_bf16;
    const int64_t ldm = m_ld(tb, half), ms = m_stride(s, tb, half);
    if (half) {
#ifdef WINO_BF16_OPERANDS
        uint32_t *bp = (uint32_t *)(lane + j->lane.bp);
        const int64_t bps = bp_stride(s, tb, false);
        transform_input_panels(bp, bps, (uint16_t *)(lane + j->lane.rows), j->in_h + in_at, s, i0, i1);
        for (int x = 0; x < 16; x++)
            cx_bf16_gemm_panels(m + x * ms, ldm, false, j->up + x * up_words(s), NULL, 0, bp + x * bps, s->cout, tb,
                                s->cin, true);
#else
        CX_ASSERT(!"bf16 products without AVX512_BF16");
#endif
    } else {
        transform_input(v, lane + j->lane.rows, j->in_h ? NULL : j->in + in_at, j->in_h ? j->in_h + in_at : NULL, s,
                        i0, i1);
        for (int x = 0; x < 16; x++)
            cx_sgemm_serial(false, false, s->cout, tb, s->cin, j->u + x * xi_stride(s->cout * s->cin), s->cin,
                            v + x * xi_stride(s->cin * tb), tb, 0.0f, m + x * ms, ldm);
    }
    const int64_t at = n * s->cout * s->oh * s->ow;
    transform_output(j->out_h ? NULL : j->out + at, j->out_h ? j->out_h + at : NULL, lane + j->lane.stage, m, ldm, ms,
                     s, i0, i1, j->bias, j->relu, j->posmask ? j->posmask + at : NULL,
                     j->posmask_h ? j->posmask_h + at : NULL);
}

/* dU (+)= sum over the images [n0, n1) of Z[xi] @ Vt[xi]. */
CX_HOT static void weight_task(const wino_job *j, float *lane, int64_t n0, int64_t n1)
{
    const wino_shape *s = &j->s;
    float *v = lane + j->lane.v, *z = lane + j->lane.m, *du = lane + j->lane.du, *zero = lane + j->lane.rows;
    memset(zero, 0, sizeof(float) * (size_t)s->ow);
    bool first = true;
    const bool bf16 = j->in_h != NULL, half = j->products_bf16;
    uint16_t *zh = (uint16_t *)(lane + j->lane.zh);
    uint32_t *bp = (uint32_t *)(lane + j->lane.bp);
    for (int64_t n = n0; n < n1; n++)
        for (int64_t i0 = 0; i0 < s->th; i0 += s->rows) {
            const int64_t i1 = min64(i0 + s->rows, s->th), tb = (i1 - i0) * s->tw;
            const int64_t x_at = n * s->cin * s->h * s->w, dy_at = n * s->cout * s->oh * s->ow;
            block_channels_last(lane + j->lane.xt, bf16 ? NULL : j->in + x_at, bf16 ? j->in_h + x_at : NULL, s, i0,
                                i1);
            if (half) {
#ifdef WINO_BF16_OPERANDS
                transform_input_cl_panels(bp, bp_stride(s, tb, true), lane + j->lane.xt, s, i0, i1);
                transform_grad_bf16(zh, zero, j->dy_h + dy_at, s, i0, i1);
#else
                CX_ASSERT(!"bf16 products without AVX512_BF16");
#endif
            } else {
                transform_input_cl(v, lane + j->lane.xt, s, i0, i1);
                transform_grad(z, zero, bf16 ? NULL : j->dy + dy_at, bf16 ? j->dy_h + dy_at : NULL, s, i0, i1);
            }
            for (int x = 0; x < 16; x++) {
                float *dux = du + x * xi_stride(s->cout * s->cin);
                if (!half) {
                    cx_sgemm_serial(false, false, s->cout, s->cin, tb, z + x * xi_stride(s->cout * tb), tb,
                                    v + x * xi_stride(tb * s->cin), s->cin, first ? 0.0f : 1.0f, dux, s->cin);
                    continue;
                }
                /* Z's rows, rounded, read in place as the micro-kernel's A
                 * (the rows its last tile reads past cout zeros) */
                uint16_t *zx = zh + x * zh_stride(s, tb);
                cx_bf16_gemm_panels(dux, s->cin, !first, NULL, zx, zh_ld(tb), bp + x * bp_stride(s, tb, true), s->cout,
                                    s->cin, zh_ld(tb), false);
            }
            first = false;
        }
}

CX_HOT static void wino_each(void *p, int64_t tid, int64_t nthreads)
{
    wino_job *j = p;
    const int64_t lanes = min64(j->lanes, nthreads);
    if (tid >= lanes) return;
    if (tid == 0) atomic_store_explicit(&j->used, lanes, memory_order_relaxed);
    float *lane = j->lanes_base + (size_t)tid * j->lane.total;
    const wino_shape *s = &j->s;
    if (j->dir == WINO_BWD_WEIGHT) {
        /* a fixed split of the images, so dw does not depend on timing */
        weight_task(j, lane, s->n * tid / lanes, s->n * (tid + 1) / lanes);
        return;
    }
    const int64_t blocks = ceil_div(s->th, s->rows);
    for (;;) {
        int64_t t = cx_claims_next(&j->claims, tid);
        if (t < 0) return;
        int64_t n = t / blocks, i0 = t % blocks * s->rows;
        fwd_task(j, lane, n, i0, min64(i0 + s->rows, s->th));
    }
}

/* Splits the scratch into the shared weights and as many lanes as fit
 * (the thread count may have grown since the scratch was sized). */
static float *setup(wino_job *j, const cx_conv_geom *g, wino_dir dir, void *scratch, size_t scratch_bytes)
{
    const bool bf16 = j->in_h != NULL;
    j->s = shape_of(g, dir);
    j->dir = dir;
    j->lane = lane_of(&j->s, dir, bf16);
    j->products_bf16 = bf16 && cx_isa_active() >= CX_ISA_AVX512_BF16;
    uintptr_t p = ((uintptr_t)scratch + WINO_ALIGN - 1) & ~(uintptr_t)(WINO_ALIGN - 1);
    float *base = (float *)p;
    size_t usable = (scratch_bytes - (size_t)(p - (uintptr_t)scratch)) / sizeof(float);
    size_t shared = shared_floats(&j->s, dir, bf16);
    j->lanes_base = base + shared;
    j->lanes = usable > shared ? min64(g->n, (int64_t)((usable - shared) / j->lane.total)) : 0;
    if (j->lanes < 1) j->lanes = 1;   /* never: the scratch is sized for one lane at least */
    cx_claims_init(&j->claims, j->s.n * ceil_div(j->s.th, j->s.rows), min64(j->lanes, cx_pool_threads()));
    atomic_init(&j->used, 1);
    return base;
}

/* The forward and the input gradient: the same tiles on different data. */
static void run_forward_like(wino_job *j, const cx_conv_geom *g, wino_dir dir, const float *w, const float *in,
                             float *out, void *scratch, size_t scratch_bytes)
{
    float *u = setup(j, g, dir, scratch, scratch_bytes);
    transform_weights(u, w, g->o, g->c, dir == WINO_BWD_INPUT);
    j->u = u;
    if (j->products_bf16) {
        const wino_shape *s = &j->s;
        const int64_t xs = xi_stride(s->cout * s->cin);
        uint16_t *uh = (uint16_t *)(u + u_floats(s));
        uint32_t *up = (uint32_t *)(u + u_floats(s) + uh_floats(s));
        for (int x = 0; x < 16; x++) {
            cx_bf16_round_rows(uh + x * xs, s->cin, u + x * xs, s->cin, s->cout, s->cin, s->cout, s->cin);
            cx_bf16_pack_a(up + x * up_words(s), uh + x * xs, s->cin, s->cout, s->cin);
        }
        j->up = up;
    }
    j->in = in;
    j->out = out;
    cx_pool_run_each(wino_each, j);
}

void cx_wino_fwd(float *y, const float *x, const float *w, const float *bias, bool relu, const cx_conv_geom *g,
                 void *scratch, size_t scratch_bytes)
{
    wino_job j = { .bias = bias, .relu = relu };
    run_forward_like(&j, g, WINO_FWD, w, x, y, scratch, scratch_bytes);
}

void cx_wino_bwd_input(float *dx, const float *dy, const float *w, const float *posmask, const cx_conv_geom *g,
                       void *scratch, size_t scratch_bytes)
{
    wino_job j = { .posmask = posmask };
    run_forward_like(&j, g, WINO_BWD_INPUT, w, dy, dx, scratch, scratch_bytes);
}

/* dw from the job's x and dy, f32 or bf16 */
static void run_weight_grad(wino_job *j, float *dw, const cx_conv_geom *g, void *scratch, size_t scratch_bytes)
{
    setup(j, g, WINO_BWD_WEIGHT, scratch, scratch_bytes);
    cx_pool_run_each(wino_each, j);
    const int64_t used = atomic_load(&j->used), len = g->o * g->c, xs = xi_stride(len);
    float *du = j->lanes_base + j->lane.du;
    for (int64_t t = 1; t < used; t++) {
        const float *part = j->lanes_base + (size_t)t * j->lane.total + j->lane.du;
        for (int x = 0; x < 16; x++)
            for (int64_t i = 0; i < len; i++) du[x * xs + i] += part[x * xs + i];
    }
    finish_weight_grad(dw, du, g->o, g->c);
}

void cx_wino_bwd_weight(float *dw, const float *x, const float *dy, const cx_conv_geom *g, void *scratch,
                        size_t scratch_bytes)
{
    wino_job j = { .in = x, .dy = dy };
    run_weight_grad(&j, dw, g, scratch, scratch_bytes);
}

void cx_wino_fwd_bf16(uint16_t *y, const uint16_t *x, const float *w, const float *bias, bool relu,
                      const cx_conv_geom *g, void *scratch, size_t scratch_bytes)
{
    wino_job j = { .in_h = x, .out_h = y, .bias = bias, .relu = relu };
    run_forward_like(&j, g, WINO_FWD, w, NULL, NULL, scratch, scratch_bytes);
}

void cx_wino_bwd_input_bf16(uint16_t *dx, const uint16_t *dy, const float *w, const uint16_t *posmask,
                            const cx_conv_geom *g, void *scratch, size_t scratch_bytes)
{
    wino_job j = { .in_h = dy, .out_h = dx, .posmask_h = posmask };
    run_forward_like(&j, g, WINO_BWD_INPUT, w, NULL, NULL, scratch, scratch_bytes);
}

void cx_wino_bwd_weight_bf16(float *dw, const uint16_t *x, const uint16_t *dy, const cx_conv_geom *g, void *scratch,
                             size_t scratch_bytes)
{
    wino_job j = { .in_h = x, .dy_h = dy };
    run_weight_grad(&j, dw, g, scratch, scratch_bytes);
}
