/* Max and average 2-D pooling, forward and backward, with PyTorch's
 * semantics (floor output size, max padding = -inf, avg divisor kh*kw).
 * Every (image, channel) plane is independent, so the pool splits the
 * N*C planes and each output element is produced by one thread in a fixed
 * order: backward passes need no atomics and are deterministic. */
#include "kernels.h"
#include "pool.h"

#include <stdint.h>
#include <string.h>

/* Floats touched per pool task before splitting pays off. */
#define POOL_GRAIN_FLOATS 16384

bool cx_pool_geom_finish(cx_pool_geom *g)
{
    if (!g) return false;
    if (g->n <= 0 || g->c <= 0 || g->h <= 0 || g->w <= 0) return false;
    if (g->kh <= 0 || g->kw <= 0 || g->sh <= 0 || g->sw <= 0 || g->ph < 0 || g->pw < 0) return false;
    /* PyTorch's rule; it also guarantees every window holds an input
     * element, so a max is always defined. */
    if (g->ph > g->kh / 2 || g->pw > g->kw / 2) return false;
    int64_t room_h = g->h + 2 * (int64_t)g->ph - g->kh;
    int64_t room_w = g->w + 2 * (int64_t)g->pw - g->kw;
    if (room_h < 0 || room_w < 0) return false;
    g->oh = room_h / g->sh + 1;
    g->ow = room_w / g->sw + 1;
    return g->oh > 0 && g->ow > 0;
}

typedef struct {
    const cx_pool_geom *g;
    float *out;
    const float *x;
    const float *dy;
    const float *posmask;  /* max backward: keep dx only where posmask > 0 */
} pool_job;

/* The clipped window of output (oh, ow): rows [h0, h1), cols [w0, w1). */
typedef struct {
    int64_t h0, h1, w0, w1;
} window;

static window window_at(const cx_pool_geom *g, int64_t oh, int64_t ow)
{
    window r;
    int64_t hs = oh * g->sh - g->ph, ws = ow * g->sw - g->pw;
    r.h0 = hs < 0 ? 0 : hs;
    r.w0 = ws < 0 ? 0 : ws;
    r.h1 = hs + g->kh > g->h ? g->h : hs + g->kh;
    r.w1 = ws + g->kw > g->w ? g->w : ws + g->kw;
    return r;
}

