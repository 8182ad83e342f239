/* 2-D convolution and its two backward ops.
 *
 * Routes, by shape:
 *  - 3x3, stride 1, one group, >= 8 channels, >= 2 images, an output
 *    plane of at least 2x2: Winograd F(2x2, 3x3) (winograd.c);
 *  - other convs on >= 2 images: im2col + sgemm per image on the pool.
 *    Each pool thread takes one image (or a block of its output rows) at a
 *    time: im2col into the thread's own column block, which stays in L2,
 *    and a single-threaded sgemm that reads and writes the tensors in
 *    their own (N, C, H, W) layout. The weight gradient sums per thread
 *    over a fixed split of the images, then adds the partial sums in
 *    thread order;
 *  - a single image, and the thin path below: images in chunks, one
 *    (C*KH*KW, chunk*OH*OW) column matrix per chunk, the sgemm split
 *    across the pool by cx_sgemm;
 *  - 1x1 stride-1 unpadded convs on large planes: one sgemm per image
 *    straight on x and y (x[n] already is the column matrix);
 *  - very few taps per output (first layers, depthwise): vector loops on
 *    the pool instead of an sgemm ("thin" path).
 *
 * The forward takes the bias (+ relu) epilogue and the input gradient the
 * relu-gradient mask, applied per block while it is in cache where the
 * route allows, else in one extra pass.
 */
#include "kernels.h"
#include "pool.h"
#include <cxla/core.h>

#include <limits.h>
#include <stdatomic.h>
#include <string.h>

/* Bound on the column matrix of one chunk of images (thin path): much
 * smaller chunks lose more to per-chunk fork/join on the pool than they
 * win from cache reuse. */
#define CONV_SCRATCH_CAP ((size_t)32 << 20)
/* Below this many output pixels per image a 1x1 conv is cheaper through a
 * chunked layout copy than through one tiny sgemm per image. */
#define CONV_DIRECT_MIN_PIXELS 256
/* With this few taps per output (C/groups*KH*KW, e.g. the first layer of
 * a CNN or a depthwise conv) an sgemm is memory bound, OpenBLAS handles
 * the skinny shapes badly, and the relayout to (N, O, OH, OW) would cost
 * as much as the product: plain vector loops over the column matrix that
 * write the final layout directly are faster. */
#define CONV_THIN_K 12
/* Floats of copying per pool task: enough to amortize the dispatch. */
#define CONV_GRAIN_FLOATS 8192
#define SCRATCH_ALIGN 64
/* Bound on one tile's column block: with the sgemm's packed panels it
 * stays in a core's L2, so the patches are written and read back from
 * cache instead of going through memory. */
#define CONV_TILE_BYTES ((size_t)1 << 20)

typedef struct {
    int64_t k;      /* rows of the column matrix: C*KH*KW */
    int64_t kg;     /* rows per group: C/groups*KH*KW */
    int64_t og;     /* output channels per group */
    int64_t p;      /* output pixels per image: OH*OW */
    int64_t chunk;  /* images per sgemm */
    bool direct;    /* 1x1, stride 1, no padding: sgemm straight on x and y */
    bool thin;      /* kg <= CONV_THIN_K: loops instead of sgemm, no (O, chunk*P) buffer */
    bool tiled;     /* per-image tiles on the pool, one single-threaded sgemm each */
    int64_t rows;   /* tiled: output rows per tile */
} conv_plan;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static size_t round_floats(int64_t n) { return (size_t)ceil_div(n, 16) * 16; }

/* y[i] (+ b), then max(., 0) if relu: a conv epilogue on one output row. */
CX_HOT static void bias_relu_row(float *restrict y, int64_t n, const float *bias, int64_t o, bool relu)
{
    if (bias) {
        const float b = bias[o];
        if (relu)
            for (int64_t i = 0; i < n; i++) { float v = y[i] + b; y[i] = v > 0 ? v : 0.0f; }
        else
            for (int64_t i = 0; i < n; i++) y[i] += b;
    } else if (relu) {
        for (int64_t i = 0; i < n; i++) y[i] = y[i] > 0 ? y[i] : 0.0f;
    }
}

typedef struct {
    float *y;
    const float *bias;
    bool relu;
    int64_t o, p;
} bias_relu_job;

CX_HOT static void bias_relu_range(void *ctx, int64_t begin, int64_t end)
{
    const bias_relu_job *j = ctx;
    for (int64_t t = begin; t < end; t++) bias_relu_row(j->y + t * j->p, j->p, j->bias, t % j->o, j->relu);
}

/* The epilogue as a pass of its own, for the paths that cannot apply it
 * per block. */
static void bias_relu_all(float *y, const float *bias, bool relu, const cx_conv_geom *g)
{
    if (!bias && !relu) return;
    bias_relu_job j = { y, bias, relu, g->o, g->oh * g->ow };
    cx_pool_parallel_for(g->n * g->o, max64(1, 16384 / max64(1, j.p)), bias_relu_range, &j);
}

static int64_t grain_for(int64_t floats_per_item)
{
    return max64(1, CONV_GRAIN_FLOATS / max64(1, floats_per_item));
}