static inline uint32_t float_bits(float v)
{
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static inline float bits_float(uint32_t b)
{
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* One step of the scan: take v (at index i) if it beats m. Bit masks
 * rather than ?: so the compiler cannot turn the select into a branch. */
static inline void max_step(float v, int64_t i, float *m, int64_t *best)
{
    const unsigned beats = (unsigned)((v > *m) | (v != v));
    const uint32_t take = -(uint32_t)beats;
    const uint64_t take64 = -(uint64_t)beats;
    *m = bits_float((float_bits(v) & take) | (float_bits(*m) & ~take));
    *best = (int64_t)(((uint64_t)i & take64) | ((uint64_t)*best & ~take64));
}

/* Index of the window's maximum within the plane. Scanning row-major with
 * a strict '>' keeps the first of equal maxima; a NaN is taken (and a later
 * NaN replaces it), so NaN propagates as in PyTorch. Starting from the
 * first element makes an all -inf window pick that element. The selects
 * are written branch-free: on real data the comparison is a coin flip, and
 * mispredicted branches cost more than the rest of the pooling. */
static inline int64_t argmax_window(const float *plane, int64_t w, window r)
{
    int64_t best = r.h0 * w + r.w0;
    float m = plane[best];
    for (int64_t ih = r.h0; ih < r.h1; ih++)
        for (int64_t iw = r.w0; iw < r.w1; iw++) max_step(plane[ih * w + iw], ih * w + iw, &m, &best);
    return best;
}

/* Output columns whose window lies entirely inside the input width:
 * [lo, hi). These take the vectorized row loops; the few border columns
 * take the clipped scalar path. */
static void interior_cols(const cx_pool_geom *g, int64_t *lo, int64_t *hi)
{
    int64_t l = (g->pw + g->sw - 1) / g->sw;
    int64_t room = g->w - g->kw + g->pw;
    int64_t h = room < 0 ? 0 : room / g->sw + 1;
    if (l > g->ow) l = g->ow;
    if (h > g->ow) h = g->ow;
    *lo = l;
    *hi = h > l ? h : l;
}

#define POOL_BLOCK 64

/* Max and first argmax of the windows of output row oh, columns [a, b)
 * (all interior), into val/arg indexed from 0. Same scan order and rule as
 * argmax_window, one window per vector lane; the lanes track the tap
 * number (narrow, so vectors stay full) and turn it into a plane index at
 * the end. `sw` is a literal at the hot call sites so the strided loads
 * get specialized. */
static inline void max_interior(const cx_pool_geom *g, const float *plane, int64_t oh, int64_t a, int64_t b,
                                int64_t sw, float *restrict val, int64_t *restrict arg)
{
    const int64_t hs = oh * g->sh - g->ph, w = g->w;
    const int64_t h0 = hs < 0 ? 0 : hs, h1 = hs + g->kh > g->h ? g->h : hs + g->kh;
    const int64_t n = b - a, base = a * sw - g->pw;
    uint32_t tap[POOL_BLOCK];
    for (int64_t i = 0; i < n; i++) {
        val[i] = plane[h0 * w + base + i * sw];
        tap[i] = 0;
    }
    uint32_t t = 0;
    for (int64_t ih = h0; ih < h1; ih++)
        for (int64_t kw = 0; kw < g->kw; kw++, t++) {
            if (t == 0) continue;
            const float *s = plane + ih * w + base + kw;
            for (int64_t i = 0; i < n; i++) {
                const float v = s[i * sw];
                const uint32_t take = -(uint32_t)((v > val[i]) | (v != v));
                val[i] = bits_float((float_bits(v) & take) | (float_bits(val[i]) & ~take));
                tap[i] = (t & take) | (tap[i] & ~take);
            }
        }
    for (int64_t i = 0; i < n; i++)
        arg[i] = (h0 + tap[i] / g->kw) * w + base + i * sw + tap[i] % g->kw;
}

/* val/arg for output row oh, columns [c0, c1) (c1 - c0 <= POOL_BLOCK). */
CX_HOT static void max_block(const cx_pool_geom *g, const float *plane, int64_t oh, int64_t c0, int64_t c1,
                      int64_t in_lo, int64_t in_hi, float *val, int64_t *arg)
{
    int64_t a = c0 > in_lo ? c0 : in_lo, b = c1 < in_hi ? c1 : in_hi;
    if (a >= b) a = b = c1;
    for (int64_t ow = c0; ow < a; ow++) {
        arg[ow - c0] = argmax_window(plane, g->w, window_at(g, oh, ow));
        val[ow - c0] = plane[arg[ow - c0]];
    }
    if (a < b) {
        if (g->sw == 1)
            max_interior(g, plane, oh, a, b, 1, val + (a - c0), arg + (a - c0));
        else if (g->sw == 2)
            max_interior(g, plane, oh, a, b, 2, val + (a - c0), arg + (a - c0));
        else
            max_interior(g, plane, oh, a, b, g->sw, val + (a - c0), arg + (a - c0));
    }
    for (int64_t ow = b; ow < c1; ow++) {
        arg[ow - c0] = argmax_window(plane, g->w, window_at(g, oh, ow));
        val[ow - c0] = plane[arg[ow - c0]];
    }
}

/* 2x2 windows at stride 2 without padding (every CNN's pooling): the
 * windows tile the plane, so backward writes each dx element exactly once
 * and needs no clearing pass. Same scan order and NaN rule as
 * argmax_window. */
bool cx_pool_geom_is_2x2(const cx_pool_geom *g)
{
    return g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0;
}

/* Vectors of W windows: the two input rows are loaded as 2W floats each
 * and split into even and odd columns; comparisons give lane masks, and
 * the selects are bitwise (no branches: each comparison is a coin flip). */
typedef float f8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t i8 __attribute__((vector_size(32)));
typedef float f4 __attribute__((vector_size(16), aligned(4), may_alias));
typedef int32_t i4 __attribute__((vector_size(16)));
#define VLD(F, p) (*(const F *)(const void *)(p))
#define VST(F, p) (*(F *)(void *)(p))
#define SEL(F, I, t, x, y) ((F)(((I)(x) & (t)) | ((I)(y) & ~(t))))
#define EVENS8() CX_MASK(i8, 0, 2, 4, 6, 8, 10, 12, 14)
#define ODDS8() CX_MASK(i8, 1, 3, 5, 7, 9, 11, 13, 15)
#define LOW8() CX_MASK(i8, 0, 8, 1, 9, 2, 10, 3, 11)
#define HIGH8() CX_MASK(i8, 4, 12, 5, 13, 6, 14, 7, 15)
#define EVENS4() CX_MASK(i4, 0, 2, 4, 6)
#define ODDS4() CX_MASK(i4, 1, 3, 5, 7)
#define LOW4() CX_MASK(i4, 0, 4, 1, 5)
#define HIGH4() CX_MASK(i4, 2, 6, 3, 7)

/* Max and first-max tap (0..3, row-major) of W windows starting at
 * column 2*ow of rows r0/r1; a NaN is taken, as in argmax_window. */
#define MAX2X2(F, I, W, EV, OD, r0, r1, ow, m, k)                                              \
    do {                                                                                        \
        const F l0_ = VLD(F, (r0) + 2 * (ow)), h0_ = VLD(F, (r0) + 2 * (ow) + (W));             \
        const F l1_ = VLD(F, (r1) + 2 * (ow)), h1_ = VLD(F, (r1) + 2 * (ow) + (W));             \
        const F v_[4] = { CX_SHUFFLE(l0_, h0_, EV()), CX_SHUFFLE(l0_, h0_, OD()),                         \
                          CX_SHUFFLE(l1_, h1_, EV()), CX_SHUFFLE(l1_, h1_, OD()) };                   \
        m = v_[0];                                                                              \
        k = (I){ 0 };                                                                           \
        for (int t_ = 1; t_ < 4; t_++) {                                                        \
            const I take_ = (v_[t_] > m) | (v_[t_] != v_[t_]);                                  \
            m = SEL(F, I, take_, v_[t_], m);                                                    \
            k = (take_ & t_) | (k & ~take_);                                                    \
        }                                                                                       \
    } while (0)

CX_HOT static void max2x2_fwd_plane(float *restrict y, const float *restrict x, const cx_pool_geom *g)
{
    for (int64_t oh = 0; oh < g->oh; oh++) {
        const float *r0 = x + 2 * oh * g->w, *r1 = r0 + g->w;
        float *yr = y + oh * g->ow;
        int64_t ow = 0;
        /* the vector loads read up to 2*ow + 2W floats of a row */
#define FWD_WINDOWS(F, I, W, EV, OD)                                                            \
        for (; ow + (W) <= g->ow && 2 * ow + 2 * (W) <= g->w; ow += (W)) {                       \
            F m;                                                                                 \
            I k;                                                                                 \
            MAX2X2(F, I, W, EV, OD, r0, r1, ow, m, k);                                           \
            (void)k;                                                                             \
            VST(F, yr + ow) = m;                                                                 \
        }
        FWD_WINDOWS(f8, i8, 8, EVENS8, ODDS8)
        FWD_WINDOWS(f4, i4, 4, EVENS4, ODDS4)
#undef FWD_WINDOWS
        for (; ow < g->ow; ow++) {
            window r = { 2 * oh, 2 * oh + 2, 2 * ow, 2 * ow + 2 };
            yr[ow] = x[argmax_window(x, g->w, r)];
        }
    }
}

/* Writes the two dx rows of W windows: v at the max tap, 0 elsewhere. */
#define SCATTER2X2(F, I, LO, HI, d0, d1, ow, k, v)                                               \
    do {                                                                                         \
        const F z_ = (F){ 0 };                                                                   \
        const F e0_ = SEL(F, I, k == 0, v, z_), o0_ = SEL(F, I, k == 1, v, z_);                  \
        const F e1_ = SEL(F, I, k == 2, v, z_), o1_ = SEL(F, I, k == 3, v, z_);                  \
        VST(F, (d0) + 2 * (ow)) = CX_SHUFFLE(e0_, o0_, LO());                                       \
        VST(F, (d0) + 2 * (ow) + sizeof(F) / 4) = CX_SHUFFLE(e0_, o0_, HI());                       \
        VST(F, (d1) + 2 * (ow)) = CX_SHUFFLE(e1_, o1_, LO());                                       \
        VST(F, (d1) + 2 * (ow) + sizeof(F) / 4) = CX_SHUFFLE(e1_, o1_, HI());                       \
    } while (0)

/* With `positive`, dy passes only where the window's max is > 0: the
 * gradient of relu before the pool, folded in (x is relu's output). */
CX_HOT static void max2x2_bwd_plane(float *restrict dx, const float *restrict x, const float *restrict dy, bool positive,
                             const cx_pool_geom *g)
{
    const int64_t w = g->w;
    for (int64_t oh = 0; oh < g->oh; oh++) {
        const float *r0 = x + 2 * oh * w, *r1 = r0 + w;
        float *d0 = dx + 2 * oh * w, *d1 = d0 + w;
        const float *gr = dy + oh * g->ow;
        int64_t ow = 0;
#define BWD_WINDOWS(F, I, W, EV, OD, LO, HI)                                                    \
        for (; ow + (W) <= g->ow && 2 * ow + 2 * (W) <= w; ow += (W)) {                          \
            F m;                                                                                 \
            I k;                                                                                 \
            MAX2X2(F, I, W, EV, OD, r0, r1, ow, m, k);                                           \
            F v = VLD(F, gr + ow);                                                               \
            if (positive) v = SEL(F, I, m > 0, v, (F){ 0 });                                     \
            SCATTER2X2(F, I, LO, HI, d0, d1, ow, k, v);                                          \
        }
        BWD_WINDOWS(f8, i8, 8, EVENS8, ODDS8, LOW8, HIGH8)
        BWD_WINDOWS(f4, i4, 4, EVENS4, ODDS4, LOW4, HIGH4)
#undef BWD_WINDOWS
        for (; ow < g->ow; ow++) {
            window r = { 2 * oh, 2 * oh + 2, 2 * ow, 2 * ow + 2 };
            const int64_t at = argmax_window(x, w, r);
            const float v = !positive || x[at] > 0 ? gr[ow] : 0.0f;
            d0[2 * ow] = d0[2 * ow + 1] = d1[2 * ow] = d1[2 * ow + 1] = 0.0f;
            dx[at] = v;
        }
        for (int64_t q = 2 * g->ow; q < w; q++) d0[q] = d1[q] = 0.0f;
    }
    if (2 * g->oh < g->h) memset(dx + 2 * g->oh * w, 0, sizeof(float) * (size_t)((g->h - 2 * g->oh) * w));
}

CX_HOT static void max_fwd_range(void *ctx, int64_t begin, int64_t end)
{
    const pool_job *j = ctx;
    const cx_pool_geom *g = j->g;
    const int64_t in_plane = g->h * g->w, out_plane = g->oh * g->ow;
    int64_t in_lo, in_hi;
    interior_cols(g, &in_lo, &in_hi);
    float val[POOL_BLOCK];
    int64_t arg[POOL_BLOCK];
    if (cx_pool_geom_is_2x2(g)) {
        for (int64_t t = begin; t < end; t++) max2x2_fwd_plane(j->out + t * out_plane, j->x + t * in_plane, g);
        return;
    }
    for (int64_t t = begin; t < end; t++) {
        const float *x = j->x + t * in_plane;
        float *y = j->out + t * out_plane;
        for (int64_t oh = 0; oh < g->oh; oh++)
            for (int64_t c0 = 0; c0 < g->ow; c0 += POOL_BLOCK) {
                const int64_t c1 = c0 + POOL_BLOCK < g->ow ? c0 + POOL_BLOCK : g->ow;
                max_block(g, x, oh, c0, c1, in_lo, in_hi, val, arg);
                memcpy(y + oh * g->ow + c0, val, sizeof(float) * (size_t)(c1 - c0));
            }
    }
}

/* Gradients are added in output order (oh, ow), as the reference does;
 * overlapping windows therefore sum in a fixed order. */
CX_HOT static void max_bwd_range(void *ctx, int64_t begin, int64_t end)
{
    const pool_job *j = ctx;
    const cx_pool_geom *g = j->g;
    const int64_t in_plane = g->h * g->w, out_plane = g->oh * g->ow;
    int64_t in_lo, in_hi;
    interior_cols(g, &in_lo, &in_hi);
    float val[POOL_BLOCK];
    int64_t arg[POOL_BLOCK];
    for (int64_t t = begin; t < end; t++) {
        const float *x = j->x + t * in_plane;
        const float *dy = j->dy + t * out_plane;
        float *dx = j->out + t * in_plane;
        if (cx_pool_geom_is_2x2(g)) {
            bool folded = j->posmask == j->x;
            max2x2_bwd_plane(dx, x, dy, folded, g);
            if (folded || !j->posmask) continue;
        } else {
            memset(dx, 0, sizeof(float) * (size_t)in_plane);
            for (int64_t oh = 0; oh < g->oh; oh++)
                for (int64_t c0 = 0; c0 < g->ow; c0 += POOL_BLOCK) {
                    const int64_t c1 = c0 + POOL_BLOCK < g->ow ? c0 + POOL_BLOCK : g->ow;
                    max_block(g, x, oh, c0, c1, in_lo, in_hi, val, arg);
                    for (int64_t ow = c0; ow < c1; ow++) dx[arg[ow - c0]] += dy[oh * g->ow + ow];
                }
            if (!j->posmask) continue;
        }
        const float *pm = j->posmask + t * in_plane;
        for (int64_t i = 0; i < in_plane; i++) dx[i] = pm[i] > 0 ? dx[i] : 0.0f;
    }
}

static inline void avg_interior(const cx_pool_geom *g, const float *plane, int64_t oh, int64_t a, int64_t b,
                                int64_t sw, float inv, float *restrict y)
{
    const int64_t hs = oh * g->sh - g->ph, w = g->w;
    const int64_t h0 = hs < 0 ? 0 : hs, h1 = hs + g->kh > g->h ? g->h : hs + g->kh;
    const int64_t n = b - a, base = a * sw - g->pw;
    float acc[POOL_BLOCK];
    for (int64_t i = 0; i < n; i++) acc[i] = 0.0f;
    for (int64_t ih = h0; ih < h1; ih++)
        for (int64_t kw = 0; kw < g->kw; kw++) {
            const float *s = plane + ih * w + base + kw;
            for (int64_t i = 0; i < n; i++) acc[i] += s[i * sw];
        }
    for (int64_t i = 0; i < n; i++) y[i] = acc[i] * inv;
}

static float avg_window(const cx_pool_geom *g, const float *plane, int64_t oh, int64_t ow, float inv)
{
    window r = window_at(g, oh, ow);
    float s = 0.0f;
    for (int64_t ih = r.h0; ih < r.h1; ih++)
        for (int64_t iw = r.w0; iw < r.w1; iw++) s += plane[ih * g->w + iw];
    return s * inv;
}

CX_HOT static void avg_fwd_range(void *ctx, int64_t begin, int64_t end)
{
    const pool_job *j = ctx;
    const cx_pool_geom *g = j->g;
    const int64_t in_plane = g->h * g->w, out_plane = g->oh * g->ow;
    const float inv = 1.0f / (float)(g->kh * g->kw);
    int64_t in_lo, in_hi;
    interior_cols(g, &in_lo, &in_hi);
    for (int64_t t = begin; t < end; t++) {
        const float *x = j->x + t * in_plane;
        float *y = j->out + t * out_plane;
        for (int64_t oh = 0; oh < g->oh; oh++) {
            float *yr = y + oh * g->ow;
            for (int64_t ow = 0; ow < in_lo; ow++) yr[ow] = avg_window(g, x, oh, ow, inv);
            for (int64_t a = in_lo; a < in_hi; a += POOL_BLOCK) {
                const int64_t b = a + POOL_BLOCK < in_hi ? a + POOL_BLOCK : in_hi;
                if (g->sw == 1)
                    avg_interior(g, x, oh, a, b, 1, inv, yr + a);
                else if (g->sw == 2)
                    avg_interior(g, x, oh, a, b, 2, inv, yr + a);
                else
                    avg_interior(g, x, oh, a, b, g->sw, inv, yr + a);
            }
            for (int64_t ow = in_hi; ow < g->ow; ow++) yr[ow] = avg_window(g, x, oh, ow, inv);
        }
    }
}

CX_HOT static void avg_bwd_range(void *ctx, int64_t begin, int64_t end)
{
    const pool_job *j = ctx;
    const cx_pool_geom *g = j->g;
    const int64_t in_plane = g->h * g->w, out_plane = g->oh * g->ow;
    const float inv = 1.0f / (float)(g->kh * g->kw);
    for (int64_t t = begin; t < end; t++) {
        const float *dy = j->dy + t * out_plane;
        float *dx = j->out + t * in_plane;
        memset(dx, 0, sizeof(float) * (size_t)in_plane);
        for (int64_t oh = 0; oh < g->oh; oh++)
            for (int64_t ow = 0; ow < g->ow; ow++) {
                window r = window_at(g, oh, ow);
                float v = dy[oh * g->ow + ow] * inv;
                for (int64_t ih = r.h0; ih < r.h1; ih++)
                    for (int64_t iw = r.w0; iw < r.w1; iw++) dx[ih * g->w + iw] += v;
            }
    }
}

static void run_planes(const cx_pool_geom *g, cx_range_fn fn, float *out, const float *x, const float *dy,
                       const float *posmask)
{
    pool_job j = { .g = g, .out = out, .x = x, .dy = dy, .posmask = posmask };
    int64_t per_plane = g->h * g->w + g->oh * g->ow * g->kh * g->kw;
    int64_t grain = POOL_GRAIN_FLOATS / (per_plane > 0 ? per_plane : 1);
    cx_pool_parallel_for(g->n * g->c, grain > 1 ? grain : 1, fn, &j);
}

void cx_pool2d_plane_f32(int kind, float *out, const float *x, const float *dy, const cx_pool_geom *g)
{
    static const cx_range_fn fns[] = { [CX_POOL_BF16_MAX] = max_fwd_range, [CX_POOL_BF16_AVG] = avg_fwd_range,
                                       [CX_POOL_BF16_MAX_BWD] = max_bwd_range, [CX_POOL_BF16_AVG_BWD] = avg_bwd_range };
    pool_job j = { .g = g, .out = out, .x = x, .dy = dy };
    fns[kind](&j, 0, g->n * g->c);
}

void cx_max_pool2d_fwd(float *y, const float *x, const cx_pool_geom *g)
{
    run_planes(g, max_fwd_range, y, x, NULL, NULL);
}

void cx_max_pool2d_bwd(float *dx, const float *x, const float *dy, const float *posmask, const cx_pool_geom *g)
{
    run_planes(g, max_bwd_range, dx, x, dy, posmask);
}

void cx_avg_pool2d_fwd(float *y, const float *x, const cx_pool_geom *g)
{
    run_planes(g, avg_fwd_range, y, x, NULL, NULL);
}

void cx_avg_pool2d_bwd(float *dx, const float *dy, const cx_pool_geom *g)
{
    run_planes(g, avg_bwd_range, dx, NULL, dy, NULL);
}