bool cx_conv_geom_finish(cx_conv_geom *g)
{
    if (!g) return false;
    if (g->n <= 0 || g->c <= 0 || g->h <= 0 || g->w <= 0 || g->o <= 0 || g->kh <= 0 || g->kw <= 0)
        return false;
    if (g->stride_h <= 0 || g->stride_w <= 0 || g->dil_h <= 0 || g->dil_w <= 0 || g->pad_h < 0 ||
        g->pad_w < 0 || g->groups <= 0)
        return false;
    if (g->c % g->groups != 0 || g->o % g->groups != 0) return false;
    int64_t span_h = (int64_t)g->dil_h * (g->kh - 1) + 1;
    int64_t span_w = (int64_t)g->dil_w * (g->kw - 1) + 1;
    int64_t room_h = g->h + 2 * (int64_t)g->pad_h - span_h;
    int64_t room_w = g->w + 2 * (int64_t)g->pad_w - span_w;
    if (room_h < 0 || room_w < 0) return false;
    g->oh = room_h / g->stride_h + 1;
    g->ow = room_w / g->stride_w + 1;
    /* Every sgemm dimension and leading dimension must fit a BLAS int; a
     * single image's column block is the smallest unit we can hand over. */
    int64_t kg = g->c / g->groups * g->kh * g->kw;
    if (g->oh > INT_MAX / g->ow || kg > INT_MAX || g->o > INT_MAX ||
        g->c > INT_MAX || g->h > INT_MAX / g->w)
        return false;
    return true;
}

static conv_plan make_plan(const cx_conv_geom *g)
{
    conv_plan pl;
    pl.kg = g->c / g->groups * g->kh * g->kw;
    pl.k = pl.kg * g->groups;
    pl.og = g->o / g->groups;
    pl.p = g->oh * g->ow;
    pl.direct = g->kh == 1 && g->kw == 1 && g->stride_h == 1 && g->stride_w == 1 &&
                g->pad_h == 0 && g->pad_w == 0 && (pl.p >= CONV_DIRECT_MIN_PIXELS || g->n == 1);
    pl.thin = !pl.direct && pl.kg <= CONV_THIN_K;
    /* Thin convs batch images into chunks; everything else that reaches
     * the chunk loop (a single image) goes one image at a time. */
    int64_t per_image = pl.k * pl.p * (int64_t)sizeof(float);
    int64_t chunk = max64(1, (int64_t)CONV_SCRATCH_CAP / per_image);
    chunk = min64(chunk, INT_MAX / pl.p);
    chunk = max64(1, min64(chunk, g->n));
    /* Equal chunks: a short tail chunk would run a poorly shaped loop. */
    chunk = ceil_div(g->n, ceil_div(g->n, chunk));
    pl.chunk = pl.thin ? chunk : 1;
    /* Per-image tiles (im2col of one image's rows, then a single-threaded
     * sgemm that writes y in place, one tile per pool thread) keep the
     * column block in cache and need no relayout; they need at least two
     * images to keep two threads busy in every direction. */
    pl.tiled = !pl.direct && !pl.thin && g->n >= 2;
    pl.rows = max64(1, min64(g->oh, (int64_t)(CONV_TILE_BYTES / sizeof(float)) / max64(1, pl.k * g->ow)));
    return pl;
}

typedef enum { TILE_FWD, TILE_BWD_INPUT, TILE_BWD_WEIGHT } tile_kind;

/* Scratch of one pool thread on the tiled path: a column block and, for
 * the weight gradient, the thread's partial dw. */
static size_t tile_lane_bytes(const cx_conv_geom *g, const conv_plan *pl, tile_kind kind)
{
    size_t floats = round_floats(pl->k * pl->rows * g->ow);
    if (kind == TILE_BWD_WEIGHT) floats += round_floats(g->o * pl->kg);
    return floats * sizeof(float);
}

static size_t tiled_scratch_bytes(const cx_conv_geom *g, const conv_plan *pl, tile_kind kind)
{
    int64_t lanes = min64(g->n, max64(1, cx_get_num_threads()));
    return (size_t)lanes * tile_lane_bytes(g, pl, kind) + SCRATCH_ALIGN;
}

/* The column matrix (K, chunk*P) of a chunk. */
static size_t plan_scratch_bytes(const conv_plan *pl)
{
    if (pl->direct) return 0;
    return round_floats(pl->k * pl->chunk * pl->p) * sizeof(float) + SCRATCH_ALIGN;
}

static float *scratch_col(void *scratch)
{
    uintptr_t p = (uintptr_t)scratch;
    p = (p + SCRATCH_ALIGN - 1) & ~(uintptr_t)(SCRATCH_ALIGN - 1);
    return (float *)p;
}

size_t cx_conv2d_scratch_bytes(const cx_conv_geom *g)
{
    if (cx_wino_applies(g)) return cx_wino_scratch_bytes(g, 0);
    conv_plan pl = make_plan(g);
    return pl.tiled ? tiled_scratch_bytes(g, &pl, TILE_FWD) : plan_scratch_bytes(&pl);
}

size_t cx_conv2d_bwd_input_scratch_bytes(const cx_conv_geom *g)
{
    if (cx_wino_applies(g)) return cx_wino_scratch_bytes(g, 1);
    conv_plan pl = make_plan(g);
    return pl.tiled ? tiled_scratch_bytes(g, &pl, TILE_BWD_INPUT) : plan_scratch_bytes(&pl);
}

size_t cx_conv2d_bwd_weight_scratch_bytes(const cx_conv_geom *g)
{
    if (cx_wino_applies(g)) return cx_wino_scratch_bytes(g, 2);
    conv_plan pl = make_plan(g);
    return pl.tiled ? tiled_scratch_bytes(g, &pl, TILE_BWD_WEIGHT) : plan_scratch_bytes(&pl);
}

/* Output positions [lo, hi) whose input coordinate out*s + start lies in
 * [0, in_n); start = k*dilation - pad may be negative. */
static void valid_range(int64_t out_n, int64_t in_n, int64_t s, int64_t start, int64_t *lo, int64_t *hi)
{
    int64_t l = start >= 0 ? 0 : ceil_div(-start, s);
    int64_t h = in_n - 1 - start < 0 ? 0 : min64(out_n, (in_n - 1 - start) / s + 1);
    *lo = min64(l, out_n);
    *hi = max64(h, *lo);
}

/* ---- layout copies on the pool ----------------------------------------- */

typedef struct {
    const cx_conv_geom *g;
    const conv_plan *pl;
    const float *x;      /* (cn, C, H, W) */
    float *col;          /* (K, cn*P) */
    const float *dcol;   /* (K, cn*P) */
    float *dx;           /* (cn, C, H, W) */
    int64_t cn;
} im2col_job;

/* dst[(oh - oh0)*OW + ow] = the input pixel tap (kh, kw) of output
 * (oh, ow) reads from the plane src (H, W), or 0 in the padding; output
 * rows [oh0, oh1). */
/* Where tap (kh, kw) lands for output rows [oh0, oh1): the input offsets
 * start_h/start_w of output (0, 0), and the output rows [oh_lo, oh_hi)
 * and columns [ow_lo, ow_hi) whose input pixel lies inside the plane. */
typedef struct {
    int64_t start_h, start_w, oh_lo, oh_hi, ow_lo, ow_hi;
} tap_span;

static tap_span tap_span_of(const cx_conv_geom *g, int64_t kh, int64_t kw, int64_t oh0, int64_t oh1)
{
    tap_span t;
    t.start_h = kh * g->dil_h - g->pad_h;
    t.start_w = kw * g->dil_w - g->pad_w;
    valid_range(g->oh, g->h, g->stride_h, t.start_h, &t.oh_lo, &t.oh_hi);
    valid_range(g->ow, g->w, g->stride_w, t.start_w, &t.ow_lo, &t.ow_hi);
    t.oh_lo = min64(max64(t.oh_lo, oh0), oh1);
    t.oh_hi = min64(max64(t.oh_hi, t.oh_lo), oh1);
    return t;
}

CX_HOT static void im2col_segment(float *dst, const float *src, const cx_conv_geom *g, int64_t kh, int64_t kw,
                           int64_t oh0, int64_t oh1)
{
    const int64_t sh = g->stride_h, sw = g->stride_w, ow_n = g->ow;
    const tap_span t = tap_span_of(g, kh, kw, oh0, oh1);
    const int64_t start_h = t.start_h, start_w = t.start_w, oh_lo = t.oh_lo, oh_hi = t.oh_hi;
    const int64_t ow_lo = t.ow_lo, ow_hi = t.ow_hi;
    /* dst holds rows [oh0, oh1) */
    if (oh_lo > oh0) memset(dst, 0, sizeof(float) * (size_t)((oh_lo - oh0) * ow_n));
    for (int64_t oh = oh_lo; oh < oh_hi; oh++) {
        float *d = dst + (oh - oh0) * ow_n;
        const float *s = src + (oh * sh + start_h) * g->w;
        for (int64_t ow = 0; ow < ow_lo; ow++) d[ow] = 0.0f;
        if (sw == 1) {
            memcpy(d + ow_lo, s + (ow_lo + start_w), sizeof(float) * (size_t)(ow_hi - ow_lo));
        } else {
            for (int64_t ow = ow_lo; ow < ow_hi; ow++) d[ow] = s[ow * sw + start_w];
        }
        for (int64_t ow = ow_hi; ow < ow_n; ow++) d[ow] = 0.0f;
    }
    if (oh_hi < oh1) memset(dst + (oh_hi - oh0) * ow_n, 0, sizeof(float) * (size_t)((oh1 - oh_hi) * ow_n));
}

/* The reverse of im2col_segment: adds src (output rows [oh0, oh1) of tap
 * (kh, kw)) into the input plane dst (H, W). */
CX_HOT static void col2im_segment(float *dst, const float *src, const cx_conv_geom *g, int64_t kh, int64_t kw,
                           int64_t oh0, int64_t oh1)
{
    const int64_t sh = g->stride_h, sw = g->stride_w, ow_n = g->ow;
    const tap_span t = tap_span_of(g, kh, kw, oh0, oh1);
    const int64_t start_h = t.start_h, start_w = t.start_w, ow_lo = t.ow_lo, ow_hi = t.ow_hi;
    for (int64_t oh = t.oh_lo; oh < t.oh_hi; oh++) {
        float *d = dst + (oh * sh + start_h) * g->w;
        const float *s = src + (oh - oh0) * ow_n;   /* src holds rows [oh0, oh1) */
        if (sw == 1) {
            float *dd = d + (ow_lo + start_w);
            const float *ss = s + ow_lo;
            for (int64_t i = 0; i < ow_hi - ow_lo; i++) dd[i] += ss[i];
        } else {
            for (int64_t ow = ow_lo; ow < ow_hi; ow++) d[ow * sw + start_w] += s[ow];
        }
    }
}

/* One task = one (k, image) row segment of P floats, so the rows of a
 * chunk are written front to back without sharing cache lines much. */
CX_HOT static void im2col_range(void *ctx, int64_t begin, int64_t end)
{
    const im2col_job *j = ctx;
    const cx_conv_geom *g = j->g;
    const int64_t kk = g->kh * g->kw, p = j->pl->p, ld = j->cn * p;
    for (int64_t t = begin; t < end; t++) {
        int64_t k = t / j->cn, n = t % j->cn;
        int64_t c = k / kk, r = k % kk;
        im2col_segment(j->col + k * ld + n * p, j->x + (n * g->c + c) * g->h * g->w, g, r / g->kw, r % g->kw, 0,
                       g->oh);
    }
}

/* One task = one (image, channel) plane of dx, so every dx element is
 * summed by one thread in a fixed order (deterministic, no atomics). */
CX_HOT static void col2im_range(void *ctx, int64_t begin, int64_t end)
{
    const im2col_job *j = ctx;
    const cx_conv_geom *g = j->g;
    const int64_t kk = g->kh * g->kw, p = j->pl->p, ld = j->cn * p;
    for (int64_t t = begin; t < end; t++) {
        int64_t n = t / g->c, c = t % g->c;
        float *dst = j->dx + t * g->h * g->w;
        memset(dst, 0, sizeof(float) * (size_t)(g->h * g->w));
        for (int64_t r = 0; r < kk; r++)
            col2im_segment(dst, j->dcol + (c * kk + r) * ld + n * p, g, r / g->kw, r % g->kw, 0, g->oh);
    }
}

/* The copies are handed out in blocks from a shared counter rather than
 * split evenly up front: right after an sgemm the BLAS threads keep
 * spinning for a while and share the cores with the pool, so one pool
 * thread can run at half speed; with an even split everyone would wait
 * for it. */
typedef struct {
    atomic_int_fast64_t next;
    int64_t n, block;
    cx_range_fn fn;
    void *ctx;
} dyn_job;

static void dyn_each(void *p, int64_t tid, int64_t nthreads)
{
    (void)tid;
    (void)nthreads;
    dyn_job *j = p;
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&j->next, j->block, memory_order_relaxed);
        if (b >= j->n) return;
        j->fn(j->ctx, b, min64(b + j->block, j->n));
    }
}

static void parallel_dyn(int64_t n, int64_t grain, cx_range_fn fn, void *ctx)
{
    int64_t threads = cx_pool_threads();
    if (n < 2 * grain || threads <= 1) {
        fn(ctx, 0, n);
        return;
    }
    dyn_job j = { .n = n, .fn = fn, .ctx = ctx };
    j.block = max64(grain, n / (8 * threads));
    atomic_init(&j.next, 0);
    cx_pool_run_each(dyn_each, &j);
}

static void im2col(float *col, const float *x, const cx_conv_geom *g, const conv_plan *pl, int64_t cn)
{
    im2col_job j = { .g = g, .pl = pl, .x = x, .col = col, .cn = cn };
    parallel_dyn(pl->k * cn, grain_for(pl->p), im2col_range, &j);
}

static void col2im(float *dx, const float *dcol, const cx_conv_geom *g, const conv_plan *pl, int64_t cn)
{
    im2col_job j = { .g = g, .pl = pl, .dcol = dcol, .dx = dx, .cn = cn };
    parallel_dyn(cn * g->c, grain_for(pl->k / g->c * pl->p), col2im_range, &j);
}

/* ---- thin path (few taps per output) ------------------------------------ */

/* Eight floats, any alignment, may alias float data. GCC and Clang lower it
 * to the widest vector the target has (two SSE registers on plain x86-64). */
typedef float v8f __attribute__((vector_size(32), aligned(4), may_alias));
#define V8(p) (*(const v8f *)(const void *)(p))
#define V8W(p) (*(v8f *)(void *)(p))

/* y[q] = sum_t coef[t*cs] * src[t*ss + q] for q < p. Four vectors of
 * output stay in registers across all terms, so y is written once; the
 * naive term-by-term axpy re-reads and re-writes y per term. */
CX_HOT static void lincomb(float *y, const float *src, int64_t ss, const float *coef, int64_t cs, int64_t terms,
                    int64_t p)
{
    int64_t q = 0;
    for (; q + 32 <= p; q += 32) {
        const float c0 = coef[0];
        v8f a0 = c0 * V8(src + q), a1 = c0 * V8(src + q + 8);
        v8f a2 = c0 * V8(src + q + 16), a3 = c0 * V8(src + q + 24);
        for (int64_t t = 1; t < terms; t++) {
            const float *s = src + t * ss + q;
            const float c = coef[t * cs];
            a0 += c * V8(s);
            a1 += c * V8(s + 8);
            a2 += c * V8(s + 16);
            a3 += c * V8(s + 24);
        }
        V8W(y + q) = a0;
        V8W(y + q + 8) = a1;
        V8W(y + q + 16) = a2;
        V8W(y + q + 24) = a3;
    }
    for (; q < p; q++) {
        float acc = coef[0] * src[q];
        for (int64_t t = 1; t < terms; t++) acc += coef[t * cs] * src[t * ss + q];
        y[q] = acc;
    }
}

typedef struct {
    const cx_conv_geom *g;
    const conv_plan *pl;
    float *out;          /* y, dcol or dw */
    const float *a;      /* col or dy */
    const float *w;      /* weights (fwd, bwd_input) or dy (bwd_weight) */
    int64_t cn;
    bool accumulate;     /* bwd_weight: add to dw (chunks after the first) */
    const float *bias;   /* fwd epilogue, or NULL */
    bool relu;
} thin_job;

/* y[n, o, :] = sum_k w[o, k] * col[g*kg + k, n*P : n*P + P]; one task per
 * (image, output channel) row. */
CX_HOT static void thin_fwd_range(void *ctx, int64_t begin, int64_t end)
{
    const thin_job *j = ctx;
    const int64_t o_n = j->g->o, p = j->pl->p, kg = j->pl->kg, ld = j->cn * p;
    for (int64_t t = begin; t < end; t++) {
        int64_t n = t / o_n, o = t % o_n, gi = o / j->pl->og;
        lincomb(j->out + t * p, j->a + gi * kg * ld + n * p, ld, j->w + o * kg, 1, kg, p);
        bias_relu_row(j->out + t * p, p, j->bias, o, j->relu);
    }
}

/* dcol[row, n*P : n*P + P] = sum_{o in group} w[o, k] * dy[n, o, :], with
 * row = g*kg + k; one task per (image, row). */
CX_HOT static void thin_bwd_input_range(void *ctx, int64_t begin, int64_t end)
{
    const thin_job *j = ctx;
    const int64_t k_n = j->pl->k, p = j->pl->p, kg = j->pl->kg, og = j->pl->og, ld = j->cn * p;
    for (int64_t t = begin; t < end; t++) {
        int64_t n = t / k_n, row = t % k_n, gi = row / kg, k = row % kg;
        lincomb(j->out + row * ld + n * p, j->a + (n * j->g->o + gi * og) * p, p,
                j->w + gi * og * kg + k, kg, og, p);
    }
}

/* Output channels of one group handled together by a bwd_weight task:
 * each column-matrix load then feeds this many dot products. */
#define THIN_OB 4

/* dw[o, k] (+)= sum_n dot(dy[n, o, :], col[g*kg + k, n*P : n*P + P]). One
 * task = up to THIN_OB output channels of one group, so each column
 * block is loaded once for all of them (the column matrix is re-read per
 * task, from L2 at best). Vector lane sums keep the reduction order fixed
 * (deterministic whatever the thread count). */
CX_HOT static void thin_bwd_weight_range(void *ctx, int64_t begin, int64_t end)
{
    const thin_job *j = ctx;
    const int64_t p = j->pl->p, kg = j->pl->kg, og = j->pl->og, ld = j->cn * p, pv = p / 8 * 8;
    const int64_t blocks = (og + THIN_OB - 1) / THIN_OB;
    for (int64_t t = begin; t < end; t++) {
        const int64_t gi = t / blocks, o0 = gi * og + (t % blocks) * THIN_OB;
        const int64_t nb = o0 + THIN_OB <= (gi + 1) * og ? THIN_OB : (gi + 1) * og - o0;
        v8f acc[THIN_OB][CONV_THIN_K];
        float tail[THIN_OB][CONV_THIN_K];
        for (int64_t b = 0; b < THIN_OB; b++)
            for (int64_t k = 0; k < kg; k++) {
                acc[b][k] = (v8f){ 0 };
                tail[b][k] = 0.0f;
            }
        for (int64_t n = 0; n < j->cn; n++) {
            const float *dy = j->w + (n * j->g->o + o0) * p;
            const float *c0 = j->a + gi * kg * ld + n * p;
            for (int64_t q = 0; q < pv; q += 8) {
                v8f d[THIN_OB];
                for (int64_t b = 0; b < nb; b++) d[b] = V8(dy + b * p + q);
                for (int64_t k = 0; k < kg; k++) {
                    const v8f c = V8(c0 + k * ld + q);
                    for (int64_t b = 0; b < nb; b++) acc[b][k] += d[b] * c;
                }
            }
            for (int64_t b = 0; b < nb; b++)
                for (int64_t k = 0; k < kg; k++)
                    for (int64_t q = pv; q < p; q++) tail[b][k] += dy[b * p + q] * c0[k * ld + q];
        }
        for (int64_t b = 0; b < nb; b++) {
            float *dw = j->out + (o0 + b) * kg;
            for (int64_t k = 0; k < kg; k++) {
                float s = tail[b][k];
                for (int l = 0; l < 8; l++) s += acc[b][k][l];
                dw[k] = j->accumulate ? dw[k] + s : s;
            }
        }
    }
}

/* ---- tiled path: one image's rows per task ------------------------------ */

typedef struct {
    const cx_conv_geom *g;
    const conv_plan *pl;
    tile_kind kind;
    char *scratch;       /* lanes * lane_bytes */
    size_t lane_bytes;
    int64_t lanes;
    float *out;          /* y, dx or dw */
    const float *x;      /* fwd, bwd_weight */
    const float *w;      /* fwd, bwd_input */
    const float *dy;     /* bwd_input, bwd_weight */
    const float *bias;   /* fwd epilogue, or NULL */
    bool relu;
    atomic_int_fast64_t next;
    atomic_int_fast64_t used;  /* bwd_weight: lanes that took part */
} tile_job;


/* col (K, (oh1-oh0)*OW) = the patches of output rows [oh0, oh1) of one
 * image x (C, H, W). */
static void im2col_rows(float *col, const float *x, const cx_conv_geom *g, int64_t oh0, int64_t oh1)
{
    const int64_t kk = g->kh * g->kw, k_n = g->c * kk, ld = (oh1 - oh0) * g->ow;
    for (int64_t k = 0; k < k_n; k++) {
        int64_t c = k / kk, r = k % kk;
        im2col_segment(col + k * ld, x + c * g->h * g->w, g, r / g->kw, r % g->kw, oh0, oh1);
    }
}

/* y[n, :, rows] = w (O, Kg) @ col, written straight into y (ld P). */
static void tile_fwd(const tile_job *j, float *col, int64_t n, int64_t oh0, int64_t oh1)
{
    const cx_conv_geom *g = j->g;
    const conv_plan *pl = j->pl;
    const int64_t cols = (oh1 - oh0) * g->ow;
    im2col_rows(col, j->x + n * g->c * g->h * g->w, g, oh0, oh1);
    float *y = j->out + n * g->o * pl->p + oh0 * g->ow;
    for (int64_t gi = 0; gi < g->groups; gi++)
        cx_sgemm_serial(false, false, pl->og, cols, pl->kg, j->w + gi * pl->og * pl->kg, pl->kg,
                        col + gi * pl->kg * cols, cols, 0.0f, y + gi * pl->og * pl->p, pl->p);
    if (j->bias || j->relu)
        for (int64_t o = 0; o < g->o; o++) bias_relu_row(y + o * pl->p, cols, j->bias, o, j->relu);
}

/* dx[n] = col2im(w^T @ dy[n]), one row block at a time into the same dx
 * plane (blocks overlap in the input, so one image is one task). */
static void tile_bwd_input(const tile_job *j, float *dcol, int64_t n)
{
    const cx_conv_geom *g = j->g;
    const conv_plan *pl = j->pl;
    const int64_t kk = g->kh * g->kw, plane = g->h * g->w;
    float *dx = j->out + n * g->c * plane;
    memset(dx, 0, sizeof(float) * (size_t)(g->c * plane));
    for (int64_t oh0 = 0; oh0 < g->oh; oh0 += pl->rows) {
        const int64_t oh1 = min64(oh0 + pl->rows, g->oh), cols = (oh1 - oh0) * g->ow;
        const float *dy = j->dy + n * g->o * pl->p + oh0 * g->ow;
        for (int64_t gi = 0; gi < g->groups; gi++)
            cx_sgemm_serial(true, false, pl->kg, cols, pl->og, j->w + gi * pl->og * pl->kg, pl->kg,
                            dy + gi * pl->og * pl->p, pl->p, 0.0f, dcol + gi * pl->kg * cols, cols);
        for (int64_t k = 0; k < pl->k; k++) {
            int64_t c = k / kk, r = k % kk;
            col2im_segment(dx + c * plane, dcol + k * cols, g, r / g->kw, r % g->kw, oh0, oh1);
        }
    }
}

/* part (O, Kg) (+)= dy[n] @ col^T over the images [n0, n1). */
static void tile_bwd_weight(const tile_job *j, float *col, float *part, int64_t n0, int64_t n1)
{
    const cx_conv_geom *g = j->g;
    const conv_plan *pl = j->pl;
    bool first = true;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t oh0 = 0; oh0 < g->oh; oh0 += pl->rows) {
            const int64_t oh1 = min64(oh0 + pl->rows, g->oh), cols = (oh1 - oh0) * g->ow;
            im2col_rows(col, j->x + n * g->c * g->h * g->w, g, oh0, oh1);
            const float *dy = j->dy + n * g->o * pl->p + oh0 * g->ow;
            for (int64_t gi = 0; gi < g->groups; gi++)
                cx_sgemm_serial(false, true, pl->og, pl->kg, cols, dy + gi * pl->og * pl->p, pl->p,
                                col + gi * pl->kg * cols, cols, first ? 0.0f : 1.0f, part + gi * pl->og * pl->kg, pl->kg);
            first = false;
        }
}

static void tile_each(void *p, int64_t tid, int64_t nthreads)
{
    tile_job *j = p;
    const int64_t lanes = min64(j->lanes, nthreads);
    if (tid >= lanes) return;
    if (tid == 0) atomic_store_explicit(&j->used, lanes, memory_order_relaxed);
    float *col = (float *)(void *)(j->scratch + (size_t)tid * j->lane_bytes);
    const cx_conv_geom *g = j->g;
    if (j->kind == TILE_BWD_WEIGHT) {
        /* A fixed split of the images (not first come, first served), so
         * the partial sums and hence dw do not depend on timing; lane 0
         * accumulates into dw itself. */
        float *part = tid == 0 ? j->out : col + round_floats(j->pl->k * j->pl->rows * g->ow);
        tile_bwd_weight(j, col, part, g->n * tid / lanes, g->n * (tid + 1) / lanes);
        return;
    }
    const int64_t blocks = j->kind == TILE_FWD ? ceil_div(g->oh, j->pl->rows) : 1;
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= g->n * blocks) return;
        if (j->kind == TILE_BWD_INPUT) {
            tile_bwd_input(j, col, t);
        } else {
            int64_t n = t / blocks, oh0 = t % blocks * j->pl->rows;
            tile_fwd(j, col, n, oh0, min64(oh0 + j->pl->rows, g->oh));
        }
    }
}

/* Runs the tiles of one op; as many pool threads take part as the scratch
 * has lanes for (the thread count may have grown since it was sized). */
static void run_tiled(tile_job *j, void *scratch, size_t scratch_bytes)
{
    j->lane_bytes = tile_lane_bytes(j->g, j->pl, j->kind);
    j->scratch = (char *)scratch_col(scratch);
    size_t usable = scratch_bytes - (size_t)(j->scratch - (char *)scratch);
    j->lanes = min64(j->g->n, (int64_t)(usable / j->lane_bytes));
    if (j->lanes < 1) j->lanes = 1;   /* never: the scratch is sized for one lane at least */
    atomic_init(&j->next, 0);
    atomic_init(&j->used, 1);
    cx_pool_run_each(tile_each, j);
    if (j->kind != TILE_BWD_WEIGHT) return;
    const int64_t len = j->g->o * j->pl->kg, used = atomic_load(&j->used);
    for (int64_t t = 1; t < used; t++) {
        const float *part = (const float *)(void *)(j->scratch + (size_t)t * j->lane_bytes) +
                            round_floats(j->pl->k * j->pl->rows * j->g->ow);
        for (int64_t i = 0; i < len; i++) j->out[i] += part[i];
    }
}

/* ---- forward ------------------------------------------------------------ */


/* The direct, thin and chunked paths. */
static void conv_untiled_fwd(float *y, const float *x, const float *w, const float *bias, bool relu,
                             const cx_conv_geom *g, const conv_plan *plp, void *scratch)
{
    const conv_plan pl = *plp;
    const int64_t groups = g->groups, cg = g->c / groups, in_img = g->c * g->h * g->w;
    const int64_t out_img = g->o * pl.p;
    if (pl.direct) {
        /* x[n] is already the (C, H*W) column matrix. */
        for (int64_t n = 0; n < g->n; n++)
            for (int64_t gi = 0; gi < groups; gi++)
                cx_sgemm(false, false, pl.og, pl.p, cg, w + gi * pl.og * cg, cg,
                         x + n * in_img + gi * cg * pl.p, pl.p, 0.0f, y + n * out_img + gi * pl.og * pl.p,
                         pl.p);
        bias_relu_all(y, bias, relu, g);
        return;
    }
    float *col = scratch_col(scratch);
    for (int64_t n0 = 0; n0 < g->n; n0 += pl.chunk) {
        const int64_t cn = min64(pl.chunk, g->n - n0), ld = cn * pl.p;
        im2col(col, x + n0 * in_img, g, &pl, cn);
        if (pl.thin) {
            thin_job j = { .g = g, .pl = &pl, .out = y + n0 * out_img, .a = col, .w = w, .cn = cn, .bias = bias,
                           .relu = relu };
            parallel_dyn(cn * g->o, grain_for(pl.kg * pl.p), thin_fwd_range, &j);
            continue;
        }
        /* one image: its (O, P) result already has the layout of y */
        for (int64_t gi = 0; gi < groups; gi++)
            cx_sgemm(false, false, pl.og, ld, pl.kg, w + gi * pl.og * pl.kg, pl.kg, col + gi * pl.kg * ld,
                     ld, 0.0f, y + n0 * out_img + gi * pl.og * ld, ld);
    }
    if (!pl.thin) bias_relu_all(y, bias, relu, g);
}

void cx_conv2d_fwd(float *y, const float *x, const float *w, const float *bias, bool relu, const cx_conv_geom *g,
                   void *scratch, size_t scratch_bytes)
{
    if (cx_wino_applies(g)) {
        cx_wino_fwd(y, x, w, bias, relu, g, scratch, scratch_bytes);
        return;
    }
    conv_plan pl = make_plan(g);
    if (pl.tiled) {
        tile_job j = { .g = g, .pl = &pl, .kind = TILE_FWD, .out = y, .x = x, .w = w, .bias = bias, .relu = relu };
        run_tiled(&j, scratch, scratch_bytes);
        return;
    }
    conv_untiled_fwd(y, x, w, bias, relu, g, &pl, scratch);
}

/* ---- backward ----------------------------------------------------------- */

typedef struct {
    float *dx;
    const float *mask;
} posmask_job;

CX_HOT static void posmask_range(void *ctx, int64_t begin, int64_t end)
{
    const posmask_job *j = ctx;
    for (int64_t i = begin; i < end; i++) j->dx[i] = j->mask[i] > 0 ? j->dx[i] : 0.0f;
}

static void conv_bwd_input_unmasked(float *dx, const float *dy, const float *w, const cx_conv_geom *g, void *scratch,
                                    size_t scratch_bytes);

void cx_conv2d_bwd_input(float *dx, const float *dy, const float *w, const float *posmask, const cx_conv_geom *g,
                         void *scratch, size_t scratch_bytes)
{
    if (cx_wino_applies(g)) {
        cx_wino_bwd_input(dx, dy, w, posmask, g, scratch, scratch_bytes);
        return;
    }
    conv_bwd_input_unmasked(dx, dy, w, g, scratch, scratch_bytes);
    if (posmask) {
        posmask_job j = { dx, posmask };
        cx_pool_parallel_for(g->n * g->c * g->h * g->w, 1 << 15, posmask_range, &j);
    }
}

static void conv_bwd_input_unmasked(float *dx, const float *dy, const float *w, const cx_conv_geom *g, void *scratch,
                                    size_t scratch_bytes)
{
    conv_plan pl = make_plan(g);
    if (pl.tiled) {
        tile_job j = { .g = g, .pl = &pl, .kind = TILE_BWD_INPUT, .out = dx, .w = w, .dy = dy };
        run_tiled(&j, scratch, scratch_bytes);
        return;
    }
    const int64_t groups = g->groups, cg = g->c / groups, in_img = g->c * g->h * g->w;
    const int64_t out_img = g->o * pl.p;
    if (pl.direct) {
        for (int64_t n = 0; n < g->n; n++)
            for (int64_t gi = 0; gi < groups; gi++)
                cx_sgemm(true, false, cg, pl.p, pl.og, w + gi * pl.og * cg, cg,
                         dy + n * out_img + gi * pl.og * pl.p, pl.p, 0.0f, dx + n * in_img + gi * cg * pl.p,
                         pl.p);
        return;
    }
    float *dcol = scratch_col(scratch);
    for (int64_t n0 = 0; n0 < g->n; n0 += pl.chunk) {
        const int64_t cn = min64(pl.chunk, g->n - n0), ld = cn * pl.p;
        const float *src = dy + n0 * out_img;
        if (pl.thin) {
            thin_job j = { .g = g, .pl = &pl, .out = dcol, .a = src, .w = w, .cn = cn };
            parallel_dyn(cn * pl.k, grain_for(pl.og * pl.p), thin_bwd_input_range, &j);
            col2im(dx + n0 * in_img, dcol, g, &pl, cn);
            continue;
        }
        /* one image: dy[n] is the (O, P) matrix itself */
        for (int64_t gi = 0; gi < groups; gi++)
            cx_sgemm(true, false, pl.kg, ld, pl.og, w + gi * pl.og * pl.kg, pl.kg, src + gi * pl.og * ld, ld,
                     0.0f, dcol + gi * pl.kg * ld, ld);
        col2im(dx + n0 * in_img, dcol, g, &pl, cn);
    }
}

void cx_conv2d_bwd_weight(float *dw, const float *x, const float *dy, const cx_conv_geom *g, void *scratch,
                          size_t scratch_bytes)
{
    conv_plan pl = make_plan(g);
    const int64_t groups = g->groups, cg = g->c / groups, in_img = g->c * g->h * g->w;
    const int64_t out_img = g->o * pl.p;
    if (g->n <= 0) {
        memset(dw, 0, sizeof(float) * (size_t)(g->o * pl.kg));
        return;
    }
    if (cx_wino_applies(g)) {
        cx_wino_bwd_weight(dw, x, dy, g, scratch, scratch_bytes);
        return;
    }
    if (pl.tiled) {
        tile_job j = { .g = g, .pl = &pl, .kind = TILE_BWD_WEIGHT, .out = dw, .x = x, .dy = dy };
        run_tiled(&j, scratch, scratch_bytes);
        return;
    }
    if (pl.direct) {
        for (int64_t n = 0; n < g->n; n++)
            for (int64_t gi = 0; gi < groups; gi++)
                cx_sgemm(false, true, pl.og, cg, pl.p, dy + n * out_img + gi * pl.og * pl.p, pl.p,
                         x + n * in_img + gi * cg * pl.p, pl.p, n == 0 ? 0.0f : 1.0f, dw + gi * pl.og * cg, cg);
        return;
    }
    float *col = scratch_col(scratch);
    for (int64_t n0 = 0; n0 < g->n; n0 += pl.chunk) {
        const int64_t cn = min64(pl.chunk, g->n - n0), ld = cn * pl.p;
        im2col(col, x + n0 * in_img, g, &pl, cn);
        const float *src = dy + n0 * out_img;
        if (pl.thin) {
            thin_job j = { .g = g, .pl = &pl, .out = dw, .a = col, .w = src, .cn = cn, .accumulate = n0 > 0 };
            const int64_t tasks = groups * ((pl.og + THIN_OB - 1) / THIN_OB);
            parallel_dyn(tasks, grain_for(pl.kg * cn * pl.p * THIN_OB), thin_bwd_weight_range, &j);
            continue;
        }
        /* one image: dy[n] is the (O, P) matrix itself */
        for (int64_t gi = 0; gi < groups; gi++)
            cx_sgemm(false, true, pl.og, pl.kg, ld, src + gi * pl.og * ld, ld, col + gi * pl.kg * ld, ld,
                     n0 == 0 ? 0.0f : 1.0f, dw + gi * pl.og * pl.kg, pl.kg);
    }
}
